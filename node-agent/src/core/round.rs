//! What one round of the core means for the outside, decided here and pure:
//! the metrics' values, the request to the coexistence loop, whether the maps
//! are in sync (readiness, the catch-up priority), and whether and what status
//! to write. The shells only write it out ([`crate::cluster::run`]).

use std::time::{Duration, Instant, SystemTime};

use chrono::{DateTime, Utc};
use switchyard_crds::{Condition, DataplaneMode};

use super::status::{
    compute_status, observable_generation, worth_reporting, CoexistenceReport, SyncReport,
    WrittenStatus,
};
use super::store::StoreChange;
use super::{Input, NodeAgent, TickReport};
use crate::datapath::Datapath;
use crate::follow::Attachment;
use crate::gate::GateStatus;
use crate::kube_proxy::health::LocalServiceHealth;
use crate::kube_proxy::metrics::{slice_changes_endpoints, InputChanges};
use crate::model::EndpointSliceModel;

/// What the agent tells the coexistence loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoexistenceRequest {
    /// The `metadata.generation` of the DataplaneNode this request follows (`None`:
    /// none). The loop reports it back once a round has acted on it, and the status
    /// reports that generation as observed only then ([`observable_generation`]).
    pub spec_generation: Option<i64>,
    /// `Some(generation)` while the DataplaneNode says `iptablesCleanup: true`.
    pub cleanup_generation: Option<i64>,
    /// The spec lets the agent serve kube-proxy's health ports (its healthz and the
    /// `healthCheckNodePort`s): `mode: Ebpf` with `iptablesCleanup: true`, which the
    /// operator sets only once kube-proxy is gone from the node and withdraws first
    /// when it brings kube-proxy back. Without it the loop closes them before it
    /// does anything else, so kube-proxy finds its ports free when it returns.
    pub health_ports_permitted: bool,
    /// Programs attached (or draining): the agent's chains must come first.
    pub serving_from_ebpf: bool,
    /// Some Service needs the agent's masquerade rule (or the agent installed
    /// it): without, the agent installs no chain (nothing it would hold is
    /// marked, and the rules would turn on netfilter's connection tracking).
    pub netfilter_chains_wanted: bool,
    /// The maps are in sync (what the replacement healthz reports).
    pub healthy: bool,
    pub last_sync: SystemTime,
    /// The `healthCheckNodePort` answers.
    pub services: Vec<LocalServiceHealth>,
}

/// What a round asks of the shell.
#[derive(Clone, Debug, PartialEq)]
pub struct RoundReport {
    /// An apply ran: its kind (`partial`, `full`, `resync`) and how long it took.
    pub sync: Option<(&'static str, Duration)>,
    pub frontends: usize,
    pub backend_slots: usize,
    /// How long the start-of-day gate stayed closed (so far, while closed).
    pub gate_wait: Duration,
    /// The gate is open: `/readyz` answers ready.
    pub ready: bool,
    /// The last sync succeeded (the catch-up priority ends with it).
    pub synced: bool,
    pub kube_proxy_rules: Option<usize>,
    /// Map entries the last sync could not write, by Service.
    pub failed_entries: std::collections::BTreeMap<String, usize>,
    pub coexistence: CoexistenceRequest,
    /// The status to hand to the writer, when it must be written.
    pub status: Option<WrittenStatus>,
}

/// The status as last handed to the writer, kept between rounds.
#[derive(Clone, Debug, Default)]
pub struct StatusTracker {
    /// The disruption signals the shell's sampler last published (`crate::disruption`): the
    /// next status carries them.
    pub disruption: Option<switchyard_crds::DisruptionReport>,
    /// The conditions last handed over (their transition times carry on).
    last_conditions: Option<Vec<Condition>>,
    last_written: WrittenStatus,
}

impl<D: Datapath> NodeAgent<D> {
    /// What the coexistence loop must do for this state of the agent.
    pub fn coexistence_request(
        &self,
        synced: bool,
        last_sync: Option<DateTime<Utc>>,
    ) -> CoexistenceRequest {
        let view = self.dataplane_node();
        CoexistenceRequest {
            spec_generation: view.and_then(|view| view.generation),
            health_ports_permitted: view.is_some_and(|view| {
                view.spec.mode == DataplaneMode::Ebpf && view.spec.iptables_cleanup
            }),
            cleanup_generation: self
                .dataplane_node()
                .filter(|view| view.spec.iptables_cleanup)
                .map(|view| view.generation.unwrap_or(0)),
            serving_from_ebpf: self.attachment() != Attachment::Detached,
            netfilter_chains_wanted: self.netfilter_chains_wanted(),
            healthy: synced,
            services: self.local_service_health(),
            last_sync: last_sync
                .map(SystemTime::from)
                .unwrap_or(SystemTime::UNIX_EPOCH),
        }
    }

    /// The round's report: `tick` is what the round's tick did, `started` when
    /// the agent started, `coexistence` the coexistence loop's last report.
    /// The status is handed over only with a DataplaneNode to write it to,
    /// only when it changed (or the object is new), and not while the gate
    /// waits within its timeout.
    pub fn round_report(
        &self,
        tick: &TickReport,
        now: Instant,
        wall: DateTime<Utc>,
        started: Instant,
        coexistence: &CoexistenceReport,
        status: &mut StatusTracker,
    ) -> RoundReport {
        let mut inputs = self.status_inputs(now, coexistence);
        inputs.disruption = status.disruption.clone();
        let reported_before = self.dataplane_node().and_then(|view| {
            let written = status
                .last_written
                .status
                .as_ref()
                .filter(|_| status.last_written.object_uid == view.uid);
            written
                .or(view.status.as_ref())
                .and_then(|reported| reported.observed_generation)
        });
        inputs.acted_generation = observable_generation(
            inputs.acted_generation,
            coexistence.progress,
            reported_before,
        );
        let synced = inputs.sync == SyncReport::Synced;
        let gate_wait = match &inputs.gate {
            GateStatus::Open { waited } => *waited,
            _ => now.saturating_duration_since(started),
        };
        let status_write = self
            .dataplane_node()
            .filter(|_| worth_reporting(&inputs.gate))
            .and_then(|view| {
                let previous = status.last_conditions.clone().unwrap_or_else(|| {
                    view.status
                        .as_ref()
                        .map(|status| status.conditions.clone())
                        .unwrap_or_default()
                });
                let computed = compute_status(&inputs, &previous, wall);
                if !status
                    .last_written
                    .needs_write(view.uid.as_deref(), &computed)
                {
                    return None;
                }
                status.last_conditions = Some(computed.conditions.clone());
                status.last_written = WrittenStatus {
                    object_uid: view.uid.clone(),
                    status: Some(computed),
                };
                Some(status.last_written.clone())
            });
        RoundReport {
            sync: tick
                .sync
                .map(|(outcome, elapsed)| (outcome.kind.name(), elapsed)),
            frontends: self.services_programmed(),
            backend_slots: self.backend_slots_programmed(),
            gate_wait,
            ready: self.gate_is_open(),
            synced,
            kube_proxy_rules: coexistence.kube_proxy_rules,
            failed_entries: self.failed_entries().clone(),
            coexistence: self.coexistence_request(synced, inputs.last_sync_time),
            status: status_write,
        }
    }
}

impl<D: Datapath> NodeAgent<D> {
    /// Takes `input` as [`Self::receive`] does, and says what it changed as kube-proxy's
    /// change trackers count their informer events (its metrics, [`InputChanges`]): every
    /// object received, the Services left differing from the maps, each slice whose
    /// endpoints or ports changed (with its trigger time), whether a sync is now due.
    pub fn receive_counting_changes(&mut self, input: Input, now: Instant) -> InputChanges {
        let mut changes = InputChanges::default();
        let mut services_named = Vec::new();
        let slices_before = self.inputs.slice_count();
        // Removals are known by the count of slices after the input.
        let mut slices_expected_after = slices_before;
        match &input {
            Input::Services(change) => {
                services_named = match change {
                    StoreChange::Replace(entries) => entries.keys().cloned().collect(),
                    StoreChange::Upsert(name, _) | StoreChange::Remove(name) => vec![name.clone()],
                };
                changes.services_received = services_named.len() as u64;
            }
            Input::EndpointSlices(change) => {
                let listed: Vec<&EndpointSliceModel> = match change {
                    StoreChange::Replace(slices) => slices.values().collect(),
                    StoreChange::Upsert(_, slice) => vec![slice],
                    StoreChange::Remove(_) => Vec::new(),
                };
                changes.slices_received = match change {
                    StoreChange::Replace(slices) => slices.len() as u64,
                    StoreChange::Upsert(..) | StoreChange::Remove(_) => 1,
                };
                for slice in listed {
                    let current = self
                        .inputs
                        .slices_of(&slice.service)
                        .into_iter()
                        .find(|current| current.slice_name == slice.slice_name);
                    match current {
                        Some(current) if !slice_changes_endpoints(current, slice) => {}
                        Some(_) => changes.slice_changes.push(slice.last_change_trigger_time),
                        None => {
                            slices_expected_after += 1;
                            changes.slice_changes.push(slice.last_change_trigger_time);
                        }
                    }
                }
                if let StoreChange::Upsert(..) = change {
                    // An upsert replaces its own slice: the count after is the count before.
                    slices_expected_after = slices_before;
                }
            }
            Input::Node(_) | Input::DataplaneNode(_) | Input::Host(_) => {}
        }
        let node_before = self.inputs.node().cloned();
        let slice_input = matches!(input, Input::EndpointSlices(_));
        let slice_relist = matches!(input, Input::EndpointSlices(StoreChange::Replace(_)));
        self.receive(input, now);
        if slice_input {
            // Each slice the input removed is a change with no trigger time to measure (a
            // relist's removals are deletes kube-proxy's informer would have delivered).
            let removed = slices_expected_after.saturating_sub(self.inputs.slice_count());
            changes
                .slice_changes
                .extend(std::iter::repeat_n(None, removed));
            if slice_relist {
                changes.slices_received += removed as u64;
            }
        }
        let dirty = self.inputs.dirty_services();
        changes.services_pending = services_named
            .into_iter()
            .filter(|name| dirty.contains(name))
            .collect();
        changes.sync_requested = !changes.services_pending.is_empty()
            || !changes.slice_changes.is_empty()
            || self.inputs.node() != node_before.as_ref();
        changes
    }
}

impl super::AgentSettings {
    /// Marks a round as started for liveness; it ends when the guard drops (the wait for the
    /// next input is outside every round, so an idle agent stays live).
    pub(crate) fn round_step(&self) -> Option<switchyard_telemetry::Step> {
        self.round_heartbeat
            .as_ref()
            .map(switchyard_telemetry::Heartbeat::step)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;
    use crate::core::health::ServiceEntry;
    use crate::core::AgentSettings;
    use crate::datapath::fake::FakeDatapath;
    use crate::datapath::{DatapathOptions, PodConnectBalancing, SocketHookCgroup};
    use crate::interfaces::Globs;
    use crate::model::{endpoint_slice_from_v1, service_from_v1, EndpointSliceModel, ServiceName};

    fn agent() -> NodeAgent<FakeDatapath> {
        let datapath = DatapathOptions {
            pin_directory: PathBuf::from("/nonexistent"),
            map_sizes: Default::default(),
            pod_interfaces: Globs::parse("veth*"),
            host_interfaces: None,
            masquerade_mark: 0x4000,
            manage_masquerade_rule: false,
            socket_hook_cgroup: SocketHookCgroup::None,
            pod_connect_balancing: PodConnectBalancing::Tcp,
            served_families: Default::default(),
        };
        let settings = AgentSettings::new(
            "node-1".into(),
            &datapath,
            Duration::from_secs(1),
            Duration::from_secs(30),
        );
        NodeAgent::start(settings, FakeDatapath::default(), Instant::now()).expect("starts")
    }

    /// The `web-1` slice of `web`: one endpoint, ready or not, with a trigger time.
    fn slice(name: &str, ready: bool, trigger: &str) -> EndpointSliceModel {
        let object: k8s_openapi::api::discovery::v1::EndpointSlice =
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "default",
                             "labels": {"kubernetes.io/service-name": "web"},
                             "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": trigger}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                "endpoints": [{"addresses": ["10.244.0.11"], "conditions": {"ready": ready}}]
            }))
            .expect("a valid EndpointSlice");
        endpoint_slice_from_v1(&object)
            .expect("converts")
            .expect("is used")
    }

    fn upsert(slice: EndpointSliceModel) -> Input {
        Input::EndpointSlices(StoreChange::Upsert(slice.slice_name.clone(), slice))
    }

    fn trigger(text: &str) -> Option<SystemTime> {
        slice("probe", true, text).last_change_trigger_time
    }

    const FIRST: &str = "2026-11-28T12:00:00Z";
    const SECOND: &str = "2026-11-28T12:00:05Z";

    #[test]
    fn a_slice_is_a_change_when_its_endpoints_change_and_not_when_only_its_trigger_time_does() {
        let mut agent = agent();
        let now = Instant::now();
        let added = agent.receive_counting_changes(upsert(slice("web-1", true, FIRST)), now);
        assert_eq!(added.slices_received, 1);
        assert_eq!(added.slice_changes, vec![trigger(FIRST)]);
        assert!(added.sync_requested);
        // The same slice again, and again with only a new trigger time: received, no change.
        for again in [slice("web-1", true, FIRST), slice("web-1", true, SECOND)] {
            let unchanged = agent.receive_counting_changes(upsert(again), now);
            assert_eq!(unchanged.slices_received, 1);
            assert!(unchanged.slice_changes.is_empty());
            assert!(!unchanged.sync_requested);
        }
        let not_ready = agent.receive_counting_changes(upsert(slice("web-1", false, SECOND)), now);
        assert_eq!(not_ready.slice_changes, vec![trigger(SECOND)]);
    }

    #[test]
    fn a_removed_slice_is_a_change_without_a_trigger_and_an_unknown_one_is_none() {
        let mut agent = agent();
        let now = Instant::now();
        agent.receive_counting_changes(upsert(slice("web-1", true, FIRST)), now);
        let name = ServiceName::new("default", "web-1");
        let removed = agent.receive_counting_changes(
            Input::EndpointSlices(StoreChange::Remove(name.clone())),
            now,
        );
        assert_eq!(removed.slices_received, 1);
        assert_eq!(removed.slice_changes, vec![None]);
        let again =
            agent.receive_counting_changes(Input::EndpointSlices(StoreChange::Remove(name)), now);
        assert_eq!(again.slices_received, 1);
        assert!(again.slice_changes.is_empty());
    }

    #[test]
    fn a_relist_counts_every_slice_it_lists_or_removes_and_changes_only_for_those_that_differ() {
        let mut agent = agent();
        let now = Instant::now();
        agent.receive_counting_changes(upsert(slice("web-1", true, FIRST)), now);
        agent.receive_counting_changes(upsert(slice("web-2", true, FIRST)), now);
        // web-1 unchanged, web-2 gone, web-3 new.
        let listed: BTreeMap<ServiceName, EndpointSliceModel> =
            [slice("web-1", true, FIRST), slice("web-3", true, SECOND)]
                .into_iter()
                .map(|slice| (slice.slice_name.clone(), slice))
                .collect();
        let relist = agent
            .receive_counting_changes(Input::EndpointSlices(StoreChange::Replace(listed)), now);
        assert_eq!(relist.slices_received, 3);
        assert_eq!(relist.slice_changes, vec![trigger(SECOND), None]);
    }

    #[test]
    fn a_service_event_leaves_its_service_pending_only_when_it_changed_the_service() {
        let mut agent = agent();
        let now = Instant::now();
        let service: k8s_openapi::api::core::v1::Service =
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"clusterIP": "10.96.0.10", "ports": [{"name": "http", "port": 80}]}
            }))
            .expect("a valid Service");
        let model = service_from_v1(&service)
            .expect("converts")
            .expect("is used");
        let name = model.name.clone();
        let entry = || {
            Input::Services(StoreChange::Upsert(
                name.clone(),
                ServiceEntry::from(model.clone()),
            ))
        };
        let added = agent.receive_counting_changes(entry(), now);
        assert_eq!(added.services_received, 1);
        assert_eq!(added.services_pending, vec![name.clone()]);
        assert!(added.sync_requested);
        // Removing a Service that was never there changes nothing.
        let unknown = ServiceName::new("default", "gone");
        let removed =
            agent.receive_counting_changes(Input::Services(StoreChange::Remove(unknown)), now);
        assert_eq!(removed.services_received, 1);
        assert!(removed.services_pending.is_empty());
        assert!(!removed.sync_requested);
    }
}
