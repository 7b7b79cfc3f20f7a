//! The bench's private world, built inside `unshare --net --mount --pid` (see
//! `main.rs`): the outer namespace holds etcd and the API server; a fresh node
//! namespace per configuration, with backend pods, a marker pod and a client pod
//! on veths (Calico-style: /32 addresses, routes to the host side). No route
//! leads anywhere but to these namespaces.

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// The Services' ClusterIPs are taken from here (the API server's service range).
pub const SERVICE_NETWORK: (Ipv4Addr, u32) = (Ipv4Addr::new(10, 96, 0, 0), 16);
/// Load-balancer ingress addresses of the bench's LoadBalancer Services
/// (`parity_cost`): the bench's own, routed nowhere but to the node.
pub const LOAD_BALANCER_NETWORK: (Ipv4Addr, u32) = (Ipv4Addr::new(10, 97, 0, 0), 16);
/// Pods' addresses.
pub const POD_NETWORK: (Ipv4Addr, u32) = (Ipv4Addr::new(10, 244, 0, 0), 16);
/// The outer namespace's end of the node's uplink (the API server's address).
pub const CONTROL_ADDRESS: Ipv4Addr = Ipv4Addr::new(192, 168, 100, 1);
/// The node's end of its uplink (the node IP).
pub const NODE_ADDRESS: Ipv4Addr = Ipv4Addr::new(192, 168, 100, 2);
pub const NODE_NAMESPACE: &str = "node";
pub const CLIENT_NAMESPACE: &str = "client";
pub const MARKER_POD: &str = "marker";
pub const BACKEND_TCP_PORT: u16 = 8080;
pub const BACKEND_UDP_PORT: u16 = 8053;
pub const SERVICE_TCP_PORT: u16 = 80;
pub const SERVICE_UDP_PORT: u16 = 53;
/// First ClusterIP offset in the service range (below it: `kubernetes` and spare room).
const FIRST_SERVICE_OFFSET: u32 = 1024;

/// The Service with index `index`: even indices are TCP 80 -> 8080, odd ones UDP
/// 53 -> 8053, one port each, so N Services are N service ports for kube-proxy.
pub fn service_address(index: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(SERVICE_NETWORK.0) + FIRST_SERVICE_OFFSET + index)
}

pub fn service_is_tcp(index: u32) -> bool {
    index.is_multiple_of(2)
}

pub fn backend_address(ordinal: u32) -> Ipv4Addr {
    Ipv4Addr::new(10, 244, 0, 11 + ordinal as u8)
}

pub fn backend_name(ordinal: u32) -> String {
    format!("pod{}", ordinal + 1)
}

pub const MARKER_ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 30);
pub const CLIENT_ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 100);

/// Runs a shell command; its output on success, an error naming it otherwise.
pub fn sh(command: &str) -> Result<String> {
    let output = Command::new("bash")
        .args(["-c", command])
        .output()
        .map_err(|error| Error::Command {
            command: command.to_string(),
            detail: error.to_string(),
        })?;
    if !output.status.success() {
        return Err(Error::Command {
            command: command.lines().next().unwrap_or_default().to_string(),
            detail: format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// A process the bench started; killed (and reaped) when dropped.
pub struct Process {
    pub child: Option<Child>,
    pub log: PathBuf,
    pub started: Instant,
}

impl Process {
    /// Starts `program args` inside network namespace `namespace` (`None`: the
    /// outer one), output appended to `log`.
    pub fn start(
        name: &str,
        namespace: Option<&str>,
        program: &Path,
        arguments: &[String],
        environment: &[(String, String)],
        log: &Path,
    ) -> Result<Self> {
        let output = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|error| Error::System(format!("failed to open {}: {error}", log.display())))?;
        let errors = output
            .try_clone()
            .map_err(|error| Error::System(format!("failed to open {}: {error}", log.display())))?;
        let mut command = match namespace {
            Some(namespace) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", namespace]).arg(program);
                command
            }
            None => Command::new(program),
        };
        command
            .args(arguments)
            .envs(environment.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(output)
            .stderr(errors);
        let started = Instant::now();
        let child = command.spawn().map_err(|error| {
            Error::System(format!(
                "failed to start {name} ({}): {error}",
                program.display()
            ))
        })?;
        Ok(Self {
            child: Some(child),
            log: log.to_path_buf(),
            started,
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `Some(status)` once the process has exited.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|child| child.try_wait().ok().flatten())
    }

    pub fn is_running(&mut self) -> bool {
        matches!(
            self.child.as_mut().map(|child| child.try_wait()),
            Some(Ok(None))
        )
    }

    /// SIGTERM, then SIGKILL after `grace`; waits for the exit.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Resident memory now and at its peak, in MiB (`VmRSS`, `VmHWM`).
    pub fn memory_mib(&self) -> Option<(f64, f64)> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        let field = |name: &str| {
            status
                .lines()
                .find(|line| line.starts_with(name))
                .and_then(|line| line.split_whitespace().nth(1))
                .and_then(|kib| kib.parse::<f64>().ok())
                .map(|kib| kib / 1024.0)
        };
        Some((field("VmRSS:")?, field("VmHWM:")?))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One node namespace with its pods; everything removed on drop.
pub struct Topology {
    servers: Vec<(String, Process)>,
    bench_binary: PathBuf,
    work: PathBuf,
    namespaces: Vec<String>,
}

impl Topology {
    /// Builds a fresh node with `backends` backend pods (each serving), a marker
    /// pod (serving as `marker`) and a client pod.
    pub fn build(work: &Path, backends: u32, bench_binary: &Path) -> Result<Self> {
        let mut topology = Self {
            servers: Vec::new(),
            bench_binary: PathBuf::new(),
            work: PathBuf::new(),
            namespaces: Vec::new(),
        };
        topology.add_node()?;
        let mut pods: Vec<(String, Ipv4Addr)> = (0..backends)
            .map(|ordinal| (backend_name(ordinal), backend_address(ordinal)))
            .collect();
        pods.push((MARKER_POD.to_string(), MARKER_ADDRESS));
        for (name, address) in &pods {
            topology.add_pod(name, *address)?;
        }
        topology.add_pod(CLIENT_NAMESPACE, CLIENT_ADDRESS)?;
        // The client opens many short connections: reuse TIME_WAIT ports, use them all.
        sh(&format!(
            "ip netns exec {CLIENT_NAMESPACE} sh -c 'echo 1 > /proc/sys/net/ipv4/tcp_tw_reuse; \
             echo \"1024 65535\" > /proc/sys/net/ipv4/ip_local_port_range'"
        ))?;
        for (name, _) in &pods {
            let log = work.join(format!("server-{name}.log"));
            let server = Process::start(
                &format!("server {name}"),
                Some(name),
                bench_binary,
                &["serve".into(), "--name".into(), name.clone()],
                &[],
                &log,
            )?;
            topology.servers.push((name.clone(), server));
        }
        topology.bench_binary = bench_binary.to_path_buf();
        topology.work = work.to_path_buf();
        // Serving: every backend answers TCP directly.
        let prober = Prober::new(CLIENT_NAMESPACE)?;
        for (name, address) in &pods {
            let target = SocketAddrV4::new(*address, BACKEND_TCP_PORT);
            let answered =
                prober.wait_for_answer(target, Some(name), Instant::now(), Duration::from_secs(10));
            if answered.is_none() {
                return Err(Error::Topology(format!(
                    "failed to see backend {name} answer on {target} within 10 s"
                )));
            }
        }
        Ok(topology)
    }

    /// Restarts any backend server that exited, saying how it ended; returns
    /// how many had to be restarted (a measurement that lost a backend says so).
    pub fn revive_servers(&mut self) -> Result<usize> {
        let mut revived = 0;
        for (name, server) in &mut self.servers {
            if let Some(status) = server.exit_status() {
                eprintln!(
                    "bench: backend server {name} had exited ({status}); log: {}",
                    server.log_text().lines().last().unwrap_or_default()
                );
                *server = Process::start(
                    &format!("server {name}"),
                    Some(name),
                    &self.bench_binary,
                    &["serve".into(), "--name".into(), name.clone()],
                    &[],
                    &self.work.join(format!("server-{name}.log")),
                )?;
                revived += 1;
            }
        }
        if revived > 0 {
            std::thread::sleep(Duration::from_millis(300));
        }
        Ok(revived)
    }

    fn add_node(&mut self) -> Result<()> {
        self.namespaces.push(NODE_NAMESPACE.to_string());
        sh(&format!(
            "ip netns add {NODE_NAMESPACE}
             ip link add ctl0 type veth peer name up0 netns {NODE_NAMESPACE}
             ip addr add {CONTROL_ADDRESS}/30 dev ctl0
             ip link set ctl0 up
             ip -n {NODE_NAMESPACE} link set lo up
             ip -n {NODE_NAMESPACE} addr add {NODE_ADDRESS}/30 dev up0
             ip -n {NODE_NAMESPACE} link set up0 up
             ip netns exec {NODE_NAMESPACE} sh -c '
               echo 1 > /proc/sys/net/ipv4/ip_forward
               echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter
               echo 0 > /proc/sys/net/ipv4/conf/default/rp_filter
               echo 1 > /proc/sys/net/ipv4/conf/all/route_localnet'"
        ))?;
        // Netfilter's connection tracking (kube-proxy's rules, and Switchyard's
        // masquerade rule) keeps closed flows for minutes by default; the table is
        // bounded machine-wide (nf_conntrack_max), so the node's own namespace
        // forgets closed flows after 2 s. Per-namespace settings: the host's stay.
        sh(&format!(
            "ip netns exec {NODE_NAMESPACE} sh -c '
               modprobe nf_conntrack 2>/dev/null || true
               cd /proc/sys/net/netfilter 2>/dev/null || exit 0
               for f in nf_conntrack_tcp_timeout_time_wait nf_conntrack_tcp_timeout_close \
                        nf_conntrack_tcp_timeout_fin_wait nf_conntrack_tcp_timeout_last_ack \
                        nf_conntrack_tcp_timeout_close_wait nf_conntrack_udp_timeout \
                        nf_conntrack_udp_timeout_stream; do
                 [ -w $f ] && echo 2 > $f
               done; true'"
        ))?;
        Ok(())
    }

    fn add_pod(&mut self, name: &str, address: Ipv4Addr) -> Result<()> {
        self.namespaces.push(name.to_string());
        let host = format!("veth-{name}");
        sh(&format!(
            "ip netns add {name}
             ip -n {NODE_NAMESPACE} link add {host} address ee:ee:ee:ee:ee:ee type veth peer name eth0 netns {name}
             ip -n {NODE_NAMESPACE} link set {host} up
             ip netns exec {NODE_NAMESPACE} sh -c 'echo 0 > /proc/sys/net/ipv4/conf/{host}/rp_filter'
             ip -n {NODE_NAMESPACE} route add {address}/32 dev {host}
             ip -n {name} link set lo up
             ip -n {name} link set eth0 up
             ip -n {name} addr add {address}/32 dev eth0
             ip -n {name} route add 169.254.1.1 dev eth0 scope link
             ip -n {name} neigh add 169.254.1.1 lladdr ee:ee:ee:ee:ee:ee dev eth0 nud permanent
             ip -n {name} route add default via 169.254.1.1 dev eth0"
        ))?;
        Ok(())
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for (_, server) in &mut self.servers {
            server.kill();
        }
        // Any process still inside one of our namespaces (a system under test).
        for namespace in &self.namespaces {
            let _ = sh(&format!(
                "ip netns pids {namespace} 2>/dev/null | xargs -r kill -9"
            ));
        }
        for namespace in self.namespaces.iter().rev() {
            let _ = sh(&format!("ip netns del {namespace}"));
        }
        let _ = sh("ip link del ctl0 2>/dev/null || true");
    }
}

/// Enters network namespace `namespace` on the calling thread.
pub fn enter_namespace(namespace: &str) -> Result<()> {
    let file = std::fs::File::open(format!("/run/netns/{namespace}")).map_err(|error| {
        Error::Topology(format!("failed to open namespace {namespace}: {error}"))
    })?;
    // SAFETY: a valid namespace descriptor; setns affects only the calling thread.
    let result = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if result != 0 {
        return Err(Error::Topology(format!(
            "failed to enter namespace {namespace}: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

enum ProbeRequest {
    Wait {
        target: SocketAddrV4,
        expected: Option<String>,
        since: Instant,
        timeout: Duration,
        reply: mpsc::Sender<Option<Duration>>,
    },
}

/// A thread inside a namespace that opens short TCP connections on request.
pub struct Prober {
    requests: mpsc::Sender<ProbeRequest>,
}

impl Prober {
    pub fn new(namespace: &str) -> Result<Self> {
        let (requests, receiver) = mpsc::channel::<ProbeRequest>();
        let (entered_sender, entered) = mpsc::channel();
        let namespace = namespace.to_string();
        std::thread::spawn(move || {
            let result = enter_namespace(&namespace);
            let ok = result.is_ok();
            let _ = entered_sender.send(result);
            if !ok {
                return;
            }
            while let Ok(ProbeRequest::Wait {
                target,
                expected,
                since,
                timeout,
                reply,
            }) = receiver.recv()
            {
                let _ = reply.send(wait_for(target, expected.as_deref(), since, timeout));
            }
        });
        entered
            .recv()
            .map_err(|_| Error::Topology("failed to start the prober thread".into()))??;
        Ok(Self { requests })
    }

    /// Opens connections to `target` until one is answered (by `expected`, if
    /// given); returns the time since `since`, or `None` after `timeout`.
    pub fn wait_for_answer(
        &self,
        target: SocketAddrV4,
        expected: Option<&str>,
        since: Instant,
        timeout: Duration,
    ) -> Option<Duration> {
        let (reply, answer) = mpsc::channel();
        self.requests
            .send(ProbeRequest::Wait {
                target,
                expected: expected.map(str::to_string),
                since,
                timeout,
                reply,
            })
            .ok()?;
        answer.recv().ok().flatten()
    }
}

fn wait_for(
    target: SocketAddrV4,
    expected: Option<&str>,
    since: Instant,
    timeout: Duration,
) -> Option<Duration> {
    let deadline = since + timeout;
    loop {
        if let Ok(answer) = ask(target, Duration::from_millis(200)) {
            if expected.is_none_or(|expected| answer == expected) {
                return Some(since.elapsed());
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        // Every millisecond at first; after 100 ms every 5 ms, so that several
        // slow observations in flight at once do not load the machine.
        let pause = if since.elapsed() < Duration::from_millis(100) {
            1
        } else {
            5
        };
        std::thread::sleep(Duration::from_millis(pause));
    }
}

/// Like [`Prober::wait_for_answer`], on a thread of its own inside `namespace`,
/// so that several observations can be in flight at once.
pub fn observe_in_background(
    namespace: &str,
    target: SocketAddrV4,
    expected: &str,
    since: Instant,
    timeout: Duration,
) -> std::thread::JoinHandle<Option<Duration>> {
    let namespace = namespace.to_string();
    let expected = expected.to_string();
    std::thread::spawn(move || {
        enter_namespace(&namespace).ok()?;
        wait_for(target, Some(&expected), since, timeout)
    })
}

/// One connection, one line, the answer.
pub fn ask(target: SocketAddrV4, timeout: Duration) -> std::io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&target.into(), timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_nodelay(true)?;
    stream.write_all(b"probe\n")?;
    let mut line = String::new();
    BufReader::new(&mut stream).read_line(&mut line)?;
    Ok(line.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::in_network;

    #[test]
    fn thirty_thousand_service_addresses_fit_in_the_service_range_without_repeats() {
        let first = service_address(0);
        let last = service_address(29_999);
        assert!(in_network(first, SERVICE_NETWORK.0, SERVICE_NETWORK.1));
        assert!(in_network(last, SERVICE_NETWORK.0, SERVICE_NETWORK.1));
        assert_ne!(
            first,
            Ipv4Addr::new(10, 96, 0, 1),
            "the kubernetes Service's address"
        );
        assert_eq!(u32::from(last) - u32::from(first), 29_999);
        assert!(u32::from(last) < u32::from(Ipv4Addr::new(10, 96, 255, 255)));
    }

    #[test]
    fn half_the_services_are_tcp_and_half_udp() {
        let tcp = (0..100).filter(|index| service_is_tcp(*index)).count();
        assert_eq!(tcp, 50);
    }
}
