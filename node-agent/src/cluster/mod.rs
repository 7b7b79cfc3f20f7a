//! `switchyard-agent run`: the agent in a cluster (the DaemonSet's command).
//!
//! Inputs: Services and EndpointSlices (v1, or v1beta1 where the server serves
//! only that), this node's Node and DataplaneNode (watched by field selector), and
//! the host's interfaces and addresses (netlink notifications). They feed the same
//! gate, desired state, syncer, coalescer and mode following as standalone mode
//! ([`agent::ClusterAgent`]). Output: the maps and programs, the DataplaneNode
//! status (Server-Side Apply, on change only), metrics and `/readyz`, and kube-proxy's
//! own metrics (served by the coexistence loop once kube-proxy has left).
//!
//! Layout:
//! - `node` (pure): what the agent takes from its Node, and whether an update matters.
//! - `store` (pure): the changes watchers send (a whole list, or one object).
//! - `status` (pure): the DataplaneNode status from the agent's state.
//! - `agent`: the state machine between inputs and the datapath (tested with fakes).
//! - `datapath`: the datapath trait and its loader-backed implementation.
//! - `events` (pure): which status changes make Events, and their rate limit.
//! - `watch`, `host`, `coexist`, `metrics`, `events_writer`: thin I/O.
//!
//! SIGTERM leaves programs and maps in place for the next process.

pub mod coexist;
pub mod events;
pub mod events_writer;
pub mod metrics;
pub mod watch;

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use chrono::Utc;
use switchyard_telemetry::events::{Publisher, Reporter};
use switchyard_telemetry::{Health, TelemetryServer};
use tokio::sync::{mpsc, watch as channel};

use self::coexist::CoexistenceSettings;
use self::events::{EventDecisions, Reported};
use self::events_writer::{dataplane_node_reference, EventRequest};
use self::metrics::AgentMetrics;
use crate::core::round::StatusTracker;
use crate::core::status::{CoexistenceProgress, CoexistenceReport, WrittenStatus};
use crate::core::{AgentSettings, NodeAgent};
use crate::datapath::{Datapath, DatapathOptions, KernelDatapath};
use crate::disruption::{dataplane_of, DisruptionMetrics, DisruptionSampler, PinnedCounters};
use crate::error::Cause;
use crate::kube_proxy::health::HealthzTarget;
use crate::kube_proxy::metrics::{KubeProxyChanges, KubeProxyMetrics, SyncDone};
use crate::kube_proxy::metrics_server::KubeProxyMetricsPort;
use crate::loader;
use crate::priority::{self, CatchUpPriority};
use crate::Error;

#[derive(Clone, Debug)]
pub struct ClusterOptions {
    pub node_name: String,
    pub datapath: DatapathOptions,
    pub metrics_address: SocketAddr,
    pub min_sync_period: Duration,
    pub gate_timeout: Duration,
    /// The pod's `controller-revision-hash` (`AGENT_REVISION`).
    pub agent_revision: Option<String>,
    /// kube-proxy's healthz, probed while its rules are present.
    pub kube_proxy_healthz: String,
    pub coexistence_interval: Duration,
    /// How long kube-proxy's healthz must stay refused before its rules go.
    pub kube_proxy_absence_confirmation: Duration,
    /// Serve kube-proxy's `:10256/healthz` once kube-proxy has left the node.
    pub serve_replacement_healthz: bool,
    pub replacement_healthz_port: u16,
    /// Serve kube-proxy's metrics here once kube-proxy has left the node (`None`: never).
    pub kube_proxy_metrics_address: Option<SocketAddr>,
    /// Where NodePorts are served (`--node-port-addresses`, `--localhost-node-ports`).
    pub node_ports: crate::desired::node_port_addresses::NodePortSettings,
}

// Liveness bounds: how long one step of each loop may take before `/healthz` calls the agent
// stuck and the kubelet restarts it. Each is well above the slowest legitimate step, because a
// restart in the middle of a long but healthy step only starts the same step again.
//
// A round is the core's tick: at worst a full sync of 30,000 Services (about a second of one
// core at 10,000 Services per few hundred milliseconds, see `DEFAULT_FULL_RESYNC_PERIOD`), run
// at a lowered CPU priority while catching up on a busy 2-core node, plus attaching programs.
const ROUND_STEP_BOUND: Duration = Duration::from_secs(120);
/// A watch step converts one event (a relist of 30,000 objects at most) and queues it: no I/O.
const WATCH_STEP_BOUND: Duration = Duration::from_secs(60);
/// A status write is one API call: kube's client gives up on a response after 295 s (its
/// default read timeout), and the writer then backs off, which is waiting.
const STATUS_WRITE_STEP_BOUND: Duration = Duration::from_secs(330);
/// A coexistence round runs iptables-save/-restore of kube-proxy's rules (hundreds of thousands
/// of lines with 30,000 Services) under the xtables lock, which kube-proxy itself may hold for
/// tens of seconds per sync, plus a healthz probe of at most `PROBE_TIMEOUT`.
const COEXISTENCE_STEP_BOUND: Duration = Duration::from_secs(300);
/// One try of an Event write is cut off at `PUBLISH_TIMEOUT` (30 s).
const EVENT_WRITE_STEP_BOUND: Duration = Duration::from_secs(60);

/// Housekeeping period: gate timeout, counters, drain progress.
const HOUSEKEEPING: Duration = Duration::from_secs(1);
const COUNTERS_PERIOD: Duration = Duration::from_secs(5);

/// The reason of `ProgramsAttached` and `Ready` when the programs could not be loaded.
const DATAPATH_LOAD_FAILED: &str = "DatapathLoadFailed";
/// How long the agent tries to report a failed load before it exits anyway.
const LOAD_FAILURE_REPORT_BOUND: Duration = Duration::from_secs(10);

/// Writes a failure to load the programs and maps (a capability the pod lacks, a kernel
/// without the BPF features) to the node's DataplaneNode before the agent exits:
/// `ProgramsAttached` and `Ready` False with the error's chain, so the object says why the
/// node's agent keeps restarting, not only its log. Best effort within a bound: the exit
/// and its log line follow whether the write reached the API server or not.
async fn report_load_failure(options: &ClusterOptions, error: &Error) {
    use switchyard_crds::{condition_types, Condition, ConditionStatus, DataplaneNode};
    // The chain starts with what failed ("failed to load the datapath programs: ...").
    let message = switchyard_model::error::chain(error);
    let now = Utc::now();
    let condition = |type_: &str| {
        Condition::new(
            type_,
            ConditionStatus::False,
            DATAPATH_LOAD_FAILED,
            message.clone(),
            None,
            now,
        )
    };
    // A merge patch of these fields only: the conditions list is replaced (the running
    // agent's others described a process that is gone), and the rest of the status (the
    // disruption report, counts) stays as the last agent wrote it. A server-side apply
    // under the agent's own field manager would drop that rest and could leave it invalid.
    let patch = serde_json::json!({"status": {
        "agentVersion": env!("CARGO_PKG_VERSION"),
        "agentRevision": options.agent_revision,
        "conditions": [
            condition(condition_types::PROGRAMS_ATTACHED),
            condition(condition_types::READY),
        ],
    }});
    let write = async {
        let client = kube_client()
            .await
            .map_err(|error| switchyard_model::error::chain(&error))?;
        kube::Api::<DataplaneNode>::all(client)
            .patch_status(
                &options.node_name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .map(|_| ())
            .map_err(|error| error.to_string())
    };
    match tokio::time::timeout(LOAD_FAILURE_REPORT_BOUND, write).await {
        Ok(Ok(())) => tracing::info!("the failed load is reported in the DataplaneNode"),
        Ok(Err(problem)) => {
            tracing::warn!(%problem, "cannot report the failed load in the DataplaneNode")
        }
        Err(_) => tracing::warn!(
            "cannot report the failed load in the DataplaneNode within {LOAD_FAILURE_REPORT_BOUND:?}"
        ),
    }
}

async fn kube_client() -> Result<kube::Client, Error> {
    let config = kube::Config::infer()
        .await
        .map_err(|error| Error::ConfigureClient {
            source: Box::new(error),
        })?;
    kube::Client::try_from(config).map_err(|error| Error::ConfigureClient {
        source: Box::new(error),
    })
}

/// Runs the agent until `shutdown` completes; programs and maps stay in place.
pub async fn run(options: ClusterOptions, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
    let mut metrics = AgentMetrics::new()?;
    // kube-proxy's metrics, kept from the start (as kube-proxy keeps them from its own) and
    // served only while the coexistence loop serves kube-proxy's ports.
    let kube_proxy_metrics = KubeProxyMetrics::new()?;
    let mut kube_proxy_changes = KubeProxyChanges::new(SystemTime::now());
    let health = Health::new();
    let telemetry_address = serve_telemetry_on_its_own_thread(
        options.metrics_address,
        metrics.registry.clone(),
        health.clone(),
    )?;
    tracing::info!(address = %telemetry_address, "serving metrics and health checks");
    // Decided before loading: loading the programs and restoring the maps' state
    // are catch-up work too.
    let original_nice = priority::current_nice().unwrap_or(0);
    let serving = loader::programs_attached_under(&options.datapath.pin_directory);
    let (mut catch_up, step) = CatchUpPriority::start(
        serving,
        priority::this_process_may_restore_priority(),
        Instant::now(),
    );
    priority::apply(step, original_nice);
    let datapath = match KernelDatapath::load(&options.datapath) {
        Ok(datapath) => datapath,
        Err(error) => {
            report_load_failure(&options, &error).await;
            return Err(error);
        }
    };
    let settings = AgentSettings {
        agent_revision: options.agent_revision.clone(),
        node_ports: options.node_ports.clone(),
        round_heartbeat: Some(health.register_loop("agent rounds", ROUND_STEP_BOUND)),
        ..AgentSettings::new(
            options.node_name.clone(),
            &options.datapath,
            options.min_sync_period,
            options.gate_timeout,
        )
    };
    let mut agent = NodeAgent::start(settings, datapath, Instant::now())?;

    let (inputs, mut received) = mpsc::unbounded_channel();
    let _host_thread = crate::host::watch_host(inputs.clone())?;
    let client = kube_client().await?;
    let watchers = watch::spawn_watchers(
        client.clone(),
        options.node_name.clone(),
        inputs,
        &health,
        WATCH_STEP_BOUND,
    );

    let (status_sender, status_receiver) = channel::channel(WrittenStatus::default());
    let (written_sender, written) = channel::channel(watch::StatusWrites::default());
    let (event_sender, event_requests) = mpsc::channel(events_writer::QUEUE_CAPACITY);
    let event_writer = tokio::spawn(events_writer::run_publisher(
        Publisher::new(
            client.clone(),
            Reporter::new(
                events_writer::REPORTING_COMPONENT,
                options.node_name.clone(),
            )
            .on_host(options.node_name.clone()),
        ),
        event_requests,
        health.register_loop("event writer", EVENT_WRITE_STEP_BOUND),
    ));
    let mut event_decisions = EventDecisions::default();
    let status_writer = tokio::spawn(watch::run_status_writer(
        client,
        options.node_name.clone(),
        status_receiver,
        written_sender,
        health.register_loop("status writer", STATUS_WRITE_STEP_BOUND),
    ));

    // The first round must already know whether programs are attached: a default
    // "not serving" would make it remove the agent's chains (their masquerade
    // included) under the programs a previous process left serving, until the
    // first real request puts them back.
    let (request_sender, request_receiver) =
        channel::channel(agent.coexistence_request(false, None));
    let (report_sender, mut reports) = channel::channel(CoexistenceReport {
        progress: CoexistenceProgress::NoRoundYet,
        ..CoexistenceReport::default()
    });
    let coexistence = tokio::spawn(coexist::run_coexistence(
        CoexistenceSettings {
            round_interval: options.coexistence_interval,
            kube_proxy_healthz: HealthzTarget::parse(&options.kube_proxy_healthz)?,
            masquerade_mark: options.datapath.masquerade_mark,
            serve_replacement_healthz: options.serve_replacement_healthz,
            healthz_port: options.replacement_healthz_port,
            kube_proxy_metrics: options
                .kube_proxy_metrics_address
                .map(|address| KubeProxyMetricsPort::new(address, &kube_proxy_metrics)),
            absence_confirmation: options.kube_proxy_absence_confirmation,
            heartbeat: health.register_loop("coexistence", COEXISTENCE_STEP_BOUND),
        },
        request_receiver,
        report_sender,
    ));

    let started = Instant::now();
    let mut coexistence_report = reports.borrow().clone();
    let mut status_tracker = StatusTracker::default();
    let mut disruption = DisruptionSampler::new(
        PinnedCounters::new(&options.datapath.pin_directory),
        Some(DisruptionMetrics::register(&metrics.registry)?),
    );
    let mut counters_read_at: Option<Instant> = None;
    let mut status_writes_counted = watch::StatusWrites::default();
    tokio::pin!(shutdown);
    loop {
        let now = Instant::now();
        let deadline = agent
            .next_deadline(now)
            .map_or(now + HOUSEKEEPING, |at| at.min(now + HOUSEKEEPING));
        tokio::select! {
            _ = &mut shutdown => break,
            input = received.recv() => match input {
                Some(input) => {
                    let now = Instant::now();
                    // Take everything queued, so a burst costs one tick.
                    let mut next = Some(input);
                    while let Some(input) = next {
                        let changes = agent.receive_counting_changes(input, now);
                        kube_proxy_changes.received(changes, SystemTime::now());
                        next = received.try_recv().ok();
                    }
                }
                None => {
                    tracing::error!("every input source stopped");
                    break;
                }
            },
            changed = reports.changed() => {
                if changed.is_ok() {
                    coexistence_report = reports.borrow_and_update().clone();
                }
            }
            _ = tokio::time::sleep_until(deadline.into()) => {}
        }
        let now = Instant::now();
        // One wall time for the tick, the disruption sample and the status: a switch's sample
        // then carries the very time of `ProgramsAttached`'s transition, where the operator's
        // soak starts and the window after the switch must not start earlier.
        let wall = Utc::now();
        let tick = agent.tick(now, wall);
        if let Some(view) = agent.dataplane_node() {
            disruption.restore_baseline(
                view.status
                    .as_ref()
                    .and_then(|status| status.disruption.as_ref()),
            );
        }
        disruption.after_round(dataplane_of(agent.attachment()), now, wall);
        status_tracker.disruption = disruption.report().cloned();
        let round = agent.round_report(
            &tick,
            now,
            wall,
            started,
            &coexistence_report,
            &mut status_tracker,
        );

        // Write the round out: metrics, readiness, the coexistence request,
        // the CPU priority, the status.
        metrics.record_round(&round, &agent.counts);
        if let Some((outcome, _)) = &tick.sync {
            kube_proxy_metrics.record_no_local_endpoints(outcome.no_local_endpoints);
            kube_proxy_metrics.record_udp_flow_release(&outcome.report);
        }
        if let Some((kind, elapsed)) = round.sync {
            let done = SyncDone {
                kind,
                elapsed,
                finished_at: SystemTime::now(),
            };
            kube_proxy_metrics.record_sync(&kube_proxy_changes.synced(&done));
        }
        kube_proxy_metrics.record_changes(&kube_proxy_changes);
        if counters_read_at.is_none_or(|at| now.saturating_duration_since(at) >= COUNTERS_PERIOD) {
            counters_read_at = Some(now);
            if let Ok(counters) = agent.datapath.counters() {
                metrics.record_packets(&counters);
            }
            if let Some(report) = agent.datapath.conntrack_sweep_report() {
                metrics.record_conntrack_sweeps(&report);
            }
        }
        let writes = *written.borrow();
        metrics
            .status_writes
            .inc_by(writes.total.saturating_sub(status_writes_counted.total));
        metrics.disruption_status_writes.inc_by(
            writes
                .disruption_only
                .saturating_sub(status_writes_counted.disruption_only),
        );
        status_writes_counted = writes;
        health.set_ready(round.ready);
        request_sender.send_if_modified(|current| {
            let changed = *current != round.coexistence;
            *current = round.coexistence.clone();
            changed
        });
        priority::apply(catch_up.after_round(round.synced, now), original_nice);
        if let Some(status) = round.status {
            let read_back = agent
                .dataplane_node()
                .and_then(|view| view.status.as_ref())
                .map(|status| status.conditions.as_slice());
            queue_events(
                &mut event_decisions,
                &status,
                round.coexistence.cleanup_generation,
                read_back,
                &options.node_name,
                &event_sender,
                now,
            );
            status_sender.send_replace(status);
        }
    }
    tracing::info!("exiting; programs and maps stay in place");
    priority::yield_for_exit();
    for task in watchers {
        task.abort();
    }
    drop(request_sender);
    let _ = tokio::time::timeout(Duration::from_secs(2), coexistence).await;
    // The last status reaches the API server if it can within the grace period.
    drop(status_sender);
    let _ = tokio::time::timeout(Duration::from_secs(2), status_writer).await;
    drop(event_sender);
    let _ = tokio::time::timeout(Duration::from_secs(2), event_writer).await;
    Ok(())
}

/// Decides the Events that the status handed to the writer deserves (see [`events`]) and
/// queues them for the Event writer, never waiting: a full queue drops the Event with a
/// warning (the conditions still say what happened).
fn queue_events(
    decisions: &mut EventDecisions,
    written: &WrittenStatus,
    cleanup_generation: Option<i64>,
    read_back: Option<&[switchyard_crds::Condition]>,
    node_name: &str,
    queue: &mpsc::Sender<EventRequest>,
    now: Instant,
) {
    let Some(status) = &written.status else {
        return;
    };
    let decided = decisions.after_report(
        Reported {
            conditions: status.conditions.clone(),
            cleanup_generation,
        },
        read_back,
        now,
    );
    for occurrence in decided.suppressed {
        tracing::info!(reason = %occurrence.reason, message = %occurrence.message, "Event dropped by the rate limit");
    }
    let involved = dataplane_node_reference(node_name, written.object_uid.as_deref());
    for occurrence in decided.publish {
        let request = EventRequest {
            involved: involved.clone(),
            occurrence,
        };
        if let Err(error) = queue.try_send(request) {
            tracing::warn!(%error, "Event dropped: the Event writer's queue is full");
        }
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` from a thread of its own, for the life of the
/// process. The agent's rounds are synchronous and run on the main thread's runtime: there, a
/// round blocked in the kernel would keep `/healthz` from answering at all, and a long but
/// healthy full sync would make probes time out. On its own thread `/healthz` answers
/// throughout, and names the stuck loop once a step has outlived its bound. Returns the address
/// it listens on.
fn serve_telemetry_on_its_own_thread(
    address: SocketAddr,
    registry: prometheus::Registry,
    health: Health,
) -> Result<SocketAddr, Error> {
    let failed = |source: Cause| Error::ServeTelemetry { source };
    let (bound_sender, bound) = std::sync::mpsc::channel::<Result<SocketAddr, Cause>>();
    let serve = move || {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(error) => {
                let _ = bound_sender.send(Err(error.into()));
                return;
            }
        };
        runtime.block_on(async move {
            match TelemetryServer::bind(address, registry, health).await {
                Ok(server) => {
                    let _ = bound_sender.send(Ok(server.local_address()));
                    // Serves until the process exits.
                    std::future::pending::<()>().await
                }
                Err(error) => {
                    let _ = bound_sender.send(Err(error.into()));
                }
            }
        });
    };
    std::thread::Builder::new()
        .name("telemetry".into())
        .spawn(serve)
        .map_err(|error| failed(error.into()))?;
    bound
        .recv()
        .map_err(|error| failed(error.into()))?
        .map_err(failed)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    fn get_healthz(address: SocketAddr) -> String {
        let mut stream = std::net::TcpStream::connect(address).expect("connects");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("sets a timeout");
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
            .expect("sends");
        let mut answer = String::new();
        stream
            .read_to_string(&mut answer)
            .expect("reads the answer");
        answer
    }

    /// The test's thread has no runtime at all and stays inside the step, as a round blocked
    /// in the kernel would keep the agent's main thread.
    #[test]
    fn healthz_answers_from_its_own_thread_while_a_round_blocks_the_caller_and_names_it() {
        let health = Health::new();
        let rounds = health.register_loop("agent rounds", Duration::ZERO);
        let address = serve_telemetry_on_its_own_thread(
            "127.0.0.1:0".parse().expect("an address"),
            prometheus::Registry::new(),
            health.clone(),
        )
        .expect("serves");
        let answer = get_healthz(address);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        // Any time in the step is past a bound of zero.
        let step = rounds.step();
        let answer = get_healthz(address);
        assert!(
            answer.starts_with("HTTP/1.1 503")
                && answer.contains("agent rounds has been in one step"),
            "{answer}"
        );
        drop(step);
        let answer = get_healthz(address);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
}
