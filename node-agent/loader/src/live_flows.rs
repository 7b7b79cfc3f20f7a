//! The live TCP flows a draining agent waits for: connections the TC programs still
//! translate that would break if they stopped. A flow the backend never answered (a SYN
//! to an endpoint that is gone or drops everything, retried by a client that keeps trying)
//! is no connection to keep: counting it held every drain open until its timeout.
//!
//! The programs write a flow's two entries with one timestamp: the client direction's,
//! refreshed by each client packet, and the reply direction's, refreshed only by the
//! backend's packets. So a reply entry still holding its client entry's timestamp has seen
//! no packet since the flow began in either direction: no answer. A reply entry that is
//! later than its client entry has seen an answer. One that is earlier is either (the client
//! spoke after the backend's last packet, or retransmitted its SYN to a silent backend): the
//! entries do not tell, so such a flow is kept, as before.

use std::collections::HashMap;

use switchyard_common::{
    ConntrackKey, ConntrackValue, DatapathConfig, CONNTRACK_FLAG_REPLY,
    CONNTRACK_FLAG_REWRITE_SOURCE, DEFAULT_TCP_IDLE_TIMEOUT_SECONDS, PROTOCOL_TCP,
    TCP_STATE_FIN_FROM_BACKEND, TCP_STATE_FIN_FROM_CLIENT, TCP_STATE_RESET,
};

/// How long a flow without an answer still counts: Linux's initial retransmission timeout
/// (`TCP_TIMEOUT_INIT`), within which a backend's SYN-ACK may still be on its way. After it
/// the client has either retransmitted (its entry moves on, and the flow is kept as
/// undecided) or given up.
pub const UNANSWERED_GRACE_NANOSECONDS: u64 = 1_000_000_000;

/// The key of the reply-direction entry of the client-direction entry `value` at `key`, as
/// the programs compute it (`conntrack::paired_key`).
fn reply_key(key: &ConntrackKey, value: &ConntrackValue) -> ConntrackKey {
    let rewrites_source = value.flags & CONNTRACK_FLAG_REWRITE_SOURCE != 0;
    ConntrackKey {
        source_address: value.new_destination_address,
        destination_address: if rewrites_source {
            value.new_source_address
        } else {
            key.source_address
        },
        source_port_big_endian: value.new_destination_port_big_endian,
        destination_port_big_endian: if rewrites_source {
            value.new_source_port_big_endian
        } else {
            key.source_port_big_endian
        },
        protocol: key.protocol,
        reserved: [0; 3],
    }
}

/// Whether `reply` translates back to the client side of `flow`: it belongs to that flow
/// (the programs' `conntrack::answers`), not to a newer flow that took the tuple over.
fn answers(reply: &ConntrackValue, flow: &ConntrackKey) -> bool {
    reply.flags & CONNTRACK_FLAG_REPLY != 0
        && reply.new_source_address == flow.destination_address
        && reply.new_source_port_big_endian == flow.destination_port_big_endian
        && reply.new_destination_address == flow.source_address
        && reply.new_destination_port_big_endian == flow.source_port_big_endian
}

/// Counts connections (client-direction entries) that are TCP, not closing, seen within
/// the idle timeout, as the programs judge liveness, and not known to be unanswered: their
/// reply entry is theirs and has seen the backend, or cannot tell (see the module's
/// documentation); a flow without its reply entry (evicted from the overflow LRU) cannot
/// be translated back and is not counted either.
pub fn live_tcp_flow_count(
    entries: &[(ConntrackKey, ConntrackValue)],
    config: &DatapathConfig,
    now_nanoseconds: u64,
) -> usize {
    let idle_seconds = if config.tcp_idle_timeout_seconds == 0 {
        DEFAULT_TCP_IDLE_TIMEOUT_SECONDS
    } else {
        config.tcp_idle_timeout_seconds
    };
    let idle_nanoseconds = u64::from(idle_seconds) * 1_000_000_000;
    let both_fins = TCP_STATE_FIN_FROM_CLIENT | TCP_STATE_FIN_FROM_BACKEND;
    let replies: HashMap<&ConntrackKey, &ConntrackValue> = entries
        .iter()
        .filter(|(key, value)| {
            key.protocol == PROTOCOL_TCP && value.flags & CONNTRACK_FLAG_REPLY != 0
        })
        .map(|(key, value)| (key, value))
        .collect();
    entries
        .iter()
        .filter(|(key, value)| {
            key.protocol == PROTOCOL_TCP
                && value.flags & CONNTRACK_FLAG_REPLY == 0
                && value.tcp_state & TCP_STATE_RESET == 0
                && value.tcp_state & both_fins != both_fins
                && now_nanoseconds.saturating_sub(value.last_seen_nanoseconds) < idle_nanoseconds
        })
        .filter(|(key, value)| {
            let Some(reply) = replies
                .get(&reply_key(key, value))
                .filter(|reply| answers(reply, key))
            else {
                return false;
            };
            let unanswered = reply.last_seen_nanoseconds == value.last_seen_nanoseconds;
            !unanswered
                || now_nanoseconds.saturating_sub(value.last_seen_nanoseconds)
                    < UNANSWERED_GRACE_NANOSECONDS
        })
        .count()
}

#[cfg(test)]
mod tests;
