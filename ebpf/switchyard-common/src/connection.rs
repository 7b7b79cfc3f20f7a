//! The connection signals the `sock_ops` program counts (issue 28): what the
//! kernel's TCP state machine says about active connections to Service
//! addresses. Shared by the program (which counts) and the agent (which reads).
//!
//! Only sockets whose destination was a Service at connect time are followed:
//! the program asks the kernel for their state-change and retransmit callbacks
//! (`bpf_sock_ops_cb_flags_set`) and for no other socket's.

/// Indexes of the [`crate::map_names::CONNECTIONS`] per-CPU totals.
pub const FAILED_CONNECTS: u32 = 0;
pub const SYN_RETRANSMITS: u32 = 1;
pub const RESETS_BY_PEER: u32 = 2;
/// Entries of the totals map.
pub const COUNT: u32 = 3;

/// The kernel's TCP states (`BPF_TCP_*`, the values the state callback passes).
pub const TCP_ESTABLISHED: u32 = 1;
pub const TCP_SYN_SENT: u32 = 2;
pub const TCP_CLOSE: u32 = 7;
pub const TCP_CLOSE_WAIT: u32 = 8;

/// The counts of one Service frontend ([`crate::FrontendKey`]), per CPU, in
/// [`crate::map_names::CONNECTIONS_BY_FRONTEND`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnectionCounts {
    pub failed_connects: u64,
    pub syn_retransmits: u64,
    pub resets_by_peer: u64,
}

impl ConnectionCounts {
    /// The count at a totals index.
    #[inline(always)]
    pub fn slot(&mut self, index: u32) -> Option<&mut u64> {
        match index {
            FAILED_CONNECTS => Some(&mut self.failed_connects),
            SYN_RETRANSMITS => Some(&mut self.syn_retransmits),
            RESETS_BY_PEER => Some(&mut self.resets_by_peer),
            _ => None,
        }
    }
}

/// What a followed socket's change of state from `old` to `new` counts, as a
/// totals index:
/// - `SYN_SENT` straight to `CLOSE`: a connect that failed (refused by a reset,
///   timed out after its SYN retransmissions, or given up by the application
///   before any answer: a connect timeout);
/// - `ESTABLISHED` or `CLOSE_WAIT` straight to `CLOSE`: a connection reset. An
///   orderly close never takes that step (it goes through `FIN_WAIT*` or
///   `LAST_ACK`, and `TIME_WAIT`'s socket closes from `FIN_WAIT2` or
///   `CLOSING`); but the kernel takes it too when the application itself aborts
///   the connection (`SO_LINGER` 0, or closing with unread data), which the
///   callback cannot tell from a peer's reset. Such an application does so under
///   kube-proxy too, so the node's baseline carries it.
///
/// Every other change counts nothing.
#[inline(always)]
pub const fn state_change_signal(old: u32, new: u32) -> Option<u32> {
    if new != TCP_CLOSE {
        return None;
    }
    match old {
        TCP_SYN_SENT => Some(FAILED_CONNECTS),
        TCP_ESTABLISHED | TCP_CLOSE_WAIT => Some(RESETS_BY_PEER),
        _ => None,
    }
}

/// What a followed socket's retransmission counts: a SYN retransmission while
/// it is still connecting, nothing after (the program stops asking for the
/// retransmit callback once the connection is established, so this is only a
/// guard).
#[inline(always)]
pub const fn retransmit_signal(state: u32) -> Option<u32> {
    if state == TCP_SYN_SENT {
        Some(SYN_RETRANSMITS)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's TCP states not named above.
    const TCP_SYN_RECV: u32 = 3;
    const TCP_FIN_WAIT1: u32 = 4;
    const TCP_FIN_WAIT2: u32 = 5;
    const TCP_TIME_WAIT: u32 = 6;
    const TCP_LAST_ACK: u32 = 9;
    const TCP_LISTEN: u32 = 10;
    const TCP_CLOSING: u32 = 11;

    #[test]
    fn a_connect_that_closes_before_it_is_established_is_a_failed_connect() {
        assert_eq!(
            state_change_signal(TCP_SYN_SENT, TCP_CLOSE),
            Some(FAILED_CONNECTS)
        );
    }

    #[test]
    fn an_established_connection_that_closes_at_once_is_a_reset() {
        assert_eq!(
            state_change_signal(TCP_ESTABLISHED, TCP_CLOSE),
            Some(RESETS_BY_PEER)
        );
        assert_eq!(
            state_change_signal(TCP_CLOSE_WAIT, TCP_CLOSE),
            Some(RESETS_BY_PEER)
        );
    }

    #[test]
    fn the_steps_of_a_served_connection_and_its_orderly_close_count_nothing() {
        let orderly = [
            (TCP_CLOSE, TCP_SYN_SENT),
            (TCP_SYN_SENT, TCP_ESTABLISHED),
            (TCP_ESTABLISHED, TCP_FIN_WAIT1),
            (TCP_FIN_WAIT1, TCP_FIN_WAIT2),
            (TCP_FIN_WAIT2, TCP_CLOSE),
            (TCP_FIN_WAIT1, TCP_CLOSING),
            (TCP_CLOSING, TCP_CLOSE),
            (TCP_FIN_WAIT1, TCP_CLOSE),
            (TCP_ESTABLISHED, TCP_CLOSE_WAIT),
            (TCP_CLOSE_WAIT, TCP_LAST_ACK),
            (TCP_LAST_ACK, TCP_CLOSE),
            (TCP_SYN_RECV, TCP_ESTABLISHED),
            (TCP_LISTEN, TCP_CLOSE),
            (TCP_TIME_WAIT, TCP_CLOSE),
        ];
        for (old, new) in orderly {
            assert_eq!(state_change_signal(old, new), None, "{old} -> {new}");
        }
    }

    #[test]
    fn only_a_retransmission_while_connecting_is_a_syn_retransmission() {
        assert_eq!(retransmit_signal(TCP_SYN_SENT), Some(SYN_RETRANSMITS));
        assert_eq!(retransmit_signal(TCP_ESTABLISHED), None);
        assert_eq!(retransmit_signal(TCP_CLOSE_WAIT), None);
    }

    #[test]
    fn each_totals_index_has_its_own_count() {
        let mut counts = ConnectionCounts::default();
        for index in 0..COUNT {
            *counts.slot(index).expect("a slot") += u64::from(index) + 1;
        }
        assert_eq!(
            counts,
            ConnectionCounts {
                failed_connects: 1,
                syn_retransmits: 2,
                resets_by_peer: 3,
            }
        );
        assert_eq!(counts.slot(COUNT), None);
    }
}
