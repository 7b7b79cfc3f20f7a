use super::*;
use crate::load::Event;

fn figures(failed: u64, steady: f64, during: f64) -> RestartFigures {
    RestartFigures {
        connections: 1_000,
        failed,
        failed_during: failed,
        p99_steady_ms: steady,
        p99_during_ms: during,
        achieved_rate: 2_000.0,
    }
}

#[test]
fn restart_figures_split_the_timeline_at_the_signal() {
    let event = |start_us, latency_us, ok| Event {
        start_us,
        latency_us,
        ok,
    };
    let report = LoadReport {
        operations: 4,
        failures: 1,
        started_unix_us: 1_000_000,
        timeline: vec![
            event(100, 1_000, true),
            event(200, 2_000, true),
            event(1_000_100, 9_000, true),
            event(1_000_200, 0, false),
            event(9_000_000, 50_000, true),
        ],
        ..LoadReport::default()
    };
    let figures = restart_figures(&report, 2_000_000, Duration::from_secs(2));
    assert_eq!(figures.failed_during, 1);
    assert_eq!(figures.p99_steady_ms, 2.0);
    assert_eq!(figures.p99_during_ms, 9.0);
    assert_eq!(figures.connections, 5);
}

#[test]
fn the_summary_totals_the_failures_and_takes_the_median_ratio_of_the_runs() {
    let runs = vec![
        Ok(figures(0, 0.25, 0.5)),
        Ok(figures(2, 0.25, 0.25)),
        Err("failed to start".into()),
        Ok(figures(0, 0.5, 1.5)),
    ];
    let mut summary = Summary::default();
    record(&mut summary, "switchyard", 10_000, &runs);
    let find = |metric: &str| summary.find(NAME, "switchyard", 10_000, metric);
    assert_eq!(find("runs"), Some(3.0));
    assert_eq!(find("failed-to-measure"), Some(1.0));
    assert_eq!(find("connections"), Some(3_000.0));
    assert_eq!(find("failed"), Some(2.0));
    assert_eq!(find(RATIO), Some(2.0));
    assert_eq!(find(&format!("{RATIO}-min")), Some(1.0));
    assert_eq!(find(&format!("{RATIO}-max")), Some(3.0));
    assert_eq!(find("p99-steady"), Some(0.25));
    assert_eq!(find("p99-during-restart"), Some(0.5));
}

#[test]
fn a_system_with_no_measured_run_records_only_that_it_failed() {
    let runs = vec![Err("failed to serve".into()), Err("failed to serve".into())];
    let mut summary = Summary::default();
    record(&mut summary, "kube-proxy-iptables-legacy", 10_000, &runs);
    assert_eq!(summary.measurements.len(), 1);
    assert_eq!(
        summary.find(
            NAME,
            "kube-proxy-iptables-legacy",
            10_000,
            "failed-to-measure"
        ),
        Some(2.0)
    );
}

#[test]
fn the_table_shows_every_run_and_a_row_of_totals_and_medians_per_system() {
    let plan = Plan::from_arguments(&["--quick"]);
    let systems = [System::Switchyard];
    let runs = [vec![
        Ok(figures(0, 0.25, 0.5)),
        Err("failed to start the agent".into()),
        Ok(figures(3, 0.5, 0.75)),
    ]];
    let text = table(&plan, 10_000, &systems, &runs, &[System::KubeProxyLegacy]).render();
    let lines: Vec<&str> = text
        .lines()
        .filter(|line| line.starts_with("| switchyard"))
        .collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert!(lines[0].contains(" 1,000 |"), "{text}");
    assert!(
        lines[1].contains("FAILED: failed to start the agent"),
        "{text}"
    );
    let all = lines[3];
    assert!(all.contains("| all "), "{text}");
    assert!(all.contains(" 2,000 |"), "{text}");
    assert!(all.contains(" 3 |"), "{text}");
    assert!(all.contains("1.75 (1.50-2.00)"), "{text}");
    // The plan's systems include kube-proxy; it could not serve, so it was not tried.
    assert!(
        text.contains("kube-proxy-iptables-legacy | not tried"),
        "{text}"
    );
}
