//! The goals of issue 24 (what kube-proxy parity costs: source ranges and
//! fragment tracking, no existing figure slower by more than 3%) and issue 29
//! (the programs' CPU per connection halved) against this run. Pure.

use super::verdict;
use crate::parity_cost;
use crate::program_stats;
use crate::report::{number, Spread, Summary, Table};

/// The Service count the goals are judged at.
pub const JUDGED_AT: u64 = 10_000;
/// Issue 29's baseline: all Switchyard programs' nanoseconds per new
/// connection at 10,000 Services, per configuration, before any cut (the
/// median of the rounds of the run this file names); the goal is half.
pub const BASELINES: [(&str, f64); 2] = [("switchyard", 8_199.0), ("switchyard-tc-only", 11_929.0)];
pub const BASELINE_RECORD: &str = "bench/results/2026-11-28-1614-program-cpu-and-parity-cost.md";
/// "No existing row slower by more than 3%": same-round ratios, in percent.
const ALLOWED_COST_PERCENT: f64 = 3.0;

pub fn table(summary: &Summary) -> Table {
    let mut table = Table::new(
        "Goals of issues 24 and 29 against this run",
        &["goal", "measured", "verdict"],
    );
    let mut row = |goal: String, (measured, met): (String, Option<bool>)| {
        table.row(vec![goal, measured, verdict(met)]);
    };
    let at = number(JUDGED_AT as f64, 0);
    row(
        format!(
            "source ranges: new connections/s to a load-balancer address with loadBalancerSourceRanges \
             >= {}% of one without ({at} Services, TC only: the check alone, same-round pairs)",
            100.0 - ALLOWED_COST_PERCENT
        ),
        source_ranges(summary, "switchyard-tc-only"),
    );
    row(
        "(same, as installed: the connect hook leaves a Service with ranges to the TC programs)"
            .into(),
        source_ranges(summary, "switchyard"),
    );
    row(
        format!(
            "fragment tracking: the TC programs' ns per packet with 4,000-byte UDP requests (three \
             fragments each) <= {}% of whole requests' ({at} Services, TC only, same-round pairs)",
            100.0 + ALLOWED_COST_PERCENT
        ),
        fragments(summary),
    );
    for (system, baseline) in BASELINES {
        let label = if system == "switchyard" {
            "as installed".to_string()
        } else {
            system.to_string()
        };
        row(
            format!(
                "program CPU per connection halved, {label}: <= {} ns ({at} Services; {} ns before \
                 any cut, {BASELINE_RECORD})",
                number(baseline / 2.0, 0),
                number(baseline, 0)
            ),
            halved(summary, system, baseline),
        );
    }
    table
}

/// The rounds' pairs, and whether they spread wider than the cost judged (on
/// a busy machine they do: the verdict then rests on the median alone).
fn pairs(spread: &Spread) -> String {
    let wide = spread.max - spread.min > 2.0 * ALLOWED_COST_PERCENT;
    format!(
        "same-round pairs median {:.1}% ({:.1}-{:.1}%){}",
        spread.median,
        spread.min,
        spread.max,
        if wide {
            format!(
                " [pairs spread over {:.0} points, wider than the {ALLOWED_COST_PERCENT:.0}% judged: not conclusive]",
                spread.max - spread.min
            )
        } else {
            String::new()
        }
    )
}

fn parity_failed(summary: &Summary, system: &str) -> Option<(String, Option<bool>)> {
    summary
        .find(parity_cost::NAME, system, JUDGED_AT, "failed-to-measure")
        .map(|_| ("failed: see the parity cost table".into(), None))
}

/// Met when the median of the rounds' rates with ranges over without is at
/// least 97%.
fn source_ranges(summary: &Summary, system: &str) -> (String, Option<bool>) {
    if let Some(failed) = parity_failed(summary, system) {
        return failed;
    }
    let find = |metric: &str| summary.find(parity_cost::NAME, system, JUDGED_AT, metric);
    let Some(ratio) = summary.find_runs(
        parity_cost::NAME,
        system,
        JUDGED_AT,
        parity_cost::RANGES_OVER_WITHOUT,
    ) else {
        return ("-".into(), None);
    };
    let rates = match (
        find("connections-per-second-with-source-ranges"),
        find("connections-per-second-without-source-ranges"),
    ) {
        (Some(with), Some(without)) => format!(
            "; {} vs {} connections/s",
            number(with, 0),
            number(without, 0)
        ),
        _ => String::new(),
    };
    let programs = match (
        find("program-ns-per-connection-with-source-ranges"),
        find("program-ns-per-connection-without-source-ranges"),
    ) {
        (Some(with), Some(without)) => format!(
            "; programs {} vs {} ns per connection",
            number(with, 0),
            number(without, 0)
        ),
        _ => String::new(),
    };
    (
        format!("{}{rates}{programs}", pairs(&ratio)),
        Some(ratio.median >= 100.0 - ALLOWED_COST_PERCENT),
    )
}

/// Met when the median of the rounds' TC ns per packet, fragmented over whole,
/// is at most 103%.
fn fragments(summary: &Summary) -> (String, Option<bool>) {
    let system = "switchyard-tc-only";
    if let Some(failed) = parity_failed(summary, system) {
        return failed;
    }
    let find = |metric: &str| summary.find(parity_cost::NAME, system, JUDGED_AT, metric);
    let Some(ratio) = summary.find_runs(
        parity_cost::NAME,
        system,
        JUDGED_AT,
        parity_cost::FRAGMENTED_OVER_WHOLE,
    ) else {
        return ("-".into(), None);
    };
    let packets = match (
        find("tc-ns-per-packet-whole"),
        find("tc-ns-per-packet-4000-bytes"),
        find("udp-requests-per-second-whole"),
        find("udp-requests-per-second-4000-bytes"),
    ) {
        (Some(whole), Some(fragmented), Some(whole_rate), Some(fragmented_rate)) => format!(
            "; {} vs {} ns per packet; {} vs {} requests/s",
            number(fragmented, 0),
            number(whole, 0),
            number(fragmented_rate, 0),
            number(whole_rate, 0)
        ),
        _ => String::new(),
    };
    (
        format!("{}{packets}", pairs(&ratio)),
        Some(ratio.median <= 100.0 + ALLOWED_COST_PERCENT),
    )
}

/// Met when the median of the rounds' nanoseconds per connection is at most
/// half the baseline.
fn halved(summary: &Summary, system: &str, baseline: f64) -> (String, Option<bool>) {
    let name = program_stats::NAME;
    if summary
        .find(name, system, JUDGED_AT, "failed-to-measure")
        .is_some()
    {
        return ("failed: see the program CPU table".into(), None);
    }
    let Some(spread) = summary.find_runs(name, system, JUDGED_AT, "ns-per-connection") else {
        return ("-".into(), None);
    };
    (
        format!(
            "{} ns per connection ({}-{}), {:.0}% of the baseline",
            number(spread.median, 0),
            number(spread.min, 0),
            number(spread.max, 0),
            100.0 * spread.median / baseline
        ),
        Some(spread.median <= baseline / 2.0),
    )
}

#[cfg(test)]
mod tests;
