//! The DataplaneConfig spec, checked and resolved into the numbers the planner uses.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use switchyard_crds::{
    BudgetExceededAction, CanarySpec, DataplaneConfigSpec, DataplaneMode, DisruptionBudget,
    IptablesCleanupPolicy, KubeProxyManagement,
};

use crate::error::Error;

/// A DataplaneConfig spec the planner can act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Settings {
    pub(crate) mode: DataplaneMode,
    pub(crate) paused: bool,
    pub(crate) management: KubeProxyManagement,
    pub(crate) cleanup: IptablesCleanupPolicy,
    /// `maxUnavailable` resolved against the node count: at least 1.
    pub(crate) max_unavailable: usize,
    pub(crate) node_ready_timeout_seconds: i64,
    pub(crate) max_failed_nodes: usize,
    pub(crate) drain_timeout_seconds: i64,
    /// `None`: no canary (`rollout.canary` absent; it is opt-in), the transition as before
    /// canaries existed.
    pub(crate) canary: Option<CanarySettings>,
}

/// Which nodes go first, how long switched nodes soak, and the disruption budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CanarySettings {
    pub(crate) canaries: CanaryNodes,
    pub(crate) soak_seconds: i64,
    pub(crate) batch_soak_seconds: i64,
    pub(crate) budget: DisruptionBudget,
    pub(crate) on_budget_exceeded: BudgetExceededAction,
}

/// How the canary nodes are chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CanaryNodes {
    /// The first `count` nodes the activation picks.
    Count(usize),
    /// Every node carrying all these labels.
    Selector(BTreeMap<String, String>),
}

impl Settings {
    /// Checks what the schema cannot (the API server enforces the ranges, but objects written
    /// before a schema change, or by a test, may still carry anything) and resolves
    /// `maxUnavailable` against `node_count`.
    pub(crate) fn from_spec(spec: &DataplaneConfigSpec, node_count: usize) -> Result<Self, Error> {
        let rollout = &spec.rollout;
        if rollout.node_ready_timeout_seconds < 1 {
            return Err(invalid(
                "rollout.nodeReadyTimeoutSeconds",
                "must be at least 1",
            ));
        }
        if rollout.drain_timeout_seconds < 0 {
            return Err(invalid(
                "rollout.drainTimeoutSeconds",
                "must not be negative",
            ));
        }
        let max_failed_nodes = usize::try_from(rollout.max_failed_nodes)
            .map_err(|_| invalid("rollout.maxFailedNodes", "must not be negative"))?;
        let canary = rollout
            .canary
            .as_ref()
            .map(|canary| {
                CanarySettings::from_spec(
                    canary,
                    &rollout.disruption_budget,
                    rollout.on_budget_exceeded,
                )
            })
            .transpose()?;
        Ok(Self {
            mode: spec.mode,
            paused: spec.paused,
            management: spec.kube_proxy.management,
            cleanup: spec.iptables_cleanup,
            max_unavailable: resolve_max_unavailable(&rollout.max_unavailable, node_count)?,
            node_ready_timeout_seconds: rollout.node_ready_timeout_seconds,
            max_failed_nodes,
            drain_timeout_seconds: rollout.drain_timeout_seconds,
            canary,
        })
    }
}

impl CanarySettings {
    /// Checks what a Kubernetes 1.20 API server cannot (no CEL: count and selector together) and
    /// what objects written before the schema had these ranges may carry.
    fn from_spec(
        canary: &CanarySpec,
        budget: &DisruptionBudget,
        on_budget_exceeded: BudgetExceededAction,
    ) -> Result<Self, Error> {
        let canaries = match (canary.count, &canary.node_selector) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "rollout.canary",
                    "set count or nodeSelector, not both",
                ))
            }
            (None, Some(selector)) if selector.is_empty() => {
                return Err(invalid(
                    "rollout.canary.nodeSelector",
                    "must name at least one label (it would match every node)",
                ))
            }
            (None, Some(selector)) => CanaryNodes::Selector(selector.clone()),
            (Some(count), None) => match usize::try_from(count) {
                Ok(count) if count >= 1 => CanaryNodes::Count(count),
                _ => {
                    return Err(invalid(
                        "rollout.canary.count",
                        format!("{count} is not a count of at least 1"),
                    ))
                }
            },
            (None, None) => CanaryNodes::Count(1),
        };
        if canary.soak_seconds < 0 {
            return Err(invalid(
                "rollout.canary.soakSeconds",
                "must not be negative",
            ));
        }
        let batch_soak_seconds = canary.batch_soak_seconds.unwrap_or(canary.soak_seconds / 3);
        if batch_soak_seconds < 0 {
            return Err(invalid(
                "rollout.canary.batchSoakSeconds",
                "must not be negative",
            ));
        }
        for (field, value) in [
            (
                "rollout.disruptionBudget.failedConnectsPerMinute",
                budget.failed_connects_per_minute,
            ),
            (
                "rollout.disruptionBudget.failedConnectsPercent",
                budget.failed_connects_percent,
            ),
            (
                "rollout.disruptionBudget.resetsPerMinute",
                budget.resets_per_minute,
            ),
            (
                "rollout.disruptionBudget.resetsPercent",
                budget.resets_percent,
            ),
            (
                "rollout.disruptionBudget.probeFailuresPerMinute",
                budget.probe_failures_per_minute,
            ),
        ] {
            if value < 0 {
                return Err(invalid(field, format!("{value} is negative")));
            }
        }
        Ok(Self {
            canaries,
            soak_seconds: canary.soak_seconds,
            batch_soak_seconds,
            budget: budget.clone(),
            on_budget_exceeded,
        })
    }
}

fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
    Error::ReadSpec {
        field,
        reason: reason.into(),
    }
}

/// A count (at least 1), or a percentage `N%` with 0 <= N <= 100 of `node_count`, rounded up
/// and at least 1 so that a transition can always make progress.
pub(crate) fn resolve_max_unavailable(
    value: &IntOrString,
    node_count: usize,
) -> Result<usize, Error> {
    const FIELD: &str = "rollout.maxUnavailable";
    match value {
        IntOrString::Int(count) => match usize::try_from(*count) {
            Ok(count) if count >= 1 => Ok(count),
            _ => Err(invalid(
                FIELD,
                format!("{count} is not a count of at least 1"),
            )),
        },
        IntOrString::String(text) => {
            let percent = text
                .strip_suffix('%')
                .and_then(|digits| digits.parse::<u32>().ok())
                .filter(|percent| *percent <= 100)
                .ok_or_else(|| {
                    invalid(
                        FIELD,
                        format!("{text:?} is neither a count nor a percentage such as \"25%\""),
                    )
                })?;
            let scaled = (node_count as u64 * u64::from(percent)).div_ceil(100);
            Ok(usize::try_from(scaled).unwrap_or(usize::MAX).max(1))
        }
    }
}
