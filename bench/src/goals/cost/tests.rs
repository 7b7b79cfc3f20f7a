use super::*;

fn goal_line(text: &str, goal: &str) -> String {
    text.lines()
        .find(|line| line.contains(goal))
        .unwrap_or_default()
        .to_string()
}

fn parity(summary: &mut Summary, system: &str, metric: &str, rounds: &[f64]) {
    summary.record_runs(
        parity_cost::NAME,
        system,
        JUDGED_AT,
        metric,
        rounds,
        "percent",
    );
}

#[test]
fn source_ranges_are_judged_on_the_median_of_the_same_round_pairs() {
    let mut summary = Summary::default();
    // TC only: 98% median (met); as installed 90% (missed).
    parity(
        &mut summary,
        "switchyard-tc-only",
        parity_cost::RANGES_OVER_WITHOUT,
        &[96.0, 98.0, 99.0],
    );
    parity(
        &mut summary,
        "switchyard",
        parity_cost::RANGES_OVER_WITHOUT,
        &[88.0, 90.0, 99.0],
    );
    let text = table(&summary).render();
    let tc_only = goal_line(&text, "the check alone");
    assert!(tc_only.contains("median 98.0% (96.0-99.0%)"), "{text}");
    assert!(
        tc_only.ends_with("| met |") || tc_only.contains("| met "),
        "{text}"
    );
    // Pairs within 3 points of each other settle it; 11 points apart they do not.
    assert!(!tc_only.contains("not conclusive"), "{text}");
    let installed = goal_line(&text, "as installed: the connect hook");
    assert!(installed.contains("MISSED"), "{text}");
    assert!(
        installed.contains("pairs spread over 11 points, wider than the 3% judged: not conclusive"),
        "{text}"
    );
}

#[test]
fn fragments_costing_more_than_three_percent_per_packet_are_a_miss_and_three_is_met() {
    for (median, verdict) in [(103.0, "met"), (103.5, "MISSED")] {
        let mut summary = Summary::default();
        parity(
            &mut summary,
            "switchyard-tc-only",
            parity_cost::FRAGMENTED_OVER_WHOLE,
            &[median - 1.0, median, median + 9.0],
        );
        let text = table(&summary).render();
        let line = goal_line(&text, "fragment tracking");
        assert!(line.contains(&format!("| {verdict} ")), "{median}: {text}");
    }
}

#[test]
fn a_parity_cost_that_could_not_be_measured_is_not_judged() {
    let mut summary = Summary::default();
    summary.record(
        parity_cost::NAME,
        "switchyard-tc-only",
        JUDGED_AT,
        "failed-to-measure",
        1.0,
        "configurations",
    );
    let text = table(&summary).render();
    assert!(
        goal_line(&text, "the check alone").contains("failed: see the parity cost table"),
        "{text}"
    );
    assert!(
        goal_line(&text, "fragment tracking").contains("not measured"),
        "{text}"
    );
}

#[test]
fn program_cpu_is_met_at_half_the_baseline_and_missed_above_it() {
    let (system, baseline) = BASELINES[0];
    assert!(baseline > 0.0, "a baseline is recorded");
    for (median, verdict) in [(baseline / 2.0, "met"), (baseline / 2.0 + 1.0, "MISSED")] {
        let mut summary = Summary::default();
        summary.record_runs(
            program_stats::NAME,
            system,
            JUDGED_AT,
            "ns-per-connection",
            &[median - 5.0, median, median + 5.0],
            "ns",
        );
        let text = table(&summary).render();
        let line = goal_line(&text, "halved, as installed");
        assert!(line.contains(&format!("| {verdict} ")), "{median}: {text}");
    }
}

#[test]
fn nothing_measured_at_ten_thousand_services_is_not_judged() {
    let mut summary = Summary::default();
    summary.record_runs(
        program_stats::NAME,
        "switchyard",
        100,
        "ns-per-connection",
        &[1.0],
        "ns",
    );
    summary.record_runs(
        parity_cost::NAME,
        "switchyard-tc-only",
        100,
        parity_cost::RANGES_OVER_WITHOUT,
        &[50.0],
        "percent",
    );
    let text = table(&summary).render();
    assert_eq!(
        text.matches("not measured at this size").count(),
        5,
        "{text}"
    );
}
