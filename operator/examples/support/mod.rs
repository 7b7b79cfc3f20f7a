//! What the examples share: a fixed clock, and a DataplaneNode as its agent reports it.

use chrono::{DateTime, TimeZone, Utc};
use switchyard_crds::{
    condition_types, Condition, ConditionStatus, DataplaneMode, DataplaneNode, DataplaneNodeSpec,
    DataplaneNodeStatus,
};

/// `seconds` after a fixed moment, so that an example prints the same every run.
pub fn at(seconds: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(1_800_000_000 + seconds, 0)
        .single()
        .unwrap_or_default()
}

/// What an agent last reported about its node.
pub struct Report {
    /// The DataplaneNode generation the report is about (the object is at generation 2).
    pub observed_generation: i64,
    pub agent_revision: &'static str,
    /// When the reported conditions last changed.
    pub at: DateTime<Utc>,
    /// kube-proxy runs on the node: its rules are present and it is healthy.
    pub kube_proxy: bool,
}

/// The DataplaneNode `name` at generation 2 with `spec`, and its agent's `report`: Ready,
/// Services synced, programs attached when told `Ebpf`.
pub fn dataplane_node(name: &str, spec: DataplaneNodeSpec, report: &Report) -> DataplaneNode {
    let attached = spec.mode == DataplaneMode::Ebpf;
    let mut dataplane_node = DataplaneNode::new(name, spec);
    dataplane_node.metadata.generation = Some(2);
    let conditions = [
        (condition_types::READY, true),
        (condition_types::PROGRAMS_ATTACHED, attached),
        (condition_types::SERVICES_SYNCED, true),
        (condition_types::KUBE_PROXY_RULES_PRESENT, report.kube_proxy),
        (condition_types::KUBE_PROXY_HEALTHY, report.kube_proxy),
    ];
    dataplane_node.status = Some(DataplaneNodeStatus {
        observed_generation: Some(report.observed_generation),
        agent_revision: Some(report.agent_revision.into()),
        conditions: conditions
            .into_iter()
            .map(|(type_, holds)| {
                let status = ConditionStatus::from_bool(holds);
                Condition::new(type_, status, "Example", "", Some(2), report.at)
            })
            .collect(),
        ..DataplaneNodeStatus::default()
    });
    dataplane_node
}
