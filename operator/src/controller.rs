//! The controller: a kube-runtime `Controller` on DataplaneConfig, also triggered by
//! DataplaneNodes, Nodes, the kube-proxy DaemonSet and its pods, and the agent DaemonSet and its
//! pods (all mapped to the DataplaneConfig named `default`).
//!
//! One reconcile: read a snapshot of the cluster ([`fetch`], then the pure
//! [`snapshot::observe`]) -> [`plan`] -> apply the plan (Server-Side Apply of DataplaneNode specs
//! as `switchyard-operator`, the kube-proxy nodeSelector patch, agent pod deletions) -> publish
//! the status (Server-Side Apply on the status subresource), with an Event for every step taken
//! and every refusal.
//!
//! Without a DataplaneConfig named `default` (never created, or deleted) the operator only
//! creates the DataplaneNodes that are missing (mode `KubeProxy`): deleting the DataplaneConfig
//! leaves the dataplane exactly as it is, nothing is ripped out under traffic.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{json, Value};
use switchyard_crds::{
    condition_types, find_condition, reasons, ConditionStatus, DataplaneConfig,
    DataplaneConfigStatus, DataplaneNode, KubeProxySpec, DEFAULT_CONFIG_NAME,
};

use crate::error::Error;
use crate::error_policy;
use crate::events::{reference_to, Occurrence, Recorder};
use crate::kube_proxy;
use crate::metrics::Metrics;
use crate::planner::{
    plan, AgentPodDeletion, DataplaneNodeWrite, KubeProxyAction, ObservedCluster, Plan,
};
use crate::snapshot::{self, ClusterObjects, SnapshotNames};

/// The field manager of every write the operator makes.
pub const FIELD_MANAGER: &str = "switchyard-operator";

/// How often the DataplaneConfig is reconciled when nothing changes and no timeout is pending.
const RESYNC_PERIOD: Duration = Duration::from_secs(300);

/// How often the operator checks, without a DataplaneConfig named `default`, that every Node
/// has its DataplaneNode (a retry of failed creations; triggers do it at once otherwise).
const RESYNC_WITHOUT_CONFIG: Duration = Duration::from_secs(30);

/// How long triggers are collected before one reconcile runs (many pods change at once).
const DEBOUNCE: Duration = Duration::from_millis(500);

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
    /// Where kube-proxy is, as the `default` DataplaneConfig last said (read by the watch
    /// mappers, so that only that DaemonSet's pods trigger reconciles).
    kube_proxy_location: Arc<RwLock<KubeProxyLocation>>,
    consecutive_failures: AtomicU32,
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
        Self {
            client,
            recorder,
            metrics,
            settings,
            kube_proxy_location: Arc::new(RwLock::new(KubeProxyLocation {
                namespace: defaults.namespace,
                name: defaults.daemon_set_name,
            })),
            consecutive_failures: AtomicU32::new(0),
        }
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

/// Runs the controller until the returned future is dropped (leadership lost) or the watches end.
pub async fn run(context: Arc<Context>) {
    let client = context.client.clone();
    let watch_config = watcher::Config::default().any_semantic();
    let agent_namespace = context.settings.agent_namespace.clone();
    let agent_name = context.settings.agent_daemon_set.clone();

    let location = context.kube_proxy_location.clone();
    let kube_proxy_pods_location = location.clone();
    let (agent_pods_namespace, agent_pods_name) = (agent_namespace.clone(), agent_name.clone());

    let controller = Controller::new(
        Api::<DataplaneConfig>::all(client.clone()),
        watch_config.clone(),
    )
    .with_config(
        kube::runtime::controller::Config::default()
            .debounce(DEBOUNCE)
            .concurrency(1),
    )
    .watches(
        Api::<DataplaneNode>::all(client.clone()),
        watch_config.clone(),
        |_| Some(default_config_ref()),
    )
    .watches(
        Api::<Node>::all(client.clone()),
        watch_config.clone(),
        |_| Some(default_config_ref()),
    )
    .watches(
        Api::<DaemonSet>::all(client.clone()),
        watch_config.clone(),
        move |daemon_set| {
            let namespace = daemon_set.namespace().unwrap_or_default();
            let name = daemon_set.name_any();
            let is_agent = namespace == agent_namespace && name == agent_name;
            let is_kube_proxy = location
                .read()
                .map(|location| location.namespace == namespace && location.name == name)
                .unwrap_or(true);
            (is_agent || is_kube_proxy).then(default_config_ref)
        },
    )
    .watches(Api::<Pod>::all(client.clone()), watch_config, move |pod| {
        let is_agent = owned_by_daemon_set(&pod, &agent_pods_namespace, &agent_pods_name);
        let is_kube_proxy = kube_proxy_pods_location
            .read()
            .map(|location| owned_by_daemon_set(&pod, &location.namespace, &location.name))
            .unwrap_or(true);
        (is_agent || is_kube_proxy).then(default_config_ref)
    });

    let outcomes_context = context.clone();
    let periodic_context = context.clone();
    let outcomes = controller
        .run(reconcile, error_policy, context)
        .for_each(move |outcome| {
            let context = outcomes_context.clone();
            async move {
                match outcome {
                    Ok(_) => {}
                    // Every trigger maps to `default`; when it does not exist, the controller
                    // reports it missing instead of reconciling, and the operator still creates
                    // missing DataplaneNodes.
                    Err(kube::runtime::controller::Error::ObjectNotFound(object))
                        if object.name == DEFAULT_CONFIG_NAME =>
                    {
                        if let Err(error) = reconcile_without_config(&context).await {
                            context.metrics.reconcile_errors.with_label_values(&[error_policy::step(&error)]).inc();
                            tracing::warn!(error = %crate::error::describe(&error), "failed to reconcile without a DataplaneConfig");
                        }
                    }
                    Err(error) => tracing::warn!(error = %crate::error::describe(&error), "reconcile failed"),
                }
            }
        });
    // Without a DataplaneConfig there is no object to requeue: a failed creation of
    // DataplaneNodes is retried on the next trigger, or at the latest by this timer.
    let periodic = async move {
        let mut interval = tokio::time::interval(RESYNC_WITHOUT_CONFIG);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            interval.tick().await;
            if let Err(error) = reconcile_without_config(&periodic_context).await {
                periodic_context
                    .metrics
                    .reconcile_errors
                    .with_label_values(&[error_policy::step(&error)])
                    .inc();
                tracing::warn!(error = %crate::error::describe(&error), "failed to reconcile without a DataplaneConfig");
            }
        }
    };
    tokio::select! {
        () = outcomes => {}
        () = periodic => {}
    }
}

/// Reconciles one DataplaneConfig.
pub async fn reconcile(
    config: Arc<DataplaneConfig>,
    context: Arc<Context>,
) -> Result<Action, Error> {
    let timer = context.metrics.reconcile_duration.start_timer();
    let outcome = if config.name_any() == DEFAULT_CONFIG_NAME {
        // The controller's cache may not hold the status this operator wrote a moment ago:
        // decide from the object as the API server has it now.
        match read_default_config(&context.client).await {
            Ok(Some(fresh)) => reconcile_default(Some(&fresh), &context).await,
            Ok(None) => reconcile_default(None, &context).await,
            Err(error) => Err(error),
        }
    } else {
        reconcile_ignored(&config, &context).await
    };
    timer.observe_duration();
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
    context
        .metrics
        .reconcile_errors
        .with_label_values(&[error_policy::step(error)])
        .inc();
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
        publish_refusals(config, status, context).await;
        if config.status.as_ref() != Some(status) {
            apply_status(config, status, &context.client).await?;
        }
    }
    Ok(None)
}

/// The DataplaneConfig named `default` as the API server has it now.
async fn read_default_config(client: &Client) -> Result<Option<DataplaneConfig>, Error> {
    Api::<DataplaneConfig>::all(client.clone())
        .get_opt(DEFAULT_CONFIG_NAME)
        .await
        .map_err(|source| Error::ReadSnapshot {
            what: "the DataplaneConfig default",
            source: source.into(),
        })
}

/// No DataplaneConfig named `default`: create missing DataplaneNodes, change nothing else.
async fn reconcile_without_config(context: &Context) -> Result<(), Error> {
    // The controller's store may lag: confirm with the API before acting as if there were none.
    if read_default_config(&context.client).await?.is_some() {
        return Ok(());
    }
    let timer = context.metrics.reconcile_duration.start_timer();
    let outcome = reconcile_default(None, context).await.map(|_| ());
    timer.observe_duration();
    outcome
}

/// The `default` DataplaneConfig (or none): snapshot -> plan -> apply -> status. Returns when to
/// reconcile again if nothing changes.
async fn reconcile_default(
    config: Option<&DataplaneConfig>,
    context: &Context,
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
    let objects = fetch(&context.client, &kube_proxy_spec, &context.settings).await?;
    let names = SnapshotNames {
        kube_proxy_daemon_set: kube_proxy_spec.daemon_set_name.clone(),
        agent_daemon_set: context.settings.agent_daemon_set.clone(),
    };
    let observed = snapshot::observe(
        &objects,
        &names,
        Utc::now(),
        context.settings.api_server_address.is_some(),
    );
    let mut plan = plan(config, &observed);
    if config.is_none() {
        plan = only_creations(plan);
    }

    let node_uids: BTreeMap<String, String> = objects
        .nodes
        .iter()
        .filter_map(|node| Some((node.name_any(), node.metadata.uid.clone()?)))
        .collect();
    let config_reference = config.map(reference_to);
    let kube_proxy_reference = objects.kube_proxy_daemon_set.as_ref().map(reference_to);
    let previous_status = config.and_then(|config| config.status.as_ref());
    let steps = steps_of(previous_status, &plan);

    for write in &plan.dataplane_nodes {
        apply_dataplane_node(&context.client, write, node_uids.get(&write.node_name)).await?;
    }
    if let Some(occurrence) = steps.dataplane_nodes {
        match &config_reference {
            Some(reference) => {
                context
                    .recorder
                    .publish_or_log(reference, &occurrence)
                    .await
            }
            None => {
                // Without a DataplaneConfig, each Node whose DataplaneNode was created carries
                // the Event about its own.
                for write in plan.dataplane_nodes.iter().filter(|write| write.create) {
                    if let Some(node) = objects
                        .nodes
                        .iter()
                        .find(|node| node.name_any() == write.node_name)
                    {
                        let created = Occurrence::normal(
                            "DataplaneNodeCreated",
                            "ApplyDataplaneNode",
                            format!("created DataplaneNode {}", describe_write(write)),
                        );
                        context
                            .recorder
                            .publish_or_log(&reference_to(node), &created)
                            .await;
                    }
                }
            }
        }
    }

    if plan.kube_proxy != KubeProxyAction::None {
        if let Some(daemon_set) = &objects.kube_proxy_daemon_set {
            apply_kube_proxy_action(&context.client, daemon_set, plan.kube_proxy).await?;
            if let Some(occurrence) = &steps.kube_proxy {
                for reference in config_reference.iter().chain(kube_proxy_reference.iter()) {
                    context.recorder.publish_or_log(reference, occurrence).await;
                }
            }
        }
    }

    for deletion in &plan.agent_pods_to_delete {
        let uid = objects
            .agent_namespace_pods
            .iter()
            .find(|pod| pod.name_any() == deletion.pod_name)
            .and_then(|pod| pod.metadata.uid.clone());
        delete_agent_pod(
            &context.client,
            &context.settings.agent_namespace,
            deletion,
            uid,
        )
        .await?;
    }
    if let (Some(reference), Some(occurrence)) = (&config_reference, &steps.agent_pods) {
        context.recorder.publish_or_log(reference, occurrence).await;
    }

    if let (Some(config), Some(status)) = (config, &plan.status) {
        if let Some(reference) = &config_reference {
            if let Some(occurrence) = &steps.phase {
                context.recorder.publish_or_log(reference, occurrence).await;
            }
        }
        publish_refusals(config, status, context).await;
        context.metrics.observe_status(status);
        if config.status.as_ref() != Some(status) {
            apply_status(config, status, &context.client).await?;
        }
    }
    Ok(plan.requeue_after)
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

async fn publish_refusals(
    config: &DataplaneConfig,
    status: &DataplaneConfigStatus,
    context: &Context,
) {
    if let Some(occurrence) = refusal(config.status.as_ref(), status) {
        context
            .recorder
            .publish_or_log(&reference_to(config), &occurrence)
            .await;
    }
}

/// Reads everything a snapshot is made of.
pub async fn fetch(
    client: &Client,
    kube_proxy: &KubeProxySpec,
    settings: &ControllerSettings,
) -> Result<ClusterObjects, Error> {
    let list = ListParams::default();
    let nodes = Api::<Node>::all(client.clone())
        .list(&list)
        .await
        .map_err(|source| Error::ReadSnapshot {
            what: "Nodes",
            source: source.into(),
        })?
        .items;
    let dataplane_nodes = Api::<DataplaneNode>::all(client.clone())
        .list(&list)
        .await
        .map_err(|source| Error::ReadSnapshot {
            what: "DataplaneNodes",
            source: source.into(),
        })?
        .items;
    let kube_proxy_daemon_sets: Api<DaemonSet> =
        Api::namespaced(client.clone(), &kube_proxy.namespace);
    let kube_proxy_daemon_set = kube_proxy_daemon_sets
        .get_opt(&kube_proxy.daemon_set_name)
        .await
        .map_err(|source| Error::ReadSnapshot {
            what: "the kube-proxy DaemonSet",
            source: source.into(),
        })?;
    let kube_proxy_namespace_pods = Api::<Pod>::namespaced(client.clone(), &kube_proxy.namespace)
        .list(&list)
        .await
        .map_err(|source| Error::ReadSnapshot {
            what: "kube-proxy pods",
            source: source.into(),
        })?
        .items;
    let agent_daemon_set = Api::<DaemonSet>::namespaced(client.clone(), &settings.agent_namespace)
        .get_opt(&settings.agent_daemon_set)
        .await
        .map_err(|source| Error::ReadSnapshot {
            what: "the agent DaemonSet",
            source: source.into(),
        })?;
    let (agent_namespace_revisions, agent_namespace_pods) = if agent_daemon_set.is_some() {
        let revisions =
            Api::<ControllerRevision>::namespaced(client.clone(), &settings.agent_namespace)
                .list(&list)
                .await
                .map_err(|source| Error::ReadSnapshot {
                    what: "agent ControllerRevisions",
                    source: source.into(),
                })?
                .items;
        let pods = Api::<Pod>::namespaced(client.clone(), &settings.agent_namespace)
            .list(&list)
            .await
            .map_err(|source| Error::ReadSnapshot {
                what: "agent pods",
                source: source.into(),
            })?
            .items;
        (revisions, pods)
    } else {
        (Vec::new(), Vec::new())
    };
    Ok(ClusterObjects {
        nodes,
        dataplane_nodes,
        kube_proxy_daemon_set,
        kube_proxy_namespace_pods,
        agent_daemon_set,
        agent_namespace_revisions,
        agent_namespace_pods,
    })
}

/// The object applied for one DataplaneNode: its whole spec and its owner, the Node (so it is
/// garbage-collected with it). Pure.
pub fn dataplane_node_object(write: &DataplaneNodeWrite, node_uid: Option<&String>) -> Value {
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

async fn apply_dataplane_node(
    client: &Client,
    write: &DataplaneNodeWrite,
    node_uid: Option<&String>,
) -> Result<(), Error> {
    let api: Api<DataplaneNode> = Api::all(client.clone());
    let object = dataplane_node_object(write, node_uid);
    api.patch(
        &write.node_name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&object),
    )
    .await
    .map(|_| ())
    .map_err(|source| Error::ApplyDataplaneNode {
        name: write.node_name.clone(),
        source: source.into(),
    })?;
    tracing::info!(node = %write.node_name, mode = %write.spec.mode, cleanup = write.spec.iptables_cleanup, create = write.create, "applied DataplaneNode spec");
    Ok(())
}

async fn apply_status(
    config: &DataplaneConfig,
    status: &DataplaneConfigStatus,
    client: &Client,
) -> Result<(), Error> {
    let api: Api<DataplaneConfig> = Api::all(client.clone());
    let name = config.name_any();
    api.patch_status(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&status_object(&name, status)),
    )
    .await
    .map(|_| ())
    .map_err(|source| Error::ApplyStatus {
        name,
        source: source.into(),
    })
}

async fn apply_kube_proxy_action(
    client: &Client,
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
    Api::<DaemonSet>::namespaced(client.clone(), &namespace)
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| Error::PatchKubeProxy {
            namespace: namespace.clone(),
            name: name.clone(),
            source: source.into(),
        })?;
    tracing::info!(%namespace, %name, ?action, "patched the kube-proxy DaemonSet");
    Ok(())
}

async fn delete_agent_pod(
    client: &Client,
    namespace: &str,
    deletion: &AgentPodDeletion,
    uid: Option<String>,
) -> Result<(), Error> {
    let params = DeleteParams {
        // Only the pod the plan saw: never a replacement that happens to reuse the name.
        preconditions: uid.map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match Api::<Pod>::namespaced(client.clone(), namespace)
        .delete(&deletion.pod_name, &params)
        .await
    {
        Ok(_) => {
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

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{DateTime, Utc};
    use switchyard_crds::{Condition, DataplaneMode, DataplaneNodeSpec, DataplanePhase};

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
            Some(&"uid-1".to_owned()),
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
}
