//! The bench's one error type; every message says which step failed.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to run `{command}`: {detail}")]
    Command { command: String, detail: String },
    #[error("failed to isolate the bench in private namespaces: {0}")]
    Isolate(String),
    #[error("{0}")]
    Topology(String),
    #[error("{0}")]
    ApiServer(String),
    #[error("failed to write objects to the API server: {0}")]
    Populate(String),
    #[error("{0}")]
    Load(String),
    #[error("{0}")]
    Serve(String),
    #[error("{0}")]
    System(String),
    #[error("failed to write {path}: {detail}")]
    Output { path: String, detail: String },
}

impl Error {
    /// The message's first line: what a table cell has room for.
    pub fn first_line(&self) -> String {
        self.to_string()
            .lines()
            .next()
            .unwrap_or_default()
            .to_string()
    }
}

pub type Result<T> = std::result::Result<T, Error>;
