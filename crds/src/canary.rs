//! Canary transitions: which nodes switch to eBPF first and how long they soak
//! (`spec.rollout.canary`), how much disruption a node may show against its own baseline
//! (`spec.rollout.disruptionBudget`) and what happens beyond it (`spec.rollout.onBudgetExceeded`),
//! plus the evidence the operator writes when a budget is exceeded
//! (`status.budgetExceeded`). What the agents measure is in [`crate::disruption`].
//!
//! The canary is opt-in: only a spec with `rollout.canary` (even `{}`) gets one. Not all the
//! budgeted signals are measured yet and no end-to-end suite proves the canary path, so a
//! transition without it behaves as before canaries existed; once `make e2e-canary` proves it,
//! a canary of one node soaking 60 s becomes the default.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which nodes switch to eBPF first, and how long every switched node is watched before the
/// next nodes switch. Opt-in (`rollout.canary` absent: no canary); when given, every field it
/// leaves out takes its default (`{}`: one canary node, 60 s of soak).
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CanarySpec {
    /// How many nodes switch first (the first ones in node-name order the activation picks).
    /// Absent: one node, unless `nodeSelector` is set. Set this or `nodeSelector`, not both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000000))]
    pub count: Option<i32>,

    /// Labels a node must carry (all of them) to be a canary: every matching node switches
    /// first, and no other node switches before they all passed their soak. Set this or
    /// `count`, not both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,

    /// Seconds each canary node is watched after it serves from eBPF before any other node
    /// switches: its disruption signals are compared with its own baseline under kube-proxy.
    /// 0 compares the first signals measured after the switch.
    #[serde(default = "default_soak_seconds")]
    #[schemars(range(min = 0, max = 86400))]
    pub soak_seconds: i64,

    /// Seconds each later batch of nodes is watched before the next batch switches. Absent: a
    /// third of `soakSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 86400))]
    pub batch_soak_seconds: Option<i64>,
}

impl Default for CanarySpec {
    fn default() -> Self {
        Self {
            count: None,
            node_selector: None,
            soak_seconds: default_soak_seconds(),
            batch_soak_seconds: None,
        }
    }
}

/// The default canary soak, in seconds.
pub const DEFAULT_SOAK_SECONDS: i64 = 60;

fn default_soak_seconds() -> i64 {
    DEFAULT_SOAK_SECONDS
}

/// How much worse than its own baseline under kube-proxy a switched node may get. A signal is
/// over budget when its rate per minute exceeds the baseline's by more than the absolute
/// allowance *and* (where there is one) by more than the relative one: a quiet node (baseline
/// near zero) is judged by the absolute allowance, a busy one by the relative allowance.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DisruptionBudget {
    /// Failed connects to Service addresses (reset before established, or timed out) per
    /// minute a node may show above its baseline.
    #[serde(default = "default_failed_connects_per_minute")]
    #[schemars(range(min = 0, max = 1000000000))]
    pub failed_connects_per_minute: i64,

    /// Failed connects, in percent of the baseline's rate, a node may show above its baseline.
    #[serde(default = "default_relative_percent")]
    #[schemars(range(min = 0, max = 1000000))]
    pub failed_connects_percent: i64,

    /// Established connections to Service addresses reset by the peer per minute a node may
    /// show above its baseline.
    #[serde(default = "default_resets_per_minute")]
    #[schemars(range(min = 0, max = 1000000000))]
    pub resets_per_minute: i64,

    /// Resets by the peer, in percent of the baseline's rate, a node may show above its
    /// baseline.
    #[serde(default = "default_relative_percent")]
    #[schemars(range(min = 0, max = 1000000))]
    pub resets_percent: i64,

    /// Failed active probes of Services with ready endpoints per minute a node may show above
    /// its baseline (probes answer or not; there is no relative allowance).
    #[serde(default = "default_probe_failures_per_minute")]
    #[schemars(range(min = 0, max = 1000000000))]
    pub probe_failures_per_minute: i64,
}

impl Default for DisruptionBudget {
    fn default() -> Self {
        Self {
            failed_connects_per_minute: default_failed_connects_per_minute(),
            failed_connects_percent: default_relative_percent(),
            resets_per_minute: default_resets_per_minute(),
            resets_percent: default_relative_percent(),
            probe_failures_per_minute: default_probe_failures_per_minute(),
        }
    }
}

fn default_failed_connects_per_minute() -> i64 {
    30
}

fn default_resets_per_minute() -> i64 {
    30
}

fn default_relative_percent() -> i64 {
    100
}

fn default_probe_failures_per_minute() -> i64 {
    6
}

/// What the operator does when a switched node exceeds the disruption budget. `Rollback`: the
/// nodes over budget go back to kube-proxy (drained, kube-proxy healthy on them first) and the
/// transition does not start again until the spec changes. `Halt`: the transition holds where
/// it stands while a node is over budget, and goes on once the node's signals are back within
/// budget.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Hash)]
pub enum BudgetExceededAction {
    #[default]
    Rollback,
    Halt,
}

impl std::fmt::Display for BudgetExceededAction {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, formatter)
    }
}

/// A signal the disruption budget limits.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Hash)]
pub enum BudgetedSignal {
    FailedConnects,
    ResetsByPeer,
    ProbeFailures,
}

impl std::fmt::Display for BudgetedSignal {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            Self::FailedConnects => "failed connects",
            Self::ResetsByPeer => "resets by peer",
            Self::ProbeFailures => "probe failures",
        })
    }
}

/// The disruption budget was exceeded: when, under which spec, what the operator did, and why.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BudgetExceeded {
    /// The `metadata.generation` of the spec whose rollout exceeded the budget. After a
    /// `Rollback` the transition does not start again while the spec keeps this generation.
    #[schemars(range(min = 0))]
    pub observed_generation: i64,

    /// What the operator did: `Rollback` or `Halt`.
    pub action: BudgetExceededAction,

    /// When the operator found the budget exceeded (RFC 3339).
    #[serde(with = "crate::time::rfc3339_seconds")]
    #[schemars(with = "DateTime<Utc>")]
    pub detected_at: DateTime<Utc>,

    /// Each signal over budget, node by node.
    #[serde(default)]
    pub evidence: Vec<DisruptionEvidence>,
}

/// One signal of one node over budget.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DisruptionEvidence {
    /// The node.
    pub node: String,

    /// The signal over budget.
    pub signal: BudgetedSignal,

    /// The rate per minute under kube-proxy, before the node switched (a decimal such as `0.5`).
    pub baseline_per_minute: String,

    /// The rate per minute after the node switched (a decimal such as `42.0`).
    pub observed_per_minute: String,

    /// The highest rate per minute the budget allowed (a decimal).
    pub allowed_per_minute: String,

    /// The Services most affected on that node, worst first.
    #[serde(default)]
    pub services: Vec<AffectedService>,
}

/// A Service affected on a node over budget.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AffectedService {
    /// The Service's namespace.
    pub namespace: String,

    /// The Service's name.
    pub name: String,

    /// How many of the signal's events the node's agent counted for the Service in its window
    /// after the switch.
    #[schemars(range(min = 0))]
    pub count: i64,
}
