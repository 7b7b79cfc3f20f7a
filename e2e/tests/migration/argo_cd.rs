//! Scenario 6, kube-proxy owned by Argo CD (see [`play`]).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kube::Api;
use switchyard_crds::{DataplaneConfig, DataplaneMode, DataplanePhase};
use switchyard_e2e::wait::{hold_for, Check, WaitOptions};

use super::checks::*;
use crate::migration_support::*;

/// Scenario 6: the kube-proxy DaemonSet carries Argo CD's tracking annotation. `Managed` is
/// refused in Preflight (Degraded KubeProxyManagedExternally, a message naming
/// `spec.kubeProxy.management` External) and kube-proxy is left untouched; `External` activates
/// every node and waits in DisablingKubeProxy without touching it; the test deletes the
/// DaemonSet (as Argo CD would) and the transition finishes. Then the DaemonSet comes back
/// (re-synced by its owner): Degraded KubeProxyReturned, cleanup withdrawn where it runs, still
/// untouched; and back to KubeProxy.
pub async fn play(world: &World) {
    let generator = world
        .short_traffic_flowing()
        .await
        .expect("traffic through kube-proxy");
    let traffic = &generator;
    let kube_proxy_pods = Recorder::start(world.kube_proxy_pods());
    let mark = serde_json::json!({"metadata": {"annotations": {"argocd.argoproj.io/tracking-id": "addons:apps/DaemonSet:kube-system/kube-proxy"}}});
    let marked = world
        .kube_proxy_daemon_set()
        .patch(
            "kube-proxy",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&mark),
        )
        .await
        .expect("mark kube-proxy as Argo CD's");
    let pods_before = world.kube_proxy_pods_by_node().await.expect("pods");
    assert_eq!(pods_before.len(), 3, "kube-proxy on every node");
    let refusals_before = world
        .event_count(
            "default",
            "DataplaneConfig",
            "default",
            "KubeProxyManagedExternally",
        )
        .await
        .expect("Events");
    let generations_before = generations(&world.dataplane_nodes().await.expect("list"));
    let mut phases = Phases::default();
    let refused = phases
        .ask_for_ebpf_and_wait_refused(
            world,
            traffic,
            serde_json::json!({"maxUnavailable": 3, "nodeReadyTimeoutSeconds": 60, "drainTimeoutSeconds": 120}),
            "KubeProxyManagedExternally",
        )
        .await;
    assert!(
        refused.message.contains("spec.kubeProxy.management")
            && refused.message.contains("External"),
        "the message must tell the user to set management External: {}",
        refused.message
    );
    assert!(
        refused.message.contains("Argo CD"),
        "the message names the owner: {}",
        refused.message
    );
    // For the next 3 s (reviews go on): kube-proxy's DaemonSet, its pods and rules, and every
    // DataplaneNode as they were.
    let pod_uids = |pods: &BTreeMap<String, k8s_openapi::api::core::v1::Pod>| {
        pods.values()
            .map(|pod| pod.metadata.uid.clone())
            .collect::<Vec<_>>()
    };
    hold_for(
        "kube-proxy (DaemonSet, pods, rules) and every DataplaneNode untouched while refused",
        WaitOptions::new(Duration::from_secs(3)).every(Duration::from_millis(250)),
        || async {
            let untouched = world.kube_proxy_daemon_set().get("kube-proxy").await?;
            let nodes = world.dataplane_nodes().await?;
            let pods = world.kube_proxy_pods_by_node().await?;
            let mut rules_gone = Vec::new();
            for node in NODES {
                if !world.kube_proxy_rules(node)?.demo_service {
                    rules_gone.push(node);
                }
            }
            Ok::<_, Failure>(
                if untouched.metadata.resource_version == marked.metadata.resource_version
                    && generations(&nodes) == generations_before
                    && pod_uids(&pods) == pod_uids(&pods_before)
                    && rules_gone.is_empty()
                {
                    Check::Ready(())
                } else {
                    Check::NotYet(format!(
                        "kube-proxy at resourceVersion {:?} (marked {:?}); generations {:?} (before {generations_before:?}); pods {:?} (before {:?}); rules gone on {rules_gone:?}",
                        untouched.metadata.resource_version,
                        marked.metadata.resource_version,
                        generations(&nodes),
                        pod_uids(&pods),
                        pod_uids(&pods_before)
                    ))
                },
            )
        },
    )
    .await
    .expect("nothing touched while refused");
    let refusals = world
        .event_count_above(
            "default",
            "DataplaneConfig",
            "default",
            "KubeProxyManagedExternally",
            refusals_before,
        )
        .await
        .expect("Events");
    assert!(refusals > refusals_before, "no Event about the refusal");
    let report = traffic.snapshot();
    world.assert_traffic_healthy(&report, "while refused");

    // External: every node is activated, then the operator waits for kube-proxy's owner.
    let config = serde_json::json!({
        "apiVersion": "switchyard.dev/v1alpha1",
        "kind": "DataplaneConfig",
        "metadata": {"name": "default"},
        "spec": {
            "mode": "Ebpf",
            "kubeProxy": {"management": "External"},
            "rollout": {"maxUnavailable": 3, "nodeReadyTimeoutSeconds": 60, "drainTimeoutSeconds": 120},
        },
    });
    Api::<DataplaneConfig>::all(world.client.clone())
        .patch(
            "default",
            &kube::api::PatchParams::apply("switchyard-demo").force(),
            &kube::api::Patch::Apply(&config),
        )
        .await
        .expect("apply management External");
    let waiting = phases
        .wait_until(
            world,
            traffic,
            "see External wait in DisablingKubeProxy with every node serving",
            Duration::from_secs(60),
            |config, nodes| {
                let status = config.status.as_ref()?;
                (status.phase == DataplanePhase::DisablingKubeProxy
                    && status.observed_generation == config.metadata.generation
                    && nodes.values().all(is_serving))
                .then(|| status.message.clone().unwrap_or_default())
            },
        )
        .await;
    println!("External, waiting: {waiting}");
    // For the next 3 s: kube-proxy unchanged, still DisablingKubeProxy, no node told to clean.
    hold_for(
        "External waiting for kube-proxy's owner without touching it",
        WaitOptions::new(Duration::from_secs(3)).every(Duration::from_millis(250)),
        || async {
            let untouched = world.kube_proxy_daemon_set().get("kube-proxy").await?;
            let phase = world
                .config()
                .await?
                .and_then(|config| config.status)
                .map(|status| status.phase);
            let cleaning: Vec<String> = world
                .dataplane_nodes()
                .await?
                .into_iter()
                .filter(|(_, node)| node.spec.iptables_cleanup)
                .map(|(name, _)| name)
                .collect();
            Ok::<_, Failure>(
                if untouched.metadata.generation == marked.metadata.generation
                    && phase == Some(DataplanePhase::DisablingKubeProxy)
                    && cleaning.is_empty()
                {
                    Check::Ready(())
                } else {
                    Check::NotYet(format!(
                        "kube-proxy generation {:?} (marked {:?}), phase {phase:?}, told to clean: {cleaning:?}",
                        untouched.metadata.generation, marked.metadata.generation
                    ))
                },
            )
        },
    )
    .await
    .expect("External waits");

    // Its owner deletes the DaemonSet: the transition continues.
    let deleted_at = Instant::now();
    world
        .kube_proxy_daemon_set()
        .delete("kube-proxy", &kube::api::DeleteParams::default())
        .await
        .expect("delete kube-proxy");
    phases
        .wait_until(
            world,
            traffic,
            "reach Ready on Ebpf once kube-proxy is deleted",
            Duration::from_secs(60),
            |config, _| config_ready(config, DataplaneMode::Ebpf).then_some(()),
        )
        .await;
    println!(
        "External: Ready {:.1} s after the DaemonSet was deleted; phases seen {:?}",
        deleted_at.elapsed().as_secs_f64(),
        phases.seen
    );
    let pod_versions = kube_proxy_pods.versions();
    let nodes = world.dataplane_nodes().await.expect("list");
    for node in NODES {
        let pod = pods_before[node].metadata.name.clone().unwrap_or_default();
        let gone = revision_deleted(&pod_versions, &pod)
            .unwrap_or_else(|| panic!("{pod} never seen deleted"));
        let cleanup_generation = nodes[node].metadata.generation.unwrap_or(0);
        assert!(
            nodes[node].spec.iptables_cleanup,
            "{node} not told to clean"
        );
        let rules = world.kube_proxy_rules(node).expect("iptables-save");
        assert_eq!(
            rules.service_chains, 0,
            "kube-proxy Service chains left on {node}"
        );
        println!(
            "{node}: {pod} gone at revision {gone}; cleaned (generation {cleanup_generation})"
        );
    }
    let report = traffic.snapshot();
    world.assert_traffic_healthy(&report, "External");

    // Its owner puts kube-proxy back: External reports it and touches nothing; no node cleans
    // rules of the kube-proxy that came back.
    switchyard_e2e::objects::create_kube_proxy_daemonset(&world.client)
        .await
        .expect("re-create kube-proxy");
    // The Degraded condition lasts while a node is still told to clean; the Event stays.
    let mut returned_condition = None;
    phases
        .wait_until(
            world,
            traffic,
            "see Degraded KubeProxyReturned and cleanup withdrawn everywhere",
            Duration::from_secs(60),
            |config, nodes| {
                if let Some(condition) = degraded_condition(config)
                    .filter(|condition| condition.reason == "KubeProxyReturned")
                {
                    returned_condition = Some(condition.message);
                }
                (returned_condition.is_some()
                    && nodes.values().all(|node| !node.spec.iptables_cleanup))
                .then_some(())
            },
        )
        .await;
    println!(
        "External, kube-proxy returned: {}",
        returned_condition.unwrap_or_default()
    );
    assert!(
        world
            .event_count_above(
                "default",
                "DataplaneConfig",
                "default",
                "KubeProxyReturned",
                0
            )
            .await
            .expect("Events")
            > 0,
        "no KubeProxyReturned Event"
    );
    let back = world
        .kube_proxy_daemon_set()
        .get("kube-proxy")
        .await
        .expect("read");
    assert!(
        !kube_proxy_disabled(&back),
        "External must not disable kube-proxy"
    );
    // kube-proxy programs every node again and its rules stay.
    let started = Instant::now();
    for node in NODES {
        loop {
            if world
                .kube_proxy_rules(node)
                .expect("iptables-save")
                .demo_service
            {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "kube-proxy's rules never back on {node}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    hold_for(
        "the returned kube-proxy's rules on every node",
        WaitOptions::new(Duration::from_secs(3)).every(Duration::from_millis(250)),
        || async {
            let mut cleaned = Vec::new();
            for node in NODES {
                if !world.kube_proxy_rules(node)?.demo_service {
                    cleaned.push(node);
                }
            }
            Ok::<_, Failure>(if cleaned.is_empty() {
                Check::Ready(())
            } else {
                Check::NotYet(format!(
                    "rules of the returned kube-proxy cleaned on {cleaned:?}"
                ))
            })
        },
    )
    .await
    .expect("the rules of the returned kube-proxy stay");
    // And the report lasts while kube-proxy runs (not only until cleanup is withdrawn).
    let config = world
        .config()
        .await
        .expect("read")
        .expect("the DataplaneConfig");
    assert_eq!(
        degraded_condition(&config).map(|condition| condition.reason),
        Some("KubeProxyReturned".to_string()),
        "Degraded KubeProxyReturned gone while kube-proxy still runs: {:#?}",
        config.status
    );
    let report = traffic.snapshot();
    world.assert_traffic_healthy(&report, "kube-proxy returned");

    // Back to KubeProxy (its owner runs it again, External lets it be).
    let report = phases
        .roll_back_to_kube_proxy(
            world,
            traffic,
            serde_json::json!({"nodeReadyTimeoutSeconds": 60, "drainTimeoutSeconds": 120}),
            Duration::from_secs(90),
        )
        .await;
    println!(
        "kube-proxy owned by Argo CD: new connections {} made, 0 failed",
        report.attempts()
    );
    let report = generator.stop().await;
    world.assert_traffic_healthy(&report, "in scenario 6");
}
