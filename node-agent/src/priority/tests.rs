use super::*;

#[test]
fn a_first_start_never_touches_the_priority() {
    let now = Instant::now();
    let (mut priority, step) = CatchUpPriority::start(false, true, now);
    assert_eq!(step, PriorityStep::Keep);
    assert!(!priority.is_lowered());
    assert_eq!(priority.after_round(false, now), PriorityStep::Keep);
    assert_eq!(priority.after_round(true, now), PriorityStep::Keep);
    assert_eq!(
        priority.after_round(true, now + CATCH_UP_LIMIT * 2),
        PriorityStep::Keep
    );
}

#[test]
fn a_restart_into_a_serving_datapath_catches_up_lowered_until_its_first_sync() {
    let now = Instant::now();
    let (mut priority, step) = CatchUpPriority::start(true, true, now);
    assert_eq!(step, PriorityStep::Lower);
    assert!(priority.is_lowered());
    let later = now + Duration::from_secs(3);
    assert_eq!(priority.after_round(false, later), PriorityStep::Keep);
    assert!(priority.is_lowered());
    assert_eq!(priority.after_round(true, later), PriorityStep::Restore);
    assert!(!priority.is_lowered());
}

#[test]
fn a_process_that_could_not_restore_its_priority_never_lowers_it() {
    let now = Instant::now();
    let (mut priority, step) = CatchUpPriority::start(true, false, now);
    assert_eq!(step, PriorityStep::Keep);
    assert!(!priority.is_lowered());
    assert_eq!(priority.after_round(true, now), PriorityStep::Keep);
    assert_eq!(
        priority.after_round(false, now + CATCH_UP_LIMIT),
        PriorityStep::Keep
    );
}

#[test]
fn restoring_needs_cap_sys_nice_in_the_effective_set() {
    let status = |effective: &str| {
        format!("Name:\tswitchyard-agent\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\nCapEff:\t{effective}\nCapBnd:\t000001ffffffffff\n")
    };
    // Root with every capability, and a container's set with SYS_NICE added.
    assert!(may_restore_priority(&status("000001ffffffffff")));
    assert!(may_restore_priority(&status("0000000000800000")));
    // The chart's set before SYS_NICE (BPF, PERFMON, NET_ADMIN, NET_RAW,
    // SYS_RESOURCE, SYS_ADMIN), and nothing at all.
    assert!(!may_restore_priority(&status("000000c001203000")));
    assert!(!may_restore_priority(&status("0000000000000000")));
    // An unreadable status restores nothing, so lowers nothing.
    assert!(!may_restore_priority("Name:\tx\n"));
    assert!(!may_restore_priority(&status("not hex")));
}

#[test]
fn the_priority_is_restored_once_and_stays() {
    let now = Instant::now();
    let (mut priority, _) = CatchUpPriority::start(true, true, now);
    assert_eq!(priority.after_round(true, now), PriorityStep::Restore);
    assert_eq!(priority.after_round(true, now), PriorityStep::Keep);
    assert_eq!(priority.after_round(false, now), PriorityStep::Keep);
}

#[test]
fn a_catch_up_that_never_syncs_is_restored_after_the_limit() {
    let now = Instant::now();
    let (mut priority, _) = CatchUpPriority::start(true, true, now);
    let just_before = now + CATCH_UP_LIMIT - Duration::from_millis(1);
    assert_eq!(priority.after_round(false, just_before), PriorityStep::Keep);
    assert_eq!(
        priority.after_round(false, now + CATCH_UP_LIMIT),
        PriorityStep::Restore
    );
}
