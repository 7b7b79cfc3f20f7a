//! NodePorts from the node itself, on 127.0.0.1 and on every local address,
//! and `--node-port-addresses`, end to end: the real binary (`switchyard-agent
//! standalone`) fed with a NodePort Service and its EndpointSlice, and real
//! sockets from the node's processes, from a pod and from an outside client.
//!
//! The node has a second local address, [`OTHER_LOCAL_IP`], on an interface
//! that gets no program (`extra0`): kube-proxy's iptables mode serves NodePorts
//! on every local address, whatever the interface.

mod datapath_support;

use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket},
    time::Duration,
};

use datapath_support::*;

const NODE_NAME: &str = "node-a";
const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 60);
const TCP_NODE_PORT: u16 = 30060;
const UDP_NODE_PORT: u16 = 30061;
/// A local address of the node on an interface without programs.
const OTHER_LOCAL_IP: Ipv4Addr = Ipv4Addr::new(172, 31, 0, 1);

fn agent_log(node: &Node) -> String {
    std::fs::read_to_string(node.work.join("agent.log")).unwrap_or_default()
}

/// The Service (a TCP and a UDP NodePort) and its slice over `pod`.
fn write_manifests(node: &Node, pod: &Pod) {
    let manifests = format!(
        "apiVersion: v1
kind: Service
metadata: {{name: web, namespace: default}}
spec:
  type: NodePort
  clusterIP: {CLUSTER_IP}
  ports:
  - {{name: http, port: 80, targetPort: {TCP_PORT}, nodePort: {TCP_NODE_PORT}, protocol: TCP}}
  - {{name: echo, port: 53, targetPort: {UDP_PORT}, nodePort: {UDP_NODE_PORT}, protocol: UDP}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: web-1, namespace: default, labels: {{kubernetes.io/service-name: web}}}}
addressType: IPv4
ports:
- {{name: http, port: {TCP_PORT}, protocol: TCP}}
- {{name: echo, port: {UDP_PORT}, protocol: UDP}}
endpoints:
- {{addresses: [{}], nodeName: {NODE_NAME}}}
",
        pod.ip
    );
    let directory = node.work.join("manifests");
    std::fs::create_dir_all(&directory).expect("manifest directory");
    // Written whole, then renamed: the agent never reads half a file.
    let staging = node.work.join("services.yaml.new");
    std::fs::write(&staging, manifests).expect("write manifests");
    std::fs::rename(&staging, directory.join("services.yaml")).expect("move manifests");
}

/// The standard topology with one backend pod, a second pod as a client, the
/// node's second local address (routed from the outside client through the
/// node), the manifests, and the agent with `flags`. Pods' TCP connects are
/// balanced by the connect hook, as by default. Returns the pods and the agent,
/// once the node's address serves the TCP NodePort to the node itself.
fn start(node: &Node, flags: &[&str]) -> (Vec<Pod>, std::process::Child) {
    assert!(
        node.cgroup.is_some(),
        "the node's processes are served by the socket hooks: they need a cgroup"
    );
    let pods = standard_topology(2);
    start_servers(&pods[0]);
    sh(&format!(
        "set -e
         ip link add extra0 type veth peer name extra1
         ip link set extra0 up
         ip link set extra1 up
         ip addr add {OTHER_LOCAL_IP}/32 dev extra0
         ip -n client route add {OTHER_LOCAL_IP}/32 via {NODE_IP}"
    ));
    write_manifests(node, &pods[0]);
    let mut arguments = vec!["--pod-connect-time-load-balancing", "tcp"];
    arguments.extend(flags);
    let agent = node.start_standalone_agent_with(NODE_NAME, "agent.log", &arguments);
    let node_port = SocketAddrV4::new(NODE_IP, TCP_NODE_PORT);
    let served = wait_until(Duration::from_secs(20), || {
        from(None, node_port, Duration::from_millis(300)).is_ok()
    });
    assert!(
        served,
        "the node's address never served the NodePort to the node:\n{}",
        agent_log(node)
    );
    (pods, agent)
}

/// A TCP request from `namespace` (`None`: the node), with the peer name the
/// client's socket reports.
fn from(
    namespace: Option<&'static str>,
    target: SocketAddrV4,
    timeout: Duration,
) -> std::io::Result<(Answer, SocketAddr)> {
    in_namespace(namespace, move || {
        let mut stream = std::net::TcpStream::connect_timeout(&target.into(), timeout)?;
        let peer = stream.peer_addr()?;
        stream.set_read_timeout(Some(timeout))?;
        stream.write_all(b"hello\n")?;
        let mut line = String::new();
        BufReader::new(&mut stream).read_line(&mut line)?;
        Ok((parse_answer(&line)?, peer))
    })
    .join()
    .expect("client thread")
}

/// A datagram from the node to `target` over an unconnected socket: the answer
/// and the address `recvfrom` says it came from.
fn unconnected_datagram(target: SocketAddrV4) -> std::io::Result<(Answer, SocketAddr)> {
    let socket = UdpSocket::bind("0.0.0.0:0")?;
    socket.set_read_timeout(Some(Duration::from_secs(2)))?;
    socket.send_to(b"hello", target)?;
    let mut buffer = [0u8; 1500];
    let (length, from) = socket.recv_from(&mut buffer)?;
    let line = String::from_utf8_lossy(&buffer[..length]).into_owned();
    Ok((parse_answer(&line)?, from))
}

/// A datagram from the node over a connected socket, with its peer name.
fn connected_datagram(target: SocketAddrV4) -> std::io::Result<(Answer, SocketAddr)> {
    let socket = UdpSocket::bind("0.0.0.0:0")?;
    socket.set_read_timeout(Some(Duration::from_secs(2)))?;
    socket.connect(target)?;
    let peer = socket.peer_addr()?;
    socket.send(b"hello")?;
    let mut buffer = [0u8; 1500];
    let length = socket.recv(&mut buffer)?;
    let line = String::from_utf8_lossy(&buffer[..length]).into_owned();
    Ok((parse_answer(&line)?, peer))
}

fn assert_refused(what: &str, result: std::io::Result<(Answer, SocketAddr)>) {
    match result {
        Ok((answer, _)) => panic!("{what}: answered by {}", answer.backend),
        Err(error) => assert_eq!(
            error.kind(),
            std::io::ErrorKind::ConnectionRefused,
            "{what}: {error}"
        ),
    }
}

fn stop(mut agent: std::process::Child) {
    let _ = agent.kill();
    let _ = agent.wait();
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn node_ports_are_served_to_the_node_on_localhost_and_on_every_local_address() {
    run_isolated(
        "node_ports_are_served_to_the_node_on_localhost_and_on_every_local_address",
        |node| {
            let (_pods, agent) = start(node, &[]);
            let timeout = Duration::from_secs(2);
            let localhost = SocketAddrV4::new(Ipv4Addr::LOCALHOST, TCP_NODE_PORT);

            // The control: the node reaches the Service's ClusterIP.
            let (answer, _) = from(None, SocketAddrV4::new(CLUSTER_IP, 80), timeout)
                .expect("the node reaches the ClusterIP");
            assert_eq!(answer.backend, "pod1");

            // TCP to 127.0.0.1 and to the other local address, from the node;
            // the socket's peer stays the address it connected to.
            for target in [localhost, SocketAddrV4::new(OTHER_LOCAL_IP, TCP_NODE_PORT)] {
                let (answer, peer) = from(None, target, timeout).unwrap_or_else(|error| {
                    panic!(
                        "the node got no answer on {target}: {error}\n{}",
                        agent_log(node)
                    )
                });
                assert_eq!(answer.backend, "pod1", "{target}");
                assert_eq!(peer, SocketAddr::V4(target));
            }
            // The other local address from outside, entering through ext0.
            let other = SocketAddrV4::new(OTHER_LOCAL_IP, TCP_NODE_PORT);
            let (answer, _) = from(Some("client"), other, timeout)
                .expect("the outside client reaches the other local address");
            assert_eq!(answer.backend, "pod1");

            // UDP to 127.0.0.1, unconnected and connected: the answer comes back
            // from the address the datagram was sent to.
            let udp_localhost = SocketAddrV4::new(Ipv4Addr::LOCALHOST, UDP_NODE_PORT);
            let (answer, from_address) =
                in_namespace(None, move || unconnected_datagram(udp_localhost))
                    .join()
                    .expect("client thread")
                    .expect("an unconnected datagram to 127.0.0.1 is echoed");
            assert_eq!(answer.backend, "pod1");
            assert_eq!(from_address, SocketAddr::V4(udp_localhost));
            let (answer, peer) = in_namespace(None, move || connected_datagram(udp_localhost))
                .join()
                .expect("client thread")
                .expect("a connected datagram to 127.0.0.1 is echoed");
            assert_eq!(answer.backend, "pod1");
            assert_eq!(peer, SocketAddr::V4(udp_localhost));

            // A pod's 127.0.0.1 is its own: refused there (nothing listens),
            // while the same pod reaches the node's address on the NodePort.
            assert_refused(
                "a pod's own loopback",
                from(Some("pod2"), localhost, timeout),
            );
            let (answer, _) = from(
                Some("pod2"),
                SocketAddrV4::new(NODE_IP, TCP_NODE_PORT),
                timeout,
            )
            .expect("the pod reaches the node's address");
            assert_eq!(answer.backend, "pod1");
            stop(agent);
        },
    );
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn with_localhost_node_ports_off_127_0_0_1_is_refused_and_the_node_address_is_served() {
    run_isolated(
        "with_localhost_node_ports_off_127_0_0_1_is_refused_and_the_node_address_is_served",
        |node| {
            let (_pods, agent) = start(node, &["--localhost-node-ports=false"]);
            let timeout = Duration::from_secs(2);
            assert_refused(
                "127.0.0.1 with localhost NodePorts off",
                from(
                    None,
                    SocketAddrV4::new(Ipv4Addr::LOCALHOST, TCP_NODE_PORT),
                    timeout,
                ),
            );
            let udp_localhost = SocketAddrV4::new(Ipv4Addr::LOCALHOST, UDP_NODE_PORT);
            let datagram = in_namespace(None, move || connected_datagram(udp_localhost))
                .join()
                .expect("client thread");
            assert!(
                datagram.is_err(),
                "a datagram to 127.0.0.1 was answered: {datagram:?}"
            );
            // The control: the node's address and the other local one still serve.
            for address in [NODE_IP, OTHER_LOCAL_IP] {
                let (answer, _) = from(None, SocketAddrV4::new(address, TCP_NODE_PORT), timeout)
                    .unwrap_or_else(|error| panic!("{address}: {error}"));
                assert_eq!(answer.backend, "pod1");
            }
            stop(agent);
        },
    );
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn node_port_addresses_restrict_node_ports_to_the_local_addresses_a_cidr_holds() {
    run_isolated(
        "node_port_addresses_restrict_node_ports_to_the_local_addresses_a_cidr_holds",
        |node| {
            let (_pods, agent) = start(node, &["--node-port-addresses", "192.168.50.0/24"]);
            let timeout = Duration::from_secs(2);
            let other = SocketAddrV4::new(OTHER_LOCAL_IP, TCP_NODE_PORT);
            assert_refused(
                "the other local address from the node",
                from(None, other, timeout),
            );
            assert_refused(
                "the other local address from outside",
                from(Some("client"), other, timeout),
            );
            // The range holds no loopback address: no localhost NodePort either.
            assert_refused(
                "127.0.0.1 outside the ranges",
                from(
                    None,
                    SocketAddrV4::new(Ipv4Addr::LOCALHOST, TCP_NODE_PORT),
                    timeout,
                ),
            );
            // The control: the address inside the range serves, from the node
            // and from outside.
            let inside = SocketAddrV4::new(NODE_IP, TCP_NODE_PORT);
            for namespace in [None, Some("client")] {
                let (answer, _) = from(namespace, inside, timeout)
                    .unwrap_or_else(|error| panic!("{namespace:?}: {error}"));
                assert_eq!(answer.backend, "pod1");
            }
            stop(agent);
        },
    );
}
