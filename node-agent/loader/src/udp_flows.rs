//! Deleting the UDP flows whose backend left their Service (kube-proxy deletes
//! the conntrack entries NATed to a removed UDP endpoint, `pkg/proxy/conntrack`):
//! the next datagram of such a flow misses, and the programs balance it again to
//! a live backend, or refuse it (ICMP port unreachable) when the frontend has no
//! backend left. TCP flows are left alone, as kube-proxy leaves them: they end
//! by timeout or reset.
//!
//! Both entries of a flow go: the client-direction one (keyed by the tuple the
//! client sent, to the frontend; its rewrite names the backend) and the reply
//! one (keyed by the backend's tuple; its rewrite names the frontend), each
//! judged on its own, so an orphan of either is found too.

use std::os::fd::BorrowedFd;

use switchyard_common::{
    map_names, ConntrackKey, ConntrackValue, CONNTRACK_FLAG_REPLY,
    CONNTRACK_FLAG_REWRITE_DESTINATION, CONNTRACK_FLAG_REWRITE_SOURCE, PROTOCOL_UDP,
};
use switchyard_model::diff::RemovedUdpBackends;
use switchyard_model::Error as MapError;

use super::expiry::delete_conntrack_entries_where;
use super::system;

const KEY_SIZE: usize = std::mem::size_of::<ConntrackKey>();

/// Whether the entry belongs to a UDP flow that a frontend in `removed` sent to
/// a backend it no longer has.
pub fn leads_to_removed_backend(
    key: &ConntrackKey,
    value: &ConntrackValue,
    removed: &RemovedUdpBackends,
) -> bool {
    if key.protocol != PROTOCOL_UDP {
        return false;
    }
    if value.flags & CONNTRACK_FLAG_REPLY == 0 {
        value.flags & CONNTRACK_FLAG_REWRITE_DESTINATION != 0
            && removed.contains(
                &(key.destination_address, key.destination_port_big_endian),
                &(
                    value.new_destination_address,
                    value.new_destination_port_big_endian,
                ),
            )
    } else {
        value.flags & CONNTRACK_FLAG_REWRITE_SOURCE != 0
            && removed.contains(
                &(value.new_source_address, value.new_source_port_big_endian),
                &(key.source_address, key.source_port_big_endian),
            )
    }
}

/// Deletes the entries of `map` (the conntrack hash or its overflow LRU) that
/// [`leads_to_removed_backend`] picks, batch by batch as they are read; returns
/// how many it deleted. A key the programs rewrote between the read and the
/// delete (a new flow from the same client port) loses its entry too, which
/// costs that UDP flow one more backend choice, nothing else.
pub fn delete_flows_to_removed_backends(
    map: BorrowedFd<'_>,
    name: &'static str,
    removed: &RemovedUdpBackends,
) -> Result<usize, MapError> {
    let walk = delete_conntrack_entries_where(
        map,
        |key, value, _read_at| leads_to_removed_backend(key, value, removed),
        |keys| system::map_delete_keys(map, keys, KEY_SIZE),
    )
    .map_err(|source| MapError::UpdateMap {
        map: name,
        source: Box::new(crate::Error::DeleteConntrackEntries {
            what: "delete the UDP flows of removed backends",
            source,
        }),
    })?;
    Ok(walk.deleted)
}

/// Both conntrack maps: the hash, then the overflow.
pub fn release(
    conntrack: BorrowedFd<'_>,
    overflow: BorrowedFd<'_>,
    removed: &RemovedUdpBackends,
) -> Result<usize, MapError> {
    Ok(
        delete_flows_to_removed_backends(conntrack, map_names::CONNTRACK, removed)?
            + delete_flows_to_removed_backends(overflow, map_names::CONNTRACK_OVERFLOW, removed)?,
    )
}

#[cfg(test)]
mod tests;
