//! The DataplaneConfig status a plan publishes.

use chrono::{DateTime, Utc};
use switchyard_crds::{
    condition_types, reasons, Condition, ConditionStatus, DataplaneConfig, DataplaneConfigStatus,
    DataplanePhase, NodeCounts, Transition,
};

use super::{agent_up_to_date, Context, Decision};
use crate::error::Error;

/// Conditions in a fixed order, each keeping the `lastTransitionTime` of the previous status when
/// its status did not change (so the time says when it really changed).
fn conditions(previous: Option<&DataplaneConfigStatus>, new: Vec<Condition>) -> Vec<Condition> {
    new.into_iter()
        .map(|mut condition| {
            let before = previous
                .and_then(|status| {
                    status
                        .conditions
                        .iter()
                        .find(|old| old.type_ == condition.type_)
                })
                .filter(|old| old.status == condition.status);
            if let Some(before) = before {
                condition.last_transition_time = before.last_transition_time;
            }
            condition
        })
        .collect()
}

fn count(value: usize) -> i32 {
    i32::try_from(value).unwrap_or(i32::MAX)
}

/// The status of a DataplaneConfig the plan acted on.
pub(crate) fn build(
    config: &DataplaneConfig,
    context: &Context,
    decision: &Decision,
) -> DataplaneConfigStatus {
    let previous = config.status.as_ref();
    let generation = config.metadata.generation;
    let now = context.now;
    let paused = context.settings.paused;

    let phase = if paused {
        DataplanePhase::Paused
    } else {
        decision.phase
    };
    let message = if paused {
        format!(
            "paused by spec.paused during {}: {}",
            decision.phase, decision.message
        )
    } else {
        decision.message.clone()
    };

    // Each condition as (status, reason, message).
    let ready = if decision.mode_in_place {
        let message = format!("every node is in mode {}", context.settings.mode);
        (ConditionStatus::True, reasons::TRANSITION_COMPLETE, message)
    } else {
        (
            ConditionStatus::False,
            decision.reason,
            decision.message.clone(),
        )
    };
    let under_way =
        decision.phase == DataplanePhase::Preflight || super::switches_nodes(decision.phase);
    let progressing = if paused {
        (ConditionStatus::False, reasons::PAUSED, message.clone())
    } else {
        let status = ConditionStatus::from_bool(under_way);
        (status, decision.reason, decision.message.clone())
    };
    let degraded = match &decision.degraded {
        Some((reason, text)) => (ConditionStatus::True, *reason, text.clone()),
        None => (ConditionStatus::False, reasons::AS_EXPECTED, String::new()),
    };
    let services_supported = super::parity::services_condition(
        &context.unsupported_services,
        context.ebpf_serves_some_node,
    );
    let new = [
        (condition_types::READY, ready),
        (condition_types::PROGRESSING, progressing),
        (condition_types::DEGRADED, degraded),
        (condition_types::SERVICES_SUPPORTED, services_supported),
    ]
    .into_iter()
    .map(|(type_, (status, reason, message))| {
        Condition::new(type_, status, reason, message, generation, now)
    })
    .collect();

    let facts = context.facts;
    let update_revision = context
        .observed
        .agent_daemon_set
        .as_ref()
        .and_then(|set| set.update_revision.as_deref());
    let serving = facts.iter().filter(|node| node.serving_from_ebpf()).count();
    let nodes = NodeCounts {
        total: count(facts.len()),
        serving: count(serving),
        kube_proxy_running: count(
            facts
                .iter()
                .filter(|node| {
                    node.kube_proxy_pod
                        .is_some_and(|pod| pod.ready && !pod.terminating)
                })
                .count(),
        ),
        rules_cleaned: count(facts.iter().filter(|node| node.rules_cleaned()).count()),
        agent_up_to_date: count(
            facts
                .iter()
                .filter(|node| match update_revision {
                    Some(revision) => agent_up_to_date(node, revision),
                    None => node.agent_ready(),
                })
                .count(),
        ),
        failed: count(context.failed.iter().filter(|failed| **failed).count()),
        draining: count(facts.iter().filter(|node| node.draining()).count()),
    };

    DataplaneConfigStatus {
        observed_generation: generation,
        phase,
        conditions: conditions(previous, new),
        nodes,
        serving_summary: Some(format!("{serving}/{}", facts.len())),
        transition: transition(previous, context, decision.mode_in_place, now),
        message: Some(message),
        // New evidence, or what was recorded under this spec (kept until the spec changes).
        budget_exceeded: decision
            .budget_exceeded
            .clone()
            .or_else(|| context.recorded_budget_exceeded.cloned()),
    }
}

/// The transition the cluster is in (or last finished), carried over from the previous status
/// so that `startedAt` survives operator restarts.
fn transition(
    previous: Option<&DataplaneConfigStatus>,
    context: &Context,
    mode_in_place: bool,
    now: DateTime<Utc>,
) -> Option<Transition> {
    let target = context.settings.mode;
    let finished_now = mode_in_place.then_some(now);
    match previous.and_then(|status| status.transition.as_ref()) {
        Some(last) if last.to == target => Some(Transition {
            finished_at: last.finished_at.or(finished_now),
            ..last.clone()
        }),
        Some(last) => Some(Transition {
            from: last.to,
            to: target,
            started_at: now,
            finished_at: finished_now,
        }),
        // Already in the requested mode when first seen: no transition happened.
        None if mode_in_place => None,
        None => Some(Transition {
            from: target.opposite(),
            to: target,
            started_at: now,
            finished_at: None,
        }),
    }
}

/// The status of a DataplaneConfig not named `default`: ignored, and saying so.
pub(crate) fn ignored(config: &DataplaneConfig, now: DateTime<Utc>) -> DataplaneConfigStatus {
    let previous = config.status.as_ref();
    let generation = config.metadata.generation;
    let message = format!(
        "ignored: the operator acts only on the DataplaneConfig named {:?}; delete this one or name it so",
        switchyard_crds::DEFAULT_CONFIG_NAME
    );
    let new = [
        (condition_types::READY, ConditionStatus::False),
        (condition_types::PROGRESSING, ConditionStatus::False),
        (condition_types::DEGRADED, ConditionStatus::True),
    ]
    .into_iter()
    .map(|(type_, status)| {
        Condition::new(
            type_,
            status,
            reasons::NOT_DEFAULT,
            message.clone(),
            generation,
            now,
        )
    })
    .collect();
    DataplaneConfigStatus {
        observed_generation: generation,
        phase: DataplanePhase::Pending,
        conditions: conditions(previous, new),
        nodes: NodeCounts::default(),
        serving_summary: None,
        transition: None,
        message: Some(message),
        budget_exceeded: None,
    }
}

/// The status of a DataplaneConfig whose spec cannot be acted on: nothing changes until the spec
/// does; the previous phase, counts and transition stay as they were.
pub(crate) fn invalid_spec(
    config: &DataplaneConfig,
    error: &Error,
    now: DateTime<Utc>,
) -> DataplaneConfigStatus {
    let previous = config.status.clone().unwrap_or_default();
    let generation = config.metadata.generation;
    let message = format!("{error}; nothing changes until the spec is fixed");
    let ready = previous
        .conditions
        .iter()
        .find(|condition| condition.type_ == condition_types::READY)
        .cloned()
        .unwrap_or_else(|| {
            Condition::new(
                condition_types::READY,
                ConditionStatus::Unknown,
                reasons::INVALID_SPEC,
                message.clone(),
                generation,
                now,
            )
        });
    let new = vec![
        ready,
        Condition::new(
            condition_types::PROGRESSING,
            ConditionStatus::False,
            reasons::INVALID_SPEC,
            message.clone(),
            generation,
            now,
        ),
        Condition::new(
            condition_types::DEGRADED,
            ConditionStatus::True,
            reasons::INVALID_SPEC,
            message.clone(),
            generation,
            now,
        ),
    ];
    DataplaneConfigStatus {
        observed_generation: generation,
        conditions: conditions(Some(&previous), new),
        message: Some(message),
        ..previous
    }
}
