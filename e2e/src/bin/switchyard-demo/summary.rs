//! The demo's summary: one record per direction (traffic per flow, the transition's time, the
//! drain of the way back, kube-proxy's rules on every node before and after), printed as a
//! table and written as JSON for `e2e/scripts/check-demo-summary.sh`, which `make demo-check`
//! runs on it.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use switchyard_crds::DataplaneMode;
use switchyard_e2e::traffic::TrafficReport;

use crate::migration_support::KubeProxyRules;

/// Everything the demo did, in order.
#[derive(Clone, Debug, Serialize)]
pub struct DemoSummary {
    pub directions: Vec<DirectionSummary>,
    pub demo_seconds: f64,
}

/// One transition under traffic.
#[derive(Clone, Debug, Serialize)]
pub struct DirectionSummary {
    pub from: DataplaneMode,
    pub to: DataplaneMode,
    /// Whether the DataplaneConfig reached Ready in `to` within the demo's timeout.
    pub reached: bool,
    /// From `kubectl apply` to Ready (or to giving up).
    pub transition_seconds: f64,
    /// How long the traffic of this direction ran.
    pub traffic_seconds: f64,
    pub flows: Vec<FlowSummary>,
    /// Failed connections over every flow of this direction.
    pub failures: usize,
    pub nodes_serving_after: i32,
    pub nodes_total: i32,
    pub rules_cleaned_after: i32,
    pub kube_proxy_rules: Vec<NodeRules>,
    /// The way back only: the nodes' drain of the connections eBPF carried.
    pub drain: Option<DrainSummary>,
}

/// One flow of the traffic generator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FlowSummary {
    pub name: String,
    /// Long-lived connections (messages counted as attempts) rather than a new connection each.
    pub long_lived: bool,
    pub attempts: u64,
    pub successes: u64,
    pub failures: usize,
    /// Long-lived connections opened, the first time and every reopening of a broken one.
    pub connections_opened: u64,
    /// Long-lived connections the demo kept open (more opened means some broke).
    pub expected_connections: Option<u64>,
    /// Answers per backend.
    pub backends: BTreeMap<String, u64>,
}

/// kube-proxy's rules on one node before and after a direction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NodeRules {
    pub node: String,
    pub before: RulesCount,
    pub after: RulesCount,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RulesCount {
    /// Rules in chains named `KUBE-*` of the nat table.
    pub rules: usize,
    pub service_chains: usize,
    /// Whether kube-proxy's rules for the demo Service are there.
    pub demo_service: bool,
}

impl From<&KubeProxyRules> for RulesCount {
    fn from(rules: &KubeProxyRules) -> Self {
        RulesCount {
            rules: rules.kube_rules,
            service_chains: rules.service_chains,
            demo_service: rules.demo_service,
        }
    }
}

/// The drain of the way back, as the demo saw it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DrainSummary {
    /// The DataplaneConfig's `drainTimeoutSeconds`.
    pub timeout_seconds: u64,
    pub nodes_seen_draining: Vec<String>,
    /// The most live flows a draining node reported.
    pub most_live_flows: i64,
    /// From the first node seen draining to every node detached.
    pub seconds: Option<f64>,
    /// From the first node seen draining to the long-lived clients hanging up.
    pub held_seconds: Option<f64>,
    /// From the clients hanging up to every node detached.
    pub detached_after_hang_up_seconds: Option<f64>,
}

/// The flows of `report`; `expected_connections` is the long-lived connections per flow kept
/// open (None for new connections).
pub fn flows(report: &TrafficReport, expected_connections: Option<u64>) -> Vec<FlowSummary> {
    report
        .flows
        .iter()
        .map(|(name, flow)| FlowSummary {
            name: name.clone(),
            long_lived: expected_connections.is_some(),
            attempts: flow.attempts,
            successes: flow.successes,
            failures: flow.failures.len(),
            connections_opened: flow.connections_opened,
            expected_connections,
            backends: flow.backends.clone(),
        })
        .collect()
}

/// kube-proxy's rules per node before and after, in node order. A node missing from either is
/// left out rather than given made-up counts (which could read as "cleaned"), so the check
/// sees fewer nodes than the cluster has.
pub fn node_rules(
    before: &BTreeMap<&'static str, KubeProxyRules>,
    after: &BTreeMap<&'static str, KubeProxyRules>,
) -> Vec<NodeRules> {
    before
        .iter()
        .filter_map(|(node, before)| {
            after.get(node).map(|after| NodeRules {
                node: node.to_string(),
                before: before.into(),
                after: after.into(),
            })
        })
        .collect()
}

pub fn seconds(duration: Duration) -> f64 {
    // Tenths are all a reader (or the check) needs.
    (duration.as_secs_f64() * 10.0).round() / 10.0
}

fn row(label: impl AsRef<str>, value: impl AsRef<str>) {
    println!("  {:<52} {:>14}", label.as_ref(), value.as_ref());
}

fn mode_name(mode: DataplaneMode) -> &'static str {
    match mode {
        DataplaneMode::KubeProxy => "kube-proxy",
        DataplaneMode::Ebpf => "eBPF",
    }
}

/// The table of one direction.
pub fn print_direction(direction: &DirectionSummary) {
    println!();
    println!(
        "Summary: {} -> {}",
        mode_name(direction.from),
        mode_name(direction.to)
    );
    row(
        format!("transition (apply to Ready in {})", direction.to),
        if direction.reached {
            format!("{:.1} s", direction.transition_seconds)
        } else {
            format!("not Ready, {:.0} s", direction.transition_seconds)
        },
    );
    for flow in &direction.flows {
        if flow.long_lived {
            row(
                format!("kept open, {}", flow.name),
                format!(
                    "{}/{}",
                    flow.expected_connections.unwrap_or_default(),
                    flow.connections_opened
                ),
            );
            row(
                format!("messages answered, {}", flow.name),
                flow.successes.to_string(),
            );
        } else {
            row(
                format!("connections made, {}", flow.name),
                flow.attempts.to_string(),
            );
        }
        row(
            format!("failures, {}", flow.name),
            flow.failures.to_string(),
        );
    }
    row("failures, this direction", direction.failures.to_string());
    if let Some(drain) = &direction.drain {
        let or_dash = |value: Option<f64>| {
            value
                .map(|seconds| format!("{seconds:.1} s"))
                .unwrap_or_else(|| "-".into())
        };
        row(
            "nodes seen draining (most live flows)",
            format!(
                "{} ({})",
                if drain.nodes_seen_draining.is_empty() {
                    "none".to_string()
                } else {
                    drain.nodes_seen_draining.join(",")
                },
                drain.most_live_flows
            ),
        );
        row(
            "drain time (first draining to all detached)",
            or_dash(drain.seconds),
        );
        row(
            "  connections held open while draining",
            or_dash(drain.held_seconds),
        );
        row(
            "  all detached after the clients hung up",
            or_dash(drain.detached_after_hang_up_seconds),
        );
        row("drain timeout", format!("{} s", drain.timeout_seconds));
    }
    row(
        "nodes serving from eBPF after",
        format!(
            "{}/{}",
            direction.nodes_serving_after, direction.nodes_total
        ),
    );
    for node in &direction.kube_proxy_rules {
        row(
            format!("kube-proxy nat rules on {} (before -> after)", node.node),
            format!("{} -> {}", node.before.rules, node.after.rules),
        );
        row(
            format!("kube-proxy Service chains on {}", node.node),
            format!(
                "{} -> {}",
                node.before.service_chains, node.after.service_chains
            ),
        );
    }
}

/// Writes `summary` as JSON to `path` (its directory made if needed).
pub fn write(summary: &DemoSummary, path: &Path) -> Result<(), SummaryError> {
    if let Some(directory) = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    {
        std::fs::create_dir_all(directory).map_err(|source| SummaryError::Write {
            path: directory.display().to_string(),
            source,
        })?;
    }
    let json = serde_json::to_vec_pretty(summary).map_err(SummaryError::Encode)?;
    std::fs::write(path, json).map_err(|source| SummaryError::Write {
        path: path.display().to_string(),
        source,
    })
}

#[derive(Debug, thiserror::Error)]
pub enum SummaryError {
    #[error("failed to encode the demo summary")]
    Encode(#[source] serde_json::Error),
    #[error("failed to write the demo summary to {path}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

#[cfg(test)]
mod tests {
    //! The summary as the demo writes it, run through the check `make demo-check` uses: the
    //! writer and the check must agree on every field the check reads.

    use std::process::Command;
    use std::time::SystemTime;

    use switchyard_e2e::traffic::{Failure, FailureCause, FlowReport};

    use super::*;

    fn answered(successes: u64, opened: u64) -> FlowReport {
        FlowReport {
            attempts: successes,
            successes,
            failures: Vec::new(),
            backends: BTreeMap::from([
                ("backend-2".to_string(), successes / 2),
                ("backend-3".to_string(), successes - successes / 2),
            ]),
            connections_opened: opened,
        }
    }

    fn report(flows: [(&str, FlowReport); 2]) -> TrafficReport {
        TrafficReport {
            flows: flows
                .into_iter()
                .map(|(name, flow)| (name.to_string(), flow))
                .collect(),
            duration: Duration::from_secs(20),
        }
    }

    fn rules(demo_service: bool) -> KubeProxyRules {
        KubeProxyRules {
            service_chains: if demo_service { 3 } else { 0 },
            kube_rules: if demo_service { 21 } else { 2 },
            demo_service,
        }
    }

    fn rules_on_every_node(demo_service: bool) -> BTreeMap<&'static str, KubeProxyRules> {
        ["node-1", "node-2", "node-3"]
            .into_iter()
            .map(|node| (node, rules(demo_service)))
            .collect()
    }

    /// Both directions as the demo records them when everything went well; `short` is the
    /// way back's report of new connections.
    fn summary_of_both_ways(short: &TrafficReport) -> DemoSummary {
        let there = report([
            ("client pod -> ClusterIP", answered(1500, 0)),
            ("outside -> NodePort", answered(1500, 0)),
        ]);
        let long_lived = report([
            ("long-lived client pod -> ClusterIP", answered(300, 10)),
            ("long-lived outside -> NodePort", answered(300, 10)),
        ]);
        let mut back_flows = flows(short, None);
        back_flows.extend(flows(&long_lived, Some(10)));
        DemoSummary {
            directions: vec![
                DirectionSummary {
                    from: DataplaneMode::KubeProxy,
                    to: DataplaneMode::Ebpf,
                    reached: true,
                    transition_seconds: 14.0,
                    traffic_seconds: 20.0,
                    flows: flows(&there, None),
                    failures: there.failure_count(),
                    nodes_serving_after: 3,
                    nodes_total: 3,
                    rules_cleaned_after: 3,
                    kube_proxy_rules: node_rules(
                        &rules_on_every_node(true),
                        &rules_on_every_node(false),
                    ),
                    drain: None,
                },
                DirectionSummary {
                    from: DataplaneMode::Ebpf,
                    to: DataplaneMode::KubeProxy,
                    reached: true,
                    transition_seconds: 9.0,
                    traffic_seconds: 15.0,
                    failures: short.failure_count() + long_lived.failure_count(),
                    flows: back_flows,
                    nodes_serving_after: 0,
                    nodes_total: 3,
                    rules_cleaned_after: 0,
                    kube_proxy_rules: node_rules(
                        &rules_on_every_node(false),
                        &rules_on_every_node(true),
                    ),
                    drain: Some(DrainSummary {
                        timeout_seconds: 120,
                        nodes_seen_draining: vec!["node-1".into()],
                        most_live_flows: 20,
                        seconds: Some(4.0),
                        held_seconds: Some(3.0),
                        detached_after_hang_up_seconds: Some(0.5),
                    }),
                },
            ],
            demo_seconds: 70.0,
        }
    }

    /// Runs the check on `summary` written to a file; its exit status and output.
    fn check(summary: &DemoSummary, name: &str) -> (bool, String) {
        let path = std::env::temp_dir().join(format!(
            "switchyard-demo-summary-{}-{name}.json",
            std::process::id()
        ));
        write(summary, &path).expect("write the summary");
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/check-demo-summary.sh");
        let output = Command::new("bash")
            .arg(script)
            .arg(&path)
            .output()
            .expect("run bash");
        let _ = std::fs::remove_file(&path);
        (
            output.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
        )
    }

    fn short_traffic(failures: usize) -> TrafficReport {
        let mut failed = answered(1200, 0);
        failed.failures = (0..failures)
            .map(|index| Failure {
                flow: "outside -> NodePort".into(),
                after: Duration::from_millis(100 * index as u64),
                at: SystemTime::now(),
                cause: FailureCause::ConnectionReset,
            })
            .collect();
        failed.attempts += failures as u64;
        report([
            ("client pod -> ClusterIP", answered(1200, 0)),
            ("outside -> NodePort", failed),
        ])
    }

    #[test]
    fn a_summary_of_both_ways_without_failures_passes_the_check() {
        let (passed, output) = check(&summary_of_both_ways(&short_traffic(0)), "passing");
        assert!(passed, "the check refused it: {output}");
        assert!(
            output.contains("ok: Ebpf -> KubeProxy"),
            "the check names the way back: {output}"
        );
    }

    #[test]
    fn a_summary_with_failures_on_the_way_back_fails_the_check() {
        let (passed, output) = check(&summary_of_both_ways(&short_traffic(3)), "failing");
        assert!(!passed, "the check accepted it: {output}");
        assert!(
            output.contains("Ebpf -> KubeProxy: 3 connections failed"),
            "the check names the failures: {output}"
        );
    }

    #[test]
    fn a_node_without_rules_after_is_left_out_and_fails_the_check() {
        let mut summary = summary_of_both_ways(&short_traffic(0));
        let mut after = rules_on_every_node(false);
        after.remove("node-2");
        summary.directions[0].kube_proxy_rules = node_rules(&rules_on_every_node(true), &after);
        let recorded: Vec<&str> = summary.directions[0]
            .kube_proxy_rules
            .iter()
            .map(|node| node.node.as_str())
            .collect();
        assert_eq!(recorded, ["node-1", "node-3"]);
        let (passed, output) = check(&summary, "node-left-out");
        assert!(!passed, "the check accepted it: {output}");
        assert!(
            output.contains("kube-proxy rules recorded for 2 nodes"),
            "the check names the missing node: {output}"
        );
    }
}
