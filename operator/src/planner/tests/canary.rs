//! Canary transitions: canaries first, soaks from the agents' timestamps, every budget
//! decision, late and missing signals, Rollback and Halt, a node that recovers, a spec change
//! during the soak, and the invariant that a node over budget is never followed by another
//! activation (a property test).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use proptest::prelude::*;
use switchyard_crds::{
    condition_types as types, reasons, BudgetExceededAction, BudgetedSignal, CanarySpec,
    ConditionStatus, DataplaneConfig,
    DataplaneMode::{Ebpf, KubeProxy},
    DataplanePhase, DisruptionBudget, DisruptionReport, ServiceSignals, SignalWindow,
};

use super::super::canary::over_budget;
use super::super::*;
use super::fixtures::*;

/// `count` failed connects (and nothing else measured) between `start` and `end`.
fn window(start: i64, end: i64, failed_connects: i64) -> SignalWindow {
    SignalWindow {
        start: at(start),
        end: at(end),
        datapath: Default::default(),
        expected: Default::default(),
        connections: switchyard_crds::ConnectionSignals {
            failed_connects: Some(failed_connects),
            syn_retransmits: Some(0),
            resets_by_peer: Some(0),
        },
        probes: switchyard_crds::ProbeSignals {
            sent: Some(60),
            failures: Some(0),
        },
        services: Vec::new(),
    }
}

/// The ten minutes before `switched`, with `failed_connects` failed connects.
fn baseline_before(switched: i64, failed_connects: i64) -> SignalWindow {
    window(switched - 600, switched, failed_connects)
}

/// Tells the node `Ebpf` at `switched`; its agent attached its programs then.
fn switch(node: &mut ObservedNode, switched: i64) {
    set_spec(node, Ebpf, false, at(switched));
    report(node, Report::following(Ebpf), None, OLD_REVISION);
    conditions_changed_at(node, at(switched));
}

/// The node's agent reports these disruption windows.
fn measure(node: &mut ObservedNode, baseline: Option<SignalWindow>, current: Option<SignalWindow>) {
    let status = node
        .dataplane_node
        .as_mut()
        .map(Arc::make_mut)
        .and_then(|node| node.status.as_mut())
        .expect("measure needs a reported status");
    status.disruption = Some(DisruptionReport { baseline, current });
}

fn four_kube_proxy_nodes() -> ObservedCluster {
    cluster(
        (1..=4)
            .map(|index| kube_proxy_node(&format!("node-{index}")))
            .collect(),
    )
}

/// Toward Ebpf, two nodes at a time, with `canary: {}`: the canary's defaults, one node and a
/// minute of soak (the canary is opt-in).
fn canary_config() -> DataplaneConfig {
    let mut config = with_max_unavailable(config(Ebpf), IntOrString::Int(2));
    config.spec.rollout.canary = Some(CanarySpec::default());
    config
}

/// The spec's canary, given as `{}` first if it had none.
fn canary_mut(config: &mut DataplaneConfig) -> &mut CanarySpec {
    config
        .spec
        .rollout
        .canary
        .get_or_insert_with(CanarySpec::default)
}

/// node-1, the canary, switched at `switched` and measured: `failed_connects` failed connects
/// in the window from the switch to now (at(0)), 5 in the ten minutes before.
fn canary_measured(switched: i64, failed_connects: i64) -> ObservedCluster {
    let mut cluster = four_kube_proxy_nodes();
    let node = node_mut(&mut cluster, "node-1");
    switch(node, switched);
    measure(
        node,
        Some(baseline_before(switched, 5)),
        Some(window(switched, 0, failed_connects)),
    );
    cluster
}

fn budget_exceeded(plan: &Plan) -> &switchyard_crds::BudgetExceeded {
    plan.status
        .as_ref()
        .and_then(|status| status.budget_exceeded.as_ref())
        .expect("the status records the budget exceeded")
}

/// Plans, checking the invariants every plan keeps.
fn checked_plan(config: &DataplaneConfig, cluster: &ObservedCluster) -> Plan {
    let plan = plan(Some(config), cluster);
    check_invariants(Some(config), cluster, &plan);
    plan
}

fn activated(plan: &Plan) -> Vec<&str> {
    plan.dataplane_nodes
        .iter()
        .filter(|write| write.spec.mode == Ebpf)
        .map(|write| write.node_name.as_str())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Opt-in: no canary, the transition as before canaries existed
// ---------------------------------------------------------------------------------------------

/// Four nodes toward Ebpf, two at a time; node-1 told `Ebpf` and serving since `switched`,
/// its agent reporting a baseline but no window after the switch (signals the canary would
/// wait for).
fn one_switched_node_with_a_baseline_only(switched: i64) -> ObservedCluster {
    let mut cluster = four_kube_proxy_nodes();
    let node = node_mut(&mut cluster, "node-1");
    switch(node, switched);
    measure(node, Some(baseline_before(switched, 0)), None);
    cluster
}

/// Every node told `Ebpf` and serving since 10 s ago, measured, within budget.
fn every_node_switched_just_now() -> ObservedCluster {
    let mut cluster = four_kube_proxy_nodes();
    for index in 1..=4 {
        let node = node_mut(&mut cluster, &format!("node-{index}"));
        switch(node, -10);
        measure(node, Some(baseline_before(-10, 0)), Some(window(-10, 0, 0)));
    }
    cluster
}

#[test]
fn a_transition_without_a_canary_never_waits_for_disruption_signals() {
    let without_canary = with_max_unavailable(config(Ebpf), IntOrString::Int(2));
    assert_eq!(without_canary.spec.rollout.canary, None);
    let with_empty_canary = canary_config();
    assert_eq!(
        with_empty_canary.spec.rollout.canary,
        Some(CanarySpec::default()),
        "control: `canary: {{}}`"
    );

    // The first batch: maxUnavailable nodes, not one canary.
    let first = checked_plan(&without_canary, &four_kube_proxy_nodes());
    assert_eq!(activated(&first), ["node-1", "node-2"]);
    let first_with_canary = checked_plan(&with_empty_canary, &four_kube_proxy_nodes());
    assert_eq!(activated(&first_with_canary), ["node-1"], "control");

    // Right after the switch (a canary would soak) and long after it, past the signals' bound
    // (a canary would halt with DisruptionSignalsMissing): the next batch goes.
    for switched in [-10, -10_000] {
        let cluster = one_switched_node_with_a_baseline_only(switched);
        let plan = checked_plan(&without_canary, &cluster);
        assert_eq!(
            activated(&plan),
            ["node-2", "node-3"],
            "switched at {switched}: {}",
            message(&plan)
        );
        assert_eq!(phase(&plan), DataplanePhase::ActivatingNodes);
        for canary_word in ["soak", "disruption signals", "canar"] {
            assert!(
                !message(&plan).contains(canary_word),
                "switched at {switched}: {}",
                message(&plan)
            );
        }
        // The only deadline: nodeReadyTimeoutSeconds of the nodes just told (no soak's end).
        assert_eq!(
            plan.requeue_after,
            Some(std::time::Duration::from_secs(300)),
            "switched at {switched}"
        );

        let control = checked_plan(&with_empty_canary, &cluster);
        assert!(
            activated(&control).is_empty(),
            "control, switched at {switched}: {}",
            message(&control)
        );
        assert!(
            message(&control).contains("soaking node-1")
                || message(&control).contains("disruption signals"),
            "control, switched at {switched}: {}",
            message(&control)
        );
    }

    // Every node serves from eBPF: kube-proxy goes at once, no last soak.
    let cluster = every_node_switched_just_now();
    let plan = checked_plan(&without_canary, &cluster);
    assert_eq!(phase(&plan), DataplanePhase::DisablingKubeProxy);
    assert_ne!(plan.kube_proxy, KubeProxyAction::None);
    let control = checked_plan(&with_empty_canary, &cluster);
    assert_eq!(phase(&control), DataplanePhase::ActivatingNodes, "control");
    assert_eq!(control.kube_proxy, KubeProxyAction::None, "control");
}

#[test]
fn budget_fields_without_a_canary_are_not_read() {
    let mut config = with_max_unavailable(config(Ebpf), IntOrString::Int(2));
    // Never judged without a canary, so not refused either.
    config
        .spec
        .rollout
        .disruption_budget
        .failed_connects_percent = -1;
    let plan = checked_plan(&config, &four_kube_proxy_nodes());
    assert_eq!(activated(&plan), ["node-1", "node-2"], "{}", message(&plan));

    canary_mut(&mut config);
    let control = checked_plan(&config, &four_kube_proxy_nodes());
    assert!(
        activated(&control).is_empty(),
        "control: refused with a canary"
    );
    assert!(
        condition_of(&control, types::DEGRADED)
            .message
            .contains("rollout.disruptionBudget.failedConnectsPercent"),
        "{}",
        condition_of(&control, types::DEGRADED).message
    );
}

// ---------------------------------------------------------------------------------------------
// Canaries first
// ---------------------------------------------------------------------------------------------

#[test]
fn the_first_plan_switches_only_the_one_canary_although_max_unavailable_allows_two() {
    let plan = checked_plan(&canary_config(), &four_kube_proxy_nodes());
    assert_eq!(activated(&plan), ["node-1"]);
    assert!(
        message(&plan).contains("canaries go first (rollout.canary.count 1, soak 60s)"),
        "{}",
        message(&plan)
    );
}

#[test]
fn a_canary_count_of_three_switches_three_nodes_first_within_max_unavailable() {
    let mut config = canary_config();
    canary_mut(&mut config).count = Some(3);
    let plan = checked_plan(&config, &four_kube_proxy_nodes());
    assert_eq!(
        activated(&plan),
        ["node-1", "node-2"],
        "maxUnavailable still limits"
    );

    let mut cluster = four_kube_proxy_nodes();
    switch(node_mut(&mut cluster, "node-1"), -5);
    switch(node_mut(&mut cluster, "node-2"), -5);
    measure(
        node_mut(&mut cluster, "node-1"),
        Some(baseline_before(-5, 0)),
        Some(window(-5, 0, 0)),
    );
    measure(
        node_mut(&mut cluster, "node-2"),
        Some(baseline_before(-5, 0)),
        Some(window(-5, 0, 0)),
    );
    let plan = checked_plan(&config, &cluster);
    assert_eq!(
        activated(&plan),
        ["node-3"],
        "the third canary goes while the first two soak; the fourth node waits"
    );
}

#[test]
fn no_other_node_switches_while_the_canary_soaks_and_the_plan_wakes_when_the_soak_ends() {
    let cluster = canary_measured(-20, 0);
    let plan = checked_plan(&canary_config(), &cluster);
    assert!(activated(&plan).is_empty(), "{:?}", plan.dataplane_nodes);
    assert_eq!(phase(&plan), DataplanePhase::ActivatingNodes);
    assert!(
        message(&plan).contains("soaking node-1"),
        "{}",
        message(&plan)
    );
    assert_eq!(
        plan.requeue_after,
        Some(std::time::Duration::from_secs(40)),
        "soak of 60 s from the switch 20 s ago"
    );
}

#[test]
fn a_canary_within_budget_after_its_soak_lets_the_next_batch_of_max_unavailable_go() {
    let cluster = canary_measured(-61, 10);
    let plan = checked_plan(&canary_config(), &cluster);
    assert_eq!(activated(&plan), ["node-2", "node-3"]);
    assert_eq!(
        condition_of(&plan, types::DEGRADED).status,
        ConditionStatus::False
    );
}

#[test]
fn later_batches_soak_a_third_of_the_canary_soak_by_default_or_batch_soak_seconds() {
    let mut cluster = canary_measured(-200, 0);
    let node = node_mut(&mut cluster, "node-2");
    switch(node, -15);
    measure(node, Some(baseline_before(-15, 0)), Some(window(-15, 0, 0)));
    let plan = checked_plan(&canary_config(), &cluster);
    assert!(activated(&plan).is_empty(), "node-2 soaks 20 s");
    assert_eq!(plan.requeue_after, Some(std::time::Duration::from_secs(5)));

    let mut config = canary_config();
    canary_mut(&mut config).batch_soak_seconds = Some(10);
    let plan = checked_plan(&config, &cluster);
    assert_eq!(
        activated(&plan),
        ["node-3", "node-4"],
        "control: a 10 s batch soak is over"
    );
}

#[test]
fn the_last_batch_soaks_before_kube_proxy_is_disabled() {
    let mut cluster = canary_measured(-300, 0);
    for name in ["node-2", "node-3", "node-4"] {
        let node = node_mut(&mut cluster, name);
        switch(node, -10);
        measure(node, Some(baseline_before(-10, 0)), Some(window(-10, 0, 0)));
    }
    let plan = checked_plan(&canary_config(), &cluster);
    assert_eq!(phase(&plan), DataplanePhase::ActivatingNodes);
    assert_eq!(plan.kube_proxy, KubeProxyAction::None);
    assert!(
        message(&plan).contains("before kube-proxy is disabled"),
        "{}",
        message(&plan)
    );

    cluster.now = at(11);
    for name in ["node-2", "node-3", "node-4"] {
        measure(
            node_mut(&mut cluster, name),
            Some(baseline_before(-10, 0)),
            Some(window(-10, 11, 0)),
        );
    }
    let plan = checked_plan(&canary_config(), &cluster);
    assert_eq!(
        phase(&plan),
        DataplanePhase::DisablingKubeProxy,
        "control: soaked"
    );
    assert_eq!(plan.kube_proxy, KubeProxyAction::Disable);
}

#[test]
fn an_agent_that_reports_no_signals_is_not_soaked_and_the_status_says_it_was_not_measured() {
    let mut cluster = four_kube_proxy_nodes();
    switch(node_mut(&mut cluster, "node-1"), -1);
    let plan = checked_plan(&canary_config(), &cluster);
    assert_eq!(activated(&plan), ["node-2", "node-3"]);
    assert!(
        message(&plan).contains("canary node-1 not measured"),
        "{}",
        message(&plan)
    );
}

// ---------------------------------------------------------------------------------------------
// Budget decisions
// ---------------------------------------------------------------------------------------------

/// Whether failed connects of `before` per minute over ten minutes then `after` per minute over
/// one minute exceed `budget`.
fn failed_connects_over(
    before_per_minute: i64,
    after_per_minute: i64,
    budget: &DisruptionBudget,
) -> bool {
    !over_budget(
        "node-1",
        &window(-660, -60, before_per_minute * 10),
        &window(-60, 0, after_per_minute),
        budget,
    )
    .is_empty()
}

#[test]
fn a_quiet_node_is_judged_by_the_absolute_allowance_and_a_busy_one_by_the_relative_one() {
    let budget = DisruptionBudget::default();
    // Quiet: baseline 0, allowance 30 per minute.
    assert!(!failed_connects_over(0, 30, &budget));
    assert!(failed_connects_over(0, 31, &budget));
    // Busy: baseline 100, doubling allowed (100%), beyond the absolute 30.
    assert!(!failed_connects_over(100, 200, &budget));
    assert!(failed_connects_over(100, 201, &budget));
    // In between: the larger limit applies (baseline 20: 50 by the absolute, 40 by the relative).
    assert!(!failed_connects_over(20, 50, &budget));
    assert!(failed_connects_over(20, 51, &budget));
    // Fewer failures than before is never over budget.
    assert!(!failed_connects_over(100, 0, &budget));
}

#[test]
fn a_zero_budget_trips_on_a_single_failure_more_than_the_baseline() {
    let budget = DisruptionBudget {
        failed_connects_per_minute: 0,
        failed_connects_percent: 0,
        ..DisruptionBudget::default()
    };
    assert!(failed_connects_over(3, 4, &budget));
    assert!(
        !failed_connects_over(3, 3, &budget),
        "control: the baseline itself is allowed"
    );
}

#[test]
fn resets_and_probe_failures_have_budgets_of_their_own_and_name_the_services_most_affected() {
    let budget = DisruptionBudget::default();
    let baseline = window(-660, -60, 0);
    let mut current = window(-60, 0, 0);
    current.connections.resets_by_peer = Some(31);
    current.probes.failures = Some(7);
    current.services = vec![
        ServiceSignals {
            namespace: "shop".into(),
            name: "cart".into(),
            failed_connects: None,
            resets_by_peer: Some(25),
            probe_failures: Some(7),
        },
        ServiceSignals {
            namespace: "shop".into(),
            name: "web".into(),
            failed_connects: None,
            resets_by_peer: Some(6),
            probe_failures: None,
        },
    ];
    let evidence = over_budget("node-1", &baseline, &current, &budget);
    let signals: Vec<BudgetedSignal> = evidence.iter().map(|piece| piece.signal).collect();
    assert_eq!(
        signals,
        [BudgetedSignal::ResetsByPeer, BudgetedSignal::ProbeFailures]
    );
    let resets = &evidence[0];
    assert_eq!(
        (
            resets.baseline_per_minute.as_str(),
            resets.observed_per_minute.as_str(),
            resets.allowed_per_minute.as_str()
        ),
        ("0.0", "31.0", "30.0")
    );
    let named: Vec<(&str, i64)> = resets
        .services
        .iter()
        .map(|service| (service.name.as_str(), service.count))
        .collect();
    assert_eq!(named, [("cart", 25), ("web", 6)], "worst first");
    assert_eq!(
        evidence[1].services.len(),
        1,
        "only Services with probe failures"
    );

    current.connections.resets_by_peer = Some(30);
    current.probes.failures = Some(6);
    assert!(
        over_budget("node-1", &baseline, &current, &budget).is_empty(),
        "control: at the allowances nothing is over budget"
    );
}

#[test]
fn expected_drops_and_datapath_counts_never_trip_the_budget() {
    let mut current = window(-60, 0, 0);
    current.expected.refused_without_ready_endpoints = Some(100_000);
    current.expected.source_range_drops = Some(100_000);
    current.datapath.translation_errors = Some(3);
    current.connections.syn_retransmits = Some(500);
    assert!(over_budget(
        "node-1",
        &window(-660, -60, 0),
        &current,
        &DisruptionBudget::default()
    )
    .is_empty());
}

#[test]
fn a_window_shorter_than_a_minute_counts_as_a_whole_minute() {
    let budget = DisruptionBudget::default();
    // 20 failures in 10 s would be 120 per minute; counted over a minute they are 20.
    assert!(over_budget(
        "node-1",
        &window(-660, -60, 0),
        &window(-10, 0, 20),
        &budget
    )
    .is_empty());
    assert!(
        !over_budget(
            "node-1",
            &window(-660, -60, 0),
            &window(-10, 0, 31),
            &budget
        )
        .is_empty(),
        "control: more than a minute's allowance in a short window is over budget at once"
    );
}

#[test]
fn numbers_beyond_the_schemas_ranges_neither_panic_nor_trip() {
    let huge = DisruptionBudget {
        failed_connects_per_minute: i64::MAX,
        failed_connects_percent: i64::MAX,
        ..DisruptionBudget::default()
    };
    assert!(!failed_connects_over(0, i64::MAX / 60, &huge));
    assert!(!failed_connects_over(i64::MAX / 600, i64::MAX / 600, &huge));
    let mut config = canary_config();
    canary_mut(&mut config).soak_seconds = i64::MAX;
    config.spec.rollout.node_ready_timeout_seconds = i64::MAX;
    let plan = checked_plan(&config, &canary_measured(-61, 0));
    assert!(
        plan.dataplane_nodes.is_empty(),
        "an endless soak holds the next batch"
    );
    assert!(
        message(&plan).contains("soaking node-1"),
        "{}",
        message(&plan)
    );
}

#[test]
fn a_signal_missing_from_the_baseline_counts_from_zero() {
    let mut baseline = window(-660, -60, 0);
    baseline.connections.failed_connects = None;
    assert!(!over_budget(
        "node-1",
        &baseline,
        &window(-60, 0, 31),
        &DisruptionBudget::default()
    )
    .is_empty());
}

// ---------------------------------------------------------------------------------------------
// Over budget: Rollback and Halt
// ---------------------------------------------------------------------------------------------

#[test]
fn a_canary_over_budget_is_rolled_back_by_itself_with_the_evidence_in_status() {
    let mut cluster = canary_measured(-61, 120);
    let node = node_mut(&mut cluster, "node-1");
    let status = node
        .dataplane_node
        .as_mut()
        .map(Arc::make_mut)
        .and_then(|node| node.status.as_mut())
        .and_then(|status| status.disruption.as_mut())
        .and_then(|report| report.current.as_mut())
        .expect("a window");
    status.services = vec![ServiceSignals {
        namespace: "shop".into(),
        name: "cart".into(),
        failed_connects: Some(118),
        resets_by_peer: None,
        probe_failures: None,
    }];
    let plan = checked_plan(&canary_config(), &cluster);
    assert_eq!(
        written_modes(&plan),
        [("node-1", KubeProxy)],
        "only the canary goes back"
    );
    assert_eq!(phase(&plan), DataplanePhase::Halted);
    let degraded = condition_of(&plan, types::DEGRADED);
    assert_eq!(degraded.reason, reasons::DISRUPTION_BUDGET_EXCEEDED);
    assert!(
        degraded.message.contains("node-1: failed connects 0.5 -> 118.0 per minute (allowed 30.5; most affected: shop/cart 118)"),
        "{}",
        degraded.message
    );
    let record = budget_exceeded(&plan);
    assert_eq!(record.action, BudgetExceededAction::Rollback);
    assert_eq!(record.observed_generation, 1);
    assert_eq!(record.detected_at, at(0));
    assert_eq!(record.evidence.len(), 1);
    assert_eq!(record.evidence[0].node, "node-1");
    assert_eq!(record.evidence[0].signal, BudgetedSignal::FailedConnects);
    assert_eq!(record.evidence[0].observed_per_minute, "118.0");
}

#[test]
fn a_canary_over_budget_is_caught_during_its_soak_not_only_at_its_end() {
    let cluster = canary_measured(-20, 45);
    let plan = checked_plan(&canary_config(), &cluster);
    assert_eq!(written_modes(&plan), [("node-1", KubeProxy)]);
    assert_eq!(phase(&plan), DataplanePhase::Halted);
}

#[test]
fn a_rollback_waits_for_kube_proxy_to_be_healthy_on_the_node_before_it_leaves_ebpf() {
    let mut cluster = canary_measured(-61, 120);
    let node = node_mut(&mut cluster, "node-1");
    let mut unhealthy = Report::following(Ebpf);
    unhealthy.kube_proxy_healthy = false;
    let disruption = node
        .dataplane_node
        .as_ref()
        .and_then(|node| node.status.as_ref())
        .and_then(|status| status.disruption.clone());
    report(node, unhealthy, None, OLD_REVISION);
    conditions_changed_at(node, at(-61));
    measure(
        node,
        disruption.as_ref().and_then(|d| d.baseline.clone()),
        disruption.and_then(|d| d.current),
    );
    let plan = checked_plan(&canary_config(), &cluster);
    assert!(
        plan.dataplane_nodes.is_empty(),
        "{:?}",
        plan.dataplane_nodes
    );
    assert_eq!(phase(&plan), DataplanePhase::Halted);
    assert!(
        message(&plan).contains("waiting for kube-proxy to be healthy on node-1"),
        "{}",
        message(&plan)
    );
}

/// The status a plan published, as the next reconcile reads it.
fn published(mut config: DataplaneConfig, plan: &Plan) -> DataplaneConfig {
    config.status = plan.status.clone();
    config
}

#[test]
fn a_rolled_back_transition_does_not_start_again_until_the_spec_changes() {
    let config = canary_config();
    let first = checked_plan(&config, &canary_measured(-61, 120));
    let config = published(config, &first);

    // The canary is back on kube-proxy, its signals clean: nothing switches under this spec.
    let mut cluster = four_kube_proxy_nodes();
    set_spec(node_mut(&mut cluster, "node-1"), KubeProxy, false, at(0));
    report(
        node_mut(&mut cluster, "node-1"),
        Report::following(KubeProxy),
        None,
        OLD_REVISION,
    );
    cluster.now = at(600);
    let held = checked_plan(&config, &cluster);
    assert!(
        held.dataplane_nodes.is_empty(),
        "{:?}",
        held.dataplane_nodes
    );
    assert_eq!(phase(&held), DataplanePhase::Halted);
    assert!(
        message(&held).contains("node-1 back on kube-proxy"),
        "{}",
        message(&held)
    );
    assert!(message(&held).contains("starts again when the spec changes"));
    assert_eq!(
        budget_exceeded(&held),
        budget_exceeded(&first),
        "the evidence is kept"
    );

    // A spec change (a new generation) starts it again and forgets the evidence.
    let mut changed = published(config, &held);
    changed.metadata.generation = Some(2);
    let again = checked_plan(&changed, &cluster);
    assert_eq!(activated(&again), ["node-1"]);
    assert_eq!(
        again
            .status
            .as_ref()
            .and_then(|status| status.budget_exceeded.as_ref()),
        None
    );
}

#[test]
fn halt_holds_the_transition_while_the_canary_is_over_budget_and_goes_on_once_it_recovers() {
    let mut config = canary_config();
    config.spec.rollout.on_budget_exceeded = BudgetExceededAction::Halt;
    let over = checked_plan(&config, &canary_measured(-61, 120));
    assert!(
        over.dataplane_nodes.is_empty(),
        "Halt switches nothing back: {:?}",
        over.dataplane_nodes
    );
    assert_eq!(phase(&over), DataplanePhase::Halted);
    assert_eq!(
        condition_of(&over, types::DEGRADED).reason,
        reasons::DISRUPTION_BUDGET_EXCEEDED
    );
    assert_eq!(budget_exceeded(&over).action, BudgetExceededAction::Halt);

    // The node recovers: its window no longer shows the failures.
    let config = published(config, &over);
    let mut recovered = canary_measured(-61, 120);
    recovered.now = at(300);
    measure(
        node_mut(&mut recovered, "node-1"),
        Some(baseline_before(-61, 5)),
        Some(window(200, 300, 2)),
    );
    let plan = checked_plan(&config, &recovered);
    assert_eq!(activated(&plan), ["node-2", "node-3"]);
    assert_eq!(
        condition_of(&plan, types::DEGRADED).status,
        ConditionStatus::False
    );
    assert_eq!(
        budget_exceeded(&plan).evidence[0].observed_per_minute,
        "118.0",
        "the first evidence under this spec stays on record"
    );
}

#[test]
fn a_second_node_over_budget_during_a_rollback_goes_back_too_and_joins_the_evidence() {
    let config = canary_config();
    let mut cluster = canary_measured(-300, 0);
    for name in ["node-2", "node-3"] {
        let node = node_mut(&mut cluster, name);
        switch(node, -30);
        measure(node, Some(baseline_before(-30, 0)), Some(window(-30, 0, 0)));
    }
    measure(
        node_mut(&mut cluster, "node-2"),
        Some(baseline_before(-30, 0)),
        Some(window(-30, 0, 90)),
    );
    let first = checked_plan(&config, &cluster);
    assert_eq!(written_modes(&first), [("node-2", KubeProxy)]);
    let config = published(config, &first);

    measure(
        node_mut(&mut cluster, "node-3"),
        Some(baseline_before(-30, 0)),
        Some(window(-30, 0, 90)),
    );
    let second = checked_plan(&config, &cluster);
    assert_eq!(
        written_modes(&second),
        [("node-2", KubeProxy), ("node-3", KubeProxy)]
    );
    let nodes: Vec<&str> = budget_exceeded(&second)
        .evidence
        .iter()
        .map(|piece| piece.node.as_str())
        .collect();
    assert_eq!(nodes, ["node-2", "node-3"]);
    assert_eq!(
        budget_exceeded(&second).detected_at,
        budget_exceeded(&first).detected_at
    );
}

// ---------------------------------------------------------------------------------------------
// Missing and late signals
// ---------------------------------------------------------------------------------------------

#[test]
fn a_missing_baseline_is_waited_for_until_the_bound_then_the_node_is_judged_against_none() {
    let mut cluster = four_kube_proxy_nodes();
    switch(node_mut(&mut cluster, "node-1"), -61);
    measure(
        node_mut(&mut cluster, "node-1"),
        None,
        Some(window(-61, 0, 20)),
    );
    let waiting = checked_plan(&canary_config(), &cluster);
    assert!(waiting.dataplane_nodes.is_empty());
    assert_eq!(phase(&waiting), DataplanePhase::ActivatingNodes);
    assert!(
        message(&waiting).contains("waiting for disruption signals"),
        "{}",
        message(&waiting)
    );
    // The bound: nodeReadyTimeoutSeconds (300) after the soak's end (at -1).
    assert_eq!(
        waiting.requeue_after,
        Some(std::time::Duration::from_secs(299))
    );

    // At the bound: 20 failed connects a minute against no baseline, within the 30 allowed.
    cluster.now = at(299);
    measure(
        node_mut(&mut cluster, "node-1"),
        None,
        Some(window(239, 299, 20)),
    );
    let judged = checked_plan(&canary_config(), &cluster);
    assert_eq!(activated(&judged), ["node-2", "node-3"]);
    assert!(
        message(&judged).contains("node-1 judged without a baseline"),
        "{}",
        message(&judged)
    );

    // Control: 31 a minute against no baseline is over budget.
    measure(
        node_mut(&mut cluster, "node-1"),
        None,
        Some(window(239, 299, 31)),
    );
    let over = checked_plan(&canary_config(), &cluster);
    assert_eq!(written_modes(&over), [("node-1", KubeProxy)]);
    assert_eq!(
        budget_exceeded(&over).evidence[0].baseline_per_minute,
        "0.0"
    );
}

#[test]
fn no_window_after_the_switch_is_waited_for_until_the_bound_then_the_transition_halts() {
    let mut cluster = four_kube_proxy_nodes();
    switch(node_mut(&mut cluster, "node-1"), -61);
    measure(
        node_mut(&mut cluster, "node-1"),
        Some(baseline_before(-61, 0)),
        None,
    );
    let waiting = checked_plan(&canary_config(), &cluster);
    assert!(waiting.dataplane_nodes.is_empty());
    assert!(
        message(&waiting).contains("waiting for disruption signals"),
        "{}",
        message(&waiting)
    );

    cluster.now = at(299);
    let halted = checked_plan(&canary_config(), &cluster);
    assert!(
        halted.dataplane_nodes.is_empty(),
        "nothing is rolled back: {:?}",
        halted.dataplane_nodes
    );
    assert_eq!(phase(&halted), DataplanePhase::Halted);
    let degraded = condition_of(&halted, types::DEGRADED);
    assert_eq!(degraded.reason, reasons::DISRUPTION_SIGNALS_MISSING);
    assert!(
        degraded
            .message
            .contains("node-1 (a window of signals covering the soak)"),
        "{}",
        degraded.message
    );

    measure(
        node_mut(&mut cluster, "node-1"),
        Some(baseline_before(-61, 0)),
        Some(window(-61, 299, 3)),
    );
    let resumed = checked_plan(&canary_config(), &cluster);
    assert_eq!(
        activated(&resumed),
        ["node-2", "node-3"],
        "the signals arrived: it resumes"
    );
}

#[test]
fn signals_that_arrive_late_are_waited_for_and_a_window_covering_the_soak_then_passes() {
    let mut cluster = four_kube_proxy_nodes();
    switch(node_mut(&mut cluster, "node-1"), -90);
    // The last window ends 40 s after the switch: it does not cover the 60 s soak.
    measure(
        node_mut(&mut cluster, "node-1"),
        Some(baseline_before(-90, 0)),
        Some(window(-90, -50, 0)),
    );
    let late = checked_plan(&canary_config(), &cluster);
    assert!(late.dataplane_nodes.is_empty());
    assert!(
        message(&late).contains("waiting for disruption signals"),
        "{}",
        message(&late)
    );

    measure(
        node_mut(&mut cluster, "node-1"),
        Some(baseline_before(-90, 0)),
        Some(window(-90, -25, 0)),
    );
    let covered = checked_plan(&canary_config(), &cluster);
    assert_eq!(activated(&covered), ["node-2", "node-3"]);
}

#[test]
fn windows_a_second_or_two_off_the_switch_time_are_taken_as_starting_and_ending_at_it() {
    let mut cluster = four_kube_proxy_nodes();
    switch(node_mut(&mut cluster, "node-1"), -90);
    // The agent sampled at 2 s before its condition's time, and froze its baseline 2 s after.
    measure(
        node_mut(&mut cluster, "node-1"),
        Some(baseline_before(-88, 0)),
        Some(window(-92, 0, 500)),
    );
    let plan = checked_plan(&canary_config(), &cluster);
    assert_eq!(
        written_modes(&plan),
        [("node-1", KubeProxy)],
        "judged: over budget"
    );
}

#[test]
fn a_window_that_starts_before_the_switch_is_not_taken_as_evidence_about_ebpf() {
    let mut cluster = four_kube_proxy_nodes();
    switch(node_mut(&mut cluster, "node-1"), -90);
    measure(
        node_mut(&mut cluster, "node-1"),
        Some(baseline_before(-90, 0)),
        Some(window(-95, 0, 500)),
    );
    let plan = checked_plan(&canary_config(), &cluster);
    assert!(
        plan.dataplane_nodes.is_empty(),
        "neither a rollback nor a next batch"
    );
    assert!(
        message(&plan).contains("waiting for disruption signals"),
        "{}",
        message(&plan)
    );
}

// ---------------------------------------------------------------------------------------------
// Spec changes during the soak, node selectors, invalid input
// ---------------------------------------------------------------------------------------------

#[test]
fn a_shorter_soak_set_during_the_soak_applies_at_once() {
    let cluster = canary_measured(-40, 0);
    let soaking = checked_plan(&canary_config(), &cluster);
    assert!(soaking.dataplane_nodes.is_empty());
    let mut changed = canary_config();
    canary_mut(&mut changed).soak_seconds = 30;
    changed.metadata.generation = Some(2);
    let plan = checked_plan(&changed, &cluster);
    assert_eq!(activated(&plan), ["node-2", "node-3"]);
}

#[test]
fn a_change_back_to_kube_proxy_during_the_soak_takes_the_canary_back_through_the_usual_rollback() {
    let cluster = canary_measured(-20, 0);
    let mut changed = config(KubeProxy);
    changed.metadata.generation = Some(2);
    let plan = checked_plan(&changed, &cluster);
    assert_eq!(written_modes(&plan), [("node-1", KubeProxy)]);
    assert_eq!(phase(&plan), DataplanePhase::DeactivatingNodes);
    assert_eq!(
        plan.status
            .as_ref()
            .and_then(|status| status.budget_exceeded.as_ref()),
        None
    );
}

fn labelled(mut cluster: ObservedCluster, names: &[&str]) -> ObservedCluster {
    for name in names {
        node_mut(&mut cluster, name)
            .labels
            .insert("switchyard.dev/canary".into(), "true".into());
    }
    cluster
}

fn selector_config() -> DataplaneConfig {
    let mut config = canary_config();
    canary_mut(&mut config).node_selector = Some(BTreeMap::from([(
        "switchyard.dev/canary".to_owned(),
        "true".to_owned(),
    )]));
    config
}

#[test]
fn a_node_selector_picks_the_canaries_and_no_other_node_goes_before_they_passed() {
    let cluster = labelled(four_kube_proxy_nodes(), &["node-3"]);
    let plan = checked_plan(&selector_config(), &cluster);
    assert_eq!(activated(&plan), ["node-3"]);

    let mut cluster = cluster;
    let node = node_mut(&mut cluster, "node-3");
    switch(node, -10);
    measure(node, Some(baseline_before(-10, 0)), Some(window(-10, 0, 0)));
    let soaking = checked_plan(&selector_config(), &cluster);
    assert!(soaking.dataplane_nodes.is_empty());

    cluster.now = at(60);
    measure(
        node_mut(&mut cluster, "node-3"),
        Some(baseline_before(-10, 0)),
        Some(window(-10, 60, 0)),
    );
    let passed = checked_plan(&selector_config(), &cluster);
    assert_eq!(activated(&passed), ["node-1", "node-2"]);
}

#[test]
fn a_node_selector_that_matches_no_node_holds_the_transition_and_says_so() {
    let plan = checked_plan(&selector_config(), &four_kube_proxy_nodes());
    assert!(plan.dataplane_nodes.is_empty());
    let degraded = condition_of(&plan, types::DEGRADED);
    assert_eq!(degraded.reason, reasons::CANARY_NODES_NOT_FOUND);
    assert!(
        degraded.message.contains("switchyard.dev/canary=true"),
        "{}",
        degraded.message
    );
}

/// Makes one field of a spec invalid.
type BreakSpec = fn(&mut DataplaneConfig);

#[test]
fn invalid_canary_settings_change_nothing_and_say_which_field_is_wrong() {
    let cases: [(&str, BreakSpec); 5] = [
        ("rollout.canary.count", |config| {
            canary_mut(config).count = Some(0)
        }),
        ("rollout.canary.soakSeconds", |config| {
            canary_mut(config).soak_seconds = -1
        }),
        ("rollout.canary.batchSoakSeconds", |config| {
            canary_mut(config).batch_soak_seconds = Some(-5)
        }),
        ("rollout.disruptionBudget.failedConnectsPercent", |config| {
            config
                .spec
                .rollout
                .disruption_budget
                .failed_connects_percent = -1
        }),
        ("rollout.canary", |config| {
            canary_mut(config).count = Some(1);
            canary_mut(config).node_selector =
                Some(BTreeMap::from([("a".to_owned(), "b".to_owned())]));
        }),
    ];
    for (field, break_it) in cases {
        let mut config = canary_config();
        break_it(&mut config);
        let plan = checked_plan(&config, &four_kube_proxy_nodes());
        assert!(plan.dataplane_nodes.is_empty(), "{field}");
        let degraded = condition_of(&plan, types::DEGRADED);
        assert_eq!(degraded.reason, reasons::INVALID_SPEC, "{field}");
        assert!(
            degraded.message.contains(&format!("spec.{field}")),
            "{field}: {}",
            degraded.message
        );
    }
    let control = checked_plan(&canary_config(), &four_kube_proxy_nodes());
    assert_eq!(
        activated(&control),
        ["node-1"],
        "control: the valid spec switches the canary"
    );
}

// ---------------------------------------------------------------------------------------------
// Whole transitions, round by round
// ---------------------------------------------------------------------------------------------

/// What a simulated transition did: each DataplaneNode write with its time, and the phases.
struct Transcript {
    writes: Vec<(i64, String, DataplaneMode)>,
    phases: Vec<DataplanePhase>,
    kube_proxy_disabled_at: Option<i64>,
}

/// Four nodes from kube-proxy toward `config`, one round every 5 s: agents attach when told
/// Ebpf and detach when told KubeProxy, and report their signals; the nodes in `faulty` fail
/// two connects a second after they switch. Stops once kube-proxy is disabled.
fn simulate(mut config: DataplaneConfig, faulty: &[&str], rounds: usize) -> Transcript {
    let mut cluster = four_kube_proxy_nodes();
    let mut switched_at: BTreeMap<String, i64> = BTreeMap::new();
    let mut transcript = Transcript {
        writes: Vec::new(),
        phases: Vec::new(),
        kube_proxy_disabled_at: None,
    };
    for round in 0..rounds {
        let now = i64::try_from(round).expect("few rounds") * 5;
        cluster.now = at(now);
        for (name, since) in &switched_at {
            let failed = if faulty.contains(&name.as_str()) {
                2 * (now - since)
            } else {
                0
            };
            measure(
                node_mut(&mut cluster, name),
                Some(baseline_before(*since, 5)),
                Some(window(*since, now.max(since + 1), failed)),
            );
        }
        let plan = checked_plan(&config, &cluster);
        config = published(config, &plan);
        transcript.phases.push(phase(&plan));
        for write in &plan.dataplane_nodes {
            transcript
                .writes
                .push((now, write.node_name.clone(), write.spec.mode));
            let node = node_mut(&mut cluster, &write.node_name);
            if write.spec.mode == Ebpf {
                switch(node, now);
                switched_at.insert(write.node_name.clone(), now);
            } else {
                set_spec(node, KubeProxy, false, at(now));
                report(node, Report::following(KubeProxy), None, OLD_REVISION);
                switched_at.remove(&write.node_name);
            }
        }
        if plan.kube_proxy == KubeProxyAction::Disable {
            transcript.kube_proxy_disabled_at = Some(now);
            break;
        }
    }
    transcript
}

#[test]
fn a_healthy_transition_goes_canary_first_then_batches_each_after_the_soak_before_it() {
    let transcript = simulate(canary_config(), &[], 100);
    let activations: Vec<(i64, &str)> = transcript
        .writes
        .iter()
        .map(|(time, name, mode)| {
            assert_eq!(*mode, Ebpf, "nothing goes back");
            (*time, name.as_str())
        })
        .collect();
    // The canary soaks 60 s, the batch of two a third of that (20 s), then the last node 20 s.
    assert_eq!(
        activations,
        [
            (0, "node-1"),
            (60, "node-2"),
            (60, "node-3"),
            (80, "node-4")
        ]
    );
    assert_eq!(transcript.kube_proxy_disabled_at, Some(100));
    assert!(!transcript.phases.contains(&DataplanePhase::Halted));
}

#[test]
fn a_faulty_canary_is_rolled_back_within_its_soak_and_no_second_node_is_ever_activated() {
    let transcript = simulate(canary_config(), &["node-1"], 60);
    assert_eq!(
        transcript.writes,
        [
            (0, "node-1".to_owned(), Ebpf),
            // Two failures a second: 40 in the first 20 s are over the 30.5 a minute allowed.
            (20, "node-1".to_owned(), KubeProxy),
        ]
    );
    assert_eq!(transcript.kube_proxy_disabled_at, None);
    assert_eq!(transcript.phases.last(), Some(&DataplanePhase::Halted));
}

// ---------------------------------------------------------------------------------------------
// The invariant, over generated clusters
// ---------------------------------------------------------------------------------------------

/// One generated node: switched (with its switch time and its failed connects per minute,
/// before and after) or not.
type GeneratedNode = Option<(i64, i64, i64)>;

fn failed_connects_rate_over_budget(before: i64, after: i64, budget: &DisruptionBudget) -> bool {
    // Independent of the planner: per minute over ten minutes before and one minute after,
    // over budget when beyond both allowances.
    let by_absolute = before + budget.failed_connects_per_minute;
    let by_relative_times_100 = before * (100 + budget.failed_connects_percent);
    after > by_absolute && after * 100 > by_relative_times_100
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_node_over_budget_is_never_followed_by_another_activation(
        nodes in prop::collection::vec(prop::option::weighted(0.5, (-400i64..-1, 0i64..50, 0i64..120)), 2..7),
        absolute in 0i64..40,
        percent in 0i64..200,
        halt in any::<bool>(),
        canaries in 1i32..4,
        soak in 0i64..120,
        max_unavailable in 1i32..4,
    ) {
        let nodes: Vec<GeneratedNode> = nodes;
        let mut cluster = cluster(
            (0..nodes.len()).map(|index| kube_proxy_node(&format!("node-{index}"))).collect(),
        );
        for (index, generated) in nodes.iter().enumerate() {
            if let Some((switched, before, after)) = generated {
                let node = node_mut(&mut cluster, &format!("node-{index}"));
                switch(node, *switched);
                measure(
                    node,
                    Some(window(switched - 600, *switched, before * 10)),
                    Some(window((-60i64).max(*switched), 0, *after)),
                );
            }
        }
        let mut config = with_max_unavailable(config(Ebpf), IntOrString::Int(max_unavailable));
        canary_mut(&mut config).count = Some(canaries);
        canary_mut(&mut config).soak_seconds = soak;
        config.spec.rollout.disruption_budget.failed_connects_per_minute = absolute;
        config.spec.rollout.disruption_budget.failed_connects_percent = percent;
        config.spec.rollout.on_budget_exceeded =
            if halt { BudgetExceededAction::Halt } else { BudgetExceededAction::Rollback };
        let budget = config.spec.rollout.disruption_budget.clone();
        // Every window after the switch is at most a minute long, so counted over a minute.
        let any_over = nodes
            .iter()
            .flatten()
            .any(|(_, before, after)| failed_connects_rate_over_budget(*before, *after, &budget));
        let plan = plan(Some(&config), &cluster);
        check_invariants(Some(&config), &cluster, &plan);
        if any_over {
            let told_before: Vec<bool> = nodes.iter().map(Option::is_some).collect();
            for write in &plan.dataplane_nodes {
                let index: usize = write.node_name.trim_start_matches("node-").parse().expect("a node index");
                prop_assert!(
                    told_before[index] || write.spec.mode != Ebpf,
                    "{} activated while a node is over budget", write.node_name
                );
            }
            prop_assert_eq!(phase(&plan), DataplanePhase::Halted);
            // And under the same spec, after a Rollback, nothing is activated either.
            if !halt {
                let mut after_rollback = config.clone();
                after_rollback.status = plan.status.clone();
                let clean = super::fixtures::cluster(
                    (0..nodes.len()).map(|index| kube_proxy_node(&format!("node-{index}"))).collect(),
                );
                let next = super::super::plan(Some(&after_rollback), &clean);
                prop_assert!(next.dataplane_nodes.iter().all(|write| write.spec.mode != Ebpf));
            }
        }
    }
}
