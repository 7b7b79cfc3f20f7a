//! The node agent's core, one state machine for both modes: inputs go in
//! ([`Input`]: from the API watchers in cluster mode, from the manifest poller
//! in standalone mode, and from the host's netlink watcher in both),
//! [`NodeAgent::tick`] syncs the maps and follows the DataplaneNode's mode, and
//! [`NodeAgent::status_inputs`] says what to report.
//!
//! Time is passed in, and the datapath is a trait, so tests drive it with an
//! in-memory fake and no sleeping.
//!
//! Layout: `node`, `store`, `health`, `status`: pure pieces; `schedule`: when the
//! next tick is wanted (and the retry of failed UDP flow releases); `tests`: the core with fakes.

pub mod health;
pub mod node;
pub mod round;
mod schedule;
pub mod status;
pub mod store;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use switchyard_common::{DATAPATH_MODE_ACTIVE, DATAPATH_MODE_DRAINING};
use switchyard_crds::{DataplaneMode, DataplaneNodeSpec, DataplaneNodeStatus};
use switchyard_model::error::chain;
use switchyard_model::follow::{restored_attachment, Mode, ModeSpec};

use self::health::{local_endpoint_count, ServiceEntry};
use self::node::{node_update_is_relevant, NodeFacts};
use self::status::{AttachmentReport, CoexistenceReport, DrainEnd, StatusInputs, SyncReport};
use self::store::StoreChange;
use crate::datapath::{
    datapath_config, Datapath, DatapathOptions, PodConnectBalancing, SocketHookCgroup,
};
use crate::desired::{node_port_addresses as node_ports, NodeView};
use crate::follow::{
    detach_interfaces, follow_mode, instruction, interfaces_to_detach, Attachment, Instruction,
    ModeAction,
};
use crate::gate::{Gate, GateInput, GateStatus};
use crate::interfaces::{self, Globs, InterfaceRole, IpInterface};
use crate::kube_proxy::health::LocalServiceHealth;
use crate::maps::ServiceMaps;
use crate::model::{EndpointSliceModel, ServiceName};
use crate::sync::coalesce::{Coalescer, Next};
use crate::sync::inputs::{SyncInputs, SyncKind, SyncOutcome};
use crate::sync::Syncer;
use crate::Error;

/// This node's DataplaneNode as the agent uses it.
#[derive(Clone, Debug, PartialEq)]
pub struct DataplaneNodeView {
    /// The object's UID: a DataplaneNode recreated under the same name is a new
    /// object that has not been given the agent's status yet.
    pub uid: Option<String>,
    pub generation: Option<i64>,
    pub spec: DataplaneNodeSpec,
    /// The status as read back (its conditions' transition times are kept).
    pub status: Option<DataplaneNodeStatus>,
}

/// What the core follows of a DataplaneNode's spec.
pub fn mode_spec(spec: &DataplaneNodeSpec) -> ModeSpec {
    ModeSpec {
        mode: match spec.mode {
            DataplaneMode::Ebpf => Mode::Ebpf,
            DataplaneMode::KubeProxy => Mode::KubeProxy,
        },
        drain_timeout_seconds: spec.drain_timeout_seconds,
    }
}

/// The CRD's name of a mode (what the status reports).
pub fn crd_mode(mode: Mode) -> DataplaneMode {
    match mode {
        Mode::Ebpf => DataplaneMode::Ebpf,
        Mode::KubeProxy => DataplaneMode::KubeProxy,
    }
}

/// Logs `error` (with its causes) unless it is the one logged last time: a
/// problem that lasts is logged once, and again only when it changes.
pub(crate) fn report_once(last: &mut Option<String>, error: &Error, what: &str) {
    let message = chain(error);
    if last.as_deref() != Some(message.as_str()) {
        tracing::error!(error = %message, "{what}");
        *last = Some(message);
    }
}

/// One input from the cluster or the host.
// The DataplaneNode's status carries the disruption windows (a few hundred bytes): an input is
// moved once from its watcher to the core, at the rate of API events, so its size costs nothing
// a box would save.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    Services(StoreChange<ServiceEntry>),
    EndpointSlices(StoreChange<EndpointSliceModel>),
    /// The Node (every update, relevant or not: the agent decides).
    Node(NodeFacts),
    /// The answer whether this node's DataplaneNode exists, and its content.
    DataplaneNode(Option<DataplaneNodeView>),
    /// The host's interfaces and addresses (after a netlink notification).
    Host(Vec<IpInterface>),
}

#[derive(Clone, Debug)]
pub struct AgentSettings {
    pub node_name: String,
    pub pod_interfaces: Globs,
    /// `None`: every non-loopback interface that is not a pod interface.
    pub host_interfaces: Option<Globs>,
    /// Where NodePorts are served (`--node-port-addresses`,
    /// `--localhost-node-ports`, standalone's `--node-ip`).
    pub node_ports: node_ports::NodePortSettings,
    pub min_sync_period: Duration,
    pub gate_timeout: Duration,
    pub masquerade_mark: u32,
    /// Install the agent's masquerade rule (off in tests without iptables).
    pub manage_masquerade_rule: bool,
    pub socket_hooks: bool,
    pub pod_connect_balancing: PodConnectBalancing,
    /// The address families whose Services the maps hold (`--served-families`).
    pub served_families: crate::model::ServedFamilies,
    pub agent_version: String,
    pub agent_revision: Option<String>,
    /// How often a full sync re-reads the maps and recomputes every Service
    /// (the safety net under the partial syncs).
    pub full_resync_period: Duration,
    /// Liveness of the rounds: every [`NodeAgent::tick`] is one step.
    pub round_heartbeat: Option<switchyard_telemetry::Heartbeat>,
}

impl AgentSettings {
    /// The settings of this node's core: its name, its datapath, how often
    /// it may apply, how long the gate waits before it reports.
    pub fn new(
        node_name: String,
        datapath: &DatapathOptions,
        min_sync_period: Duration,
        gate_timeout: Duration,
    ) -> Self {
        Self {
            node_name,
            pod_interfaces: datapath.pod_interfaces.clone(),
            host_interfaces: datapath.host_interfaces.clone(),
            node_ports: node_ports::NodePortSettings::default(),
            min_sync_period,
            gate_timeout,
            masquerade_mark: datapath.masquerade_mark,
            manage_masquerade_rule: datapath.manage_masquerade_rule,
            socket_hooks: datapath.socket_hook_cgroup != SocketHookCgroup::None,
            pod_connect_balancing: datapath.pod_connect_balancing,
            served_families: datapath.served_families,
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            agent_revision: None,
            full_resync_period: DEFAULT_FULL_RESYNC_PERIOD,
            round_heartbeat: None,
        }
    }
}

/// Default of [`AgentSettings::full_resync_period`]. A resync of 10,000
/// Services costs a few hundred milliseconds of one core; changes in between
/// are partial syncs of a fraction of a millisecond.
pub const DEFAULT_FULL_RESYNC_PERIOD: Duration = Duration::from_secs(300);

/// Counts for the metrics, since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AgentCounts {
    pub node_updates_ignored: u64,
    /// Map writes and deletes (entries and the config).
    pub map_operations: u64,
    /// Attaches that changed the kernel (a link created or its program replaced).
    pub program_attaches: u64,
    pub syncs: u64,
    /// Syncs that recomputed only the changed Services.
    pub partial_syncs: u64,
    /// Full syncs (the first, after a failure, after the node's view changed),
    /// periodic resyncs not included.
    pub full_syncs: u64,
    /// Periodic full resyncs (re-reading the maps first).
    pub resyncs: u64,
    /// Periodic full resyncs that found the maps differing from the desired
    /// state and wrote something (should stay 0).
    pub resync_corrections: u64,
}

/// What one tick did, for metrics and logs.
#[derive(Clone, Debug, Default)]
pub struct TickReport {
    /// An apply ran: what it did and how long it took.
    pub sync: Option<(SyncOutcome, Duration)>,
    /// The gate opened in this tick, after waiting this long.
    pub gate_opened_after: Option<Duration>,
}

pub struct NodeAgent<D: Datapath> {
    settings: AgentSettings,
    pub datapath: D,
    syncer: Syncer,
    gate: Gate,
    coalescer: Coalescer,
    /// Services, EndpointSlices and the node's view, with what changed.
    inputs: SyncInputs,
    services_listed: bool,
    slices_listed: bool,
    /// `healthCheckNodePort`s of the Services that have one.
    health_check_ports: BTreeMap<ServiceName, u16>,
    /// When the last full sync started; the next is due a resync period later.
    last_full_sync: Option<Instant>,
    resync_wanted: bool,
    /// When the first input not yet synced was received (logged with the sync,
    /// so a slow change shows whether it waited in the agent or before it).
    pending_since: Option<Instant>,
    node: Option<NodeFacts>,
    host_addresses: Option<Vec<IpAddr>>,
    roles: BTreeMap<String, (u32, InterfaceRole)>,
    /// `None` until the first answer; `Some(None)`: no DataplaneNode.
    dataplane_node: Option<Option<DataplaneNodeView>>,
    /// The spec of the last DataplaneNode seen, kept when it disappears.
    last_seen_spec: Option<ModeSpec>,
    attachment: Attachment,
    /// Interfaces with programs, by name, with the index they had.
    attached: BTreeMap<String, u32>,
    /// While `Detaching`: the interfaces whose detach failed, retried every round.
    detach_left: BTreeSet<String>,
    socket_hooks_attached: bool,
    /// The last failure to attach the socket hooks, logged once (they are
    /// retried every round).
    socket_hooks_error: Option<String>,
    /// The masquerade rule was installed by this process (it stays while the
    /// node serves from eBPF; the coexistence loop removes it when it leaves).
    masquerade_rule_installed: bool,
    /// The last failure to install it, logged once.
    masquerade_error: Option<String>,
    attach_error: Option<String>,
    sync_report: SyncReport,
    last_sync_time: Option<DateTime<Utc>>,
    acted_generation: Option<i64>,
    last_drain: Option<DrainEnd>,
    live_flows: Option<usize>,
    live_flows_read_at: Option<Instant>,
    gate_was_open: bool,
    /// Map entries the last sync could not write, by Service ("" for entries
    /// of no desired Service); empty after a sync that wrote everything.
    failed_entries: BTreeMap<String, usize>,
    udp_release_retry: schedule::UdpReleaseRetry,
    pub counts: AgentCounts,
}

impl<D: Datapath> NodeAgent<D> {
    /// Restores the map state (writing nothing) and finds out whether a previous
    /// process left programs attached.
    pub fn start(settings: AgentSettings, mut datapath: D, now: Instant) -> Result<Self, Error> {
        let syncer = Syncer::restore(datapath.maps())?;
        let mut gate = Gate::new(now, settings.gate_timeout);
        gate.receive(GateInput::RestoredMaps, now);
        let attached = !datapath.attached_interfaces()?.is_empty();
        let config_mode = datapath.maps().config()?.map(|config| config.mode);
        let attachment = restored_attachment(attached, config_mode, now);
        tracing::info!(
            frontends = syncer.current().frontends.len(),
            backend_slots = syncer.current().backend_slots.len(),
            ?attachment,
            "restored the pinned maps"
        );
        let served_families = settings.served_families;
        Ok(Self {
            coalescer: Coalescer::new(settings.min_sync_period),
            settings,
            datapath,
            syncer,
            gate,
            inputs: SyncInputs::serving(served_families),
            services_listed: false,
            slices_listed: false,
            health_check_ports: BTreeMap::new(),
            last_full_sync: None,
            resync_wanted: false,
            pending_since: None,
            node: None,
            host_addresses: None,
            roles: BTreeMap::new(),
            dataplane_node: None,
            last_seen_spec: None,
            attachment,
            attached: BTreeMap::new(),
            detach_left: BTreeSet::new(),
            socket_hooks_attached: false,
            socket_hooks_error: None,
            masquerade_rule_installed: false,
            masquerade_error: None,
            attach_error: None,
            sync_report: SyncReport::NotYet,
            last_sync_time: None,
            acted_generation: None,
            last_drain: None,
            live_flows: None,
            live_flows_read_at: None,
            gate_was_open: false,
            failed_entries: BTreeMap::new(),
            udp_release_retry: Default::default(),
            counts: AgentCounts::default(),
        })
    }

    pub fn gate_status(&self, now: Instant) -> GateStatus {
        self.gate.status(now)
    }

    /// Map entries the last sync could not write, by Service.
    pub fn failed_entries(&self) -> &BTreeMap<String, usize> {
        &self.failed_entries
    }

    /// Whether this process has synced the maps fully yet.
    pub fn has_synced(&self) -> bool {
        self.last_full_sync.is_some()
    }

    pub fn gate_is_open(&self) -> bool {
        self.gate.is_open()
    }

    pub fn services_programmed(&self) -> usize {
        self.syncer.current().frontends.len()
    }

    pub fn backend_slots_programmed(&self) -> usize {
        self.syncer.current().backend_slots.len()
    }

    pub fn attachment(&self) -> Attachment {
        self.attachment
    }

    /// The DataplaneNode as last seen (`None`: not known yet or absent).
    pub fn dataplane_node(&self) -> Option<&DataplaneNodeView> {
        self.dataplane_node.as_ref().and_then(Option::as_ref)
    }

    /// What the agent follows: the DataplaneNode's spec; when it disappeared,
    /// its last spec; without one ever, the attachment as it is (`KubeProxy`
    /// when nothing is attached). See [`instruction`].
    pub fn instruction(&self) -> Instruction {
        instruction(
            self.dataplane_node()
                .map(|view| mode_spec(&view.spec))
                .as_ref(),
            self.last_seen_spec.as_ref(),
            self.attachment,
        )
    }

    /// The mode followed (see [`Self::instruction`]).
    pub fn mode(&self) -> DataplaneMode {
        crd_mode(self.instruction().mode())
    }

    pub fn receive(&mut self, input: Input, now: Instant) {
        let was_pending = self.coalescer.is_pending();
        self.receive_input(input, now);
        if !was_pending && self.coalescer.is_pending() && self.pending_since.is_none() {
            self.pending_since = Some(now);
        }
    }

    fn receive_input(&mut self, input: Input, now: Instant) {
        match input {
            Input::Services(change) => {
                if self.apply_services(change) {
                    self.coalescer.changed();
                }
                if self.services_listed {
                    self.gate.receive(GateInput::Services, now);
                }
            }
            Input::EndpointSlices(change) => {
                let changed = match change {
                    StoreChange::Replace(slices) => {
                        self.slices_listed = true;
                        self.inputs.replace_slices(slices.into_values())
                    }
                    StoreChange::Upsert(_, slice) => self.inputs.upsert_slice(slice),
                    StoreChange::Remove(name) => self.inputs.remove_slice(&name),
                };
                if changed {
                    self.coalescer.changed();
                }
                if self.slices_listed {
                    self.gate.receive(GateInput::EndpointSlices, now);
                }
            }
            Input::Node(facts) => {
                self.gate.receive(GateInput::Node, now);
                if node_update_is_relevant(self.node.as_ref(), &facts) {
                    tracing::info!(addresses = ?facts.addresses, zone = ?facts.zone, "Node addresses and zone");
                    self.node = Some(facts);
                    self.update_node_view();
                } else {
                    self.counts.node_updates_ignored += 1;
                }
            }
            Input::DataplaneNode(view) => {
                self.gate.receive(GateInput::DataplaneNode, now);
                let spec_changed = self.dataplane_node().map(|old| (&old.spec, old.generation))
                    != view.as_ref().map(|new| (&new.spec, new.generation));
                if spec_changed {
                    tracing::info!(spec = ?view.as_ref().map(|view| &view.spec), "DataplaneNode");
                }
                let first_answer = self.dataplane_node.is_none();
                if let Some(view) = &view {
                    self.last_seen_spec = Some(mode_spec(&view.spec));
                }
                self.dataplane_node = Some(view);
                // No status can be written without the object, so the log is
                // where this shows until the operator (re)creates it.
                let gone = spec_changed && self.last_seen_spec.is_some();
                let attached_before = first_answer && self.attachment != Attachment::Detached;
                if self.dataplane_node().is_none() && (gone || attached_before) {
                    tracing::warn!(
                        instruction = ?self.instruction(),
                        attachment = ?self.attachment,
                        "no DataplaneNode (deleted, or garbage-collected with its Node); keeping the \
                         programs as they are, following the last spec seen, until the operator recreates it"
                    );
                }
            }
            Input::Host(interfaces) => {
                let pods = &self.settings.pod_interfaces;
                let hosts = self.settings.host_interfaces.as_ref();
                let addresses = interfaces::local_addresses(&interfaces);
                self.roles = interfaces::interface_roles(&interfaces, pods, hosts);
                if self.host_addresses.as_ref() != Some(&addresses) {
                    tracing::info!(?addresses, "host addresses");
                    self.host_addresses = Some(addresses);
                    self.update_node_view();
                }
                self.gate.receive(GateInput::HostAddresses, now);
            }
        }
    }

    /// Services change the desired state through their model; the health check
    /// port only changes what the replacement health servers answer.
    fn apply_services(&mut self, change: StoreChange<ServiceEntry>) -> bool {
        match change {
            StoreChange::Replace(entries) => {
                self.services_listed = true;
                self.health_check_ports = entries
                    .iter()
                    .filter_map(|(name, entry)| Some((name.clone(), entry.health_check_node_port?)))
                    .collect();
                self.inputs
                    .replace_services(entries.into_values().map(|entry| entry.model))
            }
            StoreChange::Upsert(name, entry) => {
                match entry.health_check_node_port {
                    Some(port) => self.health_check_ports.insert(name, port),
                    None => self.health_check_ports.remove(&name),
                };
                self.inputs.upsert_service(entry.model)
            }
            StoreChange::Remove(name) => {
                self.health_check_ports.remove(&name);
                self.inputs.remove_service(&name)
            }
        }
    }

    /// NodePorts are served on the addresses `nodePortAddresses` selects of the
    /// host's and the Node's; a change is a full sync (NodePort frontends move).
    fn update_node_view(&mut self) {
        let (Some(host), Some(node)) = (&self.host_addresses, &self.node) else {
            return;
        };
        let addresses =
            node_ports::served_addresses(&self.settings.node_ports, host, &node.addresses);
        let view = NodeView {
            name: self.settings.node_name.clone(),
            addresses,
            zone: node.zone.clone(),
        };
        if self.inputs.set_node(view) {
            self.coalescer.changed();
        }
    }

    fn sync(&mut self, now: Instant, wall: DateTime<Utc>) -> Option<(SyncOutcome, Duration)> {
        let gate_open = self.gate.open()?;
        // The periodic resync runs when due, outside the minimum sync period:
        // it is rare, and counted as an apply it would hold back a change right
        // behind it by up to a period (measured: 800 ms). A failed one is
        // retried through the coalescer, no sooner than a period later.
        let resync_due = !self.resync_wanted && self.resync_due_at().is_some_and(|due| now >= due);
        self.start_udp_release_retry_if_due(now);
        if !resync_due && self.coalescer.poll(now) != Next::Apply {
            return None;
        }
        let received_at = self.pending_since.take();
        let resync = resync_due || self.resync_wanted;
        let started = Instant::now();
        let result = self
            .inputs
            .sync(gate_open, &mut self.syncer, self.datapath.maps(), resync);
        let elapsed = started.elapsed();
        match result {
            Ok(None) => {
                // The node's view is not complete yet (cannot happen with the
                // gate open); nothing was written. The next change retries.
                None
            }
            Ok(Some(outcome)) => {
                self.counts.syncs += 1;
                self.failed_entries.clear();
                self.after_udp_flow_release(&outcome.report, now);
                let operations = outcome.report.operation_count();
                self.counts.map_operations += operations as u64;
                match outcome.kind {
                    SyncKind::Partial { .. } => self.counts.partial_syncs += 1,
                    SyncKind::Full | SyncKind::Resync => {
                        if outcome.kind == SyncKind::Full {
                            self.counts.full_syncs += 1;
                        } else {
                            self.counts.resyncs += 1;
                        }
                        self.last_full_sync = Some(now);
                        self.resync_wanted = false;
                    }
                }
                if outcome.kind == SyncKind::Resync && operations > 0 {
                    self.counts.resync_corrections += 1;
                    tracing::warn!(
                        operations,
                        "the periodic full resync found the maps differing from the desired state and corrected them"
                    );
                }
                let services = match outcome.kind {
                    SyncKind::Partial { services } => services,
                    SyncKind::Full | SyncKind::Resync => self.inputs.service_count(),
                };
                tracing::info!(
                    kind = outcome.kind.name(),
                    services,
                    frontends = self.syncer.current().frontends.len(),
                    operations,
                    elapsed_ms = elapsed.as_secs_f64() * 1000.0,
                    since_received_ms = received_at.map(|at| {
                        Instant::now().saturating_duration_since(at).as_secs_f64() * 1000.0
                    }),
                    "synced the maps"
                );
                // A resync that found nothing to correct changes nothing worth
                // reporting: the status (and its write) stays as it was.
                let clean_resync = outcome.kind == SyncKind::Resync
                    && operations == 0
                    && self.sync_report == SyncReport::Synced;
                if !clean_resync {
                    self.sync_report = SyncReport::Synced;
                    self.last_sync_time = Some(wall);
                }
                Some((outcome, elapsed))
            }
            Err(error) => {
                self.counts.syncs += 1;
                self.pending_since = received_at;
                tracing::error!(error = %chain(&error), "sync failed; every other entry was written; the next sync re-reads the maps and retries");
                self.failed_entries = error.failed_services().unwrap_or_default();
                for (service, entries) in &self.failed_entries {
                    tracing::warn!(service = %service, entries, "entries of this Service failed to sync; retrying");
                }
                self.sync_report = SyncReport::Failed {
                    message: chain(&error),
                };
                if resync_due {
                    self.resync_wanted = true;
                    self.coalescer.failed_outside(now);
                } else {
                    self.coalescer.failed();
                }
                None
            }
        }
    }

    fn write_mode(&mut self, mode: u32) -> Result<(), Error> {
        let cookie = self.datapath.network_namespace_cookie()?;
        let config = datapath_config(
            mode,
            cookie,
            self.settings.masquerade_mark,
            self.settings.pod_connect_balancing,
        );
        if self.datapath.maps().config()? != Some(config) {
            self.datapath.maps().write_config(&config)?;
            self.counts.map_operations += 1;
        }
        Ok(())
    }

    /// Attaches programs to interfaces that have none from this process: new
    /// interfaces, and at start every interface (idempotent: a restart with the
    /// same programs changes nothing in the kernel). Nothing else re-attaches.
    fn attach_new_interfaces(&mut self) {
        let roles = self.roles.clone();
        self.attached
            .retain(|name, index| roles.get(name).map(|(current, _)| current) == Some(index));
        let mut errors = Vec::new();
        for (name, (index, role)) in &roles {
            if self.attached.get(name) == Some(index) {
                continue;
            }
            match self.datapath.attach_interface(name, *role) {
                Ok(changed) => {
                    if changed {
                        self.counts.program_attaches += 1;
                        tracing::info!(interface = %name, ?role, "attached");
                    }
                    self.attached.insert(name.clone(), *index);
                }
                Err(error) => {
                    tracing::warn!(interface = %name, error = %chain(&error), "cannot attach");
                    errors.push(chain(&error));
                }
            }
        }
        if self.settings.socket_hooks && !self.socket_hooks_attached {
            match self.datapath.attach_socket_hooks() {
                Ok(changed) => {
                    if changed {
                        self.counts.program_attaches += 1;
                    }
                    if !self.socket_hooks_attached {
                        tracing::info!(changed, "socket hooks attached");
                    }
                    self.socket_hooks_attached = true;
                    self.socket_hooks_error = None;
                }
                // Interfaces work without them; retried every round.
                Err(error) => report_once(
                    &mut self.socket_hooks_error,
                    &error,
                    "cannot attach the socket hooks: host processes and pods' connects get no connect-time Service translation (pods' traffic still gets it per packet); retrying",
                ),
            }
        }
        self.attach_error = if errors.is_empty() {
            None
        } else {
            Some(errors.join("; "))
        };
    }

    fn follow(&mut self, now: Instant) -> Result<(), Error> {
        if !self.gate.is_open() {
            return Ok(());
        }
        let live = match self.attachment {
            Attachment::Draining { .. } => {
                let due = self
                    .live_flows_read_at
                    .is_none_or(|at| now.saturating_duration_since(at) >= Duration::from_secs(1));
                if due {
                    self.live_flows = self.datapath.live_tcp_flows().ok();
                    self.live_flows_read_at = Some(now);
                }
                self.live_flows
            }
            _ => None,
        };
        let followed = self.instruction();
        let (mut next, action) = follow_mode(
            self.attachment,
            followed.mode(),
            followed.drain_timeout(),
            live,
            now,
        );
        match action {
            Some(ModeAction::Activate) => {
                // Checked again on every activation: the coexistence loop removes
                // the agent's chains whenever the node leaves eBPF.
                self.masquerade_rule_installed = false;
                self.ensure_masquerade_rule()?;
                self.write_mode(DATAPATH_MODE_ACTIVE)?;
                self.socket_hooks_attached = false;
                self.attached.clear();
                self.detach_left.clear();
                self.last_drain = None;
                tracing::info!("mode Ebpf: programs attached and active");
            }
            Some(ModeAction::StartDraining) => {
                self.write_mode(DATAPATH_MODE_DRAINING)?;
                self.live_flows_read_at = None;
                tracing::info!("mode KubeProxy: draining");
            }
            Some(ModeAction::Detach) => {
                // The socket hooks stay: with the config draining they pass
                // every new connection untranslated.
                let retrying = self.attachment == Attachment::Detaching;
                let names =
                    interfaces_to_detach(self.attachment, &self.detach_left, self.roles.keys());
                let datapath = &mut self.datapath;
                let round = detach_interfaces(&names, |name| {
                    datapath
                        .detach_interface(name)
                        .map_err(|error| chain(&error))
                });
                self.attached.clear();
                if !retrying {
                    // The drain ended now, whatever the detaches do.
                    self.last_drain = Some(if live == Some(0) {
                        DrainEnd::Complete
                    } else {
                        DrainEnd::TimeoutExpired
                    });
                    self.live_flows = None;
                }
                next = round.attachment();
                self.attach_error = round.error();
                if round.remaining.is_empty() {
                    tracing::info!(live_flows = ?live, "drained: programs detached, maps kept");
                } else {
                    tracing::warn!(
                        remaining = ?round.remaining,
                        "drained, but programs are still attached on some interfaces; retrying every round"
                    );
                }
                self.detach_left = round.remaining;
            }
            None => {}
        }
        self.attachment = next;
        match self.attachment {
            Attachment::Attached | Attachment::Draining { .. } => {
                self.attach_new_interfaces();
                // Every round, not only on activation: an upgraded agent restarts
                // into an attached node, and the loader ends a schema migration
                // only once every hook runs the new programs (a no-op when there
                // is none).
                self.datapath.finish_migration()?;
            }
            // The detach errors stay reported until the retry succeeds.
            Attachment::Detaching => {}
            Attachment::Detached => self.attach_error = None,
        }
        self.acted_generation = self.dataplane_node().and_then(|view| view.generation);
        Ok(())
    }

    /// One round: sync if due, then follow the mode.
    pub fn tick(&mut self, now: Instant, wall: DateTime<Utc>) -> TickReport {
        let _step = self.settings.round_step();
        let mut report = TickReport::default();
        if self.gate.is_open() && !self.gate_was_open {
            self.gate_was_open = true;
            if let GateStatus::Open { waited } = self.gate.status(now) {
                tracing::info!(
                    waited_ms = waited.as_millis() as u64,
                    "start-of-day gate open"
                );
                report.gate_opened_after = Some(waited);
            }
        }
        // The rule before the entries that need it: a flow marked for
        // masquerade with no rule yet would reach its remote backend with the
        // client's address and its replies would bypass this node.
        if matches!(
            self.attachment,
            Attachment::Attached | Attachment::Draining { .. }
        ) {
            match self.ensure_masquerade_rule() {
                Ok(()) => self.masquerade_error = None,
                Err(error) => report_once(
                    &mut self.masquerade_error,
                    &error,
                    "NodePort traffic to other nodes is not masqueraded; retrying",
                ),
            }
        }
        // Maps first: programs attached for the first time then find them filled.
        report.sync = self.sync(now, wall);
        if let Err(error) = self.follow(now) {
            tracing::error!(error = %chain(&error), "cannot follow the mode; retrying");
            self.attach_error = Some(chain(&error));
        }
        report
    }

    /// Installs the agent's masquerade rule once some Service needs it
    /// ([`SyncInputs::masquerade_needed`]), and not before: the rule turns on
    /// netfilter's connection tracking for every flow the node forwards, a cost
    /// ClusterIP-only nodes need not pay (the programs track their own flows).
    /// Once installed it stays while the node serves from eBPF, so that flows
    /// already masqueraded keep their rule.
    fn ensure_masquerade_rule(&mut self) -> Result<(), Error> {
        if !self.settings.manage_masquerade_rule
            || self.masquerade_rule_installed
            || !self.inputs.masquerade_needed()
        {
            return Ok(());
        }
        self.datapath
            .ensure_masquerade_rule(self.settings.masquerade_mark)?;
        self.masquerade_rule_installed = true;
        tracing::info!("a Service masquerades traffic to remote backends: the agent's masquerade rule is in place");
        Ok(())
    }

    /// Whether the agent's netfilter chains belong on the node: some Service
    /// needs masquerading, or this process installed them. The coexistence loop
    /// keeps them first only then (and whenever it finds them).
    pub fn netfilter_chains_wanted(&self) -> bool {
        self.masquerade_rule_installed || self.inputs.masquerade_needed()
    }

    /// The answers of the `healthCheckNodePort`s on this node.
    /// Only the Services with a health check port are looked at (a handful,
    /// usually none), so this is cheap enough for every tick.
    pub fn local_service_health(&self) -> Vec<LocalServiceHealth> {
        let mut health: Vec<LocalServiceHealth> = self
            .health_check_ports
            .iter()
            .map(|(name, port)| LocalServiceHealth {
                health_check_node_port: *port,
                namespace: name.namespace.clone(),
                name: name.name.clone(),
                local_endpoints: local_endpoint_count(
                    &self.inputs.slices_of(name),
                    &self.settings.node_name,
                ),
            })
            .collect();
        health.sort();
        health
    }

    /// What the status is computed from.
    pub fn status_inputs(&self, now: Instant, coexistence: &CoexistenceReport) -> StatusInputs {
        StatusInputs {
            agent_version: self.settings.agent_version.clone(),
            agent_revision: self.settings.agent_revision.clone(),
            gate: self.gate.status(now),
            gate_timeout_seconds: self.settings.gate_timeout.as_secs(),
            acted_generation: self.acted_generation,
            mode: self.mode(),
            attachment: match self.attachment {
                Attachment::Detached => AttachmentReport::Detached,
                Attachment::Attached => AttachmentReport::Attached,
                // Programs are still on some interfaces: not detached yet, and
                // `attach_error` says which detaches failed.
                Attachment::Draining { .. } | Attachment::Detaching => AttachmentReport::Draining,
            },
            attach_error: self.attach_error.clone(),
            sync: self.sync_report.clone(),
            services_programmed: self
                .gate
                .is_open()
                .then(|| self.syncer.current().frontends.len()),
            live_flows: self.live_flows,
            last_drain: self.last_drain,
            coexistence: coexistence.clone(),
            last_sync_time: self.last_sync_time,
            // The shell's sampler measures these; `round_report` takes them from the tracker.
            disruption: None,
        }
    }
}

#[cfg(test)]
mod tests;
