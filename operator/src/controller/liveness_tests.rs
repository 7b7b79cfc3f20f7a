//! `/healthz` through the controller's real wiring: a reconcile wedged on an API call turns it
//! 503 once the reconcile's bound has passed; an idle controller stays live for minutes.

use std::convert::Infallible;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher;
use switchyard_crds::{DataplaneConfig, DataplaneConfigSpec};
use switchyard_telemetry::Health;
use tokio::sync::mpsc;

use super::*;

type Answer = Result<http::Response<Full<Bytes>>, Infallible>;

/// A kube client whose every call reaches the test (its method and path on `calls`) and is
/// answered by `answer`, or never.
fn client_answering(
    calls: mpsc::UnboundedSender<String>,
    answer: impl Fn(&http::Request<kube::client::Body>) -> Option<http::Response<Full<Bytes>>>
        + Clone
        + Send
        + Sync
        + 'static,
) -> Client {
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let _ = calls.send(format!("{} {}", request.method(), request.uri()));
        let answer = answer(&request);
        async move {
            match answer {
                Some(response) => Answer::Ok(response),
                None => std::future::pending::<Answer>().await,
            }
        }
    });
    Client::new(service, "default")
}

fn json(status: u16, body: serde_json::Value) -> http::Response<Full<Bytes>> {
    http::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a valid response")
}

/// An API server with nothing in it whose watches stay quiet: every list is empty, every watch
/// waits for a change that never comes, every read of one object is "not found", every write
/// is forbidden.
fn quiet_empty_cluster(
    request: &http::Request<kube::client::Body>,
) -> Option<http::Response<Full<Bytes>>> {
    let query = request.uri().query().unwrap_or_default();
    if query.contains("watch=true") {
        return None;
    }
    let status = |code: u16, reason: &str| {
        json(
            code,
            serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                "status": "Failure", "reason": reason, "code": code}),
        )
    };
    if request.method() != http::Method::GET {
        return Some(status(403, "Forbidden"));
    }
    if request.uri().path().ends_with("/default") {
        return Some(status(404, "NotFound"));
    }
    Some(json(
        200,
        serde_json::json!({"kind": "List", "apiVersion": "v1",
            "metadata": {"resourceVersion": "1"}, "items": []}),
    ))
}

fn context(client: Client, health: &Health) -> Arc<Context> {
    Arc::new(Context::new(
        client.clone(),
        Recorder::new(client, "liveness-test"),
        Metrics::new().expect("metrics register"),
        ControllerSettings {
            agent_namespace: "switchyard-system".into(),
            agent_daemon_set: "switchyard-agent".into(),
            api_server_address: Some("10.99.0.1:6443".into()),
        },
        health,
    ))
}

/// Fills every store with an empty first list, as the watches do at start.
fn fill_stores_empty(context: &Context) {
    let mut writers = context
        .writers
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
        .expect("the writers are still there");
    macro_rules! listed_empty {
        ($($writer:ident),*) => {$(
            writers.$writer.apply_watcher_event(&watcher::Event::Init);
            writers.$writer.apply_watcher_event(&watcher::Event::InitDone);
        )*};
    }
    listed_empty!(
        configs,
        nodes,
        dataplane_nodes,
        daemon_sets,
        pods,
        revisions
    );
    let services = &context.stores.unsupported_services;
    services.apply(&watcher::Event::Init);
    services.apply(&watcher::Event::InitDone);
}

#[tokio::test(start_paused = true)]
async fn a_reconcile_wedged_on_an_api_call_turns_healthz_to_503_once_its_bound_has_passed() {
    let health = Health::new();
    let (calls, mut called) = mpsc::unbounded_channel();
    let context = context(client_answering(calls, |_| None), &health);
    fill_stores_empty(&context);
    // A DataplaneConfig not named `default`: the reconcile's one call writes its status.
    let config = Arc::new(DataplaneConfig {
        metadata: ObjectMeta {
            name: Some("other".into()),
            ..ObjectMeta::default()
        },
        spec: DataplaneConfigSpec::default(),
        status: None,
    });
    let wedged = tokio::spawn(reconcile(config, Arc::clone(&context)));
    let call = called
        .recv()
        .await
        .expect("the reconcile calls the API server");
    assert!(call.starts_with("PATCH "), "{call}");
    assert_eq!(health.liveness(), Ok(()), "a reconcile just started");
    tokio::time::advance(RECONCILE_STEP_BOUND - Duration::from_secs(1)).await;
    assert_eq!(health.liveness(), Ok(()), "within its bound");
    tokio::time::advance(Duration::from_secs(2)).await;
    let reason = health.liveness().expect_err("stuck past its bound");
    assert!(
        reason.starts_with("reconcile has been in one step for 601 s"),
        "{reason}"
    );
    // The next leader's process would start afresh; here the wedged reconcile is dropped.
    wedged.abort();
    assert!(wedged.await.is_err_and(|error| error.is_cancelled()));
    assert_eq!(health.liveness(), Ok(()));
}

#[tokio::test(start_paused = true)]
async fn a_status_write_left_wedged_in_the_background_turns_healthz_to_503_past_its_bound() {
    let health = Health::new();
    let (calls, mut called) = mpsc::unbounded_channel();
    let context = context(client_answering(calls, |_| None), &health);
    let config = DataplaneConfig {
        metadata: ObjectMeta {
            name: Some("default".into()),
            ..ObjectMeta::default()
        },
        spec: DataplaneConfigSpec::default(),
        status: None,
    };
    let status = switchyard_crds::DataplaneConfigStatus::default();
    let left_in_background = apply::status_within(&config, &status, &context)
        .await
        .expect("the reconcile stops waiting");
    assert!(left_in_background);
    let call = called.recv().await.expect("the write calls the API server");
    assert!(call.starts_with("PATCH "), "{call}");
    tokio::time::advance(Duration::from_secs(659)).await;
    assert_eq!(health.liveness(), Ok(()), "within its bound");
    tokio::time::advance(Duration::from_secs(2)).await;
    let reason = health.liveness().expect_err("stuck past its bound");
    assert!(
        reason.starts_with("background write 1 has been in one step"),
        "{reason}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_idle_controller_whose_watches_stay_quiet_stays_live_for_minutes() {
    let health = Health::new();
    let (calls, mut called) = mpsc::unbounded_channel();
    let context = context(client_answering(calls, quiet_empty_cluster), &health);
    let controller = tokio::spawn(run(Arc::clone(&context)));
    let mut watches = 0;
    let mut seen = Vec::new();
    // Every watch gets its empty list and then waits (the pods' two namespaces: two watches).
    while watches < 8 {
        let call = called
            .recv()
            .await
            .expect("the controller calls the API server");
        watches += usize::from(call.contains("watch=true"));
        seen.push(call);
    }
    for seconds in (7..=700_u64).step_by(7) {
        tokio::time::sleep(Duration::from_secs(7)).await;
        assert_eq!(health.liveness(), Ok(()), "after {seconds} s: {seen:#?}");
    }
    assert!(!controller.is_finished(), "the controller still runs");
    controller.abort();
}
