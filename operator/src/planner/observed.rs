//! The observed snapshot the planner decides from: plain data a controller fills from the
//! cluster (Nodes, DataplaneNodes, the kube-proxy DaemonSet and its pods, the agent DaemonSet
//! and its pods, the Services the eBPF datapath cannot serve yet) plus the clock.
//!
//! The snapshot holds everything the planner reads, and nothing in the planner survives a
//! reconcile, so an operator restarted in the middle of a transition, given the same cluster,
//! makes the same decision the previous one would have made.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use switchyard_crds::DataplaneNode;

use super::parity::UnsupportedService;

/// What the operator sees of the cluster at one instant.
#[derive(Clone, Debug, PartialEq)]
pub struct ObservedCluster {
    /// The clock. Every timeout is computed from it and from times recorded in the cluster
    /// (`DataplaneNode.spec.requestedAt`, pod creation times), never from the operator's memory.
    pub now: DateTime<Utc>,

    /// Every Node of the cluster, with what runs on it. Order does not matter (the planner sorts
    /// by name, so that batches are chosen the same way on every reconcile).
    pub nodes: Vec<ObservedNode>,

    /// The kube-proxy DaemonSet named by `spec.kubeProxy`; `None` when it does not exist.
    pub kube_proxy_daemon_set: Option<KubeProxyDaemonSet>,

    /// The agent DaemonSet; `None` when it does not exist (no agent upgrade is then planned).
    pub agent_daemon_set: Option<AgentDaemonSet>,

    /// Whether the operator knows the API server's real address to give the agents (so they do
    /// not depend on the `kubernetes` Service they are about to take over). Preflight refuses
    /// to start a transition to `Ebpf` without it.
    pub api_server_address_configured: bool,

    /// The Services kube-proxy proxies that use a feature the eBPF datapath does not serve yet
    /// (see [`super::parity`]), in any order; Services without such a feature are not listed.
    /// A transition to `Ebpf` does not start while one exists.
    pub unsupported_services: Vec<Arc<UnsupportedService>>,
}

/// One Node and what runs on it.
#[derive(Clone, Debug, PartialEq)]
pub struct ObservedNode {
    /// The Node's name (also the name of its DataplaneNode).
    pub name: String,

    /// The Node's `Ready` condition is `True` (the kubelet is heard from).
    pub ready: bool,

    /// The Node's labels (`spec.rollout.canary.nodeSelector` picks canary nodes by them).
    pub labels: BTreeMap<String, String>,

    /// The node's DataplaneNode as read from the API (spec, `metadata.generation` and the agent's
    /// status); `None` when it does not exist yet (the plan then creates it). Shared with the
    /// operator's store rather than copied: a snapshot of 5,000 nodes would otherwise copy every
    /// DataplaneNode and its conditions on every reconcile.
    pub dataplane_node: Option<Arc<DataplaneNode>>,

    /// The kube-proxy pod on this node, if any (including one that is terminating: it may still
    /// write rules). Pods not yet bound to a node belong to the node their DaemonSet node
    /// affinity names.
    pub kube_proxy_pod: Option<ObservedPod>,

    /// The Switchyard agent pod on this node, if any.
    pub agent_pod: Option<ObservedPod>,
}

/// A pod, as far as the planner cares.
#[derive(Clone, Debug, PartialEq)]
pub struct ObservedPod {
    /// The pod's name (agent pods are deleted by name during upgrades).
    pub name: String,

    /// The pod's `Ready` condition is `True`.
    pub ready: bool,

    /// The pod's `controller-revision-hash` label: the revision of its DaemonSet it runs.
    pub revision: Option<String>,

    /// The pod's `metadata.creationTimestamp`. A freshly started agent gets the full node ready
    /// timeout from this moment.
    pub created_at: Option<DateTime<Utc>>,

    /// The pod has a `metadata.deletionTimestamp` (it is shutting down).
    pub terminating: bool,
}

/// The kube-proxy DaemonSet.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KubeProxyDaemonSet {
    /// The DaemonSet carries Switchyard's disabling nodeSelector
    /// (`switchyard.dev/kube-proxy: disabled`), so it schedules on no node.
    pub disabled_by_switchyard: bool,

    /// `status.desiredNumberScheduled`, only when the status is current
    /// (`status.observedGeneration == metadata.generation`); `None` otherwise. `Some(0)` means the
    /// DaemonSet schedules on no node (for example, someone else's nodeSelector excludes every
    /// node).
    pub desired_number_scheduled: Option<i32>,

    /// A description of the ownership mark of another tool (Helm, Argo CD, the addon manager),
    /// for example `argocd.argoproj.io/tracking-id`. With `management: Managed` the operator then
    /// refuses to touch the DaemonSet.
    pub external_owner: Option<String>,

    /// Whether the operator may patch the DaemonSet, as the API server answered a
    /// SelfSubjectAccessReview; `None` when not known (not asked, or the review failed). With
    /// `management: Managed` a `Some(false)` is refused in preflight: the transition would
    /// otherwise switch every node to eBPF and then stop at `DisablingKubeProxy` on a 403 (a
    /// hand-written DataplaneConfig naming a DaemonSet the operator's Role does not cover).
    pub patch_allowed: Option<bool>,
}

impl KubeProxyDaemonSet {
    /// Whether the DaemonSet still runs (or would start) kube-proxy pods on nodes.
    pub fn would_schedule(&self) -> bool {
        !self.disabled_by_switchyard && self.desired_number_scheduled != Some(0)
    }

    /// Whether the API server said the operator may not patch the DaemonSet.
    pub fn patch_refused(&self) -> bool {
        self.patch_allowed == Some(false)
    }
}

/// The agent DaemonSet (`updateStrategy: OnDelete`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AgentDaemonSet {
    /// The revision pods should run: the `controller-revision-hash` label of the DaemonSet's
    /// newest ControllerRevision (highest `revision`). `None` while unknown, which plans no
    /// upgrade.
    pub update_revision: Option<String>,
}
