//! I/O of the health endpoints: the probe of kube-proxy's healthz and the agent's
//! replacement servers. The answers themselves are computed in `health`.

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex, RwLock},
    time::{Duration, SystemTime},
};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
    task::JoinHandle,
};

use super::{
    detection::KubeProxyHealth,
    health::{
        classify_probe_answer, healthz_answer, request_path, service_health_answer, HealthzTarget,
        LocalServiceHealth, NodeHealth, MAX_REQUEST_BYTES,
    },
    metrics::HealthAnswerCounts,
};
use crate::Error;

/// How long a client may take to send its request before the server hangs up.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The agent's probes of kube-proxy's healthz in flight, by the local address of their
/// connection, shared with the agent's own replacement servers ([`HealthServers::own_probes`]).
/// A server that receives a request on one of these connections marks it, so the probe knows
/// by the connection itself, whatever the answer says, that this very process answered: its
/// own server holds the port, and an answer from it is never taken for kube-proxy's.
#[derive(Clone, Debug, Default)]
pub struct OwnProbes {
    /// Source address of each probe in flight, and whether one of this process's servers
    /// received it.
    in_flight: Arc<Mutex<BTreeMap<SocketAddr, bool>>>,
}

impl OwnProbes {
    fn begin(&self, source: SocketAddr) {
        if let Ok(mut in_flight) = self.in_flight.lock() {
            in_flight.insert(canonical(source), false);
        }
    }

    /// Called by a server for each request it reads: whether `peer` is one of this process's
    /// probes (which is then marked as answered by this process).
    pub(crate) fn received_by_own_server(&self, peer: SocketAddr) -> bool {
        self.in_flight
            .lock()
            .ok()
            .and_then(|mut in_flight| {
                in_flight
                    .get_mut(&canonical(peer))
                    .map(|received| *received = true)
            })
            .is_some()
    }

    /// Ends a probe: whether one of this process's servers received it.
    fn finish(&self, source: SocketAddr) -> bool {
        self.in_flight
            .lock()
            .ok()
            .and_then(|mut in_flight| in_flight.remove(&canonical(source)))
            .unwrap_or(false)
    }
}

/// The same address as the two ends of a connection see it (a server bound to `::` sees an
/// IPv4 client as `::ffff:a.b.c.d`).
fn canonical(address: SocketAddr) -> SocketAddr {
    SocketAddr::new(address.ip().to_canonical(), address.port())
}

/// Probes kube-proxy's healthz once, giving up after `timeout` (a node whose
/// kube-proxy is gone must not slow the agent's loop down). Only a refused
/// connection means nothing listens; a timeout or a broken answer is no proof that
/// kube-proxy has left (see [`KubeProxyHealth`]). Knows no server of its own: an
/// agent's server is recognised by its header only (see [`probe_kube_proxy_beside`]).
pub async fn probe_kube_proxy(target: &HealthzTarget, timeout: Duration) -> KubeProxyHealth {
    probe_kube_proxy_beside(target, timeout, &OwnProbes::default()).await
}

/// [`probe_kube_proxy`], knowing this process's own servers (`own`): a probe that one of them
/// received is [`KubeProxyHealth::AnsweredByThisAgent`], whatever it answered.
pub async fn probe_kube_proxy_beside(
    target: &HealthzTarget,
    timeout: Duration,
    own: &OwnProbes,
) -> KubeProxyHealth {
    let mut source = None;
    let outcome = probe_once(target, timeout, own, &mut source).await;
    match source {
        Some(source) if own.finish(source) => KubeProxyHealth::AnsweredByThisAgent,
        _ => outcome,
    }
}

async fn probe_once(
    target: &HealthzTarget,
    timeout: Duration,
    own: &OwnProbes,
    source: &mut Option<SocketAddr>,
) -> KubeProxyHealth {
    let attempt = async {
        let mut stream = TcpStream::connect(target.authority.as_str())
            .await
            .map_err(ProbeFailure::Connect)?;
        // Registered before the request goes out: a server checks only once it has read it.
        if let Ok(local) = stream.local_addr() {
            own.begin(local);
            *source = Some(local);
        }
        stream
            .write_all(target.request().as_bytes())
            .await
            .map_err(ProbeFailure::Exchange)?;
        let mut answer = Vec::new();
        let mut buffer = [0_u8; 1024];
        loop {
            let read = stream
                .read(&mut buffer)
                .await
                .map_err(ProbeFailure::Exchange)?;
            if read == 0 {
                break;
            }
            answer.extend_from_slice(&buffer[..read]);
            if answer.windows(4).any(|window| window == b"\r\n\r\n")
                || answer.len() >= MAX_REQUEST_BYTES
            {
                break;
            }
        }
        Ok::<_, ProbeFailure>(answer)
    };
    match tokio::time::timeout(timeout, attempt).await {
        Err(_) => KubeProxyHealth::NoAnswer {
            reason: format!("no answer within {} ms", timeout.as_millis()),
        },
        Ok(Err(ProbeFailure::Connect(error)))
            if error.kind() == std::io::ErrorKind::ConnectionRefused =>
        {
            KubeProxyHealth::Absent {
                reason: error.to_string(),
            }
        }
        Ok(Err(ProbeFailure::Connect(error) | ProbeFailure::Exchange(error))) => {
            KubeProxyHealth::NoAnswer {
                reason: error.to_string(),
            }
        }
        Ok(Ok(answer)) if answer.is_empty() => KubeProxyHealth::NoAnswer {
            reason: "the connection closed without an answer".into(),
        },
        Ok(Ok(answer)) => classify_probe_answer(&answer),
    }
}

/// Where a probe failed: connecting (refused means nothing listens) or exchanging
/// the request and answer (something listens).
enum ProbeFailure {
    Connect(std::io::Error),
    Exchange(std::io::Error),
}

/// Where the replacement servers listen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthServerSettings {
    /// kube-proxy binds `0.0.0.0` (its `--healthz-bind-address` default, and always for
    /// health check node ports); the agent does the same.
    pub bind_address: IpAddr,
    pub healthz_port: u16,
}

impl Default for HealthServerSettings {
    fn default() -> Self {
        Self {
            bind_address: IpAddr::from([0, 0, 0, 0]),
            healthz_port: super::health::KUBE_PROXY_HEALTHZ_PORT,
        }
    }
}

#[derive(Clone, Debug)]
struct Shared {
    node: NodeHealth,
    services: BTreeMap<u16, LocalServiceHealth>,
    own_probes: OwnProbes,
    /// Where `:10256`'s answers are counted (kube-proxy's healthz and livez counters), if
    /// kube-proxy's metrics are served.
    answers: Option<HealthAnswerCounts>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Role {
    Healthz,
    Service(u16),
}

/// The agent's replacement for kube-proxy's health servers: `:10256/healthz` and
/// one listener per `healthCheckNodePort`. [`HealthServers::reconcile`] opens and
/// closes listeners to match its inputs; answers always reflect the latest inputs.
pub struct HealthServers {
    settings: HealthServerSettings,
    shared: Arc<RwLock<Shared>>,
    listeners: BTreeMap<Role, JoinHandle<()>>,
}

impl HealthServers {
    pub fn new(settings: HealthServerSettings) -> Self {
        Self {
            settings,
            shared: Arc::new(RwLock::new(Shared {
                node: NodeHealth {
                    healthy: false,
                    last_updated: SystemTime::UNIX_EPOCH,
                },
                services: BTreeMap::new(),
                own_probes: OwnProbes::default(),
                answers: None,
            })),
            listeners: BTreeMap::new(),
        }
    }

    /// Counts every answer of the healthz server from now on in `counts` (kube-proxy's
    /// `kubeproxy_proxy_healthz_total` and `kubeproxy_proxy_livez_total`).
    pub fn count_answers_in(&mut self, counts: HealthAnswerCounts) {
        if let Ok(mut shared) = self.shared.write() {
            shared.answers = Some(counts);
        }
    }

    /// The registry the probe shares with these servers, so that an answer of theirs is
    /// known as this process's own ([`probe_kube_proxy_beside`]).
    pub fn own_probes(&self) -> OwnProbes {
        self.shared
            .read()
            .map(|shared| shared.own_probes.clone())
            .unwrap_or_default()
    }

    /// Serves exactly what the inputs say when `allowed` (kube-proxy has left the
    /// node, see `CleanupStateMachine::replacement_health_allowed`), nothing
    /// otherwise. A port that cannot be bound (kube-proxy or someone else holds it)
    /// is reported and tried again on the next call; the others are served.
    pub async fn reconcile(
        &mut self,
        allowed: bool,
        node: NodeHealth,
        services: &[LocalServiceHealth],
    ) -> Vec<Error> {
        let desired_services: BTreeMap<u16, LocalServiceHealth> = services
            .iter()
            .filter(|service| service.health_check_node_port != self.settings.healthz_port)
            .map(|service| (service.health_check_node_port, service.clone()))
            .collect();
        if let Ok(mut shared) = self.shared.write() {
            shared.node = node;
            shared.services = desired_services.clone();
        }
        let desired_roles: Vec<Role> = if allowed {
            std::iter::once(Role::Healthz)
                .chain(desired_services.keys().map(|port| Role::Service(*port)))
                .collect()
        } else {
            Vec::new()
        };
        let stale: Vec<Role> = self
            .listeners
            .keys()
            .filter(|role| !desired_roles.contains(role))
            .copied()
            .collect();
        for role in stale {
            if let Some(task) = self.listeners.remove(&role) {
                task.abort();
                // Wait for the task to be dropped, so its port is free on return.
                let _ = task.await;
            }
        }
        let mut errors = Vec::new();
        for role in desired_roles {
            if self.listeners.contains_key(&role) {
                continue;
            }
            let port = match role {
                Role::Healthz => self.settings.healthz_port,
                Role::Service(port) => port,
            };
            let address = SocketAddr::new(self.settings.bind_address, port);
            match TcpListener::bind(address).await {
                Ok(listener) => {
                    let shared = Arc::clone(&self.shared);
                    self.listeners
                        .insert(role, tokio::spawn(serve(listener, role, shared)));
                }
                Err(source) => errors.push(Error::ServeHealth { address, source }),
            }
        }
        errors
    }

    /// Ports served now.
    pub fn serving_ports(&self) -> Vec<u16> {
        self.listeners
            .keys()
            .map(|role| match role {
                Role::Healthz => self.settings.healthz_port,
                Role::Service(port) => *port,
            })
            .collect()
    }

    /// Stops every listener (kube-proxy came back, or the agent shuts down).
    pub async fn stop(&mut self) {
        for (_, task) in std::mem::take(&mut self.listeners) {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for HealthServers {
    fn drop(&mut self) {
        for task in self.listeners.values() {
            task.abort();
        }
    }
}

async fn serve(listener: TcpListener, role: Role, shared: Arc<RwLock<Shared>>) {
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            // Out of file descriptors or similar: back off instead of spinning.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let _ = answer(stream, peer, role, shared).await;
        });
    }
}

async fn answer(
    mut stream: TcpStream,
    peer: SocketAddr,
    role: Role,
    shared: Arc<RwLock<Shared>>,
) -> std::io::Result<()> {
    let mut request = Vec::new();
    let mut buffer = [0_u8; 1024];
    let read_head = async {
        loop {
            let read = stream.read(&mut buffer).await?;
            if read == 0 {
                break;
            }
            request.extend_from_slice(&buffer[..read]);
            if request.windows(4).any(|window| window == b"\r\n\r\n")
                || request.len() >= MAX_REQUEST_BYTES
            {
                break;
            }
        }
        Ok::<_, std::io::Error>(())
    };
    if tokio::time::timeout(REQUEST_TIMEOUT, read_head)
        .await
        .is_err()
    {
        return Ok(());
    }
    let path = request_path(&request).unwrap_or_else(|| "/".into());
    let response = {
        let Ok(shared) = shared.read() else {
            return Ok(());
        };
        // After the request was read: the probe registers before it sends it.
        shared.own_probes.received_by_own_server(peer);
        match role {
            Role::Healthz => {
                let answer = healthz_answer(&path, &shared.node, SystemTime::now());
                if let Some(counts) = &shared.answers {
                    counts.answered(&path, answer.status);
                }
                answer
            }
            Role::Service(port) => match shared.services.get(&port) {
                Some(service) => service_health_answer(service),
                // The Service went away between the reconcile and this request.
                None => return Ok(()),
            },
        }
    };
    stream.write_all(&response.to_bytes()).await?;
    stream.shutdown().await
}
