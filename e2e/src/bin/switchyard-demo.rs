//! `make demo` (run inside the local cluster by `e2e/scripts/demo.sh`): kube-proxy on 3
//! nodes serving a demo Service under traffic, the chart installed by helm, then there and
//! back under traffic: `mode: Ebpf` applied and the transition shown live, then `mode:
//! KubeProxy` with long-lived connections carried by eBPF, the nodes draining them before
//! they detach. A summary table per direction; `--summary PATH` also writes it as JSON for
//! `e2e/scripts/check-demo-summary.sh` (`make demo-check`).

#[path = "../../tests/migration_support/mod.rs"]
mod migration_support;
#[path = "switchyard-demo/summary.rs"]
mod summary;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use migration_support::*;
use switchyard_crds::{DataplaneMode, DataplaneNode};
use switchyard_e2e::traffic::{TrafficGenerator, TrafficReport};

use summary::{DemoSummary, DirectionSummary, DrainSummary};

const TRANSITION_TIMEOUT: Duration = Duration::from_secs(300);
/// Long-lived connections from each client, opened through eBPF before the way back.
const LONG_LIVED: usize = 10;
/// The way back's `drainTimeoutSeconds`: far above the demo's drain, so a drain that ends
/// only at its timeout (not with the connections) shows in the summary.
const DRAIN_TIMEOUT_SECONDS: u64 = 120;
/// How long the long-lived connections stay open once the nodes drain them: the drain is
/// part of what the demo shows, and the connections are seen answered through it.
const DRAIN_HOLD: Duration = Duration::from_secs(3);
/// Answers every flow gets on the final state of a direction before its traffic stops, so
/// the final state is shown to serve (not only reached).
const ANSWERS_ON_FINAL_STATE: u64 = 50;
const FINAL_STATE_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(250);

#[derive(Parser)]
#[command(about = "Switchyard's demo: kube-proxy to eBPF and back under traffic")]
struct Arguments {
    /// Also write the summary as JSON to this file (read by e2e/scripts/check-demo-summary.sh).
    #[arg(long, env = "SWITCHYARD_DEMO_SUMMARY")]
    summary: Option<PathBuf>,
    /// The cluster is removed after the demo (`make demo-check`): no tour of it at the end.
    #[arg(long)]
    cluster_removed_after: bool,
}

fn say(step: &str) {
    println!("==> {step}");
}

fn rules_on_every_node(world: &World) -> Outcome<BTreeMap<&'static str, KubeProxyRules>> {
    let mut rules = BTreeMap::new();
    for node in NODES {
        rules.insert(node, world.kube_proxy_rules(node)?);
    }
    Ok(rules)
}

/// The way back's drain as the demo watches it, and the long-lived connections it drains.
struct Drain {
    long_lived: Option<TrafficGenerator>,
    report: Option<TrafficReport>,
    first_draining: Option<Instant>,
    nodes_seen_draining: BTreeSet<String>,
    most_live_flows: i64,
    hung_up_at: Option<Instant>,
    all_detached_at: Option<Instant>,
}

impl Drain {
    fn new(long_lived: TrafficGenerator) -> Self {
        Drain {
            long_lived: Some(long_lived),
            report: None,
            first_draining: None,
            nodes_seen_draining: BTreeSet::new(),
            most_live_flows: 0,
            hung_up_at: None,
            all_detached_at: None,
        }
    }

    fn observe(&mut self, nodes: &BTreeMap<String, DataplaneNode>) {
        let now = Instant::now();
        for (name, node) in nodes {
            if is_draining(node) {
                self.first_draining.get_or_insert(now);
                self.nodes_seen_draining.insert(name.clone());
                self.most_live_flows = self.most_live_flows.max(live_flows(node));
            }
        }
        let all_detached = !nodes.is_empty()
            && nodes
                .values()
                .all(|node| node.spec.mode == DataplaneMode::KubeProxy && is_detached(node));
        if all_detached {
            self.all_detached_at.get_or_insert(now);
        }
    }

    /// The clients hang up once every node is back or draining and the drain has been held
    /// for [`DRAIN_HOLD`] (at once when no node drains: there is nothing to hold).
    fn hang_up_due(&self, nodes: &BTreeMap<String, DataplaneNode>) -> bool {
        let settled = !nodes.is_empty()
            && nodes.values().all(|node| {
                node.spec.mode == DataplaneMode::KubeProxy
                    && (is_detached(node) || is_draining(node))
            });
        self.long_lived.is_some()
            && settled
            && self
                .first_draining
                .is_none_or(|first| first.elapsed() >= DRAIN_HOLD)
    }

    async fn hang_up(&mut self) {
        if let Some(long_lived) = self.long_lived.take() {
            self.report = Some(long_lived.stop().await);
            self.hung_up_at = Some(Instant::now());
        }
    }

    fn summary(&self) -> DrainSummary {
        let between = |from: Option<Instant>, to: Option<Instant>| match (from, to) {
            (Some(from), Some(to)) if to >= from => Some(summary::seconds(to - from)),
            // Negative: the nodes detached before the clients hung up.
            (Some(from), Some(to)) => Some(-summary::seconds(from - to)),
            _ => None,
        };
        DrainSummary {
            timeout_seconds: DRAIN_TIMEOUT_SECONDS,
            nodes_seen_draining: self.nodes_seen_draining.iter().cloned().collect(),
            most_live_flows: self.most_live_flows,
            seconds: between(self.first_draining, self.all_detached_at),
            held_seconds: between(self.first_draining, self.hung_up_at),
            detached_after_hang_up_seconds: between(self.hung_up_at, self.all_detached_at),
        }
    }
}

/// Prints the transition to `target` live (a line per change, and every 5 s) until the
/// DataplaneConfig is Ready in it (and, on the way back, the drain's clients hung up); whether
/// it got there within [`TRANSITION_TIMEOUT`], and how long it took.
async fn watch_transition(
    world: &World,
    target: DataplaneMode,
    traffic: &TrafficGenerator,
    mut drain: Option<&mut Drain>,
) -> Outcome<(bool, Duration)> {
    let started = Instant::now();
    let mut last_line = String::new();
    let mut last_print = Instant::now();
    loop {
        let config = world.config().await?;
        let nodes = world.dataplane_nodes().await?;
        if let Some(drain) = drain.as_deref_mut() {
            drain.observe(&nodes);
            if drain.hang_up_due(&nodes) {
                drain.hang_up().await;
                println!(
                    "{:>5.1}s the long-lived clients hang up; draining nodes detach once their flows are gone",
                    started.elapsed().as_secs_f64()
                );
            }
        }
        let report = traffic.snapshot();
        let mut line = format!(
            "{}  connections {} failed {}",
            progress_line(config.as_ref(), &nodes, target),
            report.attempts(),
            report.failure_count()
        );
        if let Some(long_lived) = drain.as_deref().and_then(|drain| drain.long_lived.as_ref()) {
            let long_lived = long_lived.snapshot();
            line += &format!(
                "  long-lived opened {} broken {}",
                long_lived
                    .flows
                    .values()
                    .map(|flow| flow.connections_opened)
                    .sum::<u64>(),
                long_lived.failure_count()
            );
        }
        // The counters change on every poll; a line is printed when anything else changes.
        let state = progress_line(config.as_ref(), &nodes, target);
        if state != last_line || last_print.elapsed() > Duration::from_secs(5) {
            println!("{:>5.1}s {line}", started.elapsed().as_secs_f64());
            last_line = state;
            last_print = Instant::now();
        }
        let clients_gone = drain
            .as_deref()
            .is_none_or(|drain| drain.long_lived.is_none());
        if clients_gone
            && config
                .as_ref()
                .is_some_and(|config| config_ready(config, target))
        {
            return Ok((true, started.elapsed()));
        }
        if started.elapsed() > TRANSITION_TIMEOUT {
            let message = config
                .and_then(|config| config.status)
                .and_then(|status| status.message)
                .unwrap_or_default();
            println!("failed to reach Ready on {target} within {TRANSITION_TIMEOUT:?}: {message}");
            return Ok((false, started.elapsed()));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until every flow got [`ANSWERS_ON_FINAL_STATE`] more answers.
async fn answered_on_final_state(traffic: &TrafficGenerator) -> Outcome<()> {
    let base = traffic.snapshot();
    let started = Instant::now();
    loop {
        let now = traffic.snapshot();
        let answered = now.flows.iter().all(|(name, flow)| {
            let before = base.flows.get(name).map_or(0, |flow| flow.successes);
            flow.successes >= before + ANSWERS_ON_FINAL_STATE
        });
        if answered {
            return Ok(());
        }
        if started.elapsed() > FINAL_STATE_TIMEOUT {
            return Err(format!(
                "failed to see {ANSWERS_ON_FINAL_STATE} answers per flow on the final state within {FINAL_STATE_TIMEOUT:?}\n{now}"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The counts of nodes in the DataplaneConfig's status.
async fn node_counts(world: &World) -> Outcome<switchyard_crds::NodeCounts> {
    Ok(world
        .config()
        .await?
        .and_then(|config| config.status)
        .map(|status| status.nodes)
        .unwrap_or_default())
}

/// KubeProxy -> Ebpf under new connections from a pod and from outside.
async fn way_there(world: &World) -> Outcome<DirectionSummary> {
    say("traffic: new connections to the ClusterIP and the NodePort, all the time");
    let traffic = world.short_traffic_flowing().await?;
    let rules_before = rules_on_every_node(world)?;
    say("kubectl apply: DataplaneConfig `default`, mode: Ebpf");
    world
        .apply_config(
            DataplaneMode::Ebpf,
            serde_json::json!({"nodeReadyTimeoutSeconds": 60}),
        )
        .await?;
    let (reached, transition) =
        watch_transition(world, DataplaneMode::Ebpf, &traffic, None).await?;
    if reached {
        answered_on_final_state(&traffic).await?;
    }
    let report = traffic.stop().await;
    let rules_after = rules_on_every_node(world)?;
    let counts = node_counts(world).await?;
    if report.failure_count() > 0 {
        println!("\n{report}");
    }
    Ok(DirectionSummary {
        from: DataplaneMode::KubeProxy,
        to: DataplaneMode::Ebpf,
        reached,
        transition_seconds: summary::seconds(transition),
        traffic_seconds: summary::seconds(report.duration),
        flows: summary::flows(&report, None),
        failures: report.failure_count(),
        nodes_serving_after: counts.serving,
        nodes_total: counts.total,
        rules_cleaned_after: counts.rules_cleaned,
        kube_proxy_rules: summary::node_rules(&rules_before, &rules_after),
        drain: None,
    })
}

/// Ebpf -> KubeProxy under new connections, with long-lived connections carried by eBPF that
/// the nodes drain before they detach.
async fn way_back(world: &World) -> Outcome<DirectionSummary> {
    say(&format!(
        "the way back: new connections again, and {LONG_LIVED} long-lived connections from each client carried by eBPF"
    ));
    let traffic = world.short_traffic_flowing().await?;
    let mut drain = Drain::new(world.long_lived_traffic_open(LONG_LIVED).await?);
    let rules_before = rules_on_every_node(world)?;
    say(&format!(
        "kubectl apply: mode: KubeProxy, drainTimeoutSeconds: {DRAIN_TIMEOUT_SECONDS} (kube-proxy back first, then each node drains what eBPF carries)"
    ));
    world
        .apply_config(
            DataplaneMode::KubeProxy,
            serde_json::json!({
                "nodeReadyTimeoutSeconds": 60,
                "drainTimeoutSeconds": DRAIN_TIMEOUT_SECONDS,
            }),
        )
        .await?;
    let (reached, transition) =
        watch_transition(world, DataplaneMode::KubeProxy, &traffic, Some(&mut drain)).await?;
    // Given up on: the long-lived clients stop here, so their report exists.
    drain.hang_up().await;
    if reached {
        answered_on_final_state(&traffic).await?;
    }
    let report = traffic.stop().await;
    let long_lived = drain.report.clone().unwrap_or_default();
    let rules_after = rules_on_every_node(world)?;
    let counts = node_counts(world).await?;
    for report in [&report, &long_lived] {
        if report.failure_count() > 0 {
            println!("\n{report}");
        }
    }
    let mut flows = summary::flows(&report, None);
    flows.extend(summary::flows(&long_lived, Some(LONG_LIVED as u64)));
    Ok(DirectionSummary {
        from: DataplaneMode::Ebpf,
        to: DataplaneMode::KubeProxy,
        reached,
        transition_seconds: summary::seconds(transition),
        traffic_seconds: summary::seconds(report.duration),
        flows,
        failures: report.failure_count() + long_lived.failure_count(),
        nodes_serving_after: counts.serving,
        nodes_total: counts.total,
        rules_cleaned_after: counts.rules_cleaned,
        kube_proxy_rules: summary::node_rules(&rules_before, &rules_after),
        drain: Some(drain.summary()),
    })
}

/// What went wrong, one line each (empty when the demo went as it should).
fn problems(directions: &[DirectionSummary]) -> Vec<String> {
    let mut problems = Vec::new();
    for direction in directions {
        let name = format!("{} -> {}", direction.from, direction.to);
        if !direction.reached {
            problems.push(format!("{name}: not Ready in {}", direction.to));
        }
        if direction.failures > 0 {
            problems.push(format!("{name}: {} connections failed", direction.failures));
        }
        if let Some(drain) = &direction.drain {
            if drain.nodes_seen_draining.is_empty() {
                problems.push(format!("{name}: no node was seen draining"));
            }
        }
    }
    if directions.len() < 2 {
        problems.push("the way back was not run".into());
    }
    problems
}

async fn demo(arguments: Arguments) -> Outcome<()> {
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

    let there = way_there(&world).await?;
    summary::print_direction(&there);
    let mut directions = vec![there];
    // The way back starts from eBPF serving; from anywhere else it would show nothing.
    if directions[0].reached {
        println!();
        let back = way_back(&world).await?;
        summary::print_direction(&back);
        directions.push(back);
    }
    let summary = DemoSummary {
        directions,
        demo_seconds: summary::seconds(started.elapsed()),
    };
    println!(
        "\n  {:<52} {:>14}",
        "whole demo",
        format!("{:.0} s", summary.demo_seconds)
    );
    if let Some(path) = &arguments.summary {
        summary::write(&summary, path)?;
        println!("  summary written to {}", path.display());
    }
    if !arguments.cluster_removed_after {
        println!();
        println!(
            "The cluster stays up, back on kube-proxy (the demo's traffic and backends stopped with it). Look around:"
        );
        println!("  e2e/cluster exec kubectl get dpc,dpn");
        println!("  e2e/cluster exec kubectl describe dpc default");
        println!("  e2e/cluster exec kubectl -n kube-system get daemonset kube-proxy -o yaml");
        println!("  e2e/cluster exec ip netns exec node-1 iptables-save -t nat");
        println!("  e2e/cluster exec kubectl -n {RELEASE_NAMESPACE} get pods -o wide");
        println!("and remove it with: make demo-down");
    }
    let problems = problems(&summary.directions);
    if !problems.is_empty() {
        return Err(problems.join("; ").into());
    }
    Ok(())
}

#[tokio::main]
async fn main() {
    let arguments = Arguments::parse();
    if let Err(error) = demo(arguments).await {
        eprintln!("switchyard-demo: {error}");
        std::process::exit(1);
    }
}
