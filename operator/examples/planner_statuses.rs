//! Prints, one JSON document per line, the DataplaneConfig status the planner publishes in a
//! few typical situations (a transition under way, a halt, an ignored object, an invalid spec,
//! a finished transition, an agent upgrade, a canary over its disruption budget rolled back). `crds/tests/apiserver-1.20.sh` writes each one
//! through the status subresource of a real 1.20 API server, proving the planner's output is
//! valid for the CRD it publishes to.

mod support;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use support::{at, dataplane_node, Report};
use switchyard_crds::{
    CanarySpec, ConnectionSignals, DataplaneConfig, DataplaneConfigSpec, DataplaneMode,
    DataplaneNodeSpec, DisruptionReport, ServiceSignals, SignalWindow,
};
use switchyard_operator::planner::{
    plan, AgentDaemonSet, KubeProxyDaemonSet, ObservedCluster, ObservedNode, ObservedPod,
};

fn pod(name: &str, revision: &str) -> ObservedPod {
    ObservedPod {
        name: name.to_owned(),
        ready: true,
        revision: Some(revision.to_owned()),
        created_at: Some(at(-10_000)),
        terminating: false,
    }
}

/// A node told `mode`, whose agent reports on it (attached in `Ebpf`, kube-proxy healthy).
fn node(name: &str, mode: DataplaneMode, reported: bool, kube_proxy: bool) -> ObservedNode {
    let spec = DataplaneNodeSpec {
        requested_at: Some(at(-5_000)),
        // Without kube-proxy on the node, it has been told to clean (and has cleaned).
        iptables_cleanup: !kube_proxy,
        ..DataplaneNodeSpec::new(mode)
    };
    let report = Report {
        observed_generation: if reported { 2 } else { 1 },
        agent_revision: "old",
        at: at(-4_000),
        kube_proxy,
    };
    let dataplane_node = dataplane_node(name, spec, &report);
    ObservedNode {
        name: name.to_owned(),
        ready: true,
        labels: Default::default(),
        dataplane_node: Some(std::sync::Arc::new(dataplane_node)),
        kube_proxy_pod: kube_proxy.then(|| pod(&format!("kube-proxy-{name}"), "kp")),
        agent_pod: Some(pod(&format!("agent-{name}"), "old")),
    }
}

/// A canary on eBPF since its agent's report (`at(-4_000)`) whose failed connects to one
/// Service went from 5 in the ten minutes before to 900 in the minute after.
fn over_budget_canary(name: &str) -> ObservedNode {
    let mut canary = node(name, DataplaneMode::Ebpf, true, true);
    let window = |start: i64, end: i64, failed_connects: i64| SignalWindow {
        start: at(start),
        end: at(end),
        datapath: Default::default(),
        expected: Default::default(),
        connections: ConnectionSignals {
            failed_connects: Some(failed_connects),
            ..ConnectionSignals::default()
        },
        probes: Default::default(),
        services: vec![ServiceSignals {
            namespace: "shop".into(),
            name: "cart".into(),
            failed_connects: Some(failed_connects),
            resets_by_peer: None,
            probe_failures: None,
        }],
    };
    if let Some(status) = canary
        .dataplane_node
        .as_mut()
        .map(std::sync::Arc::make_mut)
        .and_then(|node| node.status.as_mut())
    {
        status.disruption = Some(DisruptionReport {
            baseline: Some(window(-4_600, -4_000, 5)),
            current: Some(window(-3_940, -3_880, 900)),
        });
    }
    canary
}

fn cluster(nodes: Vec<ObservedNode>, update_revision: &str) -> ObservedCluster {
    let kube_proxy_gone = nodes.iter().all(|node| node.kube_proxy_pod.is_none());
    ObservedCluster {
        now: at(0),
        nodes,
        kube_proxy_daemon_set: Some(KubeProxyDaemonSet {
            disabled_by_switchyard: kube_proxy_gone,
            desired_number_scheduled: Some(if kube_proxy_gone { 0 } else { 3 }),
            external_owner: None,
            patch_allowed: Some(true),
        }),
        agent_daemon_set: Some(AgentDaemonSet {
            update_revision: Some(update_revision.to_owned()),
        }),
        api_server_address_configured: true,
        unsupported_services: Vec::new(),
    }
}

fn config(name: &str, mode: DataplaneMode) -> DataplaneConfig {
    let mut config = DataplaneConfig::new(
        name,
        DataplaneConfigSpec {
            mode,
            ..DataplaneConfigSpec::default()
        },
    );
    config.metadata.generation = Some(1);
    config
}

fn main() {
    use DataplaneMode::{Ebpf, KubeProxy};
    let on_kube_proxy = || {
        cluster(
            vec![
                node("node-1", KubeProxy, true, true),
                node("node-2", KubeProxy, true, true),
            ],
            "old",
        )
    };
    let mut invalid = config("default", Ebpf);
    invalid.spec.rollout.max_unavailable = IntOrString::String("many".into());
    let mut halted_cluster = on_kube_proxy();
    halted_cluster.nodes[0] = node("node-1", Ebpf, false, true);
    let mut over_budget_cluster = on_kube_proxy();
    over_budget_cluster.nodes[0] = over_budget_canary("node-1");
    // The canary is opt-in: `canary: {}`, its defaults.
    let mut with_canary = config("default", Ebpf);
    with_canary.spec.rollout.canary = Some(CanarySpec::default());
    let situations = vec![
        ("activating", config("default", Ebpf), on_kube_proxy()),
        ("canary-over-budget", with_canary, over_budget_cluster),
        ("halted", config("default", Ebpf), halted_cluster),
        ("ignored", config("other", Ebpf), on_kube_proxy()),
        ("invalid", invalid, on_kube_proxy()),
        ("ready", config("default", KubeProxy), on_kube_proxy()),
        (
            "upgrading",
            config("default", Ebpf),
            cluster(
                vec![
                    node("node-1", Ebpf, true, false),
                    node("node-2", Ebpf, true, false),
                ],
                "new",
            ),
        ),
    ];
    for (situation, config, observed) in situations {
        let Some(status) = plan(Some(&config), &observed).status else {
            eprintln!("failed to get a status for {situation}");
            std::process::exit(1);
        };
        match serde_json::to_string(
            &serde_json::json!({ "situation": situation, "status": status }),
        ) {
            Ok(line) => println!("{line}"),
            Err(error) => {
                eprintln!("failed to serialize the status for {situation}: {error}");
                std::process::exit(1);
            }
        }
    }
}
