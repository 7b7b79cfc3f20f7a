//! What the controller watches and what a change there triggers: [`run`] starts one watch per
//! kind the decisions read, each filling its reflector store (reporting the operator's own
//! writes to [`OwnWrites`] as they come back), maps every change to the DataplaneConfig named
//! `default`, and runs the reconcile of "no DataplaneConfig named `default`" beside the
//! controller.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use switchyard_crds::{DataplaneConfig, DataplaneNode, KubeProxySpec, DEFAULT_CONFIG_NAME};
use switchyard_telemetry::Heartbeat;

use super::reconcile::{error_policy, reconcile, reconcile_without_config};
use super::{Context, KubeProxyLocation, Liveness};
use crate::cache::{self, OwnWrites, UnsupportedServices, WrittenKind};
use crate::planner::parity::SERVICE_PROXY_NAME_LABEL;

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
/// watch cache): [`OwnWrites`] counts on a relist that starts after a write to include it. Its
/// liveness is named after the kind it watches.
fn watched<K: Watched>(
    api: Api<K>,
    writer: reflector::store::Writer<K>,
    own_writes: &Arc<OwnWrites>,
    liveness: &Liveness,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static {
    let heartbeat = liveness.watch(&K::kind(&()));
    let own_writes = Arc::clone(own_writes);
    let kind = WrittenKind::of::<K>();
    let events = watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(K::trim);
    reflector::reflector(writer, events)
        .inspect(move |event| {
            let _step = heartbeat.step();
            if let (Some(kind), Ok(event)) = (kind, event) {
                own_writes.observe(kind, event);
            }
        })
        .touched_objects()
}

/// Pods of `namespaces` only (the agent's and kube-proxy's: the operator may read Pods nowhere
/// else), DaemonSet pods kept, trimmed to what decisions read. One watch per namespace, merged
/// by [`NamespacedPods`] into the one store.
fn watched_pods(
    client: Client,
    namespaces: &[String],
    writer: reflector::store::Writer<Pod>,
    own_writes: &Arc<OwnWrites>,
    heartbeat: Heartbeat,
) -> impl Stream<Item = Result<Pod, watcher::Error>> + Send + 'static {
    let own_writes = Arc::clone(own_writes);
    let sources = namespaces.iter().enumerate().map(|(source, namespace)| {
        watcher(
            Api::<Pod>::namespaced(client.clone(), namespace),
            watcher::Config::default(),
        )
        .default_backoff()
        .modify(cache::trim_pod)
        .filter_map(|event| std::future::ready(event.map(cache::only_daemon_set_pods).transpose()))
        .map(move |event| (source, event))
        .boxed()
    });
    let mut merged = NamespacedPods::new(namespaces.len());
    let events = futures::stream::select_all(sources).flat_map(move |(source, event)| {
        let events: Vec<Result<watcher::Event<Pod>, watcher::Error>> = match event {
            Ok(event) => merged.push(source, event).into_iter().map(Ok).collect(),
            Err(error) => vec![Err(error)],
        };
        futures::stream::iter(events)
    });
    reflector::reflector(writer, events)
        .inspect(move |event| {
            let _step = heartbeat.step();
            if let Ok(event) = event {
                own_writes.observe(WrittenKind::Pod, event);
            }
        })
        .touched_objects()
}

/// The events of several pod watches (one per namespace) as one sequence a single store can
/// apply. A store takes `Init`..`InitDone` as "this is every object", so one namespace's relist
/// passed through would drop the other namespace's pods. Instead, the store gets one
/// `Init`..`InitDone` once every watch has listed (so it is ready only then), and a later
/// relist becomes `Apply` for each pod it lists and `Delete` for each it no longer does.
struct NamespacedPods {
    /// Per watch: the pods it last reported, as the store holds them.
    known: Vec<HashMap<ObjectRef<Pod>, Pod>>,
    /// Per watch: the pods its relist in progress listed so far.
    relisting: Vec<Option<HashMap<ObjectRef<Pod>, Pod>>>,
    /// Per watch: whether it finished a list.
    listed: Vec<bool>,
    /// Whether the store got the first complete list.
    initialized: bool,
}

impl NamespacedPods {
    fn new(watches: usize) -> Self {
        Self {
            known: vec![HashMap::new(); watches],
            relisting: vec![None; watches],
            listed: vec![false; watches],
            initialized: false,
        }
    }

    /// The events for the store after `event` of watch `source`.
    fn push(&mut self, source: usize, event: watcher::Event<Pod>) -> Vec<watcher::Event<Pod>> {
        use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
        let (Some(known), Some(relisting)) =
            (self.known.get_mut(source), self.relisting.get_mut(source))
        else {
            return Vec::new();
        };
        let live = self.initialized;
        match event {
            Init => {
                *relisting = Some(HashMap::new());
                Vec::new()
            }
            InitApply(pod) => {
                relisting
                    .get_or_insert_with(HashMap::new)
                    .insert(ObjectRef::from_obj(&pod), pod.clone());
                if live {
                    vec![Apply(pod)]
                } else {
                    Vec::new()
                }
            }
            InitDone => {
                let listed = relisting.take().unwrap_or_default();
                let gone: Vec<Pod> = known
                    .iter()
                    .filter(|(key, _)| !listed.contains_key(key))
                    .map(|(_, pod)| pod.clone())
                    .collect();
                *known = listed;
                if let Some(listed) = self.listed.get_mut(source) {
                    *listed = true;
                }
                if live {
                    gone.into_iter().map(Delete).collect()
                } else if self.listed.iter().all(|listed| *listed) {
                    self.initialized = true;
                    let pods = self.known.iter().flat_map(|pods| pods.values().cloned());
                    std::iter::once(Init)
                        .chain(pods.map(InitApply))
                        .chain(std::iter::once(InitDone))
                        .collect()
                } else {
                    Vec::new()
                }
            }
            Apply(pod) => {
                known.insert(ObjectRef::from_obj(&pod), pod.clone());
                if live {
                    vec![Apply(pod)]
                } else {
                    Vec::new()
                }
            }
            Delete(pod) => {
                known.remove(&ObjectRef::from_obj(&pod));
                if live {
                    vec![Delete(pod)]
                } else {
                    Vec::new()
                }
            }
        }
    }
}

/// The namespaces whose pods the operator reads: the agent's, and kube-proxy's as the
/// DataplaneConfig `default` names it (its default namespace without one). Read once at start;
/// [`run`] ends when the DataplaneConfig moves kube-proxy elsewhere, so that the process
/// restarts with a watch there instead of planning from a store blind to kube-proxy's pods.
async fn pod_namespaces(client: &Client, agent_namespace: &str) -> Vec<String> {
    let configs: Api<DataplaneConfig> = Api::all(client.clone());
    let kube_proxy_namespace = match configs.get_opt(DEFAULT_CONFIG_NAME).await {
        Ok(Some(config)) => config.spec.kube_proxy.namespace,
        Ok(None) => KubeProxySpec::default().namespace,
        Err(error) => {
            tracing::warn!(%error, "failed to read the DataplaneConfig for kube-proxy's namespace; watching pods in the default one");
            KubeProxySpec::default().namespace
        }
    };
    let mut namespaces = vec![agent_namespace.to_owned()];
    if kube_proxy_namespace != agent_namespace {
        namespaces.push(kube_proxy_namespace);
    }
    namespaces
}

/// Services of every namespace that kube-proxy proxies (the same selector as its informers: no
/// `service.kubernetes.io/service-proxy-name` label; a Service that gains it leaves the watch as a
/// deletion), mapped to summaries as they arrive ([`UnsupportedServices`]); yields a Service
/// holding only the changed one's name (the controller names every trigger), only when what the
/// planner reads changed.
fn watched_services(
    api: Api<Service>,
    unsupported: &Arc<UnsupportedServices>,
    heartbeat: Heartbeat,
) -> impl Stream<Item = Result<Service, watcher::Error>> + Send + 'static {
    let unsupported = Arc::clone(unsupported);
    let selector = format!("!{SERVICE_PROXY_NAME_LABEL}");
    watcher(api, watcher::Config::default().labels(&selector))
        .default_backoff()
        .filter_map(move |event| {
            let _step = heartbeat.step();
            let trigger = match event {
                Ok(event) => unsupported
                    .apply(&event)
                    .then(|| Ok(cache::services::trigger(&event))),
                Err(error) => Some(Err(error)),
            };
            std::future::ready(trigger)
        })
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
            let _step = publisher_context.liveness.events.step();
            publisher_context
                .recorder
                .publish_or_log(&involved, &occurrence)
                .await;
        }
    };

    let client = context.client.clone();
    let own_writes = &context.own_writes;
    let agent_namespace = &context.settings.agent_namespace;
    let pod_namespaces = pod_namespaces(&client, agent_namespace).await;
    let kube_proxy_moved = Arc::new(tokio::sync::Notify::new());
    let moved = Arc::clone(&kube_proxy_moved);
    let watched_namespaces = pod_namespaces.clone();
    let liveness = &context.liveness;
    let configs = watched(
        Api::all(client.clone()),
        writers.configs,
        own_writes,
        liveness,
    )
    .inspect(
        move |config| {
            if let Ok(config) = config {
                let namespace = &config.spec.kube_proxy.namespace;
                if config.name_any() == DEFAULT_CONFIG_NAME && !watched_namespaces.contains(namespace) {
                    tracing::error!(%namespace, "the DataplaneConfig moved kube-proxy to a namespace whose pods are not watched; restarting the watches");
                    moved.notify_one();
                }
            }
        },
    );
    let dataplane_nodes = watched(
        Api::all(client.clone()),
        writers.dataplane_nodes,
        own_writes,
        liveness,
    );
    let nodes = watched(
        Api::all(client.clone()),
        writers.nodes,
        own_writes,
        liveness,
    );
    let daemon_sets = watched(
        Api::all(client.clone()),
        writers.daemon_sets,
        own_writes,
        liveness,
    );
    let revisions = watched(
        Api::namespaced(client.clone(), agent_namespace),
        writers.revisions,
        own_writes,
        liveness,
    );
    let services = watched_services(
        Api::all(client.clone()),
        &context.stores.unsupported_services,
        liveness.watch("Service"),
    );
    let pods = watched_pods(
        client,
        &pod_namespaces,
        writers.pods,
        own_writes,
        liveness.watch("pod"),
    );

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
        .watches_stream(services, |_| Some(default_config_ref()))
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
        () = kube_proxy_moved.notified() => {}
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};

    const AGENT: usize = 0;
    const KUBE_PROXY: usize = 1;

    fn pod(namespace: &str, name: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: Some(namespace.into()),
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    /// The merge of the two namespaces' pod watches and the store it feeds.
    struct MergedStore {
        merged: NamespacedPods,
        writer: reflector::store::Writer<Pod>,
        store: reflector::Store<Pod>,
    }

    impl MergedStore {
        fn new() -> Self {
            let (store, writer) = reflector::store::<Pod>();
            Self {
                merged: NamespacedPods::new(2),
                writer,
                store,
            }
        }

        /// Both namespaces listed: the agent's pods, then kube-proxy's.
        fn listed(agent_pods: &[&str], kube_proxy_pods: &[&str]) -> Self {
            let mut merged = Self::new();
            merged.feed(AGENT, list("switchyard-system", agent_pods));
            merged.feed(KUBE_PROXY, list("kube-system", kube_proxy_pods));
            merged
        }

        /// Feeds `events` of watch `source` through the merge into the store.
        fn feed(&mut self, source: usize, events: Vec<watcher::Event<Pod>>) {
            for event in events {
                for out in self.merged.push(source, event) {
                    self.writer.apply_watcher_event(&out);
                }
            }
        }

        /// The pods in the store, as `namespace/name`, sorted.
        fn names(&self) -> Vec<String> {
            let mut names: Vec<String> = self
                .store
                .state()
                .iter()
                .map(|pod| format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()))
                .collect();
            names.sort();
            names
        }
    }

    fn list(namespace: &str, pods: &[&str]) -> Vec<watcher::Event<Pod>> {
        std::iter::once(Init)
            .chain(pods.iter().map(|name| InitApply(pod(namespace, name))))
            .chain(std::iter::once(InitDone))
            .collect()
    }

    #[test]
    fn the_store_gets_its_first_list_only_once_every_namespace_listed() {
        let mut merged = MergedStore::new();
        merged.feed(AGENT, list("switchyard-system", &["agent-a"]));
        // A live change in the agent's namespace while kube-proxy's is still listing.
        merged.feed(AGENT, vec![Apply(pod("switchyard-system", "agent-b"))]);
        assert!(
            merged.names().is_empty(),
            "the store must not look complete yet"
        );
        merged.feed(KUBE_PROXY, list("kube-system", &["kube-proxy-1"]));
        assert_eq!(
            merged.names(),
            [
                "kube-system/kube-proxy-1",
                "switchyard-system/agent-a",
                "switchyard-system/agent-b"
            ]
        );
    }

    #[test]
    fn a_relist_of_one_namespace_keeps_the_other_namespaces_pods_and_drops_what_it_no_longer_lists()
    {
        let mut merged = MergedStore::listed(&["agent-a"], &["kube-proxy-1", "kube-proxy-2"]);
        // kube-proxy's watch expired and relisted: kube-proxy-2 went away in between.
        merged.feed(
            KUBE_PROXY,
            list("kube-system", &["kube-proxy-1", "kube-proxy-3"]),
        );
        assert_eq!(
            merged.names(),
            [
                "kube-system/kube-proxy-1",
                "kube-system/kube-proxy-3",
                "switchyard-system/agent-a"
            ]
        );
    }

    #[test]
    fn live_changes_after_the_first_list_reach_the_store() {
        let mut merged = MergedStore::listed(&["agent-a"], &["kube-proxy-1"]);
        merged.feed(AGENT, vec![Delete(pod("switchyard-system", "agent-a"))]);
        merged.feed(KUBE_PROXY, vec![Apply(pod("kube-system", "kube-proxy-2"))]);
        assert_eq!(
            merged.names(),
            ["kube-system/kube-proxy-1", "kube-system/kube-proxy-2"]
        );
    }
}
