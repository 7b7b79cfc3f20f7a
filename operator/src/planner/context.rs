//! One planning round's inputs ([`Context`]) and what every flow shares: the per-node desired
//! specs ([`Decision`]), the mode of created DataplaneNodes, the halt and `Ready` decisions, the
//! cleanup rule, and the writes and requeue a decision turns into.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use switchyard_crds::{
    reasons, BudgetExceeded, DataplaneMode, DataplaneNodeSpec, DataplanePhase,
    IptablesCleanupPolicy, KubeProxyManagement,
};

use super::facts::NodeFacts;
use super::parity::{self, UnsupportedService};
use super::settings::Settings;
use super::{
    name_list, AgentPodDeletion, DataplaneNodeWrite, KubeProxyAction, KubeProxyDaemonSet,
    ObservedCluster,
};

/// The desired spec of one node, before it is compared with what is there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DesiredNode {
    pub(crate) mode: DataplaneMode,
    pub(crate) cleanup: bool,
}

/// What the flow decided, before it becomes a plan and a status.
#[derive(Clone, Debug)]
pub(crate) struct Decision {
    /// Per node (same order as the facts).
    pub(crate) desired: Vec<DesiredNode>,
    pub(crate) kube_proxy: KubeProxyAction,
    pub(crate) agent_pods_to_delete: Vec<AgentPodDeletion>,
    pub(crate) phase: DataplanePhase,
    /// The requested mode is in place on every node (the `Ready` condition).
    pub(crate) mode_in_place: bool,
    /// The reason of `Progressing` (and of `Ready` while not in place).
    pub(crate) reason: &'static str,
    /// `Degraded`: the reason and what the user should know.
    pub(crate) degraded: Option<(&'static str, String)>,
    /// Where things stand, naming blocking nodes.
    pub(crate) message: String,
    /// Deadlines of replaced agents that have not reported yet (upgrade in flight).
    pub(crate) upgrade_deadlines: Vec<DateTime<Utc>>,
    /// When a switched node's soak ends or its wait for disruption signals reaches its bound.
    pub(crate) canary_deadlines: Vec<DateTime<Utc>>,
    /// The disruption budget exceeded under the current spec: the evidence to publish.
    pub(crate) budget_exceeded: Option<BudgetExceeded>,
}

/// The inputs of one planning round, with what is derived from them once.
pub(crate) struct Context<'a> {
    pub(crate) settings: &'a Settings,
    pub(crate) facts: &'a [NodeFacts<'a>],
    pub(crate) observed: &'a ObservedCluster,
    pub(crate) now: DateTime<Utc>,
    /// Per node: did not do what was asked in time.
    pub(crate) failed: Vec<bool>,
    /// The kube-proxy DaemonSet still runs or would start pods.
    pub(crate) kube_proxy_schedules: bool,
    /// No kube-proxy pod anywhere and the DaemonSet schedules nowhere.
    pub(crate) kube_proxy_gone: bool,
    /// The last status said kube-proxy came back (still waiting for it to leave): once cleanup
    /// is withdrawn from every node, this is what still remembers that it had been gone.
    pub(crate) kube_proxy_reported_returned: bool,
    /// The mode every missing DataplaneNode is created with, whatever the flow (see
    /// [`created_mode`]).
    pub(crate) created_mode: DataplaneMode,
    /// The Services the eBPF datapath does not serve yet, in namespace/name order.
    pub(crate) unsupported_services: Vec<Arc<UnsupportedService>>,
    /// eBPF serves some node (told `Ebpf`, or draining).
    pub(crate) ebpf_serves_some_node: bool,
    /// The DataplaneConfig's `metadata.generation`.
    pub(crate) generation: Option<i64>,
    /// What the last status recorded about the disruption budget under this very spec (same
    /// generation): after a `Rollback`, no node is activated again until the spec changes.
    pub(crate) recorded_budget_exceeded: Option<&'a BudgetExceeded>,
}

/// The mode a missing DataplaneNode is created with (never with cleanup).
///
/// A DataplaneNode is missing on a new Node, and also on a Node that re-registered under the
/// same name (its DataplaneNode, owned by the old Node, was garbage-collected): that node's
/// agent keeps its programs while it has no DataplaneNode and follows the spec once one exists.
/// Creating it as `KubeProxy` makes an attached agent drain and detach, which is safe only
/// where kube-proxy serves the node. Nothing on a missing DataplaneNode says whether it does
/// (its agent's reports went with it), so the cluster decides:
/// - `Ebpf` while Switchyard has the kube-proxy DaemonSet disabled: kube-proxy is gone or
///   leaving from every node (disabling, cleaning, on eBPF, a rollback before the restore,
///   any hold there).
/// - `Ebpf` while some node is told `Ebpf` unless the cluster heads to `Ebpf` with a kube-proxy
///   DaemonSet that still schedules: a rollback (kube-proxy restored but not yet healthy
///   everywhere, then deactivation), a hold with no DataplaneConfig (it may be a rollback), or
///   kube-proxy absent or scheduling nowhere (removed by its owner with `management: External`).
///   A node created so is deactivated later through the normal batches, only once its own
///   agent reports kube-proxy healthy there, and the rollback is not Ready before.
/// - `KubeProxy` otherwise: kube-proxy serves the node (a node joining a cluster Switchyard
///   never switched, one joining after a rollback finished, or one joining during an
///   activation, which brings it to eBPF later, once its agent is Ready, in the batches).
///
/// Limit: if the last nodes still told `Ebpf` during a rollback all lose their DataplaneNodes at
/// once, no fact is left to tell them from nodes joining a cluster back on kube-proxy, and they
/// are created as `KubeProxy`.
pub(crate) fn created_mode(
    requested: DataplaneMode,
    kube_proxy_daemon_set: Option<&KubeProxyDaemonSet>,
    facts: &[NodeFacts],
) -> DataplaneMode {
    let disabled = kube_proxy_daemon_set.is_some_and(|set| set.disabled_by_switchyard);
    let schedules = kube_proxy_daemon_set.is_some_and(KubeProxyDaemonSet::would_schedule);
    let any_on_ebpf = facts
        .iter()
        .any(|node| node.mode() == Some(DataplaneMode::Ebpf));
    let kube_proxy_stays = requested == DataplaneMode::Ebpf && schedules;
    if disabled || (any_on_ebpf && !kube_proxy_stays) {
        DataplaneMode::Ebpf
    } else {
        DataplaneMode::KubeProxy
    }
}

impl<'a> Context<'a> {
    pub(super) fn new(
        settings: &'a Settings,
        facts: &'a [NodeFacts<'a>],
        observed: &'a ObservedCluster,
        now: DateTime<Utc>,
    ) -> Self {
        let failed = facts
            .iter()
            .map(|node| node.failed(settings, now))
            .collect();
        let kube_proxy_schedules = observed
            .kube_proxy_daemon_set
            .as_ref()
            .is_some_and(KubeProxyDaemonSet::would_schedule);
        let kube_proxy_gone =
            !kube_proxy_schedules && !facts.iter().any(NodeFacts::has_kube_proxy_pod);
        Self {
            settings,
            facts,
            observed,
            now,
            failed,
            kube_proxy_schedules,
            kube_proxy_gone,
            kube_proxy_reported_returned: false,
            created_mode: created_mode(
                settings.mode,
                observed.kube_proxy_daemon_set.as_ref(),
                facts,
            ),
            unsupported_services: parity::in_order(&observed.unsupported_services),
            ebpf_serves_some_node: facts.iter().any(NodeFacts::ebpf_serves),
            generation: None,
            recorded_budget_exceeded: None,
        }
    }

    pub(super) fn names_where(
        &self,
        predicate: impl Fn(usize, &NodeFacts) -> bool,
    ) -> Vec<&'a str> {
        self.facts
            .iter()
            .enumerate()
            .filter(|(index, node)| predicate(*index, node))
            .map(|(_, node)| node.name)
            .collect()
    }

    pub(super) fn failed_names(&self) -> Vec<&'a str> {
        self.names_where(|index, _| self.failed[index])
    }

    pub(super) fn failed_count(&self) -> usize {
        self.failed.iter().filter(|failed| **failed).count()
    }

    /// Whether failed nodes are all a batch flow has left: none of `others` (the nodes it
    /// switches, waits for or queues) names a node, and some node failed.
    pub(super) fn only_failed_nodes_left(&self, others: &[&Vec<&str>]) -> bool {
        others.iter().all(|names| names.is_empty()) && self.failed_count() > 0
    }

    /// Every node keeps its current spec; nodes without a DataplaneNode get `created_mode`.
    pub(super) fn unchanged(&self) -> Vec<DesiredNode> {
        self.facts
            .iter()
            .map(|node| DesiredNode {
                mode: node.mode().unwrap_or(self.created_mode),
                cleanup: node.cleanup_requested(),
            })
            .collect()
    }

    /// A missing DataplaneNode created on eBPF by [`created_mode`]: no activation of its own.
    pub(super) fn created_on_ebpf(&self, node: &NodeFacts) -> bool {
        node.spec.is_none() && self.created_mode == DataplaneMode::Ebpf
    }

    pub(super) fn decision(
        &self,
        desired: Vec<DesiredNode>,
        phase: DataplanePhase,
        reason: &'static str,
        message: String,
    ) -> Decision {
        Decision {
            desired,
            kube_proxy: KubeProxyAction::None,
            agent_pods_to_delete: Vec::new(),
            phase,
            mode_in_place: false,
            reason,
            degraded: None,
            message,
            upgrade_deadlines: Vec::new(),
            canary_deadlines: Vec::new(),
            budget_exceeded: None,
        }
    }

    /// The halt decision: the transition stops where it stands and says which nodes failed.
    pub(super) fn halted(&self, desired: Vec<DesiredNode>, step: &str) -> Decision {
        let failed = self.failed_names();
        // Before DisablingKubeProxy, a halt leaves kube-proxy exactly as it was: say so.
        let kube_proxy = if self.settings.mode == DataplaneMode::Ebpf && !self.kube_proxy_gone {
            "; kube-proxy untouched"
        } else {
            ""
        };
        let message = format!(
            "halted before {step}: {} failed node(s) ({}), {} allowed by rollout.maxFailedNodes{kube_proxy}. \
             A node that recovers resumes the transition.",
            failed.len(),
            name_list(failed.iter().copied()),
            self.settings.max_failed_nodes,
        );
        let mut decision = self.decision(
            desired,
            DataplanePhase::Halted,
            reasons::NODES_FAILED,
            message.clone(),
        );
        decision.degraded = Some((reasons::NODES_FAILED, message));
        decision
    }

    /// `Ready`: the requested mode is in place. Failed nodes left (agents not Ready on nodes that
    /// are nonetheless in the requested mode) are reported as Degraded.
    pub(super) fn ready(&self, desired: Vec<DesiredNode>, message: &str) -> Decision {
        let mut decision = self.decision(
            desired,
            DataplanePhase::Ready,
            reasons::TRANSITION_COMPLETE,
            message.to_owned(),
        );
        decision.mode_in_place = true;
        let failed = self.failed_names();
        if !failed.is_empty() {
            decision.degraded = Some((
                reasons::AGENTS_NOT_READY,
                format!(
                    "the agent is not Ready on {}",
                    name_list(failed.iter().copied())
                ),
            ));
        } else if self.settings.mode == DataplaneMode::KubeProxy
            && self.settings.management == KubeProxyManagement::Managed
            && self.observed.kube_proxy_daemon_set.is_none()
        {
            decision.degraded = Some((
                reasons::KUBE_PROXY_NOT_FOUND,
                "the kube-proxy DaemonSet named in spec.kubeProxy does not exist: nothing implements Services".into(),
            ));
        }
        decision
    }

    /// Per node, whether it should clean kube-proxy's rules. Applied after the flow chose the
    /// modes, in every phase, so that cleanup is never requested on a node where kube-proxy runs
    /// or could start, and is withdrawn as soon as kube-proxy comes back.
    pub(super) fn decide_cleanup(&self, decision: &mut Decision) {
        for (index, node) in self.facts.iter().enumerate() {
            let desired = &mut decision.desired[index];
            let safe = self.settings.mode == DataplaneMode::Ebpf
                && self.settings.cleanup == IptablesCleanupPolicy::Auto
                && !self.kube_proxy_schedules
                && !node.has_kube_proxy_pod()
                && desired.mode == DataplaneMode::Ebpf;
            // A node asked before keeps its cleanup; a new request needs the node serving from
            // eBPF on an unchanged spec first, so no node ever loses both dataplanes.
            desired.cleanup = safe
                && (node.cleanup_requested()
                    || (node.serving_from_ebpf() && node.mode() == Some(desired.mode)));
        }
    }

    /// The DataplaneNodes whose spec changes, with `requestedAt` set to now.
    pub(super) fn node_writes(&self, decision: &Decision) -> Vec<DataplaneNodeWrite> {
        let mut writes = Vec::new();
        for (node, desired) in self.facts.iter().zip(&decision.desired) {
            let spec = DataplaneNodeSpec {
                mode: desired.mode,
                iptables_cleanup: desired.cleanup,
                requested_at: Some(self.now),
                drain_timeout_seconds: self.settings.drain_timeout_seconds,
            };
            let changed = match node.spec {
                None => true,
                Some(current) => {
                    current.mode != spec.mode
                        || current.iptables_cleanup != spec.iptables_cleanup
                        || current.drain_timeout_seconds != spec.drain_timeout_seconds
                        || current.requested_at.is_none()
                }
            };
            if changed {
                writes.push(DataplaneNodeWrite {
                    node_name: node.name.to_owned(),
                    create: node.spec.is_none(),
                    spec,
                });
            }
        }
        writes
    }

    /// The time until the earliest timeout that could change the plan without any event.
    pub(super) fn requeue_after(
        &self,
        decision: &Decision,
        writes: &[DataplaneNodeWrite],
    ) -> Option<Duration> {
        let written: std::collections::BTreeSet<&str> = writes
            .iter()
            .map(|write| write.node_name.as_str())
            .collect();
        // try_seconds: a timeout too long for a time (a spec from before the schema's ranges)
        // has no deadline rather than a panic.
        let timeout = chrono::Duration::try_seconds(self.settings.node_ready_timeout_seconds);
        let written_deadline = (!writes.is_empty())
            .then(|| timeout.and_then(|timeout| self.now.checked_add_signed(timeout)))
            .flatten();
        let node_deadlines = self
            .facts
            .iter()
            .filter(|node| !node.satisfied() && !written.contains(node.name))
            .filter_map(|node| node.deadline(self.settings));
        node_deadlines
            .chain(written_deadline)
            .chain(decision.upgrade_deadlines.iter().copied())
            .chain(decision.canary_deadlines.iter().copied())
            .filter(|deadline| *deadline > self.now)
            .min()
            .and_then(|deadline| (deadline - self.now).to_std().ok())
    }
}
