//! Scenario 1: `helm install`, then KubeProxy -> Ebpf under new and long-lived connections,
//! proved by etcd revision (every node served from eBPF before kube-proxy was disabled, and was
//! told to clean only after its kube-proxy pod was gone), the audit log, Events, metrics and the
//! nodes' nat tables; scenario 7 checks what `kubectl wait` and `kubectl get` showed meanwhile.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use switchyard_crds::{
    condition_types, find_condition, ConditionStatus, DataplaneConfig, DataplaneMode,
    DataplanePhase,
};
use switchyard_e2e::audit::{read_audit_events, AuditEvent};

use super::checks::*;
use super::harness::Shared;
use crate::migration_support::*;

/// What `kubectl` showed during scenario 1, for scenario 7.
pub struct KubectlEvidence {
    /// `kubectl wait --for=condition=Ready dpc/default`, started right after mode Ebpf.
    pub waited: Result<(), String>,
    /// The DataplaneConfig's phase read as soon as `kubectl wait` returned.
    pub phase_then: Option<DataplanePhase>,
    /// `kubectl get dpc,dpn` once Ready.
    pub listing: Result<String, String>,
}

/// Scenario 7: `kubectl wait --for=condition=Ready` returned once the transition of scenario
/// 1 was Ready (not before), and `kubectl get dpc,dpn` shows the printer columns.
pub fn check_kubectl_wait(shared: &Shared) {
    let evidence = shared
        .kubectl
        .as_ref()
        .expect("scenario 1 ended before kubectl wait returned");
    assert!(
        evidence.waited.is_ok(),
        "kubectl wait --for=condition=Ready dpc/default: {:?}",
        evidence.waited
    );
    assert_eq!(
        evidence.phase_then,
        Some(DataplanePhase::Ready),
        "kubectl wait returned before the phase was Ready"
    );
    let listing = evidence.listing.as_ref().expect("kubectl get dpc,dpn");
    println!("kubectl get dpc,dpn:\n{listing}");
    for column in [
        "MODE", "PHASE", "SERVING", "READY", "CLEANUP", "AGENT", "3/3",
    ] {
        assert!(
            listing.contains(column),
            "kubectl get dpc,dpn lacks {column}:\n{listing}"
        );
    }
}

/// Scenario 1: see the module's documentation.
pub async fn play(world: &World, shared: &mut Shared) {
    let helm_started = Instant::now();
    world.helm_install(&[]).expect("helm install");
    world
        .wait_agents_reporting(Duration::from_secs(120))
        .await
        .expect("agents reporting");
    println!(
        "helm install to every agent reporting: {:.1?}",
        helm_started.elapsed()
    );
    // Every Node got its DataplaneNode from the operator, owned by the Node (so it goes with
    // it), with an Event about it on the Node.
    for (name, node) in world.dataplane_nodes().await.expect("list DataplaneNodes") {
        assert_made_by_the_operator(&node, &name);
    }
    assert!(
        world
            .event_count_above("default", "Node", "node-1", "DataplaneNodeCreated", 0)
            .await
            .expect("Events")
            > 0,
        "no DataplaneNodeCreated Event about node-1"
    );

    let recorders = TransitionRecorders::start(world).await;
    // kube-proxy's pod on each node, before anything changes.
    let pods_before: BTreeMap<String, String> = {
        let pods = kube::Api::<Pod>::namespaced(world.client.clone(), "kube-system")
            .list(&kube::api::ListParams::default().labels("k8s-app=kube-proxy"))
            .await
            .expect("list kube-proxy pods");
        pods.items
            .into_iter()
            .filter_map(|pod| {
                let node = pod.spec.as_ref()?.node_name.clone()?;
                Some((node, pod.metadata.name.clone()?))
            })
            .collect()
    };
    assert_eq!(
        pods_before.len(),
        3,
        "a kube-proxy pod on every node: {pods_before:?}"
    );
    for node in NODES {
        let rules = world.kube_proxy_rules(node).expect("iptables-save");
        assert!(
            rules.demo_service && rules.service_chains > 0,
            "kube-proxy serves on {node}: {rules:?}"
        );
    }

    let traffic = world
        .short_traffic_flowing()
        .await
        .expect("traffic through kube-proxy");
    let long_lived = world
        .long_lived_traffic_open(LONG_LIVED)
        .await
        .expect("long-lived connections through kube-proxy");

    // Mode Ebpf; `kubectl wait` (scenario 7) runs all along and must return once it is Ready.
    let applied_at = SystemTime::now();
    world
        .apply_config(
            DataplaneMode::Ebpf,
            serde_json::json!({"nodeReadyTimeoutSeconds": 60, "drainTimeoutSeconds": 120}),
        )
        .await
        .expect("apply mode Ebpf");
    let start_revision = world.config_revision().await;
    let configs = Api::<DataplaneConfig>::all(world.client.clone());
    let kubectl_wait = tokio::spawn(async move {
        let waited = tokio::task::spawn_blocking(|| {
            run(
                "kubectl",
                &[
                    "wait",
                    "--for=condition=Ready",
                    "dpc/default",
                    "--timeout=150s",
                ],
            )
            .map(|_| ())
            .map_err(|error| error.to_string())
        })
        .await
        .unwrap_or_else(|error| Err(format!("kubectl wait did not finish: {error}")));
        // The phase the moment `kubectl wait` returned: Ready, or it returned too early.
        let phase_then = configs
            .get_opt("default")
            .await
            .ok()
            .flatten()
            .and_then(|config| config.status)
            .map(|status| status.phase);
        (waited, phase_then)
    });
    let to_ebpf = wait_config_ready(
        world,
        DataplaneMode::Ebpf,
        &traffic,
        Duration::from_secs(150),
    )
    .await;
    let (waited, phase_then) = kubectl_wait
        .await
        .unwrap_or_else(|error| (Err(format!("the kubectl wait task failed: {error}")), None));
    let listing = run("kubectl", &["get", "dpc,dpn"]).map_err(|error| error.to_string());
    shared.kubectl = Some(KubectlEvidence {
        waited,
        phase_then,
        listing,
    });

    recorders.wait_caught_up(world, &pods_before).await;

    // Orderings, by etcd revision.
    let node_versions = recorders.dataplane_nodes.versions();
    let disabled_revision = recorders
        .daemon_sets
        .versions()
        .iter()
        .filter(|version| version.revision > start_revision && kube_proxy_disabled(&version.object))
        .map(|version| version.revision)
        .min()
        .expect("the kube-proxy DaemonSet was disabled");
    let pod_versions = recorders.kube_proxy_pods.versions();
    for node in NODES {
        let serving = first_revision_where(&node_versions, start_revision, node, |version| {
            is_serving(&version.object)
        })
        .unwrap_or_else(|| panic!("{node} never served from eBPF"));
        assert!(
            serving < disabled_revision,
            "{node} served from eBPF at revision {serving}, after kube-proxy was disabled at {disabled_revision}"
        );
        let cleanup = first_revision_where(&node_versions, start_revision, node, |version| {
            version.object.spec.iptables_cleanup
        })
        .unwrap_or_else(|| panic!("{node} was never told to clean"));
        let pod = &pods_before[node];
        let gone = revision_deleted(&pod_versions, pod)
            .unwrap_or_else(|| panic!("kube-proxy pod {pod} on {node} was never deleted"));
        assert!(
            gone < cleanup,
            "{node} was told to clean at revision {cleanup}, before its kube-proxy pod {pod} was gone at {gone}"
        );
        // No flapping: once its agent reported Ready, it stayed Ready.
        let ready_after_serving: Vec<bool> = node_versions
            .iter()
            .filter(|version| {
                version.revision >= serving && version.object.metadata.name.as_deref() == Some(node)
            })
            .filter_map(|version| {
                let status = version.object.status.as_ref()?;
                find_condition(&status.conditions, condition_types::READY)
                    .map(|condition| condition.status == ConditionStatus::True)
            })
            .collect();
        assert!(
            ready_after_serving.iter().all(|ready| *ready),
            "{node} flapped: Ready after serving {ready_after_serving:?}"
        );
        println!("{node}: served from eBPF at revision {serving}; kube-proxy disabled at {disabled_revision}; pod {pod} gone at {gone}; told to clean at {cleanup}");
    }
    // The audit log: the operator's ServiceAccount patched the DaemonSet once, and told each
    // node to clean (its last spec write) only after that node's kube-proxy pod was deleted.
    let audit = read_audit_events(&world.paths.audit_log()).expect("the audit log");
    let recent: Vec<AuditEvent> = audit
        .into_iter()
        .filter(|event| audit_time(event) >= applied_at)
        .collect();
    let daemon_set_patches: Vec<&AuditEvent> =
        audit_writes(&recent, OPERATOR_SERVICE_ACCOUNT, "patch", "daemonsets")
            .filter(|event| object_name(event) == "kube-proxy")
            .collect();
    assert_eq!(
        daemon_set_patches.len(),
        1,
        "one patch of kube-proxy by the operator: {daemon_set_patches:#?}"
    );
    for node in NODES {
        let pod = &pods_before[node];
        let deleted = recent
            .iter()
            .filter(|event| event.is_successful("delete", "pods", pod))
            .map(audit_time)
            .max()
            .unwrap_or_else(|| panic!("no delete of {pod} in the audit log"));
        let last_instruction =
            audit_writes(&recent, OPERATOR_SERVICE_ACCOUNT, "patch", "dataplanenodes")
                .filter(|event| object_name(event) == node)
                .map(audit_time)
                .max()
                .unwrap_or_else(|| panic!("no operator write of DataplaneNode {node}"));
        assert!(
            deleted < last_instruction,
            "{node}: last instruction before {pod} was deleted"
        );
        assert!(
            audit_time(daemon_set_patches[0]) < deleted,
            "{pod} deleted before the operator patched kube-proxy"
        );
    }
    // Every write the operator made carries Switchyard's User-Agent.
    let operator_writes: Vec<&AuditEvent> = recent
        .iter()
        .filter(|event| {
            event.stage == "ResponseComplete"
                && event.user.username == OPERATOR_SERVICE_ACCOUNT
                && ["create", "patch", "update", "delete"].contains(&event.verb.as_str())
        })
        .collect();
    assert!(!operator_writes.is_empty(), "no operator write audited");
    for event in &operator_writes {
        let agent = event.user_agent.as_deref().unwrap_or_default();
        assert!(
            agent.starts_with("switchyard-operator/") && agent.len() > "switchyard-operator/".len(),
            "an operator write without Switchyard's User-Agent: {event:?}"
        );
    }
    println!(
        "{} operator writes audited, all with User-Agent {:?}",
        operator_writes.len(),
        operator_writes[0].user_agent
    );
    // An Event for every step.
    for (namespace, kind, name, reason) in [
        ("default", "DataplaneConfig", "default", "PhaseChanged"),
        ("default", "DataplaneConfig", "default", "NodesInstructed"),
        ("default", "DataplaneConfig", "default", "KubeProxyDisabled"),
        (
            "kube-system",
            "DaemonSet",
            "kube-proxy",
            "KubeProxyDisabled",
        ),
    ] {
        let count = world
            .event_count_above(namespace, kind, name, reason, 0)
            .await
            .expect("Events");
        assert!(
            count > 0,
            "no {reason} Event about {kind} {namespace}/{name}"
        );
    }
    // The operator's metrics, and no reconcile loop at rest (nothing changes while Ready).
    let operator = world.operator_process().expect("the operator's process");
    let metrics = world
        .operator_metrics(&operator)
        .expect("the operator's metrics");
    assert_eq!(
        metric_value(
            &metrics,
            "switchyard_operator_transition_phase{phase=\"Ready\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        metric_value(&metrics, "switchyard_operator_nodes{state=\"serving\"}"),
        Some(3.0),
        "{metrics}"
    );
    let reconciles = |metrics: &str| {
        metric_value(
            metrics,
            "switchyard_operator_reconcile_duration_seconds_count",
        )
        .unwrap_or_default()
    };
    assert!(reconciles(&metrics) > 0.0, "{metrics}");
    // A deliberate window: the reconciles counted over all of it are what is asserted.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let at_rest =
        reconciles(&world.operator_metrics(&operator).expect("metrics")) - reconciles(&metrics);
    println!("operator reconciles at rest: {at_rest} in 5 s");
    assert!(
        at_rest <= 5.0,
        "{at_rest} reconciles in 5 s with nothing changing"
    );
    for node in NODES {
        let rules = world.kube_proxy_rules(node).expect("iptables-save");
        assert_eq!(
            rules.service_chains, 0,
            "kube-proxy Service chains left on {node}: {rules:?}"
        );
        assert!(
            !rules.demo_service,
            "the demo Service's kube-proxy rules left on {node}"
        );
    }
    let long_lived_report = long_lived.stop().await;
    assert_long_lived_intact(
        &long_lived_report,
        "long-lived connections opened through kube-proxy, KubeProxy -> Ebpf",
    );
    let report = traffic.stop().await;
    world.assert_traffic_healthy(&report, "KubeProxy -> Ebpf");
    println!(
        "KubeProxy -> Ebpf: Ready in {:.1} s; new connections {} made, {} failed; long-lived {} kept, {} broken",
        to_ebpf.as_secs_f64(),
        report.attempts(),
        report.failure_count(),
        long_lived_report.flows.values().map(|flow| flow.connections_opened).sum::<u64>(),
        long_lived_report.failure_count()
    );
}
