use super::*;

#[test]
fn a_connection_rate_below_one_and_a_half_times_kube_proxy_is_a_miss() {
    let mut summary = Summary::default();
    summary.record(
        "dataplane",
        "switchyard",
        10_000,
        "new-connections-per-second",
        20_000.0,
        "1/s",
    );
    summary.record(
        "dataplane",
        "kube-proxy-iptables-legacy",
        10_000,
        "new-connections-per-second",
        15_000.0,
        "1/s",
    );
    summary.record(
        "dataplane",
        "kube-proxy-iptables-nft",
        10_000,
        "new-connections-per-second",
        5_000.0,
        "1/s",
    );
    summary.record(
        "dataplane",
        "direct",
        10_000,
        "new-connections-per-second",
        21_000.0,
        "1/s",
    );
    let text = table(&summary, &[100, 10_000], 2_000.0, &[100]).render();
    let line = |goal: &str| goal_line(&text, goal);
    assert!(line(">= 1.5x kube-proxy").contains("MISSED"), "{text}");
    assert!(
        line(">= 1.5x kube-proxy").contains("kube-proxy-iptables-legacy"),
        "{text}"
    );
    assert!(line("within 10% of direct").contains("met"), "{text}");
    assert!(line(">= 3x kube-proxy").contains("not measured"), "{text}");
}

#[test]
fn the_rate_against_direct_is_judged_on_the_medians_and_shows_the_rounds_pairs() {
    let mut summary = Summary::default();
    summary.record_runs(
        "dataplane",
        "direct",
        10_000,
        "new-connections-per-second",
        &[16_000.0, 15_000.0, 17_000.0],
        "1/s",
    );
    summary.record_runs(
        "dataplane",
        "switchyard",
        10_000,
        "new-connections-per-second",
        &[14_000.0, 13_000.0, 15_000.0],
        "1/s",
    );
    summary.record_runs(
        "dataplane",
        "switchyard",
        10_000,
        "new-connections-per-second-over-direct-same-round",
        &[87.5, 86.7, 88.2],
        "percent",
    );
    let text = table(&summary, &[10_000], 2_000.0, &[100]).render();
    let line = text
        .lines()
        .find(|line| line.contains("connection rate within 10% of direct"))
        .unwrap_or_default();
    assert!(line.contains("14,000 vs 16,000 direct: 88%"), "{text}");
    assert!(
        line.contains("pairs within a round: median 88%, 87-88%"),
        "{text}"
    );
    assert!(line.contains("MISSED"), "{text}");
}

/// The goals table's line that names `goal`.
fn goal_line(text: &str, goal: &str) -> String {
    text.lines()
        .find(|line| line.contains(goal))
        .unwrap_or_default()
        .to_string()
}

#[test]
fn the_scales_own_rounds_and_the_closed_loop_are_shown_beside_the_flatness_goal_for_reference() {
    let mut summary = Summary::default();
    for (scale, fixed_rate, full_load) in [(100, 330.0, 1_440.0), (30_000, 355.0, 1_830.0)] {
        summary.record(
            "dataplane",
            "switchyard",
            scale,
            "fixed-rate-connect-latency-p99",
            fixed_rate,
            "us",
        );
        summary.record(
            "dataplane",
            "switchyard",
            scale,
            "connect-latency-p99",
            full_load,
            "us",
        );
    }
    let text = table(&summary, &[100, 30_000], 2_000.0, &[100]).render();
    let line = |goal: &str| goal_line(&text, goal);
    let fixed_rate = line("from each scale's own data plane rounds");
    assert!(
        fixed_rate.contains("330 µs at 100, 355 µs at 30,000 (+8%)"),
        "{text}"
    );
    assert!(fixed_rate.contains("for reference"), "{text}");
    let same_rounds = line("both in the same rounds");
    assert!(same_rounds.contains("not measured"), "{text}");
    let full_load = line("closed loop at full load");
    assert!(full_load.contains("+27%"), "{text}");
    assert!(full_load.contains("for reference"), "{text}");
}

#[test]
fn latency_flatness_is_not_judged_without_both_100_and_30000_services() {
    let mut summary = Summary::default();
    for scale in [100, 10_000] {
        summary.record(
            "dataplane",
            "switchyard",
            scale,
            "fixed-rate-connect-latency-p99",
            300.0,
            "us",
        );
    }
    let text = table(&summary, &[100, 10_000], 2_000.0, &[100]).render();
    let fixed_rate = text
        .lines()
        .find(|line| line.contains("from each scale's own data plane rounds"))
        .unwrap_or_default();
    assert!(fixed_rate.contains("not measured"), "{text}");
}

/// A summary with the flatness rounds' figures: both counts' median p99,
/// the rounds' changes, and failed connects at 30,000.
fn flatness_rounds(p99s: (f64, f64), changes: &[f64], failed: f64) -> Summary {
    let mut summary = Summary::default();
    // The scales' own rounds, half an hour apart, disagree with the verdict.
    for (scale, p99) in [(100, 330.0), (30_000, 390.0)] {
        summary.record(
            "dataplane",
            "switchyard",
            scale,
            "fixed-rate-connect-latency-p99",
            p99,
            "us",
        );
    }
    for (scale, p99) in [(100, p99s.0), (30_000, p99s.1)] {
        summary.record(
            flatness::NAME,
            "switchyard",
            scale,
            flatness::P99,
            p99,
            "us",
        );
    }
    summary.record(
        flatness::NAME,
        "switchyard",
        30_000,
        "failed-connections",
        failed,
        "connections",
    );
    summary.record_runs(
        flatness::NAME,
        "switchyard",
        30_000,
        flatness::CHANGE_SAME_ROUND,
        changes,
        "percent",
    );
    summary
}

fn flatness_line(summary: &Summary) -> String {
    let text = table(summary, &[100, 30_000], 2_000.0, &[100]).render();
    goal_line(&text, "both in the same rounds")
}

#[test]
fn latency_flatness_is_judged_on_the_median_change_within_the_rounds() {
    let summary = flatness_rounds((340.0, 350.0), &[2.0, -4.0, 6.0], 0.0);
    let line = flatness_line(&summary);
    assert!(
        line.contains(
            "p99 change within a round: median +2%, -4% to +6% (340 µs at 100, 350 µs at 30,000, medians of the rounds)"
        ),
        "{line}"
    );
    assert!(line.contains("| met"), "{line}");
    let text = table(&summary, &[100, 30_000], 2_000.0, &[100]).render();
    let scales = goal_line(&text, "from each scale's own data plane rounds");
    assert!(scales.contains("+18%"), "{text}");
    assert!(scales.contains("for reference"), "{text}");
}

#[test]
fn a_median_change_beyond_ten_percent_misses_even_when_the_medians_are_close() {
    let summary = flatness_rounds((340.0, 350.0), &[12.0, 15.0, -20.0], 0.0);
    let line = flatness_line(&summary);
    assert!(line.contains("median +12%"), "{line}");
    assert!(line.contains("MISSED"), "{line}");
}

#[test]
fn a_failed_connect_in_the_flatness_rounds_misses_the_goal() {
    let summary = flatness_rounds((340.0, 350.0), &[2.0, 3.0, 1.0], 2.0);
    let line = flatness_line(&summary);
    assert!(line.contains("2 connects failed"), "{line}");
    assert!(line.contains("MISSED"), "{line}");
}

#[test]
fn flatness_rounds_that_failed_are_not_judged() {
    let mut summary = flatness_rounds((340.0, 350.0), &[2.0], 0.0);
    summary.record(
        flatness::NAME,
        "switchyard",
        30_000,
        "failed-to-measure",
        1.0,
        "configurations",
    );
    let line = flatness_line(&summary);
    assert!(
        line.contains("failed: see the latency flatness table"),
        "{line}"
    );
    assert!(line.contains("not measured"), "{line}");
}

/// A summary with the restart runs' figures for switchyard at 10,000 Services.
fn restart_runs(ratios: &[f64], failed: f64) -> Summary {
    let mut summary = Summary::default();
    let scale = 10_000;
    summary.record(
        restart::NAME,
        "switchyard",
        scale,
        "runs",
        ratios.len() as f64,
        "runs",
    );
    summary.record(
        restart::NAME,
        "switchyard",
        scale,
        "failed",
        failed,
        "connections",
    );
    summary.record_runs(
        restart::NAME,
        "switchyard",
        scale,
        "p99-steady",
        &[0.3],
        "ms",
    );
    summary.record_runs(
        restart::NAME,
        "switchyard",
        scale,
        "p99-during-restart",
        &[0.5],
        "ms",
    );
    summary.record_runs(
        restart::NAME,
        "switchyard",
        scale,
        restart::RATIO,
        ratios,
        "ratio",
    );
    summary
}

fn restart_line(summary: &Summary) -> String {
    let text = table(summary, &[10_000], 2_000.0, &[100]).render();
    goal_line(&text, "agent restart at 2,000 conn/s")
}

#[test]
fn the_restart_goal_is_judged_on_the_median_ratio_of_the_runs() {
    let line = restart_line(&restart_runs(&[1.5, 2.4, 1.7], 0.0));
    assert!(
        line.contains("0 failed in 3 runs; p99 during over steady: median 1.70x (1.50-2.40x)"),
        "{line}"
    );
    assert!(line.contains("0.50 ms during vs 0.30 ms steady"), "{line}");
    assert!(line.contains("| met"), "{line}");
    let line = restart_line(&restart_runs(&[2.1, 2.4, 1.7], 0.0));
    assert!(line.contains("median 2.10x"), "{line}");
    assert!(line.contains("MISSED"), "{line}");
}

#[test]
fn one_failed_connect_in_any_restart_run_misses_the_goal() {
    let line = restart_line(&restart_runs(&[1.1, 1.2, 1.3], 1.0));
    assert!(line.contains("1 failed in 3 runs"), "{line}");
    assert!(line.contains("MISSED"), "{line}");
}

#[test]
fn restart_runs_that_could_not_be_measured_are_not_judged() {
    let mut summary = restart_runs(&[1.1, 1.2], 0.0);
    summary.record(
        restart::NAME,
        "switchyard",
        10_000,
        "failed-to-measure",
        1.0,
        "runs",
    );
    let line = restart_line(&summary);
    assert!(line.contains("1 run(s) could not be measured"), "{line}");
    assert!(line.contains("not measured"), "{line}");
}

#[test]
fn the_cold_start_goals_take_the_worst_run() {
    let mut summary = Summary::default();
    let name = cold_start::NAME;
    summary.record(name, "switchyard", 10_000, "runs", 3.0, "runs");
    let after_gate = [0.3, 2.5, 0.4];
    summary.record_runs(
        name,
        "switchyard",
        10_000,
        "programmed-after-gate",
        &after_gate,
        "s",
    );
    summary.record_runs(
        name,
        "switchyard",
        10_000,
        "peak-rss",
        &[80.0, 82.0, 81.0],
        "MiB",
    );
    let text = table(&summary, &[10_000], 2_000.0, &[100]).render();
    let programmed = goal_line(&text, "cold start: all programmed within 2 s");
    assert!(
        programmed.contains("worst of 3 runs 2.50 s (median 0.40 s)"),
        "{text}"
    );
    assert!(programmed.contains("MISSED"), "{text}");
    let memory = goal_line(&text, "agent RSS < 100 MB");
    assert!(
        memory.contains("worst of 3 runs 82.0 MiB peak (median 81.0 MiB peak)"),
        "{text}"
    );
    assert!(memory.contains("| met"), "{text}");
}

#[test]
fn a_cold_start_run_that_could_not_be_measured_leaves_the_goal_unjudged() {
    let mut summary = Summary::default();
    let name = cold_start::NAME;
    summary.record(name, "switchyard", 10_000, "runs", 2.0, "runs");
    summary.record(name, "switchyard", 10_000, "failed-to-measure", 1.0, "runs");
    summary.record_runs(
        name,
        "switchyard",
        10_000,
        "programmed-after-gate",
        &[0.3, 0.4],
        "s",
    );
    let text = table(&summary, &[10_000], 2_000.0, &[100]).render();
    let programmed = goal_line(&text, "cold start: all programmed within 2 s");
    assert!(
        programmed.contains("1 run(s) could not be measured; see the cold start table"),
        "{text}"
    );
    assert!(programmed.contains("not measured"), "{text}");
}

#[test]
fn the_operator_goals_take_the_worst_run_at_any_node_count() {
    let mut summary = Summary::default();
    let name = operator_scale::NAME;
    let system = "switchyard-operator";
    for (nodes, p99s, per_node) in [
        (100, [100.0, 150.0, 210.0], [2.4, 2.5, 2.6]),
        (5_000, [120.0, 130.0, 140.0], [2.1, 2.2, 2.3]),
    ] {
        summary.record(name, system, nodes, "runs", 3.0, "runs");
        summary.record_runs(name, system, nodes, "reconcile-p99", &p99s, "ms");
        summary.record_runs(name, system, nodes, "peak-rss", &[40.0, 45.0, 50.0], "MiB");
        summary.record_runs(
            name,
            system,
            nodes,
            "api-requests-per-node",
            &per_node,
            "requests",
        );
    }
    summary.record_runs(
        name,
        system,
        5_000,
        "operator-time",
        &[60.0, 80.0, 70.0],
        "s",
    );
    let text = table(&summary, &[10_000], 2_000.0, &[100, 5_000]).render();
    let time = goal_line(&text, "5,000 nodes: operator time");
    assert!(
        time.contains("worst of 3 runs 80.0 s (median 70.0 s)"),
        "{text}"
    );
    assert!(time.contains("| met"), "{text}");
    let reconcile = goal_line(&text, "reconcile p99 < 200 ms");
    assert!(reconcile.contains("worst run 210 ms"), "{text}");
    assert!(reconcile.contains("MISSED"), "{text}");
    let memory = goal_line(&text, "operator RSS < 200 MB");
    assert!(memory.contains("worst run 50 MiB peak"), "{text}");
    let requests = goal_line(&text, "API requests per node bounded");
    assert!(
        requests.contains("2.50 per node at 100 nodes, 2.20 at 5000 (medians of the runs)"),
        "{text}"
    );
    assert!(requests.contains("| met"), "{text}");
}

#[test]
fn the_programming_latency_goals_take_the_worst_run_and_the_medians_against_kube_proxy() {
    let mut summary = Summary::default();
    let name = programming::NAME;
    summary.record(name, "switchyard", 10_000, "runs", 3.0, "runs");
    summary.record_runs(name, "switchyard", 10_000, "p99", &[9.0, 10.0, 120.0], "ms");
    let legacy = "kube-proxy-iptables-legacy";
    summary.record(name, legacy, 10_000, "runs", 3.0, "runs");
    summary.record_runs(
        name,
        legacy,
        10_000,
        "p99",
        &[20_000.0, 22_000.0, 30_000.0],
        "ms",
    );
    let text = table(&summary, &[10_000], 2_000.0, &[100]).render();
    let bound = goal_line(&text, "programming latency p99 < 100 ms");
    assert!(
        bound.contains("worst of 3 runs 120.0 ms (median 10.0 ms)"),
        "{text}"
    );
    assert!(bound.contains("MISSED"), "{text}");
    let faster = goal_line(&text, "programming latency >= 10x faster");
    assert!(faster.contains("10.0 ms vs 22000.0 ms"), "{text}");
    assert!(faster.contains("2200.0x"), "{text}");
    assert!(faster.contains("| met"), "{text}");
}
