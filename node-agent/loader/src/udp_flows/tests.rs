use switchyard_common::{ipv4_mapped, Address, PROTOCOL_TCP};

use super::*;
use crate::test_entries::{conntrack_key, conntrack_value};

const FRONTEND: Address = ipv4_mapped([10, 96, 0, 10]);
const OTHER_FRONTEND: Address = ipv4_mapped([10, 96, 0, 11]);
const CLIENT: Address = ipv4_mapped([10, 0, 0, 5]);
const REMOVED: Address = ipv4_mapped([10, 1, 0, 2]);
const KEPT: Address = ipv4_mapped([10, 1, 0, 3]);
const PORT: u16 = 53u16.to_be();
const BACKEND_PORT: u16 = 5353u16.to_be();

fn removed() -> RemovedUdpBackends {
    let mut removed = RemovedUdpBackends::default();
    removed
        .by_frontend
        .entry((FRONTEND, PORT))
        .or_default()
        .insert((REMOVED, BACKEND_PORT));
    removed
}

/// The client-direction entry of a flow from the client to `frontend`, sent to `backend`.
fn forward(protocol: u8, frontend: Address, backend: Address) -> (ConntrackKey, ConntrackValue) {
    let mut key = conntrack_key(protocol);
    key.source_address = CLIENT;
    key.source_port_big_endian = 40_000u16.to_be();
    key.destination_address = frontend;
    key.destination_port_big_endian = PORT;
    let mut value = conntrack_value(CONNTRACK_FLAG_REWRITE_DESTINATION, 0, 1);
    value.new_destination_address = backend;
    value.new_destination_port_big_endian = BACKEND_PORT;
    (key, value)
}

/// The reply entry of the same flow.
fn reply(protocol: u8, frontend: Address, backend: Address) -> (ConntrackKey, ConntrackValue) {
    let mut key = conntrack_key(protocol);
    key.source_address = backend;
    key.source_port_big_endian = BACKEND_PORT;
    key.destination_address = CLIENT;
    key.destination_port_big_endian = 40_000u16.to_be();
    let mut value = conntrack_value(CONNTRACK_FLAG_REPLY | CONNTRACK_FLAG_REWRITE_SOURCE, 0, 1);
    value.new_source_address = frontend;
    value.new_source_port_big_endian = PORT;
    value.new_destination_address = CLIENT;
    value.new_destination_port_big_endian = 40_000u16.to_be();
    (key, value)
}

#[test]
fn a_failed_walk_names_the_map_and_the_step_and_keeps_the_io_error_as_its_source() {
    // Not a BPF map: the kernel refuses the walk's first batch read.
    let not_a_map = std::fs::File::open("/dev/null").expect("/dev/null opens");
    let error = delete_flows_to_removed_backends(
        std::os::fd::AsFd::as_fd(&not_a_map),
        map_names::CONNTRACK,
        &removed(),
    )
    .expect_err("the walk fails");
    assert_eq!(
        error.to_string(),
        format!("failed to update map {}", map_names::CONNTRACK)
    );
    let step = std::error::Error::source(&error).expect("the step is the source");
    assert_eq!(
        step.to_string(),
        "failed to delete the UDP flows of removed backends"
    );
    let io = std::error::Error::source(step).expect("the io error is kept");
    assert!(io.downcast_ref::<std::io::Error>().is_some(), "{io:?}");
}

#[test]
fn both_entries_of_a_udp_flow_to_a_removed_backend_are_deleted() {
    let (key, value) = forward(PROTOCOL_UDP, FRONTEND, REMOVED);
    assert!(leads_to_removed_backend(&key, &value, &removed()));
    let (key, value) = reply(PROTOCOL_UDP, FRONTEND, REMOVED);
    assert!(leads_to_removed_backend(&key, &value, &removed()));
}

#[test]
fn a_udp_flow_to_a_backend_the_frontend_keeps_is_left_alone() {
    let (key, value) = forward(PROTOCOL_UDP, FRONTEND, KEPT);
    assert!(!leads_to_removed_backend(&key, &value, &removed()));
    let (key, value) = reply(PROTOCOL_UDP, FRONTEND, KEPT);
    assert!(!leads_to_removed_backend(&key, &value, &removed()));
}

#[test]
fn a_tcp_flow_to_a_removed_backend_is_left_to_time_out_as_kube_proxy_leaves_it() {
    let (key, value) = forward(PROTOCOL_TCP, FRONTEND, REMOVED);
    assert!(!leads_to_removed_backend(&key, &value, &removed()));
    let (key, value) = reply(PROTOCOL_TCP, FRONTEND, REMOVED);
    assert!(!leads_to_removed_backend(&key, &value, &removed()));
}

#[test]
fn a_flow_of_another_frontend_to_the_same_backend_is_left_alone() {
    let (key, value) = forward(PROTOCOL_UDP, OTHER_FRONTEND, REMOVED);
    assert!(!leads_to_removed_backend(&key, &value, &removed()));
    let (key, value) = reply(PROTOCOL_UDP, OTHER_FRONTEND, REMOVED);
    assert!(!leads_to_removed_backend(&key, &value, &removed()));
}

#[test]
fn an_entry_that_rewrites_no_service_address_is_left_alone() {
    // A client-direction entry that only translates the source port (no
    // destination rewrite) is not a Service flow's.
    let (key, mut value) = forward(PROTOCOL_UDP, FRONTEND, REMOVED);
    value.flags = CONNTRACK_FLAG_REWRITE_SOURCE;
    assert!(!leads_to_removed_backend(&key, &value, &removed()));
    let (key, mut value) = reply(PROTOCOL_UDP, FRONTEND, REMOVED);
    value.flags = CONNTRACK_FLAG_REPLY;
    assert!(!leads_to_removed_backend(&key, &value, &removed()));
}
