use chrono::{DateTime, Utc};
use switchyard_telemetry::events::EventType;

use super::*;

fn at() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-28T12:00:00Z")
        .map(|time| time.with_timezone(&Utc))
        .unwrap_or_default()
}

fn condition(type_: &str, holds: bool, reason: &str) -> Condition {
    Condition::new(
        type_,
        ConditionStatus::from_bool(holds),
        reason,
        "message",
        Some(1),
        at(),
    )
}

fn draining(holds: bool, reason: &str) -> Reported {
    Reported {
        conditions: vec![condition(condition_types::DRAINING, holds, reason)],
        cleanup_generation: None,
    }
}

fn rules(holds: bool, reason: &str, cleanup: bool) -> Reported {
    Reported {
        conditions: vec![condition(
            condition_types::KUBE_PROXY_RULES_PRESENT,
            holds,
            reason,
        )],
        cleanup_generation: cleanup.then_some(3),
    }
}

fn reasons_of(occurrences: &[Occurrence]) -> Vec<(&str, EventType)> {
    occurrences
        .iter()
        .map(|occurrence| (occurrence.reason.as_str(), occurrence.type_))
        .collect()
}

#[test]
fn draining_turning_true_is_a_drain_started_event() {
    let found = occurrences(
        &draining(false, reasons::ATTACHED),
        &draining(true, reasons::DRAINING_FLOWS),
    );
    assert_eq!(reasons_of(&found), [(DRAIN_STARTED, EventType::Normal)]);
}

#[test]
fn a_drain_that_ends_with_no_flow_left_is_a_normal_drain_finished_event() {
    let found = occurrences(
        &draining(true, reasons::DRAINING_FLOWS),
        &draining(false, reasons::DRAIN_COMPLETE),
    );
    assert_eq!(reasons_of(&found), [(DRAIN_FINISHED, EventType::Normal)]);
}

#[test]
fn a_drain_cut_short_by_its_timeout_is_a_warning() {
    let found = occurrences(
        &draining(true, reasons::DRAINING_FLOWS),
        &draining(false, reasons::DRAIN_TIMEOUT_EXPIRED),
    );
    assert_eq!(reasons_of(&found), [(DRAIN_FINISHED, EventType::Warning)]);
}

#[test]
fn a_drain_ended_by_going_back_to_ebpf_finishes_with_the_programs_attached() {
    let found = occurrences(
        &draining(true, reasons::DRAINING_FLOWS),
        &draining(false, reasons::ATTACHED),
    );
    assert_eq!(reasons_of(&found), [(DRAIN_FINISHED, EventType::Normal)]);
    assert!(found[0].message.contains("told Ebpf again"));
}

#[test]
fn a_status_written_again_while_draining_is_no_event() {
    let found = occurrences(
        &draining(true, reasons::DRAINING_FLOWS),
        &draining(true, reasons::DRAINING_FLOWS),
    );
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn rules_gone_while_cleanup_is_on_are_a_rules_cleaned_event() {
    let found = occurrences(
        &rules(true, reasons::RULES_PRESENT, true),
        &rules(false, reasons::RULES_ABSENT, true),
    );
    assert_eq!(
        reasons_of(&found),
        [(KUBE_PROXY_RULES_CLEANED, EventType::Normal)]
    );
}

#[test]
fn rules_gone_without_a_cleanup_request_were_not_cleaned_by_the_agent() {
    let found = occurrences(
        &rules(true, reasons::RULES_PRESENT, false),
        &rules(false, reasons::RULES_ABSENT, false),
    );
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn kube_proxy_still_running_when_cleanup_is_asked_is_a_conflict_without_a_stop() {
    let found = occurrences(
        &rules(true, reasons::RULES_PRESENT, false),
        &rules(true, reasons::KUBE_PROXY_CONFLICT, true),
    );
    assert_eq!(
        reasons_of(&found),
        [(KUBE_PROXY_CONFLICT, EventType::Warning)]
    );
}

#[test]
fn rules_back_after_the_cleanup_are_a_conflict_and_stop_the_cleanup() {
    let found = occurrences(
        &rules(false, reasons::RULES_ABSENT, true),
        &rules(true, reasons::KUBE_PROXY_CONFLICT, true),
    );
    assert_eq!(
        reasons_of(&found),
        [
            (KUBE_PROXY_CONFLICT, EventType::Warning),
            (KUBE_PROXY_CLEANUP_STOPPED, EventType::Warning)
        ]
    );
}

#[test]
fn a_conflict_that_goes_on_is_announced_once() {
    let found = occurrences(
        &rules(true, reasons::KUBE_PROXY_CONFLICT, true),
        &rules(true, reasons::KUBE_PROXY_CONFLICT, true),
    );
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn turning_cleanup_off_is_a_normal_cleanup_stopped_event() {
    let found = occurrences(
        &rules(false, reasons::RULES_ABSENT, true),
        &rules(false, reasons::RULES_ABSENT, false),
    );
    assert_eq!(
        reasons_of(&found),
        [(KUBE_PROXY_CLEANUP_STOPPED, EventType::Normal)]
    );
}

#[test]
fn the_same_transition_gives_the_same_message_so_repeats_aggregate() {
    // Aggregation by name needs stable messages: the conditions' own messages carry rule
    // counts, which the Events leave out.
    let mut counted = rules(true, reasons::RULES_PRESENT, true);
    counted.conditions[0].message = "1200 kube-proxy rules".into();
    let first = occurrences(&counted, &rules(false, reasons::RULES_ABSENT, true));
    counted.conditions[0].message = "7 kube-proxy rules".into();
    let second = occurrences(&counted, &rules(false, reasons::RULES_ABSENT, true));
    assert_eq!(first, second);
}

#[test]
fn the_first_report_after_a_restart_is_compared_with_the_status_read_back() {
    let mut decisions = EventDecisions::default();
    let read_back = draining(true, reasons::DRAINING_FLOWS).conditions;
    let now = Instant::now();
    let still_draining = decisions.after_report(
        draining(true, reasons::DRAINING_FLOWS),
        Some(&read_back),
        now,
    );
    assert_eq!(still_draining, Decided::default());
    let finished = decisions.after_report(
        draining(false, reasons::DRAIN_COMPLETE),
        Some(&read_back),
        now,
    );
    assert_eq!(
        reasons_of(&finished.publish),
        [(DRAIN_FINISHED, EventType::Normal)]
    );
}

#[test]
fn a_conflict_going_on_across_a_restart_and_a_failed_read_is_announced_once() {
    let mut decisions = EventDecisions::default();
    let now = Instant::now();
    let read_back = rules(true, reasons::KUBE_PROXY_CONFLICT, true).conditions;
    let unknown = |reason: &str| Reported {
        conditions: vec![Condition::new(
            condition_types::KUBE_PROXY_RULES_PRESENT,
            ConditionStatus::Unknown,
            reason,
            "message",
            Some(1),
            at(),
        )],
        cleanup_generation: Some(3),
    };
    let mut published = Vec::new();
    for report in [
        unknown("NotYetChecked"),
        rules(true, reasons::KUBE_PROXY_CONFLICT, true),
        unknown("RulesUnreadable"),
        rules(true, reasons::KUBE_PROXY_CONFLICT, true),
    ] {
        published.extend(
            decisions
                .after_report(report, Some(&read_back), now)
                .publish,
        );
    }
    assert!(published.is_empty(), "{published:?}");
    // The control: a conflict after the rules were known present without one is news.
    let mut decisions = EventDecisions::default();
    let read_back = rules(true, reasons::RULES_PRESENT, true).conditions;
    decisions.after_report(unknown("NotYetChecked"), Some(&read_back), now);
    let decided =
        decisions.after_report(rules(true, reasons::KUBE_PROXY_CONFLICT, true), None, now);
    assert_eq!(
        reasons_of(&decided.publish),
        [(KUBE_PROXY_CONFLICT, EventType::Warning)]
    );
}

#[test]
fn a_first_report_without_a_status_read_back_announces_a_drain_in_progress() {
    let mut decisions = EventDecisions::default();
    let decided = decisions.after_report(
        draining(true, reasons::DRAINING_FLOWS),
        None,
        Instant::now(),
    );
    assert_eq!(
        reasons_of(&decided.publish),
        [(DRAIN_STARTED, EventType::Normal)]
    );
}

#[test]
fn a_flapping_drain_is_published_five_times_then_once_per_five_minutes() {
    let mut decisions = EventDecisions::default();
    let start = Instant::now();
    let mut started = 0;
    let mut suppressed = 0;
    // Twenty drains in twenty seconds.
    for second in 0..20 {
        let now = start + Duration::from_secs(second);
        let decided = decisions.after_report(draining(true, reasons::DRAINING_FLOWS), None, now);
        started += decided.publish.len();
        suppressed += decided.suppressed.len();
        decisions.after_report(draining(false, reasons::DRAIN_COMPLETE), None, now);
    }
    assert_eq!((started, suppressed), (5, 15));
    let later = start + Duration::from_secs(20) + RateLimiter::REFILL;
    let decided = decisions.after_report(draining(true, reasons::DRAINING_FLOWS), None, later);
    assert_eq!(
        reasons_of(&decided.publish),
        [(DRAIN_STARTED, EventType::Normal)]
    );
    let decided = decisions.after_report(draining(false, reasons::DRAIN_COMPLETE), None, later);
    assert_eq!(
        reasons_of(&decided.publish),
        [(DRAIN_FINISHED, EventType::Normal)],
        "each reason has a bucket of its own"
    );
    let decided = decisions.after_report(draining(true, reasons::DRAINING_FLOWS), None, later);
    assert!(decided.publish.is_empty(), "one token only per period");
}

#[test]
fn one_reason_spent_leaves_the_others_their_own_burst() {
    let mut limiter = RateLimiter::default();
    let now = Instant::now();
    for _ in 0..RateLimiter::BURST {
        assert!(limiter.allow(DRAIN_STARTED, now));
    }
    assert!(!limiter.allow(DRAIN_STARTED, now));
    assert!(limiter.allow(KUBE_PROXY_RULES_CLEANED, now));
}

#[test]
fn a_quiet_reason_regains_its_whole_burst_and_no_more() {
    let mut limiter = RateLimiter::default();
    let start = Instant::now();
    for _ in 0..RateLimiter::BURST {
        assert!(limiter.allow(DRAIN_STARTED, start));
    }
    let much_later = start + RateLimiter::REFILL * 100;
    let allowed = (0..20)
        .filter(|_| limiter.allow(DRAIN_STARTED, much_later))
        .count();
    assert_eq!(allowed, RateLimiter::BURST as usize);
}

#[test]
fn time_waited_toward_the_next_token_is_kept() {
    let mut limiter = RateLimiter::default();
    let start = Instant::now();
    for _ in 0..RateLimiter::BURST {
        assert!(limiter.allow(DRAIN_STARTED, start));
    }
    // Refused at 4 minutes: that must not restart the 5 minutes' wait.
    assert!(!limiter.allow(DRAIN_STARTED, start + Duration::from_secs(240)));
    assert!(limiter.allow(DRAIN_STARTED, start + RateLimiter::REFILL));
}
