//! How long one `plan` takes on big clusters, as a table:
//! `cargo run --release -p switchyard-operator --example planner_scale`.
//!
//! Each cluster is in the middle of a transition to eBPF (half the nodes serving, kube-proxy
//! everywhere, `maxUnavailable: 10%`), the most work a plan does: every node's facts, a batch,
//! messages and counts. "nodes written" is what one plan holds: at most
//! `MAX_NODE_WRITES_PER_RECONCILE`, the rest follow in the next plans.

mod support;

use std::time::Instant;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use support::{at, dataplane_node, Report};
use switchyard_crds::{DataplaneConfig, DataplaneConfigSpec, DataplaneMode, DataplaneNodeSpec};
use switchyard_operator::planner::{
    plan, AgentDaemonSet, KubeProxyDaemonSet, ObservedCluster, ObservedNode, ObservedPod,
};

fn node(index: usize) -> ObservedNode {
    let name = format!("node-{index:05}");
    let mode = if index.is_multiple_of(2) {
        DataplaneMode::Ebpf
    } else {
        DataplaneMode::KubeProxy
    };
    let report = Report {
        observed_generation: 2,
        agent_revision: "r1",
        at: at(-50),
        kube_proxy: true,
    };
    let spec = DataplaneNodeSpec {
        requested_at: Some(at(-100)),
        ..DataplaneNodeSpec::new(mode)
    };
    let dataplane_node = dataplane_node(&name, spec, &report);
    let pod = |prefix: &str| ObservedPod {
        name: format!("{prefix}-{name}"),
        ready: true,
        revision: Some("r1".into()),
        created_at: Some(at(-1000)),
        terminating: false,
    };
    ObservedNode {
        name: name.clone(),
        ready: true,
        labels: Default::default(),
        dataplane_node: Some(std::sync::Arc::new(dataplane_node)),
        kube_proxy_pod: Some(pod("kube-proxy")),
        agent_pod: Some(pod("agent")),
    }
}

fn main() {
    let mut config = DataplaneConfig::new(
        "default",
        DataplaneConfigSpec {
            mode: DataplaneMode::Ebpf,
            ..DataplaneConfigSpec::default()
        },
    );
    config.spec.rollout.max_unavailable = IntOrString::String("10%".into());
    println!(
        "{:>7} {:>8} {:>12} {:>12}",
        "nodes", "rounds", "ms per plan", "nodes written"
    );
    for count in [10, 100, 1000, 5000] {
        let observed = ObservedCluster {
            now: at(0),
            nodes: (0..count).map(node).collect(),
            kube_proxy_daemon_set: Some(KubeProxyDaemonSet {
                disabled_by_switchyard: false,
                desired_number_scheduled: Some(i32::try_from(count).unwrap_or(i32::MAX)),
                external_owner: None,
                patch_allowed: Some(true),
            }),
            agent_daemon_set: Some(AgentDaemonSet {
                update_revision: Some("r1".into()),
            }),
            api_server_address_configured: true,
            unsupported_services: Vec::new(),
        };
        let rounds = if count >= 1000 { 10 } else { 100 };
        let started = Instant::now();
        let mut written = 0;
        for _ in 0..rounds {
            written = plan(Some(&config), &observed).dataplane_nodes.len();
        }
        let per_plan = started.elapsed().as_secs_f64() * 1000.0 / f64::from(rounds);
        println!("{count:>7} {rounds:>8} {per_plan:>12.3} {written:>12}");
    }
}
