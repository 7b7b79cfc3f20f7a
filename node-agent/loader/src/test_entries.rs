//! Conntrack entries for the loader's unit tests: zero everywhere but the
//! fields a test is about.

use switchyard_common::{ConntrackKey, ConntrackValue};

/// A key of `protocol` between zero addresses and ports.
pub(crate) fn conntrack_key(protocol: u8) -> ConntrackKey {
    ConntrackKey {
        source_address: [0; 16],
        destination_address: [0; 16],
        source_port_big_endian: 0,
        destination_port_big_endian: 0,
        protocol,
        reserved: [0; 3],
    }
}

/// A value with these flags, TCP state and last use, translating to nothing.
pub(crate) fn conntrack_value(
    flags: u8,
    tcp_state: u8,
    last_seen_nanoseconds: u64,
) -> ConntrackValue {
    ConntrackValue {
        new_source_address: [0; 16],
        new_destination_address: [0; 16],
        new_source_port_big_endian: 0,
        new_destination_port_big_endian: 0,
        flags,
        tcp_state,
        reserved: [0; 2],
        last_seen_nanoseconds,
    }
}
