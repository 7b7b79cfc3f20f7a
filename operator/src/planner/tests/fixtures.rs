//! Cluster states for the planner tests, a simulated cluster that reacts to plans the way the
//! agents, the kube-proxy DaemonSet and the agent DaemonSet do, and the invariants every plan
//! must keep.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Duration, TimeZone, Utc};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use switchyard_crds::{
    condition_types as types, Condition, ConditionStatus, DataplaneConfig, DataplaneConfigSpec,
    DataplaneMode, DataplaneNode, DataplaneNodeSpec, DataplaneNodeStatus, DataplanePhase,
};

use super::super::facts::NodeFacts;
use super::super::settings::Settings;
use super::super::*;

pub(super) const OLD_REVISION: &str = "agent-old";
pub(super) const NEW_REVISION: &str = "agent-new";

/// A fixed instant plus `seconds`.
pub(super) fn at(seconds: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(1_800_000_000 + seconds, 0)
        .single()
        .expect("a valid instant")
}

pub(super) fn config(mode: DataplaneMode) -> DataplaneConfig {
    let mut config = DataplaneConfig::new(
        "default",
        DataplaneConfigSpec {
            mode,
            ..DataplaneConfigSpec::default()
        },
    );
    config.metadata.generation = Some(1);
    config
}

pub(super) fn with_max_unavailable(
    mut config: DataplaneConfig,
    value: IntOrString,
) -> DataplaneConfig {
    config.spec.rollout.max_unavailable = value;
    config
}

pub(super) fn pod(name: &str, revision: &str, created_at: DateTime<Utc>) -> ObservedPod {
    ObservedPod {
        name: name.to_owned(),
        ready: true,
        revision: Some(revision.to_owned()),
        created_at: Some(created_at),
        terminating: false,
    }
}

pub(super) fn condition(type_: &str, holds: bool) -> Condition {
    Condition::new(
        type_,
        ConditionStatus::from_bool(holds),
        "Test",
        "",
        None,
        at(-10_000),
    )
}

/// A Node with kube-proxy and an old-revision agent, and no DataplaneNode yet.
pub(super) fn bare_node(name: &str) -> ObservedNode {
    ObservedNode {
        name: name.to_owned(),
        ready: true,
        labels: Default::default(),
        dataplane_node: None,
        kube_proxy_pod: Some(pod(&format!("kube-proxy-{name}"), "kp-1", at(-100_000))),
        agent_pod: Some(pod(&format!("agent-{name}"), OLD_REVISION, at(-50_000))),
    }
}

/// Sets the DataplaneNode's spec as the operator would write it (generation bumped).
pub(super) fn set_spec(
    node: &mut ObservedNode,
    mode: DataplaneMode,
    cleanup: bool,
    requested_at: DateTime<Utc>,
) {
    let spec = DataplaneNodeSpec {
        mode,
        iptables_cleanup: cleanup,
        requested_at: Some(requested_at),
        drain_timeout_seconds: 600,
    };
    match node.dataplane_node.as_mut().map(Arc::make_mut) {
        Some(dataplane_node) => {
            dataplane_node.spec = spec;
            dataplane_node.metadata.generation =
                Some(dataplane_node.metadata.generation.unwrap_or(0) + 1);
        }
        None => {
            let mut dataplane_node = DataplaneNode::new(&node.name, spec);
            dataplane_node.metadata.generation = Some(1);
            node.dataplane_node = Some(Arc::new(dataplane_node));
        }
    }
}

/// What an agent reports about its node.
#[derive(Clone, Copy, Debug)]
pub(super) struct Report {
    pub(super) attached: bool,
    pub(super) synced: bool,
    pub(super) ready: bool,
    pub(super) rules_present: bool,
    pub(super) kube_proxy_healthy: bool,
    pub(super) draining: bool,
}

impl Report {
    /// The report of a healthy agent on a node whose spec it follows, with kube-proxy running.
    pub(super) fn following(mode: DataplaneMode) -> Self {
        Self {
            attached: mode == DataplaneMode::Ebpf,
            synced: true,
            ready: true,
            rules_present: true,
            kube_proxy_healthy: true,
            draining: false,
        }
    }
}

/// The agent reports `report` about the current spec (or about `generation` if given).
pub(super) fn report(
    node: &mut ObservedNode,
    report: Report,
    generation: Option<i64>,
    agent_revision: &str,
) {
    let dataplane_node = node
        .dataplane_node
        .as_mut()
        .map(Arc::make_mut)
        .expect("report needs a DataplaneNode");
    let generation = generation.or(dataplane_node.metadata.generation);
    dataplane_node.status = Some(DataplaneNodeStatus {
        observed_generation: generation,
        agent_version: Some("0.1.0".into()),
        agent_revision: Some(agent_revision.to_owned()),
        conditions: vec![
            condition(types::READY, report.ready),
            condition(types::HOST_METADATA_READY, true),
            condition(types::PROGRAMS_ATTACHED, report.attached),
            condition(types::SERVICES_SYNCED, report.synced),
            condition(types::KUBE_PROXY_RULES_PRESENT, report.rules_present),
            condition(types::KUBE_PROXY_HEALTHY, report.kube_proxy_healthy),
            condition(types::CHAIN_ORDER_SAFE, true),
            condition(types::DRAINING, report.draining),
        ],
        services_programmed: Some(3),
        live_flows: Some(0),
        last_sync_time: Some(at(-5)),
        disruption: None,
    });
}

/// The agent's conditions last changed at `time` (something just happened on the node).
pub(super) fn conditions_changed_at(node: &mut ObservedNode, time: DateTime<Utc>) {
    if let Some(status) = node
        .dataplane_node
        .as_mut()
        .map(Arc::make_mut)
        .and_then(|node| node.status.as_mut())
    {
        for condition in &mut status.conditions {
            condition.last_transition_time = time;
        }
    }
}

/// A node on kube-proxy whose agent is Ready (the starting point of every transition).
pub(super) fn kube_proxy_node(name: &str) -> ObservedNode {
    let mut node = bare_node(name);
    set_spec(&mut node, DataplaneMode::KubeProxy, false, at(-40_000));
    report(
        &mut node,
        Report::following(DataplaneMode::KubeProxy),
        None,
        OLD_REVISION,
    );
    node
}

/// A node serving from eBPF with kube-proxy still running on it.
pub(super) fn ebpf_node(name: &str) -> ObservedNode {
    let mut node = kube_proxy_node(name);
    set_spec(&mut node, DataplaneMode::Ebpf, false, at(-30_000));
    report(
        &mut node,
        Report::following(DataplaneMode::Ebpf),
        None,
        OLD_REVISION,
    );
    node
}

/// A node serving from eBPF, kube-proxy gone from it, its rules cleaned.
pub(super) fn cleaned_node(name: &str) -> ObservedNode {
    let mut node = ebpf_node(name);
    node.kube_proxy_pod = None;
    set_spec(&mut node, DataplaneMode::Ebpf, true, at(-20_000));
    let mut cleaned = Report::following(DataplaneMode::Ebpf);
    cleaned.rules_present = false;
    cleaned.kube_proxy_healthy = false;
    report(&mut node, cleaned, None, OLD_REVISION);
    node
}

pub(super) fn kube_proxy_daemon_set() -> KubeProxyDaemonSet {
    KubeProxyDaemonSet {
        disabled_by_switchyard: false,
        desired_number_scheduled: Some(3),
        external_owner: None,
        patch_allowed: Some(true),
    }
}

pub(super) fn disabled_kube_proxy_daemon_set() -> KubeProxyDaemonSet {
    KubeProxyDaemonSet {
        disabled_by_switchyard: true,
        desired_number_scheduled: Some(0),
        external_owner: None,
        patch_allowed: Some(true),
    }
}

pub(super) fn cluster(nodes: Vec<ObservedNode>) -> ObservedCluster {
    ObservedCluster {
        now: at(0),
        nodes,
        kube_proxy_daemon_set: Some(kube_proxy_daemon_set()),
        agent_daemon_set: Some(AgentDaemonSet {
            update_revision: Some(OLD_REVISION.into()),
        }),
        api_server_address_configured: true,
        unsupported_services: Vec::new(),
    }
}

pub(super) fn node_mut<'a>(cluster: &'a mut ObservedCluster, name: &str) -> &'a mut ObservedNode {
    cluster
        .nodes
        .iter_mut()
        .find(|node| node.name == name)
        .expect("a node of that name")
}

pub(super) fn written<'a>(plan: &'a Plan, name: &str) -> Option<&'a DataplaneNodeWrite> {
    plan.dataplane_nodes
        .iter()
        .find(|write| write.node_name == name)
}

pub(super) fn written_modes(plan: &Plan) -> Vec<(&str, DataplaneMode)> {
    plan.dataplane_nodes
        .iter()
        .map(|write| (write.node_name.as_str(), write.spec.mode))
        .collect()
}

pub(super) fn phase(plan: &Plan) -> DataplanePhase {
    plan.status.as_ref().expect("a status").phase
}

pub(super) fn message(plan: &Plan) -> &str {
    plan.status
        .as_ref()
        .and_then(|status| status.message.as_deref())
        .unwrap_or_default()
}

pub(super) fn condition_of<'a>(plan: &'a Plan, type_: &str) -> &'a Condition {
    plan.status
        .as_ref()
        .and_then(|status| {
            status
                .conditions
                .iter()
                .find(|condition| condition.type_ == type_)
        })
        .unwrap_or_else(|| panic!("no {type_} condition"))
}

/// Checks the planner's safety promises for one plan on one snapshot. Used by the simulations
/// and the property tests.
pub(super) fn check_invariants(
    config: Option<&DataplaneConfig>,
    observed: &ObservedCluster,
    plan: &Plan,
) {
    assert_eq!(
        plan,
        &super::super::plan(config, observed),
        "planning twice on the same snapshot gives the same plan"
    );

    let default_spec = DataplaneConfigSpec::default();
    let spec = config.map_or(&default_spec, |config| &config.spec);
    let acted_on = config.is_none_or(|config| config.metadata.name.as_deref() == Some("default"));

    // Unsupported Services are warned about exactly while eBPF serves some node (told Ebpf, or
    // draining), each once, and a status says whether any exists.
    let ebpf_serves = observed
        .nodes
        .iter()
        .any(|node| NodeFacts::new(node).ebpf_serves());
    let mut unsupported: Vec<(&str, &str)> = observed
        .unsupported_services
        .iter()
        .map(|service| (service.namespace.as_str(), service.name.as_str()))
        .collect();
    unsupported.sort_unstable();
    unsupported.dedup();
    let warned: Vec<(&str, &str)> = plan
        .services_to_warn
        .iter()
        .map(|service| (service.namespace.as_str(), service.name.as_str()))
        .collect();
    if acted_on && ebpf_serves {
        assert_eq!(
            warned, unsupported,
            "every unsupported Service is warned about, once"
        );
    } else {
        assert!(
            warned.is_empty(),
            "Services warned about while eBPF serves no node"
        );
    }
    if let Some(supported) = plan.status.as_ref().and_then(|status| {
        status
            .conditions
            .iter()
            .find(|condition| condition.type_ == types::SERVICES_SUPPORTED)
    }) {
        assert_eq!(
            supported.status,
            ConditionStatus::from_bool(unsupported.is_empty())
        );
    }
    let mut names: Vec<&str> = observed
        .nodes
        .iter()
        .map(|node| node.name.as_str())
        .collect();
    names.sort_unstable();
    names.dedup();
    let settings = Settings::from_spec(spec, names.len());
    let (Ok(settings), true) = (settings, acted_on) else {
        assert!(plan.dataplane_nodes.is_empty() && plan.agent_pods_to_delete.is_empty());
        assert_eq!(plan.kube_proxy, KubeProxyAction::None);
        return;
    };
    if settings.paused {
        assert!(
            plan.dataplane_nodes.is_empty(),
            "paused plans no DataplaneNode write"
        );
        assert!(
            plan.agent_pods_to_delete.is_empty(),
            "paused deletes no agent pod"
        );
        assert_eq!(
            plan.kube_proxy,
            KubeProxyAction::None,
            "paused leaves kube-proxy alone"
        );
        return;
    }
    let now = switchyard_crds::time::truncate_to_seconds(observed.now);
    let daemon_set_schedules = observed
        .kube_proxy_daemon_set
        .as_ref()
        .is_some_and(KubeProxyDaemonSet::would_schedule);
    let mut first_by_name: BTreeMap<&str, &ObservedNode> = BTreeMap::new();
    for node in &observed.nodes {
        first_by_name.entry(node.name.as_str()).or_insert(node);
    }
    let facts: BTreeMap<&str, NodeFacts> = first_by_name
        .iter()
        .map(|(name, node)| (*name, NodeFacts::new(node)))
        .collect();

    // Cleanup is never requested where a kube-proxy pod exists or the DaemonSet would schedule,
    // and is withdrawn there.
    for (name, node) in &facts {
        let final_cleanup = written(plan, name).map_or(node.cleanup_requested(), |write| {
            write.spec.iptables_cleanup
        });
        if final_cleanup {
            assert!(
                !node.has_kube_proxy_pod(),
                "cleanup on {name}, which has a kube-proxy pod"
            );
            assert!(
                !daemon_set_schedules,
                "cleanup on {name} while the kube-proxy DaemonSet would schedule"
            );
        }
    }
    for write in &plan.dataplane_nodes {
        if write.spec.iptables_cleanup {
            let node = &facts[write.node_name.as_str()];
            assert!(!node.has_kube_proxy_pod() && !daemon_set_schedules);
            assert!(
                node.cleanup_requested() || node.serving_from_ebpf(),
                "cleanup newly requested on {}, which does not serve from eBPF",
                write.node_name
            );
        }
        assert_eq!(
            write.spec.requested_at,
            Some(now),
            "every write carries requestedAt"
        );
        match (config, facts[write.node_name.as_str()].spec) {
            // Without a DataplaneConfig an existing DataplaneNode only has its cleanup
            // withdrawn: its mode and drain timeout stay.
            (None, Some(current)) => {
                assert!(
                    current.iptables_cleanup && !write.spec.iptables_cleanup,
                    "without a DataplaneConfig {} is written for something else than withdrawing its cleanup",
                    write.node_name
                );
                assert_eq!(write.spec.mode, current.mode);
                assert_eq!(
                    write.spec.drain_timeout_seconds,
                    current.drain_timeout_seconds
                );
            }
            _ => assert_eq!(
                write.spec.drain_timeout_seconds,
                settings.drain_timeout_seconds
            ),
        }
    }
    if config.is_none() {
        assert_eq!(
            plan.kube_proxy,
            KubeProxyAction::None,
            "without a DataplaneConfig kube-proxy is left as it is"
        );
        assert!(
            plan.agent_pods_to_delete.is_empty() && plan.status.is_none(),
            "without a DataplaneConfig no agent is upgraded and no status written"
        );
    }

    // A missing DataplaneNode (a new Node, or one whose Node re-registered and whose agent kept
    // its programs) is never created with cleanup, and never as KubeProxy where kube-proxy may
    // not serve it: while Switchyard has the kube-proxy DaemonSet disabled, or while a node is
    // told Ebpf unless the cluster heads to eBPF with a DaemonSet that still schedules (a
    // rollback, a hold without a DataplaneConfig, kube-proxy removed by its owner).
    let disabled_by_switchyard = observed
        .kube_proxy_daemon_set
        .as_ref()
        .is_some_and(|set| set.disabled_by_switchyard);
    let any_told_ebpf = facts
        .values()
        .any(|node| node.mode() == Some(DataplaneMode::Ebpf));
    let heading_to_ebpf_with_kube_proxy =
        config.is_some() && settings.mode == DataplaneMode::Ebpf && daemon_set_schedules;
    let kube_proxy_may_not_serve =
        disabled_by_switchyard || (any_told_ebpf && !heading_to_ebpf_with_kube_proxy);
    for write in plan.dataplane_nodes.iter().filter(|write| write.create) {
        assert!(
            !write.spec.iptables_cleanup,
            "{} created with cleanup",
            write.node_name
        );
        if kube_proxy_may_not_serve {
            assert_eq!(
                write.spec.mode,
                DataplaneMode::Ebpf,
                "{} created as KubeProxy where kube-proxy may not serve it",
                write.node_name
            );
        }
    }

    // A return to kube-proxy is never Ready while a node is (or is created) on Ebpf.
    if config.is_some()
        && settings.mode == DataplaneMode::KubeProxy
        && plan.status.as_ref().is_some_and(|status| {
            matches!(
                status.phase,
                DataplanePhase::Ready | DataplanePhase::UpgradingAgents
            )
        })
    {
        for (name, node) in &facts {
            let final_mode = written(plan, name).map_or(node.mode(), |write| Some(write.spec.mode));
            assert_ne!(
                final_mode,
                Some(DataplaneMode::Ebpf),
                "Ready on kube-proxy while {name} is on Ebpf"
            );
        }
    }

    // After an automatic rollback, no node is activated again under the same spec.
    let rolled_back_under_this_spec = config.is_some_and(|config| {
        config
            .status
            .as_ref()
            .and_then(|status| status.budget_exceeded.as_ref())
            .is_some_and(|record| {
                record.action == switchyard_crds::BudgetExceededAction::Rollback
                    && Some(record.observed_generation) == config.metadata.generation
            })
    });
    if rolled_back_under_this_spec {
        for write in &plan.dataplane_nodes {
            assert!(
                write.create
                    || write.spec.mode != DataplaneMode::Ebpf
                    || facts[write.node_name.as_str()].mode() == Some(DataplaneMode::Ebpf),
                "{} activated after an automatic rollback under the same spec",
                write.node_name
            );
        }
    }

    // The parity preflight: no node is activated, and kube-proxy is not disabled, while an
    // unsupported Service exists and the transition has not started (no node told Ebpf).
    let started = facts
        .values()
        .any(|node| node.mode() == Some(DataplaneMode::Ebpf));
    if !observed.unsupported_services.is_empty() && !started {
        for write in &plan.dataplane_nodes {
            assert!(
                write.create || write.spec.mode != DataplaneMode::Ebpf,
                "{} activated while an unsupported Service exists",
                write.node_name
            );
        }
        if !facts.is_empty() {
            assert_ne!(
                plan.kube_proxy,
                KubeProxyAction::Disable,
                "kube-proxy disabled while an unsupported Service exists"
            );
        }
    }

    // kube-proxy is never disabled while any node is not serving from eBPF.
    if plan.kube_proxy == KubeProxyAction::Disable {
        assert_eq!(settings.mode, DataplaneMode::Ebpf);
        for (name, node) in &facts {
            assert!(
                node.serving_from_ebpf(),
                "kube-proxy disabled while {name} does not serve from eBPF"
            );
        }
    }
    if plan.kube_proxy == KubeProxyAction::Restore {
        assert_eq!(settings.mode, DataplaneMode::KubeProxy);
        for (name, node) in &facts {
            assert!(
                !node.cleanup_requested() || node.failed(&settings, now),
                "kube-proxy restored while {name} is told to clean"
            );
            // An agent reports a spec only once it has closed kube-proxy's health ports, which
            // it may serve only while told to clean: every agent that ever reported has
            // reported the spec without cleanup, so none holds them when kube-proxy starts.
            assert!(
                node.status.is_none() || node.acknowledged || node.failed(&settings, now),
                "kube-proxy restored while {name}'s agent has not reported its current spec"
            );
        }
    }

    // Agents are never deactivated while kube-proxy is not healthy on their node.
    for write in &plan.dataplane_nodes {
        let node = &facts[write.node_name.as_str()];
        if write.spec.mode == DataplaneMode::KubeProxy && node.mode() == Some(DataplaneMode::Ebpf) {
            assert!(
                node.kube_proxy_healthy(),
                "{} leaves eBPF while kube-proxy is not healthy on it",
                write.node_name
            );
        }
    }

    // Never more than maxUnavailable nodes in flight once the plan adds one. A DataplaneNode
    // created on Ebpf is not an activation: kube-proxy cannot be relied on there (see above), so
    // the node loses nothing it serves from, and it does not use up maxUnavailable.
    let final_mode = |name: &str, node: &NodeFacts| {
        written(plan, name)
            .map(|write| write.spec.mode)
            .or(node.mode())
    };
    let activating_writes = plan
        .dataplane_nodes
        .iter()
        .filter(|write| {
            write.spec.mode == DataplaneMode::Ebpf
                && !write.create
                && facts[write.node_name.as_str()].mode() != Some(DataplaneMode::Ebpf)
        })
        .count();
    if activating_writes > 0 {
        let in_flight = facts
            .iter()
            .filter(|(name, node)| {
                final_mode(name, node) == Some(DataplaneMode::Ebpf)
                    && node.spec.is_some()
                    && !(node.mode() == Some(DataplaneMode::Ebpf) && node.serving_from_ebpf())
                    && !node.failed(&settings, now)
            })
            .count();
        assert!(
            in_flight <= settings.max_unavailable,
            "{in_flight} nodes activating, maxUnavailable {}",
            settings.max_unavailable
        );
    }
    let deactivating_writes = plan
        .dataplane_nodes
        .iter()
        .filter(|write| {
            write.spec.mode == DataplaneMode::KubeProxy
                && facts[write.node_name.as_str()].mode() == Some(DataplaneMode::Ebpf)
        })
        .count();
    if deactivating_writes > 0 {
        let in_flight = facts
            .iter()
            .filter(|(name, node)| {
                final_mode(name, node) == Some(DataplaneMode::KubeProxy)
                    && (node.mode() == Some(DataplaneMode::Ebpf)
                        || (!node.detached() && !node.draining()))
                    && !node.failed(&settings, now)
            })
            .count();
        assert!(
            in_flight <= settings.max_unavailable,
            "{in_flight} nodes deactivating, maxUnavailable {}",
            settings.max_unavailable
        );
    }
    assert!(
        activating_writes == 0 || deactivating_writes == 0,
        "one direction at a time"
    );

    // Agent pods are deleted only when nothing else is going on, one batch at a time.
    if !plan.agent_pods_to_delete.is_empty() {
        assert!(plan.agent_pods_to_delete.len() <= settings.max_unavailable);
        assert_eq!(plan.kube_proxy, KubeProxyAction::None);
        assert!(activating_writes == 0 && deactivating_writes == 0);
        if let Some(status) = &plan.status {
            assert_eq!(status.phase, DataplanePhase::UpgradingAgents);
        }
    }
}

/// A cluster that reacts to plans: agents follow their DataplaneNode (unless broken), the
/// kube-proxy DaemonSet runs pods wherever it schedules and kube-proxy rewrites its rules, the
/// agent DaemonSet recreates deleted pods at its update revision. One round is one reconcile.
pub(super) struct Simulation {
    pub(super) config: DataplaneConfig,
    pub(super) cluster: ObservedCluster,
    /// Nodes whose agent never reports again.
    pub(super) broken_agents: Vec<String>,
    /// Live connections per node, closed one per round while the node drains.
    pub(super) live_flows: BTreeMap<String, u32>,
    /// Whether kube-proxy's rules are on each node.
    pub(super) rules_present: BTreeMap<String, bool>,
    /// Whether the agent's programs are attached on each node. An agent without a
    /// DataplaneNode keeps them as they are.
    pub(super) attached: BTreeMap<String, bool>,
    /// Whether the agent's programs take new connections on each node (attached, not draining).
    pub(super) translating_new: BTreeMap<String, bool>,
    pub(super) phases: Vec<DataplanePhase>,
    pub(super) kube_proxy_actions: Vec<(usize, KubeProxyAction)>,
}

impl Simulation {
    pub(super) fn new(node_count: usize, mode: DataplaneMode, max_unavailable: i32) -> Self {
        let nodes: Vec<ObservedNode> = (1..=node_count)
            .map(|index| kube_proxy_node(&format!("node-{index}")))
            .collect();
        let rules_present = nodes.iter().map(|node| (node.name.clone(), true)).collect();
        let mut cluster = cluster(nodes);
        if let Some(daemon_set) = cluster.kube_proxy_daemon_set.as_mut() {
            daemon_set.desired_number_scheduled =
                Some(i32::try_from(node_count).unwrap_or(i32::MAX));
        }
        Self {
            config: with_max_unavailable(config(mode), IntOrString::Int(max_unavailable)),
            cluster,
            broken_agents: Vec::new(),
            live_flows: BTreeMap::new(),
            rules_present,
            attached: BTreeMap::new(),
            translating_new: BTreeMap::new(),
            phases: Vec::new(),
            kube_proxy_actions: Vec::new(),
        }
    }

    pub(super) fn set_mode(&mut self, mode: DataplaneMode) {
        self.config.spec.mode = mode;
        self.config.metadata.generation = Some(self.config.metadata.generation.unwrap_or(1) + 1);
    }

    /// One reconcile: plan (checking the invariants), apply, let the cluster react, tick.
    pub(super) fn round(&mut self) -> Plan {
        // The operator reads the config afresh every time (a restart changes nothing).
        let config: DataplaneConfig =
            serde_json::from_value(serde_json::to_value(&self.config).expect("serializes"))
                .expect("reads back");
        let plan = super::super::plan(Some(&config), &self.cluster);
        check_invariants(Some(&config), &self.cluster, &plan);
        self.apply(&plan);
        self.react();
        self.check_every_node_is_served();
        self.cluster.now += Duration::seconds(1);
        plan
    }

    /// The promise of the whole operator: every node serves new Service connections all the
    /// time, from its agent's programs (a draining agent only finishes old ones) or from
    /// kube-proxy (a pod and its rules).
    fn check_every_node_is_served(&self) {
        for node in &self.cluster.nodes {
            let ebpf = self
                .translating_new
                .get(&node.name)
                .copied()
                .unwrap_or(false);
            let kube_proxy = node.kube_proxy_pod.is_some()
                && self.rules_present.get(&node.name).copied().unwrap_or(true);
            assert!(
                ebpf || kube_proxy,
                "{} serves Services from nothing; phases: {:?}",
                node.name,
                self.phases
            );
        }
    }

    /// The DataplaneNode of `name` is garbage-collected (its Node re-registered under the same
    /// name); the agent keeps its programs until a DataplaneNode exists again.
    pub(super) fn lose_dataplane_node(&mut self, name: &str) {
        node_mut(&mut self.cluster, name).dataplane_node = None;
    }

    fn apply(&mut self, plan: &Plan) {
        for write in &plan.dataplane_nodes {
            let node = node_mut(&mut self.cluster, &write.node_name);
            assert_eq!(write.create, node.dataplane_node.is_none());
            set_spec(
                node,
                write.spec.mode,
                write.spec.iptables_cleanup,
                write.spec.requested_at.expect("requestedAt"),
            );
        }
        match plan.kube_proxy {
            KubeProxyAction::None => {}
            KubeProxyAction::Disable => {
                let daemon_set = self
                    .cluster
                    .kube_proxy_daemon_set
                    .as_mut()
                    .expect("a DaemonSet to disable");
                daemon_set.disabled_by_switchyard = true;
                daemon_set.desired_number_scheduled = Some(0);
            }
            KubeProxyAction::Restore => {
                let daemon_set = self
                    .cluster
                    .kube_proxy_daemon_set
                    .as_mut()
                    .expect("a DaemonSet to restore");
                daemon_set.disabled_by_switchyard = false;
                daemon_set.desired_number_scheduled =
                    Some(i32::try_from(self.cluster.nodes.len()).unwrap_or(i32::MAX));
            }
        }
        for deletion in &plan.agent_pods_to_delete {
            let node = node_mut(&mut self.cluster, &deletion.node_name);
            assert_eq!(
                node.agent_pod.as_ref().map(|pod| pod.name.as_str()),
                Some(deletion.pod_name.as_str())
            );
            node.agent_pod = None;
        }
        if plan.kube_proxy != KubeProxyAction::None {
            self.kube_proxy_actions
                .push((self.phases.len(), plan.kube_proxy));
        }
        if let Some(status) = &plan.status {
            self.phases.push(status.phase);
            self.config.status = Some(status.clone());
        }
    }

    fn react(&mut self) {
        let now = self.cluster.now;
        let schedules = self
            .cluster
            .kube_proxy_daemon_set
            .as_ref()
            .is_some_and(KubeProxyDaemonSet::would_schedule);
        let update_revision = self
            .cluster
            .agent_daemon_set
            .as_ref()
            .and_then(|set| set.update_revision.clone());
        for node in &mut self.cluster.nodes {
            let name = node.name.clone();
            // The kube-proxy DaemonSet, and kube-proxy writing its rules.
            if schedules && node.kube_proxy_pod.is_none() {
                node.kube_proxy_pod = Some(pod(&format!("kube-proxy-{name}"), "kp-1", now));
            } else if !schedules {
                node.kube_proxy_pod = None;
            }
            if node.kube_proxy_pod.is_some() {
                self.rules_present.insert(name.clone(), true);
            }
            // The agent DaemonSet (OnDelete) recreates a deleted pod at the update revision.
            if node.agent_pod.is_none() {
                if let Some(revision) = &update_revision {
                    node.agent_pod = Some(pod(&format!("agent-{name}-{revision}"), revision, now));
                }
            }
            if self.broken_agents.contains(&name) {
                continue;
            }
            let Some(dataplane_node) = node.dataplane_node.as_ref() else {
                continue;
            };
            let spec = dataplane_node.spec.clone();
            let was_attached = self.attached.get(&name).copied().unwrap_or(false);
            let flows = self.live_flows.get(&name).copied().unwrap_or(0);
            let draining = spec.mode == DataplaneMode::KubeProxy && was_attached && flows > 0;
            if draining {
                self.live_flows.insert(name.clone(), flows - 1);
            }
            if spec.iptables_cleanup && node.kube_proxy_pod.is_none() {
                self.rules_present.insert(name.clone(), false);
            }
            let rules_present = self.rules_present.get(&name).copied().unwrap_or(true);
            let revision = node
                .agent_pod
                .as_ref()
                .and_then(|pod| pod.revision.clone())
                .unwrap_or_default();
            let attached = spec.mode == DataplaneMode::Ebpf || draining;
            self.attached.insert(name.clone(), attached);
            self.translating_new
                .insert(name.clone(), attached && !draining);
            let state = Report {
                attached,
                synced: true,
                ready: true,
                rules_present,
                kube_proxy_healthy: node.kube_proxy_pod.is_some() && rules_present,
                draining,
            };
            report(node, state, None, &revision);
        }
    }

    /// Rounds until the published phase is `Ready` (and stays so for a round), at most `limit`.
    pub(super) fn run_until_ready(&mut self, limit: usize) -> usize {
        for round in 0..limit {
            let plan = self.round();
            let quiet = plan.dataplane_nodes.is_empty()
                && plan.kube_proxy == KubeProxyAction::None
                && plan.agent_pods_to_delete.is_empty();
            if phase(&plan) == DataplanePhase::Ready && quiet {
                return round + 1;
            }
        }
        panic!(
            "not Ready after {limit} rounds; phases: {:?}; last status: {:?}",
            self.phases, self.config.status
        );
    }
}
