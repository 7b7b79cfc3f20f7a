//! The operator's view of the cluster: reflector stores fed by the controller's own watches, so a
//! reconcile reads memory instead of listing Nodes, DataplaneNodes and pods from the API server
//! every time (at 5,000 nodes those lists cost ~0.4 s of API server time each and hundreds of
//! MiB of transient memory per reconcile).
//!
//! Two rules keep decisions made from these stores as safe as decisions made from fresh lists:
//!
//! - **Never on a store older than the operator's own last write.** Every write the operator
//!   makes is announced to [`OwnWrites`] before it is sent; the watch taps report every event they
//!   apply to a store; a reconcile first waits until each announced write has come back through
//!   its watch ([`OwnWrites::wait_until_observed`]). Without this a reconcile right after a batch
//!   of DataplaneNode writes would see the nodes still untold and tell them again (with a new
//!   `requestedAt`, so every agent would answer twice).
//! - **Only what decisions need is kept.** Nodes keep their name, UID and Ready condition; pods
//!   are kept only when a DaemonSet owns them, with their owner, node, revision label, Ready
//!   condition and deletion mark; no object keeps its `managedFields`; of Services only those
//!   the eBPF datapath cannot serve are kept, as summaries ([`services`]).

use std::collections::BTreeMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus, Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::{Lookup, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use switchyard_crds::{DataplaneConfig, DataplaneNode, KubeProxySpec};

use crate::error::Error;
use crate::snapshot::{self, ClusterObjects, REVISION_HASH_LABEL};

pub mod services;

pub use services::UnsupportedServices;

/// The kinds of object the operator writes and watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WrittenKind {
    DataplaneConfig,
    DataplaneNode,
    DaemonSet,
    Pod,
}

impl WrittenKind {
    /// The kind of the operator's writes that objects of type `K` are; `None` for a kind it
    /// never writes.
    pub fn of<K: Resource<DynamicType = ()>>() -> Option<Self> {
        match (K::group(&()).as_ref(), K::kind(&()).as_ref()) {
            ("switchyard.dev", "DataplaneConfig") => Some(Self::DataplaneConfig),
            ("switchyard.dev", "DataplaneNode") => Some(Self::DataplaneNode),
            ("apps", "DaemonSet") => Some(Self::DaemonSet),
            ("", "Pod") => Some(Self::Pod),
            _ => None,
        }
    }
}

/// One object the operator wrote.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WrittenObject {
    pub kind: WrittenKind,
    pub namespace: Option<String>,
    pub name: String,
}

impl WrittenObject {
    pub fn new(kind: WrittenKind, namespace: Option<&str>, name: &str) -> Self {
        Self {
            kind,
            namespace: namespace
                .filter(|namespace| !namespace.is_empty())
                .map(str::to_owned),
            name: name.to_owned(),
        }
    }

    fn of<K: Resource>(kind: WrittenKind, object: &K) -> Self {
        Self::new(
            kind,
            object.meta().namespace.as_deref(),
            object.meta().name.as_deref().unwrap_or_default(),
        )
    }
}

/// What a write left behind, as far as the operator knows.
#[derive(Clone, Debug, PartialEq, Eq)]
enum WriteResult {
    /// Sent, no answer yet.
    InFlight,
    /// The object as written has this `resourceVersion`.
    Version(String),
    /// The object is gone (deleted at once).
    Gone,
}

#[derive(Clone, Debug)]
struct PendingWrite {
    result: WriteResult,
    /// Versions of the object the watch delivered since the write was announced (the answer to
    /// the write may come after its watch event).
    seen_versions: Vec<String>,
    /// The watch delivered its deletion since the write was announced.
    seen_deleted: bool,
    /// A relist of its kind started after the write was answered: once that relist is done,
    /// the store holds the write or something newer.
    relisted_after_answer: bool,
}

impl PendingWrite {
    fn observed(&self) -> bool {
        match &self.result {
            WriteResult::InFlight => false,
            WriteResult::Version(version) => {
                self.seen_deleted || self.seen_versions.iter().any(|seen| seen == version)
            }
            WriteResult::Gone => self.seen_deleted,
        }
    }
}

/// The operator's writes that its watches have not delivered yet.
///
/// Announce a write with [`begin`](Self::begin) before sending it, then report its answer
/// ([`written`](Self::written), [`deleted`](Self::deleted)) or its failure
/// ([`abandon`](Self::abandon)). The watch taps call [`observe`](Self::observe) for every event
/// after the store applied it. Relists use the API server's most recent state (not its watch
/// cache), so a relist that starts after a write was answered proves the store holds it.
#[derive(Debug)]
pub struct OwnWrites {
    pending: Mutex<BTreeMap<WrittenObject, PendingWrite>>,
    count: tokio::sync::watch::Sender<usize>,
}

impl Default for OwnWrites {
    fn default() -> Self {
        Self {
            pending: Mutex::new(BTreeMap::new()),
            count: tokio::sync::watch::Sender::new(0),
        }
    }
}

impl OwnWrites {
    fn update(&self, change: impl FnOnce(&mut BTreeMap<WrittenObject, PendingWrite>)) {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        change(&mut pending);
        pending.retain(|_, write| !write.observed());
        let count = pending.len();
        drop(pending);
        self.count.send_replace(count);
    }

    /// A write of `object` is about to be sent.
    pub fn begin(&self, object: &WrittenObject) {
        self.update(|pending| {
            let write = pending.entry(object.clone()).or_insert(PendingWrite {
                result: WriteResult::InFlight,
                seen_versions: Vec::new(),
                seen_deleted: false,
                relisted_after_answer: false,
            });
            write.result = WriteResult::InFlight;
            write.relisted_after_answer = false;
        });
    }

    /// The write was answered with the object at `resource_version` (without one, there is
    /// nothing to wait for).
    pub fn written(&self, object: &WrittenObject, resource_version: Option<String>) {
        self.update(|pending| match resource_version {
            Some(version) => {
                if let Some(write) = pending.get_mut(object) {
                    write.result = WriteResult::Version(version);
                }
            }
            None => {
                pending.remove(object);
            }
        });
    }

    /// The write was a deletion that removed the object at once.
    pub fn deleted(&self, object: &WrittenObject) {
        self.update(|pending| {
            if let Some(write) = pending.get_mut(object) {
                write.result = WriteResult::Gone;
            }
        });
    }

    /// The store already holds what the write left (a write that changed nothing brings no
    /// watch event).
    pub fn already_observed(&self, object: &WrittenObject) {
        self.abandon(object);
    }

    /// The write failed: the API server changed nothing, there is nothing to wait for.
    pub fn abandon(&self, object: &WrittenObject) {
        self.update(|pending| {
            pending.remove(object);
        });
    }

    /// A watch of `kind` delivered `event`, already applied to its store.
    pub fn observe<K: Resource>(&self, kind: WrittenKind, event: &watcher::Event<K>) {
        if self.count.borrow().eq(&0) {
            return;
        }
        self.update(|pending| match event {
            watcher::Event::Apply(object) | watcher::Event::InitApply(object) => {
                if let Some(write) = pending.get_mut(&WrittenObject::of(kind, object)) {
                    if let Some(version) = object.meta().resource_version.clone() {
                        write.seen_versions.push(version);
                    }
                }
            }
            watcher::Event::Delete(object) => {
                if let Some(write) = pending.get_mut(&WrittenObject::of(kind, object)) {
                    write.seen_deleted = true;
                }
            }
            watcher::Event::Init => {
                for (object, write) in pending.iter_mut() {
                    if object.kind == kind && write.result != WriteResult::InFlight {
                        write.relisted_after_answer = true;
                    }
                }
            }
            watcher::Event::InitDone => {
                pending.retain(|object, write| object.kind != kind || !write.relisted_after_answer);
            }
        });
    }

    /// How many writes have not come back yet.
    pub fn pending(&self) -> usize {
        *self.count.borrow()
    }

    /// Waits until every announced write came back through its watch, at most `timeout`.
    pub async fn wait_until_observed(&self, timeout: Duration) -> Result<(), Error> {
        let mut receiver = self.count.subscribe();
        let observed = tokio::time::timeout(timeout, receiver.wait_for(|count| *count == 0))
            .await
            .map(|result| result.is_ok());
        match observed {
            Ok(true) => Ok(()),
            // The sender lives as long as `self`: a closed channel cannot happen while we wait.
            Ok(false) | Err(_) => Err(Error::ObserveOwnWrites {
                pending: self.pending(),
                waited: timeout,
            }),
        }
    }
}

/// Drops what no decision reads: `managedFields` (often the largest part of an object).
pub fn drop_managed_fields<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

/// The `Ready` condition alone of `conditions` (taken out of an object's
/// status; `type_of` reads a condition's type), reduced by `trim`.
fn ready_condition<C>(
    conditions: Option<Vec<C>>,
    type_of: impl Fn(&C) -> &str,
    trim: impl FnMut(C) -> C,
) -> Vec<C> {
    conditions
        .unwrap_or_default()
        .into_iter()
        .filter(|condition| type_of(condition) == "Ready")
        .map(trim)
        .collect()
}

/// A Node reduced to what decisions read: name, UID, `resourceVersion`, labels (a canary
/// `nodeSelector` matches them) and its Ready condition.
pub fn trim_node(node: &mut Node) {
    let ready = ready_condition(
        node.status
            .as_mut()
            .and_then(|status| status.conditions.take()),
        |condition| condition.type_.as_str(),
        |condition| NodeCondition {
            type_: condition.type_,
            status: condition.status,
            ..NodeCondition::default()
        },
    );
    *node = Node {
        metadata: ObjectMeta {
            name: node.metadata.name.take(),
            uid: node.metadata.uid.take(),
            resource_version: node.metadata.resource_version.take(),
            labels: node.metadata.labels.take(),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(NodeStatus {
            conditions: Some(ready),
            ..NodeStatus::default()
        }),
    };
}

/// Whether a DaemonSet owns the pod (only such pods matter: kube-proxy's and the agents').
pub fn owned_by_a_daemon_set(pod: &Pod) -> bool {
    pod.owner_references()
        .iter()
        .any(|owner| owner.kind == "DaemonSet")
}

/// A pod reduced to what decisions read: its identity, DaemonSet owners, revision label,
/// creation and deletion marks, its node (from `spec.nodeName` or, while pending, its
/// DaemonSet's node affinity) and its Ready condition.
pub fn trim_pod(pod: &mut Pod) {
    let node = snapshot::pod_node(pod);
    let revision = pod
        .metadata
        .labels
        .as_mut()
        .and_then(|labels| labels.remove(REVISION_HASH_LABEL));
    let owners = pod.metadata.owner_references.take().map(|owners| {
        owners
            .into_iter()
            .filter(|owner| owner.kind == "DaemonSet")
            .collect::<Vec<_>>()
    });
    let ready = ready_condition(
        pod.status
            .as_mut()
            .and_then(|status| status.conditions.take()),
        |condition| condition.type_.as_str(),
        |mut condition| {
            condition.message = None;
            condition.reason = None;
            condition
        },
    );
    *pod = Pod {
        metadata: ObjectMeta {
            name: pod.metadata.name.take(),
            namespace: pod.metadata.namespace.take(),
            uid: pod.metadata.uid.take(),
            resource_version: pod.metadata.resource_version.take(),
            creation_timestamp: pod.metadata.creation_timestamp.take(),
            deletion_timestamp: pod.metadata.deletion_timestamp.take(),
            labels: revision
                .map(|revision| BTreeMap::from([(REVISION_HASH_LABEL.into(), revision)])),
            owner_references: owners,
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: node,
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            conditions: Some(ready),
            ..PodStatus::default()
        }),
    };
}

/// Keeps the pod watch to DaemonSet pods (already trimmed): a pod no DaemonSet owns any more is
/// a deletion for the store; one never owned is left out.
pub fn only_daemon_set_pods(event: watcher::Event<Pod>) -> Option<watcher::Event<Pod>> {
    match event {
        watcher::Event::Apply(pod) if !owned_by_a_daemon_set(&pod) => {
            Some(watcher::Event::Delete(pod))
        }
        watcher::Event::InitApply(pod) if !owned_by_a_daemon_set(&pod) => None,
        other => Some(other),
    }
}

/// Read handles of every store the controller fills.
#[derive(Clone)]
pub struct Stores {
    pub configs: Store<DataplaneConfig>,
    pub nodes: Store<Node>,
    pub dataplane_nodes: Store<DataplaneNode>,
    /// DaemonSets of every namespace.
    pub daemon_sets: Store<DaemonSet>,
    /// DaemonSet pods of every namespace.
    pub pods: Store<Pod>,
    /// ControllerRevisions of the agent's namespace.
    pub revisions: Store<ControllerRevision>,
    /// The Services the eBPF datapath does not serve yet.
    pub unsupported_services: Arc<UnsupportedServices>,
}

impl Stores {
    /// Waits until every store holds its first complete list, at most `timeout`.
    pub async fn wait_until_ready(&self, timeout: Duration) -> Result<(), Error> {
        let waits = async {
            let results = [
                ("DataplaneConfigs", self.configs.wait_until_ready().await),
                ("Nodes", self.nodes.wait_until_ready().await),
                (
                    "DataplaneNodes",
                    self.dataplane_nodes.wait_until_ready().await,
                ),
                ("DaemonSets", self.daemon_sets.wait_until_ready().await),
                ("pods", self.pods.wait_until_ready().await),
                (
                    "ControllerRevisions",
                    self.revisions.wait_until_ready().await,
                ),
                ("Services", {
                    self.unsupported_services.wait_until_ready().await;
                    Ok(())
                }),
            ];
            results
                .into_iter()
                .find_map(|(what, result)| result.err().map(|_| what))
        };
        match tokio::time::timeout(timeout, waits).await {
            Ok(None) => Ok(()),
            Ok(Some(what)) => Err(Error::FillCache { what }),
            Err(_) => Err(Error::FillCache {
                what: first_not_ready(self),
            }),
        }
    }

    /// The DataplaneConfig named `name`, as the store holds it.
    pub fn config(&self, name: &str) -> Option<Arc<DataplaneConfig>> {
        self.configs.get(&ObjectRef::new(name))
    }

    /// Everything a snapshot is made of, from the stores (no request to the API server).
    pub fn objects(
        &self,
        kube_proxy: &KubeProxySpec,
        agent_namespace: &str,
        agent_daemon_set: &str,
    ) -> ClusterObjects {
        let daemon_set = |namespace: &str, name: &str| {
            self.daemon_sets
                .get(&ObjectRef::new(name).within(namespace))
        };
        let agent_daemon_set = daemon_set(agent_namespace, agent_daemon_set);
        let pods_of = |namespace: &str| {
            self.pods
                .state_filter(|pod| pod.metadata.namespace.as_deref() == Some(namespace))
        };
        let (agent_namespace_revisions, agent_namespace_pods) = if agent_daemon_set.is_some() {
            (self.revisions.state(), pods_of(agent_namespace))
        } else {
            (Vec::new(), Vec::new())
        };
        ClusterObjects {
            nodes: self.nodes.state(),
            dataplane_nodes: self.dataplane_nodes.state(),
            kube_proxy_daemon_set: daemon_set(&kube_proxy.namespace, &kube_proxy.daemon_set_name),
            kube_proxy_namespace_pods: pods_of(&kube_proxy.namespace),
            agent_daemon_set,
            agent_namespace_revisions,
            agent_namespace_pods,
            unsupported_services: self.unsupported_services.list(),
        }
    }
}

fn first_not_ready(stores: &Stores) -> &'static str {
    fn ready<K: Lookup + Clone + 'static>(store: &Store<K>) -> bool
    where
        K::DynamicType: Eq + Hash + Clone,
    {
        // A store that became ready answers at once; one that did not stays pending.
        futures::FutureExt::now_or_never(store.wait_until_ready()).is_some()
    }
    if !ready(&stores.configs) {
        "DataplaneConfigs"
    } else if !ready(&stores.nodes) {
        "Nodes"
    } else if !ready(&stores.dataplane_nodes) {
        "DataplaneNodes"
    } else if !ready(&stores.daemon_sets) {
        "DaemonSets"
    } else if !ready(&stores.pods) {
        "pods"
    } else if !ready(&stores.revisions) {
        "ControllerRevisions"
    } else {
        "Services"
    }
}

#[cfg(test)]
mod tests;
