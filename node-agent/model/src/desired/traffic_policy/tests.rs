//! `externalTrafficPolicy: Local`'s flags, from Service and EndpointSlice
//! objects to laid-out map entries.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use switchyard_common::{
    FrontendKey, FrontendValue, FRONTEND_FLAG_DROP_WITHOUT_BACKENDS,
    FRONTEND_FLAG_NO_POD_CONNECT_BALANCING, SCOPE_EXTERNAL, SCOPE_INTERNAL,
};

use super::super::{frontend_key, lay_out, service_desired, NodeView};
use crate::desired::merge;
use crate::maps::MapState;
use crate::model::{endpoint_slice_from_v1, service_from_v1, Protocol};

const NODE: &str = "node-a";
const CLUSTER_IP: &str = "10.96.0.10";
const NODE_IP: &str = "192.168.1.10";
const EXTERNAL_IP: &str = "203.0.113.5";
const LOAD_BALANCER_IP: &str = "198.51.100.7";
const NODE_PORT: u16 = 30080;

fn node() -> NodeView {
    NodeView {
        name: NODE.to_string(),
        addresses: vec![NODE_IP.parse().expect("valid")],
        zone: None,
    }
}

/// A LoadBalancer Service with a NodePort, an external IP and a load-balancer
/// IP, under `policy`; `endpoints` are YAML list items of its slice.
fn entries(
    policy: &str,
    endpoints: &str,
) -> std::collections::BTreeMap<FrontendKey, FrontendValue> {
    let service: Service = serde_yaml::from_str(&format!(
        "metadata: {{name: web, namespace: default}}
spec:
  type: LoadBalancer
  clusterIP: {CLUSTER_IP}
  externalIPs: [{EXTERNAL_IP}]
  externalTrafficPolicy: {policy}
  ports: [{{name: http, port: 80, targetPort: 8080, nodePort: {NODE_PORT}}}]
status:
  loadBalancer: {{ingress: [{{ip: {LOAD_BALANCER_IP}}}]}}
"
    ))
    .expect("a valid Service");
    let slice: EndpointSlice = serde_yaml::from_str(&format!(
        "metadata: {{name: web-1, namespace: default, labels: {{kubernetes.io/service-name: web}}}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints:{endpoints}"
    ))
    .expect("a valid EndpointSlice");
    let service = service_from_v1(&service)
        .expect("converts")
        .expect("served");
    let slice = endpoint_slice_from_v1(&slice)
        .expect("converts")
        .expect("used");
    let share = service_desired(&service, &[&slice], &node());
    lay_out(&merge([&share]), &MapState::default()).frontends
}

fn key(address: &str, port: u16, scope: u8) -> FrontendKey {
    frontend_key(&address.parse().expect("valid"), port, Protocol::Tcp, scope)
}

/// The external addresses of the Service, each with its port.
fn external_addresses() -> [(&'static str, u16); 3] {
    [
        (NODE_IP, NODE_PORT),
        (EXTERNAL_IP, 80),
        (LOAD_BALANCER_IP, 80),
    ]
}

const LOCAL_AND_REMOTE: &str = "
- {addresses: [10.0.0.1], nodeName: node-a}
- {addresses: [10.0.0.2], nodeName: node-b}
";
const REMOTE_ONLY: &str = "
- {addresses: [10.0.0.2], nodeName: node-b}
";

#[test]
fn a_local_policy_leaves_pods_connects_to_its_external_addresses_to_tc_and_a_cluster_policy_does_not(
) {
    let local = entries("Local", LOCAL_AND_REMOTE);
    for (address, port) in external_addresses() {
        let twin = local[&key(address, port, SCOPE_INTERNAL)];
        assert_ne!(
            twin.flags & FRONTEND_FLAG_NO_POD_CONNECT_BALANCING,
            0,
            "{address}:{port} internal"
        );
        assert_eq!(twin.backend_count, 2, "pods reach every endpoint");
        let outside = local[&key(address, port, SCOPE_EXTERNAL)];
        assert_eq!(
            outside.flags & FRONTEND_FLAG_NO_POD_CONNECT_BALANCING,
            0,
            "{address}:{port} external"
        );
        assert_eq!(outside.backend_count, 1, "outside: the local endpoint");
    }
    // The ClusterIP is the same from any namespace: pods keep their connect-time
    // balancing there, and under a Cluster policy everywhere.
    assert_eq!(
        local[&key(CLUSTER_IP, 80, SCOPE_INTERNAL)].flags & FRONTEND_FLAG_NO_POD_CONNECT_BALANCING,
        0
    );
    let cluster = entries("Cluster", LOCAL_AND_REMOTE);
    assert_eq!(cluster.len(), 7);
    assert!(cluster
        .values()
        .all(|value| value.flags & FRONTEND_FLAG_NO_POD_CONNECT_BALANCING == 0));
}

#[test]
fn a_local_policy_without_a_local_endpoint_drops_outside_traffic_while_endpoints_exist_elsewhere() {
    let remote_only = entries("Local", REMOTE_ONLY);
    for (address, port) in external_addresses() {
        let outside = remote_only[&key(address, port, SCOPE_EXTERNAL)];
        assert_eq!(outside.backend_count, 0);
        assert_ne!(
            outside.flags & FRONTEND_FLAG_DROP_WITHOUT_BACKENDS,
            0,
            "{address}:{port}"
        );
        // The node's pods still reach the remote endpoint.
        let twin = remote_only[&key(address, port, SCOPE_INTERNAL)];
        assert_eq!(twin.backend_count, 1);
        assert_eq!(twin.flags & FRONTEND_FLAG_DROP_WITHOUT_BACKENDS, 0);
    }
    // The controls: with a local endpoint nothing is dropped; without any
    // endpoint at all, or only unready ones, kube-proxy rejects, so the agent
    // refuses; a Cluster policy never drops.
    let unready_elsewhere = "
- {addresses: [10.0.0.2], nodeName: node-b, conditions: {ready: false}}
";
    let serving_terminating_here = "
- {addresses: [10.0.0.1], nodeName: node-a, conditions: {ready: false, serving: true, terminating: true}}
- {addresses: [10.0.0.2], nodeName: node-b}
";
    for (policy, endpoints, backends) in [
        ("Local", LOCAL_AND_REMOTE, 1),
        ("Local", " []", 0),
        ("Local", unready_elsewhere, 0),
        ("Local", serving_terminating_here, 1),
        ("Cluster", " []", 0),
    ] {
        let frontends = entries(policy, endpoints);
        for (address, port) in external_addresses() {
            let outside = frontends[&key(address, port, SCOPE_EXTERNAL)];
            assert_eq!(outside.backend_count, backends, "{policy} {endpoints}");
            assert_eq!(
                outside.flags & FRONTEND_FLAG_DROP_WITHOUT_BACKENDS,
                0,
                "{policy} {endpoints} {address}:{port}"
            );
        }
    }
}
