use std::collections::VecDeque;

use chrono::TimeZone as _;

use super::*;

/// Counters handed out in order, one array per read.
struct Script(VecDeque<[Option<Reading>; SIGNAL_COUNT]>);

impl CounterSource for Script {
    fn read(&mut self) -> [Option<Reading>; SIGNAL_COUNT] {
        self.0.pop_front().expect("a scripted reading")
    }
}

/// Every counter at `value`, except `signal` at `value_of_signal`.
fn readings(value: u64, signal: Signal, value_of_signal: u64) -> [Option<Reading>; SIGNAL_COUNT] {
    let mut readings = [Some(Reading { source: 3, value }); SIGNAL_COUNT];
    readings[signal.index()] = Some(Reading {
        source: 3,
        value: value_of_signal,
    });
    readings
}

fn wall(seconds: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(1_800_000_000 + seconds, 0)
        .single()
        .expect("a valid time")
}

#[test]
fn the_kernels_list_of_possible_cpus_is_counted() {
    assert_eq!(possible_cpu_count("0-3\n"), Some(4));
    assert_eq!(possible_cpu_count("0"), Some(1));
    assert_eq!(possible_cpu_count("0,2-5"), Some(5));
    assert_eq!(possible_cpu_count(""), None);
    assert_eq!(possible_cpu_count("3-1"), None);
}

#[test]
fn a_per_cpu_value_is_the_sum_of_its_slots() {
    let mut bytes = Vec::new();
    for value in [1u64, 20, 300] {
        bytes.extend_from_slice(&value.to_ne_bytes());
    }
    assert_eq!(per_cpu_sum(&bytes), 321);
}

#[test]
fn each_signal_lands_in_its_field_of_the_status_window_and_reads_back_the_same() {
    let mut counts = [None; SIGNAL_COUNT];
    for (number, signal) in Signal::ALL.into_iter().enumerate() {
        counts[signal.index()] = Some(number as u64 + 1);
    }
    let window = WindowCounts {
        start_ms: wall(0).timestamp_millis(),
        end_ms: wall(60).timestamp_millis(),
        counts,
    };
    let status = signal_window(&window);
    assert_eq!(status.datapath.translation_errors, Some(1));
    assert_eq!(
        status.datapath.refused_with_endpoints_ready_elsewhere,
        Some(2)
    );
    assert_eq!(status.datapath.conntrack_overflows, Some(3));
    assert_eq!(status.datapath.fragments_without_first, Some(4));
    assert_eq!(status.expected.refused_without_ready_endpoints, Some(5));
    assert_eq!(status.expected.source_range_drops, Some(6));
    assert_eq!(status.connections.failed_connects, Some(7));
    assert_eq!(status.connections.syn_retransmits, Some(8));
    assert_eq!(status.connections.resets_by_peer, Some(9));
    assert_eq!((status.start, status.end), (wall(0), wall(60)));
    assert_eq!(window_counts(&status), Some(window));
}

#[test]
fn each_signal_reads_its_own_counter() {
    let places: Vec<_> = Signal::ALL.into_iter().map(counter_of).collect();
    let mut unique = places.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), places.len(), "{places:?}");
    assert_eq!(
        counter_of(Signal::SourceRangeDrops),
        (map_names::SOURCE_RANGE_DROPS, 0)
    );
    assert_eq!(
        counter_of(Signal::FragmentsWithoutFirst),
        (map_names::FRAGMENTS_WITHOUT_FIRST, 0)
    );
    assert_eq!(
        counter_of(Signal::FailedConnects),
        (map_names::CONNECTIONS, connection::FAILED_CONNECTS)
    );
    assert_eq!(
        counter_of(Signal::SynRetransmits),
        (map_names::CONNECTIONS, connection::SYN_RETRANSMITS)
    );
    assert_eq!(
        counter_of(Signal::ResetsByPeer),
        (map_names::CONNECTIONS, connection::RESETS_BY_PEER)
    );
}

#[test]
fn the_connection_signals_are_measured_while_the_node_is_on_kube_proxy() {
    let script = Script(VecDeque::from([
        readings(0, Signal::FailedConnects, 1),
        readings(0, Signal::FailedConnects, 4),
    ]));
    let mut sampler = DisruptionSampler::new(script, None);
    let start = Instant::now();
    assert!(sampler
        .after_round(Dataplane::KubeProxy, start, wall(0))
        .is_none());
    let report = sampler
        .after_round(Dataplane::KubeProxy, start + SAMPLE_PERIOD, wall(5))
        .expect("the first window is published");
    let current = report.current.as_ref().expect("a window");
    assert_eq!(current.connections.failed_connects, Some(3));
    assert_eq!(current.connections.resets_by_peer, Some(0));
    assert_eq!(current.connections.syn_retransmits, Some(0));
    // The baseline under kube-proxy carries them too; the datapath's signals not.
    let baseline = report.baseline.as_ref().expect("a baseline");
    assert_eq!(baseline.connections.failed_connects, Some(3));
    assert_eq!(baseline.datapath.translation_errors, None);
}

#[test]
fn the_datapath_counters_are_not_measured_while_the_programs_are_detached() {
    let script = Script(VecDeque::from([
        readings(0, Signal::SourceRangeDrops, 0),
        readings(0, Signal::SourceRangeDrops, 5),
    ]));
    let mut sampler = DisruptionSampler::new(script, None);
    let start = Instant::now();
    assert!(sampler
        .after_round(Dataplane::KubeProxy, start, wall(0))
        .is_none());
    let report = sampler
        .after_round(Dataplane::KubeProxy, start + SAMPLE_PERIOD, wall(5))
        .expect("the first window is published");
    let current = report.current.as_ref().expect("a window");
    assert_eq!(current.expected.source_range_drops, None);
    assert_eq!(current.datapath.translation_errors, None);
}

#[test]
fn counters_are_read_every_five_seconds_and_at_once_when_the_dataplane_changes() {
    let script = Script(VecDeque::from([
        readings(0, Signal::SourceRangeDrops, 0),
        readings(0, Signal::SourceRangeDrops, 0),
        readings(0, Signal::SourceRangeDrops, 2),
    ]));
    let mut sampler = DisruptionSampler::new(script, None);
    let start = Instant::now();
    sampler.after_round(Dataplane::KubeProxy, start, wall(0));
    // Within the period: no read (the script would run out).
    for millis in [1, 1_000, 4_999] {
        assert!(sampler
            .after_round(
                Dataplane::KubeProxy,
                start + Duration::from_millis(millis),
                wall(1)
            )
            .is_none());
    }
    // The switch: read at once.
    sampler.after_round(Dataplane::Ebpf, start + Duration::from_secs(2), wall(2));
    let report = sampler
        .after_round(Dataplane::Ebpf, start + Duration::from_secs(7), wall(7))
        .expect("the switch is published");
    let current = report.current.as_ref().expect("a window after the switch");
    assert_eq!(current.start, wall(2));
    assert_eq!(current.expected.source_range_drops, Some(2));
    assert_eq!(current.datapath.translation_errors, Some(0));
}

#[test]
fn the_metrics_count_events_and_show_the_last_minute() {
    let registry = Registry::new();
    let metrics = DisruptionMetrics::register(&registry).expect("registers");
    let script = Script(VecDeque::from([
        readings(0, Signal::FragmentsWithoutFirst, 10),
        readings(0, Signal::FragmentsWithoutFirst, 13),
    ]));
    let mut sampler = DisruptionSampler::new(script, Some(metrics));
    let start = Instant::now();
    sampler.after_round(Dataplane::Ebpf, start, wall(0));
    sampler.after_round(Dataplane::Ebpf, start + SAMPLE_PERIOD, wall(5));
    let encoded = {
        let mut buffer = Vec::new();
        prometheus::Encoder::encode(
            &prometheus::TextEncoder::new(),
            &registry.gather(),
            &mut buffer,
        )
        .expect("encodes");
        String::from_utf8(buffer).expect("text")
    };
    assert!(
        encoded.contains(
            "switchyard_agent_disruption_events_total{signal=\"fragments_without_first\"} 3"
        ),
        "{encoded}"
    );
    assert!(
        encoded.contains(
            "switchyard_agent_disruption_per_minute{signal=\"fragments_without_first\"} 3"
        ),
        "{encoded}"
    );
    assert!(
        encoded.contains("switchyard_agent_disruption_per_minute{signal=\"source_range_drops\"} 0"),
        "{encoded}"
    );
    // No baseline: the node never was on kube-proxy under this process.
    assert!(
        !encoded.contains("switchyard_agent_disruption_baseline_per_minute{"),
        "{encoded}"
    );
}

#[test]
fn a_baseline_an_earlier_process_reported_is_restored_once() {
    let script = Script(VecDeque::from([readings(0, Signal::SourceRangeDrops, 0)]));
    let mut sampler = DisruptionSampler::new(script, None);
    let earlier = signal_window(&WindowCounts {
        start_ms: wall(-600).timestamp_millis(),
        end_ms: wall(-60).timestamp_millis(),
        counts: [Some(0); SIGNAL_COUNT],
    });
    sampler.restore_baseline(Some(&DisruptionReport {
        baseline: Some(earlier.clone()),
        current: None,
    }));
    // Published at once: the baseline is news, before any window of this process.
    let report = sampler
        .after_round(Dataplane::Ebpf, Instant::now(), wall(0))
        .expect("published");
    assert_eq!(report.baseline, Some(earlier.clone()));
    assert_eq!(report.current, None);
    // A second read-back (the status this process wrote) changes nothing.
    sampler.restore_baseline(None);
    assert_eq!(
        sampler.report().and_then(|report| report.baseline.clone()),
        Some(earlier)
    );
}
