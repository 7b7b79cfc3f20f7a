//! The controller: a kube-runtime `Controller` on DataplaneConfig, also triggered by
//! DataplaneNodes, Nodes, the kube-proxy DaemonSet and its pods, the agent DaemonSet and its
//! pods, and Services whose support by the eBPF datapath changed (all mapped to the
//! DataplaneConfig named `default`).
//!
//! Read it in the order a change travels:
//! - [`watches`]: [`run`] starts the watches, which fill the reflector stores ([`crate::cache`])
//!   and trigger reconciles, and the reconcile of "no DataplaneConfig named `default`";
//! - [`reconcile`](mod@reconcile): one reconcile, top to bottom: wait until the stores hold
//!   every write this operator made, observe (a snapshot from the stores, no request to the API
//!   server but the patch-permission review), plan ([`crate::planner::plan`], which alone
//!   decides what is written), apply, publish the status; with an Event for every step taken
//!   and every refusal ([`crate::events`] words them);
//! - [`apply`]: every write, through one helper that owns the own-write protocol
//!   ([`OwnWrites`]), the bounded DataplaneNode writes and the writes left in the background.
//!
//! Without a DataplaneConfig named `default` (never created, or deleted) the plan only creates
//! the DataplaneNodes that are missing and withdraws cleanup where kube-proxy came back:
//! deleting the DataplaneConfig leaves the dataplane as it is, nothing is ripped out under
//! traffic.

mod apply;
mod reconcile;
mod watches;

use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use kube::runtime::reflector;
use kube::Client;
use switchyard_crds::{DataplaneConfig, DataplaneNode, KubeProxySpec};
use switchyard_telemetry::{Health, Heartbeat};

pub use apply::BackgroundWrites;
pub use reconcile::{error_policy, reconcile};
pub use watches::run;

use crate::cache::{OwnWrites, Stores, UnsupportedServices};
use crate::error::Error;
use crate::error_policy as policy;
use crate::events::{Occurrence, Recorder};
use crate::metrics::Metrics;

/// The field manager of every write the operator makes.
pub const FIELD_MANAGER: &str = "switchyard-operator";

/// How long a reconcile waits for the stores' first lists and for its own earlier writes to come
/// back through the watches before it gives up (and retries with backoff).
const CACHE_WAIT: Duration = Duration::from_secs(10);

// Liveness bounds: how long one step of each loop may take before `/healthz` calls the operator
// stuck and the kubelet restarts it. Each is well above the slowest legitimate step: a restart
// in the middle of a slow but healthy step only starts it again, after a new leader election.
//
// A reconcile waits for the stores and its own writes (`CACHE_WAIT` each), then makes its API
// calls one after another (observation, a bounded batch of writes, the status); a call the API
// server never answers ends at kube's read timeout (295 s), after which the reconcile fails.
pub(crate) const RECONCILE_STEP_BOUND: Duration = Duration::from_secs(600);
/// A watch step stores one event and maps it to a trigger, in memory (a relist of every Node of
/// a 5,000-node cluster at most).
const WATCH_STEP_BOUND: Duration = Duration::from_secs(60);
/// An Event's publication is one API call (kube's read timeout, 295 s), logged on failure.
const EVENT_STEP_BOUND: Duration = Duration::from_secs(330);

/// The heartbeats of the controller's long-running loops (see [`Heartbeat`]): the reconcile
/// (one at a time: the controller's concurrency is 1), the reconcile without a DataplaneConfig
/// (its own task), the Event publisher, and one per watch (registered by [`run`]).
pub struct Liveness {
    health: Health,
    pub reconcile: Heartbeat,
    pub without_config: Heartbeat,
    pub events: Heartbeat,
}

impl Liveness {
    pub fn new(health: &Health) -> Self {
        Self {
            health: health.clone(),
            reconcile: health.register_loop("reconcile", RECONCILE_STEP_BOUND),
            without_config: health
                .register_loop("reconcile without a DataplaneConfig", RECONCILE_STEP_BOUND),
            events: health.register_loop("Event publisher", EVENT_STEP_BOUND),
        }
    }

    /// The heartbeat of the watch of `what`.
    fn watch(&self, what: &str) -> Heartbeat {
        self.health
            .register_loop(format!("{what} watch"), WATCH_STEP_BOUND)
    }
}

/// Events queued and not yet published, at most (beyond, an Event is logged and dropped).
const EVENT_QUEUE: usize = 1024;

/// What the controller is told at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerSettings {
    /// Namespace of the agent DaemonSet.
    pub agent_namespace: String,
    /// Name of the agent DaemonSet.
    pub agent_daemon_set: String,
    /// The API server's real address given to the agents; Preflight refuses a transition
    /// without it.
    pub api_server_address: Option<String>,
}

/// Shared by every reconcile.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Metrics,
    pub settings: ControllerSettings,
    /// What the watches have delivered so far.
    pub stores: Stores,
    /// The operator's writes its watches have not delivered yet.
    pub own_writes: Arc<OwnWrites>,
    /// The store writers, taken by [`run`] (which feeds them from the watches).
    writers: Mutex<Option<StoreWriters>>,
    /// Where kube-proxy is, as the `default` DataplaneConfig last said (read by the watch
    /// mappers, so that only that DaemonSet's pods trigger reconciles).
    kube_proxy_location: Arc<std::sync::RwLock<KubeProxyLocation>>,
    consecutive_failures: AtomicU32,
    /// The DataplaneNode CustomResourceDefinition, once read (bulk creation Events name it).
    dataplane_node_crd: OnceLock<ObjectReference>,
    /// Wakes the reconcile of "no DataplaneConfig named `default`".
    without_config: tokio::sync::Notify,
    /// Events wait here for the task that publishes them (taken by [`run`]), so that a slow API
    /// server delays Events, not reconciles. In order, after the step they describe.
    events: tokio::sync::mpsc::Sender<(ObjectReference, Occurrence)>,
    event_queue: Mutex<Option<tokio::sync::mpsc::Receiver<(ObjectReference, Occurrence)>>>,
    /// Writes left to finish in the background (see [`apply`]).
    pub background_writes: Arc<BackgroundWrites>,
    /// The unsupported Services already warned about by an Event, with the features named (see
    /// [`reconcile`](mod@reconcile)): each gets its Event once per operator process and per
    /// change of its features.
    warned_services: Mutex<reconcile::WarnedServices>,
    /// Progress of the loops, for `/healthz`.
    pub liveness: Liveness,
}

struct StoreWriters {
    configs: reflector::store::Writer<DataplaneConfig>,
    nodes: reflector::store::Writer<Node>,
    dataplane_nodes: reflector::store::Writer<DataplaneNode>,
    daemon_sets: reflector::store::Writer<DaemonSet>,
    pods: reflector::store::Writer<Pod>,
    revisions: reflector::store::Writer<ControllerRevision>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct KubeProxyLocation {
    namespace: String,
    name: String,
}

impl KubeProxyLocation {
    fn of(spec: &KubeProxySpec) -> Self {
        Self {
            namespace: spec.namespace.clone(),
            name: spec.daemon_set_name.clone(),
        }
    }
}

impl Context {
    pub fn new(
        client: Client,
        recorder: Recorder,
        metrics: Metrics,
        settings: ControllerSettings,
        health: &Health,
    ) -> Self {
        let (configs, configs_writer) = reflector::store();
        let (nodes, nodes_writer) = reflector::store();
        let (dataplane_nodes, dataplane_nodes_writer) = reflector::store();
        let (daemon_sets, daemon_sets_writer) = reflector::store();
        let (pods, pods_writer) = reflector::store();
        let (revisions, revisions_writer) = reflector::store();
        let (events, event_queue) = tokio::sync::mpsc::channel(EVENT_QUEUE);
        Self {
            client,
            recorder,
            metrics,
            settings,
            stores: Stores {
                configs,
                nodes,
                dataplane_nodes,
                daemon_sets,
                pods,
                revisions,
                unsupported_services: Arc::new(UnsupportedServices::default()),
            },
            own_writes: Arc::new(OwnWrites::default()),
            writers: Mutex::new(Some(StoreWriters {
                configs: configs_writer,
                nodes: nodes_writer,
                dataplane_nodes: dataplane_nodes_writer,
                daemon_sets: daemon_sets_writer,
                pods: pods_writer,
                revisions: revisions_writer,
            })),
            kube_proxy_location: Arc::new(std::sync::RwLock::new(KubeProxyLocation::of(
                &KubeProxySpec::default(),
            ))),
            consecutive_failures: AtomicU32::new(0),
            dataplane_node_crd: OnceLock::new(),
            without_config: tokio::sync::Notify::new(),
            events,
            event_queue: Mutex::new(Some(event_queue)),
            background_writes: {
                let writes = Arc::new(BackgroundWrites::default());
                writes.report_to(health);
                writes
            },
            warned_services: Mutex::new(reconcile::WarnedServices::default()),
            liveness: Liveness::new(health),
        }
    }

    /// Counts a failure in `switchyard_operator_reconcile_errors_total`, by the step that failed.
    fn count_failure(&self, error: &Error) {
        self.metrics
            .reconcile_errors
            .with_label_values(&[policy::step(error)])
            .inc();
    }

    /// Queues an Event about `involved` for the publishing task.
    fn record(&self, involved: &ObjectReference, occurrence: &Occurrence) {
        if let Err(error) = self.events.try_send((involved.clone(), occurrence.clone())) {
            tracing::warn!(%error, reason = %occurrence.reason, message = %occurrence.message, "failed to queue an Event");
        }
    }

    /// Waits until the stores are filled and hold every write this operator made.
    async fn wait_for_fresh_stores(&self) -> Result<(), Error> {
        self.stores.wait_until_ready(CACHE_WAIT).await?;
        self.own_writes.wait_until_observed(CACHE_WAIT).await
    }
}

#[cfg(test)]
mod liveness_tests;
