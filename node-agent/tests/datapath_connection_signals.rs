//! The connection signals (issue 28), end to end: the real binary (`switchyard-agent
//! standalone`, which logs each published report as the DataplaneNode status would carry it)
//! with its `sock_ops` program on the test's cgroup, and real TCP connections to Service
//! addresses, from a pod (its destination a ClusterIP, translated by TC) and from the node
//! (translated at connect by the socket hook, so found through its reverse entry): a backend
//! port that refuses (RST), a backend that drops SYNs, a backend that resets an established
//! connection. The control: served connections first, reported as zero on every connection
//! signal. Each fault is also found in the per-Service map under its own Service.

mod datapath_support;

use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream},
    os::fd::{AsFd as _, AsRawFd as _},
    time::Duration,
};

use datapath_support::*;
use switchyard_common::{
    connection::ConnectionCounts, ipv4_mapped, map_names, FrontendKey, SCHEMA_VERSION,
    SCOPE_INTERNAL,
};

const NODE_NAME: &str = "node-a";
const SERVED_CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 50);
/// Its endpoint's port has no listener: the backend answers a SYN with a reset.
const REFUSING_CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 51);
const REFUSING_PORT: u16 = 9001;
/// Its endpoint's port drops SYNs (a netfilter rule in the pod).
const SILENT_CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 52);
const SILENT_PORT: u16 = 9002;
/// Its endpoint accepts, reads a line and resets the connection.
const RESETTING_CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 53);
const RESETTING_PORT: u16 = 9003;
/// No endpoint at all: refused by design (the datapath's refusal), not a failed connect.
const EMPTY_CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 54);
/// How long a published report may take: a sample every 5 s, a change published at most every
/// 10 s, unchanged figures every 30 s, with room for a busy machine.
const REPORT_DEADLINE: Duration = Duration::from_secs(60);

fn write_manifests(node: &Node, backend: &Pod) {
    let service = |name: &str, cluster_ip: Ipv4Addr, target_port: u16| {
        format!(
            "apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: default}}
spec:
  clusterIP: {cluster_ip}
  ports: [{{name: tcp, port: 80, targetPort: {target_port}, protocol: TCP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: {name}-1, namespace: default, labels: {{kubernetes.io/service-name: {name}}}}}
addressType: IPv4
ports: [{{name: tcp, port: {target_port}, protocol: TCP}}]
endpoints:
- {{addresses: [{backend}], nodeName: {NODE_NAME}}}
---
",
            backend = backend.ip,
        )
    };
    let manifests = [
        service("served", SERVED_CLUSTER_IP, TCP_PORT),
        service("refusing", REFUSING_CLUSTER_IP, REFUSING_PORT),
        service("silent", SILENT_CLUSTER_IP, SILENT_PORT),
        service("resetting", RESETTING_CLUSTER_IP, RESETTING_PORT),
        format!(
            "apiVersion: v1
kind: Service
metadata: {{name: empty, namespace: default}}
spec:
  clusterIP: {EMPTY_CLUSTER_IP}
  ports: [{{name: tcp, port: 80, targetPort: 9004, protocol: TCP}}]
"
        ),
    ]
    .concat();
    publish_manifests(node, &manifests);
}

/// A server in `pod` on `port` that accepts, reads a line and closes with `SO_LINGER` 0: a
/// reset of the established connection.
fn start_resetting_server(pod: &Pod, port: u16) {
    let address = SocketAddrV4::new(pod.ip, port);
    let (ready_sender, ready) = std::sync::mpsc::channel();
    in_namespace(Some(&pod.name), move || {
        let listener = TcpListener::bind(address).expect("bind the resetting server");
        ready_sender.send(()).expect("signal ready");
        for mut stream in listener.incoming().flatten() {
            let mut line = [0u8; 64];
            let _ = stream.read(&mut line);
            let linger = libc::linger {
                l_onoff: 1,
                l_linger: 0,
            };
            // SAFETY: a socket option on a descriptor the stream owns until it drops below.
            let set = unsafe {
                libc::setsockopt(
                    stream.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_LINGER,
                    (&linger as *const libc::linger).cast(),
                    std::mem::size_of::<libc::linger>() as libc::socklen_t,
                )
            };
            assert_eq!(set, 0, "SO_LINGER: {}", std::io::Error::last_os_error());
            drop(stream);
        }
    });
    ready.recv().expect("resetting server ready");
}

/// A connect from `namespace` (`None`: the node) that must fail with `kind`.
fn assert_connect_fails(
    namespace: Option<&str>,
    target: SocketAddrV4,
    timeout: Duration,
    kind: std::io::ErrorKind,
) {
    let result = in_namespace(namespace, move || {
        TcpStream::connect_timeout(&target.into(), timeout)
    })
    .join()
    .expect("client thread");
    match result {
        Ok(_) => panic!("{target} from {namespace:?}: connected"),
        Err(error) => assert_eq!(error.kind(), kind, "{target} from {namespace:?}: {error}"),
    }
}

/// A request from the pod to the resetting Service: connected, then reset by the backend.
fn assert_reset_after_established(target: SocketAddrV4) {
    let result = in_namespace(Some("pod2"), move || {
        let mut stream = TcpStream::connect_timeout(&target.into(), Duration::from_secs(2))?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        stream.write_all(b"hello\n")?;
        let mut answer = [0u8; 64];
        stream.read(&mut answer)
    })
    .join()
    .expect("client thread");
    match result {
        Ok(read) => panic!("the resetting backend answered {read} bytes"),
        Err(error) => assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "{error}"),
    }
}

/// The per-Service counts of `cluster_ip:80`, summed over CPUs, from the pinned map.
fn counts_of_service(node: &Node, cluster_ip: Ipv4Addr) -> Option<ConnectionCounts> {
    let directory = switchyard_loader::version_directory(&node.pin_directory, SCHEMA_VERSION);
    let map =
        switchyard_loader::system::open_pinned(&directory.join(map_names::CONNECTIONS_BY_FRONTEND))
            .expect("the per-Service map is pinned");
    let cpus = switchyard_agent::disruption::possible_cpu_count(
        &std::fs::read_to_string("/sys/devices/system/cpu/possible").expect("possible CPUs"),
    )
    .expect("a CPU count");
    let key = FrontendKey {
        address: ipv4_mapped(cluster_ip.octets()),
        port_big_endian: 80u16.to_be(),
        protocol: tcp(),
        scope: SCOPE_INTERNAL,
    };
    // SAFETY: `FrontendKey` is `repr(C)` without padding (asserted in switchyard-common).
    let key_bytes = unsafe {
        std::slice::from_raw_parts(
            (&key as *const FrontendKey).cast::<u8>(),
            std::mem::size_of::<FrontendKey>(),
        )
    };
    let value = switchyard_loader::system::map_lookup(map.as_fd(), key_bytes, 24 * cpus)
        .expect("look the Service up")?;
    let mut total = ConnectionCounts::default();
    for slot in value.chunks_exact(24) {
        let field = |at: usize| u64::from_ne_bytes(slot[at..at + 8].try_into().expect("8 bytes"));
        total.failed_connects += field(0);
        total.syn_retransmits += field(8);
        total.resets_by_peer += field(16);
    }
    Some(total)
}

/// The instructions the verifier checked for the pinned `sock_ops` program
/// (`bpf_prog_info.verified_insns`, at offset 216), printed for the record.
fn verified_instructions_of_sock_ops(node: &Node) -> u32 {
    let program = switchyard_loader::system::open_pinned(
        &switchyard_loader::version_directory(&node.pin_directory, SCHEMA_VERSION)
            .join("programs")
            .join(switchyard_common::program_names::SOCK_OPS),
    )
    .expect("the sock_ops program is pinned");
    let mut info = [0u8; 256];
    #[repr(C)]
    struct InfoRequest {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    let request = InfoRequest {
        bpf_fd: program.as_raw_fd() as u32,
        info_len: info.len() as u32,
        info: info.as_mut_ptr() as u64,
    };
    // SAFETY: BPF_OBJ_GET_INFO_BY_FD (15) writes at most `info_len` bytes into `info`,
    // which outlives the call.
    let result = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            15,
            &request as *const InfoRequest,
            std::mem::size_of::<InfoRequest>(),
        )
    };
    assert_eq!(
        result,
        0,
        "BPF_OBJ_GET_INFO_BY_FD: {}",
        std::io::Error::last_os_error()
    );
    u32::from_ne_bytes(info[216..220].try_into().expect("4 bytes"))
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn the_reported_connection_signals_count_refused_and_unanswered_connects_syn_retransmissions_and_resets_per_service(
) {
    run_isolated(
        "the_reported_connection_signals_count_refused_and_unanswered_connects_syn_retransmissions_and_resets_per_service",
        |node| {
            assert!(
                node.cgroup.is_some(),
                "the sock_ops program needs the test's cgroup"
            );
            let pods = standard_topology(2);
            start_servers(&pods[0]);
            start_resetting_server(&pods[0], RESETTING_PORT);
            sh(&format!(
                "ip netns exec {pod} nft add table inet silent
                 ip netns exec {pod} nft add chain inet silent input '{{ type filter hook input priority 0; }}'
                 ip netns exec {pod} nft add rule inet silent input tcp dport {SILENT_PORT} drop",
                pod = pods[0].name
            ));
            write_manifests(node, &pods[0]);
            let mut agent = node.start_standalone_agent(NODE_NAME, "agent.log");
            let attached = wait_until(Duration::from_secs(20), || {
                switchyard_loader::connection_signals_attached(&node.pin_directory)
            });
            assert!(attached, "sock_ops never attached:\n{}", agent_log(node));
            println!(
                "sy_sock_ops: {} instructions verified",
                verified_instructions_of_sock_ops(node)
            );
            let served = SocketAddrV4::new(SERVED_CLUSTER_IP, 80);
            // Ready once the node's connect is translated: before the socket hook is there,
            // the node has no route to the ClusterIP and its connect fails before any SYN
            // (nothing to count), whereas a pod's SYN would be sent and fail, and count. The
            // same round attaches the pods' interfaces before the socket hooks.
            let ready = wait_until(Duration::from_secs(20), || {
                tcp_request(served, Duration::from_millis(300)).is_ok()
            });
            assert!(ready, "the served Service never answered:\n{}", agent_log(node));

            // The control: served connections, from the pod and from the node, move no
            // connection signal. Waits for a window that ends after them.
            for _ in 0..3 {
                in_namespace(Some("pod2"), move || tcp_request(served, Duration::from_secs(2)))
                    .join()
                    .expect("pod thread")
                    .expect("the pod reaches the served Service");
                tcp_request(served, Duration::from_secs(2))
                    .expect("the node reaches the served Service");
            }
            let served_until = chrono::Utc::now().timestamp();
            let control = wait_for_window(node, REPORT_DEADLINE, "covering the served connections", |window| {
                window.end.timestamp() > served_until
            });
            assert_eq!(control.connections.failed_connects, Some(0), "{control:#?}");
            assert_eq!(control.connections.syn_retransmits, Some(0), "{control:#?}");
            assert_eq!(control.connections.resets_by_peer, Some(0), "{control:#?}");
            assert_eq!(counts_of_service(node, SERVED_CLUSTER_IP), None);

            // Refused by design (no endpoint): the datapath's refusal, no failed connect.
            assert_connect_fails(
                Some("pod2"),
                SocketAddrV4::new(EMPTY_CLUSTER_IP, 80),
                Duration::from_secs(2),
                std::io::ErrorKind::ConnectionRefused,
            );
            // Refused by the backend: once from the pod (its destination the ClusterIP),
            // once from the node (translated at connect, found by its reverse entry).
            let refusing = SocketAddrV4::new(REFUSING_CLUSTER_IP, 80);
            for namespace in [Some("pod2"), None] {
                assert_connect_fails(
                    namespace,
                    refusing,
                    Duration::from_secs(2),
                    std::io::ErrorKind::ConnectionRefused,
                );
            }
            // Unanswered: the SYN is sent again (after 1 s) before the client gives up.
            assert_connect_fails(
                Some("pod2"),
                SocketAddrV4::new(SILENT_CLUSTER_IP, 80),
                Duration::from_millis(2_500),
                std::io::ErrorKind::TimedOut,
            );
            assert_reset_after_established(SocketAddrV4::new(RESETTING_CLUSTER_IP, 80));

            let moved = wait_for_window(node, REPORT_DEADLINE, "with the failed connects and the reset", |window| {
                window.connections.failed_connects == Some(3)
                    && window.connections.syn_retransmits.unwrap_or(0) >= 1
                    && window.connections.resets_by_peer == Some(1)
            });
            println!("reported after the faults: {moved:#?}");
            assert_eq!(moved.datapath.translation_errors, Some(0), "{moved:#?}");
            assert_eq!(
                moved.expected.refused_without_ready_endpoints,
                Some(1),
                "{moved:#?}"
            );
            assert_eq!(counts_of_service(node, EMPTY_CLUSTER_IP), None);

            let refused = counts_of_service(node, REFUSING_CLUSTER_IP).expect("the refusing Service");
            assert_eq!(
                refused,
                ConnectionCounts { failed_connects: 2, syn_retransmits: 0, resets_by_peer: 0 }
            );
            let silent = counts_of_service(node, SILENT_CLUSTER_IP).expect("the silent Service");
            assert_eq!(silent.failed_connects, 1, "{silent:?}");
            assert!(silent.syn_retransmits >= 1, "{silent:?}");
            assert_eq!(silent.resets_by_peer, 0, "{silent:?}");
            let reset = counts_of_service(node, RESETTING_CLUSTER_IP).expect("the resetting Service");
            assert_eq!(
                reset,
                ConnectionCounts { failed_connects: 0, syn_retransmits: 0, resets_by_peer: 1 }
            );
            assert_eq!(counts_of_service(node, SERVED_CLUSTER_IP), None);
            let _ = agent.kill();
            let _ = agent.wait();
        },
    );
}
