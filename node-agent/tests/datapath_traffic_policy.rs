//! `externalTrafficPolicy: Local` end to end, from Service and EndpointSlice
//! manifests through the real binary (`switchyard-agent standalone`) with its
//! default settings, socket hooks and pods' connect-time balancing included:
//! clients outside the node reach only the node's own endpoint, as with
//! kube-proxy, while the node's pods reach every endpoint; without a local
//! endpoint, outside traffic is dropped (kube-proxy's KUBE-XLB drop), not
//! refused.

mod datapath_support;

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, SocketAddrV4},
    path::Path,
    process::{Child, Command},
    time::Duration,
};

use datapath_support::*;

const NODE_NAME: &str = "node-a";
const OTHER_NODE: &str = "node-b";
const LOCAL_WEB: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 50);
const CLUSTER_WEB: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 51);
const REMOTE_WEB: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 52);
const EMPTY_WEB: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 53);
const LOCAL_WEB_NODE_PORT: u16 = 30050;
const CLUSTER_WEB_NODE_PORT: u16 = 30051;
const REMOTE_WEB_NODE_PORT: u16 = 30052;
const EMPTY_WEB_NODE_PORT: u16 = 30053;

/// The standalone agent as a user starts it: `datapath_support`'s start
/// switches pods' connect-time balancing off (those tests look at what the TC
/// programs do), this one keeps the default.
fn start_agent_with_default_balancing(node: &Node) -> Child {
    let log = std::fs::File::create(node.work.join("agent.log")).expect("agent log");
    let error_log = log.try_clone().expect("agent log");
    let socket_hooks: Vec<std::ffi::OsString> = match &node.cgroup {
        Some(cgroup) => vec!["--cgroup".into(), cgroup.into()],
        None => vec!["--no-socket-hooks".into()],
    };
    Command::new(env!("CARGO_BIN_EXE_switchyard-agent"))
        .args(["standalone", "--manifests"])
        .arg(node.work.join("manifests"))
        .args([
            "--pod-interfaces",
            "veth-*",
            "--host-interfaces",
            "ext0",
            "--node-ip",
            "192.168.50.1",
            "--node-name",
            NODE_NAME,
            "--min-sync-period-ms",
            "100",
            "--bpf-pin-dir",
        ])
        .arg(&node.pin_directory)
        .args(socket_hooks)
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(error_log)
        .spawn()
        .expect("start switchyard-agent")
}

fn write_manifests(directory: &Path, text: &str) {
    std::fs::create_dir_all(directory).expect("manifest directory");
    std::fs::write(directory.join("services.yaml"), text).expect("write manifests");
}

/// A NodePort Service `name` with `policy`, and its slice with `endpoints`
/// (YAML list items, one per line).
fn node_port_service(
    name: &str,
    cluster_ip: Ipv4Addr,
    node_port: u16,
    policy: &str,
    endpoints: &str,
) -> String {
    format!(
        "apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: default}}
spec:
  type: NodePort
  clusterIP: {cluster_ip}
  externalTrafficPolicy: {policy}
  ports: [{{name: http, port: 80, targetPort: 8080, nodePort: {node_port}, protocol: TCP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: {name}-1, namespace: default, labels: {{kubernetes.io/service-name: {name}}}}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints:{endpoints}
---
"
    )
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

/// The endpoint list items: pod `local` on this node, `remote` declared on
/// another (reachable, as a remote pod would be).
fn local_and_remote(local: Ipv4Addr, remote: Ipv4Addr) -> String {
    format!(
        "\n- {{addresses: [{local}], nodeName: {NODE_NAME}}}\n- {{addresses: [{remote}], nodeName: {OTHER_NODE}}}\n"
    )
}

/// Waits until each client reaches each address, and until the agent says its
/// socket hooks are attached (they come after the TC programs: a client that
/// is answered by TC alone before then proves nothing about them).
fn wait_serving(node: &Node, targets: &[(&'static str, SocketAddrV4)]) {
    let targets = targets.to_vec();
    let serving = wait_until(Duration::from_secs(20), || {
        agent_log(node).contains("socket hooks attached")
            && targets.iter().all(|(namespace, address)| {
                let address = *address;
                in_namespace(Some(namespace), move || {
                    tcp_request(address, Duration::from_millis(300)).is_ok()
                })
                .join()
                .unwrap_or(false)
            })
    });
    assert!(serving, "the agent never served:\n{}", agent_log(node));
}

/// A connect from `namespace` to `address` with a deadline: how it ended.
fn connect_outcome(
    namespace: &'static str,
    address: SocketAddrV4,
    deadline: Duration,
) -> std::io::Result<()> {
    in_namespace(Some(namespace), move || {
        std::net::TcpStream::connect_timeout(&address.into(), deadline).map(|_| ())
    })
    .join()
    .expect("client")
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn a_local_policy_node_port_sends_outside_clients_only_to_the_local_endpoint_with_default_settings()
{
    run_isolated(
        "a_local_policy_node_port_sends_outside_clients_only_to_the_local_endpoint_with_default_settings",
        |node| {
            let pods = standard_topology(3);
            start_servers(&pods[0]);
            start_servers(&pods[1]);
            let endpoints = local_and_remote(pods[0].ip, pods[1].ip);
            let manifests = format!(
                "{}{}",
                node_port_service("local-web", LOCAL_WEB, LOCAL_WEB_NODE_PORT, "Local", &endpoints),
                node_port_service(
                    "cluster-web",
                    CLUSTER_WEB,
                    CLUSTER_WEB_NODE_PORT,
                    "Cluster",
                    &endpoints
                ),
            );
            write_manifests(&node.work.join("manifests"), &manifests);
            let mut agent = start_agent_with_default_balancing(node);
            let local_node_port = SocketAddrV4::new(NODE_IP, LOCAL_WEB_NODE_PORT);
            let cluster_node_port = SocketAddrV4::new(NODE_IP, CLUSTER_WEB_NODE_PORT);
            wait_serving(
                node,
                &[
                    ("client", local_node_port),
                    ("client", cluster_node_port),
                    ("pod3", local_node_port),
                ],
            );

            // From outside: the local endpoint only, every time.
            let outside = backends_of(Some("client"), local_node_port, 60);
            assert_eq!(
                outside.keys().collect::<Vec<_>>(),
                vec!["pod1"],
                "outside -> Local NodePort: {outside:?}"
            );
            // ... and it sees the client's own address (no masquerade).
            for answer in tcp_requests_from(Some("client"), local_node_port, 10) {
                let answer = answer.expect("answered");
                assert_eq!(answer.seen_client.ip(), std::net::IpAddr::V4(CLIENT_IP));
            }
            // The control: the same endpoints under a Cluster policy are both used
            // from outside, so the restriction above is the policy's doing.
            let cluster = backends_of(Some("client"), cluster_node_port, 60);
            assert_eq!(cluster.len(), 2, "outside -> Cluster NodePort: {cluster:?}");
            // The node's pods reach every endpoint through the same NodePort
            // (kube-proxy's short-circuit of pod traffic to external destinations).
            let from_pod = backends_of(Some("pod3"), local_node_port, 60);
            assert_eq!(from_pod.len(), 2, "pod -> Local NodePort: {from_pod:?}");
            let _ = agent.kill();
            let _ = agent.wait();
        },
    );
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn a_local_policy_node_port_without_a_local_endpoint_drops_outside_clients_and_serves_pods() {
    run_isolated(
        "a_local_policy_node_port_without_a_local_endpoint_drops_outside_clients_and_serves_pods",
        |node| {
            let pods = standard_topology(3);
            start_servers(&pods[0]);
            start_servers(&pods[1]);
            let remote_only = format!(
                "\n- {{addresses: [{}], nodeName: {OTHER_NODE}}}\n",
                pods[1].ip
            );
            let manifests = format!(
                "{}{}{}",
                node_port_service(
                    "local-web",
                    LOCAL_WEB,
                    LOCAL_WEB_NODE_PORT,
                    "Local",
                    &local_and_remote(pods[0].ip, pods[1].ip)
                ),
                node_port_service(
                    "remote-web",
                    REMOTE_WEB,
                    REMOTE_WEB_NODE_PORT,
                    "Local",
                    &remote_only
                ),
                node_port_service("empty-web", EMPTY_WEB, EMPTY_WEB_NODE_PORT, "Local", " []"),
            );
            write_manifests(&node.work.join("manifests"), &manifests);
            let mut agent = start_agent_with_default_balancing(node);
            let local_node_port = SocketAddrV4::new(NODE_IP, LOCAL_WEB_NODE_PORT);
            let remote_node_port = SocketAddrV4::new(NODE_IP, REMOTE_WEB_NODE_PORT);
            let empty_node_port = SocketAddrV4::new(NODE_IP, EMPTY_WEB_NODE_PORT);
            // The controls first: the outside client is served through a Local
            // NodePort with a local endpoint, and the node's pods through the one
            // without (its remote endpoint).
            wait_serving(
                node,
                &[("client", local_node_port), ("pod3", remote_node_port)],
            );
            let from_pod = backends_of(Some("pod3"), remote_node_port, 20);
            assert_eq!(
                from_pod.keys().collect::<Vec<_>>(),
                vec!["pod2"],
                "{from_pod:?}"
            );

            // No local endpoint, endpoints elsewhere: no answer at all (a load
            // balancer's client retries), where a refusal would come within
            // milliseconds.
            let dropped = connect_outcome("client", remote_node_port, Duration::from_secs(2));
            let error =
                dropped.expect_err("connected through a Local NodePort without a local endpoint");
            assert_eq!(error.kind(), std::io::ErrorKind::TimedOut, "{error}");
            // No endpoint at all: refused at once, as kube-proxy rejects.
            let refused = connect_outcome("client", empty_node_port, Duration::from_secs(2));
            let error = refused.expect_err("connected to a Service without endpoints");
            assert_eq!(
                error.kind(),
                std::io::ErrorKind::ConnectionRefused,
                "{error}"
            );
            let _ = agent.kill();
            let _ = agent.wait();
        },
    );
}
