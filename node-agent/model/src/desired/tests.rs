use std::collections::BTreeSet;
use std::net::IpAddr;

use proptest::prelude::*;
use switchyard_common::{BackendSlotKey, FrontendValue};

use super::layout::{first_free_id, place_backends, stable_group_hash};
use super::*;
use crate::maps::MapState;
use crate::model::{EndpointModel, EndpointPortModel, TargetPort};

const NODE: &str = "node-a";

fn ip(text: &str) -> IpAddr {
    text.parse().expect("test address is valid")
}

fn node(addresses: &[&str]) -> NodeView {
    NodeView {
        name: NODE.to_string(),
        zone: None,
        addresses: addresses.iter().map(|address| ip(address)).collect(),
    }
}

fn port(name: &str, protocol: Protocol, number: u16, node_port: Option<u16>) -> ServicePortModel {
    ServicePortModel {
        name: name.to_string(),
        protocol,
        port: number,
        node_port,
        target_port: TargetPort::Name(name.to_string()),
    }
}

fn service(name: &str, cluster_ip: &str, ports: Vec<ServicePortModel>) -> ServiceModel {
    ServiceModel {
        name: ServiceName::new("default", name),
        cluster_ips: vec![ip(cluster_ip)],
        external_ips: vec![],
        load_balancer_ips: vec![],
        ports,
        external_traffic_policy: TrafficPolicy::Cluster,
        internal_traffic_policy: TrafficPolicy::Cluster,
        session_affinity_timeout_seconds: None,
        load_balancer_source_ranges: Vec::new(),
    }
}

#[derive(Clone, Copy)]
enum State {
    Ready,
    ServingTerminating,
    NotServingTerminating,
    NotReady,
}

/// A Service with the one port most tests need: `http`, TCP 80, to the target port named `http`.
fn http_service(name: &str, cluster_ip: &str) -> ServiceModel {
    service(
        name,
        cluster_ip,
        vec![port("http", Protocol::Tcp, 80, None)],
    )
}

/// A slice of `service` whose port `http` is TCP `target_port`.
fn http_slice(
    service: &str,
    target_port: u16,
    endpoints: Vec<EndpointModel>,
) -> EndpointSliceModel {
    slice(service, &[("http", Protocol::Tcp, target_port)], endpoints)
}

fn endpoint(address: &str, state: State, node_name: &str) -> EndpointModel {
    let (ready, serving, terminating) = match state {
        State::Ready => (true, true, false),
        State::ServingTerminating => (false, true, true),
        State::NotServingTerminating => (false, false, true),
        State::NotReady => (false, false, false),
    };
    EndpointModel {
        address: ip(address),
        ready,
        serving,
        terminating,
        node_name: Some(node_name.to_string()),
        hints: Default::default(),
    }
}

fn slice(
    service: &str,
    ports: &[(&str, Protocol, u16)],
    endpoints: Vec<EndpointModel>,
) -> EndpointSliceModel {
    let family = endpoints
        .first()
        .map(|endpoint| AddressFamily::of(&endpoint.address))
        .unwrap_or(AddressFamily::Ipv4);
    EndpointSliceModel {
        slice_name: ServiceName::new("default", format!("{service}-slice")),
        service: ServiceName::new("default", service),
        family,
        ports: ports
            .iter()
            .map(|(name, protocol, number)| EndpointPortModel {
                name: name.to_string(),
                protocol: *protocol,
                port: *number,
            })
            .collect(),
        endpoints,
        last_change_trigger_time: None,
    }
}

fn backend(address: &str, port: u16, local: bool) -> BackendValue {
    BackendValue {
        address: address_bytes(&ip(address)),
        port_big_endian: port.to_be(),
        flags: if local { BACKEND_FLAG_LOCAL } else { 0 },
    }
}

fn tcp(address: &str, port: u16, scope: u8) -> FrontendKey {
    frontend_key(&ip(address), port, Protocol::Tcp, scope)
}

fn group(service: &str, port_name: &str, view: EndpointView) -> GroupKey {
    GroupKey {
        service: ServiceName::new("default", service),
        port_name: port_name.to_string(),
        protocol: Protocol::Tcp,
        family: AddressFamily::Ipv4,
        view,
    }
}

/// The backends a frontend balances over, read back from laid-out entries.
fn backends_behind(state: &MapState, key: &FrontendKey) -> Vec<BackendValue> {
    let value = state.frontends.get(key).expect("frontend exists");
    (0..value.backend_count)
        .map(|ordinal| {
            *state
                .backend_slots
                .get(&BackendSlotKey {
                    group_id: value.group_id,
                    ordinal,
                })
                .expect("slot exists")
        })
        .collect()
}

fn sorted(mut backends: Vec<BackendValue>) -> Vec<BackendValue> {
    backends.sort();
    backends
}

#[test]
fn a_cluster_ip_service_gets_one_internal_frontend_over_its_ready_endpoints() {
    let services = [http_service("web", "10.96.0.1")];
    let slices = [http_slice(
        "web",
        8080,
        vec![
            endpoint("10.0.0.2", State::Ready, "node-b"),
            endpoint("10.0.0.1", State::Ready, NODE),
            endpoint("10.0.0.3", State::NotReady, NODE),
        ],
    )];
    let desired = desired_services(&services, &slices, &node(&["192.168.1.10"]));
    assert_eq!(
        desired.frontends.keys().copied().collect::<Vec<_>>(),
        vec![tcp("10.96.0.1", 80, SCOPE_INTERNAL)]
    );
    assert_eq!(
        desired.groups.get(&group("web", "http", EndpointView::All)),
        Some(&vec![
            backend("10.0.0.1", 8080, true),
            backend("10.0.0.2", 8080, false)
        ])
    );
    assert!(desired.conflicts.is_empty());

    let entries = lay_out(&desired, &MapState::default());
    let frontend = entries.frontends[&tcp("10.96.0.1", 80, SCOPE_INTERNAL)];
    assert_eq!(frontend.backend_count, 2);
    assert_eq!(frontend.flags, 0);
    assert_eq!(frontend.affinity_timeout_seconds, 0);
    assert_eq!(entries.backend_slots.len(), 2);
}

#[test]
fn a_service_without_endpoint_slices_refuses_with_zero_backends() {
    let services = [service(
        "empty",
        "10.96.0.9",
        vec![port("", Protocol::Udp, 53, None)],
    )];
    let entries = desired_entries(&services, &[], &node(&[]), &MapState::default());
    let key = frontend_key(&ip("10.96.0.9"), 53, Protocol::Udp, SCOPE_INTERNAL);
    assert_eq!(entries.frontends[&key].backend_count, 0);
    assert!(entries.backend_slots.is_empty());
}

#[test]
fn named_target_ports_are_resolved_per_slice_by_port_name() {
    // Two pod generations expose the named port `web` on different numbers.
    let services = [http_service("app", "10.96.0.2")];
    let slices = [
        http_slice("app", 8080, vec![endpoint("10.0.0.1", State::Ready, NODE)]),
        http_slice("app", 9090, vec![endpoint("10.0.0.2", State::Ready, NODE)]),
        // A slice without the port's name contributes nothing to it.
        slice(
            "app",
            &[("other", Protocol::Tcp, 7070)],
            vec![endpoint("10.0.0.3", State::Ready, NODE)],
        ),
        // Nor does one with the name but another protocol.
        slice(
            "app",
            &[("http", Protocol::Udp, 6060)],
            vec![endpoint("10.0.0.4", State::Ready, NODE)],
        ),
    ];
    let desired = desired_services(&services, &slices, &node(&[]));
    assert_eq!(
        desired.groups[&group("app", "http", EndpointView::All)],
        vec![
            backend("10.0.0.1", 8080, true),
            backend("10.0.0.2", 9090, true)
        ]
    );
}

#[test]
fn several_ports_get_their_own_frontends_and_groups() {
    let services = [service(
        "dns",
        "10.96.0.10",
        vec![
            port("dns", Protocol::Udp, 53, None),
            port("dns-tcp", Protocol::Tcp, 53, None),
            port("metrics", Protocol::Tcp, 9153, None),
        ],
    )];
    let slices = [slice(
        "dns",
        &[
            ("dns", Protocol::Udp, 5353),
            ("dns-tcp", Protocol::Tcp, 5353),
            ("metrics", Protocol::Tcp, 9153),
        ],
        vec![endpoint("10.0.0.1", State::Ready, NODE)],
    )];
    let entries = desired_entries(&services, &slices, &node(&[]), &MapState::default());
    let udp = frontend_key(&ip("10.96.0.10"), 53, Protocol::Udp, SCOPE_INTERNAL);
    let dns_tcp = tcp("10.96.0.10", 53, SCOPE_INTERNAL);
    let metrics = tcp("10.96.0.10", 9153, SCOPE_INTERNAL);
    assert_eq!(entries.frontends.len(), 3);
    assert_eq!(
        backends_behind(&entries, &udp),
        vec![backend("10.0.0.1", 5353, true)]
    );
    assert_eq!(
        backends_behind(&entries, &dns_tcp),
        vec![backend("10.0.0.1", 5353, true)]
    );
    assert_eq!(
        backends_behind(&entries, &metrics),
        vec![backend("10.0.0.1", 9153, true)]
    );
    let groups: BTreeSet<u32> = entries
        .frontends
        .values()
        .map(|value| value.group_id)
        .collect();
    assert_eq!(groups.len(), 3, "each port has its own group");
}

#[test]
fn terminating_endpoints_get_no_new_flows_while_any_endpoint_is_ready() {
    let services = [http_service("web", "10.96.0.1")];
    let slices = [http_slice(
        "web",
        8080,
        vec![
            endpoint("10.0.0.1", State::Ready, NODE),
            endpoint("10.0.0.2", State::ServingTerminating, NODE),
            endpoint("10.0.0.3", State::NotServingTerminating, NODE),
        ],
    )];
    let desired = desired_services(&services, &slices, &node(&[]));
    assert_eq!(
        desired.groups[&group("web", "http", EndpointView::All)],
        vec![backend("10.0.0.1", 8080, true)]
    );
}

#[test]
fn serving_terminating_endpoints_are_used_when_none_is_ready() {
    let services = [http_service("web", "10.96.0.1")];
    let slices = [http_slice(
        "web",
        8080,
        vec![
            endpoint("10.0.0.2", State::ServingTerminating, NODE),
            endpoint("10.0.0.3", State::NotServingTerminating, NODE),
            endpoint("10.0.0.4", State::NotReady, NODE),
        ],
    )];
    let desired = desired_services(&services, &slices, &node(&[]));
    assert_eq!(
        desired.groups[&group("web", "http", EndpointView::All)],
        vec![backend("10.0.0.2", 8080, true)]
    );
}

#[test]
fn an_endpoint_listed_in_two_slices_is_one_backend_with_its_best_condition() {
    let services = [http_service("web", "10.96.0.1")];
    let slices = [
        http_slice(
            "web",
            8080,
            vec![endpoint("10.0.0.1", State::NotReady, NODE)],
        ),
        http_slice("web", 8080, vec![endpoint("10.0.0.1", State::Ready, NODE)]),
    ];
    let desired = desired_services(&services, &slices, &node(&[]));
    assert_eq!(
        desired.groups[&group("web", "http", EndpointView::All)],
        vec![backend("10.0.0.1", 8080, true)]
    );
}

fn node_port_service(external: TrafficPolicy) -> ServiceModel {
    let mut model = service(
        "np",
        "10.96.0.3",
        vec![port("http", Protocol::Tcp, 80, Some(30080))],
    );
    model.external_traffic_policy = external;
    model
}

fn mixed_slice(service: &str) -> EndpointSliceModel {
    http_slice(
        service,
        8080,
        vec![
            endpoint("10.0.0.1", State::Ready, NODE),
            endpoint("10.0.1.1", State::Ready, "node-b"),
        ],
    )
}

#[test]
fn a_node_port_is_served_on_every_node_address_in_both_scopes() {
    let services = [node_port_service(TrafficPolicy::Cluster)];
    let slices = [mixed_slice("np")];
    let entries = desired_entries(
        &services,
        &slices,
        &node(&["192.168.1.10", "172.16.0.10"]),
        &MapState::default(),
    );
    let expected_keys: BTreeSet<FrontendKey> = [
        tcp("10.96.0.3", 80, SCOPE_INTERNAL),
        tcp("192.168.1.10", 30080, SCOPE_INTERNAL),
        tcp("192.168.1.10", 30080, SCOPE_EXTERNAL),
        tcp("172.16.0.10", 30080, SCOPE_INTERNAL),
        tcp("172.16.0.10", 30080, SCOPE_EXTERNAL),
    ]
    .into_iter()
    .collect();
    assert_eq!(
        entries.frontends.keys().copied().collect::<BTreeSet<_>>(),
        expected_keys
    );
    // One group: every frontend sees every endpoint.
    let groups: BTreeSet<u32> = entries
        .frontends
        .values()
        .map(|value| value.group_id)
        .collect();
    assert_eq!(groups.len(), 1);
    // Only the external scope masquerades traffic to remote backends.
    assert_eq!(
        entries.frontends[&tcp("192.168.1.10", 30080, SCOPE_EXTERNAL)].flags,
        FRONTEND_FLAG_MASQUERADE_REMOTE
    );
    assert_eq!(
        entries.frontends[&tcp("192.168.1.10", 30080, SCOPE_INTERNAL)].flags,
        0
    );
}

#[test]
fn external_traffic_policy_local_keeps_the_client_address_and_only_local_endpoints_outside() {
    let services = [node_port_service(TrafficPolicy::Local)];
    let slices = [mixed_slice("np")];
    let entries = desired_entries(
        &services,
        &slices,
        &node(&["192.168.1.10"]),
        &MapState::default(),
    );
    let external = tcp("192.168.1.10", 30080, SCOPE_EXTERNAL);
    assert_eq!(
        entries.frontends[&external].flags,
        FRONTEND_FLAG_PRESERVE_CLIENT_ADDRESS
    );
    assert_eq!(
        backends_behind(&entries, &external),
        vec![backend("10.0.0.1", 8080, true)]
    );
    // The node's own pods still reach every endpoint, on the ClusterIP and the
    // NodePort alike (kube-proxy's cluster chain).
    for internal in [
        tcp("192.168.1.10", 30080, SCOPE_INTERNAL),
        tcp("10.96.0.3", 80, SCOPE_INTERNAL),
    ] {
        assert_eq!(
            backends_behind(&entries, &internal),
            vec![
                backend("10.0.0.1", 8080, true),
                backend("10.0.1.1", 8080, false)
            ]
        );
    }
}

#[test]
fn external_traffic_policy_local_without_local_endpoints_drops_outside_traffic() {
    let services = [node_port_service(TrafficPolicy::Local)];
    let slices = [http_slice(
        "np",
        8080,
        vec![endpoint("10.0.1.1", State::Ready, "node-b")],
    )];
    let entries = desired_entries(
        &services,
        &slices,
        &node(&["192.168.1.10"]),
        &MapState::default(),
    );
    let outside = entries.frontends[&tcp("192.168.1.10", 30080, SCOPE_EXTERNAL)];
    assert_eq!(outside.backend_count, 0);
    assert_ne!(
        outside.flags & switchyard_common::FRONTEND_FLAG_DROP_WITHOUT_BACKENDS,
        0
    );
    assert_eq!(
        entries.frontends[&tcp("192.168.1.10", 30080, SCOPE_INTERNAL)].backend_count,
        1
    );
}

#[test]
fn only_frontends_without_backends_of_a_service_with_endpoints_elsewhere_are_flagged_for_the_refusal_counters(
) {
    use switchyard_common::FRONTEND_FLAG_ENDPOINTS_ELSEWHERE as ELSEWHERE;
    // internalTrafficPolicy: Local, the only endpoint on another node: the ClusterIP has no
    // backend here while the Service has one elsewhere.
    let mut local = http_service("itp", "10.96.0.4");
    local.internal_traffic_policy = TrafficPolicy::Local;
    let remote_only = http_slice(
        "itp",
        8080,
        vec![endpoint("10.0.1.1", State::Ready, "node-b")],
    );
    // No endpoint anywhere (its only endpoint is not ready and not serving).
    let nowhere = http_service("down", "10.96.0.5");
    let not_ready = http_slice(
        "down",
        8080,
        vec![endpoint("10.0.1.2", State::NotReady, "node-b")],
    );
    // Cluster policy with a remote endpoint: backends, no flag.
    let served = http_service("web", "10.96.0.6");
    let served_slice = http_slice(
        "web",
        8080,
        vec![endpoint("10.0.1.3", State::Ready, "node-b")],
    );
    let entries = desired_entries(
        &[local, nowhere, served],
        &[remote_only, not_ready, served_slice],
        &node(&[]),
        &MapState::default(),
    );
    let flag_of =
        |address: &str| entries.frontends[&tcp(address, 80, SCOPE_INTERNAL)].flags & ELSEWHERE;
    assert_eq!(flag_of("10.96.0.4"), ELSEWHERE);
    assert_eq!(flag_of("10.96.0.5"), 0);
    assert_eq!(flag_of("10.96.0.6"), 0);

    // externalTrafficPolicy: Local without a local endpoint: the outside entry carries both
    // the drop and the counters' flag, its inside twin (backends) neither.
    let entries = desired_entries(
        &[node_port_service(TrafficPolicy::Local)],
        &[http_slice(
            "np",
            8080,
            vec![endpoint("10.0.1.1", State::Ready, "node-b")],
        )],
        &node(&["192.168.1.10"]),
        &MapState::default(),
    );
    let outside = entries.frontends[&tcp("192.168.1.10", 30080, SCOPE_EXTERNAL)];
    assert_eq!(outside.flags & ELSEWHERE, ELSEWHERE);
    let inside = entries.frontends[&tcp("192.168.1.10", 30080, SCOPE_INTERNAL)];
    assert_eq!(inside.flags & ELSEWHERE, 0);
}

#[test]
fn internal_traffic_policy_local_restricts_the_cluster_ip_to_local_endpoints() {
    let mut model = http_service("itp", "10.96.0.4");
    model.internal_traffic_policy = TrafficPolicy::Local;
    let entries = desired_entries(
        &[model],
        &[mixed_slice("itp")],
        &node(&[]),
        &MapState::default(),
    );
    assert_eq!(
        backends_behind(&entries, &tcp("10.96.0.4", 80, SCOPE_INTERNAL)),
        vec![backend("10.0.0.1", 8080, true)]
    );
}

#[test]
fn both_local_policies_share_one_local_group() {
    let mut model = node_port_service(TrafficPolicy::Local);
    model.internal_traffic_policy = TrafficPolicy::Local;
    let desired = desired_services(&[model], &[mixed_slice("np")], &node(&["192.168.1.10"]));
    let groups: BTreeSet<&GroupKey> = desired.groups.keys().collect();
    assert_eq!(
        groups,
        [
            group("np", "http", EndpointView::All),
            group("np", "http", EndpointView::Local)
        ]
        .iter()
        .collect()
    );
    assert_eq!(
        desired.frontends[&tcp("10.96.0.3", 80, SCOPE_INTERNAL)].group,
        desired.frontends[&tcp("192.168.1.10", 30080, SCOPE_EXTERNAL)].group
    );
}

#[test]
fn external_and_load_balancer_ips_are_served_on_the_service_port_in_both_scopes() {
    let mut model = service(
        "lb",
        "10.96.0.5",
        vec![port("https", Protocol::Tcp, 443, None)],
    );
    model.external_ips = vec![ip("192.0.2.10")];
    model.load_balancer_ips = vec![ip("198.51.100.1")];
    let desired = desired_services(&[model], &[], &node(&["192.168.1.10"]));
    for address in ["192.0.2.10", "198.51.100.1"] {
        for scope in [SCOPE_INTERNAL, SCOPE_EXTERNAL] {
            assert!(
                desired.frontends.contains_key(&tcp(address, 443, scope)),
                "{address} scope {scope}"
            );
        }
    }
    assert_eq!(
        desired.frontends.len(),
        5,
        "no NodePort without a node port"
    );
}

#[test]
fn client_ip_affinity_is_set_on_every_frontend_with_its_timeout() {
    let mut model = node_port_service(TrafficPolicy::Cluster);
    model.session_affinity_timeout_seconds = Some(60);
    let entries = desired_entries(
        &[model],
        &[],
        &node(&["192.168.1.10"]),
        &MapState::default(),
    );
    for (key, value) in &entries.frontends {
        assert_ne!(value.flags & FRONTEND_FLAG_SESSION_AFFINITY, 0, "{key:?}");
        assert_eq!(value.affinity_timeout_seconds, 60, "{key:?}");
    }
}

#[test]
fn node_addresses_of_another_family_get_no_node_port() {
    let services = [node_port_service(TrafficPolicy::Cluster)];
    let desired = desired_services(&services, &[], &node(&["192.168.1.10", "fd00::10"]));
    assert!(desired
        .frontends
        .keys()
        .all(|key| switchyard_common::ipv4_of_mapped(&key.address).is_some()));
    assert_eq!(desired.frontends.len(), 3);
}

#[test]
fn ipv6_slices_do_not_feed_an_ipv4_service() {
    let services = [http_service("web", "10.96.0.1")];
    let slices = [http_slice(
        "web",
        8080,
        vec![endpoint("fd00::1", State::Ready, NODE)],
    )];
    let desired = desired_services(&services, &slices, &node(&[]));
    assert_eq!(
        desired.groups[&group("web", "http", EndpointView::All)],
        vec![]
    );
}

#[test]
fn slices_of_another_namespace_do_not_feed_a_service_of_the_same_name() {
    let services = [http_service("web", "10.96.0.1")];
    let mut other = mixed_slice("web");
    other.service = ServiceName::new("elsewhere", "web");
    let desired = desired_services(&services, &[other], &node(&[]));
    assert_eq!(
        desired.groups[&group("web", "http", EndpointView::All)],
        vec![]
    );
}

#[test]
fn two_services_claiming_one_address_keep_the_first_by_name_whatever_the_input_order() {
    let mut first = http_service("a-first", "10.96.0.1");
    first.external_ips = vec![ip("192.0.2.10")];
    let mut second = http_service("b-second", "10.96.0.2");
    second.external_ips = vec![ip("192.0.2.10")];
    let forward = desired_services(&[first.clone(), second.clone()], &[], &node(&[]));
    let backward = desired_services(&[second, first], &[], &node(&[]));
    assert_eq!(forward, backward);
    let key = tcp("192.0.2.10", 80, SCOPE_EXTERNAL);
    assert_eq!(
        forward.frontends[&key].group.service,
        ServiceName::new("default", "a-first")
    );
    assert!(forward.conflicts.contains(&FrontendConflict {
        key,
        kept: ServiceName::new("default", "a-first"),
        dropped: ServiceName::new("default", "b-second"),
    }));
    // The loser keeps its own ClusterIP.
    assert!(forward
        .frontends
        .contains_key(&tcp("10.96.0.2", 80, SCOPE_INTERNAL)));
}

#[test]
fn an_address_listed_twice_by_one_service_is_not_a_conflict() {
    let mut model = http_service("web", "10.96.0.1");
    model.external_ips = vec![ip("192.0.2.10"), ip("192.0.2.10")];
    let desired = desired_services(&[model], &[], &node(&[]));
    assert!(desired.conflicts.is_empty());
}

#[test]
fn new_groups_take_their_stable_hash_as_id() {
    let services = [http_service("web", "10.96.0.1")];
    let entries = desired_entries(&services, &[], &node(&[]), &MapState::default());
    assert_eq!(
        entries.frontends[&tcp("10.96.0.1", 80, SCOPE_INTERNAL)].group_id,
        stable_group_hash(&group("web", "http", EndpointView::All)).max(1)
    );
}

#[test]
fn the_stable_hash_separates_fields() {
    let mut left = group("ab", "c", EndpointView::All);
    left.service.namespace = "x".into();
    let mut right = group("a", "bc", EndpointView::All);
    right.service.namespace = "x".into();
    assert_ne!(stable_group_hash(&left), stable_group_hash(&right));
    assert_ne!(
        stable_group_hash(&group("a", "b", EndpointView::All)),
        stable_group_hash(&group("a", "b", EndpointView::Local))
    );
}

#[test]
fn the_id_probe_skips_taken_ids_and_zero_and_wraps() {
    let taken: std::collections::HashSet<u32> = [5, 6, u32::MAX, 1].into_iter().collect();
    assert_eq!(first_free_id(5, &taken), 7);
    assert_eq!(first_free_id(0, &taken), 2);
    assert_eq!(first_free_id(u32::MAX, &taken), 2);
    assert_eq!(first_free_id(9, &taken), 9);
}

#[test]
fn inherited_group_ids_are_kept_even_when_they_are_not_the_hash() {
    let services = [http_service("web", "10.96.0.1")];
    let slices = [mixed_slice("web")];
    let fresh = desired_entries(&services, &slices, &node(&[]), &MapState::default());
    // Renumber the group as an older agent might have.
    let mut restored = MapState::default();
    for (key, value) in &fresh.frontends {
        restored.frontends.insert(
            *key,
            FrontendValue {
                group_id: 42,
                ..*value
            },
        );
    }
    for (key, value) in &fresh.backend_slots {
        restored.backend_slots.insert(
            BackendSlotKey {
                group_id: 42,
                ..*key
            },
            *value,
        );
    }
    let again = desired_entries(&services, &slices, &node(&[]), &restored);
    assert_eq!(
        again, restored,
        "an unchanged Service maps to the restored entries"
    );
}

#[test]
fn a_new_group_never_takes_an_id_still_used_in_the_maps() {
    let web = group("web", "http", EndpointView::All);
    let hash = stable_group_hash(&web).max(1);
    // Some stale entry of another Service holds the id `web` would hash to.
    let mut current = MapState::default();
    current.frontends.insert(
        tcp("10.96.0.200", 80, SCOPE_INTERNAL),
        FrontendValue {
            group_id: hash,
            backend_count: 1,
            flags: 0,
            affinity_timeout_seconds: 0,
        },
    );
    current.backend_slots.insert(
        BackendSlotKey {
            group_id: hash,
            ordinal: 0,
        },
        backend("10.9.9.9", 1, false),
    );
    let services = [http_service("web", "10.96.0.1")];
    let entries = desired_entries(&services, &[], &node(&[]), &current);
    assert_ne!(
        entries.frontends[&tcp("10.96.0.1", 80, SCOPE_INTERNAL)].group_id,
        hash
    );
}

#[test]
fn two_groups_claiming_one_restored_id_give_it_to_the_one_with_more_frontends() {
    // Before: internalTrafficPolicy Cluster, so the ClusterIP and both NodePort
    // scopes share group 7. After: Local, so the ClusterIP moves to a local group.
    let mut model = node_port_service(TrafficPolicy::Cluster);
    let node_view = node(&["192.168.1.10"]);
    let mut current = MapState::default();
    let value = FrontendValue {
        group_id: 7,
        backend_count: 0,
        flags: 0,
        affinity_timeout_seconds: 0,
    };
    for key in [
        tcp("10.96.0.3", 80, SCOPE_INTERNAL),
        tcp("192.168.1.10", 30080, SCOPE_INTERNAL),
        tcp("192.168.1.10", 30080, SCOPE_EXTERNAL),
    ] {
        current.frontends.insert(key, value);
    }
    model.internal_traffic_policy = TrafficPolicy::Local;
    let entries = desired_entries(&[model], &[], &node_view, &current);
    assert_eq!(
        entries.frontends[&tcp("192.168.1.10", 30080, SCOPE_EXTERNAL)].group_id,
        7
    );
    let local_id = entries.frontends[&tcp("10.96.0.3", 80, SCOPE_INTERNAL)].group_id;
    assert_ne!(local_id, 7);
    assert_ne!(local_id, 0);
}

#[test]
fn removing_a_backend_moves_only_the_last_one_into_its_slot() {
    let backends: Vec<BackendValue> = (1..=5)
        .map(|index| backend(&format!("10.0.0.{index}"), 80, false))
        .collect();
    let mut current = MapState::default();
    for (ordinal, value) in (0u32..).zip(&backends) {
        current.backend_slots.insert(
            BackendSlotKey {
                group_id: 3,
                ordinal,
            },
            *value,
        );
    }
    let without_second: Vec<BackendValue> = backends
        .iter()
        .copied()
        .filter(|value| *value != backends[1])
        .collect();
    let placed = place_backends(3, &without_second, &current);
    assert_eq!(
        placed,
        vec![backends[0], backends[4], backends[2], backends[3]]
    );
}

#[test]
fn adding_a_backend_appends_it_without_moving_the_others() {
    let backends: Vec<BackendValue> = (2..=4)
        .map(|index| backend(&format!("10.0.0.{index}"), 80, false))
        .collect();
    let mut current = MapState::default();
    for (ordinal, value) in (0u32..).zip(&backends) {
        current.backend_slots.insert(
            BackendSlotKey {
                group_id: 3,
                ordinal,
            },
            *value,
        );
    }
    let mut with_new = backends.clone();
    with_new.push(backend("10.0.0.1", 80, false));
    with_new.sort();
    let placed = place_backends(3, &with_new, &current);
    assert_eq!(
        placed,
        vec![
            backends[0],
            backends[1],
            backends[2],
            backend("10.0.0.1", 80, false)
        ]
    );
}

fn arbitrary_scenario() -> impl Strategy<Value = (Vec<ServiceModel>, Vec<EndpointSliceModel>)> {
    let service_strategy = (
        0u8..6,
        prop::collection::vec(
            (0u8..3, any::<bool>(), prop::option::of(30000u16..30004)),
            1..3,
        ),
        any::<bool>(),
        any::<bool>(),
        prop::option::of(1u32..100),
        any::<bool>(),
    );
    let slice_strategy = (
        0u8..6,
        0u8..3,
        prop::collection::vec((0u8..12, 0u8..4, any::<bool>()), 0..6),
    );
    (
        prop::collection::vec(service_strategy, 0..6),
        prop::collection::vec(slice_strategy, 0..10),
    )
        .prop_map(|(service_specs, slice_specs)| {
            let services = service_specs
                .into_iter()
                .map(
                    |(index, ports, external_local, internal_local, affinity, external_ip)| {
                        let mut model = service(
                            &format!("svc-{index}"),
                            &format!("10.96.0.{index}"),
                            ports
                                .into_iter()
                                .map(|(name, udp, node_port)| {
                                    port(
                                        &format!("p{name}"),
                                        if udp { Protocol::Udp } else { Protocol::Tcp },
                                        80 + u16::from(name),
                                        node_port,
                                    )
                                })
                                .collect(),
                        );
                        if external_local {
                            model.external_traffic_policy = TrafficPolicy::Local;
                        }
                        if internal_local {
                            model.internal_traffic_policy = TrafficPolicy::Local;
                        }
                        model.session_affinity_timeout_seconds = affinity;
                        if external_ip {
                            model.external_ips = vec![ip("192.0.2.1")];
                        }
                        model
                    },
                )
                .collect();
            let slices = slice_specs
                .into_iter()
                .map(|(service_index, port_name, endpoints)| {
                    let name = format!("p{port_name}");
                    slice(
                        &format!("svc-{service_index}"),
                        &[
                            (name.as_str(), Protocol::Tcp, 8000 + u16::from(port_name)),
                            (name.as_str(), Protocol::Udp, 8000 + u16::from(port_name)),
                        ],
                        endpoints
                            .into_iter()
                            .map(|(host, state, local)| {
                                endpoint(
                                    &format!("10.0.0.{host}"),
                                    [
                                        State::Ready,
                                        State::ServingTerminating,
                                        State::NotServingTerminating,
                                        State::NotReady,
                                    ][usize::from(state)],
                                    if local { NODE } else { "node-b" },
                                )
                            })
                            .collect(),
                    )
                })
                .collect();
            (services, slices)
        })
}

/// Scenarios shared with the syncer's property tests.
pub(crate) fn scenario_strategy(
) -> impl Strategy<Value = (Vec<ServiceModel>, Vec<EndpointSliceModel>)> {
    arbitrary_scenario()
}

/// The node of the property-test scenarios.
pub(crate) fn scenario_node() -> NodeView {
    node(&["192.168.1.10"])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn laying_out_against_its_own_result_changes_nothing((services, slices) in arbitrary_scenario()) {
        let node_view = scenario_node();
        let first = desired_entries(&services, &slices, &node_view, &MapState::default());
        let second = desired_entries(&services, &slices, &node_view, &first);
        prop_assert_eq!(&first, &second);
        prop_assert!(first.frontends_with_missing_slots().is_empty());
    }

    #[test]
    fn every_frontend_balances_over_exactly_its_groups_backends(
        (services, slices) in arbitrary_scenario(),
        (previous_services, previous_slices) in arbitrary_scenario(),
    ) {
        let node_view = scenario_node();
        // Laid out against an unrelated previous state, ids and slots differ but
        // what each frontend balances over does not.
        let previous = desired_entries(&previous_services, &previous_slices, &node_view, &MapState::default());
        let desired = desired_services(&services, &slices, &node_view);
        let entries = lay_out(&desired, &previous);
        prop_assert_eq!(entries.frontends.len(), desired.frontends.len());
        for (key, frontend) in &desired.frontends {
            prop_assert_eq!(sorted(backends_behind(&entries, key)), desired.groups[&frontend.group].clone());
        }
        // Distinct groups have distinct ids.
        let mut ids_by_group: std::collections::BTreeMap<u32, &GroupKey> = Default::default();
        for (key, frontend) in &desired.frontends {
            let id = entries.frontends[key].group_id;
            let owner = ids_by_group.entry(id).or_insert(&frontend.group);
            prop_assert_eq!(*owner, &frontend.group);
        }
        // No stray slots.
        let slot_count: usize = desired.groups.values().map(Vec::len).sum();
        prop_assert_eq!(entries.backend_slots.len(), slot_count);
    }
}

fn any_frontend_masquerades(desired: &DesiredServices) -> bool {
    desired
        .frontends
        .values()
        .any(|frontend| frontend.flags & FRONTEND_FLAG_MASQUERADE_REMOTE != 0)
}

#[test]
fn a_service_masquerades_exactly_when_one_of_its_frontends_is_flagged_for_it() {
    let cluster_ip = http_service("plain", "10.96.0.7");
    let mut with_affinity = cluster_ip.clone();
    with_affinity.session_affinity_timeout_seconds = Some(30);
    let mut internal_local = cluster_ip.clone();
    internal_local.internal_traffic_policy = TrafficPolicy::Local;
    let with_external = |policy: TrafficPolicy, external_ips: bool, load_balancer: bool| {
        let mut model = cluster_ip.clone();
        model.external_traffic_policy = policy;
        if external_ips {
            model.external_ips = vec![ip("192.0.2.10")];
        }
        if load_balancer {
            model.load_balancer_ips = vec![ip("198.51.100.1")];
        }
        model
    };
    let cases = [
        ("ClusterIP", cluster_ip.clone(), false),
        ("ClusterIP with ClientIP affinity", with_affinity, false),
        (
            "ClusterIP with internalTrafficPolicy Local",
            internal_local,
            false,
        ),
        (
            "NodePort, Cluster",
            node_port_service(TrafficPolicy::Cluster),
            true,
        ),
        (
            "NodePort, Local",
            node_port_service(TrafficPolicy::Local),
            false,
        ),
        (
            "externalIPs, Cluster",
            with_external(TrafficPolicy::Cluster, true, false),
            true,
        ),
        (
            "externalIPs, Local",
            with_external(TrafficPolicy::Local, true, false),
            false,
        ),
        (
            "LoadBalancer ingress, Cluster",
            with_external(TrafficPolicy::Cluster, false, true),
            true,
        ),
        (
            "LoadBalancer ingress, Local",
            with_external(TrafficPolicy::Local, false, true),
            false,
        ),
    ];
    for (name, model, expected) in cases {
        let slices = [mixed_slice(&model.name.name)];
        let desired = desired_services(
            std::slice::from_ref(&model),
            &slices,
            &node(&["192.168.1.10"]),
        );
        assert_eq!(
            masquerades_remote_backends(&model),
            expected,
            "{name}: the decision"
        );
        assert_eq!(
            any_frontend_masquerades(&desired),
            expected,
            "{name}: the frontends computed"
        );
    }
}

#[test]
fn a_node_port_on_a_node_without_an_address_of_its_family_may_install_the_rule_for_nothing() {
    // The decision errs on the side that costs tracking, never a connection.
    let model = node_port_service(TrafficPolicy::Cluster);
    let desired = desired_services(std::slice::from_ref(&model), &[], &node(&["fd00::10"]));
    assert!(!any_frontend_masquerades(&desired));
    assert!(masquerades_remote_backends(&model));
}
