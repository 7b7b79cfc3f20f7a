use super::*;

const PERIOD: Duration = Duration::from_secs(1);

fn at(start: Instant, milliseconds: u64) -> Instant {
    start + Duration::from_millis(milliseconds)
}

#[test]
fn nothing_is_applied_without_a_change() {
    let mut coalescer = Coalescer::new(PERIOD);
    assert_eq!(coalescer.poll(Instant::now()), Next::Idle);
}

#[test]
fn the_first_change_and_a_change_after_a_quiet_period_apply_at_once() {
    let start = Instant::now();
    let mut coalescer = Coalescer::new(PERIOD);
    coalescer.changed();
    assert_eq!(coalescer.poll(start), Next::Apply);
    assert_eq!(coalescer.poll(at(start, 10)), Next::Idle);
    coalescer.changed();
    assert_eq!(coalescer.poll(at(start, 5_000)), Next::Apply);
}

#[test]
fn a_burst_is_coalesced_into_one_apply_a_period_after_the_last() {
    let start = Instant::now();
    let mut coalescer = Coalescer::new(PERIOD);
    coalescer.changed();
    assert_eq!(coalescer.poll(start), Next::Apply);
    for milliseconds in [100, 200, 300, 900] {
        coalescer.changed();
        assert_eq!(
            coalescer.poll(at(start, milliseconds)),
            Next::WaitUntil(at(start, 1_000))
        );
    }
    assert_eq!(coalescer.poll(at(start, 1_000)), Next::Apply);
    assert_eq!(
        coalescer.poll(at(start, 1_001)),
        Next::Idle,
        "one apply for the burst"
    );
    coalescer.changed();
    assert_eq!(
        coalescer.poll(at(start, 1_500)),
        Next::WaitUntil(at(start, 2_000))
    );
}

#[test]
fn a_failed_apply_is_retried_no_sooner_than_a_period_later() {
    let start = Instant::now();
    let mut coalescer = Coalescer::new(PERIOD);
    coalescer.changed();
    assert_eq!(coalescer.poll(start), Next::Apply);
    coalescer.failed();
    assert!(coalescer.is_pending());
    assert_eq!(
        coalescer.poll(at(start, 1)),
        Next::WaitUntil(at(start, 1_000))
    );
    assert_eq!(coalescer.poll(at(start, 1_000)), Next::Apply);
}

#[test]
fn a_failed_apply_outside_poll_is_retried_a_period_after_it() {
    let start = Instant::now();
    let mut coalescer = Coalescer::new(PERIOD);
    coalescer.changed();
    assert_eq!(coalescer.poll(start), Next::Apply);
    coalescer.failed_outside(at(start, 5_000));
    assert_eq!(
        coalescer.poll(at(start, 5_001)),
        Next::WaitUntil(at(start, 6_000))
    );
    assert_eq!(coalescer.poll(at(start, 6_000)), Next::Apply);
}

#[test]
fn a_zero_period_applies_every_change_at_once() {
    let start = Instant::now();
    let mut coalescer = Coalescer::new(Duration::ZERO);
    for milliseconds in 0..5 {
        coalescer.changed();
        assert_eq!(coalescer.poll(at(start, milliseconds)), Next::Apply);
    }
}
