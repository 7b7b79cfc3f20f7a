//! `loadBalancerSourceRanges` from Service objects to map entries: which
//! frontends are filtered, what they admit, and how syncs write and prune it.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use switchyard_common::{
    FrontendKey, FRONTEND_FLAG_MASQUERADE_REMOTE, FRONTEND_FLAG_NODE_OUTSIDE_SOURCE_RANGES,
    FRONTEND_FLAG_SOURCE_RANGES, SCOPE_EXTERNAL, SCOPE_INTERNAL,
};

use super::*;
use crate::desired::{frontend_key, service_desired, ServiceDesired};
use crate::gate::{Gate, GateInput, GateOpen};
use crate::maps::{FakeServiceMaps, MapState, SourceRangeEntry};
use crate::model::source_ranges::parse_cidr;
use crate::model::{endpoint_slice_from_v1, service_from_v1, EndpointSliceModel, Protocol};
use crate::sync::inputs::{SyncInputs, SyncKind};
use crate::sync::Syncer;

const CLUSTER_IP: &str = "10.96.0.50";
const EXTERNAL_IP: &str = "203.0.113.9";
const LOAD_BALANCER_IPS: [&str; 2] = ["198.51.100.7", "198.51.100.8"];
const NODE_PORT: u16 = 30050;
const NODE_ADDRESS: &str = "192.168.50.1";

fn ip(text: &str) -> IpAddr {
    text.parse().expect("test address")
}

/// A LoadBalancer Service `name` with a cluster IP, an external IP, a NodePort,
/// two load-balancer addresses and `ranges` (YAML flow items, e.g. `"10.0.0.0/8"`),
/// read the way the agent reads it.
fn load_balancer_yaml(name: &str, ranges: &str, annotations: &str) -> ServiceModel {
    let yaml = format!(
        "metadata: {{name: {name}, namespace: default, annotations: {{{annotations}}}}}
spec:
  type: LoadBalancer
  clusterIP: {CLUSTER_IP}
  externalIPs: [{EXTERNAL_IP}]
  loadBalancerSourceRanges: [{ranges}]
  ports: [{{name: http, port: 80, targetPort: 8080, nodePort: {NODE_PORT}, protocol: TCP}}]
status:
  loadBalancer:
    ingress: [{{ip: {}}}, {{ip: {}}}]
",
        LOAD_BALANCER_IPS[0], LOAD_BALANCER_IPS[1]
    );
    let service: Service = serde_yaml::from_str(&yaml).expect("test Service YAML");
    service_from_v1(&service)
        .expect("converts")
        .expect("a LoadBalancer Service is kept")
}

fn load_balancer(ranges: &str) -> ServiceModel {
    load_balancer_yaml("web", ranges, "")
}

fn slice(service: &str) -> EndpointSliceModel {
    let yaml = format!(
        "metadata: {{name: {service}-1, namespace: default, labels: {{kubernetes.io/service-name: {service}}}}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints: [{{addresses: [10.244.0.11], nodeName: node-a}}]
"
    );
    let slice: EndpointSlice = serde_yaml::from_str(&yaml).expect("test slice YAML");
    endpoint_slice_from_v1(&slice)
        .expect("converts")
        .expect("kept")
}

fn node(addresses: &[&str]) -> NodeView {
    NodeView {
        name: "node-a".into(),
        addresses: addresses.iter().map(|address| ip(address)).collect(),
        ..NodeView::default()
    }
}

fn share(service: &ServiceModel, node: &NodeView) -> ServiceDesired {
    let slice = slice(&service.name.name);
    service_desired(service, &[&slice], node)
}

fn key(address: &str, port: u16, scope: u8) -> FrontendKey {
    frontend_key(&ip(address), port, Protocol::Tcp, scope)
}

fn prefix(text: &str) -> SourcePrefix {
    source_prefix(&parse_cidr(text).expect("test range"))
}

fn host(address: &str) -> SourcePrefix {
    prefix(&format!("{address}/32"))
}

fn frontend<'a>(
    share: &'a ServiceDesired,
    key: &FrontendKey,
) -> &'a crate::desired::DesiredFrontend {
    &share
        .frontends
        .iter()
        .find(|(candidate, _)| candidate == key)
        .unwrap_or_else(|| panic!("no frontend {key:?}"))
        .1
}

fn load_balancer_keys() -> Vec<FrontendKey> {
    LOAD_BALANCER_IPS
        .iter()
        .flat_map(|address| {
            [
                key(address, 80, SCOPE_EXTERNAL),
                key(address, 80, SCOPE_INTERNAL),
            ]
        })
        .collect()
}

fn unfiltered_keys() -> Vec<FrontendKey> {
    vec![
        key(CLUSTER_IP, 80, SCOPE_INTERNAL),
        key(EXTERNAL_IP, 80, SCOPE_EXTERNAL),
        key(EXTERNAL_IP, 80, SCOPE_INTERNAL),
        key(NODE_ADDRESS, NODE_PORT, SCOPE_EXTERNAL),
        key(NODE_ADDRESS, NODE_PORT, SCOPE_INTERNAL),
    ]
}

#[test]
fn only_the_load_balancer_frontends_of_a_service_with_source_ranges_are_filtered_in_both_scopes() {
    let share = share(
        &load_balancer("192.168.60.0/24, 10.20.0.0/16"),
        &node(&[NODE_ADDRESS]),
    );
    for key in load_balancer_keys() {
        let frontend = frontend(&share, &key);
        assert_eq!(
            frontend.flags
                & (FRONTEND_FLAG_SOURCE_RANGES | FRONTEND_FLAG_NODE_OUTSIDE_SOURCE_RANGES),
            FRONTEND_FLAG_SOURCE_RANGES | FRONTEND_FLAG_NODE_OUTSIDE_SOURCE_RANGES,
            "{key:?}"
        );
        assert_eq!(
            frontend.source_ranges,
            vec![prefix("10.20.0.0/16"), prefix("192.168.60.0/24")],
            "{key:?}"
        );
    }
    // The filter adds to the frontend's other flags.
    assert_ne!(
        frontend(&share, &key(LOAD_BALANCER_IPS[0], 80, SCOPE_EXTERNAL)).flags
            & FRONTEND_FLAG_MASQUERADE_REMOTE,
        0
    );
    // ClusterIP, external IPs and NodePorts of the same Service: never filtered.
    for key in unfiltered_keys() {
        let frontend = frontend(&share, &key);
        assert_eq!(
            frontend.flags
                & (FRONTEND_FLAG_SOURCE_RANGES | FRONTEND_FLAG_NODE_OUTSIDE_SOURCE_RANGES),
            0,
            "{key:?}"
        );
        assert!(frontend.source_ranges.is_empty(), "{key:?}");
    }
}

#[test]
fn a_range_holding_a_node_address_lets_the_node_in_and_admits_the_load_balancer_addresses_as_sources(
) {
    let share = share(&load_balancer("192.168.50.0/24"), &node(&[NODE_ADDRESS]));
    for key in load_balancer_keys() {
        let frontend = frontend(&share, &key);
        assert_eq!(
            frontend.flags
                & (FRONTEND_FLAG_SOURCE_RANGES | FRONTEND_FLAG_NODE_OUTSIDE_SOURCE_RANGES),
            FRONTEND_FLAG_SOURCE_RANGES,
            "{key:?}"
        );
        assert_eq!(
            frontend.source_ranges,
            vec![
                prefix("192.168.50.0/24"),
                host(LOAD_BALANCER_IPS[0]),
                host(LOAD_BALANCER_IPS[1]),
            ]
        );
    }
}

#[test]
fn no_range_of_the_family_or_a_range_of_every_address_filters_nothing() {
    // The last: every entry is skipped, which leaves no range, as in kube-proxy.
    for ranges in ["", "fd00::/8", "10.0.0.0/8, 0.0.0.0/0", "not-a-cidr"] {
        let share = share(&load_balancer(ranges), &node(&[NODE_ADDRESS]));
        for (key, frontend) in &share.frontends {
            assert_eq!(
                frontend.flags & FRONTEND_FLAG_SOURCE_RANGES,
                0,
                "{ranges}: {key:?}"
            );
            assert!(frontend.source_ranges.is_empty(), "{ranges}: {key:?}");
        }
    }
}

#[test]
fn a_range_that_is_no_cidr_is_skipped_and_the_others_still_filter() {
    let service = load_balancer("' 192.168.60.0/24', not-a-cidr, '010.020.0.0/16'");
    assert_eq!(service.load_balancer_source_ranges.len(), 2);
    let share = share(&service, &node(&[NODE_ADDRESS]));
    assert_eq!(
        frontend(&share, &key(LOAD_BALANCER_IPS[0], 80, SCOPE_EXTERNAL)).source_ranges,
        vec![prefix("10.20.0.0/16"), prefix("192.168.60.0/24")]
    );
}

#[test]
fn the_ranges_are_read_from_the_field_of_load_balancer_services_only_never_from_the_annotation() {
    let annotated = load_balancer_yaml(
        "web",
        "",
        "service.beta.kubernetes.io/load-balancer-source-ranges: 10.0.0.0/8",
    );
    assert!(annotated.load_balancer_source_ranges.is_empty());
    let yaml = format!(
        "metadata: {{name: web, namespace: default}}
spec:
  type: NodePort
  clusterIP: {CLUSTER_IP}
  loadBalancerSourceRanges: [10.0.0.0/8]
  ports: [{{name: http, port: 80, targetPort: 8080, nodePort: {NODE_PORT}, protocol: TCP}}]
"
    );
    let service: Service = serde_yaml::from_str(&yaml).expect("test Service YAML");
    let node_port = service_from_v1(&service).expect("converts").expect("kept");
    assert!(node_port.load_balancer_source_ranges.is_empty());
}

fn open_gate() -> GateOpen {
    let now = Instant::now();
    let mut gate = Gate::new(now, Duration::from_secs(30));
    for input in GateInput::ALL {
        gate.receive(input, now);
    }
    gate.open().expect("every input was received")
}

/// The source range entries a state holds.
fn entries(state: &MapState) -> BTreeSet<SourceRangeEntry> {
    state.source_ranges.clone()
}

fn expected_entries(prefixes: &[SourcePrefix]) -> BTreeSet<SourceRangeEntry> {
    load_balancer_keys()
        .into_iter()
        .flat_map(|frontend| {
            prefixes.iter().map(move |prefix| SourceRangeEntry {
                frontend,
                prefix: *prefix,
            })
        })
        .collect()
}

#[test]
fn partial_syncs_write_new_ranges_prune_old_ones_and_a_restart_plans_nothing() {
    let mut inputs = SyncInputs::default();
    inputs.set_node(node(&[NODE_ADDRESS]));
    inputs.upsert_service(load_balancer("192.168.60.0/24"));
    inputs.upsert_slice(slice("web"));
    let mut maps = FakeServiceMaps {
        watch_for_missing_slots: true,
        ..FakeServiceMaps::default()
    };
    let mut syncer = Syncer::restore(&maps).expect("restores");
    let sync = |inputs: &mut SyncInputs, syncer: &mut Syncer, maps: &mut FakeServiceMaps| {
        inputs
            .sync(open_gate(), syncer, maps, false)
            .expect("applies")
            .expect("the node is known")
    };
    let outcome = sync(&mut inputs, &mut syncer, &mut maps);
    assert_eq!(outcome.kind, SyncKind::Full);
    assert_eq!(
        entries(&maps.state),
        expected_entries(&[prefix("192.168.60.0/24")])
    );
    assert_eq!(outcome.report.source_ranges_written, 4);

    // The ranges change: one kept, one new, the old one pruned.
    inputs.upsert_service(load_balancer("10.20.0.0/16, 172.16.0.0/12"));
    let outcome = sync(&mut inputs, &mut syncer, &mut maps);
    assert_eq!(outcome.kind, SyncKind::Partial { services: 1 });
    assert_eq!(
        entries(&maps.state),
        expected_entries(&[prefix("10.20.0.0/16"), prefix("172.16.0.0/12")])
    );
    assert_eq!(outcome.report.source_ranges_written, 8);
    assert_eq!(outcome.report.source_ranges_deleted, 4);
    // Frontends were untouched: the flags did not change.
    assert_eq!(outcome.report.frontends_written, 0);

    // A restart restores the entries and a full sync of the same inputs writes nothing.
    let mut restarted = Syncer::restore(&maps).expect("restores");
    let outcome = inputs
        .sync(open_gate(), &mut restarted, &mut maps, true)
        .expect("applies")
        .expect("the node is known");
    assert_eq!(outcome.report.operation_count(), 0, "{outcome:?}");

    // The ranges removed: the entries go and the frontends lose the flag.
    inputs.upsert_service(load_balancer(""));
    let outcome = sync(&mut inputs, &mut restarted, &mut maps);
    assert!(entries(&maps.state).is_empty());
    assert_eq!(outcome.report.source_ranges_deleted, 8);
    assert!(maps
        .state
        .frontends
        .values()
        .all(|value| value.flags & FRONTEND_FLAG_SOURCE_RANGES == 0));
    assert!(maps.missing_slot_violations.is_empty());
}

#[test]
fn a_deleted_service_leaves_no_source_range_entry_behind() {
    let mut inputs = SyncInputs::default();
    inputs.set_node(node(&[NODE_ADDRESS]));
    inputs.upsert_service(load_balancer("192.168.60.0/24"));
    inputs.upsert_slice(slice("web"));
    let mut maps = FakeServiceMaps::default();
    let mut syncer = Syncer::restore(&maps).expect("restores");
    inputs
        .sync(open_gate(), &mut syncer, &mut maps, false)
        .expect("applies");
    assert_eq!(maps.state.source_ranges.len(), 4);
    inputs.remove_service(&crate::model::ServiceName::new("default", "web"));
    inputs
        .sync(open_gate(), &mut syncer, &mut maps, false)
        .expect("applies");
    assert!(maps.state.source_ranges.is_empty());
    assert!(maps.state.frontends.is_empty());
}
