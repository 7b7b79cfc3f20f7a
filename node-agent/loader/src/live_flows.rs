//! The live TCP flows a draining agent waits for: connections the TC programs still
//! translate that would break if they stopped. A flow the backend never answered (a SYN
//! to an endpoint that is gone or drops everything, retried by a client that keeps trying)
//! is no connection to keep: counting it held every drain open until its timeout.
//!
//! The programs mark the backend's first packet of a TCP flow on both its entries
//! (`TCP_STATE_REPLY_SEEN`), and every client-direction entry they write says so
//! (`CONNTRACK_FLAG_RECORDS_REPLY`): such a flow is answered exactly when it has the bit,
//! however its client retried or idled since.
//!
//! Entries an older build wrote (pinned maps survive agent upgrades) lack the flag, and
//! their missing bit means nothing. For them, timestamps are all there is: the programs
//! write a flow's two entries with one timestamp, the client direction's refreshed by
//! each client packet, the reply direction's only by the backend's. So a reply entry
//! still holding its client entry's timestamp has seen no packet since the flow began in
//! either direction: no answer. A reply entry later than its client entry has seen an
//! answer. One that is earlier is either (the client spoke after the backend's last
//! packet, or retransmitted its SYN to a silent backend): the entries do not tell, so
//! such a flow is kept. Once the backend answers under the new programs, the bit is set
//! on an old entry too, and it counts as answered.

use std::collections::HashMap;

use switchyard_common::{
    ConntrackKey, ConntrackValue, DatapathConfig, CONNTRACK_FLAG_RECORDS_REPLY,
    CONNTRACK_FLAG_REPLY, CONNTRACK_FLAG_REWRITE_SOURCE, DEFAULT_TCP_IDLE_TIMEOUT_SECONDS,
    PROTOCOL_TCP, TCP_STATE_FIN_FROM_BACKEND, TCP_STATE_FIN_FROM_CLIENT, TCP_STATE_REPLY_SEEN,
    TCP_STATE_RESET,
};

/// How long after it began a flow without an answer still counts: Linux's initial
/// retransmission timeout (`TCP_TIMEOUT_INIT`), within which a backend's SYN-ACK may still
/// be on its way. After it the client has either retransmitted or given up (without
/// `CONNTRACK_FLAG_RECORDS_REPLY`, a retransmission moves the client's entry on and the
/// flow is kept as undecided).
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

/// Whether the flow of client-direction entry `flow`, whose own reply entry is `reply`,
/// may be a connection rather than SYNs nobody answered (see the module's documentation):
/// answered, not known to be unanswered (entries of an older build), or still within
/// [`UNANSWERED_GRACE_NANOSECONDS`] of its beginning (the reply entry's timestamp while
/// the backend has not spoken).
fn may_be_answered(flow: &ConntrackValue, reply: &ConntrackValue, now_nanoseconds: u64) -> bool {
    let answered = if flow.flags & CONNTRACK_FLAG_RECORDS_REPLY != 0 {
        flow.tcp_state & TCP_STATE_REPLY_SEEN != 0
    } else {
        flow.tcp_state & TCP_STATE_REPLY_SEEN != 0
            || reply.last_seen_nanoseconds != flow.last_seen_nanoseconds
    };
    answered
        || now_nanoseconds.saturating_sub(reply.last_seen_nanoseconds)
            < UNANSWERED_GRACE_NANOSECONDS
}

/// Counts connections (client-direction entries) that are TCP, not closing, seen within
/// the idle timeout, as the programs judge liveness, and not known to be unanswered
/// ([`may_be_answered`]); a flow without its own reply entry (evicted from the overflow
/// LRU, or taken over) cannot be translated back and is not counted either.
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
            replies
                .get(&reply_key(key, value))
                .filter(|reply| answers(reply, key))
                .is_some_and(|reply| may_be_answered(value, reply, now_nanoseconds))
        })
        .count()
}

#[cfg(test)]
mod tests;
