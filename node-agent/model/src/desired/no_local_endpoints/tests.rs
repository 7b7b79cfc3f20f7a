//! kube-proxy's no-local-endpoints count, from Service and EndpointSlice objects.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::{no_local_endpoints, NoLocalEndpoints};
use crate::desired::NodeView;
use crate::model::{endpoint_slice_from_v1, service_from_v1, AddressFamily};

const NODE: &str = "node-a";

fn node() -> NodeView {
    NodeView {
        name: NODE.to_string(),
        addresses: vec!["192.168.1.10".parse().expect("valid")],
        zone: None,
    }
}

/// One endpoint of the slice, as a YAML list item.
fn endpoint(address: &str, node_name: &str, ready: bool, terminating: bool) -> String {
    format!(
        "
  - addresses: [{address}]
    nodeName: {node_name}
    conditions: {{ready: {ready}, serving: true, terminating: {terminating}}}"
    )
}

/// The count for a Service whose `spec` lines are `spec` (indented by two), with one slice
/// listing `endpoints` on ports `http` and `metrics`.
fn count(spec: &str, endpoints: &[String]) -> NoLocalEndpoints {
    let service: Service = serde_yaml::from_str(&format!(
        "metadata: {{name: web, namespace: default}}
spec:
  clusterIP: 10.96.0.10
{spec}"
    ))
    .expect("a valid Service");
    let endpoints = if endpoints.is_empty() {
        " []".to_string()
    } else {
        endpoints.concat()
    };
    let slice: EndpointSlice = serde_yaml::from_str(&format!(
        "metadata: {{name: web-1, namespace: default, labels: {{kubernetes.io/service-name: web}}}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}, {{name: metrics, port: 9090, protocol: TCP}}]
endpoints:{endpoints}"
    ))
    .expect("a valid EndpointSlice");
    let service = service_from_v1(&service)
        .expect("converts")
        .expect("served");
    let slice = endpoint_slice_from_v1(&slice)
        .expect("converts")
        .expect("used");
    no_local_endpoints(&service, &[&slice], &node(), AddressFamily::Ipv4)
}

const INTERNAL_LOCAL: &str = "  internalTrafficPolicy: Local
  ports: [{name: http, port: 80, targetPort: 8080}]";

const EXTERNAL_LOCAL_NODE_PORT: &str = "  type: NodePort
  externalTrafficPolicy: Local
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080}]";

fn remote() -> String {
    endpoint("10.244.1.5", "node-b", true, false)
}

fn local() -> String {
    endpoint("10.244.0.5", NODE, true, false)
}

#[test]
fn an_internal_local_service_with_only_a_remote_endpoint_counts_and_with_a_local_one_does_not() {
    assert_eq!(
        count(INTERNAL_LOCAL, &[remote()]),
        NoLocalEndpoints {
            internal: 1,
            external: 0
        }
    );
    // The control: the same Service with an endpoint on this node.
    assert!(count(INTERNAL_LOCAL, &[remote(), local()]).is_zero());
}

#[test]
fn an_external_local_node_port_with_only_a_remote_endpoint_counts_and_with_a_local_one_does_not() {
    assert_eq!(
        count(EXTERNAL_LOCAL_NODE_PORT, &[remote()]),
        NoLocalEndpoints {
            internal: 0,
            external: 1
        }
    );
    assert!(count(EXTERNAL_LOCAL_NODE_PORT, &[local()]).is_zero());
}

#[test]
fn both_policies_local_count_once_each() {
    let spec = "  type: NodePort
  externalTrafficPolicy: Local
  internalTrafficPolicy: Local
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080}]";
    assert_eq!(
        count(spec, &[remote()]),
        NoLocalEndpoints {
            internal: 1,
            external: 1
        }
    );
}

#[test]
fn a_service_without_any_endpoint_is_not_counted_as_kube_proxy_rejects_it_instead() {
    assert!(count(INTERNAL_LOCAL, &[]).is_zero());
    // Not ready and not terminating is no endpoint either.
    let unready = endpoint("10.244.1.5", "node-b", false, false);
    assert!(count(INTERNAL_LOCAL, &[unready]).is_zero());
    // The control: a serving terminating endpoint elsewhere is one.
    let terminating = endpoint("10.244.1.5", "node-b", false, true);
    assert_eq!(count(INTERNAL_LOCAL, &[terminating]).internal, 1);
}

#[test]
fn a_serving_terminating_local_endpoint_is_a_local_endpoint() {
    let terminating_here = endpoint("10.244.0.5", NODE, false, true);
    assert!(count(INTERNAL_LOCAL, &[remote(), terminating_here]).is_zero());
}

#[test]
fn cluster_policies_are_never_counted() {
    let spec = "  type: NodePort
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080}]";
    assert!(count(spec, &[remote()]).is_zero());
}

#[test]
fn an_external_local_policy_counts_only_on_a_service_reachable_from_outside() {
    // A ClusterIP Service keeps no external address: its external policy means nothing.
    let cluster_ip_only = "  externalTrafficPolicy: Local
  ports: [{name: http, port: 80, targetPort: 8080}]";
    assert!(count(cluster_ip_only, &[remote()]).is_zero());
    // The control: the same Service with an external IP is reachable from outside.
    let with_external_ip = "  externalTrafficPolicy: Local
  externalIPs: [203.0.113.5]
  ports: [{name: http, port: 80, targetPort: 8080}]";
    assert_eq!(count(with_external_ip, &[remote()]).external, 1);
}

#[test]
fn each_service_port_is_counted() {
    let spec = "  internalTrafficPolicy: Local
  ports: [{name: http, port: 80, targetPort: 8080}, {name: metrics, port: 9090, targetPort: 9090}]";
    assert_eq!(count(spec, &[remote()]).internal, 2);
}

#[test]
fn a_service_counts_only_in_the_family_of_its_cluster_ips() {
    let service: Service = serde_yaml::from_str(
        "metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  internalTrafficPolicy: Local
  ports: [{name: http, port: 80, targetPort: 8080}]",
    )
    .expect("a valid Service");
    let slice: EndpointSlice = serde_yaml::from_str(&format!(
        "metadata: {{name: web-1, namespace: default, labels: {{kubernetes.io/service-name: web}}}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints:{}",
        remote()
    ))
    .expect("a valid EndpointSlice");
    let service = service_from_v1(&service)
        .expect("converts")
        .expect("served");
    let slice = endpoint_slice_from_v1(&slice)
        .expect("converts")
        .expect("used");
    let in_family = |family| no_local_endpoints(&service, &[&slice], &node(), family);
    assert!(in_family(AddressFamily::Ipv6).is_zero());
    assert_eq!(in_family(AddressFamily::Ipv4).internal, 1);
}

#[test]
fn counts_add_up_by_policy() {
    let mut total = NoLocalEndpoints::default();
    total += NoLocalEndpoints {
        internal: 1,
        external: 2,
    };
    total += NoLocalEndpoints {
        internal: 3,
        external: 0,
    };
    assert_eq!(
        total,
        NoLocalEndpoints {
            internal: 4,
            external: 2
        }
    );
}
