//! Scenario 3: Ebpf -> KubeProxy with 20 + 20 long-lived connections carried by eBPF: the nodes
//! drain while they stay open (none breaks), every agent detaches within 5 s of the last one
//! closing, and kube-proxy serves on every node before any node is told to go back.

use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::apps::v1::DaemonSet;
use kube::Api;
use switchyard_crds::{DataplaneMode, DataplaneNode, DataplanePhase};
use switchyard_e2e::audit::{read_audit_events, AuditEvent};
use switchyard_e2e::wait::{hold_for, Check, WaitOptions};

use super::checks::*;
use crate::migration_support::*;

/// Scenario 3: see the module's documentation.
pub async fn play(world: &World) {
    let traffic = world
        .short_traffic_flowing()
        .await
        .expect("traffic through eBPF");
    let long_lived = world
        .long_lived_traffic_open(LONG_LIVED)
        .await
        .expect("long-lived connections through eBPF");
    let dataplane_nodes_api = Api::<DataplaneNode>::all(world.client.clone());
    let dataplane_nodes = Recorder::start_listed(dataplane_nodes_api.clone())
        .await
        .expect("record DataplaneNodes");
    let daemon_sets = Recorder::start_listed(world.kube_proxy_daemon_set())
        .await
        .expect("record DaemonSets");
    let (rules_seen, poller) = poll_kube_proxy_rules();
    let rollback_applied_at = SystemTime::now();
    world
        .apply_config(
            DataplaneMode::KubeProxy,
            serde_json::json!({"nodeReadyTimeoutSeconds": 60, "drainTimeoutSeconds": 120}),
        )
        .await
        .expect("apply mode KubeProxy");
    let rollback_revision = world.config_revision().await;
    let rollback_started = Instant::now();
    // Nodes drain while the long-lived connections stay open: every node is detached or
    // draining, and at least one still carries flows.
    let mut last_line = String::new();
    loop {
        let nodes = world.dataplane_nodes().await.expect("list");
        let config = world.config().await.expect("read");
        let line = progress_line(config.as_ref(), &nodes, DataplaneMode::KubeProxy);
        if line != last_line {
            println!("{:>5.1}s {line}", rollback_started.elapsed().as_secs_f64());
            last_line = line.clone();
        }
        let settled = nodes.values().all(|node| {
            node.spec.mode == DataplaneMode::KubeProxy
                && (is_detached(node) || (is_draining(node) && live_flows(node) > 0))
        });
        if settled && nodes.values().any(is_draining) {
            break;
        }
        assert!(
            rollback_started.elapsed() < Duration::from_secs(90),
            "failed to see the nodes draining within 90 s: {line}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "draining after {:.1?}; holding the connections 3 s more",
        rollback_started.elapsed()
    );
    // All through the next 3 s (connections still open): a node drains, the config is not
    // Ready, and every connection is answered.
    hold_for(
        "a node draining, the DataplaneConfig not Ready and no failed connection while connections are open",
        WaitOptions::new(Duration::from_secs(3)).every(Duration::from_millis(200)),
        || async {
            let nodes = world.dataplane_nodes().await?;
            let config = world.config().await?;
            let phase = config
                .as_ref()
                .and_then(|config| config.status.as_ref())
                .map(|status| status.phase);
            let failed = traffic.snapshot().failure_count() + long_lived.snapshot().failure_count();
            Ok::<_, Failure>(
                if nodes.values().any(is_draining)
                    && phase != Some(DataplanePhase::Ready)
                    && failed == 0
                {
                    Check::Ready(())
                } else {
                    Check::NotYet(format!(
                        "phase {phase:?}, {failed} failed connections: {}",
                        progress_line(config.as_ref(), &nodes, DataplaneMode::KubeProxy)
                    ))
                },
            )
        },
    )
    .await
    .expect("draining held");
    let closed_at = Instant::now();
    let long_lived_report = long_lived.stop().await;
    let mut detached_after = Duration::ZERO;
    loop {
        let nodes = world.dataplane_nodes().await.expect("list");
        if nodes
            .values()
            .all(|node| node.spec.mode == DataplaneMode::KubeProxy && is_detached(node))
        {
            detached_after = detached_after.max(closed_at.elapsed());
            break;
        }
        assert!(
            closed_at.elapsed() < Duration::from_secs(5),
            "failed to see every agent detached within 5 s of the last connection closing: {}",
            progress_line(None, &nodes, DataplaneMode::KubeProxy)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_long_lived_intact(
        &long_lived_report,
        "long-lived connections opened through eBPF, Ebpf -> KubeProxy",
    );
    let to_kube_proxy = wait_config_ready(
        world,
        DataplaneMode::KubeProxy,
        &traffic,
        Duration::from_secs(60),
    )
    .await
        + rollback_started
            .elapsed()
            .saturating_sub(closed_at.elapsed());
    poller.await.expect("the rules poller");
    // kube-proxy served on every node before any agent was told to go back (so before any
    // detached): the operator's first DataplaneNode write after it restored the DaemonSet
    // (writes before it only withdraw the cleanup instruction) comes after kube-proxy's rules
    // were seen on every node.
    let seen = rules_seen
        .lock()
        .map(|seen| seen.clone())
        .unwrap_or_default();
    assert_eq!(
        seen.len(),
        3,
        "kube-proxy's rules seen on every node: {seen:?}"
    );
    let audit: Vec<AuditEvent> = read_audit_events(&world.paths.audit_log())
        .expect("the audit log")
        .into_iter()
        .filter(|event| audit_time(event) >= rollback_applied_at)
        .collect();
    let restored_at = audit_writes(&audit, OPERATOR_SERVICE_ACCOUNT, "patch", "daemonsets")
        .filter(|event| object_name(event) == "kube-proxy")
        .map(audit_time)
        .min()
        .expect("the operator's patch restoring kube-proxy");
    let first_instruction =
        audit_writes(&audit, OPERATOR_SERVICE_ACCOUNT, "patch", "dataplanenodes")
            .map(audit_time)
            .filter(|time| *time > restored_at)
            .min()
            .expect("an operator write of a DataplaneNode after kube-proxy was restored");
    let since_rollback = |time: &SystemTime| {
        time.duration_since(rollback_applied_at)
            .unwrap_or_default()
            .as_secs_f64()
    };
    println!(
        "rollback: kube-proxy restored at {:.2} s, its rules seen at {:?} s, first node told KubeProxy at {:.2} s",
        since_rollback(&restored_at),
        seen.iter().map(|(node, time)| format!("{node} {:.2}", since_rollback(time))).collect::<Vec<_>>(),
        since_rollback(&first_instruction)
    );
    for (node, time) in &seen {
        assert!(
            *time < first_instruction,
            "kube-proxy's rules on {node} were seen only after the operator told a node to go back"
        );
    }
    daemon_sets
        .wait_caught_up(&world.kube_proxy_daemon_set())
        .await
        .expect("the kube-proxy DaemonSet recorded");
    let restored_revision = daemon_sets
        .versions()
        .iter()
        .filter(|version| {
            version.revision > rollback_revision && !kube_proxy_disabled(&version.object)
        })
        .map(|version| version.revision)
        .min()
        .expect("the kube-proxy DaemonSet was restored");
    dataplane_nodes
        .wait_caught_up(&dataplane_nodes_api)
        .await
        .expect("DataplaneNodes recorded");
    let node_versions = dataplane_nodes.versions();
    for node in NODES {
        let told = first_revision_where(&node_versions, rollback_revision, node, |version| {
            version.object.spec.mode == DataplaneMode::KubeProxy
        })
        .unwrap_or_else(|| panic!("{node} never told KubeProxy"));
        assert!(restored_revision < told, "{node} told KubeProxy at {told}, before kube-proxy was restored at {restored_revision}");
    }
    assert_kube_proxy_found_its_health_ports_free(world, rollback_applied_at, true).await;
    let report = traffic.stop().await;
    world.assert_traffic_healthy(&report, "Ebpf -> KubeProxy");
    for node in NODES {
        let rules = world.kube_proxy_rules(node).expect("iptables-save");
        assert!(
            rules.demo_service,
            "kube-proxy serves on {node} again: {rules:?}"
        );
    }
    let daemon_set: DaemonSet = world
        .kube_proxy_daemon_set()
        .get("kube-proxy")
        .await
        .expect("read");
    assert!(
        !kube_proxy_disabled(&daemon_set),
        "kube-proxy's nodeSelector restored"
    );
    println!(
        "Ebpf -> KubeProxy: Ready in {:.1} s; new connections {} made, {} failed; long-lived {} kept through draining, {} broken; every agent detached {:.1} s after the last connection closed",
        to_kube_proxy.as_secs_f64(),
        report.attempts(),
        report.failure_count(),
        long_lived_report.flows.values().map(|flow| flow.connections_opened).sum::<u64>(),
        long_lived_report.failure_count(),
        detached_after.as_secs_f64()
    );
}
