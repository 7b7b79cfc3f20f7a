use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::v1beta1::{self, endpoint_slice_from_v1beta1};
use super::*;

fn service(yaml: &str) -> Service {
    serde_yaml::from_str(yaml).expect("test Service YAML is valid")
}

fn slice(yaml: &str) -> EndpointSlice {
    serde_yaml::from_str(yaml).expect("test EndpointSlice YAML is valid")
}

fn ip(text: &str) -> IpAddr {
    text.parse().expect("test address is valid")
}

fn convert(yaml: &str) -> Option<ServiceModel> {
    service_from_v1(&service(yaml)).expect("test Service converts")
}

#[test]
fn a_cluster_ip_service_with_tcp_and_udp_ports_keeps_both_ports() {
    let model = convert(
        r#"
metadata: {name: dns, namespace: kube-system}
spec:
  clusterIP: 10.96.0.10
  ports:
  - {name: dns, port: 53, protocol: UDP, targetPort: 53}
  - {name: dns-tcp, port: 53, protocol: TCP, targetPort: dns-tcp}
"#,
    )
    .expect("a ClusterIP Service is kept");
    assert_eq!(model.name, ServiceName::new("kube-system", "dns"));
    assert_eq!(model.cluster_ips, vec![ip("10.96.0.10")]);
    assert_eq!(
        model.ports,
        vec![
            ServicePortModel {
                name: "dns".into(),
                protocol: Protocol::Udp,
                port: 53,
                node_port: None,
                target_port: TargetPort::Number(53),
            },
            ServicePortModel {
                name: "dns-tcp".into(),
                protocol: Protocol::Tcp,
                port: 53,
                node_port: None,
                target_port: TargetPort::Name("dns-tcp".into()),
            },
        ]
    );
    assert_eq!(model.external_traffic_policy, TrafficPolicy::Cluster);
    assert_eq!(model.internal_traffic_policy, TrafficPolicy::Cluster);
    assert_eq!(model.session_affinity_timeout_seconds, None);
}

#[test]
fn a_service_without_namespace_lands_in_default_and_protocol_defaults_to_tcp() {
    let model = convert("metadata: {name: web}\nspec: {clusterIP: 10.96.0.5, ports: [{port: 80}]}")
        .expect("kept");
    assert_eq!(model.name, ServiceName::new("default", "web"));
    assert_eq!(model.ports[0].protocol, Protocol::Tcp);
    assert_eq!(model.ports[0].name, "");
    assert_eq!(model.ports[0].target_port, TargetPort::Number(80));
}

#[test]
fn headless_external_name_and_unallocated_services_are_ignored() {
    assert_eq!(
        convert("metadata: {name: h}\nspec: {clusterIP: None, ports: [{port: 80}]}"),
        None
    );
    assert_eq!(
        convert("metadata: {name: e}\nspec: {type: ExternalName, externalName: example.com}"),
        None
    );
    assert_eq!(
        convert("metadata: {name: u}\nspec: {ports: [{port: 80}]}"),
        None
    );
    assert_eq!(convert("metadata: {name: s}"), None);
}

#[test]
fn node_ports_count_only_for_node_port_and_load_balancer_services() {
    let node_port = convert(
        "metadata: {name: a}\nspec: {type: NodePort, clusterIP: 10.96.0.1, ports: [{port: 80, nodePort: 30080}]}",
    )
    .expect("kept");
    assert_eq!(node_port.ports[0].node_port, Some(30080));
    let cluster_ip = convert(
        "metadata: {name: a}\nspec: {type: ClusterIP, clusterIP: 10.96.0.1, ports: [{port: 80, nodePort: 30080}]}",
    )
    .expect("kept");
    assert_eq!(cluster_ip.ports[0].node_port, None);
}

#[test]
fn load_balancer_ingress_ips_are_used_except_hostnames_and_proxy_mode() {
    let model = convert(
        r#"
metadata: {name: lb}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.7
  externalIPs: [192.0.2.10]
  externalTrafficPolicy: Local
  ports: [{port: 443, nodePort: 30443}]
status:
  loadBalancer:
    ingress:
    - ip: 198.51.100.1
    - hostname: lb.example.com
    - {ip: 198.51.100.2, ipMode: Proxy}
    - {ip: 198.51.100.3, ipMode: VIP}
"#,
    )
    .expect("kept");
    assert_eq!(model.external_ips, vec![ip("192.0.2.10")]);
    assert_eq!(
        model.load_balancer_ips,
        vec![ip("198.51.100.1"), ip("198.51.100.3")]
    );
    assert_eq!(model.external_traffic_policy, TrafficPolicy::Local);
}

#[test]
fn load_balancer_status_of_a_non_load_balancer_service_is_ignored() {
    let model = convert(
        "metadata: {name: a}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\nstatus: {loadBalancer: {ingress: [{ip: 198.51.100.1}]}}",
    )
    .expect("kept");
    assert!(model.load_balancer_ips.is_empty());
}

#[test]
fn client_ip_affinity_defaults_to_three_hours_and_keeps_a_configured_timeout() {
    let default = convert(
        "metadata: {name: a}\nspec: {clusterIP: 10.96.0.1, sessionAffinity: ClientIP, ports: [{port: 80}]}",
    )
    .expect("kept");
    assert_eq!(default.session_affinity_timeout_seconds, Some(10_800));
    let configured = convert(
        "metadata: {name: a}\nspec: {clusterIP: 10.96.0.1, sessionAffinity: ClientIP, sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}, ports: [{port: 80}]}",
    )
    .expect("kept");
    assert_eq!(configured.session_affinity_timeout_seconds, Some(60));
}

#[test]
fn internal_traffic_policy_local_is_read() {
    let model = convert(
        "metadata: {name: a}\nspec: {clusterIP: 10.96.0.1, internalTrafficPolicy: Local, ports: [{port: 80}]}",
    )
    .expect("kept");
    assert_eq!(model.internal_traffic_policy, TrafficPolicy::Local);
}

#[test]
fn dual_stack_cluster_ips_give_both_families() {
    let model = convert(
        "metadata: {name: a}\nspec: {clusterIP: 10.96.0.1, clusterIPs: [10.96.0.1, 'fd00::1'], ports: [{port: 80}]}",
    )
    .expect("kept");
    assert_eq!(model.cluster_ips, vec![ip("10.96.0.1"), ip("fd00::1")]);
    assert_eq!(
        model.families(),
        vec![AddressFamily::Ipv4, AddressFamily::Ipv6]
    );
}

#[test]
fn sctp_ports_are_skipped_but_the_service_is_kept() {
    let model = convert(
        "metadata: {name: a}\nspec: {clusterIP: 10.96.0.1, ports: [{name: s, port: 9, protocol: SCTP}, {name: t, port: 80}]}",
    )
    .expect("kept");
    assert_eq!(model.ports.len(), 1);
    assert_eq!(model.ports[0].name, "t");
}

#[test]
fn invalid_fields_are_reported_by_their_path() {
    let cases = [
        (
            "metadata: {name: a}\nspec: {clusterIP: 10.96.0.300, ports: [{port: 80}]}",
            "spec.clusterIP",
        ),
        (
            "metadata: {name: a}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}, {port: 70000}]}",
            "spec.ports[1].port",
        ),
        (
            "metadata: {name: a}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80, protocol: ICMP}]}",
            "spec.ports[0].protocol",
        ),
        (
            "metadata: {name: a}\nspec: {clusterIP: 10.96.0.1, externalIPs: [1.2.3.4, nope], ports: [{port: 80}]}",
            "spec.externalIPs[1]",
        ),
        (
            "metadata: {name: a}\nspec: {clusterIP: 10.96.0.1, externalTrafficPolicy: Sometimes, ports: [{port: 80}]}",
            "spec.externalTrafficPolicy",
        ),
        (
            "metadata: {name: a}\nspec: {clusterIP: 10.96.0.1, sessionAffinity: ClientIP, sessionAffinityConfig: {clientIP: {timeoutSeconds: 0}}, ports: [{port: 80}]}",
            "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
        ),
        ("metadata: {namespace: x}\nspec: {clusterIP: 10.96.0.1}", "metadata.name"),
    ];
    for (yaml, field) in cases {
        let error = service_from_v1(&service(yaml)).expect_err(yaml);
        assert_eq!(error.field, field, "{yaml}");
    }
}

const V1_SLICE: &str = r#"
metadata:
  name: web-abc
  namespace: shop
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports:
- {name: http, port: 8080, protocol: TCP}
- {name: metrics, port: 9090}
- {name: sctp, port: 7, protocol: SCTP}
endpoints:
- addresses: [10.0.1.5]
  conditions: {ready: true}
  nodeName: node-a
- addresses: [10.0.2.5]
  conditions: {ready: false, serving: true, terminating: true}
  nodeName: node-b
- addresses: [10.0.3.5]
- addresses: [10.0.4.5, 10.0.4.6]
  conditions: {ready: false}
  deprecatedTopology: {kubernetes.io/hostname: node-c}
- addresses: []
"#;

#[test]
fn a_v1_slice_keeps_ports_conditions_and_nodes() {
    let model = endpoint_slice_from_v1(&slice(V1_SLICE))
        .expect("converts")
        .expect("kept");
    assert_eq!(model.service, ServiceName::new("shop", "web"));
    assert_eq!(model.slice_name, ServiceName::new("shop", "web-abc"));
    assert_eq!(model.family, AddressFamily::Ipv4);
    assert_eq!(
        model.ports,
        vec![
            EndpointPortModel {
                name: "http".into(),
                protocol: Protocol::Tcp,
                port: 8080
            },
            EndpointPortModel {
                name: "metrics".into(),
                protocol: Protocol::Tcp,
                port: 9090
            },
        ]
    );
    assert_eq!(
        model.endpoints,
        vec![
            EndpointModel {
                address: ip("10.0.1.5"),
                ready: true,
                serving: true,
                terminating: false,
                node_name: Some("node-a".into()),
                hints: Default::default(),
            },
            EndpointModel {
                address: ip("10.0.2.5"),
                ready: false,
                serving: true,
                terminating: true,
                node_name: Some("node-b".into()),
                hints: Default::default(),
            },
            // Unknown conditions are ready, as the API documents.
            EndpointModel {
                address: ip("10.0.3.5"),
                ready: true,
                serving: true,
                terminating: false,
                node_name: None,
                hints: Default::default(),
            },
            // Only the first address counts; unknown serving follows ready.
            EndpointModel {
                address: ip("10.0.4.5"),
                ready: false,
                serving: false,
                terminating: false,
                node_name: Some("node-c".into()),
                hints: Default::default(),
            },
        ]
    );
}

#[test]
fn slices_without_a_service_label_or_with_fqdn_addresses_are_ignored() {
    let unlabelled = slice("metadata: {name: x}\naddressType: IPv4\nendpoints: []");
    assert_eq!(endpoint_slice_from_v1(&unlabelled).expect("converts"), None);
    let fqdn = slice(
        "metadata: {name: x, labels: {kubernetes.io/service-name: web}}\naddressType: FQDN\nendpoints: [{addresses: [example.com]}]",
    );
    assert_eq!(endpoint_slice_from_v1(&fqdn).expect("converts"), None);
}

#[test]
fn an_endpoint_of_the_wrong_family_is_reported_by_its_path() {
    let mixed = slice(
        "metadata: {name: x, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nendpoints: [{addresses: [10.0.0.1]}, {addresses: ['fd00::5']}]",
    );
    let error = endpoint_slice_from_v1(&mixed).expect_err("wrong family");
    assert_eq!(error.field, "endpoints[1].addresses[0]");
}

#[test]
fn a_v1beta1_slice_takes_the_node_from_the_hostname_topology() {
    let beta: v1beta1::EndpointSlice = serde_yaml::from_str(
        r#"
apiVersion: discovery.k8s.io/v1beta1
kind: EndpointSlice
metadata:
  name: web-xyz
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.0.1.5]
  conditions: {ready: true}
  topology: {kubernetes.io/hostname: node-a, topology.kubernetes.io/zone: z1}
- addresses: [10.0.1.6]
  conditions: {ready: false, serving: true, terminating: true}
  nodeName: node-b
  topology: {kubernetes.io/hostname: ignored-when-node-name-is-set}
"#,
    )
    .expect("v1beta1 YAML parses");
    let model = endpoint_slice_from_v1beta1(&beta)
        .expect("converts")
        .expect("kept");
    assert_eq!(model.service, ServiceName::new("default", "web"));
    assert_eq!(model.endpoints[0].node_name.as_deref(), Some("node-a"));
    assert_eq!(model.endpoints[1].node_name.as_deref(), Some("node-b"));
    assert!(model.endpoints[1].terminating);
    assert_eq!(model.ports[0].port, 8080);
}

fn slice_with_annotations(annotations: &str) -> EndpointSliceModel {
    let text = format!(
        "metadata: {{name: web-1, namespace: default, labels: {{kubernetes.io/service-name: web}}, annotations: {annotations}}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints: [{{addresses: [10.244.0.11]}}]
"
    );
    endpoint_slice_from_v1(&slice(&text))
        .expect("converts")
        .expect("is used")
}

#[test]
fn the_last_change_trigger_time_is_read_to_the_nanosecond_as_the_endpoint_slice_controller_writes_it(
) {
    let model = slice_with_annotations(
        "{endpoints.kubernetes.io/last-change-trigger-time: \"2026-11-28T12:00:01.123456789Z\"}",
    );
    let expected = std::time::UNIX_EPOCH + std::time::Duration::new(1_795_867_201, 123_456_789);
    assert_eq!(model.last_change_trigger_time, Some(expected));
    // Whole seconds (RFC 3339 without a fraction) too.
    let whole = slice_with_annotations(
        "{endpoints.kubernetes.io/last-change-trigger-time: \"2026-11-28T12:00:01Z\"}",
    );
    assert_eq!(
        whole.last_change_trigger_time,
        Some(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_795_867_201))
    );
}

#[test]
fn a_missing_or_malformed_trigger_time_is_no_time_and_the_slice_is_still_used() {
    assert_eq!(slice_with_annotations("{}").last_change_trigger_time, None);
    assert_eq!(
        slice_with_annotations("{endpoints.kubernetes.io/last-change-trigger-time: yesterday}")
            .last_change_trigger_time,
        None
    );
}
