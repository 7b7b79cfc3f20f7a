//! Shared harness of the privileged datapath tests (`datapath_*.rs`).
//!
//! Isolation: every test re-executes its own test binary, for itself only, under
//! `unshare --net --mount --pid --fork --kill-child --mount-proc`. The child is the
//! "node": a fresh network namespace with only loopback, a private mount namespace
//! (a private bpffs for the pins, `/run/netns` for the pod namespaces), and a PID
//! namespace, so when the child exits, however it exits, every process it started
//! dies and every namespace, mount, pin and link goes with it. The parent removes
//! the two directories the child used on the host file system (the bpffs mount
//! point and a child cgroup for the socket hooks).
//!
//! Network safety: the child's namespaces have no route out; traffic only goes to
//! addresses of namespaces the test made itself.
#![allow(dead_code)]

mod signals;
// Not every test binary uses them (as with the rest of this module).
#[allow(unused_imports)]
pub use signals::*;

use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket},
    os::fd::{AsRawFd, FromRawFd as _},
    path::{Path, PathBuf},
    process::Command,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use switchyard_agent::{
    loader::{self, Datapath, InterfaceKind, LoaderSettings, MapSizes, PinnedServiceMaps},
    maps::ServiceMaps,
};
use switchyard_common::{
    ipv4_mapped, BackendSlotKey, BackendValue, DatapathConfig, FrontendKey, FrontendValue,
    BACKEND_FLAG_LOCAL, DATAPATH_MODE_ACTIVE, PROTOCOL_TCP, PROTOCOL_UDP, SCOPE_EXTERNAL,
    SCOPE_INTERNAL,
};

const ISOLATED: &str = "SWITCHYARD_DATAPATH_TEST_ISOLATED";
const WORK_DIRECTORY: &str = "SWITCHYARD_DATAPATH_TEST_DIRECTORY";

/// Runs `body` as the node of a private topology (see the module comment).
/// `test_name` is the test function's name, used to re-run exactly that test.
pub fn run_isolated(test_name: &str, body: impl FnOnce(&Node)) {
    if std::env::var_os(ISOLATED).is_some() {
        let work = PathBuf::from(std::env::var_os(WORK_DIRECTORY).expect("work directory"));
        let node = Node::prepare(work);
        body(&node);
        return;
    }
    assert!(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() } == 0,
        "the datapath tests need root (they create network namespaces and load BPF programs)"
    );
    let work = std::env::temp_dir().join(format!("switchyard-{test_name}-{}", std::process::id()));
    std::fs::create_dir_all(&work).expect("create the work directory");
    let executable = std::env::current_exe().expect("test executable");
    let status = Command::new("unshare")
        .args([
            "--net",
            "--mount",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            "--propagation",
            "private",
            "--",
        ])
        .arg(&executable)
        .args([
            test_name,
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "--ignored",
        ])
        .env(ISOLATED, "1")
        .env(WORK_DIRECTORY, &work)
        .status()
        .expect("run unshare");
    // The child's mounts are gone with its mount namespace; remove what is left
    // on the host: the directories and the child cgroup.
    let cgroup = test_cgroup_path(&work);
    if let Some(cgroup) = cgroup {
        let _ = std::fs::remove_dir(cgroup);
    }
    let _ = std::fs::remove_dir_all(&work);
    assert!(status.success(), "the isolated test failed: {status}");
}

fn test_cgroup_path(work: &Path) -> Option<PathBuf> {
    let name = work.file_name()?.to_string_lossy().into_owned();
    Some(loader::default_cgroup_path()?.join(name))
}

/// Runs a shell command, panicking with its output if it fails.
pub fn sh(command: &str) -> String {
    let output = Command::new("bash")
        .args(["-c", command])
        .output()
        .expect("run bash");
    assert!(
        output.status.success(),
        "`{command}` failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 1);
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 2);
pub const HAIRPIN_IP: Ipv4Addr = Ipv4Addr::new(169, 254, 42, 1);
pub const MASQUERADE_MARK: u32 = 0x4000;
pub const TCP_PORT: u16 = 8080;
pub const UDP_PORT: u16 = 8053;

/// The node: this process's private namespaces, and where to put pins.
pub struct Node {
    pub work: PathBuf,
    pub pin_directory: PathBuf,
    pub cgroup: Option<PathBuf>,
}

impl Node {
    /// Starts the agent binary in standalone mode on this node's test topology (pods
    /// on `veth-*`, the outside on `ext0` unless the arguments name
    /// `--host-interfaces`, node IP 192.168.50.1, manifests from
    /// `<work>/manifests`, pins in this node's bpffs); its output goes to
    /// `<work>/<log_name>`.
    pub fn start_standalone_agent(&self, node_name: &str, log_name: &str) -> std::process::Child {
        self.start_standalone_agent_with(node_name, log_name, &[])
    }

    /// [`Node::start_standalone_agent`] with more arguments.
    pub fn start_standalone_agent_with(
        &self,
        node_name: &str,
        log_name: &str,
        more_arguments: &[&str],
    ) -> std::process::Child {
        let log = std::fs::File::create(self.work.join(log_name)).expect("agent log");
        let error_log = log.try_clone().expect("agent log");
        // The socket hooks go to the test's own cgroup, never the machine's root.
        let socket_hooks: Vec<std::ffi::OsString> = match &self.cgroup {
            Some(cgroup) => vec!["--cgroup".into(), cgroup.into()],
            None => vec!["--no-socket-hooks".into()],
        };
        Command::new(env!("CARGO_BIN_EXE_switchyard-agent"))
            .args(["standalone", "--manifests"])
            .arg(self.work.join("manifests"))
            .args(["--pod-interfaces", "veth-*"])
            // `ext0`, unless the test names its own external interfaces.
            .args(if more_arguments.contains(&"--host-interfaces") {
                &[][..]
            } else {
                &["--host-interfaces", "ext0"][..]
            })
            .args([
                "--node-ip",
                "192.168.50.1",
                "--node-name",
                node_name,
                "--min-sync-period-ms",
                "100",
                "--bpf-pin-dir",
            ])
            .arg(&self.pin_directory)
            .args(socket_hooks)
            // These tests check what the TC programs do with pods' traffic (their
            // flows' state across restarts and upgrades); connect-time translation
            // would take pods' TCP away from them. A test that names the option
            // itself chooses.
            .args(
                if more_arguments.contains(&"--pod-connect-time-load-balancing") {
                    &[][..]
                } else {
                    &["--pod-connect-time-load-balancing", "disabled"][..]
                },
            )
            .args(more_arguments)
            .env("RUST_LOG", "info")
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(error_log)
            .spawn()
            .expect("start switchyard-agent")
    }
    fn prepare(work: PathBuf) -> Self {
        let bpffs = work.join("bpffs");
        std::fs::create_dir_all(&bpffs).expect("create the bpffs mount point");
        sh(&format!("mount -t bpf bpf {}", bpffs.display()));
        sh("mkdir -p /run/netns && mount -t tmpfs tmpfs /run/netns");
        sh("ip link set lo up");
        // The socket hooks go on a child cgroup holding only this process, so
        // they can never touch another process on the machine.
        let cgroup = test_cgroup_path(&work).and_then(|cgroup| {
            std::fs::create_dir_all(&cgroup).ok()?;
            std::fs::write(cgroup.join("cgroup.procs"), "0").ok()?;
            Some(cgroup)
        });
        Self {
            pin_directory: bpffs.join("switchyard"),
            work,
            cgroup,
        }
    }

    pub fn loader_settings(&self) -> LoaderSettings {
        LoaderSettings {
            pin_directory: self.pin_directory.clone(),
            map_sizes: MapSizes {
                frontends: 4096,
                backend_slots: 16384,
                conntrack: 65536,
                conntrack_overflow: 4096,
                affinity: 4096,
                socket_reverse: 4096,
            },
            cgroup_path: self.cgroup.clone(),
            ipv6_socket_hooks: false,
            attach_mode: loader::AttachMode::Auto,
            schema: &loader::schema::SCHEMA,
        }
    }
}

/// A pod: its own network namespace, behind a veth whose host side is `veth-<name>`.
#[derive(Clone, Debug)]
pub struct Pod {
    pub name: String,
    pub ip: Ipv4Addr,
}

impl Pod {
    pub fn host_interface(&self) -> String {
        format!("veth-{}", self.name)
    }
}

/// Creates a pod namespace wired Calico-style: a /32 address, a default route via
/// a link-local gateway whose neighbour entry is the host side's fixed MAC.
pub fn add_pod(name: &str, ip: Ipv4Addr) -> Pod {
    let host = format!("veth-{name}");
    sh(&format!(
        "ip netns add {name}
         ip link add {host} address ee:ee:ee:ee:ee:ee type veth peer name eth0 netns {name}
         ip link set {host} up
         echo 0 > /proc/sys/net/ipv4/conf/{host}/rp_filter
         ip route add {ip}/32 dev {host}
         ip -n {name} link set lo up
         ip -n {name} link set eth0 up
         ip -n {name} addr add {ip}/32 dev eth0
         ip -n {name} route add 169.254.1.1 dev eth0 scope link
         ip -n {name} neigh add 169.254.1.1 lladdr ee:ee:ee:ee:ee:ee dev eth0 nud permanent
         ip -n {name} route add default via 169.254.1.1 dev eth0"
    ));
    Pod {
        name: name.to_string(),
        ip,
    }
}

/// The node's forwarding settings and its external interface `ext0` with a client
/// namespace `client` behind it.
pub fn add_external_client() {
    sh(&format!(
        "echo 1 > /proc/sys/net/ipv4/ip_forward
         echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter
         echo 0 > /proc/sys/net/ipv4/conf/default/rp_filter
         ip netns add client
         ip link add ext0 type veth peer name eth0 netns client
         ip addr add {NODE_IP}/24 dev ext0
         ip link set ext0 up
         ip -n client link set lo up
         ip -n client addr add {CLIENT_IP}/24 dev eth0
         ip -n client link set eth0 up
         ip -n client route add default via {NODE_IP}"
    ));
}

/// A standard topology: `count` pods `pod1..` with 10.244.0.11.., and the client.
pub fn standard_topology(count: u8) -> Vec<Pod> {
    add_external_client();
    (1..=count)
        .map(|index| {
            add_pod(
                &format!("pod{index}"),
                Ipv4Addr::new(10, 244, 0, 10 + index),
            )
        })
        .collect()
}

/// Runs `body` on a thread inside network namespace `namespace` (`None`: the node).
pub fn in_namespace<T: Send + 'static>(
    namespace: Option<&str>,
    body: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let namespace = namespace.map(str::to_string);
    std::thread::spawn(move || {
        if let Some(namespace) = namespace {
            enter_namespace(&namespace);
        }
        body()
    })
}

pub fn enter_namespace(namespace: &str) {
    let file = std::fs::File::open(format!("/run/netns/{namespace}")).expect("open netns");
    // SAFETY: valid namespace descriptor; setns affects only the calling thread.
    let result = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(
        result,
        0,
        "setns into {namespace}: {}",
        std::io::Error::last_os_error()
    );
}

/// Backend servers in a pod: TCP on 8080 answers every line with
/// "<pod name> <client address as seen>\n"; UDP on 8053 answers every datagram the
/// same way. They run until the process ends.
pub fn start_servers(pod: &Pod) {
    start_tcp_server(pod, TCP_PORT);
    let name = pod.name.clone();
    let (ready_sender, ready) = std::sync::mpsc::channel();
    in_namespace(Some(&pod.name), move || {
        let udp = UdpSocket::bind(("0.0.0.0", UDP_PORT)).expect("bind udp");
        ready_sender.send(()).expect("signal ready");
        let mut buffer = [0u8; 1500];
        while let Ok((_, peer)) = udp.recv_from(&mut buffer) {
            let _ = udp.send_to(format!("{name} {peer}\n").as_bytes(), peer);
        }
    });
    ready.recv().expect("udp server ready");
}

/// A TCP server on `port` in `pod`'s namespace answering every line it gets with
/// the pod's name and the client address it sees.
pub fn start_tcp_server(pod: &Pod, port: u16) {
    let name = pod.name.clone();
    let (ready_sender, ready) = std::sync::mpsc::channel();
    in_namespace(Some(&pod.name), move || {
        let listener = TcpListener::bind(("0.0.0.0", port)).expect("bind tcp");
        ready_sender.send(()).expect("signal ready");
        for stream in listener.incoming().flatten() {
            let name = name.clone();
            std::thread::spawn(move || serve_connection(stream, &name));
        }
    });
    ready.recv().expect("tcp server ready");
}

fn serve_connection(stream: TcpStream, name: &str) {
    let Ok(peer) = stream.peer_addr() else { return };
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let reader = BufReader::new(stream);
    for line in reader.lines() {
        if line.is_err() {
            return;
        }
        if writer
            .write_all(format!("{name} {peer}\n").as_bytes())
            .is_err()
        {
            return;
        }
    }
}

/// One answer of a backend: who answered, and the client address it saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub backend: String,
    pub seen_client: SocketAddr,
}

pub fn parse_answer(line: &str) -> std::io::Result<Answer> {
    let invalid = || std::io::Error::new(std::io::ErrorKind::InvalidData, line.to_string());
    let (backend, seen) = line.trim().split_once(' ').ok_or_else(invalid)?;
    Ok(Answer {
        backend: backend.to_string(),
        seen_client: seen.parse().map_err(|_| invalid())?,
    })
}

/// Connects (from the calling thread's namespace), sends one line, reads the answer.
pub fn tcp_request(address: SocketAddrV4, timeout: Duration) -> std::io::Result<Answer> {
    let mut stream = TcpStream::connect_timeout(&address.into(), timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.write_all(b"hello\n")?;
    let mut line = String::new();
    BufReader::new(&mut stream).read_line(&mut line)?;
    parse_answer(&line)
}

pub fn udp_request(address: SocketAddrV4, timeout: Duration) -> std::io::Result<Answer> {
    let socket = UdpSocket::bind("0.0.0.0:0")?;
    socket.set_read_timeout(Some(timeout))?;
    socket.connect(address)?;
    socket.send(b"hello")?;
    let mut buffer = [0u8; 1500];
    let length = socket.recv(&mut buffer)?;
    // The reply must come from the address we asked (reverse translation works).
    let mut line = String::from_utf8_lossy(&buffer[..length]).into_owned();
    line.truncate(line.trim_end().len());
    parse_answer(&line)
}

/// Sets socket option `name` of `level` on `socket` to `value` (a plain C value
/// of the type the option takes).
pub fn set_socket_option<T>(
    socket: &impl AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> std::io::Result<()> {
    // SAFETY: `value` points to `size_of::<T>()` readable bytes for the call, and
    // the descriptor is borrowed from a live socket.
    let result = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if result == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A TCP connection from local port `port`, bound with SO_REUSEADDR first, so two
/// sockets can share one local port towards different destinations (as the
/// ephemeral ports of `connect` are shared).
pub fn connect_from_port(
    port: u16,
    target: SocketAddrV4,
    timeout: Duration,
) -> std::io::Result<TcpStream> {
    let last_error = || Err(std::io::Error::last_os_error());
    // SAFETY: plain system calls on a descriptor this function owns; on success
    // it is handed to `TcpStream`, which closes it.
    unsafe {
        let descriptor = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if descriptor < 0 {
            return last_error();
        }
        let stream = TcpStream::from_raw_fd(descriptor);
        let one: libc::c_int = 1;
        set_socket_option(&stream, libc::SOL_SOCKET, libc::SO_REUSEADDR, &one)?;
        // `connect` gives up after the send timeout.
        let send_timeout = libc::timeval {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_usec: timeout.subsec_micros() as libc::suseconds_t,
        };
        set_socket_option(&stream, libc::SOL_SOCKET, libc::SO_SNDTIMEO, &send_timeout)?;
        let address = |ip: Ipv4Addr, port: u16| libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(ip).to_be(),
            },
            sin_zero: [0; 8],
        };
        let local = address(Ipv4Addr::UNSPECIFIED, port);
        let length = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        if libc::bind(
            descriptor,
            (&local as *const libc::sockaddr_in).cast(),
            length,
        ) != 0
        {
            return last_error();
        }
        let remote = address(*target.ip(), target.port());
        if libc::connect(
            descriptor,
            (&remote as *const libc::sockaddr_in).cast(),
            length,
        ) != 0
        {
            return last_error();
        }
        stream.set_read_timeout(Some(timeout))?;
        Ok(stream)
    }
}

/// One request over a TCP connection from local port `port` (see
/// `connect_from_port`), in the calling thread's namespace.
pub fn tcp_request_from_port(
    port: u16,
    address: SocketAddrV4,
    timeout: Duration,
) -> std::io::Result<Answer> {
    let mut stream = connect_from_port(port, address, timeout)?;
    stream.write_all(b"hello\n")?;
    let mut line = String::new();
    BufReader::new(&mut stream).read_line(&mut line)?;
    parse_answer(&line)
}

/// Runs `count` TCP requests from `namespace` to `address`, returning each result.
pub fn tcp_requests_from(
    namespace: Option<&str>,
    address: SocketAddrV4,
    count: usize,
) -> Vec<std::io::Result<Answer>> {
    in_namespace(namespace, move || {
        let mut results = Vec::new();
        for _ in 0..count {
            let result = tcp_request(address, Duration::from_secs(2));
            let failed = result.is_err();
            results.push(result);
            // One failure is enough to fail a test; do not wait for the others.
            if failed {
                break;
            }
        }
        results
    })
    .join()
    .expect("client thread")
}

/// A long-lived TCP connection that sends a line every `interval` and counts
/// failures, on its own thread, until stopped.
pub struct LongLivedConnection {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<LongLivedReport>,
}

#[derive(Debug, Clone, Default)]
pub struct LongLivedReport {
    pub requests: usize,
    pub failure: Option<String>,
    pub backends: Vec<String>,
}

impl LongLivedConnection {
    pub fn open(namespace: Option<&str>, address: SocketAddrV4, interval: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = stop.clone();
        let (opened_sender, opened) = std::sync::mpsc::channel();
        let handle = in_namespace(namespace, move || {
            let mut report = LongLivedReport::default();
            let stream = match TcpStream::connect_timeout(&address.into(), Duration::from_secs(2)) {
                Ok(stream) => stream,
                Err(error) => {
                    report.failure = Some(format!("connect: {error}"));
                    let _ = opened_sender.send(());
                    return report;
                }
            };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
            let mut writer = stream.try_clone().expect("clone stream");
            let mut reader = BufReader::new(stream);
            let mut first = true;
            while !thread_stop.load(Ordering::Relaxed) {
                let mut line = String::new();
                let result = writer
                    .write_all(b"ping\n")
                    .and_then(|()| reader.read_line(&mut line))
                    .and_then(|length| {
                        if length == 0 {
                            Err(std::io::Error::new(
                                std::io::ErrorKind::UnexpectedEof,
                                "closed by peer",
                            ))
                        } else {
                            parse_answer(&line)
                        }
                    });
                match result {
                    Ok(answer) => {
                        report.requests += 1;
                        if !report.backends.contains(&answer.backend) {
                            report.backends.push(answer.backend);
                        }
                    }
                    Err(error) => {
                        report.failure = Some(format!("request {}: {error}", report.requests));
                        break;
                    }
                }
                if first {
                    first = false;
                    let _ = opened_sender.send(());
                }
                std::thread::sleep(interval);
            }
            if first {
                let _ = opened_sender.send(());
            }
            report
        });
        let _ = opened.recv();
        Self { stop, handle }
    }

    pub fn close(self) -> LongLivedReport {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("connection thread")
    }
}

/// Loads the datapath into the node and attaches it to every pod interface,
/// `ext0`, and the test cgroup; writes an active config.
pub fn start_datapath(node: &Node, pods: &[Pod]) -> (Datapath, PinnedServiceMaps) {
    let mut datapath = Datapath::load(node.loader_settings()).expect("load the datapath");
    for pod in pods {
        datapath
            .attach_interface(&pod.host_interface(), InterfaceKind::Pod)
            .expect("attach pod interface");
    }
    datapath
        .attach_interface("ext0", InterfaceKind::Host)
        .expect("attach ext0");
    datapath.attach_socket_hooks().expect("attach socket hooks");
    let mut maps = datapath.service_maps().expect("open maps");
    maps.write_config(&active_config()).expect("write config");
    (datapath, maps)
}

/// How many entries the socket hooks' reverse map (`SY_SOCK_REVERSE`) holds.
pub fn socket_reverse_entries(pin_directory: &Path) -> usize {
    use std::os::fd::AsFd as _;
    let path = loader::version_directory(pin_directory, switchyard_common::SCHEMA_VERSION)
        .join(switchyard_common::map_names::SOCKET_REVERSE);
    let map = loader::system::open_pinned(&path).expect("open the reverse map");
    loader::system::map_entries(
        map.as_fd(),
        std::mem::size_of::<switchyard_common::SocketReverseKey>(),
        std::mem::size_of::<switchyard_common::SocketReverseValue>(),
    )
    .expect("read the reverse map")
    .len()
}

pub fn active_config() -> DatapathConfig {
    DatapathConfig {
        hairpin_address: ipv4_mapped(HAIRPIN_IP.octets()),
        network_namespace_cookie: loader::system::network_namespace_cookie().expect("netns cookie"),
        mode: DATAPATH_MODE_ACTIVE,
        masquerade_mark: MASQUERADE_MARK,
        tcp_idle_timeout_seconds: 0,
        tcp_closing_timeout_seconds: 0,
        udp_idle_timeout_seconds: 0,
        // The TC programs carry pods' traffic, as most tests here check; the
        // connect-time tests switch it on themselves.
        pod_connect_balancing: switchyard_common::POD_CONNECT_BALANCING_DISABLED,
    }
}

/// One Service port written straight into the maps (what the syncer will do).
pub struct ServiceEntry {
    pub group_id: u32,
    pub frontends: Vec<(Ipv4Addr, u16, u8)>,
    pub protocol: u8,
    pub backends: Vec<(Ipv4Addr, u16, bool)>,
    pub flags: u32,
    pub affinity_timeout_seconds: u32,
}

impl ServiceEntry {
    pub fn cluster_ip(group_id: u32, ip: Ipv4Addr, port: u16, protocol: u8) -> Self {
        Self {
            group_id,
            frontends: vec![(ip, port, SCOPE_INTERNAL)],
            protocol,
            backends: Vec::new(),
            flags: 0,
            affinity_timeout_seconds: 0,
        }
    }

    pub fn with_node_port(mut self, port: u16) -> Self {
        self.frontends.push((NODE_IP, port, SCOPE_INTERNAL));
        self.frontends.push((NODE_IP, port, SCOPE_EXTERNAL));
        self
    }

    pub fn with_backends(mut self, pods: &[&Pod]) -> Self {
        let port = if self.protocol == PROTOCOL_UDP {
            UDP_PORT
        } else {
            TCP_PORT
        };
        self.backends = pods.iter().map(|pod| (pod.ip, port, true)).collect();
        self
    }
}

/// Writes a Service: backend slots first, then frontends (the syncer's order);
/// stale slots beyond the new count are deleted last.
pub fn write_service(maps: &mut PinnedServiceMaps, service: &ServiceEntry) {
    for (ordinal, (ip, port, local)) in service.backends.iter().enumerate() {
        maps.write_backend_slot(
            &BackendSlotKey {
                group_id: service.group_id,
                ordinal: ordinal as u32,
            },
            &BackendValue {
                address: ipv4_mapped(ip.octets()),
                port_big_endian: port.to_be(),
                flags: if *local { BACKEND_FLAG_LOCAL } else { 0 },
            },
        )
        .expect("write backend slot");
    }
    for (ip, port, scope) in &service.frontends {
        maps.write_frontend(
            &FrontendKey {
                address: ipv4_mapped(ip.octets()),
                port_big_endian: port.to_be(),
                protocol: service.protocol,
                scope: *scope,
            },
            &FrontendValue {
                group_id: service.group_id,
                backend_count: service.backends.len() as u32,
                flags: service.flags,
                affinity_timeout_seconds: service.affinity_timeout_seconds,
            },
        )
        .expect("write frontend");
    }
    for ordinal in service.backends.len() as u32..service.backends.len() as u32 + 16 {
        maps.delete_backend_slot(&BackendSlotKey {
            group_id: service.group_id,
            ordinal,
        })
        .expect("delete stale slot");
    }
}

pub fn tcp() -> u8 {
    PROTOCOL_TCP
}

/// Waits until `condition` holds or `timeout` passes.
/// The standalone agent's log on `node` so far (empty before it wrote one).
pub fn agent_log(node: &Node) -> String {
    std::fs::read_to_string(node.work.join("agent.log")).unwrap_or_default()
}

/// Gives the standalone agent on `node` its Service and EndpointSlice manifests: written
/// whole, then renamed, so the agent never reads half a file.
pub fn publish_manifests(node: &Node, text: &str) {
    let directory = node.work.join("manifests");
    std::fs::create_dir_all(&directory).expect("manifest directory");
    let staging = node.work.join("services.yaml.new");
    std::fs::write(&staging, text).expect("write manifests");
    std::fs::rename(&staging, directory.join("services.yaml")).expect("move manifests");
}

pub fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    condition()
}

/// Reads a whole stream to a string (for command output).
pub fn read_all(mut reader: impl std::io::Read) -> String {
    let mut text = String::new();
    let _ = reader.read_to_string(&mut text);
    text
}

/// What the node looks like, for failure messages: programs on each interface,
/// counters, conntrack entries.
pub fn diagnostics() -> String {
    let output = Command::new("bash")
        .args([
            "-c",
            "bpftool net show 2>&1; ip -br addr 2>&1; ip route 2>&1; \
             for m in $(ls -d \"$SWITCHYARD_DATAPATH_TEST_DIRECTORY\"/bpffs/switchyard/v*/SY_COUNTERS 2>/dev/null); do bpftool map dump pinned $m 2>&1 | head -60; done",
        ])
        .output();
    match output {
        Ok(output) => format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
        Err(error) => format!("no diagnostics: {error}"),
    }
}
