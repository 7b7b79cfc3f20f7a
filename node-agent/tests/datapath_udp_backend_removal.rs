//! UDP flows whose backend leaves the EndpointSlice, end to end: the real binary
//! (`switchyard-agent standalone`) fed with a UDP Service and its EndpointSlice,
//! and connected UDP sockets that keep their source port (one in a pod, through
//! the ClusterIP; one outside the node, through the NodePort). kube-proxy deletes
//! the conntrack entries NATed to a removed UDP endpoint, so such a flow's next
//! datagram goes to a live endpoint; once the Service has no endpoint left,
//! the datagrams are refused (ICMP port unreachable, ECONNREFUSED on a connected
//! socket); and once an endpoint returns, they are answered again.

mod datapath_support;

use std::{
    net::{Ipv4Addr, SocketAddrV4, UdpSocket},
    time::{Duration, Instant},
};

use datapath_support::*;

const NODE_NAME: &str = "node-a";
const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 53);
const NODE_PORT: u16 = 30053;
/// kube-proxy's budget is its sync; issue 24 asks for this.
const MOVE_WITHIN: Duration = Duration::from_secs(1);

/// The UDP Service and its slice over `pods` (none: a Service without endpoints).
fn write_manifests(node: &Node, pods: &[&Pod]) {
    let endpoints: String = pods
        .iter()
        .map(|pod| format!("- {{addresses: [{}], nodeName: {NODE_NAME}}}\n", pod.ip))
        .collect();
    let endpoints = if endpoints.is_empty() {
        "[]\n".to_string()
    } else {
        format!("\n{endpoints}")
    };
    let manifests = format!(
        "apiVersion: v1
kind: Service
metadata: {{name: dns, namespace: default}}
spec:
  type: NodePort
  clusterIP: {CLUSTER_IP}
  ports: [{{name: dns, port: 53, targetPort: {UDP_PORT}, nodePort: {NODE_PORT}, protocol: UDP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: dns-1, namespace: default, labels: {{kubernetes.io/service-name: dns}}}}
addressType: IPv4
ports: [{{name: dns, port: {UDP_PORT}, protocol: UDP}}]
endpoints: {endpoints}"
    );
    publish_manifests(node, &manifests);
}

/// A UDP client: one socket, connected (so its source port never changes and
/// the kernel reports ICMP errors to it), made in `namespace`.
struct Client {
    what: &'static str,
    socket: UdpSocket,
}

impl Client {
    /// `namespace` `None`: the node, whose connect the socket hook translates.
    fn open(what: &'static str, namespace: Option<&'static str>, target: SocketAddrV4) -> Self {
        let socket = in_namespace(namespace, move || {
            let socket = UdpSocket::bind("0.0.0.0:0").expect("bind the client socket");
            socket.connect(target).expect("connect the client socket");
            socket
        })
        .join()
        .expect("client thread");
        Self { what, socket }
    }

    /// One datagram and its answer (`WouldBlock`/`TimedOut`: none within
    /// `timeout`; `ConnectionRefused`: refused).
    fn ask(&self, timeout: Duration) -> std::io::Result<Answer> {
        self.socket.set_read_timeout(Some(timeout))?;
        self.socket.send(b"hello")?;
        let mut buffer = [0u8; 1500];
        let length = self.socket.recv(&mut buffer)?;
        let mut line = String::from_utf8_lossy(&buffer[..length]).into_owned();
        line.truncate(line.trim_end().len());
        parse_answer(&line)
    }

    /// Asks `count` times; every answer's backend (panics on a lost datagram).
    fn backends(&self, count: usize) -> Vec<String> {
        (0..count)
            .map(|_| {
                self.ask(Duration::from_secs(1))
                    .unwrap_or_else(|error| panic!("{}: no answer: {error}", self.what))
                    .backend
            })
            .collect()
    }

    /// Keeps asking (each datagram waiting at most 100 ms) until `done` holds
    /// for an outcome, or `limit` passes; how long it took.
    fn until(
        &self,
        limit: Duration,
        mut done: impl FnMut(&std::io::Result<Answer>) -> bool,
    ) -> Option<Duration> {
        let started = Instant::now();
        while started.elapsed() < limit {
            if done(&self.ask(Duration::from_millis(100))) {
                return Some(started.elapsed());
            }
        }
        None
    }
}

/// The backend every one of `count` datagrams went to: one, or a panic.
fn sticky_backend(client: &Client, count: usize) -> String {
    let backends = client.backends(count);
    let first = backends[0].clone();
    assert!(
        backends.iter().all(|backend| *backend == first),
        "{}: one flow was answered by several backends before any change: {backends:?}",
        client.what
    );
    first
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn udp_flows_move_off_a_removed_backend_within_a_second_are_refused_once_none_is_left_and_answered_when_one_returns(
) {
    run_isolated(
        "udp_flows_move_off_a_removed_backend_within_a_second_are_refused_once_none_is_left_and_answered_when_one_returns",
        |node| {
            let mut pods = standard_topology(2);
            start_servers(&pods[0]);
            start_servers(&pods[1]);
            // The client pod: no server, only the socket below.
            add_pod("pod3", Ipv4Addr::new(10, 244, 0, 13));
            write_manifests(node, &[&pods[0], &pods[1]]);
            let mut agent = node.start_standalone_agent(NODE_NAME, "agent.log");
            let cluster_ip = SocketAddrV4::new(CLUSTER_IP, 53);
            let node_port = SocketAddrV4::new(NODE_IP, NODE_PORT);

            let served = wait_until(Duration::from_secs(20), || {
                Client::open("probe", Some("pod3"), cluster_ip)
                    .ask(Duration::from_millis(300))
                    .is_ok()
            });
            assert!(
                served,
                "the ClusterIP was never answered:\n{}",
                agent_log(node)
            );

            // The socket hooks may attach after the TC programs serve the pod: the node's
            // connect needs them (without, the ClusterIP has no route from the node).
            if node.cgroup.is_some() {
                let hooked = wait_until(Duration::from_secs(20), || {
                    in_namespace(None, move || {
                        UdpSocket::bind("0.0.0.0:0").and_then(|socket| socket.connect(cluster_ip))
                    })
                    .join()
                    .is_ok_and(|connected| connected.is_ok())
                });
                assert!(
                    hooked,
                    "the node's connect to the ClusterIP was never translated:\n{}",
                    agent_log(node)
                );
            }

            // The control: each flow sticks to one backend for many datagrams.
            let from_pod = Client::open("the pod through the ClusterIP", Some("pod3"), cluster_ip);
            let answering = sticky_backend(&from_pod, 20);
            // The outside client's flow must be on the same backend, so that the
            // removal below moves both: new source ports until one is (a fair
            // choice between two backends; 40 tries miss with odds 2^-40).
            let from_outside = (0..40)
                .map(|_| {
                    Client::open(
                        "the outside client through the NodePort",
                        Some("client"),
                        node_port,
                    )
                })
                .find(|client| sticky_backend(client, 5) == answering)
                .expect("no outside flow landed on the pod's backend in 40 tries");
            assert_eq!(sticky_backend(&from_outside, 20), answering);
            // The node's own socket, connected to the backend itself by the
            // connect hook (when the test has a cgroup for the hooks).
            let from_node = node.cgroup.as_ref().map(|_| {
                (0..40)
                    .map(|_| Client::open("the node through the connect hook", None, cluster_ip))
                    .find(|client| sticky_backend(client, 5) == answering)
                    .expect("no node socket landed on the pod's backend in 40 tries")
            });
            let (removed, kept): (Vec<Pod>, Vec<Pod>) =
                pods.drain(..).partition(|pod| pod.name == answering);
            let (removed, kept) = (&removed[0], &kept[0]);
            println!("both flows are on {}; removing it", removed.name);

            // The answering backend leaves the slice; its server keeps running,
            // so a flow left on it would still be answered by it.
            let written = Instant::now();
            write_manifests(node, &[kept]);
            for client in [&from_pod, &from_outside] {
                let moved = client.until(
                    Duration::from_secs(5),
                    |outcome| matches!(outcome, Ok(answer) if answer.backend == kept.name),
                );
                let since_written = written.elapsed();
                assert!(
                    moved.is_some() && since_written < MOVE_WITHIN,
                    "{}: not answered by {} within {MOVE_WITHIN:?} of the removal of {} (moved: {moved:?}, {since_written:?} since):\n{}",
                    client.what,
                    kept.name,
                    removed.name,
                    agent_log(node)
                );
                println!(
                    "{}: answered by {} {since_written:?} after the removal",
                    client.what, kept.name
                );
                assert_eq!(sticky_backend(client, 10), kept.name, "{}", client.what);
            }
            if let Some(from_node) = from_node {
                // The socket holds the removed backend: the agent aborts it, as
                // Cilium does, and the application connects again.
                // ECONNABORTED from a receive; or, when the abort came between
                // two datagrams, EDESTADDRREQ from the next send (the abort
                // disconnected the socket) with ECONNABORTED still pending.
                let mut error_seen = None;
                let aborted = from_node.until(Duration::from_secs(5), |outcome| match outcome {
                    Err(error) if error.kind() == std::io::ErrorKind::ConnectionAborted => {
                        error_seen = Some(error.to_string());
                        true
                    }
                    Err(error) if error.raw_os_error() == Some(libc::EDESTADDRREQ) => {
                        let pending = from_node.socket.take_error().ok().flatten();
                        assert!(
                            pending.as_ref().map(std::io::Error::kind)
                                == Some(std::io::ErrorKind::ConnectionAborted),
                            "disconnected without ECONNABORTED pending: {pending:?}"
                        );
                        error_seen = Some(format!("{error}, then {pending:?}"));
                        true
                    }
                    _ => false,
                });
                let since_written = written.elapsed();
                assert!(
                    aborted.is_some() && since_written < MOVE_WITHIN,
                    "{}: not aborted within {MOVE_WITHIN:?} of the removal of {} (aborted: {aborted:?}, {since_written:?} since):\n{}",
                    from_node.what,
                    removed.name,
                    agent_log(node)
                );
                println!(
                    "{}: aborted {since_written:?} after the removal ({error_seen:?})",
                    from_node.what
                );
                let again = Client::open("the node, connected again", None, cluster_ip);
                assert_eq!(sticky_backend(&again, 10), kept.name, "{}", again.what);
            }

            // The last backend leaves: the same flows are refused.
            let written = Instant::now();
            write_manifests(node, &[]);
            for client in [&from_pod, &from_outside] {
                let refused = client.until(Duration::from_secs(5), |outcome| {
                    matches!(outcome, Err(error) if error.kind() == std::io::ErrorKind::ConnectionRefused)
                });
                let since_written = written.elapsed();
                assert!(
                    refused.is_some() && since_written < MOVE_WITHIN,
                    "{}: not refused within {MOVE_WITHIN:?} of the removal of the last backend (refused: {refused:?}, {since_written:?} since):\n{}",
                    client.what,
                    agent_log(node)
                );
                println!(
                    "{}: refused {since_written:?} after the last backend left",
                    client.what
                );
            }

            // A backend comes back: the same sockets, refused a moment ago, are
            // answered again (a refusal leaves no flow state behind, where
            // kube-proxy deletes the conntrack entries that cached it).
            let written = Instant::now();
            write_manifests(node, &[kept]);
            for client in [&from_pod, &from_outside] {
                let answered = client.until(Duration::from_secs(5), |outcome| {
                    matches!(outcome, Ok(answer) if answer.backend == kept.name)
                });
                let since_written = written.elapsed();
                assert!(
                    answered.is_some() && since_written < MOVE_WITHIN,
                    "{}: not answered within {MOVE_WITHIN:?} of a backend's return (answered: {answered:?}, {since_written:?} since):\n{}",
                    client.what,
                    agent_log(node)
                );
                println!("{}: answered again {since_written:?} after a backend came back", client.what);
            }
            let _ = agent.kill();
            let _ = agent.wait();
        },
    );
}
