use super::*;
use http_body_util::BodyExt;
use prometheus::{IntCounter, Opts};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn registry_with_counter() -> Registry {
    let registry = Registry::new();
    let counter = IntCounter::with_opts(Opts::new(
        "switchyard_test_requests_total",
        "Requests in the test.",
    ))
    .unwrap();
    counter.inc_by(3);
    registry.register(Box::new(counter)).unwrap();
    registry
}

async fn body_of(response: Response<Full<Bytes>>) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// One plain HTTP/1.1 request over a fresh connection; returns the status code and body.
async fn get(address: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let status: u16 = raw
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap();
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test]
async fn metrics_are_served_in_the_prometheus_text_format() {
    let response = respond(
        &Method::GET,
        "/metrics",
        &registry_with_counter(),
        &Health::new(),
    );
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[CONTENT_TYPE], METRICS_CONTENT_TYPE);
    let body = body_of(response).await;
    assert!(
        body.contains("# TYPE switchyard_test_requests_total counter"),
        "{body}"
    );
    assert!(body.contains("switchyard_test_requests_total 3"), "{body}");
}

#[tokio::test]
async fn readiness_follows_what_the_process_declares() {
    let registry = Registry::new();
    let health = Health::new();
    assert_eq!(
        respond(&Method::GET, "/readyz", &registry, &health).status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    health.set_ready(true);
    assert_eq!(
        respond(&Method::GET, "/readyz", &registry, &health).status(),
        StatusCode::OK
    );
    health.set_ready(false);
    assert_eq!(
        respond(&Method::GET, "/readyz", &registry, &health).status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
}

#[tokio::test]
async fn a_process_is_live_until_it_declares_itself_broken() {
    let registry = Registry::new();
    let health = Health::new();
    assert_eq!(
        respond(&Method::GET, "/healthz", &registry, &health).status(),
        StatusCode::OK
    );
    health.set_live(false);
    assert_eq!(
        respond(&Method::GET, "/healthz", &registry, &health).status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
}

async fn healthz(health: &Health) -> (StatusCode, String) {
    let response = respond(&Method::GET, "/healthz", &Registry::new(), health);
    let status = response.status();
    (status, body_of(response).await)
}

#[tokio::test(start_paused = true)]
async fn a_loop_stuck_in_a_step_turns_healthz_to_503_once_its_bound_has_passed() {
    let health = Health::new();
    let reconcile = health.register_loop("reconcile", Duration::from_secs(60));
    let _idle = health.register_loop("status writer", Duration::from_secs(10));
    // A loop wedged in the middle of a step: a request that never returns.
    let stuck = tokio::spawn(async move {
        let _step = reconcile.step();
        std::future::pending::<()>().await;
    });
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_secs(59)).await;
    assert_eq!(healthz(&health).await.0, StatusCode::OK, "within its bound");
    tokio::time::advance(Duration::from_secs(2)).await;
    let (status, body) = healthz(&health).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        body.contains("reconcile has been in one step for 61 s") && !body.contains("status writer"),
        "{body}"
    );
    assert!(!health.is_live());
    // Once the stuck step is gone (the task cancelled), the loop waits again: live.
    stuck.abort();
    assert!(stuck.await.is_err_and(|error| error.is_cancelled()));
    assert_eq!(healthz(&health).await.0, StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn an_idle_process_whose_loops_wait_for_work_stays_live_for_minutes() {
    let health = Health::new();
    let watches = health.register_loop("watches", Duration::from_secs(30));
    let writer = health.register_loop("status writer", Duration::from_secs(30));
    // One loop waits for work that never comes; the other takes a short step every 20 s.
    let (_work, mut no_work) = tokio::sync::mpsc::channel::<()>(1);
    let waiting = tokio::spawn(async move {
        while no_work.recv().await.is_some() {
            let _step = watches.step();
        }
    });
    let ticking = tokio::spawn(async move {
        let mut interval = tokio::time::interval(Duration::from_secs(20));
        loop {
            interval.tick().await;
            let _step = writer.step();
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    });
    for _ in 0..60 {
        tokio::time::advance(Duration::from_secs(7)).await;
        tokio::task::yield_now().await;
        let (status, body) = healthz(&health).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    assert!(!waiting.is_finished() && !ticking.is_finished());
    waiting.abort();
    ticking.abort();
}

#[tokio::test(start_paused = true)]
async fn a_step_that_ended_leaves_the_loop_waiting_and_healthy() {
    let health = Health::new();
    let heartbeat = health.register_loop("reconcile", Duration::from_secs(5));
    drop(heartbeat.step());
    tokio::time::advance(Duration::from_secs(600)).await;
    assert_eq!(healthz(&health).await.0, StatusCode::OK);
    assert_eq!(heartbeat.name(), "reconcile");
}

#[tokio::test]
async fn unknown_paths_are_not_found_and_writes_are_refused() {
    let registry = Registry::new();
    let health = Health::new();
    assert_eq!(
        respond(&Method::GET, "/", &registry, &health).status(),
        StatusCode::NOT_FOUND
    );
    let refused = respond(&Method::POST, "/metrics", &registry, &health);
    assert_eq!(refused.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(refused.headers()[ALLOW], "GET, HEAD");
}

#[tokio::test]
async fn the_endpoint_serves_metrics_and_health_on_an_ephemeral_loopback_port() {
    let health = Health::new();
    let server = TelemetryServer::bind(
        "127.0.0.1:0".parse().unwrap(),
        registry_with_counter(),
        health.clone(),
    )
    .await
    .unwrap();
    let address = server.local_address();
    assert!(address.ip().is_loopback());
    assert_ne!(address.port(), 0);

    let (status, body) = get(address, "/metrics").await;
    assert_eq!(status, 200);
    assert!(body.contains("switchyard_test_requests_total 3"), "{body}");

    assert_eq!(get(address, "/healthz").await.0, 200);
    assert_eq!(
        get(address, "/readyz").await,
        (503, "not ready\n".to_owned())
    );
    health.set_ready(true);
    assert_eq!(get(address, "/readyz").await, (200, "ok\n".to_owned()));
    assert_eq!(get(address, "/nothing-here").await.0, 404);

    server.shutdown().await;
    assert!(
        tokio::net::TcpStream::connect(address).await.is_err(),
        "the endpoint still accepts connections after shutdown"
    );
}

#[tokio::test]
async fn binding_a_port_in_use_fails_with_the_address() {
    let first = TelemetryServer::bind(
        "127.0.0.1:0".parse().unwrap(),
        Registry::new(),
        Health::new(),
    )
    .await
    .unwrap();
    let error = TelemetryServer::bind(first.local_address(), Registry::new(), Health::new())
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Bind { address, .. } if address == first.local_address()));
    assert!(
        error
            .to_string()
            .starts_with("failed to listen on 127.0.0.1:"),
        "{error}"
    );
}
