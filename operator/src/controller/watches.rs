//! What the controller watches and what a change there triggers: [`run`] starts one watch per
//! kind the decisions read, each filling its reflector store (reporting the operator's own
//! writes to [`OwnWrites`] as they come back), maps every change to the DataplaneConfig named
//! `default`, and runs the reconcile of "no DataplaneConfig named `default`" beside the
//! controller.

use std::fmt::Debug;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use switchyard_crds::{DataplaneConfig, DataplaneNode, DEFAULT_CONFIG_NAME};

use super::reconcile::{error_policy, reconcile, reconcile_without_config};
use super::{Context, KubeProxyLocation};
use crate::cache::{self, OwnWrites, WrittenKind};

/// How long triggers are collected before one reconcile runs (many pods change at once). Also
/// the pause before a reconcile continues the writes the previous one left over.
const DEBOUNCE: Duration = Duration::from_millis(200);

/// How often the operator checks, without a DataplaneConfig named `default`, that every Node
/// has its DataplaneNode (a retry of failed creations; triggers do it at once otherwise).
const RESYNC_WITHOUT_CONFIG: Duration = Duration::from_secs(30);

/// An object the controller watches, trimmed to what decisions read before it is stored.
trait Watched:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
    /// Drops what no decision reads.
    fn trim(&mut self) {
        cache::drop_managed_fields(self);
    }
}

impl Watched for DataplaneConfig {}
impl Watched for DataplaneNode {}
impl Watched for DaemonSet {}
impl Watched for ControllerRevision {}
impl Watched for Node {
    fn trim(&mut self) {
        cache::trim_node(self);
    }
}

/// A watch whose events fill `writer`'s store and are then reported to `own_writes` (when the
/// operator writes such objects: [`WrittenKind::of`]); yields the
/// objects touched (for triggers). Relists read the API server's most recent state (not its
/// watch cache): [`OwnWrites`] counts on a relist that starts after a write to include it.
fn watched<K: Watched>(
    api: Api<K>,
    writer: reflector::store::Writer<K>,
    own_writes: &Arc<OwnWrites>,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static {
    let own_writes = Arc::clone(own_writes);
    let kind = WrittenKind::of::<K>();
    let events = watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(K::trim);
    reflector::reflector(writer, events)
        .inspect(move |event| {
            if let (Some(kind), Ok(event)) = (kind, event) {
                own_writes.observe(kind, event);
            }
        })
        .touched_objects()
}

/// Pods of every namespace, but only DaemonSet pods are kept, trimmed to what decisions read.
fn watched_pods(
    api: Api<Pod>,
    writer: reflector::store::Writer<Pod>,
    own_writes: &Arc<OwnWrites>,
) -> impl Stream<Item = Result<Pod, watcher::Error>> + Send + 'static {
    let own_writes = Arc::clone(own_writes);
    let events = watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(cache::trim_pod)
        .filter_map(|event| std::future::ready(event.map(cache::only_daemon_set_pods).transpose()));
    reflector::reflector(writer, events)
        .inspect(move |event| {
            if let Ok(event) = event {
                own_writes.observe(WrittenKind::Pod, event);
            }
        })
        .touched_objects()
}

fn default_config_ref() -> ObjectRef<DataplaneConfig> {
    ObjectRef::new(DEFAULT_CONFIG_NAME)
}

/// Whether a change of the DaemonSet `namespace/name` (or of one of its pods) concerns the
/// operator: the agent DaemonSet, or the kube-proxy DaemonSet where the `default`
/// DataplaneConfig last said it is.
fn concerns_the_operator(
    namespace: &str,
    name: &str,
    agent: &(String, String),
    kube_proxy: &std::sync::RwLock<KubeProxyLocation>,
) -> bool {
    let is_agent = agent.0 == namespace && agent.1 == name;
    // A poisoned lock says nothing about where kube-proxy is: let the change trigger.
    let is_kube_proxy = kube_proxy
        .read()
        .map(|location| location.namespace == namespace && location.name == name)
        .unwrap_or(true);
    is_agent || is_kube_proxy
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
    let own_writes = &context.own_writes;
    let agent_namespace = &context.settings.agent_namespace;
    let configs = watched(Api::all(client.clone()), writers.configs, own_writes);
    let dataplane_nodes = watched(
        Api::all(client.clone()),
        writers.dataplane_nodes,
        own_writes,
    );
    let nodes = watched(Api::all(client.clone()), writers.nodes, own_writes);
    let daemon_sets = watched(Api::all(client.clone()), writers.daemon_sets, own_writes);
    let revisions = watched(
        Api::namespaced(client.clone(), agent_namespace),
        writers.revisions,
        own_writes,
    );
    let pods = watched_pods(Api::all(client), writers.pods, own_writes);

    let agent = (
        agent_namespace.clone(),
        context.settings.agent_daemon_set.clone(),
    );
    let pods_agent = agent.clone();
    let location = context.kube_proxy_location.clone();
    let pods_location = location.clone();
    let controller = Controller::for_stream(configs, context.stores.configs.clone())
        .with_config(
            controller::Config::default()
                .debounce(DEBOUNCE)
                .concurrency(1),
        )
        .watches_stream(dataplane_nodes, |_| Some(default_config_ref()))
        .watches_stream(nodes, |_| Some(default_config_ref()))
        .watches_stream(revisions, |_| Some(default_config_ref()))
        .watches_stream(daemon_sets, move |daemon_set| {
            let namespace = daemon_set.namespace().unwrap_or_default();
            concerns_the_operator(&namespace, &daemon_set.name_any(), &agent, &location)
                .then(default_config_ref)
        })
        .watches_stream(pods, move |pod| {
            let namespace = pod.namespace().unwrap_or_default();
            pod.owner_references()
                .iter()
                .filter(|owner| owner.kind == "DaemonSet")
                .any(|owner| {
                    concerns_the_operator(&namespace, &owner.name, &pods_agent, &pods_location)
                })
                .then(default_config_ref)
        });

    let outcomes_context = context.clone();
    let without_config_context = context.clone();
    let outcomes = controller
        .run(reconcile, error_policy, context)
        .for_each(move |outcome| {
            match outcome {
                Ok(_) => {}
                // Every trigger maps to `default`; when it does not exist, the controller
                // reports it missing instead of reconciling, and the operator still plans
                // without it (in its own task: this stream also feeds the stores that
                // reconcile waits on, so it must not wait here).
                Err(controller::Error::ObjectNotFound(object))
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
    tokio::select! {
        () = outcomes => {}
        () = without_config(without_config_context) => {}
        () = publish_events => {}
    }
}

/// The reconcile of "no DataplaneConfig named `default`", woken by the controller when a
/// trigger finds it missing. There is no object to requeue: a failed write is retried on the
/// next trigger, or at the latest by the [`RESYNC_WITHOUT_CONFIG`] timer.
async fn without_config(context: Arc<Context>) {
    let mut interval = tokio::time::interval(RESYNC_WITHOUT_CONFIG);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            () = context.without_config.notified() => {}
        }
        // Writes are bounded per reconcile: go on until none is left.
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
}
