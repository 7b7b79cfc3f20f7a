//! `switchyard-agent standalone`: the datapath driven by manifest files instead of
//! an API server. The same core as cluster mode ([`NodeAgent`]), fed by another
//! input source:
//! - manifests are polled (modification times, every `poll_interval`) and
//!   re-applied when they change; a bad set is reported (file, document, field)
//!   and the last good set keeps serving;
//! - a DataplaneNode named after `--node-name` is followed; without one the mode
//!   is `Ebpf`;
//! - the host's interfaces and addresses come from the same netlink watcher as
//!   in cluster mode ([`crate::host`]);
//! - each round's report of the core ([`RoundReport`]) is written out as in
//!   cluster mode, and nothing is decided here: the CPU priority, and the status
//!   to the log (there is no API server to write it to), the disruption signals
//!   ([`crate::disruption`]) to the log at info as each report is published;
//! - SIGTERM or SIGINT leaves programs, links and maps in place (the next process
//!   takes over without a dropped connection); `--detach-on-exit` removes all.

pub mod manifests;

use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use chrono::Utc;
use switchyard_crds::{DataplaneMode, DataplaneNodeSpec};
use switchyard_model::error::chain;
use tokio::sync::mpsc;

use self::manifests::{Fingerprint, Manifests};
use crate::core::node::NodeFacts;
use crate::core::round::{RoundReport, StatusTracker};
use crate::core::status::{CoexistenceReport, WrittenStatus};
use crate::core::store::StoreChange;
use crate::core::{report_once, AgentSettings, DataplaneNodeView, Input, NodeAgent};
use crate::datapath::{Datapath, DatapathOptions};
use crate::disruption::{DisruptionSampler, PinnedCounters};
use crate::priority::{self, CatchUpPriority};
use crate::Error;

#[derive(Clone, Debug)]
pub struct StandaloneOptions {
    pub manifests: PathBuf,
    pub datapath: DatapathOptions,
    /// Where NodePorts are served (`--node-ip` among them).
    pub node_ports: crate::desired::node_port_addresses::NodePortSettings,
    pub node_name: String,
    pub detach_on_exit: bool,
    pub min_sync_period: Duration,
    pub poll_interval: Duration,
    pub gate_timeout: Duration,
}

/// How often a full sync re-reads the maps and recomputes every Service (the
/// safety net under the partial syncs), as in cluster mode.
pub const FULL_RESYNC_PERIOD: Duration = crate::core::DEFAULT_FULL_RESYNC_PERIOD;

/// The core's settings in standalone mode.
pub fn agent_settings(options: &StandaloneOptions) -> AgentSettings {
    AgentSettings {
        node_ports: options.node_ports.clone(),
        full_resync_period: FULL_RESYNC_PERIOD,
        ..AgentSettings::new(
            options.node_name.clone(),
            &options.datapath,
            options.min_sync_period,
            options.gate_timeout,
        )
    }
}

/// The manifest files as an input source: each poll that finds a new good
/// set turns it into the inputs the API watchers would send.
pub struct ManifestSource {
    path: PathBuf,
    node_name: String,
    fingerprint: Option<Fingerprint>,
    cache: manifests::ManifestCache,
    /// The last error logged, so that a problem that lasts is logged once.
    reported_error: Option<String>,
}

impl ManifestSource {
    pub fn new(path: PathBuf, node_name: String) -> Self {
        Self {
            path,
            node_name,
            fingerprint: None,
            cache: manifests::ManifestCache::default(),
            reported_error: None,
        }
    }

    /// Reads the manifests if they changed; returns the inputs of a new good
    /// set (none when nothing changed or the set is bad: the last good set
    /// keeps serving).
    pub fn poll(&mut self) -> Vec<Input> {
        let fingerprint = match manifests::fingerprint(&self.path) {
            Ok(fingerprint) => fingerprint,
            Err(error) => {
                self.fingerprint = None;
                report_once(
                    &mut self.reported_error,
                    &error,
                    "keeping the last good manifests",
                );
                return Vec::new();
            }
        };
        if self.fingerprint.as_ref() == Some(&fingerprint) {
            return Vec::new();
        }
        self.fingerprint = Some(fingerprint);
        let manifests = match self.cache.load(&self.path, &self.node_name) {
            Ok(manifests) => manifests,
            Err(error) => {
                report_once(
                    &mut self.reported_error,
                    &error,
                    "keeping the last good manifests",
                );
                return Vec::new();
            }
        };
        tracing::info!(
            services = manifests.services.len(),
            endpoint_slices = manifests.endpoint_slices.len(),
            dataplane_node = manifests.dataplane_node.is_some(),
            "read the manifests"
        );
        self.reported_error = None;
        manifest_inputs(&manifests, &self.node_name)
    }
}

/// What a set of manifests says, as the core's inputs: complete lists of
/// Services and EndpointSlices, the DataplaneNode (without one in the
/// files, a spec of `Ebpf`: a standalone node serves from eBPF unless told),
/// and the node's facts with the zone of its Node manifest, if any.
fn manifest_inputs(manifests: &Manifests, node_name: &str) -> Vec<Input> {
    let services = manifests
        .services
        .iter()
        .map(|service| (service.name.clone(), service.clone().into()))
        .collect();
    let slices = manifests
        .endpoint_slices
        .iter()
        .map(|slice| (slice.slice_name.clone(), slice.clone()))
        .collect();
    let spec = manifests
        .dataplane_node
        .clone()
        .unwrap_or_else(|| DataplaneNodeSpec::new(DataplaneMode::Ebpf));
    vec![
        Input::Node(node_facts(node_name, manifests.node_zone.clone())),
        Input::Services(StoreChange::Replace(services)),
        Input::EndpointSlices(StoreChange::Replace(slices)),
        Input::DataplaneNode(Some(DataplaneNodeView {
            uid: None,
            generation: None,
            spec,
            status: None,
        })),
    ]
}

/// Standalone mode's Node: its name, no addresses (NodePorts are served on the
/// host's local addresses or `--node-ip`), and the zone a Node manifest gives.
fn node_facts(node_name: &str, zone: Option<String>) -> NodeFacts {
    NodeFacts {
        name: node_name.to_string(),
        addresses: Vec::new(),
        zone,
    }
}

/// The standalone agent: the core and its manifest source.
pub struct Standalone<D: Datapath> {
    pub agent: NodeAgent<D>,
    manifests: ManifestSource,
    detach_on_exit: bool,
    manage_masquerade_rule: bool,
    /// When the agent started (how long the start-of-day gate has waited).
    started: Instant,
    /// The status the core last handed over, kept between rounds.
    status: StatusTracker,
    /// The disruption signals' sampler, once `run` gives it one (tests of the core run
    /// without: it reads the node's pins).
    disruption: Option<DisruptionSampler<PinnedCounters>>,
}

impl<D: Datapath> Standalone<D> {
    /// Restores the map state (writing nothing). Standalone mode has no Node
    /// object: its name comes from `--node-name`, its addresses from the host
    /// (or `--node-ip`), so the Node input is given here.
    pub fn start(options: StandaloneOptions, datapath: D, now: Instant) -> Result<Self, Error> {
        let mut agent = NodeAgent::start(agent_settings(&options), datapath, now)?;
        agent.receive(Input::Node(node_facts(&options.node_name, None)), now);
        Ok(Self {
            agent,
            manifests: ManifestSource::new(options.manifests, options.node_name),
            detach_on_exit: options.detach_on_exit,
            manage_masquerade_rule: options.datapath.manage_masquerade_rule,
            started: now,
            status: StatusTracker::default(),
            disruption: None,
        })
    }

    /// Measures the disruption signals from now on, with `sampler`.
    pub fn measure_disruption(&mut self, sampler: DisruptionSampler<PinnedCounters>) {
        self.disruption = Some(sampler);
    }

    /// Reads the manifests and hands what changed to the core.
    pub fn poll_manifests(&mut self, now: Instant) {
        for input in self.manifests.poll() {
            self.agent.receive(input, now);
        }
    }

    /// One round of the core (sync if due, follow the mode), and what the core decided of it
    /// for the shell to write out, as in cluster mode.
    pub fn tick(&mut self, now: Instant) -> RoundReport {
        let wall = Utc::now();
        let tick = self.agent.tick(now, wall);
        if let Some(sampler) = &mut self.disruption {
            let dataplane = crate::disruption::dataplane_of(self.agent.attachment());
            if let Some(published) = sampler.after_round(dataplane, now, wall) {
                // No API server to write the status to: the log carries each published report,
                // as JSON (what the status would hold).
                match serde_json::to_string(published) {
                    Ok(report) => tracing::info!(%report, "disruption signals"),
                    Err(error) => {
                        tracing::warn!(%error, "cannot encode the disruption signals")
                    }
                }
            }
            self.status.disruption = sampler.report().cloned();
        }
        // Standalone mode runs no coexistence loop: kube-proxy's rules stay unchecked.
        self.agent.round_report(
            &tick,
            now,
            wall,
            self.started,
            &CoexistenceReport::default(),
            &mut self.status,
        )
    }

    /// The end: leave everything in place, or remove it all.
    pub fn shut_down(&mut self) -> Result<(), Error> {
        if self.detach_on_exit {
            self.agent.datapath.detach_everything()?;
            if self.manage_masquerade_rule {
                crate::masquerade::remove()?;
            }
            tracing::info!("detached everything and removed the pins");
        } else {
            tracing::info!("exiting; programs and maps stay in place");
        }
        Ok(())
    }
}

/// Runs until `shutdown` completes: the host watcher's inputs as they come,
/// the manifests every `poll_interval`.
pub async fn run<D: Datapath>(
    options: StandaloneOptions,
    datapath: D,
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
    let pin_directory = options.datapath.pin_directory.clone();
    let mut standalone = Standalone::start(options, datapath, Instant::now())?;
    standalone.measure_disruption(DisruptionSampler::new(
        PinnedCounters::new(&pin_directory),
        None,
    ));
    // The first round has every input it needs at once (the watcher's first
    // view may come after a SIGTERM during start-up, which ends the loop after
    // that round): a round started must serve, with its programs pinned.
    match crate::interfaces::read_interfaces() {
        Ok(interfaces) => standalone
            .agent
            .receive(Input::Host(interfaces), Instant::now()),
        Err(error) => {
            tracing::warn!(error = %chain(&error), "cannot read the host's interfaces yet")
        }
    }
    let (inputs, mut received) = mpsc::unbounded_channel();
    let _host_thread = crate::host::watch_host(inputs)?;
    let mut next_poll = Instant::now();
    tokio::pin!(shutdown);
    loop {
        let now = Instant::now();
        if now >= next_poll {
            standalone.poll_manifests(now);
            next_poll = now + poll_interval;
        }
        let round = standalone.tick(now);
        // Write the round out: the CPU priority, and the status to the log (no API server to
        // write it to). Standalone mode serves no metrics or probes and runs no coexistence loop.
        priority::apply(catch_up.after_round(round.synced, now), original_nice);
        if let Some(WrittenStatus {
            status: Some(status),
            ..
        }) = &round.status
        {
            tracing::debug!(?status, "the DataplaneNode status");
        }
        let deadline = standalone
            .agent
            .next_deadline(now)
            .map_or(next_poll, |at| at.min(next_poll));
        tokio::select! {
            _ = &mut shutdown => break,
            input = received.recv() => match input {
                Some(input) => {
                    let now = Instant::now();
                    standalone.agent.receive(input, now);
                    while let Ok(more) = received.try_recv() {
                        standalone.agent.receive(more, now);
                    }
                }
                None => {
                    tracing::error!("the host watcher stopped");
                    break;
                }
            },
            _ = tokio::time::sleep_until(deadline.into()) => {}
        }
    }
    priority::yield_for_exit();
    standalone.shut_down()
}

#[cfg(test)]
mod tests;
