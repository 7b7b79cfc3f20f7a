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
//!    With `rollout.canary` set (opt-in until `make e2e-canary` proves it; without it, none of
//!    the rest of this step), the canaries go first, and while kube-proxy still serves the
//!    cluster every switched node soaks and is judged against its own disruption baseline before the next batch (and before
//!    kube-proxy is disabled); over `disruptionBudget` the transition rolls those nodes back or
//!    halts (see `planner/canary.rs`).
//! 3. `DisablingKubeProxy`, only when every node serves from eBPF: `Managed` disables the
//!    DaemonSet, `External` waits. Done when no node has a kube-proxy pod.
//! 4. `CleaningRules` (`iptablesCleanup: Auto`): `iptablesCleanup: true` on each node that
//!    serves from eBPF and has no kube-proxy pod while the DaemonSet schedules nowhere; done when
//!    every node reports `KubeProxyRulesPresent` False.
//! 5. `Ready`; agent upgrades may then run (`UpgradingAgents`).
//!
//! # Ebpf -> KubeProxy
//! `iptablesCleanup: false` everywhere first; `RestoringKubeProxy` (`Managed` restores the
//! DaemonSet once every node acknowledged the end of cleanup, which an agent does only once it
//! has handed kube-proxy's health ports back; `External` waits, its message saying when the
//! owner may restore kube-proxy) until every node reports `KubeProxyHealthy`; `DeactivatingNodes` in batches of `maxUnavailable`, a node told
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
//!
//! # Without a DataplaneConfig named `default`
//! Never created, or deleted: the plan creates the DataplaneNodes that are missing (in the mode
//! `created_mode` picks) and withdraws cleanup wherever kube-proxy runs or could start (it came
//! back: cleaning its rules there would flap the node between kube-proxy and eBPF); nothing
//! else. No kube-proxy action, no agent pod deletion, no status: deleting the DataplaneConfig
//! leaves the dataplane as it is, nothing is ripped out under traffic.
//!
//! # Bounded work
//! A plan holds at most [`MAX_NODE_WRITES_PER_RECONCILE`] DataplaneNode writes, the first ones
//! in node-name order, and then asks to be planned again at once ([`Plan::requeue_after`] zero):
//! the next plan, from a snapshot holding these writes, picks the next nodes. A plan that the
//! API server's refusal to let the operator patch kube-proxy holds in Preflight asks to be
//! planned again within [`PATCH_PERMISSION_RECHECK`]: a fixed Role triggers no watch.

mod canary;
mod context;
mod facts;
mod observed;
pub mod parity;
mod settings;
mod status;
#[cfg(test)]
mod tests;
mod to_ebpf;
mod to_kube_proxy;
mod upgrade;
mod without_config;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::ResourceExt;
use switchyard_crds::{
    reasons, DataplaneConfig, DataplaneConfigStatus, DataplaneMode, DataplaneNodeSpec,
    DataplanePhase, DEFAULT_CONFIG_NAME,
};

pub(crate) use canary::describe_evidence;
pub use observed::{
    AgentDaemonSet, KubeProxyDaemonSet, ObservedCluster, ObservedNode, ObservedPod,
};
pub use parity::{UnsupportedFeature, UnsupportedService};

use context::{created_mode, Context, Decision};
use facts::NodeFacts;
use settings::Settings;
use upgrade::agent_up_to_date;

/// The most DataplaneNode writes one plan holds; the rest follow in the next plan, at once (see
/// "Bounded work" above). Bounded work keeps every reconcile short, so that a pause, a reversal
/// or a returning kube-proxy is acted on within one short reconcile even while thousands of
/// nodes are being told something.
pub const MAX_NODE_WRITES_PER_RECONCILE: usize = 500;

/// How soon a plan held by a refused SelfSubjectAccessReview (the operator may not patch the
/// kube-proxy DaemonSet) asks to be planned again: a fixed Role or RoleBinding triggers no watch
/// of the operator's.
pub const PATCH_PERMISSION_RECHECK: Duration = Duration::from_secs(10);

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
    /// The Services that deserve a Warning Event (`UnsupportedByDataplane`): every unsupported
    /// Service while eBPF serves some node (told `Ebpf`, or still draining), in namespace/name
    /// order; none otherwise. The controller records each once.
    pub services_to_warn: Vec<Arc<UnsupportedService>>,
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
/// does not exist: the plan then only creates missing DataplaneNodes and withdraws unsafe
/// cleanup (see "Without a DataplaneConfig named `default`" above), and publishes no status.
///
/// A DataplaneConfig with any other name gets a plan that changes nothing and a status whose
/// `Degraded` condition says it is ignored.
///
/// What the plan holds is what the operator does: at most [`MAX_NODE_WRITES_PER_RECONCILE`]
/// node writes, and the requeue they need.
///
/// The result depends only on the arguments: the same snapshot always gives the same plan.
pub fn plan(config: Option<&DataplaneConfig>, observed: &ObservedCluster) -> Plan {
    let now = switchyard_crds::time::truncate_to_seconds(observed.now);
    let mut nodes: Vec<&ObservedNode> = observed.nodes.iter().collect();
    nodes.sort_by(|left, right| left.name.cmp(&right.name));
    nodes.dedup_by(|later, earlier| later.name == earlier.name);

    let mut plan = match config {
        None => without_config::plan(&nodes, observed, now),
        Some(config) if config.name_any() != DEFAULT_CONFIG_NAME => {
            return Plan::nothing_with_status(status::ignored(config, now));
        }
        Some(config) => {
            let mut plan = with_config(config, &nodes, observed, now);
            let patch_refused = observed
                .kube_proxy_daemon_set
                .as_ref()
                .is_some_and(KubeProxyDaemonSet::patch_refused);
            if patch_refused {
                plan.requeue_within(PATCH_PERMISSION_RECHECK);
            }
            plan
        }
    };
    plan.limit_node_writes(MAX_NODE_WRITES_PER_RECONCILE);
    plan.services_to_warn = services_to_warn(&nodes, observed);
    plan
}

/// Every unsupported Service, in namespace/name order, while eBPF serves some node: kube-proxy's
/// rules for them are gone or going there.
fn services_to_warn(
    nodes: &[&ObservedNode],
    observed: &ObservedCluster,
) -> Vec<Arc<UnsupportedService>> {
    if !ebpf_serves_some_node(nodes) {
        return Vec::new();
    }
    parity::in_order(&observed.unsupported_services)
}

/// Whether some node is told `Ebpf` or still translates flows while draining.
fn ebpf_serves_some_node(nodes: &[&ObservedNode]) -> bool {
    nodes.iter().any(|node| NodeFacts::new(node).ebpf_serves())
}

/// The plan for the DataplaneConfig named `default`: the flow toward its mode, from wherever the
/// cluster stands, then cleanup, then agent upgrades.
fn with_config(
    config: &DataplaneConfig,
    nodes: &[&ObservedNode],
    observed: &ObservedCluster,
    now: DateTime<Utc>,
) -> Plan {
    let settings = match Settings::from_spec(&config.spec, nodes.len()) {
        Ok(settings) => settings,
        Err(error) => {
            return Plan::nothing_with_status(status::invalid_spec(config, &error, now));
        }
    };

    let facts: Vec<NodeFacts> = nodes.iter().map(|node| NodeFacts::new(node)).collect();
    let mut context = Context::new(&settings, &facts, observed, now);
    context.kube_proxy_reported_returned = reported_kube_proxy_returned(config);
    context.generation = config.metadata.generation;
    context.recorded_budget_exceeded = recorded_budget_exceeded(config);
    let mut decision = match settings.mode {
        DataplaneMode::Ebpf => context.toward_ebpf(),
        DataplaneMode::KubeProxy => context.toward_kube_proxy(),
    };
    context.decide_cleanup(&mut decision);
    if decision.phase == DataplanePhase::Ready {
        context.upgrade_agents(&mut decision);
    }

    let writes = context.node_writes(&decision);
    let requeue_after = context.requeue_after(&decision, &writes);
    let status = Some(status::build(config, &context, &decision));
    if settings.paused {
        return Plan {
            status,
            ..Plan::nothing()
        };
    }
    Plan {
        dataplane_nodes: writes,
        kube_proxy: decision.kube_proxy,
        agent_pods_to_delete: decision.agent_pods_to_delete,
        status,
        requeue_after,
        services_to_warn: Vec::new(),
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
            services_to_warn: Vec::new(),
        }
    }

    fn nothing_with_status(status: DataplaneConfigStatus) -> Self {
        Self {
            status: Some(status),
            ..Self::nothing()
        }
    }

    /// Plan again within `limit` at the latest.
    fn requeue_within(&mut self, limit: Duration) {
        self.requeue_after = Some(self.requeue_after.map_or(limit, |after| after.min(limit)));
    }

    /// Keeps the first `budget` node writes (node-name order); with some left over, plans again
    /// at once: the next plan, from a snapshot holding these writes, picks the next nodes.
    fn limit_node_writes(&mut self, budget: usize) {
        if self.dataplane_nodes.len() > budget {
            self.dataplane_nodes.truncate(budget);
            self.requeue_after = Some(Duration::ZERO);
        }
    }
}

/// Whether the DataplaneConfig's last status shows kube-proxy had left and is now back: it says
/// so (in DisablingKubeProxy, or ActivatingNodes while the agents catch up with the withdrawn
/// cleanup), or the transition to `Ebpf` of this very spec had got past kube-proxy
/// (CleaningRules, Ready, UpgradingAgents). Needed once no node is told to clean any
/// more: the round that withdrew cleanup may have failed before its status was written (a
/// conflicting kube-proxy patch), and the next one must still know.
fn reported_kube_proxy_returned(config: &DataplaneConfig) -> bool {
    let Some(status) = config.status.as_ref() else {
        return false;
    };
    // ActivatingNodes too: withdrawing cleanup sends the transition back there until the
    // agents report on the new spec (see `toward_ebpf`).
    let says_so = matches!(
        status.phase,
        DataplanePhase::DisablingKubeProxy | DataplanePhase::ActivatingNodes
    ) && status.conditions.iter().any(|condition| {
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

/// What the last status recorded about the disruption budget, if it was recorded under the
/// current spec (the same `metadata.generation`): a spec change forgets it.
fn recorded_budget_exceeded(config: &DataplaneConfig) -> Option<&switchyard_crds::BudgetExceeded> {
    config
        .status
        .as_ref()
        .and_then(|status| status.budget_exceeded.as_ref())
        .filter(|recorded| Some(recorded.observed_generation) == config.metadata.generation)
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

/// The parts of a message that name nodes, in order: each template whose nodes are not none,
/// its `{}` replaced by them (as [`name_list`] lists them).
pub(crate) fn naming(lists: &[(&Vec<&str>, &str)]) -> Vec<String> {
    lists
        .iter()
        .filter(|(names, _)| !names.is_empty())
        .map(|(names, template)| template.replacen("{}", &name_list(names.iter().copied()), 1))
        .collect()
}

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
