//! Which conntrack entries hold a drain open.

use switchyard_common::{
    ipv4_mapped, ConntrackKey, ConntrackValue, DatapathConfig, CONNTRACK_FLAG_PORT_TRANSLATED,
    CONNTRACK_FLAG_RECORDS_REPLY, CONNTRACK_FLAG_REPLY, CONNTRACK_FLAG_REWRITE_DESTINATION,
    CONNTRACK_FLAG_REWRITE_SOURCE, PROTOCOL_TCP, PROTOCOL_UDP, TCP_STATE_FIN_FROM_BACKEND,
    TCP_STATE_FIN_FROM_CLIENT, TCP_STATE_REPLY_SEEN, TCP_STATE_RESET,
};

use super::{live_tcp_flow_count, UNANSWERED_GRACE_NANOSECONDS};

const SECOND: u64 = 1_000_000_000;
const NOW: u64 = 1_000 * SECOND;
const FRONTEND: [u8; 4] = [10, 96, 0, 1];
const FRONTEND_PORT: u16 = 443;
const BACKEND: [u8; 4] = [10, 244, 1, 5];
const BACKEND_PORT: u16 = 6443;

fn config() -> DatapathConfig {
    DatapathConfig {
        hairpin_address: [0; 16],
        network_namespace_cookie: 1,
        mode: switchyard_common::DATAPATH_MODE_DRAINING,
        masquerade_mark: 0,
        tcp_idle_timeout_seconds: 60,
        tcp_closing_timeout_seconds: 10,
        udp_idle_timeout_seconds: 120,
        pod_connect_balancing: 0,
    }
}

/// One flow's two entries as the programs write them: from client `10.244.0.<host>` port
/// `port` through the frontend to the backend; the client's side last seen at `client`,
/// the backend's at `backend` (both written with the same time when the flow began).
/// `Flow::tcp` is a flow an older build wrote (no `CONNTRACK_FLAG_RECORDS_REPLY`);
/// `Flow::recorded` one of the current programs.
struct Flow {
    host: u8,
    port: u16,
    protocol: u8,
    client: u64,
    backend: u64,
    tcp_state: u8,
    /// The client's port as the backend sees it, when the programs translated it.
    translated_port: Option<u16>,
    /// Written by programs that record the backend's first packet.
    records_reply: bool,
}

impl Flow {
    fn tcp(host: u8, client: u64, backend: u64) -> Self {
        Self {
            host,
            port: 40_000 + u16::from(host),
            protocol: PROTOCOL_TCP,
            client,
            backend,
            tcp_state: 0,
            translated_port: None,
            records_reply: false,
        }
    }

    /// A flow of the current programs; `answered`: the backend's first packet came,
    /// and set `TCP_STATE_REPLY_SEEN` on both entries.
    fn recorded(host: u8, client: u64, backend: u64, answered: bool) -> Self {
        Self {
            records_reply: true,
            tcp_state: if answered { TCP_STATE_REPLY_SEEN } else { 0 },
            ..Self::tcp(host, client, backend)
        }
    }

    fn entries(&self) -> [(ConntrackKey, ConntrackValue); 2] {
        let client = ipv4_mapped([10, 244, 0, self.host]);
        let seen_port = self.translated_port.unwrap_or(self.port);
        let translated = if self.translated_port.is_some() {
            CONNTRACK_FLAG_REWRITE_SOURCE | CONNTRACK_FLAG_PORT_TRANSLATED
        } else {
            0
        };
        let records = if self.records_reply {
            CONNTRACK_FLAG_RECORDS_REPLY
        } else {
            0
        };
        let forward_key = ConntrackKey {
            source_address: client,
            destination_address: ipv4_mapped(FRONTEND),
            source_port_big_endian: self.port.to_be(),
            destination_port_big_endian: FRONTEND_PORT.to_be(),
            protocol: self.protocol,
            reserved: [0; 3],
        };
        let forward = ConntrackValue {
            new_source_address: client,
            new_destination_address: ipv4_mapped(BACKEND),
            new_source_port_big_endian: seen_port.to_be(),
            new_destination_port_big_endian: BACKEND_PORT.to_be(),
            flags: CONNTRACK_FLAG_REWRITE_DESTINATION | translated | records,
            tcp_state: self.tcp_state,
            reserved: [0; 2],
            last_seen_nanoseconds: self.client,
        };
        let reply_translated = if self.translated_port.is_some() {
            CONNTRACK_FLAG_REWRITE_DESTINATION | CONNTRACK_FLAG_PORT_TRANSLATED
        } else {
            0
        };
        let reply_key = ConntrackKey {
            source_address: ipv4_mapped(BACKEND),
            destination_address: client,
            source_port_big_endian: BACKEND_PORT.to_be(),
            destination_port_big_endian: seen_port.to_be(),
            protocol: self.protocol,
            reserved: [0; 3],
        };
        let reply = ConntrackValue {
            new_source_address: ipv4_mapped(FRONTEND),
            new_destination_address: client,
            new_source_port_big_endian: FRONTEND_PORT.to_be(),
            new_destination_port_big_endian: self.port.to_be(),
            flags: CONNTRACK_FLAG_REPLY | CONNTRACK_FLAG_REWRITE_SOURCE | reply_translated,
            tcp_state: self.tcp_state,
            reserved: [0; 2],
            last_seen_nanoseconds: self.backend,
        };
        [(forward_key, forward), (reply_key, reply)]
    }
}

fn live(flows: &[Flow]) -> usize {
    let entries: Vec<(ConntrackKey, ConntrackValue)> =
        flows.iter().flat_map(Flow::entries).collect();
    live_tcp_flow_count(&entries, &config(), NOW)
}

#[test]
fn a_flow_the_backend_never_answered_is_not_live_and_one_it_answered_is() {
    let began = NOW - 5 * SECOND;
    // A SYN to a silent backend: nothing since the flow began, in either direction.
    assert_eq!(live(&[Flow::tcp(1, began, began)]), 0);
    // The control: the same flow with an answer from the backend.
    assert_eq!(live(&[Flow::tcp(1, began, began + SECOND)]), 1);
    // Both together: only the answered one holds the drain.
    assert_eq!(
        live(&[
            Flow::tcp(1, began, began),
            Flow::tcp(2, began, began + SECOND)
        ]),
        1
    );
}

#[test]
fn a_flow_whose_client_spoke_after_the_backends_last_packet_is_kept() {
    // An idle connection whose last packet was the client's (an acknowledgement): its
    // entries cannot tell it from a SYN retransmitted to a silent backend, so it is kept.
    let began = NOW - 30 * SECOND;
    assert_eq!(
        live(&[Flow::tcp(1, began + 20 * SECOND, began + 10 * SECOND)]),
        1
    );
}

#[test]
fn an_unanswered_flow_counts_within_one_retransmission_timeout_of_its_syn() {
    let just_now = NOW - UNANSWERED_GRACE_NANOSECONDS / 2;
    assert_eq!(live(&[Flow::tcp(1, just_now, just_now)]), 1);
    let a_timeout_ago = NOW - UNANSWERED_GRACE_NANOSECONDS;
    assert_eq!(live(&[Flow::tcp(1, a_timeout_ago, a_timeout_ago)]), 0);
}

#[test]
fn a_flow_without_a_reply_entry_of_its_own_is_not_live() {
    let answered = Flow::tcp(1, NOW - 2 * SECOND, NOW - SECOND);
    let [forward, reply] = answered.entries();
    // The control: both entries.
    assert_eq!(live_tcp_flow_count(&[forward, reply], &config(), NOW), 1);
    // The reply entry gone (evicted from the overflow LRU).
    assert_eq!(live_tcp_flow_count(&[forward], &config(), NOW), 0);
    // The reply entry taken over by a newer flow from another client port.
    let mut taken = reply;
    taken.1.new_destination_port_big_endian = 50_000u16.to_be();
    assert_eq!(live_tcp_flow_count(&[forward, taken], &config(), NOW), 0);
}

#[test]
fn a_port_translated_flow_is_found_by_its_translated_reply() {
    let answered = Flow {
        translated_port: Some(61_000),
        ..Flow::tcp(1, NOW - 2 * SECOND, NOW - SECOND)
    };
    assert_eq!(live(&[answered]), 1);
    let unanswered = Flow {
        translated_port: Some(61_000),
        ..Flow::tcp(1, NOW - 2 * SECOND, NOW - 2 * SECOND)
    };
    assert_eq!(live(&[unanswered]), 0);
}

#[test]
fn only_open_recent_tcp_connections_count_as_live_flows() {
    let answered = |host: u8| Flow::tcp(host, NOW - 2 * SECOND, NOW - SECOND);
    let with_state = |host: u8, tcp_state: u8| Flow {
        tcp_state,
        ..answered(host)
    };
    let flows = [
        // Counted once, not once per direction.
        answered(1),
        // UDP never holds a drain open.
        Flow {
            protocol: PROTOCOL_UDP,
            ..answered(2)
        },
        with_state(3, TCP_STATE_RESET),
        with_state(4, TCP_STATE_FIN_FROM_CLIENT | TCP_STATE_FIN_FROM_BACKEND),
        // Half closed: still live.
        with_state(5, TCP_STATE_FIN_FROM_CLIENT),
        // Idle past the timeout.
        Flow::tcp(6, NOW - 61 * SECOND, NOW - 62 * SECOND),
    ];
    assert_eq!(live(&flows), 2);
}

#[test]
fn a_recorded_flow_the_backend_answered_is_live_even_when_its_client_spoke_last() {
    // An idle connection whose last packet was the client's acknowledgement: the
    // timestamps alone look like a retried SYN, the bit says the backend answered.
    let began = NOW - 30 * SECOND;
    let idle = |host: u8| Flow::recorded(host, began + 20 * SECOND, began + 10 * SECOND, true);
    assert_eq!(live(&[idle(1)]), 1);
    // Answered once, long ago, silent since: still the backend's connection.
    assert_eq!(live(&[Flow::recorded(2, NOW - 2 * SECOND, began, true)]), 1);
}

#[test]
fn a_recorded_flow_without_an_answer_is_not_live_even_when_its_client_retransmitted() {
    let began = NOW - 5 * SECOND;
    // SYNs retransmitted to a silent backend: the client's entry moved on (the last
    // retransmission half a second ago), the reply entry still holds the flow's start.
    let retried = |host: u8| Flow::recorded(host, NOW - SECOND / 2, began, false);
    assert_eq!(live(&[retried(1)]), 0);
    // Never retransmitted either.
    assert_eq!(live(&[Flow::recorded(2, began, began, false)]), 0);
    // The control: the same retried flow with the bit its answer would have set.
    assert_eq!(
        live(&[Flow {
            tcp_state: TCP_STATE_REPLY_SEEN,
            ..retried(1)
        }]),
        1
    );
    // Port-translated flows are judged the same way.
    let translated = |answered: bool| Flow {
        translated_port: Some(61_000),
        ..Flow::recorded(3, NOW - SECOND / 2, began, answered)
    };
    assert_eq!(live(&[translated(false)]), 0);
    assert_eq!(live(&[translated(true)]), 1);
}

#[test]
fn a_recorded_flow_without_an_answer_counts_within_one_retransmission_timeout_of_its_start() {
    // Its SYN-ACK may still be on its way; the grace runs from the flow's start (the
    // reply entry's timestamp), not from the client's last retransmission.
    let just_now = NOW - UNANSWERED_GRACE_NANOSECONDS / 2;
    assert_eq!(live(&[Flow::recorded(1, just_now, just_now, false)]), 1);
    let a_timeout_ago = NOW - UNANSWERED_GRACE_NANOSECONDS;
    assert_eq!(live(&[Flow::recorded(1, NOW - 1, a_timeout_ago, false)]), 0);
}

#[test]
fn a_flow_of_an_older_build_keeps_the_timestamp_rule_and_counts_once_its_answer_is_recorded() {
    // The retried SYN of a recorded flow is not live; the same entries without the flag
    // (written before the programs recorded answers) cannot be told from an idle
    // connection and are kept, as before the upgrade.
    let began = NOW - 5 * SECOND;
    let retried = Flow::tcp(1, NOW - SECOND / 2, began);
    assert_eq!(live(&[retried]), 1);
    assert_eq!(
        live(&[Flow::recorded(1, NOW - SECOND / 2, began, false)]),
        0
    );
    // An old flow the new programs saw answered: the bit counts without the flag, even
    // where the timestamps alone would say "never answered".
    let answered_since = Flow {
        tcp_state: TCP_STATE_REPLY_SEEN,
        ..Flow::tcp(2, began, began)
    };
    assert_eq!(live(&[answered_since]), 1);
    assert_eq!(live(&[Flow::tcp(2, began, began)]), 0);
}
