//! The agent's error enum (the core's map errors and the loader's are kept
//! whole inside it). Variants are named after the step that failed;
//! messages start with "failed to ...".

/// Everything that can go wrong in the agent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to read manifest {path}: {source}")]
    ReadManifest {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// A failed read or update of the Service maps (the core's error).
    #[error(transparent)]
    Map(#[from] switchyard_model::Error),
    /// Loading, pinning, attaching or migrating the programs and maps.
    #[error(transparent)]
    Loader(#[from] switchyard_loader::Error),
    #[error("failed to read manifest {path}, document {document}: field {field}: {reason}")]
    InvalidManifest {
        path: std::path::PathBuf,
        document: usize,
        field: String,
        reason: String,
    },
    #[error("failed to read the host's interfaces: {reason}")]
    ReadInterfaces { reason: String },
    #[error("failed to program the masquerade rule: {reason}")]
    ProgramMasquerade { reason: String },
    // kube-proxy coexistence (kube_proxy): cleanup, chain order, health endpoints.
    #[error("failed to parse iptables-save output at line {line}: {reason}")]
    ParseIptablesSave { line: usize, reason: String },
    #[error("failed to parse nft output: {reason}")]
    ParseNftables { reason: String },
    #[error("failed to run {command}: {reason}")]
    RunNetfilterTool { command: String, reason: String },
    #[error("failed to clean up kube-proxy's rules: {reason}")]
    CleanUpKubeProxyRules { reason: String },
    #[error("failed to keep the agent's chains first: {reason}")]
    GuardChainOrder { reason: String },
    #[error("failed to parse the kube-proxy healthz URL {url}: {reason}")]
    ParseHealthzUrl { url: String, reason: String },
    #[error("failed to serve health checks on {address}: {source}")]
    ServeHealth {
        address: std::net::SocketAddr,
        source: std::io::Error,
    },
    // Cluster mode (cluster): the API server client, metrics, status.
    #[error("failed to configure the Kubernetes client: {reason}")]
    ConfigureClient { reason: String },
    #[error("failed to register the metrics: {reason}")]
    RegisterMetrics { reason: String },
    #[error("failed to serve metrics and health checks: {reason}")]
    ServeTelemetry { reason: String },
}
