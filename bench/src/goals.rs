//! The goals, checked against what was measured: met, missed, or not
//! measured at this size. Pure.

use crate::cold_start;
use crate::flatness;
use crate::operator_scale;
use crate::programming;
use crate::report::{number, Spread, Summary, Table};
use crate::restart;

const KUBE_PROXIES: [&str; 2] = ["kube-proxy-iptables-legacy", "kube-proxy-iptables-nft"];

/// The better of the two kube-proxy backends for `metric` (higher or lower is better).
fn best_kube_proxy(
    summary: &Summary,
    name: &str,
    scale: u64,
    metric: &str,
    higher_is_better: bool,
) -> Option<(f64, &'static str)> {
    KUBE_PROXIES
        .iter()
        .filter_map(|system| {
            summary
                .find(name, system, scale, metric)
                .map(|value| (value, *system))
        })
        .filter(|(value, _)| value.is_finite())
        .reduce(|a, b| {
            if (a.0 >= b.0) == higher_is_better {
                a
            } else {
                b
            }
        })
}

fn verdict(met: Option<bool>) -> String {
    match met {
        Some(true) => "met".into(),
        Some(false) => "MISSED".into(),
        None => "not measured at this size".into(),
    }
}

/// `latency_rate`: the connections per second of the fixed-rate latency runs.
pub fn table(
    summary: &Summary,
    dataplane_scales: &[u32],
    latency_rate: f64,
    node_counts: &[u32],
) -> Table {
    let mut table = Table::new(
        "Goals of issue 7 against this run",
        &["goal", "measured", "verdict"],
    );
    let mut row = |goal: &str, measured: String, verdict: String| {
        table.row(vec![goal.to_string(), measured, verdict]);
    };
    let rate = "new-connections-per-second";
    let data = "dataplane";
    for (scale, factor) in [(10_000u64, 1.5), (30_000, 3.0)] {
        let switchyard = summary.find(data, "switchyard", scale, rate);
        let kube_proxy = best_kube_proxy(summary, data, scale, rate, true);
        let (measured, met) = match (switchyard, kube_proxy) {
            (Some(s), Some((k, which))) => (
                format!(
                    "{} vs {} ({which}): {:.2}x",
                    number(s, 0),
                    number(k, 0),
                    s / k
                ),
                Some(s >= factor * k),
            ),
            _ => ("-".into(), None),
        };
        row(
            &format!(
                "{} Services: connection rate >= {factor}x kube-proxy",
                number(scale as f64, 0)
            ),
            measured,
            verdict(met),
        );
    }
    for (system, goal) in [
        (
            "switchyard",
            "10,000 Services: connection rate within 10% of direct pod IP",
        ),
        (
            "switchyard-tc-only",
            "(same, every packet through the TC programs: connect hook off)",
        ),
    ] {
        let (measured, met) = match (
            summary.find(data, system, 10_000, rate),
            summary.find(data, "direct", 10_000, rate),
        ) {
            (Some(s), Some(d)) => {
                // The rounds' pairs (each run over direct's run of the same
                // round) show how far the verdict rests on the spread.
                let paired = "new-connections-per-second-over-direct-same-round";
                let pairs = match summary.find_runs(data, system, 10_000, paired) {
                    Some(Spread { median, min, max }) => {
                        format!(" (pairs within a round: median {median:.0}%, {min:.0}-{max:.0}%)")
                    }
                    None => String::new(),
                };
                (
                    format!(
                        "{} vs {} direct: {:.0}%{pairs}",
                        number(s, 0),
                        number(d, 0),
                        100.0 * s / d
                    ),
                    Some(s >= 0.9 * d),
                )
            }
            _ => ("-".into(), None),
        };
        row(goal, measured, verdict(met));
    }
    let smallest = dataplane_scales.iter().min().copied().unwrap_or(0) as u64;
    let largest = dataplane_scales.iter().max().copied().unwrap_or(0) as u64;
    // The goal is about the data path's latency, so it is judged at a fixed rate
    // well below saturation. At full load (a closed loop of 16 workers) latency is
    // mostly the queue in front of two busy cores: by Little's law a whole
    // operation takes 16 / rate on average, so that row's p99 rises whenever the
    // connection rate drifts down.
    let rate_label = number(latency_rate, 0);
    // Judged on the rounds that measure both counts minutes apart (`flatness`),
    // by the median of each round's change: the scales' own rounds are half an
    // hour apart or more, over which this VM's speed drifts by more than the
    // goal's 10%. Their figures follow for reference, with the closed loop's.
    let (measured, met) = flatness_in_the_same_rounds(summary);
    row(
        &format!(
            "eBPF connect p99 at 30,000 Services within 10% of p99 at 100 (at {rate_label} connections/s, both in the same rounds)"
        ),
        measured,
        verdict(met),
    );
    let reference_rows = [
        (
            "fixed-rate-connect-latency-p99",
            "(same, from each scale's own data plane rounds, half an hour or more apart)",
        ),
        (
            "connect-latency-p99",
            "(same, closed loop at full load: p99 follows the connection rate)",
        ),
    ];
    for (metric, goal) in reference_rows {
        let measured = match (
            summary.find(data, "switchyard", smallest, metric),
            summary.find(data, "switchyard", largest, metric),
        ) {
            (Some(small), Some(large)) if largest == 30_000 && smallest == 100 => format!(
                "{} µs at 100, {} µs at 30,000 ({:+.0}%)",
                number(small, 0),
                number(large, 0),
                100.0 * (large / small - 1.0)
            ),
            _ => "-".into(),
        };
        let verdict = if measured == "-" {
            verdict(None)
        } else {
            "for reference".into()
        };
        row(goal, measured, verdict);
    }

    let latency = programming::NAME;
    let scale = 10_000;
    let switchyard_p99 = summary.find(latency, "switchyard", scale, "p99");
    let (measured, met) = Runs {
        name: latency,
        system: "switchyard",
        scale,
        table: "programming latency",
    }
    .worst(
        summary,
        "p99",
        &|milliseconds| format!("{milliseconds:.1} ms"),
        &|milliseconds| milliseconds < 100.0,
    );
    row(
        "programming latency p99 < 100 ms (10,000 Services)",
        measured,
        verdict(met),
    );
    let (measured, met) = match (
        switchyard_p99,
        best_kube_proxy(summary, latency, scale, "p99", false),
    ) {
        (Some(s), Some((k, which))) if s.is_finite() => (
            format!(
                "{s:.1} ms vs {k:.1} ms ({which}), medians of the runs: {:.1}x",
                k / s
            ),
            Some(k >= 10.0 * s),
        ),
        _ => ("-".into(), None),
    };
    row(
        "programming latency >= 10x faster than kube-proxy",
        measured,
        verdict(met),
    );
    let cold = |metric, show: &dyn Fn(f64) -> String, within: &dyn Fn(f64) -> bool| {
        let runs = Runs {
            name: cold_start::NAME,
            system: "switchyard",
            scale,
            table: "cold start",
        };
        runs.worst(summary, metric, show, within)
    };
    let (measured, met) = cold(
        "programmed-after-gate",
        &|seconds| format!("{seconds:.2} s"),
        &|seconds| seconds <= 2.0,
    );
    row(
        "cold start: all programmed within 2 s of gate open (10,000 Services)",
        measured,
        verdict(met),
    );
    let (measured, met) = cold("peak-rss", &|mib| format!("{mib:.1} MiB peak"), &|mib| {
        mib < 100.0
    });
    row("agent RSS < 100 MB", measured, verdict(met));
    let (measured, met) = restart_in_runs(summary, scale);
    row(
        "agent restart at 2,000 conn/s: zero failed, p99 within 2x of steady (median of the runs)",
        measured,
        verdict(met),
    );

    let operator = operator_scale::NAME;
    let system = "switchyard-operator";
    let (measured, met) = Runs {
        name: operator,
        system,
        scale: 5_000,
        table: "operator",
    }
    .worst(
        summary,
        "operator-time",
        &|seconds| format!("{seconds:.1} s"),
        &|seconds| seconds < 300.0,
    );
    row(
        "5,000 nodes: operator time beyond the agents' delays < 5 min",
        measured,
        verdict(met),
    );
    let largest_nodes = node_counts.iter().max().copied().unwrap_or(0) as u64;
    let smallest_nodes = node_counts.iter().min().copied().unwrap_or(0) as u64;
    let p99s: Vec<f64> = node_counts
        .iter()
        .filter_map(|nodes| summary.find(operator, system, *nodes as u64, "reconcile-p99-max"))
        .collect();
    let (measured, met) = if p99s.is_empty() {
        ("-".into(), None)
    } else {
        let worst = p99s.iter().copied().fold(f64::NAN, f64::max);
        (format!("worst run {worst:.0} ms"), Some(worst < 200.0))
    };
    row("reconcile p99 < 200 ms", measured, verdict(met));
    let peaks: Vec<f64> = node_counts
        .iter()
        .filter_map(|nodes| summary.find(operator, system, *nodes as u64, "peak-rss-max"))
        .collect();
    let (measured, met) = if peaks.is_empty() {
        ("-".into(), None)
    } else {
        let worst = peaks.iter().copied().fold(f64::NAN, f64::max);
        (
            format!("worst run {worst:.0} MiB peak"),
            Some(worst < 200.0),
        )
    };
    row("operator RSS < 200 MB", measured, verdict(met));
    let per_node = |nodes: u64| summary.find(operator, system, nodes, "api-requests-per-node");
    let (measured, met) = match (per_node(smallest_nodes), per_node(largest_nodes)) {
        (Some(small), Some(large)) if largest_nodes > smallest_nodes => (
            format!(
                "{small:.2} per node at {smallest_nodes} nodes, {large:.2} at {largest_nodes} (medians of the runs)"
            ),
            Some(large <= small * 1.1),
        ),
        _ => ("-".into(), None),
    };
    row(
        "API requests per node bounded by a constant",
        measured,
        verdict(met),
    );
    table
}

/// A measurement taken in several runs.
struct Runs<'a> {
    name: &'a str,
    system: &'a str,
    scale: u64,
    /// The table that shows the runs, named when a run failed.
    table: &'a str,
}

impl Runs<'_> {
    /// The worst (highest) run of `metric` against `within`, with the median
    /// beside it; not judged when a run could not be measured.
    fn worst(
        &self,
        summary: &Summary,
        metric: &str,
        show: &dyn Fn(f64) -> String,
        within: &dyn Fn(f64) -> bool,
    ) -> (String, Option<bool>) {
        let find = |metric: &str| summary.find(self.name, self.system, self.scale, metric);
        if let Some(failed) = find("failed-to-measure") {
            return (
                format!(
                    "failed: {} run(s) could not be measured; see the {} table",
                    number(failed, 0),
                    self.table
                ),
                None,
            );
        }
        match (
            find("runs"),
            summary.find_runs(self.name, self.system, self.scale, metric),
        ) {
            (Some(runs), Some(spread)) => (
                format!(
                    "worst of {} runs {} (median {})",
                    number(runs, 0),
                    show(spread.max),
                    show(spread.median)
                ),
                Some(within(spread.max)),
            ),
            _ => ("-".into(), None),
        }
    }
}

/// The restart goal from several restarts of the agent: met when no connect
/// failed in any run and the median of the runs' p99 ratios (during the
/// restart over steady) is at most 2; not judged when a run could not be
/// measured.
fn restart_in_runs(summary: &Summary, scale: u64) -> (String, Option<bool>) {
    let find = |metric: &str| summary.find(restart::NAME, "switchyard", scale, metric);
    if let Some(runs) = find("failed-to-measure") {
        return (
            format!(
                "failed: {} run(s) could not be measured; see the restart disruption table",
                number(runs, 0)
            ),
            None,
        );
    }
    let (Some(runs), Some(failed), Some(steady), Some(during), Some(ratio)) = (
        find("runs"),
        find("failed"),
        find("p99-steady"),
        find("p99-during-restart"),
        summary.find_runs(restart::NAME, "switchyard", scale, restart::RATIO),
    ) else {
        return ("-".into(), None);
    };
    (
        format!(
            "{} failed in {} runs; p99 during over steady: median {:.2}x ({:.2}-{:.2}x); \
             {during:.2} ms during vs {steady:.2} ms steady (medians)",
            number(failed, 0),
            number(runs, 0),
            ratio.median,
            ratio.min,
            ratio.max,
        ),
        Some(failed == 0.0 && ratio.median <= 2.0),
    )
}

/// The flatness goal from the rounds that measure 100 and 30,000 Services
/// minutes apart: met when the median of the rounds' p99 changes is at most
/// +10% and no connect failed (a failed connect has no latency, so the p99
/// leaves it out); not judged when the rounds did not all complete.
fn flatness_in_the_same_rounds(summary: &Summary) -> (String, Option<bool>) {
    let find = |scale: u64, metric: &str| summary.find(flatness::NAME, "switchyard", scale, metric);
    if find(30_000, "failed-to-measure").is_some() {
        return ("failed: see the latency flatness table".into(), None);
    }
    let change = flatness::CHANGE_SAME_ROUND;
    let (Some(small), Some(large), Some(Spread { median, min, max })) = (
        find(100, flatness::P99),
        find(30_000, flatness::P99),
        summary.find_runs(flatness::NAME, "switchyard", 30_000, change),
    ) else {
        return ("-".into(), None);
    };
    let failed = find(100, "failed-connections").unwrap_or(0.0)
        + find(30_000, "failed-connections").unwrap_or(0.0);
    let failures = if failed > 0.0 {
        format!("; {} connects failed", number(failed, 0))
    } else {
        String::new()
    };
    (
        format!(
            "p99 change within a round: median {median:+.0}%, {min:+.0}% to {max:+.0}% \
             ({} µs at 100, {} µs at 30,000, medians of the rounds){failures}",
            number(small, 0),
            number(large, 0),
        ),
        Some(median <= 10.0 && failed == 0.0),
    )
}

#[cfg(test)]
mod tests {
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
    fn the_scales_own_rounds_and_the_closed_loop_are_shown_beside_the_flatness_goal_for_reference()
    {
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
}
