//! The DataplaneNode status the agent reports, computed from its state. Pure: the
//! caller compares the result with what it last wrote and writes only on change,
//! so every message here is stable while nothing changes (no growing counters, no
//! "waited N s").

use chrono::{DateTime, Utc};
use switchyard_crds::{
    condition_types, reasons, set_condition, Condition, ConditionStatus, DataplaneMode,
    DataplaneNodeStatus, DisruptionReport,
};

use crate::gate::GateStatus;

/// Reason of the kube-proxy conditions before the first check of the node's rules.
pub const NOT_YET_CHECKED: &str = "NotYetChecked";

/// One condition's value, before it gets its type and times.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionValue {
    pub status: ConditionStatus,
    pub reason: String,
    pub message: String,
}

impl ConditionValue {
    pub fn new(holds: bool, reason: &str, message: impl Into<String>) -> Self {
        Self {
            status: ConditionStatus::from_bool(holds),
            reason: reason.to_owned(),
            message: message.into(),
        }
    }

    pub fn unknown(reason: &str, message: impl Into<String>) -> Self {
        Self {
            status: ConditionStatus::Unknown,
            reason: reason.to_owned(),
            message: message.into(),
        }
    }
}

/// What the kube-proxy coexistence checks last found (see `cluster::coexist`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoexistenceReport {
    pub rules_present: ConditionValue,
    pub chain_order_safe: ConditionValue,
    pub kube_proxy_healthy: ConditionValue,
    /// kube-proxy rules found on the node (for the metric), if checked.
    pub kube_proxy_rules: Option<usize>,
    /// Which spec the coexistence loop has acted on.
    pub progress: CoexistenceProgress,
}

/// Which DataplaneNode spec the coexistence loop has acted on: what it serves of
/// kube-proxy's health ports and whether it cleans follow that spec from then on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CoexistenceProgress {
    /// No coexistence loop runs (standalone mode): the core waits for none.
    #[default]
    NoLoop,
    /// The loop has not finished a round yet.
    NoRoundYet,
    /// A round finished on the request of this DataplaneNode generation (`None`:
    /// there was no DataplaneNode).
    ActedOn(Option<i64>),
}

/// The spec generation the status may report as observed: the one the core acted
/// on (`acted`) once the coexistence loop has acted on it too, else the one reported
/// before (never a later one). The operator reads `observedGeneration` as "the node
/// did what this spec says": brings kube-proxy back only after every node has
/// reported the spec that took cleanup away, so a node must have closed
/// kube-proxy's health ports (and stopped cleaning) before it reports that spec,
/// or kube-proxy would find its healthz port taken
/// (`FailedToStartProxierHealthcheck`).
pub fn observable_generation(
    acted: Option<i64>,
    progress: CoexistenceProgress,
    reported_before: Option<i64>,
) -> Option<i64> {
    match progress {
        CoexistenceProgress::NoLoop => acted,
        CoexistenceProgress::ActedOn(generation) if generation == acted => acted,
        CoexistenceProgress::NoRoundYet | CoexistenceProgress::ActedOn(_) => {
            reported_before.filter(|before| acted.is_some_and(|acted| *before <= acted))
        }
    }
}

impl Default for CoexistenceReport {
    fn default() -> Self {
        let unknown =
            || ConditionValue::unknown(NOT_YET_CHECKED, "the node's rules have not been read yet");
        Self {
            rules_present: unknown(),
            chain_order_safe: unknown(),
            kube_proxy_healthy: unknown(),
            kube_proxy_rules: None,
            progress: CoexistenceProgress::default(),
        }
    }
}

/// The programs as the agent left them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachmentReport {
    Detached,
    Attached,
    Draining,
}

/// How the last drain ended (for `Draining` False after it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainEnd {
    /// No live flow was left.
    Complete,
    /// The drain timeout passed with flows left.
    TimeoutExpired,
}

/// The maps' state as the syncer reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SyncReport {
    /// Nothing applied yet (the gate is closed, or the first apply is due).
    NotYet,
    Synced,
    Failed {
        message: String,
    },
}

/// Everything the status is computed from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusInputs {
    pub agent_version: String,
    pub agent_revision: Option<String>,
    pub gate: GateStatus,
    /// How long the gate waits before reporting `HostMetadataTimeout`.
    pub gate_timeout_seconds: u64,
    /// `metadata.generation` of the DataplaneNode spec the agent last acted on.
    pub acted_generation: Option<i64>,
    /// The mode followed (`KubeProxy` without a DataplaneNode only on a node
    /// that never had one and has nothing attached: see `follow::instruction`).
    pub mode: DataplaneMode,
    pub attachment: AttachmentReport,
    pub attach_error: Option<String>,
    pub sync: SyncReport,
    pub services_programmed: Option<usize>,
    pub live_flows: Option<usize>,
    pub last_drain: Option<DrainEnd>,
    pub coexistence: CoexistenceReport,
    pub last_sync_time: Option<DateTime<Utc>>,
    /// The disruption signals last published by the sampler (`crate::disruption`), if any.
    pub disruption: Option<DisruptionReport>,
}

/// Whether the status is worth reporting yet. While the gate waits within its
/// timeout (the first fraction of a second of every start) nothing is written: a
/// restarted agent would otherwise flip `Ready` to False and back on every
/// restart, while the previous process's programs serve throughout.
pub fn worth_reporting(gate: &GateStatus) -> bool {
    !matches!(gate, GateStatus::Waiting { .. })
}

/// The status last handed to the writer, and the DataplaneNode object (its UID)
/// it was meant for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WrittenStatus {
    pub object_uid: Option<String>,
    pub status: Option<DataplaneNodeStatus>,
}

impl WrittenStatus {
    /// Whether `status` must be written to the object `object_uid`: it changed, or
    /// the DataplaneNode is a new object (deleted and recreated under the same
    /// name, possibly at the same generation) that has not been given it yet.
    pub fn needs_write(&self, object_uid: Option<&str>, status: &DataplaneNodeStatus) -> bool {
        self.status.as_ref() != Some(status) || self.object_uid.as_deref() != object_uid
    }
}

fn as_count(value: usize) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The status to report. `previous` (the conditions last written, or read back
/// at start) keeps each condition's `lastTransitionTime` while its status stays.
pub fn compute_status(
    inputs: &StatusInputs,
    previous: &[Condition],
    now: DateTime<Utc>,
) -> DataplaneNodeStatus {
    let mut conditions: Vec<Condition> = previous.to_vec();
    for (type_, value) in condition_values(inputs) {
        set_condition(
            &mut conditions,
            Condition::new(
                type_,
                value.status,
                &value.reason,
                value.message,
                inputs.acted_generation,
                now,
            ),
        );
    }
    // Only the conditions the agent owns, in a stable order.
    let order = condition_order();
    conditions.retain(|condition| order.contains(&condition.type_.as_str()));
    conditions.sort_by_key(|condition| {
        order
            .iter()
            .position(|type_| *type_ == condition.type_)
            .unwrap_or(usize::MAX)
    });
    DataplaneNodeStatus {
        observed_generation: inputs.acted_generation,
        agent_version: Some(inputs.agent_version.clone()),
        agent_revision: inputs.agent_revision.clone(),
        conditions,
        services_programmed: inputs.services_programmed.map(as_count),
        live_flows: match inputs.attachment {
            AttachmentReport::Draining => inputs.live_flows.map(as_count),
            _ => None,
        },
        last_sync_time: inputs.last_sync_time,
        // Only what the sampler published: it changes at a bounded rate, so the status is not
        // written again for every sample.
        disruption: inputs.disruption.clone(),
    }
}

fn condition_order() -> [&'static str; 8] {
    [
        condition_types::HOST_METADATA_READY,
        condition_types::PROGRAMS_ATTACHED,
        condition_types::SERVICES_SYNCED,
        condition_types::KUBE_PROXY_RULES_PRESENT,
        condition_types::CHAIN_ORDER_SAFE,
        condition_types::KUBE_PROXY_HEALTHY,
        condition_types::DRAINING,
        condition_types::READY,
    ]
}

fn mode_name(mode: DataplaneMode) -> &'static str {
    match mode {
        DataplaneMode::KubeProxy => "KubeProxy",
        DataplaneMode::Ebpf => "Ebpf",
    }
}

fn condition_values(inputs: &StatusInputs) -> Vec<(&'static str, ConditionValue)> {
    let host_metadata = match &inputs.gate {
        GateStatus::Open { .. } => ConditionValue::new(
            true,
            reasons::HOST_METADATA_RECEIVED,
            "every start-of-day input arrived",
        ),
        GateStatus::Waiting { .. } => ConditionValue::new(
            false,
            reasons::WAITING_FOR_HOST_METADATA,
            format!(
                "waiting for {}; the previous entries keep serving",
                inputs.gate.missing_names()
            ),
        ),
        GateStatus::TimedOut { .. } => ConditionValue::new(
            false,
            reasons::HOST_METADATA_TIMEOUT,
            format!(
                "still missing after {} s: {}; still waiting, writing nothing to the maps meanwhile",
                inputs.gate_timeout_seconds,
                inputs.gate.missing_names()
            ),
        ),
    };
    let programs = match (&inputs.attach_error, inputs.attachment) {
        (Some(error), _) => ConditionValue::new(
            inputs.attachment != AttachmentReport::Detached,
            reasons::ATTACH_FAILED,
            error.clone(),
        ),
        (None, AttachmentReport::Attached) => {
            ConditionValue::new(true, reasons::ATTACHED, "the TC programs are attached")
        }
        (None, AttachmentReport::Draining) => ConditionValue::new(
            true,
            reasons::DRAINING_FLOWS,
            "the TC programs translate live flows only, before detaching",
        ),
        (None, AttachmentReport::Detached) => ConditionValue::new(
            false,
            reasons::DETACHED,
            "no program is attached; the maps are kept in sync",
        ),
    };
    let services = match &inputs.sync {
        SyncReport::Synced => ConditionValue::new(
            true,
            reasons::SYNCED,
            "the maps hold the current Services and endpoints",
        ),
        SyncReport::Failed { message } => {
            ConditionValue::new(false, reasons::SYNC_FAILED, message.clone())
        }
        SyncReport::NotYet => ConditionValue::new(
            false,
            reasons::WAITING_FOR_HOST_METADATA,
            "nothing written before the start-of-day gate opens",
        ),
    };
    let draining = match (inputs.attachment, inputs.last_drain) {
        (AttachmentReport::Draining, _) => ConditionValue::new(
            true,
            reasons::DRAINING_FLOWS,
            "told KubeProxy: live flows keep their translation, new connections go to kube-proxy's rules",
        ),
        (AttachmentReport::Detached, Some(DrainEnd::Complete)) => ConditionValue::new(
            false,
            reasons::DRAIN_COMPLETE,
            "no live flow was left, so the programs detached",
        ),
        (AttachmentReport::Detached, Some(DrainEnd::TimeoutExpired)) => ConditionValue::new(
            false,
            reasons::DRAIN_TIMEOUT_EXPIRED,
            "the drain timeout passed, so the programs detached with flows left",
        ),
        (AttachmentReport::Detached, None) => {
            ConditionValue::new(false, reasons::DETACHED, "not draining")
        }
        (AttachmentReport::Attached, _) => {
            ConditionValue::new(false, reasons::ATTACHED, "not draining")
        }
    };
    let attachment_follows_mode = match inputs.mode {
        DataplaneMode::Ebpf => inputs.attachment == AttachmentReport::Attached,
        DataplaneMode::KubeProxy => inputs.attachment != AttachmentReport::Attached,
    };
    let ready = match (&inputs.gate, &inputs.sync, &inputs.attach_error) {
        (GateStatus::TimedOut { .. }, _, _) => ConditionValue::new(
            false,
            reasons::HOST_METADATA_TIMEOUT,
            host_metadata.message.clone(),
        ),
        (GateStatus::Waiting { .. }, _, _) => ConditionValue::new(
            false,
            reasons::WAITING_FOR_HOST_METADATA,
            host_metadata.message.clone(),
        ),
        (_, SyncReport::Failed { message }, _) => {
            ConditionValue::new(false, reasons::SYNC_FAILED, message.clone())
        }
        (_, _, Some(error)) => ConditionValue::new(false, reasons::ATTACH_FAILED, error.clone()),
        (_, SyncReport::NotYet, _) => ConditionValue::new(
            false,
            reasons::WAITING_FOR_HOST_METADATA,
            "the first sync is due",
        ),
        (_, SyncReport::Synced, None) if attachment_follows_mode => ConditionValue::new(
            true,
            reasons::AGENT_READY,
            format!("following mode {}", mode_name(inputs.mode)),
        ),
        (_, SyncReport::Synced, None) => ConditionValue::new(
            false,
            reasons::ATTACH_FAILED,
            format!(
                "the programs do not follow mode {} yet",
                mode_name(inputs.mode)
            ),
        ),
    };
    let coexistence = &inputs.coexistence;
    vec![
        (condition_types::HOST_METADATA_READY, host_metadata),
        (condition_types::PROGRAMS_ATTACHED, programs),
        (condition_types::SERVICES_SYNCED, services),
        (
            condition_types::KUBE_PROXY_RULES_PRESENT,
            coexistence.rules_present.clone(),
        ),
        (
            condition_types::CHAIN_ORDER_SAFE,
            coexistence.chain_order_safe.clone(),
        ),
        (
            condition_types::KUBE_PROXY_HEALTHY,
            coexistence.kube_proxy_healthy.clone(),
        ),
        (condition_types::DRAINING, draining),
        (condition_types::READY, ready),
    ]
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chrono::TimeZone;
    use switchyard_crds::find_condition;

    use super::*;
    use crate::gate::GateInput;

    fn at(seconds: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_800_000_000 + seconds, 0)
            .single()
            .expect("a valid time")
    }

    fn ready_inputs() -> StatusInputs {
        StatusInputs {
            agent_version: "0.1.0".into(),
            agent_revision: Some("abc123".into()),
            gate: GateStatus::Open {
                waited: Duration::from_millis(300),
            },
            gate_timeout_seconds: 30,
            acted_generation: Some(4),
            mode: DataplaneMode::Ebpf,
            attachment: AttachmentReport::Attached,
            attach_error: None,
            sync: SyncReport::Synced,
            services_programmed: Some(12),
            live_flows: Some(3),
            last_drain: None,
            coexistence: CoexistenceReport::default(),
            last_sync_time: Some(at(5)),
            disruption: None,
        }
    }

    fn condition<'a>(status: &'a DataplaneNodeStatus, type_: &str) -> &'a Condition {
        find_condition(&status.conditions, type_).expect("the condition is reported")
    }

    #[test]
    fn the_status_carries_the_disruption_signals_last_published_and_none_without() {
        assert_eq!(
            compute_status(&ready_inputs(), &[], at(10)).disruption,
            None
        );
        let report = DisruptionReport {
            baseline: None,
            current: Some(switchyard_crds::SignalWindow {
                start: at(0),
                end: at(60),
                datapath: Default::default(),
                expected: switchyard_crds::ExpectedDrops {
                    refused_without_ready_endpoints: Some(0),
                    source_range_drops: Some(2),
                },
                connections: Default::default(),
                probes: Default::default(),
                services: Vec::new(),
            }),
        };
        let inputs = StatusInputs {
            disruption: Some(report.clone()),
            ..ready_inputs()
        };
        assert_eq!(
            compute_status(&inputs, &[], at(10)).disruption,
            Some(report)
        );
    }

    #[test]
    fn an_agent_serving_from_ebpf_reports_ready_with_every_field() {
        let status = compute_status(&ready_inputs(), &[], at(10));
        assert_eq!(status.observed_generation, Some(4));
        assert_eq!(status.agent_version.as_deref(), Some("0.1.0"));
        assert_eq!(status.agent_revision.as_deref(), Some("abc123"));
        assert_eq!(status.services_programmed, Some(12));
        assert_eq!(status.live_flows, None, "live flows only while draining");
        assert_eq!(status.last_sync_time, Some(at(5)));
        let types: Vec<&str> = status.conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, condition_order().to_vec());
        for type_ in [
            condition_types::HOST_METADATA_READY,
            condition_types::PROGRAMS_ATTACHED,
            condition_types::SERVICES_SYNCED,
            condition_types::READY,
        ] {
            assert!(condition(&status, type_).is_true(), "{type_}");
        }
        assert!(!condition(&status, condition_types::DRAINING).is_true());
        assert!(status
            .conditions
            .iter()
            .all(|condition| condition.observed_generation == Some(4)));
        assert_eq!(
            condition(&status, condition_types::KUBE_PROXY_RULES_PRESENT).status,
            ConditionStatus::Unknown
        );
    }

    #[test]
    fn a_gate_closed_past_its_timeout_names_the_missing_input_in_ready() {
        let mut inputs = ready_inputs();
        inputs.gate = GateStatus::TimedOut {
            missing: vec![GateInput::Node, GateInput::EndpointSlices],
            waited: Duration::from_secs(31),
        };
        inputs.sync = SyncReport::NotYet;
        inputs.acted_generation = None;
        let status = compute_status(&inputs, &[], at(40));
        let ready = condition(&status, condition_types::READY);
        assert_eq!(ready.status, ConditionStatus::False);
        assert_eq!(ready.reason, reasons::HOST_METADATA_TIMEOUT);
        assert!(
            ready.message.contains("Node, EndpointSlices"),
            "{}",
            ready.message
        );
        let metadata = condition(&status, condition_types::HOST_METADATA_READY);
        assert_eq!(metadata.reason, reasons::HOST_METADATA_TIMEOUT);
        // A later computation while still waiting is identical: no status write.
        let mut later = inputs.clone();
        later.gate = GateStatus::TimedOut {
            missing: vec![GateInput::Node, GateInput::EndpointSlices],
            waited: Duration::from_secs(95),
        };
        assert_eq!(
            compute_status(&later, &status.conditions, at(100)),
            status,
            "nothing in the status grows while the agent waits"
        );
    }

    #[test]
    fn a_start_is_reported_once_the_gate_opens_or_times_out_not_while_it_waits() {
        assert!(!worth_reporting(&GateStatus::Waiting {
            missing: vec![GateInput::Services]
        }));
        assert!(worth_reporting(&GateStatus::TimedOut {
            missing: vec![GateInput::Services],
            waited: Duration::from_secs(31)
        }));
        assert!(worth_reporting(&GateStatus::Open {
            waited: Duration::from_millis(80)
        }));
    }

    #[test]
    fn waiting_within_the_timeout_is_not_a_timeout() {
        let mut inputs = ready_inputs();
        inputs.gate = GateStatus::Waiting {
            missing: vec![GateInput::HostAddresses],
        };
        inputs.sync = SyncReport::NotYet;
        let status = compute_status(&inputs, &[], at(1));
        let ready = condition(&status, condition_types::READY);
        assert_eq!(ready.reason, reasons::WAITING_FOR_HOST_METADATA);
        assert!(ready.message.contains("host addresses"));
    }

    #[test]
    fn transition_times_change_only_when_a_status_changes() {
        let first = compute_status(&ready_inputs(), &[], at(10));
        let mut inputs = ready_inputs();
        inputs.services_programmed = Some(13);
        let second = compute_status(&inputs, &first.conditions, at(20));
        assert_eq!(
            condition(&second, condition_types::READY).last_transition_time,
            at(10)
        );
        inputs.sync = SyncReport::Failed {
            message: "failed to update map SY_FRONTENDS: map is full".into(),
        };
        let third = compute_status(&inputs, &second.conditions, at(30));
        let ready = condition(&third, condition_types::READY);
        assert_eq!(ready.status, ConditionStatus::False);
        assert_eq!(ready.reason, reasons::SYNC_FAILED);
        assert_eq!(ready.last_transition_time, at(30));
        assert_eq!(
            condition(&third, condition_types::HOST_METADATA_READY).last_transition_time,
            at(10)
        );
    }

    #[test]
    fn draining_reports_live_flows_and_stays_ready_in_kube_proxy_mode() {
        let mut inputs = ready_inputs();
        inputs.mode = DataplaneMode::KubeProxy;
        inputs.attachment = AttachmentReport::Draining;
        inputs.live_flows = Some(7);
        let status = compute_status(&inputs, &[], at(10));
        assert_eq!(status.live_flows, Some(7));
        assert!(condition(&status, condition_types::DRAINING).is_true());
        assert!(condition(&status, condition_types::PROGRAMS_ATTACHED).is_true());
        assert!(condition(&status, condition_types::READY).is_true());

        inputs.attachment = AttachmentReport::Detached;
        inputs.last_drain = Some(DrainEnd::Complete);
        let status = compute_status(&inputs, &status.conditions, at(20));
        let draining = condition(&status, condition_types::DRAINING);
        assert_eq!(draining.status, ConditionStatus::False);
        assert_eq!(draining.reason, reasons::DRAIN_COMPLETE);
        assert!(!condition(&status, condition_types::PROGRAMS_ATTACHED).is_true());
        assert_eq!(status.live_flows, None);
        assert!(condition(&status, condition_types::READY).is_true());
    }

    #[test]
    fn ebpf_mode_without_attached_programs_is_not_ready() {
        let mut inputs = ready_inputs();
        inputs.attachment = AttachmentReport::Detached;
        inputs.attach_error = Some("failed to attach sy_ingress_host to eth0: busy".into());
        let status = compute_status(&inputs, &[], at(10));
        let ready = condition(&status, condition_types::READY);
        assert_eq!(ready.reason, reasons::ATTACH_FAILED);
        let attached = condition(&status, condition_types::PROGRAMS_ATTACHED);
        assert_eq!(attached.status, ConditionStatus::False);
        assert_eq!(attached.reason, reasons::ATTACH_FAILED);
    }

    #[test]
    fn kube_proxy_mode_from_the_start_is_ready_with_nothing_attached() {
        let mut inputs = ready_inputs();
        inputs.mode = DataplaneMode::KubeProxy;
        inputs.attachment = AttachmentReport::Detached;
        let status = compute_status(&inputs, &[], at(10));
        assert!(condition(&status, condition_types::READY).is_true());
        assert_eq!(
            condition(&status, condition_types::DRAINING).reason,
            reasons::DETACHED
        );
    }

    #[test]
    fn a_spec_is_reported_as_observed_once_the_coexistence_loop_has_acted_on_it_too() {
        // The core acted on generation 5; the loop's last round was on 4 (its health ports
        // may still be open): 4 is what was reported, and stays.
        let held = observable_generation(Some(5), CoexistenceProgress::ActedOn(Some(4)), Some(4));
        assert_eq!(held, Some(4));
        // The control: the loop acted on 5.
        let caught_up =
            observable_generation(Some(5), CoexistenceProgress::ActedOn(Some(5)), Some(4));
        assert_eq!(caught_up, Some(5));
        // Before the loop's first round, what the previous process reported stays.
        assert_eq!(
            observable_generation(Some(5), CoexistenceProgress::NoRoundYet, Some(4)),
            Some(4)
        );
        // Without a coexistence loop (standalone) nothing is waited for.
        assert_eq!(
            observable_generation(Some(5), CoexistenceProgress::NoLoop, None),
            Some(5)
        );
    }

    #[test]
    fn a_held_back_generation_never_runs_ahead_of_the_spec_acted_on() {
        // A DataplaneNode recreated (generations start again) while the old one had
        // reported 9: nothing is reported as observed until the loop acts on the new one.
        assert_eq!(
            observable_generation(Some(1), CoexistenceProgress::ActedOn(Some(9)), Some(9)),
            None
        );
        assert_eq!(
            observable_generation(None, CoexistenceProgress::NoRoundYet, Some(3)),
            None
        );
        assert_eq!(
            observable_generation(None, CoexistenceProgress::ActedOn(None), None),
            None
        );
    }

    #[test]
    fn coexistence_reports_are_passed_through_and_foreign_conditions_dropped() {
        let mut inputs = ready_inputs();
        inputs.coexistence = CoexistenceReport {
            rules_present: ConditionValue::new(
                true,
                reasons::KUBE_PROXY_CONFLICT,
                "kube-proxy runs again",
            ),
            chain_order_safe: ConditionValue::new(true, reasons::CHAIN_ORDER_VERIFIED, "first"),
            kube_proxy_healthy: ConditionValue::new(true, reasons::KUBE_PROXY_HEALTHZ_OK, "200"),
            kube_proxy_rules: Some(40),
            progress: CoexistenceProgress::ActedOn(Some(4)),
        };
        let foreign = Condition::new("Foreign", ConditionStatus::True, "X", "", None, at(0));
        let status = compute_status(&inputs, &[foreign], at(10));
        assert_eq!(
            condition(&status, condition_types::KUBE_PROXY_RULES_PRESENT).reason,
            reasons::KUBE_PROXY_CONFLICT
        );
        assert!(condition(&status, condition_types::CHAIN_ORDER_SAFE).is_true());
        assert!(condition(&status, condition_types::KUBE_PROXY_HEALTHY).is_true());
        assert!(find_condition(&status.conditions, "Foreign").is_none());
    }

    #[test]
    fn a_dataplane_node_recreated_under_the_same_name_is_given_the_status_again() {
        let status = compute_status(&ready_inputs(), &[], at(0));
        let mut written = WrittenStatus::default();
        assert!(written.needs_write(Some("first"), &status));
        written = WrittenStatus {
            object_uid: Some("first".into()),
            status: Some(status.clone()),
        };
        assert!(!written.needs_write(Some("first"), &status), "unchanged");
        // Garbage-collected with its Node and recreated: same name, same
        // generation, same status, but a new object without it.
        assert!(written.needs_write(Some("second"), &status));
        let mut changed = status.clone();
        changed.observed_generation = Some(99);
        assert!(written.needs_write(Some("first"), &changed));
    }
}
