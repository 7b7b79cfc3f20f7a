//! The controller: a kube-runtime `Controller` on DataplaneConfig, also triggered by
//! DataplaneNodes, Nodes, the kube-proxy DaemonSet and its pods, and the agent DaemonSet and its
//! pods (all mapped to the DataplaneConfig named `default`).
//!
//! Every watch fills a reflector store ([`crate::cache`]); one reconcile: wait until the stores
//! hold every write this operator made ([`OwnWrites`]), take a snapshot from them (no request to
//! the API server, then the pure [`snapshot::observe`]) -> [`plan`] -> apply the plan
//! (Server-Side Apply of DataplaneNode specs as `switchyard-operator`, at most
//! [`MAX_NODE_WRITES_PER_RECONCILE`] per reconcile, the kube-proxy nodeSelector patch, agent pod
//! deletions) -> publish the status (Server-Side Apply on the status subresource), with an Event
//! for every step taken and every refusal.
//!
//! Without a DataplaneConfig named `default` (never created, or deleted) the operator only
//! creates the DataplaneNodes that are missing (mode `KubeProxy`): deleting the DataplaneConfig
//! leaves the dataplane exactly as it is, nothing is ripped out under traffic.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use chrono::Utc;
use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use switchyard_crds::{
    condition_types, find_condition, reasons, ConditionStatus, DataplaneConfig,
    DataplaneConfigStatus, DataplaneMode, DataplaneNode, KubeProxyManagement, KubeProxySpec,
    DEFAULT_CONFIG_NAME,
};

use crate::cache::{self, OwnWrites, Stores, WrittenKind, WrittenObject};
use crate::error::Error;
use crate::error_policy;
use crate::events::{reference_to, Occurrence, Recorder};
use crate::kube_proxy;
use crate::metrics::Metrics;
use crate::planner::{
    plan, AgentPodDeletion, DataplaneNodeWrite, KubeProxyAction, KubeProxyDaemonSet,
    ObservedCluster, Plan,
};
use crate::snapshot::{self, SnapshotNames};

/// The field manager of every write the operator makes.
pub const FIELD_MANAGER: &str = "switchyard-operator";

/// How often the DataplaneConfig is reconciled when nothing changes and no timeout is pending.
const RESYNC_PERIOD: Duration = Duration::from_secs(300);

/// How often the operator checks, without a DataplaneConfig named `default`, that every Node
/// has its DataplaneNode (a retry of failed creations; triggers do it at once otherwise).
const RESYNC_WITHOUT_CONFIG: Duration = Duration::from_secs(30);

/// How long triggers are collected before one reconcile runs (many pods change at once). Also
/// the pause before a reconcile continues the writes the previous one left over.
const DEBOUNCE: Duration = Duration::from_millis(200);

/// The most DataplaneNode writes one reconcile makes, and how long it goes on starting new ones;
/// the rest follow in the next reconcile right away (it plans again from the stores, which by
/// then hold these writes, and picks the same remaining nodes: batches go in node-name order).
/// Bounded work keeps every reconcile short, so a pause, a reversal or a returning kube-proxy is
/// acted on within one short reconcile even while thousands of nodes are being told something.
pub const MAX_NODE_WRITES_PER_RECONCILE: usize = 500;
const NODE_WRITE_TIME_PER_RECONCILE: Duration = Duration::from_millis(60);
/// How long a reconcile waits for the DataplaneNode writes it started, at most, when nothing in
/// its plan must follow them (see `apply_dataplane_nodes`); longer than the time it starts them
/// for, so that the count of started writes is final when it stops waiting.
const NODE_WRITE_WAIT_PER_RECONCILE: Duration = Duration::from_millis(90);
/// How long a reconcile waits for its status write before leaving it to finish in the
/// background (see `apply_status_within`).
const STATUS_WRITE_WAIT: Duration = Duration::from_millis(50);
/// When a reconcile that left writes in the background looks again at the latest.
const BACKGROUND_RECHECK: Duration = Duration::from_secs(1);

/// DataplaneNode writes in flight at once within a reconcile.
const NODE_WRITE_CONCURRENCY: usize = 16;

/// How long a reconcile waits for the stores' first lists and for its own earlier writes to come
/// back through the watches before it gives up (and retries with backoff).
const CACHE_WAIT: Duration = Duration::from_secs(10);

/// Above this many DataplaneNodes created in one reconcile without a DataplaneConfig, one Event
/// about the DataplaneNode CustomResourceDefinition says so instead of one Event per Node (a
/// fresh install on 5,000 nodes would otherwise write 5,000 Events).
const PER_NODE_CREATION_EVENTS: usize = 10;

/// The name of the DataplaneNode CustomResourceDefinition (what bulk creation Events are about).
const DATAPLANE_NODE_CRD: &str = "dataplanenodes.switchyard.dev";

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
    kube_proxy_location: Arc<RwLock<KubeProxyLocation>>,
    consecutive_failures: AtomicU32,
    /// The DataplaneNode CustomResourceDefinition, once read (bulk creation Events name it).
    dataplane_node_crd: OnceLock<ObjectReference>,
    /// Wakes the reconcile of "no DataplaneConfig named `default`".
    without_config: tokio::sync::Notify,
    /// Events wait here for the task that publishes them (taken by [`run`]), so that a slow API
    /// server delays Events, not reconciles. In order, after the step they describe.
    events: tokio::sync::mpsc::Sender<(ObjectReference, Occurrence)>,
    event_queue: Mutex<Option<tokio::sync::mpsc::Receiver<(ObjectReference, Occurrence)>>>,
    /// Writes left to finish in the background (see `apply_dataplane_nodes`).
    pub background_writes: Arc<BackgroundWrites>,
}

/// How soon a refused review is asked again, with a reconcile of its own: a fixed Role or
/// RoleBinding triggers no watch of the operator's.
const PATCH_PERMISSION_RECHECK: Duration = Duration::from_secs(10);

/// Events queued and not yet published, at most (beyond, an Event is logged and dropped).
const EVENT_QUEUE: usize = 1024;

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

impl Context {
    pub fn new(
        client: Client,
        recorder: Recorder,
        metrics: Metrics,
        settings: ControllerSettings,
    ) -> Self {
        let defaults = KubeProxySpec::default();
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
            kube_proxy_location: Arc::new(RwLock::new(KubeProxyLocation {
                namespace: defaults.namespace,
                name: defaults.daemon_set_name,
            })),
            consecutive_failures: AtomicU32::new(0),
            dataplane_node_crd: OnceLock::new(),
            without_config: tokio::sync::Notify::new(),
            events,
            event_queue: Mutex::new(Some(event_queue)),
            background_writes: Arc::new(BackgroundWrites::default()),
        }
    }

    /// Counts a failure in `switchyard_operator_reconcile_errors_total`, by the step that failed.
    fn count_failure(&self, error: &Error) {
        self.metrics
            .reconcile_errors
            .with_label_values(&[error_policy::step(error)])
            .inc();
    }

    /// Queues an Event about `involved` for the publishing task.
    fn record(&self, involved: &ObjectReference, occurrence: &Occurrence) {
        if let Err(error) = self.events.try_send((involved.clone(), occurrence.clone())) {
            tracing::warn!(%error, reason = %occurrence.reason, message = %occurrence.message, "failed to queue an Event");
        }
    }

    /// The write of `written` was answered with `version`. A write that changed nothing (the
    /// object already had that version) brings no watch event: the store holds it already.
    fn note_written<K>(
        &self,
        store: &reflector::Store<K>,
        written: &WrittenObject,
        version: Option<String>,
    ) where
        K: Resource<DynamicType = ()> + Clone + 'static,
    {
        let key = match &written.namespace {
            Some(namespace) => ObjectRef::<K>::new(&written.name).within(namespace),
            None => ObjectRef::<K>::new(&written.name),
        };
        let in_store = version.is_some()
            && store
                .get(&key)
                .and_then(|object| object.meta().resource_version.clone())
                == version;
        if in_store {
            self.own_writes.already_observed(written);
        } else {
            self.own_writes.written(written, version);
        }
    }

    /// Waits until the stores are filled and hold every write this operator made.
    async fn wait_for_fresh_stores(&self) -> Result<(), Error> {
        self.stores.wait_until_ready(CACHE_WAIT).await?;
        self.own_writes.wait_until_observed(CACHE_WAIT).await
    }
}

fn default_config_ref() -> ObjectRef<DataplaneConfig> {
    ObjectRef::new(DEFAULT_CONFIG_NAME)
}

fn owned_by_daemon_set(pod: &Pod, namespace: &str, name: &str) -> bool {
    pod.namespace().as_deref() == Some(namespace)
        && pod
            .owner_references()
            .iter()
            .any(|owner| owner.kind == "DaemonSet" && owner.name == name)
}

/// A watch whose events fill `writer`'s store and are then reported to `own_writes`; yields the
/// objects touched (for triggers). Relists read the API server's most recent state (not its
/// watch cache): [`OwnWrites`] counts on a relist that starts after a write to include it.
fn watched<K>(
    api: Api<K>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
    kind: Option<WrittenKind>,
    own_writes: Arc<OwnWrites>,
    trim: impl FnMut(&mut K) + Send + 'static,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    reflector::reflector(writer, watcher(api, config).default_backoff().modify(trim))
        .inspect(move |event| {
            if let (Some(kind), Ok(event)) = (kind, event) {
                own_writes.observe(kind, event);
            }
        })
        .touched_objects()
}

/// Runs the controller until the returned future is dropped (leadership lost) or the watches end.
pub async fn run(context: Arc<Context>) {
    let Some(writers) = context
        .writers
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
    else {
        tracing::error!("the controller ran twice with one context; its stores are fed already");
        return;
    };
    let Some(mut event_queue) = context
        .event_queue
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
    else {
        tracing::error!(
            "the controller ran twice with one context; its Events are published already"
        );
        return;
    };
    let publisher_context = context.clone();
    let publish_events = async move {
        while let Some((involved, occurrence)) = event_queue.recv().await {
            publisher_context
                .recorder
                .publish_or_log(&involved, &occurrence)
                .await;
        }
    };
    let client = context.client.clone();
    let watch_config = watcher::Config::default();
    let agent_namespace = context.settings.agent_namespace.clone();
    let agent_name = context.settings.agent_daemon_set.clone();
    let own_writes = context.own_writes.clone();

    let location = context.kube_proxy_location.clone();
    let kube_proxy_pods_location = location.clone();
    let (agent_pods_namespace, agent_pods_name) = (agent_namespace.clone(), agent_name.clone());

    let configs = watched(
        Api::<DataplaneConfig>::all(client.clone()),
        watch_config.clone(),
        writers.configs,
        Some(WrittenKind::DataplaneConfig),
        own_writes.clone(),
        cache::drop_managed_fields,
    );
    let dataplane_nodes = watched(
        Api::<DataplaneNode>::all(client.clone()),
        watch_config.clone(),
        writers.dataplane_nodes,
        Some(WrittenKind::DataplaneNode),
        own_writes.clone(),
        cache::drop_managed_fields,
    );
    let nodes = watched(
        Api::<Node>::all(client.clone()),
        watch_config.clone(),
        writers.nodes,
        None,
        own_writes.clone(),
        cache::trim_node,
    );
    let daemon_sets = watched(
        Api::<DaemonSet>::all(client.clone()),
        watch_config.clone(),
        writers.daemon_sets,
        Some(WrittenKind::DaemonSet),
        own_writes.clone(),
        cache::drop_managed_fields,
    );
    let revisions = watched(
        Api::<ControllerRevision>::namespaced(client.clone(), &agent_namespace),
        watch_config.clone(),
        writers.revisions,
        None,
        own_writes.clone(),
        cache::drop_managed_fields,
    );
    // Pods of every namespace, but only DaemonSet pods are kept, trimmed to what decisions read.
    let pod_own_writes = own_writes.clone();
    let pods = reflector::reflector(
        writers.pods,
        watcher(Api::<Pod>::all(client.clone()), watch_config)
            .default_backoff()
            .modify(cache::trim_pod)
            .filter_map(|event| {
                std::future::ready(event.map(cache::only_daemon_set_pods).transpose())
            }),
    )
    .inspect(move |event| {
        if let Ok(event) = event {
            pod_own_writes.observe(WrittenKind::Pod, event);
        }
    })
    .touched_objects();

    let controller = Controller::for_stream(configs, context.stores.configs.clone())
        .with_config(
            kube::runtime::controller::Config::default()
                .debounce(DEBOUNCE)
                .concurrency(1),
        )
        .watches_stream(dataplane_nodes, |_| Some(default_config_ref()))
        .watches_stream(nodes, |_| Some(default_config_ref()))
        .watches_stream(revisions, |_| Some(default_config_ref()))
        .watches_stream(daemon_sets, move |daemon_set| {
            let namespace = daemon_set.namespace().unwrap_or_default();
            let name = daemon_set.name_any();
            let is_agent = namespace == agent_namespace && name == agent_name;
            let is_kube_proxy = location
                .read()
                .map(|location| location.namespace == namespace && location.name == name)
                .unwrap_or(true);
            (is_agent || is_kube_proxy).then(default_config_ref)
        })
        .watches_stream(pods, move |pod| {
            let is_agent = owned_by_daemon_set(&pod, &agent_pods_namespace, &agent_pods_name);
            let is_kube_proxy = kube_proxy_pods_location
                .read()
                .map(|location| owned_by_daemon_set(&pod, &location.namespace, &location.name))
                .unwrap_or(true);
            (is_agent || is_kube_proxy).then(default_config_ref)
        });

    let outcomes_context = context.clone();
    let without_config_context = context.clone();
    let outcomes = controller
        .run(reconcile, error_policy, context)
        .for_each(move |outcome| {
            match outcome {
                Ok(_) => {}
                // Every trigger maps to `default`; when it does not exist, the controller
                // reports it missing instead of reconciling, and the operator still creates
                // missing DataplaneNodes (in its own task: this stream also feeds the stores
                // that reconcile waits on, so it must not wait here).
                Err(kube::runtime::controller::Error::ObjectNotFound(object))
                    if object.name == DEFAULT_CONFIG_NAME =>
                {
                    outcomes_context.without_config.notify_one();
                }
                Err(error) => {
                    tracing::warn!(error = %crate::error::describe(&error), "reconcile failed")
                }
            }
            std::future::ready(())
        });
    // Without a DataplaneConfig there is no object to requeue: a failed creation of
    // DataplaneNodes is retried on the next trigger, or at the latest by this timer.
    let without_config = async move {
        let context = without_config_context;
        let mut interval = tokio::time::interval(RESYNC_WITHOUT_CONFIG);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = interval.tick() => {}
                () = context.without_config.notified() => {}
            }
            // Creations are bounded per reconcile: go on until none is left.
            loop {
                match reconcile_without_config(&context).await {
                    Ok(true) => continue,
                    Ok(false) => break,
                    Err(error) => {
                        context.count_failure(&error);
                        tracing::warn!(error = %crate::error::describe(&error), "failed to reconcile without a DataplaneConfig");
                        break;
                    }
                }
            }
        }
    };
    tokio::select! {
        () = outcomes => {}
        () = without_config => {}
        () = publish_events => {}
    }
}

/// Reconciles one DataplaneConfig.
pub async fn reconcile(
    config: Arc<DataplaneConfig>,
    context: Arc<Context>,
) -> Result<Action, Error> {
    let timer = context.metrics.reconcile_duration.start_timer();
    let started = std::time::Instant::now();
    let name = config.name_any();
    let waited = context.wait_for_fresh_stores().await;
    let waited_for_stores = started.elapsed();
    let outcome = match waited {
        Err(error) => Err(error),
        // The object the controller handed over may predate this operator's last status write:
        // decide from the store, which now holds it.
        Ok(()) if config.name_any() == DEFAULT_CONFIG_NAME => {
            match context.stores.config(DEFAULT_CONFIG_NAME) {
                Some(fresh) => reconcile_default(Some(&fresh), &context).await,
                None => {
                    context.without_config.notify_one();
                    Ok(None)
                }
            }
        }
        Ok(()) => {
            let fresh = context.stores.config(&config.name_any()).unwrap_or(config);
            reconcile_ignored(&fresh, &context).await
        }
    };
    timer.observe_duration();
    tracing::debug!(
        config = %name,
        took_ms = started.elapsed().as_millis() as u64,
        waited_for_stores_ms = waited_for_stores.as_millis() as u64,
        "reconciled"
    );
    match outcome {
        Ok(requeue_after) => {
            context.consecutive_failures.store(0, Ordering::SeqCst);
            Ok(Action::requeue(
                requeue_after.unwrap_or(RESYNC_PERIOD).min(RESYNC_PERIOD),
            ))
        }
        Err(error) => Err(error),
    }
}

/// The decision table of [`error_policy`](crate::error_policy) applied to one failure.
pub fn error_policy(_config: Arc<DataplaneConfig>, error: &Error, context: Arc<Context>) -> Action {
    let failures = context
        .consecutive_failures
        .fetch_add(1, Ordering::SeqCst)
        .saturating_add(1);
    context.count_failure(error);
    let class = error_policy::classify(error);
    let next = error_policy::retry_after(class, failures);
    tracing::warn!(error = %crate::error::describe(error), ?class, retry_in = ?next, "reconcile failed");
    match next {
        Some(delay) => Action::requeue(delay),
        None => Action::await_change(),
    }
}

/// A DataplaneConfig not named `default`: only a status saying it is ignored.
async fn reconcile_ignored(
    config: &DataplaneConfig,
    context: &Context,
) -> Result<Option<Duration>, Error> {
    let observed = ObservedCluster {
        now: Utc::now(),
        nodes: Vec::new(),
        kube_proxy_daemon_set: None,
        agent_daemon_set: None,
        api_server_address_configured: context.settings.api_server_address.is_some(),
    };
    let plan = plan(Some(config), &observed);
    if let Some(status) = &plan.status {
        publish_refusals(config, status, context);
        if config.status.as_ref() != Some(status) {
            apply_status(config, status, context).await?;
        }
    }
    Ok(None)
}

/// No DataplaneConfig named `default`: create missing DataplaneNodes, change nothing else.
/// Returns whether creations are left for another round.
async fn reconcile_without_config(context: &Arc<Context>) -> Result<bool, Error> {
    context.wait_for_fresh_stores().await?;
    if context.stores.config(DEFAULT_CONFIG_NAME).is_some() {
        return Ok(false);
    }
    let timer = context.metrics.reconcile_duration.start_timer();
    let outcome = reconcile_default(None, context).await;
    timer.observe_duration();
    outcome.map(|requeue_after| requeue_after == Some(Duration::ZERO))
}

/// Whether the operator may patch the DaemonSet `namespace/name`, as a SelfSubjectAccessReview
/// answers now; `None` when the review itself failed.
async fn kube_proxy_patch_allowed(context: &Context, namespace: &str, name: &str) -> Option<bool> {
    let review = daemon_set_patch_review(namespace, name);
    match Api::<SelfSubjectAccessReview>::all(context.client.clone())
        .create(&PostParams::default(), &review)
        .await
    {
        Ok(answer) => answer.status.map(|status| status.allowed),
        Err(error) => {
            tracing::warn!(%error, %namespace, %name, "failed to ask whether the operator may patch the kube-proxy DaemonSet");
            None
        }
    }
}

/// Whether a reconcile asks the API server if the operator may patch the kube-proxy DaemonSet:
/// only where the answer can decide whether a transition to eBPF starts (`Managed`, kube-proxy
/// not disabled yet, and no transition under way), so that a refusal holds it in Preflight
/// before any node is switched. Asked afresh each time (RBAC changes trigger no watch), which
/// costs one request per reconcile in those phases only, never per node.
fn asks_patch_permission(config: &DataplaneConfig, daemon_set_disabled: bool) -> bool {
    let transition_under_way = config
        .status
        .as_ref()
        .is_some_and(|status| crate::planner::switches_nodes(status.phase));
    config.spec.mode == DataplaneMode::Ebpf
        && config.spec.kube_proxy.management == KubeProxyManagement::Managed
        && !daemon_set_disabled
        && !transition_under_way
}

/// The question "may I patch DaemonSet `namespace/name`?" for the API server.
fn daemon_set_patch_review(namespace: &str, name: &str) -> SelfSubjectAccessReview {
    SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some("apps".into()),
                resource: Some("daemonsets".into()),
                verb: Some("patch".into()),
                namespace: Some(namespace.to_string()),
                name: Some(name.to_string()),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    }
}

/// The `default` DataplaneConfig (or none): snapshot -> plan -> apply -> status. Returns when to
/// reconcile again if nothing changes (`Some(ZERO)` when writes were left for the next round).
async fn reconcile_default(
    config: Option<&DataplaneConfig>,
    context: &Arc<Context>,
) -> Result<Option<Duration>, Error> {
    let kube_proxy_spec = config
        .map(|config| config.spec.kube_proxy.clone())
        .unwrap_or_default();
    if let Ok(mut location) = context.kube_proxy_location.write() {
        *location = KubeProxyLocation {
            namespace: kube_proxy_spec.namespace.clone(),
            name: kube_proxy_spec.daemon_set_name.clone(),
        };
    }
    let snapshot_started = std::time::Instant::now();
    let objects = context.stores.objects(
        &kube_proxy_spec,
        &context.settings.agent_namespace,
        &context.settings.agent_daemon_set,
    );
    let names = SnapshotNames {
        kube_proxy_daemon_set: kube_proxy_spec.daemon_set_name.clone(),
        agent_daemon_set: context.settings.agent_daemon_set.clone(),
    };
    let mut observed = snapshot::observe(
        &objects,
        &names,
        Utc::now(),
        context.settings.api_server_address.is_some(),
    );
    if let (Some(config), Some(daemon_set)) = (config, observed.kube_proxy_daemon_set.as_mut()) {
        if asks_patch_permission(config, daemon_set.disabled_by_switchyard) {
            daemon_set.patch_allowed = kube_proxy_patch_allowed(
                context,
                &kube_proxy_spec.namespace,
                &kube_proxy_spec.daemon_set_name,
            )
            .await;
        }
    }
    let patch_refused = observed
        .kube_proxy_daemon_set
        .as_ref()
        .is_some_and(KubeProxyDaemonSet::patch_refused);
    let mut plan = plan(config, &observed);
    drop(observed);
    if patch_refused {
        plan.requeue_after = Some(
            plan.requeue_after
                .map_or(PATCH_PERMISSION_RECHECK, |after| {
                    after.min(PATCH_PERMISSION_RECHECK)
                }),
        );
    }
    if config.is_none() {
        plan = only_creations(plan);
    }
    // Bounded work per reconcile: the writes left over are planned again (the same ones, in
    // node-name order) by the next reconcile, which runs at once.
    plan.dataplane_nodes.truncate(MAX_NODE_WRITES_PER_RECONCILE);

    let node_uids: BTreeMap<&str, &str> = objects
        .nodes
        .iter()
        .filter_map(|node| {
            Some((
                node.metadata.name.as_deref()?,
                node.metadata.uid.as_deref()?,
            ))
        })
        .collect();
    let config_reference = config.map(reference_to);
    let kube_proxy_reference = objects.kube_proxy_daemon_set.as_deref().map(reference_to);
    let previous_status = config.and_then(|config| config.status.as_ref());

    let planned = std::time::Instant::now();
    let planned_writes = plan.dataplane_nodes.len();
    // Node writes still in flight when the reconcile stops waiting may finish in the background
    // only when nothing else in this plan must follow them (a kube-proxy patch or an agent pod
    // deletion is applied after the node writes it goes with, as the plan orders them).
    let later_steps_follow =
        plan.kube_proxy != KubeProxyAction::None || !plan.agent_pods_to_delete.is_empty();
    let applied = apply_dataplane_nodes(
        context,
        &plan.dataplane_nodes,
        &node_uids,
        !later_steps_follow,
    )
    .await?;
    let more_writes_left = applied.started < planned_writes;
    let mut left_in_background = applied.left_in_background;
    // The Events describe what was written (or is being written: see apply_dataplane_nodes).
    plan.dataplane_nodes.truncate(applied.started);
    let steps = steps_of(previous_status, &plan);
    tracing::debug!(
        nodes = objects.nodes.len(),
        writes = plan.dataplane_nodes.len(),
        more_writes_left,
        planning_took_ms = (planned - snapshot_started).as_millis() as u64,
        writes_took_ms = planned.elapsed().as_millis() as u64,
        "applied the plan's DataplaneNode writes"
    );
    if let Some(occurrence) = steps.dataplane_nodes {
        match &config_reference {
            Some(reference) => context.record(reference, &occurrence),
            None => publish_creations(context, &plan.dataplane_nodes, &objects.nodes).await,
        }
    }

    if plan.kube_proxy != KubeProxyAction::None {
        if let Some(daemon_set) = &objects.kube_proxy_daemon_set {
            apply_kube_proxy_action(context, daemon_set, plan.kube_proxy).await?;
            if let Some(occurrence) = &steps.kube_proxy {
                for reference in config_reference.iter().chain(kube_proxy_reference.iter()) {
                    context.record(reference, occurrence);
                }
            }
        }
    }

    for deletion in &plan.agent_pods_to_delete {
        let uid = objects
            .agent_namespace_pods
            .iter()
            .find(|pod| pod.metadata.name.as_deref() == Some(deletion.pod_name.as_str()))
            .and_then(|pod| pod.metadata.uid.clone());
        delete_agent_pod(context, deletion, uid).await?;
    }
    if let (Some(reference), Some(occurrence)) = (&config_reference, &steps.agent_pods) {
        context.record(reference, occurrence);
    }

    if let (Some(config), Some(status)) = (config, &plan.status) {
        if let Some(reference) = &config_reference {
            if let Some(occurrence) = &steps.phase {
                context.record(reference, occurrence);
            }
        }
        publish_refusals(config, status, context);
        context.metrics.observe_status(status);
        if config.status.as_ref() != Some(status) {
            left_in_background |=
                apply_status_within(config, status, context, STATUS_WRITE_WAIT).await?;
        }
    }
    if more_writes_left {
        return Ok(Some(Duration::ZERO));
    }
    if left_in_background {
        // A write that fails in the background is no reconcile failure: look again soon, so
        // that it is planned again without waiting for the next trigger.
        return Ok(Some(
            plan.requeue_after
                .map_or(BACKGROUND_RECHECK, |after| after.min(BACKGROUND_RECHECK)),
        ));
    }
    Ok(plan.requeue_after)
}

/// Events about DataplaneNodes created without a DataplaneConfig: each Node carries the Event
/// about its own, unless many were created at once; then one Event about the DataplaneNode
/// CustomResourceDefinition names them.
async fn publish_creations(context: &Context, writes: &[DataplaneNodeWrite], nodes: &[Arc<Node>]) {
    let created: Vec<&DataplaneNodeWrite> = writes.iter().filter(|write| write.create).collect();
    if created.len() > PER_NODE_CREATION_EVENTS {
        let reference = dataplane_node_crd_reference(context).await;
        context.record(&reference, &bulk_creation(&created));
        return;
    }
    for write in created {
        if let Some(node) = nodes
            .iter()
            .find(|node| node.metadata.name.as_deref() == Some(write.node_name.as_str()))
        {
            let created = Occurrence::normal(
                "DataplaneNodeCreated",
                "ApplyDataplaneNode",
                format!("created DataplaneNode {}", describe_write(write)),
            );
            context.record(&reference_to(node.as_ref()), &created);
        }
    }
}

/// The Event for many DataplaneNodes created at once (node-name order: first and last named).
/// Pure.
pub fn bulk_creation(created: &[&DataplaneNodeWrite]) -> Occurrence {
    let first = created.first().map(|write| write.node_name.as_str());
    let last = created.last().map(|write| write.node_name.as_str());
    let modes: std::collections::BTreeSet<String> = created
        .iter()
        .map(|write| write.spec.mode.to_string())
        .collect();
    Occurrence::normal(
        "DataplaneNodesCreated",
        "ApplyDataplaneNode",
        format!(
            "created {} DataplaneNodes (mode {}) for Nodes {} to {}",
            created.len(),
            modes.into_iter().collect::<Vec<_>>().join(", "),
            first.unwrap_or_default(),
            last.unwrap_or_default()
        ),
    )
}

/// The DataplaneNode CustomResourceDefinition as an Event's object (read once; without its UID
/// when it cannot be read).
async fn dataplane_node_crd_reference(context: &Context) -> ObjectReference {
    if let Some(reference) = context.dataplane_node_crd.get() {
        return reference.clone();
    }
    match Api::<CustomResourceDefinition>::all(context.client.clone())
        .get(DATAPLANE_NODE_CRD)
        .await
    {
        Ok(definition) => context
            .dataplane_node_crd
            .get_or_init(|| reference_to(&definition))
            .clone(),
        Err(error) => {
            tracing::debug!(%error, "failed to read the DataplaneNode CustomResourceDefinition for an Event");
            ObjectReference {
                api_version: Some(CustomResourceDefinition::api_version(&()).into_owned()),
                kind: Some(CustomResourceDefinition::kind(&()).into_owned()),
                name: Some(DATAPLANE_NODE_CRD.to_owned()),
                ..ObjectReference::default()
            }
        }
    }
}

/// The plan restricted to creating missing DataplaneNodes: what the operator does while no
/// DataplaneConfig named `default` exists.
pub fn only_creations(plan: Plan) -> Plan {
    Plan {
        dataplane_nodes: plan
            .dataplane_nodes
            .into_iter()
            .filter(|write| write.create)
            .collect(),
        kube_proxy: KubeProxyAction::None,
        agent_pods_to_delete: Vec::new(),
        status: None,
        requeue_after: None,
    }
}

/// The Events a plan's steps deserve (at most one per kind of step).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Steps {
    pub dataplane_nodes: Option<Occurrence>,
    pub kube_proxy: Option<Occurrence>,
    pub agent_pods: Option<Occurrence>,
    pub phase: Option<Occurrence>,
}

/// Describes what the plan does, for Events. Pure.
pub fn steps_of(previous: Option<&DataplaneConfigStatus>, plan: &Plan) -> Steps {
    let mut steps = Steps::default();
    let created: Vec<&DataplaneNodeWrite> = plan
        .dataplane_nodes
        .iter()
        .filter(|write| write.create)
        .collect();
    let updated: Vec<&DataplaneNodeWrite> = plan
        .dataplane_nodes
        .iter()
        .filter(|write| !write.create)
        .collect();
    let mut parts = Vec::new();
    if !created.is_empty() {
        parts.push(format!(
            "created DataplaneNodes for {}",
            created
                .iter()
                .map(|write| describe_write(write))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if !updated.is_empty() {
        parts.push(format!(
            "told {}",
            updated
                .iter()
                .map(|write| describe_write(write))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if !parts.is_empty() {
        let reason = if updated.is_empty() {
            "DataplaneNodesCreated"
        } else {
            "NodesInstructed"
        };
        steps.dataplane_nodes = Some(Occurrence::normal(
            reason,
            "ApplyDataplaneNode",
            parts.join("; "),
        ));
    }

    let status_message = plan
        .status
        .as_ref()
        .and_then(|status| status.message.clone());
    let returned = plan.status.as_ref().is_some_and(|status| {
        status
            .conditions
            .iter()
            .any(|condition| condition.reason == reasons::KUBE_PROXY_RETURNED)
    });
    steps.kube_proxy = match plan.kube_proxy {
        KubeProxyAction::None => None,
        KubeProxyAction::Disable => Some(Occurrence::normal(
            if returned { "KubeProxyDisabledAgain" } else { "KubeProxyDisabled" },
            "DisableKubeProxy",
            format!(
                "added nodeSelector {}={} to the kube-proxy DaemonSet (previous selector recorded in {}){}",
                kube_proxy::DISABLED_SELECTOR_KEY,
                kube_proxy::DISABLED_SELECTOR_VALUE,
                kube_proxy::PREVIOUS_SELECTOR_ANNOTATION,
                status_message.as_deref().map(|message| format!(": {message}")).unwrap_or_default()
            ),
        )),
        KubeProxyAction::Restore => Some(Occurrence::normal(
            "KubeProxyRestored",
            "RestoreKubeProxy",
            "put back the kube-proxy DaemonSet's nodeSelector exactly as it was before Switchyard disabled it",
        )),
    };

    if !plan.agent_pods_to_delete.is_empty() {
        steps.agent_pods = Some(Occurrence::normal(
            "AgentPodsDeleted",
            "UpgradeAgents",
            format!(
                "deleted agent pods so that the DaemonSet recreates them at its update revision: {}",
                plan.agent_pods_to_delete
                    .iter()
                    .map(|AgentPodDeletion { node_name, pod_name }| format!("{pod_name} on {node_name}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }

    if let Some(status) = &plan.status {
        let previous_phase = previous.map(|previous| previous.phase);
        if previous_phase != Some(status.phase) {
            let from = previous_phase.map_or_else(|| "none".to_owned(), |phase| phase.to_string());
            steps.phase = Some(Occurrence::normal(
                "PhaseChanged",
                "Plan",
                format!(
                    "phase {from} -> {}{}",
                    status.phase,
                    status
                        .message
                        .as_deref()
                        .map(|message| format!(": {message}"))
                        .unwrap_or_default()
                ),
            ));
        }
    }
    steps
}

fn describe_write(write: &DataplaneNodeWrite) -> String {
    format!(
        "{} (mode {}{})",
        write.node_name,
        write.spec.mode,
        if write.spec.iptables_cleanup {
            ", clean kube-proxy rules"
        } else {
            ""
        }
    )
}

/// A refusal to publish: the `Degraded` condition of `new` when it is `True` and differs (reason
/// or message) from the one in `previous`. Pure.
pub fn refusal(
    previous: Option<&DataplaneConfigStatus>,
    new: &DataplaneConfigStatus,
) -> Option<Occurrence> {
    let degraded = find_condition(&new.conditions, condition_types::DEGRADED)?;
    if degraded.status != ConditionStatus::True {
        return None;
    }
    let before = previous
        .and_then(|previous| find_condition(&previous.conditions, condition_types::DEGRADED));
    let unchanged = before.is_some_and(|before| {
        before.status == ConditionStatus::True
            && before.reason == degraded.reason
            && before.message == degraded.message
    });
    (!unchanged).then(|| Occurrence::warning(&degraded.reason, "Refuse", degraded.message.clone()))
}

fn publish_refusals(config: &DataplaneConfig, status: &DataplaneConfigStatus, context: &Context) {
    if let Some(occurrence) = refusal(config.status.as_ref(), status) {
        context.record(&reference_to(config), &occurrence);
    }
}

/// The object applied for one DataplaneNode: its whole spec and its owner, the Node (so it is
/// garbage-collected with it). Pure.
pub fn dataplane_node_object(write: &DataplaneNodeWrite, node_uid: Option<&str>) -> Value {
    let mut metadata = json!({ "name": write.node_name });
    if let Some(uid) = node_uid {
        metadata["ownerReferences"] = json!([{
            "apiVersion": "v1",
            "kind": "Node",
            "name": write.node_name,
            "uid": uid,
        }]);
    }
    json!({
        "apiVersion": DataplaneNode::api_version(&()),
        "kind": DataplaneNode::kind(&()),
        "metadata": metadata,
        "spec": write.spec,
    })
}

/// The object applied to a DataplaneConfig's status subresource. Pure.
pub fn status_object(config_name: &str, status: &DataplaneConfigStatus) -> Value {
    json!({
        "apiVersion": DataplaneConfig::api_version(&()),
        "kind": DataplaneConfig::kind(&()),
        "metadata": { "name": config_name },
        "status": status,
    })
}

/// Applies `writes` in order, [`NODE_WRITE_CONCURRENCY`] at a time, starting new ones for
/// [`NODE_WRITE_TIME_PER_RECONCILE`]; returns how many were started (always the first ones) and
/// whether some were left to finish in the background, or the first failure among those that
/// ended while the reconcile waited.
///
/// The reconcile waits for the writes it started until they end, or, when
/// `may_finish_in_background`, at most [`NODE_WRITE_WAIT_PER_RECONCILE`]: a write the API server
/// is slow to answer then finishes in the background instead of holding the reconcile (and with
/// it a pause, a reversal or a returning kube-proxy) for its whole latency. Nothing decides on it
/// meanwhile: [`OwnWrites`] makes the next reconcile wait until the stores hold it (or until it
/// failed, which is logged and counted; the next plan picks the same node again).
async fn apply_dataplane_nodes(
    context: &Arc<Context>,
    writes: &[DataplaneNodeWrite],
    node_uids: &BTreeMap<&str, &str>,
    may_finish_in_background: bool,
) -> Result<AppliedWrites, Error> {
    if writes.is_empty() {
        return Ok(AppliedWrites {
            started: 0,
            left_in_background: false,
        });
    }
    let batch: Vec<(DataplaneNodeWrite, Option<String>)> = writes
        .iter()
        .map(|write| {
            let uid = node_uids
                .get(write.node_name.as_str())
                .map(|uid| uid.to_string());
            (write.clone(), uid)
        })
        .collect();
    let gate = Arc::new(StartGate::default());
    let (outcomes_sender, mut outcomes) = tokio::sync::mpsc::unbounded_channel();
    let writer_context = Arc::clone(context);
    let writer_gate = Arc::clone(&gate);
    // Both deadlines count from now, whenever the writer task first runs.
    let stop_starting = tokio::time::sleep(NODE_WRITE_TIME_PER_RECONCILE);
    let stop_waiting = tokio::time::sleep(NODE_WRITE_WAIT_PER_RECONCILE);
    context.background_writes.spawn(async move {
        // Each future owns what it writes: futures borrowing from the batch trip the
        // compiler's higher-ranked lifetime check for `Send` futures in a spawned task.
        let applies: Vec<_> = batch
            .into_iter()
            .map(|(write, uid)| {
                let context = Arc::clone(&writer_context);
                let gate = Arc::clone(&writer_gate);
                async move {
                    if !gate.start() {
                        // The reconcile has counted what started: this one never does.
                        return (write.node_name, None);
                    }
                    let outcome = apply_dataplane_node(&context, &write, uid.as_deref()).await;
                    (write.node_name, Some(outcome))
                }
            })
            .collect();
        futures::stream::iter(applies)
            .take_until(stop_starting)
            .buffer_unordered(NODE_WRITE_CONCURRENCY)
            .for_each(|(node_name, outcome)| {
                let Some(outcome) = outcome else {
                    return std::future::ready(());
                };
                if let Err(error) = outcomes_sender.send(outcome) {
                    // The reconcile stopped waiting: this write finished in the background.
                    if let Err(failure) = error.0 {
                        writer_context.count_failure(&failure);
                        tracing::warn!(node = %node_name, error = %crate::error::describe(&failure), "failed to apply a DataplaneNode spec in the background; the next reconcile plans it again");
                    }
                }
                std::future::ready(())
            })
            .await;
    });

    tokio::pin!(stop_waiting);
    let mut first_failure = None;
    let mut left_in_background = false;
    loop {
        tokio::select! {
            outcome = outcomes.recv() => match outcome {
                Some(Ok(())) => {}
                Some(Err(failure)) => {
                    first_failure.get_or_insert(failure);
                }
                // Every started write has ended.
                None => break,
            },
            () = &mut stop_waiting, if may_finish_in_background => {
                tracing::debug!("leaving the DataplaneNode writes still in flight to finish in the background");
                left_in_background = true;
                break;
            }
        }
    }
    // Closing the gate and reading the count is one step: no write starts uncounted.
    let started = gate.close();
    match first_failure {
        Some(failure) => Err(failure),
        None => Ok(AppliedWrites {
            started,
            left_in_background,
        }),
    }
}

/// What [`apply_dataplane_nodes`] did.
struct AppliedWrites {
    /// Writes started (the first ones of the plan).
    started: usize,
    /// Some of them were still in flight when the reconcile stopped waiting.
    left_in_background: bool,
}

/// Which writes of a reconcile started: once the reconcile stops waiting and closes the gate,
/// no other starts, so the count it reads is final.
#[derive(Default)]
struct StartGate {
    /// (closed, writes started)
    state: Mutex<(bool, usize)>,
}

impl StartGate {
    /// Whether a write may start (and is then counted).
    fn start(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.0 {
            return false;
        }
        state.1 += 1;
        true
    }

    /// Closes the gate; the number of writes that started.
    fn close(&self) -> usize {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.0 = true;
        state.1
    }
}

/// The operator's writes that finish in the background: counted, so that a graceful shutdown
/// waits for them before releasing the leader Lease (no write of an old leader lands after the
/// next one took over).
#[derive(Default)]
pub struct BackgroundWrites {
    in_flight: AtomicUsize,
    idle: tokio::sync::Notify,
}

impl BackgroundWrites {
    fn spawn(self: &Arc<Self>, work: impl std::future::Future<Output = ()> + Send + 'static) {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let tracker = Arc::clone(self);
        tokio::spawn(async move {
            work.await;
            if tracker.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
                tracker.idle.notify_waiters();
            }
        });
    }

    /// Waits until no background write is left, for at most `limit`; whether none is.
    pub async fn wait_until_idle(&self, limit: Duration) -> bool {
        let waited = tokio::time::timeout(limit, async {
            loop {
                let idle = self.idle.notified();
                if self.in_flight.load(Ordering::SeqCst) == 0 {
                    return;
                }
                idle.await;
            }
        })
        .await;
        waited.is_ok()
    }
}

async fn apply_dataplane_node(
    context: &Context,
    write: &DataplaneNodeWrite,
    node_uid: Option<&str>,
) -> Result<(), Error> {
    let api: Api<DataplaneNode> = Api::all(context.client.clone());
    let object = dataplane_node_object(write, node_uid);
    let written = WrittenObject::new(WrittenKind::DataplaneNode, None, &write.node_name);
    context.own_writes.begin(&written);
    match api
        .patch(
            &write.node_name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&object),
        )
        .await
    {
        Ok(applied) => context.note_written(
            &context.stores.dataplane_nodes,
            &written,
            applied.metadata.resource_version,
        ),
        Err(source) => {
            context.own_writes.abandon(&written);
            return Err(Error::ApplyDataplaneNode {
                name: write.node_name.clone(),
                source: source.into(),
            });
        }
    }
    tracing::info!(node = %write.node_name, mode = %write.spec.mode, cleanup = write.spec.iptables_cleanup, create = write.create, "applied DataplaneNode spec");
    Ok(())
}

/// [`apply_status`], waited for at most `wait`: the status is the reconcile's last step, so a
/// status write the API server is slow to answer (queued behind the node writes still in flight)
/// finishes in the background; the next reconcile waits for it through [`OwnWrites`], and a
/// failure is logged and counted (the next reconcile finds the status unchanged and writes it
/// again).
async fn apply_status_within(
    config: &DataplaneConfig,
    status: &DataplaneConfigStatus,
    context: &Arc<Context>,
    wait: Duration,
) -> Result<bool, Error> {
    let config = config.clone();
    let status = status.clone();
    let writer_context = Arc::clone(context);
    let (outcome_sender, outcome) = tokio::sync::oneshot::channel();
    context.background_writes.spawn(async move {
        let written = apply_status(&config, &status, &writer_context).await;
        // Sending fails once the reconcile stopped waiting: this write finished in the
        // background, and a failure is told here.
        if let Err(Err(failure)) = outcome_sender.send(written) {
            writer_context.count_failure(&failure);
            tracing::warn!(error = %crate::error::describe(&failure), "failed to apply the DataplaneConfig status in the background; the next reconcile writes it again");
        }
    });
    match tokio::time::timeout(wait, outcome).await {
        Ok(Ok(written)) => written.map(|()| false),
        Ok(Err(ended)) => Err(Error::ApplyStatusTask {
            reason: ended.to_string(),
        }),
        Err(_) => {
            tracing::debug!("leaving the status write to finish in the background");
            Ok(true)
        }
    }
}

async fn apply_status(
    config: &DataplaneConfig,
    status: &DataplaneConfigStatus,
    context: &Context,
) -> Result<(), Error> {
    let api: Api<DataplaneConfig> = Api::all(context.client.clone());
    let name = config.name_any();
    let written = WrittenObject::new(WrittenKind::DataplaneConfig, None, &name);
    context.own_writes.begin(&written);
    match api
        .patch_status(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&status_object(&name, status)),
        )
        .await
    {
        Ok(applied) => {
            context.note_written(
                &context.stores.configs,
                &written,
                applied.metadata.resource_version,
            );
            Ok(())
        }
        Err(source) => {
            context.own_writes.abandon(&written);
            Err(Error::ApplyStatus {
                name,
                source: source.into(),
            })
        }
    }
}

async fn apply_kube_proxy_action(
    context: &Context,
    daemon_set: &DaemonSet,
    action: KubeProxyAction,
) -> Result<(), Error> {
    let namespace = daemon_set.namespace().unwrap_or_default();
    let name = daemon_set.name_any();
    let computed = match action {
        KubeProxyAction::None => return Ok(()),
        KubeProxyAction::Disable => {
            // The planner refuses already; this guards against a planner change.
            if let Some(owner) = kube_proxy::external_owner(daemon_set) {
                return Err(Error::ComputeKubeProxyPatch {
                    namespace,
                    name,
                    reason: format!("it is managed by another tool ({owner})"),
                });
            }
            kube_proxy::disable_patch(daemon_set)
        }
        KubeProxyAction::Restore => kube_proxy::restore_patch(daemon_set),
    };
    let patch = computed.map_err(|refusal| Error::ComputeKubeProxyPatch {
        namespace: namespace.clone(),
        name: name.clone(),
        reason: refusal.to_string(),
    })?;
    let Some(patch) = patch else { return Ok(()) };
    let written = WrittenObject::new(WrittenKind::DaemonSet, Some(&namespace), &name);
    context.own_writes.begin(&written);
    match Api::<DaemonSet>::namespaced(context.client.clone(), &namespace)
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(patched) => context.note_written(
            &context.stores.daemon_sets,
            &written,
            patched.metadata.resource_version,
        ),
        Err(source) => {
            context.own_writes.abandon(&written);
            return Err(Error::PatchKubeProxy {
                namespace: namespace.clone(),
                name: name.clone(),
                source: source.into(),
            });
        }
    }
    tracing::info!(%namespace, %name, ?action, "patched the kube-proxy DaemonSet");
    Ok(())
}

async fn delete_agent_pod(
    context: &Context,
    deletion: &AgentPodDeletion,
    uid: Option<String>,
) -> Result<(), Error> {
    let namespace = context.settings.agent_namespace.as_str();
    let params = DeleteParams {
        // Only the pod the plan saw: never a replacement that happens to reuse the name.
        preconditions: uid.map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let written = WrittenObject::new(WrittenKind::Pod, Some(namespace), &deletion.pod_name);
    context.own_writes.begin(&written);
    match Api::<Pod>::namespaced(context.client.clone(), namespace)
        .delete(&deletion.pod_name, &params)
        .await
    {
        Ok(outcome) => {
            match outcome.left() {
                // Graceful: the pod stays, marked for deletion, until its kubelet confirms.
                Some(pod) => context.note_written(
                    &context.stores.pods,
                    &written,
                    pod.metadata.resource_version,
                ),
                None => context.own_writes.deleted(&written),
            }
            tracing::info!(pod = %deletion.pod_name, node = %deletion.node_name, "deleted agent pod for upgrade");
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {
            context.own_writes.abandon(&written);
            Ok(())
        }
        Err(source) => {
            context.own_writes.abandon(&written);
            Err(Error::DeleteAgentPod {
                namespace: namespace.to_owned(),
                name: deletion.pod_name.clone(),
                source: source.into(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{DateTime, Utc};
    use switchyard_crds::{Condition, DataplaneNodeSpec, DataplanePhase};

    #[test]
    fn the_patch_review_asks_for_patch_on_exactly_the_named_daemon_set() {
        let review = daemon_set_patch_review("kube-system", "kube-proxy");
        let attributes = review
            .spec
            .resource_attributes
            .expect("resource attributes");
        assert_eq!(attributes.group.as_deref(), Some("apps"));
        assert_eq!(attributes.resource.as_deref(), Some("daemonsets"));
        assert_eq!(attributes.verb.as_deref(), Some("patch"));
        assert_eq!(attributes.namespace.as_deref(), Some("kube-system"));
        assert_eq!(attributes.name.as_deref(), Some("kube-proxy"));
        assert!(review.spec.non_resource_attributes.is_none());
    }

    #[test]
    fn the_patch_permission_is_asked_only_where_it_can_hold_a_transition_to_ebpf_in_preflight() {
        let config = |mode, management, phase: Option<DataplanePhase>| {
            let mut config = DataplaneConfig::new("default", Default::default());
            config.spec.mode = mode;
            config.spec.kube_proxy.management = management;
            config.status = phase.map(|phase| DataplaneConfigStatus {
                phase,
                ..DataplaneConfigStatus::default()
            });
            config
        };
        let managed = KubeProxyManagement::Managed;
        for phase in [
            None,
            Some(DataplanePhase::Pending),
            Some(DataplanePhase::Preflight),
            Some(DataplanePhase::Ready),
            Some(DataplanePhase::Halted),
        ] {
            assert!(
                asks_patch_permission(&config(DataplaneMode::Ebpf, managed, phase), false),
                "{phase:?}"
            );
        }
        for phase in [
            DataplanePhase::ActivatingNodes,
            DataplanePhase::DisablingKubeProxy,
            DataplanePhase::CleaningRules,
        ] {
            assert!(
                !asks_patch_permission(&config(DataplaneMode::Ebpf, managed, Some(phase)), false),
                "{phase:?}"
            );
        }
        assert!(!asks_patch_permission(
            &config(DataplaneMode::Ebpf, managed, None),
            true
        ));
        assert!(!asks_patch_permission(
            &config(DataplaneMode::KubeProxy, managed, None),
            false
        ));
        assert!(!asks_patch_permission(
            &config(DataplaneMode::Ebpf, KubeProxyManagement::External, None),
            false
        ));
    }

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-22T01:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    fn write(node: &str, create: bool, mode: DataplaneMode, cleanup: bool) -> DataplaneNodeWrite {
        let mut spec = DataplaneNodeSpec::new(mode);
        spec.iptables_cleanup = cleanup;
        spec.requested_at = Some(now());
        DataplaneNodeWrite {
            node_name: node.into(),
            create,
            spec,
        }
    }

    fn empty_plan() -> Plan {
        Plan {
            dataplane_nodes: Vec::new(),
            kube_proxy: KubeProxyAction::None,
            agent_pods_to_delete: Vec::new(),
            status: None,
            requeue_after: None,
        }
    }

    fn degraded(reason: &str, message: &str) -> DataplaneConfigStatus {
        DataplaneConfigStatus {
            conditions: vec![Condition::new(
                condition_types::DEGRADED,
                ConditionStatus::True,
                reason,
                message,
                Some(1),
                now(),
            )],
            ..DataplaneConfigStatus::default()
        }
    }

    #[test]
    fn without_a_dataplane_config_only_missing_dataplane_nodes_are_created() {
        let plan = Plan {
            dataplane_nodes: vec![
                write("a", true, DataplaneMode::KubeProxy, false),
                write("b", false, DataplaneMode::KubeProxy, false),
            ],
            kube_proxy: KubeProxyAction::Restore,
            agent_pods_to_delete: vec![AgentPodDeletion {
                node_name: "a".into(),
                pod_name: "agent-a".into(),
            }],
            status: None,
            requeue_after: Some(Duration::from_secs(3)),
        };
        let restricted = only_creations(plan);
        assert_eq!(restricted.dataplane_nodes.len(), 1);
        assert_eq!(restricted.dataplane_nodes[0].node_name, "a");
        assert_eq!(
            restricted.kube_proxy,
            KubeProxyAction::None,
            "deleting the DataplaneConfig must leave kube-proxy as it is"
        );
        assert!(restricted.agent_pods_to_delete.is_empty());
    }

    #[test]
    fn a_dataplane_node_is_applied_whole_and_owned_by_its_node() {
        let object = dataplane_node_object(
            &write("node-a", true, DataplaneMode::Ebpf, true),
            Some("uid-1"),
        );
        assert_eq!(object["apiVersion"], "switchyard.dev/v1alpha1");
        assert_eq!(object["kind"], "DataplaneNode");
        assert_eq!(object["metadata"]["name"], "node-a");
        assert_eq!(object["metadata"]["ownerReferences"][0]["kind"], "Node");
        assert_eq!(object["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        assert_eq!(object["spec"]["mode"], "Ebpf");
        assert_eq!(object["spec"]["iptablesCleanup"], true);
        assert_eq!(object["spec"]["requestedAt"], "2026-11-22T01:00:00Z");
        assert!(
            object.get("status").is_none(),
            "the operator never writes what the agent reports"
        );
    }

    #[test]
    fn the_status_is_applied_to_the_status_subresource_with_its_generation() {
        let status = DataplaneConfigStatus {
            observed_generation: Some(4),
            phase: DataplanePhase::ActivatingNodes,
            ..DataplaneConfigStatus::default()
        };
        let object = status_object("default", &status);
        assert_eq!(object["kind"], "DataplaneConfig");
        assert_eq!(object["status"]["observedGeneration"], 4);
        assert_eq!(object["status"]["phase"], "ActivatingNodes");
        assert!(
            object.get("spec").is_none(),
            "the status apply must not claim the user's spec"
        );
    }

    #[test]
    fn every_kind_of_step_gets_an_event() {
        let mut plan = empty_plan();
        plan.dataplane_nodes = vec![
            write("a", true, DataplaneMode::KubeProxy, false),
            write("b", false, DataplaneMode::Ebpf, true),
        ];
        plan.kube_proxy = KubeProxyAction::Disable;
        plan.agent_pods_to_delete = vec![AgentPodDeletion {
            node_name: "a".into(),
            pod_name: "agent-x".into(),
        }];
        plan.status = Some(DataplaneConfigStatus {
            phase: DataplanePhase::DisablingKubeProxy,
            ..DataplaneConfigStatus::default()
        });
        let previous = DataplaneConfigStatus {
            phase: DataplanePhase::ActivatingNodes,
            ..DataplaneConfigStatus::default()
        };
        let steps = steps_of(Some(&previous), &plan);
        let nodes = steps.dataplane_nodes.unwrap();
        assert!(
            nodes
                .message
                .contains("created DataplaneNodes for a (mode KubeProxy)"),
            "{}",
            nodes.message
        );
        assert!(
            nodes
                .message
                .contains("told b (mode Ebpf, clean kube-proxy rules)"),
            "{}",
            nodes.message
        );
        assert_eq!(steps.kube_proxy.unwrap().reason, "KubeProxyDisabled");
        assert!(steps.agent_pods.unwrap().message.contains("agent-x on a"));
        assert!(steps
            .phase
            .unwrap()
            .message
            .starts_with("phase ActivatingNodes -> DisablingKubeProxy"));
    }

    #[test]
    fn disabling_a_kube_proxy_that_came_back_says_so() {
        let mut plan = empty_plan();
        plan.kube_proxy = KubeProxyAction::Disable;
        plan.status = Some(degraded(
            reasons::KUBE_PROXY_RETURNED,
            "kube-proxy came back",
        ));
        assert_eq!(
            steps_of(None, &plan).kube_proxy.unwrap().reason,
            "KubeProxyDisabledAgain"
        );
    }

    #[test]
    fn an_unchanged_plan_is_no_event() {
        let mut plan = empty_plan();
        let status = DataplaneConfigStatus {
            phase: DataplanePhase::Ready,
            ..DataplaneConfigStatus::default()
        };
        plan.status = Some(status.clone());
        assert_eq!(steps_of(Some(&status), &plan), Steps::default());
    }

    #[test]
    fn a_refusal_is_recorded_when_it_first_appears_or_changes() {
        let refused = degraded(
            reasons::KUBE_PROXY_MANAGED_EXTERNALLY,
            "set management: External",
        );
        let occurrence = refusal(None, &refused).unwrap();
        assert_eq!(occurrence.reason, "KubeProxyManagedExternally");
        assert_eq!(occurrence.type_, crate::events::EventType::Warning);
        assert_eq!(
            refusal(Some(&refused), &refused),
            None,
            "the same refusal is not repeated every reconcile"
        );
        let other = degraded(reasons::API_SERVER_ADDRESS_MISSING, "no address");
        assert_eq!(
            refusal(Some(&refused), &other).unwrap().reason,
            "ApiServerAddressMissing"
        );
        assert_eq!(refusal(None, &DataplaneConfigStatus::default()), None);
    }

    #[test]
    fn many_creations_make_one_event_naming_the_first_and_last_node() {
        let writes = [
            write("node-00000", true, DataplaneMode::KubeProxy, false),
            write("node-00001", true, DataplaneMode::KubeProxy, false),
            write("node-00099", true, DataplaneMode::KubeProxy, false),
        ];
        let created: Vec<&DataplaneNodeWrite> = writes.iter().collect();
        let occurrence = bulk_creation(&created);
        assert_eq!(occurrence.reason, "DataplaneNodesCreated");
        assert_eq!(
            occurrence.message,
            "created 3 DataplaneNodes (mode KubeProxy) for Nodes node-00000 to node-00099"
        );
    }

    #[test]
    fn a_closed_start_gate_counts_exactly_the_writes_that_started() {
        let gate = StartGate::default();
        assert!(gate.start());
        assert!(gate.start());
        assert_eq!(gate.close(), 2);
        // A write reaching the gate after the reconcile counted never starts.
        assert!(!gate.start());
        assert_eq!(gate.close(), 2);
    }

    #[tokio::test]
    async fn a_shutdown_waits_for_background_writes_until_they_end_or_the_limit() {
        let writes = Arc::new(BackgroundWrites::default());
        assert!(writes.wait_until_idle(Duration::from_millis(10)).await);
        let (finish, finished) = tokio::sync::oneshot::channel::<()>();
        writes.spawn(async move {
            let _ = finished.await;
        });
        assert!(
            !writes.wait_until_idle(Duration::from_millis(50)).await,
            "a write in flight is waited for"
        );
        let waiter = {
            let writes = Arc::clone(&writes);
            tokio::spawn(async move { writes.wait_until_idle(Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        let _ = finish.send(());
        assert!(
            waiter.await.expect("the waiter"),
            "idle once the write ended"
        );
    }
}
