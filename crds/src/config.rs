//! `DataplaneConfig`: the cluster-wide choice of Service dataplane.

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::canary::{BudgetExceeded, BudgetExceededAction, CanarySpec, DisruptionBudget};
use crate::condition::Condition;

/// The name of the only `DataplaneConfig` the operator acts on; any other gets a `Degraded`
/// condition saying it is ignored.
pub const DEFAULT_CONFIG_NAME: &str = "default";

/// Which dataplane implements Services. `KubeProxy`: kube-proxy does, in whatever mode it runs
/// (Switchyard's programs are detached). `Ebpf`: Switchyard's TC programs do; kube-proxy is
/// disabled and its rules are cleaned.
#[derive(
    Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Hash, PartialOrd, Ord,
)]
pub enum DataplaneMode {
    KubeProxy,
    Ebpf,
}

impl DataplaneMode {
    /// The other mode: where a transition to `self` comes from.
    pub fn opposite(self) -> Self {
        match self {
            Self::KubeProxy => Self::Ebpf,
            Self::Ebpf => Self::KubeProxy,
        }
    }
}

impl std::fmt::Display for DataplaneMode {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            Self::KubeProxy => "KubeProxy",
            Self::Ebpf => "Ebpf",
        })
    }
}

/// Who disables and restores the kube-proxy DaemonSet. `Managed`: the operator does (it adds a
/// nodeSelector no node matches and later restores exactly the previous one). `External`:
/// someone else does (for example GitOps); the operator waits for it and reports.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Hash)]
pub enum KubeProxyManagement {
    #[default]
    Managed,
    External,
}

/// Whether nodes remove kube-proxy's rules once Services are served from eBPF. `Auto`: a node
/// cleans kube-proxy's rules only after kube-proxy is gone from that node. `Disabled`: rules are
/// left in place.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Hash)]
pub enum IptablesCleanupPolicy {
    #[default]
    Auto,
    Disabled,
}

/// Where a transition stands. `Pending`: nothing decided yet. `Preflight`: checking that every
/// node can take part. `ActivatingNodes`: nodes are switched to eBPF in batches.
/// `DisablingKubeProxy`: waiting for kube-proxy to leave every node. `CleaningRules`: nodes
/// remove kube-proxy's rules. `RestoringKubeProxy`: waiting for kube-proxy to be healthy on
/// every node. `DeactivatingNodes`: nodes go back to kube-proxy in batches. `UpgradingAgents`:
/// agent pods are replaced in batches. `Ready`: the requested mode is in place. `Paused`:
/// `spec.paused` froze the transition. `Halted`: the transition stopped because nodes failed.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Hash)]
pub enum DataplanePhase {
    #[default]
    Pending,
    Preflight,
    ActivatingNodes,
    DisablingKubeProxy,
    CleaningRules,
    RestoringKubeProxy,
    DeactivatingNodes,
    UpgradingAgents,
    Ready,
    Paused,
    Halted,
}

impl std::fmt::Display for DataplanePhase {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, formatter)
    }
}

/// The cluster's Service dataplane, and how to move between kube-proxy and Switchyard's eBPF
/// datapath. The operator acts only on the object named `default`.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    group = "switchyard.dev",
    version = "v1alpha1",
    kind = "DataplaneConfig",
    plural = "dataplaneconfigs",
    singular = "dataplaneconfig",
    shortname = "dpc",
    status = "DataplaneConfigStatus",
    derive = "PartialEq",
    doc = "The cluster's Service dataplane (kube-proxy or Switchyard's eBPF datapath) and how the operator moves between them. Only the object named `default` is acted on.",
    printcolumn = r#"{"name": "Mode", "type": "string", "description": "The requested dataplane.", "jsonPath": ".spec.mode"}"#,
    printcolumn = r#"{"name": "Phase", "type": "string", "description": "Where the transition stands.", "jsonPath": ".status.phase"}"#,
    printcolumn = r#"{"name": "Serving", "type": "string", "description": "Nodes serving Services from eBPF, out of all nodes.", "jsonPath": ".status.servingSummary"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct DataplaneConfigSpec {
    /// Which dataplane implements Services: `KubeProxy` (kube-proxy, whatever its own mode) or
    /// `Ebpf` (Switchyard's TC programs; kube-proxy disabled and its rules cleaned).
    pub mode: DataplaneMode,

    /// Freezes the transition where it stands: no node, kube-proxy or agent change is made
    /// while true. The status says so.
    #[serde(default)]
    pub paused: bool,

    /// How kube-proxy is found and who disables and restores it.
    #[serde(default)]
    pub kube_proxy: KubeProxySpec,

    /// Whether nodes remove kube-proxy's rules once they serve from eBPF: `Auto` (a node cleans
    /// only after kube-proxy is gone from it) or `Disabled`.
    #[serde(default)]
    pub iptables_cleanup: IptablesCleanupPolicy,

    /// How fast nodes are switched, and how failures are tolerated.
    #[serde(default)]
    pub rollout: RolloutSpec,
}

/// How kube-proxy is found and who disables and restores it.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct KubeProxySpec {
    /// `Managed`: the operator disables the kube-proxy DaemonSet (a nodeSelector no node matches)
    /// and restores exactly its previous nodeSelector. `External`: someone else (for example
    /// GitOps) removes or restores it; the operator waits and reports.
    #[serde(default)]
    pub management: KubeProxyManagement,

    /// Namespace of the kube-proxy DaemonSet.
    #[serde(default = "default_kube_proxy_namespace")]
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,

    /// Name of the kube-proxy DaemonSet.
    #[serde(default = "default_kube_proxy_daemon_set_name")]
    #[schemars(length(min = 1, max = 253))]
    pub daemon_set_name: String,
}

impl Default for KubeProxySpec {
    fn default() -> Self {
        Self {
            management: KubeProxyManagement::default(),
            namespace: default_kube_proxy_namespace(),
            daemon_set_name: default_kube_proxy_daemon_set_name(),
        }
    }
}

fn default_kube_proxy_namespace() -> String {
    "kube-system".to_owned()
}

fn default_kube_proxy_daemon_set_name() -> String {
    "kube-proxy".to_owned()
}

/// How fast nodes are switched, and how failures are tolerated.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RolloutSpec {
    /// How many nodes may be switching (or having their agent replaced) at once: a count (at
    /// least 1) or a percentage of the nodes such as `25%` (rounded up, at least one node).
    #[serde(default = "default_max_unavailable")]
    pub max_unavailable: IntOrString,

    /// Seconds a node has, from the moment it is asked, to report what was asked (for example
    /// that its programs are attached); after that it counts as failed.
    #[serde(default = "default_node_ready_timeout_seconds")]
    #[schemars(range(min = 1, max = 86400))]
    pub node_ready_timeout_seconds: i64,

    /// How many failed nodes the remaining batches of node activations tolerate. Disabling
    /// kube-proxy still needs every node, so with failed nodes the transition halts before it.
    /// 0 halts at the first failed node.
    #[serde(default)]
    #[schemars(range(min = 0, max = 1000000))]
    pub max_failed_nodes: i32,

    /// Seconds a node told to go back to kube-proxy keeps translating the connections it already
    /// carries before it detaches anyway. Copied into each DataplaneNode's spec.
    #[serde(default = "default_drain_timeout_seconds")]
    #[schemars(range(min = 0, max = 86400))]
    pub drain_timeout_seconds: i64,

    /// Opt-in canary: which nodes switch to eBPF first and how long switched nodes are watched
    /// (their disruption signals compared with their own baseline) before more nodes switch.
    /// Absent: no canary, no soak and no wait for disruption signals; nodes switch in batches
    /// of `maxUnavailable`. Given, even as `{}`: one canary node soaking 60 s. Opt-in until the
    /// canary path is proven end to end (`make e2e-canary`); then one canary of 60 s becomes
    /// the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanarySpec>,

    /// How much worse than its own baseline under kube-proxy a switched node may get. Read
    /// only when `canary` is set.
    #[serde(default)]
    pub disruption_budget: DisruptionBudget,

    /// What happens when a switched node exceeds the disruption budget: `Rollback` (the nodes
    /// over budget go back to kube-proxy, and the transition does not start again until the
    /// spec changes) or `Halt` (the transition holds until the node is back within budget).
    /// Read only when `canary` is set.
    #[serde(default)]
    pub on_budget_exceeded: BudgetExceededAction,
}

impl Default for RolloutSpec {
    fn default() -> Self {
        Self {
            max_unavailable: default_max_unavailable(),
            node_ready_timeout_seconds: default_node_ready_timeout_seconds(),
            max_failed_nodes: 0,
            drain_timeout_seconds: default_drain_timeout_seconds(),
            canary: None,
            disruption_budget: DisruptionBudget::default(),
            on_budget_exceeded: BudgetExceededAction::default(),
        }
    }
}

fn default_max_unavailable() -> IntOrString {
    IntOrString::Int(1)
}

fn default_node_ready_timeout_seconds() -> i64 {
    300
}

/// The default drain timeout (seconds) of a node going back to kube-proxy.
pub const DEFAULT_DRAIN_TIMEOUT_SECONDS: i64 = 600;

fn default_drain_timeout_seconds() -> i64 {
    DEFAULT_DRAIN_TIMEOUT_SECONDS
}

impl Default for DataplaneConfigSpec {
    /// What the operator does when no `DataplaneConfig` named `default` exists: `KubeProxy`.
    fn default() -> Self {
        Self {
            mode: DataplaneMode::KubeProxy,
            paused: false,
            kube_proxy: KubeProxySpec::default(),
            iptables_cleanup: IptablesCleanupPolicy::default(),
            rollout: RolloutSpec::default(),
        }
    }
}

/// What the operator observed and decided, written by the operator.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DataplaneConfigStatus {
    /// The `metadata.generation` of the spec this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,

    /// Where the transition stands.
    #[serde(default)]
    pub phase: DataplanePhase,

    /// `Ready` (the requested mode is in place), `Progressing` (a transition or agent upgrade is
    /// under way) and `Degraded` (something needs attention; the reason and message say what).
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// Counts of nodes by state.
    #[serde(default)]
    pub nodes: NodeCounts,

    /// Nodes serving Services from eBPF out of all nodes (for example `3/3`), for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving_summary: Option<String>,

    /// The current (or last) transition between modes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transition: Option<Transition>,

    /// A human-readable account of where things stand, naming the nodes that block progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,

    /// The disruption budget was exceeded under the current spec: the evidence and what the
    /// operator did. Cleared when the spec changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_exceeded: Option<BudgetExceeded>,
}

/// Counts of nodes by state.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NodeCounts {
    /// All nodes.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub total: i32,
    /// Nodes serving Services from eBPF (programs attached and Services synced).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub serving: i32,
    /// Nodes with a running kube-proxy pod.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub kube_proxy_running: i32,
    /// Nodes asked to clean kube-proxy's rules that report none left.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub rules_cleaned: i32,
    /// Nodes whose agent runs the agent DaemonSet's current revision and reports Ready.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub agent_up_to_date: i32,
    /// Nodes that did not report what was asked within `nodeReadyTimeoutSeconds`.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub failed: i32,
    /// Nodes told to go back to kube-proxy that still translate connections they already carry.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub draining: i32,
}

/// A transition between modes.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Transition {
    /// The mode the cluster is leaving.
    pub from: DataplaneMode,
    /// The mode the cluster is going to.
    pub to: DataplaneMode,
    /// When the operator first saw the request (RFC 3339).
    #[serde(with = "crate::time::rfc3339_seconds")]
    #[schemars(with = "DateTime<Utc>")]
    pub started_at: DateTime<Utc>,
    /// When the requested mode was in place on every node (RFC 3339); absent while under way.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::time::option_rfc3339_seconds"
    )]
    #[schemars(with = "Option<DateTime<Utc>>")]
    pub finished_at: Option<DateTime<Utc>>,
}
