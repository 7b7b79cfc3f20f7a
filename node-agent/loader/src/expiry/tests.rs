use super::*;

use crate::test_entries::conntrack_key as key;

fn value(last_seen_nanoseconds: u64, tcp_state: u8) -> ConntrackValue {
    crate::test_entries::conntrack_value(0, tcp_state, last_seen_nanoseconds)
}

const SECOND: u64 = 1_000_000_000;
const UDP: u8 = switchyard_common::PROTOCOL_UDP;

fn lifetimes() -> Lifetimes {
    Lifetimes {
        tcp_idle: 100 * SECOND,
        tcp_closing: 10 * SECOND,
        udp_idle: 30 * SECOND,
    }
}

#[test]
fn an_open_tcp_flow_lives_for_the_idle_timeout_after_its_last_packet() {
    let now = 1_000 * SECOND;
    let lifetimes = lifetimes();
    let tcp = key(PROTOCOL_TCP);
    assert!(!is_expired(
        &tcp,
        &value(now - 99 * SECOND, 0),
        &lifetimes,
        now
    ));
    assert!(is_expired(
        &tcp,
        &value(now - 100 * SECOND, 0),
        &lifetimes,
        now
    ));
    // A FIN from one side only is not a closed connection.
    let half_closed = value(now - 50 * SECOND, TCP_STATE_FIN_FROM_CLIENT);
    assert!(!is_expired(&tcp, &half_closed, &lifetimes, now));
}

#[test]
fn a_closed_or_reset_tcp_flow_lives_for_the_closing_timeout() {
    let now = 1_000 * SECOND;
    let lifetimes = lifetimes();
    let tcp = key(PROTOCOL_TCP);
    let both_fins = TCP_STATE_FIN_FROM_CLIENT | TCP_STATE_FIN_FROM_BACKEND;
    for state in [
        both_fins,
        TCP_STATE_RESET,
        TCP_STATE_RESET | TCP_STATE_FIN_FROM_BACKEND,
    ] {
        assert!(!is_expired(
            &tcp,
            &value(now - 9 * SECOND, state),
            &lifetimes,
            now
        ));
        assert!(is_expired(
            &tcp,
            &value(now - 10 * SECOND, state),
            &lifetimes,
            now
        ));
    }
}

#[test]
fn a_udp_flow_lives_for_the_udp_idle_timeout_whatever_its_tcp_state_bits() {
    let now = 1_000 * SECOND;
    let lifetimes = lifetimes();
    let udp = key(UDP);
    assert!(!is_expired(
        &udp,
        &value(now - 29 * SECOND, 0),
        &lifetimes,
        now
    ));
    assert!(is_expired(
        &udp,
        &value(now - 30 * SECOND, 0),
        &lifetimes,
        now
    ));
    assert!(!is_expired(
        &udp,
        &value(now - 29 * SECOND, TCP_STATE_RESET),
        &lifetimes,
        now
    ));
}

#[test]
fn an_entry_stamped_after_the_sweep_read_the_clock_is_not_expired() {
    // The programs may refresh an entry between the sweep's clock read and its
    // look at the entry: its stamp is then in the sweep's future.
    let now = 1_000 * SECOND;
    let udp = key(UDP);
    assert!(!is_expired(&udp, &value(now + 5, 0), &lifetimes(), now));
}

#[test]
fn zero_lifetimes_in_the_configuration_mean_the_programs_defaults() {
    let lifetimes = Lifetimes::of(&DatapathConfig::default());
    assert_eq!(
        lifetimes,
        Lifetimes {
            tcp_idle: u64::from(DEFAULT_TCP_IDLE_TIMEOUT_SECONDS) * SECOND,
            tcp_closing: u64::from(DEFAULT_TCP_CLOSING_TIMEOUT_SECONDS) * SECOND,
            udp_idle: u64::from(DEFAULT_UDP_IDLE_TIMEOUT_SECONDS) * SECOND,
        }
    );
    let configured = Lifetimes::of(&DatapathConfig {
        tcp_idle_timeout_seconds: 7,
        tcp_closing_timeout_seconds: 3,
        udp_idle_timeout_seconds: 5,
        ..DatapathConfig::default()
    });
    assert_eq!(
        configured,
        Lifetimes {
            tcp_idle: 7 * SECOND,
            tcp_closing: 3 * SECOND,
            udp_idle: 5 * SECOND,
        }
    );
}

#[test]
fn a_fuller_hash_is_swept_sooner() {
    let capacity = 1_000;
    assert_eq!(
        next_sweep_after(0, capacity, Duration::ZERO),
        LONGEST_SWEEP_INTERVAL
    );
    assert_eq!(
        next_sweep_after(100, capacity, Duration::ZERO),
        LONGEST_SWEEP_INTERVAL
    );
    assert_eq!(
        next_sweep_after(500, capacity, Duration::ZERO),
        SHORTEST_SWEEP_INTERVAL
    );
    assert_eq!(
        next_sweep_after(1_000, capacity, Duration::ZERO),
        SHORTEST_SWEEP_INTERVAL
    );
    let halfway = next_sweep_after(300, capacity, Duration::ZERO);
    assert!(halfway < LONGEST_SWEEP_INTERVAL && halfway > SHORTEST_SWEEP_INTERVAL);
    let mut previous = LONGEST_SWEEP_INTERVAL;
    for kept in (0..=1_000).step_by(50) {
        let interval = next_sweep_after(kept, capacity, Duration::ZERO);
        assert!(
            interval <= previous,
            "{kept} entries: {interval:?} after {previous:?}"
        );
        previous = interval;
    }
    assert_eq!(
        next_sweep_after(10, 0, Duration::ZERO),
        LONGEST_SWEEP_INTERVAL
    );
}

#[test]
fn sweeps_take_at_most_a_twentieth_of_a_core_however_large_the_hash() {
    let capacity = 4_000_000;
    for (kept, took) in [
        (3_000_000, Duration::from_millis(900)),
        (100, Duration::from_millis(900)),
        (3_000_000, Duration::from_millis(20)),
        (0, Duration::from_secs(2)),
    ] {
        let pause = next_sweep_after(kept, capacity, took);
        let share = took.as_secs_f64() / (took + pause).as_secs_f64();
        assert!(
            share <= 0.05 + 1e-9,
            "{kept} kept, sweep {took:?}, pause {pause:?}: {share}"
        );
        // Never sooner than the fill asks for, either.
        assert!(pause >= next_sweep_after(kept, capacity, Duration::ZERO));
    }
    // A full hash that sweeps in 900 ms waits 17.1 s, not 1 s.
    assert_eq!(
        next_sweep_after(3_000_000, capacity, Duration::from_millis(900)),
        Duration::from_millis(17_100)
    );
    // A quick sweep leaves the fill-based pace alone.
    assert_eq!(
        next_sweep_after(3_000_000, capacity, Duration::from_millis(20)),
        SHORTEST_SWEEP_INTERVAL
    );
}

#[test]
fn a_sweep_keeps_what_it_did_not_delete() {
    let sweep = Sweep {
        seen: 10,
        deleted: 4,
    };
    assert_eq!(sweep.kept(), 6);
}
