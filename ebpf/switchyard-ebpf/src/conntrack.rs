//! Switchyard's own connection tracking: lifetimes, state updates and applying an
//! entry's rewrite to a packet.

use aya_ebpf::programs::TcContext;
use switchyard_common::{
    ConntrackKey, ConntrackValue, DatapathConfig, CONNTRACK_FLAG_MASQUERADE, CONNTRACK_FLAG_REPLY,
    CONNTRACK_FLAG_REWRITE_DESTINATION, CONNTRACK_FLAG_REWRITE_SOURCE,
    DEFAULT_TCP_CLOSING_TIMEOUT_SECONDS, DEFAULT_TCP_IDLE_TIMEOUT_SECONDS,
    DEFAULT_UDP_IDLE_TIMEOUT_SECONDS, PROTOCOL_TCP, TCP_STATE_FIN_FROM_BACKEND,
    TCP_STATE_FIN_FROM_CLIENT, TCP_STATE_RESET,
};

use crate::{
    count,
    packet::{self, Packet},
    CONNTRACK, PASS,
};

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

/// Records that the flow is alive, and its TCP teardown. Teardown bits go to both
/// entries of the connection, so each knows when both sides have closed.
#[inline(always)]
pub fn refresh(entry: &mut ConntrackValue, packet: &Packet, key: &ConntrackKey, now: u64) {
    entry.last_seen_nanoseconds = now;
    let mut state = 0;
    if packet.is_tcp_fin() {
        state |= if entry.flags & CONNTRACK_FLAG_REPLY == 0 {
            TCP_STATE_FIN_FROM_CLIENT
        } else {
            TCP_STATE_FIN_FROM_BACKEND
        };
    }
    if packet.is_tcp_reset() {
        state |= TCP_STATE_RESET;
    }
    if state != 0 {
        entry.tcp_state |= state;
        let other_key = paired_key(key, entry);
        if let Some(other) = CONNTRACK.get_ptr_mut(&other_key) {
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
    if entry.flags & CONNTRACK_FLAG_REWRITE_DESTINATION != 0 {
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
    // A plain reply on its way in (at the backend's interface): it is translated
    // at egress towards the client, after netfilter has seen it untranslated.
    Ok(PASS)
}

/// Applies a client-direction entry: destination to the backend, and for a
/// hairpin flow the source to the hairpin address, sent straight back out.
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
        return crate::bounce(ctx);
    }
    Ok(PASS)
}
