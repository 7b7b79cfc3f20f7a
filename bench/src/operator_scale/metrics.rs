//! What the operator scale run reads back: the operator's reconcile histogram,
//! the API server's audit log and the simulated agents' answer times.

use std::collections::BTreeMap;
use std::path::Path;

use super::METRICS_ADDRESS;

/// A snapshot of a Prometheus histogram (bucket upper bounds -> cumulative counts).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Histogram {
    pub buckets: Vec<(f64, f64)>,
    pub count: f64,
}

impl Histogram {
    pub fn parse(metrics: &str, name: &str) -> Option<Self> {
        let bucket_prefix = format!("{name}_bucket{{le=\"");
        let mut buckets = Vec::new();
        let mut count = None;
        for line in metrics.lines() {
            if let Some(rest) = line.strip_prefix(&bucket_prefix) {
                let (bound, value) = rest.split_once("\"}")?;
                let bound = if bound == "+Inf" {
                    f64::INFINITY
                } else {
                    bound.parse().ok()?
                };
                buckets.push((bound, value.trim().parse().ok()?));
            } else if let Some(value) = line.strip_prefix(&format!("{name}_count ")) {
                count = value.trim().parse().ok();
            }
        }
        Some(Self {
            buckets,
            count: count?,
        })
    }

    pub fn subtract(&self, earlier: &Histogram) -> Histogram {
        let buckets = self
            .buckets
            .iter()
            .map(|(bound, value)| {
                let before = earlier
                    .buckets
                    .iter()
                    .find(|(b, _)| b == bound)
                    .map(|(_, v)| *v)
                    .unwrap_or(0.0);
                (*bound, value - before)
            })
            .collect();
        Histogram {
            buckets,
            count: self.count - earlier.count,
        }
    }

    /// As Prometheus' `histogram_quantile`: linear within the bucket holding the rank.
    pub fn quantile(&self, quantile: f64) -> f64 {
        if self.count <= 0.0 {
            return f64::NAN;
        }
        let rank = quantile * self.count;
        let mut lower_bound = 0.0;
        let mut lower_count = 0.0;
        for (bound, cumulative) in &self.buckets {
            if *cumulative >= rank {
                if bound.is_infinite() {
                    return lower_bound;
                }
                let in_bucket = cumulative - lower_count;
                if in_bucket <= 0.0 {
                    return *bound;
                }
                return lower_bound + (bound - lower_bound) * (rank - lower_count) / in_bucket;
            }
            lower_bound = *bound;
            lower_count = *cumulative;
        }
        lower_bound
    }
}

pub(super) fn reconcile_histogram() -> Option<Histogram> {
    let output = std::process::Command::new("curl")
        .args([
            "-sf",
            "--max-time",
            "5",
            &format!("http://{METRICS_ADDRESS}/metrics"),
        ])
        .output()
        .ok()?;
    Histogram::parse(
        &String::from_utf8_lossy(&output.stdout),
        "switchyard_operator_reconcile_duration_seconds",
    )
}

/// Requests by one user in an audit log window: in all, per verb, and per verb and
/// resource (`patch dataplanenodes`, `patch dataplaneconfigs/status`, ...).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AuditCount {
    pub total: u64,
    pub by_verb: BTreeMap<String, u64>,
    pub by_verb_and_resource: BTreeMap<String, u64>,
}

/// Requests by `user` in a JSON audit log between two instants (µs since the
/// epoch, by `requestReceivedTimestamp`).
pub fn count_audit_requests(log: &Path, user: &str, from_us: u64, to_us: u64) -> AuditCount {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut count = AuditCount::default();
    for line in text.lines() {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if event["user"]["username"] != user {
            continue;
        }
        let received = event["requestReceivedTimestamp"]
            .as_str()
            .and_then(|time| chrono::DateTime::parse_from_rfc3339(time).ok())
            .map(|time| time.timestamp_micros() as u64)
            .unwrap_or(0);
        if received < from_us || received > to_us {
            continue;
        }
        count.total += 1;
        let verb = event["verb"].as_str().unwrap_or("?").to_string();
        let resource = match (
            event["objectRef"]["resource"].as_str(),
            event["objectRef"]["subresource"].as_str(),
        ) {
            (Some(resource), Some(subresource)) => format!("{resource}/{subresource}"),
            (Some(resource), None) => resource.to_owned(),
            (None, _) => "(no resource)".to_owned(),
        };
        *count
            .by_verb_and_resource
            .entry(format!("{verb} {resource}"))
            .or_insert(0) += 1;
        *count.by_verb.entry(verb).or_insert(0) += 1;
    }
    count
}

/// The time within `[from, to]` during which at least one agent was sitting on
/// its delay (the union of `[seen, answered]` intervals), in seconds.
pub fn waiting_on_agents(answers: &Path, from_us: u64, to_us: u64) -> f64 {
    let text = std::fs::read_to_string(answers).unwrap_or_default();
    let mut intervals: Vec<(u64, u64)> = text
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|answer| Some((answer["seen_us"].as_u64()?, answer["answered_us"].as_u64()?)))
        .map(|(seen, answered)| (seen.max(from_us), answered.min(to_us)))
        .filter(|(seen, answered)| answered > seen)
        .collect();
    union_seconds(&mut intervals)
}

pub fn union_seconds(intervals: &mut [(u64, u64)]) -> f64 {
    intervals.sort_unstable();
    let mut total = 0;
    let mut current: Option<(u64, u64)> = None;
    for (start, end) in intervals.iter().copied() {
        current = match current {
            Some((current_start, current_end)) if start <= current_end => {
                Some((current_start, current_end.max(end)))
            }
            Some((current_start, current_end)) => {
                total += current_end - current_start;
                Some((start, end))
            }
            None => Some((start, end)),
        };
    }
    if let Some((start, end)) = current {
        total += end - start;
    }
    total as f64 / 1e6
}
