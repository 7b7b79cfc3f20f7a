//! The goals, checked against what was measured: met, missed, or not
//! measured at this size. Pure.

pub mod cost;

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
    // The highest `metric` over every node count measured.
    let worst_over_node_counts = |metric| {
        node_counts
            .iter()
            .filter_map(|nodes| summary.find(operator, system, *nodes as u64, metric))
            .reduce(f64::max)
    };
    let (measured, met) = match worst_over_node_counts("reconcile-p99-max") {
        Some(worst) => (format!("worst run {worst:.0} ms"), Some(worst < 200.0)),
        None => ("-".into(), None),
    };
    row("reconcile p99 < 200 ms", measured, verdict(met));
    let (measured, met) = match worst_over_node_counts("peak-rss-max") {
        Some(worst) => (
            format!("worst run {worst:.0} MiB peak"),
            Some(worst < 200.0),
        ),
        None => ("-".into(), None),
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
mod tests;
