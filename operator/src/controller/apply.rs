//! Applying a plan: every write the operator makes, each through [`tracked`], which owns the
//! own-write protocol ([`OwnWrites`]: `begin` before the API call, then what the call left
//! noted, or the write abandoned when it failed), so that the next reconcile waits until its
//! watches deliver every write it made.
//!
//! DataplaneNode writes go [`NODE_WRITE_CONCURRENCY`] at a time behind a [`StartGate`]; writes
//! a reconcile stops waiting for finish as [`BackgroundWrites`], which a graceful shutdown waits
//! for. Objects are built by pure functions ([`dataplane_node_object`], [`status_object`]).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::{self, ObjectRef};
use kube::{Api, Resource, ResourceExt};
use serde_json::{json, Value};
use switchyard_crds::{DataplaneConfig, DataplaneConfigStatus, DataplaneNode};

use super::{Context, FIELD_MANAGER};
use crate::cache::{OwnWrites, WrittenKind, WrittenObject};
use crate::error::Error;
use crate::kube_proxy;
use crate::planner::{AgentPodDeletion, DataplaneNodeWrite, KubeProxyAction};

/// How long a reconcile goes on starting the DataplaneNode writes of its plan; the rest follow
/// in the next reconcile right away (it plans again from the stores, which by then hold these
/// writes, and picks the same remaining nodes: writes go in node-name order).
const NODE_WRITE_TIME_PER_RECONCILE: Duration = Duration::from_millis(60);
/// How long a reconcile waits for the DataplaneNode writes it started, at most, when nothing in
/// its plan must follow them (see [`dataplane_nodes`]); longer than the time it starts them
/// for, so that the count of started writes is final when it stops waiting.
const NODE_WRITE_WAIT_PER_RECONCILE: Duration = Duration::from_millis(90);
/// DataplaneNode writes in flight at once within a reconcile.
const NODE_WRITE_CONCURRENCY: usize = 16;
/// How long a reconcile waits for its status write before leaving it to finish in the
/// background (see [`status_within`]).
const STATUS_WRITE_WAIT: Duration = Duration::from_millis(50);

/// What a successful write left in the API server.
enum Landed {
    /// The object as written now has this `resourceVersion`.
    Version(Option<String>),
    /// The object is gone.
    Deleted,
}

impl Landed {
    fn object<K: Resource>(object: &K) -> Self {
        Self::Version(object.meta().resource_version.clone())
    }
}

/// Makes the API call `call` as the write of `written`, under the own-write protocol: begun in
/// [`OwnWrites`] before the call is made, then noted as the call answered (a version to see in
/// `store`, or gone), or abandoned when it failed. The one place the operator writes through.
async fn tracked<K>(
    context: &Context,
    store: &reflector::Store<K>,
    written: &WrittenObject,
    call: impl Future<Output = Result<Landed, kube::Error>>,
) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    context.own_writes.begin(written);
    match call.await {
        Ok(Landed::Version(version)) => {
            note_written(&context.own_writes, store, written, version);
            Ok(())
        }
        Ok(Landed::Deleted) => {
            context.own_writes.deleted(written);
            Ok(())
        }
        Err(error) => {
            context.own_writes.abandon(written);
            Err(error)
        }
    }
}

/// The write of `written` was answered with `version`. A write that changed nothing (the
/// object already had that version) brings no watch event: the store holds it already.
fn note_written<K>(
    own_writes: &OwnWrites,
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
        own_writes.already_observed(written);
    } else {
        own_writes.written(written, version);
    }
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
/// meanwhile: [`OwnWrites`](crate::cache::OwnWrites) makes the next reconcile wait until the stores hold it (or until it
/// failed, which is logged and counted; the next plan picks the same node again).
pub(super) async fn dataplane_nodes(
    context: &Arc<Context>,
    writes: &[DataplaneNodeWrite],
    nodes: &[Arc<Node>],
    may_finish_in_background: bool,
) -> Result<AppliedWrites, Error> {
    if writes.is_empty() {
        return Ok(AppliedWrites {
            started: 0,
            left_in_background: false,
        });
    }
    let node_uids: BTreeMap<&str, &str> = nodes
        .iter()
        .filter_map(|node| {
            Some((
                node.metadata.name.as_deref()?,
                node.metadata.uid.as_deref()?,
            ))
        })
        .collect();
    // Each write goes with the UID of its Node (its owner), when the Node is known.
    let batch: Vec<(DataplaneNodeWrite, Option<String>)> = writes
        .iter()
        .map(|write| {
            let uid = node_uids
                .get(write.node_name.as_str())
                .map(|uid| (*uid).to_owned());
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
                    let outcome = dataplane_node(&context, &write, uid.as_deref()).await;
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

/// What [`dataplane_nodes`] did.
pub(super) struct AppliedWrites {
    /// Writes started (the first ones of the plan).
    pub(super) started: usize,
    /// Some of them were still in flight when the reconcile stopped waiting.
    pub(super) left_in_background: bool,
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
    /// Liveness of the writes in flight, once [`Self::report_to`] was called.
    liveness: Mutex<Option<WriteHeartbeats>>,
}

/// One heartbeat per write in flight at once (steps of one heartbeat must not overlap), reused
/// by later writes: as many as the most writes ever in flight together.
struct WriteHeartbeats {
    health: switchyard_telemetry::Health,
    registered: usize,
    idle: Vec<switchyard_telemetry::Heartbeat>,
}

/// How long one background write may take: a batch of DataplaneNode writes runs
/// [`NODE_WRITE_CONCURRENCY`] calls at a time, and only those started in its first
/// [`NODE_WRITE_TIME_PER_RECONCILE`], so at worst two calls in a row each end at kube's read
/// timeout (295 s); a status write is one call.
const BACKGROUND_WRITE_STEP_BOUND: Duration = Duration::from_secs(660);

impl BackgroundWrites {
    /// Makes every write from now on one step of a heartbeat of `health`.
    pub fn report_to(&self, health: &switchyard_telemetry::Health) {
        *self.liveness.lock().unwrap_or_else(PoisonError::into_inner) = Some(WriteHeartbeats {
            health: health.clone(),
            registered: 0,
            idle: Vec::new(),
        });
    }

    fn heartbeat(&self) -> Option<switchyard_telemetry::Heartbeat> {
        let mut liveness = self.liveness.lock().unwrap_or_else(PoisonError::into_inner);
        let liveness = liveness.as_mut()?;
        Some(liveness.idle.pop().unwrap_or_else(|| {
            liveness.registered += 1;
            let name = format!("background write {}", liveness.registered);
            liveness
                .health
                .register_loop(name, BACKGROUND_WRITE_STEP_BOUND)
        }))
    }

    fn spawn(self: &Arc<Self>, work: impl std::future::Future<Output = ()> + Send + 'static) {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let tracker = Arc::clone(self);
        let heartbeat = self.heartbeat();
        tokio::spawn(async move {
            let step = heartbeat
                .as_ref()
                .map(switchyard_telemetry::Heartbeat::step);
            work.await;
            drop(step);
            if let (Some(heartbeat), Some(liveness)) = (
                heartbeat,
                tracker
                    .liveness
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .as_mut(),
            ) {
                liveness.idle.push(heartbeat);
            }
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

/// Server-Side Apply of one DataplaneNode's whole spec, owned by its Node.
async fn dataplane_node(
    context: &Context,
    write: &DataplaneNodeWrite,
    node_uid: Option<&str>,
) -> Result<(), Error> {
    let api: Api<DataplaneNode> = Api::all(context.client.clone());
    let object = dataplane_node_object(write, node_uid);
    let written = WrittenObject::new(WrittenKind::DataplaneNode, None, &write.node_name);
    tracked(context, &context.stores.dataplane_nodes, &written, async {
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let applied = api
            .patch(&write.node_name, &params, &Patch::Apply(&object))
            .await?;
        Ok(Landed::object(&applied))
    })
    .await
    .map_err(|source| Error::ApplyDataplaneNode {
        name: write.node_name.clone(),
        source: source.into(),
    })?;
    tracing::info!(node = %write.node_name, mode = %write.spec.mode, cleanup = write.spec.iptables_cleanup, create = write.create, "applied DataplaneNode spec");
    Ok(())
}

/// [`status`], waited for at most [`STATUS_WRITE_WAIT`]; whether it was left to finish in the
/// background. The status is the reconcile's last step, so a status write the API server is
/// slow to answer (queued behind the node writes still in flight) finishes in the background;
/// the next reconcile waits for it through [`OwnWrites`], and a failure is logged and counted
/// (the next reconcile finds the status unchanged and writes it again).
pub(super) async fn status_within(
    config: &DataplaneConfig,
    status: &DataplaneConfigStatus,
    context: &Arc<Context>,
) -> Result<bool, Error> {
    let config = config.clone();
    let status = status.clone();
    let writer_context = Arc::clone(context);
    let (outcome_sender, outcome) = tokio::sync::oneshot::channel();
    context.background_writes.spawn(async move {
        let written = self::status(&config, &status, &writer_context).await;
        // Sending fails once the reconcile stopped waiting: this write finished in the
        // background, and a failure is told here.
        if let Err(Err(failure)) = outcome_sender.send(written) {
            writer_context.count_failure(&failure);
            tracing::warn!(error = %crate::error::describe(&failure), "failed to apply the DataplaneConfig status in the background; the next reconcile writes it again");
        }
    });
    match tokio::time::timeout(STATUS_WRITE_WAIT, outcome).await {
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

/// Server-Side Apply of a DataplaneConfig's status subresource.
pub(super) async fn status(
    config: &DataplaneConfig,
    status: &DataplaneConfigStatus,
    context: &Context,
) -> Result<(), Error> {
    let api: Api<DataplaneConfig> = Api::all(context.client.clone());
    let name = config.name_any();
    let object = status_object(&name, status);
    let written = WrittenObject::new(WrittenKind::DataplaneConfig, None, &name);
    tracked(context, &context.stores.configs, &written, async {
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let applied = api
            .patch_status(&name, &params, &Patch::Apply(&object))
            .await?;
        Ok(Landed::object(&applied))
    })
    .await
    .map_err(|source| Error::ApplyStatus {
        name: name.clone(),
        source: source.into(),
    })
}

/// Disables or restores the kube-proxy DaemonSet (a merge patch of its nodeSelector and the
/// annotation that records the previous one).
pub(super) async fn kube_proxy_action(
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
    let api = Api::<DaemonSet>::namespaced(context.client.clone(), &namespace);
    let written = WrittenObject::new(WrittenKind::DaemonSet, Some(&namespace), &name);
    tracked(context, &context.stores.daemon_sets, &written, async {
        let patched = api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(Landed::object(&patched))
    })
    .await
    .map_err(|source| Error::PatchKubeProxy {
        namespace: namespace.clone(),
        name: name.clone(),
        source: source.into(),
    })?;
    tracing::info!(%namespace, %name, ?action, "patched the kube-proxy DaemonSet");
    Ok(())
}

/// Deletes the agent pods of `deletions`, in order, each only if it is still the pod the plan
/// saw in `pods` (by UID).
pub(super) async fn delete_agent_pods(
    context: &Context,
    deletions: &[AgentPodDeletion],
    pods: &[Arc<Pod>],
) -> Result<(), Error> {
    for deletion in deletions {
        let uid = pods
            .iter()
            .find(|pod| pod.metadata.name.as_deref() == Some(deletion.pod_name.as_str()))
            .and_then(|pod| pod.metadata.uid.clone());
        delete_agent_pod(context, deletion, uid).await?;
    }
    Ok(())
}

/// Deletes the agent pod of `deletion` (only the one with `uid`, when known), so that its
/// DaemonSet recreates it at the update revision. A pod already gone or replaced is no failure.
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
    let api = Api::<Pod>::namespaced(context.client.clone(), namespace);
    let written = WrittenObject::new(WrittenKind::Pod, Some(namespace), &deletion.pod_name);
    let deleted = tracked(context, &context.stores.pods, &written, async {
        let outcome = api.delete(&deletion.pod_name, &params).await?;
        // Graceful: the pod stays, marked for deletion, until its kubelet confirms.
        Ok(outcome
            .left()
            .map_or(Landed::Deleted, |pod| Landed::object(&pod)))
    })
    .await;
    match deleted {
        Ok(()) => {
            tracing::info!(pod = %deletion.pod_name, node = %deletion.node_name, "deleted agent pod for upgrade");
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
        Err(source) => Err(Error::DeleteAgentPod {
            namespace: namespace.to_owned(),
            name: deletion.pod_name.clone(),
            source: source.into(),
        }),
    }
}

/// The object applied for one DataplaneNode: its whole spec and its owner, the Node (so it is
/// garbage-collected with it). Pure.
fn dataplane_node_object(write: &DataplaneNodeWrite, node_uid: Option<&str>) -> Value {
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
fn status_object(config_name: &str, status: &DataplaneConfigStatus) -> Value {
    json!({
        "apiVersion": DataplaneConfig::api_version(&()),
        "kind": DataplaneConfig::kind(&()),
        "metadata": { "name": config_name },
        "status": status,
    })
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};
    use switchyard_crds::{DataplaneMode, DataplaneNodeSpec, DataplanePhase};

    use super::*;

    fn write(node: &str, mode: DataplaneMode, cleanup: bool) -> DataplaneNodeWrite {
        let mut spec = DataplaneNodeSpec::new(mode);
        spec.iptables_cleanup = cleanup;
        spec.requested_at = Some(
            DateTime::parse_from_rfc3339("2026-11-22T01:00:00Z")
                .expect("a valid time")
                .with_timezone(&Utc),
        );
        DataplaneNodeWrite {
            node_name: node.into(),
            create: true,
            spec,
        }
    }

    #[test]
    fn a_dataplane_node_is_applied_whole_and_owned_by_its_node() {
        let object =
            dataplane_node_object(&write("node-a", DataplaneMode::Ebpf, true), Some("uid-1"));
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
