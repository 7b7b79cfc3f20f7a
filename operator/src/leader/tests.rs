use super::*;

fn held_by(holder: &str, duration_seconds: Option<i32>) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(holder.into()),
        lease_duration_seconds: duration_seconds,
        ..LeaseSpec::default()
    }
}

#[test]
fn a_missing_lease_is_created() {
    let now = Instant::now();
    assert_eq!(
        decide(None, "a", now, now, &LeaseTiming::default()),
        LeaseDecision::Create
    );
}

#[test]
fn the_holder_renews() {
    let now = Instant::now();
    assert_eq!(
        decide(
            Some(&held_by("a", Some(15))),
            "a",
            now,
            now,
            &LeaseTiming::default()
        ),
        LeaseDecision::Renew
    );
}

#[test]
fn a_lease_held_by_another_replica_keeps_this_one_waiting_until_it_stops_changing_for_its_duration()
{
    let timing = LeaseTiming::default();
    let seen = Instant::now();
    let lease = held_by("b", Some(15));
    assert_eq!(
        decide(
            Some(&lease),
            "a",
            seen,
            seen + Duration::from_secs(14),
            &timing
        ),
        LeaseDecision::Wait { holder: "b".into() }
    );
    assert_eq!(
        decide(
            Some(&lease),
            "a",
            seen,
            seen + Duration::from_secs(15),
            &timing
        ),
        LeaseDecision::TakeOver
    );
}

#[test]
fn the_holders_own_lease_duration_counts_over_ours() {
    let timing = LeaseTiming::default();
    let seen = Instant::now();
    let lease = held_by("b", Some(60));
    assert!(matches!(
        decide(
            Some(&lease),
            "a",
            seen,
            seen + Duration::from_secs(30),
            &timing
        ),
        LeaseDecision::Wait { .. }
    ));
}

#[test]
fn a_released_lease_is_taken_over_at_once() {
    let now = Instant::now();
    let released = LeaseSpec {
        holder_identity: None,
        ..LeaseSpec::default()
    };
    assert_eq!(
        decide(Some(&released), "a", now, now, &LeaseTiming::default()),
        LeaseDecision::TakeOver
    );
    let emptied = held_by("", Some(15));
    assert_eq!(
        decide(Some(&emptied), "a", now, now, &LeaseTiming::default()),
        LeaseDecision::TakeOver
    );
}

#[test]
fn taking_over_counts_a_transition_and_renewing_does_not() {
    let timing = LeaseTiming::default();
    let now = Utc::now();
    let mut current = held_by("b", Some(15));
    current.lease_transitions = Some(4);
    let taken =
        lease_spec_for(&LeaseDecision::TakeOver, Some(&current), "a", &timing, now).unwrap();
    assert_eq!(taken.holder_identity.as_deref(), Some("a"));
    assert_eq!(taken.lease_transitions, Some(5));
    let renewed = lease_spec_for(&LeaseDecision::Renew, Some(&taken), "a", &timing, now).unwrap();
    assert_eq!(renewed.lease_transitions, Some(5));
    assert_eq!(renewed.holder_identity.as_deref(), Some("a"));
    assert!(renewed.renew_time.is_some());
    assert_eq!(
        lease_spec_for(
            &LeaseDecision::Wait { holder: "b".into() },
            Some(&current),
            "a",
            &timing,
            now
        ),
        None
    );
}

#[test]
fn a_leader_stops_acting_before_anyone_else_may_start() {
    let timing = LeaseTiming::default();
    assert!(timing.renew_deadline < timing.lease_duration);
    assert!(timing.retry_period < timing.renew_deadline);
}
