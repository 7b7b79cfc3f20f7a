//! Scenario 5: an agent that never becomes Ready. node-3's pin directory is hidden under a
//! tmpfs (pins fail there) and its agent restarted; mode Ebpf then halts with Degraded naming
//! node-3, and kube-proxy is left alone. Then the DataplaneConfig is deleted while the
//! transition is held ([`play_config_deleted`]), and a node told to clean while
//! kube-proxy runs there has the instruction withdrawn ([`play_cleanup_withdrawn`]).

use std::time::{Duration, Instant};

use kube::Api;
use switchyard_crds::{
    condition_types, find_condition, ConditionStatus, DataplaneConfig, DataplaneMode,
    DataplaneNode, DataplanePhase,
};
use switchyard_e2e::cluster::ClusterPaths;
use switchyard_e2e::pod_runner::events::{read_events, running_processes, EventKind, RunnerEvent};
use switchyard_e2e::wait::{hold_for, Check, WaitOptions};

use crate::migration_support::*;

/// Scenario 5: see the module's documentation.
pub async fn play(world: &World) {
    let old_agent = agent_process("node-3").expect("node-3's agent");
    switchyard_e2e::netns::run_in_node(
        &world.paths,
        "node-3",
        "mount",
        &[
            "-t",
            "tmpfs",
            "switchyard-e2e-no-bpffs",
            "/sys/fs/bpf/switchyard",
        ],
    )
    .expect("hide node-3's pin directory");
    run(
        "kubectl",
        &[
            "-n",
            RELEASE_NAMESPACE,
            "delete",
            "pod",
            "-l",
            "app.kubernetes.io/component=agent",
            "--field-selector",
            "spec.nodeName=node-3",
            "--wait=false",
        ],
    )
    .expect("restart node-3's agent");
    // The old agent is gone before mode Ebpf is asked for (it could still serve). With the
    // chart's pod, the new one never gets as far as its agent: its `mount-bpf-fs` init
    // container refuses a pin directory covered by another filesystem, as on a real node
    // (the pod stays in Init:Error). An agent process that starts anyway cannot pin. Either
    // way node-3 never reports Ready, which is what this scenario is about.
    let started = Instant::now();
    loop {
        let replaced = new_agent_pod_blocked(&old_agent);
        if let Ok(Some(how)) = &replaced {
            println!("node-3's new agent pod: {how}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "failed to see node-3's new agent pod refused by mount-bpf-fs or its agent started within 60 s: {replaced:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let traffic = world
        .short_traffic_flowing()
        .await
        .expect("traffic through kube-proxy");
    let halt_started = Instant::now();
    world
        .apply_config(
            DataplaneMode::Ebpf,
            serde_json::json!({"nodeReadyTimeoutSeconds": 10, "drainTimeoutSeconds": 120}),
        )
        .await
        .expect("apply mode Ebpf");
    let degraded = loop {
        let config = world
            .config()
            .await
            .expect("read")
            .expect("the DataplaneConfig");
        let condition = config.status.as_ref().and_then(|status| {
            find_condition(&status.conditions, condition_types::DEGRADED).cloned()
        });
        if let Some(condition) = condition.filter(|condition| {
            condition.status == ConditionStatus::True && condition.message.contains("node-3")
        }) {
            break (config, condition);
        }
        assert!(
            halt_started.elapsed() < Duration::from_secs(60),
            "failed to see Degraded naming node-3 within 60 s: {:#?}",
            config.status
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let (config, condition) = degraded;
    println!(
        "an agent never Ready: after {:.1} s phase {:?}, Degraded {}: {}",
        halt_started.elapsed().as_secs_f64(),
        config.status.as_ref().map(|status| status.phase),
        condition.reason,
        condition.message
    );
    assert_ne!(
        config.status.as_ref().map(|status| status.phase),
        Some(DataplanePhase::Ready)
    );
    // Halted, for the next 3 s: kube-proxy not disabled, no node told to clean, kube-proxy's
    // rules on every node.
    hold_for(
        "kube-proxy serving and untouched while a node is not Ready",
        WaitOptions::new(Duration::from_secs(3)).every(Duration::from_millis(250)),
        || async {
            let daemon_set = world.kube_proxy_daemon_set().get("kube-proxy").await?;
            let cleaning: Vec<String> = world
                .dataplane_nodes()
                .await?
                .into_iter()
                .filter(|(_, node)| node.spec.iptables_cleanup)
                .map(|(name, _)| name)
                .collect();
            let mut rules_gone = Vec::new();
            for node in NODES {
                if !world.kube_proxy_rules(node)?.demo_service {
                    rules_gone.push(node);
                }
            }
            Ok::<_, Failure>(
                if !kube_proxy_disabled(&daemon_set) && cleaning.is_empty() && rules_gone.is_empty()
                {
                    Check::Ready(())
                } else {
                    Check::NotYet(format!(
                        "kube-proxy disabled: {}; told to clean: {cleaning:?}; kube-proxy's rules gone on {rules_gone:?}",
                        kube_proxy_disabled(&daemon_set)
                    ))
                },
            )
        },
    )
    .await
    .expect("kube-proxy left alone");
    let report = traffic.stop().await;
    world.assert_traffic_healthy(&report, "while halted");
}

/// The DataplaneConfig deleted while scenario 5's transition is held. Without a DataplaneConfig
/// named `default` the operator does two things only: it creates the DataplaneNode a Node lacks,
/// and it withdraws the cleanup instruction where kube-proxy came back. Neither is due here
/// (every node has its DataplaneNode, none is told to clean), so nothing changes: no node is
/// switched, no DataplaneNode removed, kube-proxy untouched. Then a DataplaneNode deleted by
/// hand is created again, owned by its Node.
pub async fn play_config_deleted(world: &World) {
    let traffic = world.short_traffic_flowing().await.expect("traffic");
    let nodes_before = world.dataplane_nodes().await.expect("list");
    let daemon_set_before = world
        .kube_proxy_daemon_set()
        .get("kube-proxy")
        .await
        .expect("read");
    assert!(
        nodes_before
            .values()
            .all(|node| !node.spec.iptables_cleanup),
        "a node is told to clean before the DataplaneConfig is deleted: nothing would be due"
    );
    Api::<DataplaneConfig>::all(world.client.clone())
        .delete("default", &kube::api::DeleteParams::default())
        .await
        .expect("delete the DataplaneConfig");
    let unchanged = || async {
        let nodes = world.dataplane_nodes().await?;
        let daemon_set = world.kube_proxy_daemon_set().get("kube-proxy").await?;
        let changed: Vec<&String> = nodes_before
            .iter()
            .filter(|(name, before)| nodes.get(*name).map(|node| &node.spec) != Some(&before.spec))
            .map(|(name, _)| name)
            .collect();
        Ok::<_, Failure>(
            if changed.is_empty()
                && nodes.len() == nodes_before.len()
                && daemon_set.metadata.generation == daemon_set_before.metadata.generation
            {
                Check::Ready(())
            } else {
                Check::NotYet(format!(
                    "DataplaneNodes {:?}, changed or removed: {changed:?}; kube-proxy generation {:?} (before {:?})",
                    nodes.keys().collect::<Vec<_>>(),
                    daemon_set.metadata.generation,
                    daemon_set_before.metadata.generation
                ))
            },
        )
    };
    hold_for(
        "every DataplaneNode and kube-proxy as they were after the DataplaneConfig was deleted",
        WaitOptions::new(Duration::from_secs(3)).every(Duration::from_millis(250)),
        unchanged,
    )
    .await
    .expect("nothing changes without a DataplaneConfig");

    // What the operator still does: the DataplaneNode a Node lacks is created, owned by it.
    let dataplane_nodes = Api::<DataplaneNode>::all(world.client.clone());
    let removed_uid = nodes_before["node-3"].metadata.uid.clone();
    dataplane_nodes
        .delete("node-3", &kube::api::DeleteParams::default())
        .await
        .expect("delete node-3's DataplaneNode");
    let deleted_at = Instant::now();
    let recreated = loop {
        let found = dataplane_nodes.get_opt("node-3").await.expect("read");
        if let Some(node) = found.filter(|node| node.metadata.uid != removed_uid) {
            break node;
        }
        assert!(
            deleted_at.elapsed() < Duration::from_secs(30),
            "failed to see node-3's DataplaneNode created again within 30 s without a DataplaneConfig"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    println!(
        "without a DataplaneConfig: node-3's DataplaneNode created again after {:.1?}, mode {}",
        deleted_at.elapsed(),
        recreated.spec.mode
    );
    super::checks::assert_made_by_the_operator(&recreated, "node-3");
    let daemon_set = world
        .kube_proxy_daemon_set()
        .get("kube-proxy")
        .await
        .expect("read");
    assert_eq!(
        daemon_set.metadata.generation, daemon_set_before.metadata.generation,
        "kube-proxy changed after the DataplaneConfig was deleted"
    );
    let nodes = world.dataplane_nodes().await.expect("list");
    for name in ["node-1", "node-2"] {
        assert_eq!(
            nodes[name].spec, nodes_before[name].spec,
            "{name} changed after the DataplaneConfig was deleted"
        );
    }
    let report = traffic.stop().await;
    world.assert_traffic_healthy(&report, "after the DataplaneConfig was deleted");
}

/// How node-3's agent pod that replaced `old_agent` got stuck, per the pod runner's events:
/// its `mount-bpf-fs` init container failed, or its agent process started (it cannot pin).
/// `None` while the old agent still runs or the new pod has got to neither.
fn new_agent_pod_blocked(old_agent: &RunnerEvent) -> Outcome<Option<String>> {
    let events = read_events(&ClusterPaths::from_environment().pod_runner_events())?;
    if running_processes(&events, "agent").contains_key(&old_agent.pod_uid) {
        return Ok(None);
    }
    let newer = |event: &&RunnerEvent| {
        event.node == old_agent.node
            && event.pod_uid != old_agent.pod_uid
            && event.at_unix_ms >= old_agent.at_unix_ms
    };
    let init_failed = events.iter().filter(newer).find(|event| {
        event.container == "mount-bpf-fs"
            && matches!(event.kind, EventKind::Exited | EventKind::StartFailed)
            && event
                .detail
                .as_deref()
                .is_some_and(|detail| !detail.ends_with("exit status: 0"))
    });
    if let Some(event) = init_failed {
        return Ok(Some(format!(
            "mount-bpf-fs refused ({})",
            event.detail.as_deref().unwrap_or_default()
        )));
    }
    let agent_started = events
        .iter()
        .filter(newer)
        .find(|event| event.container == "agent" && event.kind == EventKind::Started);
    Ok(agent_started.map(|event| format!("agent started (pid {:?}), cannot pin", event.pid)))
}

/// The agent process on `node` now, per the pod runner's events.
fn agent_process(node: &str) -> Outcome<RunnerEvent> {
    let events = read_events(&ClusterPaths::from_environment().pod_runner_events())?;
    running_processes(&events, "agent")
        .into_values()
        .find(|process| process.node == node)
        .ok_or_else(|| format!("failed to find an agent process on {node}").into())
}

/// Without a DataplaneConfig named `default`, the operator still withdraws the instruction to
/// clean kube-proxy's rules from a node where kube-proxy runs (a stale instruction, set here by
/// hand on node-1, would otherwise have its agent remove the rules kube-proxy serves with as
/// soon as kube-proxy stops for a moment). kube-proxy's rules stay on node-1 throughout.
pub async fn play_cleanup_withdrawn(world: &World) {
    let traffic = world.short_traffic_flowing().await.expect("traffic");
    // No DataplaneConfig: deleted by the scenario before (again here if that one failed and
    // the cluster was brought back with one).
    let configs = Api::<DataplaneConfig>::all(world.client.clone());
    if configs.get_opt("default").await.expect("read").is_some() {
        configs
            .delete("default", &kube::api::DeleteParams::default())
            .await
            .expect("delete the DataplaneConfig");
    }
    let started = Instant::now();
    while configs.get_opt("default").await.expect("read").is_some() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "failed to see the DataplaneConfig gone within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        world
            .kube_proxy_rules("node-1")
            .expect("iptables-save")
            .demo_service,
        "kube-proxy serves on node-1"
    );
    let dataplane_nodes = Api::<DataplaneNode>::all(world.client.clone());
    let told = dataplane_nodes
        .patch(
            "node-1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&serde_json::json!({"spec": {"iptablesCleanup": true}})),
        )
        .await
        .expect("tell node-1 to clean");
    assert!(told.spec.iptables_cleanup, "node-1 told to clean");
    let told_at = Instant::now();
    loop {
        let node = dataplane_nodes.get("node-1").await.expect("read");
        if !node.spec.iptables_cleanup {
            break;
        }
        assert!(
            told_at.elapsed() < Duration::from_secs(30),
            "failed to see node-1's cleanup withdrawn within 30 s without a DataplaneConfig while kube-proxy runs there"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "without a DataplaneConfig: node-1's cleanup withdrawn {:.1?} after it was set, kube-proxy running there",
        told_at.elapsed()
    );
    assert!(
        world
            .kube_proxy_rules("node-1")
            .expect("iptables-save")
            .demo_service,
        "kube-proxy's rules cleaned on node-1"
    );
    let report = traffic.stop().await;
    world.assert_traffic_healthy(&report, "with a stale cleanup instruction withdrawn");
}
