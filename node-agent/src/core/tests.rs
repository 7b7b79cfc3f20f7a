use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use switchyard_common::{FrontendKey, DATAPATH_MODE_ACTIVE, SCOPE_EXTERNAL};

use super::*;
use crate::datapath::fake::FakeDatapath;
use crate::desired::frontend_key;
use crate::interfaces::IpAddressInfo;
use crate::maps::{FakeServiceMaps, MapMutation};
use crate::model::{
    endpoint_slice_from_v1, service_from_v1, EndpointModel, Protocol, ServiceModel, ServiceName,
};

fn settings() -> AgentSettings {
    AgentSettings {
        node_name: "node-1".into(),
        pod_interfaces: Globs::parse("p-*"),
        host_interfaces: Some(Globs::parse("eth0")),
        node_ports: Default::default(),
        min_sync_period: Duration::from_secs(1),
        gate_timeout: Duration::from_secs(30),
        masquerade_mark: 0x4000,
        manage_masquerade_rule: false,
        socket_hooks: false,
        pod_connect_balancing: PodConnectBalancing::Tcp,
        served_families: Default::default(),
        agent_version: "0.1.0".into(),
        agent_revision: None,
        full_resync_period: Duration::from_secs(300),
        round_heartbeat: None,
    }
}

fn interface(index: u32, name: &str, addresses: &[&str]) -> IpInterface {
    IpInterface {
        ifindex: index,
        ifname: name.into(),
        addr_info: addresses
            .iter()
            .map(|address| IpAddressInfo {
                family: "inet".into(),
                local: Some((*address).into()),
                scope: Some("global".into()),
            })
            .collect(),
    }
}

fn host(extra_eth0_address: Option<&str>, pods: &[&str]) -> Input {
    let mut eth0 = vec!["10.99.0.11"];
    eth0.extend(extra_eth0_address);
    let mut interfaces = vec![
        interface(1, "lo", &["127.0.0.1"]),
        interface(2, "eth0", &eth0),
    ];
    for (offset, name) in pods.iter().enumerate() {
        interfaces.push(interface(10 + offset as u32, name, &["10.244.1.1"]));
    }
    Input::Host(interfaces)
}

fn node_facts(addresses: &[&str]) -> NodeFacts {
    NodeFacts {
        name: "node-1".into(),
        zone: None,
        addresses: addresses
            .iter()
            .map(|address| address.parse().expect("valid"))
            .collect(),
    }
}

fn service() -> ServiceModel {
    let service: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"type": "NodePort", "clusterIP": "10.96.0.10", "ports": [
            {"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080, "protocol": "TCP"}
        ]}
    }))
    .expect("a valid Service");
    service_from_v1(&service)
        .expect("converts")
        .expect("is used")
}

fn slice() -> EndpointSliceModel {
    let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web-1", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [
            {"addresses": ["10.244.2.10"], "nodeName": "node-2", "conditions": {"ready": true}},
            {"addresses": ["10.244.3.10"], "nodeName": "node-3", "conditions": {"ready": true}}
        ]
    }))
    .expect("a valid EndpointSlice");
    endpoint_slice_from_v1(&slice)
        .expect("converts")
        .expect("is used")
}

fn key_of(name: &str) -> ServiceName {
    ServiceName::new("default", name)
}

fn dataplane_node(mode: DataplaneMode, generation: i64) -> Input {
    Input::DataplaneNode(Some(DataplaneNodeView {
        uid: Some(format!("uid-{generation}")),
        generation: Some(generation),
        spec: DataplaneNodeSpec::new(mode),
        status: None,
    }))
}

fn every_input_but_the_dataplane_node() -> Vec<Input> {
    vec![
        Input::Services(StoreChange::Replace(BTreeMap::from([(
            key_of("web"),
            service().into(),
        )]))),
        Input::EndpointSlices(StoreChange::Replace(BTreeMap::from([(
            key_of("web-1"),
            slice(),
        )]))),
        Input::Node(node_facts(&["10.99.0.11"])),
        host(None, &["p-client"]),
    ]
}

fn node_port_key(address: &str) -> FrontendKey {
    frontend_key(
        &address.parse().expect("valid"),
        30080,
        Protocol::Tcp,
        SCOPE_EXTERNAL,
    )
}

fn wall() -> DateTime<Utc> {
    Utc::now()
}

/// An agent whose gate opened in `mode`, after its first tick.
fn running_agent(mode: DataplaneMode, start: Instant) -> NodeAgent<FakeDatapath> {
    let mut agent = NodeAgent::start(settings(), FakeDatapath::default(), start).expect("starts");
    for input in every_input_but_the_dataplane_node() {
        agent.receive(input, start);
    }
    agent.receive(dataplane_node(mode, 1), start);
    agent.tick(start, wall());
    agent
}

#[test]
fn nothing_is_written_or_attached_before_every_input_arrived() {
    let start = Instant::now();
    let previous = FakeServiceMaps::default();
    let mut agent = NodeAgent::start(
        settings(),
        FakeDatapath {
            maps: previous,
            ..FakeDatapath::default()
        },
        start,
    )
    .expect("starts");
    for input in every_input_but_the_dataplane_node() {
        agent.receive(input, start);
    }
    for second in 0..40 {
        agent.tick(start + Duration::from_secs(second), wall());
    }
    assert_eq!(agent.datapath.maps.mutations_attempted, 0);
    assert_eq!(agent.datapath.attach_calls, 0);
    let status = agent.status_inputs(
        start + Duration::from_secs(40),
        &CoexistenceReport::default(),
    );
    assert!(
        matches!(&status.gate, GateStatus::TimedOut { missing, .. } if missing == &vec![GateInput::DataplaneNode]),
        "{:?}",
        status.gate
    );
    assert_eq!(status.sync, SyncReport::NotYet);

    // The answer "no DataplaneNode" opens the gate: maps synced, nothing attached.
    agent.receive(Input::DataplaneNode(None), start + Duration::from_secs(41));
    agent.tick(start + Duration::from_secs(41), wall());
    assert!(agent.datapath.maps.mutations_applied > 0);
    assert!(agent
        .datapath
        .maps
        .state
        .frontends
        .contains_key(&node_port_key("10.99.0.11")));
    assert!(
        agent.datapath.attached.is_empty(),
        "KubeProxy without a DataplaneNode"
    );
    assert_eq!(agent.mode(), DataplaneMode::KubeProxy);
}

#[test]
fn node_heartbeats_after_the_initial_sync_cause_no_map_write_and_no_attach() {
    let start = Instant::now();
    let mut agent = running_agent(DataplaneMode::Ebpf, start);
    assert_eq!(
        agent.datapath.attached.keys().cloned().collect::<Vec<_>>(),
        vec!["eth0".to_string(), "p-client".to_string()]
    );
    let mutations = agent.datapath.maps.mutations_attempted;
    let attach_calls = agent.datapath.attach_calls;
    let counts = agent.counts;
    assert!(counts.map_operations > 0 && counts.program_attaches == 2);
    for second in 1..=200 {
        let now = start + Duration::from_secs(second);
        agent.receive(Input::Node(node_facts(&["10.99.0.11"])), now);
        // The host's interfaces are re-read too (an unrelated link changed).
        agent.receive(host(None, &["p-client"]), now);
        agent.tick(now, wall());
    }
    assert_eq!(agent.counts.node_updates_ignored, 200);
    assert_eq!(agent.datapath.maps.mutations_attempted, mutations);
    assert_eq!(agent.datapath.attach_calls, attach_calls);
    assert_eq!(agent.counts.map_operations, counts.map_operations);
    assert_eq!(agent.counts.program_attaches, counts.program_attaches);
}

#[test]
fn an_address_added_to_the_interface_and_the_node_is_programmed_at_once() {
    let start = Instant::now();
    let mut agent = running_agent(DataplaneMode::Ebpf, start);
    let later = start + Duration::from_secs(10);
    agent.receive(host(Some("10.99.0.111"), &["p-client"]), later);
    agent.receive(
        Input::Node(node_facts(&["10.99.0.11", "10.99.0.111"])),
        later,
    );
    let report = agent.tick(later, wall());
    assert!(
        matches!(report.sync, Some((outcome, _)) if outcome.kind == SyncKind::Full),
        "applied in the same tick, as a full sync"
    );
    assert!(agent
        .datapath
        .maps
        .state
        .frontends
        .contains_key(&node_port_key("10.99.0.111")));
    assert_eq!(agent.counts.node_updates_ignored, 0);
    assert_eq!(
        agent.counts.program_attaches, 2,
        "no re-attach for an address"
    );
}

#[test]
fn a_new_pod_interface_gets_programs_and_nothing_else_is_reattached() {
    let start = Instant::now();
    let mut agent = running_agent(DataplaneMode::Ebpf, start);
    let calls = agent.datapath.attach_calls;
    let later = start + Duration::from_secs(5);
    agent.receive(host(None, &["p-client", "p-new"]), later);
    agent.tick(later, wall());
    assert_eq!(agent.datapath.attach_calls, calls + 1);
    assert!(agent.datapath.attached.contains_key("p-new"));
}

#[test]
fn a_relist_with_the_same_objects_writes_nothing_and_a_deletion_prunes_after_the_period() {
    let start = Instant::now();
    let mut agent = running_agent(DataplaneMode::Ebpf, start);
    let mutations = agent.datapath.maps.mutations_attempted;
    let later = start + Duration::from_millis(200);
    agent.receive(
        Input::Services(StoreChange::Replace(BTreeMap::from([(
            key_of("web"),
            service().into(),
        )]))),
        later,
    );
    agent.tick(later, wall());
    assert_eq!(agent.datapath.maps.mutations_attempted, mutations);
    agent.receive(Input::Services(StoreChange::Remove(key_of("web"))), later);
    assert!(
        agent.tick(later, wall()).sync.is_none(),
        "coalesced: 1 s after the last apply"
    );
    assert!(agent.next_deadline(later).is_some());
    agent.tick(start + Duration::from_secs(1), wall());
    assert!(agent.datapath.maps.state.frontends.is_empty());
}

#[test]
fn kube_proxy_mode_after_ebpf_drains_then_detaches_when_no_flow_is_left() {
    let start = Instant::now();
    let mut agent = running_agent(DataplaneMode::Ebpf, start);
    assert_eq!(
        agent.datapath.maps.config.map(|config| config.mode),
        Some(DATAPATH_MODE_ACTIVE)
    );
    agent.datapath.live_flows = 4;
    let t1 = start + Duration::from_secs(1);
    agent.receive(dataplane_node(DataplaneMode::KubeProxy, 2), t1);
    agent.tick(t1, wall());
    assert!(matches!(agent.attachment(), Attachment::Draining { .. }));
    let t2 = start + Duration::from_secs(3);
    agent.tick(t2, wall());
    let status = agent.status_inputs(t2, &CoexistenceReport::default());
    assert_eq!(status.attachment, AttachmentReport::Draining);
    assert_eq!(status.live_flows, Some(4));
    assert_eq!(status.acted_generation, Some(2));
    assert!(
        !agent.datapath.attached.is_empty(),
        "still translating live flows"
    );
    agent.datapath.live_flows = 0;
    agent.tick(start + Duration::from_secs(5), wall());
    assert_eq!(agent.attachment(), Attachment::Detached);
    assert!(agent.datapath.attached.is_empty());
    let status = agent.status_inputs(
        start + Duration::from_secs(5),
        &CoexistenceReport::default(),
    );
    assert_eq!(status.last_drain, Some(DrainEnd::Complete));
    assert!(
        !agent.datapath.maps.state.frontends.is_empty(),
        "maps stay in sync in KubeProxy mode"
    );
}

#[test]
fn a_deleted_dataplane_node_keeps_an_attached_node_serving() {
    let start = Instant::now();
    let mut agent = running_agent(DataplaneMode::Ebpf, start);
    agent.datapath.live_flows = 4;
    // Garbage-collected with its Node (re-registered under the same name).
    for second in 1..=700 {
        let now = start + Duration::from_secs(second);
        if second == 1 {
            agent.receive(Input::DataplaneNode(None), now);
        }
        agent.tick(now, wall());
    }
    assert_eq!(agent.attachment(), Attachment::Attached);
    assert_eq!(agent.mode(), DataplaneMode::Ebpf);
    assert!(matches!(
        agent.instruction(),
        Instruction::DataplaneNodeGone(spec) if spec.mode == Mode::Ebpf
    ));
    assert_eq!(
        agent.datapath.maps.config.map(|config| config.mode),
        Some(DATAPATH_MODE_ACTIVE),
        "new connections are still translated"
    );
    assert_eq!(agent.datapath.attached.len(), 2);
}

#[test]
fn a_dataplane_node_recreated_with_ebpf_is_followed_without_reattaching() {
    let start = Instant::now();
    let mut agent = running_agent(DataplaneMode::Ebpf, start);
    let attach_calls = agent.datapath.attach_calls;
    let t1 = start + Duration::from_secs(1);
    agent.receive(Input::DataplaneNode(None), t1);
    agent.tick(t1, wall());
    // The operator recreates it with the cluster's mode, as a new object.
    let t2 = start + Duration::from_secs(2);
    agent.receive(dataplane_node(DataplaneMode::Ebpf, 1), t2);
    agent.tick(t2, wall());
    assert_eq!(agent.attachment(), Attachment::Attached);
    assert_eq!(agent.datapath.attach_calls, attach_calls);
    assert_eq!(agent.counts.program_attaches, 2, "attached once, at start");
    let status = agent.status_inputs(t2, &CoexistenceReport::default());
    assert_eq!(status.attachment, AttachmentReport::Attached);
    assert_eq!(status.mode, DataplaneMode::Ebpf);
    assert_eq!(status.acted_generation, Some(1));
}

#[test]
fn a_restarted_agent_without_a_dataplane_node_keeps_the_programs_an_earlier_process_attached() {
    let start = Instant::now();
    let first = running_agent(DataplaneMode::Ebpf, start);
    let previous = FakeDatapath {
        maps: first.datapath.maps.clone(),
        attached: first.datapath.attached.clone(),
        ..FakeDatapath::default()
    };
    let mut second = NodeAgent::start(settings(), previous, start).expect("starts");
    for input in every_input_but_the_dataplane_node() {
        second.receive(input, start);
    }
    second.receive(Input::DataplaneNode(None), start);
    for second_of_run in 0..700 {
        second.tick(start + Duration::from_secs(second_of_run), wall());
    }
    assert_eq!(second.attachment(), Attachment::Attached);
    assert_eq!(
        second.instruction(),
        Instruction::AttachedBefore(Mode::Ebpf)
    );
    assert_eq!(
        second.datapath.maps.config.map(|config| config.mode),
        Some(DATAPATH_MODE_ACTIVE)
    );
}

/// Programs a process attached but died before activating (no config entry)
/// never served: the core takes them for detached and activates them when the
/// DataplaneNode says `Ebpf`, in cluster mode as in standalone mode (cluster
/// mode used to take them for serving and never wrote `ACTIVE`).
#[test]
fn programs_found_attached_but_never_activated_are_activated_in_cluster_mode() {
    let start = Instant::now();
    let mut previous = FakeDatapath::default();
    previous
        .attached
        .insert("p-client".to_string(), InterfaceRole::Pod);
    let mut agent = NodeAgent::start(settings(), previous, start).expect("starts");
    assert_eq!(agent.attachment(), Attachment::Detached);
    for input in every_input_but_the_dataplane_node() {
        agent.receive(input, start);
    }
    agent.receive(dataplane_node(DataplaneMode::Ebpf, 1), start);
    agent.tick(start, wall());
    assert_eq!(agent.attachment(), Attachment::Attached);
    assert_eq!(
        agent.datapath.maps.config.map(|config| config.mode),
        Some(DATAPATH_MODE_ACTIVE)
    );
}

#[test]
fn a_failed_detach_keeps_the_node_draining_with_the_error_until_a_retry_succeeds() {
    let start = Instant::now();
    let mut agent = running_agent(DataplaneMode::Ebpf, start);
    agent.datapath.failing_detaches.insert("p-client".into());
    let t1 = start + Duration::from_secs(1);
    agent.receive(dataplane_node(DataplaneMode::KubeProxy, 2), t1);
    agent.tick(t1, wall());
    assert!(matches!(agent.attachment(), Attachment::Draining { .. }));

    let t2 = start + Duration::from_secs(3);
    agent.tick(t2, wall());
    assert_eq!(agent.attachment(), Attachment::Detaching);
    assert_eq!(
        agent.datapath.attached.keys().cloned().collect::<Vec<_>>(),
        vec!["p-client".to_string()],
        "eth0 detached, p-client left"
    );
    assert!(agent.next_deadline(t2).is_some(), "woken to retry");
    let status = agent.status_inputs(t2, &CoexistenceReport::default());
    assert_eq!(status.attachment, AttachmentReport::Draining);
    assert_eq!(
        status.attach_error.as_deref(),
        Some("failed to detach from p-client: device or resource busy")
    );
    assert_eq!(status.last_drain, Some(DrainEnd::Complete));

    // Still failing: the same state, nothing re-attached.
    let attach_calls = agent.datapath.attach_calls;
    agent.tick(start + Duration::from_secs(4), wall());
    assert_eq!(agent.attachment(), Attachment::Detaching);
    assert_eq!(agent.datapath.attach_calls, attach_calls);

    agent.datapath.failing_detaches.clear();
    let t5 = start + Duration::from_secs(5);
    agent.tick(t5, wall());
    assert_eq!(agent.attachment(), Attachment::Detached);
    assert!(agent.datapath.attached.is_empty());
    let status = agent.status_inputs(t5, &CoexistenceReport::default());
    assert_eq!(status.attachment, AttachmentReport::Detached);
    assert_eq!(status.attach_error, None);
    assert_eq!(status.last_drain, Some(DrainEnd::Complete));
}

#[test]
fn a_restarted_agent_finds_its_programs_and_entries_and_rewrites_nothing() {
    let start = Instant::now();
    let first = running_agent(DataplaneMode::Ebpf, start);
    let previous = FakeDatapath {
        maps: first.datapath.maps.clone(),
        attached: first.datapath.attached.clone(),
        ..FakeDatapath::default()
    };
    let mut second = NodeAgent::start(settings(), previous, start).expect("starts");
    assert_eq!(second.attachment(), Attachment::Attached);
    let mutations = second.datapath.maps.mutations_attempted;
    for input in every_input_but_the_dataplane_node() {
        second.receive(input, start);
    }
    second.receive(dataplane_node(DataplaneMode::Ebpf, 1), start);
    second.tick(start, wall());
    assert_eq!(
        second.datapath.maps.mutations_attempted, mutations,
        "the first apply after a restart is a no-op"
    );
    assert_eq!(
        second.counts.program_attaches, 0,
        "attaching again changed nothing"
    );
}

fn api_service() -> ServiceModel {
    let mut model = service();
    model.name = key_of("api");
    model.cluster_ips = vec!["10.96.0.20".parse().expect("valid")];
    model.ports[0].node_port = Some(30081);
    model
}

fn api_slice(hosts: &[&str]) -> EndpointSliceModel {
    let mut model = slice();
    model.slice_name = key_of("api-1");
    model.service = key_of("api");
    model.endpoints.truncate(1);
    let template = model.endpoints[0].clone();
    model.endpoints = hosts
        .iter()
        .map(|address| EndpointModel {
            address: address.parse().expect("valid"),
            node_name: Some("node-1".into()),
            hints: Default::default(),
            ..template.clone()
        })
        .collect();
    model
}

fn cluster_ip_backend_count(agent: &mut NodeAgent<FakeDatapath>, address: &str) -> Option<u32> {
    let key = frontend_key(
        &address.parse().expect("valid"),
        80,
        Protocol::Tcp,
        switchyard_common::SCOPE_INTERNAL,
    );
    agent
        .datapath
        .maps
        .state
        .frontends
        .get(&key)
        .map(|value| value.backend_count)
}

#[test]
fn after_the_first_sync_a_service_or_slice_change_is_a_partial_sync_of_that_service() {
    let start = Instant::now();
    let mut agent = running_agent(DataplaneMode::Ebpf, start);
    assert_eq!(
        agent.counts.partial_syncs, 0,
        "the first sync is a full one"
    );
    let web_slots = agent.datapath.maps.state.backend_slots.clone();

    let t1 = start + Duration::from_secs(2);
    agent.receive(
        Input::Services(StoreChange::Upsert(key_of("api"), api_service().into())),
        t1,
    );
    agent.receive(
        Input::EndpointSlices(StoreChange::Upsert(
            key_of("api-1"),
            api_slice(&["10.244.1.5"]),
        )),
        t1,
    );
    let (outcome, _) = agent.tick(t1, wall()).sync.expect("applied at once");
    assert_eq!(outcome.kind, SyncKind::Partial { services: 1 });
    assert_eq!(cluster_ip_backend_count(&mut agent, "10.96.0.20"), Some(1));
    assert!(
        web_slots
            .iter()
            .all(|(key, value)| agent.datapath.maps.state.backend_slots.get(key) == Some(value)),
        "web's slots untouched"
    );

    // The slice is deleted: api refuses, web is untouched.
    let t2 = start + Duration::from_secs(4);
    agent.receive(
        Input::EndpointSlices(StoreChange::Remove(key_of("api-1"))),
        t2,
    );
    let (outcome, _) = agent.tick(t2, wall()).sync.expect("applied at once");
    assert_eq!(outcome.kind, SyncKind::Partial { services: 1 });
    assert_eq!(cluster_ip_backend_count(&mut agent, "10.96.0.20"), Some(0));
    assert_eq!(cluster_ip_backend_count(&mut agent, "10.96.0.10"), Some(2));
    assert_eq!(agent.counts.partial_syncs, 2);
}

#[test]
fn changes_within_the_min_sync_period_are_batched_into_one_sync_and_none_is_dropped() {
    let start = Instant::now();
    let mut agent = running_agent(DataplaneMode::Ebpf, start);
    let mut web_slice = slice();
    web_slice.endpoints.truncate(1);
    let t1 = start + Duration::from_millis(200);
    agent.receive(
        Input::EndpointSlices(StoreChange::Upsert(key_of("web-1"), web_slice)),
        t1,
    );
    assert!(agent.tick(t1, wall()).sync.is_none(), "within the period");
    let t2 = start + Duration::from_millis(500);
    agent.receive(
        Input::Services(StoreChange::Upsert(key_of("api"), api_service().into())),
        t2,
    );
    assert!(agent.tick(t2, wall()).sync.is_none(), "within the period");
    assert_eq!(
        agent.next_deadline(t2),
        Some(start + Duration::from_secs(1))
    );
    let (outcome, _) = agent
        .tick(start + Duration::from_secs(1), wall())
        .sync
        .expect("one apply for both");
    assert_eq!(outcome.kind, SyncKind::Partial { services: 2 });
    assert_eq!(cluster_ip_backend_count(&mut agent, "10.96.0.10"), Some(1));
    assert_eq!(cluster_ip_backend_count(&mut agent, "10.96.0.20"), Some(0));
}

#[test]
fn a_node_address_change_is_a_full_sync() {
    let start = Instant::now();
    let mut agent = running_agent(DataplaneMode::Ebpf, start);
    let later = start + Duration::from_secs(10);
    agent.receive(Input::Node(node_facts(&["10.99.0.12"])), later);
    let (outcome, _) = agent.tick(later, wall()).sync.expect("applied");
    assert_eq!(outcome.kind, SyncKind::Full);
    let frontends = &agent.datapath.maps.state.frontends;
    assert!(frontends.contains_key(&node_port_key("10.99.0.12")));
    // eth0 still has 10.99.0.11: NodePorts stay on the host's addresses too.
    assert!(frontends.contains_key(&node_port_key("10.99.0.11")));
}

#[test]
fn the_periodic_full_resync_rereads_the_maps_and_repairs_them() {
    let start = Instant::now();
    let mut agent = running_agent(DataplaneMode::Ebpf, start);
    let expected = agent.datapath.maps.state.clone();
    // Something else deleted an entry behind the agent's back.
    agent
        .datapath
        .maps
        .state
        .frontends
        .remove(&node_port_key("10.99.0.11"));
    let before_due = start + Duration::from_secs(299);
    assert!(agent.tick(before_due, wall()).sync.is_none());
    assert_eq!(
        agent.next_deadline(before_due),
        Some(start + Duration::from_secs(300)),
        "woken for the resync"
    );
    let due = start + Duration::from_secs(300);
    let (outcome, _) = agent.tick(due, wall()).sync.expect("the resync ran");
    assert_eq!(outcome.kind, SyncKind::Resync);
    assert_eq!(agent.counts.resync_corrections, 1);
    assert_eq!(agent.datapath.maps.state, expected);
    // The next one is a period later, and finds nothing to correct: it
    // leaves the status (its last sync time) alone, so it costs no write.
    assert!(agent
        .tick(due + Duration::from_secs(10), wall())
        .sync
        .is_none());
    let reported = agent
        .status_inputs(due, &CoexistenceReport::default())
        .last_sync_time;
    let (outcome, _) = agent
        .tick(due + Duration::from_secs(300), wall())
        .sync
        .expect("the next resync ran");
    assert_eq!(outcome.kind, SyncKind::Resync);
    assert_eq!(outcome.report.operation_count(), 0);
    assert_eq!(agent.counts.resync_corrections, 1);
    assert_eq!(
        agent
            .status_inputs(due, &CoexistenceReport::default())
            .last_sync_time,
        reported
    );
}

#[test]
fn only_services_with_a_health_check_port_are_answered_with_their_local_endpoints() {
    let start = Instant::now();
    let mut agent = running_agent(DataplaneMode::Ebpf, start);
    assert!(agent.local_service_health().is_empty());
    let later = start + Duration::from_secs(2);
    agent.receive(
        Input::Services(StoreChange::Upsert(
            key_of("api"),
            ServiceEntry {
                model: api_service(),
                health_check_node_port: Some(32000),
            },
        )),
        later,
    );
    agent.receive(
        Input::EndpointSlices(StoreChange::Upsert(
            key_of("api-1"),
            api_slice(&["10.244.1.5", "10.244.1.6"]),
        )),
        later,
    );
    let health = agent.local_service_health();
    assert_eq!(health.len(), 1);
    assert_eq!(health[0].health_check_node_port, 32000);
    assert_eq!(health[0].name, "api");
    assert_eq!(health[0].local_endpoints, 2);
    agent.receive(Input::Services(StoreChange::Remove(key_of("api"))), later);
    assert!(agent.local_service_health().is_empty());
}

#[test]
fn a_watch_event_before_the_first_complete_list_does_not_open_the_gate() {
    let start = Instant::now();
    let mut agent = NodeAgent::start(settings(), FakeDatapath::default(), start).expect("starts");
    agent.receive(
        Input::Services(StoreChange::Upsert(key_of("web"), service().into())),
        start,
    );
    agent.receive(
        Input::EndpointSlices(StoreChange::Upsert(key_of("web-1"), slice())),
        start,
    );
    agent.receive(Input::Node(node_facts(&["10.99.0.11"])), start);
    agent.receive(host(None, &["p-client"]), start);
    agent.receive(dataplane_node(DataplaneMode::Ebpf, 1), start);
    agent.tick(start, wall());
    assert!(!agent.gate_is_open(), "single events are not a list");
    assert_eq!(agent.datapath.maps.mutations_attempted, 0);
    for input in every_input_but_the_dataplane_node() {
        agent.receive(input, start);
    }
    agent.tick(start, wall());
    assert!(agent.gate_is_open());
    assert!(agent.datapath.maps.mutations_applied > 0);
}

#[test]
fn a_change_right_after_the_periodic_resync_is_not_held_back_and_a_failed_resync_waits_a_period() {
    let start = Instant::now();
    let mut agent = running_agent(DataplaneMode::Ebpf, start);
    let due = start + Duration::from_secs(300);
    let (outcome, _) = agent.tick(due, wall()).sync.expect("the resync ran");
    assert_eq!(outcome.kind, SyncKind::Resync);
    let right_after = due + Duration::from_millis(100);
    agent.receive(
        Input::Services(StoreChange::Upsert(key_of("api"), api_service().into())),
        right_after,
    );
    let (outcome, _) = agent
        .tick(right_after, wall())
        .sync
        .expect("applied at once, not a period after the resync");
    assert_eq!(outcome.kind, SyncKind::Partial { services: 1 });

    // The next resync fails: retried a period later, with no busy loop meanwhile.
    let next_due = due + Duration::from_secs(300);
    agent
        .datapath
        .maps
        .failing_kinds
        .insert(MapMutation::WriteFrontend);
    agent.datapath.maps.state.frontends.clear();
    assert!(agent.tick(next_due, wall()).sync.is_none(), "failed");
    let soon = next_due + Duration::from_millis(10);
    assert!(agent
        .next_deadline(soon)
        .is_some_and(|at| at >= next_due + Duration::from_secs(1)));
    assert!(
        agent.tick(soon, wall()).sync.is_none(),
        "not retried at once"
    );
    agent.datapath.maps.failing_kinds.clear();
    let (outcome, _) = agent
        .tick(next_due + Duration::from_secs(1), wall())
        .sync
        .expect("retried a period later");
    assert_eq!(outcome.kind, SyncKind::Resync);
    assert!(!agent.datapath.maps.state.frontends.is_empty(), "repaired");
}

#[test]
fn the_masquerade_rule_goes_in_before_the_first_entry_that_needs_it_and_again_on_every_activation()
{
    let start = Instant::now();
    let mut agent = NodeAgent::start(
        AgentSettings {
            manage_masquerade_rule: true,
            ..settings()
        },
        FakeDatapath::default(),
        start,
    )
    .expect("starts");
    let mut cluster_ip_only = service();
    cluster_ip_only.ports[0].node_port = None;
    let mut inputs = every_input_but_the_dataplane_node();
    inputs[0] = Input::Services(StoreChange::Replace(BTreeMap::from([(
        key_of("web"),
        cluster_ip_only.into(),
    )])));
    for input in inputs {
        agent.receive(input, start);
    }
    agent.receive(dataplane_node(DataplaneMode::Ebpf, 1), start);
    agent.tick(start, wall());
    assert_eq!(agent.attachment(), Attachment::Attached);
    assert!(!agent.datapath.maps.state.frontends.is_empty());
    assert_eq!(
        agent.datapath.masquerade_installs,
        Vec::<bool>::new(),
        "ClusterIPs are translated and tracked by the programs alone: no netfilter rule"
    );
    assert!(!agent.netfilter_chains_wanted());

    // A NodePort (externalTrafficPolicy Cluster) to remote endpoints.
    let t1 = start + Duration::from_secs(2);
    agent.receive(
        Input::Services(StoreChange::Upsert(key_of("web"), service().into())),
        t1,
    );
    agent.tick(t1, wall());
    assert!(agent
        .datapath
        .maps
        .state
        .frontends
        .contains_key(&node_port_key("10.99.0.11")));
    assert_eq!(
        agent.datapath.masquerade_installs,
        vec![false],
        "installed once, before any entry flagged for masquerading was written"
    );
    assert!(agent.netfilter_chains_wanted());

    // The Service goes back to ClusterIP: the rule stays while the node serves.
    let t2 = start + Duration::from_secs(4);
    let mut cluster_ip_only = service();
    cluster_ip_only.ports[0].node_port = None;
    agent.receive(
        Input::Services(StoreChange::Upsert(key_of("web"), cluster_ip_only.into())),
        t2,
    );
    agent.tick(t2, wall());
    assert!(agent.netfilter_chains_wanted(), "flows may still use it");
    assert_eq!(agent.datapath.masquerade_installs.len(), 1);

    // Away from eBPF (the coexistence loop then removes the chains) and back.
    let t3 = start + Duration::from_secs(6);
    agent.receive(
        Input::Services(StoreChange::Upsert(key_of("web"), service().into())),
        t3,
    );
    agent.receive(dataplane_node(DataplaneMode::KubeProxy, 2), t3);
    agent.tick(t3, wall());
    agent.tick(t3 + Duration::from_secs(2), wall());
    assert_eq!(agent.attachment(), Attachment::Detached);
    let t4 = start + Duration::from_secs(10);
    agent.receive(dataplane_node(DataplaneMode::Ebpf, 3), t4);
    agent.tick(t4, wall());
    assert_eq!(agent.attachment(), Attachment::Attached);
    assert_eq!(
        agent.datapath.masquerade_installs.len(),
        2,
        "activation installs the rule again"
    );
}

#[test]
fn the_core_and_the_crd_agree_on_the_default_drain_timeout_and_the_modes() {
    assert_eq!(
        crate::follow::DEFAULT_DRAIN_TIMEOUT_SECONDS,
        switchyard_crds::DEFAULT_DRAIN_TIMEOUT_SECONDS
    );
    for mode in [DataplaneMode::Ebpf, DataplaneMode::KubeProxy] {
        assert_eq!(
            crd_mode(mode_spec(&DataplaneNodeSpec::new(mode)).mode),
            mode
        );
    }
}

#[test]
fn a_frontend_that_always_fails_is_reported_for_its_service_and_retried_while_the_rest_is_written()
{
    let start = Instant::now();
    let failing = node_port_key("10.99.0.11");
    let mut datapath = FakeDatapath::default();
    datapath.maps.failing_frontends.insert(failing);
    let mut agent = NodeAgent::start(settings(), datapath, start).expect("starts");
    for input in every_input_but_the_dataplane_node() {
        agent.receive(input, start);
    }
    agent.receive(dataplane_node(DataplaneMode::Ebpf, 1), start);
    agent.tick(start, wall());
    assert_eq!(
        agent.failed_entries(),
        &BTreeMap::from([("default/web".to_string(), 1)])
    );
    let status = agent.status_inputs(start, &CoexistenceReport::default());
    assert!(
        matches!(&status.sync, SyncReport::Failed { message } if message.contains("default/web") && message.contains("injected fault")),
        "{:?}",
        status.sync
    );
    // Everything else of the Service is in the maps: its ClusterIP answers.
    assert_eq!(cluster_ip_backend_count(&mut agent, "10.96.0.10"), Some(2));
    assert!(!agent.datapath.maps.state.frontends.contains_key(&failing));

    // Retried: once the entry can be written, the report clears.
    agent.datapath.maps.failing_frontends.clear();
    let mut now = start;
    for _ in 0..60 {
        now += Duration::from_secs(1);
        agent.tick(now, wall());
    }
    assert!(agent.failed_entries().is_empty());
    assert!(agent.datapath.maps.state.frontends.contains_key(&failing));
    let status = agent.status_inputs(now, &CoexistenceReport::default());
    assert_eq!(status.sync, SyncReport::Synced);
}

/// The shell writes out what the round decides: the status goes to the writer
/// once when it changes, not again while it stays, and again for a
/// DataplaneNode recreated under the same name (a new UID).
#[test]
fn a_round_hands_over_the_status_only_when_it_must_be_written() {
    let start = Instant::now();
    let mut agent = running_agent(DataplaneMode::Ebpf, start);
    let coexistence = CoexistenceReport::default();
    let mut tracker = round::StatusTracker::default();
    let tick = agent.tick(start, wall());
    let first = agent.round_report(&tick, start, wall(), start, &coexistence, &mut tracker);
    let written = first.status.expect("the first status is written");
    assert_eq!(written.object_uid.as_deref(), Some("uid-1"));
    assert!(first.synced && first.ready);
    assert!(first.coexistence.serving_from_ebpf);

    let later = start + Duration::from_secs(1);
    let tick = agent.tick(later, wall());
    let unchanged = agent.round_report(&tick, later, wall(), start, &coexistence, &mut tracker);
    assert_eq!(unchanged.status, None, "nothing changed");

    let mut recreated = dataplane_node(DataplaneMode::Ebpf, 1);
    if let Input::DataplaneNode(Some(view)) = &mut recreated {
        view.uid = Some("uid-recreated".into());
    }
    agent.receive(recreated, later);
    let tick = agent.tick(later, wall());
    let again = agent.round_report(&tick, later, wall(), start, &coexistence, &mut tracker);
    assert_eq!(
        again.status.and_then(|status| status.object_uid).as_deref(),
        Some("uid-recreated")
    );
}

/// The disruption signals the sampler published go out with the next status, once: a round
/// with the same report writes nothing, so the status is written at the sampler's rate.
#[test]
fn a_newly_published_disruption_report_is_written_once_with_the_status() {
    let start = Instant::now();
    let mut agent = running_agent(DataplaneMode::Ebpf, start);
    let coexistence = CoexistenceReport::default();
    let mut tracker = round::StatusTracker::default();
    let tick = agent.tick(start, wall());
    let first = agent.round_report(&tick, start, wall(), start, &coexistence, &mut tracker);
    assert!(first.status.is_some());
    let report = switchyard_crds::DisruptionReport {
        baseline: None,
        current: Some(switchyard_crds::SignalWindow {
            start: wall(),
            end: wall() + chrono::Duration::seconds(5),
            datapath: Default::default(),
            expected: Default::default(),
            connections: Default::default(),
            probes: Default::default(),
            services: Vec::new(),
        }),
    };
    tracker.disruption = Some(report.clone());
    let later = start + Duration::from_secs(1);
    let tick = agent.tick(later, wall());
    let with_report = agent.round_report(&tick, later, wall(), start, &coexistence, &mut tracker);
    let written = with_report
        .status
        .and_then(|written| written.status)
        .expect("the new report is written");
    assert_eq!(written.disruption, Some(report));
    let tick = agent.tick(later, wall());
    let same = agent.round_report(&tick, later, wall(), start, &coexistence, &mut tracker);
    assert_eq!(same.status, None, "the same report is not written again");
}

/// An agent whose rounds report to `health` (as `cluster::run` wires it), every input given.
fn agent_reporting_rounds_to(
    health: &switchyard_telemetry::Health,
    bound: Duration,
    start: Instant,
) -> NodeAgent<FakeDatapath> {
    let settings = AgentSettings {
        round_heartbeat: Some(health.register_loop("agent rounds", bound)),
        ..settings()
    };
    let mut agent = NodeAgent::start(settings, FakeDatapath::default(), start).expect("starts");
    for input in every_input_but_the_dataplane_node() {
        agent.receive(input, start);
    }
    agent.receive(dataplane_node(DataplaneMode::Ebpf, 1), start);
    agent
}

#[tokio::test(start_paused = true)]
async fn a_round_blocked_in_its_sync_makes_the_agent_not_live_once_the_round_bound_has_passed() {
    let health = switchyard_telemetry::Health::new();
    let bound = Duration::from_secs(120);
    let start = Instant::now();
    let mut agent = agent_reporting_rounds_to(&health, bound, start);
    // The first access to the maps blocks until the test releases it.
    let (entered_sender, mut entered) = tokio::sync::mpsc::unbounded_channel::<()>();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let mut first_access = Some((entered_sender, released));
    agent.datapath.on_maps_access = Some(Box::new(move || {
        if let Some((entered, released)) = first_access.take() {
            let _ = entered.send(());
            let _ = released.recv();
        }
    }));
    let runtime = tokio::runtime::Handle::current();
    let round = std::thread::spawn(move || {
        // The round reads the runtime's paused clock, as liveness does.
        let _clock = runtime.enter();
        let report = agent.tick(start, wall());
        (agent, report)
    });
    entered.recv().await.expect("the sync reached the maps");
    assert_eq!(health.liveness(), Ok(()), "a round just started");
    tokio::time::advance(bound - Duration::from_secs(1)).await;
    assert_eq!(health.liveness(), Ok(()), "within its bound");
    tokio::time::advance(Duration::from_secs(2)).await;
    let reason = health.liveness().expect_err("stuck past its bound");
    assert!(
        reason.contains("agent rounds has been in one step for 121 s"),
        "{reason}"
    );

    release.send(()).expect("the round waits for the release");
    let (agent, report) = round.join().expect("the round ends");
    assert!(report.sync.is_some(), "the blocked step was a sync");
    assert!(agent.has_synced());
    assert_eq!(health.liveness(), Ok(()), "the agent waits for input again");
}

#[tokio::test(start_paused = true)]
async fn an_agent_waiting_for_input_stays_live_for_minutes() {
    let health = switchyard_telemetry::Health::new();
    let start = Instant::now();
    // One agent that has every input and synced, one that never got any (its gate stays shut).
    let mut synced = agent_reporting_rounds_to(&health, Duration::from_secs(120), start);
    let settings = AgentSettings {
        round_heartbeat: Some(health.register_loop("idle agent rounds", Duration::from_secs(5))),
        ..settings()
    };
    let mut without_inputs =
        NodeAgent::start(settings, FakeDatapath::default(), start).expect("starts");
    synced.tick(start, wall());
    without_inputs.tick(start, wall());
    // Each runs a round only when it has something due (the gate's timeout, the periodic
    // resync), as the shell's loop wakes for it; in between they wait for input.
    let mut rounds = 0;
    for seconds in (7..=700_u64).step_by(7) {
        tokio::time::advance(Duration::from_secs(7)).await;
        let now = start + Duration::from_secs(seconds);
        for agent in [&mut synced, &mut without_inputs] {
            if agent.next_deadline(now).is_some_and(|due| due <= now) {
                agent.tick(now, wall());
                rounds += 1;
            }
        }
        assert_eq!(health.liveness(), Ok(()), "after {seconds} s");
    }
    assert!(synced.has_synced() && !without_inputs.has_synced());
    assert!(rounds < 20, "the agents mostly waited ({rounds} rounds)");
}

/// This node's DataplaneNode at `generation`, one object throughout.
fn dataplane_node_spec(spec: DataplaneNodeSpec, generation: i64) -> Input {
    Input::DataplaneNode(Some(DataplaneNodeView {
        uid: Some("uid-one-object".into()),
        generation: Some(generation),
        spec,
        status: None,
    }))
}

/// What the coexistence loop reports after a round on `generation`'s request; `rules` varies
/// the report so that the status changes and is handed over.
fn coexistence_after_round_on(generation: i64, rules: usize) -> CoexistenceReport {
    CoexistenceReport {
        kube_proxy_rules: Some(rules),
        rules_present: status::ConditionValue::new(
            rules > 0,
            "Test",
            format!("{rules} kube-proxy rules"),
        ),
        progress: status::CoexistenceProgress::ActedOn(Some(generation)),
        ..CoexistenceReport::default()
    }
}

/// The operator brings kube-proxy back only once every node reports the spec that took cleanup
/// away: the node must have closed kube-proxy's health ports by then, which the coexistence
/// loop does in its first round on that spec. So the status names that generation only once
/// the loop reports a round on it.
#[test]
fn a_spec_taking_cleanup_back_is_reported_as_observed_only_after_the_coexistence_loop_acted_on_it()
{
    let start = Instant::now();
    let mut agent = NodeAgent::start(settings(), FakeDatapath::default(), start).expect("starts");
    for input in every_input_but_the_dataplane_node() {
        agent.receive(input, start);
    }
    let mut tracker = round::StatusTracker::default();
    let cleaning = DataplaneNodeSpec {
        iptables_cleanup: true,
        ..DataplaneNodeSpec::new(DataplaneMode::Ebpf)
    };
    agent.receive(dataplane_node_spec(cleaning, 2), start);
    let tick = agent.tick(start, wall());
    let round = agent.round_report(
        &tick,
        start,
        wall(),
        start,
        &coexistence_after_round_on(2, 0),
        &mut tracker,
    );
    assert!(round.coexistence.health_ports_permitted);
    assert_eq!(round.coexistence.spec_generation, Some(2));
    let written = round.status.and_then(|written| written.status);
    assert_eq!(
        written.and_then(|status| status.observed_generation),
        Some(2)
    );

    // Told to go back: cleanup taken away. The loop's last round was still on 2 (its servers
    // may be open): the status, though it changed, still names 2.
    let later = start + Duration::from_secs(1);
    agent.receive(
        dataplane_node_spec(DataplaneNodeSpec::new(DataplaneMode::Ebpf), 3),
        later,
    );
    let tick = agent.tick(later, wall());
    let round = agent.round_report(
        &tick,
        later,
        wall(),
        start,
        &coexistence_after_round_on(2, 7),
        &mut tracker,
    );
    assert!(!round.coexistence.health_ports_permitted);
    assert_eq!(round.coexistence.spec_generation, Some(3));
    let held = round
        .status
        .and_then(|written| written.status)
        .expect("the changed conditions are handed over");
    assert_eq!(held.observed_generation, Some(2));
    assert!(held
        .conditions
        .iter()
        .all(|condition| condition.observed_generation == Some(2)));

    // The control: the loop's round on 3 (ports closed) makes 3 observed.
    let tick = agent.tick(later, wall());
    let round = agent.round_report(
        &tick,
        later,
        wall(),
        start,
        &coexistence_after_round_on(3, 7),
        &mut tracker,
    );
    let observed = round
        .status
        .and_then(|written| written.status)
        .and_then(|status| status.observed_generation);
    assert_eq!(observed, Some(3));

    // mode: KubeProxy never permits the ports either, with or without cleanup.
    let back = DataplaneNodeSpec {
        iptables_cleanup: true,
        ..DataplaneNodeSpec::new(DataplaneMode::KubeProxy)
    };
    agent.receive(dataplane_node_spec(back, 4), later);
    let tick = agent.tick(later, wall());
    let round = agent.round_report(
        &tick,
        later,
        wall(),
        start,
        &coexistence_after_round_on(3, 7),
        &mut tracker,
    );
    assert!(!round.coexistence.health_ports_permitted);
}

fn dns_service() -> ServiceModel {
    let service: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "dns", "namespace": "default"},
        "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.53", "ports": [
            {"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP"}
        ]}
    }))
    .expect("a valid Service");
    service_from_v1(&service)
        .expect("converts")
        .expect("is used")
}

/// The `dns` Service's slice with endpoints at `addresses`.
fn dns_slice(addresses: &[&str]) -> Input {
    let endpoints: Vec<serde_json::Value> = addresses
        .iter()
        .map(|address| serde_json::json!({"addresses": [address], "nodeName": "node-2", "conditions": {"ready": true}}))
        .collect();
    let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "dns-1", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "dns"}},
        "addressType": "IPv4",
        "ports": [{"name": "dns", "port": 5353, "protocol": "UDP"}],
        "endpoints": endpoints,
    }))
    .expect("a valid EndpointSlice");
    let slice = endpoint_slice_from_v1(&slice)
        .expect("converts")
        .expect("is used");
    Input::EndpointSlices(StoreChange::Upsert(key_of("dns-1"), slice))
}

/// A running agent serving the UDP `dns` Service from two endpoints, and the
/// moment (a period after its last sync) when one of them leaves.
fn agent_with_two_udp_endpoints(start: Instant) -> (NodeAgent<FakeDatapath>, Instant) {
    let mut agent = running_agent(DataplaneMode::Ebpf, start);
    let added = start + Duration::from_secs(1);
    agent.receive(
        Input::Services(StoreChange::Upsert(key_of("dns"), dns_service().into())),
        added,
    );
    agent.receive(dns_slice(&["10.244.2.53", "10.244.3.53"]), added);
    agent
        .tick(added, wall())
        .sync
        .expect("the Service is synced");
    assert!(agent.datapath.maps.udp_flow_releases.is_empty());
    (agent, added + Duration::from_secs(1))
}

#[test]
fn a_failed_udp_flow_release_is_retried_soon_with_backoff_without_any_other_input() {
    let start = Instant::now();
    let (mut agent, removed_at) = agent_with_two_udp_endpoints(start);
    agent.datapath.maps.failing_udp_flow_releases = true;
    agent.receive(dns_slice(&["10.244.3.53"]), removed_at);
    let (outcome, _) = agent.tick(removed_at, wall()).sync.expect("synced");
    assert!(outcome.report.udp_flow_releases_pending);

    // The first retry is due a second later; it fails too: the next waits twice as long.
    let first_retry = removed_at + Duration::from_secs(1);
    assert_eq!(agent.next_deadline(removed_at), Some(first_retry));
    let (outcome, _) = agent
        .tick(first_retry, wall())
        .sync
        .expect("the first retry is a sync of its own");
    assert_eq!(outcome.kind, SyncKind::Partial { services: 0 });
    assert!(outcome.report.udp_flow_releases_pending);
    let second_retry = first_retry + Duration::from_secs(2);
    assert_eq!(agent.next_deadline(first_retry), Some(second_retry));
    assert!(
        agent
            .tick(second_retry - Duration::from_millis(1), wall())
            .sync
            .is_none(),
        "not retried before its backoff"
    );

    agent.datapath.maps.failing_udp_flow_releases = false;
    let (outcome, _) = agent
        .tick(second_retry, wall())
        .sync
        .expect("retried again");
    assert_eq!(agent.datapath.maps.udp_flow_releases.len(), 1);
    assert_eq!(outcome.report.udp_flow_entries_deleted, 1);
    assert!(!outcome.report.udp_flow_releases_pending);
    assert_eq!(
        agent.next_deadline(second_retry),
        Some(start + Duration::from_secs(300)),
        "only the periodic resync is left"
    );
}

#[test]
fn nothing_is_retried_when_the_udp_flow_release_succeeded() {
    let start = Instant::now();
    let (mut agent, removed_at) = agent_with_two_udp_endpoints(start);
    agent.receive(dns_slice(&["10.244.3.53"]), removed_at);
    let (outcome, _) = agent.tick(removed_at, wall()).sync.expect("synced");
    assert_eq!(
        outcome.report.udp_flow_entries_deleted, 1,
        "released at once"
    );
    assert!(!outcome.report.udp_flow_releases_pending);
    assert_eq!(
        agent.next_deadline(removed_at),
        Some(start + Duration::from_secs(300))
    );
    for second in 1..=10 {
        let now = removed_at + Duration::from_secs(second);
        assert!(
            agent.tick(now, wall()).sync.is_none(),
            "no sync at {second} s"
        );
    }
    assert_eq!(agent.datapath.maps.udp_flow_releases.len(), 1);
}
