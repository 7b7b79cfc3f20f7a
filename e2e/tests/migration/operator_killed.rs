//! Scenario 4, the operator killed twice (see [`play`]).

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use switchyard_crds::{DataplaneMode, DataplanePhase};
use switchyard_e2e::audit::{read_audit_events, AuditEvent};
use switchyard_e2e::pod_runner::events::RunnerEvent;
use switchyard_e2e::wait::{hold_for, Check, WaitOptions};

use super::checks::*;
use crate::migration_support::*;

/// SIGKILLs the leading operator, process `pid` (`when`: where in the transition, for the
/// log), and waits for a new one to lead.
async fn kill_the_leader(world: &World, pid: u32, when: &str) -> RunnerEvent {
    kill(pid, libc::SIGKILL);
    let killed_at = Instant::now();
    println!("SIGKILL operator pid {pid} {when}");
    let next = world
        .wait_operator_leading(Some(pid), Duration::from_secs(60))
        .await
        .expect("a new operator leads");
    println!(
        "new operator pid {:?} leads {:.1} s after the kill",
        next.pid,
        killed_at.elapsed().as_secs_f64()
    );
    next
}

/// Scenario 4: KubeProxy -> Ebpf with the operator SIGKILLed during ActivatingNodes and again
/// during DisablingKubeProxy (held there by a finalizer on node-3's kube-proxy pod, so that the
/// second kill falls between "kube-proxy disabled, node-1 and node-2 told to clean" and "node-3
/// told to clean"). The operator that comes back finishes the transition without repeating or
/// skipping a step: the audit log shows one kube-proxy patch and exactly two instructions per
/// node (Ebpf, then cleanup after its kube-proxy pod was gone); every DataplaneNode's generation
/// grew by exactly two; the KubeProxyDisabled Event was published once; no Preflight again.
/// Then `kubeadm upgrade`'s reset of the nodeSelector under eBPF (kube-proxy comes back on every
/// node, the operator disables it again) and the rollback, which restores the selector exactly.
pub async fn play(world: &World) {
    let generator = world
        .short_traffic_flowing()
        .await
        .expect("traffic through kube-proxy");
    let traffic = &generator;
    let recorders = TransitionRecorders::start(world).await;
    let pods = world
        .kube_proxy_pods_by_node()
        .await
        .expect("kube-proxy pods");
    assert_eq!(pods.len(), 3, "a kube-proxy pod on every node: {pods:?}");
    let pod_names: BTreeMap<String, String> = pods
        .iter()
        .map(|(node, pod)| (node.clone(), pod.metadata.name.clone().unwrap_or_default()))
        .collect();
    let original = world
        .kube_proxy_daemon_set()
        .get("kube-proxy")
        .await
        .expect("read kube-proxy");
    let original_selector = node_selector(&original);
    assert_eq!(
        original_selector
            .get("kubernetes.io/os")
            .map(String::as_str),
        Some("linux"),
        "kube-proxy's own nodeSelector (e2e/manifests/kube-proxy.yaml)"
    );
    let generations_before = generations(&world.dataplane_nodes().await.expect("list"));
    let disabled_events_before = world
        .event_count(
            "kube-system",
            "DaemonSet",
            "kube-proxy",
            "KubeProxyDisabled",
        )
        .await
        .expect("Events");
    let held_pod = pod_names["node-3"].clone();
    world
        .hold_pod(&held_pod, true)
        .await
        .expect("hold node-3's kube-proxy pod");

    let applied_at = SystemTime::now();
    world
        .apply_config(
            DataplaneMode::Ebpf,
            serde_json::json!({"maxUnavailable": 1, "nodeReadyTimeoutSeconds": 60, "drainTimeoutSeconds": 120}),
        )
        .await
        .expect("apply mode Ebpf");
    let start_revision = config_revision(
        &world
            .config()
            .await
            .expect("read")
            .expect("the DataplaneConfig"),
    );
    let mut phases = Phases::default();

    // First kill: as soon as the status says ActivatingNodes about this generation.
    let at_first_kill = phases
        .wait_until(
            world,
            traffic,
            "see ActivatingNodes",
            Duration::from_secs(60),
            |config, nodes| {
                let status = config.status.as_ref()?;
                (status.phase == DataplanePhase::ActivatingNodes
                    && status.observed_generation == config.metadata.generation)
                    .then(|| nodes.clone())
            },
        )
        .await;
    let first = world.operator_process().expect("the operator's process");
    let first_pid = first.pid.expect("a pid");
    let asked: Vec<&String> = at_first_kill
        .iter()
        .filter(|(_, node)| node.spec.mode == DataplaneMode::Ebpf)
        .map(|(name, _)| name)
        .collect();
    let serving: Vec<&String> = at_first_kill
        .iter()
        .filter(|(_, node)| is_serving(node))
        .map(|(name, _)| name)
        .collect();
    let second = kill_the_leader(
        world,
        first_pid,
        &format!("in ActivatingNodes: told Ebpf {asked:?}, serving {serving:?}"),
    )
    .await;
    assert!(
        asked.len() < 3 || serving.len() < 3,
        "killed too late: every node already served"
    );
    let second_pid = second.pid.expect("a pid");

    // Second kill: kube-proxy disabled, node-1 and node-2 told to clean (their kube-proxy pods
    // are gone), node-3 not (its pod is held).
    let at_second_kill = phases
        .wait_until(
            world,
            traffic,
            "see DisablingKubeProxy with node-1 and node-2 told to clean",
            Duration::from_secs(90),
            |config, nodes| {
                let status = config.status.as_ref()?;
                let cleaning = |name: &str| {
                    nodes
                        .get(name)
                        .is_some_and(|node| node.spec.iptables_cleanup)
                };
                (status.phase == DataplanePhase::DisablingKubeProxy
                    && cleaning("node-1")
                    && cleaning("node-2"))
                .then(|| nodes.clone())
            },
        )
        .await;
    assert!(
        !at_second_kill["node-3"].spec.iptables_cleanup,
        "node-3 told to clean while its kube-proxy pod is still there"
    );
    kill_the_leader(
        world,
        second_pid,
        "in DisablingKubeProxy (node-3's kube-proxy pod held)",
    )
    .await;
    // The new operator has its snapshot and its reconcile: for the next 3 s nothing may move
    // (node-3 not told to clean, no DataplaneNode written, still DisablingKubeProxy).
    let generations_at_second_kill = generations(&at_second_kill);
    hold_for(
        "every DataplaneNode and the phase as they were at the second kill",
        WaitOptions::new(Duration::from_secs(3)).every(Duration::from_millis(200)),
        || async {
            let held = world.dataplane_nodes().await?;
            let phase = world
                .config()
                .await?
                .and_then(|config| config.status)
                .map(|status| status.phase);
            let node_3_cleaning = held
                .get("node-3")
                .is_some_and(|node| node.spec.iptables_cleanup);
            Ok::<_, Failure>(
                if !node_3_cleaning
                    && generations(&held) == generations_at_second_kill
                    && phase == Some(DataplanePhase::DisablingKubeProxy)
                {
                    Check::Ready(())
                } else {
                    Check::NotYet(format!(
                        "phase {phase:?}, node-3 told to clean: {node_3_cleaning}, generations {:?} (at the kill {generations_at_second_kill:?})",
                        generations(&held)
                    ))
                },
            )
        },
    )
    .await
    .expect("the new operator repeats nothing");

    // node-3's kube-proxy pod goes: the transition finishes.
    world
        .hold_pod(&held_pod, false)
        .await
        .expect("release node-3's kube-proxy pod");
    phases
        .wait_until(
            world,
            traffic,
            "reach Ready on Ebpf",
            Duration::from_secs(60),
            |config, _| config_ready(config, DataplaneMode::Ebpf).then_some(()),
        )
        .await;
    println!("phases seen: {:?}", phases.seen);
    let after_first_kill = phases
        .seen
        .iter()
        .skip_while(|phase| **phase != DataplanePhase::ActivatingNodes);
    for phase in after_first_kill {
        assert_ne!(
            *phase,
            DataplanePhase::Preflight,
            "went back to Preflight after a kill: {:?}",
            phases.seen
        );
    }
    for phase in [
        DataplanePhase::ActivatingNodes,
        DataplanePhase::DisablingKubeProxy,
        DataplanePhase::Ready,
    ] {
        assert!(
            phases.seen.contains(&phase),
            "{phase} never seen: {:?}",
            phases.seen
        );
    }
    // The evidence (the recorders have every write of the transition first).
    recorders.wait_caught_up(world, &pod_names).await;
    let nodes = world.dataplane_nodes().await.expect("list");
    for node in NODES {
        assert_eq!(
            nodes[node].metadata.generation.unwrap_or(0) - generations_before[node],
            2,
            "{node}: exactly two instructions (Ebpf, then cleanup) expected"
        );
        assert!(
            nodes[node].spec.iptables_cleanup,
            "{node} never told to clean"
        );
    }
    let audit: Vec<AuditEvent> = read_audit_events(&world.paths.audit_log())
        .expect("the audit log")
        .into_iter()
        .filter(|event| audit_time(event) >= applied_at)
        .collect();
    let daemon_set_patches = audit_writes(&audit, OPERATOR_SERVICE_ACCOUNT, "patch", "daemonsets")
        .filter(|event| object_name(event) == "kube-proxy")
        .count();
    assert_eq!(
        daemon_set_patches, 1,
        "patches of kube-proxy by the operator"
    );
    let disabled_revision = recorders
        .daemon_sets
        .versions()
        .iter()
        .filter(|version| version.revision > start_revision && kube_proxy_disabled(&version.object))
        .map(|version| version.revision)
        .min()
        .expect("the kube-proxy DaemonSet was disabled");
    let node_versions = recorders.dataplane_nodes.versions();
    let pod_versions = recorders.kube_proxy_pods.versions();
    for node in NODES {
        let instructions: Vec<SystemTime> =
            audit_writes(&audit, OPERATOR_SERVICE_ACCOUNT, "patch", "dataplanenodes")
                .filter(|event| object_name(event) == node)
                .map(audit_time)
                .collect();
        assert_eq!(
            instructions.len(),
            2,
            "{node}: the operator's writes of its DataplaneNode (Ebpf, then cleanup)"
        );
        let pod = &pod_names[node];
        let gone_at = pod_gone_at(&audit, pod).unwrap_or_else(|| panic!("{pod} never deleted"));
        assert!(
            gone_at < instructions[1],
            "{node} told to clean before its kube-proxy pod {pod} was gone"
        );
        let serving = first_revision_where(&node_versions, start_revision, node, |version| {
            is_serving(&version.object)
        })
        .unwrap_or_else(|| panic!("{node} never served from eBPF"));
        let cleanup = first_revision_where(&node_versions, start_revision, node, |version| {
            version.object.spec.iptables_cleanup
        })
        .unwrap_or_else(|| panic!("{node} was never told to clean"));
        let gone = revision_deleted(&pod_versions, pod)
            .unwrap_or_else(|| panic!("{pod} never seen deleted"));
        assert!(
            serving < disabled_revision,
            "{node} served only after kube-proxy was disabled"
        );
        assert!(
            gone < cleanup,
            "{node} told to clean at {cleanup}, before {pod} was gone at {gone}"
        );
        println!("{node}: served at revision {serving}; kube-proxy disabled at {disabled_revision}; {pod} gone at {gone}; told to clean at {cleanup}; operator writes of its DataplaneNode: 2");
    }
    let disabled_events = world
        .event_count_above(
            "kube-system",
            "DaemonSet",
            "kube-proxy",
            "KubeProxyDisabled",
            disabled_events_before,
        )
        .await
        .expect("Events");
    assert_eq!(
        disabled_events - disabled_events_before,
        1,
        "KubeProxyDisabled Events published during the transition"
    );
    let runner_events =
        switchyard_e2e::pod_runner::events::read_events(&world.paths.pod_runner_events())
            .expect("the pod runner's events");
    let operator_starts = runner_events
        .iter()
        .filter(|event| {
            event.container == OPERATOR_CONTAINER
                && event.kind == switchyard_e2e::pod_runner::events::EventKind::Started
        })
        .count();
    println!("operator processes started so far: {operator_starts}");
    for node in NODES {
        let rules = world.kube_proxy_rules(node).expect("iptables-save");
        assert_eq!(
            rules.service_chains, 0,
            "kube-proxy Service chains left on {node}"
        );
    }
    let report = traffic.snapshot();
    world.assert_traffic_healthy(&report, "with the operator killed twice");
    println!(
        "operator killed twice: Ready; new connections {} made, 0 failed",
        report.attempts()
    );

    // `kubeadm upgrade` resets kube-proxy's nodeSelector while the cluster is on eBPF: kube-proxy
    // comes back on every node, the agents stop cleaning, the operator disables it again.
    let again_before = world
        .event_count(
            "default",
            "DataplaneConfig",
            "default",
            "KubeProxyDisabledAgain",
        )
        .await
        .expect("Events");
    let reset = serde_json::json!({"spec": {"template": {"spec": {"nodeSelector": {KUBE_PROXY_DISABLED_KEY: null}}}}});
    world
        .kube_proxy_daemon_set()
        .patch(
            "kube-proxy",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&reset),
        )
        .await
        .expect("reset kube-proxy's nodeSelector");
    let reset_started = Instant::now();
    loop {
        let again = world
            .event_count(
                "default",
                "DataplaneConfig",
                "default",
                "KubeProxyDisabledAgain",
            )
            .await
            .expect("Events");
        if again > again_before {
            break;
        }
        assert!(
            reset_started.elapsed() < Duration::from_secs(60),
            "failed to see KubeProxyDisabledAgain within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Same generation, so a Ready read proves nothing by itself: wait for kube-proxy gone again
    // and every node told to clean again, then Ready.
    loop {
        let pods = world.kube_proxy_pods_by_node().await.expect("pods");
        let nodes = world.dataplane_nodes().await.expect("list");
        let config = world
            .config()
            .await
            .expect("read")
            .expect("the DataplaneConfig");
        if pods.is_empty()
            && nodes.values().all(|node| node.spec.iptables_cleanup)
            && config_ready(&config, DataplaneMode::Ebpf)
        {
            break;
        }
        assert!(
            reset_started.elapsed() < Duration::from_secs(90),
            "failed to see kube-proxy disabled again and every node cleaned within 90 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let daemon_set = world
        .kube_proxy_daemon_set()
        .get("kube-proxy")
        .await
        .expect("read");
    assert!(
        kube_proxy_disabled(&daemon_set),
        "kube-proxy disabled again"
    );
    println!(
        "kubeadm-style reset of kube-proxy's nodeSelector: disabled again, every node clean and Ready after {:.1} s",
        reset_started.elapsed().as_secs_f64()
    );

    // Rollback: the DaemonSet gets back exactly the nodeSelector it had.
    let restored_before = world
        .event_count("default", "DataplaneConfig", "default", "KubeProxyRestored")
        .await
        .expect("Events");
    Phases::default()
        .roll_back_to_kube_proxy(
            world,
            traffic,
            serde_json::json!({"nodeReadyTimeoutSeconds": 60, "drainTimeoutSeconds": 120}),
            Duration::from_secs(90),
        )
        .await;
    let restored = world
        .kube_proxy_daemon_set()
        .get("kube-proxy")
        .await
        .expect("read");
    assert_eq!(
        node_selector(&restored),
        original_selector,
        "kube-proxy's nodeSelector not restored exactly"
    );
    assert!(
        !restored
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(PREVIOUS_SELECTOR_ANNOTATION),
        "the recorded selector left on kube-proxy"
    );
    let restored_after = world
        .event_count_above(
            "default",
            "DataplaneConfig",
            "default",
            "KubeProxyRestored",
            restored_before,
        )
        .await
        .expect("Events");
    assert!(
        restored_after > restored_before,
        "no KubeProxyRestored Event"
    );
    println!("rolled back to KubeProxy, nodeSelector restored exactly: {original_selector:?}");
    let report = generator.stop().await;
    world.assert_traffic_healthy(&report, "in scenario 4");
}
