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

fn metric_error(source: prometheus::Error) -> crate::Error {
    crate::Error::RegisterMetrics { source }
}

impl AgentMetrics {
    pub fn new() -> Result<Self, crate::Error> {
        let registry = Registry::new();
        let sync_duration = HistogramVec::new(
            HistogramOpts::new(
                "switchyard_agent_sync_duration_seconds",
                "Time one sync of the maps took (desired state, plan and apply), by kind: \
                 partial (only the changed Services), full, resync (periodic, re-reads the maps).",
            )
            .buckets(vec![
                0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                0.25, 0.5, 1.0, 2.5,
            ]),
            &["kind"],
        )
        .map_err(metric_error)?;
        let map_entries = IntGaugeVec::new(
            Opts::new(
                "switchyard_agent_map_entries",
                "Entries the agent has programmed, by map.",
            ),
            &["map"],
        )
        .map_err(metric_error)?;
        let program_attaches = IntCounter::new(
            "switchyard_agent_program_attach_total",
            "Program attaches that changed the kernel (a link created or its program replaced).",
        )
        .map_err(metric_error)?;
        let gate_wait_seconds = prometheus::Gauge::new(
            "switchyard_agent_gate_wait_seconds",
            "How long the start-of-day gate stayed closed (so far, while it is closed).",
        )
        .map_err(metric_error)?;
        let node_updates_ignored = IntCounter::new(
            "switchyard_agent_node_updates_ignored_total",
            "Updates of this node's Node object that changed nothing the agent uses.",
        )
        .map_err(metric_error)?;
        let datapath_packets = IntCounterVec::new(
            Opts::new(
                "switchyard_agent_datapath_packets_total",
                "Packets seen by the TC programs, by result (from their per-CPU counters).",
            ),
            &["result"],
        )
        .map_err(metric_error)?;
        let kube_proxy_rules_present = IntGauge::new(
            "switchyard_agent_kube_proxy_rules_present",
            "kube-proxy Service rules found on the node at the last check.",
        )
        .map_err(metric_error)?;
        let map_operations = IntCounter::new(
            "switchyard_agent_map_operations_total",
            "Writes and deletes of map entries (Service entries and the datapath config).",
        )
        .map_err(metric_error)?;
        let status_writes = IntCounter::new(
            "switchyard_agent_status_writes_total",
            "DataplaneNode status writes (made only when the status changed).",
        )
        .map_err(metric_error)?;
        let resync_corrections = IntCounter::new(
            "switchyard_agent_resync_corrections_total",
            "Periodic full resyncs that found the maps differing from the desired state \
             (something else wrote them, or the partial syncs drifted) and wrote corrections.",
        )
        .map_err(metric_error)?;
        let conntrack_entries = IntGauge::new(
            "switchyard_agent_conntrack_entries",
            "Entries of the conntrack hash after the last expiry sweep; near the capacity, \
             new flows go to the overflow LRU (datapath_packets_total{result=\"conntrack_overflow\"}).",
        )
        .map_err(metric_error)?;
        let conntrack_capacity = IntGauge::new(
            "switchyard_agent_conntrack_capacity",
            "Entries the conntrack hash can hold.",
        )
        .map_err(metric_error)?;
        let conntrack_sweep_seconds = prometheus::Gauge::new(
            "switchyard_agent_conntrack_sweep_seconds",
            "How long the last conntrack expiry sweep took (sweeps take at most 5% of one core).",
        )
        .map_err(metric_error)?;
        let conntrack_expired = IntCounter::new(
            "switchyard_agent_conntrack_expired_total",
            "Expired conntrack entries the sweeps removed.",
        )
        .map_err(metric_error)?;
        let sync_failed_entries = IntGaugeVec::new(
            Opts::new(
                "switchyard_agent_sync_failed_entries",
                "Map entries the last sync could not bring to their desired state, by Service \
                 (namespace/name; empty for entries of no desired Service). Every other entry \
                 was written; these are retried. 0 when the last sync succeeded.",
            ),
            &["service"],
        )
        .map_err(metric_error)?;
        let collectors: Vec<Box<dyn prometheus::core::Collector>> = vec![
            Box::new(sync_failed_entries.clone()),
            Box::new(conntrack_entries.clone()),
            Box::new(conntrack_capacity.clone()),
            Box::new(conntrack_sweep_seconds.clone()),
            Box::new(conntrack_expired.clone()),
            Box::new(resync_corrections.clone()),
            Box::new(sync_duration.clone()),
            Box::new(map_entries.clone()),
            Box::new(program_attaches.clone()),
            Box::new(gate_wait_seconds.clone()),
            Box::new(node_updates_ignored.clone()),
            Box::new(datapath_packets.clone()),
            Box::new(kube_proxy_rules_present.clone()),
            Box::new(map_operations.clone()),
            Box::new(status_writes.clone()),
        ];
        for collector in collectors {
            registry.register(collector).map_err(metric_error)?;
        }
        Ok(Self {
            registry,
            sync_duration,
            map_entries,
            program_attaches,
            gate_wait_seconds,
            node_updates_ignored,
            datapath_packets,
            kube_proxy_rules_present,
            map_operations,
            status_writes,
            resync_corrections,
            conntrack_entries,
            conntrack_capacity,
            conntrack_sweep_seconds,
            conntrack_expired,
            sync_failed_entries,
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
mod tests {
    use super::*;

    fn value(metrics: &AgentMetrics, name: &str) -> String {
        let families = metrics.registry.gather();
        let mut text = Vec::new();
        prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &families, &mut text)
            .expect("encodes");
        String::from_utf8(text)
            .expect("utf-8")
            .lines()
            .find(|line| line.starts_with(name))
            .unwrap_or_default()
            .to_string()
    }

    #[test]
    fn counters_follow_the_agent_counts_by_differences() {
        let mut metrics = AgentMetrics::new().expect("registers");
        let mut counts = AgentCounts {
            node_updates_ignored: 3,
            ..AgentCounts::default()
        };
        metrics.record_counts(&counts);
        counts.node_updates_ignored = 5;
        metrics.record_counts(&counts);
        metrics.record_counts(&counts);
        assert_eq!(
            value(&metrics, "switchyard_agent_node_updates_ignored_total"),
            "switchyard_agent_node_updates_ignored_total 5"
        );
    }

    #[test]
    fn conntrack_metrics_follow_the_sweep_reports() {
        let mut metrics = AgentMetrics::new().expect("registers");
        let mut report = SweepReport {
            entries: 1_000,
            capacity: 524_288,
            last_sweep_took: std::time::Duration::from_millis(250),
            removed_total: 40,
        };
        metrics.record_conntrack_sweeps(&report);
        report.entries = 900;
        report.removed_total = 140;
        metrics.record_conntrack_sweeps(&report);
        metrics.record_conntrack_sweeps(&report);
        assert_eq!(
            value(&metrics, "switchyard_agent_conntrack_entries"),
            "switchyard_agent_conntrack_entries 900"
        );
        assert_eq!(
            value(&metrics, "switchyard_agent_conntrack_capacity"),
            "switchyard_agent_conntrack_capacity 524288"
        );
        assert_eq!(
            value(&metrics, "switchyard_agent_conntrack_sweep_seconds"),
            "switchyard_agent_conntrack_sweep_seconds 0.25"
        );
        assert_eq!(
            value(&metrics, "switchyard_agent_conntrack_expired_total"),
            "switchyard_agent_conntrack_expired_total 140"
        );
    }

    #[test]
    fn packet_counters_are_labelled_by_result() {
        let mut metrics = AgentMetrics::new().expect("registers");
        metrics.record_packets(&Counters {
            translated: 10,
            ..Counters::default()
        });
        metrics.record_packets(&Counters {
            translated: 25,
            no_backend: 1,
            ..Counters::default()
        });
        assert_eq!(
            value(
                &metrics,
                "switchyard_agent_datapath_packets_total{result=\"translated\"}"
            ),
            "switchyard_agent_datapath_packets_total{result=\"translated\"} 25"
        );
    }
}
