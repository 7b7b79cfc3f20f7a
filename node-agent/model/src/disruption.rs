//! The node's disruption signals as counts over windows of time, from samples of the
//! datapath's monotonic counters (issue 28). Pure: samples in, windows and "publish now" out;
//! the agent reads the counters and writes the report (`node-agent/src/disruption`).
//!
//! # Windows
//! - **Current**: the last [`Settings::window_ms`] (60 s) of samples, never reaching back before the
//!   moment the node last switched dataplane. A minute because the figures are read as counts
//!   per minute (the disruption budget's unit, and the shortest window the operator judges):
//!   the count of a full window *is* the per-minute figure, with no scaling that would turn one
//!   event into a fraction. Shorter would make the figure jumpy; longer would dilute a burst and
//!   keep showing it long after it ended.
//! - **Baseline**: while the node is on kube-proxy, the last [`Settings::baseline_window_ms`]
//!   (10 min) of samples on kube-proxy, sliding; frozen at the switch to eBPF (the last sample
//!   taken before it) and kept while the node serves from eBPF, so the operator compares the
//!   node with itself under kube-proxy. Longer than the current window because it is the
//!   yardstick: ten minutes of a quiet node's rare events say more than one. Back on kube-proxy
//!   (a rollback), the kept baseline stays until the node has spent
//!   [`Settings::baseline_minimum_ms`] there again, then a fresh one slides. A baseline handed in
//!   at start (read back from the status an earlier process wrote) is kept the same way, so an
//!   agent restart does not lose it.
//!
//! # Counters
//! Each sample holds, per signal, the counter's value and the identity of the map it was read
//! from (the kernel's map id), or nothing when the signal is not measured at that moment (the
//! datapath's counters while the programs are detached: they count nothing then, and a zero
//! would claim kube-proxy refused nothing; the connection signals of the `sock_ops` program,
//! which counts whatever the dataplane, are measured on kube-proxy too). Between two samples a counter increased by
//! `after − before`; if it went down, or the map is another one (re-created, the agent's pins
//! removed), it started again from zero in between and increased by `after` (at least: events
//! before the reset are lost, never counted negative). An agent restart starts with no sample
//! at all: the first one is only a starting point. The interval between the last sample before
//! a switch and the first after it belongs to neither window (it straddles the switch); the
//! caller samples right at the switch so that interval is short. A wall clock that jumps back
//! starts the windows again rather than count over a negative span.
//!
//! # Publishing
//! The report is written to the DataplaneNode, so it is not republished with every sample:
//! [`DisruptionTracker::publish`] says when. A change of the figures (any count, a window
//! appearing, a switch) is published at most every [`Settings::min_interval_watched_ms`] (10 s)
//! during the [`Settings::watched_after_switch_ms`] (15 min) after a switch (or the agent's start,
//! which may fall in a soak), when the operator soaks the node and waits for a window covering
//! its soak, and at most every
//! [`Settings::min_interval_at_rest_ms`] (60 s) otherwise. Unchanged figures are still refreshed
//! (the window's end moves on) every [`Settings::refresh_watched_ms`] (30 s) while watched, so a
//! soak is seen covered within 30 s of its end, and every [`Settings::refresh_at_rest_ms`] (5 min)
//! at rest: a node writes its status at most once a minute at rest, whatever its noise.

use std::collections::VecDeque;

/// How many signals a sample holds.
pub const SIGNAL_COUNT: usize = 9;

/// One measured signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Signal {
    /// Packets (and the node's connects) the programs failed to translate.
    TranslationErrors,
    /// New flows refused for lack of a backend while the Service has endpoints elsewhere.
    RefusedWithEndpointsElsewhere,
    /// Conntrack entries the full hash had no room for (written to the overflow LRU).
    ConntrackOverflows,
    /// IP fragments whose first fragment was never seen.
    FragmentsWithoutFirst,
    /// New flows refused because the Service has no endpoint anywhere (by design).
    RefusedWithoutReadyEndpoints,
    /// Packets dropped by `loadBalancerSourceRanges` (by design).
    SourceRangeDrops,
    /// TCP connects to Service addresses that closed before they were established.
    FailedConnects,
    /// SYNs of connects to Service addresses sent again.
    SynRetransmits,
    /// Established connections to Service addresses reset.
    ResetsByPeer,
}

impl Signal {
    pub const ALL: [Signal; SIGNAL_COUNT] = [
        Signal::TranslationErrors,
        Signal::RefusedWithEndpointsElsewhere,
        Signal::ConntrackOverflows,
        Signal::FragmentsWithoutFirst,
        Signal::RefusedWithoutReadyEndpoints,
        Signal::SourceRangeDrops,
        Signal::FailedConnects,
        Signal::SynRetransmits,
        Signal::ResetsByPeer,
    ];

    /// Its place in a sample's readings and a window's counts.
    pub fn index(self) -> usize {
        self as usize
    }

    /// Its name in metrics (the `signal` label).
    pub fn name(self) -> &'static str {
        match self {
            Signal::TranslationErrors => "translation_errors",
            Signal::RefusedWithEndpointsElsewhere => "refused_with_endpoints_ready_elsewhere",
            Signal::ConntrackOverflows => "conntrack_overflows",
            Signal::FragmentsWithoutFirst => "fragments_without_first",
            Signal::RefusedWithoutReadyEndpoints => "refused_without_ready_endpoints",
            Signal::SourceRangeDrops => "source_range_drops",
            Signal::FailedConnects => "failed_connects",
            Signal::SynRetransmits => "syn_retransmits",
            Signal::ResetsByPeer => "resets_by_peer",
        }
    }

    /// Counted by the kernel's view of the node's connections (the `sock_ops` program),
    /// which runs whatever the dataplane: measured under kube-proxy too, unlike the
    /// datapath's own counters.
    pub fn measured_on_kube_proxy(self) -> bool {
        matches!(
            self,
            Signal::FailedConnects | Signal::SynRetransmits | Signal::ResetsByPeer
        )
    }

    /// Dropped or refused by design: shown apart from what points at a problem.
    pub fn expected(self) -> bool {
        matches!(
            self,
            Signal::RefusedWithoutReadyEndpoints | Signal::SourceRangeDrops
        )
    }
}

/// One counter as read: its value, and the identity of the map it was read from (a map created
/// again counts from zero again).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    pub source: u32,
    pub value: u64,
}

/// What serves the node's Services when a sample is taken (the agent's `ProgramsAttached`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dataplane {
    KubeProxy,
    Ebpf,
}

/// The counters at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Wall clock, milliseconds since the Unix epoch (the clock of the status' conditions).
    pub at_ms: i64,
    pub dataplane: Dataplane,
    /// By [`Signal::index`]; `None`: not measured at this moment.
    pub readings: [Option<Reading>; SIGNAL_COUNT],
}

/// How much a counter increased between two readings (see "Counters" above); `None` unless
/// both were measured.
pub fn increase(before: Option<Reading>, after: Option<Reading>) -> Option<u64> {
    let (before, after) = (before?, after?);
    if after.source == before.source && after.value >= before.value {
        Some(after.value - before.value)
    } else {
        Some(after.value)
    }
}

/// Counts of each signal over one window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowCounts {
    pub start_ms: i64,
    pub end_ms: i64,
    /// By [`Signal::index`]; `None`: not measured anywhere in the window.
    pub counts: [Option<u64>; SIGNAL_COUNT],
}

impl WindowCounts {
    pub fn count(&self, signal: Signal) -> Option<u64> {
        self.counts[signal.index()]
    }

    fn length_ms(&self) -> i64 {
        self.end_ms - self.start_ms
    }
}

/// The windows to report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DisruptionReport {
    pub baseline: Option<WindowCounts>,
    pub current: Option<WindowCounts>,
}

/// The windows' lengths and the publishing bounds (see the module's documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    pub window_ms: i64,
    pub baseline_window_ms: i64,
    pub baseline_minimum_ms: i64,
    pub watched_after_switch_ms: i64,
    pub min_interval_watched_ms: i64,
    pub min_interval_at_rest_ms: i64,
    pub refresh_watched_ms: i64,
    pub refresh_at_rest_ms: i64,
}

const SECOND: i64 = 1_000;
const MINUTE: i64 = 60 * SECOND;

impl Default for Settings {
    fn default() -> Self {
        Self {
            window_ms: MINUTE,
            baseline_window_ms: 10 * MINUTE,
            baseline_minimum_ms: MINUTE,
            watched_after_switch_ms: 15 * MINUTE,
            min_interval_watched_ms: 10 * SECOND,
            min_interval_at_rest_ms: MINUTE,
            refresh_watched_ms: 30 * SECOND,
            refresh_at_rest_ms: 5 * MINUTE,
        }
    }
}

/// The counters' increase between two consecutive samples of one dataplane.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Interval {
    start_ms: i64,
    end_ms: i64,
    increments: [Option<u64>; SIGNAL_COUNT],
}

/// What decides whether a report is news: the counts, which windows exist, and the switches.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Figures {
    baseline: Option<[Option<u64>; SIGNAL_COUNT]>,
    current: Option<[Option<u64>; SIGNAL_COUNT]>,
    switches: u64,
}

/// The samples of the current dataplane and the windows they make.
#[derive(Clone, Debug)]
pub struct DisruptionTracker {
    settings: Settings,
    last_sample: Option<Sample>,
    /// When the current dataplane's samples start (its first sample, or a clock jump).
    phase_since_ms: i64,
    switches: u64,
    /// Oldest first, at most `baseline_window_ms` (the longer window) back from the last sample.
    intervals: VecDeque<Interval>,
    /// The baseline frozen at the last switch to eBPF, or handed in at start.
    kept_baseline: Option<WindowCounts>,
    published: Option<(i64, DisruptionReport, Figures)>,
}

impl DisruptionTracker {
    /// A tracker with no sample yet; `restored_baseline`: the baseline an earlier process
    /// reported, kept until a fresh one replaces it.
    pub fn new(settings: Settings, restored_baseline: Option<WindowCounts>) -> Self {
        Self {
            settings,
            last_sample: None,
            phase_since_ms: 0,
            switches: 0,
            intervals: VecDeque::new(),
            kept_baseline: restored_baseline.filter(|window| window.length_ms() > 0),
            published: None,
        }
    }

    /// Keeps `baseline` (what an earlier process reported, read back once the agent has its
    /// DataplaneNode) unless this tracker already keeps one of its own. Ignored once the node
    /// switched in this process: the baseline frozen then is newer.
    pub fn restore_baseline(&mut self, baseline: WindowCounts) {
        if self.kept_baseline.is_none() && self.switches == 0 && baseline.length_ms() > 0 {
            self.kept_baseline = Some(baseline);
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The dataplane of the last sample.
    pub fn dataplane(&self) -> Option<Dataplane> {
        self.last_sample.as_ref().map(|sample| sample.dataplane)
    }

    /// Takes one sample in.
    pub fn record(&mut self, sample: Sample) {
        let Some(last) = self.last_sample.clone() else {
            self.phase_since_ms = sample.at_ms;
            self.last_sample = Some(sample);
            return;
        };
        if sample.dataplane != last.dataplane {
            if last.dataplane == Dataplane::KubeProxy {
                self.kept_baseline = self.baseline();
            }
            self.intervals.clear();
            self.phase_since_ms = sample.at_ms;
            self.switches += 1;
        } else if sample.at_ms < last.at_ms {
            // The wall clock went back: the windows start again from here.
            self.intervals.clear();
            self.phase_since_ms = sample.at_ms;
        } else {
            let mut increments = [None; SIGNAL_COUNT];
            for (index, increment) in increments.iter_mut().enumerate() {
                *increment = increase(last.readings[index], sample.readings[index]);
            }
            self.intervals.push_back(Interval {
                start_ms: last.at_ms,
                end_ms: sample.at_ms,
                increments,
            });
            let oldest = sample.at_ms - self.settings.baseline_window_ms;
            while self
                .intervals
                .front()
                .is_some_and(|interval| interval.start_ms < oldest)
            {
                self.intervals.pop_front();
            }
        }
        self.last_sample = Some(sample);
    }

    /// The counts over the intervals of the current dataplane that start at most `length_ms`
    /// before the last sample.
    fn window(&self, length_ms: i64) -> Option<WindowCounts> {
        let end_ms = self.last_sample.as_ref()?.at_ms;
        let mut included = self
            .intervals
            .iter()
            .filter(|interval| interval.start_ms >= end_ms - length_ms)
            .peekable();
        let start_ms = included.peek()?.start_ms;
        let mut counts = [None; SIGNAL_COUNT];
        for interval in included {
            for (count, increment) in counts.iter_mut().zip(interval.increments) {
                if let Some(increment) = increment {
                    *count = Some(count.unwrap_or(0_u64).saturating_add(increment));
                }
            }
        }
        Some(WindowCounts {
            start_ms,
            end_ms,
            counts,
        })
    }

    /// The baseline: on kube-proxy, its sliding window once long enough (or when there is no
    /// other); otherwise the one kept.
    pub fn baseline(&self) -> Option<WindowCounts> {
        if self.dataplane() == Some(Dataplane::KubeProxy) {
            if let Some(live) = self.window(self.settings.baseline_window_ms) {
                if live.length_ms() >= self.settings.baseline_minimum_ms
                    || self.kept_baseline.is_none()
                {
                    return Some(live);
                }
            }
        }
        self.kept_baseline.clone()
    }

    /// The windows as of the last sample.
    pub fn report(&self) -> DisruptionReport {
        DisruptionReport {
            baseline: self.baseline(),
            current: self.window(self.settings.window_ms),
        }
    }

    fn figures(&self, report: &DisruptionReport) -> Figures {
        Figures {
            baseline: report.baseline.as_ref().map(|window| window.counts),
            current: report.current.as_ref().map(|window| window.counts),
            switches: self.switches,
        }
    }

    /// The report, if it is due at `now_ms` (see "Publishing"); it then counts as published.
    pub fn publish(&mut self, now_ms: i64) -> Option<DisruptionReport> {
        let report = self.report();
        if report.baseline.is_none() && report.current.is_none() {
            return None;
        }
        let figures = self.figures(&report);
        if let Some((at_ms, last, last_figures)) = &self.published {
            if *last == report {
                return None;
            }
            let since = now_ms.saturating_sub(*at_ms);
            // The start of the process counts as a switch: it may be restarted in a soak.
            let watched =
                now_ms.saturating_sub(self.phase_since_ms) < self.settings.watched_after_switch_ms;
            let (min_interval, refresh) = if watched {
                (
                    self.settings.min_interval_watched_ms,
                    self.settings.refresh_watched_ms,
                )
            } else {
                (
                    self.settings.min_interval_at_rest_ms,
                    self.settings.refresh_at_rest_ms,
                )
            };
            let changed = *last_figures != figures;
            let due = (changed && since >= min_interval) || since >= refresh;
            // A clock that went back publishes at once: the intervals cannot be compared.
            if !due && since >= 0 {
                return None;
            }
        }
        self.published = Some((now_ms, report.clone(), figures));
        Some(report)
    }

    /// The report last published.
    pub fn published(&self) -> Option<&DisruptionReport> {
        self.published.as_ref().map(|(_, report, _)| report)
    }
}

#[cfg(test)]
mod tests;
