use std::collections::BTreeMap;
use std::net::IpAddr;

use proptest::prelude::*;
use switchyard_common::{BackendSlotKey, FrontendKey, SCOPE_EXTERNAL, SCOPE_INTERNAL};

use super::*;
use crate::desired::{desired_services, frontend_key, lay_out};
use crate::maps::{FakeServiceMaps, MapMutation, MapState};
use crate::model::{
    AddressFamily, EndpointModel, EndpointPortModel, Protocol, ServicePortModel, TargetPort,
    TrafficPolicy,
};
use crate::sync::tests::{open_gate, semantics};

fn ip(text: &str) -> IpAddr {
    text.parse().expect("test address is valid")
}

fn name(text: &str) -> ServiceName {
    ServiceName::new("default", text)
}

fn node(addresses: &[&str]) -> NodeView {
    NodeView {
        name: "node-a".into(),
        zone: None,
        addresses: addresses.iter().map(|address| ip(address)).collect(),
    }
}

fn service(service_name: &str, cluster_ip: &str, node_port: Option<u16>) -> ServiceModel {
    ServiceModel {
        name: name(service_name),
        cluster_ips: vec![ip(cluster_ip)],
        external_ips: vec![],
        load_balancer_ips: vec![],
        ports: vec![ServicePortModel {
            name: "http".into(),
            protocol: Protocol::Tcp,
            port: 80,
            node_port,
            target_port: TargetPort::Name("web".into()),
        }],
        external_traffic_policy: TrafficPolicy::Cluster,
        internal_traffic_policy: TrafficPolicy::Cluster,
        session_affinity_timeout_seconds: None,
        load_balancer_source_ranges: Vec::new(),
    }
}

fn slice(slice_name: &str, service_name: &str, port: u16, hosts: &[u8]) -> EndpointSliceModel {
    EndpointSliceModel {
        slice_name: name(slice_name),
        service: name(service_name),
        family: AddressFamily::Ipv4,
        ports: vec![EndpointPortModel {
            name: "http".into(),
            protocol: Protocol::Tcp,
            port,
        }],
        endpoints: hosts
            .iter()
            .map(|host| EndpointModel {
                address: ip(&format!("10.244.0.{host}")),
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

fn cluster_ip_key(address: &str) -> FrontendKey {
    frontend_key(&ip(address), 80, Protocol::Tcp, SCOPE_INTERNAL)
}

/// The backends (address last byte, port) a frontend balances over, sorted.
fn backends_behind(state: &MapState, key: &FrontendKey) -> Vec<(u8, u16)> {
    let Some(value) = state.frontends.get(key) else {
        return vec![];
    };
    let mut backends: Vec<(u8, u16)> = (0..value.backend_count)
        .filter_map(|ordinal| {
            state.backend_slots.get(&BackendSlotKey {
                group_id: value.group_id,
                ordinal,
            })
        })
        .map(|backend| (backend.address[15], u16::from_be(backend.port_big_endian)))
        .collect();
    backends.sort();
    backends
}

/// Two Services with two endpoints each, synced once (a full sync).
fn synced() -> (SyncInputs, Syncer, FakeServiceMaps) {
    let mut inputs = SyncInputs::default();
    inputs.set_node(node(&["192.168.1.10"]));
    inputs.upsert_service(service("web", "10.96.0.1", None));
    inputs.upsert_service(service("api", "10.96.0.2", None));
    inputs.upsert_slice(slice("web-1", "web", 8080, &[1, 2]));
    inputs.upsert_slice(slice("api-1", "api", 9090, &[3, 4]));
    let mut maps = FakeServiceMaps {
        watch_for_missing_slots: true,
        ..FakeServiceMaps::default()
    };
    let mut syncer = Syncer::restore(&maps).expect("restores");
    let outcome = inputs
        .sync(open_gate(), &mut syncer, &mut maps, false)
        .expect("applies")
        .expect("the node is known");
    assert_eq!(outcome.kind, SyncKind::Full, "the first sync is a full one");
    assert!(!inputs.has_changes());
    (inputs, syncer, maps)
}

fn sync(inputs: &mut SyncInputs, syncer: &mut Syncer, maps: &mut FakeServiceMaps) -> SyncOutcome {
    inputs
        .sync(open_gate(), syncer, maps, false)
        .expect("applies")
        .expect("the node is known")
}

/// What a full sync of the same inputs would keep: it would write nothing.
fn assert_a_full_sync_changes_nothing(inputs: &SyncInputs, maps: &FakeServiceMaps) {
    let node = inputs.node().expect("known").clone();
    let services: Vec<ServiceModel> = inputs.services().cloned().collect();
    let slices: Vec<EndpointSliceModel> = services
        .iter()
        .flat_map(|service| inputs.slices_of(&service.name))
        .cloned()
        .collect();
    let desired = desired_services(&services, &slices, &node);
    assert_eq!(maps.state, lay_out(&desired, &maps.state));
    assert!(maps.missing_slot_violations.is_empty());
}

#[test]
fn nothing_is_synced_before_the_node_is_known() {
    let mut inputs = SyncInputs::default();
    inputs.upsert_service(service("web", "10.96.0.1", None));
    let mut maps = FakeServiceMaps::default();
    let mut syncer = Syncer::restore(&maps).expect("restores");
    let outcome = inputs
        .sync(open_gate(), &mut syncer, &mut maps, false)
        .expect("no error");
    assert_eq!(outcome, None);
    assert_eq!(maps.mutations_attempted, 0);
    assert!(inputs.has_changes(), "the change waits for the node");
}

#[test]
fn an_endpoint_slice_change_recomputes_and_writes_only_its_service() {
    let (mut inputs, mut syncer, mut maps) = synced();
    let api_before = backends_behind(&maps.state, &cluster_ip_key("10.96.0.2"));
    assert!(inputs.upsert_slice(slice("web-1", "web", 8080, &[1, 2, 5])));
    assert_eq!(
        inputs.dirty_services().iter().collect::<Vec<_>>(),
        vec![&name("web")]
    );
    let outcome = sync(&mut inputs, &mut syncer, &mut maps);
    assert_eq!(outcome.kind, SyncKind::Partial { services: 1 });
    // One new slot, the frontend's count: two writes.
    assert_eq!(outcome.report.backend_slots_written, 1);
    assert_eq!(outcome.report.frontends_written, 1);
    assert_eq!(outcome.report.operation_count(), 2);
    assert_eq!(
        backends_behind(&maps.state, &cluster_ip_key("10.96.0.1")),
        vec![(1, 8080), (2, 8080), (5, 8080)]
    );
    assert_eq!(
        backends_behind(&maps.state, &cluster_ip_key("10.96.0.2")),
        api_before
    );
    assert_a_full_sync_changes_nothing(&inputs, &maps);
}

#[test]
fn an_unchanged_object_marks_nothing() {
    let (mut inputs, _, _) = synced();
    assert!(!inputs.upsert_service(service("web", "10.96.0.1", None)));
    assert!(!inputs.upsert_slice(slice("web-1", "web", 8080, &[1, 2])));
    assert!(!inputs.remove_service(&name("missing")));
    assert!(!inputs.remove_slice(&name("missing")));
    assert!(!inputs.set_node(node(&["192.168.1.10"])));
    assert!(!inputs.has_changes());
}

#[test]
fn a_deleted_service_loses_its_entries_and_its_slices_wait_for_it() {
    let (mut inputs, mut syncer, mut maps) = synced();
    assert!(inputs.remove_service(&name("web")));
    let outcome = sync(&mut inputs, &mut syncer, &mut maps);
    assert_eq!(outcome.kind, SyncKind::Partial { services: 1 });
    assert!(!maps
        .state
        .frontends
        .contains_key(&cluster_ip_key("10.96.0.1")));
    assert_eq!(
        maps.state.backend_slots.len(),
        2,
        "only api's slots are left"
    );
    assert_a_full_sync_changes_nothing(&inputs, &maps);

    // Its slice is still known: the Service coming back finds its endpoints.
    assert!(inputs.upsert_service(service("web", "10.96.0.1", None)));
    sync(&mut inputs, &mut syncer, &mut maps);
    assert_eq!(
        backends_behind(&maps.state, &cluster_ip_key("10.96.0.1")),
        vec![(1, 8080), (2, 8080)]
    );
    assert_a_full_sync_changes_nothing(&inputs, &maps);
}

#[test]
fn a_slice_moved_to_another_service_changes_both() {
    let (mut inputs, mut syncer, mut maps) = synced();
    // The label now names api: web loses the endpoints, api gains them.
    assert!(inputs.upsert_slice(slice("web-1", "api", 9090, &[1, 2])));
    let mut dirty: Vec<&ServiceName> = inputs.dirty_services().iter().collect();
    dirty.sort();
    assert_eq!(dirty, vec![&name("api"), &name("web")]);
    let outcome = sync(&mut inputs, &mut syncer, &mut maps);
    assert_eq!(outcome.kind, SyncKind::Partial { services: 2 });
    assert_eq!(
        backends_behind(&maps.state, &cluster_ip_key("10.96.0.1")),
        vec![],
        "web refuses"
    );
    assert_eq!(
        maps.state.frontends[&cluster_ip_key("10.96.0.1")].backend_count,
        0
    );
    assert_eq!(
        backends_behind(&maps.state, &cluster_ip_key("10.96.0.2")),
        vec![(1, 9090), (2, 9090), (3, 9090), (4, 9090)]
    );
    assert_a_full_sync_changes_nothing(&inputs, &maps);
}

#[test]
fn a_service_split_over_several_slices_balances_over_all_of_them() {
    let (mut inputs, mut syncer, mut maps) = synced();
    inputs.upsert_slice(slice("web-2", "web", 8080, &[6, 7]));
    inputs.upsert_slice(slice("web-3", "web", 8080, &[2, 8]));
    sync(&mut inputs, &mut syncer, &mut maps);
    assert_eq!(
        backends_behind(&maps.state, &cluster_ip_key("10.96.0.1")),
        vec![(1, 8080), (2, 8080), (6, 8080), (7, 8080), (8, 8080)],
        "endpoint 2 is in two slices and counted once"
    );
    // Removing one slice keeps the others' endpoints (and 2, still in web-1).
    assert!(inputs.remove_slice(&name("web-3")));
    let outcome = sync(&mut inputs, &mut syncer, &mut maps);
    assert_eq!(outcome.kind, SyncKind::Partial { services: 1 });
    assert_eq!(
        backends_behind(&maps.state, &cluster_ip_key("10.96.0.1")),
        vec![(1, 8080), (2, 8080), (6, 8080), (7, 8080)]
    );
    assert_a_full_sync_changes_nothing(&inputs, &maps);
}

#[test]
fn named_target_ports_follow_the_port_each_slice_resolved() {
    let (mut inputs, mut syncer, mut maps) = synced();
    // The pods behind "web" now listen on another port: the EndpointSlice
    // controller resolves the named port anew and the slice says so.
    inputs.upsert_slice(slice("web-1", "web", 8443, &[1, 2]));
    sync(&mut inputs, &mut syncer, &mut maps);
    assert_eq!(
        backends_behind(&maps.state, &cluster_ip_key("10.96.0.1")),
        vec![(1, 8443), (2, 8443)]
    );
    assert_a_full_sync_changes_nothing(&inputs, &maps);
}

#[test]
fn a_node_address_change_is_a_full_sync_that_moves_every_node_port() {
    let (mut inputs, mut syncer, mut maps) = synced();
    inputs.upsert_service(service("web", "10.96.0.1", Some(30080)));
    inputs.upsert_service(service("api", "10.96.0.2", Some(30081)));
    sync(&mut inputs, &mut syncer, &mut maps);
    let node_port =
        |address: &str, port: u16| frontend_key(&ip(address), port, Protocol::Tcp, SCOPE_EXTERNAL);
    assert!(maps
        .state
        .frontends
        .contains_key(&node_port("192.168.1.10", 30080)));

    assert!(inputs.set_node(node(&["192.168.1.20"])));
    let outcome = sync(&mut inputs, &mut syncer, &mut maps);
    assert_eq!(outcome.kind, SyncKind::Full);
    for port in [30080, 30081] {
        assert!(!maps
            .state
            .frontends
            .contains_key(&node_port("192.168.1.10", port)));
        assert!(maps
            .state
            .frontends
            .contains_key(&node_port("192.168.1.20", port)));
    }
    assert_a_full_sync_changes_nothing(&inputs, &maps);
    // The node change is done: the next change is partial again.
    inputs.upsert_slice(slice("api-1", "api", 9090, &[3]));
    assert_eq!(
        sync(&mut inputs, &mut syncer, &mut maps).kind,
        SyncKind::Partial { services: 1 }
    );
}

#[test]
fn changes_between_syncs_are_batched_into_one_partial_sync() {
    let (mut inputs, mut syncer, mut maps) = synced();
    inputs.upsert_slice(slice("web-1", "web", 8080, &[1]));
    inputs.upsert_slice(slice("web-1", "web", 8080, &[1, 9]));
    inputs.upsert_service(service("db", "10.96.0.3", None));
    inputs.upsert_slice(slice("db-1", "db", 5432, &[7]));
    inputs.remove_service(&name("api"));
    let outcome = sync(&mut inputs, &mut syncer, &mut maps);
    assert_eq!(outcome.kind, SyncKind::Partial { services: 3 });
    assert_eq!(
        backends_behind(&maps.state, &cluster_ip_key("10.96.0.1")),
        vec![(1, 8080), (9, 8080)],
        "the last state of web, none of the intermediate ones lost"
    );
    assert_eq!(
        backends_behind(&maps.state, &cluster_ip_key("10.96.0.3")),
        vec![(7, 5432)]
    );
    assert!(!maps
        .state
        .frontends
        .contains_key(&cluster_ip_key("10.96.0.2")));
    assert_a_full_sync_changes_nothing(&inputs, &maps);
}

#[test]
fn freed_backend_slots_are_reused_without_stale_entries() {
    let (mut inputs, mut syncer, mut maps) = synced();
    let slots_before = maps.state.backend_slots.len();
    inputs.remove_service(&name("web"));
    sync(&mut inputs, &mut syncer, &mut maps);
    assert_eq!(maps.state.backend_slots.len(), slots_before - 2);
    // A new Service right after: its group gets an id no stale slot uses.
    inputs.upsert_service(service("cache", "10.96.0.9", None));
    inputs.upsert_slice(slice("cache-1", "cache", 6379, &[5, 6, 7]));
    sync(&mut inputs, &mut syncer, &mut maps);
    assert_eq!(
        backends_behind(&maps.state, &cluster_ip_key("10.96.0.9")),
        vec![(5, 6379), (6, 6379), (7, 6379)]
    );
    assert_eq!(maps.state.backend_slots.len(), slots_before + 1);
    assert_a_full_sync_changes_nothing(&inputs, &maps);
}

#[test]
fn a_relist_marks_only_what_differs() {
    let (mut inputs, _, _) = synced();
    assert!(!inputs.replace_services([
        service("web", "10.96.0.1", None),
        service("api", "10.96.0.2", None)
    ]));
    assert!(!inputs.replace_slices([
        slice("web-1", "web", 8080, &[1, 2]),
        slice("api-1", "api", 9090, &[3, 4])
    ]));
    assert!(!inputs.has_changes());
    // api is gone from the list, web's slice changed, db is new.
    assert!(inputs.replace_services([
        service("web", "10.96.0.1", None),
        service("db", "10.96.0.3", None)
    ]));
    assert!(inputs.replace_slices([
        slice("web-1", "web", 8080, &[1]),
        slice("api-1", "api", 9090, &[3, 4])
    ]));
    let dirty: Vec<&ServiceName> = inputs.dirty_services().iter().collect();
    assert_eq!(dirty, vec![&name("api"), &name("db"), &name("web")]);
}

#[test]
fn a_failed_partial_apply_keeps_the_changes_and_the_next_sync_is_a_full_one() {
    let (mut inputs, mut syncer, mut maps) = synced();
    inputs.upsert_slice(slice("web-1", "web", 8080, &[1, 2, 5]));
    maps.failing_kinds.insert(MapMutation::WriteFrontend);
    let result = inputs.sync(open_gate(), &mut syncer, &mut maps, false);
    assert!(result.is_err());
    assert!(maps.missing_slot_violations.is_empty());
    assert!(inputs.has_changes(), "the change is not lost");
    assert!(syncer.needs_full_sync());
    // Still serving the old endpoints meanwhile.
    assert_eq!(
        backends_behind(&maps.state, &cluster_ip_key("10.96.0.1")),
        vec![(1, 8080), (2, 8080)]
    );

    maps.failing_kinds.clear();
    let outcome = sync(&mut inputs, &mut syncer, &mut maps);
    assert_eq!(outcome.kind, SyncKind::Full);
    assert_eq!(
        backends_behind(&maps.state, &cluster_ip_key("10.96.0.1")),
        vec![(1, 8080), (2, 8080), (5, 8080)]
    );
    assert!(!inputs.has_changes());
    assert_a_full_sync_changes_nothing(&inputs, &maps);
}

#[test]
fn a_full_map_refuses_the_new_service_and_keeps_serving_the_others() {
    let (mut inputs, mut syncer, mut maps) = synced();
    maps.frontend_capacity = Some(maps.state.frontends.len());
    inputs.upsert_service(service("db", "10.96.0.3", None));
    inputs.upsert_slice(slice("db-1", "db", 5432, &[7]));
    inputs.upsert_slice(slice("web-1", "web", 8080, &[1]));
    assert!(inputs
        .sync(open_gate(), &mut syncer, &mut maps, false)
        .is_err());
    assert!(maps.missing_slot_violations.is_empty());
    assert!(maps.state.frontends_with_missing_slots().is_empty());
    assert_eq!(&maps.state, syncer.current(), "the tracked state follows");
    assert!(!maps
        .state
        .frontends
        .contains_key(&cluster_ip_key("10.96.0.3")));
    assert_eq!(
        backends_behind(&maps.state, &cluster_ip_key("10.96.0.2")),
        vec![(3, 9090), (4, 9090)]
    );
    // Room again (a bigger map, or another Service deleted): it converges.
    maps.frontend_capacity = None;
    let outcome = sync(&mut inputs, &mut syncer, &mut maps);
    assert_eq!(outcome.kind, SyncKind::Full);
    assert_eq!(
        backends_behind(&maps.state, &cluster_ip_key("10.96.0.3")),
        vec![(7, 5432)]
    );
    assert_eq!(
        backends_behind(&maps.state, &cluster_ip_key("10.96.0.1")),
        vec![(1, 8080)]
    );
    assert_a_full_sync_changes_nothing(&inputs, &maps);
}

#[test]
fn the_periodic_resync_rereads_the_maps_and_repairs_what_something_else_changed() {
    let (mut inputs, mut syncer, mut maps) = synced();
    let expected = maps.state.clone();
    // bpftool deleted a frontend and wrote a stray one behind the agent's back.
    maps.state.frontends.remove(&cluster_ip_key("10.96.0.1"));
    let stray = cluster_ip_key("10.96.9.9");
    maps.state
        .frontends
        .insert(stray, expected.frontends[&cluster_ip_key("10.96.0.2")]);
    // A partial sync trusts its tracked state and does not notice.
    assert_eq!(
        sync(&mut inputs, &mut syncer, &mut maps)
            .report
            .operation_count(),
        0
    );
    let outcome = inputs
        .sync(open_gate(), &mut syncer, &mut maps, true)
        .expect("applies")
        .expect("the node is known");
    assert_eq!(outcome.kind, SyncKind::Resync);
    assert!(outcome.report.frontends_deleted == 1 && outcome.report.frontends_written == 1);
    assert!(!maps.state.frontends.contains_key(&stray));
    // web's old slots still held its id, so it got a new one: same backends.
    assert_eq!(semantics(&maps.state), semantics(&expected));
    assert_a_full_sync_changes_nothing(&inputs, &maps);
    // Partial syncs resume afterwards.
    inputs.upsert_slice(slice("api-1", "api", 9090, &[3]));
    assert_eq!(
        sync(&mut inputs, &mut syncer, &mut maps).kind,
        SyncKind::Partial { services: 1 }
    );
}

/// One step of the property test below.
#[derive(Clone, Debug)]
enum Step {
    UpsertService(ServiceModel),
    RemoveService(ServiceName),
    UpsertSlice(EndpointSliceModel),
    RemoveSlice(ServiceName),
    RelistServices(Vec<ServiceModel>),
    RelistSlices(Vec<EndpointSliceModel>),
    SetNode(NodeView),
    /// A sync, with a fault injected into its `n`th map mutation if given.
    Sync(Option<u64>),
    Resync,
}

const SERVICE_NAMES: [&str; 4] = ["a", "b", "c", "d"];
const SLICE_NAMES: [&str; 5] = ["s0", "s1", "s2", "s3", "s4"];

fn service_strategy() -> impl Strategy<Value = ServiceModel> {
    (
        0..SERVICE_NAMES.len(),
        // Cluster IPs from a small set: two Services may claim one.
        0u8..5,
        prop::collection::vec(
            (0u8..2, any::<bool>(), prop::option::of(30000u16..30003)),
            1..3,
        ),
        any::<bool>(),
        any::<bool>(),
        prop::option::of(1u32..100),
        // A shared external IP: claimed by several Services.
        any::<bool>(),
    )
        .prop_map(
            |(index, cluster_ip, ports, external_local, internal_local, affinity, external)| {
                let mut model =
                    service(SERVICE_NAMES[index], &format!("10.96.0.{cluster_ip}"), None);
                model.ports = ports
                    .into_iter()
                    .map(|(port_name, udp, node_port)| ServicePortModel {
                        name: format!("p{port_name}"),
                        protocol: if udp { Protocol::Udp } else { Protocol::Tcp },
                        port: 80 + u16::from(port_name),
                        node_port,
                        target_port: TargetPort::Name(format!("target-{port_name}")),
                    })
                    .collect();
                model
                    .ports
                    .sort_by(|left, right| left.name.cmp(&right.name));
                model.ports.dedup_by(|left, right| left.name == right.name);
                if external_local {
                    model.external_traffic_policy = TrafficPolicy::Local;
                }
                if internal_local {
                    model.internal_traffic_policy = TrafficPolicy::Local;
                }
                model.session_affinity_timeout_seconds = affinity;
                if external {
                    model.external_ips = vec![ip("192.0.2.1")];
                }
                model
            },
        )
}

fn slice_strategy() -> impl Strategy<Value = EndpointSliceModel> {
    (
        0..SLICE_NAMES.len(),
        0..SERVICE_NAMES.len(),
        0u8..2,
        0u16..2,
        prop::collection::vec((0u8..8, 0u8..4, any::<bool>()), 0..5),
    )
        .prop_map(
            |(slice_index, service_index, port_name, port_shift, endpoints)| {
                let port_name = format!("p{port_name}");
                let number = 8000 + port_shift;
                EndpointSliceModel {
                    slice_name: name(SLICE_NAMES[slice_index]),
                    service: name(SERVICE_NAMES[service_index]),
                    family: AddressFamily::Ipv4,
                    ports: vec![
                        EndpointPortModel {
                            name: port_name.clone(),
                            protocol: Protocol::Tcp,
                            port: number,
                        },
                        EndpointPortModel {
                            name: port_name,
                            protocol: Protocol::Udp,
                            port: number,
                        },
                    ],
                    endpoints: endpoints
                        .into_iter()
                        .map(|(host, state, local)| EndpointModel {
                            address: ip(&format!("10.244.0.{host}")),
                            ready: state == 0,
                            serving: state <= 1,
                            terminating: state >= 1,
                            node_name: Some(if local { "node-a" } else { "node-b" }.into()),
                            hints: Default::default(),
                        })
                        .collect(),
                    last_change_trigger_time: None,
                }
            },
        )
}

fn node_strategy() -> impl Strategy<Value = NodeView> {
    prop::collection::btree_set(0u8..3, 0..3).prop_map(|hosts| NodeView {
        name: "node-a".into(),
        zone: None,
        addresses: hosts
            .into_iter()
            .map(|host| ip(&format!("192.168.1.{host}")))
            .collect(),
    })
}

fn step_strategy() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => service_strategy().prop_map(Step::UpsertService),
        1 => (0..SERVICE_NAMES.len()).prop_map(|index| Step::RemoveService(name(SERVICE_NAMES[index]))),
        5 => slice_strategy().prop_map(Step::UpsertSlice),
        1 => (0..SLICE_NAMES.len()).prop_map(|index| Step::RemoveSlice(name(SLICE_NAMES[index]))),
        1 => prop::collection::vec(service_strategy(), 0..4).prop_map(Step::RelistServices),
        1 => prop::collection::vec(slice_strategy(), 0..5).prop_map(Step::RelistSlices),
        1 => node_strategy().prop_map(Step::SetNode),
        4 => prop::option::weighted(0.3, 0u64..12).prop_map(Step::Sync),
        1 => Just(Step::Resync),
    ]
}

/// The reference: plain collections the test keeps itself, and the desired
/// state computed from them from scratch.
#[derive(Default)]
struct Reference {
    services: BTreeMap<ServiceName, ServiceModel>,
    slices: BTreeMap<ServiceName, EndpointSliceModel>,
    node: NodeView,
}

impl Reference {
    fn desired(&self) -> crate::desired::DesiredServices {
        let services: Vec<ServiceModel> = self.services.values().cloned().collect();
        let slices: Vec<EndpointSliceModel> = self.slices.values().cloned().collect();
        desired_services(&services, &slices, &self.node)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any sequence of changes, batched into partial syncs at arbitrary points,
    /// with map faults injected at arbitrary mutations, ends with exactly the
    /// maps one full sync of the final inputs keeps, and no moment of it
    /// exposes a frontend to a missing slot.
    #[test]
    fn any_sequence_of_partial_syncs_reaches_what_one_full_sync_of_the_final_inputs_keeps(
        initial_node in node_strategy(),
        steps in prop::collection::vec(step_strategy(), 1..40),
    ) {
        let mut reference = Reference { node: initial_node.clone(), ..Reference::default() };
        let mut inputs = SyncInputs::default();
        inputs.set_node(initial_node);
        let mut maps = FakeServiceMaps { watch_for_missing_slots: true, ..FakeServiceMaps::default() };
        let mut syncer = Syncer::restore(&maps).expect("restores");
        for step in steps.into_iter().chain([Step::Sync(None)]) {
            match step {
                Step::UpsertService(service) => {
                    reference.services.insert(service.name.clone(), service.clone());
                    inputs.upsert_service(service);
                }
                Step::RemoveService(service_name) => {
                    reference.services.remove(&service_name);
                    inputs.remove_service(&service_name);
                }
                Step::UpsertSlice(slice) => {
                    reference.slices.insert(slice.slice_name.clone(), slice.clone());
                    inputs.upsert_slice(slice);
                }
                Step::RemoveSlice(slice_name) => {
                    reference.slices.remove(&slice_name);
                    inputs.remove_slice(&slice_name);
                }
                Step::RelistServices(services) => {
                    reference.services = services.iter().map(|service| (service.name.clone(), service.clone())).collect();
                    inputs.replace_services(services);
                }
                Step::RelistSlices(slices) => {
                    reference.slices = slices.iter().map(|slice| (slice.slice_name.clone(), slice.clone())).collect();
                    inputs.replace_slices(slices);
                }
                Step::SetNode(node) => {
                    reference.node = node.clone();
                    inputs.set_node(node);
                }
                Step::Sync(fault) => {
                    if let Some(offset) = fault {
                        maps.failing_mutations.insert(maps.mutations_attempted + offset);
                    }
                    match inputs.sync(open_gate(), &mut syncer, &mut maps, false) {
                        Ok(Some(_)) => {
                            prop_assert!(!inputs.has_changes());
                            let desired = reference.desired();
                            // Exactly what a full sync keeps: it would write nothing.
                            prop_assert_eq!(&maps.state, &lay_out(&desired, &maps.state));
                            prop_assert_eq!(
                                semantics(&maps.state),
                                semantics(&lay_out(&desired, &MapState::default()))
                            );
                        }
                        Ok(None) => prop_assert!(false, "the node is always known"),
                        Err(_) => {
                            prop_assert!(fault.is_some(), "only injected faults fail");
                            prop_assert!(syncer.needs_full_sync());
                        }
                    }
                    maps.failing_mutations.clear();
                    prop_assert_eq!(&maps.state, syncer.current());
                }
                Step::Resync => {
                    let outcome = inputs.sync(open_gate(), &mut syncer, &mut maps, true);
                    prop_assert_eq!(outcome.map(|outcome| outcome.map(|outcome| outcome.kind)).ok(), Some(Some(SyncKind::Resync)));
                    prop_assert_eq!(&maps.state, &lay_out(&reference.desired(), &maps.state));
                }
            }
            prop_assert!(maps.missing_slot_violations.is_empty(), "{:?}", maps.missing_slot_violations);
        }
    }
}

#[test]
fn masquerading_is_needed_while_some_service_has_a_node_port_with_cluster_policy() {
    let mut inputs = SyncInputs::default();
    inputs.upsert_service(service("web", "10.96.0.1", None));
    assert!(
        !inputs.masquerade_needed(),
        "a ClusterIP needs no masquerade"
    );
    inputs.upsert_service(service("public", "10.96.0.2", Some(30080)));
    inputs.upsert_service(service("other", "10.96.0.3", Some(30081)));
    assert!(inputs.masquerade_needed());
    inputs.remove_service(&name("public"));
    assert!(inputs.masquerade_needed(), "another Service still needs it");
    let mut local = service("other", "10.96.0.3", Some(30081));
    local.external_traffic_policy = TrafficPolicy::Local;
    inputs.upsert_service(local);
    assert!(
        !inputs.masquerade_needed(),
        "externalTrafficPolicy Local keeps the client address: no masquerade"
    );
    inputs.replace_services([service("listed", "10.96.0.4", Some(30082))]);
    assert!(inputs.masquerade_needed(), "a relist counts too");
    inputs.replace_services([service("web", "10.96.0.1", None)]);
    assert!(!inputs.masquerade_needed(), "a relist forgets what is gone");
}

#[test]
fn each_sync_reports_the_services_with_a_local_policy_and_no_local_endpoint() {
    let (mut inputs, mut syncer, mut maps) = synced();
    let remote_only = |hosts: &[u8]| {
        let mut slice = slice("local-1", "local", 8080, hosts);
        for endpoint in &mut slice.endpoints {
            endpoint.node_name = Some("node-b".into());
        }
        slice
    };
    // The control: Cluster policies count nothing, whatever their endpoints.
    inputs.upsert_slice(remote_only(&[7]));
    assert!(sync(&mut inputs, &mut syncer, &mut maps)
        .no_local_endpoints
        .is_zero());

    let mut local_policy = service("local", "10.96.0.3", None);
    local_policy.internal_traffic_policy = TrafficPolicy::Local;
    inputs.upsert_service(local_policy);
    let outcome = sync(&mut inputs, &mut syncer, &mut maps);
    assert!(matches!(outcome.kind, SyncKind::Partial { .. }));
    assert_eq!(outcome.no_local_endpoints.internal, 1);
    assert_eq!(outcome.no_local_endpoints.external, 0);

    // A full sync (the node's view changed) counts it again.
    inputs.set_node(node(&["192.168.1.11"]));
    let outcome = sync(&mut inputs, &mut syncer, &mut maps);
    assert_eq!(outcome.kind, SyncKind::Full);
    assert_eq!(outcome.no_local_endpoints.internal, 1);

    // An endpoint on this node: nothing to count any more.
    inputs.upsert_slice(slice("local-1", "local", 8080, &[7]));
    assert!(sync(&mut inputs, &mut syncer, &mut maps)
        .no_local_endpoints
        .is_zero());

    // Back to remote only, then the Service is deleted: gone with it.
    inputs.upsert_slice(remote_only(&[7]));
    assert_eq!(
        sync(&mut inputs, &mut syncer, &mut maps)
            .no_local_endpoints
            .internal,
        1
    );
    inputs.remove_service(&name("local"));
    assert!(sync(&mut inputs, &mut syncer, &mut maps)
        .no_local_endpoints
        .is_zero());
}

#[test]
fn a_failed_sync_leaves_the_count_to_the_next_successful_one() {
    let (mut inputs, mut syncer, mut maps) = synced();
    let mut local_policy = service("local", "10.96.0.3", None);
    local_policy.internal_traffic_policy = TrafficPolicy::Local;
    let mut remote = slice("local-1", "local", 8080, &[7]);
    remote.endpoints[0].node_name = Some("node-b".into());
    inputs.upsert_service(local_policy);
    inputs.upsert_slice(remote);
    maps.failing_kinds.insert(MapMutation::WriteFrontend);
    assert!(inputs
        .sync(open_gate(), &mut syncer, &mut maps, false)
        .is_err());
    maps.failing_kinds.clear();
    let outcome = sync(&mut inputs, &mut syncer, &mut maps);
    assert_eq!(outcome.kind, SyncKind::Full);
    assert_eq!(outcome.no_local_endpoints.internal, 1);
}
