//! Scenario 4b, an operator that may not patch kube-proxy (see [`play`]).

use std::time::{Duration, Instant};

use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::Api;
use switchyard_crds::DataplanePhase;
use switchyard_e2e::wait::{hold_for, Check, WaitOptions};

use super::checks::*;
use crate::migration_support::*;

/// Scenario 4b: the operator may not patch the kube-proxy DaemonSet (the chart's RoleBinding
/// for it is deleted, as when a hand-written DataplaneConfig names a DaemonSet the chart's Role
/// does not cover). `Managed` is refused in Preflight (Degraded KubeProxyNotPatchable) before
/// any node is switched; once the binding is back, the transition starts by itself (a refusal
/// is asked again every 10 s, with no watch event needed), and is then turned back to KubeProxy.
pub async fn play(world: &World) {
    let generator = world
        .short_traffic_flowing()
        .await
        .expect("traffic through kube-proxy");
    let traffic = &generator;
    let rollout = serde_json::json!({"maxUnavailable": 3, "nodeReadyTimeoutSeconds": 60, "drainTimeoutSeconds": 120});
    let bindings: Api<RoleBinding> = Api::namespaced(world.client.clone(), "kube-system");
    let binding_name = "switchyard-operator-kube-proxy";
    let binding = bindings
        .get(binding_name)
        .await
        .expect("the chart's RoleBinding for the kube-proxy DaemonSet");
    bindings
        .delete(binding_name, &kube::api::DeleteParams::default())
        .await
        .expect("delete the RoleBinding");
    let generations_before = generations(&world.dataplane_nodes().await.expect("list"));
    let daemon_set_before = world
        .kube_proxy_daemon_set()
        .get("kube-proxy")
        .await
        .expect("read");
    let mut phases = Phases::default();
    let refused = phases
        .ask_for_ebpf_and_wait_refused(world, traffic, rollout.clone(), "KubeProxyNotPatchable")
        .await;
    assert!(
        refused.message.contains("may not patch") && refused.message.contains("External"),
        "the message says what is missing and what to do: {}",
        refused.message
    );
    // For the next 2 s (reviews go on): still Preflight, no node instructed, kube-proxy as it was.
    hold_for(
        "Preflight, every DataplaneNode and the kube-proxy DaemonSet as they were while refused",
        WaitOptions::new(Duration::from_secs(2)).every(Duration::from_millis(200)),
        || async {
            let phase = world
                .config()
                .await?
                .and_then(|config| config.status)
                .map(|status| status.phase);
            let now = generations(&world.dataplane_nodes().await?);
            let daemon_set = world.kube_proxy_daemon_set().get("kube-proxy").await?;
            Ok::<_, Failure>(
                if phase == Some(DataplanePhase::Preflight)
                    && now == generations_before
                    && daemon_set.metadata.resource_version
                        == daemon_set_before.metadata.resource_version
                {
                    Check::Ready(())
                } else {
                    Check::NotYet(format!(
                        "phase {phase:?}, generations {now:?} (before {generations_before:?}), kube-proxy at resourceVersion {:?} (before {:?})",
                        daemon_set.metadata.resource_version,
                        daemon_set_before.metadata.resource_version
                    ))
                },
            )
        },
    )
    .await
    .expect("nothing moves while refused");

    // Bound again: the next review lets the transition start, with no other change.
    let mut restored = binding.clone();
    restored.metadata.resource_version = None;
    restored.metadata.uid = None;
    restored.metadata.creation_timestamp = None;
    restored.metadata.managed_fields = None;
    bindings
        .create(&kube::api::PostParams::default(), &restored)
        .await
        .expect("re-create the RoleBinding");
    let bound_again = Instant::now();
    phases
        .wait_until(
            world,
            traffic,
            "start switching nodes once the operator may patch kube-proxy",
            Duration::from_secs(40),
            |_, nodes| (generations(nodes) != generations_before).then_some(()),
        )
        .await;
    println!(
        "nodes switched {:.1?} after the RoleBinding came back",
        bound_again.elapsed()
    );
    phases
        .roll_back_to_kube_proxy(world, traffic, rollout, Duration::from_secs(120))
        .await;
    let report = generator.stop().await;
    world.assert_traffic_healthy(&report, "in scenario 4b");
}
