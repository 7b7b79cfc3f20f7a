//! What a failed reconcile does next, as a small decision table.
//!
//! | failure                                              | class         | next                          |
//! |------------------------------------------------------|---------------|-------------------------------|
//! | network, timeout, 5xx, 429                           | `Transient`   | retry, backoff 1 s doubling to 5 min |
//! | 409 (a write raced another writer)                   | `Conflict`    | retry after 1 s (re-read first)  |
//! | 404 (an object vanished under the step)              | `Transient`   | retry with backoff            |
//! | 401, 403 (credentials or RBAC)                       | `Forbidden`   | retry every 5 min (a human fixes RBAC) |
//! | 400, 422, an unreadable recorded selector, a bad spec | `InvalidSpec` | wait for a change of the watched objects |
//!
//! Waiting for a change: any change of the DataplaneConfig or of the objects the controller
//! watches triggers a new reconcile, so nothing is retried in a loop that can only fail again.

use std::time::Duration;

use crate::error::{ApiError, Error};

/// How a failure is treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureClass {
    /// Likely to go away by itself.
    Transient,
    /// Another writer changed the object between read and write.
    Conflict,
    /// The operator lacks permission; only a human can fix it.
    Forbidden,
    /// Retrying the same input fails the same way; a change of the input is needed.
    InvalidSpec,
}

/// The longest backoff between retries of a transient failure.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// Classifies a reconcile failure.
pub fn classify(error: &Error) -> FailureClass {
    match error {
        Error::ReadSpec { .. } | Error::ComputeKubeProxyPatch { .. } => FailureClass::InvalidSpec,
        Error::ReadSnapshot { source, .. }
        | Error::ApplyDataplaneNode { source, .. }
        | Error::PatchKubeProxy { source, .. }
        | Error::DeleteAgentPod { source, .. }
        | Error::ApplyStatus { source, .. }
        | Error::ApplyCrd { source, .. }
        | Error::PublishEvent { source, .. }
        | Error::ReadLease { source }
        | Error::WriteLease { source } => classify_api_error(source),
        Error::LeadershipLost { .. }
        | Error::ApplyStatusTask { .. }
        | Error::FillCache { .. }
        | Error::ObserveOwnWrites { .. }
        | Error::ConfigureClient { .. }
        | Error::StartTelemetry { .. } => FailureClass::Transient,
    }
}

fn classify_api_error(error: &ApiError) -> FailureClass {
    match error.status_code() {
        Some(409) => FailureClass::Conflict,
        Some(401 | 403) => FailureClass::Forbidden,
        Some(400 | 422) => FailureClass::InvalidSpec,
        // 404, 429, 5xx, and no answer at all (network, timeouts, TLS).
        _ => FailureClass::Transient,
    }
}

/// When to retry after `consecutive_failures` failures in a row (1 for the first), or `None` to
/// wait for a change.
pub fn retry_after(class: FailureClass, consecutive_failures: u32) -> Option<Duration> {
    match class {
        FailureClass::InvalidSpec => None,
        FailureClass::Conflict => Some(Duration::from_secs(1)),
        FailureClass::Forbidden => Some(MAX_BACKOFF),
        FailureClass::Transient => {
            let exponent = consecutive_failures.saturating_sub(1).min(16);
            Some(Duration::from_secs(1u64 << exponent).min(MAX_BACKOFF))
        }
    }
}

/// The step that failed, as a metric label.
pub fn step(error: &Error) -> &'static str {
    match error {
        Error::ReadSpec { .. } => "read_spec",
        Error::ReadSnapshot { .. } => "read_snapshot",
        Error::FillCache { .. } => "fill_cache",
        Error::ObserveOwnWrites { .. } => "observe_own_writes",
        Error::ApplyDataplaneNode { .. } => "apply_dataplane_node",
        Error::PatchKubeProxy { .. } | Error::ComputeKubeProxyPatch { .. } => "patch_kube_proxy",
        Error::DeleteAgentPod { .. } => "delete_agent_pod",
        Error::ApplyStatus { .. } | Error::ApplyStatusTask { .. } => "apply_status",
        Error::ApplyCrd { .. } => "apply_crd",
        Error::PublishEvent { .. } => "publish_event",
        Error::ReadLease { .. } | Error::WriteLease { .. } | Error::LeadershipLost { .. } => {
            "leader_election"
        }
        Error::ConfigureClient { .. } => "configure_client",
        Error::StartTelemetry { .. } => "start_telemetry",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn api_error(code: u16) -> ApiError {
        let mut status = Status::failure("test", "Test");
        status.code = code;
        kube::Error::Api(Box::new(status)).into()
    }

    fn apply_failure(code: u16) -> Error {
        Error::ApplyDataplaneNode {
            name: "node-a".into(),
            source: api_error(code),
        }
    }

    #[test]
    fn server_errors_and_throttling_are_retried_with_growing_backoff() {
        for code in [500, 503, 504, 429, 404] {
            assert_eq!(
                classify(&apply_failure(code)),
                FailureClass::Transient,
                "{code}"
            );
        }
        let delays: Vec<_> = (1..=12)
            .map(|failures| retry_after(FailureClass::Transient, failures).unwrap())
            .collect();
        assert_eq!(delays[0], Duration::from_secs(1));
        assert_eq!(delays[1], Duration::from_secs(2));
        assert_eq!(delays[2], Duration::from_secs(4));
        assert!(delays.windows(2).all(|pair| pair[0] <= pair[1]));
        assert_eq!(*delays.last().unwrap(), MAX_BACKOFF);
        assert_eq!(
            retry_after(FailureClass::Transient, u32::MAX),
            Some(MAX_BACKOFF)
        );
    }

    #[test]
    fn a_lost_write_race_is_retried_at_once_after_a_fresh_read() {
        assert_eq!(classify(&apply_failure(409)), FailureClass::Conflict);
        assert_eq!(
            retry_after(FailureClass::Conflict, 7),
            Some(Duration::from_secs(1))
        );
    }

    #[test]
    fn invalid_specs_wait_for_a_change_instead_of_retrying() {
        assert_eq!(classify(&apply_failure(422)), FailureClass::InvalidSpec);
        assert_eq!(classify(&apply_failure(400)), FailureClass::InvalidSpec);
        assert_eq!(
            classify(&Error::ReadSpec {
                field: "rollout.maxUnavailable",
                reason: "bad".into()
            }),
            FailureClass::InvalidSpec
        );
        assert_eq!(
            classify(&Error::ComputeKubeProxyPatch {
                namespace: "kube-system".into(),
                name: "kube-proxy".into(),
                reason: "x".into()
            }),
            FailureClass::InvalidSpec
        );
        assert_eq!(retry_after(FailureClass::InvalidSpec, 1), None);
    }

    #[test]
    fn missing_permissions_are_retried_slowly() {
        assert_eq!(classify(&apply_failure(403)), FailureClass::Forbidden);
        assert_eq!(retry_after(FailureClass::Forbidden, 1), Some(MAX_BACKOFF));
    }

    #[test]
    fn every_error_names_the_step_that_failed() {
        assert_eq!(step(&apply_failure(500)), "apply_dataplane_node");
        assert_eq!(
            step(&Error::LeadershipLost { reason: "x".into() }),
            "leader_election"
        );
    }
}
