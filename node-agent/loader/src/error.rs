//! The loader's errors. Variants are named after the step that failed;
//! messages start with "failed to ..." and say only that step: what went wrong
//! below it is the error's source (log them with `switchyard_model::error::chain`).
//! A failed read or update of a map is the core's [`switchyard_model::Error`],
//! kept whole.

/// What went wrong below a step: the underlying error, or a description where
/// there is none (a missing program, a path with a NUL byte).
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// Everything that can go wrong while loading, pinning, attaching or migrating.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Map(#[from] switchyard_model::Error),
    #[error("failed to load the datapath programs: {what}")]
    LoadPrograms {
        what: String,
        #[source]
        source: Option<Cause>,
    },
    #[error(transparent)]
    BpfFilesystem(#[from] crate::pins::BpfFilesystemError),
    #[error("failed to {step} the pin directory {path}")]
    PreparePinDirectory {
        step: &'static str,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to pin {path}")]
    PinObject {
        path: std::path::PathBuf,
        #[source]
        source: Cause,
    },
    #[error("failed to attach {program} to {target}")]
    AttachProgram {
        program: &'static str,
        target: String,
        #[source]
        source: Cause,
    },
    #[error("failed to detach from {target}")]
    DetachProgram {
        target: String,
        #[source]
        source: Cause,
    },
    #[error("failed to watch network interfaces")]
    WatchInterfaces {
        #[source]
        source: std::io::Error,
    },
    #[error("failed to migrate the maps of schema version {from_version}")]
    MigrateMaps {
        from_version: u32,
        #[source]
        source: Cause,
    },
    #[error("failed to read the network namespace cookie")]
    ReadNetworkNamespaceCookie {
        #[source]
        source: std::io::Error,
    },
    /// A walk of a conntrack map that deletes some of its entries failed;
    /// `what` names the entries (wrapped in a map update error by the caller).
    #[error("failed to {what}")]
    DeleteConntrackEntries {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to start the conntrack expiry thread")]
    StartExpiryThread {
        #[source]
        source: std::io::Error,
    },
}
