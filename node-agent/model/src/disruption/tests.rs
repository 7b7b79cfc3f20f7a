use proptest::prelude::*;

use super::*;

const SOURCE: u32 = 7;
const START: i64 = 1_800_000_000_000;
const S: i64 = 1_000;

/// A sample at `seconds` after `START` with every signal read as `value` from map `SOURCE`.
fn sample(seconds: i64, dataplane: Dataplane, value: u64) -> Sample {
    Sample {
        at_ms: START + seconds * S,
        dataplane,
        readings: [Some(Reading {
            source: SOURCE,
            value,
        }); SIGNAL_COUNT],
    }
}

fn with_reading(mut sample: Sample, signal: Signal, reading: Option<Reading>) -> Sample {
    sample.readings[signal.index()] = reading;
    sample
}

fn tracker() -> DisruptionTracker {
    DisruptionTracker::new(Settings::default(), None)
}

fn count(window: &Option<WindowCounts>, signal: Signal) -> Option<u64> {
    window.as_ref().and_then(|window| window.count(signal))
}

#[test]
fn a_counter_that_grew_increased_by_the_difference() {
    let reading = |value| Some(Reading { source: 1, value });
    assert_eq!(increase(reading(10), reading(15)), Some(5));
    assert_eq!(increase(reading(10), reading(10)), Some(0));
}

#[test]
fn a_counter_that_went_down_or_moved_to_another_map_started_again_from_zero() {
    let reading = |source, value| Some(Reading { source, value });
    // Went down: restarted, counted 3 since.
    assert_eq!(increase(reading(1, 10), reading(1, 3)), Some(3));
    // Another map (created again) that already counted past the old value: all of it is new.
    assert_eq!(increase(reading(1, 10), reading(2, 25)), Some(25));
}

#[test]
fn a_counter_not_measured_at_either_end_has_no_increase() {
    let reading = Some(Reading {
        source: 1,
        value: 4,
    });
    assert_eq!(increase(None, reading), None);
    assert_eq!(increase(reading, None), None);
}

#[test]
fn the_first_sample_is_only_a_starting_point() {
    let mut tracker = tracker();
    tracker.record(sample(0, Dataplane::KubeProxy, 100));
    assert_eq!(tracker.report(), DisruptionReport::default());
    tracker.record(sample(5, Dataplane::KubeProxy, 103));
    let report = tracker.report();
    let current = report.current.expect("a window");
    assert_eq!((current.start_ms, current.end_ms), (START, START + 5 * S));
    assert_eq!(current.count(Signal::TranslationErrors), Some(3));
}

#[test]
fn the_current_window_slides_over_the_last_minute() {
    let mut tracker = tracker();
    tracker.record(sample(0, Dataplane::Ebpf, 0));
    tracker.record(sample(10, Dataplane::Ebpf, 4));
    for seconds in (20..=70).step_by(10) {
        tracker.record(sample(seconds, Dataplane::Ebpf, 4));
    }
    // The interval 0-10 s, which held the 4 events, starts more than a minute before 70 s.
    let current = tracker.report().current.expect("a window");
    assert_eq!(
        (current.start_ms, current.end_ms),
        (START + 10 * S, START + 70 * S)
    );
    assert_eq!(current.count(Signal::SourceRangeDrops), Some(0));
    // Control: at 60 s it was still in.
    let mut tracker = DisruptionTracker::new(Settings::default(), None);
    tracker.record(sample(0, Dataplane::Ebpf, 0));
    tracker.record(sample(10, Dataplane::Ebpf, 4));
    tracker.record(sample(60, Dataplane::Ebpf, 4));
    assert_eq!(
        count(&tracker.report().current, Signal::SourceRangeDrops),
        Some(4)
    );
}

#[test]
fn on_kube_proxy_the_baseline_slides_over_the_last_ten_minutes() {
    let mut tracker = tracker();
    tracker.record(sample(0, Dataplane::KubeProxy, 0));
    tracker.record(sample(60, Dataplane::KubeProxy, 2));
    for seconds in (120..=660).step_by(60) {
        tracker.record(sample(
            seconds,
            Dataplane::KubeProxy,
            2 + seconds as u64 / 60,
        ));
    }
    let baseline = tracker.report().baseline.expect("a baseline");
    assert_eq!(
        (baseline.start_ms, baseline.end_ms),
        (START + 60 * S, START + 660 * S)
    );
    // 2 at 60 s and 13 at 660 s: 11 events in the ten minutes.
    assert_eq!(baseline.count(Signal::ConntrackOverflows), Some(11));
}

#[test]
fn the_baseline_freezes_at_the_switch_and_the_current_window_starts_after_it() {
    let mut tracker = tracker();
    tracker.record(sample(0, Dataplane::KubeProxy, 0));
    tracker.record(sample(60, Dataplane::KubeProxy, 3));
    tracker.record(sample(120, Dataplane::KubeProxy, 5));
    // Events between the last sample on kube-proxy and the switch belong to no window.
    tracker.record(sample(123, Dataplane::Ebpf, 9));
    let report = tracker.report();
    let baseline = report.baseline.clone().expect("a baseline");
    assert_eq!(
        (baseline.start_ms, baseline.end_ms),
        (START, START + 120 * S)
    );
    assert_eq!(baseline.count(Signal::TranslationErrors), Some(5));
    assert_eq!(report.current, None);
    tracker.record(sample(130, Dataplane::Ebpf, 10));
    let report = tracker.report();
    assert_eq!(report.baseline, Some(baseline.clone()));
    let current = report.current.expect("a window");
    assert_eq!(current.start_ms, START + 123 * S);
    assert_eq!(current.count(Signal::TranslationErrors), Some(1));
    // Hours later on eBPF, the baseline is the same.
    for seconds in (200..=7_200).step_by(60) {
        tracker.record(sample(seconds, Dataplane::Ebpf, 10));
    }
    assert_eq!(tracker.report().baseline, Some(baseline));
}

#[test]
fn back_on_kube_proxy_the_kept_baseline_stays_until_a_minute_there_makes_a_fresh_one() {
    let mut tracker = tracker();
    tracker.record(sample(0, Dataplane::KubeProxy, 0));
    tracker.record(sample(120, Dataplane::KubeProxy, 6));
    tracker.record(sample(121, Dataplane::Ebpf, 6));
    tracker.record(sample(200, Dataplane::Ebpf, 6));
    let frozen = tracker.report().baseline.expect("a baseline");
    tracker.record(sample(201, Dataplane::KubeProxy, 6));
    tracker.record(sample(230, Dataplane::KubeProxy, 6));
    assert_eq!(tracker.report().baseline, Some(frozen));
    tracker.record(sample(261, Dataplane::KubeProxy, 7));
    let fresh = tracker.report().baseline.expect("a baseline");
    assert_eq!(
        (fresh.start_ms, fresh.end_ms),
        (START + 201 * S, START + 261 * S)
    );
    assert_eq!(fresh.count(Signal::FragmentsWithoutFirst), Some(1));
}

#[test]
fn a_baseline_restored_from_an_earlier_process_is_kept_until_a_fresh_one_is_long_enough() {
    let restored = WindowCounts {
        start_ms: START - 600 * S,
        end_ms: START - 10 * S,
        counts: [Some(4); SIGNAL_COUNT],
    };
    let mut tracker = DisruptionTracker::new(Settings::default(), Some(restored.clone()));
    tracker.record(sample(0, Dataplane::Ebpf, 0));
    tracker.record(sample(5, Dataplane::Ebpf, 0));
    assert_eq!(tracker.report().baseline, Some(restored.clone()));
    // On kube-proxy: kept for the first minute, then replaced.
    let mut tracker = DisruptionTracker::new(Settings::default(), Some(restored.clone()));
    tracker.record(sample(0, Dataplane::KubeProxy, 0));
    tracker.record(sample(30, Dataplane::KubeProxy, 0));
    assert_eq!(tracker.report().baseline, Some(restored));
    tracker.record(sample(60, Dataplane::KubeProxy, 0));
    assert_eq!(
        tracker.report().baseline.map(|window| window.start_ms),
        Some(START)
    );
}

#[test]
fn a_baseline_read_back_later_is_kept_unless_this_process_froze_its_own() {
    let read_back = WindowCounts {
        start_ms: START - 600 * S,
        end_ms: START - 10 * S,
        counts: [Some(4); SIGNAL_COUNT],
    };
    let mut tracker = tracker();
    tracker.record(sample(0, Dataplane::Ebpf, 0));
    tracker.record(sample(5, Dataplane::Ebpf, 0));
    assert_eq!(tracker.report().baseline, None);
    tracker.restore_baseline(read_back.clone());
    assert_eq!(tracker.report().baseline, Some(read_back.clone()));
    // A node that switched under this process keeps what it froze.
    let mut tracker = DisruptionTracker::new(Settings::default(), None);
    tracker.record(sample(0, Dataplane::KubeProxy, 0));
    tracker.record(sample(5, Dataplane::KubeProxy, 0));
    tracker.record(sample(6, Dataplane::Ebpf, 0));
    let frozen = tracker.report().baseline;
    tracker.restore_baseline(read_back);
    assert_eq!(tracker.report().baseline, frozen);
    assert_eq!(frozen.map(|window| window.end_ms), Some(START + 5 * S));
}

#[test]
fn a_switch_before_a_minute_on_kube_proxy_keeps_the_short_baseline_when_there_is_no_other() {
    let mut tracker = tracker();
    tracker.record(sample(0, Dataplane::KubeProxy, 0));
    tracker.record(sample(20, Dataplane::KubeProxy, 1));
    tracker.record(sample(21, Dataplane::Ebpf, 1));
    let baseline = tracker.report().baseline.expect("a baseline");
    assert_eq!(
        (baseline.start_ms, baseline.end_ms),
        (START, START + 20 * S)
    );
}

#[test]
fn a_restarted_counter_never_counts_negative() {
    let mut tracker = tracker();
    tracker.record(sample(0, Dataplane::Ebpf, 50));
    tracker.record(sample(5, Dataplane::Ebpf, 55));
    // The map was created again: its counter restarted and counted 2.
    tracker.record(sample(10, Dataplane::Ebpf, 2));
    tracker.record(sample(15, Dataplane::Ebpf, 3));
    assert_eq!(
        count(&tracker.report().current, Signal::SourceRangeDrops),
        Some(5 + 2 + 1)
    );
}

#[test]
fn a_signal_not_measured_in_the_window_has_no_count_and_others_keep_theirs() {
    let mut tracker = tracker();
    let unmeasured = |seconds, value| {
        with_reading(
            sample(seconds, Dataplane::KubeProxy, value),
            Signal::TranslationErrors,
            None,
        )
    };
    tracker.record(unmeasured(0, 0));
    tracker.record(unmeasured(5, 2));
    let current = tracker.report().current;
    assert_eq!(count(&current, Signal::TranslationErrors), None);
    assert_eq!(count(&current, Signal::SourceRangeDrops), Some(2));
    // Measured from here on: a count from the first interval it is read at both ends.
    tracker.record(sample(10, Dataplane::KubeProxy, 4));
    tracker.record(sample(15, Dataplane::KubeProxy, 5));
    assert_eq!(
        count(&tracker.report().current, Signal::TranslationErrors),
        Some(1)
    );
}

#[test]
fn a_wall_clock_that_goes_back_starts_the_windows_again() {
    let mut tracker = tracker();
    tracker.record(sample(100, Dataplane::Ebpf, 0));
    tracker.record(sample(105, Dataplane::Ebpf, 9));
    tracker.record(sample(50, Dataplane::Ebpf, 9));
    assert_eq!(tracker.report().current, None);
    tracker.record(sample(55, Dataplane::Ebpf, 10));
    let current = tracker.report().current.expect("a window");
    assert_eq!(current.start_ms, START + 50 * S);
    assert_eq!(current.count(Signal::TranslationErrors), Some(1));
}

#[test]
fn the_first_report_with_a_window_is_published_at_once() {
    let mut tracker = tracker();
    tracker.record(sample(0, Dataplane::KubeProxy, 0));
    assert_eq!(tracker.publish(START), None);
    tracker.record(sample(5, Dataplane::KubeProxy, 0));
    assert!(tracker.publish(START + 5 * S).is_some());
    assert!(tracker.published().is_some());
}

#[test]
fn changed_figures_are_published_at_most_every_ten_seconds_while_watched() {
    let mut tracker = tracker();
    tracker.record(sample(0, Dataplane::Ebpf, 0));
    tracker.record(sample(5, Dataplane::Ebpf, 1));
    assert!(tracker.publish(START + 5 * S).is_some());
    tracker.record(sample(10, Dataplane::Ebpf, 2));
    assert_eq!(tracker.publish(START + 10 * S), None, "5 s after the last");
    tracker.record(sample(15, Dataplane::Ebpf, 3));
    let published = tracker
        .publish(START + 15 * S)
        .expect("10 s after the last");
    assert_eq!(
        count(&published.current, Signal::TranslationErrors),
        Some(3)
    );
}

#[test]
fn unchanged_figures_are_refreshed_every_thirty_seconds_while_watched_and_not_before() {
    let mut tracker = tracker();
    tracker.record(sample(0, Dataplane::Ebpf, 0));
    tracker.record(sample(5, Dataplane::Ebpf, 0));
    assert!(tracker.publish(START + 5 * S).is_some());
    for seconds in (10..35).step_by(5) {
        tracker.record(sample(seconds, Dataplane::Ebpf, 0));
        assert_eq!(tracker.publish(START + seconds * S), None, "at {seconds} s");
    }
    tracker.record(sample(35, Dataplane::Ebpf, 0));
    let refreshed = tracker
        .publish(START + 35 * S)
        .expect("30 s after the last");
    assert_eq!(
        refreshed.current.map(|window| window.end_ms),
        Some(START + 35 * S)
    );
}

#[test]
fn at_rest_changes_wait_a_minute_and_unchanged_figures_five() {
    let mut tracker = tracker();
    // Past the 15 minutes after the start.
    let rest = 16 * 60;
    for seconds in [0, rest - 5, rest] {
        tracker.record(sample(seconds, Dataplane::Ebpf, 0));
    }
    assert!(tracker.publish(START + rest * S).is_some());
    tracker.record(sample(rest + 30, Dataplane::Ebpf, 1));
    assert_eq!(
        tracker.publish(START + (rest + 30) * S),
        None,
        "a change 30 s after"
    );
    tracker.record(sample(rest + 60, Dataplane::Ebpf, 1));
    assert!(
        tracker.publish(START + (rest + 60) * S).is_some(),
        "a minute after"
    );
    // The event slides out of the window: a change again, a minute later.
    tracker.record(sample(rest + 120, Dataplane::Ebpf, 1));
    assert!(tracker.publish(START + (rest + 120) * S).is_some());
    for seconds in (rest + 180..rest + 420).step_by(60) {
        tracker.record(sample(seconds, Dataplane::Ebpf, 1));
        assert_eq!(tracker.publish(START + seconds * S), None, "at {seconds} s");
    }
    tracker.record(sample(rest + 420, Dataplane::Ebpf, 1));
    assert!(
        tracker.publish(START + (rest + 420) * S).is_some(),
        "five minutes after"
    );
}

#[test]
fn a_switch_is_news_even_when_the_counts_stay_the_same() {
    let mut tracker = tracker();
    tracker.record(sample(0, Dataplane::KubeProxy, 0));
    tracker.record(sample(5, Dataplane::KubeProxy, 0));
    assert!(tracker.publish(START + 5 * S).is_some());
    tracker.record(sample(15, Dataplane::Ebpf, 0));
    tracker.record(sample(20, Dataplane::Ebpf, 0));
    let published = tracker.publish(START + 20 * S).expect("the switch");
    let current = published.current.expect("a window after the switch");
    assert_eq!(current.start_ms, START + 15 * S);
    assert_eq!(
        published.baseline.map(|window| window.end_ms),
        Some(START + 5 * S)
    );
}

#[test]
fn nothing_new_is_not_published_again() {
    let mut tracker = tracker();
    tracker.record(sample(0, Dataplane::Ebpf, 0));
    tracker.record(sample(5, Dataplane::Ebpf, 0));
    assert!(tracker.publish(START + 5 * S).is_some());
    // No sample since: the same report, however late.
    assert_eq!(tracker.publish(START + 3_600 * S), None);
}

/// What happened between two samples in the generated histories.
#[derive(Clone, Debug)]
enum Step {
    /// `events` counted, `seconds` later.
    Count { seconds: i64, events: u64 },
    /// The counter restarted from zero (same map if `same_map`) and counted `events`.
    Restart {
        seconds: i64,
        events: u64,
        same_map: bool,
    },
    /// The node switched dataplane, `seconds` later.
    Switch { seconds: i64 },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (1..30i64, 0..20u64).prop_map(|(seconds, events)| Step::Count { seconds, events }),
        1 => (1..30i64, 0..20u64, any::<bool>()).prop_map(|(seconds, events, same_map)| {
            Step::Restart { seconds, events, same_map }
        }),
        1 => (1..30i64).prop_map(|seconds| Step::Switch { seconds }),
    ]
}

proptest! {
    /// However counters restart, a window never counts more than happened in it, and counts
    /// exactly what happened when every restart shows (a lower value or another map).
    #[test]
    fn a_window_counts_what_happened_in_it_and_never_more(steps in prop::collection::vec(step(), 1..60)) {
        let mut tracker = DisruptionTracker::new(Settings::default(), None);
        let mut now = 0i64;
        let mut value = 0u64;
        let mut source = 1u32;
        let mut dataplane = Dataplane::KubeProxy;
        // Events per interval of the current dataplane: (start, end, events, exact).
        let mut happened: Vec<(i64, i64, u64, bool)> = Vec::new();
        let reading = |value, source| Reading { source, value };
        tracker.record(Sample { at_ms: 0, dataplane, readings: [Some(reading(value, source)); SIGNAL_COUNT] });
        for step in steps {
            let start = now;
            match step {
                Step::Count { seconds, events } => {
                    now += seconds * S;
                    value += events;
                    happened.push((start, now, events, true));
                }
                Step::Restart { seconds, events, same_map } => {
                    now += seconds * S;
                    let exact = !same_map || events < value;
                    if !same_map {
                        source += 1;
                    }
                    value = events;
                    happened.push((start, now, events, exact));
                }
                Step::Switch { seconds } => {
                    now += seconds * S;
                    dataplane = match dataplane {
                        Dataplane::KubeProxy => Dataplane::Ebpf,
                        Dataplane::Ebpf => Dataplane::KubeProxy,
                    };
                    happened.clear();
                }
            }
            tracker.record(Sample { at_ms: now, dataplane, readings: [Some(reading(value, source)); SIGNAL_COUNT] });
            if let Some(current) = tracker.report().current {
                prop_assert!(current.start_ms >= now - 60 * S);
                prop_assert_eq!(current.end_ms, now);
                let inside: Vec<_> = happened.iter().filter(|(start, ..)| *start >= current.start_ms).collect();
                let truth: u64 = inside.iter().map(|(_, _, events, _)| events).sum();
                let counted = current.count(Signal::TranslationErrors).expect("measured");
                prop_assert!(counted <= truth, "counted {} of {}", counted, truth);
                if inside.iter().all(|(.., exact)| *exact) {
                    prop_assert_eq!(counted, truth);
                }
            }
        }
    }

    /// Whatever the history, the baseline ends no later than the last switch to eBPF while the
    /// node serves from eBPF, and the current window never starts before the last switch.
    #[test]
    fn windows_never_straddle_a_switch(steps in prop::collection::vec(step(), 1..60)) {
        let mut tracker = DisruptionTracker::new(Settings::default(), None);
        let mut now = 0i64;
        let mut dataplane = Dataplane::KubeProxy;
        let mut switched_at = 0i64;
        tracker.record(sample(0, dataplane, 0));
        for step in steps {
            match step {
                Step::Count { seconds, .. } | Step::Restart { seconds, .. } => now += seconds * S,
                Step::Switch { seconds } => {
                    now += seconds * S;
                    switched_at = now;
                    dataplane = match dataplane {
                        Dataplane::KubeProxy => Dataplane::Ebpf,
                        Dataplane::Ebpf => Dataplane::KubeProxy,
                    };
                }
            }
            tracker.record(Sample { at_ms: START + now, ..sample(0, dataplane, 0) });
            let report = tracker.report();
            if let Some(current) = report.current {
                prop_assert!(current.start_ms >= START + switched_at);
            }
            if dataplane == Dataplane::Ebpf {
                if let Some(baseline) = report.baseline {
                    prop_assert!(baseline.end_ms <= START + switched_at);
                }
            }
        }
    }

    /// However often the counts change, no two publications are closer than ten seconds.
    #[test]
    fn publications_are_at_least_ten_seconds_apart(gaps in prop::collection::vec((1..15i64, 0..3u64), 1..200)) {
        let mut tracker = DisruptionTracker::new(Settings::default(), None);
        let mut now = 0i64;
        let mut value = 0u64;
        let mut last_published: Option<i64> = None;
        tracker.record(sample(0, Dataplane::Ebpf, 0));
        for (seconds, events) in gaps {
            now += seconds * S;
            value += events;
            tracker.record(Sample { at_ms: START + now, ..sample(0, Dataplane::Ebpf, value) });
            if tracker.publish(START + now).is_some() {
                if let Some(before) = last_published {
                    prop_assert!(now - before >= 10 * S, "published {} ms apart", now - before);
                }
                last_published = Some(now);
            }
        }
    }
}

#[test]
fn only_the_connection_signals_are_measured_on_kube_proxy() {
    let on_kube_proxy: Vec<_> = Signal::ALL
        .into_iter()
        .filter(|signal| signal.measured_on_kube_proxy())
        .collect();
    assert_eq!(
        on_kube_proxy,
        [
            Signal::FailedConnects,
            Signal::SynRetransmits,
            Signal::ResetsByPeer
        ]
    );
}

#[test]
fn every_signal_has_its_own_place_and_name() {
    let mut places: Vec<_> = Signal::ALL.into_iter().map(Signal::index).collect();
    places.sort();
    assert_eq!(places, (0..SIGNAL_COUNT).collect::<Vec<_>>());
    let mut names: Vec<_> = Signal::ALL.into_iter().map(Signal::name).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), SIGNAL_COUNT);
}
