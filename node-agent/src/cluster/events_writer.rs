//! Publishes the agent's Events (decided in [`super::events`]) about its DataplaneNode, through
//! the Event writer the operator uses too ([`switchyard_telemetry::events::Publisher`]: core/v1
//! Events without `eventTime`, which a 1.20 API server accepts about a cluster-scoped object).
//!
//! Thin I/O, off the agent's loop: the loop queues and never waits for the API server. An Event
//! is best effort, as in client-go: a few tries, each bounded in time, then it is logged and
//! dropped (the DataplaneNode's conditions still say what happened).

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use switchyard_crds::DataplaneNode;
use switchyard_model::error::chain;
use switchyard_telemetry::events::{Occurrence, Publisher};
use switchyard_telemetry::Heartbeat;
use tokio::sync::mpsc;

/// The component named in the agent's Events.
pub const REPORTING_COMPONENT: &str = "switchyard-agent";

/// Events queued and not yet written; past this the loop drops new ones (with a warning) rather
/// than wait. A transition makes at most a handful, and the rate limit bounds the rest.
pub const QUEUE_CAPACITY: usize = 64;

/// One try: a create, and for a repeat a read and a patch.
pub const PUBLISH_TIMEOUT: Duration = Duration::from_secs(30);
const TRIES: u32 = 3;
const FIRST_BACKOFF: Duration = Duration::from_secs(1);

/// An Event to write about a DataplaneNode.
#[derive(Clone, Debug, PartialEq)]
pub struct EventRequest {
    pub involved: ObjectReference,
    pub occurrence: Occurrence,
}

/// The reference to the DataplaneNode `name` (the object `uid`, when known) for `involvedObject`.
pub fn dataplane_node_reference(name: &str, uid: Option<&str>) -> ObjectReference {
    ObjectReference {
        api_version: Some(DataplaneNode::api_version(&()).into_owned()),
        kind: Some(DataplaneNode::kind(&()).into_owned()),
        name: Some(name.to_owned()),
        uid: uid.map(str::to_owned),
        ..ObjectReference::default()
    }
}

/// Writes every queued Event through `publisher` until the queue closes (see
/// [`run_event_writer`]).
pub async fn run_publisher(
    publisher: Publisher,
    requests: mpsc::Receiver<EventRequest>,
    heartbeat: Heartbeat,
) {
    let publish = move |request: EventRequest| {
        let publisher = publisher.clone();
        async move {
            publisher
                .publish(&request.involved, &request.occurrence)
                .await
        }
    };
    run_event_writer(publish, requests, heartbeat).await;
}

/// Writes every queued Event with `publish` until the queue closes. Each try is a step of
/// `heartbeat`, bounded by [`PUBLISH_TIMEOUT`]; the backoff between tries and the wait for the
/// next Event are not.
pub async fn run_event_writer<F, Fut, E>(
    mut publish: F,
    mut requests: mpsc::Receiver<EventRequest>,
    heartbeat: Heartbeat,
) where
    F: FnMut(EventRequest) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: std::error::Error + 'static,
{
    while let Some(request) = requests.recv().await {
        let mut backoff = FIRST_BACKOFF;
        for attempt in 1..=TRIES {
            let step = heartbeat.step();
            let outcome = tokio::time::timeout(PUBLISH_TIMEOUT, publish(request.clone())).await;
            drop(step);
            let failure = match outcome {
                Ok(Ok(())) => {
                    tracing::info!(reason = %request.occurrence.reason, message = %request.occurrence.message, "recorded an Event");
                    break;
                }
                Ok(Err(error)) => chain(&error),
                Err(_) => format!(
                    "failed to record an Event: no answer within {} s",
                    PUBLISH_TIMEOUT.as_secs()
                ),
            };
            if attempt == TRIES {
                tracing::warn!(reason = %request.occurrence.reason, error = %failure, "dropped an Event after {TRIES} tries");
            } else {
                tracing::debug!(reason = %request.occurrence.reason, error = %failure, "retrying an Event");
                tokio::time::sleep(backoff).await;
                backoff *= 2;
            }
        }
    }
}

#[cfg(test)]
mod tests;
