//! The release of UDP flows whose backend left their Service: what each sync
//! asks the maps to delete (the maps' side is `loader::udp_flows`).

use std::collections::BTreeMap;
use std::net::IpAddr;

use switchyard_common::ipv4_mapped;

use super::tests::open_gate;
use super::*;
use crate::desired::{frontend_key, services_desired, NodeView, ServiceDesired};
use crate::diff::AddressPort;
use crate::maps::FakeServiceMaps;
use crate::model::{
    EndpointModel, EndpointPortModel, EndpointSliceModel, Protocol, ServiceModel, ServiceName,
    ServicePortModel, TargetPort, TrafficPolicy,
};

const CLUSTER_IP: [u8; 4] = [10, 96, 0, 10];
const NODE_IP: [u8; 4] = [192, 168, 1, 10];
const NODE_PORT: u16 = 30053;

fn ip(text: &str) -> IpAddr {
    text.parse().expect("test address is valid")
}

fn dns_service(protocol: Protocol) -> ServiceModel {
    ServiceModel {
        name: ServiceName::new("default", "dns"),
        cluster_ips: vec![ip("10.96.0.10")],
        external_ips: vec![],
        load_balancer_ips: vec![],
        ports: vec![ServicePortModel {
            name: "dns".into(),
            protocol,
            port: 53,
            node_port: Some(NODE_PORT),
            target_port: TargetPort::Number(5353),
        }],
        external_traffic_policy: TrafficPolicy::Cluster,
        internal_traffic_policy: TrafficPolicy::Cluster,
        session_affinity_timeout_seconds: None,
        load_balancer_source_ranges: Vec::new(),
    }
}

/// The Service's slice with endpoints `10.1.0.<host>` for each of `hosts`.
fn dns_slice(protocol: Protocol, hosts: &[u8]) -> EndpointSliceModel {
    EndpointSliceModel {
        slice_name: ServiceName::new("default", "dns-abc"),
        service: ServiceName::new("default", "dns"),
        family: crate::model::AddressFamily::Ipv4,
        ports: vec![EndpointPortModel {
            name: "dns".into(),
            protocol,
            port: 5353,
        }],
        endpoints: hosts
            .iter()
            .map(|host| EndpointModel {
                address: ip(&format!("10.1.0.{host}")),
                ready: true,
                serving: true,
                terminating: false,
                node_name: Some("node-a".into()),
                hints: Default::default(),
            })
            .collect(),
        last_change_trigger_time: None,
    }
}

fn node() -> NodeView {
    NodeView {
        name: "node-a".into(),
        zone: None,
        addresses: vec![ip("192.168.1.10")],
    }
}

fn services(protocol: Protocol, hosts: &[u8]) -> BTreeMap<ServiceName, ServiceDesired> {
    services_desired(
        &[dns_service(protocol)],
        &[dns_slice(protocol, hosts)],
        &node(),
    )
}

fn backend(host: u8) -> AddressPort {
    (ipv4_mapped([10, 1, 0, host]), 5353u16.to_be())
}

/// The release asking for the flows to `hosts` at the ClusterIP and the NodePort.
fn release_of(hosts: &[u8]) -> RemovedUdpBackends {
    let mut removed = RemovedUdpBackends::default();
    for frontend in [
        (ipv4_mapped(CLUSTER_IP), 53u16.to_be()),
        (ipv4_mapped(NODE_IP), NODE_PORT.to_be()),
    ] {
        removed
            .by_frontend
            .insert(frontend, hosts.iter().map(|host| backend(*host)).collect());
    }
    removed
}

/// A syncer and maps synced (a full sync) to the Service with `hosts`.
fn synced(protocol: Protocol, hosts: &[u8]) -> (FakeServiceMaps, Syncer) {
    let mut maps = FakeServiceMaps::default();
    let mut syncer = Syncer::restore(&maps).expect("restores");
    syncer
        .sync_services(open_gate(), services(protocol, hosts), &mut maps)
        .expect("applies");
    (maps, syncer)
}

fn partial_sync(
    syncer: &mut Syncer,
    maps: &mut FakeServiceMaps,
    changes: Vec<(ServiceName, Option<ServiceDesired>)>,
) -> ApplyReport {
    syncer
        .partial()
        .expect("a partial sync")
        .sync_changes(open_gate(), changes, maps)
        .expect("applies")
}

fn change_to(protocol: Protocol, hosts: &[u8]) -> Vec<(ServiceName, Option<ServiceDesired>)> {
    services(protocol, hosts)
        .into_iter()
        .map(|(name, desired)| (name, Some(desired)))
        .collect()
}

#[test]
fn a_udp_endpoint_leaving_its_slice_releases_its_flows_at_the_cluster_ip_and_the_node_port() {
    let (mut maps, mut syncer) = synced(Protocol::Udp, &[1, 2, 3]);
    assert!(
        maps.udp_flow_releases.is_empty(),
        "a first sync removes no backend"
    );

    let report = partial_sync(&mut syncer, &mut maps, change_to(Protocol::Udp, &[2, 3]));

    assert_eq!(maps.udp_flow_releases, vec![release_of(&[1])]);
    assert_eq!(report.udp_flow_entries_deleted, 2);
}

#[test]
fn a_udp_endpoint_leaving_releases_its_flows_in_a_full_sync_too() {
    let (mut maps, mut syncer) = synced(Protocol::Udp, &[1, 2, 3]);
    syncer
        .sync_services(open_gate(), services(Protocol::Udp, &[1, 3]), &mut maps)
        .expect("applies");
    assert_eq!(maps.udp_flow_releases, vec![release_of(&[2])]);
}

#[test]
fn a_tcp_endpoint_leaving_releases_nothing_as_kube_proxy_leaves_tcp_flows_to_time_out() {
    let (mut maps, mut syncer) = synced(Protocol::Tcp, &[1, 2, 3]);
    partial_sync(&mut syncer, &mut maps, change_to(Protocol::Tcp, &[2, 3]));
    let frontend = frontend_key(
        &ip("10.96.0.10"),
        53,
        Protocol::Tcp,
        switchyard_common::SCOPE_INTERNAL,
    );
    assert_eq!(
        maps.state.frontends[&frontend].backend_count, 2,
        "the control: the endpoint left"
    );
    assert!(maps.udp_flow_releases.is_empty());
}

#[test]
fn an_endpoint_joining_or_an_unchanged_resync_releases_nothing() {
    let (mut maps, mut syncer) = synced(Protocol::Udp, &[1, 2]);
    partial_sync(&mut syncer, &mut maps, change_to(Protocol::Udp, &[1, 2, 3]));
    syncer.reread_maps_before_next_sync();
    syncer
        .sync_services(open_gate(), services(Protocol::Udp, &[1, 2, 3]), &mut maps)
        .expect("applies");
    assert!(maps.udp_flow_releases.is_empty());
}

#[test]
fn a_service_losing_its_last_endpoint_releases_every_flow_so_the_next_datagram_is_refused() {
    let (mut maps, mut syncer) = synced(Protocol::Udp, &[1, 2]);
    partial_sync(&mut syncer, &mut maps, change_to(Protocol::Udp, &[]));
    let frontend = frontend_key(
        &ip("10.96.0.10"),
        53,
        Protocol::Udp,
        switchyard_common::SCOPE_INTERNAL,
    );
    assert_eq!(
        maps.state.frontends[&frontend].backend_count, 0,
        "the frontend stays, without backends, so the programs refuse new flows"
    );
    assert_eq!(maps.udp_flow_releases, vec![release_of(&[1, 2])]);
}

#[test]
fn a_deleted_service_releases_its_flows() {
    let (mut maps, mut syncer) = synced(Protocol::Udp, &[1, 2]);
    partial_sync(
        &mut syncer,
        &mut maps,
        vec![(ServiceName::new("default", "dns"), None)],
    );
    assert!(maps.state.frontends.is_empty());
    assert_eq!(maps.udp_flow_releases, vec![release_of(&[1, 2])]);
}

#[test]
fn a_failed_release_is_retried_with_the_next_sync_minus_the_backends_that_came_back() {
    let (mut maps, mut syncer) = synced(Protocol::Udp, &[1, 2, 3]);
    maps.failing_udp_flow_releases = true;
    let report = partial_sync(&mut syncer, &mut maps, change_to(Protocol::Udp, &[3]));
    assert_eq!(report.udp_flow_entries_deleted, 0);
    assert!(
        report.udp_flow_releases_pending,
        "the caller is told to sync again soon"
    );
    assert!(maps.udp_flow_releases.is_empty());

    // Endpoint 1 came back before the retry: its flows are live again.
    maps.failing_udp_flow_releases = false;
    let report = partial_sync(&mut syncer, &mut maps, change_to(Protocol::Udp, &[1, 3]));
    assert_eq!(maps.udp_flow_releases, vec![release_of(&[2])]);
    assert!(
        !report.udp_flow_releases_pending,
        "nothing is left to retry"
    );

    // Done: nothing is released again.
    syncer
        .sync_services(open_gate(), services(Protocol::Udp, &[1, 3]), &mut maps)
        .expect("applies");
    assert_eq!(maps.udp_flow_releases.len(), 1);
}

#[test]
fn a_failed_release_is_retried_by_a_partial_sync_without_any_change() {
    let (mut maps, mut syncer) = synced(Protocol::Udp, &[1, 2]);
    maps.failing_udp_flow_releases = true;
    partial_sync(&mut syncer, &mut maps, change_to(Protocol::Udp, &[2]));
    maps.failing_udp_flow_releases = false;

    let report = partial_sync(&mut syncer, &mut maps, Vec::new());

    assert_eq!(maps.udp_flow_releases, vec![release_of(&[1])]);
    assert_eq!(report.udp_flow_entries_deleted, 2);
    assert!(!report.udp_flow_releases_pending);
}

#[test]
fn a_release_is_timed_whether_it_succeeds_or_fails_and_an_apply_without_one_is_not() {
    let (mut maps, mut syncer) = synced(Protocol::Udp, &[1, 2, 3]);
    // The control: an apply that removes no backend runs no release.
    let unchanged = partial_sync(&mut syncer, &mut maps, change_to(Protocol::Udp, &[1, 2, 3]));
    assert_eq!(unchanged.udp_flow_release_elapsed, None);

    let released = partial_sync(&mut syncer, &mut maps, change_to(Protocol::Udp, &[2, 3]));
    assert!(released.udp_flow_release_elapsed.is_some());
    assert_eq!(released.udp_flow_entries_deleted, 2);

    maps.failing_udp_flow_releases = true;
    let failed = partial_sync(&mut syncer, &mut maps, change_to(Protocol::Udp, &[3]));
    assert!(failed.udp_flow_release_elapsed.is_some());
    assert_eq!(failed.udp_flow_entries_deleted, 0);
}
