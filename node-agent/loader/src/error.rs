//! The loader's errors. Variants are named after the step that failed;
//! messages start with "failed to ...". A failed read or update of a map is the
//! core's [`switchyard_model::Error`], kept whole.

/// Everything that can go wrong while loading, pinning, attaching or migrating.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Map(#[from] switchyard_model::Error),
    #[error("failed to load the datapath programs: {reason}")]
    LoadPrograms { reason: String },
    #[error("failed to {step} the pin directory {path}")]
    PreparePinDirectory {
        step: &'static str,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to pin {path}: {reason}")]
    PinObject {
        path: std::path::PathBuf,
        reason: String,
    },
    #[error("failed to attach {program} to {target}: {reason}")]
    AttachProgram {
        program: &'static str,
        target: String,
        reason: String,
    },
    #[error("failed to detach from {target}: {reason}")]
    DetachProgram { target: String, reason: String },
    #[error("failed to watch network interfaces")]
    WatchInterfaces {
        #[source]
        source: std::io::Error,
    },
    #[error("failed to migrate the maps of schema version {from_version}: {reason}")]
    MigrateMaps { from_version: u32, reason: String },
    #[error("failed to read the network namespace cookie")]
    ReadNetworkNamespaceCookie {
        #[source]
        source: std::io::Error,
    },
}
