//! The one error type of the e2e crate: each variant names the step that failed.

use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum E2eError {
    #[error("failed to read the kubeconfig {path}: {source}")]
    ReadKubeconfig {
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("failed to build a client from the kubeconfig {path}: {source}")]
    BuildClient {
        path: PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("failed to {description} within {waited:?}; last observation: {last_observation}")]
    WaitTimedOut {
        description: String,
        waited: Duration,
        last_observation: String,
    },
    #[error("failed to {description}: {message}")]
    WaitAborted {
        description: String,
        message: String,
    },
    #[error("failed to keep {description} for {window:?}: after {after:?}: {violation}")]
    HoldBroken {
        description: String,
        window: Duration,
        after: Duration,
        violation: String,
    },
    #[error("failed to read {path}: {source}")]
    ReadFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("failed to write {path}: {source}")]
    WriteFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("failed to parse the image table {path}, line {line}: {message}")]
    ParseImageTable {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("failed to enter the network namespace {path}: {source}")]
    EnterNetworkNamespace {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("failed to run {command}: {message}")]
    RunCommand { command: String, message: String },
    #[error("failed to start the echo server in {namespace} on port {port}: {source}")]
    StartEchoServer {
        namespace: String,
        port: u16,
        source: std::io::Error,
    },
    #[error("failed to create a socket in {namespace}: {source}")]
    CreateSocket {
        namespace: String,
        source: std::io::Error,
    },
    #[error("failed to call the API server to {action}: {source}")]
    Kubernetes { action: String, source: kube::Error },
    #[error("failed to parse the manifest {name}: {source}")]
    ParseManifest {
        name: String,
        source: serde_yaml::Error,
    },
    #[error("failed to resolve the process of pod {pod}: {message}")]
    ResolvePodProcess { pod: String, message: String },
    #[error("failed to start the process of pod {pod}: {source}")]
    StartProcess { pod: String, source: std::io::Error },
    #[error("failed to watch pods: {message}")]
    WatchPods { message: String },
}

pub type Result<T, E = E2eError> = std::result::Result<T, E>;
