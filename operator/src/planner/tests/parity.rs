//! The parity preflight: which Services the eBPF datapath does not serve yet (one test per
//! feature, each with a control the datapath serves), the refusal before any node is activated
//! and the transition once they are gone, the condition and the warnings while eBPF serves, and
//! a return to kube-proxy never held.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use switchyard_crds::{
    condition_types as types, reasons, ConditionStatus,
    DataplaneMode::{Ebpf, KubeProxy},
    DataplanePhase,
};

use super::super::parity::SERVICE_PROXY_NAME_LABEL;
use super::super::*;
use super::fixtures::*;
use super::three_kube_proxy_nodes;
use UnsupportedFeature::{Ipv6, SctpPorts};

/// A ClusterIP Service with one TCP port at an IPv4 cluster IP, as a 1.20 API server fills it.
fn service(name: &str) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("shop".into()),
            uid: Some(format!("uid-{name}")),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            cluster_ip: Some("10.96.0.20".into()),
            cluster_ips: Some(vec!["10.96.0.20".into()]),
            ip_families: Some(vec!["IPv4".into()]),
            ip_family_policy: Some("SingleStack".into()),
            ports: Some(vec![port("http", "TCP")]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

fn port(name: &str, protocol: &str) -> ServicePort {
    ServicePort {
        name: Some(name.into()),
        port: 80,
        protocol: Some(protocol.into()),
        ..ServicePort::default()
    }
}

fn spec(service: &mut Service) -> &mut ServiceSpec {
    service.spec.as_mut().expect("a spec")
}

fn features(service: &Service) -> Vec<UnsupportedFeature> {
    UnsupportedService::of(service).map_or_else(Vec::new, |found| found.features)
}

fn load_balancer(ranges: &[&str]) -> Service {
    let mut service = service("lb");
    spec(&mut service).type_ = Some("LoadBalancer".into());
    spec(&mut service).load_balancer_source_ranges =
        Some(ranges.iter().map(|range| (*range).to_owned()).collect());
    service
}

#[test]
fn an_sctp_port_is_unsupported_and_tcp_and_udp_ports_are_not() {
    let mut served = service("dns");
    spec(&mut served).ports = Some(vec![port("tcp", "TCP"), port("udp", "UDP")]);
    assert_eq!(UnsupportedService::of(&served), None);

    let mut sctp = served.clone();
    spec(&mut sctp)
        .ports
        .get_or_insert_with(Vec::new)
        .push(port("sctp", "SCTP"));
    assert_eq!(
        UnsupportedService::of(&sctp),
        Some(UnsupportedService {
            namespace: "shop".into(),
            name: "dns".into(),
            uid: Some("uid-dns".into()),
            features: vec![SctpPorts],
        })
    );
}

#[test]
fn an_ipv6_or_dual_stack_service_is_unsupported_and_an_ipv4_one_is_not() {
    let ipv4 = service("web");
    assert_eq!(features(&ipv4), []);
    let mut prefers_dual_stack_in_an_ipv4_cluster = ipv4.clone();
    spec(&mut prefers_dual_stack_in_an_ipv4_cluster).ip_family_policy =
        Some("PreferDualStack".into());
    assert_eq!(
        features(&prefers_dual_stack_in_an_ipv4_cluster),
        [],
        "one family: IPv4 only"
    );

    let mut ipv6 = ipv4.clone();
    spec(&mut ipv6).ip_families = Some(vec!["IPv6".into()]);
    spec(&mut ipv6).cluster_ip = Some("fd00:10:96::20".into());
    spec(&mut ipv6).cluster_ips = Some(vec!["fd00:10:96::20".into()]);
    assert_eq!(features(&ipv6), [Ipv6]);

    for policy in ["RequireDualStack", "PreferDualStack"] {
        let mut dual_stack = ipv4.clone();
        spec(&mut dual_stack).ip_family_policy = Some(policy.into());
        spec(&mut dual_stack).ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
        spec(&mut dual_stack).cluster_ips =
            Some(vec!["10.96.0.20".into(), "fd00:10:96::20".into()]);
        assert_eq!(features(&dual_stack), [Ipv6], "{policy}");
    }

    // An API server that fills no ipFamilies: the addresses say it.
    let mut address_only = ipv4.clone();
    spec(&mut address_only).ip_families = None;
    spec(&mut address_only).cluster_ips = None;
    assert_eq!(features(&address_only), [], "control: an IPv4 address");
    spec(&mut address_only).cluster_ip = Some("fd00:10:96::20".into());
    assert_eq!(features(&address_only), [Ipv6]);
    spec(&mut address_only).cluster_ip = Some("10.96.0.20".into());
    spec(&mut address_only).cluster_ips = Some(vec!["10.96.0.20".into(), "fd00::20".into()]);
    assert_eq!(features(&address_only), [Ipv6]);
}

#[test]
fn a_load_balancer_with_source_ranges_is_served_and_never_refused() {
    // The datapath filters sources itself (docs/parity.md row 32): no range, blank, open,
    // restricting or unparsable, keeps a LoadBalancer from a transition.
    for ranges in [
        &[][..],
        &["  "][..],
        &["10.0.0.0/8", " 0.0.0.0/0 "][..],
        &["10.0.0.0/8"][..],
        &["192.168.0.0/16", "203.0.113.7/32"][..],
        &["not-a-cidr"][..],
    ] {
        assert_eq!(features(&load_balancer(ranges)), [], "{ranges:?}");
    }
    // Control: the same LoadBalancer is still flagged for what the datapath does not serve.
    let mut with_sctp = load_balancer(&["10.0.0.0/8"]);
    spec(&mut with_sctp)
        .ports
        .get_or_insert_with(Vec::new)
        .push(port("sctp", "SCTP"));
    assert_eq!(features(&with_sctp), [SctpPorts]);
    // Nothing kept for the planner: no summary, so no refusal, condition or Event.
    assert_eq!(
        UnsupportedService::of(&load_balancer(&["10.0.0.0/8"])),
        None
    );
}

#[test]
fn services_kube_proxy_does_not_proxy_are_never_flagged() {
    let mut everything = load_balancer(&["10.0.0.0/8"]);
    spec(&mut everything)
        .ports
        .get_or_insert_with(Vec::new)
        .push(port("sctp", "SCTP"));
    spec(&mut everything).ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
    assert_eq!(
        features(&everything),
        [SctpPorts, Ipv6],
        "control: a proxied Service with every unsupported feature, in the table's order"
    );

    let mut headless = everything.clone();
    spec(&mut headless).type_ = Some("ClusterIP".into());
    spec(&mut headless).cluster_ip = Some("None".into());
    let mut unallocated = everything.clone();
    spec(&mut unallocated).cluster_ip = Some(String::new());
    let mut without_cluster_ip = everything.clone();
    spec(&mut without_cluster_ip).cluster_ip = None;
    let mut external_name = everything.clone();
    spec(&mut external_name).type_ = Some("ExternalName".into());
    let mut other_proxy = everything.clone();
    other_proxy.metadata.labels = Some(BTreeMap::from([(
        SERVICE_PROXY_NAME_LABEL.into(),
        "other-proxy".into(),
    )]));
    for (what, service) in [
        ("headless", headless),
        ("unallocated", unallocated),
        ("without a cluster IP", without_cluster_ip),
        ("ExternalName", external_name),
        ("owned by another proxy", other_proxy),
    ] {
        assert_eq!(UnsupportedService::of(&service), None, "{what}");
    }
}

fn unsupported(name: &str, features: &[UnsupportedFeature]) -> Arc<UnsupportedService> {
    Arc::new(UnsupportedService {
        namespace: "shop".into(),
        name: name.into(),
        uid: Some(format!("uid-{name}")),
        features: features.to_vec(),
    })
}

fn with_services(
    mut cluster: ObservedCluster,
    services: Vec<Arc<UnsupportedService>>,
) -> ObservedCluster {
    cluster.unsupported_services = services;
    cluster
}

#[test]
fn a_transition_to_ebpf_is_refused_while_an_unsupported_service_exists_and_proceeds_once_it_is_gone(
) {
    let refused_cluster = with_services(
        three_kube_proxy_nodes(),
        vec![unsupported("pbx", &[SctpPorts])],
    );
    let refused = plan(Some(&config(Ebpf)), &refused_cluster);
    check_invariants(Some(&config(Ebpf)), &refused_cluster, &refused);
    assert_eq!(phase(&refused), DataplanePhase::Preflight);
    assert!(refused.dataplane_nodes.is_empty(), "no node activated");
    assert_eq!(
        refused.kube_proxy,
        KubeProxyAction::None,
        "kube-proxy untouched"
    );
    let degraded = condition_of(&refused, types::DEGRADED);
    assert_eq!(
        (degraded.status, degraded.reason.as_str()),
        (ConditionStatus::True, reasons::UNSUPPORTED_SERVICES)
    );
    assert!(
        degraded.message.contains(
            "1 Service(s) use what the eBPF datapath does not serve yet: shop/pbx (SCTP ports)"
        ),
        "{}",
        degraded.message
    );
    let supported = condition_of(&refused, types::SERVICES_SUPPORTED);
    assert_eq!(supported.status, ConditionStatus::False);
    assert!(
        supported
            .message
            .contains("a transition to Ebpf is refused"),
        "{}",
        supported.message
    );
    assert!(
        refused.services_to_warn.is_empty(),
        "kube-proxy serves every node: no Service is broken"
    );

    // The SCTP Service deleted: the same cluster goes on.
    let plan = plan(Some(&config(Ebpf)), &three_kube_proxy_nodes());
    assert_eq!(phase(&plan), DataplanePhase::ActivatingNodes);
    assert_eq!(written_modes(&plan), vec![("node-1", Ebpf)]);
    assert_eq!(
        condition_of(&plan, types::DEGRADED).status,
        ConditionStatus::False
    );
    let supported = condition_of(&plan, types::SERVICES_SUPPORTED);
    assert_eq!(
        (supported.status, supported.reason.as_str()),
        (ConditionStatus::True, reasons::ALL_SERVICES_SUPPORTED)
    );
}

#[test]
fn the_refusal_names_ten_services_with_their_features_and_counts_the_rest() {
    let names: Vec<String> = (0..12).map(|index| format!("svc-{index:02}")).collect();
    // Given in reverse: the message names them in namespace/name order all the same.
    let twelve: Vec<Arc<UnsupportedService>> = names
        .iter()
        .rev()
        .map(|name| unsupported(name, &[SctpPorts, Ipv6]))
        .collect();
    let plan = plan(
        Some(&config(Ebpf)),
        &with_services(three_kube_proxy_nodes(), twelve.clone()),
    );
    let message = &condition_of(&plan, types::DEGRADED).message;
    assert!(
        message.contains("12 Service(s) use what the eBPF datapath does not serve yet: shop/svc-00 (SCTP ports, IPv6), shop/svc-01 (SCTP ports, IPv6)"),
        "{message}"
    );
    assert!(
        message.contains("shop/svc-09 (SCTP ports, IPv6) and 2 more"),
        "{message}"
    );
    assert!(!message.contains("svc-10") && !message.contains("svc-11"));

    let ten = twelve[2..].to_vec();
    let plan = super::super::plan(
        Some(&config(Ebpf)),
        &with_services(three_kube_proxy_nodes(), ten),
    );
    let message = &condition_of(&plan, types::DEGRADED).message;
    assert!(
        message.contains("shop/svc-08 (SCTP ports, IPv6) and shop/svc-09"),
        "control: ten are all named: {message}"
    );
    assert!(!message.contains("more"), "{message}");
}

/// node-1 serves from eBPF, node-2 and node-3 wait for their batch.
fn mid_transition() -> ObservedCluster {
    cluster(vec![
        ebpf_node("node-1"),
        kube_proxy_node("node-2"),
        kube_proxy_node("node-3"),
    ])
}

#[test]
fn a_cluster_partly_or_wholly_on_ebpf_keeps_its_course_and_names_the_unsupported_services() {
    let pbx = unsupported("pbx", &[SctpPorts]);
    let mut on_ebpf = cluster(vec![cleaned_node("node-1"), cleaned_node("node-2")]);
    on_ebpf.kube_proxy_daemon_set = Some(disabled_kube_proxy_daemon_set());
    for (what, cluster) in [("mid-transition", mid_transition()), ("Ready", on_ebpf)] {
        let control = plan(Some(&config(Ebpf)), &cluster);
        let with_pbx = with_services(cluster, vec![pbx.clone()]);
        let plan = plan(Some(&config(Ebpf)), &with_pbx);
        check_invariants(Some(&config(Ebpf)), &with_pbx, &plan);
        assert_eq!(
            plan.dataplane_nodes, control.dataplane_nodes,
            "{what}: no rollback"
        );
        assert_eq!(plan.kube_proxy, control.kube_proxy, "{what}");
        assert_eq!(phase(&plan), phase(&control), "{what}");
        assert_eq!(
            condition_of(&plan, types::DEGRADED),
            condition_of(&control, types::DEGRADED),
            "{what}"
        );
        let supported = condition_of(&plan, types::SERVICES_SUPPORTED);
        assert_eq!(
            (supported.status, supported.reason.as_str()),
            (ConditionStatus::False, reasons::UNSUPPORTED_SERVICES),
            "{what}"
        );
        assert!(
            supported.message.contains("shop/pbx (SCTP ports)")
                && supported.message.contains("do not work"),
            "{what}: {}",
            supported.message
        );
        assert_eq!(plan.services_to_warn, vec![pbx.clone()], "{what}");

        assert_eq!(
            condition_of(&control, types::SERVICES_SUPPORTED).status,
            ConditionStatus::True,
            "{what}: control"
        );
        assert!(control.services_to_warn.is_empty(), "{what}: control");
    }
}

#[test]
fn going_back_to_kube_proxy_is_never_held_by_unsupported_services() {
    let pbx = unsupported("pbx", &[SctpPorts, Ipv6]);
    let on_ebpf = cluster(vec![
        ebpf_node("node-1"),
        ebpf_node("node-2"),
        ebpf_node("node-3"),
    ]);
    let control = plan(Some(&config(KubeProxy)), &on_ebpf);
    assert_eq!(phase(&control), DataplanePhase::DeactivatingNodes);
    assert_eq!(written_modes(&control), vec![("node-1", KubeProxy)]);

    let with_pbx = with_services(on_ebpf, vec![pbx.clone()]);
    let plan = plan(Some(&config(KubeProxy)), &with_pbx);
    check_invariants(Some(&config(KubeProxy)), &with_pbx, &plan);
    assert_eq!(plan.dataplane_nodes, control.dataplane_nodes);
    assert_eq!(plan.kube_proxy, control.kube_proxy);
    assert_eq!(phase(&plan), phase(&control));
    assert_eq!(
        condition_of(&plan, types::DEGRADED),
        condition_of(&control, types::DEGRADED)
    );
    assert_eq!(
        plan.services_to_warn,
        vec![pbx],
        "still broken on the nodes eBPF serves until they leave it"
    );
}

#[test]
fn services_are_warned_about_while_ebpf_serves_some_node_even_without_a_dataplane_config() {
    let pbx = unsupported("pbx", &[SctpPorts]);
    let plan = plan(None, &with_services(mid_transition(), vec![pbx.clone()]));
    assert_eq!(plan.services_to_warn, vec![pbx.clone()]);
    let plan = super::super::plan(None, &with_services(three_kube_proxy_nodes(), vec![pbx]));
    assert!(
        plan.services_to_warn.is_empty(),
        "control: every node on kube-proxy"
    );
}
