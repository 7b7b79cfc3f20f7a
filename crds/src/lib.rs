//! The `switchyard.dev/v1alpha1` API.
//!
//! - [`DataplaneConfig`] (cluster-scoped, short name `dpc`): which dataplane implements Services
//!   (`KubeProxy` or `Ebpf`) and how the operator moves between them. Only the object named
//!   [`DEFAULT_CONFIG_NAME`] is acted on.
//! - [`DataplaneNode`] (cluster-scoped, short name `dpn`, named after its Node): the operator's
//!   instruction to one node (spec) and the node agent's report (status).
//!
//! Both schemas are structural, use no CEL and are accepted by a Kubernetes 1.20 API server.
//! [`crds_yaml`] renders them; `cargo run -p switchyard-crds --bin crdgen` prints it and the
//! committed `crds/switchyard.dev_crds.yaml` must equal it.

pub mod canary;
pub mod condition;
pub mod config;
pub mod crd;
pub mod disruption;
pub mod node;
pub mod time;

pub use canary::{
    AffectedService, BudgetExceeded, BudgetExceededAction, BudgetedSignal, CanarySpec,
    DisruptionBudget, DisruptionEvidence, DEFAULT_SOAK_SECONDS,
};
pub use condition::{
    condition_is_false, condition_is_true, find_condition, set_condition, Condition,
    ConditionStatus,
};
pub use config::{
    DataplaneConfig, DataplaneConfigSpec, DataplaneConfigStatus, DataplaneMode, DataplanePhase,
    IptablesCleanupPolicy, KubeProxyManagement, KubeProxySpec, NodeCounts, RolloutSpec, Transition,
    DEFAULT_CONFIG_NAME, DEFAULT_DRAIN_TIMEOUT_SECONDS,
};
pub use crd::{crds, crds_yaml, Error};
pub use disruption::{
    ConnectionSignals, DatapathSignals, DisruptionReport, ExpectedDrops, ProbeSignals,
    ServiceSignals, SignalWindow,
};
pub use node::{DataplaneNode, DataplaneNodeSpec, DataplaneNodeStatus};

/// The API group.
pub const API_GROUP: &str = "switchyard.dev";
/// The API version.
pub const API_VERSION: &str = "v1alpha1";

/// Condition types: those of `DataplaneConfig` status, then those of `DataplaneNode` status.
pub mod condition_types {
    /// DataplaneConfig and DataplaneNode: the requested state is in place. On a DataplaneNode:
    /// the agent's start-of-day gate is open and it follows the current spec.
    pub const READY: &str = "Ready";
    /// DataplaneConfig: a transition or an agent upgrade is under way.
    pub const PROGRESSING: &str = "Progressing";
    /// DataplaneConfig: something needs attention (failed nodes, a refused step, an ignored object).
    pub const DEGRADED: &str = "Degraded";
    /// DataplaneConfig: no Service uses a feature the eBPF datapath does not serve yet (the
    /// parity preflight's answer, whatever the mode: `False` names the Services).
    pub const SERVICES_SUPPORTED: &str = "ServicesSupported";

    /// DataplaneNode: the agent has every input it needs before it writes its maps (pinned map
    /// state, host IPs, its Node, the initial Services and EndpointSlices, its DataplaneNode).
    pub const HOST_METADATA_READY: &str = "HostMetadataReady";
    /// DataplaneNode: the TC programs are attached (True only in `Ebpf` mode or while draining).
    pub const PROGRAMS_ATTACHED: &str = "ProgramsAttached";
    /// DataplaneNode: the maps hold the current Services and endpoints.
    pub const SERVICES_SYNCED: &str = "ServicesSynced";
    /// DataplaneNode: kube-proxy's Service rules are present on the node.
    pub const KUBE_PROXY_RULES_PRESENT: &str = "KubeProxyRulesPresent";
    /// DataplaneNode: kube-proxy's rules are present on the node and its healthz answers 200.
    pub const KUBE_PROXY_HEALTHY: &str = "KubeProxyHealthy";
    /// DataplaneNode: eBPF-translated traffic cannot be dropped by kube-proxy's chains.
    pub const CHAIN_ORDER_SAFE: &str = "ChainOrderSafe";
    /// DataplaneNode: told `KubeProxy`, the programs still translate live flows before detaching.
    pub const DRAINING: &str = "Draining";
}

/// Condition reasons (CamelCase identifiers), shared by the operator and the agent.
pub mod reasons {
    // DataplaneConfig.
    /// The object is not named `default`, so the operator ignores it.
    pub const NOT_DEFAULT: &str = "NotDefault";
    /// The spec cannot be acted on (for example a malformed `maxUnavailable`).
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// `spec.paused` is true.
    pub const PAUSED: &str = "Paused";
    /// A precondition of the transition does not hold yet.
    pub const PREFLIGHT_FAILED: &str = "PreflightFailed";
    /// A transition between modes is under way.
    pub const TRANSITION_IN_PROGRESS: &str = "TransitionInProgress";
    /// A node that joined (or whose DataplaneNode was recreated) is being brought to the mode.
    pub const NODES_JOINING: &str = "NodesJoining";
    /// The requested mode is in place on every node.
    pub const TRANSITION_COMPLETE: &str = "TransitionComplete";
    /// Agent pods are being replaced by the agent DaemonSet's update revision.
    pub const AGENT_UPGRADE_IN_PROGRESS: &str = "AgentUpgradeInProgress";
    /// More nodes failed than `maxFailedNodes` allows, or a failed node blocks the next step.
    pub const NODES_FAILED: &str = "NodesFailed";
    /// An agent upgrade stopped because a node did not come back in time.
    pub const AGENT_UPGRADE_FAILED: &str = "AgentUpgradeFailed";
    /// Agents on some nodes do not report Ready (reported while nothing else is going on).
    pub const AGENTS_NOT_READY: &str = "AgentsNotReady";
    /// Nothing needs attention.
    pub const AS_EXPECTED: &str = "AsExpected";
    /// The kube-proxy DaemonSet carries Helm, Argo CD or addon-manager ownership marks, so
    /// `management: Managed` is refused: set `management: External`.
    pub const KUBE_PROXY_MANAGED_EXTERNALLY: &str = "KubeProxyManagedExternally";
    /// `management: Managed`, but the operator may not patch the kube-proxy DaemonSet (RBAC).
    pub const KUBE_PROXY_NOT_PATCHABLE: &str = "KubeProxyNotPatchable";
    /// The kube-proxy DaemonSet does not exist.
    pub const KUBE_PROXY_NOT_FOUND: &str = "KubeProxyNotFound";
    /// `management: External`: waiting for someone else to remove kube-proxy.
    pub const WAITING_FOR_KUBE_PROXY_REMOVAL: &str = "WaitingForKubeProxyRemoval";
    /// Waiting for kube-proxy to be healthy on every node.
    pub const WAITING_FOR_KUBE_PROXY: &str = "WaitingForKubeProxy";
    /// kube-proxy came back while the cluster is on `Ebpf`.
    pub const KUBE_PROXY_RETURNED: &str = "KubeProxyReturned";
    /// The operator has no address of the API server to give the agents.
    pub const API_SERVER_ADDRESS_MISSING: &str = "ApiServerAddressMissing";
    /// Some Services use a feature the eBPF datapath does not serve yet (SCTP, IPv6): a
    /// transition to `Ebpf` is refused before any node is
    /// activated; once on eBPF, `ServicesSupported` is `False`.
    pub const UNSUPPORTED_SERVICES: &str = "UnsupportedServices";
    /// Every Service uses only what the eBPF datapath serves (`ServicesSupported` `True`).
    pub const ALL_SERVICES_SUPPORTED: &str = "AllServicesSupported";
    /// A switched node showed more disruption than `spec.rollout.disruptionBudget` allows: the
    /// transition rolled those nodes back or holds (`spec.rollout.onBudgetExceeded`); the
    /// message and `status.budgetExceeded` hold the evidence.
    pub const DISRUPTION_BUDGET_EXCEEDED: &str = "DisruptionBudgetExceeded";
    /// A switched node that reports disruption signals did not report a baseline and a window
    /// after its soak within `nodeReadyTimeoutSeconds`: the transition holds until it does.
    pub const DISRUPTION_SIGNALS_MISSING: &str = "DisruptionSignalsMissing";
    /// `spec.rollout.canary.nodeSelector` matches no node: no node switches.
    pub const CANARY_NODES_NOT_FOUND: &str = "CanaryNodesNotFound";

    // DataplaneNode (written by the agent).
    /// The start-of-day gate stayed closed past its timeout; the message names the missing input.
    pub const HOST_METADATA_TIMEOUT: &str = "HostMetadataTimeout";
    /// Every start-of-day input arrived.
    pub const HOST_METADATA_RECEIVED: &str = "HostMetadataReceived";
    /// Waiting for start-of-day inputs.
    pub const WAITING_FOR_HOST_METADATA: &str = "WaitingForHostMetadata";
    /// kube-proxy runs in a mode Switchyard does not take over from (IPVS).
    pub const UNSUPPORTED_KUBE_PROXY_MODE: &str = "UnsupportedKubeProxyMode";
    /// kube-proxy's rules came back after cleanup: the agent stopped cleaning, never fighting it.
    pub const KUBE_PROXY_CONFLICT: &str = "KubeProxyConflict";
    /// The programs are attached.
    pub const ATTACHED: &str = "Attached";
    /// The programs are not attached (mode `KubeProxy`).
    pub const DETACHED: &str = "Detached";
    /// Attaching the programs failed; the message says why.
    pub const ATTACH_FAILED: &str = "AttachFailed";
    /// The maps hold the current Services.
    pub const SYNCED: &str = "Synced";
    /// Applying the desired map state failed; the message says why.
    pub const SYNC_FAILED: &str = "SyncFailed";
    /// kube-proxy's rules are present.
    pub const RULES_PRESENT: &str = "RulesPresent";
    /// No kube-proxy rule is left.
    pub const RULES_ABSENT: &str = "RulesAbsent";
    /// Removing kube-proxy's rules failed; the message says why.
    pub const CLEANUP_FAILED: &str = "CleanupFailed";
    /// kube-proxy's healthz answered 200 and its rules are present.
    pub const KUBE_PROXY_HEALTHZ_OK: &str = "KubeProxyHealthzOk";
    /// kube-proxy's healthz did not answer 200, or its rules are missing.
    pub const KUBE_PROXY_UNHEALTHY: &str = "KubeProxyUnhealthy";
    /// The agent's rules precede kube-proxy's where needed.
    pub const CHAIN_ORDER_VERIFIED: &str = "ChainOrderVerified";
    /// Something displaced the agent's rules; they were put back.
    pub const CHAIN_ORDER_RESTORED: &str = "ChainOrderRestored";
    /// Live flows are still translated before detaching.
    pub const DRAINING_FLOWS: &str = "DrainingFlows";
    /// No live flow remained, so the programs detached.
    pub const DRAIN_COMPLETE: &str = "DrainComplete";
    /// The drain timeout passed, so the programs detached with flows left.
    pub const DRAIN_TIMEOUT_EXPIRED: &str = "DrainTimeoutExpired";
    /// The agent follows the current spec.
    pub const AGENT_READY: &str = "AgentReady";
}
