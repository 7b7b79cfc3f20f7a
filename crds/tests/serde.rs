//! What the API objects look like to Rust code: defaults for minimal objects, rejected bad
//! values, timestamps the way Kubernetes writes them, conditions that keep their transition time.

use chrono::{DateTime, TimeZone, Utc};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::json;
use switchyard_crds::{
    condition_types, reasons, set_condition, BudgetExceededAction, CanarySpec, Condition,
    ConditionStatus, DataplaneConfig, DataplaneMode, DataplaneNode, DataplanePhase,
    DisruptionBudget, IptablesCleanupPolicy, KubeProxyManagement,
};

fn time(seconds: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(1_800_000_000 + seconds, 0)
        .single()
        .expect("a valid time")
}

#[test]
fn a_minimal_dataplane_config_gets_every_default() {
    let config: DataplaneConfig = serde_json::from_value(json!({
        "apiVersion": "switchyard.dev/v1alpha1",
        "kind": "DataplaneConfig",
        "metadata": { "name": "default" },
        "spec": { "mode": "Ebpf" }
    }))
    .expect("a minimal DataplaneConfig deserializes");
    let spec = &config.spec;
    assert_eq!(spec.mode, DataplaneMode::Ebpf);
    assert!(!spec.paused);
    assert_eq!(spec.kube_proxy.management, KubeProxyManagement::Managed);
    assert_eq!(spec.kube_proxy.namespace, "kube-system");
    assert_eq!(spec.kube_proxy.daemon_set_name, "kube-proxy");
    assert_eq!(spec.iptables_cleanup, IptablesCleanupPolicy::Auto);
    assert_eq!(spec.rollout.max_unavailable, IntOrString::Int(1));
    assert_eq!(spec.rollout.node_ready_timeout_seconds, 300);
    assert_eq!(spec.rollout.max_failed_nodes, 0);
    assert_eq!(spec.rollout.drain_timeout_seconds, 600);
    assert!(config.status.is_none());
}

#[test]
fn a_dataplane_config_written_before_canaries_existed_gets_no_canary_and_the_budget_defaults() {
    let config: DataplaneConfig = serde_json::from_value(json!({
        "apiVersion": "switchyard.dev/v1alpha1",
        "kind": "DataplaneConfig",
        "metadata": { "name": "default" },
        "spec": { "mode": "Ebpf", "rollout": { "maxUnavailable": 2 } }
    }))
    .expect("an older DataplaneConfig deserializes");
    let rollout = &config.spec.rollout;
    assert_eq!(rollout.canary, None, "the canary is opt-in");
    assert_eq!(rollout.disruption_budget, DisruptionBudget::default());
    assert_eq!(rollout.disruption_budget.failed_connects_per_minute, 30);
    assert_eq!(rollout.disruption_budget.failed_connects_percent, 100);
    assert_eq!(rollout.disruption_budget.resets_per_minute, 30);
    assert_eq!(rollout.disruption_budget.resets_percent, 100);
    assert_eq!(rollout.disruption_budget.probe_failures_per_minute, 6);
    assert_eq!(rollout.on_budget_exceeded, BudgetExceededAction::Rollback);
    assert_eq!(
        rollout.max_unavailable,
        IntOrString::Int(2),
        "the fields it had are kept"
    );
}

#[test]
fn a_canary_given_as_an_empty_object_is_one_node_soaking_a_minute() {
    let config: DataplaneConfig = serde_json::from_value(json!({
        "apiVersion": "switchyard.dev/v1alpha1",
        "kind": "DataplaneConfig",
        "metadata": { "name": "default" },
        "spec": { "mode": "Ebpf", "rollout": { "canary": {} } }
    }))
    .expect("a DataplaneConfig with an empty canary deserializes");
    let canary = config
        .spec
        .rollout
        .canary
        .expect("an empty canary is a canary");
    assert_eq!(canary, CanarySpec::default());
    assert_eq!(canary.count, None, "absent: one node");
    assert_eq!(canary.node_selector, None);
    assert_eq!(canary.soak_seconds, 60);
    assert_eq!(
        canary.batch_soak_seconds, None,
        "absent: a third of the soak"
    );
}

#[test]
fn a_spec_without_a_canary_is_written_without_one() {
    let config: DataplaneConfig = serde_json::from_value(json!({
        "apiVersion": "switchyard.dev/v1alpha1",
        "kind": "DataplaneConfig",
        "metadata": { "name": "default" },
        "spec": { "mode": "Ebpf" }
    }))
    .expect("a minimal DataplaneConfig deserializes");
    let written = serde_json::to_value(&config).expect("serializes");
    assert!(
        written["spec"]["rollout"].get("canary").is_none(),
        "no canary written: {written}"
    );
    // Control: a canary given is written back.
    let mut with_canary = config;
    with_canary.spec.rollout.canary = Some(CanarySpec::default());
    let written = serde_json::to_value(&with_canary).expect("serializes");
    assert_eq!(written["spec"]["rollout"]["canary"]["soakSeconds"], 60);
}

#[test]
fn canary_budget_and_action_fields_are_read_as_written_and_an_unknown_action_is_rejected() {
    let read = |rollout: serde_json::Value| {
        serde_json::from_value::<DataplaneConfig>(json!({
            "apiVersion": "switchyard.dev/v1alpha1",
            "kind": "DataplaneConfig",
            "metadata": { "name": "default" },
            "spec": { "mode": "Ebpf", "rollout": rollout }
        }))
    };
    let config = read(json!({
        "canary": { "nodeSelector": { "switchyard.dev/canary": "true" }, "soakSeconds": 300, "batchSoakSeconds": 30 },
        "disruptionBudget": { "failedConnectsPerMinute": 5 },
        "onBudgetExceeded": "Halt"
    }))
    .expect("deserializes");
    let rollout = &config.spec.rollout;
    let canary = rollout.canary.as_ref().expect("the canary given");
    assert_eq!(
        canary
            .node_selector
            .as_ref()
            .and_then(|labels| labels.get("switchyard.dev/canary"))
            .map(String::as_str),
        Some("true")
    );
    assert_eq!(canary.soak_seconds, 300);
    assert_eq!(canary.batch_soak_seconds, Some(30));
    assert_eq!(rollout.disruption_budget.failed_connects_per_minute, 5);
    assert_eq!(
        rollout.disruption_budget.resets_per_minute, 30,
        "the rest defaulted"
    );
    assert_eq!(rollout.on_budget_exceeded, BudgetExceededAction::Halt);
    assert!(read(json!({ "onBudgetExceeded": "Ignore" })).is_err());
    assert!(
        read(json!({ "onBudgetExceeded": "Rollback" })).is_ok(),
        "control: a known action is read"
    );
}

#[test]
fn a_partly_filled_nested_object_keeps_its_values_and_defaults_the_rest() {
    let config: DataplaneConfig = serde_json::from_value(json!({
        "apiVersion": "switchyard.dev/v1alpha1",
        "kind": "DataplaneConfig",
        "metadata": { "name": "default" },
        "spec": {
            "mode": "KubeProxy",
            "kubeProxy": { "management": "External" },
            "rollout": { "maxUnavailable": "25%" }
        }
    }))
    .expect("deserializes");
    assert_eq!(
        config.spec.kube_proxy.management,
        KubeProxyManagement::External
    );
    assert_eq!(config.spec.kube_proxy.namespace, "kube-system");
    assert_eq!(
        config.spec.rollout.max_unavailable,
        IntOrString::String("25%".into())
    );
    assert_eq!(config.spec.rollout.node_ready_timeout_seconds, 300);
}

#[test]
fn a_minimal_dataplane_node_gets_every_default() {
    let node: DataplaneNode = serde_json::from_value(json!({
        "apiVersion": "switchyard.dev/v1alpha1",
        "kind": "DataplaneNode",
        "metadata": { "name": "node-1" },
        "spec": { "mode": "KubeProxy" }
    }))
    .expect("a minimal DataplaneNode deserializes");
    assert_eq!(node.spec.mode, DataplaneMode::KubeProxy);
    assert!(!node.spec.iptables_cleanup);
    assert_eq!(node.spec.requested_at, None);
    assert_eq!(node.spec.drain_timeout_seconds, 600);
}

#[test]
fn an_unknown_mode_is_rejected() {
    for bad in ["ebpf", "IPVS", "", "Kubeproxy"] {
        let result = serde_json::from_value::<DataplaneConfig>(json!({
            "apiVersion": "switchyard.dev/v1alpha1",
            "kind": "DataplaneConfig",
            "metadata": { "name": "default" },
            "spec": { "mode": bad }
        }));
        assert!(result.is_err(), "mode {bad:?} must be rejected");
    }
}

#[test]
fn a_missing_mode_is_rejected() {
    let result = serde_json::from_value::<DataplaneNode>(json!({
        "apiVersion": "switchyard.dev/v1alpha1",
        "kind": "DataplaneNode",
        "metadata": { "name": "node-1" },
        "spec": {}
    }));
    assert!(result.is_err());
}

#[test]
fn unknown_management_cleanup_policy_phase_and_condition_status_are_rejected() {
    let base = |spec: serde_json::Value| {
        serde_json::from_value::<DataplaneConfig>(json!({
            "apiVersion": "switchyard.dev/v1alpha1",
            "kind": "DataplaneConfig",
            "metadata": { "name": "default" },
            "spec": spec
        }))
    };
    assert!(base(json!({ "mode": "Ebpf", "kubeProxy": { "management": "Helm" } })).is_err());
    assert!(base(json!({ "mode": "Ebpf", "iptablesCleanup": "Always" })).is_err());
    assert!(serde_json::from_value::<DataplanePhase>(json!("Done")).is_err());
    assert!(serde_json::from_value::<ConditionStatus>(json!("true")).is_err());
}

#[test]
fn timestamps_are_written_in_whole_seconds_like_kubernetes_writes_them() {
    let precise = Utc
        .timestamp_opt(1_800_000_000, 123_456_789)
        .single()
        .expect("a valid time");
    let condition = Condition::new(
        condition_types::READY,
        ConditionStatus::True,
        reasons::AS_EXPECTED,
        "",
        Some(3),
        precise,
    );
    let written = serde_json::to_value(&condition).expect("serializes");
    assert_eq!(written["lastTransitionTime"], "2027-01-15T08:00:00Z");
    assert_eq!(written["type"], "Ready");
    assert_eq!(written["status"], "True");
    assert_eq!(written["observedGeneration"], 3);
    let read: Condition = serde_json::from_value(written).expect("reads back");
    assert_eq!(read.last_transition_time, time(0));
}

#[test]
fn any_rfc3339_time_is_read() {
    let node: DataplaneNode = serde_json::from_value(json!({
        "apiVersion": "switchyard.dev/v1alpha1",
        "kind": "DataplaneNode",
        "metadata": { "name": "node-1" },
        "spec": { "mode": "Ebpf", "requestedAt": "2027-01-15T09:00:00.5+01:00" }
    }))
    .expect("deserializes");
    assert_eq!(
        node.spec.requested_at.map(|at| at.timestamp()),
        Some(time(0).timestamp())
    );
}

#[test]
fn setting_a_condition_with_an_unchanged_status_keeps_its_transition_time() {
    let mut conditions = vec![Condition::new(
        "Ready",
        ConditionStatus::True,
        "AsExpected",
        "",
        Some(1),
        time(0),
    )];
    set_condition(
        &mut conditions,
        Condition::new(
            "Ready",
            ConditionStatus::True,
            "AsExpected",
            "still",
            Some(2),
            time(60),
        ),
    );
    assert_eq!(conditions.len(), 1);
    assert_eq!(conditions[0].last_transition_time, time(0));
    assert_eq!(conditions[0].message, "still");
    assert_eq!(conditions[0].observed_generation, Some(2));
}

#[test]
fn setting_a_condition_with_a_new_status_moves_its_transition_time() {
    let mut conditions = vec![Condition::new(
        "Ready",
        ConditionStatus::True,
        "AsExpected",
        "",
        Some(1),
        time(0),
    )];
    set_condition(
        &mut conditions,
        Condition::new(
            "Ready",
            ConditionStatus::False,
            "NodesFailed",
            "",
            Some(1),
            time(60),
        ),
    );
    set_condition(
        &mut conditions,
        Condition::new(
            "Degraded",
            ConditionStatus::True,
            "NodesFailed",
            "",
            Some(1),
            time(60),
        ),
    );
    assert_eq!(conditions.len(), 2);
    assert_eq!(conditions[0].last_transition_time, time(60));
    assert_eq!(conditions[0].status, ConditionStatus::False);
}

#[test]
fn reasons_are_valid_condition_reasons() {
    let pattern_holds = |reason: &str| {
        let mut characters = reason.chars();
        characters
            .next()
            .is_some_and(|first| first.is_ascii_alphabetic())
            && reason
                .chars()
                .all(|character| character.is_ascii_alphanumeric() || "_,:".contains(character))
            && !reason.ends_with([',', ':'])
    };
    for reason in [
        reasons::HOST_METADATA_TIMEOUT,
        reasons::UNSUPPORTED_KUBE_PROXY_MODE,
        reasons::KUBE_PROXY_CONFLICT,
        reasons::KUBE_PROXY_MANAGED_EXTERNALLY,
        reasons::NOT_DEFAULT,
        reasons::NODES_FAILED,
        reasons::DRAIN_TIMEOUT_EXPIRED,
        reasons::DISRUPTION_BUDGET_EXCEEDED,
        reasons::DISRUPTION_SIGNALS_MISSING,
        reasons::CANARY_NODES_NOT_FOUND,
    ] {
        assert!(pattern_holds(reason), "{reason}");
    }
    assert_eq!(reasons::HOST_METADATA_TIMEOUT, "HostMetadataTimeout");
    assert_eq!(
        reasons::UNSUPPORTED_KUBE_PROXY_MODE,
        "UnsupportedKubeProxyMode"
    );
    assert_eq!(reasons::KUBE_PROXY_CONFLICT, "KubeProxyConflict");
    assert_eq!(
        reasons::KUBE_PROXY_MANAGED_EXTERNALLY,
        "KubeProxyManagedExternally"
    );
}

#[test]
fn a_full_status_round_trips() {
    let node: DataplaneNode = serde_json::from_value(json!({
        "apiVersion": "switchyard.dev/v1alpha1",
        "kind": "DataplaneNode",
        "metadata": { "name": "node-1", "generation": 4 },
        "spec": { "mode": "Ebpf", "iptablesCleanup": true, "requestedAt": "2027-01-15T08:00:00Z", "drainTimeoutSeconds": 30 },
        "status": {
            "observedGeneration": 4,
            "agentVersion": "0.1.0",
            "agentRevision": "6d5f7c",
            "servicesProgrammed": 12,
            "liveFlows": 0,
            "lastSyncTime": "2027-01-15T08:00:00Z",
            "conditions": [
                { "type": "Ready", "status": "True", "reason": "AgentReady", "message": "", "lastTransitionTime": "2027-01-15T08:00:00Z", "observedGeneration": 4 },
                { "type": "Draining", "status": "False", "reason": "DrainComplete", "lastTransitionTime": "2027-01-15T08:00:00Z" }
            ]
        }
    }))
    .expect("deserializes");
    let status = node.status.as_ref().expect("has a status");
    assert!(status.condition_is_true(condition_types::READY));
    assert!(!status.condition_is_true(condition_types::DRAINING));
    assert_eq!(status.conditions[1].message, "");
    let null_message: Condition = serde_json::from_value(json!({
        "type": "Ready", "status": "True", "reason": "AgentReady", "message": null,
        "lastTransitionTime": "2027-01-15T08:00:00Z"
    }))
    .expect("a null message reads as empty");
    assert_eq!(null_message.message, "");
    let again: DataplaneNode =
        serde_json::from_value(serde_json::to_value(&node).expect("serializes"))
            .expect("reads back");
    assert_eq!(again, node);
}

#[test]
fn a_node_status_with_disruption_signals_round_trips_and_one_without_them_reads_as_not_measured() {
    let node: DataplaneNode = serde_json::from_value(json!({
        "apiVersion": "switchyard.dev/v1alpha1",
        "kind": "DataplaneNode",
        "metadata": { "name": "node-1", "generation": 2 },
        "spec": { "mode": "Ebpf" },
        "status": {
            "observedGeneration": 2,
            "disruption": {
                "baseline": {
                    "start": "2027-01-15T07:50:00Z", "end": "2027-01-15T08:00:00Z",
                    "connections": { "failedConnects": 3, "resetsByPeer": 1, "synRetransmits": 9 },
                    "expected": { "refusedWithoutReadyEndpoints": 40 }
                },
                "current": {
                    "start": "2027-01-15T08:00:05Z", "end": "2027-01-15T08:01:05Z",
                    "datapath": { "translationErrors": 0, "refusedWithEndpointsReadyElsewhere": 2, "conntrackOverflows": 0, "fragmentsWithoutFirst": 0 },
                    "expected": { "refusedWithoutReadyEndpoints": 4, "sourceRangeDrops": 12 },
                    "connections": { "failedConnects": 120 },
                    "probes": { "sent": 60, "failures": 7 },
                    "services": [ { "namespace": "shop", "name": "cart", "failedConnects": 118 } ]
                }
            }
        }
    }))
    .expect("deserializes");
    let disruption = node
        .status
        .as_ref()
        .and_then(|status| status.disruption.as_ref())
        .expect("the disruption report is read");
    let current = disruption.current.as_ref().expect("a current window");
    assert_eq!(current.connections.failed_connects, Some(120));
    assert_eq!(
        current.connections.resets_by_peer, None,
        "not measured: absent"
    );
    assert_eq!(current.expected.source_range_drops, Some(12));
    assert_eq!(current.services[0].name, "cart");
    assert_eq!(
        disruption.baseline.as_ref().map(|baseline| baseline.end),
        Some(
            DateTime::parse_from_rfc3339("2027-01-15T08:00:00Z")
                .expect("a time")
                .with_timezone(&Utc)
        )
    );
    let again: DataplaneNode =
        serde_json::from_value(serde_json::to_value(&node).expect("serializes"))
            .expect("reads back");
    assert_eq!(again, node);

    let silent: DataplaneNode = serde_json::from_value(json!({
        "apiVersion": "switchyard.dev/v1alpha1",
        "kind": "DataplaneNode",
        "metadata": { "name": "node-2" },
        "spec": { "mode": "Ebpf" },
        "status": { "observedGeneration": 1 }
    }))
    .expect("an agent that measures nothing reports a valid status");
    assert_eq!(silent.status.and_then(|status| status.disruption), None);
}
