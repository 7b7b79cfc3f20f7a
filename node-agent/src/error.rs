//! The agent's one error enum. Variants are named after the step that failed;
//! messages start with "failed to ...".

/// Everything that can go wrong in the agent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to read manifest {path}: {source}")]
    ReadManifest {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("failed to update map {map}: {reason}")]
    UpdateMap { map: &'static str, reason: String },
    #[error("failed to read map {map}: {reason}")]
    ReadMap { map: &'static str, reason: String },
}
