//! The load generator (`switchyard-bench load`) and the backend server
//! (`switchyard-bench serve`). Both run inside namespaces the bench made
//! (`ip netns exec`); the generator refuses any target outside the bench's own
//! Service and pod ranges, and stops after a bounded time and operation count.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{TcpListener, TcpSocket, TcpStream, UdpSocket};

use crate::error::Error;
use crate::topology::{LOAD_BALANCER_NETWORK, POD_NETWORK, SERVICE_NETWORK};

/// The longest a single run may last, whatever it is asked.
pub const MAX_DURATION: Duration = Duration::from_secs(120);
/// The most operations a single run may do, whatever it is asked.
pub const MAX_OPERATIONS: u64 = 5_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
pub enum Workload {
    /// A new TCP connection per request: connect, one line, its answer, close.
    Connect,
    /// Requests on kept-alive TCP connections (one per worker).
    KeptAlive,
    /// UDP request/response, a new socket (source port) per request, as DNS clients do.
    Udp,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LoadOptions {
    pub workload: Workload,
    pub targets: Vec<SocketAddrV4>,
    pub concurrency: usize,
    pub duration: Duration,
    pub max_operations: u64,
    /// Open loop at this many operations per second (the restart test, and the
    /// data plane's fixed-rate latency runs); `None`: closed loop, each worker
    /// starts its next operation when one ends. Latency is timed from when an
    /// operation starts, not from when it was due.
    pub rate: Option<f64>,
    pub timeout: Duration,
    /// Record every operation's start time and outcome (the restart test needs the timeline).
    pub timeline: bool,
    /// Bytes of each UDP request (at most 65,507); 0: the 7 bytes of `request`.
    /// Larger than the path's MTU, a request leaves the client in IP fragments.
    #[serde(default)]
    pub udp_payload_bytes: usize,
}

/// One operation on the timeline: start (µs since the run began), latency (µs), ok.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Event {
    pub start_us: u64,
    pub latency_us: u32,
    pub ok: bool,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LoadReport {
    pub operations: u64,
    pub failures: u64,
    pub elapsed_seconds: f64,
    /// Sorted: connect latency for `Connect`, request round trip otherwise (µs).
    pub latencies_us: Vec<u32>,
    pub first_failure: Option<String>,
    /// Who answered the first operations (backend names), for probes.
    pub answers: Vec<String>,
    pub timeline: Vec<Event>,
    /// When the run began, in µs since the Unix epoch (to line the timeline up
    /// with events the bench caused, such as a restart).
    pub started_unix_us: u64,
}

impl LoadReport {
    pub fn rate(&self) -> f64 {
        if self.elapsed_seconds > 0.0 {
            self.operations as f64 / self.elapsed_seconds
        } else {
            0.0
        }
    }
}

/// Only addresses of the bench's own Services (cluster and load-balancer
/// addresses) and pods may be targets.
pub fn check_targets(targets: &[SocketAddrV4]) -> Result<(), Error> {
    if targets.is_empty() {
        return Err(Error::Load("failed to start: no targets".into()));
    }
    for target in targets {
        let inside = [SERVICE_NETWORK, POD_NETWORK, LOAD_BALANCER_NETWORK]
            .iter()
            .any(|(network, prefix)| in_network(*target.ip(), *network, *prefix));
        if !inside {
            return Err(Error::Load(format!(
                "failed to accept target {target}: outside the bench's Service, pod and load-balancer ranges"
            )));
        }
    }
    Ok(())
}

pub fn in_network(address: Ipv4Addr, network: Ipv4Addr, prefix: u32) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    };
    u32::from(address) & mask == u32::from(network) & mask
}

/// A small, fast generator for picking targets (xorshift64*); not for secrets.
#[derive(Clone, Debug)]
pub struct Picker(u64);

impl Picker {
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }
    pub fn below(&mut self, bound: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % bound.max(1)
    }
}

struct Shared {
    options: LoadOptions,
    started: Instant,
    deadline: Instant,
    stop: AtomicBool,
    issued: AtomicU64,
    results: Mutex<Results>,
}

#[derive(Default)]
struct Results {
    operations: u64,
    failures: u64,
    latencies_us: Vec<u32>,
    first_failure: Option<String>,
    answers: Vec<String>,
    timeline: Vec<Event>,
}

impl Shared {
    /// Claims the next operation, or `None` when the run is over.
    fn claim(&self) -> Option<u64> {
        if self.stop.load(Ordering::Relaxed) || Instant::now() >= self.deadline {
            return None;
        }
        let index = self.issued.fetch_add(1, Ordering::Relaxed);
        (index < self.options.max_operations).then_some(index)
    }

    fn finish(&self, start: Instant, outcome: Result<(u32, String), String>) {
        let start_us = start.duration_since(self.started).as_micros() as u64;
        let Ok(mut results) = self.results.lock() else {
            return;
        };
        match outcome {
            Ok((latency_us, answer)) => {
                results.operations += 1;
                results.latencies_us.push(latency_us);
                if results.answers.len() < 16 {
                    results.answers.push(answer);
                }
                if self.options.timeline {
                    results.timeline.push(Event {
                        start_us,
                        latency_us,
                        ok: true,
                    });
                }
            }
            Err(error) => {
                results.failures += 1;
                if results.first_failure.is_none() {
                    results.first_failure =
                        Some(format!("{error} (at {:.3} s)", start_us as f64 / 1e6));
                }
                if self.options.timeline {
                    let latency_us = start.elapsed().as_micros().min(u32::MAX as u128) as u32;
                    results.timeline.push(Event {
                        start_us,
                        latency_us,
                        ok: false,
                    });
                }
            }
        }
    }
}

/// Runs the load and reports; never longer than `MAX_DURATION` plus one timeout.
pub async fn run(options: LoadOptions) -> Result<LoadReport, Error> {
    check_targets(&options.targets)?;
    let mut options = options;
    options.duration = options.duration.min(MAX_DURATION);
    options.max_operations = options.max_operations.min(MAX_OPERATIONS);
    options.concurrency = options.concurrency.clamp(1, 4096);
    let started = Instant::now();
    let started_unix_us = unix_micros();
    let shared = Arc::new(Shared {
        deadline: started + options.duration,
        started,
        stop: AtomicBool::new(false),
        issued: AtomicU64::new(0),
        results: Mutex::new(Results::default()),
        options,
    });
    let mut tasks = Vec::new();
    match shared.options.rate {
        None => {
            for worker in 0..shared.options.concurrency {
                let shared = shared.clone();
                tasks.push(tokio::spawn(async move {
                    closed_loop(shared, worker as u64).await
                }));
            }
            for task in tasks {
                let _ = task.await;
            }
        }
        Some(rate) => open_loop(shared.clone(), rate).await,
    }
    let elapsed_seconds = started
        .elapsed()
        .as_secs_f64()
        .min(shared.options.duration.as_secs_f64().max(0.001));
    let mut results = shared
        .results
        .lock()
        .map_err(|_| Error::Load("failed to collect the results: a worker panicked".into()))?;
    let mut latencies_us = std::mem::take(&mut results.latencies_us);
    latencies_us.sort_unstable();
    let mut timeline = std::mem::take(&mut results.timeline);
    timeline.sort_by_key(|event| event.start_us);
    Ok(LoadReport {
        operations: results.operations,
        failures: results.failures,
        elapsed_seconds,
        latencies_us,
        first_failure: results.first_failure.take(),
        answers: std::mem::take(&mut results.answers),
        timeline,
        started_unix_us,
    })
}

pub fn unix_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_micros() as u64)
        .unwrap_or(0)
}

async fn closed_loop(shared: Arc<Shared>, worker: u64) {
    let mut picker = Picker::new(0x9e37_79b9_7f4a_7c15 ^ (worker + 1).wrapping_mul(0x1000_0001));
    let targets = shared.options.targets.clone();
    let payload = udp_payload(shared.options.udp_payload_bytes);
    match shared.options.workload {
        workload @ (Workload::Connect | Workload::Udp) => {
            while shared.claim().is_some() {
                let target = targets[picker.below(targets.len())];
                let start = Instant::now();
                let outcome =
                    request_once(workload, target, shared.options.timeout, &payload).await;
                shared.finish(start, outcome);
            }
        }
        Workload::KeptAlive => {
            let target = targets[picker.below(targets.len())];
            let timeout = shared.options.timeout;
            let stream = match tokio::time::timeout(timeout, TcpStream::connect(target)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => {
                    shared.finish(Instant::now(), Err(format!("connect {target}: {error}")));
                    return;
                }
                Err(_) => {
                    shared.finish(Instant::now(), Err(format!("connect {target}: timed out")));
                    return;
                }
            };
            let _ = stream.set_nodelay(true);
            let (reader, mut writer) = stream.into_split();
            let mut reader = BufReader::new(reader);
            let mut line = String::new();
            while shared.claim().is_some() {
                let start = Instant::now();
                line.clear();
                let exchange = async {
                    writer.write_all(b"request\n").await?;
                    reader.read_line(&mut line).await
                };
                let outcome = match tokio::time::timeout(timeout, exchange).await {
                    Ok(Ok(0)) => Err("closed by the server".to_string()),
                    Ok(Ok(_)) => Ok((elapsed_us(start), line.trim().to_string())),
                    Ok(Err(error)) => Err(format!("request: {error}")),
                    Err(_) => Err("request: timed out".to_string()),
                };
                let failed = outcome.is_err();
                shared.finish(start, outcome);
                if failed {
                    return;
                }
            }
        }
    }
}

/// Starts one operation every 1/rate seconds, whether or not earlier ones ended.
async fn open_loop(shared: Arc<Shared>, rate: f64) {
    let interval = Duration::from_secs_f64(1.0 / rate.clamp(1.0, 1_000_000.0));
    let limit = Arc::new(tokio::sync::Semaphore::new(shared.options.concurrency));
    let mut picker = Picker::new(0x5851_f42d_4c95_7f2d);
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = tokio::task::JoinSet::new();
    while shared.claim().is_some() {
        ticker.tick().await;
        let Ok(permit) = limit.clone().acquire_owned().await else {
            break;
        };
        let target = shared.options.targets[picker.below(shared.options.targets.len())];
        let shared = shared.clone();
        tasks.spawn(async move {
            let start = Instant::now();
            let payload = udp_payload(shared.options.udp_payload_bytes);
            let outcome = request_once(
                shared.options.workload,
                target,
                shared.options.timeout,
                &payload,
            )
            .await;
            shared.finish(start, outcome);
            drop(permit);
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}

/// One request on a fresh socket: a datagram and its answer for `Udp`, else a
/// new connection (see [`connect_once`]).
async fn request_once(
    workload: Workload,
    target: SocketAddrV4,
    timeout: Duration,
    payload: &[u8],
) -> Result<(u32, String), String> {
    match workload {
        Workload::Udp => udp_once(target, timeout, payload).await,
        _ => connect_once(target, timeout).await,
    }
}

/// A UDP request of `bytes` bytes (`request` padded with dots), the 7 bytes
/// of `request` for 0, never more than one datagram holds.
pub fn udp_payload(bytes: usize) -> Vec<u8> {
    let mut payload = b"request".to_vec();
    if bytes > 0 {
        payload.resize(bytes.min(65_507), b'.');
    }
    payload
}

fn elapsed_us(start: Instant) -> u32 {
    start.elapsed().as_micros().min(u32::MAX as u128) as u32
}

/// Connect (timed), one line, its answer, close. Returns the connect latency.
async fn connect_once(target: SocketAddrV4, timeout: Duration) -> Result<(u32, String), String> {
    let start = Instant::now();
    let socket = TcpSocket::new_v4().map_err(|error| format!("socket: {error}"))?;
    let stream = match tokio::time::timeout(timeout, socket.connect(target.into())).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => return Err(format!("connect {target}: {error}")),
        Err(_) => return Err(format!("connect {target}: timed out")),
    };
    let connect_us = elapsed_us(start);
    let _ = stream.set_nodelay(true);
    let mut stream = stream;
    let exchange = async {
        stream.write_all(b"request\n").await?;
        let mut buffer = [0u8; 128];
        let mut length = 0;
        while length < buffer.len() {
            let read = stream.read(&mut buffer[length..]).await?;
            if read == 0 {
                break;
            }
            length += read;
            if buffer[..length].contains(&b'\n') {
                break;
            }
        }
        Ok::<_, std::io::Error>(
            String::from_utf8_lossy(&buffer[..length])
                .trim()
                .to_string(),
        )
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(Ok(answer)) if !answer.is_empty() => Ok((connect_us, answer)),
        Ok(Ok(_)) => Err(format!("request {target}: closed without an answer")),
        Ok(Err(error)) => Err(format!("request {target}: {error}")),
        Err(_) => Err(format!("request {target}: timed out")),
    }
}

async fn udp_once(
    target: SocketAddrV4,
    timeout: Duration,
    payload: &[u8],
) -> Result<(u32, String), String> {
    let start = Instant::now();
    let socket = UdpSocket::bind("0.0.0.0:0")
        .await
        .map_err(|error| format!("bind: {error}"))?;
    socket
        .connect(target)
        .await
        .map_err(|error| format!("connect {target}: {error}"))?;
    let exchange = async {
        socket.send(payload).await?;
        let mut buffer = [0u8; 256];
        let length = socket.recv(&mut buffer).await?;
        Ok::<_, std::io::Error>(
            String::from_utf8_lossy(&buffer[..length])
                .trim()
                .to_string(),
        )
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(Ok(answer)) => Ok((elapsed_us(start), answer)),
        Ok(Err(error)) => Err(format!("udp {target}: {error}")),
        Err(_) => Err(format!("udp {target}: timed out")),
    }
}

/// The backend: TCP `tcp_port` answers each line with `<name>\n`, UDP `udp_port`
/// each datagram. Runs until killed.
pub async fn serve(name: String, tcp_port: u16, udp_port: u16) -> Result<(), Error> {
    let listener = TcpListener::bind(("0.0.0.0", tcp_port))
        .await
        .map_err(|error| Error::Serve(format!("failed to listen on TCP {tcp_port}: {error}")))?;
    let udp = UdpSocket::bind(("0.0.0.0", udp_port))
        .await
        .map_err(|error| Error::Serve(format!("failed to bind UDP {udp_port}: {error}")))?;
    let answer: Arc<[u8]> = format!("{name}\n").into_bytes().into();
    let udp_answer = answer.clone();
    tokio::spawn(async move {
        let mut buffer = [0u8; 1500];
        loop {
            match udp.recv_from(&mut buffer).await {
                Ok((_, peer)) => {
                    let _ = udp.send_to(&udp_answer, peer).await;
                }
                // An ICMP error for an earlier reply, or a transient failure: keep serving.
                Err(_) => continue,
            }
        }
    });
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            // Out of descriptors or similar: keep serving the others.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            }
        };
        let answer = answer.clone();
        tokio::spawn(async move {
            let _ = stream.set_nodelay(true);
            let mut stream = stream;
            let mut buffer = [0u8; 4096];
            loop {
                let read = match stream.read(&mut buffer).await {
                    Ok(0) | Err(_) => return,
                    Ok(read) => read,
                };
                let lines = buffer[..read].iter().filter(|byte| **byte == b'\n').count();
                for _ in 0..lines {
                    if stream.write_all(&answer).await.is_err() {
                        return;
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_outside_the_benchs_own_ranges_are_refused() {
        let service = SocketAddrV4::new(Ipv4Addr::new(10, 96, 3, 4), 80);
        let pod = SocketAddrV4::new(Ipv4Addr::new(10, 244, 0, 11), 8080);
        assert!(check_targets(&[service, pod]).is_ok());
        let outside = SocketAddrV4::new(Ipv4Addr::new(8, 8, 8, 8), 53);
        let error = check_targets(&[service, outside]).expect_err("refused");
        assert!(error.to_string().contains("8.8.8.8:53"), "{error}");
        assert!(check_targets(&[]).is_err());
    }

    #[test]
    fn a_udp_request_has_the_size_asked_for_within_one_datagram() {
        assert_eq!(udp_payload(0), b"request");
        assert_eq!(udp_payload(4_000).len(), 4_000);
        assert!(udp_payload(4_000).starts_with(b"request..."));
        assert_eq!(udp_payload(100_000).len(), 65_507);
    }

    #[test]
    fn load_balancer_addresses_of_the_bench_are_targets() {
        let load_balancer = SocketAddrV4::new(Ipv4Addr::new(10, 97, 0, 1), 80);
        assert!(check_targets(&[load_balancer]).is_ok());
        let outside = SocketAddrV4::new(Ipv4Addr::new(10, 98, 0, 1), 80);
        assert!(check_targets(&[outside]).is_err());
    }

    #[test]
    fn the_picker_spreads_over_every_target() {
        let mut picker = Picker::new(7);
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            seen[picker.below(10)] += 1;
        }
        assert!(seen.iter().all(|count| *count > 800), "{seen:?}");
    }

    #[tokio::test]
    async fn a_run_against_a_local_server_is_bounded_by_its_operation_count() {
        // The generator only talks to the bench's ranges, so the server is
        // checked on loopback through `connect_once`/`udp_once` directly.
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = match listener.local_addr().expect("address") {
            std::net::SocketAddr::V4(address) => address,
            std::net::SocketAddr::V6(_) => unreachable!("bound to IPv4"),
        };
        drop(listener);
        let udp_probe = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind udp");
        let udp_port = udp_probe.local_addr().expect("udp address").port();
        drop(udp_probe);
        tokio::spawn(serve("backend-a".into(), address.port(), udp_port));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let answer = connect_once(address, Duration::from_secs(2))
            .await
            .expect("tcp answer");
        assert_eq!(answer.1, "backend-a");
        let answer = udp_once(
            SocketAddrV4::new(Ipv4Addr::LOCALHOST, udp_port),
            Duration::from_secs(2),
            &udp_payload(4_000),
        )
        .await
        .expect("udp answer");
        assert_eq!(answer.1, "backend-a");
    }
}
