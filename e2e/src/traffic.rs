//! Test traffic: echo servers standing in for backends, and a generator that
//! opens connections continuously and records every failure with its time
//! and cause.
//!
//! Protocol: the client sends a line, the server answers `<server name>
//! <line>`. A short connection sends one line and closes; a long-lived
//! connection sends a line every interval for as long as the generator runs,
//! so a connection that a dataplane switch breaks is counted too.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::error::{E2eError, Result};
use crate::netns::NamespaceThread;

// ---------------------------------------------------------------------------
// Echo server
// ---------------------------------------------------------------------------

/// A TCP server that answers every line with its own name and the line.
/// Stops when dropped.
#[derive(Debug)]
pub struct EchoServer {
    pub name: String,
    pub address: SocketAddr,
    tasks: JoinSet<()>,
}

impl EchoServer {
    /// Listens on `address` inside the namespace of `thread`.
    pub async fn start(thread: &NamespaceThread, address: SocketAddr, name: &str) -> Result<Self> {
        Self::start_answering(thread, address, name, false).await
    }

    /// [`Self::start`], but every answer names the client's address as the server saw it
    /// (`<name>@<client address> <line>`), so a report's backends show whether a dataplane
    /// kept the client's address or masqueraded it.
    pub async fn start_naming_peer(
        thread: &NamespaceThread,
        address: SocketAddr,
        name: &str,
    ) -> Result<Self> {
        Self::start_answering(thread, address, name, true).await
    }

    async fn start_answering(
        thread: &NamespaceThread,
        address: SocketAddr,
        name: &str,
        naming_peer: bool,
    ) -> Result<Self> {
        let listener = thread
            .tcp_listener(address)
            .await
            .and_then(tokio::net::TcpListener::from_std)
            .map_err(|source| E2eError::StartEchoServer {
                namespace: thread.label().to_string(),
                port: address.port(),
                source,
            })?;
        let local_address = listener.local_addr().unwrap_or(address);
        let mut tasks = JoinSet::new();
        let server_name = name.to_string();
        tasks.spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        if let Ok((stream, peer)) = accepted {
                            let answering_as = if naming_peer {
                                format!("{server_name}@{}", peer.ip())
                            } else {
                                server_name.clone()
                            };
                            connections.spawn(serve_connection(stream, answering_as));
                        }
                    }
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        Ok(Self {
            name: name.to_string(),
            address: local_address,
            tasks,
        })
    }

    /// Stops listening and closes every open connection.
    pub async fn stop(mut self) {
        self.tasks.shutdown().await;
    }
}

async fn serve_connection(stream: TcpStream, name: String) {
    let (reader, mut writer) = stream.into_split();
    let mut lines = BufReader::new(reader).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if writer
            .write_all(format!("{name} {line}\n").as_bytes())
            .await
            .is_err()
        {
            return;
        }
    }
}

// ---------------------------------------------------------------------------
// UDP echo server
// ---------------------------------------------------------------------------

/// The largest datagram a UDP echo server or a datagram flow reads: any IPv4 datagram fits.
const MAXIMUM_DATAGRAM: usize = 65_535;

/// A UDP server that answers every datagram with its own name and the datagram
/// (`<name> <datagram>`), as [`EchoServer`] answers lines. A large datagram is answered
/// whole, so the answer is fragmented on its way back as the question was on its way in.
/// Stops when dropped.
#[derive(Debug)]
pub struct UdpEchoServer {
    pub name: String,
    pub address: SocketAddr,
    tasks: JoinSet<()>,
}

impl UdpEchoServer {
    /// Listens on `address` inside the namespace of `thread`.
    pub async fn start(thread: &NamespaceThread, address: SocketAddr, name: &str) -> Result<Self> {
        let socket = thread
            .run(move || {
                let socket = std::net::UdpSocket::bind(address)?;
                socket.set_nonblocking(true)?;
                Ok(socket)
            })
            .await
            .and_then(tokio::net::UdpSocket::from_std)
            .map_err(|source| E2eError::StartEchoServer {
                namespace: thread.label().to_string(),
                port: address.port(),
                source,
            })?;
        let local_address = socket.local_addr().unwrap_or(address);
        let prefix = format!("{name} ").into_bytes();
        let mut tasks = JoinSet::new();
        tasks.spawn(async move {
            let mut buffer = vec![0u8; MAXIMUM_DATAGRAM];
            loop {
                // An error here is about one datagram (or an ICMP error about an earlier
                // answer): the client that sent it counts its missing answer.
                let Ok((length, peer)) = socket.recv_from(&mut buffer).await else {
                    continue;
                };
                let mut answer = Vec::with_capacity(prefix.len() + length);
                answer.extend_from_slice(&prefix);
                answer.extend_from_slice(&buffer[..length]);
                let _ = socket.send_to(&answer, peer).await;
            }
        });
        Ok(Self {
            name: name.to_string(),
            address: local_address,
            tasks,
        })
    }

    /// Stops answering.
    pub async fn stop(mut self) {
        self.tasks.shutdown().await;
    }
}

// ---------------------------------------------------------------------------
// Failures and reports
// ---------------------------------------------------------------------------

/// Why one attempt failed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum FailureCause {
    ConnectionRefused,
    ConnectTimeout,
    HostUnreachable,
    ConnectionReset,
    /// The peer closed the connection before answering.
    ClosedByPeer,
    ReplyTimeout,
    /// An answer that does not echo what was sent.
    WrongReply(String),
    /// A worker of the generator panicked (or was cancelled): its flow stopped being
    /// exercised, so the report cannot claim that nothing failed.
    WorkerDied(String),
    Other(String),
}

impl fmt::Display for FailureCause {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailureCause::ConnectionRefused => write!(formatter, "connection refused"),
            FailureCause::ConnectTimeout => write!(formatter, "connect timed out"),
            FailureCause::HostUnreachable => write!(formatter, "host or network unreachable"),
            FailureCause::ConnectionReset => write!(formatter, "connection reset"),
            FailureCause::ClosedByPeer => write!(formatter, "closed by the peer before answering"),
            FailureCause::ReplyTimeout => write!(formatter, "no answer in time"),
            FailureCause::WrongReply(reply) => write!(formatter, "wrong answer {reply:?}"),
            FailureCause::WorkerDied(why) => write!(formatter, "the traffic worker died: {why}"),
            FailureCause::Other(message) => write!(formatter, "{message}"),
        }
    }
}

/// The cause of an I/O error (pure, so every mapping is tested).
pub fn classify_io_error(error: &std::io::Error) -> FailureCause {
    use std::io::ErrorKind;
    match error.kind() {
        ErrorKind::ConnectionRefused => FailureCause::ConnectionRefused,
        ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe => {
            FailureCause::ConnectionReset
        }
        ErrorKind::TimedOut => FailureCause::ConnectTimeout,
        ErrorKind::UnexpectedEof => FailureCause::ClosedByPeer,
        ErrorKind::HostUnreachable | ErrorKind::NetworkUnreachable => FailureCause::HostUnreachable,
        _ => match error.raw_os_error() {
            Some(libc::EHOSTUNREACH) | Some(libc::ENETUNREACH) => FailureCause::HostUnreachable,
            _ => FailureCause::Other(error.to_string()),
        },
    }
}

/// One failed attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub flow: String,
    /// Time since the generator started.
    pub after: Duration,
    pub at: SystemTime,
    pub cause: FailureCause,
}

/// What happened to one flow.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlowReport {
    pub attempts: u64,
    pub successes: u64,
    pub failures: Vec<Failure>,
    /// Answers per backend (server name).
    pub backends: BTreeMap<String, u64>,
    /// Long-lived connections opened (the first and every reconnect).
    pub connections_opened: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrafficReport {
    pub flows: BTreeMap<String, FlowReport>,
    pub duration: Duration,
}

impl TrafficReport {
    pub fn failures(&self) -> impl Iterator<Item = &Failure> {
        self.flows.values().flat_map(|flow| flow.failures.iter())
    }

    pub fn failure_count(&self) -> usize {
        self.failures().count()
    }

    pub fn attempts(&self) -> u64 {
        self.flows.values().map(|flow| flow.attempts).sum()
    }

    /// Failures per cause over all flows.
    pub fn failures_by_cause(&self) -> BTreeMap<FailureCause, usize> {
        let mut counts = BTreeMap::new();
        for failure in self.failures() {
            *counts.entry(failure.cause.clone()).or_insert(0) += 1;
        }
        counts
    }
}

impl fmt::Display for TrafficReport {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(formatter, "traffic over {:.1?}:", self.duration)?;
        for (name, flow) in &self.flows {
            writeln!(
                formatter,
                "  {name}: {} attempts, {} answered, {} failed, backends {:?}",
                flow.attempts,
                flow.successes,
                flow.failures.len(),
                flow.backends
            )?;
            for failure in flow.failures.iter().take(20) {
                writeln!(
                    formatter,
                    "    at {:>8.3?} ({} UTC): {}",
                    failure.after,
                    time_of_day(failure.at),
                    failure.cause
                )?;
            }
            if flow.failures.len() > 20 {
                writeln!(formatter, "    ... and {} more", flow.failures.len() - 20)?;
            }
        }
        Ok(())
    }
}

/// `HH:MM:SS.mmm` (UTC) of a wall-clock time, to find a failure in the components' logs.
fn time_of_day(at: SystemTime) -> String {
    let since_epoch = at.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let seconds = since_epoch.as_secs() % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60,
        since_epoch.subsec_millis()
    )
}

// ---------------------------------------------------------------------------
// Generator
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowMode {
    /// A new connection every `interval` (one line, then close), from each of
    /// `workers` loops.
    ShortConnections { interval: Duration, workers: usize },
    /// `connections` connections kept open, each sending a line every
    /// `message_interval`; a broken one is counted and reopened.
    LongLived {
        connections: usize,
        message_interval: Duration,
    },
    /// A new UDP socket every `interval`, from each of `workers` loops: connected to the
    /// destination, it sends one datagram of `size` bytes ([`datagram_message`]) and waits
    /// for a [`UdpEchoServer`]'s answer (a new flow each time, as a short connection is).
    /// Above the path's MTU (1,500 bytes here) the datagram and its answer travel as IP
    /// fragments, and only an answer carrying the whole datagram counts.
    Datagrams {
        interval: Duration,
        workers: usize,
        size: usize,
    },
}

/// Connections from one namespace to one destination.
#[derive(Debug, Clone)]
pub struct Flow {
    pub name: String,
    pub source: NamespaceThread,
    pub destination: SocketAddr,
    pub mode: FlowMode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    pub connect: Duration,
    pub reply: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(1),
            reply: Duration::from_secs(1),
        }
    }
}

type SharedReport = Arc<Mutex<TrafficReport>>;

/// However a test ends (a panic before `stop`, a hung step), its traffic stops by
/// itself after this long: test traffic is always bounded in time.
pub const MAXIMUM_TRAFFIC_LIFETIME: Duration = Duration::from_secs(20 * 60);

/// Runs flows until stopped.
pub struct TrafficGenerator {
    report: SharedReport,
    stop: watch::Sender<bool>,
    tasks: JoinSet<()>,
    /// The flow each worker task exercises, so a worker that dies is charged to its flow.
    workers: HashMap<tokio::task::Id, String>,
    started: tokio::time::Instant,
}

impl TrafficGenerator {
    pub fn start(flows: Vec<Flow>, timeouts: Timeouts) -> Self {
        let started = tokio::time::Instant::now();
        let report: SharedReport = Arc::new(Mutex::new(TrafficReport::default()));
        let (stop, stopped) = watch::channel(false);
        let mut tasks = JoinSet::new();
        let watchdog = stop.clone();
        tasks.spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(MAXIMUM_TRAFFIC_LIFETIME) => {
                    let _ = watchdog.send(true);
                }
                _ = watchdog.closed() => {}
            }
        });
        let mut generator = Self {
            report,
            stop,
            tasks,
            workers: HashMap::new(),
            started,
        };
        for flow in flows {
            if let Ok(mut shared) = generator.report.lock() {
                shared.flows.entry(flow.name.clone()).or_default();
            }
            let worker = Worker {
                flow: flow.clone(),
                timeouts,
                report: generator.report.clone(),
                stopped: stopped.clone(),
                started,
            };
            match flow.mode {
                FlowMode::ShortConnections { interval, workers } => {
                    for _ in 0..workers.max(1) {
                        generator.spawn_worker(
                            &flow.name,
                            short_connection_loop(worker.clone(), interval),
                        );
                    }
                }
                FlowMode::LongLived {
                    connections,
                    message_interval,
                } => {
                    for _ in 0..connections.max(1) {
                        generator.spawn_worker(
                            &flow.name,
                            long_lived_loop(worker.clone(), message_interval),
                        );
                    }
                }
                FlowMode::Datagrams {
                    interval,
                    workers,
                    size,
                } => {
                    for _ in 0..workers.max(1) {
                        generator.spawn_worker(
                            &flow.name,
                            datagram_loop(worker.clone(), interval, size),
                        );
                    }
                }
            }
        }
        generator
    }

    /// Runs one worker of `flow`, remembered so that its death is counted against the flow.
    fn spawn_worker(
        &mut self,
        flow: &str,
        worker: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let handle = self.tasks.spawn(worker);
        self.workers.insert(handle.id(), flow.to_string());
    }

    /// The report so far, while traffic goes on.
    pub fn snapshot(&self) -> TrafficReport {
        let mut report = self
            .report
            .lock()
            .map(|report| report.clone())
            .unwrap_or_default();
        report.duration = self.started.elapsed();
        report
    }

    /// Stops every flow (long-lived connections are closed cleanly) and
    /// returns the final report. A worker that panicked is a failure of its flow:
    /// otherwise a generator whose workers all died would report zero failures.
    pub async fn stop(mut self) -> TrafficReport {
        let _ = self.stop.send(true);
        while let Some(joined) = self.tasks.join_next().await {
            if let Err(error) = joined {
                let flow = self
                    .workers
                    .get(&error.id())
                    .cloned()
                    .unwrap_or_else(|| "the traffic watchdog".to_string());
                record(
                    &self.report,
                    &flow,
                    self.started,
                    Err(FailureCause::WorkerDied(describe_join_error(error))),
                );
            }
        }
        self.snapshot()
    }
}

/// Why a worker task ended without finishing: its panic message, or that it was cancelled.
fn describe_join_error(error: tokio::task::JoinError) -> String {
    if !error.is_panic() {
        return error.to_string();
    }
    let payload = error.into_panic();
    if let Some(message) = payload.downcast_ref::<&str>() {
        format!("panicked: {message}")
    } else if let Some(message) = payload.downcast_ref::<String>() {
        format!("panicked: {message}")
    } else {
        "panicked".to_string()
    }
}

fn record(
    report: &SharedReport,
    flow: &str,
    started: tokio::time::Instant,
    outcome: std::result::Result<String, FailureCause>,
) {
    let Ok(mut report) = report.lock() else {
        return;
    };
    let entry = report.flows.entry(flow.to_string()).or_default();
    entry.attempts += 1;
    match outcome {
        Ok(backend) => {
            entry.successes += 1;
            *entry.backends.entry(backend).or_insert(0) += 1;
        }
        Err(cause) => entry.failures.push(Failure {
            flow: flow.to_string(),
            after: started.elapsed(),
            at: SystemTime::now(),
            cause,
        }),
    }
}

async fn connect(
    source: &NamespaceThread,
    destination: SocketAddr,
    timeouts: Timeouts,
) -> std::result::Result<TcpStream, FailureCause> {
    let socket = source
        .tcp_socket()
        .await
        .map_err(|error| FailureCause::Other(format!("socket: {error}")))?;
    match tokio::time::timeout(timeouts.connect, socket.connect(destination)).await {
        Err(_) => Err(FailureCause::ConnectTimeout),
        Ok(Err(error)) => Err(classify_io_error(&error)),
        Ok(Ok(stream)) => Ok(stream),
    }
}

/// Sends one line and reads the answer: the backend's name.
async fn exchange(
    reader: &mut BufReader<tokio::net::tcp::OwnedReadHalf>,
    writer: &mut tokio::net::tcp::OwnedWriteHalf,
    message: &str,
    timeouts: Timeouts,
) -> std::result::Result<String, FailureCause> {
    writer
        .write_all(format!("{message}\n").as_bytes())
        .await
        .map_err(|error| classify_io_error(&error))?;
    let mut answer = String::new();
    match tokio::time::timeout(timeouts.reply, reader.read_line(&mut answer)).await {
        Err(_) => Err(FailureCause::ReplyTimeout),
        Ok(Err(error)) => Err(classify_io_error(&error)),
        Ok(Ok(0)) => Err(FailureCause::ClosedByPeer),
        Ok(Ok(_)) => parse_answer(answer.trim_end(), message),
    }
}

/// One short connection from `source` to `destination`: connect, send one line,
/// read the answer; the answering backend's name, or why it failed. For tests
/// that measure how soon a change is served.
pub async fn exchange_once(
    source: &NamespaceThread,
    destination: SocketAddr,
    timeouts: Timeouts,
) -> std::result::Result<String, FailureCause> {
    short_exchange(source, destination, "once", timeouts).await
}

/// A new connection that sends `message`, reads the answer and closes.
async fn short_exchange(
    source: &NamespaceThread,
    destination: SocketAddr,
    message: &str,
    timeouts: Timeouts,
) -> std::result::Result<String, FailureCause> {
    let stream = connect(source, destination, timeouts).await?;
    let (reader, mut writer) = stream.into_split();
    let mut reader = BufReader::new(reader);
    let outcome = exchange(&mut reader, &mut writer, message, timeouts).await;
    let _ = writer.shutdown().await;
    outcome
}

/// The backend's name from an answer to `message` (pure).
pub fn parse_answer(answer: &str, message: &str) -> std::result::Result<String, FailureCause> {
    match answer.split_once(' ') {
        Some((backend, echoed)) if echoed == message && !backend.is_empty() => {
            Ok(backend.to_string())
        }
        _ => Err(FailureCause::WrongReply(answer.to_string())),
    }
}

/// What each worker of a flow works with.
#[derive(Clone)]
struct Worker {
    flow: Flow,
    timeouts: Timeouts,
    /// The report its outcomes are recorded in.
    report: SharedReport,
    stopped: watch::Receiver<bool>,
    /// When the generator started (failure times are counted from it).
    started: tokio::time::Instant,
}

impl Worker {
    fn record(&self, outcome: std::result::Result<String, FailureCause>) {
        record(&self.report, &self.flow.name, self.started, outcome);
    }
}

async fn short_connection_loop(mut worker: Worker, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sequence = 0u64;
    loop {
        tokio::select! {
            _ = worker.stopped.changed() => return,
            _ = ticker.tick() => {}
        }
        if *worker.stopped.borrow() {
            return;
        }
        sequence += 1;
        let outcome = short_exchange(
            &worker.flow.source,
            worker.flow.destination,
            &format!("probe-{sequence}"),
            worker.timeouts,
        )
        .await;
        worker.record(outcome);
    }
}

async fn long_lived_loop(mut worker: Worker, message_interval: Duration) {
    let mut sequence = 0u64;
    'reconnect: loop {
        if *worker.stopped.borrow() {
            return;
        }
        let flow = &worker.flow;
        let stream = match connect(&flow.source, flow.destination, worker.timeouts).await {
            Ok(stream) => stream,
            Err(cause) => {
                worker.record(Err(cause));
                tokio::select! {
                    _ = worker.stopped.changed() => return,
                    _ = tokio::time::sleep(message_interval) => continue 'reconnect,
                }
            }
        };
        if let Ok(mut report) = worker.report.lock() {
            report
                .flows
                .entry(worker.flow.name.clone())
                .or_default()
                .connections_opened += 1;
        }
        let (reader, mut writer) = stream.into_split();
        let mut reader = BufReader::new(reader);
        let mut ticker = tokio::time::interval(message_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = worker.stopped.changed() => {
                    let _ = writer.shutdown().await;
                    return;
                }
                _ = ticker.tick() => {}
            }
            sequence += 1;
            let outcome = exchange(
                &mut reader,
                &mut writer,
                &format!("message-{sequence}"),
                worker.timeouts,
            )
            .await;
            let broken = outcome.is_err();
            worker.record(outcome);
            if broken {
                continue 'reconnect;
            }
        }
    }
}

async fn datagram_loop(mut worker: Worker, interval: Duration, size: usize) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sequence = 0u64;
    loop {
        tokio::select! {
            _ = worker.stopped.changed() => return,
            _ = ticker.tick() => {}
        }
        if *worker.stopped.borrow() {
            return;
        }
        sequence += 1;
        let outcome = datagram_exchange(
            &worker.flow.source,
            worker.flow.destination,
            &datagram_message(sequence, size),
            worker.timeouts,
        )
        .await;
        worker.record(outcome);
    }
}

/// The datagram a [`FlowMode::Datagrams`] flow sends: `datagram-<sequence>-` padded with dots
/// to `size` bytes (never shorter than that prefix), so a lost or reordered fragment cannot
/// pass for a whole answer.
pub fn datagram_message(sequence: u64, size: usize) -> String {
    let mut message = format!("datagram-{sequence}-");
    let padding = size.saturating_sub(message.len());
    message.extend(std::iter::repeat_n('.', padding));
    message
}

/// One datagram from a new socket in `source`, connected to `destination` (so an ICMP error
/// about it fails the exchange as refused or unreachable); the answering backend's name, or
/// why it failed.
pub async fn datagram_exchange(
    source: &NamespaceThread,
    destination: SocketAddr,
    message: &str,
    timeouts: Timeouts,
) -> std::result::Result<String, FailureCause> {
    let any: SocketAddr = if destination.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = source
        .run(move || {
            let socket = std::net::UdpSocket::bind(any)?;
            socket.set_nonblocking(true)?;
            Ok(socket)
        })
        .await
        .and_then(tokio::net::UdpSocket::from_std)
        .map_err(|error| FailureCause::Other(format!("socket: {error}")))?;
    socket
        .connect(destination)
        .await
        .map_err(|error| classify_io_error(&error))?;
    socket
        .send(message.as_bytes())
        .await
        .map_err(|error| classify_io_error(&error))?;
    let mut buffer = vec![0u8; MAXIMUM_DATAGRAM];
    match tokio::time::timeout(timeouts.reply, socket.recv(&mut buffer)).await {
        Err(_) => Err(FailureCause::ReplyTimeout),
        Ok(Err(error)) => Err(classify_io_error(&error)),
        Ok(Ok(length)) => {
            let answer = String::from_utf8_lossy(&buffer[..length]);
            parse_answer(&answer, message).map_err(|_| {
                // The whole answer would bury the report: its length and start say enough.
                let start: String = answer.chars().take(40).collect();
                FailureCause::WrongReply(format!("{length} bytes starting {start:?}"))
            })
        }
    }
}

#[cfg(test)]
mod tests;
