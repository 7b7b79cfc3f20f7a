//! The IPv6 socket hooks (issue 25, phase 1), end to end: the real binary
//! (`switchyard-agent standalone --served-families ipv4,ipv6`) fed with a
//! dual-stack Service and its EndpointSlices of both families, and the node's own
//! sockets (this process, in the test's cgroup where the hooks are attached)
//! reaching the Service's IPv6 ClusterIP over TCP and UDP, and its IPv4 ClusterIP
//! through an IPv4-mapped address on an IPv6 socket.
//!
//! The TC programs translate no IPv6 yet: only the node's own processes are
//! served over IPv6, which is what this checks.

mod datapath_support;

use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, TcpListener, TcpStream, UdpSocket},
    time::Duration,
};

use datapath_support::*;

const NODE_NAME: &str = "node-a";
const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 70);
const CLUSTER_IPV6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x70);
/// The node's IPv6 address (on `ext0`): the source of its IPv6 connections.
const NODE_IPV6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x50, 0, 0, 0, 0, 0, 1);
/// pod1's IPv6 address.
const POD_IPV6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 0, 0, 0, 0, 0, 0x11);
/// Ports of pod1's dual-stack servers (one socket each for both families), apart
/// from the harness's IPv4-only servers.
const TCP_TARGET: u16 = 8081;
const UDP_TARGET: u16 = 8054;
const SERVICE_TCP_PORT: u16 = 80;
const SERVICE_UDP_PORT: u16 = 53;
const TIMEOUT: Duration = Duration::from_secs(2);

/// The dual-stack Service over pod1, as a 1.20+ API server stores it, with one
/// EndpointSlice per family.
fn write_manifests(node: &Node, pod: &Pod) {
    let ports = format!(
        "ports:
- {{name: http, port: {TCP_TARGET}, protocol: TCP}}
- {{name: echo, port: {UDP_TARGET}, protocol: UDP}}"
    );
    let manifests = format!(
        "apiVersion: v1
kind: Service
metadata: {{name: web, namespace: default}}
spec:
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: {CLUSTER_IP}
  clusterIPs: [{CLUSTER_IP}, '{CLUSTER_IPV6}']
  ports:
  - {{name: http, port: {SERVICE_TCP_PORT}, targetPort: {TCP_TARGET}, protocol: TCP}}
  - {{name: echo, port: {SERVICE_UDP_PORT}, targetPort: {UDP_TARGET}, protocol: UDP}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: web-ipv4, namespace: default, labels: {{kubernetes.io/service-name: web}}}}
addressType: IPv4
{ports}
endpoints:
- {{addresses: [{}], nodeName: {NODE_NAME}}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: web-ipv6, namespace: default, labels: {{kubernetes.io/service-name: web}}}}
addressType: IPv6
{ports}
endpoints:
- {{addresses: ['{POD_IPV6}'], nodeName: {NODE_NAME}}}
",
        pod.ip
    );
    publish_manifests(node, &manifests);
}

/// IPv6 on the standard topology: pod1 gets [`POD_IPV6`] behind its veth (a /128
/// route, a default route through a fixed link-local gateway, as its IPv4 side
/// has), the node gets [`NODE_IPV6`]. No duplicate address detection, and the
/// node's neighbour entry for the pod is written: the addresses are usable at once.
fn add_ipv6(pod: &Pod) {
    let name = &pod.name;
    let host = pod.host_interface();
    sh(&format!(
        "set -e
         mac=$(ip netns exec {name} cat /sys/class/net/eth0/address)
         ip -n {name} addr add {POD_IPV6}/128 dev eth0 nodad
         ip -n {name} neigh add fe80::1 lladdr ee:ee:ee:ee:ee:ee dev eth0 nud permanent
         ip -n {name} -6 route add default via fe80::1 dev eth0
         ip -6 route add {POD_IPV6}/128 dev {host}
         ip -6 neigh add {POD_IPV6} lladdr $mac dev {host} nud permanent
         ip addr add {NODE_IPV6}/64 dev ext0 nodad"
    ));
}

/// pod1's servers on `[::]` (both families on one socket): every TCP line and
/// every datagram is answered with "<pod> <peer> <local address>".
fn start_dual_stack_servers(pod: &Pod) {
    let name = pod.name.clone();
    let (ready_sender, ready) = std::sync::mpsc::channel();
    in_namespace(Some(&pod.name), move || {
        let listener = TcpListener::bind(("::", TCP_TARGET)).expect("bind tcp");
        let udp = UdpSocket::bind(("::", UDP_TARGET)).expect("bind udp");
        ready_sender.send(()).expect("signal ready");
        let udp_name = name.clone();
        std::thread::spawn(move || {
            let local = udp.local_addr().expect("udp local address");
            let mut buffer = [0u8; 1500];
            while let Ok((_, peer)) = udp.recv_from(&mut buffer) {
                // The datagram's own destination is not in `recv_from`: the
                // family of the peer tells which path it took.
                let _ = udp.send_to(format!("{udp_name} {peer} {local}\n").as_bytes(), peer);
            }
        });
        for stream in listener.incoming().flatten() {
            let name = name.clone();
            std::thread::spawn(move || serve(stream, &name));
        }
    });
    ready.recv().expect("servers ready");
}

fn serve(stream: TcpStream, name: &str) {
    let (Ok(peer), Ok(local)) = (stream.peer_addr(), stream.local_addr()) else {
        return;
    };
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    for line in BufReader::new(stream).lines() {
        if line.is_err()
            || writer
                .write_all(format!("{name} {peer} {local}\n").as_bytes())
                .is_err()
        {
            return;
        }
    }
}

/// One answer: who answered, the client it saw, and the address it was reached on.
#[derive(Debug)]
struct Reply {
    backend: String,
    seen_client: SocketAddr,
    reached_on: SocketAddr,
}

fn parse_reply(text: &str) -> std::io::Result<Reply> {
    let invalid = || std::io::Error::new(std::io::ErrorKind::InvalidData, text.to_string());
    let mut fields = text.split_whitespace();
    let mut next = || fields.next().ok_or_else(invalid);
    Ok(Reply {
        backend: next()?.to_string(),
        seen_client: next()?.parse().map_err(|_| invalid())?,
        reached_on: next()?.parse().map_err(|_| invalid())?,
    })
}

/// A TCP request from the node over an IPv6 socket: the reply and the peer name
/// the client's socket reports.
fn tcp_from_node(target: SocketAddrV6) -> std::io::Result<(Reply, SocketAddr)> {
    let mut stream = TcpStream::connect_timeout(&target.into(), TIMEOUT)?;
    let peer = stream.peer_addr()?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.write_all(b"hello\n")?;
    let mut line = String::new();
    BufReader::new(&mut stream).read_line(&mut line)?;
    Ok((parse_reply(&line)?, peer))
}

/// A datagram from the node over an IPv6 socket, connected (the peer name) or
/// not (the address `recvfrom` reports).
fn datagram_from_node(
    target: SocketAddrV6,
    connected: bool,
) -> std::io::Result<(Reply, SocketAddr)> {
    let socket = UdpSocket::bind("[::]:0")?;
    socket.set_read_timeout(Some(TIMEOUT))?;
    let mut buffer = [0u8; 1500];
    let (length, from) = if connected {
        socket.connect(target)?;
        socket.send(b"hello")?;
        (socket.recv(&mut buffer)?, socket.peer_addr()?)
    } else {
        socket.send_to(b"hello", target)?;
        socket.recv_from(&mut buffer)?
    };
    Ok((
        parse_reply(&String::from_utf8_lossy(&buffer[..length]))?,
        from,
    ))
}

fn ipv6(address: Ipv6Addr, port: u16) -> SocketAddrV6 {
    SocketAddrV6::new(address, port, 0, 0)
}

/// `::ffff:a.b.c.d`.
fn mapped(address: Ipv4Addr, port: u16) -> SocketAddrV6 {
    ipv6(address.to_ipv6_mapped(), port)
}

/// The topology with IPv6, pod1's servers, the manifests and the agent with
/// `flags`; returns once the node's IPv4 socket reaches the IPv4 ClusterIP (the
/// Service is in the maps and the IPv4 hooks run).
fn start(node: &Node, flags: &[&str]) -> (Vec<Pod>, std::process::Child) {
    assert!(
        node.cgroup.is_some(),
        "the node's processes are served by the socket hooks: they need a cgroup"
    );
    let pods = standard_topology(2);
    add_ipv6(&pods[0]);
    start_dual_stack_servers(&pods[0]);
    write_manifests(node, &pods[0]);
    let agent = node.start_standalone_agent_with(NODE_NAME, "agent.log", flags);
    let ipv4_cluster_ip = std::net::SocketAddrV4::new(CLUSTER_IP, SERVICE_TCP_PORT);
    let served = wait_until(Duration::from_secs(20), || {
        TcpStream::connect_timeout(&ipv4_cluster_ip.into(), Duration::from_millis(300)).is_ok()
    });
    assert!(
        served,
        "the node never reached the IPv4 ClusterIP ({:?}; the pod straight: {:?}):\n{}",
        TcpStream::connect_timeout(&ipv4_cluster_ip.into(), TIMEOUT),
        TcpStream::connect_timeout(
            &std::net::SocketAddrV4::new(pods[0].ip, TCP_TARGET).into(),
            TIMEOUT
        ),
        agent_log(node)
    );
    (pods, agent)
}

fn ipv6_hook_links(node: &Node) -> Vec<String> {
    let links = node.pin_directory.join("links");
    let mut names: Vec<String> = std::fs::read_dir(&links)
        .map(|entries| {
            entries
                .flatten()
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .filter(|name| name.starts_with("cgroup-") && name.ends_with('6'))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn stop(mut agent: std::process::Child) {
    let _ = agent.kill();
    let _ = agent.wait();
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn the_nodes_ipv6_sockets_reach_a_dual_stack_service_over_ipv6_and_over_an_ipv4_mapped_address() {
    run_isolated(
        "the_nodes_ipv6_sockets_reach_a_dual_stack_service_over_ipv6_and_over_an_ipv4_mapped_address",
        |node| {
            let (_pods, agent) = start(node, &["--served-families", "ipv4,ipv6"]);
            let expected_links = [
                "cgroup-connect6",
                "cgroup-getpeername6",
                "cgroup-recvmsg6",
                "cgroup-sendmsg6",
            ];
            assert!(
                wait_until(Duration::from_secs(10), || ipv6_hook_links(node)
                    == expected_links),
                "the IPv6 hooks were not attached: {:?}\n{}",
                ipv6_hook_links(node),
                agent_log(node)
            );

            // The control: the pod's IPv6 address, straight.
            let (reply, peer) = tcp_from_node(ipv6(POD_IPV6, TCP_TARGET))
                .unwrap_or_else(|error| panic!("the pod's IPv6 address: {error}\n{}", diagnostics()));
            assert_eq!(reply.backend, "pod1");
            assert_eq!(peer, SocketAddr::V6(ipv6(POD_IPV6, TCP_TARGET)));

            // TCP to the IPv6 ClusterIP: the pod is reached on its IPv6 address,
            // from the node's, and the socket's peer stays the Service address.
            let service = ipv6(CLUSTER_IPV6, SERVICE_TCP_PORT);
            for _ in 0..5 {
                let (reply, peer) = tcp_from_node(service).unwrap_or_else(|error| {
                    panic!("TCP to {service}: {error}\n{}", agent_log(node))
                });
                assert_eq!(reply.backend, "pod1");
                assert_eq!(reply.reached_on, SocketAddr::V6(ipv6(POD_IPV6, TCP_TARGET)));
                assert_eq!(reply.seen_client.ip(), std::net::IpAddr::V6(NODE_IPV6));
                assert_eq!(peer, SocketAddr::V6(service), "getpeername");
            }

            // UDP to the IPv6 ClusterIP, over a connected socket (its peer name)
            // and an unconnected one (`recvfrom`): the Service answers.
            let service = ipv6(CLUSTER_IPV6, SERVICE_UDP_PORT);
            for connected in [true, false] {
                let (reply, from) = datagram_from_node(service, connected).unwrap_or_else(|error| {
                    panic!("UDP to {service} (connected: {connected}): {error}\n{}", agent_log(node))
                });
                assert_eq!(reply.backend, "pod1");
                assert_eq!(reply.seen_client.ip(), std::net::IpAddr::V6(NODE_IPV6));
                assert_eq!(from, SocketAddr::V6(service), "connected: {connected}");
            }

            // The IPv4 ClusterIP named by an IPv4-mapped address on an IPv6
            // socket: the pod is reached over IPv4, the peer name stays mapped.
            let service = mapped(CLUSTER_IP, SERVICE_TCP_PORT);
            let (reply, peer) = tcp_from_node(service)
                .unwrap_or_else(|error| panic!("TCP to {service}: {error}\n{}", agent_log(node)));
            assert_eq!(reply.backend, "pod1");
            assert_eq!(
                reply.reached_on,
                SocketAddr::V6(mapped(Ipv4Addr::new(10, 244, 0, 11), TCP_TARGET)),
                "the dual-stack server saw an IPv4 connection"
            );
            assert_eq!(peer, SocketAddr::V6(service), "getpeername");
            // UDP too, connected (`connect6`) and not (the kernel hands an
            // IPv4-mapped datagram to `sendmsg4`; `recvmsg6` turns the answer).
            let service = mapped(CLUSTER_IP, SERVICE_UDP_PORT);
            for connected in [true, false] {
                let (reply, from) = datagram_from_node(service, connected).unwrap_or_else(|error| {
                    panic!("UDP to {service} (connected: {connected}): {error}\n{}", agent_log(node))
                });
                assert_eq!(reply.backend, "pod1");
                assert_eq!(from, SocketAddr::V6(service), "connected: {connected}");
            }

            // The closed connected sockets' reverse entries went with them
            // (sock_release finds IPv6 sockets by dst_ip6, IPv4-mapped ones
            // included). The two unconnected UDP sockets' entries age out of the
            // LRU instead, as with IPv4: two are left.
            assert!(
                wait_until(Duration::from_secs(5), || socket_reverse_entries(&node.pin_directory) == 2),
                "{} reverse entries left",
                socket_reverse_entries(&node.pin_directory)
            );
            stop(agent);
        },
    );
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn without_ipv6_served_no_ipv6_hook_is_attached_and_the_ipv6_cluster_ip_is_not_translated() {
    run_isolated(
        "without_ipv6_served_no_ipv6_hook_is_attached_and_the_ipv6_cluster_ip_is_not_translated",
        |node| {
            // The default: IPv4 only. `start` is the control (the IPv4 ClusterIP
            // works), and so is the pod's IPv6 address reached straight.
            let (_pods, agent) = start(node, &[]);
            assert_eq!(ipv6_hook_links(node), Vec::<String>::new());
            let (reply, _) = tcp_from_node(ipv6(POD_IPV6, TCP_TARGET)).unwrap_or_else(|error| {
                panic!("the pod's IPv6 address: {error}\n{}", diagnostics())
            });
            assert_eq!(reply.backend, "pod1");
            // Nothing routes the IPv6 ClusterIP: untranslated, it goes nowhere.
            let untranslated = tcp_from_node(ipv6(CLUSTER_IPV6, SERVICE_TCP_PORT));
            assert!(
                untranslated.is_err(),
                "the IPv6 ClusterIP answered without IPv6 served: {untranslated:?}"
            );
            stop(agent);
        },
    );
}
