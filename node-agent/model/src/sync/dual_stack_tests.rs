//! Dual-stack Services (issue 25, phase 1): from manifests (`ipFamilies`,
//! `ipFamilyPolicy`, `clusterIPs`, EndpointSlices of both address types) through
//! [`SyncInputs`] to the map entries, with the served families as the agent's
//! `--served-families` sets them.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use proptest::prelude::*;
use switchyard_common::{ipv4_of_mapped, BackendValue, FrontendKey, SCOPE_EXTERNAL};

use super::inputs::SyncInputs;
use super::tests::{open_gate, semantics};
use super::Syncer;
use crate::desired::NodeView;
use crate::maps::{FakeServiceMaps, MapState};
use crate::model::{
    endpoint_slice_from_v1, service_from_v1, AddressFamily, EndpointSliceModel, ServedFamilies,
    ServiceModel,
};

const NODE: &str = "node-a";

fn service(yaml: &str) -> ServiceModel {
    let object: Service = serde_yaml::from_str(yaml).expect("test Service YAML is valid");
    service_from_v1(&object)
        .expect("test Service converts")
        .expect("test Service is served")
}

fn slice(yaml: &str) -> EndpointSliceModel {
    let object: EndpointSlice = serde_yaml::from_str(yaml).expect("test slice YAML is valid");
    endpoint_slice_from_v1(&object)
        .expect("test slice converts")
        .expect("test slice is used")
}

/// A dual-stack LoadBalancer Service as a 1.20+ API server stores it: IPv6 first
/// (`PreferDualStack`, `ipFamilies: [IPv6, IPv4]`), external IPs and ingress
/// addresses of both families.
fn dual_stack_service() -> ServiceModel {
    service(
        r#"
metadata: {name: web, namespace: default}
spec:
  type: LoadBalancer
  ipFamilyPolicy: PreferDualStack
  ipFamilies: [IPv6, IPv4]
  clusterIP: fd00:96::10
  clusterIPs: [fd00:96::10, 10.96.0.10]
  externalIPs: [192.0.2.10, 2001:db8::10]
  ports:
  - {name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30080}
  - {name: dns, port: 53, protocol: UDP, targetPort: 8053, nodePort: 30053}
status:
  loadBalancer:
    ingress: [{ip: 198.51.100.7}, {ip: "2001:db8:1::7"}]
"#,
    )
}

fn slices_of_both_families() -> Vec<EndpointSliceModel> {
    let ports =
        "ports: [{name: http, port: 8080, protocol: TCP}, {name: dns, port: 8053, protocol: UDP}]";
    vec![
        slice(&format!(
            r#"
metadata: {{name: web-v4, namespace: default, labels: {{kubernetes.io/service-name: web}}}}
addressType: IPv4
{ports}
endpoints:
- {{addresses: [10.244.0.11], nodeName: {NODE}}}
- {{addresses: [10.244.1.12], nodeName: node-b}}
"#
        )),
        slice(&format!(
            r#"
metadata: {{name: web-v6, namespace: default, labels: {{kubernetes.io/service-name: web}}}}
addressType: IPv6
{ports}
endpoints:
- {{addresses: ["fd00:244::11"], nodeName: {NODE}}}
- {{addresses: ["fd00:244:1::12"], nodeName: node-b}}
"#
        )),
    ]
}

fn node() -> NodeView {
    NodeView {
        name: NODE.into(),
        addresses: vec![
            "192.168.50.1".parse().unwrap(),
            "fd00:50::1".parse().unwrap(),
        ],
        zone: None,
    }
}

fn family_of(address: &[u8; 16]) -> AddressFamily {
    match ipv4_of_mapped(address) {
        Some(_) => AddressFamily::Ipv4,
        None => AddressFamily::Ipv6,
    }
}

/// The map entries one full sync writes from a fresh start.
fn synced_state(
    served: ServedFamilies,
    services: &[ServiceModel],
    slices: &[EndpointSliceModel],
) -> MapState {
    let mut inputs = SyncInputs::serving(served);
    inputs.set_node(node());
    for service in services {
        inputs.upsert_service(service.clone());
    }
    for slice in slices {
        inputs.upsert_slice(slice.clone());
    }
    let mut maps = FakeServiceMaps {
        watch_for_missing_slots: true,
        ..FakeServiceMaps::default()
    };
    let mut syncer = Syncer::restore(&maps).expect("restores");
    inputs
        .sync(open_gate(), &mut syncer, &mut maps, false)
        .expect("applies")
        .expect("the node is known");
    assert!(maps.missing_slot_violations.is_empty());
    maps.state
}

/// Every frontend's backends (`semantics`: flags, affinity timeout, backends),
/// checked to be of the frontend's own family.
fn assert_no_cross_family_backend(
    frontends: &BTreeMap<FrontendKey, (u32, u32, Vec<BackendValue>)>,
) {
    for (key, (_, _, backends)) in frontends {
        for backend in backends {
            assert_eq!(
                family_of(&backend.address),
                family_of(&key.address),
                "{key:?} is backed by {backend:?}"
            );
        }
    }
}

#[test]
fn a_dual_stack_service_yields_frontends_of_both_families_each_backed_by_its_own_family() {
    let state = synced_state(
        ServedFamilies::DUAL_STACK,
        &[dual_stack_service()],
        &slices_of_both_families(),
    );
    let frontends = semantics(&state);
    assert_no_cross_family_backend(&frontends);
    for family in [AddressFamily::Ipv4, AddressFamily::Ipv6] {
        let of_family: Vec<_> = frontends
            .iter()
            .filter(|(key, _)| family_of(&key.address) == family)
            .collect();
        // Per port (2): the cluster IP (1), and the NodePort on the node's address,
        // the external IP and the ingress address, each in both scopes (6).
        assert_eq!(of_family.len(), 2 * 7, "{family:?}: {of_family:#?}");
        // Every frontend of the family has both of the family's endpoints.
        for (key, (_, _, backends)) in &of_family {
            assert_eq!(backends.len(), 2, "{key:?}");
        }
    }
    let ipv6_cluster_ip = crate::desired::frontend_key(
        &"fd00:96::10".parse().unwrap(),
        80,
        crate::model::Protocol::Tcp,
        switchyard_common::SCOPE_INTERNAL,
    );
    let expected: Vec<[u8; 16]> = ["fd00:244::11", "fd00:244:1::12"]
        .iter()
        .map(|text| text.parse::<std::net::Ipv6Addr>().unwrap().octets())
        .collect();
    let found: Vec<[u8; 16]> = frontends[&ipv6_cluster_ip]
        .2
        .iter()
        .map(|backend| backend.address)
        .collect();
    assert_eq!(found, expected);
    assert!(frontends[&ipv6_cluster_ip]
        .2
        .iter()
        .all(|backend| backend.port_big_endian == 8080u16.to_be()));
}

#[test]
fn with_ipv4_served_only_a_dual_stack_service_keeps_its_ipv4_entries_and_no_ipv6_one() {
    let dual = synced_state(
        ServedFamilies::DUAL_STACK,
        &[dual_stack_service()],
        &slices_of_both_families(),
    );
    let ipv4_only = synced_state(
        ServedFamilies::IPV4_ONLY,
        &[dual_stack_service()],
        &slices_of_both_families(),
    );
    assert!(ipv4_only
        .frontends
        .keys()
        .all(|key| family_of(&key.address) == AddressFamily::Ipv4));
    // The IPv4 half is the same as when both families are served.
    let ipv4_half = |state: &MapState| {
        semantics(state)
            .into_iter()
            .filter(|(key, _)| family_of(&key.address) == AddressFamily::Ipv4)
            .map(|(key, (flags, _, backends))| (key, flags, backends))
            .collect::<Vec<_>>()
    };
    assert_eq!(ipv4_half(&ipv4_only), ipv4_half(&dual));
    assert_eq!(ipv4_half(&ipv4_only).len(), 14);
}

#[test]
fn an_ipv6_only_service_is_dropped_when_ipv6_is_not_served_and_kept_when_it_is() {
    let ipv6_only = service(
        r#"
metadata: {name: web, namespace: default}
spec:
  ipFamilyPolicy: SingleStack
  ipFamilies: [IPv6]
  clusterIP: fd00:96::10
  clusterIPs: [fd00:96::10]
  ports: [{name: http, port: 80, protocol: TCP}]
"#,
    );
    assert_eq!(ipv6_only.restricted_to(ServedFamilies::IPV4_ONLY), None);
    let mut inputs = SyncInputs::serving(ServedFamilies::IPV4_ONLY);
    assert!(!inputs.upsert_service(ipv6_only.clone()));
    assert_eq!(inputs.service_count(), 0);
    let state = synced_state(
        ServedFamilies::DUAL_STACK,
        &[ipv6_only],
        &slices_of_both_families(),
    );
    let frontends = semantics(&state);
    assert_eq!(frontends.len(), 1);
    assert_no_cross_family_backend(&frontends);
    assert_eq!(
        frontends.values().next().map(|value| value.2.len()),
        Some(2)
    );
}

#[test]
fn an_ipv4_only_cluster_gets_byte_identical_entries_whatever_families_are_served() {
    // Control: the setting changes nothing for IPv4 Services, and the default
    // is IPv4 only (the agent's state before issue 25).
    let ipv4 = service(
        r#"
metadata: {name: web, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  externalIPs: [192.0.2.10]
  sessionAffinity: ClientIP
  ports:
  - {name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30080}
  - {name: dns, port: 53, protocol: UDP, targetPort: 8053, nodePort: 30053}
status:
  loadBalancer:
    ingress: [{ip: 198.51.100.7}]
"#,
    );
    assert_eq!(
        ipv4.restricted_to(ServedFamilies::IPV4_ONLY).as_ref(),
        Some(&ipv4)
    );
    let slices = slices_of_both_families();
    let ipv4_slices: Vec<EndpointSliceModel> = slices
        .iter()
        .filter(|slice| slice.family == AddressFamily::Ipv4)
        .cloned()
        .collect();
    let served_ipv4 = synced_state(
        ServedFamilies::IPV4_ONLY,
        std::slice::from_ref(&ipv4),
        &slices,
    );
    let served_both = synced_state(
        ServedFamilies::DUAL_STACK,
        std::slice::from_ref(&ipv4),
        &slices,
    );
    let default = {
        // `SyncInputs::default()`, as the agent made them before the setting.
        let mut inputs = SyncInputs::default();
        assert_eq!(inputs.served_families(), ServedFamilies::IPV4_ONLY);
        inputs.set_node(node());
        inputs.upsert_service(ipv4.clone());
        for slice in &ipv4_slices {
            inputs.upsert_slice(slice.clone());
        }
        let mut maps = FakeServiceMaps::default();
        let mut syncer = Syncer::restore(&maps).expect("restores");
        inputs
            .sync(open_gate(), &mut syncer, &mut maps, false)
            .expect("applies")
            .expect("the node is known");
        maps.state
    };
    assert_eq!(served_ipv4, served_both);
    assert_eq!(served_ipv4, default);
    // Not empty by accident: every frontend has both IPv4 endpoints.
    assert_eq!(served_ipv4.frontends.len(), 2 * 7);
    assert!(semantics(&served_ipv4)
        .values()
        .all(|(_, _, backends)| backends.len() == 2));
}

fn address_of(family: AddressFamily, index: u8) -> IpAddr {
    match family {
        AddressFamily::Ipv4 => IpAddr::from([10, 244, 0, index]),
        AddressFamily::Ipv6 => IpAddr::from([0xfd00, 0x244, 0, 0, 0, 0, 0, u16::from(index)]),
    }
}

proptest! {
    /// Whatever addresses a Service has of either family and whatever endpoints,
    /// every frontend is backed only by endpoints of its own family, every
    /// cluster IP of a served family gets a frontend with all its family's ready
    /// endpoints, and no address of an unserved family gets one.
    #[test]
    fn no_frontend_is_ever_backed_by_an_endpoint_of_the_other_family(
        cluster_families in prop::collection::vec(prop::bool::ANY, 1..=2),
        external_families in prop::collection::vec(prop::bool::ANY, 0..3),
        endpoints in prop::collection::vec((prop::bool::ANY, 1u8..30, prop::bool::ANY), 0..8),
        serve_ipv6 in prop::bool::ANY,
        node_port in prop::bool::ANY,
    ) {
        let mut cluster_ips: Vec<IpAddr> = cluster_families
            .iter()
            .map(|ipv6| match family(*ipv6) {
                AddressFamily::Ipv4 => IpAddr::from([10, 96, 0, 10]),
                AddressFamily::Ipv6 => "fd00:96::10".parse().unwrap(),
            })
            .collect();
        cluster_ips.dedup();
        let mut model = dual_stack_service();
        model.cluster_ips = cluster_ips.clone();
        model.external_ips = external_families
            .iter()
            .enumerate()
            .map(|(index, ipv6)| match family(*ipv6) {
                AddressFamily::Ipv4 => IpAddr::from([192, 0, 2, 20 + index as u8]),
                AddressFamily::Ipv6 => IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x20 + index as u16]),
            })
            .collect();
        if !node_port {
            for port in &mut model.ports {
                port.node_port = None;
            }
        }
        let mut slices = slices_of_both_families();
        for slice in &mut slices {
            slice.endpoints.clear();
        }
        for (ipv6, index, ready) in &endpoints {
            let slice = &mut slices[usize::from(*ipv6)];
            let mut endpoint = slice_endpoint_template();
            endpoint.address = address_of(family(*ipv6), *index);
            endpoint.ready = *ready;
            endpoint.serving = *ready;
            slice.endpoints.push(endpoint);
        }
        let served = if serve_ipv6 { ServedFamilies::DUAL_STACK } else { ServedFamilies::IPV4_ONLY };
        let state = synced_state(served, &[model], &slices);
        let frontends = semantics(&state);
        assert_no_cross_family_backend(&frontends);
        for key in frontends.keys() {
            prop_assert!(served.contains(family_of(&key.address)), "{key:?}");
            prop_assert!(key.scope == SCOPE_EXTERNAL || key.scope == switchyard_common::SCOPE_INTERNAL);
        }
        for cluster_ip in cluster_ips.iter().filter(|ip| served.serves(ip)) {
            let cluster_family = AddressFamily::of(cluster_ip);
            let mut ready: Vec<[u8; 16]> = endpoints
                .iter()
                .filter(|(ipv6, _, ready)| *ready && family(*ipv6) == cluster_family)
                .map(|(ipv6, index, _)| crate::desired::address_bytes(&address_of(family(*ipv6), *index)))
                .collect();
            ready.sort();
            ready.dedup();
            let key = crate::desired::frontend_key(cluster_ip, 80, crate::model::Protocol::Tcp, switchyard_common::SCOPE_INTERNAL);
            let (_, _, backends) = frontends.get(&key).expect("a served cluster IP has a frontend");
            let mut found: Vec<[u8; 16]> = backends.iter().map(|backend| backend.address).collect();
            found.sort();
            prop_assert_eq!(found, ready);
        }
    }
}

fn family(ipv6: bool) -> AddressFamily {
    if ipv6 {
        AddressFamily::Ipv6
    } else {
        AddressFamily::Ipv4
    }
}

fn slice_endpoint_template() -> crate::model::EndpointModel {
    crate::model::EndpointModel {
        address: IpAddr::from([0, 0, 0, 0]),
        ready: true,
        serving: true,
        terminating: false,
        node_name: Some(NODE.into()),
        hints: Default::default(),
    }
}
