use std::net::IpAddr;

use switchyard_common::{
    FRONTEND_FLAG_NODE_OUTSIDE_SOURCE_RANGES, FRONTEND_FLAG_SOURCE_RANGES, SCOPE_EXTERNAL,
    SCOPE_INTERNAL,
};

use super::*;
use crate::desired::{frontend_key, service_desired, source_ranges, NodeView};
use crate::model::{
    Protocol, ServiceModel, ServiceName, ServicePortModel, TargetPort, TrafficPolicy,
};

fn ip(text: &str) -> IpAddr {
    text.parse().expect("test address is valid")
}

fn ips(texts: &[&str]) -> Vec<IpAddr> {
    texts.iter().map(|text| ip(text)).collect()
}

fn values(texts: &[&str]) -> Vec<String> {
    texts.iter().map(|text| text.to_string()).collect()
}

fn settings(addresses: &[&str], localhost: bool) -> NodePortSettings {
    NodePortSettings {
        addresses: NodePortAddresses::parse(&values(addresses)).expect("valid setting"),
        localhost,
        node_ips: Vec::new(),
    }
}

/// The host's global addresses: two interfaces' and a docker bridge's, IPv6 too.
const LOCAL: [&str; 4] = ["10.99.0.11", "172.17.0.1", "192.168.7.2", "fd00::11"];
/// The Node's addresses, InternalIPs first.
const NODE: [&str; 3] = ["10.99.0.11", "fd00::11", "192.0.2.7"];

fn served(settings: &NodePortSettings) -> Vec<IpAddr> {
    served_addresses(settings, &ips(&LOCAL), &ips(&NODE))
}

#[test]
fn kube_proxys_values_parse_and_anything_else_is_refused() {
    assert_eq!(NodePortAddresses::parse(&[]), Ok(NodePortAddresses::Every));
    assert_eq!(
        NodePortAddresses::parse(&values(&["", " "])),
        Ok(NodePortAddresses::Every)
    );
    assert_eq!(
        NodePortAddresses::parse(&values(&["primary"])),
        Ok(NodePortAddresses::Primary)
    );
    let Ok(NodePortAddresses::Ranges(ranges)) =
        NodePortAddresses::parse(&values(&["10.0.0.0/8, 192.168.7.0/24", "fd00::/64"]))
    else {
        panic!("three ranges expected");
    };
    assert_eq!(ranges.len(), 3);
    assert!(NodePortAddresses::parse(&values(&["primary", "10.0.0.0/8"])).is_err());
    assert!(NodePortAddresses::parse(&values(&["10.0.0.0/8", "10.0.0.1"])).is_err());
    assert!(NodePortAddresses::parse(&values(&["all"])).is_err());
}

#[test]
fn by_default_every_local_address_and_the_nodes_and_localhost_are_served() {
    assert_eq!(NodePortSettings::default(), settings(&[], true));
    assert_eq!(
        served(&NodePortSettings::default()),
        ips(&[
            "10.99.0.11",
            "127.0.0.1",
            "172.17.0.1",
            "192.0.2.7",
            "192.168.7.2",
            "fd00::11"
        ])
    );
}

#[test]
fn localhost_is_served_only_when_the_flag_is_on_and_the_setting_selects_it() {
    let without = served(&settings(&[], false));
    assert!(!without.contains(&LOCALHOST));
    assert!(without.contains(&ip("172.17.0.1")), "the rest stays");
    // A range list must hold 127.0.0.1 (kube-proxy 1.24+).
    assert!(!served(&settings(&["10.0.0.0/8"], true)).contains(&LOCALHOST));
    assert!(served(&settings(&["10.0.0.0/8", "127.0.0.0/8"], true)).contains(&LOCALHOST));
    assert!(!served(&settings(&["10.0.0.0/8", "127.0.0.0/8"], false)).contains(&LOCALHOST));
    // `primary` never selects it; `::1` is never served.
    assert!(!served(&settings(&["primary"], true)).contains(&LOCALHOST));
    let with_ipv6_loopback = served_addresses(
        &settings(&["::/0", "0.0.0.0/0"], true),
        &ips(&["::1", "127.0.0.1", "10.99.0.11"]),
        &[],
    );
    assert_eq!(with_ipv6_loopback, ips(&["10.99.0.11", "127.0.0.1"]));
}

#[test]
fn a_range_list_keeps_only_the_local_addresses_it_holds() {
    assert_eq!(
        served(&settings(&["192.168.7.0/24", "fd00::/64"], true)),
        ips(&["192.168.7.2", "fd00::11"])
    );
    // A range holding no local address serves nothing (kube-proxy logs it).
    assert_eq!(
        served(&settings(&["203.0.113.0/24"], true)),
        Vec::<IpAddr>::new()
    );
}

#[test]
fn primary_is_the_first_node_address_of_each_family_and_node_ips_come_first() {
    assert_eq!(
        served(&settings(&["primary"], true)),
        ips(&["10.99.0.11", "fd00::11"])
    );
    let node_ips = NodePortSettings {
        node_ips: ips(&["192.168.7.2", "10.99.0.11"]),
        ..settings(&["primary"], true)
    };
    // `--node-ip` replaces the Node's addresses: no IPv6 one is left.
    assert_eq!(served(&node_ips), ips(&["192.168.7.2"]));
    // No address of a family known: that family serves no NodePort.
    assert_eq!(
        served_addresses(&settings(&["primary"], true), &ips(&LOCAL), &[]),
        Vec::<IpAddr>::new()
    );
}

#[test]
fn node_ips_stand_for_the_nodes_addresses_next_to_the_local_ones() {
    let node_ips = NodePortSettings {
        node_ips: ips(&["10.99.0.12"]),
        ..NodePortSettings::default()
    };
    // 192.0.2.7 was the Node's only: replaced.
    assert_eq!(
        served(&node_ips),
        ips(&[
            "10.99.0.11",
            "10.99.0.12",
            "127.0.0.1",
            "172.17.0.1",
            "192.168.7.2",
            "fd00::11"
        ])
    );
    let restricted = NodePortSettings {
        node_ips: ips(&["10.99.0.12"]),
        ..settings(&["10.99.0.12/32", "192.168.0.0/16"], true)
    };
    assert_eq!(served(&restricted), ips(&["10.99.0.12", "192.168.7.2"]));
}

fn node_port_service() -> ServiceModel {
    ServiceModel {
        name: ServiceName::new("default", "web"),
        cluster_ips: vec![ip("10.96.0.10")],
        external_ips: vec![],
        load_balancer_ips: vec![ip("198.51.100.7")],
        ports: vec![ServicePortModel {
            name: "http".into(),
            protocol: Protocol::Tcp,
            port: 80,
            node_port: Some(30080),
            target_port: TargetPort::Number(8080),
        }],
        external_traffic_policy: TrafficPolicy::Cluster,
        internal_traffic_policy: TrafficPolicy::Cluster,
        session_affinity_timeout_seconds: None,
        load_balancer_source_ranges: Vec::new(),
    }
}

fn node_view(addresses: &[&str]) -> NodeView {
    NodeView {
        name: "node-a".into(),
        addresses: ips(addresses),
        zone: None,
    }
}

#[test]
fn a_localhost_node_port_gets_an_internal_frontend_only_and_a_node_address_both() {
    let desired = service_desired(
        &node_port_service(),
        &[],
        &node_view(&["10.99.0.11", "127.0.0.1"]),
    );
    let has = |address: &str, scope: u8| {
        desired
            .frontend_keys()
            .any(|key| *key == frontend_key(&ip(address), 30080, Protocol::Tcp, scope))
    };
    assert!(has("127.0.0.1", SCOPE_INTERNAL));
    assert!(!has("127.0.0.1", SCOPE_EXTERNAL));
    assert!(has("10.99.0.11", SCOPE_INTERNAL));
    assert!(has("10.99.0.11", SCOPE_EXTERNAL));
}

#[test]
fn localhost_does_not_count_as_a_node_address_inside_source_ranges() {
    let flags = |range: &str, addresses: &[&str]| {
        let mut service = node_port_service();
        service.load_balancer_source_ranges =
            vec![crate::model::source_ranges::parse_cidr(range).expect("valid")];
        source_ranges::load_balancer_filter(
            &service,
            crate::model::AddressFamily::Ipv4,
            &node_view(addresses),
        )
        .expect("filtered")
        .flags
    };
    assert_eq!(
        flags("127.0.0.0/8", &["10.99.0.11", "127.0.0.1"]),
        FRONTEND_FLAG_SOURCE_RANGES | FRONTEND_FLAG_NODE_OUTSIDE_SOURCE_RANGES
    );
    // The control: a node address inside the ranges admits the node.
    assert_eq!(
        flags("10.99.0.0/16", &["10.99.0.11", "127.0.0.1"]),
        FRONTEND_FLAG_SOURCE_RANGES
    );
}
