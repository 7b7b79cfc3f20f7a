//! ICMP errors about translated flows, end to end: the real binary
//! (`switchyard-agent standalone`) fed with Service and EndpointSlice manifests,
//! and real sockets whose kernel must recognise the error the TC programs
//! translated back.
//! - Connection refused: a connected UDP socket to a Service whose backend port
//!   is closed gets ECONNREFUSED from the backend's port unreachable (through a
//!   ClusterIP from a pod, a NodePort and an external IP from outside, and a
//!   masqueraded NodePort whose error netfilter de-masquerades first).
//! - Path MTU discovery: a TCP upload through a Service to a backend behind a
//!   router whose far link has a smaller MTU completes, because the router's
//!   "fragmentation needed" reaches the client's socket.

mod datapath_support;

use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream},
    os::fd::FromRawFd as _,
    time::{Duration, Instant},
};

use datapath_support::*;

const NODE_NAME: &str = "node-a";
/// An endpoint declared on this node name is remote: its flows are masqueraded.
const OTHER_NODE: &str = "node-b";
/// A port nothing listens on in the backends.
const CLOSED_PORT: u16 = 9999;
/// How soon a refusal must come: the error is the backend's answer to the first
/// datagram, so anything slower is a timeout in disguise.
const PROMPTLY: Duration = Duration::from_secs(1);

/// A Service of `kind` (`NodePort`) with one port `port` to `target_port`
/// (`protocol`), and its EndpointSlice: `endpoint` on node `endpoint_node`.
struct ServiceManifest<'a> {
    name: &'a str,
    cluster_ip: Ipv4Addr,
    external_ips: &'a [Ipv4Addr],
    protocol: &'a str,
    port: u16,
    node_port: u16,
    target_port: u16,
    endpoint: Ipv4Addr,
    endpoint_node: &'a str,
}

impl ServiceManifest<'_> {
    fn yaml(&self) -> String {
        let Self {
            name,
            cluster_ip,
            protocol,
            port,
            node_port,
            target_port,
            endpoint,
            endpoint_node,
            ..
        } = self;
        let external_ips = self
            .external_ips
            .iter()
            .map(Ipv4Addr::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: default}}
spec:
  type: NodePort
  clusterIP: {cluster_ip}
  externalIPs: [{external_ips}]
  ports: [{{name: p, port: {port}, targetPort: {target_port}, nodePort: {node_port}, protocol: {protocol}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: {name}-1, namespace: default, labels: {{kubernetes.io/service-name: {name}}}}}
addressType: IPv4
ports: [{{name: p, port: {target_port}, protocol: {protocol}}}]
endpoints:
- {{addresses: [{endpoint}], nodeName: {endpoint_node}}}
---
"
        )
    }
}

/// One exchange over a connected UDP socket from `namespace` (`None`: the
/// node), and how long it took.
fn connected_udp_exchange(
    namespace: Option<&'static str>,
    target: SocketAddrV4,
) -> (std::io::Result<Answer>, Duration) {
    in_namespace(namespace, move || {
        let started = Instant::now();
        let result = udp_request(target, Duration::from_secs(3));
        (result, started.elapsed())
    })
    .join()
    .expect("client thread")
}

/// The exchange must fail with ECONNREFUSED, promptly.
fn assert_refused(what: &str, namespace: Option<&'static str>, target: SocketAddrV4) {
    let (result, elapsed) = connected_udp_exchange(namespace, target);
    match result {
        Ok(answer) => panic!("{what}: answered by {} instead of refused", answer.backend),
        Err(error) => {
            assert_eq!(
                error.kind(),
                std::io::ErrorKind::ConnectionRefused,
                "{what}: {error} after {elapsed:?} instead of ECONNREFUSED:\n{}",
                diagnostics()
            );
            assert!(elapsed < PROMPTLY, "{what}: refused only after {elapsed:?}");
            println!("{what}: refused after {elapsed:?}");
        }
    }
}

/// The exchange must be answered by `backend`.
fn assert_echoed(what: &str, namespace: Option<&'static str>, target: SocketAddrV4, backend: &str) {
    let (result, _) = connected_udp_exchange(namespace, target);
    let answer = result.unwrap_or_else(|error| panic!("{what}: {error}"));
    assert_eq!(answer.backend, backend, "{what}");
}

/// The Internet checksum of `bytes` plus `sum` (a partial sum): zero when the
/// bytes hold a valid checksum.
fn internet_checksum(bytes: &[u8], mut sum: u32) -> u16 {
    for pair in bytes.chunks(2) {
        let word = u16::from_be_bytes([pair[0], pair.get(1).copied().unwrap_or(0)]);
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The ICMP error a connected UDP exchange from `namespace` to `target` brings
/// back, as the namespace's kernel received it (IP header first), read from a
/// raw socket opened before the exchange.
fn error_received_for(namespace: &'static str, target: SocketAddrV4) -> Vec<u8> {
    in_namespace(Some(namespace), move || {
        // SAFETY: a plain socket call; the descriptor is owned by `raw` at once.
        let raw = unsafe {
            let descriptor = libc::socket(
                libc::AF_INET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::IPPROTO_ICMP,
            );
            assert!(
                descriptor >= 0,
                "raw socket: {}",
                std::io::Error::last_os_error()
            );
            std::net::UdpSocket::from_raw_fd(descriptor)
        };
        raw.set_read_timeout(Some(Duration::from_secs(3)))
            .expect("raw socket timeout");
        let refused = udp_request(target, Duration::from_secs(3));
        assert!(
            matches!(&refused, Err(error) if error.kind() == std::io::ErrorKind::ConnectionRefused),
            "{refused:?}"
        );
        let mut buffer = [0u8; 1500];
        loop {
            let length = raw
                .recv(&mut buffer)
                .expect("the ICMP error on the raw socket");
            let packet = &buffer[..length];
            let header = usize::from(packet[0] & 0x0f) * 4;
            let quote = &packet[header + 8..];
            // Destination unreachable about a datagram to `target`.
            if packet[header] == 3
                && quote.len() >= 28
                && quote[16..20] == target.ip().octets()
                && quote[22..24] == target.port().to_be_bytes()
            {
                return packet.to_vec();
            }
        }
    })
    .join()
    .expect("raw socket thread")
}

/// Checks the checksums of an ICMP error about a UDP datagram (IP header
/// first: the outer IP, the ICMP and the quoted IP checksums), and that it
/// names `frontend` as the quoted destination and as its own source.
fn assert_translated_error(packet: &[u8], frontend: SocketAddrV4, client: Ipv4Addr) {
    let header = usize::from(packet[0] & 0x0f) * 4;
    assert_eq!(packet[12..16], frontend.ip().octets(), "outer source");
    assert_eq!(
        internet_checksum(&packet[..header], 0),
        0,
        "outer IP checksum"
    );
    let icmp = &packet[header..];
    assert_eq!((icmp[0], icmp[1]), (3, 3), "port unreachable");
    assert_eq!(internet_checksum(icmp, 0), 0, "ICMP checksum");
    let quote = &icmp[8..];
    assert_eq!(quote[0], 0x45);
    assert_eq!(internet_checksum(&quote[..20], 0), 0, "quoted IP checksum");
    assert_eq!(quote[12..16], client.octets(), "quoted source");
    assert_eq!(quote[16..20], frontend.ip().octets(), "quoted destination");
    assert_eq!(quote[22..24], frontend.port().to_be_bytes(), "quoted port");
    // The quoted UDP checksum is not checked: veth leaves a datagram's
    // checksum to "offload" (CHECKSUM_PARTIAL, never completed), so the field
    // the backend quotes holds a partial sum, whichever NAT translates it back.
}

/// Lifts ICMP error rate limiting in `namespace`: each closed-port probe costs
/// one error, and the default limit (one per second after a burst of six, per
/// destination) would turn a later probe into a timeout that is not the
/// datapath's.
fn no_icmp_rate_limit(namespace: &str) {
    sh(&format!(
        "ip netns exec {namespace} sysctl -qw net.ipv4.icmp_ratelimit=0"
    ));
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn a_connected_udp_socket_to_a_service_whose_backend_port_is_closed_is_refused_at_once() {
    run_isolated(
        "a_connected_udp_socket_to_a_service_whose_backend_port_is_closed_is_refused_at_once",
        |node| {
            let pods = standard_topology(3);
            start_servers(&pods[0]);
            for pod in &pods {
                no_icmp_rate_limit(&pod.name);
            }
            let open = ServiceManifest {
                name: "open",
                cluster_ip: Ipv4Addr::new(10, 96, 0, 60),
                external_ips: &[],
                protocol: "UDP",
                port: 53,
                node_port: 30060,
                target_port: UDP_PORT,
                endpoint: pods[0].ip,
                endpoint_node: NODE_NAME,
            };
            let closed = ServiceManifest {
                name: "closed",
                cluster_ip: Ipv4Addr::new(10, 96, 0, 61),
                external_ips: &[Ipv4Addr::new(198, 51, 100, 61)],
                node_port: 30061,
                target_port: CLOSED_PORT,
                ..open
            };
            // pod2 stands for an endpoint on another node: outside clients'
            // flows to it are masqueraded, and netfilter turns its error back
            // towards the client before the TC programs see it.
            let closed_remote = ServiceManifest {
                name: "closed-remote",
                cluster_ip: Ipv4Addr::new(10, 96, 0, 62),
                external_ips: &[],
                node_port: 30062,
                target_port: CLOSED_PORT,
                endpoint: pods[1].ip,
                endpoint_node: OTHER_NODE,
                ..open
            };
            publish_manifests(
                node,
                &format!("{}{}{}", open.yaml(), closed.yaml(), closed_remote.yaml()),
            );
            let mut agent = node.start_standalone_agent(NODE_NAME, "agent.log");

            let open_cluster_ip = SocketAddrV4::new(open.cluster_ip, open.port);
            let open_node_port = SocketAddrV4::new(NODE_IP, open.node_port);
            let serving = wait_until(Duration::from_secs(20), || {
                [
                    (Some("pod3"), open_cluster_ip),
                    (Some("client"), open_node_port),
                ]
                .into_iter()
                .all(|(namespace, target)| {
                    in_namespace(namespace, move || {
                        udp_request(target, Duration::from_millis(300)).is_ok()
                    })
                    .join()
                    .unwrap_or(false)
                })
            });
            assert!(serving, "the agent never served:\n{}", agent_log(node));

            // A pod through a ClusterIP (translated at the pod's interface).
            assert_echoed(
                "a pod to the open ClusterIP",
                Some("pod3"),
                open_cluster_ip,
                "pod1",
            );
            assert_refused(
                "a pod to the closed ClusterIP",
                Some("pod3"),
                SocketAddrV4::new(closed.cluster_ip, closed.port),
            );
            // A pod that is its own Service's backend (a hairpin flow: the
            // programs send its packets straight back, from the hairpin address).
            assert_echoed(
                "the backend pod to the open ClusterIP (hairpin)",
                Some("pod1"),
                open_cluster_ip,
                "pod1",
            );
            assert_refused(
                "the backend pod to the closed ClusterIP (hairpin)",
                Some("pod1"),
                SocketAddrV4::new(closed.cluster_ip, closed.port),
            );
            // The kernel's own path: the same closed port on the pod IP.
            assert_refused(
                "a pod to the closed port on the pod IP",
                Some("pod3"),
                SocketAddrV4::new(pods[0].ip, CLOSED_PORT),
            );

            // Outside clients through a NodePort and an external IP (translated
            // at the node's external interface).
            assert_echoed(
                "outside to the open NodePort",
                Some("client"),
                open_node_port,
                "pod1",
            );
            assert_refused(
                "outside to the closed NodePort",
                Some("client"),
                SocketAddrV4::new(NODE_IP, closed.node_port),
            );
            // What the client's kernel got: every checksum right, the
            // frontend in the quote and as the sender.
            let closed_node_port = SocketAddrV4::new(NODE_IP, closed.node_port);
            assert_translated_error(
                &error_received_for("client", closed_node_port),
                closed_node_port,
                CLIENT_IP,
            );
            assert_refused(
                "outside to the closed external IP",
                Some("client"),
                SocketAddrV4::new(closed.external_ips[0], closed.port),
            );
            assert_refused(
                "outside to the closed NodePort of a masqueraded endpoint",
                Some("client"),
                SocketAddrV4::new(NODE_IP, closed_remote.node_port),
            );
            assert_refused(
                "outside to the closed port on the pod IP",
                Some("client"),
                SocketAddrV4::new(pods[0].ip, CLOSED_PORT),
            );

            // The node's own connected UDP socket: the connect hook pointed the
            // socket at the backend itself, so no packet was translated and the
            // kernel matches the error to the socket by itself.
            // Without the test cgroup no hook would run and this check would be skipped.
            assert!(
                node.cgroup.is_some(),
                "no test cgroup for the socket hooks: the node's own socket cannot be checked"
            );
            {
                // The hooks are attached in the round after the interfaces.
                let hooked = wait_until(Duration::from_secs(20), || {
                    connected_udp_exchange(None, open_cluster_ip).0.is_ok()
                });
                assert!(
                    hooked,
                    "the node never reached the ClusterIP:\n{}",
                    agent_log(node)
                );
                assert_echoed(
                    "the node to the open ClusterIP",
                    None,
                    open_cluster_ip,
                    "pod1",
                );
                assert_refused(
                    "the node to the closed ClusterIP (connect-time translation)",
                    None,
                    SocketAddrV4::new(closed.cluster_ip, closed.port),
                );
            }
            let _ = agent.kill();
            let _ = agent.wait();
        },
    );
}

/// The far end of the path MTU test: `router` behind the node's second
/// external interface `ext1`, and `far` behind the router, on a link whose MTU
/// is 1280 on the router's side (1500 everywhere else, so both ends announce an
/// MSS of 1460 and send segments the router cannot forward towards `far`).
/// `far` is the backend of the uploads and the client of the downloads.
const FAR_BACKEND: Ipv4Addr = Ipv4Addr::new(10, 244, 9, 2);
const UPLOAD_PORT: u16 = 8080;
const TRANSFER_BYTES: usize = 4 << 20;
/// A UDP port of `far` the time-exceeded probes aim at (nothing listens).
const TRACE_PORT: u16 = 7777;
/// Where the download sources listen.
const DOWNLOAD_PORT: u16 = 8090;

fn add_router_and_far_backend() {
    sh(&format!(
        "ip netns add router
         ip netns add far
         ip link add ext1 type veth peer name eth0 netns router
         ip addr add 10.245.0.1/30 dev ext1
         ip link set ext1 up
         echo 0 > /proc/sys/net/ipv4/conf/ext1/rp_filter
         ip route add 10.244.9.0/24 via 10.245.0.2
         ip -n router link set lo up
         ip -n router addr add 10.245.0.2/30 dev eth0
         ip -n router link set eth0 up
         ip -n router link add far0 mtu 1280 type veth peer name eth0 netns far
         ip -n router addr add 10.244.9.1/24 dev far0
         ip -n router link set far0 up
         ip -n router route add default via 10.245.0.1
         ip netns exec router sysctl -qw net.ipv4.ip_forward=1
         ip -n far link set lo up
         ip -n far addr add {FAR_BACKEND}/24 dev eth0
         ip -n far link set eth0 up
         ip -n far route add default via 10.244.9.1"
    ));
    no_icmp_rate_limit("router");
}

/// A TCP sink in `far`: reads a connection to its end, then answers the
/// number of bytes it read.
fn start_upload_sink() {
    let (ready_sender, ready) = std::sync::mpsc::channel();
    in_namespace(Some("far"), move || {
        let listener = TcpListener::bind(("0.0.0.0", UPLOAD_PORT)).expect("bind the sink");
        ready_sender.send(()).expect("signal ready");
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut stream = stream;
                let mut buffer = vec![0u8; 64 << 10];
                let mut total = 0usize;
                loop {
                    match stream.read(&mut buffer) {
                        Ok(0) => break,
                        Ok(length) => total += length,
                        Err(_) => return,
                    }
                }
                let _ = stream.write_all(format!("{total}\n").as_bytes());
            });
        }
    });
    ready.recv().expect("sink ready");
}

/// Uploads `bytes` from `namespace` (`None`: the node) to `target` and returns
/// the count the sink confirmed. Every step is bounded: a path that loses the
/// large segments stalls, and the stall fails with a timeout.
fn upload(
    namespace: Option<&'static str>,
    target: SocketAddrV4,
    bytes: usize,
) -> std::io::Result<usize> {
    in_namespace(namespace, move || {
        let mut stream = TcpStream::connect_timeout(&target.into(), Duration::from_secs(2))?;
        stream.set_write_timeout(Some(Duration::from_secs(10)))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        let chunk = vec![0x5au8; 64 << 10];
        let mut sent = 0;
        while sent < bytes {
            let length = chunk.len().min(bytes - sent);
            stream.write_all(&chunk[..length])?;
            sent += length;
        }
        stream.shutdown(std::net::Shutdown::Write)?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer)?;
        answer.trim().parse().map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("the sink answered {answer:?}"),
            )
        })
    })
    .join()
    .expect("upload thread")
}

/// A TCP source in `pod`: sends every connection [`TRANSFER_BYTES`] bytes,
/// then closes it.
fn start_download_source(pod: &Pod) {
    let (ready_sender, ready) = std::sync::mpsc::channel();
    in_namespace(Some(&pod.name), move || {
        let listener = TcpListener::bind(("0.0.0.0", DOWNLOAD_PORT)).expect("bind the source");
        ready_sender.send(()).expect("signal ready");
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut stream = stream;
                let chunk = vec![0xa5u8; 64 << 10];
                let mut sent = 0;
                while sent < TRANSFER_BYTES {
                    let length = chunk.len().min(TRANSFER_BYTES - sent);
                    if stream.write_all(&chunk[..length]).is_err() {
                        return;
                    }
                    sent += length;
                }
            });
        }
    });
    ready.recv().expect("source ready");
}

/// Downloads from `target` in `far` until the source closes; the byte count.
/// Bounded as `upload` is.
fn download(target: SocketAddrV4) -> std::io::Result<usize> {
    in_namespace(Some("far"), move || {
        let mut stream = TcpStream::connect_timeout(&target.into(), Duration::from_secs(2))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut buffer = vec![0u8; 64 << 10];
        let mut total = 0;
        loop {
            match stream.read(&mut buffer)? {
                0 => return Ok(total),
                length => total += length,
            }
        }
    })
    .join()
    .expect("download thread")
}

/// Downloads from `target` into `far` and checks that it completed, and that
/// the sender (`source_pod`) learnt the smaller path MTU towards `learnt_at`
/// (the client address its socket sees).
fn assert_downloaded(
    node: &Node,
    what: &str,
    target: SocketAddrV4,
    source_pod: &'static str,
    learnt_at: Ipv4Addr,
) {
    let started = Instant::now();
    match download(target) {
        Ok(count) => assert_eq!(count, TRANSFER_BYTES, "{what}: got {count} bytes"),
        Err(error) => panic!(
            "{what}: the download failed after {:?}: {error}\n{}\n{}\n{}",
            started.elapsed(),
            diagnostics(),
            transfer_context(Some(source_pod)),
            agent_log(node)
        ),
    }
    let elapsed = started.elapsed();
    let route = sh(&format!("ip -n {source_pod} route get {learnt_at}"));
    assert!(
        route.contains("mtu 1280"),
        "{what}: {source_pod} learnt no path MTU towards {learnt_at}: {route}"
    );
    println!(
        "{what}: {TRANSFER_BYTES} bytes in {elapsed:?}; {}",
        route.trim()
    );
}

/// A datagram from the outside client to `target` over a connected UDP socket
/// whose packets live two hops (the node, then the router drops it and answers
/// "time exceeded", as to a traceroute), with `IP_RECVERR` so that the socket
/// reports such an error; the receive's outcome, and how long it took.
fn time_exceeded_outcome(target: SocketAddrV4) -> (std::io::Result<usize>, Duration) {
    in_namespace(Some("client"), move || {
        let started = Instant::now();
        let result = (|| {
            let socket = std::net::UdpSocket::bind("0.0.0.0:0")?;
            socket.set_ttl(2)?;
            let on: libc::c_int = 1;
            set_socket_option(&socket, libc::IPPROTO_IP, libc::IP_RECVERR, &on)?;
            socket.set_read_timeout(Some(Duration::from_secs(3)))?;
            socket.connect(target)?;
            socket.send(b"hello")?;
            let mut buffer = [0u8; 1500];
            socket.recv(&mut buffer)
        })();
        (result, started.elapsed())
    })
    .join()
    .expect("client thread")
}

fn assert_time_exceeded(what: &str, target: SocketAddrV4) {
    let (result, elapsed) = time_exceeded_outcome(target);
    match result {
        Ok(length) => panic!("{what}: {length} bytes answered instead of an error"),
        Err(error) => {
            assert_eq!(
                error.raw_os_error(),
                Some(libc::EHOSTUNREACH),
                "{what}: {error} after {elapsed:?} instead of the router's time exceeded"
            );
            assert!(
                elapsed < PROMPTLY,
                "{what}: reported only after {elapsed:?}"
            );
            println!("{what}: time exceeded reported after {elapsed:?}");
        }
    }
}

/// The source address the node uses towards `destination` (what netfilter's
/// masquerading picks for a flow leaving that way).
fn node_address_towards(destination: Ipv4Addr) -> Ipv4Addr {
    let route = sh(&format!("ip -o route get {destination}"));
    let source = route
        .split_whitespace()
        .skip_while(|word| *word != "src")
        .nth(1)
        .unwrap_or_else(|| panic!("no source address in {route:?}"));
    source
        .parse()
        .unwrap_or_else(|_| panic!("not an address: {source}"))
}

/// What the sockets of `namespace` and the programs' flows look like, for a
/// failed transfer.
fn transfer_context(namespace: Option<&str>) -> String {
    let sockets = match namespace {
        Some(name) => format!("ip netns exec {name} ss -tanoi"),
        None => "ss -tanoi".to_string(),
    };
    sh(&format!(
        "{sockets} 2>&1; for m in $SWITCHYARD_DATAPATH_TEST_DIRECTORY/bpffs/switchyard/v*/SY_CONNTRACK; do bpftool map dump pinned $m 2>&1 | head -400; done; true"
    ))
}

/// Uploads from `namespace` to `target` and checks that it completed, and that
/// the sender learnt the smaller path MTU towards `learnt_at` (the address its
/// socket is connected to), from the router's "fragmentation needed".
fn assert_uploaded(
    node: &Node,
    what: &str,
    namespace: Option<&'static str>,
    target: SocketAddrV4,
    learnt_at: Ipv4Addr,
) {
    let started = Instant::now();
    match upload(namespace, target, TRANSFER_BYTES) {
        Ok(count) => assert_eq!(count, TRANSFER_BYTES, "{what}: the sink got {count} bytes"),
        Err(error) => panic!(
            "{what}: the upload failed after {:?}: {error}\n{}\n{}\n{}",
            started.elapsed(),
            diagnostics(),
            transfer_context(namespace),
            agent_log(node)
        ),
    }
    let elapsed = started.elapsed();
    let route = sh(&format!(
        "ip {} route get {learnt_at}",
        namespace
            .map(|name| format!("-n {name}"))
            .unwrap_or_default()
    ));
    assert!(
        route.contains("mtu 1280"),
        "{what}: no path MTU learnt towards {learnt_at}: {route}"
    );
    println!(
        "{what}: {TRANSFER_BYTES} bytes in {elapsed:?}; {}",
        route.trim()
    );
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn large_uploads_and_downloads_through_services_complete_across_a_link_with_a_smaller_mtu() {
    run_isolated(
        "large_uploads_and_downloads_through_services_complete_across_a_link_with_a_smaller_mtu",
        |node| {
            // pod1: a client of the uploads and the source of the download
            // through a Service; pod2: the source of the control download.
            let pods = standard_topology(2);
            add_router_and_far_backend();
            start_upload_sink();
            start_download_source(&pods[0]);
            start_download_source(&pods[1]);
            let upload_service = ServiceManifest {
                name: "upload",
                cluster_ip: Ipv4Addr::new(10, 96, 0, 70),
                external_ips: &[],
                protocol: "TCP",
                port: 80,
                node_port: 30070,
                target_port: UPLOAD_PORT,
                endpoint: FAR_BACKEND,
                endpoint_node: NODE_NAME,
            };
            // The same backend declared on another node: flows to it from
            // outside are masqueraded, so the router's error goes to the node's
            // address and netfilter turns it back towards the client.
            let remote_service = ServiceManifest {
                name: "upload-remote",
                cluster_ip: Ipv4Addr::new(10, 96, 0, 71),
                external_ips: &[Ipv4Addr::new(198, 51, 100, 71)],
                node_port: 30071,
                endpoint_node: OTHER_NODE,
                ..upload_service
            };
            // Downloads: `far` is the client, entering through `ext1`.
            let download_service = ServiceManifest {
                name: "download",
                cluster_ip: Ipv4Addr::new(10, 96, 0, 72),
                external_ips: &[],
                node_port: 30072,
                target_port: DOWNLOAD_PORT,
                endpoint: pods[0].ip,
                ..upload_service
            };
            // The control download's source, declared on another node: its
            // flows from outside are masqueraded.
            let remote_download_service = ServiceManifest {
                name: "download-remote",
                cluster_ip: Ipv4Addr::new(10, 96, 0, 73),
                external_ips: &[Ipv4Addr::new(198, 51, 100, 73)],
                node_port: 30073,
                endpoint: pods[1].ip,
                endpoint_node: OTHER_NODE,
                ..download_service
            };
            // Datagrams to `far` that never get there (see `time_exceeded_outcome`).
            let trace_service = ServiceManifest {
                name: "trace",
                cluster_ip: Ipv4Addr::new(10, 96, 0, 74),
                external_ips: &[],
                protocol: "UDP",
                node_port: 30074,
                target_port: TRACE_PORT,
                endpoint: FAR_BACKEND,
                ..upload_service
            };
            publish_manifests(
                node,
                &format!(
                    "{}{}{}{}{}",
                    upload_service.yaml(),
                    remote_service.yaml(),
                    download_service.yaml(),
                    remote_download_service.yaml(),
                    trace_service.yaml()
                ),
            );
            let mut agent = node.start_standalone_agent_with(
                NODE_NAME,
                "agent.log",
                &["--host-interfaces", "ext*"],
            );
            let node_port = SocketAddrV4::new(NODE_IP, upload_service.node_port);
            let serving = wait_until(Duration::from_secs(20), || {
                upload(Some("client"), node_port, 16).is_ok()
            });
            assert!(serving, "the agent never served:\n{}", agent_log(node));

            // Each target is a destination of its own, so no upload profits
            // from the path MTU another one learnt.
            assert_uploaded(
                node,
                "straight to the backend (the kernel's own path)",
                Some("client"),
                SocketAddrV4::new(FAR_BACKEND, UPLOAD_PORT),
                FAR_BACKEND,
            );
            assert_uploaded(
                node,
                "outside through the NodePort",
                Some("client"),
                node_port,
                NODE_IP,
            );
            let external_ip = remote_service.external_ips[0];
            assert_uploaded(
                node,
                "outside through a masqueraded external IP",
                Some("client"),
                SocketAddrV4::new(external_ip, remote_service.port),
                external_ip,
            );
            assert_uploaded(
                node,
                "a pod through the ClusterIP",
                Some("pod1"),
                SocketAddrV4::new(upload_service.cluster_ip, upload_service.port),
                upload_service.cluster_ip,
            );

            // The other way: the router's error is about a reply, which the
            // programs sent from the Service address: it comes to the node and
            // must reach the backend. The control: another pod's own address
            // (a destination of its own for the path MTU, in another namespace).
            assert_downloaded(
                node,
                "straight from a pod (the kernel's own path)",
                SocketAddrV4::new(pods[1].ip, DOWNLOAD_PORT),
                "pod2",
                FAR_BACKEND,
            );
            assert_downloaded(
                node,
                "from outside through the NodePort",
                SocketAddrV4::new(NODE_IP, download_service.node_port),
                "pod1",
                FAR_BACKEND,
            );
            // Masqueraded: the backend sees the node's address on its side
            // (what the kernel picks for the way to the pod), and netfilter
            // masquerades the error the programs turned towards it.
            let masqueraded_as = node_address_towards(pods[1].ip);
            assert_downloaded(
                node,
                "from outside through a masqueraded external IP",
                SocketAddrV4::new(
                    remote_download_service.external_ips[0],
                    remote_download_service.port,
                ),
                "pod2",
                masqueraded_as,
            );
            // Time exceeded, from the router: the kernel's own path, then
            // through the NodePort.
            assert_time_exceeded(
                "straight to the far end (the kernel's own path)",
                SocketAddrV4::new(FAR_BACKEND, TRACE_PORT),
            );
            assert_time_exceeded(
                "outside through the NodePort",
                SocketAddrV4::new(NODE_IP, trace_service.node_port),
            );
            // The node's own socket, pointed at the backend by the connect
            // hook: nothing is translated, the kernel learns the MTU by itself.
            // Without the test cgroup no hook would run and this check would be skipped.
            assert!(
                node.cgroup.is_some(),
                "no test cgroup for the socket hooks: the node's own socket cannot be checked"
            );
            {
                let cluster_ip = SocketAddrV4::new(upload_service.cluster_ip, upload_service.port);
                // The hooks are attached in the round after the interfaces.
                let hooked = wait_until(Duration::from_secs(20), || {
                    upload(None, cluster_ip, 16).is_ok()
                });
                assert!(
                    hooked,
                    "the node never reached the ClusterIP:\n{}",
                    agent_log(node)
                );
                assert_uploaded(
                    node,
                    "the node through the ClusterIP (connect-time translation)",
                    None,
                    cluster_ip,
                    FAR_BACKEND,
                );
            }
            let _ = agent.kill();
            let _ = agent.wait();
        },
    );
}
