//! The agent's Prometheus metrics, served by `switchyard-telemetry` with
//! `/healthz` and `/readyz` on one port.

use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

use crate::core::round::RoundReport;
use crate::core::AgentCounts;
use crate::loader::{expiry::SweepReport, Counters};

pub struct AgentMetrics {
    pub registry: Registry,
    /// By `kind`: partial, full, resync.
    pub sync_duration: HistogramVec,
    pub map_entries: IntGaugeVec,
    pub program_attaches: IntCounter,
    pub gate_wait_seconds: prometheus::Gauge,
    pub node_updates_ignored: IntCounter,
    pub datapath_packets: IntCounterVec,
    pub kube_proxy_rules_present: IntGauge,
    pub map_operations: IntCounter,
    pub status_writes: IntCounter,
    pub disruption_status_writes: IntCounter,
    pub resync_corrections: IntCounter,
    pub conntrack_entries: IntGauge,
    pub conntrack_capacity: IntGauge,
    pub conntrack_sweep_seconds: prometheus::Gauge,
    pub conntrack_expired: IntCounter,
    /// Map entries the last sync could not write, by Service.
    pub sync_failed_entries: IntGaugeVec,
    /// Counts already added to the counters (they only grow by differences).
    counted: AgentCounts,
    counted_packets: Counters,
    counted_expired: u64,
}

/// Registers a newly made metric in `registry` and hands it back, so that no
/// metric is made without being served.
fn register<M>(registry: &Registry, made: prometheus::Result<M>) -> Result<M, crate::Error>
where
    M: prometheus::core::Collector + Clone + 'static,
{
    let metric_error = |source| crate::Error::RegisterMetrics { source };
    let metric = made.map_err(metric_error)?;
    registry
        .register(Box::new(metric.clone()))
        .map_err(metric_error)?;
    Ok(metric)
}

impl AgentMetrics {
    pub fn new() -> Result<Self, crate::Error> {
        let registry = Registry::new();
        Ok(Self {
            sync_duration: register(
                &registry,
                HistogramVec::new(
                    HistogramOpts::new(
                        "switchyard_agent_sync_duration_seconds",
                        "Time one sync of the maps took (desired state, plan and apply), by kind: \
                         partial (only the changed Services), full, resync (periodic, re-reads the maps).",
                    )
                    .buckets(vec![
                        0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                        0.1, 0.25, 0.5, 1.0, 2.5,
                    ]),
                    &["kind"],
                ),
            )?,
            map_entries: register(
                &registry,
                IntGaugeVec::new(
                    Opts::new(
                        "switchyard_agent_map_entries",
                        "Entries the agent has programmed, by map.",
                    ),
                    &["map"],
                ),
            )?,
            program_attaches: register(
                &registry,
                IntCounter::new(
                    "switchyard_agent_program_attach_total",
                    "Program attaches that changed the kernel (a link created or its program replaced).",
                ),
            )?,
            gate_wait_seconds: register(
                &registry,
                prometheus::Gauge::new(
                    "switchyard_agent_gate_wait_seconds",
                    "How long the start-of-day gate stayed closed (so far, while it is closed).",
                ),
            )?,
            node_updates_ignored: register(
                &registry,
                IntCounter::new(
                    "switchyard_agent_node_updates_ignored_total",
                    "Updates of this node's Node object that changed nothing the agent uses.",
                ),
            )?,
            datapath_packets: register(
                &registry,
                IntCounterVec::new(
                    Opts::new(
                        "switchyard_agent_datapath_packets_total",
                        "Packets seen by the TC programs, by result (from their per-CPU counters).",
                    ),
                    &["result"],
                ),
            )?,
            kube_proxy_rules_present: register(
                &registry,
                IntGauge::new(
                    "switchyard_agent_kube_proxy_rules_present",
                    "kube-proxy Service rules found on the node at the last check.",
                ),
            )?,
            map_operations: register(
                &registry,
                IntCounter::new(
                    "switchyard_agent_map_operations_total",
                    "Writes and deletes of map entries (Service entries and the datapath config).",
                ),
            )?,
            status_writes: register(
                &registry,
                IntCounter::new(
                    "switchyard_agent_status_writes_total",
                    "DataplaneNode status writes (made only when the status changed).",
                ),
            )?,
            disruption_status_writes: register(
                &registry,
                IntCounter::new(
                    "switchyard_agent_status_writes_disruption_only_total",
                    "DataplaneNode status writes that changed nothing but the disruption report (its bounded-rate publication for canary soaks).",
                ),
            )?,
            resync_corrections: register(
                &registry,
                IntCounter::new(
                    "switchyard_agent_resync_corrections_total",
                    "Periodic full resyncs that found the maps differing from the desired state \
                     (something else wrote them, or the partial syncs drifted) and wrote corrections.",
                ),
            )?,
            conntrack_entries: register(
                &registry,
                IntGauge::new(
                    "switchyard_agent_conntrack_entries",
                    "Entries of the conntrack hash after the last expiry sweep; near the capacity, \
                     new flows go to the overflow LRU (datapath_packets_total{result=\"conntrack_overflow\"}).",
                ),
            )?,
            conntrack_capacity: register(
                &registry,
                IntGauge::new(
                    "switchyard_agent_conntrack_capacity",
                    "Entries the conntrack hash can hold.",
                ),
            )?,
            conntrack_sweep_seconds: register(
                &registry,
                prometheus::Gauge::new(
                    "switchyard_agent_conntrack_sweep_seconds",
                    "How long the last conntrack expiry sweep took (sweeps take at most 5% of one core).",
                ),
            )?,
            conntrack_expired: register(
                &registry,
                IntCounter::new(
                    "switchyard_agent_conntrack_expired_total",
                    "Expired conntrack entries the sweeps removed.",
                ),
            )?,
            sync_failed_entries: register(
                &registry,
                IntGaugeVec::new(
                    Opts::new(
                        "switchyard_agent_sync_failed_entries",
                        "Map entries the last sync could not bring to their desired state, by Service \
                         (namespace/name; empty for entries of no desired Service). Every other entry \
                         was written; these are retried. 0 when the last sync succeeded.",
                    ),
                    &["service"],
                ),
            )?,
            registry,
            counted: AgentCounts::default(),
            counted_packets: Counters::default(),
            counted_expired: 0,
        })
    }

    /// Brings the conntrack metrics up to the expiry's report.
    pub fn record_conntrack_sweeps(&mut self, report: &SweepReport) {
        self.conntrack_entries
            .set(i64::try_from(report.entries).unwrap_or(i64::MAX));
        self.conntrack_capacity.set(i64::from(report.capacity));
        self.conntrack_sweep_seconds
            .set(report.last_sweep_took.as_secs_f64());
        self.conntrack_expired
            .inc_by(report.removed_total.saturating_sub(self.counted_expired));
        self.counted_expired = report.removed_total;
    }

    /// Writes out one round of the core: its sync, entries, gate, the
    /// coexistence loop's count of kube-proxy rules, and the counts.
    pub fn record_round(&mut self, round: &RoundReport, counts: &AgentCounts) {
        if let Some((kind, elapsed)) = round.sync {
            self.sync_duration
                .with_label_values(&[kind])
                .observe(elapsed.as_secs_f64());
        }
        self.record_counts(counts);
        self.record_failed_entries(&round.failed_entries);
        let count = |value: usize| i64::try_from(value).unwrap_or(i64::MAX);
        self.map_entries
            .with_label_values(&["frontends"])
            .set(count(round.frontends));
        self.map_entries
            .with_label_values(&["backends"])
            .set(count(round.backend_slots));
        self.gate_wait_seconds.set(round.gate_wait.as_secs_f64());
        if let Some(rules) = round.kube_proxy_rules {
            self.kube_proxy_rules_present.set(count(rules));
        }
    }

    /// The entries the last sync left behind, by Service (Services that have
    /// none any more drop out).
    pub fn record_failed_entries(&self, by_service: &std::collections::BTreeMap<String, usize>) {
        self.sync_failed_entries.reset();
        for (service, entries) in by_service {
            self.sync_failed_entries
                .with_label_values(&[service.as_str()])
                .set(i64::try_from(*entries).unwrap_or(i64::MAX));
        }
    }

    /// Brings the counters up to the agent's counts.
    pub fn record_counts(&mut self, counts: &AgentCounts) {
        let delta = |now: u64, before: u64| now.saturating_sub(before);
        self.node_updates_ignored.inc_by(delta(
            counts.node_updates_ignored,
            self.counted.node_updates_ignored,
        ));
        self.map_operations
            .inc_by(delta(counts.map_operations, self.counted.map_operations));
        self.program_attaches.inc_by(delta(
            counts.program_attaches,
            self.counted.program_attaches,
        ));
        self.resync_corrections.inc_by(delta(
            counts.resync_corrections,
            self.counted.resync_corrections,
        ));
        self.counted = *counts;
    }

    /// Brings the packet counters up to the programs' counters. They live in the
    /// pinned maps and so count since the programs were first loaded; this
    /// process's metric starts from what it first reads.
    pub fn record_packets(&mut self, counters: &Counters) {
        let pairs = [
            (
                "translated",
                counters.translated,
                self.counted_packets.translated,
            ),
            (
                "no_backend",
                counters.no_backend,
                self.counted_packets.no_backend,
            ),
            (
                "conntrack_hit",
                counters.conntrack_hit,
                self.counted_packets.conntrack_hit,
            ),
            (
                "conntrack_miss",
                counters.conntrack_miss,
                self.counted_packets.conntrack_miss,
            ),
            ("error", counters.error, self.counted_packets.error),
            (
                "passed_untracked",
                counters.passed_untracked,
                self.counted_packets.passed_untracked,
            ),
            (
                "reverse_translated",
                counters.reverse_translated,
                self.counted_packets.reverse_translated,
            ),
            (
                "conntrack_overflow",
                counters.conntrack_overflow,
                self.counted_packets.conntrack_overflow,
            ),
        ];
        for (result, now, before) in pairs {
            self.datapath_packets
                .with_label_values(&[result])
                .inc_by(now.saturating_sub(before));
        }
        self.counted_packets = *counters;
    }
}

#[cfg(test)]
mod tests;
