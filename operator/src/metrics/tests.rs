use super::*;
use prometheus::{Encoder, TextEncoder};
use switchyard_crds::NodeCounts;

fn exposition(metrics: &Metrics) -> String {
    let mut text = Vec::new();
    TextEncoder::new()
        .encode(&metrics.registry().gather(), &mut text)
        .unwrap();
    String::from_utf8(text).unwrap()
}

#[test]
fn the_phase_gauge_is_one_for_the_current_phase_only() {
    let metrics = Metrics::new().unwrap();
    let status = DataplaneConfigStatus {
        phase: DataplanePhase::ActivatingNodes,
        nodes: NodeCounts {
            total: 3,
            serving: 1,
            kube_proxy_running: 3,
            ..NodeCounts::default()
        },
        ..DataplaneConfigStatus::default()
    };
    metrics.observe_status(&status);
    let text = exposition(&metrics);
    assert!(
        text.contains("switchyard_operator_transition_phase{phase=\"ActivatingNodes\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("switchyard_operator_transition_phase{phase=\"Ready\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("switchyard_operator_nodes{state=\"total\"} 3"),
        "{text}"
    );
    assert!(
        text.contains("switchyard_operator_nodes{state=\"serving\"} 1"),
        "{text}"
    );

    metrics.observe_status(&DataplaneConfigStatus {
        phase: DataplanePhase::Ready,
        ..status
    });
    let text = exposition(&metrics);
    assert!(
        text.contains("switchyard_operator_transition_phase{phase=\"ActivatingNodes\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("switchyard_operator_transition_phase{phase=\"Ready\"} 1"),
        "{text}"
    );
}

#[test]
fn reconcile_durations_are_exposed_as_a_histogram() {
    let metrics = Metrics::new().unwrap();
    metrics.reconcile_duration.observe(0.02);
    let text = exposition(&metrics);
    assert!(
        text.contains("# TYPE switchyard_operator_reconcile_duration_seconds histogram"),
        "{text}"
    );
    assert!(
        text.contains("switchyard_operator_reconcile_duration_seconds_count 1"),
        "{text}"
    );
}
