//! `switchyard-agent standalone`: the datapath driven by manifest files instead of
//! an API server. The same pure parts as cluster mode (model, desired state,
//! gate, syncer, mode following) fed from files:
//! - manifests are polled (modification times, every `poll_interval`) and
//!   re-applied when they change; a bad set is reported (file, document, field)
//!   and the last good set keeps serving;
//! - a DataplaneNode named after `--node-name` is followed; without one the mode
//!   is `Ebpf`;
//! - SIGTERM or SIGINT leaves programs, links and maps in place (the next process
//!   takes over without a dropped connection); `--detach-on-exit` removes all.

pub mod datapath;
pub mod follow;
pub mod interfaces;
pub mod manifests;
pub mod masquerade;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use switchyard_common::{DATAPATH_MODE_ACTIVE, DATAPATH_MODE_DRAINING};
use switchyard_crds::DataplaneMode;

use self::datapath::{datapath_config, Datapath};
use self::follow::{detach_interfaces, follow_mode, interfaces_to_detach, Attachment, ModeAction};
use self::interfaces::{Globs, InterfaceRole};
use self::manifests::{Fingerprint, Manifests};
use crate::desired::NodeView;
use crate::gate::{Gate, GateInput, GateStatus};
use crate::maps::ServiceMaps;
use crate::priority::{self, CatchUpPriority};
use crate::sync::coalesce::{Coalescer, Next};
use crate::sync::inputs::{SyncInputs, SyncKind};
use crate::sync::Syncer;
use crate::Error;

#[derive(Clone, Debug)]
pub struct StandaloneOptions {
    pub manifests: PathBuf,
    pub pod_interfaces: Globs,
    /// `None`: every non-loopback interface that is not a pod interface.
    pub host_interfaces: Option<Globs>,
    /// Empty: the global addresses of the host interfaces.
    pub node_ips: Vec<IpAddr>,
    pub node_name: String,
    pub pin_directory: PathBuf,
    pub detach_on_exit: bool,
    pub min_sync_period: Duration,
    pub poll_interval: Duration,
    pub gate_timeout: Duration,
    pub masquerade_mark: u32,
    /// Install the agent's masquerade rule (off in environments without iptables).
    pub manage_masquerade_rule: bool,
    pub socket_hook_cgroup: SocketHookCgroup,
    pub pod_connect_balancing: PodConnectBalancing,
    pub map_sizes: crate::loader::MapSizes,
}

/// Whether the socket hooks point pods' TCP connects to Services at a backend
/// (`--pod-connect-time-load-balancing`), as Calico's eBPF dataplane and
/// Cilium's socket load balancer do by default: a connection whose socket is
/// connected to the backend itself needs no per-packet translation, no
/// connection tracking entry, and survives any later change of dataplane.
/// `disabled` leaves pods' traffic to the TC programs, for meshes and tools that
/// must see the Service address in the packets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum PodConnectBalancing {
    Disabled,
    #[default]
    Tcp,
}

impl PodConnectBalancing {
    /// Its value in `DatapathConfig::pod_connect_balancing`.
    pub fn config_value(self) -> u32 {
        match self {
            PodConnectBalancing::Disabled => switchyard_common::POD_CONNECT_BALANCING_DISABLED,
            PodConnectBalancing::Tcp => switchyard_common::POD_CONNECT_BALANCING_TCP,
        }
    }
}

/// Where the host socket hooks go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SocketHookCgroup {
    /// The cgroup v2 root: every process of the node.
    Root,
    Path(PathBuf),
    None,
}

/// Where the interfaces and addresses come from (the host, or a test's list).
pub trait HostView {
    fn interfaces(&mut self) -> Result<Vec<interfaces::IpInterface>, Error>;
}

/// The host's interfaces through `ip -j addr`.
pub struct IpCommand;

impl HostView for IpCommand {
    fn interfaces(&mut self) -> Result<Vec<interfaces::IpInterface>, Error> {
        interfaces::read_interfaces()
    }
}

/// The standalone agent's state between ticks.
pub struct Standalone<D: Datapath, H: HostView> {
    options: StandaloneOptions,
    pub datapath: D,
    host: H,
    syncer: Syncer,
    gate: Gate,
    coalescer: Coalescer,
    fingerprint: Option<Fingerprint>,
    /// The last good manifests.
    manifests: Option<Manifests>,
    manifest_cache: manifests::ManifestCache,
    node_addresses: Option<Vec<IpAddr>>,
    /// Interfaces with programs, by name, with the index they had.
    attached: BTreeMap<String, u32>,
    attachment: Attachment,
    /// While `Detaching`: the interfaces whose detach failed, retried every round.
    detach_left: BTreeSet<String>,
    socket_hooks: SocketHooks,
    masquerade_rule_ensured: bool,
    gate_timeout_reported: bool,
    /// The last errors logged, so that a problem that lasts is logged once.
    reported_manifest_error: Option<String>,
    reported_host_error: Option<String>,
    /// Services, EndpointSlices and the node's view, with what changed since
    /// the last sync (so that a change plans only the Services it touches).
    inputs: SyncInputs,
    /// When the last full sync started; the next is due a resync period later.
    last_full_sync: Option<Instant>,
    resync_wanted: bool,
    /// Successful syncs by kind, since start (logs and tests).
    pub sync_counts: SyncCounts,
}

/// Successful syncs by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncCounts {
    pub partial: u64,
    pub full: u64,
    pub resync: u64,
}

/// How often a full sync re-reads the maps and recomputes every Service (the
/// safety net under the partial syncs), as in cluster mode.
pub const FULL_RESYNC_PERIOD: Duration = crate::cluster::agent::DEFAULT_FULL_RESYNC_PERIOD;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SocketHooks {
    Wanted,
    Failing,
    Attached,
}

impl<D: Datapath, H: HostView> Standalone<D, H> {
    /// Restores the map state (writing nothing) and finds out whether a previous
    /// process left programs attached.
    pub fn start(
        options: StandaloneOptions,
        datapath: D,
        host: H,
        now: Instant,
    ) -> Result<Self, Error> {
        let mut datapath = datapath;
        let syncer = Syncer::restore(datapath.maps())?;
        let mut gate = Gate::new(now, options.gate_timeout);
        gate.receive(GateInput::RestoredMaps, now);
        // Standalone mode has no Node object: what the agent would take from it
        // (name, addresses) comes from flags and the host.
        gate.receive(GateInput::Node, now);
        let attachment = if datapath.attached_interfaces()?.is_empty() {
            Attachment::Detached
        } else {
            match datapath.maps().config()?.map(|config| config.mode) {
                Some(DATAPATH_MODE_ACTIVE) => Attachment::Attached,
                Some(DATAPATH_MODE_DRAINING) => Attachment::Draining { since: now },
                // Programs attached but never activated (a process that died
                // in between): activate them as if nothing were attached
                // (attaching again keeps the links).
                _ => Attachment::Detached,
            }
        };
        tracing::info!(
            frontends = syncer.current().frontends.len(),
            backend_slots = syncer.current().backend_slots.len(),
            ?attachment,
            "restored the pinned maps"
        );
        Ok(Self {
            coalescer: Coalescer::new(options.min_sync_period),
            options,
            datapath,
            host,
            syncer,
            gate,
            fingerprint: None,
            manifests: None,
            manifest_cache: manifests::ManifestCache::default(),
            node_addresses: None,
            attached: BTreeMap::new(),
            attachment,
            detach_left: BTreeSet::new(),
            socket_hooks: SocketHooks::Wanted,
            masquerade_rule_ensured: false,
            gate_timeout_reported: false,
            reported_manifest_error: None,
            reported_host_error: None,
            inputs: SyncInputs::default(),
            last_full_sync: None,
            resync_wanted: false,
            sync_counts: SyncCounts::default(),
        })
    }

    /// Whether this process has synced the maps with the manifests (fully) yet.
    pub fn has_synced(&self) -> bool {
        self.last_full_sync.is_some()
    }

    pub fn attachment(&self) -> Attachment {
        self.attachment
    }

    pub fn gate_status(&self, now: Instant) -> GateStatus {
        self.gate.status(now)
    }

    fn mode(&self) -> DataplaneMode {
        self.manifests
            .as_ref()
            .and_then(|manifests| manifests.dataplane_node.as_ref())
            .map(|spec| spec.mode)
            .unwrap_or(DataplaneMode::Ebpf)
    }

    fn drain_timeout(&self) -> Duration {
        let seconds = self
            .manifests
            .as_ref()
            .and_then(|manifests| manifests.dataplane_node.as_ref())
            .map(|spec| spec.drain_timeout_seconds)
            .unwrap_or(switchyard_crds::config::DEFAULT_DRAIN_TIMEOUT_SECONDS);
        Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
    }

    fn read_manifests(&mut self, now: Instant) {
        let fingerprint = match manifests::fingerprint(&self.options.manifests) {
            Ok(fingerprint) => fingerprint,
            Err(error) => {
                self.fingerprint = None;
                report_once(
                    &mut self.reported_manifest_error,
                    &error,
                    "keeping the last good manifests",
                );
                return;
            }
        };
        if self.fingerprint.as_ref() == Some(&fingerprint) {
            return;
        }
        self.fingerprint = Some(fingerprint);
        match self
            .manifest_cache
            .load(&self.options.manifests, &self.options.node_name)
        {
            Ok(manifests) => {
                tracing::info!(
                    services = manifests.services.len(),
                    endpoint_slices = manifests.endpoint_slices.len(),
                    dataplane_node = manifests.dataplane_node.is_some(),
                    "read the manifests"
                );
                self.reported_manifest_error = None;
                if self.manifests.as_ref() != Some(&manifests) {
                    // Only the Services whose objects or slices differ from
                    // the last good set are marked for the next sync.
                    let services_changed = self
                        .inputs
                        .replace_services(manifests.services.iter().cloned());
                    let slices_changed = self
                        .inputs
                        .replace_slices(manifests.endpoint_slices.iter().cloned());
                    if services_changed || slices_changed {
                        self.coalescer.changed();
                    }
                    self.manifests = Some(manifests);
                }
                for input in [
                    GateInput::Services,
                    GateInput::EndpointSlices,
                    GateInput::DataplaneNode,
                ] {
                    self.gate.receive(input, now);
                }
            }
            Err(error) => report_once(
                &mut self.reported_manifest_error,
                &error,
                "keeping the last good manifests",
            ),
        }
    }

    /// Reads interfaces and addresses; returns the interfaces that get programs.
    fn read_host(&mut self, now: Instant) -> BTreeMap<String, (u32, InterfaceRole)> {
        let interfaces = match self.host.interfaces() {
            Ok(interfaces) => interfaces,
            Err(error) => {
                report_once(
                    &mut self.reported_host_error,
                    &error,
                    "cannot read the host's interfaces",
                );
                return BTreeMap::new();
            }
        };
        self.reported_host_error = None;
        let pods = &self.options.pod_interfaces;
        let hosts = self.options.host_interfaces.as_ref();
        let addresses = if self.options.node_ips.is_empty() {
            interfaces::host_addresses(&interfaces, pods, hosts)
        } else {
            self.options.node_ips.clone()
        };
        if self.node_addresses.as_ref() != Some(&addresses) {
            tracing::info!(?addresses, "node addresses");
            self.node_addresses = Some(addresses.clone());
            // Every NodePort moves: the next sync is a full one.
            let node = NodeView {
                name: self.options.node_name.clone(),
                addresses,
            };
            if self.inputs.set_node(node) {
                self.coalescer.changed();
            }
        }
        self.gate.receive(GateInput::HostAddresses, now);
        interfaces::interface_roles(&interfaces, pods, hosts)
    }

    fn sync(&mut self, now: Instant) {
        let Some(gate_open) = self.gate.open() else {
            let status = self.gate.status(now);
            if matches!(status, GateStatus::TimedOut { .. }) && !self.gate_timeout_reported {
                tracing::warn!(
                    missing = status.missing_names(),
                    "still waiting before the first write"
                );
                self.gate_timeout_reported = true;
            }
            return;
        };
        // The periodic resync runs when due, outside the minimum sync period
        // (so a change right behind it is not held back); a failed one is
        // retried through the coalescer, no sooner than a period later.
        let resync_due = !self.resync_wanted
            && self
                .last_full_sync
                .is_some_and(|at| now >= at + FULL_RESYNC_PERIOD);
        if self.manifests.is_none() || (!resync_due && self.coalescer.poll(now) != Next::Apply) {
            return;
        }
        let resync = resync_due || self.resync_wanted;
        let started = Instant::now();
        let result = self
            .inputs
            .sync(gate_open, &mut self.syncer, self.datapath.maps(), resync);
        let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
        match result {
            // No node addresses yet (the gate waits for them): nothing written.
            Ok(None) => {}
            Ok(Some(outcome)) => {
                let operations = outcome.report.operation_count();
                match outcome.kind {
                    SyncKind::Partial { .. } => self.sync_counts.partial += 1,
                    SyncKind::Full => self.sync_counts.full += 1,
                    SyncKind::Resync => self.sync_counts.resync += 1,
                }
                let services = match outcome.kind {
                    SyncKind::Partial { services } => services,
                    SyncKind::Full | SyncKind::Resync => {
                        self.last_full_sync = Some(now);
                        self.resync_wanted = false;
                        self.inputs.service_count()
                    }
                };
                if outcome.kind == SyncKind::Resync && operations > 0 {
                    tracing::warn!(
                        operations,
                        "the periodic full resync found the maps differing from the desired state and corrected them"
                    );
                }
                tracing::info!(
                    kind = outcome.kind.name(),
                    services,
                    frontends = self.syncer.current().frontends.len(),
                    operations,
                    elapsed_ms,
                    "synced the maps"
                );
            }
            Err(error) => {
                tracing::error!(%error, "sync failed; the next sync re-reads the maps and plans everything");
                if resync_due {
                    self.resync_wanted = true;
                    self.coalescer.failed_outside(now);
                } else {
                    self.coalescer.failed();
                }
            }
        }
    }

    fn write_mode(&mut self, mode: u32) -> Result<(), Error> {
        let cookie = self.datapath.network_namespace_cookie()?;
        let config = datapath_config(
            mode,
            cookie,
            self.options.masquerade_mark,
            self.options.pod_connect_balancing,
        );
        if self.datapath.maps().config()? != Some(config) {
            self.datapath.maps().write_config(&config)?;
        }
        Ok(())
    }

    fn attach_new_interfaces(&mut self, roles: &BTreeMap<String, (u32, InterfaceRole)>) {
        self.attached
            .retain(|name, index| roles.get(name).map(|(current, _)| current) == Some(index));
        for (name, (index, role)) in roles {
            if self.attached.get(name) == Some(index) {
                continue;
            }
            match self.datapath.attach_interface(name, *role) {
                Ok(()) => {
                    tracing::info!(interface = %name, ?role, "attached");
                    self.attached.insert(name.clone(), *index);
                }
                Err(error) => tracing::warn!(interface = %name, %error, "cannot attach"),
            }
        }
    }

    /// The masquerade rule goes in once some Service needs it (a NodePort or
    /// external address with `externalTrafficPolicy: Cluster`), and not before:
    /// it turns on netfilter's connection tracking of every flow the node
    /// forwards, which ClusterIP-only nodes need not pay. Checked once per
    /// process (a previous process may have been started without it); a failure
    /// is logged and retried.
    fn ensure_masquerade_rule(&mut self) {
        if !self.options.manage_masquerade_rule
            || self.masquerade_rule_ensured
            || !self.inputs.masquerade_needed()
        {
            return;
        }
        match masquerade::ensure(self.options.masquerade_mark) {
            Ok(()) => self.masquerade_rule_ensured = true,
            Err(error) => {
                tracing::error!(%error, "NodePort traffic to other nodes is not masqueraded; retrying")
            }
        }
    }

    /// Socket hooks are retried every round until attached, but a failure is
    /// logged once: interfaces work without them (only host processes lose
    /// Service translation).
    fn attach_socket_hooks(&mut self) {
        if self.socket_hooks == SocketHooks::Attached {
            return;
        }
        match self.datapath.attach_socket_hooks() {
            Ok(()) => {
                if self.options.socket_hook_cgroup != SocketHookCgroup::None {
                    tracing::info!("socket hooks attached");
                }
                self.socket_hooks = SocketHooks::Attached;
            }
            Err(error) => {
                if self.socket_hooks == SocketHooks::Wanted {
                    tracing::error!(%error, "cannot attach the socket hooks; host processes get no Service translation; retrying");
                }
                self.socket_hooks = SocketHooks::Failing;
            }
        }
    }

    fn follow(
        &mut self,
        roles: &BTreeMap<String, (u32, InterfaceRole)>,
        now: Instant,
    ) -> Result<(), Error> {
        if !self.gate.is_open() {
            return Ok(());
        }
        let live = match self.attachment {
            Attachment::Draining { .. } => self.datapath.live_tcp_flows().ok(),
            _ => None,
        };
        let (mut next, action) = follow_mode(
            self.attachment,
            self.mode(),
            self.drain_timeout(),
            live,
            now,
        );
        match action {
            Some(ModeAction::Activate) => {
                // Checked again on every activation (something may have removed it
                // while the node was away from eBPF).
                self.masquerade_rule_ensured = false;
                self.ensure_masquerade_rule();
                self.write_mode(DATAPATH_MODE_ACTIVE)?;
                self.socket_hooks = SocketHooks::Wanted;
                self.attached.clear();
                self.detach_left.clear();
                tracing::info!("mode Ebpf: programs attached and active");
            }
            Some(ModeAction::StartDraining) => {
                self.write_mode(DATAPATH_MODE_DRAINING)?;
                tracing::info!("mode KubeProxy: draining");
            }
            Some(ModeAction::Detach) => {
                // The socket hooks stay: with the config draining they pass
                // every new connection untranslated.
                let names = interfaces_to_detach(self.attachment, &self.detach_left, roles.keys());
                let datapath = &mut self.datapath;
                let round = detach_interfaces(&names, |name| datapath.detach_interface(name));
                self.attached.clear();
                next = round.attachment();
                match round.error() {
                    None => {
                        tracing::info!(live_flows = ?live, "drained: programs detached, maps kept")
                    }
                    Some(error) => tracing::error!(
                        remaining = ?round.remaining,
                        %error,
                        "drained, but programs are still attached on some interfaces; retrying every round"
                    ),
                }
                self.detach_left = round.remaining;
            }
            None => {}
        }
        self.attachment = next;
        if let Attachment::Attached | Attachment::Draining { .. } = self.attachment {
            self.ensure_masquerade_rule();
            self.attach_new_interfaces(roles);
            self.attach_socket_hooks();
            // Every round, not only on activation: an upgraded agent restarts into
            // an attached node, and the loader ends a schema migration only once
            // every hook runs the new programs (a no-op when there is none).
            self.datapath.finish_migration()?;
        }
        Ok(())
    }

    /// One round: read inputs, sync if due, follow the mode.
    pub fn tick(&mut self, now: Instant) {
        self.read_manifests(now);
        let roles = self.read_host(now);
        // The rule before the entries that need it, once programs are attached
        // (activation installs it before it attaches them).
        if matches!(
            self.attachment,
            Attachment::Attached | Attachment::Draining { .. }
        ) {
            self.ensure_masquerade_rule();
        }
        // Maps first: programs attached for the first time then find them filled.
        self.sync(now);
        if let Err(error) = self.follow(&roles, now) {
            tracing::error!(%error, "cannot follow the mode; retrying");
        }
    }

    /// The end: leave everything in place, or remove it all.
    pub fn shut_down(&mut self) -> Result<(), Error> {
        if self.options.detach_on_exit {
            self.datapath.detach_everything()?;
            if self.options.manage_masquerade_rule {
                masquerade::remove()?;
            }
            tracing::info!("detached everything and removed the pins");
        } else {
            tracing::info!("exiting; programs and maps stay in place");
        }
        Ok(())
    }
}

/// Logs `error` unless it is the one logged last time.
pub(crate) fn report_once(last: &mut Option<String>, error: &Error, what: &str) {
    let message = error.to_string();
    if last.as_deref() != Some(message.as_str()) {
        tracing::error!(error = %message, "{what}");
        *last = Some(message);
    }
}

/// Runs until `shutdown` completes.
pub async fn run<D: Datapath, H: HostView>(
    options: StandaloneOptions,
    datapath: D,
    host: H,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let poll_interval = options.poll_interval;
    // As in cluster mode (see `priority`): decided before the restore.
    let original_nice = priority::current_nice().unwrap_or(0);
    let serving = !datapath.attached_interfaces()?.is_empty();
    let (mut catch_up, step) = CatchUpPriority::start(
        serving,
        priority::this_process_may_restore_priority(),
        Instant::now(),
    );
    priority::apply(step, original_nice);
    let mut agent = Standalone::start(options, datapath, host, Instant::now())?;
    tokio::pin!(shutdown);
    loop {
        let now = Instant::now();
        agent.tick(now);
        priority::apply(catch_up.after_round(agent.has_synced(), now), original_nice);
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep(poll_interval) => {}
        }
    }
    priority::yield_for_exit();
    agent.shut_down()
}

#[cfg(test)]
mod tests;
