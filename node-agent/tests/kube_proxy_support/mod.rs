//! Shared harness of the privileged kube-proxy coexistence tests
//! (`kube_proxy_*.rs`).
//!
//! Isolation: every test re-executes its own test binary, for itself only, under
//! `unshare --net --mount --pid --fork --kill-child --mount-proc`. The child is the
//! "node": a fresh network namespace with only loopback (so the netfilter rules it
//! loads, in both iptables backends and nftables, are its own and die with it),
//! a private mount namespace with its own `/run/netns` for the client and server
//! namespaces it creates, and a PID namespace so every process it starts dies
//! with it, however it exits. Nothing touches the machine's own rules.
//!
//! Network safety: the namespaces the tests make have no route out; traffic goes
//! only to loopback and to addresses of those namespaces.
#![allow(dead_code)]

use std::{
    fs::File,
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream},
    os::fd::AsRawFd as _,
    process::Command,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

use switchyard_agent::kube_proxy::{system::Tools, Backend, Family};

const ISOLATED: &str = "SWITCHYARD_KUBE_PROXY_TEST_ISOLATED";

pub const LEGACY_1_20_IPV4: &str =
    include_str!("../../src/kube_proxy/tests/fixtures/kube-proxy-1.20-legacy-ipv4.txt");
pub const NFT_1_33_IPV4: &str =
    include_str!("../../src/kube_proxy/tests/fixtures/kube-proxy-1.33-nft-ipv4.txt");
pub const NFT_1_33_IPV6: &str =
    include_str!("../../src/kube_proxy/tests/fixtures/kube-proxy-1.33-nft-ipv6.txt");
pub const ONLY_NAT: &str =
    include_str!("../../src/kube_proxy/tests/fixtures/kube-proxy-only-nat.txt");
pub const NFTABLES_MODE: &str =
    include_str!("../../src/kube_proxy/tests/fixtures/nftables-mode.nft");
/// What the real kube-proxy 1.20.2 wrote (see the fixture's capture script).
pub const CAPTURED_1_20_LEGACY: &str =
    include_str!("../../src/kube_proxy/tests/fixtures/kube-proxy-1.20.2-captured-legacy.txt");
pub const CAPTURED_1_20_NFT: &str =
    include_str!("../../src/kube_proxy/tests/fixtures/kube-proxy-1.20.2-captured-nft.txt");

/// The Service of `ONLY_NAT`: 10.96.0.20:80 -> 10.0.2.2:8080.
pub const SERVICE: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 96, 0, 20), 80);
pub const BACKEND_PORT: u16 = 8080;
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 2);
pub const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);

/// Runs `body` as the node of a private topology (see the module comment).
/// `test_name` is the test function's name, used to re-run exactly that test.
pub fn run_isolated(test_name: &str, body: impl FnOnce()) {
    if std::env::var_os(ISOLATED).is_some() {
        sh("mkdir -p /run/netns && mount -t tmpfs tmpfs /run/netns");
        sh("ip link set lo up");
        body();
        return;
    }
    assert!(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() } == 0,
        "the kube-proxy coexistence tests need root (they create network namespaces)"
    );
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
        .status()
        .expect("run unshare");
    assert!(status.success(), "the isolated test failed: {status}");
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

/// Feeds `text` to `iptables-restore --noflush` of that backend and family.
pub fn load(backend: Backend, family: Family, text: &str) {
    Tools::new()
        .restore(backend, family, text)
        .unwrap_or_else(|error| panic!("loading rules failed: {error}"));
}

/// The current kube-proxy dump without its `nfacct` matches, which need nfacct
/// objects (created by kube-proxy through netlink) that the tests do not have.
pub fn without_nfacct(text: &str) -> String {
    text.lines()
        .map(|line| match line.find(" -m nfacct --nfacct-name") {
            Some(start) => {
                let rest = &line[start + " -m nfacct --nfacct-name".len()..];
                let rest = rest.trim_start();
                let after_name = rest.find(' ').map(|index| &rest[index..]).unwrap_or("");
                format!("{}{}", &line[..start], after_name)
            }
            None => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// `iptables-save` of a backend and family, as text.
pub fn save_text(backend: Backend, family: Family) -> String {
    sh(&backend.tool(family, "save"))
}

/// The node between a client and a server namespace:
/// client 10.0.1.2 -- c0 10.0.1.1 [node] s0 10.0.2.1 -- server 10.0.2.2.
pub fn client_server_topology() {
    sh("ip netns add client
        ip netns add server
        ip link add c0 type veth peer name eth0 netns client
        ip link add s0 type veth peer name eth0 netns server
        ip addr add 10.0.1.1/24 dev c0
        ip addr add 10.0.2.1/24 dev s0
        ip link set c0 up
        ip link set s0 up
        ip -n client link set lo up
        ip -n client link set eth0 up
        ip -n client addr add 10.0.1.2/24 dev eth0
        ip -n client route add default via 10.0.1.1
        ip -n server link set lo up
        ip -n server link set eth0 up
        ip -n server addr add 10.0.2.2/24 dev eth0
        ip -n server route add default via 10.0.2.1
        sysctl -qw net.ipv4.ip_forward=1");
}

/// Runs `work` on a thread that has entered the named network namespace; the
/// sockets it creates live there.
pub fn in_namespace<T: Send + 'static>(
    name: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> JoinHandle<T> {
    let path = format!("/run/netns/{name}");
    std::thread::spawn(move || {
        let namespace = File::open(&path).expect("open the namespace");
        // SAFETY: setns on a valid namespace fd; it changes only this thread.
        let result = unsafe { libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(result, 0, "setns into {path}");
        work()
    })
}

/// Gives the server namespace the addresses of the captured dumps' `default/web`
/// endpoints (10.244.1.5 and 10.244.2.7), routed through the node.
pub fn serve_captured_web_endpoints() {
    sh("ip -n server addr add 10.244.1.5/32 dev eth0
        ip -n server addr add 10.244.2.7/32 dev eth0
        ip route add 10.244.0.0/16 via 10.0.2.2");
}

/// An echo server on port `BACKEND_PORT` of every server address, serving
/// every connection until stopped.
pub struct EchoServer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EchoServer {
    pub fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let (ready_sender, ready) = std::sync::mpsc::channel();
        let thread = in_namespace("server", move || {
            let listener =
                TcpListener::bind((Ipv4Addr::UNSPECIFIED, BACKEND_PORT)).expect("bind the server");
            listener.set_nonblocking(true).expect("nonblocking");
            ready_sender.send(()).expect("signal ready");
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut stream, _)) => {
                        let flag = Arc::clone(&flag);
                        std::thread::spawn(move || {
                            let _ = stream.set_nonblocking(false);
                            let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
                            let mut buffer = [0_u8; 256];
                            while !flag.load(Ordering::Relaxed) {
                                match stream.read(&mut buffer) {
                                    Ok(0) => break,
                                    Ok(read) => {
                                        if stream.write_all(&buffer[..read]).is_err() {
                                            break;
                                        }
                                    }
                                    Err(error)
                                        if matches!(
                                            error.kind(),
                                            std::io::ErrorKind::WouldBlock
                                                | std::io::ErrorKind::TimedOut
                                        ) => {}
                                    Err(_) => break,
                                }
                            }
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        ready.recv().expect("the server started");
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A long-lived TCP connection from the client namespace to `SERVICE`, driven
/// from the test thread: each round trip sends a few bytes and waits for the echo.
pub struct LongLivedConnection {
    stream: TcpStream,
}

impl LongLivedConnection {
    pub fn open() -> Self {
        Self::open_to(SERVICE)
    }

    pub fn open_to(address: SocketAddrV4) -> Self {
        let stream = in_namespace("client", move || {
            TcpStream::connect_timeout(&address.into(), Duration::from_secs(3))
        })
        .join()
        .expect("the client thread")
        .expect("connect from the client namespace");
        stream
            .set_read_timeout(Some(Duration::from_secs(1)))
            .expect("timeout");
        Self { stream }
    }

    /// One request and its echo; an error when the echo does not come back in 1 s.
    pub fn round_trip(&mut self, sequence: u32) -> std::io::Result<()> {
        let message = sequence.to_be_bytes();
        self.stream.write_all(&message)?;
        let mut answer = [0_u8; 4];
        self.stream.read_exact(&mut answer)?;
        if answer == message {
            Ok(())
        } else {
            Err(std::io::Error::other("wrong echo"))
        }
    }

    /// `count` round trips, `interval` apart; the number that failed.
    pub fn round_trips(&mut self, first: u32, count: u32, interval: Duration) -> u32 {
        let mut failed = 0;
        for sequence in first..first + count {
            if self.round_trip(sequence).is_err() {
                failed += 1;
            }
            std::thread::sleep(interval);
        }
        failed
    }
}
