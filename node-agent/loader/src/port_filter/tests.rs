use super::*;
use switchyard_common::{ipv4_mapped, PROTOCOL_TCP, PROTOCOL_UDP, SCOPE_INTERNAL};

fn frontend(port: u16) -> FrontendKey {
    FrontendKey {
        address: ipv4_mapped([10, 96, 0, 1]),
        port_big_endian: port.to_be(),
        protocol: PROTOCOL_TCP,
        scope: SCOPE_INTERNAL,
    }
}

fn backend(port: u16) -> BackendValue {
    BackendValue {
        address: ipv4_mapped([10, 244, 0, 5]),
        port_big_endian: port.to_be(),
        flags: 0,
    }
}

fn flow_entry(
    source_port: u16,
    destination_port: u16,
    flags: u8,
) -> (ConntrackKey, ConntrackValue) {
    (
        ConntrackKey {
            source_address: ipv4_mapped([10, 244, 0, 9]),
            destination_address: ipv4_mapped([10, 96, 0, 2]),
            source_port_big_endian: source_port.to_be(),
            destination_port_big_endian: destination_port.to_be(),
            protocol: PROTOCOL_UDP,
            reserved: [0; 3],
        },
        crate::test_entries::conntrack_value(flags, 0, 0),
    )
}

#[test]
fn frontend_ports_are_marked_as_frontend_ports_and_backend_ports_as_backend_ports() {
    let frontends = [frontend(80), frontend(30080)];
    let backends = [backend(8080), backend(8080), backend(9090)];
    let marked = ports_in_use(&frontends, &backends, &[], []);
    let expected: BTreeSet<u32> = [
        index(FRONTEND_PORTS, 80u16.to_be()),
        index(FRONTEND_PORTS, 30080u16.to_be()),
        index(BACKEND_PORTS, 8080u16.to_be()),
        index(BACKEND_PORTS, 9090u16.to_be()),
    ]
    .into();
    assert_eq!(marked, expected);
}

#[test]
fn flows_whose_frontend_and_backend_are_gone_keep_their_ports_marked() {
    let flows = [
        // Client 10.244.0.9:40000 to a frontend on port 53...
        flow_entry(40000, 53, 0),
        // ...and its reply entry, from the backend's port 5353.
        flow_entry(5353, 40000, CONNTRACK_FLAG_REPLY),
    ];
    let marked = ports_in_use([], [], &flows, []);
    let expected: BTreeSet<u32> = [
        index(FRONTEND_PORTS, 53u16.to_be()),
        index(BACKEND_PORTS, 5353u16.to_be()),
    ]
    .into();
    assert_eq!(marked, expected);
}

#[test]
fn a_socket_translated_to_a_backend_that_is_gone_keeps_its_port_marked() {
    // A pod's connection the connect hook pointed at 10.244.0.5:8443, whose
    // Service has since gone: only the reverse entry still names the port.
    let socket = SocketReverseKey {
        socket_cookie: 7,
        backend_address: ipv4_mapped([10, 244, 0, 5]),
        backend_port_big_endian: 8443u16.to_be(),
        reserved: [0; 6],
    };
    let marked = ports_in_use([], [], &[], [&socket]);
    let expected: BTreeSet<u32> = [index(BACKEND_PORTS, 8443u16.to_be())].into();
    assert_eq!(marked, expected);
}

#[test]
fn nothing_in_the_maps_marks_nothing() {
    assert!(ports_in_use([], [], &[], []).is_empty());
}
