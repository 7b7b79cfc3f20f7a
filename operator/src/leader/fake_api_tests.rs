use super::*;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Value};

#[derive(Default)]
struct FakeLeases {
    lease: Mutex<Option<Value>>,
    resource_version: Mutex<u64>,
    hang: AtomicBool,
}

fn status(code: StatusCode, reason: &str) -> Response<Full<Bytes>> {
    let body = json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code.as_u16(), "message": reason });
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = code;
    response
}

fn ok(code: StatusCode, value: &Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(value.to_string())));
    *response.status_mut() = code;
    response
}

async fn serve(
    fake: Arc<FakeLeases>,
    request: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if fake.hang.load(Ordering::SeqCst) {
        std::future::pending::<()>().await;
    }
    let method = request.method().clone();
    let body: Value = match request.into_body().collect().await {
        Ok(collected) => serde_json::from_slice(&collected.to_bytes()).unwrap_or(Value::Null),
        Err(_) => Value::Null,
    };
    let mut lease = fake.lease.lock().unwrap();
    let mut version = fake.resource_version.lock().unwrap();
    let response = match method.as_str() {
        "GET" => match lease.as_ref() {
            Some(stored) => ok(StatusCode::OK, stored),
            None => status(StatusCode::NOT_FOUND, "NotFound"),
        },
        "POST" if lease.is_some() => status(StatusCode::CONFLICT, "AlreadyExists"),
        "PUT"
            if lease
                .as_ref()
                .map(|stored| &stored["metadata"]["resourceVersion"])
                != Some(&body["metadata"]["resourceVersion"]) =>
        {
            status(StatusCode::CONFLICT, "Conflict")
        }
        "POST" | "PUT" => {
            *version += 1;
            let mut stored = body;
            stored["metadata"]["resourceVersion"] = json!(version.to_string());
            *lease = Some(stored.clone());
            ok(
                if method == "POST" {
                    StatusCode::CREATED
                } else {
                    StatusCode::OK
                },
                &stored,
            )
        }
        _ => status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed"),
    };
    Ok(response)
}

async fn fake_api() -> (Client, Arc<FakeLeases>) {
    let fake = Arc::new(FakeLeases::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let served = fake.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let fake = served.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |request| serve(fake.clone(), request));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    let client = Client::try_from(kube::Config::new(
        format!("http://{address}").parse().unwrap(),
    ))
    .unwrap();
    (client, fake)
}

fn fast() -> LeaseTiming {
    LeaseTiming {
        lease_duration: Duration::from_millis(1000),
        renew_deadline: Duration::from_millis(300),
        retry_period: Duration::from_millis(50),
    }
}

fn elector(client: &Client, identity: &str) -> LeaderElector {
    LeaderElector::new(
        client.clone(),
        "switchyard-system",
        "switchyard-operator",
        identity,
        fast(),
    )
}

fn holder(fake: &FakeLeases) -> Option<String> {
    fake.lease
        .lock()
        .unwrap()
        .as_ref()
        .and_then(|lease| lease["spec"]["holderIdentity"].as_str().map(str::to_owned))
}

#[tokio::test]
async fn two_replicas_racing_for_the_lease_never_lead_at_once() {
    let (client, fake) = fake_api().await;
    let mut first = elector(&client, "replica-1");
    let mut second = elector(&client, "replica-2");
    for round in 0..10 {
        let (one, two) = tokio::join!(first.try_acquire_or_renew(), second.try_acquire_or_renew());
        let leaders = [one.unwrap(), two.unwrap()]
            .iter()
            .filter(|round| **round == Round::Leading)
            .count();
        assert!(leaders <= 1, "round {round}: two leaders");
        if round > 0 {
            assert_eq!(leaders, 1, "round {round}: the holder must keep renewing");
        }
    }
    let lease_holder = holder(&fake).unwrap();
    assert!(lease_holder == "replica-1" || lease_holder == "replica-2");
}

#[tokio::test]
async fn a_follower_takes_over_only_after_the_holder_stops_renewing_for_the_lease_duration() {
    let (client, fake) = fake_api().await;
    let mut first = elector(&client, "replica-1");
    let mut second = elector(&client, "replica-2");
    first.acquire().await.unwrap();
    assert_eq!(
        second.try_acquire_or_renew().await.unwrap(),
        Round::Following {
            holder: "replica-1".into()
        }
    );
    // replica-1 stops renewing (it died): replica-2 waits the whole lease duration.
    let stopped = Instant::now();
    second.acquire().await.unwrap();
    assert!(
        stopped.elapsed() >= fast().lease_duration,
        "took over after {:?}",
        stopped.elapsed()
    );
    assert_eq!(holder(&fake).as_deref(), Some("replica-2"));
    let transitions =
        fake.lease.lock().unwrap().as_ref().unwrap()["spec"]["leaseTransitions"].as_i64();
    assert_eq!(transitions, Some(1));
}

#[tokio::test]
async fn a_leader_whose_lease_was_taken_stops_at_its_next_renewal() {
    let (client, fake) = fake_api().await;
    let mut leader = elector(&client, "replica-1");
    leader.acquire().await.unwrap();
    {
        let mut lease = fake.lease.lock().unwrap();
        lease.as_mut().unwrap()["spec"]["holderIdentity"] = json!("replica-2");
    }
    let lost = tokio::time::timeout(Duration::from_secs(2), leader.keep_renewing())
        .await
        .unwrap();
    assert!(
        matches!(&lost, Error::LeadershipLost { reason } if reason.contains("replica-2")),
        "{lost}"
    );
}

#[tokio::test]
async fn a_leader_that_cannot_renew_stops_within_its_renew_deadline() {
    let (client, fake) = fake_api().await;
    let mut leader = elector(&client, "replica-1");
    leader.acquire().await.unwrap();
    // The API server stops answering (requests hang, they do not fail).
    fake.hang.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let lost = tokio::time::timeout(Duration::from_secs(5), leader.keep_renewing())
        .await
        .expect("a leader whose renewals hang must give up");
    assert!(matches!(lost, Error::LeadershipLost { .. }));
    let timing = fast();
    assert!(
        started.elapsed() < timing.renew_deadline + timing.retry_period * 2,
        "stopped acting only after {:?}",
        started.elapsed()
    );
    // Another replica may only take over after the lease duration: the leader has stopped
    // before then.
    assert!(timing.renew_deadline + timing.retry_period * 2 < timing.lease_duration);
}

#[tokio::test]
async fn a_released_lease_is_taken_over_without_waiting() {
    let (client, _fake) = fake_api().await;
    let mut first = elector(&client, "replica-1");
    let mut second = elector(&client, "replica-2");
    first.acquire().await.unwrap();
    assert!(matches!(
        second.try_acquire_or_renew().await.unwrap(),
        Round::Following { .. }
    ));
    first.release().await.unwrap();
    assert_eq!(second.try_acquire_or_renew().await.unwrap(), Round::Leading);
}
