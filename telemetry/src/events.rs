//! Kubernetes Events as both Switchyard processes write them (the operator about its steps, the
//! agent about its node's drain and kube-proxy cleanup): one shape, one name scheme, one writer.
//!
//! kube-rs's recorder writes `events.k8s.io/v1` Events, which carry `eventTime`; for an object
//! without a namespace (DataplaneConfig, DataplaneNode, Node) it puts them in `default`. A
//! Kubernetes 1.20 API server validates such an Event with the legacy rules: an Event with an
//! `eventTime` about a cluster-scoped object must live in `kube-system`, so it answers 422
//! "involvedObject.namespace: Invalid value: \"\": does not match event.namespace". An Event
//! without `eventTime` about a cluster-scoped object may live in `default`, on 1.20 and on every
//! later release. So Switchyard writes `core/v1` Events without `eventTime`, in the involved
//! object's namespace, or `default` for cluster-scoped objects.
//!
//! Repeated Events are aggregated the way client-go does: the name is derived from the
//! involved object, the reason and the message, so the same Event again bumps `count` and
//! `lastTimestamp` on the existing object instead of creating another.

use std::hash::{Hash, Hasher};

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

/// The namespace an Event about a cluster-scoped object lives in.
pub const CLUSTER_SCOPED_EVENT_NAMESPACE: &str = "default";

/// Whether an Event reports normal progress or something that needs attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}

/// What happened, before it becomes an Event about some object.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Occurrence {
    pub type_: EventType,
    /// A CamelCase reason (for example `KubeProxyDisabled`).
    pub reason: String,
    /// What the process did or refused (for example `Disable`), for `kubectl get events -o wide`.
    pub action: String,
    pub message: String,
}

impl Occurrence {
    pub fn normal(reason: &str, action: &str, message: impl Into<String>) -> Self {
        Self {
            type_: EventType::Normal,
            reason: reason.to_owned(),
            action: action.to_owned(),
            message: message.into(),
        }
    }

    pub fn warning(reason: &str, action: &str, message: impl Into<String>) -> Self {
        Self {
            type_: EventType::Warning,
            reason: reason.to_owned(),
            action: action.to_owned(),
            message: message.into(),
        }
    }
}

/// Who reports: the component (`source.component`, `reportingComponent`, for example
/// `switchyard-agent`), its instance (`reportingInstance`: a pod or node name) and, for a
/// process bound to a node, that node (`source.host`, which `kubectl get events -o wide` shows).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reporter {
    pub component: String,
    pub instance: String,
    pub host: Option<String>,
}

impl Reporter {
    pub fn new(component: impl Into<String>, instance: impl Into<String>) -> Self {
        Self {
            component: component.into(),
            instance: instance.into(),
            host: None,
        }
    }

    /// The same reporter, running on node `host`.
    pub fn on_host(self, host: impl Into<String>) -> Self {
        Self {
            host: Some(host.into()),
            ..self
        }
    }
}

/// A reference to `object` for `involvedObject`.
pub fn reference_to<K: Resource<DynamicType = ()>>(object: &K) -> ObjectReference {
    ObjectReference {
        api_version: Some(K::api_version(&()).into_owned()),
        kind: Some(K::kind(&()).into_owned()),
        name: object.meta().name.clone(),
        namespace: object.meta().namespace.clone(),
        uid: object.meta().uid.clone(),
        resource_version: None,
        field_path: None,
    }
}

/// The Event to create for `occurrence` about `involved`, first seen at `now`. No `eventTime`,
/// and the namespace rule above, so that every API server from 1.20 on accepts it.
pub fn build_event(
    involved: &ObjectReference,
    occurrence: &Occurrence,
    reporter: &Reporter,
    now: DateTime<Utc>,
) -> Event {
    let namespace = involved
        .namespace
        .clone()
        .filter(|namespace| !namespace.is_empty())
        .unwrap_or_else(|| CLUSTER_SCOPED_EVENT_NAMESPACE.to_owned());
    let time = to_time(now);
    Event {
        metadata: ObjectMeta {
            name: Some(event_name(involved, occurrence)),
            namespace: Some(namespace),
            ..ObjectMeta::default()
        },
        involved_object: involved.clone(),
        type_: Some(occurrence.type_.as_str().to_owned()),
        reason: Some(occurrence.reason.clone()),
        action: Some(occurrence.action.clone()),
        message: Some(truncate_message(&occurrence.message)),
        source: Some(EventSource {
            component: Some(reporter.component.clone()),
            host: reporter.host.clone(),
        }),
        reporting_component: Some(reporter.component.clone()),
        reporting_instance: Some(reporter.instance.clone()),
        first_timestamp: Some(time.clone()),
        last_timestamp: Some(time),
        count: Some(1),
        event_time: None,
        series: None,
        related: None,
    }
}

/// `<object name>.<hash of what happened>`: stable, so a repeat finds the earlier Event.
pub fn event_name(involved: &ObjectReference, occurrence: &Occurrence) -> String {
    // FNV-1a: stable across processes and releases (std's SipHash keys are not guaranteed to be).
    let mut hasher = Fnv1a::default();
    involved.kind.hash(&mut hasher);
    involved.name.hash(&mut hasher);
    involved.uid.hash(&mut hasher);
    occurrence.hash(&mut hasher);
    let object_name = involved.name.as_deref().unwrap_or("unnamed");
    // Names are at most 253 characters; the hash takes 17 with its dot.
    let prefix: String = object_name.chars().take(200).collect();
    format!("{prefix}.{:016x}", hasher.finish())
}

/// Messages longer than an Event allows (1 KiB is what kubectl shows well; the API allows more,
/// but a runaway list of node names should not make a write fail).
fn truncate_message(message: &str) -> String {
    const LIMIT: usize = 1024;
    if message.len() <= LIMIT {
        return message.to_owned();
    }
    let mut end = LIMIT - 3;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &message[..end])
}

fn to_time(time: DateTime<Utc>) -> Time {
    Time(Timestamp::from_second(time.timestamp()).unwrap_or(Timestamp::UNIX_EPOCH))
}

#[derive(Default)]
struct Fnv1a(u64);

impl Hasher for Fnv1a {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        if self.0 == 0 {
            self.0 = 0xcbf2_9ce4_8422_2325;
        }
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// An Event could not be written.
#[derive(Debug, thiserror::Error)]
#[error("failed to record Event {name}")]
pub struct PublishError {
    /// The Event's name (see [`event_name`]).
    pub name: String,
    #[source]
    pub source: kube::Error,
}

/// Writes Events through the API.
#[derive(Clone)]
pub struct Publisher {
    client: Client,
    reporter: Reporter,
}

impl Publisher {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self { client, reporter }
    }

    /// Records `occurrence` about `involved`: creates the Event, or bumps the count of the same
    /// Event recorded earlier.
    pub async fn publish(
        &self,
        involved: &ObjectReference,
        occurrence: &Occurrence,
    ) -> Result<(), PublishError> {
        let event = build_event(involved, occurrence, &self.reporter, Utc::now());
        let namespace = event.metadata.namespace.clone().unwrap_or_default();
        let name = event.name_any();
        let events: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let failed = |name: &str| {
            let name = name.to_owned();
            move |source| PublishError { name, source }
        };
        match events.create(&PostParams::default(), &event).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                let existing = events.get(&name).await.map_err(failed(&name))?;
                let patch = json!({
                    "count": existing.count.unwrap_or(1).saturating_add(1),
                    "lastTimestamp": event.last_timestamp,
                });
                events
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(|_| ())
                    .map_err(failed(&name))
            }
            Err(source) => Err(failed(&name)(source)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORTER: &str = "switchyard-operator";

    fn reporter() -> Reporter {
        Reporter::new(REPORTER, "operator-0")
    }

    /// A DataplaneConfig named `default` (cluster-scoped), without depending on the CRDs.
    fn config_reference() -> ObjectReference {
        ObjectReference {
            api_version: Some("switchyard.dev/v1alpha1".into()),
            kind: Some("DataplaneConfig".into()),
            name: Some("default".into()),
            uid: Some("0b7c".into()),
            ..ObjectReference::default()
        }
    }

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-22T01:18:18.250Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn events_about_cluster_scoped_objects_live_in_default_without_an_event_time() {
        let occurrence = Occurrence::normal("KubeProxyDisabled", "Disable", "kube-proxy disabled");
        let event = build_event(&config_reference(), &occurrence, &reporter(), now());
        assert_eq!(event.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(event.involved_object.namespace, None);
        assert_eq!(
            event.event_time, None,
            "1.20 rejects eventTime on cluster-scoped Events outside kube-system"
        );
        assert_eq!(
            event.involved_object.kind.as_deref(),
            Some("DataplaneConfig")
        );
        assert_eq!(event.count, Some(1));
        let serialized = serde_json::to_value(&event).unwrap();
        assert_eq!(serialized["firstTimestamp"], "2026-11-22T01:18:18Z");
        assert!(serialized.get("eventTime").is_none());
        assert_eq!(serialized["source"]["component"], REPORTER);
        assert_eq!(serialized["reportingComponent"], REPORTER);
        assert_eq!(serialized["reportingInstance"], "operator-0");
        assert!(serialized["source"].get("host").is_none());
    }

    #[test]
    fn a_reporter_on_a_node_names_the_node_as_the_source_host() {
        let occurrence = Occurrence::normal("DrainStarted", "Drain", "draining");
        let reporter = Reporter::new("switchyard-agent", "node-1").on_host("node-1");
        let event = build_event(&config_reference(), &occurrence, &reporter, now());
        let source = event.source.unwrap_or_default();
        assert_eq!(source.component.as_deref(), Some("switchyard-agent"));
        assert_eq!(source.host.as_deref(), Some("node-1"));
    }

    #[test]
    fn events_about_namespaced_objects_live_in_the_objects_namespace() {
        let reference = ObjectReference {
            api_version: Some("apps/v1".into()),
            kind: Some("DaemonSet".into()),
            name: Some("kube-proxy".into()),
            namespace: Some("kube-system".into()),
            ..ObjectReference::default()
        };
        let occurrence = Occurrence::normal("KubeProxyDisabled", "Disable", "disabled");
        let event = build_event(&reference, &occurrence, &reporter(), now());
        assert_eq!(event.metadata.namespace.as_deref(), Some("kube-system"));
    }

    #[test]
    fn the_same_occurrence_gets_the_same_name_and_a_different_one_another() {
        let reference = config_reference();
        let disabled = Occurrence::normal("KubeProxyDisabled", "Disable", "disabled");
        let restored = Occurrence::normal("KubeProxyRestored", "Restore", "restored");
        assert_eq!(
            event_name(&reference, &disabled),
            event_name(&reference, &disabled.clone())
        );
        assert_ne!(
            event_name(&reference, &disabled),
            event_name(&reference, &restored)
        );
        assert!(event_name(&reference, &disabled).starts_with("default."));
    }

    #[test]
    fn a_recreated_object_gets_events_of_its_own() {
        let occurrence = Occurrence::normal("DrainStarted", "Drain", "draining");
        let first = config_reference();
        let recreated = ObjectReference {
            uid: Some("1d9e".into()),
            ..config_reference()
        };
        assert_ne!(
            event_name(&first, &occurrence),
            event_name(&recreated, &occurrence)
        );
    }

    #[test]
    fn event_names_are_stable_across_releases() {
        // A changed hash would make every upgrade duplicate the Events of the last hour.
        let reference = config_reference();
        let occurrence = Occurrence::warning("KubeProxyManagedExternally", "Disable", "refused");
        assert_eq!(
            event_name(&reference, &occurrence),
            "default.cc569294cf76d4e2"
        );
    }

    /// A kube client whose every request goes to `answer`, which sees the method, the path
    /// and the body, and whose requests are logged on `calls`.
    fn client_answering(
        calls: std::sync::Arc<std::sync::Mutex<Vec<(String, String, serde_json::Value)>>>,
        answer: fn(&str, &str, usize) -> (u16, serde_json::Value),
    ) -> Client {
        use http_body_util::BodyExt;
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let calls = calls.clone();
            async move {
                let method = request.method().to_string();
                let path = request.uri().path().to_owned();
                let bytes = match request.into_body().collect().await {
                    Ok(collected) => collected.to_bytes(),
                    Err(_) => bytes::Bytes::new(),
                };
                let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
                let seen = {
                    let mut calls = calls
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    calls.push((method.clone(), path.clone(), body));
                    calls.iter().filter(|call| call.0 == method).count()
                };
                let (status, answer) = answer(&method, &path, seen);
                Ok::<_, std::convert::Infallible>(
                    http::Response::builder()
                        .status(status)
                        .header("content-type", "application/json")
                        .body(http_body_util::Full::new(bytes::Bytes::from(
                            answer.to_string(),
                        )))
                        .expect("a valid response"),
                )
            }
        });
        Client::new(service, "default")
    }

    #[tokio::test]
    async fn a_repeated_event_bumps_the_count_of_the_one_recorded_before() {
        let calls = std::sync::Arc::default();
        let client = client_answering(std::sync::Arc::clone(&calls), |method, _, seen| {
            let event = json!({"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": "default.x", "namespace": "default"},
                "involvedObject": {}, "count": 4});
            match (method, seen) {
                ("POST", 1) => (201, event),
                ("POST", _) => (
                    409,
                    json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                        "status": "Failure", "reason": "AlreadyExists", "code": 409}),
                ),
                _ => (200, event),
            }
        });
        let publisher = Publisher::new(client, reporter());
        let occurrence = Occurrence::normal("DrainStarted", "Drain", "draining");
        publisher
            .publish(&config_reference(), &occurrence)
            .await
            .expect("the first is created");
        publisher
            .publish(&config_reference(), &occurrence)
            .await
            .expect("the repeat is counted");
        let calls = calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let name = event_name(&config_reference(), &occurrence);
        let path = format!("/api/v1/namespaces/default/events/{name}");
        let methods: Vec<(&str, &str)> = calls
            .iter()
            .map(|(method, path, _)| (method.as_str(), path.as_str()))
            .collect();
        assert_eq!(
            methods,
            [
                ("POST", "/api/v1/namespaces/default/events"),
                ("POST", "/api/v1/namespaces/default/events"),
                ("GET", path.as_str()),
                ("PATCH", path.as_str()),
            ]
        );
        assert_eq!(calls[0].2["metadata"]["name"], name.as_str());
        assert!(calls[0].2.get("eventTime").is_none());
        assert_eq!(calls[3].2["count"], 5, "the count read back, plus one");
    }

    #[tokio::test]
    async fn a_refused_event_is_an_error_naming_the_event_with_the_apis_answer_as_its_source() {
        let client = client_answering(std::sync::Arc::default(), |_, _, _| {
            (
                403,
                json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                    "status": "Failure", "reason": "Forbidden", "code": 403}),
            )
        });
        let occurrence = Occurrence::normal("DrainStarted", "Drain", "draining");
        let error = Publisher::new(client, reporter())
            .publish(&config_reference(), &occurrence)
            .await
            .expect_err("forbidden");
        assert_eq!(error.name, event_name(&config_reference(), &occurrence));
        assert!(
            matches!(&error.source, kube::Error::Api(status) if status.code == 403),
            "{error:?}"
        );
    }

    #[test]
    fn long_messages_are_cut_at_a_character_boundary() {
        let message = "é".repeat(2000);
        let cut = truncate_message(&message);
        assert!(cut.len() <= 1024 && cut.ends_with("..."));
    }
}
