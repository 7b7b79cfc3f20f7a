//! The small HTTP endpoint every Switchyard process serves on one port:
//!
//! - `GET /metrics`: the process's Prometheus registry in the text exposition format;
//! - `GET /healthz`: 200 while the process is live, 503 once it declared itself broken or one
//!   of its long-running loops is stuck (see [`Heartbeat`]);
//! - `GET /readyz`: 200 once the process declared itself ready, 503 before (and after it
//!   declared itself not ready again).
//!
//! It is deliberately tiny (hyper's HTTP/1 server, no framework): it must never be what keeps a
//! process from starting, and it must answer while the process's real work is blocked (an
//! operator waiting for its leader Lease is live but not acting).
//!
//! [`events`] is the other thing both processes share: how they write Kubernetes Events.

pub mod events;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus::{Encoder, Registry, TextEncoder};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Errors of the telemetry endpoint.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The listening socket could not be opened.
    #[error("failed to listen on {address} for metrics and health checks")]
    Bind {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The bound socket's address could not be read back.
    #[error("failed to read the address the telemetry endpoint listens on")]
    ReadLocalAddress(#[source] std::io::Error),
}

/// Liveness and readiness of the process, shared between the code that knows them and the
/// endpoint that reports them. Cheap to clone; every clone sees the same state.
#[derive(Clone, Debug)]
pub struct Health {
    state: Arc<HealthState>,
}

#[derive(Debug)]
struct HealthState {
    live: AtomicBool,
    ready: AtomicBool,
    loops: Mutex<Vec<Arc<LoopState>>>,
}

/// One long-running loop's progress, as liveness reads it.
#[derive(Debug)]
struct LoopState {
    name: String,
    /// How long one step may take before the loop counts as stuck.
    bound: Duration,
    /// When the step in progress started; `None` while the loop waits for work.
    busy_since: Mutex<Option<Instant>>,
}

impl LoopState {
    /// Why the loop counts as stuck at `now`, or `None`.
    fn stuck(&self, now: Instant) -> Option<String> {
        let busy_since = (*self
            .busy_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner))?;
        let busy_for = now.saturating_duration_since(busy_since);
        (busy_for > self.bound).then(|| {
            format!(
                "{} has been in one step for {} s (at most {} s allowed)",
                self.name,
                busy_for.as_secs(),
                self.bound.as_secs()
            )
        })
    }
}

/// A long-running loop's report of progress to liveness. The loop marks the start of each step
/// ([`Self::step`]) and the step's end is marked when the returned guard drops. A loop waiting
/// for work (between steps) is healthy however long it waits; a loop in the middle of a step for
/// longer than its bound is stuck, and `/healthz` answers 503 naming it, so that the kubelet
/// restarts a process wedged on, say, a request that never returns.
///
/// Steps of one heartbeat do not overlap: a loop runs one step at a time. A loop that runs
/// several concurrently registers one heartbeat per concurrent worker.
#[derive(Clone, Debug)]
pub struct Heartbeat {
    state: Arc<LoopState>,
}

impl Heartbeat {
    /// Marks a step as started now; it ends when the guard drops (also on an early return, an
    /// error or a cancelled future).
    #[must_use = "the step ends when the guard drops"]
    pub fn step(&self) -> Step {
        *self
            .state
            .busy_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        Step {
            state: Arc::clone(&self.state),
        }
    }

    /// The loop's name, as `/healthz` says it.
    pub fn name(&self) -> &str {
        &self.state.name
    }
}

/// A step in progress of a [`Heartbeat`]'s loop; dropping it marks the step done.
#[derive(Debug)]
pub struct Step {
    state: Arc<LoopState>,
}

impl Drop for Step {
    fn drop(&mut self) {
        *self
            .state
            .busy_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }
}

impl Health {
    /// A process that is live and not ready yet.
    pub fn new() -> Self {
        Self {
            state: Arc::new(HealthState {
                live: AtomicBool::new(true),
                ready: AtomicBool::new(false),
                loops: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Declares the process ready (or not) to do its work.
    pub fn set_ready(&self, ready: bool) {
        self.state.ready.store(ready, Ordering::SeqCst);
    }

    /// Declares the process live, or broken beyond repair (the kubelet then restarts it).
    pub fn set_live(&self, live: bool) {
        self.state.live.store(live, Ordering::SeqCst);
    }

    /// Whether the process declared itself ready.
    pub fn is_ready(&self) -> bool {
        self.state.ready.load(Ordering::SeqCst)
    }

    /// Whether the process is live: it did not declare itself broken and none of its loops is
    /// stuck.
    pub fn is_live(&self) -> bool {
        self.liveness().is_ok()
    }

    /// `Ok` while the process is live, else why not (the process declared itself broken, or
    /// the loops that are stuck, named).
    pub fn liveness(&self) -> Result<(), String> {
        if !self.state.live.load(Ordering::SeqCst) {
            return Err("the process declared itself broken".to_owned());
        }
        let now = Instant::now();
        let stuck: Vec<String> = self
            .state
            .loops
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(|state| state.stuck(now))
            .collect();
        if stuck.is_empty() {
            Ok(())
        } else {
            Err(stuck.join("; "))
        }
    }

    /// Registers a long-running loop named `name` whose steps each take at most `bound` when
    /// all is well (choose it well above the slowest healthy step: a step that outlives it makes
    /// the process not live).
    pub fn register_loop(&self, name: impl Into<String>, bound: Duration) -> Heartbeat {
        let state = Arc::new(LoopState {
            name: name.into(),
            bound,
            busy_since: Mutex::new(None),
        });
        self.state
            .loops
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::clone(&state));
        Heartbeat { state }
    }
}

impl Default for Health {
    fn default() -> Self {
        Self::new()
    }
}

/// The media type of Prometheus' text exposition format.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The answer to one request. Pure apart from reading the registry and the health flags, so
/// routing is tested without a socket.
pub fn respond(
    method: &Method,
    path: &str,
    registry: &Registry,
    health: &Health,
) -> Response<Full<Bytes>> {
    if method != Method::GET && method != Method::HEAD {
        let mut response = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET and HEAD are served\n",
        );
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    match path {
        "/metrics" => metrics(registry),
        "/healthz" | "/livez" => match health.liveness() {
            Ok(()) => text(StatusCode::OK, "ok\n"),
            Err(reason) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not live: {reason}\n"),
            ),
        },
        "/readyz" => probe(health.is_ready(), "ready"),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /healthz or /readyz\n",
        ),
    }
}

fn probe(holds: bool, what: &str) -> Response<Full<Bytes>> {
    if holds {
        text(StatusCode::OK, "ok\n")
    } else {
        text(StatusCode::SERVICE_UNAVAILABLE, format!("not {what}\n"))
    }
}

fn metrics(registry: &Registry) -> Response<Full<Bytes>> {
    let mut body = Vec::new();
    match TextEncoder::new().encode(&registry.gather(), &mut body) {
        Ok(()) => {
            let mut response = Response::new(Full::new(Bytes::from(body)));
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(METRICS_CONTENT_TYPE));
            response
        }
        Err(error) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("failed to encode the metrics: {error}\n"),
        ),
    }
}

fn text(status: StatusCode, body: impl Into<String>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.into())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// A running endpoint. Dropping it stops accepting connections.
#[derive(Debug)]
pub struct TelemetryServer {
    local_address: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl TelemetryServer {
    /// Listens on `address` (port 0 picks a free port: see [`Self::local_address`]) and serves
    /// `registry` and `health` until [`Self::shutdown`] or drop.
    pub async fn bind(
        address: SocketAddr,
        registry: Registry,
        health: Health,
    ) -> Result<Self, Error> {
        let listener = TcpListener::bind(address)
            .await
            .map_err(|source| Error::Bind { address, source })?;
        let local_address = listener.local_addr().map_err(Error::ReadLocalAddress)?;
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(accept_loop(listener, registry, health, stopped));
        tracing::info!(%local_address, "serving /metrics, /healthz and /readyz");
        Ok(Self {
            local_address,
            stop,
            task,
        })
    }

    /// The address the endpoint listens on.
    pub fn local_address(&self) -> SocketAddr {
        self.local_address
    }

    /// Stops accepting connections and waits until the accepting task has ended.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        let _ = (&mut self.task).await;
    }
}

impl Drop for TelemetryServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

async fn accept_loop(
    listener: TcpListener,
    registry: Registry,
    health: Health,
    mut stopped: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopped.changed() => return,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(error) => {
                // Running out of file descriptors must not end the endpoint for good.
                tracing::warn!(%error, "failed to accept a telemetry connection");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let registry = registry.clone();
        let health = health.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                let response = respond(request.method(), request.uri().path(), &registry, &health);
                async move { Ok::<_, Infallible>(response) }
            });
            if let Err(error) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%error, "telemetry connection ended with an error");
            }
        });
    }
}

#[cfg(test)]
mod tests;
