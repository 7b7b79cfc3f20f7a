//! The planner's behaviour, step by step and reversal by reversal, then whole simulated
//! transitions, then properties over generated cluster states (in `tests/properties.rs`).

mod canary;
mod fixtures;
mod parity;
mod properties;

use std::sync::Arc;

use chrono::Duration;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use switchyard_crds::{
    condition_types as types, reasons, ConditionStatus, DataplaneConfig, DataplaneConfigSpec,
    DataplaneMode::{Ebpf, KubeProxy},
    DataplanePhase, IptablesCleanupPolicy, KubeProxyManagement,
};

use super::*;
use fixtures::*;

fn three_kube_proxy_nodes() -> ObservedCluster {
    cluster(vec![
        kube_proxy_node("node-1"),
        kube_proxy_node("node-2"),
        kube_proxy_node("node-3"),
    ])
}

fn ebpf_config() -> DataplaneConfig {
    config(Ebpf)
}

// ---------------------------------------------------------------------------------------------
// Preflight
// ---------------------------------------------------------------------------------------------

#[test]
fn preflight_passes_when_every_agent_is_ready_and_the_first_batch_is_activated_at_once() {
    let plan = plan(Some(&ebpf_config()), &three_kube_proxy_nodes());
    assert_eq!(phase(&plan), DataplanePhase::ActivatingNodes);
    assert_eq!(written_modes(&plan), vec![("node-1", Ebpf)]);
    assert_eq!(plan.kube_proxy, KubeProxyAction::None);
}

#[test]
fn preflight_waits_until_every_agent_reports_ready_for_its_current_generation() {
    let mut cluster = three_kube_proxy_nodes();
    let node = node_mut(&mut cluster, "node-2");
    // The agent's report is about an older spec.
    report(node, Report::following(KubeProxy), Some(0), OLD_REVISION);
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::Preflight);
    assert!(
        plan.dataplane_nodes.is_empty(),
        "no node is activated before preflight passes"
    );
    assert!(message(&plan).contains("node-2"), "{}", message(&plan));
    assert_eq!(
        condition_of(&plan, types::PROGRESSING).reason,
        reasons::PREFLIGHT_FAILED
    );
}

#[test]
fn preflight_waits_for_an_agent_that_reports_not_ready() {
    let mut cluster = three_kube_proxy_nodes();
    let mut not_ready = Report::following(KubeProxy);
    not_ready.ready = false;
    report(
        node_mut(&mut cluster, "node-3"),
        not_ready,
        None,
        OLD_REVISION,
    );
    conditions_changed_at(node_mut(&mut cluster, "node-3"), at(-5));
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::Preflight);
    assert!(message(&plan).contains("node-3"));
    // Not yet past the timeout: waiting is not degraded.
    assert_eq!(
        condition_of(&plan, types::DEGRADED).status,
        ConditionStatus::False
    );
}

#[test]
fn preflight_rejects_a_node_whose_kubelet_is_not_ready() {
    let mut cluster = three_kube_proxy_nodes();
    node_mut(&mut cluster, "node-1").ready = false;
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::Preflight);
    assert!(message(&plan).contains("node-1"));
}

#[test]
fn preflight_creates_missing_dataplane_nodes_in_kube_proxy_mode_and_waits_for_them() {
    let cluster = cluster(vec![kube_proxy_node("node-1"), bare_node("node-2")]);
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::Preflight);
    let write = written(&plan, "node-2").expect("node-2's DataplaneNode is created");
    assert!(write.create);
    assert_eq!(write.spec.mode, KubeProxy);
    assert!(!write.spec.iptables_cleanup);
    assert!(written(&plan, "node-1").is_none());
    assert!(message(&plan).contains("DataplaneNodes being created for node-2"));
}

#[test]
fn preflight_refuses_a_kube_proxy_in_ipvs_mode() {
    let mut cluster = three_kube_proxy_nodes();
    let status = node_mut(&mut cluster, "node-2")
        .dataplane_node
        .as_mut()
        .map(Arc::make_mut)
        .and_then(|node| node.status.as_mut())
        .expect("status");
    let rules = status
        .conditions
        .iter_mut()
        .find(|condition| condition.type_ == types::KUBE_PROXY_RULES_PRESENT)
        .expect("condition");
    rules.reason = reasons::UNSUPPORTED_KUBE_PROXY_MODE.into();
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::Preflight);
    assert!(plan.dataplane_nodes.is_empty());
    let degraded = condition_of(&plan, types::DEGRADED);
    assert_eq!(degraded.status, ConditionStatus::True);
    assert_eq!(degraded.reason, reasons::UNSUPPORTED_KUBE_PROXY_MODE);
    assert!(degraded.message.contains("node-2") && degraded.message.contains("IPVS"));
}

#[test]
fn preflight_refuses_a_managed_kube_proxy_owned_by_another_tool() {
    let mut cluster = three_kube_proxy_nodes();
    cluster
        .kube_proxy_daemon_set
        .as_mut()
        .expect("daemon set")
        .external_owner = Some("argocd.argoproj.io/tracking-id".into());
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::Preflight);
    assert!(plan.dataplane_nodes.is_empty());
    let degraded = condition_of(&plan, types::DEGRADED);
    assert_eq!(degraded.reason, reasons::KUBE_PROXY_MANAGED_EXTERNALLY);
    assert!(
        degraded.message.contains("management to External"),
        "{}",
        degraded.message
    );
}

#[test]
fn preflight_refuses_a_managed_kube_proxy_the_operator_may_not_patch() {
    let mut cluster = three_kube_proxy_nodes();
    cluster
        .kube_proxy_daemon_set
        .as_mut()
        .expect("daemon set")
        .patch_allowed = Some(false);
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::Preflight);
    assert!(plan.dataplane_nodes.is_empty());
    let degraded = condition_of(&plan, types::DEGRADED);
    assert_eq!(degraded.reason, reasons::KUBE_PROXY_NOT_PATCHABLE);
    assert!(
        degraded.message.contains("may not patch") && degraded.message.contains("External"),
        "{}",
        degraded.message
    );
}

#[test]
fn an_unknown_patch_permission_does_not_hold_preflight_and_external_management_needs_none() {
    let mut cluster = three_kube_proxy_nodes();
    cluster
        .kube_proxy_daemon_set
        .as_mut()
        .expect("daemon set")
        .patch_allowed = None;
    let plan_unknown = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan_unknown), DataplanePhase::ActivatingNodes);

    cluster
        .kube_proxy_daemon_set
        .as_mut()
        .expect("daemon set")
        .patch_allowed = Some(false);
    let mut config = ebpf_config();
    config.spec.kube_proxy.management = KubeProxyManagement::External;
    let plan_external = plan(Some(&config), &cluster);
    assert_eq!(phase(&plan_external), DataplanePhase::ActivatingNodes);
}

#[test]
fn an_externally_managed_kube_proxy_owned_by_another_tool_passes_preflight() {
    let mut cluster = three_kube_proxy_nodes();
    cluster
        .kube_proxy_daemon_set
        .as_mut()
        .expect("daemon set")
        .external_owner = Some("argocd.argoproj.io/tracking-id".into());
    let mut config = ebpf_config();
    config.spec.kube_proxy.management = KubeProxyManagement::External;
    let plan = plan(Some(&config), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::ActivatingNodes);
}

#[test]
fn preflight_refuses_without_an_api_server_address_for_the_agents() {
    let mut cluster = three_kube_proxy_nodes();
    cluster.api_server_address_configured = false;
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::Preflight);
    assert_eq!(
        condition_of(&plan, types::DEGRADED).reason,
        reasons::API_SERVER_ADDRESS_MISSING
    );
}

#[test]
fn preflight_says_when_the_kube_proxy_daemon_set_is_already_absent() {
    let mut cluster = three_kube_proxy_nodes();
    cluster.kube_proxy_daemon_set = None;
    node_mut(&mut cluster, "node-1").ready = false;
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::Preflight);
    assert!(
        message(&plan).contains("already absent"),
        "{}",
        message(&plan)
    );
}

#[test]
fn an_already_absent_kube_proxy_daemon_set_is_said_and_does_not_block_activation() {
    let mut cluster = three_kube_proxy_nodes();
    cluster.kube_proxy_daemon_set = None;
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::ActivatingNodes);
    assert!(
        message(&plan).contains("already absent"),
        "{}",
        message(&plan)
    );
}

// ---------------------------------------------------------------------------------------------
// ActivatingNodes
// ---------------------------------------------------------------------------------------------

#[test]
fn activation_switches_at_most_max_unavailable_nodes_at_a_time() {
    let config = with_max_unavailable(ebpf_config(), IntOrString::Int(2));
    let plan = plan(Some(&config), &three_kube_proxy_nodes());
    assert_eq!(
        written_modes(&plan),
        vec![("node-1", Ebpf), ("node-2", Ebpf)]
    );
    assert!(
        message(&plan).contains("1 more node(s) queued"),
        "{}",
        message(&plan)
    );
}

#[test]
fn max_unavailable_as_a_percentage_rounds_up() {
    let config = with_max_unavailable(ebpf_config(), IntOrString::String("34%".into()));
    let plan = plan(Some(&config), &three_kube_proxy_nodes());
    // 34% of 3 nodes is 1.02: two nodes.
    assert_eq!(plan.dataplane_nodes.len(), 2);
    let config = with_max_unavailable(ebpf_config(), IntOrString::String("0%".into()));
    let plan = super::plan(Some(&config), &three_kube_proxy_nodes());
    assert_eq!(
        plan.dataplane_nodes.len(),
        1,
        "at least one node, so the transition can progress"
    );
}

#[test]
fn the_next_batch_waits_until_the_current_one_reports_attached_and_synced() {
    let mut cluster = three_kube_proxy_nodes();
    set_spec(node_mut(&mut cluster, "node-1"), Ebpf, false, at(-5));
    // The agent acknowledged the spec but has not attached yet.
    let mut attaching = Report::following(Ebpf);
    attaching.attached = false;
    report(
        node_mut(&mut cluster, "node-1"),
        attaching,
        None,
        OLD_REVISION,
    );
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::ActivatingNodes);
    assert!(plan.dataplane_nodes.is_empty(), "node-1 is still in flight");
    assert!(
        message(&plan).contains("waiting for node-1"),
        "{}",
        message(&plan)
    );

    report(
        node_mut(&mut cluster, "node-1"),
        Report::following(Ebpf),
        None,
        OLD_REVISION,
    );
    let plan = super::plan(Some(&ebpf_config()), &cluster);
    assert_eq!(written_modes(&plan), vec![("node-2", Ebpf)]);
}

#[test]
fn a_node_counts_as_activated_only_for_the_generation_that_asked_for_it() {
    let mut cluster = three_kube_proxy_nodes();
    let node = node_mut(&mut cluster, "node-1");
    set_spec(node, Ebpf, false, at(-5));
    // A report saying "attached" about the generation before (a stale status) does not count.
    let generation = node
        .dataplane_node
        .as_ref()
        .and_then(|node| node.metadata.generation)
        .expect("generation");
    report(
        node,
        Report::following(Ebpf),
        Some(generation - 1),
        OLD_REVISION,
    );
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert!(plan.dataplane_nodes.is_empty());
    assert_eq!(plan.status.as_ref().expect("status").nodes.serving, 0);
}

#[test]
fn a_node_that_does_not_attach_within_the_timeout_fails_and_halts_the_transition() {
    let mut cluster = three_kube_proxy_nodes();
    set_spec(node_mut(&mut cluster, "node-1"), Ebpf, false, at(-301));
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::Halted);
    assert!(
        plan.dataplane_nodes.is_empty(),
        "no further batch after a failure with maxFailedNodes 0"
    );
    assert_eq!(plan.kube_proxy, KubeProxyAction::None);
    let degraded = condition_of(&plan, types::DEGRADED);
    assert_eq!(degraded.status, ConditionStatus::True);
    assert_eq!(degraded.reason, reasons::NODES_FAILED);
    assert!(degraded.message.contains("node-1"));
    assert!(message(&plan).contains("node-1") && message(&plan).contains("kube-proxy untouched"));
    assert_eq!(plan.status.as_ref().expect("status").nodes.failed, 1);
}

#[test]
fn a_node_within_its_timeout_has_not_failed() {
    let mut cluster = three_kube_proxy_nodes();
    set_spec(node_mut(&mut cluster, "node-1"), Ebpf, false, at(-299));
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::ActivatingNodes);
    assert_eq!(plan.requeue_after, Some(std::time::Duration::from_secs(1)));
}

#[test]
fn failed_nodes_within_max_failed_nodes_let_other_batches_go_on() {
    let mut config = ebpf_config();
    config.spec.rollout.max_failed_nodes = 1;
    let mut cluster = three_kube_proxy_nodes();
    set_spec(node_mut(&mut cluster, "node-1"), Ebpf, false, at(-400));
    let plan = plan(Some(&config), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::ActivatingNodes);
    assert_eq!(
        written_modes(&plan),
        vec![("node-2", Ebpf)],
        "node-1 failed and no longer counts as in flight"
    );
    assert_eq!(
        condition_of(&plan, types::DEGRADED).status,
        ConditionStatus::True
    );
}

#[test]
fn with_failed_nodes_the_transition_halts_before_disabling_kube_proxy() {
    let mut config = ebpf_config();
    config.spec.rollout.max_failed_nodes = 1;
    let mut cluster = cluster(vec![
        kube_proxy_node("node-1"),
        ebpf_node("node-2"),
        ebpf_node("node-3"),
    ]);
    set_spec(node_mut(&mut cluster, "node-1"), Ebpf, false, at(-400));
    let plan = plan(Some(&config), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::Halted);
    assert_eq!(
        plan.kube_proxy,
        KubeProxyAction::None,
        "kube-proxy untouched"
    );
    assert!(message(&plan).contains("node-1"));
    assert!(
        message(&plan).contains("disabling kube-proxy"),
        "{}",
        message(&plan)
    );
}

#[test]
fn more_failures_than_allowed_halt_at_once() {
    let mut config = ebpf_config();
    config.spec.rollout.max_failed_nodes = 1;
    config.spec.rollout.max_unavailable = IntOrString::Int(3);
    let mut cluster = cluster(vec![
        kube_proxy_node("node-1"),
        kube_proxy_node("node-2"),
        kube_proxy_node("node-3"),
        kube_proxy_node("node-4"),
    ]);
    set_spec(node_mut(&mut cluster, "node-1"), Ebpf, false, at(-400));
    set_spec(node_mut(&mut cluster, "node-2"), Ebpf, false, at(-400));
    let plan = plan(Some(&config), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::Halted);
    assert!(plan.dataplane_nodes.is_empty());
    assert!(
        message(&plan).contains("node-1 and node-2"),
        "{}",
        message(&plan)
    );
}

#[test]
fn a_not_ready_node_whose_agent_is_silent_counts_as_failed_after_the_timeout() {
    let mut cluster = cluster(vec![kube_proxy_node("node-1"), ebpf_node("node-2")]);
    let node = node_mut(&mut cluster, "node-1");
    node.ready = false;
    set_spec(node, Ebpf, false, at(-301));
    // The agent never reports on the new spec.
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::Halted);
    assert_eq!(plan.status.as_ref().expect("status").nodes.failed, 1);
}

#[test]
fn a_failed_node_that_recovers_clears_halted_by_itself() {
    let mut cluster = cluster(vec![kube_proxy_node("node-1"), kube_proxy_node("node-2")]);
    set_spec(node_mut(&mut cluster, "node-1"), Ebpf, false, at(-400));
    let halted = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&halted), DataplanePhase::Halted);

    report(
        node_mut(&mut cluster, "node-1"),
        Report::following(Ebpf),
        None,
        OLD_REVISION,
    );
    let mut config = ebpf_config();
    config.status = halted.status.clone();
    let resumed = plan(Some(&config), &cluster);
    assert_eq!(phase(&resumed), DataplanePhase::ActivatingNodes);
    assert_eq!(written_modes(&resumed), vec![("node-2", Ebpf)]);
    assert_eq!(
        condition_of(&resumed, types::DEGRADED).status,
        ConditionStatus::False
    );
}

#[test]
fn a_restarted_agent_gets_the_full_timeout_from_its_pod_start() {
    let mut cluster = three_kube_proxy_nodes();
    let node = node_mut(&mut cluster, "node-1");
    set_spec(node, Ebpf, false, at(-400));
    node.agent_pod = Some(pod("agent-node-1-b", OLD_REVISION, at(-100)));
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(
        phase(&plan),
        DataplanePhase::ActivatingNodes,
        "node-1's agent started 100 s ago"
    );
    assert_eq!(
        plan.requeue_after,
        Some(std::time::Duration::from_secs(200))
    );
}

#[test]
fn a_node_whose_agent_is_not_ready_is_not_activated_but_waited_for() {
    let mut config = with_max_unavailable(ebpf_config(), IntOrString::Int(3));
    config.spec.rollout.max_failed_nodes = 0;
    let mut cluster = cluster(vec![
        ebpf_node("node-1"),
        kube_proxy_node("node-2"),
        kube_proxy_node("node-3"),
    ]);
    let node = node_mut(&mut cluster, "node-2");
    set_spec(node, KubeProxy, false, at(-10));
    let plan = plan(Some(&config), &cluster);
    assert_eq!(written_modes(&plan), vec![("node-3", Ebpf)]);
    assert!(
        message(&plan).contains("waiting for the agent and the Node to be Ready on node-2"),
        "{}",
        message(&plan)
    );
}

// ---------------------------------------------------------------------------------------------
// DisablingKubeProxy
// ---------------------------------------------------------------------------------------------

#[test]
fn kube_proxy_is_disabled_once_every_node_serves_from_ebpf() {
    let cluster = cluster(vec![
        ebpf_node("node-1"),
        ebpf_node("node-2"),
        ebpf_node("node-3"),
    ]);
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::DisablingKubeProxy);
    assert_eq!(plan.kube_proxy, KubeProxyAction::Disable);
    assert!(
        plan.dataplane_nodes.is_empty(),
        "no cleanup while kube-proxy pods are there"
    );
}

#[test]
fn kube_proxy_is_not_disabled_while_one_node_is_not_serving_from_ebpf() {
    let mut cluster = cluster(vec![
        ebpf_node("node-1"),
        ebpf_node("node-2"),
        ebpf_node("node-3"),
    ]);
    let mut detached = Report::following(Ebpf);
    detached.synced = false;
    report(
        node_mut(&mut cluster, "node-3"),
        detached,
        None,
        OLD_REVISION,
    );
    conditions_changed_at(node_mut(&mut cluster, "node-3"), at(-5));
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::ActivatingNodes);
    assert_eq!(plan.kube_proxy, KubeProxyAction::None);
}

#[test]
fn a_node_that_stopped_serving_long_ago_counts_as_failed() {
    let mut cluster = cluster(vec![ebpf_node("node-1"), ebpf_node("node-2")]);
    let mut detached = Report::following(Ebpf);
    detached.synced = false;
    report(
        node_mut(&mut cluster, "node-2"),
        detached,
        None,
        OLD_REVISION,
    );
    conditions_changed_at(node_mut(&mut cluster, "node-2"), at(-301));
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::Halted);
    assert_eq!(plan.kube_proxy, KubeProxyAction::None);
}

#[test]
fn disabling_waits_until_no_kube_proxy_pod_is_left() {
    let mut cluster = cluster(vec![ebpf_node("node-1"), ebpf_node("node-2")]);
    cluster.kube_proxy_daemon_set = Some(disabled_kube_proxy_daemon_set());
    node_mut(&mut cluster, "node-1").kube_proxy_pod = None;
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::DisablingKubeProxy);
    assert_eq!(plan.kube_proxy, KubeProxyAction::None, "already disabled");
    assert!(
        message(&plan).contains("pods left on node-2"),
        "{}",
        message(&plan)
    );
    // node-1's kube-proxy is gone and the DaemonSet schedules nowhere: node-1 may clean already.
    let write = written(&plan, "node-1").expect("node-1 cleans");
    assert!(write.spec.iptables_cleanup);
    assert!(
        written(&plan, "node-2").is_none(),
        "node-2 still runs kube-proxy"
    );
}

#[test]
fn external_management_waits_for_kube_proxy_to_go_without_touching_it() {
    let mut config = ebpf_config();
    config.spec.kube_proxy.management = KubeProxyManagement::External;
    let cluster = cluster(vec![ebpf_node("node-1"), ebpf_node("node-2")]);
    let plan = plan(Some(&config), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::DisablingKubeProxy);
    assert_eq!(plan.kube_proxy, KubeProxyAction::None);
    assert!(
        message(&plan).contains("removed by its owner"),
        "{}",
        message(&plan)
    );
}

#[test]
fn external_management_continues_once_the_owner_deleted_the_daemon_set() {
    let mut config = ebpf_config();
    config.spec.kube_proxy.management = KubeProxyManagement::External;
    let mut cluster = cluster(vec![ebpf_node("node-1"), ebpf_node("node-2")]);
    cluster.kube_proxy_daemon_set = None;
    for node in &mut cluster.nodes {
        node.kube_proxy_pod = None;
    }
    let plan = plan(Some(&config), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::CleaningRules);
    assert!(plan
        .dataplane_nodes
        .iter()
        .all(|write| write.spec.iptables_cleanup));
    assert_eq!(plan.dataplane_nodes.len(), 2);
}

#[test]
fn a_daemon_set_that_schedules_on_no_node_counts_as_gone_once_its_pods_left() {
    let mut config = ebpf_config();
    config.spec.kube_proxy.management = KubeProxyManagement::External;
    let mut cluster = cluster(vec![ebpf_node("node-1")]);
    cluster
        .kube_proxy_daemon_set
        .as_mut()
        .expect("daemon set")
        .desired_number_scheduled = Some(0);
    node_mut(&mut cluster, "node-1").kube_proxy_pod = None;
    let plan = plan(Some(&config), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::CleaningRules);
}

#[test]
fn a_managed_kube_proxy_owned_by_argo_cd_is_refused_with_a_clear_condition() {
    // Owner marks appeared after preflight.
    let mut cluster = cluster(vec![ebpf_node("node-1"), ebpf_node("node-2")]);
    cluster
        .kube_proxy_daemon_set
        .as_mut()
        .expect("daemon set")
        .external_owner = Some("argocd.argoproj.io/tracking-id".into());
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::DisablingKubeProxy);
    assert_eq!(plan.kube_proxy, KubeProxyAction::None);
    let degraded = condition_of(&plan, types::DEGRADED);
    assert_eq!(degraded.reason, reasons::KUBE_PROXY_MANAGED_EXTERNALLY);
    assert!(degraded.message.contains("External"));
}

// ---------------------------------------------------------------------------------------------
// CleaningRules
// ---------------------------------------------------------------------------------------------

#[test]
fn cleanup_is_requested_on_every_node_once_kube_proxy_is_gone() {
    let mut cluster = cluster(vec![ebpf_node("node-1"), ebpf_node("node-2")]);
    cluster.kube_proxy_daemon_set = Some(disabled_kube_proxy_daemon_set());
    for node in &mut cluster.nodes {
        node.kube_proxy_pod = None;
    }
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::CleaningRules);
    assert_eq!(plan.dataplane_nodes.len(), 2);
    for write in &plan.dataplane_nodes {
        assert_eq!(write.spec.mode, Ebpf);
        assert!(write.spec.iptables_cleanup);
    }
}

#[test]
fn cleanup_is_never_requested_while_the_daemon_set_would_still_schedule() {
    // No pod right now (for example, evicted), but the DaemonSet would start one again.
    let mut cluster = cluster(vec![ebpf_node("node-1"), ebpf_node("node-2")]);
    for node in &mut cluster.nodes {
        node.kube_proxy_pod = None;
    }
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::DisablingKubeProxy);
    assert!(plan
        .dataplane_nodes
        .iter()
        .all(|write| !write.spec.iptables_cleanup));
}

#[test]
fn cleaning_is_done_when_every_node_reports_no_kube_proxy_rules() {
    let mut cluster = cluster(vec![cleaned_node("node-1"), cleaned_node("node-2")]);
    cluster.kube_proxy_daemon_set = Some(disabled_kube_proxy_daemon_set());
    let mut still = Report::following(Ebpf);
    still.kube_proxy_healthy = false;
    report(node_mut(&mut cluster, "node-2"), still, None, OLD_REVISION);
    conditions_changed_at(node_mut(&mut cluster, "node-2"), at(-5));
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::CleaningRules);
    assert!(
        message(&plan).contains("node-2") && !message(&plan).contains("node-1"),
        "{}",
        message(&plan)
    );

    let mut still = Report::following(Ebpf);
    still.rules_present = false;
    report(node_mut(&mut cluster, "node-2"), still, None, OLD_REVISION);
    let plan = super::plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::Ready);
    assert_eq!(
        condition_of(&plan, types::READY).status,
        ConditionStatus::True
    );
    assert_eq!(plan.status.as_ref().expect("status").nodes.rules_cleaned, 2);
}

#[test]
fn a_node_that_does_not_clean_in_time_halts_with_its_name() {
    let mut cluster = cluster(vec![cleaned_node("node-1"), cleaned_node("node-2")]);
    cluster.kube_proxy_daemon_set = Some(disabled_kube_proxy_daemon_set());
    let node = node_mut(&mut cluster, "node-2");
    report(node, Report::following(Ebpf), None, OLD_REVISION);
    node.dataplane_node
        .as_mut()
        .map(Arc::make_mut)
        .expect("dpn")
        .spec
        .requested_at = Some(at(-500));
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::Halted);
    assert!(message(&plan).contains("node-2"));
}

#[test]
fn cleanup_disabled_skips_cleaning_rules() {
    let mut config = ebpf_config();
    config.spec.iptables_cleanup = IptablesCleanupPolicy::Disabled;
    let mut cluster = cluster(vec![ebpf_node("node-1"), ebpf_node("node-2")]);
    cluster.kube_proxy_daemon_set = Some(disabled_kube_proxy_daemon_set());
    for node in &mut cluster.nodes {
        node.kube_proxy_pod = None;
    }
    let plan = plan(Some(&config), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::Ready);
    assert!(plan.dataplane_nodes.is_empty());
}

#[test]
fn kube_proxy_coming_back_withdraws_cleanup_and_disables_it_again() {
    // `kubeadm upgrade` reset the nodeSelector while the cluster is on eBPF.
    let mut cluster = cluster(vec![cleaned_node("node-1"), cleaned_node("node-2")]);
    node_mut(&mut cluster, "node-1").kube_proxy_pod =
        Some(pod("kube-proxy-node-1", "kp-2", at(-3)));
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::DisablingKubeProxy);
    assert_eq!(plan.kube_proxy, KubeProxyAction::Disable);
    assert_eq!(
        condition_of(&plan, types::PROGRESSING).reason,
        reasons::KUBE_PROXY_RETURNED
    );
    for write in &plan.dataplane_nodes {
        assert!(
            !write.spec.iptables_cleanup,
            "{} must stop cleaning",
            write.node_name
        );
        assert_eq!(write.spec.mode, Ebpf);
    }
    assert_eq!(plan.dataplane_nodes.len(), 2);
}

#[test]
fn an_externally_managed_kube_proxy_coming_back_is_reported_degraded() {
    let mut config = ebpf_config();
    config.spec.kube_proxy.management = KubeProxyManagement::External;
    let mut cluster = cluster(vec![cleaned_node("node-1")]);
    node_mut(&mut cluster, "node-1").kube_proxy_pod =
        Some(pod("kube-proxy-node-1", "kp-2", at(-3)));
    let plan = plan(Some(&config), &cluster);
    assert_eq!(plan.kube_proxy, KubeProxyAction::None);
    assert_eq!(
        condition_of(&plan, types::DEGRADED).reason,
        reasons::KUBE_PROXY_RETURNED
    );
    assert!(
        !written(&plan, "node-1")
            .expect("cleanup withdrawn")
            .spec
            .iptables_cleanup
    );
}

#[test]
fn kube_proxy_coming_back_is_still_reported_when_the_round_that_withdrew_cleanup_failed() {
    // Ready on eBPF; then kube-proxy's nodeSelector is reset. The round that withdrew cleanup
    // wrote the DataplaneNodes but its kube-proxy patch conflicted: the status still says Ready.
    let mut config = ebpf_config();
    let mut cluster = cluster(vec![cleaned_node("node-1"), cleaned_node("node-2")]);
    cluster.kube_proxy_daemon_set = Some(disabled_kube_proxy_daemon_set());
    let ready = plan(Some(&config), &cluster);
    assert_eq!(phase(&ready), DataplanePhase::Ready);
    config.status = ready.status.clone();
    cluster.kube_proxy_daemon_set = Some(kube_proxy_daemon_set());
    for name in ["node-1", "node-2"] {
        let node = node_mut(&mut cluster, name);
        node.kube_proxy_pod = Some(pod(&format!("kube-proxy-{name}"), "kp-2", at(-3)));
        set_spec(node, Ebpf, false, at(-2));
        report(node, Report::following(Ebpf), None, OLD_REVISION);
    }
    let retried = plan(Some(&config), &cluster);
    assert_eq!(retried.kube_proxy, KubeProxyAction::Disable);
    assert_eq!(
        condition_of(&retried, types::PROGRESSING).reason,
        reasons::KUBE_PROXY_RETURNED
    );

    // A status about an earlier spec (another generation) says nothing about this one.
    let mut changed = config.clone();
    changed.metadata.generation = Some(changed.metadata.generation.unwrap_or(1) + 1);
    let disabling = plan(Some(&changed), &cluster);
    assert_eq!(disabling.kube_proxy, KubeProxyAction::Disable);
    assert_ne!(
        condition_of(&disabling, types::PROGRESSING).reason,
        reasons::KUBE_PROXY_RETURNED
    );
}

#[test]
fn an_externally_managed_kube_proxy_that_came_back_stays_degraded_after_cleanup_is_withdrawn() {
    let mut config = ebpf_config();
    config.spec.kube_proxy.management = KubeProxyManagement::External;
    let mut cluster = cluster(vec![cleaned_node("node-1")]);
    node_mut(&mut cluster, "node-1").kube_proxy_pod =
        Some(pod("kube-proxy-node-1", "kp-2", at(-3)));
    let returned = plan(Some(&config), &cluster);
    assert_eq!(
        condition_of(&returned, types::DEGRADED).reason,
        reasons::KUBE_PROXY_RETURNED
    );
    // The next round: cleanup withdrawn as written, the agent follows, kube-proxy still runs.
    config.status = returned.status.clone();
    let node = node_mut(&mut cluster, "node-1");
    set_spec(node, Ebpf, false, at(-2));
    report(node, Report::following(Ebpf), None, OLD_REVISION);
    let still = plan(Some(&config), &cluster);
    assert_eq!(phase(&still), DataplanePhase::DisablingKubeProxy);
    assert_eq!(
        condition_of(&still, types::DEGRADED).reason,
        reasons::KUBE_PROXY_RETURNED,
        "the report must last while kube-proxy runs"
    );
    assert_eq!(still.kube_proxy, KubeProxyAction::None);
    assert!(
        still.dataplane_nodes.is_empty(),
        "{:?}",
        still.dataplane_nodes
    );

    // Its owner removes it again: the transition goes on and the report goes with it.
    config.status = still.status.clone();
    node_mut(&mut cluster, "node-1").kube_proxy_pod = None;
    cluster.kube_proxy_daemon_set = None;
    let after = plan(Some(&config), &cluster);
    assert_ne!(phase(&after), DataplanePhase::DisablingKubeProxy);
    let degraded = condition_of(&after, types::DEGRADED);
    assert!(
        degraded.reason != reasons::KUBE_PROXY_RETURNED
            || degraded.status == ConditionStatus::False,
        "{degraded:?}"
    );
}

/// Pass 1 of a kube-proxy coming back on a cluster Ready on eBPF, then pass 2: cleanup withdrawn
/// as pass 1 wrote it (each DataplaneNode's generation bumped), no agent has reported on it yet.
fn kube_proxy_returned_then_cleanup_withdrawn_unreported(
    management: KubeProxyManagement,
) -> (DataplaneConfig, ObservedCluster, Plan, Plan) {
    let mut config = ebpf_config();
    config.spec.kube_proxy.management = management;
    let mut cluster = cluster(vec![cleaned_node("node-1"), cleaned_node("node-2")]);
    for name in ["node-1", "node-2"] {
        node_mut(&mut cluster, name).kube_proxy_pod =
            Some(pod(&format!("kube-proxy-{name}"), "kp-2", at(-3)));
    }
    let returned = plan(Some(&config), &cluster);
    assert_eq!(phase(&returned), DataplanePhase::DisablingKubeProxy);
    config.status = returned.status.clone();
    for name in ["node-1", "node-2"] {
        set_spec(node_mut(&mut cluster, name), Ebpf, false, at(-2));
    }
    let catching_up = plan(Some(&config), &cluster);
    (config, cluster, returned, catching_up)
}

#[test]
fn an_externally_managed_kube_proxy_that_came_back_stays_degraded_while_the_agents_catch_up_with_the_withdrawn_cleanup(
) {
    let (mut config, mut cluster, returned, catching_up) =
        kube_proxy_returned_then_cleanup_withdrawn_unreported(KubeProxyManagement::External);
    let degraded = condition_of(&returned, types::DEGRADED);
    assert_eq!(degraded.reason, reasons::KUBE_PROXY_RETURNED);
    assert_eq!(degraded.status, ConditionStatus::True);

    // Pass 2: the agents have not reported on the withdrawn cleanup yet.
    let degraded = condition_of(&catching_up, types::DEGRADED);
    assert_eq!(
        (degraded.reason.as_str(), degraded.status),
        (reasons::KUBE_PROXY_RETURNED, ConditionStatus::True),
        "the report must last while the agents catch up: {degraded:?}"
    );
    assert_eq!(catching_up.kube_proxy, KubeProxyAction::None);

    // Pass 3: the agents follow the withdrawn cleanup; kube-proxy still runs everywhere.
    config.status = catching_up.status.clone();
    for name in ["node-1", "node-2"] {
        report(
            node_mut(&mut cluster, name),
            Report::following(Ebpf),
            None,
            OLD_REVISION,
        );
    }
    let caught_up = plan(Some(&config), &cluster);
    assert_eq!(phase(&caught_up), DataplanePhase::DisablingKubeProxy);
    let degraded = condition_of(&caught_up, types::DEGRADED);
    assert_eq!(
        (degraded.reason.as_str(), degraded.status),
        (reasons::KUBE_PROXY_RETURNED, ConditionStatus::True),
        "the report must last while kube-proxy runs: {degraded:?}"
    );
    assert_eq!(caught_up.kube_proxy, KubeProxyAction::None);
    assert!(
        caught_up.dataplane_nodes.is_empty(),
        "{:?}",
        caught_up.dataplane_nodes
    );
}

#[test]
fn an_externally_managed_kube_proxy_removed_while_the_agents_catch_up_is_no_longer_reported() {
    let (mut config, mut cluster, _, catching_up) =
        kube_proxy_returned_then_cleanup_withdrawn_unreported(KubeProxyManagement::External);
    // Control: the round before its removal still reports it.
    assert_eq!(
        condition_of(&catching_up, types::DEGRADED).reason,
        reasons::KUBE_PROXY_RETURNED
    );
    config.status = catching_up.status.clone();
    for name in ["node-1", "node-2"] {
        node_mut(&mut cluster, name).kube_proxy_pod = None;
    }
    cluster.kube_proxy_daemon_set = None;
    let removed = plan(Some(&config), &cluster);
    let degraded = condition_of(&removed, types::DEGRADED);
    assert!(
        degraded.reason != reasons::KUBE_PROXY_RETURNED
            || degraded.status == ConditionStatus::False,
        "{degraded:?}"
    );
    assert_ne!(
        condition_of(&removed, types::PROGRESSING).reason,
        reasons::KUBE_PROXY_RETURNED
    );
}

#[test]
fn a_managed_kube_proxy_that_came_back_keeps_its_reason_while_the_agents_catch_up_with_the_withdrawn_cleanup(
) {
    let (mut config, mut cluster, returned, catching_up) =
        kube_proxy_returned_then_cleanup_withdrawn_unreported(KubeProxyManagement::Managed);
    assert_eq!(returned.kube_proxy, KubeProxyAction::Disable);
    assert_eq!(
        condition_of(&returned, types::PROGRESSING).reason,
        reasons::KUBE_PROXY_RETURNED
    );

    // Pass 2: the agents have not reported on the withdrawn cleanup yet.
    assert_eq!(
        condition_of(&catching_up, types::PROGRESSING).reason,
        reasons::KUBE_PROXY_RETURNED,
        "{}",
        message(&catching_up)
    );

    // Pass 3: the agents follow the withdrawn cleanup; kube-proxy still runs everywhere.
    config.status = catching_up.status.clone();
    for name in ["node-1", "node-2"] {
        report(
            node_mut(&mut cluster, name),
            Report::following(Ebpf),
            None,
            OLD_REVISION,
        );
    }
    let caught_up = plan(Some(&config), &cluster);
    assert_eq!(phase(&caught_up), DataplanePhase::DisablingKubeProxy);
    assert_eq!(
        condition_of(&caught_up, types::PROGRESSING).reason,
        reasons::KUBE_PROXY_RETURNED,
        "{}",
        message(&caught_up)
    );
    assert_eq!(caught_up.kube_proxy, KubeProxyAction::Disable);
    assert!(
        message(&caught_up).contains("came back"),
        "{}",
        message(&caught_up)
    );
    assert!(
        caught_up.dataplane_nodes.is_empty(),
        "{:?}",
        caught_up.dataplane_nodes
    );
}

// ---------------------------------------------------------------------------------------------
// Nodes joining a cluster on eBPF
// ---------------------------------------------------------------------------------------------

fn cluster_on_ebpf() -> ObservedCluster {
    let mut cluster = cluster(vec![cleaned_node("node-1"), cleaned_node("node-2")]);
    cluster.kube_proxy_daemon_set = Some(disabled_kube_proxy_daemon_set());
    cluster
}

#[test]
fn a_cluster_fully_on_ebpf_is_ready_and_plans_nothing() {
    let plan = plan(Some(&ebpf_config()), &cluster_on_ebpf());
    assert_eq!(phase(&plan), DataplanePhase::Ready);
    assert!(plan.dataplane_nodes.is_empty());
    assert_eq!(plan.kube_proxy, KubeProxyAction::None);
    assert_eq!(plan.requeue_after, None);
    let status = plan.status.expect("status");
    assert_eq!(status.serving_summary.as_deref(), Some("2/2"));
}

#[test]
fn a_node_joining_a_cluster_on_ebpf_is_brought_to_ebpf_then_cleaned_on_its_own() {
    let mut cluster = cluster_on_ebpf();
    let mut joining = bare_node("node-3");
    joining.kube_proxy_pod = None;
    cluster.nodes.push(joining);
    let plan = plan(Some(&ebpf_config()), &cluster);
    let write = written(&plan, "node-3").expect("node-3's DataplaneNode");
    assert!(write.create);
    assert_eq!(
        write.spec.mode, Ebpf,
        "created directly in Ebpf: no preflight, no cluster transition"
    );
    assert!(
        !write.spec.iptables_cleanup,
        "cleanup only once it serves from eBPF"
    );
    assert_eq!(plan.kube_proxy, KubeProxyAction::None);
    assert_eq!(phase(&plan), DataplanePhase::ActivatingNodes);
    assert_eq!(
        condition_of(&plan, types::PROGRESSING).reason,
        reasons::NODES_JOINING
    );
    assert_eq!(
        plan.dataplane_nodes.len(),
        1,
        "the other nodes are left alone"
    );

    // Once it serves from eBPF, it is told to clean.
    let node = node_mut(&mut cluster, "node-3");
    set_spec(node, Ebpf, false, at(0));
    report(node, Report::following(Ebpf), None, OLD_REVISION);
    let plan = super::plan(Some(&ebpf_config()), &cluster);
    let write = written(&plan, "node-3").expect("node-3 cleans");
    assert!(write.spec.iptables_cleanup);
    assert_eq!(phase(&plan), DataplanePhase::CleaningRules);
}

#[test]
fn a_recreated_dataplane_node_on_ebpf_is_brought_back_without_rerunning_the_transition() {
    let mut cluster = cluster_on_ebpf();
    node_mut(&mut cluster, "node-2").dataplane_node = None;
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(written_modes(&plan), vec![("node-2", Ebpf)]);
    assert!(written(&plan, "node-2").expect("write").create);
    assert_eq!(plan.kube_proxy, KubeProxyAction::None);
}

#[test]
fn the_transition_record_is_not_restarted_by_a_joining_node() {
    let mut config = ebpf_config();
    let finished = plan(Some(&config), &cluster_on_ebpf());
    config.status = finished.status.clone();
    config.status.as_mut().expect("status").transition = Some(switchyard_crds::Transition {
        from: KubeProxy,
        to: Ebpf,
        started_at: at(-900),
        finished_at: Some(at(-100)),
    });
    let mut cluster = cluster_on_ebpf();
    cluster.nodes.push(bare_node("node-3"));
    node_mut(&mut cluster, "node-3").kube_proxy_pod = None;
    let plan = plan(Some(&config), &cluster);
    let transition = plan.status.expect("status").transition.expect("transition");
    assert_eq!(
        (transition.started_at, transition.finished_at),
        (at(-900), Some(at(-100)))
    );
}

// ---------------------------------------------------------------------------------------------
// Ebpf -> KubeProxy
// ---------------------------------------------------------------------------------------------

fn rollback_config() -> DataplaneConfig {
    config(KubeProxy)
}

#[test]
fn rollback_turns_cleanup_off_everywhere_first_and_restores_nothing_yet() {
    let plan = plan(Some(&rollback_config()), &cluster_on_ebpf());
    assert_eq!(phase(&plan), DataplanePhase::RestoringKubeProxy);
    assert_eq!(
        plan.kube_proxy,
        KubeProxyAction::None,
        "agents might still be cleaning"
    );
    assert_eq!(plan.dataplane_nodes.len(), 2);
    for write in &plan.dataplane_nodes {
        assert!(!write.spec.iptables_cleanup);
        assert_eq!(write.spec.mode, Ebpf, "nodes keep serving from eBPF");
    }
}

#[test]
fn rollback_restores_kube_proxy_once_every_agent_acknowledged_the_end_of_cleanup() {
    let mut cluster = cluster_on_ebpf();
    for name in ["node-1", "node-2"] {
        let node = node_mut(&mut cluster, name);
        set_spec(node, Ebpf, false, at(-5));
    }
    // node-2 has not acknowledged yet.
    let mut no_rules = Report::following(Ebpf);
    no_rules.rules_present = false;
    no_rules.kube_proxy_healthy = false;
    report(
        node_mut(&mut cluster, "node-1"),
        no_rules,
        None,
        OLD_REVISION,
    );
    let plan = plan(Some(&rollback_config()), &cluster);
    assert_eq!(plan.kube_proxy, KubeProxyAction::None);
    assert!(message(&plan).contains("node-2"), "{}", message(&plan));

    report(
        node_mut(&mut cluster, "node-2"),
        no_rules,
        None,
        OLD_REVISION,
    );
    let plan = super::plan(Some(&rollback_config()), &cluster);
    assert_eq!(plan.kube_proxy, KubeProxyAction::Restore);
    assert_eq!(phase(&plan), DataplanePhase::RestoringKubeProxy);
    assert!(
        plan.dataplane_nodes.is_empty(),
        "no node leaves eBPF before kube-proxy is healthy"
    );
}

#[test]
fn rollback_waits_for_kube_proxy_healthy_on_every_node_before_deactivating_any() {
    let mut cluster = cluster(vec![ebpf_node("node-1"), ebpf_node("node-2")]);
    let mut unhealthy = Report::following(Ebpf);
    unhealthy.kube_proxy_healthy = false;
    report(
        node_mut(&mut cluster, "node-2"),
        unhealthy,
        None,
        OLD_REVISION,
    );
    let plan = plan(Some(&rollback_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::RestoringKubeProxy);
    assert!(
        plan.dataplane_nodes.is_empty(),
        "node-1 is healthy but node-2 is not yet"
    );
    assert_eq!(
        condition_of(&plan, types::PROGRESSING).reason,
        reasons::WAITING_FOR_KUBE_PROXY
    );
    assert!(message(&plan).contains("node-2"));
}

#[test]
fn a_ready_kube_proxy_pod_alone_does_not_count_as_healthy() {
    let mut cluster = cluster(vec![ebpf_node("node-1")]);
    let mut unhealthy = Report::following(Ebpf);
    unhealthy.kube_proxy_healthy = false;
    report(
        node_mut(&mut cluster, "node-1"),
        unhealthy,
        None,
        OLD_REVISION,
    );
    assert!(cluster.nodes[0]
        .kube_proxy_pod
        .as_ref()
        .is_some_and(|pod| pod.ready));
    let plan = plan(Some(&rollback_config()), &cluster);
    assert!(plan.dataplane_nodes.is_empty());
}

#[test]
fn rollback_deactivates_in_batches_of_max_unavailable() {
    let cluster = cluster(vec![
        ebpf_node("node-1"),
        ebpf_node("node-2"),
        ebpf_node("node-3"),
    ]);
    let plan = plan(
        Some(&with_max_unavailable(
            rollback_config(),
            IntOrString::Int(2),
        )),
        &cluster,
    );
    assert_eq!(phase(&plan), DataplanePhase::DeactivatingNodes);
    assert_eq!(
        written_modes(&plan),
        vec![("node-1", KubeProxy), ("node-2", KubeProxy)]
    );
}

#[test]
fn a_node_told_kube_proxy_counts_as_deactivated_only_once_its_agent_reports_it_detached() {
    let mut cluster = cluster(vec![ebpf_node("node-1"), ebpf_node("node-2")]);
    let node = node_mut(&mut cluster, "node-1");
    set_spec(node, KubeProxy, false, at(-5));
    // Acknowledged, but programs still attached (not draining): in flight.
    let mut still_attached = Report::following(KubeProxy);
    still_attached.attached = true;
    report(node, still_attached, None, OLD_REVISION);
    let plan = plan(Some(&rollback_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::DeactivatingNodes);
    assert!(
        plan.dataplane_nodes.is_empty(),
        "node-1 in flight blocks the next batch"
    );
    assert!(
        message(&plan).contains("waiting for node-1 to detach"),
        "{}",
        message(&plan)
    );

    report(
        node_mut(&mut cluster, "node-1"),
        Report::following(KubeProxy),
        None,
        OLD_REVISION,
    );
    let plan = super::plan(Some(&rollback_config()), &cluster);
    assert_eq!(written_modes(&plan), vec![("node-2", KubeProxy)]);
}

fn draining(node: &mut ObservedNode, requested_at: chrono::DateTime<chrono::Utc>) {
    set_spec(node, KubeProxy, false, requested_at);
    let mut draining = Report::following(KubeProxy);
    draining.attached = true;
    draining.draining = true;
    report(node, draining, None, OLD_REVISION);
}

#[test]
fn draining_nodes_are_shown_and_do_not_count_against_max_unavailable() {
    let mut cluster = cluster(vec![
        ebpf_node("node-1"),
        ebpf_node("node-2"),
        ebpf_node("node-3"),
    ]);
    draining(node_mut(&mut cluster, "node-1"), at(-30));
    let plan = plan(Some(&rollback_config()), &cluster);
    assert_eq!(written_modes(&plan), vec![("node-2", KubeProxy)]);
    let status = plan.status.as_ref().expect("status");
    assert_eq!(status.nodes.draining, 1);
    assert_eq!(status.phase, DataplanePhase::DeactivatingNodes);
    assert!(
        message(&plan).contains("draining live connections on node-1"),
        "{}",
        message(&plan)
    );
}

#[test]
fn a_draining_node_is_not_failed_before_its_drain_timeout() {
    let mut cluster = cluster(vec![ebpf_node("node-1"), ebpf_node("node-2")]);
    // Past the node ready timeout (300 s) but within drain (600 s) + ready.
    draining(node_mut(&mut cluster, "node-1"), at(-800));
    let plan = plan(Some(&rollback_config()), &cluster);
    assert_eq!(plan.status.as_ref().expect("status").nodes.failed, 0);
    assert_eq!(phase(&plan), DataplanePhase::DeactivatingNodes);
    assert_eq!(
        plan.requeue_after,
        Some(std::time::Duration::from_secs(100))
    );
}

#[test]
fn a_draining_node_fails_once_its_drain_timeout_and_the_ready_timeout_passed() {
    let mut cluster = cluster(vec![ebpf_node("node-1"), ebpf_node("node-2")]);
    draining(node_mut(&mut cluster, "node-1"), at(-901));
    let plan = plan(Some(&rollback_config()), &cluster);
    assert_eq!(plan.status.as_ref().expect("status").nodes.failed, 1);
    assert_eq!(phase(&plan), DataplanePhase::Halted);
    assert!(
        !message(&plan).contains("untouched"),
        "kube-proxy was restored: a rollback halt must not claim otherwise"
    );
}

#[test]
fn rollback_finishes_ready_when_every_node_is_detached() {
    let cluster = three_kube_proxy_nodes();
    let plan = plan(Some(&rollback_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::Ready);
    assert!(plan.dataplane_nodes.is_empty());
    assert_eq!(
        condition_of(&plan, types::READY).status,
        ConditionStatus::True
    );
    assert_eq!(
        condition_of(&plan, types::PROGRESSING).status,
        ConditionStatus::False
    );
}

#[test]
fn external_rollback_waits_for_kube_proxy_to_be_restored_by_its_owner() {
    let mut config = rollback_config();
    config.spec.kube_proxy.management = KubeProxyManagement::External;
    let mut cluster = cluster_on_ebpf();
    // The owner deleted the DaemonSet (Switchyard never touched it).
    cluster.kube_proxy_daemon_set = None;
    for name in ["node-1", "node-2"] {
        let node = node_mut(&mut cluster, name);
        set_spec(node, Ebpf, false, at(-5));
        let mut no_rules = Report::following(Ebpf);
        no_rules.rules_present = false;
        no_rules.kube_proxy_healthy = false;
        report(node, no_rules, None, OLD_REVISION);
    }
    let plan = plan(Some(&config), &cluster);
    assert_eq!(
        plan.kube_proxy,
        KubeProxyAction::None,
        "External: the operator never restores"
    );
    assert_eq!(phase(&plan), DataplanePhase::RestoringKubeProxy);
    assert!(
        message(&plan).contains("restored by its owner"),
        "{}",
        message(&plan)
    );
}

/// Applies the plan's DataplaneNode writes to the snapshot, as the API server would (the
/// generation moves on; the agents' reports stay as they were).
fn apply_node_writes(cluster: &mut ObservedCluster, plan: &Plan) {
    for write in &plan.dataplane_nodes {
        let node = node_mut(cluster, &write.node_name);
        set_spec(node, write.spec.mode, write.spec.iptables_cleanup, at(0));
    }
}

/// An agent that served kube-proxy's health ports reports the spec that takes cleanup away only
/// once it has closed them: until then its report, however fresh its conditions, names the
/// older generation. kube-proxy is restored only once every node has reported the new one.
#[test]
fn kube_proxy_is_restored_only_once_every_agent_has_reported_the_spec_that_took_its_health_ports_back(
) {
    let mut cluster = cluster_on_ebpf();
    let first = plan(Some(&rollback_config()), &cluster);
    assert_eq!(first.kube_proxy, KubeProxyAction::None);
    assert!(
        first
            .dataplane_nodes
            .iter()
            .all(|write| !write.spec.iptables_cleanup && write.spec.mode == Ebpf),
        "cleanup, and with it the permission to serve kube-proxy's ports, is taken back first"
    );
    let held_generation = node_mut(&mut cluster, "node-2")
        .dataplane_node
        .as_ref()
        .and_then(|node| node.metadata.generation)
        .expect("node-2's generation");
    apply_node_writes(&mut cluster, &first);
    let mut no_rules = Report::following(Ebpf);
    no_rules.rules_present = false;
    no_rules.kube_proxy_healthy = false;
    report(
        node_mut(&mut cluster, "node-1"),
        no_rules,
        None,
        OLD_REVISION,
    );
    // node-2's agent still had the ports open when it wrote this.
    report(
        node_mut(&mut cluster, "node-2"),
        no_rules,
        Some(held_generation),
        OLD_REVISION,
    );
    let waiting = plan(Some(&rollback_config()), &cluster);
    assert_eq!(
        waiting.kube_proxy,
        KubeProxyAction::None,
        "node-2 may still hold kube-proxy's healthz port"
    );
    assert!(waiting.dataplane_nodes.is_empty());
    assert!(
        message(&waiting).contains("node-2") && !message(&waiting).contains("node-1"),
        "{}",
        message(&waiting)
    );

    // The control: node-2 reports the new spec, its ports closed.
    report(
        node_mut(&mut cluster, "node-2"),
        no_rules,
        None,
        OLD_REVISION,
    );
    let restoring = plan(Some(&rollback_config()), &cluster);
    assert_eq!(restoring.kube_proxy, KubeProxyAction::Restore);
}

/// With `External` the operator cannot hold kube-proxy back, so its message says when the owner
/// may bring it back: not while an agent has not reported the spec that took cleanup away.
#[test]
fn an_external_rollback_says_to_restore_kube_proxy_only_once_every_agent_handed_its_ports_back() {
    let mut config = rollback_config();
    config.spec.kube_proxy.management = KubeProxyManagement::External;
    let mut cluster = cluster_on_ebpf();
    // The owner removed the DaemonSet itself (Switchyard never touched it).
    cluster.kube_proxy_daemon_set = None;
    let first = plan(Some(&config), &cluster);
    apply_node_writes(&mut cluster, &first);
    let mut no_rules = Report::following(Ebpf);
    no_rules.rules_present = false;
    no_rules.kube_proxy_healthy = false;
    report(
        node_mut(&mut cluster, "node-1"),
        no_rules,
        None,
        OLD_REVISION,
    );
    let waiting = plan(Some(&config), &cluster);
    assert_eq!(waiting.kube_proxy, KubeProxyAction::None);
    assert!(
        message(&waiting).contains("node-2")
            && message(&waiting).contains("restore kube-proxy only then"),
        "{}",
        message(&waiting)
    );

    report(
        node_mut(&mut cluster, "node-2"),
        no_rules,
        None,
        OLD_REVISION,
    );
    let now_it_may = plan(Some(&config), &cluster);
    assert_eq!(
        now_it_may.kube_proxy,
        KubeProxyAction::None,
        "External: the operator never restores"
    );
    assert!(
        message(&now_it_may)
            .contains("waiting for kube-proxy to be healthy (restored by its owner")
            && !message(&now_it_may).contains("only then"),
        "{}",
        message(&now_it_may)
    );
}

/// A node that failed (its agent gone, never reporting) does not hold the way back forever: an
/// agent that is there hands kube-proxy's ports back as soon as it sees kube-proxy's rules.
#[test]
fn a_failed_node_that_never_reports_the_new_spec_does_not_hold_back_the_restore() {
    let mut config = rollback_config();
    config.spec.rollout.max_failed_nodes = 1;
    let mut cluster = cluster_on_ebpf();
    let first = plan(Some(&config), &cluster);
    apply_node_writes(&mut cluster, &first);
    let mut no_rules = Report::following(Ebpf);
    no_rules.rules_present = false;
    no_rules.kube_proxy_healthy = false;
    report(
        node_mut(&mut cluster, "node-1"),
        no_rules,
        None,
        OLD_REVISION,
    );
    let waiting = plan(Some(&config), &cluster);
    assert_eq!(waiting.kube_proxy, KubeProxyAction::None, "not failed yet");
    // Past node-2's timeout, its report still on the spec before.
    cluster.now = at(3_600);
    let restoring = plan(Some(&config), &cluster);
    assert_eq!(restoring.kube_proxy, KubeProxyAction::Restore);
}

#[test]
fn a_kube_proxy_disabled_by_switchyard_is_restored_by_it_even_after_management_became_external() {
    let mut config = rollback_config();
    config.spec.kube_proxy.management = KubeProxyManagement::External;
    let mut cluster = cluster_on_ebpf();
    for name in ["node-1", "node-2"] {
        let node = node_mut(&mut cluster, name);
        set_spec(node, Ebpf, false, at(-5));
        let mut no_rules = Report::following(Ebpf);
        no_rules.rules_present = false;
        no_rules.kube_proxy_healthy = false;
        report(node, no_rules, None, OLD_REVISION);
    }
    let plan = plan(Some(&config), &cluster);
    assert_eq!(plan.kube_proxy, KubeProxyAction::Restore);
}

#[test]
fn managed_rollback_without_a_kube_proxy_daemon_set_is_degraded_and_waits() {
    let mut cluster = cluster_on_ebpf();
    cluster.kube_proxy_daemon_set = None;
    for name in ["node-1", "node-2"] {
        let node = node_mut(&mut cluster, name);
        set_spec(node, Ebpf, false, at(-5));
        let mut no_rules = Report::following(Ebpf);
        no_rules.rules_present = false;
        no_rules.kube_proxy_healthy = false;
        report(node, no_rules, None, OLD_REVISION);
    }
    let plan = plan(Some(&rollback_config()), &cluster);
    assert!(plan.dataplane_nodes.is_empty());
    assert_eq!(
        condition_of(&plan, types::DEGRADED).reason,
        reasons::KUBE_PROXY_NOT_FOUND
    );
}

// ---------------------------------------------------------------------------------------------
// Missing DataplaneNodes (new Nodes, or Nodes that re-registered and lost theirs)
// ---------------------------------------------------------------------------------------------

/// Nodes on eBPF during a rollback whose kube-proxy DaemonSet was restored: kube-proxy is
/// healthy on node-1; node-2's DataplaneNode was garbage-collected (its Node re-registered) and
/// its agent keeps its programs.
fn rollback_restored_with_a_lost_dataplane_node() -> ObservedCluster {
    let mut cluster = cluster(vec![ebpf_node("node-1"), ebpf_node("node-2")]);
    node_mut(&mut cluster, "node-2").dataplane_node = None;
    cluster
}

#[test]
fn a_dataplane_node_recreated_during_the_rollback_keeps_serving_from_ebpf_until_kube_proxy_is_healthy_there(
) {
    let config = with_max_unavailable(rollback_config(), IntOrString::Int(2));
    let mut cluster = rollback_restored_with_a_lost_dataplane_node();
    let plan = plan(Some(&config), &cluster);
    let write = written(&plan, "node-2").expect("node-2's DataplaneNode is recreated");
    assert!(write.create);
    assert_eq!(
        (write.spec.mode, write.spec.iptables_cleanup),
        (Ebpf, false),
        "KubeProxy would make its agent detach before kube-proxy serves there"
    );
    assert_eq!(
        written_modes(&plan),
        vec![("node-2", Ebpf)],
        "no node leaves eBPF meanwhile"
    );
    assert_eq!(phase(&plan), DataplanePhase::RestoringKubeProxy);

    // Its agent follows the new spec, kube-proxy not yet healthy there: nobody moves, not Ready.
    let node = node_mut(&mut cluster, "node-2");
    set_spec(node, Ebpf, false, at(0));
    let mut unhealthy = Report::following(Ebpf);
    unhealthy.kube_proxy_healthy = false;
    report(node, unhealthy, None, OLD_REVISION);
    let plan = super::plan(Some(&config), &cluster);
    assert!(plan.dataplane_nodes.is_empty());
    assert_eq!(phase(&plan), DataplanePhase::RestoringKubeProxy);
    assert!(message(&plan).contains("node-2"), "{}", message(&plan));

    // kube-proxy healthy on node-2: it is deactivated in the normal batches.
    report(
        node_mut(&mut cluster, "node-2"),
        Report::following(Ebpf),
        None,
        OLD_REVISION,
    );
    let plan = super::plan(Some(&config), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::DeactivatingNodes);
    assert_eq!(
        written_modes(&plan),
        vec![("node-1", KubeProxy), ("node-2", KubeProxy)]
    );
}

#[test]
fn a_dataplane_node_recreated_before_the_rollback_restored_kube_proxy_is_created_as_ebpf() {
    let mut cluster = cluster_on_ebpf();
    node_mut(&mut cluster, "node-2").dataplane_node = None;
    let plan = plan(Some(&rollback_config()), &cluster);
    let write = written(&plan, "node-2").expect("node-2's DataplaneNode is recreated");
    assert!(write.create);
    assert_eq!(
        (write.spec.mode, write.spec.iptables_cleanup),
        (Ebpf, false)
    );
    assert_eq!(phase(&plan), DataplanePhase::RestoringKubeProxy);
}

#[test]
fn a_dataplane_node_recreated_while_the_rollback_is_halted_is_created_as_ebpf() {
    let mut cluster = rollback_restored_with_a_lost_dataplane_node();
    cluster.nodes.push(ebpf_node("node-3"));
    draining(node_mut(&mut cluster, "node-3"), at(-901));
    let plan = plan(Some(&rollback_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::Halted);
    assert_eq!(written_modes(&plan), vec![("node-2", Ebpf)]);
}

#[test]
fn a_dataplane_node_recreated_while_paused_with_kube_proxy_disabled_is_created_as_ebpf_once_resumed(
) {
    // Disabling kube-proxy: its DaemonSet is disabled, its pods left node-1 already.
    let mut cluster = cluster(vec![ebpf_node("node-1"), ebpf_node("node-2")]);
    cluster.kube_proxy_daemon_set = Some(disabled_kube_proxy_daemon_set());
    node_mut(&mut cluster, "node-1").kube_proxy_pod = None;
    node_mut(&mut cluster, "node-2").dataplane_node = None;
    for mode in [Ebpf, KubeProxy] {
        let mut config = config(mode);
        config.spec.paused = true;
        let paused = plan(Some(&config), &cluster);
        assert!(
            paused.dataplane_nodes.is_empty(),
            "paused writes nothing: node-2's agent keeps its programs meanwhile"
        );
        config.spec.paused = false;
        let resumed = plan(Some(&config), &cluster);
        let write = written(&resumed, "node-2").expect("node-2's DataplaneNode");
        assert!(write.create, "{mode:?}");
        assert_eq!(
            (write.spec.mode, write.spec.iptables_cleanup),
            (Ebpf, false),
            "{mode:?}"
        );
    }
}

#[test]
fn a_dataplane_node_recreated_while_held_without_a_config_after_kube_proxy_was_restored_is_created_as_ebpf(
) {
    // The DataplaneConfig was deleted in the middle of a rollback: nothing says kube-proxy is
    // healthy on node-2 yet.
    let plan = plan(None, &rollback_restored_with_a_lost_dataplane_node());
    assert_eq!(written_modes(&plan), vec![("node-2", Ebpf)]);
    assert_eq!(plan.kube_proxy, KubeProxyAction::None);
}

#[test]
fn dataplane_nodes_recreated_where_an_external_owner_removed_kube_proxy_are_created_as_ebpf_without_using_max_unavailable(
) {
    let mut cluster = cluster(vec![
        cleaned_node("node-1"),
        bare_node("node-2"),
        bare_node("node-3"),
    ]);
    cluster.kube_proxy_daemon_set = None;
    for node in &mut cluster.nodes {
        node.kube_proxy_pod = None;
    }
    for mode in [Ebpf, KubeProxy] {
        let mut config = config(mode);
        config.spec.kube_proxy.management = KubeProxyManagement::External;
        let plan = plan(Some(&config), &cluster);
        assert_eq!(
            written_modes(&plan)
                .into_iter()
                .filter(|(name, _)| *name != "node-1")
                .collect::<Vec<_>>(),
            vec![("node-2", Ebpf), ("node-3", Ebpf)],
            "{mode:?}: nothing else could serve them (maxUnavailable 1)"
        );
        assert!(
            plan.dataplane_nodes
                .iter()
                .all(|write| !write.spec.iptables_cleanup),
            "{mode:?}"
        );
    }
}

#[test]
fn a_node_joining_a_cluster_on_kube_proxy_is_created_as_kube_proxy() {
    let mut cluster = three_kube_proxy_nodes();
    cluster.nodes.push(bare_node("node-4"));
    for config in [Some(rollback_config()), None] {
        let plan = plan(config.as_ref(), &cluster);
        assert_eq!(written_modes(&plan), vec![("node-4", KubeProxy)]);
        assert!(written(&plan, "node-4").expect("write").create);
        assert!(
            !written(&plan, "node-4")
                .expect("write")
                .spec
                .iptables_cleanup
        );
    }
}

#[test]
fn a_node_joining_during_an_activation_is_created_as_kube_proxy_and_waited_for() {
    // kube-proxy still runs everywhere: it serves the new node until activation reaches it.
    let mut cluster = cluster(vec![ebpf_node("node-1"), kube_proxy_node("node-2")]);
    cluster.nodes.push(bare_node("node-3"));
    let plan = plan(
        Some(&with_max_unavailable(ebpf_config(), IntOrString::Int(3))),
        &cluster,
    );
    assert_eq!(phase(&plan), DataplanePhase::ActivatingNodes);
    assert_eq!(
        written_modes(&plan),
        vec![("node-2", Ebpf), ("node-3", KubeProxy)]
    );
}

#[test]
fn a_node_joining_after_the_rollback_finished_is_created_as_kube_proxy() {
    let mut simulation = Simulation::new(3, Ebpf, 1);
    simulation.run_until_ready(60);
    simulation.set_mode(KubeProxy);
    simulation.run_until_ready(80);
    let mut joining = bare_node("node-4");
    let now = simulation.cluster.now;
    joining.kube_proxy_pod = Some(pod("kube-proxy-node-4", "kp-1", now));
    joining.agent_pod = Some(pod("agent-node-4", OLD_REVISION, now));
    simulation.cluster.nodes.push(joining);
    let plan = simulation.round();
    assert_eq!(written_modes(&plan), vec![("node-4", KubeProxy)]);
    assert_eq!(plan.kube_proxy, KubeProxyAction::None);
    assert!(written(&plan, "node-4").expect("write").create);
}

#[test]
fn a_dataplane_node_lost_at_any_round_of_either_transition_never_leaves_its_node_unserved() {
    // The simulation checks at every round that every node is served by its agent's programs
    // or by kube-proxy, and every plan against the invariants.
    for to in [Ebpf, KubeProxy] {
        for lost_after in 0..16 {
            let mut simulation = Simulation::new(3, Ebpf, 1);
            simulation.live_flows.insert("node-2".into(), 2);
            if to == KubeProxy {
                simulation.run_until_ready(60);
                simulation.set_mode(KubeProxy);
            }
            for _ in 0..lost_after {
                simulation.round();
            }
            simulation.lose_dataplane_node("node-2");
            simulation.run_until_ready(80);
            let spec = &node_mut(&mut simulation.cluster, "node-2")
                .dataplane_node
                .as_ref()
                .expect("recreated")
                .spec;
            assert_eq!(spec.mode, to, "to {to:?}, lost after {lost_after} rounds");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Reversals
// ---------------------------------------------------------------------------------------------

#[test]
fn reversing_during_activation_deactivates_the_activated_nodes_without_touching_kube_proxy() {
    // node-1 serves from eBPF, node-2 is being activated, kube-proxy still runs everywhere.
    let mut cluster = cluster(vec![
        ebpf_node("node-1"),
        kube_proxy_node("node-2"),
        kube_proxy_node("node-3"),
    ]);
    set_spec(node_mut(&mut cluster, "node-2"), Ebpf, false, at(-3));
    let plan = plan(
        Some(&with_max_unavailable(
            rollback_config(),
            IntOrString::Int(3),
        )),
        &cluster,
    );
    assert_eq!(plan.kube_proxy, KubeProxyAction::None);
    assert_eq!(
        phase(&plan),
        DataplanePhase::RestoringKubeProxy,
        "node-2 has not acknowledged its spec yet"
    );

    report(
        node_mut(&mut cluster, "node-2"),
        Report::following(Ebpf),
        None,
        OLD_REVISION,
    );
    let plan = super::plan(
        Some(&with_max_unavailable(
            rollback_config(),
            IntOrString::Int(3),
        )),
        &cluster,
    );
    assert_eq!(phase(&plan), DataplanePhase::DeactivatingNodes);
    assert_eq!(
        written_modes(&plan),
        vec![("node-1", KubeProxy), ("node-2", KubeProxy)]
    );
}

#[test]
fn reversing_during_disabling_restores_kube_proxy_before_any_node_leaves_ebpf() {
    let mut cluster = cluster(vec![ebpf_node("node-1"), ebpf_node("node-2")]);
    cluster.kube_proxy_daemon_set = Some(disabled_kube_proxy_daemon_set());
    node_mut(&mut cluster, "node-1").kube_proxy_pod = None;
    let plan = plan(Some(&rollback_config()), &cluster);
    assert_eq!(plan.kube_proxy, KubeProxyAction::Restore);
    assert!(plan.dataplane_nodes.is_empty());
    assert_eq!(phase(&plan), DataplanePhase::RestoringKubeProxy);
}

#[test]
fn reversing_during_cleaning_turns_cleanup_off_before_restoring_kube_proxy() {
    let mut cluster = cluster(vec![cleaned_node("node-1"), ebpf_node("node-2")]);
    cluster.kube_proxy_daemon_set = Some(disabled_kube_proxy_daemon_set());
    node_mut(&mut cluster, "node-2").kube_proxy_pod = None;
    let plan = plan(Some(&rollback_config()), &cluster);
    assert_eq!(plan.kube_proxy, KubeProxyAction::None);
    assert_eq!(
        written(&plan, "node-1").map(|write| write.spec.iptables_cleanup),
        Some(false)
    );
    assert!(written(&plan, "node-2").is_none(), "node-2 never cleaned");
}

#[test]
fn reversing_during_restoring_disables_kube_proxy_again_without_deactivating_nodes() {
    // Rollback restored the DaemonSet; pods are coming back; the user flips back to Ebpf.
    let mut cluster = cluster(vec![ebpf_node("node-1"), ebpf_node("node-2")]);
    node_mut(&mut cluster, "node-2").kube_proxy_pod = None;
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::DisablingKubeProxy);
    assert_eq!(plan.kube_proxy, KubeProxyAction::Disable);
    assert!(plan
        .dataplane_nodes
        .iter()
        .all(|write| write.spec.mode == Ebpf && !write.spec.iptables_cleanup));
}

#[test]
fn reversing_during_deactivation_reactivates_nodes_in_batches_without_preflight() {
    let mut cluster = cluster(vec![
        kube_proxy_node("node-1"),
        ebpf_node("node-2"),
        ebpf_node("node-3"),
    ]);
    // node-1 went back to kube-proxy, and then its Node went NotReady: no preflight is rerun,
    // but node-1 is not eligible while its kubelet is not Ready.
    node_mut(&mut cluster, "node-1").ready = false;
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::ActivatingNodes);
    assert!(plan.dataplane_nodes.is_empty());
    node_mut(&mut cluster, "node-1").ready = true;
    let plan = super::plan(Some(&ebpf_config()), &cluster);
    assert_eq!(written_modes(&plan), vec![("node-1", Ebpf)]);
}

#[test]
fn reversing_during_preflight_is_ready_at_once_without_touching_anything() {
    let mut cluster = three_kube_proxy_nodes();
    node_mut(&mut cluster, "node-2").ready = false;
    let waiting = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&waiting), DataplanePhase::Preflight);
    let mut config = rollback_config();
    config.status = waiting.status.clone();
    let reversed = plan(Some(&config), &cluster);
    assert_eq!(phase(&reversed), DataplanePhase::Ready);
    assert!(reversed.dataplane_nodes.is_empty());
    assert_eq!(reversed.kube_proxy, KubeProxyAction::None);
    let transition = reversed
        .status
        .and_then(|status| status.transition)
        .expect("transition");
    assert_eq!((transition.from, transition.to), (Ebpf, KubeProxy));
    assert_eq!(transition.finished_at, Some(at(0)));
}

#[test]
fn reversing_during_an_agent_upgrade_stops_the_upgrade_and_starts_the_rollback() {
    let mut config = rollback_config();
    config.spec.rollout.max_unavailable = IntOrString::Int(3);
    let plan = plan(Some(&config), &upgrade_cluster());
    assert!(
        plan.agent_pods_to_delete.is_empty(),
        "no agent is replaced during a transition"
    );
    assert_eq!(phase(&plan), DataplanePhase::RestoringKubeProxy);
}

#[test]
fn reversing_a_draining_node_brings_it_back_to_ebpf() {
    let mut cluster = cluster(vec![ebpf_node("node-1"), ebpf_node("node-2")]);
    draining(node_mut(&mut cluster, "node-1"), at(-30));
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(written_modes(&plan), vec![("node-1", Ebpf)]);
    assert_eq!(plan.kube_proxy, KubeProxyAction::None);
}

// ---------------------------------------------------------------------------------------------
// Pause
// ---------------------------------------------------------------------------------------------

#[test]
fn paused_plans_no_change_and_says_where_it_stands() {
    let mut config = ebpf_config();
    config.spec.paused = true;
    let cluster = cluster(vec![ebpf_node("node-1"), ebpf_node("node-2")]);
    let plan = plan(Some(&config), &cluster);
    assert!(plan.dataplane_nodes.is_empty());
    assert_eq!(plan.kube_proxy, KubeProxyAction::None);
    assert_eq!(phase(&plan), DataplanePhase::Paused);
    assert!(
        message(&plan).contains("DisablingKubeProxy"),
        "{}",
        message(&plan)
    );
    assert_eq!(
        condition_of(&plan, types::PROGRESSING).reason,
        reasons::PAUSED
    );
    assert_eq!(plan.requeue_after, None);
}

#[test]
fn paused_deletes_no_agent_pod_and_creates_no_dataplane_node() {
    let mut config = rollback_config();
    config.spec.paused = true;
    let mut cluster = cluster(vec![kube_proxy_node("node-1"), bare_node("node-2")]);
    cluster.agent_daemon_set = Some(AgentDaemonSet {
        update_revision: Some(NEW_REVISION.into()),
    });
    let plan = plan(Some(&config), &cluster);
    assert!(plan.dataplane_nodes.is_empty());
    assert!(plan.agent_pods_to_delete.is_empty());
}

#[test]
fn unpausing_continues_from_the_same_step() {
    let mut config = ebpf_config();
    let cluster = cluster(vec![ebpf_node("node-1"), ebpf_node("node-2")]);
    let unpaused = plan(Some(&config), &cluster);
    config.spec.paused = true;
    let paused = plan(Some(&config), &cluster);
    config.spec.paused = false;
    config.status = paused.status.clone();
    let resumed = plan(Some(&config), &cluster);
    assert_eq!(resumed.kube_proxy, unpaused.kube_proxy);
    assert_eq!(resumed.dataplane_nodes, unpaused.dataplane_nodes);
    assert_eq!(phase(&resumed), DataplanePhase::DisablingKubeProxy);
}

// ---------------------------------------------------------------------------------------------
// No DataplaneConfig, other names, invalid specs
// ---------------------------------------------------------------------------------------------

#[test]
fn without_a_default_config_the_operator_behaves_as_kube_proxy_and_creates_dataplane_nodes() {
    let cluster = cluster(vec![kube_proxy_node("node-1"), bare_node("node-2")]);
    let plan = plan(None, &cluster);
    assert_eq!(written_modes(&plan), vec![("node-2", KubeProxy)]);
    assert!(written(&plan, "node-2").expect("write").create);
    assert_eq!(plan.kube_proxy, KubeProxyAction::None);
    assert!(plan.status.is_none(), "nothing to publish a status on");
}

#[test]
fn without_a_default_config_a_cluster_on_ebpf_stays_there_and_joining_nodes_join_it() {
    // Deleting the DataplaneConfig rips nothing out under traffic.
    let mut cluster = cluster_on_ebpf();
    let mut joining = bare_node("node-3");
    joining.kube_proxy_pod = None;
    cluster.nodes.push(joining);
    let plan = plan(None, &cluster);
    assert_eq!(written_modes(&plan), vec![("node-3", Ebpf)]);
    assert_eq!(plan.kube_proxy, KubeProxyAction::None);
    assert!(plan.status.is_none());
}

#[test]
fn without_a_default_config_a_transition_in_the_middle_is_held_where_it_stands() {
    let mut cluster = cluster(vec![
        ebpf_node("node-1"),
        kube_proxy_node("node-2"),
        bare_node("node-3"),
    ]);
    cluster.kube_proxy_daemon_set = Some(disabled_kube_proxy_daemon_set());
    let plan = plan(None, &cluster);
    assert_eq!(
        written_modes(&plan),
        vec![("node-3", Ebpf)],
        "only the missing DataplaneNode is created, on eBPF: kube-proxy is disabled"
    );
    assert_eq!(
        plan.kube_proxy,
        KubeProxyAction::None,
        "kube-proxy is neither disabled nor restored"
    );
    assert!(plan.agent_pods_to_delete.is_empty());
}

#[test]
fn without_a_default_config_cleanup_is_still_withdrawn_where_kube_proxy_came_back() {
    // kube-proxy came back (its DaemonSet schedules again, a pod already runs on node-1) on a
    // cluster told to clean its rules: cleaning on would flap the nodes between kube-proxy and
    // eBPF, so the cleanup is withdrawn even without a DataplaneConfig.
    let mut cluster = cluster(vec![cleaned_node("node-1"), cleaned_node("node-2")]);
    node_mut(&mut cluster, "node-1").kube_proxy_pod =
        Some(pod("kube-proxy-node-1", "kp-2", at(-3)));
    node_mut(&mut cluster, "node-2")
        .dataplane_node
        .as_mut()
        .map(Arc::make_mut)
        .expect("node-2's DataplaneNode")
        .spec
        .drain_timeout_seconds = 30;
    let plan = plan(None, &cluster);
    assert_eq!(plan.dataplane_nodes.len(), 2);
    for write in &plan.dataplane_nodes {
        assert!(!write.create && !write.spec.iptables_cleanup, "{write:?}");
        assert_eq!(write.spec.mode, Ebpf, "{write:?}: only the cleanup changes");
        assert_eq!(write.spec.requested_at, Some(at(0)));
    }
    assert_eq!(
        written(&plan, "node-2")
            .expect("node-2")
            .spec
            .drain_timeout_seconds,
        30,
        "the node keeps its drain timeout: nothing but the cleanup is written"
    );
    assert_eq!(plan.kube_proxy, KubeProxyAction::None);
    assert!(plan.status.is_none() && plan.agent_pods_to_delete.is_empty());

    // Control: while kube-proxy stays gone the cleanup stays as it is.
    assert!(plan_without_config_writes_nothing(&cluster_on_ebpf()));
}

fn plan_without_config_writes_nothing(cluster: &ObservedCluster) -> bool {
    let plan = plan(None, cluster);
    plan.dataplane_nodes.is_empty()
        && plan.kube_proxy == KubeProxyAction::None
        && plan.agent_pods_to_delete.is_empty()
        && plan.status.is_none()
}

#[test]
fn without_a_default_config_nothing_but_creations_and_cleanup_withdrawals_is_planned() {
    // What a DataplaneConfig would act on here, each case planned without one: an agent
    // upgrade in Ready, a drain timeout and a missing requestedAt to correct, kube-proxy to
    // restore, a node serving from eBPF to clean, a node to deactivate.
    let mut upgrade = cluster(vec![kube_proxy_node("node-1"), kube_proxy_node("node-2")]);
    upgrade.agent_daemon_set = Some(AgentDaemonSet {
        update_revision: Some(NEW_REVISION.into()),
    });
    let with_config = plan(Some(&config(KubeProxy)), &upgrade);
    assert!(
        !with_config.agent_pods_to_delete.is_empty(),
        "control: a DataplaneConfig upgrades the agents here"
    );
    assert!(plan_without_config_writes_nothing(&upgrade));

    let mut stale_specs = cluster(vec![kube_proxy_node("node-1"), kube_proxy_node("node-2")]);
    for (name, drain_timeout_seconds, requested_at) in
        [("node-1", 30, Some(at(-40_000))), ("node-2", 600, None)]
    {
        let spec = &mut node_mut(&mut stale_specs, name)
            .dataplane_node
            .as_mut()
            .map(Arc::make_mut)
            .expect("DataplaneNode")
            .spec;
        spec.drain_timeout_seconds = drain_timeout_seconds;
        spec.requested_at = requested_at;
    }
    assert_eq!(
        plan(Some(&config(KubeProxy)), &stale_specs)
            .dataplane_nodes
            .len(),
        2,
        "control: a DataplaneConfig rewrites both specs"
    );
    assert!(plan_without_config_writes_nothing(&stale_specs));

    let mut disabled = cluster(vec![kube_proxy_node("node-1")]);
    disabled.kube_proxy_daemon_set = Some(disabled_kube_proxy_daemon_set());
    disabled.nodes[0].kube_proxy_pod = None;
    assert_eq!(
        plan(Some(&config(KubeProxy)), &disabled).kube_proxy,
        KubeProxyAction::Restore,
        "control: a DataplaneConfig restores kube-proxy here"
    );
    assert!(plan_without_config_writes_nothing(&disabled));

    let mut to_clean = cluster_on_ebpf();
    let mut serving = ebpf_node("node-3");
    serving.kube_proxy_pod = None;
    to_clean.nodes.push(serving);
    assert!(
        written(&plan(Some(&ebpf_config()), &to_clean), "node-3")
            .is_some_and(|write| write.spec.iptables_cleanup),
        "control: a DataplaneConfig cleans node-3"
    );
    assert!(plan_without_config_writes_nothing(&to_clean));

    let mut rollback = cluster(vec![ebpf_node("node-1"), kube_proxy_node("node-2")]);
    for node in &mut rollback.nodes {
        let mut report_on =
            Report::following(node.dataplane_node.as_ref().expect("spec").spec.mode);
        report_on.kube_proxy_healthy = true;
        report(node, report_on, None, OLD_REVISION);
    }
    assert_eq!(
        written_modes(&plan(Some(&config(KubeProxy)), &rollback)),
        vec![("node-1", KubeProxy)],
        "control: a DataplaneConfig deactivates node-1"
    );
    assert!(plan_without_config_writes_nothing(&rollback));
}

#[test]
fn a_config_not_named_default_is_ignored_with_a_degraded_condition() {
    let mut config = ebpf_config();
    config.metadata.name = Some("other".into());
    let plan = plan(Some(&config), &three_kube_proxy_nodes());
    assert!(plan.dataplane_nodes.is_empty());
    assert_eq!(plan.kube_proxy, KubeProxyAction::None);
    let degraded = condition_of(&plan, types::DEGRADED);
    assert_eq!(degraded.status, ConditionStatus::True);
    assert_eq!(degraded.reason, reasons::NOT_DEFAULT);
    assert!(degraded.message.contains("\"default\""));
    assert_eq!(
        condition_of(&plan, types::READY).status,
        ConditionStatus::False
    );
}

#[test]
fn an_invalid_max_unavailable_changes_nothing_and_is_reported() {
    for bad in [
        IntOrString::Int(0),
        IntOrString::Int(-1),
        IntOrString::String("a lot".into()),
        IntOrString::String("150%".into()),
    ] {
        let config = with_max_unavailable(ebpf_config(), bad.clone());
        let plan = plan(Some(&config), &three_kube_proxy_nodes());
        assert!(plan.dataplane_nodes.is_empty(), "{bad:?}");
        let degraded = condition_of(&plan, types::DEGRADED);
        assert_eq!(degraded.reason, reasons::INVALID_SPEC);
        assert!(
            degraded
                .message
                .starts_with("failed to read spec.rollout.maxUnavailable"),
            "{}",
            degraded.message
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Agent upgrades
// ---------------------------------------------------------------------------------------------

fn upgrade_cluster() -> ObservedCluster {
    let mut cluster = cluster_on_ebpf();
    cluster.nodes.push(cleaned_node("node-3"));
    cluster.agent_daemon_set = Some(AgentDaemonSet {
        update_revision: Some(NEW_REVISION.into()),
    });
    cluster
}

#[test]
fn agent_upgrade_deletes_outdated_pods_in_batches_of_max_unavailable() {
    let plan = plan(
        Some(&with_max_unavailable(ebpf_config(), IntOrString::Int(2))),
        &upgrade_cluster(),
    );
    assert_eq!(phase(&plan), DataplanePhase::UpgradingAgents);
    let nodes: Vec<_> = plan
        .agent_pods_to_delete
        .iter()
        .map(|deletion| deletion.node_name.as_str())
        .collect();
    assert_eq!(nodes, vec!["node-1", "node-2"]);
    assert_eq!(plan.agent_pods_to_delete[0].pod_name, "agent-node-1");
    assert!(plan.dataplane_nodes.is_empty());
    assert_eq!(
        condition_of(&plan, types::READY).status,
        ConditionStatus::True,
        "the dataplane stays in place"
    );
}

#[test]
fn agent_upgrade_waits_for_the_new_pods_to_report_ready_with_the_update_revision() {
    let mut cluster = upgrade_cluster();
    // node-1's new pod runs but its agent still reports the old revision.
    node_mut(&mut cluster, "node-1").agent_pod =
        Some(pod("agent-node-1-new", NEW_REVISION, at(-10)));
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::UpgradingAgents);
    assert!(
        plan.agent_pods_to_delete.is_empty(),
        "never two batches in flight"
    );
    assert!(
        message(&plan).contains("waiting for node-1"),
        "{}",
        message(&plan)
    );

    let node = node_mut(&mut cluster, "node-1");
    let mut cleaned = Report::following(Ebpf);
    cleaned.rules_present = false;
    cleaned.kube_proxy_healthy = false;
    report(node, cleaned, None, NEW_REVISION);
    let plan = super::plan(Some(&ebpf_config()), &cluster);
    let nodes: Vec<_> = plan
        .agent_pods_to_delete
        .iter()
        .map(|deletion| deletion.node_name.as_str())
        .collect();
    assert_eq!(nodes, vec!["node-2"]);
    assert_eq!(
        plan.status.as_ref().expect("status").nodes.agent_up_to_date,
        1
    );
}

#[test]
fn a_terminating_old_pod_counts_as_in_flight() {
    let mut cluster = upgrade_cluster();
    node_mut(&mut cluster, "node-1")
        .agent_pod
        .as_mut()
        .expect("pod")
        .terminating = true;
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert!(plan.agent_pods_to_delete.is_empty());
    assert_eq!(phase(&plan), DataplanePhase::UpgradingAgents);
}

#[test]
fn agent_upgrade_never_runs_during_a_transition() {
    let mut cluster = cluster(vec![ebpf_node("node-1"), kube_proxy_node("node-2")]);
    cluster.agent_daemon_set = Some(AgentDaemonSet {
        update_revision: Some(NEW_REVISION.into()),
    });
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::ActivatingNodes);
    assert!(plan.agent_pods_to_delete.is_empty());
}

#[test]
fn agent_upgrade_halts_when_a_node_does_not_come_back_in_time() {
    let mut cluster = upgrade_cluster();
    node_mut(&mut cluster, "node-1").agent_pod =
        Some(pod("agent-node-1-new", NEW_REVISION, at(-301)));
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::Halted);
    assert!(plan.agent_pods_to_delete.is_empty());
    let degraded = condition_of(&plan, types::DEGRADED);
    assert_eq!(degraded.reason, reasons::AGENT_UPGRADE_FAILED);
    assert!(degraded.message.contains("node-1"));
}

#[test]
fn agent_upgrade_also_runs_on_a_cluster_on_kube_proxy() {
    let mut cluster = three_kube_proxy_nodes();
    cluster.agent_daemon_set = Some(AgentDaemonSet {
        update_revision: Some(NEW_REVISION.into()),
    });
    let plan = plan(Some(&rollback_config()), &cluster);
    assert_eq!(plan.agent_pods_to_delete.len(), 1);
}

#[test]
fn a_node_that_never_had_an_agent_is_not_part_of_an_upgrade() {
    let mut cluster = three_kube_proxy_nodes();
    cluster.agent_daemon_set = Some(AgentDaemonSet {
        update_revision: Some(OLD_REVISION.into()),
    });
    let node = node_mut(&mut cluster, "node-3");
    node.agent_pod = None;
    node.dataplane_node
        .as_mut()
        .map(Arc::make_mut)
        .and_then(|node| node.status.as_mut())
        .expect("status")
        .agent_revision = None;
    let plan = plan(Some(&rollback_config()), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::Ready);
}

// ---------------------------------------------------------------------------------------------
// Status
// ---------------------------------------------------------------------------------------------

#[test]
fn status_counts_nodes_by_state_and_summarises_serving() {
    let mut cluster = cluster(vec![
        cleaned_node("node-1"),
        ebpf_node("node-2"),
        kube_proxy_node("node-3"),
    ]);
    draining(node_mut(&mut cluster, "node-3"), at(-10));
    let mut config = rollback_config();
    config.metadata.generation = Some(7);
    let status = plan(Some(&config), &cluster).status.expect("status");
    assert_eq!(status.observed_generation, Some(7));
    assert_eq!(status.nodes.total, 3);
    assert_eq!(status.nodes.serving, 2);
    assert_eq!(status.nodes.kube_proxy_running, 2);
    assert_eq!(status.nodes.rules_cleaned, 1);
    assert_eq!(status.nodes.agent_up_to_date, 3);
    assert_eq!(status.nodes.draining, 1);
    assert_eq!(status.serving_summary.as_deref(), Some("2/3"));
    assert!(status
        .conditions
        .iter()
        .all(|condition| condition.observed_generation == Some(7)));
    let types: Vec<_> = status
        .conditions
        .iter()
        .map(|condition| condition.type_.as_str())
        .collect();
    assert_eq!(
        types,
        vec!["Ready", "Progressing", "Degraded", "ServicesSupported"]
    );
}

#[test]
fn conditions_keep_their_transition_time_while_their_status_is_unchanged() {
    let mut config = ebpf_config();
    let mut cluster = three_kube_proxy_nodes();
    let first = plan(Some(&config), &cluster);
    config.status = first.status.clone();
    cluster.now = at(60);
    let second = plan(Some(&config), &cluster);
    for type_ in [types::READY, types::PROGRESSING, types::DEGRADED] {
        assert_eq!(
            condition_of(&second, type_).last_transition_time,
            at(0),
            "{type_}"
        );
    }
}

#[test]
fn the_transition_start_survives_an_operator_restart() {
    let mut config = ebpf_config();
    let mut cluster = three_kube_proxy_nodes();
    let first = plan(Some(&config), &cluster);
    let transition = first
        .status
        .as_ref()
        .and_then(|status| status.transition.clone())
        .expect("a transition");
    assert_eq!(
        (
            transition.from,
            transition.to,
            transition.started_at,
            transition.finished_at
        ),
        (KubeProxy, Ebpf, at(0), None)
    );
    // A new operator reads the published status back from the API.
    config.status = first.status.clone();
    let config: DataplaneConfig =
        serde_json::from_value(serde_json::to_value(&config).expect("serializes"))
            .expect("reads back");
    cluster.now = at(500);
    let later = plan(Some(&config), &cluster);
    assert_eq!(
        later
            .status
            .and_then(|status| status.transition)
            .map(|transition| transition.started_at),
        Some(at(0))
    );
}

#[test]
fn a_cluster_already_in_the_requested_mode_has_no_transition() {
    let plan = plan(Some(&rollback_config()), &three_kube_proxy_nodes());
    assert_eq!(plan.status.expect("status").transition, None);
}

#[test]
fn the_message_names_at_most_ten_blocking_nodes() {
    let nodes: Vec<_> = (1..=13)
        .map(|index| kube_proxy_node(&format!("node-{index:02}")))
        .collect();
    let mut cluster = cluster(nodes);
    for node in &mut cluster.nodes {
        node.ready = false;
    }
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert!(
        message(&plan).contains("node-01, node-02"),
        "{}",
        message(&plan)
    );
    assert!(
        message(&plan).contains("node-10 and 3 more"),
        "{}",
        message(&plan)
    );
    assert!(!message(&plan).contains("node-11"));
}

#[test]
fn every_spec_write_carries_requested_at_and_the_drain_timeout() {
    let mut config = ebpf_config();
    config.spec.rollout.drain_timeout_seconds = 45;
    let mut cluster = three_kube_proxy_nodes();
    cluster.now = at(0) + Duration::milliseconds(700);
    let plan = plan(Some(&config), &cluster);
    // node-1 is activated; the others get the new drain timeout.
    assert_eq!(plan.dataplane_nodes.len(), 3);
    for write in &plan.dataplane_nodes {
        assert_eq!(
            write.spec.requested_at,
            Some(at(0)),
            "whole seconds, as the API stores them"
        );
        assert_eq!(write.spec.drain_timeout_seconds, 45);
    }
}

#[test]
fn nodes_are_planned_in_name_order_whatever_order_they_are_observed_in() {
    let mut cluster = three_kube_proxy_nodes();
    cluster.nodes.reverse();
    let plan = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(written_modes(&plan), vec![("node-1", Ebpf)]);
}

#[test]
fn requeue_after_points_at_the_next_timeout() {
    let plan = plan(Some(&ebpf_config()), &three_kube_proxy_nodes());
    assert_eq!(
        plan.requeue_after,
        Some(std::time::Duration::from_secs(300))
    );
}

// ---------------------------------------------------------------------------------------------
// Whole transitions on a simulated cluster (invariants checked at every round)
// ---------------------------------------------------------------------------------------------

#[test]
fn a_full_transition_to_ebpf_goes_through_every_step_in_order() {
    let mut simulation = Simulation::new(5, Ebpf, 2);
    let rounds = simulation.run_until_ready(60);
    let mut steps = simulation.phases.clone();
    steps.dedup();
    assert_eq!(
        steps,
        vec![
            DataplanePhase::ActivatingNodes,
            DataplanePhase::DisablingKubeProxy,
            DataplanePhase::CleaningRules,
            DataplanePhase::Ready
        ]
    );
    assert!(rounds <= 12, "{rounds} rounds");
    assert_eq!(
        simulation
            .kube_proxy_actions
            .iter()
            .map(|(_, action)| *action)
            .collect::<Vec<_>>(),
        vec![KubeProxyAction::Disable]
    );
    let status = simulation.config.status.as_ref().expect("status");
    assert_eq!(status.serving_summary.as_deref(), Some("5/5"));
    assert_eq!(status.nodes.rules_cleaned, 5);
    assert!(status
        .transition
        .as_ref()
        .is_some_and(|transition| transition.finished_at.is_some()));
}

#[test]
fn a_full_rollback_goes_through_every_step_in_order_and_waits_for_draining_nodes() {
    let mut simulation = Simulation::new(4, Ebpf, 1);
    simulation.run_until_ready(60);
    simulation.set_mode(KubeProxy);
    for index in 1..=4 {
        simulation.live_flows.insert(format!("node-{index}"), 3);
    }
    simulation.phases.clear();
    simulation.run_until_ready(80);
    let mut steps = simulation.phases.clone();
    steps.dedup();
    assert_eq!(
        steps,
        vec![
            DataplanePhase::RestoringKubeProxy,
            DataplanePhase::DeactivatingNodes,
            DataplanePhase::Ready
        ]
    );
    assert!(simulation
        .cluster
        .nodes
        .iter()
        .all(|node| node.kube_proxy_pod.is_some()));
    assert_eq!(
        simulation
            .kube_proxy_actions
            .last()
            .map(|(_, action)| *action),
        Some(KubeProxyAction::Restore)
    );
}

#[test]
fn flipping_the_mode_at_every_step_always_ends_ready_in_the_last_requested_mode() {
    for flip_after in 1..14 {
        let mut simulation = Simulation::new(3, Ebpf, 1);
        for _ in 0..flip_after {
            simulation.round();
        }
        simulation.set_mode(KubeProxy);
        simulation.run_until_ready(80);
        for node in &simulation.cluster.nodes {
            let spec = &node.dataplane_node.as_ref().expect("dpn").spec;
            assert_eq!(
                (spec.mode, spec.iptables_cleanup),
                (KubeProxy, false),
                "flip after {flip_after}"
            );
            assert!(node.kube_proxy_pod.is_some());
        }
        simulation.set_mode(Ebpf);
        simulation.run_until_ready(80);
        assert!(simulation
            .cluster
            .nodes
            .iter()
            .all(|node| node.kube_proxy_pod.is_none()));
    }
}

#[test]
fn an_agent_that_never_becomes_ready_halts_the_transition_with_kube_proxy_untouched() {
    let mut simulation = Simulation::new(3, Ebpf, 1);
    simulation.broken_agents.push("node-2".into());
    for _ in 0..400 {
        simulation.round();
    }
    assert_eq!(simulation.phases.last(), Some(&DataplanePhase::Halted));
    assert!(simulation.kube_proxy_actions.is_empty());
    let status = simulation.config.status.as_ref().expect("status");
    assert!(status
        .message
        .as_deref()
        .is_some_and(|message| message.contains("node-2")));
    // The node recovers: the transition finishes by itself.
    simulation.broken_agents.clear();
    simulation.run_until_ready(60);
}

#[test]
fn a_rolling_agent_upgrade_replaces_one_batch_at_a_time() {
    let mut simulation = Simulation::new(4, Ebpf, 2);
    simulation.run_until_ready(60);
    simulation.cluster.agent_daemon_set = Some(AgentDaemonSet {
        update_revision: Some(NEW_REVISION.into()),
    });
    simulation.phases.clear();
    let mut deleted_per_round = Vec::new();
    for _ in 0..20 {
        let plan = simulation.round();
        deleted_per_round.push(plan.agent_pods_to_delete.len());
        if phase(&plan) == DataplanePhase::Ready {
            break;
        }
    }
    assert_eq!(
        deleted_per_round
            .iter()
            .filter(|count| **count > 0)
            .copied()
            .collect::<Vec<_>>(),
        vec![2, 2]
    );
    assert!(simulation.cluster.nodes.iter().all(|node| node
        .agent_pod
        .as_ref()
        .and_then(|pod| pod.revision.as_deref())
        == Some(NEW_REVISION)));
    assert_eq!(simulation.phases.last(), Some(&DataplanePhase::Ready));
}

#[test]
fn on_an_untouched_cluster_a_default_config_spec_equals_the_no_config_behaviour() {
    let cluster = cluster(vec![kube_proxy_node("node-1"), bare_node("node-2")]);
    let without = plan(None, &cluster);
    let with = plan(
        Some(&DataplaneConfig::new(
            "default",
            DataplaneConfigSpec::default(),
        )),
        &cluster,
    );
    assert_eq!(without.dataplane_nodes, with.dataplane_nodes);
    assert_eq!(without.kube_proxy, with.kube_proxy);
}

// ---------------------------------------------------------------------------------------------
// What the plan holds is what the operator does: the write budget and the requeues
// ---------------------------------------------------------------------------------------------

/// `count` Nodes without DataplaneNodes, listed in reverse name order.
fn many_new_nodes(count: usize) -> ObservedCluster {
    cluster(
        (0..count)
            .rev()
            .map(|index| bare_node(&format!("node-{index:04}")))
            .collect(),
    )
}

#[test]
fn a_plan_holds_at_most_the_write_budget_in_node_name_order_and_the_next_plan_takes_the_rest() {
    let extra = 7;
    let mut cluster = many_new_nodes(MAX_NODE_WRITES_PER_RECONCILE + extra);
    for config in [None, Some(config(KubeProxy))] {
        let first = plan(config.as_ref(), &cluster);
        let names: Vec<&str> = first
            .dataplane_nodes
            .iter()
            .map(|write| write.node_name.as_str())
            .collect();
        let expected: Vec<String> = (0..MAX_NODE_WRITES_PER_RECONCILE)
            .map(|index| format!("node-{index:04}"))
            .collect();
        assert_eq!(names, expected, "{config:?}: the first nodes by name");
        assert_eq!(
            first.requeue_after,
            Some(std::time::Duration::ZERO),
            "{config:?}: writes are left over, plan again at once"
        );
    }

    // The operator writes the first batch; the next plan takes exactly the rest.
    let first = plan(None, &cluster);
    for write in &first.dataplane_nodes {
        let node = node_mut(&mut cluster, &write.node_name);
        set_spec(node, write.spec.mode, write.spec.iptables_cleanup, at(0));
    }
    let second = plan(None, &cluster);
    let rest: Vec<&str> = second
        .dataplane_nodes
        .iter()
        .map(|write| write.node_name.as_str())
        .collect();
    let expected: Vec<String> = (MAX_NODE_WRITES_PER_RECONCILE
        ..MAX_NODE_WRITES_PER_RECONCILE + extra)
        .map(|index| format!("node-{index:04}"))
        .collect();
    assert_eq!(rest, expected);
    assert_eq!(
        second.requeue_after, None,
        "nothing left over: no immediate requeue"
    );
}

#[test]
fn a_plan_within_the_write_budget_is_whole_and_keeps_its_own_requeue() {
    let cluster = many_new_nodes(MAX_NODE_WRITES_PER_RECONCILE);
    let plan = plan(None, &cluster);
    assert_eq!(plan.dataplane_nodes.len(), MAX_NODE_WRITES_PER_RECONCILE);
    assert_eq!(plan.requeue_after, None);
}

#[test]
fn a_refused_patch_permission_is_asked_again_soon_without_waiting_for_a_trigger() {
    let mut cluster = three_kube_proxy_nodes();
    let refuse = |cluster: &mut ObservedCluster, allowed| {
        cluster
            .kube_proxy_daemon_set
            .as_mut()
            .expect("daemon set")
            .patch_allowed = allowed;
    };
    refuse(&mut cluster, Some(false));
    let refused = plan(Some(&ebpf_config()), &cluster);
    assert_eq!(phase(&refused), DataplanePhase::Preflight);
    assert_eq!(refused.requeue_after, Some(PATCH_PERMISSION_RECHECK));

    let mut paused = ebpf_config();
    paused.spec.paused = true;
    assert_eq!(
        plan(Some(&paused), &cluster).requeue_after,
        Some(PATCH_PERMISSION_RECHECK),
        "a paused transition still learns of a fixed Role"
    );
    for (own, expected) in [(None, 10), (Some(3), 3), (Some(20), 10)] {
        let mut plan = Plan {
            requeue_after: own.map(std::time::Duration::from_secs),
            ..Plan::nothing()
        };
        plan.requeue_within(PATCH_PERMISSION_RECHECK);
        assert_eq!(
            plan.requeue_after,
            Some(std::time::Duration::from_secs(expected)),
            "{own:?}"
        );
    }

    // Control: allowed, or not known, the plan keeps its own requeue.
    for allowed in [Some(true), None] {
        refuse(&mut cluster, allowed);
        let plan = plan(Some(&ebpf_config()), &cluster);
        assert_ne!(phase(&plan), DataplanePhase::Preflight, "{allowed:?}");
        assert_ne!(
            plan.requeue_after,
            Some(PATCH_PERMISSION_RECHECK),
            "{allowed:?}"
        );
    }
}
