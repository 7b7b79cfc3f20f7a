//! The texts of the Events about a plan's steps and refusals: what the operator did, worded
//! for `kubectl get events`. Pure: the reconcile records them (see [`crate::controller`]).

use switchyard_crds::{
    condition_types, find_condition, reasons, BudgetExceededAction, ConditionStatus,
    DataplaneConfigStatus,
};

use super::Occurrence;
use crate::kube_proxy;
use crate::planner::{
    AgentPodDeletion, DataplaneNodeWrite, KubeProxyAction, Plan, UnsupportedService,
};

/// The Events a plan's steps deserve (at most one per kind of step).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Steps {
    pub dataplane_nodes: Option<Occurrence>,
    pub kube_proxy: Option<Occurrence>,
    pub agent_pods: Option<Occurrence>,
    pub phase: Option<Occurrence>,
    /// The disruption budget exceeded (new evidence): about the DataplaneConfig and each Node
    /// in [`Steps::budget_nodes`].
    pub budget: Option<Occurrence>,
    /// The nodes named in the new evidence, in order, once each.
    pub budget_nodes: Vec<String>,
}

/// Describes what the plan does, for Events. Pure.
pub fn steps_of(previous: Option<&DataplaneConfigStatus>, plan: &Plan) -> Steps {
    Steps {
        dataplane_nodes: dataplane_nodes_step(&plan.dataplane_nodes),
        kube_proxy: kube_proxy_step(plan.kube_proxy, plan.status.as_ref()),
        agent_pods: agent_pods_step(&plan.agent_pods_to_delete),
        phase: plan
            .status
            .as_ref()
            .and_then(|status| phase_step(previous, status)),
        budget: plan
            .status
            .as_ref()
            .and_then(|status| budget_step(previous, status)),
        budget_nodes: plan
            .status
            .as_ref()
            .filter(|status| budget_step(previous, status).is_some())
            .and_then(|status| status.budget_exceeded.as_ref())
            .map(|record| {
                let mut nodes: Vec<String> = Vec::new();
                for piece in &record.evidence {
                    if !nodes.contains(&piece.node) {
                        nodes.push(piece.node.clone());
                    }
                }
                nodes
            })
            .unwrap_or_default(),
    }
}

/// The Warning Event about the disruption budget exceeded, when `status` records evidence the
/// previous status did not have.
fn budget_step(
    previous: Option<&DataplaneConfigStatus>,
    status: &DataplaneConfigStatus,
) -> Option<Occurrence> {
    let record = status.budget_exceeded.as_ref()?;
    if previous.and_then(|previous| previous.budget_exceeded.as_ref()) == Some(record) {
        return None;
    }
    let outcome = match record.action {
        BudgetExceededAction::Rollback => {
            "the nodes over budget go back to kube-proxy; the transition starts again when the spec changes"
        }
        BudgetExceededAction::Halt => {
            "the transition holds until the nodes are back within budget"
        }
    };
    Some(Occurrence::warning(
        reasons::DISRUPTION_BUDGET_EXCEEDED,
        &record.action.to_string(),
        format!(
            "{}: {outcome}",
            crate::planner::describe_evidence(&record.evidence)
        ),
    ))
}

/// The Event about the kube-proxy DaemonSet disabled (again, when it came back) or restored.
fn kube_proxy_step(
    action: KubeProxyAction,
    status: Option<&DataplaneConfigStatus>,
) -> Option<Occurrence> {
    let status_message = status.and_then(|status| status.message.as_deref());
    let returned = status.is_some_and(|status| {
        status
            .conditions
            .iter()
            .any(|condition| condition.reason == reasons::KUBE_PROXY_RETURNED)
    });
    match action {
        KubeProxyAction::None => None,
        KubeProxyAction::Disable => Some(Occurrence::normal(
            if returned { "KubeProxyDisabledAgain" } else { "KubeProxyDisabled" },
            "DisableKubeProxy",
            format!(
                "added nodeSelector {}={} to the kube-proxy DaemonSet (previous selector recorded in {}){}",
                kube_proxy::DISABLED_SELECTOR_KEY,
                kube_proxy::DISABLED_SELECTOR_VALUE,
                kube_proxy::PREVIOUS_SELECTOR_ANNOTATION,
                status_message.map(|message| format!(": {message}")).unwrap_or_default()
            ),
        )),
        KubeProxyAction::Restore => Some(Occurrence::normal(
            "KubeProxyRestored",
            "RestoreKubeProxy",
            "put back the kube-proxy DaemonSet's nodeSelector exactly as it was before Switchyard disabled it",
        )),
    }
}

/// The Event about agent pods deleted for an upgrade, if any.
fn agent_pods_step(deletions: &[AgentPodDeletion]) -> Option<Occurrence> {
    if deletions.is_empty() {
        return None;
    }
    let pods: Vec<String> = deletions
        .iter()
        .map(
            |AgentPodDeletion {
                 node_name,
                 pod_name,
             }| format!("{pod_name} on {node_name}"),
        )
        .collect();
    Some(Occurrence::normal(
        "AgentPodsDeleted",
        "UpgradeAgents",
        format!(
            "deleted agent pods so that the DaemonSet recreates them at its update revision: {}",
            pods.join(", ")
        ),
    ))
}

/// The Event about a new phase, if `status` changes it.
fn phase_step(
    previous: Option<&DataplaneConfigStatus>,
    status: &DataplaneConfigStatus,
) -> Option<Occurrence> {
    let previous_phase = previous.map(|previous| previous.phase);
    if previous_phase == Some(status.phase) {
        return None;
    }
    let from = previous_phase.map_or_else(|| "none".to_owned(), |phase| phase.to_string());
    let message = status
        .message
        .as_deref()
        .map(|message| format!(": {message}"))
        .unwrap_or_default();
    Some(Occurrence::normal(
        "PhaseChanged",
        "Plan",
        format!("phase {from} -> {}{message}", status.phase),
    ))
}

/// The Event about the DataplaneNodes written, created and told something new, if any.
fn dataplane_nodes_step(writes: &[DataplaneNodeWrite]) -> Option<Occurrence> {
    let (created, updated): (Vec<&DataplaneNodeWrite>, Vec<&DataplaneNodeWrite>) =
        writes.iter().partition(|write| write.create);
    let described = |writes: &[&DataplaneNodeWrite]| {
        let described: Vec<String> = writes.iter().map(|write| describe_write(write)).collect();
        described.join(", ")
    };
    let mut parts = Vec::new();
    if !created.is_empty() {
        parts.push(format!(
            "created DataplaneNodes for {}",
            described(&created)
        ));
    }
    if !updated.is_empty() {
        parts.push(format!("told {}", described(&updated)));
    }
    let reason = if updated.is_empty() {
        "DataplaneNodesCreated"
    } else {
        "NodesInstructed"
    };
    (!parts.is_empty()).then(|| Occurrence::normal(reason, "ApplyDataplaneNode", parts.join("; ")))
}

fn describe_write(write: &DataplaneNodeWrite) -> String {
    format!(
        "{} (mode {}{})",
        write.node_name,
        write.spec.mode,
        if write.spec.iptables_cleanup {
            ", clean kube-proxy rules"
        } else {
            ""
        }
    )
}

/// A refusal to publish: the `Degraded` condition of `new` when it is `True` and differs (reason
/// or message) from the one in `previous`. Pure.
pub fn refusal(
    previous: Option<&DataplaneConfigStatus>,
    new: &DataplaneConfigStatus,
) -> Option<Occurrence> {
    let degraded = find_condition(&new.conditions, condition_types::DEGRADED)?;
    // The budget's own Event (see `budget_step`) says it once, with the evidence; the message
    // of this condition changes while the nodes go back, which is no new refusal.
    if degraded.status != ConditionStatus::True
        || degraded.reason == reasons::DISRUPTION_BUDGET_EXCEEDED
    {
        return None;
    }
    let before = previous
        .and_then(|previous| find_condition(&previous.conditions, condition_types::DEGRADED));
    let unchanged = before.is_some_and(|before| {
        before.status == ConditionStatus::True
            && before.reason == degraded.reason
            && before.message == degraded.message
    });
    (!unchanged).then(|| Occurrence::warning(&degraded.reason, "Refuse", degraded.message.clone()))
}

/// The reason of the Warning Event on a Service the eBPF datapath does not serve yet.
pub const UNSUPPORTED_BY_DATAPLANE: &str = "UnsupportedByDataplane";

/// The Warning Event on a Service that uses features the eBPF datapath does not serve yet, while
/// eBPF serves some node. Pure.
pub fn unsupported_service(service: &UnsupportedService) -> Occurrence {
    let features: Vec<&str> = service
        .features
        .iter()
        .map(|feature| feature.named())
        .collect();
    Occurrence::warning(
        UNSUPPORTED_BY_DATAPLANE,
        "CheckParity",
        format!(
            "the eBPF datapath does not serve this Service's {} yet; on the nodes eBPF serves, kube-proxy's rules for it are gone or going, so it does not work as kube-proxy served it. \
             Remove those features, or go back to kube-proxy (DataplaneConfig default, spec.mode KubeProxy)",
            features.join(" and ")
        ),
    )
}

/// The Event about one DataplaneNode created without a DataplaneConfig, for its Node. Pure.
pub fn creation(write: &DataplaneNodeWrite) -> Occurrence {
    Occurrence::normal(
        "DataplaneNodeCreated",
        "ApplyDataplaneNode",
        format!("created DataplaneNode {}", describe_write(write)),
    )
}

/// The Event for many DataplaneNodes created at once (node-name order: first and last named).
/// Pure.
pub fn bulk_creation(created: &[&DataplaneNodeWrite]) -> Occurrence {
    let first = created.first().map(|write| write.node_name.as_str());
    let last = created.last().map(|write| write.node_name.as_str());
    let modes: std::collections::BTreeSet<String> = created
        .iter()
        .map(|write| write.spec.mode.to_string())
        .collect();
    Occurrence::normal(
        "DataplaneNodesCreated",
        "ApplyDataplaneNode",
        format!(
            "created {} DataplaneNodes (mode {}) for Nodes {} to {}",
            created.len(),
            modes.into_iter().collect::<Vec<_>>().join(", "),
            first.unwrap_or_default(),
            last.unwrap_or_default()
        ),
    )
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};
    use switchyard_crds::{Condition, DataplaneMode, DataplaneNodeSpec, DataplanePhase};

    use super::*;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-22T01:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    fn write(node: &str, create: bool, mode: DataplaneMode, cleanup: bool) -> DataplaneNodeWrite {
        let mut spec = DataplaneNodeSpec::new(mode);
        spec.iptables_cleanup = cleanup;
        spec.requested_at = Some(now());
        DataplaneNodeWrite {
            node_name: node.into(),
            create,
            spec,
        }
    }

    fn empty_plan() -> Plan {
        Plan {
            dataplane_nodes: Vec::new(),
            kube_proxy: KubeProxyAction::None,
            agent_pods_to_delete: Vec::new(),
            status: None,
            requeue_after: None,
            services_to_warn: Vec::new(),
        }
    }

    fn degraded(reason: &str, message: &str) -> DataplaneConfigStatus {
        DataplaneConfigStatus {
            conditions: vec![Condition::new(
                condition_types::DEGRADED,
                ConditionStatus::True,
                reason,
                message,
                Some(1),
                now(),
            )],
            ..DataplaneConfigStatus::default()
        }
    }

    #[test]
    fn every_kind_of_step_gets_an_event() {
        let mut plan = empty_plan();
        plan.dataplane_nodes = vec![
            write("a", true, DataplaneMode::KubeProxy, false),
            write("b", false, DataplaneMode::Ebpf, true),
        ];
        plan.kube_proxy = KubeProxyAction::Disable;
        plan.agent_pods_to_delete = vec![AgentPodDeletion {
            node_name: "a".into(),
            pod_name: "agent-x".into(),
        }];
        plan.status = Some(DataplaneConfigStatus {
            phase: DataplanePhase::DisablingKubeProxy,
            ..DataplaneConfigStatus::default()
        });
        let previous = DataplaneConfigStatus {
            phase: DataplanePhase::ActivatingNodes,
            ..DataplaneConfigStatus::default()
        };
        let steps = steps_of(Some(&previous), &plan);
        let nodes = steps.dataplane_nodes.unwrap();
        assert!(
            nodes
                .message
                .contains("created DataplaneNodes for a (mode KubeProxy)"),
            "{}",
            nodes.message
        );
        assert!(
            nodes
                .message
                .contains("told b (mode Ebpf, clean kube-proxy rules)"),
            "{}",
            nodes.message
        );
        assert_eq!(steps.kube_proxy.unwrap().reason, "KubeProxyDisabled");
        assert!(steps.agent_pods.unwrap().message.contains("agent-x on a"));
        assert!(steps
            .phase
            .unwrap()
            .message
            .starts_with("phase ActivatingNodes -> DisablingKubeProxy"));
    }

    #[test]
    fn disabling_a_kube_proxy_that_came_back_says_so() {
        let mut plan = empty_plan();
        plan.kube_proxy = KubeProxyAction::Disable;
        plan.status = Some(degraded(
            reasons::KUBE_PROXY_RETURNED,
            "kube-proxy came back",
        ));
        assert_eq!(
            steps_of(None, &plan).kube_proxy.unwrap().reason,
            "KubeProxyDisabledAgain"
        );
    }

    #[test]
    fn an_unchanged_plan_is_no_event() {
        let mut plan = empty_plan();
        let status = DataplaneConfigStatus {
            phase: DataplanePhase::Ready,
            ..DataplaneConfigStatus::default()
        };
        plan.status = Some(status.clone());
        assert_eq!(steps_of(Some(&status), &plan), Steps::default());
    }

    #[test]
    fn a_refusal_is_recorded_when_it_first_appears_or_changes() {
        let refused = degraded(
            reasons::KUBE_PROXY_MANAGED_EXTERNALLY,
            "set management: External",
        );
        let occurrence = refusal(None, &refused).unwrap();
        assert_eq!(occurrence.reason, "KubeProxyManagedExternally");
        assert_eq!(occurrence.type_, crate::events::EventType::Warning);
        assert_eq!(
            refusal(Some(&refused), &refused),
            None,
            "the same refusal is not repeated every reconcile"
        );
        let other = degraded(reasons::API_SERVER_ADDRESS_MISSING, "no address");
        assert_eq!(
            refusal(Some(&refused), &other).unwrap().reason,
            "ApiServerAddressMissing"
        );
        assert_eq!(refusal(None, &DataplaneConfigStatus::default()), None);
    }

    #[test]
    fn many_creations_make_one_event_naming_the_first_and_last_node() {
        let writes = [
            write("node-00000", true, DataplaneMode::KubeProxy, false),
            write("node-00001", true, DataplaneMode::KubeProxy, false),
            write("node-00099", true, DataplaneMode::KubeProxy, false),
        ];
        let created: Vec<&DataplaneNodeWrite> = writes.iter().collect();
        let occurrence = bulk_creation(&created);
        assert_eq!(occurrence.reason, "DataplaneNodesCreated");
        assert_eq!(
            occurrence.message,
            "created 3 DataplaneNodes (mode KubeProxy) for Nodes node-00000 to node-00099"
        );
    }

    fn budget_record(nodes: &[&str]) -> switchyard_crds::BudgetExceeded {
        switchyard_crds::BudgetExceeded {
            observed_generation: 1,
            action: BudgetExceededAction::Rollback,
            detected_at: now(),
            evidence: nodes
                .iter()
                .map(|node| switchyard_crds::DisruptionEvidence {
                    node: (*node).into(),
                    signal: switchyard_crds::BudgetedSignal::FailedConnects,
                    baseline_per_minute: "0.5".into(),
                    observed_per_minute: "42.0".into(),
                    allowed_per_minute: "30.5".into(),
                    services: vec![switchyard_crds::AffectedService {
                        namespace: "shop".into(),
                        name: "cart".into(),
                        count: 40,
                    }],
                })
                .collect(),
        }
    }

    #[test]
    fn new_budget_evidence_gets_one_warning_naming_the_nodes_and_is_not_repeated() {
        let mut plan = empty_plan();
        let mut exceeded = degraded(reasons::DISRUPTION_BUDGET_EXCEEDED, "rolled back");
        exceeded.budget_exceeded = Some(budget_record(&["node-1", "node-1", "node-2"]));
        plan.status = Some(exceeded.clone());

        let steps = steps_of(Some(&DataplaneConfigStatus::default()), &plan);
        let occurrence = steps.budget.expect("new evidence gets an Event");
        assert_eq!(occurrence.type_, crate::events::EventType::Warning);
        assert_eq!(occurrence.reason, reasons::DISRUPTION_BUDGET_EXCEEDED);
        assert_eq!(occurrence.action, "Rollback");
        assert!(
            occurrence.message.contains(
                "node-1: failed connects 0.5 -> 42.0 per minute (allowed 30.5; most affected: shop/cart 40)"
            ) && occurrence.message.contains("starts again when the spec changes"),
            "{}",
            occurrence.message
        );
        assert_eq!(steps.budget_nodes, ["node-1", "node-2"]);
        assert_eq!(
            refusal(None, &exceeded),
            None,
            "no second Warning for the same budget through the Degraded condition"
        );

        let again = steps_of(Some(&exceeded), &plan);
        assert_eq!(again.budget, None, "the same evidence is not repeated");
        assert!(again.budget_nodes.is_empty());
    }
}
