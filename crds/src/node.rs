//! `DataplaneNode`: the operator's instruction to one node (spec) and its agent's report (status).

use chrono::{DateTime, Utc};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::condition::{condition_is_true, Condition};
use crate::config::{DataplaneMode, DEFAULT_DRAIN_TIMEOUT_SECONDS};
use crate::disruption::DisruptionReport;

/// The operator's instruction to one node. Named after its Node and owned by it, so it is
/// garbage-collected with the Node. The agent on the node follows the spec and reports in the
/// status.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[kube(
    group = "switchyard.dev",
    version = "v1alpha1",
    kind = "DataplaneNode",
    plural = "dataplanenodes",
    singular = "dataplanenode",
    shortname = "dpn",
    status = "DataplaneNodeStatus",
    derive = "PartialEq",
    doc = "The operator's instruction to one node (spec) and the node agent's report (status). Named after its Node, owned by it.",
    printcolumn = r#"{"name": "Mode", "type": "string", "description": "The dataplane this node is told to use.", "jsonPath": ".spec.mode"}"#,
    printcolumn = r#"{"name": "Ready", "type": "string", "description": "Whether the agent reports Ready.", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name": "Cleanup", "type": "boolean", "description": "Whether the node is told to clean kube-proxy's rules.", "jsonPath": ".spec.iptablesCleanup"}"#,
    printcolumn = r#"{"name": "Agent", "type": "string", "description": "The version of the agent on the node.", "jsonPath": ".status.agentVersion"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct DataplaneNodeSpec {
    /// Which dataplane this node uses: `KubeProxy` (no programs attached, maps kept in sync) or
    /// `Ebpf` (programs attached, Services served by them).
    pub mode: DataplaneMode,

    /// Whether the node removes kube-proxy's Service rules. The operator sets it only once
    /// kube-proxy is gone from the node.
    #[serde(default)]
    pub iptables_cleanup: bool,

    /// When the operator last changed this spec (RFC 3339). Timeouts are computed from it, so
    /// they survive operator restarts.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::time::option_rfc3339_seconds"
    )]
    #[schemars(with = "Option<DateTime<Utc>>")]
    pub requested_at: Option<DateTime<Utc>>,

    /// Seconds the node, once told `KubeProxy`, keeps translating the connections it already
    /// carries before it detaches anyway. Copied from the DataplaneConfig.
    #[serde(default = "default_drain_timeout_seconds")]
    #[schemars(range(min = 0, max = 86400))]
    pub drain_timeout_seconds: i64,
}

fn default_drain_timeout_seconds() -> i64 {
    DEFAULT_DRAIN_TIMEOUT_SECONDS
}

/// The agent's report, written by the agent on the node.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DataplaneNodeStatus {
    /// The `metadata.generation` of the spec the agent acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,

    /// The version of the agent binary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<String>,

    /// The agent pod's `controller-revision-hash` label (given through the downward API), so the
    /// operator knows which agent DaemonSet revision reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_revision: Option<String>,

    /// `HostMetadataReady`, `ProgramsAttached`, `ServicesSynced`, `KubeProxyRulesPresent`,
    /// `KubeProxyHealthy`, `ChainOrderSafe`, `Draining` and `Ready`.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// How many Service frontends the agent has programmed into its maps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub services_programmed: Option<i64>,

    /// Live TCP flows in the agent's own conntrack still translated while draining.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub live_flows: Option<i64>,

    /// When the agent last applied a sync of its maps (RFC 3339).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::time::option_rfc3339_seconds"
    )]
    #[schemars(with = "Option<DateTime<Utc>>")]
    pub last_sync_time: Option<DateTime<Utc>>,

    /// The disruption the node shows: its signals under kube-proxy before it switched (the
    /// baseline) and over the most recent window. Absent when the agent measures none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disruption: Option<DisruptionReport>,
}

impl DataplaneNodeStatus {
    /// Whether the condition of type `type_` is `True`.
    pub fn condition_is_true(&self, type_: &str) -> bool {
        condition_is_true(&self.conditions, type_)
    }
}

impl DataplaneNodeSpec {
    /// A spec telling the node to use `mode`, with the default drain timeout and no cleanup.
    pub fn new(mode: DataplaneMode) -> Self {
        Self {
            mode,
            iptables_cleanup: false,
            requested_at: None,
            drain_timeout_seconds: DEFAULT_DRAIN_TIMEOUT_SECONDS,
        }
    }
}
