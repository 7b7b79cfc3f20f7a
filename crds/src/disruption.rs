//! What an agent reports about the disruption its node shows (`DataplaneNode`
//! `status.disruption`): counts of each signal over a window under kube-proxy before the node
//! switched (the baseline) and over the most recent sliding window after it.
//!
//! Counts, not rates: a window's rate per minute is `count × 60 / (end − start)`. Whole counts
//! with their window keep the report exact (no rounding, no float noise making every status
//! write a change) and let the operator compare windows of different lengths.
//!
//! Every field is optional: an agent that measures nothing reports no `disruption` at all, one
//! that measures only some signals leaves the others out.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The node's disruption signals: its baseline under kube-proxy and its most recent window.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DisruptionReport {
    /// Measured under kube-proxy, ending at or before the moment the node last switched to
    /// eBPF. Kept (not slid) once the node switched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<SignalWindow>,

    /// The sliding window: the most recent counts, starting no earlier than the moment the node
    /// last switched dataplane (so a window after the switch holds nothing from before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<SignalWindow>,
}

/// Counts of each signal over one window of time.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SignalWindow {
    /// Where the window starts (RFC 3339).
    #[serde(with = "crate::time::rfc3339_seconds")]
    #[schemars(with = "DateTime<Utc>")]
    pub start: DateTime<Utc>,

    /// Where the window ends: when these counts were read (RFC 3339).
    #[serde(with = "crate::time::rfc3339_seconds")]
    #[schemars(with = "DateTime<Utc>")]
    pub end: DateTime<Utc>,

    /// From the datapath: what it did wrong.
    #[serde(default)]
    pub datapath: DatapathSignals,

    /// From the datapath: what it dropped or refused by design. Shown apart, never counted
    /// against the disruption budget.
    #[serde(default)]
    pub expected: ExpectedDrops,

    /// From the kernel's view of TCP connections to Service addresses made by the node's pods
    /// and host processes.
    #[serde(default)]
    pub connections: ConnectionSignals,

    /// From the node's active probes of Services with ready endpoints.
    #[serde(default)]
    pub probes: ProbeSignals,

    /// The Services with the most failed connects, resets by peer and probe failures in this
    /// window, worst first (at most ten).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<ServiceSignals>,
}

/// Datapath counts that point at a datapath problem.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DatapathSignals {
    /// Packets the datapath failed to translate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub translation_errors: Option<i64>,

    /// New flows refused for lack of endpoints although the Service has ready endpoints on
    /// some node (the datapath's view is behind or wrong).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub refused_with_endpoints_ready_elsewhere: Option<i64>,

    /// New flows the conntrack table had no room for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub conntrack_overflows: Option<i64>,

    /// IP fragments that arrived without their first fragment (no ports to translate by).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub fragments_without_first: Option<i64>,
}

/// Datapath counts of drops and refusals by design.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ExpectedDrops {
    /// New flows refused because the Service has no ready endpoint anywhere (kube-proxy
    /// refuses them too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub refused_without_ready_endpoints: Option<i64>,

    /// Packets dropped by a Service's `loadBalancerSourceRanges`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub source_range_drops: Option<i64>,
}

/// Counts about TCP connections to Service addresses.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionSignals {
    /// Connects that failed: reset before established, or timed out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub failed_connects: Option<i64>,

    /// SYN retransmissions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub syn_retransmits: Option<i64>,

    /// Established connections reset by the peer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub resets_by_peer: Option<i64>,
}

/// Counts about the node's active probes.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ProbeSignals {
    /// Probes sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub sent: Option<i64>,

    /// Probes that got no answer (TCP connect refused, reset or timed out; UDP unanswered where
    /// the port answers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub failures: Option<i64>,
}

/// The budgeted counts of one Service in a window.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSignals {
    /// The Service's namespace.
    pub namespace: String,

    /// The Service's name.
    pub name: String,

    /// Failed connects to the Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub failed_connects: Option<i64>,

    /// Connections to the Service reset by the peer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub resets_by_peer: Option<i64>,

    /// Failed probes of the Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub probe_failures: Option<i64>,
}
