//! The agent's error enum (the core's map errors and the loader's are kept
//! whole inside it). Variants are named after the step that failed; messages
//! start with "failed to ..." and say only that step: what went wrong below it
//! is the error's source, nested per step (log with
//! `switchyard_model::error::chain`). Parse errors of input the agent reads
//! (iptables-save, nft, a URL) describe the input instead: nothing failed below.

/// What went wrong below a step: the underlying error, or a description where
/// there is none (a tool that is not installed, its stderr).
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

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
    #[error("failed to read the host's interfaces")]
    ReadInterfaces {
        #[source]
        source: Cause,
    },
    #[error("failed to program the masquerade rule")]
    ProgramMasquerade {
        #[source]
        source: Cause,
    },
    // kube-proxy coexistence (kube_proxy): cleanup, chain order, health endpoints.
    #[error("failed to parse iptables-save output at line {line}: {reason}")]
    ParseIptablesSave { line: usize, reason: String },
    #[error("failed to parse nft output: {reason}")]
    ParseNftables { reason: String },
    #[error("failed to run {command}")]
    RunNetfilterTool {
        command: String,
        #[source]
        source: Cause,
    },
    #[error("failed to clean up kube-proxy's rules in {backend}")]
    CleanUpKubeProxyRules {
        backend: String,
        #[source]
        source: Box<Error>,
    },
    #[error("failed to keep the agent's chains first in {backend}")]
    GuardChainOrder {
        backend: &'static str,
        #[source]
        source: Box<Error>,
    },
    #[error("failed to parse the kube-proxy healthz URL {url}: {reason}")]
    ParseHealthzUrl { url: String, reason: String },
    #[error("failed to serve health checks on {address}: {source}")]
    ServeHealth {
        address: std::net::SocketAddr,
        source: std::io::Error,
    },
    // Cluster mode (cluster): the API server client, metrics, status.
    #[error("failed to configure the Kubernetes client")]
    ConfigureClient {
        #[source]
        source: Cause,
    },
    #[error("failed to register the metrics")]
    RegisterMetrics {
        #[source]
        source: prometheus::Error,
    },
    #[error("failed to serve metrics and health checks")]
    ServeTelemetry {
        #[source]
        source: Cause,
    },
}
