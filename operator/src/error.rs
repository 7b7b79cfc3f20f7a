//! The operator's errors.

/// Errors of the operator crate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A DataplaneConfig spec field holds a value the planner cannot act on.
    #[error("failed to read spec.{field}: {reason}")]
    ReadSpec { field: &'static str, reason: String },
}
