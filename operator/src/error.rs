//! The operator's errors.

/// Errors of the operator crate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A DataplaneConfig spec field holds a value the planner cannot act on.
    #[error("failed to read spec.{field}: {reason}")]
    ReadSpec { field: &'static str, reason: String },

    /// Listing or reading the objects a snapshot is made of failed.
    #[error("failed to read {what} for the snapshot")]
    ReadSnapshot {
        what: &'static str,
        #[source]
        source: ApiError,
    },
    /// A store of the operator's watches did not receive its first complete list in time.
    #[error("failed to fill the cache of {what} from its watch")]
    FillCache { what: &'static str },
    /// The operator's own writes did not come back through its watches in time, so its stores
    /// may be older than what it last wrote; it decides nothing until they catch up.
    #[error("failed to see {pending} of the operator's own writes come back through its watches within {} s", waited.as_secs())]
    ObserveOwnWrites {
        pending: usize,
        waited: std::time::Duration,
    },
    /// Writing a DataplaneNode's spec (Server-Side Apply) failed.
    #[error("failed to apply the spec of DataplaneNode {name}")]
    ApplyDataplaneNode {
        name: String,
        #[source]
        source: ApiError,
    },
    /// Patching the kube-proxy DaemonSet's nodeSelector failed.
    #[error("failed to patch the kube-proxy DaemonSet {namespace}/{name}")]
    PatchKubeProxy {
        namespace: String,
        name: String,
        #[source]
        source: ApiError,
    },
    /// The kube-proxy patch could not be computed safely from the DaemonSet as read.
    #[error(
        "failed to compute the patch of the kube-proxy DaemonSet {namespace}/{name}: {reason}"
    )]
    ComputeKubeProxyPatch {
        namespace: String,
        name: String,
        reason: String,
    },
    /// Deleting an agent pod for an OnDelete upgrade failed.
    #[error("failed to delete agent pod {namespace}/{name}")]
    DeleteAgentPod {
        namespace: String,
        name: String,
        #[source]
        source: ApiError,
    },
    /// Writing the DataplaneConfig status (Server-Side Apply) failed.
    #[error("failed to apply the status of DataplaneConfig {name}")]
    ApplyStatus {
        name: String,
        #[source]
        source: ApiError,
    },
    /// The task writing the DataplaneConfig status ended without an answer (it panicked or was
    /// cancelled).
    #[error("failed to apply the DataplaneConfig status: its task ended: {reason}")]
    ApplyStatusTask { reason: String },
    /// Applying one of the operator's CustomResourceDefinitions failed.
    #[error("failed to apply the CustomResourceDefinition {name}")]
    ApplyCrd {
        name: String,
        #[source]
        source: ApiError,
    },
    /// Creating or updating an Event failed.
    #[error("failed to record Event {name}")]
    PublishEvent {
        name: String,
        #[source]
        source: ApiError,
    },
    /// Reading the leader Lease failed.
    #[error("failed to read the leader Lease")]
    ReadLease {
        #[source]
        source: ApiError,
    },
    /// Writing the leader Lease failed.
    #[error("failed to write the leader Lease")]
    WriteLease {
        #[source]
        source: ApiError,
    },
    /// This replica can no longer prove it holds the leader Lease; it stops acting and exits.
    #[error("failed to keep the leader Lease: {reason}")]
    LeadershipLost { reason: String },
    /// The Kubernetes client could not be configured (no kubeconfig, no in-cluster account).
    #[error("failed to configure the Kubernetes client: {reason}")]
    ConfigureClient { reason: String },
    /// The metrics and health endpoint could not start.
    #[error("failed to start the metrics and health endpoint: {reason}")]
    StartTelemetry { reason: String },
}

/// A Kubernetes API error that the crate's [`Error`] can carry while staying `Clone` and
/// comparable (the planner's errors are compared in tests). Compared by message.
#[derive(Debug, Clone)]
pub struct ApiError(pub std::sync::Arc<kube::Error>);

impl ApiError {
    /// The error as kube returned it.
    pub fn kube(&self) -> &kube::Error {
        &self.0
    }

    /// The HTTP status code of an error the API server answered, if it answered.
    pub fn status_code(&self) -> Option<u16> {
        match self.kube() {
            kube::Error::Api(status) => Some(status.code),
            _ => None,
        }
    }
}

impl From<kube::Error> for ApiError {
    fn from(error: kube::Error) -> Self {
        Self(std::sync::Arc::new(error))
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, formatter)
    }
}

impl std::error::Error for ApiError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl PartialEq for ApiError {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl Eq for ApiError {}

/// The error and every source under it, `: `-separated, for logs (tracing's `%error` shows only
/// the outermost message).
pub fn describe(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}
