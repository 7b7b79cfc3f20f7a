//! `make demo` (run inside the local cluster by `e2e/scripts/demo.sh`): kube-proxy on 3
//! nodes serving a demo Service under traffic, the chart installed by helm, then
//! `mode: Ebpf` applied and the transition shown live, and a summary table.

#[path = "../../tests/migration_support/mod.rs"]
mod migration_support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use migration_support::*;
use switchyard_crds::DataplaneMode;

const TRANSITION_TIMEOUT: Duration = Duration::from_secs(300);

fn say(step: &str) {
    println!("==> {step}");
}

async fn rules_on_every_node(world: &World) -> Outcome<BTreeMap<&'static str, KubeProxyRules>> {
    let mut rules = BTreeMap::new();
    for node in NODES {
        rules.insert(node, world.kube_proxy_rules(node)?);
    }
    Ok(rules)
}

async fn demo() -> Outcome<()> {
    let started = Instant::now();
    say("kube-proxy on every node, a NodePort Service `demo` with backends on node-2 and node-3");
    let world = World::new().await?;
    println!(
        "    ClusterIP {} (from a client pod on node-1), NodePort {} (from outside the nodes)",
        world.cluster_ip_address(),
        world.node_port_address()
    );
    say(&format!(
        "helm install {RELEASE} charts/switchyard (apiServer.host={})",
        world.api_server_host
    ));
    world.helm_install(&[])?;
    world
        .wait_agents_reporting(Duration::from_secs(120))
        .await?;
    println!("    operator and 3 agents up; every node still on kube-proxy");

    say("traffic: new connections to the ClusterIP and the NodePort, all the time");
    let traffic = world.short_traffic()?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rules_before = rules_on_every_node(&world).await?;

    say("kubectl apply: DataplaneConfig `default`, mode: Ebpf");
    let transition_started = Instant::now();
    world
        .apply_config(
            DataplaneMode::Ebpf,
            serde_json::json!({"nodeReadyTimeoutSeconds": 60}),
        )
        .await?;
    let mut last_line = String::new();
    let mut last_print = Instant::now();
    loop {
        let config = world.config().await?;
        let nodes = world.dataplane_nodes().await?;
        let report = traffic.snapshot();
        let line = progress_line(config.as_ref(), &nodes, DataplaneMode::Ebpf);
        if line != last_line || last_print.elapsed() > Duration::from_secs(5) {
            println!(
                "{:>5.1}s {line}  connections {} failed {}",
                transition_started.elapsed().as_secs_f64(),
                report.attempts(),
                report.failure_count()
            );
            last_line = line;
            last_print = Instant::now();
        }
        if config
            .as_ref()
            .is_some_and(|config| config_ready(config, DataplaneMode::Ebpf))
        {
            break;
        }
        if transition_started.elapsed() > TRANSITION_TIMEOUT {
            let message = config
                .and_then(|config| config.status)
                .and_then(|status| status.message)
                .unwrap_or_default();
            return Err(format!(
                "failed to reach Ready on Ebpf within {TRANSITION_TIMEOUT:?}: {message}"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let transition = transition_started.elapsed();
    // A little more traffic on the final state, then the totals.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let report = traffic.stop().await;
    let rules_after = rules_on_every_node(&world).await?;
    let config = world.config().await?;
    let counts = config
        .as_ref()
        .and_then(|config| config.status.as_ref())
        .map(|status| status.nodes.clone())
        .unwrap_or_default();

    println!();
    println!("Summary: kube-proxy -> eBPF");
    println!(
        "  {:<42} {:>12}",
        "transition (apply to Ready)",
        format!("{:.1} s", transition.as_secs_f64())
    );
    for (name, flow) in &report.flows {
        println!(
            "  {:<42} {:>12}",
            format!("connections made, {name}"),
            flow.attempts
        );
        println!(
            "  {:<42} {:>12}",
            format!("failures, {name}"),
            flow.failures.len()
        );
    }
    println!(
        "  {:<42} {:>12}",
        "connections made, total",
        report.attempts()
    );
    println!("  {:<42} {:>12}", "failures, total", report.failure_count());
    println!(
        "  {:<42} {:>12}",
        "nodes serving from eBPF",
        format!("{}/{}", counts.serving, counts.total)
    );
    println!(
        "  {:<42} {:>12}",
        "nodes whose kube-proxy rules were cleaned",
        format!("{}/{}", counts.rules_cleaned, counts.total)
    );
    for node in NODES {
        let before = rules_before.get(node).cloned().unwrap_or_default();
        let after = rules_after.get(node).cloned().unwrap_or_default();
        println!(
            "  {:<42} {:>12}",
            format!("kube-proxy nat rules on {node} (before -> after)"),
            format!("{} -> {}", before.kube_rules, after.kube_rules)
        );
        println!(
            "  {:<42} {:>12}",
            format!("kube-proxy Service chains on {node}"),
            format!("{} -> {}", before.service_chains, after.service_chains)
        );
    }
    println!(
        "  {:<42} {:>12}",
        "whole demo",
        format!("{:.0} s", started.elapsed().as_secs_f64())
    );
    if report.failure_count() > 0 {
        println!("\n{report}");
    }
    println!();
    println!(
        "The cluster stays up (the demo's traffic and backends stopped with it). Look around:"
    );
    println!("  e2e/cluster exec kubectl get dpc,dpn");
    println!("  e2e/cluster exec kubectl describe dpc default");
    println!("  e2e/cluster exec kubectl -n kube-system get daemonset kube-proxy -o yaml");
    println!("  e2e/cluster exec ip netns exec node-1 iptables-save -t nat");
    println!("  e2e/cluster exec kubectl -n {RELEASE_NAMESPACE} get pods -o wide");
    println!("and remove it with: make demo-down");
    if report.failure_count() > 0 {
        return Err(format!("{} connections failed", report.failure_count()).into());
    }
    Ok(())
}

#[tokio::main]
async fn main() {
    if let Err(error) = demo().await {
        eprintln!("switchyard-demo: {error}");
        std::process::exit(1);
    }
}
