//! IPv4 fragments of UDP datagrams through Services, end to end: the real binary
//! (`switchyard-agent standalone`) fed with Service and EndpointSlice manifests,
//! and datagrams larger than the links' MTU (1500), which the senders' kernels
//! fragment. Only a datagram's first fragment carries its ports; the later ones
//! must follow it through the same translation, both ways, or the receiver's
//! reassembly never completes. Every echo is checked byte for byte, by receivers
//! that verify UDP checksums in software (checksum offload is off on every link),
//! so the first fragment's checksum update for the whole datagram is checked too.

mod datapath_support;

use std::{
    net::{Ipv4Addr, SocketAddrV4, UdpSocket},
    os::fd::AsRawFd as _,
    path::Path,
    time::Duration,
};

use datapath_support::*;

const NODE_NAME: &str = "node-a";
/// An endpoint declared on this node name is remote: outside clients' flows to
/// it are masqueraded, so netfilter reassembles and fragments them again.
const OTHER_NODE: &str = "node-b";
/// Where the backends' echo servers listen.
const ECHO_PORT: u16 = 9000;
const LOCAL_CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 70);
const LOCAL_NODE_PORT: u16 = 30070;
const REMOTE_CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 71);
const REMOTE_NODE_PORT: u16 = 30071;
const SERVICE_PORT: u16 = 5000;
/// Datagram sizes: 3 fragments, 21 fragments, and the largest UDP payload
/// IPv4 carries (45 fragments).
const SIZES: [usize; 3] = [4_000, 30_000, 65_507];

fn agent_log(node: &Node) -> String {
    std::fs::read_to_string(node.work.join("agent.log")).unwrap_or_default()
}

/// A UDP NodePort Service `name` to the echo port of `endpoint` on `endpoint_node`.
fn service_yaml(
    name: &str,
    cluster_ip: Ipv4Addr,
    node_port: u16,
    endpoint: Ipv4Addr,
    endpoint_node: &str,
) -> String {
    format!(
        "apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: default}}
spec:
  type: NodePort
  clusterIP: {cluster_ip}
  ports: [{{name: echo, port: {SERVICE_PORT}, targetPort: {ECHO_PORT}, nodePort: {node_port}, protocol: UDP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: {name}-1, namespace: default, labels: {{kubernetes.io/service-name: {name}}}}}
addressType: IPv4
ports: [{{name: echo, port: {ECHO_PORT}, protocol: UDP}}]
endpoints:
- {{addresses: [{endpoint}], nodeName: {endpoint_node}}}
---
"
    )
}

fn write_manifests(node: &Node, text: &str) {
    let directory = node.work.join("manifests");
    std::fs::create_dir_all(&directory).expect("manifest directory");
    // Written whole, then renamed: the agent never reads half a file.
    let staging = node.work.join("services.yaml.new");
    std::fs::write(&staging, text).expect("write manifests");
    std::fs::rename(&staging, directory.join("services.yaml")).expect("move manifests");
}

/// A UDP server in `pod` on [`ECHO_PORT`] sending every datagram back as it came.
fn start_echo_server(pod: &Pod) {
    let (ready_sender, ready) = std::sync::mpsc::channel();
    in_namespace(Some(&pod.name), move || {
        let socket = UdpSocket::bind(("0.0.0.0", ECHO_PORT)).expect("bind the echo server");
        ready_sender.send(()).expect("signal ready");
        let mut buffer = vec![0u8; 65_536];
        while let Ok((length, peer)) = socket.recv_from(&mut buffer) {
            let _ = socket.send_to(&buffer[..length], peer);
        }
    });
    ready.recv().expect("echo server ready");
}

/// Turns receive checksum offload off on `interface` of `namespace` (`None`:
/// the node). A veth otherwise marks a packet without a computed checksum as
/// verified (`CHECKSUM_UNNECESSARY`) as it passes it on, which a wrong UDP
/// checksum would get through; without it each receiver checks the checksum of
/// every datagram it reassembles.
fn verify_checksums_in_software(namespace: Option<&'static str>, interface: &'static str) {
    in_namespace(namespace, move || {
        // `struct ethtool_value` and its command (linux/ethtool.h).
        #[repr(C)]
        struct EthtoolValue {
            command: u32,
            data: u32,
        }
        const ETHTOOL_SET_RECEIVE_CHECKSUM: u32 = 0x15;
        let socket = UdpSocket::bind("0.0.0.0:0").expect("a socket for the ioctl");
        let mut value = EthtoolValue {
            command: ETHTOOL_SET_RECEIVE_CHECKSUM,
            data: 0,
        };
        // SAFETY: an all-zero `ifreq` is valid; the name (shorter than IFNAMSIZ,
        // so NUL-terminated) and the data pointer, to `value` which outlives the
        // call, are what SIOCETHTOOL reads.
        let result = unsafe {
            let mut request: libc::ifreq = std::mem::zeroed();
            for (target, byte) in request.ifr_name.iter_mut().zip(interface.bytes()) {
                *target = byte as libc::c_char;
            }
            request.ifr_ifru.ifru_data = (&mut value as *mut EthtoolValue).cast();
            libc::ioctl(socket.as_raw_fd(), libc::SIOCETHTOOL, &mut request)
        };
        assert_eq!(
            result,
            0,
            "turning receive checksum offload off on {interface}: {}",
            std::io::Error::last_os_error()
        );
    })
    .join()
    .expect("ioctl thread");
}

/// A payload of `length` bytes in which every fragment's share differs from
/// every other's (a byte counter would repeat every 256 bytes).
fn payload(length: usize, seed: u32) -> Vec<u8> {
    let mut state = seed.wrapping_mul(2_654_435_761) | 1;
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state as u8
        })
        .collect()
}

/// Sends one datagram of `length` bytes from `namespace` (`None`: the node)
/// over a socket connected to `target` (so only an answer from `target` itself
/// is received) and checks that the same bytes came back.
fn echo(
    namespace: Option<&'static str>,
    target: SocketAddrV4,
    length: usize,
) -> Result<(), String> {
    in_namespace(namespace, move || {
        let sent = payload(length, length as u32 ^ u32::from(target.port()));
        let socket = UdpSocket::bind("0.0.0.0:0").map_err(|error| format!("bind: {error}"))?;
        socket
            .set_read_timeout(Some(Duration::from_secs(3)))
            .map_err(|error| format!("timeout: {error}"))?;
        socket
            .connect(target)
            .map_err(|error| format!("connect: {error}"))?;
        socket
            .send(&sent)
            .map_err(|error| format!("send: {error}"))?;
        let mut received = vec![0u8; 65_536];
        let received_length = socket
            .recv(&mut received)
            .map_err(|error| format!("no echo: {error}"))?;
        if received[..received_length] != sent[..] {
            let first_difference = sent
                .iter()
                .zip(&received[..received_length])
                .position(|(sent, received)| sent != received);
            return Err(format!(
                "the echo differs: {received_length} bytes back, first difference at {first_difference:?}"
            ));
        }
        Ok(())
    })
    .join()
    .expect("client thread")
}

/// Echoes a datagram of every size in [`SIZES`] from `namespace` through `target`.
fn assert_echoed_whole(
    what: &str,
    namespace: Option<&'static str>,
    target: SocketAddrV4,
    node: &Node,
) {
    for length in SIZES {
        if let Err(error) = echo(namespace, target, length) {
            panic!(
                "{what}: a {length}-byte datagram to {target}: {error}\nlater fragments without their first: {}\n{}\n{}",
                fragments_without_first(&node.pin_directory),
                diagnostics(),
                agent_log(node)
            );
        }
        println!("{what}: a {length}-byte datagram echoed whole");
    }
}

/// The programs' count of later fragments whose first they never saw.
fn fragments_without_first(pin_directory: &Path) -> u64 {
    let path = switchyard_agent::loader::version_directory(
        pin_directory,
        switchyard_common::SCHEMA_VERSION,
    )
    .join(switchyard_common::map_names::FRAGMENTS_WITHOUT_FIRST);
    let data = aya::maps::MapData::from_pin(&path).expect("open the fragment counter");
    let counter: aya::maps::PerCpuArray<_, u64> =
        aya::maps::PerCpuArray::try_from(aya::maps::Map::PerCpuArray(data))
            .expect("the fragment counter is a per-CPU array");
    counter
        .get(&0, 0)
        .expect("read the fragment counter")
        .iter()
        .sum()
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn udp_datagrams_larger_than_the_mtu_are_echoed_whole_through_cluster_ips_and_node_ports() {
    run_isolated(
        "udp_datagrams_larger_than_the_mtu_are_echoed_whole_through_cluster_ips_and_node_ports",
        |node| {
            let pods = standard_topology(3);
            for pod in &pods[..2] {
                start_echo_server(pod);
            }
            verify_checksums_in_software(None, "ext0");
            verify_checksums_in_software(Some("client"), "eth0");
            for (namespace, interface) in [
                ("pod1", "veth-pod1"),
                ("pod2", "veth-pod2"),
                ("pod3", "veth-pod3"),
            ] {
                verify_checksums_in_software(None, interface);
                verify_checksums_in_software(Some(namespace), "eth0");
            }
            write_manifests(
                node,
                &format!(
                    "{}{}",
                    service_yaml(
                        "echo",
                        LOCAL_CLUSTER_IP,
                        LOCAL_NODE_PORT,
                        pods[0].ip,
                        NODE_NAME
                    ),
                    service_yaml(
                        "echo-remote",
                        REMOTE_CLUSTER_IP,
                        REMOTE_NODE_PORT,
                        pods[1].ip,
                        OTHER_NODE
                    ),
                ),
            );
            let mut agent = node.start_standalone_agent(NODE_NAME, "agent.log");
            let cluster_ip = SocketAddrV4::new(LOCAL_CLUSTER_IP, SERVICE_PORT);
            let node_port = SocketAddrV4::new(NODE_IP, LOCAL_NODE_PORT);
            let remote_node_port = SocketAddrV4::new(NODE_IP, REMOTE_NODE_PORT);
            // Served once a datagram that fits one packet is echoed on every path.
            let serving = wait_until(Duration::from_secs(20), || {
                [
                    (Some("pod3"), cluster_ip),
                    (Some("client"), node_port),
                    (Some("client"), remote_node_port),
                ]
                .into_iter()
                .all(|(namespace, target)| echo(namespace, target, 100).is_ok())
            });
            assert!(serving, "the agent never served:\n{}", agent_log(node));

            // The control: the same datagrams straight to the pods, no Service.
            assert_echoed_whole(
                "a pod to the backend's pod IP",
                Some("pod3"),
                SocketAddrV4::new(pods[0].ip, ECHO_PORT),
                node,
            );
            assert_echoed_whole(
                "the outside client to the backend's pod IP",
                Some("client"),
                SocketAddrV4::new(pods[0].ip, ECHO_PORT),
                node,
            );

            // Through the Services: translated at the pod's interface (ClusterIP)
            // or at the node's external one (NodePort), and the echo's fragments
            // translated back at egress.
            assert_echoed_whole(
                "a pod through the ClusterIP",
                Some("pod3"),
                cluster_ip,
                node,
            );
            assert_echoed_whole(
                "the outside client through the NodePort",
                Some("client"),
                node_port,
                node,
            );
            assert_echoed_whole(
                "the outside client through a masqueraded NodePort",
                Some("client"),
                remote_node_port,
                node,
            );
            assert_echoed_whole(
                "the backend pod through its own ClusterIP (hairpin)",
                Some("pod1"),
                cluster_ip,
                node,
            );
            // The node's own socket: the socket hooks point it at the backend,
            // so no fragment of its needs translating.
            assert!(
                node.cgroup.is_some(),
                "no test cgroup for the socket hooks: the node's own datagrams cannot be checked"
            );
            assert_echoed_whole("the node through the ClusterIP", None, cluster_ip, node);
            // Every later fragment found its first.
            assert_eq!(fragments_without_first(&node.pin_directory), 0);

            // A later fragment whose first never came: passed on as it is, and
            // counted.
            send_a_later_fragment_alone(NODE_IP);
            let counted = wait_until(Duration::from_secs(5), || {
                fragments_without_first(&node.pin_directory) == 1
            });
            assert!(
                counted,
                "the lone fragment was counted {} times, not once",
                fragments_without_first(&node.pin_directory)
            );
            let _ = agent.kill();
            let _ = agent.wait();

            // The pins of the build before fragment tracking (same schema
            // version): the maps are created where they are missing, and the
            // new programs that use them replace the running ones.
            let current = switchyard_agent::loader::version_directory(
                &node.pin_directory,
                switchyard_common::SCHEMA_VERSION,
            );
            for name in [
                switchyard_common::map_names::FRAGMENTS,
                switchyard_common::map_names::FRAGMENTS_WITHOUT_FIRST,
            ] {
                std::fs::remove_file(current.join(name)).expect("unpin a fragment map");
            }
            let mut agent = node.start_standalone_agent(NODE_NAME, "agent.log");
            let pinned_again = wait_until(Duration::from_secs(20), || {
                current
                    .join(switchyard_common::map_names::FRAGMENTS)
                    .exists()
                    && current
                        .join(switchyard_common::map_names::FRAGMENTS_WITHOUT_FIRST)
                        .exists()
            });
            assert!(
                pinned_again,
                "the fragment maps were not pinned again:\n{}",
                agent_log(node)
            );
            let served_again = wait_until(Duration::from_secs(20), || {
                echo(Some("pod3"), cluster_ip, 30_000).is_ok()
            });
            assert!(
                served_again,
                "fragments were not translated after the upgrade:\n{}",
                agent_log(node)
            );
            assert_echoed_whole(
                "the outside client through the NodePort after the upgrade",
                Some("client"),
                node_port,
                node,
            );
            let _ = agent.kill();
            let _ = agent.wait();
        },
    );
}
