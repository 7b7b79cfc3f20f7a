//! Property tests over generated cluster states: whatever the cluster looks like, every plan
//! keeps the safety invariants (see `fixtures::check_invariants`), and a simulated cluster driven
//! by plans from a generated start always converges without breaking them.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use proptest::prelude::*;
use switchyard_crds::{DataplaneConfig, DataplaneMode, IptablesCleanupPolicy, KubeProxyManagement};

use super::super::*;
use super::fixtures::*;

fn mode() -> impl Strategy<Value = DataplaneMode> {
    prop_oneof![Just(DataplaneMode::KubeProxy), Just(DataplaneMode::Ebpf)]
}

prop_compose! {
    fn report_strategy()(
        attached in any::<bool>(),
        synced in any::<bool>(),
        ready in any::<bool>(),
        rules_present in any::<bool>(),
        kube_proxy_healthy in any::<bool>(),
        draining in any::<bool>(),
    ) -> Report {
        Report { attached, synced, ready, rules_present, kube_proxy_healthy, draining }
    }
}

prop_compose! {
    fn pod_strategy(prefix: &'static str)(
        present in any::<bool>(),
        ready in any::<bool>(),
        new_revision in any::<bool>(),
        age in 0i64..1000,
        terminating in prop::bool::weighted(0.1),
    ) -> Option<ObservedPod> {
        present.then(|| ObservedPod {
            name: format!("{prefix}-{age}"),
            ready,
            revision: Some(if new_revision { NEW_REVISION } else { OLD_REVISION }.to_owned()),
            created_at: Some(at(-age)),
            terminating,
        })
    }
}

prop_compose! {
    fn node_strategy()(
        ready in prop::bool::weighted(0.9),
        dataplane_node in prop::option::weighted(0.85, (mode(), any::<bool>(), 0i64..2000, 1i64..4)),
        status in prop::option::weighted(0.85, (report_strategy(), 0i64..2, any::<bool>())),
        kube_proxy_pod in pod_strategy("kube-proxy"),
        agent_pod in pod_strategy("agent"),
    ) -> ObservedNode {
        let mut node = ObservedNode {
            name: String::new(),
            ready,
            labels: Default::default(),
            dataplane_node: None,
            kube_proxy_pod,
            agent_pod,
        };
        if let Some((mode, cleanup, requested_ago, generation)) = dataplane_node {
            for _ in 0..generation {
                set_spec(&mut node, mode, cleanup, at(-requested_ago));
            }
            if let Some((state, lag, new_revision)) = status {
                let current = node.dataplane_node.as_ref().and_then(|node| node.metadata.generation).unwrap_or(1);
                report(&mut node, state, Some(current - lag), if new_revision { NEW_REVISION } else { OLD_REVISION });
            }
        }
        node
    }
}

prop_compose! {
    fn cluster_strategy()(
        nodes in prop::collection::vec(node_strategy(), 0..7),
        kube_proxy in prop::option::weighted(0.8, (any::<bool>(), prop::option::of(0i32..4), prop::option::weighted(0.15, Just("argocd.argoproj.io/tracking-id".to_owned())))),
        update_revision in prop::option::of(any::<bool>()),
        api_server_address_configured in prop::bool::weighted(0.9),
        unsupported_services in prop::collection::vec(prop::sample::subsequence(vec![UnsupportedFeature::SctpPorts, UnsupportedFeature::Ipv6], 1..=2), 0..3),
        now in 0i64..1500,
    ) -> ObservedCluster {
        let nodes = nodes
            .into_iter()
            .enumerate()
            .map(|(index, mut node)| {
                node.name = format!("node-{index}");
                if let Some(dataplane_node) = node.dataplane_node.as_mut().map(Arc::make_mut) {
                    dataplane_node.metadata.name = Some(node.name.clone());
                }
                node
            })
            .collect();
        ObservedCluster {
            now: at(now),
            nodes,
            kube_proxy_daemon_set: kube_proxy.map(|(disabled_by_switchyard, desired_number_scheduled, external_owner)| KubeProxyDaemonSet {
                disabled_by_switchyard,
                desired_number_scheduled: if disabled_by_switchyard { Some(0) } else { desired_number_scheduled },
                external_owner,
                patch_allowed: None,
            }),
            agent_daemon_set: update_revision.map(|new| AgentDaemonSet {
                update_revision: Some(if new { NEW_REVISION } else { OLD_REVISION }.to_owned()),
            }),
            api_server_address_configured,
            unsupported_services: unsupported_services
                .into_iter()
                .enumerate()
                .map(|(index, features)| Arc::new(UnsupportedService {
                    namespace: "shop".into(),
                    name: format!("service-{index}"),
                    uid: None,
                    features,
                }))
                .collect(),
        }
    }
}

prop_compose! {
    fn config_strategy()(
        mode in mode(),
        paused in prop::bool::weighted(0.1),
        external in prop::bool::weighted(0.3),
        cleanup_disabled in prop::bool::weighted(0.2),
        max_unavailable in prop_oneof![
            (1i32..4).prop_map(IntOrString::Int),
            (0u32..=100).prop_map(|percent| IntOrString::String(format!("{percent}%"))),
        ],
        max_failed_nodes in 0i32..3,
        node_ready_timeout_seconds in prop_oneof![Just(300i64), 1i64..1000],
        drain_timeout_seconds in prop_oneof![Just(600i64), 0i64..1000],
        named_default in prop::bool::weighted(0.95),
    ) -> DataplaneConfig {
        let mut config = config(mode);
        if !named_default {
            config.metadata.name = Some("other".into());
        }
        config.spec.paused = paused;
        config.spec.kube_proxy.management = if external { KubeProxyManagement::External } else { KubeProxyManagement::Managed };
        config.spec.iptables_cleanup = if cleanup_disabled { IptablesCleanupPolicy::Disabled } else { IptablesCleanupPolicy::Auto };
        config.spec.rollout.max_unavailable = max_unavailable;
        config.spec.rollout.max_failed_nodes = max_failed_nodes;
        config.spec.rollout.node_ready_timeout_seconds = node_ready_timeout_seconds;
        config.spec.rollout.drain_timeout_seconds = drain_timeout_seconds;
        config
    }
}

proptest! {
    // Modest case counts: `cargo test` must stay fast on two shared cores.
    #![proptest_config(ProptestConfig { cases: 384, ..ProptestConfig::default() })]

    /// Cleanup is never requested where a kube-proxy pod exists or the DaemonSet would schedule;
    /// kube-proxy is never disabled while a node does not serve from eBPF; no node leaves eBPF
    /// while kube-proxy is not healthy on it; never more than maxUnavailable in flight; no node
    /// is activated while an unsupported Service exists and the transition has not started; the
    /// same snapshot always gives the same plan.
    #[test]
    fn every_plan_keeps_the_safety_invariants(config in config_strategy(), cluster in cluster_strategy()) {
        let plan = plan(Some(&config), &cluster);
        check_invariants(Some(&config), &cluster, &plan);
    }

    #[test]
    fn every_plan_without_a_config_keeps_the_safety_invariants(cluster in cluster_strategy()) {
        let plan = plan(None, &cluster);
        prop_assert!(plan.status.is_none());
        check_invariants(None, &cluster, &plan);
    }

    /// From a cluster wholly on kube-proxy whose agents are all Ready (so that nothing else
    /// holds the preflight), with any rollout settings: while an unsupported Service exists no
    /// node is activated and kube-proxy is left alone; without one (the control) the first batch
    /// goes.
    #[test]
    fn no_node_is_activated_while_an_unsupported_service_exists_and_the_transition_has_not_started(
        node_count in 1usize..7,
        config in config_strategy(),
        unsupported_services in prop::collection::vec(prop::sample::subsequence(vec![UnsupportedFeature::SctpPorts, UnsupportedFeature::Ipv6], 1..=2), 0..3),
    ) {
        let mut cluster = cluster((1..=node_count).map(|index| kube_proxy_node(&format!("node-{index}"))).collect());
        cluster.unsupported_services = unsupported_services
            .into_iter()
            .enumerate()
            .map(|(index, features)| Arc::new(UnsupportedService {
                namespace: "shop".into(),
                name: format!("service-{index}"),
                uid: None,
                features,
            }))
            .collect();
        let mut config = config;
        config.metadata.name = Some("default".into());
        config.spec.mode = DataplaneMode::Ebpf;
        config.spec.paused = false;
        let plan = plan(Some(&config), &cluster);
        check_invariants(Some(&config), &cluster, &plan);
        let activated = plan.dataplane_nodes.iter().filter(|write| write.spec.mode == DataplaneMode::Ebpf).count();
        if cluster.unsupported_services.is_empty() {
            prop_assert!(activated > 0, "control: nothing else holds the preflight");
        } else {
            prop_assert_eq!(activated, 0);
            prop_assert_eq!(plan.kube_proxy, KubeProxyAction::None);
        }
    }

    /// Restarting the operator (reading its own status back) changes no decision.
    #[test]
    fn a_restarted_operator_makes_the_same_decision(config in config_strategy(), cluster in cluster_strategy()) {
        let first = plan(Some(&config), &cluster);
        let mut restarted: DataplaneConfig = config.clone();
        restarted.status = first.status.clone();
        let restarted: DataplaneConfig = serde_json::from_value(serde_json::to_value(&restarted).expect("serializes")).expect("reads back");
        let second = plan(Some(&restarted), &cluster);
        prop_assert_eq!(&first.dataplane_nodes, &second.dataplane_nodes);
        prop_assert_eq!(first.kube_proxy, second.kube_proxy);
        prop_assert_eq!(&first.agent_pods_to_delete, &second.agent_pods_to_delete);
        prop_assert_eq!(first.status.map(|status| status.phase), second.status.map(|status| status.phase));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// From a cluster on kube-proxy, any sequence of mode flips driven through a simulated
    /// cluster (with an agent that may stop reporting for a while, live connections that make
    /// nodes drain, an agent upgrade that may land at any time, and a DataplaneNode that may be
    /// garbage-collected at any time while its agent keeps its programs) keeps every invariant
    /// and every node served at every round, and once the broken agent recovers ends Ready in
    /// the last requested mode.
    #[test]
    fn any_sequence_of_mode_flips_converges_safely(
        node_count in 1usize..5,
        max_unavailable in 1i32..3,
        max_failed_nodes in 0i32..2,
        flips in prop::collection::vec((mode(), 0usize..8), 1..4),
        broken_node in prop::option::weighted(0.3, 1usize..5),
        broken_rounds in 0usize..400,
        live_flows in prop::collection::vec(0u32..4, 4),
        upgrade_after in prop::option::weighted(0.3, 0usize..20),
        lost_dataplane_node in prop::option::weighted(0.5, (1usize..5, 0usize..20)),
    ) {
        let mut simulation = Simulation::new(node_count, DataplaneMode::KubeProxy, max_unavailable);
        simulation.config.spec.rollout.max_failed_nodes = max_failed_nodes;
        for (index, flows) in live_flows.iter().enumerate() {
            simulation.live_flows.insert(format!("node-{}", index + 1), *flows);
        }
        if let Some(broken) = broken_node.filter(|broken| *broken <= node_count) {
            simulation.broken_agents.push(format!("node-{broken}"));
        }
        let mut round = 0;
        for (mode, rounds) in &flips {
            simulation.config.spec.mode = *mode;
            for _ in 0..*rounds {
                if upgrade_after == Some(round) {
                    simulation.cluster.agent_daemon_set = Some(AgentDaemonSet { update_revision: Some(NEW_REVISION.into()) });
                }
                if let Some((node, _)) = lost_dataplane_node.filter(|(node, at)| *at == round && *node <= node_count) {
                    simulation.lose_dataplane_node(&format!("node-{node}"));
                }
                simulation.round();
                round += 1;
            }
        }
        for _ in 0..broken_rounds {
            simulation.round();
        }
        simulation.broken_agents.clear();
        simulation.run_until_ready(120);
        let last = flips.last().map(|(mode, _)| *mode).unwrap_or(DataplaneMode::KubeProxy);
        for node in &simulation.cluster.nodes {
            let spec = &node.dataplane_node.as_ref().expect("every node has its DataplaneNode").spec;
            prop_assert_eq!(spec.mode, last);
            prop_assert_eq!(node.kube_proxy_pod.is_some(), last == DataplaneMode::KubeProxy);
        }
    }
}
