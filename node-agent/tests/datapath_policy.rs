//! Service features that the desired-state code decides, checked end to end
//! through the real binary (`switchyard-agent standalone` fed with manifests) and
//! real sockets: `internalTrafficPolicy: Local`, and named target ports resolved
//! per endpoint from EndpointSlice ports.

mod datapath_support;

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader, Write as _},
    net::{Ipv4Addr, SocketAddrV4, TcpListener},
    path::Path,
    process::Child,
    time::{Duration, Instant},
};

use datapath_support::*;

const NODE_NAME: &str = "node-a";
const OTHER_NODE: &str = "node-b";

fn start_agent(node: &Node) -> Child {
    node.start_standalone_agent(NODE_NAME, "agent.log")
}

fn agent_log(node: &Node) -> String {
    std::fs::read_to_string(node.work.join("agent.log")).unwrap_or_default()
}

fn write_manifests(directory: &Path, text: &str) {
    std::fs::create_dir_all(directory).expect("manifest directory");
    std::fs::write(directory.join("services.yaml"), text).expect("write manifests");
}

/// The EndpointSlice `<service>-1` of `service`: port `http` on 8080, with
/// `endpoints` (YAML list items, one per line).
fn endpoint_slice(service: &str, endpoints: &str) -> String {
    format!(
        "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: {service}-1, namespace: default, labels: {{kubernetes.io/service-name: {service}}}}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints:
{endpoints}"
    )
}

/// Waits until every address answers from its namespace.
fn wait_serving(node: &Node, targets: &[(Option<&'static str>, SocketAddrV4)]) {
    let targets = targets.to_vec();
    let serving = wait_until(Duration::from_secs(20), || {
        targets.iter().all(|(namespace, address)| {
            let address = *address;
            in_namespace(*namespace, move || {
                tcp_request(address, Duration::from_millis(300)).is_ok()
            })
            .join()
            .unwrap_or(false)
        })
    });
    assert!(serving, "the agent never served:\n{}", agent_log(node));
}

/// How many answers each backend gave; panics on a failed request.
fn backends_of(
    namespace: Option<&'static str>,
    address: SocketAddrV4,
    count: usize,
) -> BTreeMap<String, usize> {
    let mut backends = BTreeMap::new();
    for result in tcp_requests_from(namespace, address, count) {
        let answer = result.unwrap_or_else(|error| panic!("{namespace:?} -> {address}: {error}"));
        *backends.entry(answer.backend).or_insert(0) += 1;
    }
    backends
}

/// A connect from `namespace`: how long until it failed, and how.
fn refused_connect(
    namespace: Option<&'static str>,
    address: SocketAddrV4,
) -> (Duration, std::io::Result<()>) {
    in_namespace(namespace, move || {
        let started = Instant::now();
        let result = std::net::TcpStream::connect_timeout(&address.into(), Duration::from_secs(3))
            .map(|_| ());
        (started.elapsed(), result)
    })
    .join()
    .expect("client")
}

const LOCAL_WEB: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 20);
const CLUSTER_WEB: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 21);
const REMOTE_ONLY: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 22);
const LOCAL_WEB_NODE_PORT: u16 = 30020;

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn internal_traffic_policy_local_reaches_only_local_endpoints_and_refuses_fast_without_any() {
    run_isolated(
        "internal_traffic_policy_local_reaches_only_local_endpoints_and_refuses_fast_without_any",
        |node| {
            let pods = standard_topology(3);
            start_servers(&pods[0]);
            start_servers(&pods[1]);
            // pod1 is this node's endpoint; pod2 is declared on another node (it
            // is reachable, as a remote pod would be).
            let (local, remote) = (pods[0].ip, pods[1].ip);
            let both = format!(
                "- {{addresses: [{local}], nodeName: {NODE_NAME}}}\n- {{addresses: [{remote}], nodeName: {OTHER_NODE}}}\n"
            );
            let remote_only = format!("- {{addresses: [{remote}], nodeName: {OTHER_NODE}}}\n");
            let manifests = format!(
                "apiVersion: v1
kind: Service
metadata: {{name: local-web, namespace: default}}
spec:
  type: NodePort
  clusterIP: {LOCAL_WEB}
  internalTrafficPolicy: Local
  ports: [{{name: http, port: 80, targetPort: 8080, nodePort: {LOCAL_WEB_NODE_PORT}, protocol: TCP}}]
---
{}---
apiVersion: v1
kind: Service
metadata: {{name: cluster-web, namespace: default}}
spec:
  clusterIP: {CLUSTER_WEB}
  ports: [{{name: http, port: 80, targetPort: 8080, protocol: TCP}}]
---
{}---
apiVersion: v1
kind: Service
metadata: {{name: remote-only, namespace: default}}
spec:
  clusterIP: {REMOTE_ONLY}
  internalTrafficPolicy: Local
  ports: [{{name: http, port: 80, targetPort: 8080, protocol: TCP}}]
---
{}",
                endpoint_slice("local-web", &both),
                endpoint_slice("cluster-web", &both),
                endpoint_slice("remote-only", &remote_only),
            );
            write_manifests(&node.work.join("manifests"), &manifests);
            let mut agent = start_agent(node);
            let local_web = SocketAddrV4::new(LOCAL_WEB, 80);
            let cluster_web = SocketAddrV4::new(CLUSTER_WEB, 80);
            let node_port = SocketAddrV4::new(NODE_IP, LOCAL_WEB_NODE_PORT);
            wait_serving(
                node,
                &[
                    (Some("pod3"), local_web),
                    (Some("pod3"), cluster_web),
                    (Some("client"), node_port),
                ],
            );

            // From a pod and from the host (socket hooks): only the local endpoint.
            for namespace in [Some("pod3"), None] {
                let backends = backends_of(namespace, local_web, 60);
                assert_eq!(
                    backends.keys().collect::<Vec<_>>(),
                    vec!["pod1"],
                    "{namespace:?}: {backends:?}"
                );
            }
            // The same endpoints without the policy: both are used, so the
            // restriction above is the policy's doing.
            let backends = backends_of(Some("pod3"), cluster_web, 60);
            assert_eq!(backends.len(), 2, "{backends:?}");
            // internalTrafficPolicy does not apply to traffic from outside: the
            // NodePort balances over both (externalTrafficPolicy is Cluster).
            let backends = backends_of(Some("client"), node_port, 60);
            assert_eq!(backends.len(), 2, "{backends:?}");

            // No local endpoint: refused at once, from a pod and from the host.
            for namespace in [Some("pod3"), None] {
                let (elapsed, result) =
                    refused_connect(namespace, SocketAddrV4::new(REMOTE_ONLY, 80));
                let error = result.expect_err("connected to a Service with no local endpoint");
                assert_ne!(
                    error.kind(),
                    std::io::ErrorKind::TimedOut,
                    "{namespace:?}: hung"
                );
                assert!(
                    elapsed < Duration::from_millis(100),
                    "{namespace:?}: refused after {elapsed:?} ({error})"
                );
                println!("{namespace:?}: refused after {elapsed:?}: {error}");
            }
            let _ = agent.kill();
            let _ = agent.wait();
        },
    );
}

const NAMED: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 30);
const NAMED_NODE_PORT: u16 = 30030;
const OTHER_CONTAINER_PORT: u16 = 9090;

/// A TCP server on `port` in `pod`'s namespace answering like `start_servers`.
fn start_server_on(pod: &Pod, port: u16) {
    let name = pod.name.clone();
    let (ready_sender, ready) = std::sync::mpsc::channel();
    in_namespace(Some(&pod.name), move || {
        let listener = TcpListener::bind(("0.0.0.0", port)).expect("bind");
        ready_sender.send(()).expect("signal ready");
        for stream in listener.incoming().flatten() {
            let name = name.clone();
            std::thread::spawn(move || {
                let Ok(peer) = stream.peer_addr() else { return };
                let Ok(mut writer) = stream.try_clone() else {
                    return;
                };
                for line in BufReader::new(stream).lines() {
                    if line.is_err()
                        || writer
                            .write_all(format!("{name} {peer}\n").as_bytes())
                            .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    ready.recv().expect("server ready");
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn a_named_target_port_reaches_each_backend_on_its_own_container_port() {
    run_isolated(
        "a_named_target_port_reaches_each_backend_on_its_own_container_port",
        |node| {
            let pods = standard_topology(3);
            // pod1 listens on 8080 only, pod2 on 9090 only: a backend given the
            // other's number would refuse the connection.
            start_server_on(&pods[0], TCP_PORT);
            start_server_on(&pods[1], OTHER_CONTAINER_PORT);
            let (first, second) = (pods[0].ip, pods[1].ip);
            // The Service names its target port; each EndpointSlice carries the
            // number that name resolved to in its pods (one port set per slice).
            let manifests = format!(
                "apiVersion: v1
kind: Service
metadata: {{name: named, namespace: default}}
spec:
  type: NodePort
  clusterIP: {NAMED}
  ports: [{{name: http, port: 80, targetPort: web, nodePort: {NAMED_NODE_PORT}, protocol: TCP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: named-a, namespace: default, labels: {{kubernetes.io/service-name: named}}}}
addressType: IPv4
ports: [{{name: http, port: {TCP_PORT}, protocol: TCP}}]
endpoints:
- {{addresses: [{first}], nodeName: {NODE_NAME}}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: named-b, namespace: default, labels: {{kubernetes.io/service-name: named}}}}
addressType: IPv4
ports: [{{name: http, port: {OTHER_CONTAINER_PORT}, protocol: TCP}}]
endpoints:
- {{addresses: [{second}], nodeName: {NODE_NAME}}}
"
            );
            write_manifests(&node.work.join("manifests"), &manifests);
            let mut agent = start_agent(node);
            let cluster_ip = SocketAddrV4::new(NAMED, 80);
            let node_port = SocketAddrV4::new(NODE_IP, NAMED_NODE_PORT);
            // Each client the requests below come from: the host's are translated
            // by the socket hooks, the pod's and the outside client's by TC.
            wait_serving(
                node,
                &[
                    (Some("pod3"), cluster_ip),
                    (None, cluster_ip),
                    (Some("client"), node_port),
                ],
            );
            // Every request succeeds (a wrong port would be refused), and both
            // backends answer, from a pod, the host and outside.
            for (namespace, address) in [
                (Some("pod3"), cluster_ip),
                (None, cluster_ip),
                (Some("client"), node_port),
            ] {
                let backends = backends_of(namespace, address, 60);
                assert_eq!(
                    backends.keys().collect::<Vec<_>>(),
                    vec!["pod1", "pod2"],
                    "{namespace:?} -> {address}: {backends:?}"
                );
            }
            let _ = agent.kill();
            let _ = agent.wait();
        },
    );
}

const INSIDE: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 40);
const OUTSIDE: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 41);
const OUTSIDE_NODE_PORT: u16 = 30041;

/// Connections netfilter tracks in the calling thread's namespace (0 when
/// nothing turned its connection tracking on there).
fn netfilter_tracked_connections() -> u64 {
    std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_count")
        .ok()
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or(0)
}

fn node_rules() -> String {
    sh("iptables-save 2>/dev/null; iptables-legacy-save 2>/dev/null; true")
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn a_node_serving_only_cluster_ips_leaves_netfilter_off_until_a_node_port_needs_masquerading() {
    run_isolated(
        "a_node_serving_only_cluster_ips_leaves_netfilter_off_until_a_node_port_needs_masquerading",
        |node| {
            let pods = standard_topology(3);
            start_servers(&pods[0]);
            start_servers(&pods[1]);
            // pod1 is this node's endpoint; pod2 stands for one on another node.
            let (local, remote) = (pods[0].ip, pods[1].ip);
            let inside = format!(
                "apiVersion: v1
kind: Service
metadata: {{name: inside, namespace: default}}
spec:
  clusterIP: {INSIDE}
  ports: [{{name: http, port: 80, targetPort: 8080, protocol: TCP}}]
---
{}",
                endpoint_slice(
                    "inside",
                    &format!(
                        "- {{addresses: [{local}], nodeName: {NODE_NAME}}}\n- {{addresses: [{remote}], nodeName: {OTHER_NODE}}}\n"
                    )
                )
            );
            write_manifests(&node.work.join("manifests"), &inside);
            let mut agent = start_agent(node);
            let cluster_ip = SocketAddrV4::new(INSIDE, 80);
            wait_serving(node, &[(Some("pod3"), cluster_ip)]);
            let backends = backends_of(Some("pod3"), cluster_ip, 40);
            assert_eq!(backends.len(), 2, "{backends:?}");
            // The programs translated and tracked 40 connections; netfilter saw
            // none of them: no rule of the agent's turned its tracking on.
            let rules = node_rules();
            assert!(
                !rules.contains("SWITCHYARD-"),
                "the agent installed netfilter rules no Service needs:\n{rules}"
            );
            assert_eq!(
                netfilter_tracked_connections(),
                0,
                "netfilter tracks the node's flows:\n{rules}"
            );

            // A NodePort whose only endpoint is remote: its flows must be
            // masqueraded, so the rule goes in (and netfilter's tracking with it).
            let outside = format!(
                "{inside}---
apiVersion: v1
kind: Service
metadata: {{name: outside, namespace: default}}
spec:
  type: NodePort
  clusterIP: {OUTSIDE}
  ports: [{{name: http, port: 80, targetPort: 8080, nodePort: {OUTSIDE_NODE_PORT}, protocol: TCP}}]
---
{}",
                endpoint_slice(
                    "outside",
                    &format!("- {{addresses: [{remote}], nodeName: {OTHER_NODE}}}\n")
                )
            );
            write_manifests(&node.work.join("manifests"), &outside);
            let node_port = SocketAddrV4::new(NODE_IP, OUTSIDE_NODE_PORT);
            wait_serving(node, &[(Some("client"), node_port)]);
            for result in tcp_requests_from(Some("client"), node_port, 20) {
                let answer = result.expect("request to the NodePort");
                assert_eq!(answer.backend, "pod2");
                assert_eq!(
                    answer.seen_client.ip(),
                    std::net::IpAddr::V4(NODE_IP),
                    "masqueraded to the node's address, so the reply comes back here"
                );
            }
            let rules = node_rules();
            assert!(
                rules.contains(&format!(
                    "-A SWITCHYARD-POSTROUTING -m mark --mark {MASQUERADE_MARK:#x}/{MASQUERADE_MARK:#x} -j MASQUERADE"
                )),
                "no masquerade rule:\n{rules}"
            );
            assert!(netfilter_tracked_connections() > 0);
            // ClusterIP traffic keeps working with the rule in place.
            assert_eq!(backends_of(Some("pod3"), cluster_ip, 20).len(), 2);
            let _ = agent.kill();
            let _ = agent.wait();
        },
    );
}
