use switchyard_crds::{condition_types, DataplaneMode};

use super::metrics::{union_seconds, Histogram};
use super::simulated::simulated_status;
use super::*;

fn transition_figures(
    total: f64,
    reconcile_p99: f64,
    requests_by_verb: &[(&str, u64)],
) -> TransitionFigures {
    let requests_by_verb: BTreeMap<String, u64> = requests_by_verb
        .iter()
        .map(|(verb, count)| (verb.to_string(), *count))
        .collect();
    TransitionFigures {
        total,
        waiting_on_agents: total / 2.0,
        reconciles: 10.0,
        reconcile_p50: reconcile_p99 / 2.0,
        reconcile_p99,
        requests: requests_by_verb.values().sum(),
        requests_by_verb_and_resource: requests_by_verb
            .iter()
            .map(|(verb, count)| (format!("{verb} dataplanenodes"), *count))
            .collect(),
        requests_by_verb,
        rss_mib: 20.0,
        peak_rss_mib: 21.0,
    }
}

#[test]
fn the_summary_keeps_each_figure_over_the_runs_and_every_verb_any_run_made() {
    let runs: Vec<Run> = vec![
        Ok(transition_figures(
            10.0,
            0.1,
            &[("patch", 200), ("update", 4)],
        )),
        Err("failed to start the operator".into()),
        Ok(transition_figures(20.0, 0.3, &[("patch", 220)])),
    ];
    let mut summary = Summary::default();
    record(&mut summary, 100, &runs);
    let find = |metric: &str| summary.find(NAME, SYSTEM, 100, metric);
    assert_eq!(find("runs"), Some(2.0));
    assert_eq!(find("failed-to-measure"), Some(1.0));
    assert_eq!(find("total-time"), Some(15.0));
    assert_eq!(find("operator-time-max"), Some(10.0));
    assert_eq!(find("reconcile-p99-max"), Some(300.0));
    assert_eq!(find("api-requests-per-node"), Some(2.12));
    assert_eq!(find("api-requests-per-node-update-min"), Some(0.0));
    assert_eq!(find("api-requests-per-node-update-max"), Some(0.04));
}

#[test]
fn the_tables_show_every_run_and_the_medians_of_a_node_count() {
    let runs: Vec<Run> = vec![
        Ok(transition_figures(10.0, 0.1, &[("patch", 200)])),
        Err("failed to start the operator".into()),
        Ok(transition_figures(
            20.0,
            0.3,
            &[("patch", 220), ("update", 4)],
        )),
    ];
    let mut table = Table::new("operator", &COLUMNS);
    let mut requests = Table::new("requests", &REQUEST_COLUMNS);
    rows(&mut table, &mut requests, 100, &runs);
    let text = table.render();
    assert!(text.contains("patch 200"), "{text}");
    assert!(
        text.contains("FAILED: failed to start the operator"),
        "{text}"
    );
    let all = text
        .lines()
        .find(|line| line.contains("| all"))
        .unwrap_or_default();
    assert!(all.contains("15.0 (10.0-20.0)"), "{text}");
    assert!(all.contains("200 (100-300)"), "{text}");
    let requests = requests.render();
    let update = requests
        .lines()
        .find(|line| line.contains("update dataplanenodes"))
        .unwrap_or_default();
    assert!(update.contains("2 (0-4)"), "{requests}");
}

#[test]
fn quantiles_are_interpolated_within_the_bucket_holding_the_rank() {
    let metrics = "x_bucket{le=\"0.1\"} 50\nx_bucket{le=\"0.2\"} 100\nx_bucket{le=\"+Inf\"} 100\nx_count 100\n";
    let histogram = Histogram::parse(metrics, "x").expect("parses");
    assert_eq!(histogram.count, 100.0);
    assert!((histogram.quantile(0.5) - 0.1).abs() < 1e-9);
    assert!((histogram.quantile(0.75) - 0.15).abs() < 1e-9);
    let empty = Histogram {
        buckets: vec![],
        count: 0.0,
    };
    assert!(empty.quantile(0.5).is_nan());
    let later = Histogram::parse(
        "x_bucket{le=\"0.1\"} 60\nx_bucket{le=\"0.2\"} 130\nx_bucket{le=\"+Inf\"} 130\nx_count 130\n",
        "x",
    )
    .expect("parses");
    let difference = later.subtract(&histogram);
    assert_eq!(difference.count, 30.0);
    assert_eq!(difference.buckets[0], (0.1, 10.0));
}

#[test]
fn overlapping_waits_count_once() {
    let mut intervals = vec![(0, 1_000_000), (500_000, 1_500_000), (3_000_000, 3_500_000)];
    assert!((union_seconds(&mut intervals) - 2.0).abs() < 1e-9);
    assert_eq!(union_seconds(&mut []), 0.0);
}

#[test]
fn audit_requests_are_counted_for_the_user_within_the_window() {
    let directory =
        std::env::temp_dir().join(format!("switchyard-bench-audit-{}", std::process::id()));
    std::fs::create_dir_all(&directory).expect("directory");
    let log = directory.join("audit.log");
    std::fs::write(
        &log,
        concat!(
            "{\"user\":{\"username\":\"switchyard-operator\"},\"verb\":\"list\",\"objectRef\":{\"resource\":\"nodes\"},\"requestReceivedTimestamp\":\"2026-01-01T00:00:01.000000Z\"}\n",
            "{\"user\":{\"username\":\"switchyard-operator\"},\"verb\":\"patch\",\"objectRef\":{\"resource\":\"dataplanenodes\"},\"requestReceivedTimestamp\":\"2026-01-01T00:00:02.000000Z\"}\n",
            "{\"user\":{\"username\":\"bench\"},\"verb\":\"create\",\"requestReceivedTimestamp\":\"2026-01-01T00:00:02.000000Z\"}\n",
            "{\"user\":{\"username\":\"switchyard-operator\"},\"verb\":\"get\",\"requestReceivedTimestamp\":\"2026-01-01T00:00:09.000000Z\"}\n",
        ),
    )
    .expect("write");
    let start = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
        .expect("time")
        .timestamp_micros() as u64;
    let count = count_audit_requests(&log, "switchyard-operator", start, start + 5_000_000);
    let _ = std::fs::remove_dir_all(&directory);
    assert_eq!(count.total, 2);
    assert_eq!(count.by_verb.get("list"), Some(&1));
    assert_eq!(count.by_verb.get("patch"), Some(&1));
    assert_eq!(
        count.by_verb_and_resource.get("patch dataplanenodes"),
        Some(&1)
    );
    assert_eq!(count.by_verb_and_resource.get("list nodes"), Some(&1));
}

#[test]
fn a_simulated_agent_reports_the_spec_it_was_given() {
    let mut node = DataplaneNode::new(
        "node-00001",
        switchyard_crds::DataplaneNodeSpec::new(DataplaneMode::Ebpf),
    );
    node.metadata.generation = Some(3);
    node.spec.iptables_cleanup = true;
    let status = simulated_status(&node, chrono::Utc::now());
    assert_eq!(status.observed_generation, Some(3));
    assert!(status.condition_is_true(condition_types::PROGRAMS_ATTACHED));
    assert!(!status.condition_is_true(condition_types::KUBE_PROXY_RULES_PRESENT));
    assert!(status.condition_is_true(condition_types::READY));
}
