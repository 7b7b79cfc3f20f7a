//! Topology hints, from Service and EndpointSlice objects to the backends of
//! each view; the last tests check every combination of two endpoints (and
//! random sets of more) against kube-proxy's rules written out plainly.

use std::collections::BTreeSet;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use proptest::prelude::*;
use switchyard_common::{BackendValue, SCOPE_EXTERNAL, SCOPE_INTERNAL};

use super::super::{
    address_bytes, frontend_key, service_desired, EndpointView, NodeView, ServiceDesired,
};
use crate::model::{
    endpoint_slice_from_v1, service_from_v1, EndpointSliceModel, Protocol, ServiceModel,
};

const NODE: &str = "node-a";
const ZONE: &str = "zone-a";
const CLUSTER_IP: &str = "10.96.0.10";
const NODE_IP: &str = "192.168.1.10";
const NODE_PORT: u16 = 30080;

fn node(zone: Option<&str>) -> NodeView {
    NodeView {
        name: NODE.to_string(),
        addresses: vec![NODE_IP.parse().expect("valid")],
        zone: zone.map(str::to_string),
    }
}

/// A NodePort Service with the given traffic policies and, if any, its
/// `trafficDistribution` (which kube-proxy never reads).
fn service(external: &str, internal: &str, distribution: Option<&str>) -> ServiceModel {
    let distribution = distribution
        .map(|value| format!("  trafficDistribution: {value}\n"))
        .unwrap_or_default();
    let text = format!(
        "metadata: {{name: web, namespace: default}}
spec:
  type: NodePort
  clusterIP: {CLUSTER_IP}
  externalTrafficPolicy: {external}
  internalTrafficPolicy: {internal}
{distribution}  ports: [{{name: http, port: 80, targetPort: 8080, nodePort: {NODE_PORT}}}]
"
    );
    let object: Service = serde_yaml::from_str(&text).expect("a valid Service");
    service_from_v1(&object).expect("converts").expect("served")
}

/// One endpoint of a slice: `10.0.0.<host>`, its conditions, node and hints.
#[derive(Clone, Debug)]
struct Endpoint {
    host: u8,
    ready: bool,
    serving: bool,
    terminating: bool,
    node: &'static str,
    zones: Vec<&'static str>,
    nodes: Vec<&'static str>,
}

fn ready(host: u8, node: &'static str) -> Endpoint {
    Endpoint {
        host,
        ready: true,
        serving: true,
        terminating: false,
        node,
        zones: vec![],
        nodes: vec![],
    }
}

impl Endpoint {
    fn for_zones(mut self, zones: &[&'static str]) -> Self {
        self.zones = zones.to_vec();
        self
    }

    fn for_nodes(mut self, nodes: &[&'static str]) -> Self {
        self.nodes = nodes.to_vec();
        self
    }

    fn not_ready(mut self) -> Self {
        (self.ready, self.serving, self.terminating) = (false, false, false);
        self
    }

    fn serving_terminating(mut self) -> Self {
        (self.ready, self.serving, self.terminating) = (false, true, true);
        self
    }

    fn address(&self) -> IpAddr {
        IpAddr::from([10, 0, 0, self.host])
    }

    fn yaml(&self) -> String {
        let names = |names: &[&str]| {
            names
                .iter()
                .map(|name| format!("{{name: {name}}}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut hints = Vec::new();
        if !self.zones.is_empty() {
            hints.push(format!("forZones: [{}]", names(&self.zones)));
        }
        if !self.nodes.is_empty() {
            hints.push(format!("forNodes: [{}]", names(&self.nodes)));
        }
        let hints = if hints.is_empty() {
            String::new()
        } else {
            format!(", hints: {{{}}}", hints.join(", "))
        };
        format!(
            "- {{addresses: [{}], nodeName: {}, conditions: {{ready: {}, serving: {}, terminating: {}}}{hints}}}\n",
            self.address(),
            self.node,
            self.ready,
            self.serving,
            self.terminating
        )
    }
}

fn slice(endpoints: &[Endpoint]) -> EndpointSliceModel {
    let items: String = endpoints.iter().map(Endpoint::yaml).collect();
    let text = format!(
        "metadata: {{name: web-1, namespace: default, labels: {{kubernetes.io/service-name: web}}}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints:{}",
        if items.is_empty() {
            " []\n".to_string()
        } else {
            format!("\n{items}")
        }
    );
    let object: EndpointSlice = serde_yaml::from_str(&text).expect("a valid EndpointSlice");
    endpoint_slice_from_v1(&object)
        .expect("converts")
        .expect("used")
}

/// The hosts (`10.0.0.<host>`) a frontend balances over.
fn hosts_behind(desired: &ServiceDesired, address: &str, port: u16, scope: u8) -> BTreeSet<u8> {
    let key = frontend_key(&address.parse().expect("valid"), port, Protocol::Tcp, scope);
    let (_, frontend) = desired
        .frontends
        .iter()
        .find(|(candidate, _)| *candidate == key)
        .expect("the frontend exists");
    desired
        .backends_of(&frontend.group)
        .expect("its group exists")
        .iter()
        .map(host_of)
        .collect()
}

fn host_of(backend: &BackendValue) -> u8 {
    backend.address[15]
}

/// The backends of the cluster-wide view (the ClusterIP of a Cluster policy).
fn cluster_wide(endpoints: &[Endpoint], node: &NodeView) -> BTreeSet<u8> {
    let desired = service_desired(
        &service("Cluster", "Cluster", None),
        &[&slice(endpoints)],
        node,
    );
    hosts_behind(&desired, CLUSTER_IP, 80, SCOPE_INTERNAL)
}

fn hosts(list: &[u8]) -> BTreeSet<u8> {
    list.iter().copied().collect()
}

#[test]
fn zone_hints_keep_only_the_ready_endpoints_hinted_for_this_nodes_zone() {
    let endpoints = [
        ready(1, NODE).for_zones(&[ZONE]),
        ready(2, "node-b").for_zones(&[ZONE]),
        ready(3, "node-c").for_zones(&["zone-b"]),
        ready(4, "node-d").for_zones(&["zone-b", ZONE]),
    ];
    assert_eq!(
        cluster_wide(&endpoints, &node(Some(ZONE))),
        hosts(&[1, 2, 4])
    );
    // The control: the same endpoints on a node of the other zone.
    assert_eq!(
        cluster_wide(&endpoints, &node(Some("zone-b"))),
        hosts(&[3, 4])
    );
}

#[test]
fn one_ready_endpoint_without_a_zone_hint_turns_zone_hints_off() {
    let endpoints = [
        ready(1, NODE).for_zones(&[ZONE]),
        ready(2, "node-b").for_zones(&["zone-b"]),
        ready(3, "node-c"),
    ];
    assert_eq!(
        cluster_wide(&endpoints, &node(Some(ZONE))),
        hosts(&[1, 2, 3])
    );
    // Without the unhinted one the hints apply.
    assert_eq!(
        cluster_wide(&endpoints[..2], &node(Some(ZONE))),
        hosts(&[1])
    );
}

#[test]
fn endpoints_that_are_not_ready_do_not_turn_the_hints_off() {
    let endpoints = [
        ready(1, NODE).for_zones(&[ZONE]),
        ready(2, "node-b").for_zones(&["zone-b"]),
        ready(3, "node-c").not_ready(),
        ready(4, "node-d").serving_terminating(),
    ];
    assert_eq!(cluster_wide(&endpoints, &node(Some(ZONE))), hosts(&[1]));
}

#[test]
fn zone_hints_that_name_no_endpoint_for_this_zone_are_ignored() {
    let endpoints = [
        ready(1, "node-b").for_zones(&["zone-b"]),
        ready(2, "node-c").for_zones(&["zone-c"]),
    ];
    assert_eq!(cluster_wide(&endpoints, &node(Some(ZONE))), hosts(&[1, 2]));
}

#[test]
fn a_node_without_a_zone_label_ignores_zone_hints() {
    let endpoints = [
        ready(1, NODE).for_zones(&[ZONE]),
        ready(2, "node-b").for_zones(&["zone-b"]),
    ];
    assert_eq!(cluster_wide(&endpoints, &node(None)), hosts(&[1, 2]));
    assert_eq!(cluster_wide(&endpoints, &node(Some(""))), hosts(&[1, 2]));
    assert_eq!(cluster_wide(&endpoints, &node(Some(ZONE))), hosts(&[1]));
}

#[test]
fn node_hints_come_before_zone_hints_when_every_ready_endpoint_has_one() {
    let endpoints = [
        ready(1, NODE).for_zones(&[ZONE]).for_nodes(&[NODE]),
        ready(2, "node-b").for_zones(&[ZONE]).for_nodes(&["node-b"]),
        ready(3, "node-c")
            .for_zones(&["zone-b"])
            .for_nodes(&["node-c"]),
    ];
    assert_eq!(cluster_wide(&endpoints, &node(Some(ZONE))), hosts(&[1]));
}

#[test]
fn node_hints_that_miss_this_node_or_one_endpoint_fall_back_to_zone_hints() {
    let for_other_nodes = [
        ready(1, "node-b").for_zones(&[ZONE]).for_nodes(&["node-b"]),
        ready(2, "node-c").for_zones(&[ZONE]).for_nodes(&["node-c"]),
        ready(3, "node-d")
            .for_zones(&["zone-b"])
            .for_nodes(&["node-d"]),
    ];
    assert_eq!(
        cluster_wide(&for_other_nodes, &node(Some(ZONE))),
        hosts(&[1, 2])
    );
    let one_without = [
        ready(1, NODE).for_zones(&[ZONE]).for_nodes(&[NODE]),
        ready(2, "node-b").for_zones(&[ZONE]),
        ready(3, "node-c")
            .for_zones(&["zone-b"])
            .for_nodes(&["node-c"]),
    ];
    assert_eq!(
        cluster_wide(&one_without, &node(Some(ZONE))),
        hosts(&[1, 2])
    );
}

#[test]
fn the_terminating_fall_back_ignores_hints() {
    let endpoints = [
        ready(1, NODE).serving_terminating().for_zones(&[ZONE]),
        ready(2, "node-b")
            .serving_terminating()
            .for_zones(&["zone-b"]),
    ];
    assert_eq!(cluster_wide(&endpoints, &node(Some(ZONE))), hosts(&[1, 2]));
}

#[test]
fn hints_narrow_the_cluster_wide_frontends_and_never_a_local_policy() {
    let endpoints = [
        ready(1, NODE).for_zones(&["zone-b"]),
        ready(2, "node-b").for_zones(&[ZONE]),
        ready(3, "node-c").for_zones(&["zone-b"]),
    ];
    let zone_a = node(Some(ZONE));
    let slices = [slice(&endpoints)];
    let slices: Vec<&EndpointSliceModel> = slices.iter().collect();
    // Cluster policies: the ClusterIP, and the NodePort in both scopes.
    let cluster = service_desired(&service("Cluster", "Cluster", None), &slices, &zone_a);
    for (address, port, scope) in [
        (CLUSTER_IP, 80, SCOPE_INTERNAL),
        (NODE_IP, NODE_PORT, SCOPE_INTERNAL),
        (NODE_IP, NODE_PORT, SCOPE_EXTERNAL),
    ] {
        assert_eq!(
            hosts_behind(&cluster, address, port, scope),
            hosts(&[2]),
            "{address}:{port} scope {scope}"
        );
    }
    // Local policies: the local endpoint, hinted for another zone, all the same;
    // the pods' view of the NodePort (cluster-wide) is narrowed.
    let local = service_desired(&service("Local", "Local", None), &slices, &zone_a);
    assert_eq!(
        hosts_behind(&local, CLUSTER_IP, 80, SCOPE_INTERNAL),
        hosts(&[1])
    );
    assert_eq!(
        hosts_behind(&local, NODE_IP, NODE_PORT, SCOPE_EXTERNAL),
        hosts(&[1])
    );
    assert_eq!(
        hosts_behind(&local, NODE_IP, NODE_PORT, SCOPE_INTERNAL),
        hosts(&[2])
    );
    assert!(local
        .groups
        .iter()
        .any(|(group, _)| group.view == EndpointView::Local));
}

#[test]
fn traffic_distribution_is_read_through_the_hints_alone() {
    // kube-proxy never reads the field: the EndpointSlice controller turns it
    // into hints. With hints, the hints decide; without, every endpoint.
    let hinted = [
        ready(1, NODE).for_zones(&[ZONE]),
        ready(2, "node-b").for_zones(&["zone-b"]),
    ];
    let unhinted = [ready(1, NODE), ready(2, "node-b")];
    for distribution in [None, Some("PreferClose"), Some("PreferSameZone")] {
        let with = service("Cluster", "Cluster", distribution);
        let zone_a = node(Some(ZONE));
        let narrowed = service_desired(&with, &[&slice(&hinted)], &zone_a);
        assert_eq!(
            hosts_behind(&narrowed, CLUSTER_IP, 80, SCOPE_INTERNAL),
            hosts(&[1]),
            "{distribution:?}"
        );
        let every = service_desired(&with, &[&slice(&unhinted)], &zone_a);
        assert_eq!(
            hosts_behind(&every, CLUSTER_IP, 80, SCOPE_INTERNAL),
            hosts(&[1, 2]),
            "{distribution:?}"
        );
    }
}

#[test]
fn an_endpoint_listed_by_two_slices_keeps_the_hints_of_the_copy_that_has_them() {
    let zone_a = node(Some(ZONE));
    let with_hints = slice(&[
        ready(1, NODE).for_zones(&[ZONE]),
        ready(2, "node-b").for_zones(&["zone-b"]),
    ]);
    let mut moving = slice(&[ready(2, "node-b")]);
    moving.slice_name.name = "web-2".into();
    let desired = service_desired(
        &service("Cluster", "Cluster", None),
        &[&moving, &with_hints],
        &zone_a,
    );
    assert_eq!(
        hosts_behind(&desired, CLUSTER_IP, 80, SCOPE_INTERNAL),
        hosts(&[1])
    );
}

// Every combination of two endpoints, and random sets of up to six, against
// kube-proxy's rules written out as plainly as possible.

/// kube-proxy's cluster-wide endpoints (`CategorizeEndpoints`), spelled out.
fn expected_cluster_wide(endpoints: &[Endpoint], node: &NodeView) -> BTreeSet<u8> {
    let zone = node.zone.clone().unwrap_or_default();
    let ready: Vec<&Endpoint> = endpoints.iter().filter(|endpoint| endpoint.ready).collect();
    let every_has_node_hint = ready.iter().all(|endpoint| !endpoint.nodes.is_empty());
    let one_for_this_node = ready
        .iter()
        .any(|endpoint| endpoint.nodes.contains(&node.name.as_str()));
    let every_has_zone_hint = ready.iter().all(|endpoint| !endpoint.zones.is_empty());
    let one_for_this_zone = ready
        .iter()
        .any(|endpoint| !zone.is_empty() && endpoint.zones.contains(&zone.as_str()));
    let chosen: BTreeSet<u8> = if !ready.is_empty() && every_has_node_hint && one_for_this_node {
        ready
            .iter()
            .filter(|endpoint| endpoint.nodes.contains(&node.name.as_str()))
            .map(|endpoint| endpoint.host)
            .collect()
    } else if !ready.is_empty() && every_has_zone_hint && one_for_this_zone {
        ready
            .iter()
            .filter(|endpoint| endpoint.zones.contains(&zone.as_str()))
            .map(|endpoint| endpoint.host)
            .collect()
    } else {
        ready.iter().map(|endpoint| endpoint.host).collect()
    };
    if !chosen.is_empty() {
        return chosen;
    }
    endpoints
        .iter()
        .filter(|endpoint| endpoint.serving && endpoint.terminating)
        .map(|endpoint| endpoint.host)
        .collect()
}

/// kube-proxy's local endpoints: ready local ones, else serving terminating
/// local ones; never narrowed by hints.
fn expected_local(endpoints: &[Endpoint]) -> BTreeSet<u8> {
    let local = || endpoints.iter().filter(|endpoint| endpoint.node == NODE);
    let ready: BTreeSet<u8> = local()
        .filter(|endpoint| endpoint.ready)
        .map(|endpoint| endpoint.host)
        .collect();
    if !ready.is_empty() {
        return ready;
    }
    local()
        .filter(|endpoint| endpoint.serving && endpoint.terminating)
        .map(|endpoint| endpoint.host)
        .collect()
}

/// A Service whose ClusterIP shows the cluster-wide view and whose NodePort,
/// from outside, the local one.
fn both_views_service() -> &'static ServiceModel {
    static SERVICE: std::sync::OnceLock<ServiceModel> = std::sync::OnceLock::new();
    SERVICE.get_or_init(|| service("Local", "Cluster", None))
}

fn check_against_kube_proxy(endpoints: &[Endpoint], node: &NodeView) {
    let slices = [slice(endpoints)];
    let slices: Vec<&EndpointSliceModel> = slices.iter().collect();
    let cluster = expected_cluster_wide(endpoints, node);
    let local = expected_local(endpoints);
    let desired = service_desired(both_views_service(), &slices, node);
    assert_eq!(
        hosts_behind(&desired, CLUSTER_IP, 80, SCOPE_INTERNAL),
        cluster,
        "cluster-wide view of {endpoints:?} on {node:?}"
    );
    assert_eq!(
        hosts_behind(&desired, NODE_IP, NODE_PORT, SCOPE_EXTERNAL),
        local,
        "local view of {endpoints:?} on {node:?}"
    );
}

/// Every endpoint an exhaustive test tries in one position.
fn endpoint_variants(host: u8) -> Vec<Endpoint> {
    let mut variants = Vec::new();
    for node_name in [NODE, "node-b"] {
        for zones in [&[][..], &[ZONE][..], &["zone-b"][..], &[ZONE, "zone-b"][..]] {
            for nodes in [&[][..], &[NODE][..], &["node-b"][..]] {
                let base = ready(host, node_name).for_zones(zones).for_nodes(nodes);
                variants.push(base.clone());
                variants.push(base.clone().serving_terminating());
                variants.push(base.not_ready());
            }
        }
    }
    variants
}

#[test]
fn every_combination_of_two_endpoints_gets_kube_proxys_cluster_wide_and_local_endpoints() {
    let firsts = endpoint_variants(1);
    let seconds = endpoint_variants(2);
    let nodes = [node(Some(ZONE)), node(Some("zone-b")), node(None)];
    let mut checked = 0;
    for first in &firsts {
        for second in &seconds {
            for node in &nodes {
                check_against_kube_proxy(&[first.clone(), second.clone()], node);
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 72 * 72 * 3);
}

fn any_endpoint(host: u8) -> impl Strategy<Value = Endpoint> {
    (
        0..3u8,
        prop::sample::select(vec![NODE, "node-b", "node-c"]),
        prop::sample::subsequence(vec![ZONE, "zone-b", "zone-c"], 0..=2),
        prop::sample::subsequence(vec![NODE, "node-b", "node-c"], 0..=2),
    )
        .prop_map(move |(state, node_name, zones, nodes)| {
            let endpoint = ready(host, node_name).for_zones(&zones).for_nodes(&nodes);
            match state {
                0 => endpoint,
                1 => endpoint.serving_terminating(),
                _ => endpoint.not_ready(),
            }
        })
}

fn any_endpoints() -> impl Strategy<Value = Vec<Endpoint>> {
    (0..=6usize).prop_flat_map(|count| {
        (1..=count as u8)
            .map(any_endpoint)
            .collect::<Vec<_>>()
            .prop_map(|endpoints| endpoints)
    })
}

proptest! {
    #[test]
    fn any_set_of_endpoints_gets_kube_proxys_cluster_wide_and_local_endpoints(
        endpoints in any_endpoints(),
        zone in prop::option::of(prop::sample::select(vec![ZONE, "zone-b", ""])),
    ) {
        check_against_kube_proxy(&endpoints, &node(zone));
    }
}

#[test]
fn hints_are_read_from_v1_and_v1beta1_slices_sorted_without_duplicates_or_empty_names() {
    let endpoints = "endpoints:
- addresses: [10.0.0.1]
  hints: {forZones: [{name: zone-b}, {name: zone-a}, {name: zone-b}, {name: ''}], forNodes: [{name: node-a}]}
- addresses: [10.0.0.2]
";
    let metadata =
        "metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
";
    let v1: EndpointSlice =
        serde_yaml::from_str(&format!("{metadata}{endpoints}")).expect("a valid EndpointSlice");
    let v1 = endpoint_slice_from_v1(&v1)
        .expect("converts")
        .expect("used");
    let v1beta1: crate::model::v1beta1::EndpointSlice =
        serde_yaml::from_str(&format!("{metadata}{endpoints}")).expect("a valid EndpointSlice");
    let v1beta1 = crate::model::v1beta1::endpoint_slice_from_v1beta1(&v1beta1)
        .expect("converts")
        .expect("used");
    for model in [v1, v1beta1] {
        let hints = &model.endpoints[0].hints;
        assert_eq!(&*hints.zones, ["zone-a".to_string(), "zone-b".to_string()]);
        assert_eq!(&*hints.nodes, ["node-a".to_string()]);
        assert!(model.endpoints[1].hints.zones.is_empty());
        assert!(model.endpoints[1].hints.nodes.is_empty());
    }
}

#[test]
fn backends_keep_their_addresses_and_ports() {
    // The hosts above are read from the last byte: check the whole value once.
    let desired = service_desired(
        &service("Cluster", "Cluster", None),
        &[&slice(&[ready(7, NODE)])],
        &node(Some(ZONE)),
    );
    let key = frontend_key(&CLUSTER_IP.parse().expect("valid"), 80, Protocol::Tcp, 0);
    let (_, frontend) = desired
        .frontends
        .iter()
        .find(|(candidate, _)| *candidate == key)
        .expect("the ClusterIP");
    let backends = desired.backends_of(&frontend.group).expect("its group");
    assert_eq!(backends.len(), 1);
    assert_eq!(
        backends[0].address,
        address_bytes(&"10.0.0.7".parse().expect("valid"))
    );
    assert_eq!(u16::from_be(backends[0].port_big_endian), 8080);
}
