//! One reconcile, top to bottom: wait until the stores hold every write this operator made,
//! observe (a snapshot from the stores), plan ([`plan`] alone decides what is written: the
//! node-write budget, the requeues and what happens without a DataplaneConfig are the plan's),
//! apply ([`apply`]), publish the status; each step taken and each refusal recorded as an Event
//! (worded by [`crate::events`]), and a Warning Event on each Service the eBPF datapath does
//! not serve yet while eBPF serves some node ([`WarnedServices`] records each once).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use chrono::Utc;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Node, ObjectReference, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::PostParams;
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use switchyard_crds::{
    DataplaneConfig, DataplaneConfigStatus, DataplaneMode, KubeProxyManagement, DEFAULT_CONFIG_NAME,
};

use super::{apply, Context, KubeProxyLocation};
use crate::error::Error;
use crate::error_policy;
use crate::events::{self, reference_to, Occurrence, Steps};
use crate::planner::{
    plan, DataplaneNodeWrite, KubeProxyAction, ObservedCluster, Plan, UnsupportedFeature,
    UnsupportedService,
};
use crate::snapshot::{self, ClusterObjects, SnapshotNames};

/// How often the DataplaneConfig is reconciled when nothing changes and no timeout is pending.
const RESYNC_PERIOD: Duration = Duration::from_secs(300);

/// When a reconcile that left writes in the background looks again at the latest.
const BACKGROUND_RECHECK: Duration = Duration::from_secs(1);

/// Above this many DataplaneNodes created in one reconcile without a DataplaneConfig, one Event
/// about the DataplaneNode CustomResourceDefinition says so instead of one Event per Node (a
/// fresh install on 5,000 nodes would otherwise write 5,000 Events).
const PER_NODE_CREATION_EVENTS: usize = 10;

/// At most this many Services get their `UnsupportedByDataplane` Event per reconcile; the rest
/// follow in the next ones, soon after (see [`next_reconcile`]), so that a cluster with thousands
/// of such Services does not flood the Event queue and push out the transition's own Events.
const SERVICE_WARNINGS_PER_RECONCILE: usize = 100;

/// The name of the DataplaneNode CustomResourceDefinition (what bulk creation Events are about).
const DATAPLANE_NODE_CRD: &str = "dataplanenodes.switchyard.dev";

/// Reconciles one DataplaneConfig.
pub async fn reconcile(
    config: Arc<DataplaneConfig>,
    context: Arc<Context>,
) -> Result<Action, Error> {
    // The whole reconcile is one step: the controller calls it only when there is work.
    let _step = context.liveness.reconcile.step();
    let timer = context.metrics.reconcile_duration.start_timer();
    let started = std::time::Instant::now();
    let name = config.name_any();
    let waited = context.wait_for_fresh_stores().await;
    let waited_for_stores = started.elapsed();
    let outcome = match waited {
        Err(error) => Err(error),
        // The object the controller handed over may predate this operator's last status write:
        // decide from the store, which now holds it.
        Ok(()) if name == DEFAULT_CONFIG_NAME => match context.stores.config(DEFAULT_CONFIG_NAME) {
            Some(fresh) => reconcile_default(Some(&fresh), &context).await,
            None => {
                context.without_config.notify_one();
                Ok(None)
            }
        },
        Ok(()) => {
            let fresh = context.stores.config(&name).unwrap_or(config);
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
    let requeue_after = outcome?;
    context.consecutive_failures.store(0, Ordering::SeqCst);
    Ok(Action::requeue(
        requeue_after.unwrap_or(RESYNC_PERIOD).min(RESYNC_PERIOD),
    ))
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
        unsupported_services: Vec::new(),
    };
    if let Some(status) = &plan(Some(config), &observed).status {
        publish_refusals(config, status, context);
        if config.status.as_ref() != Some(status) {
            apply::status(config, status, context).await?;
        }
    }
    Ok(None)
}

/// No DataplaneConfig named `default`: the plan without one (missing DataplaneNodes created,
/// cleanup withdrawn where kube-proxy came back). Returns whether writes are left for another
/// round.
pub(super) async fn reconcile_without_config(context: &Arc<Context>) -> Result<bool, Error> {
    let _step = context.liveness.without_config.step();
    context.wait_for_fresh_stores().await?;
    if context.stores.config(DEFAULT_CONFIG_NAME).is_some() {
        return Ok(false);
    }
    let timer = context.metrics.reconcile_duration.start_timer();
    let outcome = reconcile_default(None, context).await;
    timer.observe_duration();
    outcome.map(|requeue_after| requeue_after == Some(Duration::ZERO))
}

/// The `default` DataplaneConfig (or none): observe -> plan -> apply -> status. Returns when to
/// reconcile again if nothing changes (`Some(ZERO)` when writes were left for the next round).
async fn reconcile_default(
    config: Option<&DataplaneConfig>,
    context: &Arc<Context>,
) -> Result<Option<Duration>, Error> {
    let started = std::time::Instant::now();
    let (objects, observed) = observe(config, context).await;
    let mut plan = plan(config, &observed);
    drop(observed);
    let planned = started.elapsed();

    // Node writes still in flight when the reconcile stops waiting may finish in the background
    // only when nothing else in this plan must follow them (a kube-proxy patch or an agent pod
    // deletion is applied after the node writes it goes with, as the plan orders them).
    // A new disruption-budget record is written before the node writes that send nodes back to
    // kube-proxy: it is what keeps them from being switched to eBPF again under this spec (the
    // planner has no memory but the status), so it must not be lost when a later step fails.
    if let (Some(config), Some(status)) = (config, plan.status.as_ref()) {
        if records_new_budget_evidence(config, status) {
            apply::status(config, status, context).await?;
        }
    }

    let later_steps_follow =
        plan.kube_proxy != KubeProxyAction::None || !plan.agent_pods_to_delete.is_empty();
    let planned_writes = plan.dataplane_nodes.len();
    let nodes = apply::dataplane_nodes(
        context,
        &plan.dataplane_nodes,
        &objects.nodes,
        !later_steps_follow,
    )
    .await?;
    // The Events describe what was written (or is being written: see apply::dataplane_nodes).
    plan.dataplane_nodes.truncate(nodes.started);
    tracing::debug!(
        nodes = objects.nodes.len(),
        writes = plan.dataplane_nodes.len(),
        more_writes_left = nodes.started < planned_writes,
        planning_took_ms = planned.as_millis() as u64,
        writes_took_ms = (started.elapsed() - planned).as_millis() as u64,
        "applied the plan's DataplaneNode writes"
    );
    let steps = events::steps_of(config.and_then(|config| config.status.as_ref()), &plan);
    let config_reference = config.map(reference_to);
    match &config_reference {
        Some(reference) => record(context, [reference], steps.dataplane_nodes.as_ref()),
        None => publish_creations(context, &plan.dataplane_nodes, &objects.nodes).await,
    }

    if let (KubeProxyAction::Disable | KubeProxyAction::Restore, Some(daemon_set)) =
        (plan.kube_proxy, objects.kube_proxy_daemon_set.as_deref())
    {
        apply::kube_proxy_action(context, daemon_set, plan.kube_proxy).await?;
        let daemon_set_reference = reference_to(daemon_set);
        let references = config_reference.iter().chain([&daemon_set_reference]);
        record(context, references, steps.kube_proxy.as_ref());
    }

    apply::delete_agent_pods(
        context,
        &plan.agent_pods_to_delete,
        &objects.agent_namespace_pods,
    )
    .await?;
    record(context, config_reference.iter(), steps.agent_pods.as_ref());

    // The disruption budget exceeded: the evidence about the DataplaneConfig and each Node over
    // budget, so that `kubectl describe node` shows it too.
    record(context, config_reference.iter(), steps.budget.as_ref());
    let budget_nodes: Vec<ObjectReference> = objects
        .nodes
        .iter()
        .filter(|node| steps.budget_nodes.contains(&node.name_any()))
        .map(|node| reference_to(node.as_ref()))
        .collect();
    record(context, &budget_nodes, steps.budget.as_ref());

    let warnings_left = warn_unsupported_services(context, &plan.services_to_warn);

    let mut left_in_background = nodes.left_in_background;
    if let (Some(config), Some(status)) = (config, &plan.status) {
        left_in_background |= publish_status(config, status, &steps, context).await?;
    }
    Ok(next_reconcile(
        &plan,
        nodes.started < planned_writes,
        left_in_background || warnings_left,
    ))
}

/// Whether `status` records disruption-budget evidence the DataplaneConfig's last status does not.
fn records_new_budget_evidence(config: &DataplaneConfig, status: &DataplaneConfigStatus) -> bool {
    status.budget_exceeded.is_some()
        && config
            .status
            .as_ref()
            .and_then(|previous| previous.budget_exceeded.as_ref())
            != status.budget_exceeded.as_ref()
}

/// Records the `UnsupportedByDataplane` Event on each Service of `to_warn` not warned about yet;
/// whether some are left for the next reconcile.
fn warn_unsupported_services(context: &Context, to_warn: &[Arc<UnsupportedService>]) -> bool {
    let (new, left) = context
        .warned_services
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .select(to_warn, SERVICE_WARNINGS_PER_RECONCILE);
    for service in &new {
        context.record(
            &service_reference(service),
            &events::unsupported_service(service),
        );
    }
    left
}

/// The Service `service` summarizes, as an Event's object.
fn service_reference(service: &UnsupportedService) -> ObjectReference {
    ObjectReference {
        api_version: Some(Service::api_version(&()).into_owned()),
        kind: Some(Service::kind(&()).into_owned()),
        name: Some(service.name.clone()),
        namespace: Some(service.namespace.clone()),
        uid: service.uid.clone(),
        ..ObjectReference::default()
    }
}

/// The unsupported Services already warned about, as they were then (UID and features). Events
/// are deduplicated like the operator's others: recorded when something new appears, and a
/// repeat (after an operator restart) only bumps the count of the Event of the same name.
#[derive(Debug, Default)]
pub(super) struct WarnedServices {
    warned: BTreeMap<(String, String), (Option<String>, Vec<UnsupportedFeature>)>,
}

impl WarnedServices {
    /// The Services of `to_warn` not yet warned about as they are now, at most `limit` of them,
    /// remembered from now on, and whether more are left. A Service no longer in `to_warn` is
    /// forgotten, so one that becomes unsupported again (or a cluster that goes to eBPF again)
    /// is warned again.
    pub(super) fn select(
        &mut self,
        to_warn: &[Arc<UnsupportedService>],
        limit: usize,
    ) -> (Vec<Arc<UnsupportedService>>, bool) {
        let listed: std::collections::BTreeSet<(&str, &str)> = to_warn
            .iter()
            .map(|service| (service.namespace.as_str(), service.name.as_str()))
            .collect();
        self.warned
            .retain(|(namespace, name), _| listed.contains(&(namespace.as_str(), name.as_str())));
        let mut new = Vec::new();
        let mut left = false;
        for service in to_warn {
            let key = (service.namespace.clone(), service.name.clone());
            let now = (service.uid.clone(), service.features.clone());
            if self.warned.get(&key) == Some(&now) {
                continue;
            }
            if new.len() == limit {
                left = true;
                break;
            }
            self.warned.insert(key, now);
            new.push(Arc::clone(service));
        }
        (new, left)
    }
}

/// When to reconcile again if nothing changes: at once when the plan's writes did not all start,
/// soon when some finish in the background (a write that fails there is no reconcile failure:
/// it is planned again without waiting for the next trigger), else when the plan says.
fn next_reconcile(plan: &Plan, writes_left: bool, left_in_background: bool) -> Option<Duration> {
    if writes_left {
        Some(Duration::ZERO)
    } else if left_in_background {
        Some(
            plan.requeue_after
                .map_or(BACKGROUND_RECHECK, |after| after.min(BACKGROUND_RECHECK)),
        )
    } else {
        plan.requeue_after
    }
}

/// The snapshot a plan is made from: the stores' objects (kube-proxy where `config` says it is,
/// which the watch mappers follow from now on) and, where the answer can hold a transition,
/// whether the operator may patch the kube-proxy DaemonSet.
async fn observe(
    config: Option<&DataplaneConfig>,
    context: &Context,
) -> (ClusterObjects, ObservedCluster) {
    let kube_proxy = config
        .map(|config| config.spec.kube_proxy.clone())
        .unwrap_or_default();
    if let Ok(mut location) = context.kube_proxy_location.write() {
        *location = KubeProxyLocation::of(&kube_proxy);
    }
    let settings = &context.settings;
    let objects = context.stores.objects(
        &kube_proxy,
        &settings.agent_namespace,
        &settings.agent_daemon_set,
    );
    let names = SnapshotNames {
        kube_proxy_daemon_set: kube_proxy.daemon_set_name.clone(),
        agent_daemon_set: settings.agent_daemon_set.clone(),
    };
    let api_server_address_configured = settings.api_server_address.is_some();
    let mut observed =
        snapshot::observe(&objects, &names, Utc::now(), api_server_address_configured);
    if let (Some(config), Some(daemon_set)) = (config, observed.kube_proxy_daemon_set.as_mut()) {
        if asks_patch_permission(config, daemon_set.disabled_by_switchyard) {
            daemon_set.patch_allowed = kube_proxy_patch_allowed(
                context,
                &kube_proxy.namespace,
                &kube_proxy.daemon_set_name,
            )
            .await;
        }
    }
    (objects, observed)
}

/// Publishes the `default` DataplaneConfig's status (its phase Event, refusals, metrics, and
/// the status itself when it changed); whether the write was left to finish in the background.
async fn publish_status(
    config: &DataplaneConfig,
    status: &DataplaneConfigStatus,
    steps: &Steps,
    context: &Arc<Context>,
) -> Result<bool, Error> {
    record(context, [&reference_to(config)], steps.phase.as_ref());
    publish_refusals(config, status, context);
    context.metrics.observe_status(status);
    if config.status.as_ref() == Some(status) {
        return Ok(false);
    }
    apply::status_within(config, status, context).await
}

/// Records `occurrence`, if any, about each of `references`.
fn record<'r>(
    context: &Context,
    references: impl IntoIterator<Item = &'r ObjectReference>,
    occurrence: Option<&Occurrence>,
) {
    if let Some(occurrence) = occurrence {
        for reference in references {
            context.record(reference, occurrence);
        }
    }
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

/// Events about DataplaneNodes created without a DataplaneConfig: each Node carries the Event
/// about its own, unless many were created at once; then one Event about the DataplaneNode
/// CustomResourceDefinition names them.
async fn publish_creations(context: &Context, writes: &[DataplaneNodeWrite], nodes: &[Arc<Node>]) {
    let created: Vec<&DataplaneNodeWrite> = writes.iter().filter(|write| write.create).collect();
    if created.len() > PER_NODE_CREATION_EVENTS {
        let reference = dataplane_node_crd_reference(context).await;
        context.record(&reference, &events::bulk_creation(&created));
        return;
    }
    for write in created {
        let node = nodes
            .iter()
            .find(|node| node.metadata.name.as_deref() == Some(write.node_name.as_str()));
        if let Some(node) = node {
            context.record(&reference_to(node.as_ref()), &events::creation(write));
        }
    }
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

/// Records the refusal in `status`, if it is new (see [`events::refusal`]).
fn publish_refusals(config: &DataplaneConfig, status: &DataplaneConfigStatus, context: &Context) {
    if let Some(occurrence) = events::refusal(config.status.as_ref(), status) {
        context.record(&reference_to(config), &occurrence);
    }
}

#[cfg(test)]
mod tests {
    use switchyard_crds::{DataplaneConfigStatus, DataplanePhase};

    use super::*;

    #[test]
    fn new_budget_evidence_is_written_first_and_evidence_already_recorded_is_not() {
        let record = switchyard_crds::BudgetExceeded {
            observed_generation: 1,
            action: switchyard_crds::BudgetExceededAction::Rollback,
            detected_at: Utc::now(),
            evidence: Vec::new(),
        };
        let with_record = DataplaneConfigStatus {
            budget_exceeded: Some(record),
            ..DataplaneConfigStatus::default()
        };
        let mut config = DataplaneConfig::new("default", Default::default());
        assert!(records_new_budget_evidence(&config, &with_record));
        assert!(!records_new_budget_evidence(
            &config,
            &DataplaneConfigStatus::default()
        ));
        config.status = Some(with_record.clone());
        assert!(!records_new_budget_evidence(&config, &with_record));
    }

    fn unsupported(
        name: &str,
        uid: &str,
        features: &[UnsupportedFeature],
    ) -> Arc<UnsupportedService> {
        Arc::new(UnsupportedService {
            namespace: "shop".into(),
            name: name.into(),
            uid: Some(uid.into()),
            features: features.to_vec(),
        })
    }

    fn names(selected: &[Arc<UnsupportedService>]) -> Vec<&str> {
        selected
            .iter()
            .map(|service| service.name.as_str())
            .collect()
    }

    #[test]
    fn each_unsupported_service_is_warned_about_once_until_it_changes_or_leaves_the_list() {
        let mut warned = WarnedServices::default();
        let pbx = unsupported("pbx", "u1", &[UnsupportedFeature::SctpPorts]);
        let lb = unsupported("lb", "u2", &[UnsupportedFeature::Ipv6]);
        let (new, left) = warned.select(&[pbx.clone(), lb.clone()], 10);
        assert_eq!((names(&new), left), (vec!["pbx", "lb"], false));
        let (new, _) = warned.select(&[pbx.clone(), lb.clone()], 10);
        assert!(new.is_empty(), "the same Services again: no new Event");

        let pbx_dual_stack = unsupported(
            "pbx",
            "u1",
            &[UnsupportedFeature::SctpPorts, UnsupportedFeature::Ipv6],
        );
        let (new, _) = warned.select(&[pbx_dual_stack.clone(), lb.clone()], 10);
        assert_eq!(names(&new), ["pbx"], "a new feature is worth a new Event");
        let recreated = unsupported("lb", "u3", &[UnsupportedFeature::Ipv6]);
        let (new, _) = warned.select(&[pbx_dual_stack.clone(), recreated.clone()], 10);
        assert_eq!(
            names(&new),
            ["lb"],
            "a Service recreated under its name is new"
        );

        let (new, _) = warned.select(std::slice::from_ref(&recreated), 10);
        assert!(new.is_empty());
        let (new, _) = warned.select(&[pbx_dual_stack.clone(), recreated], 10);
        assert_eq!(
            names(&new),
            ["pbx"],
            "a Service that left the list (fixed, or eBPF gone) is warned again when it comes back"
        );
    }

    #[test]
    fn at_most_the_limit_is_warned_about_per_reconcile_and_the_rest_are_left_for_the_next() {
        let mut warned = WarnedServices::default();
        let services: Vec<Arc<UnsupportedService>> = (0..5)
            .map(|index| {
                unsupported(
                    &format!("svc-{index}"),
                    &format!("u{index}"),
                    &[UnsupportedFeature::Ipv6],
                )
            })
            .collect();
        let (new, left) = warned.select(&services, 3);
        assert_eq!((names(&new), left), (vec!["svc-0", "svc-1", "svc-2"], true));
        let (new, left) = warned.select(&services, 3);
        assert_eq!((names(&new), left), (vec!["svc-3", "svc-4"], false));
        let (new, left) = warned.select(&services, 3);
        assert_eq!((new.len(), left), (0, false));
    }

    #[test]
    fn an_unsupported_service_event_is_about_the_service_in_its_namespace() {
        let lb = unsupported("lb", "u2", &[UnsupportedFeature::Ipv6]);
        let reference = service_reference(&lb);
        let occurrence = events::unsupported_service(&lb);
        let event = events::build_event(&reference, &occurrence, "operator-0", Utc::now());
        assert_eq!(event.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(event.event_time, None, "1.20 accepts it without eventTime");
        assert_eq!(event.involved_object.kind.as_deref(), Some("Service"));
        assert_eq!(event.involved_object.api_version.as_deref(), Some("v1"));
        assert_eq!(event.involved_object.uid.as_deref(), Some("u2"));
        assert_eq!(event.type_.as_deref(), Some("Warning"));
        assert_eq!(
            event.reason.as_deref(),
            Some(events::UNSUPPORTED_BY_DATAPLANE)
        );
        let message = event.message.unwrap_or_default();
        assert!(
            message.contains("does not serve this Service's IPv6 yet"),
            "{message}"
        );
        let sctp = events::unsupported_service(&unsupported(
            "pbx",
            "u1",
            &[UnsupportedFeature::SctpPorts],
        ));
        assert!(
            sctp.message.contains("SCTP ports") && !sctp.message.contains("IPv6"),
            "{}",
            sctp.message
        );
    }

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
}
