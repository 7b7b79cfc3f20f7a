//! The transition planner: from what the cluster looks like now, the next safe step of a
//! dataplane transition. Pure: no I/O, no clock of its own, no memory between calls.
//!
//! [`plan`] takes the `DataplaneConfig` (or `None` when there is none named `default`) and an
//! [`ObservedCluster`] snapshot and returns a [`Plan`]: the DataplaneNode specs to write, the
//! kube-proxy action, the agent pods to delete and the status to publish. A controller applies
//! the plan and calls again on the next change (or after [`Plan::requeue_after`]).
//!
//! # KubeProxy -> Ebpf
//! 1. `Preflight` (while no node is told `Ebpf`): every node has a DataplaneNode whose agent
//!    reports Ready on its current spec and whose Node is Ready; no agent reports
//!    `UnsupportedKubeProxyMode`; the API server address is configured; with `Managed`, the
//!    kube-proxy DaemonSet carries no other tool's ownership marks and the operator may patch it
//!    (a SelfSubjectAccessReview). A missing DaemonSet is said.
//! 2. `ActivatingNodes`: `mode: Ebpf` on at most `maxUnavailable` nodes at a time (nodes in
//!    flight included); a node is done when it reports `ProgramsAttached` and `ServicesSynced`
//!    on the spec that asked. Up to `maxFailedNodes` failed nodes let further batches go on.
//! 3. `DisablingKubeProxy`, only when every node serves from eBPF: `Managed` disables the
//!    DaemonSet, `External` waits. Done when no node has a kube-proxy pod.
//! 4. `CleaningRules` (`iptablesCleanup: Auto`): `iptablesCleanup: true` on each node that
//!    serves from eBPF and has no kube-proxy pod while the DaemonSet schedules nowhere; done when
//!    every node reports `KubeProxyRulesPresent` False.
//! 5. `Ready`; agent upgrades may then run (`UpgradingAgents`).
//!
//! # Ebpf -> KubeProxy
//! `iptablesCleanup: false` everywhere first; `RestoringKubeProxy` (`Managed` restores the
//! DaemonSet once every node acknowledged the end of cleanup, `External` waits) until every node
//! reports `KubeProxyHealthy`; `DeactivatingNodes` in batches of `maxUnavailable`, a node told
//! `KubeProxy` counting as done once its agent reports it detached; draining nodes are shown,
//! not counted against `maxUnavailable` nor as failed before their drain timeout; `Ready`.
//!
//! # Missing DataplaneNodes
//! A Node without a DataplaneNode (new, or re-registered under the same name, whose agent keeps
//! its programs meanwhile) gets one in the mode `created_mode` picks from the whole cluster:
//! `Ebpf` wherever kube-proxy may not serve it (disabled by Switchyard, removed, or a rollback
//! not finished), `KubeProxy` otherwise; never with cleanup. Every flow creates them so.
//!
//! # Reversals, pauses, failures
//! Batches are chosen in node-name order, so a snapshot that does not yet show the last writes
//! (a lagging informer cache) picks the same nodes again, never more of them.
//!
//! The flow is chosen from the requested mode and the observed state, so a change of
//! `spec.mode` mid-way turns the transition around from where it stands, through every safety
//! step of the new direction. `paused` plans no change at all. A node fails when it has not
//! done what its spec asks within `nodeReadyTimeoutSeconds` of the later of `requestedAt` and
//! its agent pod's start. More failed nodes than `maxFailedNodes` halt at once; fewer halt only
//! where the next step needs every node. A node that recovers clears `Halted` by itself.
//!
//! # Agent upgrades
//! Only in `Ready`. Pods whose revision differs from the DaemonSet's update revision are deleted
//! `maxUnavailable` at a time; the next batch waits until every replaced node's DataplaneNode
//! reports Ready with `agentRevision` equal to the update revision. A replaced agent that does
//! not report within `nodeReadyTimeoutSeconds` of its pod's start halts the upgrade.

mod facts;
mod observed;
mod settings;
mod status;
#[cfg(test)]
mod tests;

use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::ResourceExt;
use switchyard_crds::{
    reasons, DataplaneConfig, DataplaneConfigSpec, DataplaneConfigStatus, DataplaneMode,
    DataplaneNodeSpec, DataplanePhase, IptablesCleanupPolicy, KubeProxyManagement,
    DEFAULT_CONFIG_NAME,
};

pub use observed::{
    AgentDaemonSet, KubeProxyDaemonSet, ObservedCluster, ObservedNode, ObservedPod,
};

use facts::NodeFacts;
use settings::Settings;

/// What the operator should do now.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// DataplaneNodes to create or update, in node-name order. Only nodes whose spec changes are
    /// listed; every listed spec carries `requestedAt` = the snapshot's clock.
    pub dataplane_nodes: Vec<DataplaneNodeWrite>,
    /// What to do with the kube-proxy DaemonSet.
    pub kube_proxy: KubeProxyAction,
    /// Agent pods to delete (rolling upgrade), in node-name order.
    pub agent_pods_to_delete: Vec<AgentPodDeletion>,
    /// The DataplaneConfig status to publish; `None` when there is no DataplaneConfig.
    pub status: Option<DataplaneConfigStatus>,
    /// When to plan again if nothing changes before: the next moment a node's timeout expires.
    pub requeue_after: Option<Duration>,
}

/// One DataplaneNode to write.
#[derive(Clone, Debug, PartialEq)]
pub struct DataplaneNodeWrite {
    /// The Node's name, which is also the DataplaneNode's.
    pub node_name: String,
    /// The DataplaneNode does not exist: create it, owned by its Node.
    pub create: bool,
    /// The whole spec to write.
    pub spec: DataplaneNodeSpec,
}

/// What to do with the kube-proxy DaemonSet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KubeProxyAction {
    /// Leave it as it is.
    None,
    /// Add the nodeSelector no node matches (`switchyard.dev/kube-proxy: disabled`), recording
    /// the previous one.
    Disable,
    /// Put back exactly the nodeSelector recorded when it was disabled.
    Restore,
}

/// An agent pod to delete so that the DaemonSet (`OnDelete`) recreates it at its update revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentPodDeletion {
    /// The node the pod runs on.
    pub node_name: String,
    /// The pod's name.
    pub pod_name: String,
}

/// Decides the next safe step.
///
/// `config` is the DataplaneConfig to act on. Pass the one named `default`, or `None` when it
/// does not exist. Without one, the plan publishes no status and:
/// - on a cluster Switchyard never switched (no node told `Ebpf`, kube-proxy not disabled by
///   Switchyard, no cleanup), behaves as if it said `mode: KubeProxy` with every default,
///   creating the missing DataplaneNodes;
/// - on a cluster on eBPF (kube-proxy gone, nodes told `Ebpf`), keeps it there: it behaves as if
///   it said `mode: Ebpf`, which from there only brings joining nodes to eBPF and cleans them,
///   so deleting the DataplaneConfig rips nothing out under traffic;
/// - in the middle of a transition, holds everything where it stands (as `paused` does), except
///   that it creates missing DataplaneNodes (in the mode `created_mode` gives) and withdraws
///   cleanup wherever kube-proxy runs or could start.
///
/// A DataplaneConfig with any other name gets a plan that changes nothing and a status whose
/// `Degraded` condition says it is ignored.
///
/// The result depends only on the arguments: the same snapshot always gives the same plan.
pub fn plan(config: Option<&DataplaneConfig>, observed: &ObservedCluster) -> Plan {
    let now = switchyard_crds::time::truncate_to_seconds(observed.now);
    if let Some(config) = config {
        if config.name_any() != DEFAULT_CONFIG_NAME {
            return Plan::nothing_with_status(status::ignored(config, now));
        }
    }
    let mut nodes: Vec<&ObservedNode> = observed.nodes.iter().collect();
    nodes.sort_by(|left, right| left.name.cmp(&right.name));
    nodes.dedup_by(|later, earlier| later.name == earlier.name);

    let without_config = config
        .is_none()
        .then(|| WithoutConfig::of(&nodes, observed));
    let default_spec = DataplaneConfigSpec {
        mode: match without_config {
            Some(WithoutConfig::KeepOnEbpf) => DataplaneMode::Ebpf,
            _ => DataplaneMode::KubeProxy,
        },
        ..DataplaneConfigSpec::default()
    };
    let spec = config.map_or(&default_spec, |config| &config.spec);

    let settings = match Settings::from_spec(spec, nodes.len()) {
        Ok(settings) => settings,
        Err(error) => {
            let status = config.map(|config| status::invalid_spec(config, &error, now));
            return Plan {
                status,
                ..Plan::nothing()
            };
        }
    };

    let facts: Vec<NodeFacts> = nodes.iter().map(|node| NodeFacts::new(node)).collect();
    let holding = without_config == Some(WithoutConfig::Hold);
    let mut context = Context::new(&settings, &facts, observed, now);
    context.kube_proxy_reported_returned = reported_kube_proxy_returned(config);
    let mut decision = match settings.mode {
        _ if holding => context.hold(),
        DataplaneMode::Ebpf => context.toward_ebpf(),
        DataplaneMode::KubeProxy => context.toward_kube_proxy(),
    };
    if holding {
        context.withdraw_unsafe_cleanup(&mut decision);
    } else {
        context.decide_cleanup(&mut decision);
    }
    if decision.phase == DataplanePhase::Ready {
        context.upgrade_agents(&mut decision);
    }

    let writes = context.node_writes(&decision);
    let requeue_after = context.requeue_after(&decision, &writes);
    let status = config.map(|config| status::build(config, &context, &decision));
    if settings.paused {
        return Plan {
            status,
            requeue_after: None,
            ..Plan::nothing()
        };
    }
    Plan {
        dataplane_nodes: writes,
        kube_proxy: decision.kube_proxy,
        agent_pods_to_delete: decision.agent_pods_to_delete,
        status,
        requeue_after,
    }
}

/// What to do when no DataplaneConfig named `default` exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WithoutConfig {
    /// Switchyard never switched this cluster: act as `mode: KubeProxy`.
    StayOnKubeProxy,
    /// The cluster is on eBPF: keep it there.
    KeepOnEbpf,
    /// A transition was under way: hold it where it stands.
    Hold,
}

impl WithoutConfig {
    fn of(nodes: &[&ObservedNode], observed: &ObservedCluster) -> Self {
        let specs = || {
            nodes
                .iter()
                .filter_map(|node| node.dataplane_node.as_deref())
                .map(|node| &node.spec)
        };
        let any_ebpf = specs().any(|spec| spec.mode == DataplaneMode::Ebpf);
        let any_cleanup = specs().any(|spec| spec.iptables_cleanup);
        let daemon_set = observed.kube_proxy_daemon_set.as_ref();
        let disabled = daemon_set.is_some_and(|set| set.disabled_by_switchyard);
        let kube_proxy_gone = !daemon_set.is_some_and(KubeProxyDaemonSet::would_schedule)
            && nodes.iter().all(|node| node.kube_proxy_pod.is_none());
        if !any_ebpf && !any_cleanup && !disabled {
            Self::StayOnKubeProxy
        } else if any_ebpf && kube_proxy_gone {
            Self::KeepOnEbpf
        } else {
            Self::Hold
        }
    }
}

impl Plan {
    fn nothing() -> Self {
        Self {
            dataplane_nodes: Vec::new(),
            kube_proxy: KubeProxyAction::None,
            agent_pods_to_delete: Vec::new(),
            status: None,
            requeue_after: None,
        }
    }

    fn nothing_with_status(status: DataplaneConfigStatus) -> Self {
        Self {
            status: Some(status),
            ..Self::nothing()
        }
    }
}

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

/// Whether the DataplaneConfig's last status shows kube-proxy had left and is now back: it says
/// so (in DisablingKubeProxy), or the transition to `Ebpf` of this very spec had got past
/// kube-proxy (CleaningRules, Ready, UpgradingAgents). Needed once no node is told to clean any
/// more: the round that withdrew cleanup may have failed before its status was written (a
/// conflicting kube-proxy patch), and the next one must still know.
fn reported_kube_proxy_returned(config: Option<&DataplaneConfig>) -> bool {
    let Some(config) = config else {
        return false;
    };
    let Some(status) = config.status.as_ref() else {
        return false;
    };
    let says_so = status.phase == DataplanePhase::DisablingKubeProxy
        && status.conditions.iter().any(|condition| {
            condition.reason == reasons::KUBE_PROXY_RETURNED
                && condition.status == switchyard_crds::ConditionStatus::True
        });
    let was_past_kube_proxy = config.spec.mode == DataplaneMode::Ebpf
        && status.observed_generation == config.metadata.generation
        && matches!(
            status.phase,
            DataplanePhase::CleaningRules | DataplanePhase::Ready | DataplanePhase::UpgradingAgents
        );
    says_so || was_past_kube_proxy
}

/// Whether `phase` is a transition past Preflight: nodes (or kube-proxy, or the agents) are
/// being switched, so nothing that only Preflight checks may hold it any more.
pub(crate) fn switches_nodes(phase: DataplanePhase) -> bool {
    matches!(
        phase,
        DataplanePhase::ActivatingNodes
            | DataplanePhase::DisablingKubeProxy
            | DataplanePhase::CleaningRules
            | DataplanePhase::RestoringKubeProxy
            | DataplanePhase::DeactivatingNodes
            | DataplanePhase::UpgradingAgents
    )
}

/// At most this many node names in a message, so that status stays small on big clusters.
const NAMES_IN_MESSAGE: usize = 10;

/// `a, b and c`, or `a, b, ... and 7 more`.
pub(crate) fn name_list<'n>(names: impl IntoIterator<Item = &'n str>) -> String {
    let names: Vec<&str> = names.into_iter().collect();
    match names.len() {
        0 => String::new(),
        1 => names[0].to_owned(),
        count if count <= NAMES_IN_MESSAGE => {
            format!("{} and {}", names[..count - 1].join(", "), names[count - 1])
        }
        count => format!(
            "{} and {} more",
            names[..NAMES_IN_MESSAGE].join(", "),
            count - NAMES_IN_MESSAGE
        ),
    }
}

impl<'a> Context<'a> {
    fn new(
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
        }
    }

    fn names_where(&self, predicate: impl Fn(usize, &NodeFacts) -> bool) -> Vec<&'a str> {
        self.facts
            .iter()
            .enumerate()
            .filter(|(index, node)| predicate(*index, node))
            .map(|(_, node)| node.name)
            .collect()
    }

    fn failed_names(&self) -> Vec<&'a str> {
        self.names_where(|index, _| self.failed[index])
    }

    fn failed_count(&self) -> usize {
        self.failed.iter().filter(|failed| **failed).count()
    }

    /// Every node keeps its current spec; nodes without a DataplaneNode get `created_mode`.
    fn unchanged(&self) -> Vec<DesiredNode> {
        self.facts
            .iter()
            .map(|node| DesiredNode {
                mode: node.mode().unwrap_or(self.created_mode),
                cleanup: node.cleanup_requested(),
            })
            .collect()
    }

    /// A missing DataplaneNode created on eBPF by [`created_mode`]: no activation of its own.
    fn created_on_ebpf(&self, node: &NodeFacts) -> bool {
        node.spec.is_none() && self.created_mode == DataplaneMode::Ebpf
    }

    fn decision(
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
        }
    }

    /// The halt decision: the transition stops where it stands and says which nodes failed.
    fn halted(&self, desired: Vec<DesiredNode>, step: &str) -> Decision {
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

    /// KubeProxy -> Ebpf, from wherever the cluster stands.
    fn toward_ebpf(&self) -> Decision {
        let desired = self.unchanged();
        let not_serving = self.names_where(|_, node| !node.serving_from_ebpf());
        if !not_serving.is_empty() {
            let started = self
                .facts
                .iter()
                .any(|node| node.mode() == Some(DataplaneMode::Ebpf));
            if !started {
                if let Some(refusal) = self.preflight_refusal() {
                    return refusal;
                }
            }
            return self.activate(desired);
        }

        // Every node serves from eBPF.
        if !self.kube_proxy_gone {
            return self.disable_kube_proxy(desired);
        }

        if self.settings.cleanup == IptablesCleanupPolicy::Auto {
            let not_cleaned = self.names_where(|_, node| !node.rules_cleaned());
            if !not_cleaned.is_empty() {
                if self.failed_count() > self.settings.max_failed_nodes
                    || self
                        .names_where(|index, node| !node.rules_cleaned() && !self.failed[index])
                        .is_empty()
                {
                    return self.halted(desired, "finishing the cleanup of kube-proxy's rules");
                }
                let message = format!(
                    "cleaning kube-proxy's rules on {}",
                    name_list(not_cleaned.iter().copied())
                );
                return self.decision(
                    desired,
                    DataplanePhase::CleaningRules,
                    reasons::TRANSITION_IN_PROGRESS,
                    message,
                );
            }
        }

        self.ready(
            desired,
            "every node serves Services from eBPF and kube-proxy is gone",
        )
    }

    /// Why the transition may not start, if it may not.
    fn preflight_refusal(&self) -> Option<Decision> {
        let mut problems: Vec<String> = Vec::new();
        let mut degraded_reason: Option<&'static str> = None;

        let missing = self.names_where(|_, node| node.spec.is_none());
        if !missing.is_empty() {
            problems.push(format!(
                "DataplaneNodes being created for {}",
                name_list(missing.iter().copied())
            ));
        }
        let not_ready = self
            .names_where(|_, node| node.spec.is_some() && !(node.agent_ready() && node.node_ready));
        if !not_ready.is_empty() {
            problems.push(format!(
                "agent or Node not Ready on {}",
                name_list(not_ready.iter().copied())
            ));
        }
        let unsupported = self.names_where(|_, node| node.unsupported_kube_proxy_mode());
        if !unsupported.is_empty() {
            problems.push(format!(
                "kube-proxy runs in a mode Switchyard cannot take over from (IPVS) on {}",
                name_list(unsupported.iter().copied())
            ));
            degraded_reason = Some(reasons::UNSUPPORTED_KUBE_PROXY_MODE);
        }
        if !self.observed.api_server_address_configured {
            problems.push("the operator has no API server address to give the agents (they must not depend on the kubernetes Service)".into());
            degraded_reason.get_or_insert(reasons::API_SERVER_ADDRESS_MISSING);
        }
        if self.settings.management == KubeProxyManagement::Managed {
            if let Some(owner) = self
                .observed
                .kube_proxy_daemon_set
                .as_ref()
                .and_then(|set| set.external_owner.as_deref())
            {
                problems.push(format!(
                    "the kube-proxy DaemonSet is managed by another tool ({owner}): set spec.kubeProxy.management to External"
                ));
                degraded_reason.get_or_insert(reasons::KUBE_PROXY_MANAGED_EXTERNALLY);
            }
            let patch_refused = self
                .observed
                .kube_proxy_daemon_set
                .as_ref()
                .is_some_and(KubeProxyDaemonSet::patch_refused);
            if patch_refused {
                problems.push(
                    "the operator may not patch the kube-proxy DaemonSet that spec.kubeProxy names (RBAC): grant it patch on that DaemonSet, or set spec.kubeProxy.management to External".into(),
                );
                degraded_reason.get_or_insert(reasons::KUBE_PROXY_NOT_PATCHABLE);
            }
        }
        if problems.is_empty() {
            return None;
        }
        let failed = self.failed_names();
        if !failed.is_empty() {
            problems.push(format!(
                "failed node(s): {}",
                name_list(failed.iter().copied())
            ));
            degraded_reason.get_or_insert(reasons::NODES_FAILED);
        }
        if self.observed.kube_proxy_daemon_set.is_none() {
            problems.push("the kube-proxy DaemonSet is not there (already absent)".into());
        }
        let message = format!("preflight: {}", problems.join("; "));
        let mut decision = self.decision(
            self.unchanged(),
            DataplanePhase::Preflight,
            reasons::PREFLIGHT_FAILED,
            message.clone(),
        );
        decision.degraded = degraded_reason.map(|reason| (reason, message));
        Some(decision)
    }

    /// `ActivatingNodes`: the next batch of nodes to `Ebpf`.
    fn activate(&self, mut desired: Vec<DesiredNode>) -> Decision {
        let settings = self.settings;
        if self.failed_count() > settings.max_failed_nodes {
            return self.halted(desired, "activating more nodes");
        }
        let in_flight = self.names_where(|index, node| {
            node.mode() == Some(DataplaneMode::Ebpf)
                && !node.serving_from_ebpf()
                && !self.failed[index]
        });
        let capacity = settings.max_unavailable.saturating_sub(in_flight.len());
        // Missing DataplaneNodes created on eBPF need no activation: kube-proxy cannot serve
        // them, so they are not made unavailable and do not use up maxUnavailable.
        let created = self.names_where(|_, node| self.created_on_ebpf(node));
        let eligible = |index: usize, node: &NodeFacts| {
            node.mode() != Some(DataplaneMode::Ebpf)
                && !self.created_on_ebpf(node)
                && !self.failed[index]
                // Once kube-proxy is gone a node not on eBPF serves nothing, so waiting for its
                // agent gains nothing; before, only a node whose agent is ready may switch.
                && (self.kube_proxy_gone || (node.agent_ready() && node.node_ready && !node.unsupported_kube_proxy_mode()))
        };
        let mut activated = Vec::new();
        let mut chosen = vec![false; self.facts.len()];
        for (index, node) in self.facts.iter().enumerate() {
            if activated.len() < capacity && eligible(index, node) {
                desired[index] = DesiredNode {
                    mode: DataplaneMode::Ebpf,
                    cleanup: false,
                };
                activated.push(node.name);
                chosen[index] = true;
            }
        }
        let waiting = self.names_where(|index, node| {
            node.mode() != Some(DataplaneMode::Ebpf)
                && !self.created_on_ebpf(node)
                && !self.failed[index]
                && !chosen[index]
        });
        let failed = self.failed_names();
        if in_flight.is_empty()
            && activated.is_empty()
            && created.is_empty()
            && waiting.is_empty()
            && !failed.is_empty()
        {
            return self.halted(
                desired,
                "disabling kube-proxy (it needs every node serving from eBPF)",
            );
        }

        let mut parts = Vec::new();
        if !activated.is_empty() {
            parts.push(format!(
                "switching {} to eBPF",
                name_list(activated.iter().copied())
            ));
        }
        if !created.is_empty() {
            parts.push(format!(
                "creating the DataplaneNodes of {} on eBPF (kube-proxy cannot serve them)",
                name_list(created.iter().copied())
            ));
        }
        if !in_flight.is_empty() {
            parts.push(format!(
                "waiting for {} to report programs attached and Services synced",
                name_list(in_flight.iter().copied())
            ));
        }
        let blocked = self.names_where(|index, node| {
            node.mode() != Some(DataplaneMode::Ebpf)
                && !self.created_on_ebpf(node)
                && !self.failed[index]
                && !chosen[index]
                && !eligible(index, node)
        });
        if !blocked.is_empty() {
            parts.push(format!(
                "waiting for the agent and the Node to be Ready on {}",
                name_list(blocked.iter().copied())
            ));
        }
        let queued = waiting.len() - blocked.len();
        if queued > 0 {
            parts.push(format!(
                "{queued} more node(s) queued (rollout.maxUnavailable {})",
                settings.max_unavailable
            ));
        }
        if !failed.is_empty() {
            parts.push(format!("failed: {}", name_list(failed.iter().copied())));
        }
        if self.observed.kube_proxy_daemon_set.is_none() {
            parts.push("the kube-proxy DaemonSet is not there (already absent)".into());
        }
        let (reason, prefix) = if self.kube_proxy_gone {
            (
                reasons::NODES_JOINING,
                "bringing nodes without kube-proxy to eBPF: ",
            )
        } else {
            (reasons::TRANSITION_IN_PROGRESS, "")
        };
        let mut decision = self.decision(
            desired,
            DataplanePhase::ActivatingNodes,
            reason,
            format!("{prefix}{}", parts.join("; ")),
        );
        if !failed.is_empty() {
            decision.degraded = Some((
                reasons::NODES_FAILED,
                format!(
                    "{} node(s) failed ({}), {} allowed by rollout.maxFailedNodes",
                    failed.len(),
                    name_list(failed.iter().copied()),
                    settings.max_failed_nodes
                ),
            ));
        }
        decision
    }

    /// Whether kube-proxy left after the cluster had cleaned its rules and is now back.
    fn kube_proxy_returned(&self) -> bool {
        self.kube_proxy_reported_returned || self.facts.iter().any(NodeFacts::cleanup_requested)
    }

    /// `DisablingKubeProxy`: every node serves from eBPF; kube-proxy has to go.
    fn disable_kube_proxy(&self, desired: Vec<DesiredNode>) -> Decision {
        let with_pods = self.names_where(|_, node| node.has_kube_proxy_pod());
        let pods = if with_pods.is_empty() {
            String::new()
        } else {
            format!(
                "; kube-proxy pods left on {}",
                name_list(with_pods.iter().copied())
            )
        };
        let returned = self.kube_proxy_returned();
        let reason = if returned {
            reasons::KUBE_PROXY_RETURNED
        } else {
            reasons::TRANSITION_IN_PROGRESS
        };
        let mut decision = self.decision(
            desired,
            DataplanePhase::DisablingKubeProxy,
            reason,
            String::new(),
        );
        let daemon_set = self.observed.kube_proxy_daemon_set.as_ref();
        match self.settings.management {
            KubeProxyManagement::Managed => match daemon_set {
                Some(daemon_set) if daemon_set.would_schedule() => {
                    if let Some(owner) = daemon_set.external_owner.as_deref() {
                        let message = format!(
                            "refusing to disable the kube-proxy DaemonSet: it is managed by another tool ({owner}); \
                             set spec.kubeProxy.management to External and remove it there{pods}"
                        );
                        decision.degraded = Some((reasons::KUBE_PROXY_MANAGED_EXTERNALLY, message.clone()));
                        decision.message = message;
                    } else {
                        decision.kube_proxy = KubeProxyAction::Disable;
                        decision.message = if returned {
                            format!("kube-proxy came back while the cluster is on eBPF: disabling its DaemonSet again{pods}")
                        } else {
                            format!("every node serves from eBPF: disabling the kube-proxy DaemonSet{pods}")
                        };
                    }
                }
                Some(_) => decision.message = format!("kube-proxy DaemonSet disabled: waiting for its pods to leave{pods}"),
                None => decision.message = format!("kube-proxy DaemonSet not found: waiting for the remaining kube-proxy pods to leave{pods}"),
            },
            KubeProxyManagement::External => {
                decision.message = format!("waiting for kube-proxy to be removed by its owner (spec.kubeProxy.management External){pods}");
                if returned {
                    decision.degraded = Some((
                        reasons::KUBE_PROXY_RETURNED,
                        format!("kube-proxy came back while the cluster is on eBPF and is managed externally: remove it{pods}"),
                    ));
                }
            }
        }
        decision
    }

    /// Ebpf -> KubeProxy, from wherever the cluster stands.
    fn toward_kube_proxy(&self) -> Decision {
        // A missing DataplaneNode is created on eBPF until the rollback is over (see
        // `created_mode`): `deactivate` then brings it back like any other node, once its own
        // agent reports kube-proxy healthy, and it keeps the rollback from being Ready before.
        let desired: Vec<DesiredNode> = self
            .facts
            .iter()
            .map(|node| DesiredNode {
                mode: node.mode().unwrap_or(self.created_mode),
                cleanup: false,
            })
            .collect();
        let not_detached = self.names_where(|_, node| node.spec.is_some() && !node.detached());
        let daemon_set = self.observed.kube_proxy_daemon_set.as_ref();
        let managed = self.settings.management == KubeProxyManagement::Managed;
        // What Switchyard disabled, Switchyard restores, even if management became External
        // since: nobody else knows the nodeSelector it recorded.
        let restore_pending = daemon_set.is_some_and(|set| set.disabled_by_switchyard);
        // Agents must have stopped cleaning kube-proxy's rules before kube-proxy comes back, so
        // the two never fight over them: nodes still told to clean, or whose agent has not yet
        // reported on its current spec.
        let still_cleaning = self.names_where(|index, node| {
            !self.failed[index]
                && (node.cleanup_requested() || (node.status.is_some() && !node.acknowledged))
        });

        if not_detached.is_empty() && !restore_pending && still_cleaning.is_empty() {
            return self.ready(
                desired,
                "every node is detached and kube-proxy implements Services",
            );
        }
        if self.failed_count() > self.settings.max_failed_nodes {
            return self.halted(desired, "going back to kube-proxy");
        }

        let mut decision = self.decision(
            desired,
            DataplanePhase::RestoringKubeProxy,
            reasons::TRANSITION_IN_PROGRESS,
            String::new(),
        );
        let waiting_for_cleanup_to_stop = || {
            format!(
                "waiting for the agents on {} to report on their current spec (iptablesCleanup: false)",
                name_list(still_cleaning.iter().copied())
            )
        };
        if restore_pending {
            if still_cleaning.is_empty() {
                decision.kube_proxy = KubeProxyAction::Restore;
                decision.message = "restoring the kube-proxy DaemonSet".into();
            } else {
                decision.message = format!(
                    "{} before restoring kube-proxy",
                    waiting_for_cleanup_to_stop()
                );
            }
            return decision;
        }

        let unhealthy =
            self.names_where(|index, node| !self.failed[index] && !node.kube_proxy_healthy());
        if !unhealthy.is_empty() {
            decision.reason = reasons::WAITING_FOR_KUBE_PROXY;
            let who = match (managed, daemon_set) {
                (true, None) => {
                    decision.degraded = Some((
                        reasons::KUBE_PROXY_NOT_FOUND,
                        "the kube-proxy DaemonSet named in spec.kubeProxy does not exist, so it cannot be restored".into(),
                    ));
                    " (the kube-proxy DaemonSet does not exist)"
                }
                (false, _) => " (restored by its owner: spec.kubeProxy.management External)",
                (true, Some(_)) => "",
            };
            decision.message = format!(
                "waiting for kube-proxy to be healthy{who} on {} before any node leaves eBPF",
                name_list(unhealthy.iter().copied())
            );
            return decision;
        }
        if not_detached.is_empty() {
            decision.message = waiting_for_cleanup_to_stop();
            return decision;
        }
        self.deactivate(decision)
    }

    /// `DeactivatingNodes`: the next batch of nodes back to `KubeProxy`.
    fn deactivate(&self, mut decision: Decision) -> Decision {
        decision.phase = DataplanePhase::DeactivatingNodes;
        let in_flight = self.names_where(|index, node| {
            node.mode() == Some(DataplaneMode::KubeProxy)
                && !node.detached()
                && !node.draining()
                && !self.failed[index]
        });
        let draining = self.names_where(|index, node| node.draining() && !self.failed[index]);
        let capacity = self
            .settings
            .max_unavailable
            .saturating_sub(in_flight.len());
        let mut deactivated = Vec::new();
        let mut chosen = vec![false; self.facts.len()];
        for (index, node) in self.facts.iter().enumerate() {
            if deactivated.len() < capacity
                && node.mode() == Some(DataplaneMode::Ebpf)
                && node.kube_proxy_healthy()
                && !self.failed[index]
            {
                decision.desired[index].mode = DataplaneMode::KubeProxy;
                deactivated.push(node.name);
                chosen[index] = true;
            }
        }
        let queued = self.names_where(|index, node| {
            node.mode() == Some(DataplaneMode::Ebpf) && !self.failed[index] && !chosen[index]
        });
        let failed = self.failed_names();
        if in_flight.is_empty()
            && draining.is_empty()
            && deactivated.is_empty()
            && queued.is_empty()
            && !failed.is_empty()
        {
            return self.halted(decision.desired, "finishing the return to kube-proxy");
        }
        let mut parts = Vec::new();
        if !deactivated.is_empty() {
            parts.push(format!(
                "switching {} back to kube-proxy",
                name_list(deactivated.iter().copied())
            ));
        }
        if !in_flight.is_empty() {
            parts.push(format!(
                "waiting for {} to detach",
                name_list(in_flight.iter().copied())
            ));
        }
        if !draining.is_empty() {
            parts.push(format!(
                "draining live connections on {}",
                name_list(draining.iter().copied())
            ));
        }
        if !queued.is_empty() {
            parts.push(format!(
                "{} more node(s) queued (rollout.maxUnavailable {})",
                queued.len(),
                self.settings.max_unavailable
            ));
        }
        if !failed.is_empty() {
            parts.push(format!("failed: {}", name_list(failed.iter().copied())));
            decision.degraded = Some((
                reasons::NODES_FAILED,
                format!(
                    "{} node(s) failed ({})",
                    failed.len(),
                    name_list(failed.iter().copied())
                ),
            ));
        }
        decision.message = parts.join("; ");
        decision
    }

    /// `Ready`: the requested mode is in place. Failed nodes left (agents not Ready on nodes that
    /// are nonetheless in the requested mode) are reported as Degraded.
    fn ready(&self, desired: Vec<DesiredNode>, message: &str) -> Decision {
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

    /// No DataplaneConfig while a transition was under way: nothing moves; only missing
    /// DataplaneNodes are created (in the mode `created_mode` gives).
    fn hold(&self) -> Decision {
        let message =
            "no DataplaneConfig named default: the transition is held where it stands".to_owned();
        self.decision(
            self.unchanged(),
            DataplanePhase::Pending,
            reasons::TRANSITION_IN_PROGRESS,
            message,
        )
    }

    /// Keeps every node's cleanup as it is, except where kube-proxy runs or could start.
    fn withdraw_unsafe_cleanup(&self, decision: &mut Decision) {
        for (index, node) in self.facts.iter().enumerate() {
            decision.desired[index].cleanup = node.cleanup_requested()
                && !self.kube_proxy_schedules
                && !node.has_kube_proxy_pod();
        }
    }

    /// Per node, whether it should clean kube-proxy's rules. Applied after the flow chose the
    /// modes, in every phase, so that cleanup is never requested on a node where kube-proxy runs
    /// or could start, and is withdrawn as soon as kube-proxy comes back.
    fn decide_cleanup(&self, decision: &mut Decision) {
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

    /// Rolling agent upgrade, only while `Ready`.
    fn upgrade_agents(&self, decision: &mut Decision) {
        let Some(update_revision) = self
            .observed
            .agent_daemon_set
            .as_ref()
            .and_then(|set| set.update_revision.as_deref())
        else {
            return;
        };
        let mut outdated = Vec::new();
        let mut in_flight = Vec::new();
        let mut timed_out = Vec::new();
        for node in self.facts {
            if agent_up_to_date(node, update_revision) {
                continue;
            }
            match node.agent_pod {
                Some(pod)
                    if pod.revision.as_deref() != Some(update_revision) && !pod.terminating =>
                {
                    outdated.push((node.name, pod));
                }
                pod => {
                    // Being replaced: the old pod shuts down, or the new one has not reported
                    // Ready from the update revision yet, or there is no pod while the node's
                    // last report came from an older agent. A node that never had an agent is
                    // not part of the upgrade.
                    let older_agent_reported = node
                        .status
                        .and_then(|status| status.agent_revision.as_deref())
                        .is_some_and(|revision| revision != update_revision);
                    if pod.is_none() && !older_agent_reported {
                        continue;
                    }
                    in_flight.push(node.name);
                    let timeout =
                        chrono::Duration::seconds(self.settings.node_ready_timeout_seconds);
                    let deadline = pod
                        .filter(|pod| !pod.terminating)
                        .and_then(|pod| pod.created_at)
                        .and_then(|created| created.checked_add_signed(timeout));
                    match deadline {
                        Some(deadline) if self.now >= deadline => timed_out.push(node.name),
                        Some(deadline) => decision.upgrade_deadlines.push(deadline),
                        None => {}
                    }
                }
            }
        }
        if outdated.is_empty() && in_flight.is_empty() {
            return;
        }
        if !timed_out.is_empty() {
            let message = format!(
                "agent upgrade to revision {update_revision} halted: {} did not come back Ready within {}s",
                name_list(timed_out.iter().copied()),
                self.settings.node_ready_timeout_seconds
            );
            decision.phase = DataplanePhase::Halted;
            decision.reason = reasons::AGENT_UPGRADE_FAILED;
            decision.degraded = Some((reasons::AGENT_UPGRADE_FAILED, message.clone()));
            decision.message = message;
            return;
        }
        decision.phase = DataplanePhase::UpgradingAgents;
        decision.reason = reasons::AGENT_UPGRADE_IN_PROGRESS;
        if !in_flight.is_empty() {
            // Never two batches in flight.
            decision.message = format!(
                "upgrading agents to revision {update_revision}: waiting for {} to report Ready; {} more to go",
                name_list(in_flight.iter().copied()),
                outdated.len()
            );
            return;
        }
        let batch: Vec<_> = outdated
            .iter()
            .take(self.settings.max_unavailable)
            .collect();
        decision.agent_pods_to_delete = batch
            .iter()
            .map(|(node_name, pod)| AgentPodDeletion {
                node_name: (*node_name).to_owned(),
                pod_name: pod.name.clone(),
            })
            .collect();
        decision.message = format!(
            "upgrading agents to revision {update_revision}: replacing the agent on {}; {} more to go",
            name_list(batch.iter().map(|(name, _)| *name)),
            outdated.len() - batch.len()
        );
    }

    /// The DataplaneNodes whose spec changes, with `requestedAt` set to now.
    fn node_writes(&self, decision: &Decision) -> Vec<DataplaneNodeWrite> {
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
    fn requeue_after(
        &self,
        decision: &Decision,
        writes: &[DataplaneNodeWrite],
    ) -> Option<Duration> {
        let written: std::collections::BTreeSet<&str> = writes
            .iter()
            .map(|write| write.node_name.as_str())
            .collect();
        let timeout = chrono::Duration::seconds(self.settings.node_ready_timeout_seconds);
        let written_deadline = (!writes.is_empty())
            .then(|| self.now.checked_add_signed(timeout))
            .flatten();
        let node_deadlines = self
            .facts
            .iter()
            .filter(|node| !node.satisfied() && !written.contains(node.name))
            .filter_map(|node| node.deadline(self.settings));
        node_deadlines
            .chain(written_deadline)
            .chain(decision.upgrade_deadlines.iter().copied())
            .filter(|deadline| *deadline > self.now)
            .min()
            .and_then(|deadline| (deadline - self.now).to_std().ok())
    }
}

/// The node runs the agent DaemonSet's update revision and its agent reports Ready from it.
pub(crate) fn agent_up_to_date(node: &NodeFacts, update_revision: &str) -> bool {
    node.agent_pod
        .is_some_and(|pod| pod.revision.as_deref() == Some(update_revision))
        && node
            .status
            .is_some_and(|status| status.agent_revision.as_deref() == Some(update_revision))
        && node.agent_ready()
}
