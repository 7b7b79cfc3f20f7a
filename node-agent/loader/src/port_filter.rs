//! The port filter's contents (`switchyard_common::port_filter`): which entries a
//! load must mark so that every flow the maps serve passes it.

use std::collections::BTreeSet;

use switchyard_common::{
    port_filter::{index, BACKEND_PORTS, FRONTEND_PORTS},
    BackendValue, ConntrackKey, ConntrackValue, FrontendKey, SocketReverseKey,
    CONNTRACK_FLAG_REPLY,
};

/// The port filter entries that frontends, backend slots, conntrack entries and
/// the socket hooks' reverse entries need marked: each frontend's port and each
/// backend's port, and for a flow whose frontend or backend is gone already, the
/// ports its own entries are found by (a client-direction entry's destination
/// port, which was its frontend's; a reply entry's source port, which was its
/// backend's; a translated socket's peer port, which is its backend's: its
/// `getpeername` and `recvmsg` look their entry up only on a marked port).
pub fn ports_in_use<'a>(
    frontends: impl IntoIterator<Item = &'a FrontendKey>,
    backend_slots: impl IntoIterator<Item = &'a BackendValue>,
    conntrack: &[(ConntrackKey, ConntrackValue)],
    translated_sockets: impl IntoIterator<Item = &'a SocketReverseKey>,
) -> BTreeSet<u32> {
    let mut indexes: BTreeSet<u32> = frontends
        .into_iter()
        .map(|key| index(FRONTEND_PORTS, key.port_big_endian))
        .collect();
    indexes.extend(
        backend_slots
            .into_iter()
            .map(|value| index(BACKEND_PORTS, value.port_big_endian)),
    );
    indexes.extend(conntrack.iter().map(|(key, value)| {
        if value.flags & CONNTRACK_FLAG_REPLY == 0 {
            index(FRONTEND_PORTS, key.destination_port_big_endian)
        } else {
            index(BACKEND_PORTS, key.source_port_big_endian)
        }
    }));
    indexes.extend(
        translated_sockets
            .into_iter()
            .map(|key| index(BACKEND_PORTS, key.backend_port_big_endian)),
    );
    indexes
}

#[cfg(test)]
mod tests;
