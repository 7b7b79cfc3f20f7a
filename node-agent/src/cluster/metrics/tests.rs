use super::*;

fn value(metrics: &AgentMetrics, name: &str) -> String {
    let families = metrics.registry.gather();
    let mut text = Vec::new();
    prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &families, &mut text)
        .expect("encodes");
    String::from_utf8(text)
        .expect("utf-8")
        .lines()
        .find(|line| line.starts_with(name))
        .unwrap_or_default()
        .to_string()
}

#[test]
fn counters_follow_the_agent_counts_by_differences() {
    let mut metrics = AgentMetrics::new().expect("registers");
    let mut counts = AgentCounts {
        node_updates_ignored: 3,
        ..AgentCounts::default()
    };
    metrics.record_counts(&counts);
    counts.node_updates_ignored = 5;
    metrics.record_counts(&counts);
    metrics.record_counts(&counts);
    assert_eq!(
        value(&metrics, "switchyard_agent_node_updates_ignored_total"),
        "switchyard_agent_node_updates_ignored_total 5"
    );
}

#[test]
fn conntrack_metrics_follow_the_sweep_reports() {
    let mut metrics = AgentMetrics::new().expect("registers");
    let mut report = SweepReport {
        entries: 1_000,
        capacity: 524_288,
        last_sweep_took: std::time::Duration::from_millis(250),
        removed_total: 40,
    };
    metrics.record_conntrack_sweeps(&report);
    report.entries = 900;
    report.removed_total = 140;
    metrics.record_conntrack_sweeps(&report);
    metrics.record_conntrack_sweeps(&report);
    assert_eq!(
        value(&metrics, "switchyard_agent_conntrack_entries"),
        "switchyard_agent_conntrack_entries 900"
    );
    assert_eq!(
        value(&metrics, "switchyard_agent_conntrack_capacity"),
        "switchyard_agent_conntrack_capacity 524288"
    );
    assert_eq!(
        value(&metrics, "switchyard_agent_conntrack_sweep_seconds"),
        "switchyard_agent_conntrack_sweep_seconds 0.25"
    );
    assert_eq!(
        value(&metrics, "switchyard_agent_conntrack_expired_total"),
        "switchyard_agent_conntrack_expired_total 140"
    );
}

#[test]
fn packet_counters_are_labelled_by_result() {
    let mut metrics = AgentMetrics::new().expect("registers");
    metrics.record_packets(&Counters {
        translated: 10,
        ..Counters::default()
    });
    metrics.record_packets(&Counters {
        translated: 25,
        no_backend: 1,
        ..Counters::default()
    });
    assert_eq!(
        value(
            &metrics,
            "switchyard_agent_datapath_packets_total{result=\"translated\"}"
        ),
        "switchyard_agent_datapath_packets_total{result=\"translated\"} 25"
    );
}
