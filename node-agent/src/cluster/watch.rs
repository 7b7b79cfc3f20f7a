//! The API server side: which EndpointSlice version to read (discovery), the
//! watchers that feed the agent, and the status writer.
//!
//! Facts about the oldest supported server (1.20) with kube 5.0: it does not serve
//! `discovery.k8s.io/v1` (so `Api<v1::EndpointSlice>` gets 404 and v1beta1 is read
//! through `DynamicObject` into the model's own v1beta1 types);
//! `Discovery::run_aggregated()` returns no groups there, so `Discovery::run()`
//! is used; streaming lists fail with 422, so watchers use the default list+watch.
//!
//! Every watcher retries forever with a short capped backoff: an API server that
//! is unreachable at start only keeps the gate closed (the previous process's
//! entries keep serving), and the agent catches up seconds after it returns.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::discovery::Discovery;
use kube::runtime::watcher;
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use switchyard_crds::{DataplaneNode, DataplaneNodeStatus};
use switchyard_telemetry::{Health, Heartbeat};
use tokio::sync::{mpsc, watch};

use crate::core::health::{health_check_node_port, ServiceEntry};
use crate::core::node::NodeFacts;
use crate::core::status::WrittenStatus;
use crate::core::store::StoreChange;
use crate::core::{DataplaneNodeView, Input};
use crate::model::{self, v1beta1, EndpointSliceModel, FieldError, ServiceName};

/// The agent's field manager for Server-Side Apply.
pub const FIELD_MANAGER: &str = "switchyard-agent";
const DISCOVERY_GROUP: &str = "discovery.k8s.io";
const BACKOFF_START: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Which EndpointSlice API the server serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndpointSliceVersion {
    V1,
    V1beta1,
}

/// Asks the server (retrying until it answers) which EndpointSlice version it
/// serves: v1 when listed, else v1beta1.
pub async fn discover_endpoint_slice_version(client: &Client) -> EndpointSliceVersion {
    let mut backoff = BACKOFF_START;
    let mut logged = false;
    loop {
        match Discovery::new(client.clone())
            .filter(&[DISCOVERY_GROUP])
            .run()
            .await
        {
            Ok(discovery) => {
                let serves_v1 = discovery.get(DISCOVERY_GROUP).is_some_and(|group| {
                    group
                        .versioned_resources("v1")
                        .iter()
                        .any(|(resource, _)| resource.kind == "EndpointSlice")
                });
                let version = if serves_v1 {
                    EndpointSliceVersion::V1
                } else {
                    EndpointSliceVersion::V1beta1
                };
                tracing::info!(?version, "EndpointSlice API version");
                return version;
            }
            Err(error) => {
                if !logged {
                    tracing::warn!(%error, "cannot reach the API server for discovery; retrying");
                    logged = true;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
}

fn key_of<K: Resource>(object: &K) -> ServiceName {
    ServiceName::new(
        object
            .meta()
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        object.meta().name.clone().unwrap_or_default(),
    )
}

/// Consumes a watcher stream, retrying errors with a capped backoff, and calls
/// `handle` with every event.
async fn consume<K, F>(
    api: Api<K>,
    config: watcher::Config,
    what: &'static str,
    heartbeat: Heartbeat,
    mut handle: F,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    F: FnMut(watcher::Event<K>) -> bool,
{
    let mut stream = watcher(api, config).boxed();
    let mut backoff = BACKOFF_START;
    let mut failing = false;
    while let Some(event) = stream.next().await {
        match event {
            Ok(event) => {
                if failing {
                    tracing::info!(what, "watching again");
                }
                backoff = BACKOFF_START;
                failing = false;
                // The step is the event's handling only; waiting on the stream is waiting
                // for work, however long the cluster stays quiet.
                let _step = heartbeat.step();
                if !handle(event) {
                    return;
                }
            }
            Err(error) => {
                if !failing {
                    tracing::warn!(what, %error, "watch failed; retrying");
                    failing = true;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
}

/// Turns watcher events into store changes: a (re)list is buffered from `Init`
/// to `InitDone` and handed over whole, so the agent never sees half a list;
/// single changes pass through. Objects that do not convert are logged and left
/// out, by a relist and by an update alike: an update that does not convert
/// removes the object's previous version, whose backends may be gone. Pure (no
/// I/O), so the buffering is tested on its own.
pub struct ChangeBuilder<K, V> {
    what: &'static str,
    convert: fn(&K) -> Result<Option<V>, FieldError>,
    buffer: Option<BTreeMap<ServiceName, V>>,
}

impl<K: Resource, V> ChangeBuilder<K, V> {
    pub fn new(what: &'static str, convert: fn(&K) -> Result<Option<V>, FieldError>) -> Self {
        Self {
            what,
            convert,
            buffer: None,
        }
    }

    /// The object in the model (`None`: not used by the datapath), or, when it
    /// does not convert, `None` after a warning naming it and the field.
    fn converted(&self, object: &K) -> Option<V> {
        match (self.convert)(object) {
            Ok(value) => value,
            Err(error) => {
                tracing::warn!(
                    what = self.what,
                    object = %key_of(object),
                    field = %error.field,
                    reason = %error.reason,
                    "leaving out an object the datapath cannot use (a previous version is removed)"
                );
                None
            }
        }
    }

    pub fn on_event(&mut self, event: watcher::Event<K>) -> Option<StoreChange<V>> {
        match event {
            watcher::Event::Init => {
                self.buffer = Some(BTreeMap::new());
                None
            }
            watcher::Event::InitApply(object) => {
                if let Some(value) = self.converted(&object) {
                    if let Some(buffer) = self.buffer.as_mut() {
                        buffer.insert(key_of(&object), value);
                    }
                }
                None
            }
            watcher::Event::InitDone => self.buffer.take().map(StoreChange::Replace),
            // As in a relist, an object that does not convert is left out: its
            // previous version must not keep serving backends it no longer has.
            watcher::Event::Apply(object) => Some(match self.converted(&object) {
                Some(value) => StoreChange::Upsert(key_of(&object), value),
                None => StoreChange::Remove(key_of(&object)),
            }),
            watcher::Event::Delete(object) => Some(StoreChange::Remove(key_of(&object))),
        }
    }
}

/// How the Service and EndpointSlice collections are listed and watched.
///
/// Lists are served from the API server's watch cache (resourceVersion 0), as
/// kube-proxy's and the kubelet's informers list: a quorum read of every Service
/// and EndpointSlice from etcd, by every agent at every restart (a rolling upgrade
/// of thousands of nodes), costs the control plane far more, and the watch that
/// follows brings a list that was a little behind up to date. The Node and the
/// DataplaneNode (one object each) stay quorum reads.
///
/// Both are watched with kube-proxy's label selector (`model::labels`): a
/// Service owned by another proxy (`service.kubernetes.io/service-proxy-name`),
/// its slices, and the slices of headless Services are never listed, and one
/// that gains the label leaves the watch as a deletion. The conversion leaves
/// such objects out too, for the standalone mode's manifests.
fn collection_watch_config() -> watcher::Config {
    watcher::Config::default()
        .any_semantic()
        .labels(model::labels::KUBE_PROXY_LABEL_SELECTOR)
}

/// Watches a collection converted to the model, sending complete lists as one
/// `Replace` and single changes as they come. Returns when the agent is gone.
async fn watch_collection<K, V>(
    api: Api<K>,
    what: &'static str,
    convert: fn(&K) -> Result<Option<V>, FieldError>,
    wrap: fn(StoreChange<V>) -> Input,
    inputs: mpsc::UnboundedSender<Input>,
    heartbeat: Heartbeat,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let mut builder = ChangeBuilder::new(what, convert);
    consume(
        api,
        collection_watch_config(),
        what,
        heartbeat,
        |event| match builder.on_event(event) {
            Some(change) => inputs.send(wrap(change)).is_ok(),
            None => true,
        },
    )
    .await;
}

fn service_entry(service: &Service) -> Result<Option<ServiceEntry>, FieldError> {
    Ok(model::service_from_v1(service)?.map(|model| ServiceEntry {
        model,
        health_check_node_port: health_check_node_port(service),
    }))
}

fn slice_model_v1(slice: &EndpointSlice) -> Result<Option<EndpointSliceModel>, FieldError> {
    model::endpoint_slice_from_v1(slice)
}

fn slice_model_v1beta1(object: &DynamicObject) -> Result<Option<EndpointSliceModel>, FieldError> {
    let value = serde_json::to_value(object).map_err(|error| FieldError {
        field: "(object)".into(),
        reason: error.to_string(),
    })?;
    let slice: v1beta1::EndpointSlice =
        serde_path_to_error::deserialize(value).map_err(|error| FieldError {
            field: error.path().to_string(),
            reason: error.inner().to_string(),
        })?;
    v1beta1::endpoint_slice_from_v1beta1(&slice)
}

pub fn endpoint_slice_v1beta1_resource() -> ApiResource {
    ApiResource {
        group: DISCOVERY_GROUP.into(),
        version: "v1beta1".into(),
        api_version: v1beta1::API_VERSION.into(),
        kind: "EndpointSlice".into(),
        plural: "endpointslices".into(),
    }
}

/// Starts the watchers; they send to `inputs` until it closes. Each registers a
/// heartbeat with `health` whose steps (one event's handling) last at most `step_bound`.
pub fn spawn_watchers(
    client: Client,
    node_name: String,
    inputs: mpsc::UnboundedSender<Input>,
    health: &Health,
    step_bound: Duration,
) -> Vec<tokio::task::JoinHandle<()>> {
    let heartbeat = |what: &str| health.register_loop(format!("{what} watch"), step_bound);
    let mut tasks = Vec::new();
    tasks.push(tokio::spawn(watch_collection(
        Api::<Service>::all(client.clone()),
        "Services",
        service_entry,
        Input::Services,
        inputs.clone(),
        heartbeat("Services"),
    )));
    let slices_heartbeat = heartbeat("EndpointSlices");
    let slices_client = client.clone();
    let slices_inputs = inputs.clone();
    tasks.push(tokio::spawn(async move {
        match discover_endpoint_slice_version(&slices_client).await {
            EndpointSliceVersion::V1 => {
                watch_collection(
                    Api::<EndpointSlice>::all(slices_client),
                    "EndpointSlices",
                    slice_model_v1,
                    Input::EndpointSlices,
                    slices_inputs,
                    slices_heartbeat,
                )
                .await
            }
            EndpointSliceVersion::V1beta1 => {
                watch_collection(
                    Api::<DynamicObject>::all_with(
                        slices_client,
                        &endpoint_slice_v1beta1_resource(),
                    ),
                    "EndpointSlices",
                    slice_model_v1beta1,
                    Input::EndpointSlices,
                    slices_inputs,
                    slices_heartbeat,
                )
                .await
            }
        }
    }));
    let by_name = format!("metadata.name={node_name}");
    let node_inputs = inputs.clone();
    let node_api = Api::<Node>::all(client.clone());
    let node_config = watcher::Config::default().fields(&by_name);
    let node_heartbeat = heartbeat("Node");
    tasks.push(tokio::spawn(async move {
        consume(
            node_api,
            node_config,
            "Node",
            node_heartbeat,
            |event| match event {
                watcher::Event::Apply(node) | watcher::Event::InitApply(node) => node_inputs
                    .send(Input::Node(NodeFacts::from_node(&node)))
                    .is_ok(),
                _ => true,
            },
        )
        .await
    }));
    let dataplane_api = Api::<DataplaneNode>::all(client);
    let dataplane_config = watcher::Config::default().fields(&by_name);
    let dataplane_heartbeat = heartbeat("DataplaneNode");
    tasks.push(tokio::spawn(async move {
        let mut found: Option<DataplaneNodeView> = None;
        let what = "DataplaneNode";
        consume(
            dataplane_api,
            dataplane_config,
            what,
            dataplane_heartbeat,
            |event| {
                let answer = match event {
                    watcher::Event::Init => {
                        found = None;
                        return true;
                    }
                    watcher::Event::InitApply(object) => {
                        found = Some(view_of(&object));
                        return true;
                    }
                    watcher::Event::InitDone => found.take(),
                    watcher::Event::Apply(object) => Some(view_of(&object)),
                    // The agent decides what a missing DataplaneNode means (see
                    // `follow::instruction`): one that disappears keeps the node as
                    // it is.
                    watcher::Event::Delete(_) => None,
                };
                inputs.send(Input::DataplaneNode(answer)).is_ok()
            },
        )
        .await
    }));
    tasks
}

fn view_of(object: &DataplaneNode) -> DataplaneNodeView {
    DataplaneNodeView {
        uid: object.metadata.uid.clone(),
        generation: object.metadata.generation,
        spec: object.spec.clone(),
        status: object.status.clone(),
    }
}

/// Writes the latest status handed over by the agent, whenever it changes,
/// retrying failures. Writes are Server-Side Apply on the status subresource with
/// field manager `switchyard-agent`.
pub async fn run_status_writer(
    client: Client,
    node_name: String,
    mut statuses: watch::Receiver<WrittenStatus>,
    written: watch::Sender<StatusWrites>,
    heartbeat: Heartbeat,
) {
    let api = Api::<DataplaneNode>::all(client);
    let mut backoff = BACKOFF_START;
    let mut last_written: Option<DataplaneNodeStatus> = None;
    loop {
        let wanted = statuses.borrow_and_update().clone();
        // The core hands over a status only when it must be written
        // (`core::round`); a failed write is retried with the latest one.
        if let Some(status) = &wanted.status {
            // The step is the write (the backoff after a failure is waiting).
            let step = heartbeat.step();
            let written_now = write_status(&api, &node_name, status).await;
            drop(step);
            match written_now {
                Ok(()) => {
                    tracing::debug!("status written");
                    backoff = BACKOFF_START;
                    let disruption_only = last_written
                        .as_ref()
                        .is_some_and(|last| differs_only_in_disruption(last, status));
                    written.send_modify(|count| count.record(disruption_only));
                    last_written = Some(status.clone());
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot write the DataplaneNode status; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    continue;
                }
            }
        }
        if statuses.changed().await.is_err() {
            return;
        }
    }
}

/// How many status writes the writer made, and how many of them carried nothing new but the
/// disruption report (published at a bounded rate for the operator's canary soak, not in answer
/// to anything the agent watches).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatusWrites {
    pub total: u64,
    pub disruption_only: u64,
}

impl StatusWrites {
    fn record(&mut self, disruption_only: bool) {
        self.total += 1;
        if disruption_only {
            self.disruption_only += 1;
        }
    }
}

/// Whether `next` differs from `last` in its disruption report only.
fn differs_only_in_disruption(last: &DataplaneNodeStatus, next: &DataplaneNodeStatus) -> bool {
    last.disruption != next.disruption
        && DataplaneNodeStatus {
            disruption: None,
            ..last.clone()
        } == DataplaneNodeStatus {
            disruption: None,
            ..next.clone()
        }
}

async fn write_status(
    api: &Api<DataplaneNode>,
    node_name: &str,
    status: &DataplaneNodeStatus,
) -> Result<(), kube::Error> {
    let patch = serde_json::json!({
        "apiVersion": format!("{}/{}", switchyard_crds::API_GROUP, switchyard_crds::API_VERSION),
        "kind": "DataplaneNode",
        "metadata": {"name": node_name},
        "status": status,
    });
    api.patch_status(
        node_name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_that_changes_only_the_disruption_report_is_counted_apart() {
        let last = DataplaneNodeStatus::default();
        let report = switchyard_crds::DisruptionReport::default();
        let only_disruption = DataplaneNodeStatus {
            disruption: Some(report.clone()),
            ..last.clone()
        };
        assert!(differs_only_in_disruption(&last, &only_disruption));
        // Controls: another field changed too, or nothing changed at all.
        let more = DataplaneNodeStatus {
            disruption: Some(report),
            services_programmed: Some(7),
            ..last.clone()
        };
        assert!(!differs_only_in_disruption(&last, &more));
        assert!(!differs_only_in_disruption(&last, &last.clone()));
        let mut writes = StatusWrites::default();
        writes.record(true);
        writes.record(false);
        assert_eq!(
            writes,
            StatusWrites {
                total: 2,
                disruption_only: 1
            }
        );
    }

    #[test]
    fn services_and_endpoint_slices_are_listed_from_the_watch_cache() {
        assert_eq!(
            collection_watch_config().list_semantic,
            watcher::ListSemantic::Any
        );
    }

    #[test]
    fn services_and_endpoint_slices_are_watched_with_kube_proxys_label_selector() {
        assert_eq!(
            collection_watch_config().label_selector.as_deref(),
            Some("!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless")
        );
    }

    fn labelled_service(labels: serde_json::Value) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default", "labels": labels},
            "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80}]}
        }))
        .expect("a valid Service")
    }

    #[test]
    fn a_service_that_gains_the_proxy_name_label_is_removed_and_one_without_it_is_kept() {
        let mut builder = ChangeBuilder::new("Services", service_entry);
        assert!(matches!(
            builder.on_event(watcher::Event::Apply(labelled_service(
                serde_json::json!({"app": "web"})
            ))),
            Some(StoreChange::Upsert(key, _)) if key == ServiceName::new("default", "web")
        ));
        assert_eq!(
            builder.on_event(watcher::Event::Apply(labelled_service(serde_json::json!({
                "app": "web",
                "service.kubernetes.io/service-proxy-name": "other-proxy"
            })))),
            Some(StoreChange::Remove(ServiceName::new("default", "web")))
        );
    }

    #[test]
    fn a_labelled_v1beta1_slice_is_left_out_of_a_list() {
        let mut builder = ChangeBuilder::new("EndpointSlices", slice_model_v1beta1);
        let mut labelled = v1beta1_slice("web-2", true);
        labelled
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("service.kubernetes.io/headless".into(), String::new());
        assert_eq!(builder.on_event(watcher::Event::Init), None);
        assert_eq!(
            builder.on_event(watcher::Event::InitApply(v1beta1_slice("web-1", true))),
            None
        );
        assert_eq!(builder.on_event(watcher::Event::InitApply(labelled)), None);
        let Some(StoreChange::Replace(list)) = builder.on_event(watcher::Event::InitDone) else {
            panic!("a complete list");
        };
        assert_eq!(
            list.keys().cloned().collect::<Vec<_>>(),
            vec![ServiceName::new("default", "web-1")]
        );
    }

    fn v1beta1_slice(name: &str, ready: bool) -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1beta1",
            "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": "default",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [{"addresses": ["10.244.2.10"], "conditions": {"ready": ready},
                           "topology": {"kubernetes.io/hostname": "node-2"}}]
        }))
        .expect("a valid object")
    }

    #[test]
    fn a_v1beta1_slice_read_as_a_dynamic_object_converts_with_its_topology_node() {
        let model = slice_model_v1beta1(&v1beta1_slice("web-1", true))
            .expect("converts")
            .expect("used");
        assert_eq!(model.service, ServiceName::new("default", "web"));
        assert_eq!(model.endpoints[0].node_name.as_deref(), Some("node-2"));
        assert!(model.endpoints[0].ready);
    }

    #[test]
    fn a_malformed_v1beta1_slice_names_the_field() {
        let mut object = v1beta1_slice("web-1", true);
        object.data["endpoints"] = serde_json::json!("not a list");
        let error = slice_model_v1beta1(&object).expect_err("rejected");
        assert_eq!(error.field, "endpoints");
    }

    #[test]
    fn a_list_is_handed_over_whole_only_when_complete() {
        let mut builder = ChangeBuilder::new("EndpointSlices", slice_model_v1beta1);
        assert_eq!(builder.on_event(watcher::Event::Init), None);
        assert_eq!(
            builder.on_event(watcher::Event::InitApply(v1beta1_slice("web-1", true))),
            None
        );
        let mut broken = v1beta1_slice("web-2", true);
        broken.data["endpoints"] = serde_json::json!(7);
        assert_eq!(builder.on_event(watcher::Event::InitApply(broken)), None);
        assert_eq!(
            builder.on_event(watcher::Event::InitApply(v1beta1_slice("web-3", false))),
            None
        );
        let Some(StoreChange::Replace(list)) = builder.on_event(watcher::Event::InitDone) else {
            panic!("a complete list");
        };
        assert_eq!(
            list.keys().cloned().collect::<Vec<_>>(),
            vec![
                ServiceName::new("default", "web-1"),
                ServiceName::new("default", "web-3")
            ],
            "the malformed slice is left out"
        );
        assert!(matches!(
            builder.on_event(watcher::Event::Apply(v1beta1_slice("web-4", true))),
            Some(StoreChange::Upsert(key, _)) if key == ServiceName::new("default", "web-4")
        ));
        assert_eq!(
            builder.on_event(watcher::Event::Delete(v1beta1_slice("web-1", true))),
            Some(StoreChange::Remove(ServiceName::new("default", "web-1")))
        );
    }

    #[test]
    fn an_update_that_does_not_convert_removes_the_previous_version_as_a_relist_would() {
        let mut builder = ChangeBuilder::new("EndpointSlices", slice_model_v1beta1);
        assert!(matches!(
            builder.on_event(watcher::Event::Apply(v1beta1_slice("web-1", true))),
            Some(StoreChange::Upsert(key, _)) if key == ServiceName::new("default", "web-1")
        ));
        let mut broken = v1beta1_slice("web-1", true);
        broken.data["endpoints"] = serde_json::json!("not a list");
        assert_eq!(
            builder.on_event(watcher::Event::Apply(broken.clone())),
            Some(StoreChange::Remove(ServiceName::new("default", "web-1"))),
            "the old endpoints do not stay"
        );

        // A relist of the same broken object leaves it out the same way.
        assert_eq!(builder.on_event(watcher::Event::Init), None);
        assert_eq!(builder.on_event(watcher::Event::InitApply(broken)), None);
        let Some(StoreChange::Replace(list)) = builder.on_event(watcher::Event::InitDone) else {
            panic!("a complete list");
        };
        assert!(list.is_empty());
    }
}
