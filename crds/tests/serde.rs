//! What the API objects look like to Rust code: defaults for minimal objects, rejected bad
//! values, timestamps the way Kubernetes writes them, conditions that keep their transition time.

use chrono::{DateTime, TimeZone, Utc};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::json;
use switchyard_crds::{
    condition_types, reasons, set_condition, Condition, ConditionStatus, DataplaneConfig,
    DataplaneMode, DataplaneNode, DataplanePhase, IptablesCleanupPolicy, KubeProxyManagement,
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
