//! Scenario 2: the agents upgraded by `helm upgrade` with a new agent image tag (the image
//! table maps every tag to the same binary: the new tag gives the DaemonSet a new revision,
//! which is what the operator rolls): one node at a time, never two agent processes on one
//! node, no connection lost, and Helm the only writer of the agent DaemonSet.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use switchyard_crds::{DataplaneMode, DataplaneNode};

use crate::migration_support::*;

/// Scenario 2: see the module's documentation.
pub async fn play(world: &World) {
    let traffic = world
        .short_traffic_flowing()
        .await
        .expect("traffic through eBPF");
    let dataplane_nodes_api = Api::<DataplaneNode>::all(world.client.clone());
    let dataplane_nodes = Recorder::start_listed(dataplane_nodes_api.clone())
        .await
        .expect("record DataplaneNodes");
    let agent_pods = Recorder::start_listed(Api::<Pod>::namespaced(
        world.client.clone(),
        RELEASE_NAMESPACE,
    ))
    .await
    .expect("record the agent pods");
    let upgrade_revision = world.config_revision().await;
    let upgrade_started = Instant::now();
    world
        .helm_install(&["--set", "image.agent.tag=0.1.1-e2e"])
        .expect("helm upgrade with a new agent tag");
    let new_revision = {
        let started = Instant::now();
        loop {
            let daemon_set = Api::<DaemonSet>::namespaced(world.client.clone(), RELEASE_NAMESPACE)
                .get("switchyard-agent")
                .await
                .expect("read the agent DaemonSet");
            let image = daemon_set
                .spec
                .as_ref()
                .and_then(|spec| spec.template.spec.as_ref())
                .and_then(|spec| spec.containers.first())
                .and_then(|container| container.image.clone())
                .unwrap_or_default();
            assert!(image.ends_with(":0.1.1-e2e"), "the DaemonSet runs {image}");
            let revisions = Api::<k8s_openapi::api::apps::v1::ControllerRevision>::namespaced(
                world.client.clone(),
                RELEASE_NAMESPACE,
            )
            .list(&kube::api::ListParams::default())
            .await
            .expect("list ControllerRevisions");
            let newest = revisions
                .items
                .iter()
                .max_by_key(|revision| revision.revision)
                .and_then(|revision| {
                    revision
                        .metadata
                        .labels
                        .as_ref()?
                        .get("controller-revision-hash")
                        .cloned()
                });
            if let Some(newest) = newest.filter(|_| revisions.items.len() >= 2) {
                break newest;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "no new agent revision"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let mut last_line = String::new();
    let mut saw_upgrading = false;
    loop {
        let nodes = world.dataplane_nodes().await.expect("list");
        let config = world.config().await.expect("read");
        let upgraded = nodes
            .values()
            .filter(|node| {
                node.status
                    .as_ref()
                    .and_then(|status| status.agent_revision.as_deref())
                    == Some(new_revision.as_str())
                    && is_serving(node)
            })
            .count();
        let phase = config
            .as_ref()
            .and_then(|config| config.status.as_ref())
            .map(|status| status.phase.to_string())
            .unwrap_or_default();
        saw_upgrading |= phase == "UpgradingAgents";
        let line = format!("{phase} agents on the new revision: {upgraded}/3");
        if line != last_line {
            println!("{:>5.1}s {line}", upgrade_started.elapsed().as_secs_f64());
            last_line = line.clone();
        }
        if upgraded == 3
            && config
                .as_ref()
                .is_some_and(|config| config_ready(config, DataplaneMode::Ebpf))
        {
            break;
        }
        assert!(
            upgrade_started.elapsed() < Duration::from_secs(120),
            "failed to upgrade every agent within 120 s: {line}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let upgrade_duration = upgrade_started.elapsed();
    // One node at a time: a node's old agent pod is deleted only after the node before it
    // reports Ready on the new revision.
    dataplane_nodes
        .wait_caught_up(&dataplane_nodes_api)
        .await
        .expect("DataplaneNodes recorded");
    let old_pod_deleted = |versions: &[Version<Pod>], node: &str| {
        versions
            .iter()
            .filter(|version| version.revision > upgrade_revision)
            .filter(|version| {
                version
                    .object
                    .spec
                    .as_ref()
                    .and_then(|spec| spec.node_name.as_deref())
                    == Some(node)
                    && (version.deleted || version.object.metadata.deletion_timestamp.is_some())
            })
            .map(|version| version.revision)
            .min()
    };
    agent_pods
        .wait_recorded("the deletion of an agent pod on every node", |versions| {
            NODES
                .iter()
                .all(|node| old_pod_deleted(versions, node).is_some())
        })
        .await
        .expect("agent pods recorded");
    let node_versions = dataplane_nodes.versions();
    let mut upgrades: Vec<(u64, u64, String)> = Vec::new();
    for node in NODES {
        let deleted = old_pod_deleted(&agent_pods.versions(), node)
            .unwrap_or_else(|| panic!("the agent pod on {node} was never deleted"));
        let ready = first_revision_where(&node_versions, upgrade_revision, node, |version| {
            is_serving(&version.object)
                && version
                    .object
                    .status
                    .as_ref()
                    .and_then(|status| status.agent_revision.as_deref())
                    == Some(new_revision.as_str())
        })
        .unwrap_or_else(|| panic!("{node} never reported Ready on the new revision"));
        upgrades.push((deleted, ready, node.to_string()));
    }
    upgrades.sort();
    println!(
        "agent upgrades (old pod deleted at revision, new agent Ready at revision): {upgrades:?}"
    );
    for pair in upgrades.windows(2) {
        assert!(
            pair[0].1 < pair[1].0,
            "{} was upgraded before {} was Ready again: {upgrades:?}",
            pair[1].2,
            pair[0].2
        );
    }
    // Never two agent processes on one node (the pod runner's event log).
    let events = switchyard_e2e::pod_runner::events::read_events(&world.paths.pod_runner_events())
        .expect("the pod runner's events");
    for node in NODES {
        let mut running: Vec<Option<u32>> = Vec::new();
        for event in events
            .iter()
            .filter(|event| event.container == "agent" && event.node == node)
        {
            match event.kind {
                switchyard_e2e::pod_runner::events::EventKind::Started => {
                    running.push(event.pid);
                    assert!(
                        running.len() <= 1,
                        "two agent processes on {node}: {running:?}"
                    );
                }
                switchyard_e2e::pod_runner::events::EventKind::Exited => {
                    running.retain(|pid| *pid != event.pid);
                }
                _ => {}
            }
        }
        assert_eq!(
            running.len(),
            1,
            "one agent process left on {node}: {running:?}"
        );
    }
    let report = traffic.stop().await;
    world.assert_traffic_healthy(&report, "during the agent upgrade");
    println!(
        "agent upgrade: {:.1} s for 3 nodes, one at a time; new connections {} made, 0 failed",
        upgrade_duration.as_secs_f64(),
        report.attempts()
    );
    drop(agent_pods);
    assert!(
        world
            .event_count_above(
                "default",
                "DataplaneConfig",
                "default",
                "AgentPodsDeleted",
                0
            )
            .await
            .expect("Events")
            > 0,
        "no AgentPodsDeleted Event"
    );
    assert!(
        saw_upgrading,
        "phase UpgradingAgents never seen during the agent upgrade"
    );
    // Agents are upgraded by deleting pods: Helm stays the only writer of their DaemonSet.
    let agent_daemon_set = Api::<DaemonSet>::namespaced(world.client.clone(), RELEASE_NAMESPACE)
        .get("switchyard-agent")
        .await
        .expect("read the agent DaemonSet");
    let writers = super::checks::field_managers(&agent_daemon_set.metadata);
    assert!(
        !writers
            .iter()
            .any(|manager| manager == "switchyard-operator"),
        "the operator wrote the agent DaemonSet: {writers:?}"
    );
}
