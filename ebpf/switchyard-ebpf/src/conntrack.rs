//! Switchyard's own connection tracking: lifetimes, state updates and applying an
//! entry's rewrite to a packet.

use aya_ebpf::programs::TcContext;
use switchyard_common::{
    ConntrackKey, ConntrackValue, DatapathConfig, CONNTRACK_FLAG_MASQUERADE,
    CONNTRACK_FLAG_PORT_TRANSLATED, CONNTRACK_FLAG_REPLY, CONNTRACK_FLAG_REWRITE_DESTINATION,
    CONNTRACK_FLAG_REWRITE_SOURCE, DEFAULT_TCP_CLOSING_TIMEOUT_SECONDS,
    DEFAULT_TCP_IDLE_TIMEOUT_SECONDS, DEFAULT_UDP_IDLE_TIMEOUT_SECONDS, PROTOCOL_TCP,
    TCP_STATE_FIN_FROM_BACKEND, TCP_STATE_FIN_FROM_CLIENT, TCP_STATE_REPLY_SEEN, TCP_STATE_RESET,
};

use crate::{
    count,
    packet::{self, Packet},
    CONNTRACK, CONNTRACK_OVERFLOW, PASS,
};

/// The entry of `key`: in the hash, or else in the overflow LRU. A key is in the
/// overflow only while the hash has none for it (see `insert`), so the first one
/// found is the only live one.
#[inline(always)]
pub fn find_entry(key: &ConntrackKey) -> Option<*mut ConntrackValue> {
    CONNTRACK
        .get_ptr_mut(key)
        .or_else(|| CONNTRACK_OVERFLOW.get_ptr_mut(key))
}

/// Writes the entry of `key`. The hash takes it unless it is full, and a full
/// hash still replaces a key it holds (the kernel keeps a spare element per CPU
/// for that): only a key the hash lacks goes to the overflow, which evicts its
/// oldest entry when it is full too.
#[inline(always)]
pub fn insert(key: &ConntrackKey, value: &ConntrackValue) -> Result<(), ()> {
    if CONNTRACK.insert(key, value, 0).is_ok() {
        return Ok(());
    }
    count(switchyard_common::counter::CONNTRACK_OVERFLOW);
    CONNTRACK_OVERFLOW.insert(key, value, 0).map_err(|_| ())
}

/// A TCP connection that has been reset, or has seen a FIN in each direction:
/// it lives only for the closing timeout, so the teardown itself is translated.
#[inline(always)]
pub fn is_closing(tcp_state: u8) -> bool {
    tcp_state & TCP_STATE_RESET != 0
        || tcp_state & (TCP_STATE_FIN_FROM_CLIENT | TCP_STATE_FIN_FROM_BACKEND)
            == (TCP_STATE_FIN_FROM_CLIENT | TCP_STATE_FIN_FROM_BACKEND)
}

#[inline(always)]
fn or_default(value: u32, default: u32) -> u64 {
    if value == 0 {
        default as u64
    } else {
        value as u64
    }
}

/// Whether an entry still stands for a live flow. An expired entry is treated as
/// absent even before the LRU evicts it.
#[inline(always)]
pub fn is_live(entry: &ConntrackValue, protocol: u8, config: &DatapathConfig, now: u64) -> bool {
    let timeout_seconds = if protocol == PROTOCOL_TCP {
        if is_closing(entry.tcp_state) {
            or_default(
                config.tcp_closing_timeout_seconds,
                DEFAULT_TCP_CLOSING_TIMEOUT_SECONDS,
            )
        } else {
            or_default(
                config.tcp_idle_timeout_seconds,
                DEFAULT_TCP_IDLE_TIMEOUT_SECONDS,
            )
        }
    } else {
        or_default(
            config.udp_idle_timeout_seconds,
            DEFAULT_UDP_IDLE_TIMEOUT_SECONDS,
        )
    };
    now.wrapping_sub(entry.last_seen_nanoseconds) < timeout_seconds * 1_000_000_000
}

/// How long after its last packet a UDP flow keeps its claim on its backend-side
/// tuple when it has no request waiting for an answer. UDP has no end: a flow
/// whose last request was answered may be over (a DNS client closes its socket)
/// or not (one socket asking several Services). Within this window a new flow
/// that would need the same tuple gets another source port; after it, the new
/// flow takes the tuple over and the old one chooses again on its next datagram.
const UDP_IN_USE_NANOSECONDS: u64 = 1_000_000_000;

/// Whether a hairpin flow's entry (sent straight back out), as opposed to a
/// source or destination rewrite that only undoes a source port translation.
#[inline(always)]
pub fn is_hairpin(entry: &ConntrackValue) -> bool {
    entry.flags & CONNTRACK_FLAG_PORT_TRANSLATED == 0
}

/// Whether `reply`, a reply-direction entry, translates back to the client side of
/// the client-direction tuple `flow`: it belongs to that flow.
#[inline(always)]
fn answers(reply: &ConntrackValue, flow: &ConntrackKey) -> bool {
    reply.flags & CONNTRACK_FLAG_REPLY != 0
        && reply.new_source_address == flow.destination_address
        && reply.new_source_port_big_endian == flow.destination_port_big_endian
        && reply.new_destination_address == flow.source_address
        && reply.new_destination_port_big_endian == flow.source_port_big_endian
}

/// Whether the live reply entry of the client-direction entry `entry` at `key`
/// still belongs to it. It may not: the LRU may have evicted it, or a newer flow
/// from the same client port through another frontend to the same backend may
/// have taken its tuple over. Replies would then be lost or come back from the
/// wrong address, so the caller treats the flow as new.
// Not inlined: a function of its own keeps its keys off `try_ingress`'s stack.
#[inline(never)]
pub fn reply_belongs_to(
    key: &ConntrackKey,
    entry: &ConntrackValue,
    config: &DatapathConfig,
    now: u64,
) -> bool {
    let reply_key = paired_key(key, entry);
    // SAFETY: read at once; a concurrent update gives at worst a stale answer.
    match find_entry(&reply_key) {
        // SAFETY: valid for this program run; read at once.
        Some(reply) => {
            let reply = unsafe { &*reply };
            answers(reply, key) && is_live(reply, key.protocol, config, now)
        }
        None => false,
    }
}

/// Whether the backend-side tuple `reply_key` is held by a live flow other than
/// `flow` (the client-direction tuple of a new flow) that may still get packets
/// through it: then the new flow must not take the tuple, or one of the two would
/// get the other's replies (the backend cannot tell them apart). Stale holders
/// (expired, orphaned, closed TCP, UDP idle past `UDP_IN_USE_NANOSECONDS` with no
/// request waiting) do not count: the new flow takes their tuple over.
// Not inlined: see `reply_belongs_to`.
#[inline(never)]
pub fn held_by_another_flow(
    reply_key: &ConntrackKey,
    flow: &ConntrackKey,
    config: &DatapathConfig,
    now: u64,
) -> bool {
    // SAFETY: fields are read from the map value in place; a concurrent update
    // gives at worst a stale answer.
    let Some(reply) = find_entry(reply_key) else {
        return false;
    };
    // SAFETY: valid for this program run.
    let reply = unsafe { &*reply };
    if !is_live(reply, reply_key.protocol, config, now) {
        return false;
    }
    if reply.flags & CONNTRACK_FLAG_REPLY == 0 {
        // The client direction of a flow that itself uses this exact tuple.
        return true;
    }
    if answers(reply, flow) {
        // This flow's own earlier entry (its client-direction entry expired or
        // was evicted): taken over by the same flow.
        return false;
    }
    let owner_key = paired_key(reply_key, reply);
    // SAFETY: as above.
    let Some(owner) = find_entry(&owner_key) else {
        return false;
    };
    // SAFETY: valid for this program run.
    let owner = unsafe { &*owner };
    if owner.flags & CONNTRACK_FLAG_REPLY != 0 || !is_live(owner, reply_key.protocol, config, now) {
        return false;
    }
    // The owner's client-direction entry must still lead to this reply entry
    // (else it belongs to a newer flow and this reply entry is an orphan).
    let owner_rewrites_source = owner.flags & CONNTRACK_FLAG_REWRITE_SOURCE != 0;
    let (owner_client_address, owner_client_port) = if owner_rewrites_source {
        (owner.new_source_address, owner.new_source_port_big_endian)
    } else {
        (owner_key.source_address, owner_key.source_port_big_endian)
    };
    if owner.new_destination_address != reply_key.source_address
        || owner.new_destination_port_big_endian != reply_key.source_port_big_endian
        || owner_client_address != reply_key.destination_address
        || owner_client_port != reply_key.destination_port_big_endian
    {
        return false;
    }
    if reply_key.protocol == PROTOCOL_TCP {
        return !is_closing(reply.tcp_state) && !is_closing(owner.tcp_state);
    }
    let waiting_for_an_answer = owner.last_seen_nanoseconds > reply.last_seen_nanoseconds;
    waiting_for_an_answer || now.wrapping_sub(reply.last_seen_nanoseconds) < UDP_IN_USE_NANOSECONDS
}

/// The key of the other direction's entry of the same connection.
#[inline(always)]
fn paired_key(key: &ConntrackKey, entry: &ConntrackValue) -> ConntrackKey {
    if entry.flags & CONNTRACK_FLAG_REPLY == 0 {
        let rewrites_source = entry.flags & CONNTRACK_FLAG_REWRITE_SOURCE != 0;
        ConntrackKey {
            source_address: entry.new_destination_address,
            destination_address: if rewrites_source {
                entry.new_source_address
            } else {
                key.source_address
            },
            source_port_big_endian: entry.new_destination_port_big_endian,
            destination_port_big_endian: if rewrites_source {
                entry.new_source_port_big_endian
            } else {
                key.source_port_big_endian
            },
            protocol: key.protocol,
            reserved: [0; 3],
        }
    } else {
        let rewrites_destination = entry.flags & CONNTRACK_FLAG_REWRITE_DESTINATION != 0;
        ConntrackKey {
            source_address: if rewrites_destination {
                entry.new_destination_address
            } else {
                key.destination_address
            },
            destination_address: entry.new_source_address,
            source_port_big_endian: if rewrites_destination {
                entry.new_destination_port_big_endian
            } else {
                key.destination_port_big_endian
            },
            destination_port_big_endian: entry.new_source_port_big_endian,
            protocol: key.protocol,
            reserved: [0; 3],
        }
    }
}

/// Records that the flow is alive, its TCP teardown, and the backend's first TCP
/// packet. These bits go to both entries of the connection, so each knows when both
/// sides have closed, and the client's entry whether the backend ever answered
/// (`TCP_STATE_REPLY_SEEN`, read by the draining agent: a SYN retried to a silent
/// backend refreshes the client's entry as an idle connection's last ACK does). The
/// answer costs the other entry's lookup once per flow: after it, the reply entry
/// has the bit.
#[inline(always)]
pub fn refresh(entry: &mut ConntrackValue, packet: &Packet, key: &ConntrackKey, now: u64) {
    entry.last_seen_nanoseconds = now;
    let mut state = 0;
    let from_backend = entry.flags & CONNTRACK_FLAG_REPLY != 0;
    if packet.is_tcp_fin() {
        state |= if from_backend {
            TCP_STATE_FIN_FROM_BACKEND
        } else {
            TCP_STATE_FIN_FROM_CLIENT
        };
    }
    if packet.is_tcp_reset() {
        state |= TCP_STATE_RESET;
    }
    if from_backend
        && packet.protocol == PROTOCOL_TCP
        && entry.tcp_state & TCP_STATE_REPLY_SEEN == 0
    {
        state |= TCP_STATE_REPLY_SEEN;
    }
    if state != 0 {
        entry.tcp_state |= state;
        let other_key = paired_key(key, entry);
        if let Some(other) = find_entry(&other_key) {
            // SAFETY: valid for this run; a single byte-wide OR.
            unsafe { (*other).tcp_state |= state };
        }
    }
}

/// A packet that hit a live entry at ingress.
#[inline(always)]
pub fn apply_at_ingress(
    ctx: &TcContext,
    packet: &Packet,
    key: &ConntrackKey,
    entry: &mut ConntrackValue,
    masquerade_mark: u32,
    now: u64,
) -> Result<i32, ()> {
    if entry.flags & CONNTRACK_FLAG_REPLY == 0 {
        refresh(entry, packet, key, now);
        count(switchyard_common::counter::CONNTRACK_HIT);
        let rewrite = *entry;
        return rewrite_forward(ctx, packet, &rewrite, masquerade_mark);
    }
    if entry.flags & CONNTRACK_FLAG_REWRITE_DESTINATION != 0 && is_hairpin(entry) {
        // The reply of a hairpin flow, coming back from the pod that is both
        // client and backend: translate both ends and send it straight back.
        refresh(entry, packet, key, now);
        count(switchyard_common::counter::CONNTRACK_HIT);
        count(switchyard_common::counter::REVERSE_TRANSLATED);
        let rewrite = *entry;
        packet::rewrite_source(
            ctx,
            packet,
            rewrite.new_source_address,
            rewrite.new_source_port_big_endian,
        )?;
        packet::rewrite_destination(
            ctx,
            packet,
            rewrite.new_destination_address,
            rewrite.new_destination_port_big_endian,
        )?;
        return crate::bounce(ctx);
    }
    // A plain (or port-translated) reply on its way in (at the backend's
    // interface): it is translated at egress towards the client, after netfilter
    // has seen it untranslated.
    Ok(PASS)
}

/// Applies a client-direction entry: destination to the backend; for a hairpin
/// flow the source to the hairpin address, sent straight back out; for a
/// port-translated flow the source port.
#[inline(always)]
pub fn rewrite_forward(
    ctx: &TcContext,
    packet: &Packet,
    rewrite: &ConntrackValue,
    masquerade_mark: u32,
) -> Result<i32, ()> {
    packet::rewrite_destination(
        ctx,
        packet,
        rewrite.new_destination_address,
        rewrite.new_destination_port_big_endian,
    )?;
    if rewrite.flags & CONNTRACK_FLAG_MASQUERADE != 0 {
        // SAFETY: reading and writing the mark of the context we were given.
        unsafe {
            let mark = (*ctx.skb.skb).mark;
            ctx.set_mark(mark | masquerade_mark);
        }
    }
    if rewrite.flags & CONNTRACK_FLAG_REWRITE_SOURCE != 0 {
        packet::rewrite_source(
            ctx,
            packet,
            rewrite.new_source_address,
            rewrite.new_source_port_big_endian,
        )?;
        if is_hairpin(rewrite) {
            return crate::bounce(ctx);
        }
    }
    Ok(PASS)
}
