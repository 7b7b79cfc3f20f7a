//! The node's disruption signals (issue 28), measured by the agent: a thin loop over the pure
//! windows of [`switchyard_model::disruption`]. Each round of either mode hands the sampler the
//! dataplane serving the node; every [`SAMPLE_PERIOD`], and at once when the dataplane changed,
//! it reads the datapath's per-CPU counters from their pins, takes the sample in, brings the
//! metrics up to date, and asks the tracker whether the report is due. The report it last
//! published goes into the DataplaneNode's `status.disruption` (cluster mode) or the log
//! (standalone mode), so the status is written only when the figures changed, at a bounded rate
//! (see the model's "Publishing").
//!
//! # What each signal reads
//! - translation errors: `SY_COUNTERS[ERROR]`, the programs' failures (malformed packets, a
//!   rewrite or a helper that failed, a conntrack entry no map could take);
//! - conntrack overflows: `SY_COUNTERS[CONNTRACK_OVERFLOW]`, entries (two per flow) the full
//!   hash could not take, written to the overflow LRU (which may evict a live flow);
//! - refusals for lack of a backend: `SY_REFUSALS`, split by the frontend's
//!   `FRONTEND_FLAG_ENDPOINTS_ELSEWHERE`, which the agent sets from its desired state when it
//!   writes a frontend without backends of a Service with ready (or serving terminating)
//!   endpoints on some node. Attributed as the datapath saw it at the time of the packet: a
//!   refusal counted while the agent's view was behind (endpoints just appeared, the frontend
//!   not yet rewritten) counts as "without endpoints", and a Service whose endpoints all went
//!   in the meantime as "elsewhere" until its frontend is rewritten (the next sync, well under
//!   a second). Counting per frontend instead would cost a hash update on the refusal path and
//!   an unbounded map; the split is exact as soon as the maps are in sync;
//! - fragments without their first: `SY_FRAG_ORPHANS`;
//! - source-range drops: `SY_SRC_DROPS`;
//! - failed connects, SYN retransmissions and resets of TCP connections to Service addresses:
//!   `SY_CONNECTIONS`, counted by the `sock_ops` program (see `switchyard_common::connection`
//!   for what each state change counts), read only while its link is pinned (attached).
//!
//! The datapath's signals are measured only while the programs are attached: detached (the
//! node on kube-proxy) they count nothing, and a zero would claim kube-proxy refused and
//! dropped nothing, so they are reported as not measured in the baseline. The connection
//! signals are measured whatever the dataplane: the `sock_ops` program is attached at load,
//! counts and translates nothing, so the baseline under kube-proxy carries them.

use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone as _, Utc};
use prometheus::{GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use switchyard_common::{connection, counter, map_names, refusal, SCHEMA_VERSION};
use switchyard_crds::{
    ConnectionSignals, DatapathSignals, DisruptionReport, ExpectedDrops, SignalWindow,
};
use switchyard_loader::system;
use switchyard_model::disruption::{
    increase, Dataplane, DisruptionTracker, Reading, Sample, Settings, Signal, WindowCounts,
    SIGNAL_COUNT,
};

use crate::follow::Attachment;

/// How often the counters are read: a few system calls, and short enough next to the
/// one-minute window that a window's edges are within 5 s of where they should be.
pub const SAMPLE_PERIOD: Duration = Duration::from_secs(5);

/// What `ProgramsAttached` says of an attachment: the dataplane the operator's soak measures
/// from (a draining node still translates its flows with the programs).
pub fn dataplane_of(attachment: Attachment) -> Dataplane {
    match attachment {
        Attachment::Detached => Dataplane::KubeProxy,
        Attachment::Attached | Attachment::Draining { .. } | Attachment::Detaching => {
            Dataplane::Ebpf
        }
    }
}

/// Where the counters come from: the pins in a node, a script in tests.
pub trait CounterSource {
    /// Every signal's counter now; `None` for one that cannot be read (its map absent, as
    /// under programs older than it).
    fn read(&mut self) -> [Option<Reading>; SIGNAL_COUNT];
}

/// The per-CPU counters of the pinned maps of the current schema version.
pub struct PinnedCounters {
    directory: PathBuf,
    /// The agent's pin directory: whether the `sock_ops` link is pinned.
    pin_directory: PathBuf,
    /// The kernel's possible CPUs: a per-CPU value holds one 8-byte slot for each.
    possible_cpus: Option<usize>,
}

/// Where one signal's counter is: a map and an index.
fn counter_of(signal: Signal) -> (&'static str, u32) {
    match signal {
        Signal::TranslationErrors => (map_names::COUNTERS, counter::ERROR),
        Signal::ConntrackOverflows => (map_names::COUNTERS, counter::CONNTRACK_OVERFLOW),
        Signal::RefusedWithEndpointsElsewhere => {
            (map_names::REFUSALS, refusal::WITH_ENDPOINTS_ELSEWHERE)
        }
        Signal::RefusedWithoutReadyEndpoints => {
            (map_names::REFUSALS, refusal::WITHOUT_READY_ENDPOINTS)
        }
        Signal::FragmentsWithoutFirst => (map_names::FRAGMENTS_WITHOUT_FIRST, 0),
        Signal::SourceRangeDrops => (map_names::SOURCE_RANGE_DROPS, 0),
        Signal::FailedConnects => (map_names::CONNECTIONS, connection::FAILED_CONNECTS),
        Signal::SynRetransmits => (map_names::CONNECTIONS, connection::SYN_RETRANSMITS),
        Signal::ResetsByPeer => (map_names::CONNECTIONS, connection::RESETS_BY_PEER),
    }
}

/// The number of possible CPUs in the kernel's list format (`0-3`, `0,2-5`).
pub fn possible_cpu_count(list: &str) -> Option<usize> {
    let mut count = 0;
    for range in list.trim().split(',') {
        let (first, last) = match range.split_once('-') {
            Some((first, last)) => (first.parse::<usize>().ok()?, last.parse::<usize>().ok()?),
            None => {
                let only = range.parse::<usize>().ok()?;
                (only, only)
            }
        };
        count += last.checked_sub(first)? + 1;
    }
    (count > 0).then_some(count)
}

/// The sum over CPUs of one per-CPU `u64` value as the kernel returns it.
fn per_cpu_sum(bytes: &[u8]) -> u64 {
    bytes
        .chunks_exact(8)
        .map(|slot| {
            let mut value = [0u8; 8];
            value.copy_from_slice(slot);
            u64::from_ne_bytes(value)
        })
        .fold(0, u64::wrapping_add)
}

impl PinnedCounters {
    pub fn new(pin_directory: &Path) -> Self {
        Self {
            directory: switchyard_loader::version_directory(pin_directory, SCHEMA_VERSION),
            pin_directory: pin_directory.to_path_buf(),
            possible_cpus: std::fs::read_to_string("/sys/devices/system/cpu/possible")
                .ok()
                .and_then(|list| possible_cpu_count(&list)),
        }
    }

    /// One counter, from its pin opened now (a map created again is a new pin: an open
    /// descriptor would keep reading the old one).
    fn read_one(&self, map: &'static str, index: u32) -> std::io::Result<Reading> {
        let cpus = self
            .possible_cpus
            .ok_or_else(|| std::io::Error::other("the number of possible CPUs is unknown"))?;
        let pin = system::open_pinned(&self.directory.join(map))?;
        let source = system::map_id(pin.as_fd())?;
        let value = system::map_lookup(pin.as_fd(), &index.to_ne_bytes(), 8 * cpus)?
            .ok_or_else(|| std::io::Error::other(format!("{map} has no entry {index}")))?;
        Ok(Reading {
            source,
            value: per_cpu_sum(&value),
        })
    }
}

impl CounterSource for PinnedCounters {
    fn read(&mut self) -> [Option<Reading>; SIGNAL_COUNT] {
        let mut readings = [None; SIGNAL_COUNT];
        // Without its program attached, the connection counters count nothing.
        let connections_counted =
            switchyard_loader::connection_signals_attached(&self.pin_directory);
        for signal in Signal::ALL {
            if signal.measured_on_kube_proxy() && !connections_counted {
                continue;
            }
            let (map, index) = counter_of(signal);
            match self.read_one(map, index) {
                Ok(reading) => readings[signal.index()] = Some(reading),
                Err(error) => {
                    tracing::debug!(%error, map, index, "cannot read a disruption counter")
                }
            }
        }
        readings
    }
}

/// The disruption metrics, on the agent's metrics endpoint.
pub struct DisruptionMetrics {
    /// Counter increases seen by the samples, by signal.
    events: IntCounterVec,
    /// The current window's count (the per-minute figure), by signal.
    per_minute: IntGaugeVec,
    /// The baseline's rate per minute, by signal.
    baseline_per_minute: GaugeVec,
}

impl DisruptionMetrics {
    pub fn register(registry: &Registry) -> Result<Self, crate::Error> {
        let failed = |source| crate::Error::RegisterMetrics { source };
        let events = IntCounterVec::new(
            Opts::new(
                "switchyard_agent_disruption_events_total",
                "Disruption signal events counted by the datapath, by signal (expected drops \
                 included: refused_without_ready_endpoints, source_range_drops), while the \
                 programs are attached; the connection signals (failed_connects, \
                 syn_retransmits, resets_by_peer) whatever the dataplane.",
            ),
            &["signal"],
        )
        .map_err(failed)?;
        let per_minute = IntGaugeVec::new(
            Opts::new(
                "switchyard_agent_disruption_per_minute",
                "Disruption signal events over the last minute (since the last dataplane switch \
                 if later), by signal; absent while not measured.",
            ),
            &["signal"],
        )
        .map_err(failed)?;
        let baseline_per_minute = GaugeVec::new(
            Opts::new(
                "switchyard_agent_disruption_baseline_per_minute",
                "Disruption signal events per minute in the baseline (the last ten minutes under \
                 kube-proxy, kept once the node switched), by signal; absent while not measured.",
            ),
            &["signal"],
        )
        .map_err(failed)?;
        for collector in [
            Box::new(events.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(per_minute.clone()),
            Box::new(baseline_per_minute.clone()),
        ] {
            registry.register(collector).map_err(failed)?;
        }
        Ok(Self {
            events,
            per_minute,
            baseline_per_minute,
        })
    }

    fn record(
        &self,
        increases: &[Option<u64>; SIGNAL_COUNT],
        current: Option<&WindowCounts>,
        baseline: Option<&WindowCounts>,
    ) {
        for signal in Signal::ALL {
            let label = [signal.name()];
            if let Some(increase) = increases[signal.index()] {
                self.events.with_label_values(&label).inc_by(increase);
            }
            match current.and_then(|window| window.count(signal)) {
                Some(count) => self
                    .per_minute
                    .with_label_values(&label)
                    .set(i64::try_from(count).unwrap_or(i64::MAX)),
                None => {
                    let _ = self.per_minute.remove_label_values(&label);
                }
            }
            let rate = baseline.and_then(|window| {
                let count = window.count(signal)?;
                let minutes = (window.end_ms - window.start_ms) as f64 / 60_000.0;
                (minutes > 0.0).then(|| count as f64 / minutes)
            });
            match rate {
                Some(rate) => self.baseline_per_minute.with_label_values(&label).set(rate),
                None => {
                    let _ = self.baseline_per_minute.remove_label_values(&label);
                }
            }
        }
    }
}

/// The sampler: when to read, what to publish.
pub struct DisruptionSampler<C: CounterSource> {
    counters: C,
    tracker: DisruptionTracker,
    metrics: Option<DisruptionMetrics>,
    last_sample: Option<(Instant, Dataplane)>,
    last_readings: [Option<Reading>; SIGNAL_COUNT],
    published: Option<DisruptionReport>,
    baseline_restored: bool,
}

impl<C: CounterSource> DisruptionSampler<C> {
    pub fn new(counters: C, metrics: Option<DisruptionMetrics>) -> Self {
        Self {
            counters,
            tracker: DisruptionTracker::new(Settings::default(), None),
            metrics,
            last_sample: None,
            last_readings: [None; SIGNAL_COUNT],
            published: None,
            baseline_restored: false,
        }
    }

    /// Hands the sampler the baseline an earlier process reported (the DataplaneNode's status
    /// as read back), once: an agent restart keeps the node's baseline under kube-proxy.
    pub fn restore_baseline(&mut self, reported: Option<&DisruptionReport>) {
        if self.baseline_restored {
            return;
        }
        self.baseline_restored = true;
        if let Some(baseline) = reported
            .and_then(|report| report.baseline.as_ref())
            .and_then(window_counts)
        {
            self.tracker.restore_baseline(baseline);
        }
    }

    /// One round: samples if due (the period elapsed, or the dataplane changed), and returns
    /// the report when a new one is published.
    pub fn after_round(
        &mut self,
        dataplane: Dataplane,
        now: Instant,
        wall: DateTime<Utc>,
    ) -> Option<&DisruptionReport> {
        let due = self.last_sample.is_none_or(|(at, sampled)| {
            sampled != dataplane || now.saturating_duration_since(at) >= SAMPLE_PERIOD
        });
        if !due {
            return None;
        }
        self.last_sample = Some((now, dataplane));
        let mut readings = self.counters.read();
        if dataplane == Dataplane::KubeProxy {
            // The translating programs are detached: their counters measure nothing.
            for signal in Signal::ALL {
                if !signal.measured_on_kube_proxy() {
                    readings[signal.index()] = None;
                }
            }
        }
        let mut increases = [None; SIGNAL_COUNT];
        for (index, increase_of) in increases.iter_mut().enumerate() {
            *increase_of = increase(self.last_readings[index], readings[index]);
        }
        self.last_readings = readings;
        self.tracker.record(Sample {
            at_ms: wall.timestamp_millis(),
            dataplane,
            readings,
        });
        if let Some(metrics) = &self.metrics {
            let report = self.tracker.report();
            metrics.record(
                &increases,
                report.current.as_ref(),
                report.baseline.as_ref(),
            );
        }
        let published = self.tracker.publish(wall.timestamp_millis())?;
        self.published = Some(DisruptionReport {
            baseline: published.baseline.as_ref().map(signal_window),
            current: published.current.as_ref().map(signal_window),
        });
        self.published.as_ref()
    }

    /// The report last published (what the status carries).
    pub fn report(&self) -> Option<&DisruptionReport> {
        self.published.as_ref()
    }
}

fn time_of(milliseconds: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(milliseconds)
        .single()
        .unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
}

fn as_count(count: Option<u64>) -> Option<i64> {
    count.map(|count| i64::try_from(count).unwrap_or(i64::MAX))
}

/// A window as the DataplaneNode status carries it.
pub fn signal_window(window: &WindowCounts) -> SignalWindow {
    SignalWindow {
        start: time_of(window.start_ms),
        end: time_of(window.end_ms),
        datapath: DatapathSignals {
            translation_errors: as_count(window.count(Signal::TranslationErrors)),
            refused_with_endpoints_ready_elsewhere: as_count(
                window.count(Signal::RefusedWithEndpointsElsewhere),
            ),
            conntrack_overflows: as_count(window.count(Signal::ConntrackOverflows)),
            fragments_without_first: as_count(window.count(Signal::FragmentsWithoutFirst)),
        },
        expected: ExpectedDrops {
            refused_without_ready_endpoints: as_count(
                window.count(Signal::RefusedWithoutReadyEndpoints),
            ),
            source_range_drops: as_count(window.count(Signal::SourceRangeDrops)),
        },
        connections: ConnectionSignals {
            failed_connects: as_count(window.count(Signal::FailedConnects)),
            syn_retransmits: as_count(window.count(Signal::SynRetransmits)),
            resets_by_peer: as_count(window.count(Signal::ResetsByPeer)),
        },
        probes: Default::default(),
        services: Vec::new(),
    }
}

/// A window read back from the status; `None` for one that ends before it starts.
pub fn window_counts(window: &SignalWindow) -> Option<WindowCounts> {
    let count = |value: Option<i64>| value.and_then(|value| u64::try_from(value).ok());
    let mut counts = [None; SIGNAL_COUNT];
    counts[Signal::TranslationErrors.index()] = count(window.datapath.translation_errors);
    counts[Signal::RefusedWithEndpointsElsewhere.index()] =
        count(window.datapath.refused_with_endpoints_ready_elsewhere);
    counts[Signal::ConntrackOverflows.index()] = count(window.datapath.conntrack_overflows);
    counts[Signal::FragmentsWithoutFirst.index()] = count(window.datapath.fragments_without_first);
    counts[Signal::RefusedWithoutReadyEndpoints.index()] =
        count(window.expected.refused_without_ready_endpoints);
    counts[Signal::SourceRangeDrops.index()] = count(window.expected.source_range_drops);
    counts[Signal::FailedConnects.index()] = count(window.connections.failed_connects);
    counts[Signal::SynRetransmits.index()] = count(window.connections.syn_retransmits);
    counts[Signal::ResetsByPeer.index()] = count(window.connections.resets_by_peer);
    let (start_ms, end_ms) = (
        window.start.timestamp_millis(),
        window.end.timestamp_millis(),
    );
    (end_ms > start_ms).then_some(WindowCounts {
        start_ms,
        end_ms,
        counts,
    })
}

#[cfg(test)]
mod tests;
