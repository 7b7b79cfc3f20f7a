//! kube-proxy's metrics (`pkg/proxy/metrics`), under their names, for the agent to serve on
//! kube-proxy's metrics address once kube-proxy has left the node: dashboards and alerts
//! written for kube-proxy keep reading them after the switch.
//!
//! Served (same names, types, labels and buckets as kube-proxy's current release; the
//! `ip_family` label kube-proxy added in 1.33 is `IPv4`, the family the datapath serves, so
//! queries written for 1.20's unlabelled series still match):
//! - `sync_proxy_rules_duration_seconds`, `sync_full_proxy_rules_duration_seconds`,
//!   `sync_partial_proxy_rules_duration_seconds`: one sync of the maps (a periodic resync is
//!   a full one), as kube-proxy times one `syncProxyRules`;
//! - `sync_proxy_rules_last_timestamp_seconds`: the end of the last successful sync;
//! - `sync_proxy_rules_last_queued_timestamp_seconds`: the last input that left a sync to
//!   do (kube-proxy's `Sync()` call);
//! - `network_programming_duration_seconds`: from an EndpointSlice's
//!   `endpoints.kubernetes.io/last-change-trigger-time` to the end of the sync that wrote
//!   its change to the maps, for each slice change that changed something and whose trigger
//!   came after the agent started (kube-proxy's `trackerStartTime`);
//! - `sync_proxy_rules_{service,endpoint}_changes_{total,pending}`;
//! - `sync_proxy_rules_no_local_endpoints_total` (labels `traffic_policy`, `ip_family`): the
//!   Service ports a `Local` policy leaves without a local endpoint, as of the last
//!   successful sync ([`crate::desired::no_local_endpoints`]);
//! - `proxy_healthz_total` / `proxy_livez_total` (label `code`): the answers of the agent's
//!   replacement `:10256/healthz` and `/livez` ([`HealthAnswerCounts`]);
//! - `conntrack_reconciler_deleted_entries_total` and
//!   `conntrack_reconciler_sync_duration_seconds`: the UDP flows the agent deletes when a
//!   backend leaves its frontend (kube-proxy's conntrack reconciler deletes the same flows
//!   from the kernel's conntrack), and how long each deletion pass took.
//!
//! Pure: [`KubeProxyChanges`] turns what each input did ([`InputChanges`], from the core)
//! and each sync ([`SyncDone`]) into values; [`KubeProxyMetrics`] only writes them out.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

use crate::desired::no_local_endpoints::NoLocalEndpoints;
use crate::model::{EndpointSliceModel, ServiceName};
use crate::sync::ApplyReport;

/// kube-proxy's `--metrics-bind-address` default (1.20 and current releases' flag; kubeadm
/// and many distributions set `0.0.0.0:10249` in the configuration instead).
pub const KUBE_PROXY_METRICS_ADDRESS: &str = "127.0.0.1:10249";

/// kube-proxy's `v1.IPFamily` label value for the only family the datapath serves.
const IP_FAMILY: &str = "IPv4";

/// `metrics.ExponentialBuckets(0.001, 2, 15)`: 1 ms to 16.384 s.
pub fn sync_duration_buckets() -> Vec<f64> {
    (0..15)
        .map(|power| 0.001 * f64::from(1_u32 << power))
        .collect()
}

/// `metrics.MergeBuckets(LinearBuckets(0.25, 0.25, 2), LinearBuckets(1, 1, 59),
/// LinearBuckets(60, 5, 12), LinearBuckets(120, 30, 7))`; the merge starts its list with a
/// 0 bucket.
pub fn network_programming_buckets() -> Vec<f64> {
    let linear = |start: f64, width: f64, count: u32| {
        (0..count).map(move |index| start + width * f64::from(index))
    };
    std::iter::once(0.0)
        .chain(linear(0.25, 0.25, 2))
        .chain(linear(1.0, 1.0, 59))
        .chain(linear(60.0, 5.0, 12))
        .chain(linear(120.0, 30.0, 7))
        .collect()
}

/// Whether two versions of a slice differ in what the agent syncs: everything but the trigger
/// time, as kube-proxy's `updatePending` compares the slice's endpoints and ports only.
pub fn slice_changes_endpoints(old: &EndpointSliceModel, new: &EndpointSliceModel) -> bool {
    let EndpointSliceModel {
        slice_name,
        service,
        family,
        ports,
        endpoints,
        last_change_trigger_time: _,
    } = old;
    *slice_name != new.slice_name
        || *service != new.service
        || *family != new.family
        || *ports != new.ports
        || *endpoints != new.endpoints
}

/// What one input did, as kube-proxy's change trackers see their informer events.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InputChanges {
    /// Service objects received: each add, update and delete, each Service of a relist.
    pub services_received: u64,
    /// Services this input named whose share now differs from what the maps hold.
    pub services_pending: Vec<ServiceName>,
    /// EndpointSlice objects received, as for Services.
    pub slices_received: u64,
    /// One entry per slice this input changed (kube-proxy's `changeNeeded`): its trigger
    /// time, `None` for a removal (whose annotation only dates the last update) or a slice
    /// without one.
    pub slice_changes: Vec<Option<SystemTime>>,
    /// The input leaves a sync to do.
    pub sync_requested: bool,
}

/// A successful sync of the maps, as the core reports it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SyncDone {
    /// `partial`, `full` or `resync` ([`crate::sync::inputs::SyncKind::name`]).
    pub kind: &'static str,
    pub elapsed: Duration,
    /// Wall-clock time the sync ended.
    pub finished_at: SystemTime,
}

/// What to observe for one sync.
#[derive(Clone, Debug, PartialEq)]
pub struct SyncObservations {
    pub duration_seconds: f64,
    /// Only the changed Services were synced (kube-proxy's partial sync).
    pub partial: bool,
    /// One latency per slice change the sync programmed, in seconds; negative when the
    /// trigger time is ahead of the node's clock, as kube-proxy's `time.Since` gives it.
    pub network_programming_seconds: Vec<f64>,
}

/// kube-proxy's change tracking and sync bookkeeping, fed by the core's inputs and syncs.
#[derive(Clone, Debug)]
pub struct KubeProxyChanges {
    /// Triggers at or before this are older than the agent and not measured.
    started_at: SystemTime,
    pub service_changes_total: u64,
    pub endpoint_changes_total: u64,
    /// Slice changes since the last successful sync.
    pub endpoint_changes_pending: u64,
    /// Services changed by Service events since the last successful sync.
    services_pending: BTreeSet<ServiceName>,
    /// Trigger times of the slice changes not synced yet.
    trigger_times: Vec<SystemTime>,
    pub last_queued: Option<SystemTime>,
    pub last_synced: Option<SystemTime>,
}

impl KubeProxyChanges {
    pub fn new(started_at: SystemTime) -> Self {
        Self {
            started_at,
            service_changes_total: 0,
            endpoint_changes_total: 0,
            endpoint_changes_pending: 0,
            services_pending: BTreeSet::new(),
            trigger_times: Vec::new(),
            last_queued: None,
            last_synced: None,
        }
    }

    pub fn service_changes_pending(&self) -> usize {
        self.services_pending.len()
    }

    /// One input, received at `at`.
    pub fn received(&mut self, changes: InputChanges, at: SystemTime) {
        self.service_changes_total += changes.services_received;
        self.endpoint_changes_total += changes.slices_received;
        self.services_pending.extend(changes.services_pending);
        self.endpoint_changes_pending += changes.slice_changes.len() as u64;
        let started_at = self.started_at;
        self.trigger_times.extend(
            changes
                .slice_changes
                .into_iter()
                .flatten()
                .filter(|trigger| *trigger > started_at),
        );
        if changes.sync_requested {
            self.last_queued = Some(at);
        }
    }

    /// A successful sync: it wrote every change received before it, so every pending change
    /// is synced and every trigger time measured. A failed sync is not reported: its changes
    /// stay pending and are measured when a sync writes them.
    pub fn synced(&mut self, sync: &SyncDone) -> SyncObservations {
        self.services_pending.clear();
        self.endpoint_changes_pending = 0;
        self.last_synced = Some(sync.finished_at);
        let network_programming_seconds = std::mem::take(&mut self.trigger_times)
            .into_iter()
            .map(|trigger| seconds_between(trigger, sync.finished_at))
            .collect();
        SyncObservations {
            duration_seconds: sync.elapsed.as_secs_f64(),
            partial: sync.kind == "partial",
            network_programming_seconds,
        }
    }
}

/// `to - from` in seconds, negative when `to` is earlier.
fn seconds_between(from: SystemTime, to: SystemTime) -> f64 {
    match to.duration_since(from) {
        Ok(elapsed) => elapsed.as_secs_f64(),
        Err(ahead) => -ahead.duration().as_secs_f64(),
    }
}

/// Seconds since the Unix epoch, as Prometheus' `SetToCurrentTime` writes them.
fn unix_seconds(time: SystemTime) -> f64 {
    seconds_between(SystemTime::UNIX_EPOCH, time)
}

/// The answers of the replacement `:10256` server, counted by HTTP status as kube-proxy's
/// healthz and livez handlers count theirs; shared with the servers, which count each
/// answer as they write it.
#[derive(Clone, Debug)]
pub struct HealthAnswerCounts {
    healthz: IntCounterVec,
    livez: IntCounterVec,
}

impl HealthAnswerCounts {
    /// The status codes kube-proxy's handlers answer with: their series exist from the
    /// start, at zero.
    const CODES: [&'static str; 2] = ["200", "503"];

    fn new() -> Result<Self, crate::Error> {
        let counter = |name: &str, help: &str| {
            IntCounterVec::new(Opts::new(name, alpha(help)), &["code"]).map_err(metric_error)
        };
        let counts = Self {
            healthz: counter(
                "kubeproxy_proxy_healthz_total",
                "Cumulative proxy healthz HTTP status",
            )?,
            livez: counter(
                "kubeproxy_proxy_livez_total",
                "Cumulative proxy livez HTTP status",
            )?,
        };
        for code in Self::CODES {
            counts.healthz.with_label_values(&[code]);
            counts.livez.with_label_values(&[code]);
        }
        Ok(counts)
    }

    /// One answer to `path` (query included) with `status`. Only `/healthz` and `/livez`
    /// are counted: kube-proxy counts in those two handlers, and its other paths' 404s
    /// count nowhere.
    pub fn answered(&self, path: &str, status: u16) {
        let counter = match path.split('?').next().unwrap_or_default() {
            "/healthz" => &self.healthz,
            "/livez" => &self.livez,
            _ => return,
        };
        counter.with_label_values(&[&status.to_string()]).inc();
    }
}

/// The registry the agent serves on kube-proxy's metrics address: kube-proxy's metrics only,
/// never the agent's own (those stay on the agent's port, under `switchyard_agent_`).
pub struct KubeProxyMetrics {
    pub registry: Registry,
    sync_duration: HistogramVec,
    sync_full_duration: HistogramVec,
    sync_partial_duration: HistogramVec,
    last_timestamp: prometheus::GaugeVec,
    last_queued_timestamp: prometheus::GaugeVec,
    network_programming: HistogramVec,
    endpoint_changes_pending: IntGauge,
    endpoint_changes_total: IntCounter,
    service_changes_pending: IntGauge,
    service_changes_total: IntCounter,
    no_local_endpoints: IntGaugeVec,
    health_answers: HealthAnswerCounts,
    conntrack_deleted: IntCounterVec,
    conntrack_duration: HistogramVec,
}

fn metric_error(source: prometheus::Error) -> crate::Error {
    crate::Error::RegisterMetrics { source }
}

/// kube-proxy's help texts carry their stability level as component-base writes it.
fn alpha(help: &str) -> String {
    format!("[ALPHA] {help}")
}

fn histogram(name: &str, help: &str, buckets: Vec<f64>) -> Result<HistogramVec, crate::Error> {
    HistogramVec::new(
        HistogramOpts::new(name, alpha(help)).buckets(buckets),
        &["ip_family"],
    )
    .map_err(metric_error)
}

fn family_gauge(name: &str, help: &str) -> Result<prometheus::GaugeVec, crate::Error> {
    prometheus::GaugeVec::new(Opts::new(name, alpha(help)), &["ip_family"]).map_err(metric_error)
}

impl KubeProxyMetrics {
    pub fn new() -> Result<Self, crate::Error> {
        let metrics = Self {
            registry: Registry::new(),
            sync_duration: histogram(
                "kubeproxy_sync_proxy_rules_duration_seconds",
                "SyncProxyRules latency in seconds",
                sync_duration_buckets(),
            )?,
            sync_full_duration: histogram(
                "kubeproxy_sync_full_proxy_rules_duration_seconds",
                "SyncProxyRules latency in seconds for full resyncs",
                sync_duration_buckets(),
            )?,
            sync_partial_duration: histogram(
                "kubeproxy_sync_partial_proxy_rules_duration_seconds",
                "SyncProxyRules latency in seconds for partial resyncs",
                sync_duration_buckets(),
            )?,
            last_timestamp: family_gauge(
                "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
                "The last time proxy rules were successfully synced",
            )?,
            last_queued_timestamp: family_gauge(
                "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
                "The last time a sync of proxy rules was queued",
            )?,
            network_programming: histogram(
                "kubeproxy_network_programming_duration_seconds",
                "In Cluster Network Programming Latency in seconds",
                network_programming_buckets(),
            )?,
            endpoint_changes_pending: IntGauge::new(
                "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
                alpha("Pending proxy rules Endpoint changes"),
            )
            .map_err(metric_error)?,
            endpoint_changes_total: IntCounter::new(
                "kubeproxy_sync_proxy_rules_endpoint_changes_total",
                alpha("Cumulative proxy rules Endpoint changes"),
            )
            .map_err(metric_error)?,
            service_changes_pending: IntGauge::new(
                "kubeproxy_sync_proxy_rules_service_changes_pending",
                alpha("Pending proxy rules Service changes"),
            )
            .map_err(metric_error)?,
            service_changes_total: IntCounter::new(
                "kubeproxy_sync_proxy_rules_service_changes_total",
                alpha("Cumulative proxy rules Service changes"),
            )
            .map_err(metric_error)?,
            no_local_endpoints: IntGaugeVec::new(
                Opts::new(
                    "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
                    alpha("Number of services with a Local traffic policy and no endpoints"),
                ),
                &["traffic_policy", "ip_family"],
            )
            .map_err(metric_error)?,
            health_answers: HealthAnswerCounts::new()?,
            conntrack_deleted: IntCounterVec::new(
                Opts::new(
                    "kubeproxy_conntrack_reconciler_deleted_entries_total",
                    alpha("Cumulative conntrack flows deleted by conntrack reconciler"),
                ),
                &["ip_family"],
            )
            .map_err(metric_error)?,
            conntrack_duration: histogram(
                "kubeproxy_conntrack_reconciler_sync_duration_seconds",
                "ReconcileConntrackFlowsLatency latency in seconds",
                sync_duration_buckets(),
            )?,
        };
        let collectors: Vec<Box<dyn prometheus::core::Collector>> = vec![
            Box::new(metrics.sync_duration.clone()),
            Box::new(metrics.sync_full_duration.clone()),
            Box::new(metrics.sync_partial_duration.clone()),
            Box::new(metrics.last_timestamp.clone()),
            Box::new(metrics.last_queued_timestamp.clone()),
            Box::new(metrics.network_programming.clone()),
            Box::new(metrics.endpoint_changes_pending.clone()),
            Box::new(metrics.endpoint_changes_total.clone()),
            Box::new(metrics.service_changes_pending.clone()),
            Box::new(metrics.service_changes_total.clone()),
            Box::new(metrics.no_local_endpoints.clone()),
            Box::new(metrics.health_answers.healthz.clone()),
            Box::new(metrics.health_answers.livez.clone()),
            Box::new(metrics.conntrack_deleted.clone()),
            Box::new(metrics.conntrack_duration.clone()),
        ];
        for collector in collectors {
            metrics.registry.register(collector).map_err(metric_error)?;
        }
        // kube-proxy's labelled series exist from its start (its proxier touches them
        // once); so do these, so a dashboard sees zeros rather than no data.
        for vec in [
            &metrics.sync_duration,
            &metrics.sync_full_duration,
            &metrics.sync_partial_duration,
            &metrics.network_programming,
            &metrics.conntrack_duration,
        ] {
            vec.with_label_values(&[IP_FAMILY]);
        }
        metrics.conntrack_deleted.with_label_values(&[IP_FAMILY]);
        metrics.record_no_local_endpoints(NoLocalEndpoints::default());
        // Zero until the first sync, as kube-proxy 1.20's unlabelled gauges read.
        for gauge in [&metrics.last_timestamp, &metrics.last_queued_timestamp] {
            gauge.with_label_values(&[IP_FAMILY]);
        }
        Ok(metrics)
    }

    /// Brings the change counts, the pending gauges and the timestamps up to `changes`.
    pub fn record_changes(&self, changes: &KubeProxyChanges) {
        let gauge = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
        self.service_changes_total.inc_by(
            changes
                .service_changes_total
                .saturating_sub(self.service_changes_total.get()),
        );
        self.endpoint_changes_total.inc_by(
            changes
                .endpoint_changes_total
                .saturating_sub(self.endpoint_changes_total.get()),
        );
        self.service_changes_pending
            .set(gauge(changes.service_changes_pending() as u64));
        self.endpoint_changes_pending
            .set(gauge(changes.endpoint_changes_pending));
        if let Some(at) = changes.last_queued {
            self.last_queued_timestamp
                .with_label_values(&[IP_FAMILY])
                .set(unix_seconds(at));
        }
        if let Some(at) = changes.last_synced {
            self.last_timestamp
                .with_label_values(&[IP_FAMILY])
                .set(unix_seconds(at));
        }
    }

    /// The answer counts the replacement health servers write to.
    pub fn health_answers(&self) -> HealthAnswerCounts {
        self.health_answers.clone()
    }

    /// The no-local-endpoints counts of the last successful sync, which kube-proxy sets at
    /// the end of each of its syncs.
    pub fn record_no_local_endpoints(&self, counts: NoLocalEndpoints) {
        let gauge = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
        for (policy, count) in [("internal", counts.internal), ("external", counts.external)] {
            self.no_local_endpoints
                .with_label_values(&[policy, IP_FAMILY])
                .set(gauge(count));
        }
    }

    /// The release of the UDP flows of removed backends an apply ran, if it ran one: timed
    /// whether it succeeded or not, its deleted flows counted when it succeeded, as
    /// kube-proxy times every conntrack reconcile and adds what it deleted. An apply that
    /// removed no UDP backend walked no conntrack map, and observes nothing.
    pub fn record_udp_flow_release(&self, report: &ApplyReport) {
        let Some(elapsed) = report.udp_flow_release_elapsed else {
            return;
        };
        self.conntrack_duration
            .with_label_values(&[IP_FAMILY])
            .observe(elapsed.as_secs_f64());
        self.conntrack_deleted
            .with_label_values(&[IP_FAMILY])
            .inc_by(report.udp_flow_entries_deleted as u64);
    }

    /// Observes one sync.
    pub fn record_sync(&self, sync: &SyncObservations) {
        self.sync_duration
            .with_label_values(&[IP_FAMILY])
            .observe(sync.duration_seconds);
        let by_kind = if sync.partial {
            &self.sync_partial_duration
        } else {
            &self.sync_full_duration
        };
        by_kind
            .with_label_values(&[IP_FAMILY])
            .observe(sync.duration_seconds);
        let latency = self.network_programming.with_label_values(&[IP_FAMILY]);
        for seconds in &sync.network_programming_seconds {
            latency.observe(*seconds);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::model::{AddressFamily, EndpointModel, EndpointPortModel, Protocol};

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + seconds)
    }

    fn slice_change(trigger: Option<u64>) -> InputChanges {
        InputChanges {
            slices_received: 1,
            slice_changes: vec![trigger.map(at)],
            sync_requested: true,
            ..InputChanges::default()
        }
    }

    fn sync(kind: &'static str, finished: u64) -> SyncDone {
        SyncDone {
            kind,
            elapsed: Duration::from_millis(3),
            finished_at: at(finished),
        }
    }

    #[test]
    fn the_sync_duration_buckets_are_kube_proxys_fifteen_doublings_from_a_millisecond() {
        let buckets = sync_duration_buckets();
        assert_eq!(buckets.len(), 15);
        assert_eq!(buckets[0], 0.001);
        assert_eq!(buckets[1], 0.002);
        assert!((buckets[14] - 16.384).abs() < 1e-9, "{buckets:?}");
    }

    #[test]
    fn the_network_programming_buckets_start_at_zero_and_end_at_five_minutes_as_kube_proxys_merge_builds_them(
    ) {
        let buckets = network_programming_buckets();
        // 0, then 2 + 59 + 12 + 7 linear buckets.
        assert_eq!(buckets.len(), 81);
        assert_eq!(&buckets[..5], &[0.0, 0.25, 0.5, 1.0, 2.0]);
        assert_eq!(buckets[61], 59.0);
        assert_eq!(buckets[62], 60.0);
        assert_eq!(buckets[73], 115.0);
        assert_eq!(buckets[74], 120.0);
        assert_eq!(buckets[80], 300.0);
        assert!(buckets.windows(2).all(|pair| pair[0] < pair[1]));
    }

    #[test]
    fn network_programming_latency_runs_from_each_changed_slices_trigger_to_the_end_of_the_sync_that_wrote_it(
    ) {
        let mut changes = KubeProxyChanges::new(at(0));
        changes.received(slice_change(Some(10)), at(10));
        changes.received(slice_change(Some(11)), at(11));
        let observed = changes.synced(&sync("partial", 14));
        assert_eq!(observed.network_programming_seconds, vec![4.0, 3.0]);
        // Measured once: the next sync wrote nothing new.
        let next = changes.synced(&sync("partial", 20));
        assert!(next.network_programming_seconds.is_empty());
    }

    #[test]
    fn a_trigger_from_before_the_agent_started_is_not_measured() {
        let mut changes = KubeProxyChanges::new(at(100));
        changes.received(slice_change(Some(99)), at(101));
        changes.received(slice_change(Some(100)), at(101));
        // The control: a trigger after the start is.
        changes.received(slice_change(Some(101)), at(101));
        let observed = changes.synced(&sync("full", 103));
        assert_eq!(observed.network_programming_seconds, vec![2.0]);
        // Every one of them was a change, measured or not.
        assert_eq!(changes.endpoint_changes_total, 3);
    }

    #[test]
    fn a_removal_or_a_slice_without_a_trigger_counts_as_a_change_but_is_not_measured() {
        let mut changes = KubeProxyChanges::new(at(0));
        changes.received(slice_change(None), at(5));
        assert_eq!(changes.endpoint_changes_pending, 1);
        let observed = changes.synced(&sync("partial", 6));
        assert!(observed.network_programming_seconds.is_empty());
    }

    #[test]
    fn a_trigger_ahead_of_the_nodes_clock_gives_a_negative_latency_as_kube_proxys_time_since_does()
    {
        let mut changes = KubeProxyChanges::new(at(0));
        changes.received(slice_change(Some(30)), at(20));
        let observed = changes.synced(&sync("partial", 28));
        assert_eq!(observed.network_programming_seconds, vec![-2.0]);
    }

    #[test]
    fn pending_changes_count_until_a_successful_sync_and_the_totals_keep_growing() {
        let mut changes = KubeProxyChanges::new(at(0));
        let web = ServiceName::new("default", "web");
        let services = |names: Vec<ServiceName>, received: u64| InputChanges {
            services_received: received,
            services_pending: names,
            sync_requested: true,
            ..InputChanges::default()
        };
        changes.received(services(vec![web.clone()], 1), at(1));
        // The same Service again is still one Service pending.
        changes.received(services(vec![web.clone()], 1), at(2));
        changes.received(slice_change(None), at(2));
        changes.received(slice_change(None), at(2));
        assert_eq!(changes.service_changes_pending(), 1);
        assert_eq!(changes.endpoint_changes_pending, 2);
        changes.synced(&sync("partial", 3));
        assert_eq!(changes.service_changes_pending(), 0);
        assert_eq!(changes.endpoint_changes_pending, 0);
        assert_eq!(changes.service_changes_total, 2);
        assert_eq!(changes.endpoint_changes_total, 2);
        assert_eq!(changes.last_synced, Some(at(3)));
    }

    #[test]
    fn the_last_queued_time_is_that_of_the_last_input_that_left_a_sync_to_do() {
        let mut changes = KubeProxyChanges::new(at(0));
        changes.received(slice_change(Some(1)), at(4));
        assert_eq!(changes.last_queued, Some(at(4)));
        // An input that changed nothing queues no sync.
        let unchanged = InputChanges {
            slices_received: 1,
            ..InputChanges::default()
        };
        changes.received(unchanged, at(9));
        assert_eq!(changes.last_queued, Some(at(4)));
    }

    #[test]
    fn a_partial_sync_is_observed_as_partial_and_full_syncs_and_resyncs_as_full() {
        let mut changes = KubeProxyChanges::new(at(0));
        assert!(changes.synced(&sync("partial", 1)).partial);
        assert!(!changes.synced(&sync("full", 2)).partial);
        assert!(!changes.synced(&sync("resync", 3)).partial);
    }

    fn slice(ready: bool, trigger: Option<u64>) -> EndpointSliceModel {
        EndpointSliceModel {
            slice_name: ServiceName::new("default", "web-1"),
            service: ServiceName::new("default", "web"),
            family: AddressFamily::Ipv4,
            ports: vec![EndpointPortModel {
                name: "http".into(),
                protocol: Protocol::Tcp,
                port: 8080,
            }],
            endpoints: vec![EndpointModel {
                address: "10.244.0.11".parse().expect("an address"),
                ready,
                serving: ready,
                terminating: false,
                node_name: None,
                hints: Default::default(),
            }],
            last_change_trigger_time: trigger.map(at),
        }
    }

    #[test]
    fn a_slice_changes_with_its_endpoints_not_with_its_trigger_time_alone() {
        assert!(!slice_changes_endpoints(
            &slice(true, Some(1)),
            &slice(true, Some(2))
        ));
        assert!(slice_changes_endpoints(
            &slice(true, Some(1)),
            &slice(false, Some(2))
        ));
    }

    /// kube-proxy's metrics as `pkg/proxy/metrics/metrics.go` (v1.33+) declares them, for the
    /// ones the agent serves: name, type, labels (in the order a scrape shows them, by name).
    const KUBE_PROXY_METRICS: [(&str, &str, &[&str]); 15] = [
        (
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "histogram",
            &["ip_family"],
        ),
        (
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "histogram",
            &["ip_family"],
        ),
        (
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "histogram",
            &["ip_family"],
        ),
        (
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "gauge",
            &["ip_family"],
        ),
        (
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "gauge",
            &["ip_family"],
        ),
        (
            "kubeproxy_network_programming_duration_seconds",
            "histogram",
            &["ip_family"],
        ),
        (
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
            "gauge",
            &[],
        ),
        (
            "kubeproxy_sync_proxy_rules_endpoint_changes_total",
            "counter",
            &[],
        ),
        (
            "kubeproxy_sync_proxy_rules_service_changes_pending",
            "gauge",
            &[],
        ),
        (
            "kubeproxy_sync_proxy_rules_service_changes_total",
            "counter",
            &[],
        ),
        (
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            "gauge",
            &["ip_family", "traffic_policy"],
        ),
        ("kubeproxy_proxy_healthz_total", "counter", &["code"]),
        ("kubeproxy_proxy_livez_total", "counter", &["code"]),
        (
            "kubeproxy_conntrack_reconciler_deleted_entries_total",
            "counter",
            &["ip_family"],
        ),
        (
            "kubeproxy_conntrack_reconciler_sync_duration_seconds",
            "histogram",
            &["ip_family"],
        ),
    ];

    /// Every series' type and label names, by metric name, as a scrape shows them.
    pub(crate) fn exposition_types(text: &str) -> BTreeMap<String, String> {
        text.lines()
            .filter_map(|line| line.strip_prefix("# TYPE "))
            .filter_map(|rest| rest.split_once(' '))
            .map(|(name, kind)| (name.to_string(), kind.to_string()))
            .collect()
    }

    pub(crate) fn expected_types() -> BTreeMap<String, String> {
        KUBE_PROXY_METRICS
            .iter()
            .map(|(name, kind, _)| (name.to_string(), kind.to_string()))
            .collect()
    }

    fn encoded(registry: &Registry) -> String {
        let mut text = Vec::new();
        prometheus::Encoder::encode(
            &prometheus::TextEncoder::new(),
            &registry.gather(),
            &mut text,
        )
        .expect("encodes");
        String::from_utf8(text).expect("utf-8")
    }

    #[test]
    fn the_registry_holds_kube_proxys_metrics_with_their_types_labels_and_buckets() {
        let metrics = KubeProxyMetrics::new().expect("registers");
        let mut changes = KubeProxyChanges::new(at(0));
        changes.received(slice_change(Some(1)), at(2));
        metrics.record_sync(&changes.synced(&sync("partial", 3)));
        metrics.record_changes(&changes);
        let text = encoded(&metrics.registry);
        assert_eq!(exposition_types(&text), expected_types());
        for family in metrics.registry.gather() {
            let (_, _, labels) = KUBE_PROXY_METRICS
                .iter()
                .find(|(name, _, _)| *name == family.name())
                .expect("a kube-proxy metric");
            for metric in family.get_metric() {
                let names: Vec<&str> = metric
                    .get_label()
                    .iter()
                    .map(|label| label.name())
                    .collect();
                assert_eq!(&names, labels, "{}", family.name());
            }
        }
        assert!(text.contains(
            "kubeproxy_network_programming_duration_seconds_bucket{ip_family=\"IPv4\",le=\"2\"} 1"
        ));
        assert!(text.contains(
            "kubeproxy_network_programming_duration_seconds_bucket{ip_family=\"IPv4\",le=\"1\"} 0"
        ));
        assert!(text.contains(
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"16.384\"} 1"
        ));
        assert!(text.contains("kubeproxy_sync_proxy_rules_endpoint_changes_total 1"));
        assert!(text.contains(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"} 1800000003"
        ));
        assert!(text.contains("# HELP kubeproxy_sync_proxy_rules_duration_seconds [ALPHA] SyncProxyRules latency in seconds"));
        // Zero until something is counted, as kube-proxy's series read once touched.
        assert!(text.contains("kubeproxy_proxy_healthz_total{code=\"503\"} 0"));
        assert!(text.contains(
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=\"IPv4\",traffic_policy=\"external\"} 0"
        ));
        assert!(text.contains(
            "kubeproxy_conntrack_reconciler_sync_duration_seconds_bucket{ip_family=\"IPv4\",le=\"16.384\"} 0"
        ));
    }

    #[test]
    fn the_no_local_endpoints_gauge_reads_the_counts_of_the_last_successful_sync() {
        let metrics = KubeProxyMetrics::new().expect("registers");
        let series = |policy: &str| {
            format!("kubeproxy_sync_proxy_rules_no_local_endpoints_total{{ip_family=\"IPv4\",traffic_policy=\"{policy}\"}}")
        };
        metrics.record_no_local_endpoints(NoLocalEndpoints {
            internal: 2,
            external: 1,
        });
        let text = encoded(&metrics.registry);
        assert!(
            text.contains(&format!("{} 2", series("internal"))),
            "{text}"
        );
        assert!(
            text.contains(&format!("{} 1", series("external"))),
            "{text}"
        );
        // A gauge: the next sync's counts replace these.
        metrics.record_no_local_endpoints(NoLocalEndpoints::default());
        let text = encoded(&metrics.registry);
        assert!(
            text.contains(&format!("{} 0", series("internal"))),
            "{text}"
        );
        assert!(
            text.contains(&format!("{} 0", series("external"))),
            "{text}"
        );
    }

    #[test]
    fn a_udp_flow_release_is_timed_and_its_deletions_counted_and_an_apply_without_one_is_not() {
        let metrics = KubeProxyMetrics::new().expect("registers");
        let deleted = "kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family=\"IPv4\"}";
        let timed =
            "kubeproxy_conntrack_reconciler_sync_duration_seconds_count{ip_family=\"IPv4\"}";
        // The control: an apply that released nothing observes nothing.
        metrics.record_udp_flow_release(&ApplyReport {
            frontends_written: 3,
            ..ApplyReport::default()
        });
        let text = encoded(&metrics.registry);
        assert!(text.contains(&format!("{deleted} 0")), "{text}");
        assert!(text.contains(&format!("{timed} 0")), "{text}");

        metrics.record_udp_flow_release(&ApplyReport {
            udp_flow_entries_deleted: 4,
            udp_flow_release_elapsed: Some(Duration::from_millis(3)),
            ..ApplyReport::default()
        });
        // A failed release is timed, and deleted nothing.
        metrics.record_udp_flow_release(&ApplyReport {
            udp_flow_releases_pending: true,
            udp_flow_release_elapsed: Some(Duration::from_millis(1)),
            ..ApplyReport::default()
        });
        let text = encoded(&metrics.registry);
        assert!(text.contains(&format!("{deleted} 4")), "{text}");
        assert!(text.contains(&format!("{timed} 2")), "{text}");
        assert!(text.contains(
            "kubeproxy_conntrack_reconciler_sync_duration_seconds_bucket{ip_family=\"IPv4\",le=\"0.002\"} 1"
        ));
    }

    #[test]
    fn healthz_and_livez_answers_are_counted_by_code_and_other_paths_are_not() {
        let metrics = KubeProxyMetrics::new().expect("registers");
        let answers = metrics.health_answers();
        answers.answered("/healthz", 200);
        answers.answered("/healthz?verbose", 200);
        answers.answered("/healthz", 503);
        answers.answered("/livez", 200);
        // kube-proxy's 404s are counted nowhere.
        answers.answered("/metrics", 404);
        answers.answered("/healthzx", 404);
        let text = encoded(&metrics.registry);
        assert!(
            text.contains("kubeproxy_proxy_healthz_total{code=\"200\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("kubeproxy_proxy_healthz_total{code=\"503\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("kubeproxy_proxy_livez_total{code=\"200\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("kubeproxy_proxy_livez_total{code=\"503\"} 0"),
            "{text}"
        );
        assert!(!text.contains("code=\"404\""), "{text}");
    }

    #[test]
    fn the_agents_own_registry_carries_none_of_kube_proxys_metrics() {
        let agent = crate::cluster::metrics::AgentMetrics::new().expect("registers");
        let types = exposition_types(&encoded(&agent.registry));
        // The control: the agent's registry is read at all.
        assert!(types.contains_key("switchyard_agent_program_attach_total"));
        assert!(types.keys().all(|name| !name.starts_with("kubeproxy_")));
    }
}
