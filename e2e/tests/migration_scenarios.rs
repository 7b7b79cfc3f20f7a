//! Issue 6's seven e2e scenarios (and issue 8's e2e part) on one 3-node cluster with real
//! kube-proxy, the chart installed by helm and the real agent and operator binaries, in this
//! order: (1) helm install and KubeProxy -> Ebpf, (7) `kubectl wait` and the columns, (2) agent
//! upgrade by `helm upgrade`, (3) rollback with draining, (4) KubeProxy -> Ebpf with the
//! operator SIGKILLed in ActivatingNodes and again in DisablingKubeProxy, then kube-proxy's
//! nodeSelector reset under eBPF and the rollback restoring it exactly, (4b) an operator that
//! may not patch kube-proxy refused in Preflight until its RoleBinding is back, (6) kube-proxy owned by
//! Argo CD (`Managed` refused, `External` waits until the test deletes it, then it comes back),
//! (5) an agent that never becomes Ready, and the DataplaneConfig deleted mid-transition.
//! `make e2e-operator` starts the cluster, runs the operator's own cluster tests and then this
//! inside it, and tears it down.
//!
//! New connections run all the time (a client pod on node-1 to the ClusterIP, outside to
//! node-1's NodePort, each ~100 a second) and every failure is counted; before the
//! transitions of (1) and (3) 20 long-lived connections from each client are opened, each
//! sending a line every 200 ms. Orderings are proved by etcd revision: the recorder sees every version of
//! the DataplaneNodes, the kube-proxy DaemonSet and its pods, and the one etcd gives
//! every write of every resource a place in one sequence. The API server's audit log
//! tells who wrote (the operator's ServiceAccount) and when.

mod migration_support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::Api;
use migration_support::*;
use switchyard_crds::{
    condition_types, find_condition, ConditionStatus, DataplaneConfig, DataplaneMode,
    DataplaneNode, DataplanePhase,
};
use switchyard_e2e::audit::{read_audit_events, AuditEvent};
use switchyard_e2e::traffic::{TrafficGenerator, TrafficReport};

const LONG_LIVED: usize = 20;

fn audit_time(event: &AuditEvent) -> SystemTime {
    chrono::DateTime::parse_from_rfc3339(&event.stage_timestamp)
        .map(SystemTime::from)
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// Successful completed writes (`verb`) of `resource` (no subresource) by `user`.
fn audit_writes<'a>(
    events: &'a [AuditEvent],
    user: &'a str,
    verb: &'a str,
    resource: &'a str,
) -> impl Iterator<Item = &'a AuditEvent> + 'a {
    events.iter().filter(move |event| {
        event.stage == "ResponseComplete"
            && event.verb == verb
            && event.user.username == user
            && event
                .response_status
                .as_ref()
                .and_then(|status| status.code)
                .is_some_and(|code| code < 300)
            && event
                .object_ref
                .as_ref()
                .is_some_and(|object| object.resource == resource && object.subresource.is_none())
    })
}

fn object_name(event: &AuditEvent) -> &str {
    event
        .object_ref
        .as_ref()
        .and_then(|object| object.name.as_deref())
        .unwrap_or_default()
}

/// Waits until the DataplaneConfig is Ready in `mode`, printing the transition as it goes;
/// returns how long it took.
async fn wait_config_ready(
    world: &World,
    mode: DataplaneMode,
    traffic: &TrafficGenerator,
    timeout: Duration,
) -> Duration {
    let started = Instant::now();
    let mut last_line = String::new();
    loop {
        let config = world.config().await.expect("read the DataplaneConfig");
        let nodes = world.dataplane_nodes().await.expect("list DataplaneNodes");
        let line = progress_line(config.as_ref(), &nodes, mode);
        if line != last_line {
            let report = traffic.snapshot();
            println!(
                "{:>5.1}s {line}  connections {} failed {}",
                started.elapsed().as_secs_f64(),
                report.attempts(),
                report.failure_count()
            );
            last_line = line;
        }
        if config
            .as_ref()
            .is_some_and(|config| config_ready(config, mode))
        {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < timeout,
            "failed to reach Ready on {mode} within {timeout:?}: {config:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn assert_long_lived_intact(report: &TrafficReport, what: &str) {
    println!("{what}: {report}");
    for (name, flow) in &report.flows {
        assert_eq!(
            flow.failures.len(),
            0,
            "{what}: {name} had broken connections\n{report}"
        );
        assert_eq!(
            flow.connections_opened, LONG_LIVED as u64,
            "{what}: {name} had to reopen connections\n{report}"
        );
        assert!(
            flow.successes >= 5 * LONG_LIVED as u64,
            "{what}: {name} exchanged too little\n{report}"
        );
    }
}

/// The first time the demo Service's kube-proxy rules are seen on each node, polled every
/// 100 ms (for at most about a minute).
fn poll_kube_proxy_rules() -> (
    Arc<Mutex<BTreeMap<String, SystemTime>>>,
    tokio::task::JoinHandle<()>,
) {
    let seen: Arc<Mutex<BTreeMap<String, SystemTime>>> = Arc::default();
    let shared = seen.clone();
    let nodes: Vec<String> = NODES.iter().map(|node| node.to_string()).collect();
    let task = tokio::task::spawn_blocking(move || {
        for _ in 0..600 {
            for node in &nodes {
                let already = shared
                    .lock()
                    .map(|seen| seen.contains_key(node))
                    .unwrap_or(true);
                if already {
                    continue;
                }
                let present =
                    switchyard_e2e::netns::run_in_namespace(node, "iptables-save", &["-t", "nat"])
                        .map(|dump| KubeProxyRules::parse(&dump).demo_service)
                        .unwrap_or(false);
                if present {
                    if let Ok(mut seen) = shared.lock() {
                        seen.insert(node.clone(), SystemTime::now());
                    }
                }
            }
            if shared
                .lock()
                .map(|seen| seen.len() == nodes.len())
                .unwrap_or(true)
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    (seen, task)
}

/// ICMP and ARP seen by the client pod, written to the cluster's logs (kept by `down` beside
/// the last logs) for diagnosing a failed connection; stopped when dropped. Nothing is
/// captured when tcpdump is not installed.
struct ClientCapture(Option<std::process::Child>);

impl ClientCapture {
    fn start(world: &World) -> Self {
        let path = world
            .paths
            .audit_log()
            .with_file_name("client-pod-icmp-arp.log");
        let child = std::fs::File::create(&path).ok().and_then(|file| {
            std::process::Command::new("ip")
                .args(["netns", "exec", &world.client_pod.name, "tcpdump"])
                .args(["-n", "-l", "-tttt", "-i", "any", "icmp or arp"])
                .stdout(file)
                .stderr(std::process::Stdio::null())
                .spawn()
                .ok()
        });
        Self(child)
    }
}

impl Drop for ClientCapture {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[tokio::test]
#[ignore = "needs the e2e cluster: make e2e-migration"]
async fn a_cluster_moves_to_ebpf_and_back_under_traffic_without_breaking_a_connection() {
    let world = World::new()
        .await
        .expect("the demo Service served by kube-proxy");
    let _capture = ClientCapture::start(&world);
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
        let owners = node.metadata.owner_references.clone().unwrap_or_default();
        assert!(
            owners.len() == 1 && owners[0].kind == "Node" && owners[0].name == name,
            "DataplaneNode {name} owned by {owners:?}"
        );
        let managers: Vec<String> = node
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter_map(|entry| entry.manager.clone())
            .collect();
        assert!(
            managers
                .iter()
                .any(|manager| manager == "switchyard-operator"),
            "DataplaneNode {name} managed by {managers:?}"
        );
    }
    assert!(
        world
            .event_count_above("default", "Node", "node-1", "DataplaneNodeCreated", 0)
            .await
            .expect("Events")
            > 0,
        "no DataplaneNodeCreated Event about node-1"
    );

    let dataplane_nodes = Recorder::start(Api::<DataplaneNode>::all(world.client.clone()));
    let daemon_sets = Recorder::start(world.kube_proxy_daemon_set());
    let kube_proxy_pods = Recorder::start(world.kube_proxy_pods());
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

    let traffic = world.short_traffic().expect("traffic");
    let long_lived = world
        .long_lived_traffic(LONG_LIVED)
        .expect("long-lived connections");
    tokio::time::sleep(Duration::from_secs(2)).await;

    // (1) + (7): mode Ebpf; `kubectl wait` returns once it is Ready.
    let applied_at = SystemTime::now();
    world
        .apply_config(
            DataplaneMode::Ebpf,
            serde_json::json!({"nodeReadyTimeoutSeconds": 60, "drainTimeoutSeconds": 120}),
        )
        .await
        .expect("apply mode Ebpf");
    let start_revision = world.config_revision().await;
    let kubectl_wait = tokio::task::spawn_blocking(|| {
        run(
            "kubectl",
            &[
                "wait",
                "--for=condition=Ready",
                "dpc/default",
                "--timeout=150s",
            ],
        )
        .map_err(|error| error.to_string())
    });
    let to_ebpf = wait_config_ready(
        &world,
        DataplaneMode::Ebpf,
        &traffic,
        Duration::from_secs(150),
    )
    .await;
    let waited = kubectl_wait.await.expect("kubectl wait ran");
    assert!(
        waited.is_ok(),
        "kubectl wait --for=condition=Ready dpc/default: {waited:?}"
    );
    let config = world
        .config()
        .await
        .expect("read")
        .expect("the DataplaneConfig");
    assert_eq!(
        config.status.as_ref().map(|status| status.phase),
        Some(DataplanePhase::Ready),
        "kubectl wait returned before the phase was Ready"
    );
    let listing = run("kubectl", &["get", "dpc,dpn"]).expect("kubectl get dpc,dpn");
    println!("kubectl get dpc,dpn:\n{listing}");
    for column in [
        "MODE", "PHASE", "SERVING", "READY", "CLEANUP", "AGENT", "3/3",
    ] {
        assert!(
            listing.contains(column),
            "kubectl get dpc,dpn lacks {column}:\n{listing}"
        );
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Orderings, by etcd revision.
    let node_versions = dataplane_nodes.versions();
    let disabled_revision = daemon_sets
        .versions()
        .iter()
        .filter(|version| version.revision > start_revision && kube_proxy_disabled(&version.object))
        .map(|version| version.revision)
        .min()
        .expect("the kube-proxy DaemonSet was disabled");
    let pod_versions = kube_proxy_pods.versions();
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
    let so_far = traffic.snapshot();
    world.assert_no_failed_connections(&so_far, "KubeProxy -> Ebpf");
    println!(
        "KubeProxy -> Ebpf: Ready in {:.1} s; new connections {} made, {} failed; long-lived {} kept, {} broken",
        to_ebpf.as_secs_f64(),
        so_far.attempts(),
        so_far.failure_count(),
        long_lived_report.flows.values().map(|flow| flow.connections_opened).sum::<u64>(),
        long_lived_report.failure_count()
    );

    // (2) Agent upgrade by `helm upgrade` with a new agent image tag (the image table maps
    // every tag to the same binary: the new tag gives the DaemonSet a new revision, which is
    // what the operator rolls): one node at a time, never two agent processes on one node.
    let agent_pods = Recorder::start(Api::<Pod>::namespaced(
        world.client.clone(),
        RELEASE_NAMESPACE,
    ));
    let upgrade_revision = world.config_revision().await;
    let before_upgrade = traffic.snapshot();
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
    let node_versions = dataplane_nodes.versions();
    let mut upgrades: Vec<(u64, u64, String)> = Vec::new();
    for node in NODES {
        let deleted = agent_pods
            .versions()
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
    let after_upgrade = traffic.snapshot();
    world.assert_no_failed_connections(&after_upgrade, "during the agent upgrade");
    println!(
        "agent upgrade: {:.1} s for 3 nodes, one at a time; new connections {} made, 0 failed",
        upgrade_duration.as_secs_f64(),
        after_upgrade.attempts() - before_upgrade.attempts()
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
    let writers: Vec<String> = agent_daemon_set
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|entry| entry.manager.clone())
        .collect();
    assert!(
        !writers
            .iter()
            .any(|manager| manager == "switchyard-operator"),
        "the operator wrote the agent DaemonSet: {writers:?}"
    );

    // (3) Rollback to KubeProxy, with 20 + 20 connections now carried by eBPF.
    let long_lived = world
        .long_lived_traffic(LONG_LIVED)
        .expect("long-lived connections");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (rules_seen, poller) = poll_kube_proxy_rules();
    let rollback_applied_at = SystemTime::now();
    let before_rollback = traffic.snapshot();
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
    tokio::time::sleep(Duration::from_secs(3)).await;
    let nodes = world.dataplane_nodes().await.expect("list");
    assert!(
        nodes.values().any(is_draining),
        "the draining node stopped draining with connections open"
    );
    let config = world
        .config()
        .await
        .expect("read")
        .expect("the DataplaneConfig");
    assert_ne!(
        config.status.as_ref().map(|status| status.phase),
        Some(DataplanePhase::Ready),
        "Ready while a node still drains"
    );
    world.assert_no_failed_connections(&traffic.snapshot(), "while draining");
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
        &world,
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
    let restored_revision = daemon_sets
        .versions()
        .iter()
        .filter(|version| {
            version.revision > rollback_revision && !kube_proxy_disabled(&version.object)
        })
        .map(|version| version.revision)
        .min()
        .expect("the kube-proxy DaemonSet was restored");
    let node_versions = dataplane_nodes.versions();
    for node in NODES {
        let told = first_revision_where(&node_versions, rollback_revision, node, |version| {
            version.object.spec.mode == DataplaneMode::KubeProxy
        })
        .unwrap_or_else(|| panic!("{node} never told KubeProxy"));
        assert!(restored_revision < told, "{node} told KubeProxy at {told}, before kube-proxy was restored at {restored_revision}");
    }
    let report = traffic.stop().await;
    let rollback_attempts = report.attempts() - before_rollback.attempts();
    println!("{report}");
    world.assert_no_failed_connections(&report, "so far");
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
        rollback_attempts,
        report.failure_count() - so_far.failure_count(),
        long_lived_report.flows.values().map(|flow| flow.connections_opened).sum::<u64>(),
        long_lived_report.failure_count(),
        detached_after.as_secs_f64()
    );

    // (4) and (6), under new connections all the time.
    let traffic = world.short_traffic().expect("traffic");
    tokio::time::sleep(Duration::from_secs(1)).await;
    the_operator_killed_twice_finishes_without_repeating_or_skipping_a_step(&world, &traffic).await;
    a_kube_proxy_the_operator_may_not_patch_is_refused_until_it_may(&world, &traffic).await;
    a_kube_proxy_owned_by_argo_cd_is_refused_then_waited_for(&world, &traffic).await;
    let report = traffic.stop().await;
    println!("{report}");
    world.assert_no_failed_connections(&report, "in scenarios 4, 4b and 6");

    // (5) An agent that never becomes Ready: node-3's bpffs is hidden under a tmpfs (pins
    // fail there) and its agent is restarted; mode Ebpf then halts with Degraded naming
    // node-3, and kube-proxy is left alone.
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
    tokio::time::sleep(Duration::from_secs(3)).await;
    let traffic = world.short_traffic().expect("traffic");
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
    tokio::time::sleep(Duration::from_secs(3)).await;
    let daemon_set: DaemonSet = world
        .kube_proxy_daemon_set()
        .get("kube-proxy")
        .await
        .expect("read");
    assert!(
        !kube_proxy_disabled(&daemon_set),
        "kube-proxy was disabled despite a node that is not Ready"
    );
    for (name, node) in world.dataplane_nodes().await.expect("list") {
        assert!(
            !node.spec.iptables_cleanup,
            "{name} was told to clean kube-proxy's rules"
        );
    }
    for node in NODES {
        let rules = world.kube_proxy_rules(node).expect("iptables-save");
        assert!(
            rules.demo_service,
            "kube-proxy's rules gone on {node}: {rules:?}"
        );
    }
    // Deleting the DataplaneConfig leaves the dataplane as it is, mid-transition included.
    let nodes_before = world.dataplane_nodes().await.expect("list");
    let daemon_set_before = world
        .kube_proxy_daemon_set()
        .get("kube-proxy")
        .await
        .expect("read");
    Api::<DataplaneConfig>::all(world.client.clone())
        .delete("default", &kube::api::DeleteParams::default())
        .await
        .expect("delete the DataplaneConfig");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let nodes_after = world.dataplane_nodes().await.expect("list");
    assert_eq!(
        nodes_after.len(),
        3,
        "DataplaneNodes removed with the config"
    );
    for (name, node) in &nodes_after {
        assert_eq!(
            node.spec, nodes_before[name].spec,
            "{name} changed after the DataplaneConfig was deleted"
        );
    }
    let daemon_set_after = world
        .kube_proxy_daemon_set()
        .get("kube-proxy")
        .await
        .expect("read");
    assert_eq!(
        daemon_set_after.metadata.generation, daemon_set_before.metadata.generation,
        "kube-proxy changed after the DataplaneConfig was deleted"
    );
    let report = traffic.stop().await;
    println!("{report}");
    world.assert_no_failed_connections(
        &report,
        "while halted and after the DataplaneConfig was deleted",
    );
}

// ---------------------------------------------------------------------------
// Scenarios 4 and 6, under the same traffic as the others.
// ---------------------------------------------------------------------------

fn kill(pid: u32, signal: i32) {
    // SAFETY: kill(2) on a pid the pod runner reported for the operator's container.
    let result = unsafe { libc::kill(pid as i32, signal) };
    assert_eq!(result, 0, "kill {pid}: {}", std::io::Error::last_os_error());
}

/// The phases a DataplaneConfig went through, as polled (each one once in a row).
#[derive(Default)]
struct Phases {
    seen: Vec<DataplanePhase>,
    started: Option<Instant>,
    last_line: String,
}

impl Phases {
    /// Polls every 100 ms, printing each change, until `check` returns `Some`; fails the test
    /// after `timeout`.
    async fn wait_until<T>(
        &mut self,
        world: &World,
        traffic: &TrafficGenerator,
        description: &str,
        timeout: Duration,
        mut check: impl FnMut(&DataplaneConfig, &BTreeMap<String, DataplaneNode>) -> Option<T>,
    ) -> T {
        let started = *self.started.get_or_insert_with(Instant::now);
        let waiting_since = Instant::now();
        loop {
            let config = world
                .config()
                .await
                .expect("read the DataplaneConfig")
                .expect("the DataplaneConfig");
            let nodes = world.dataplane_nodes().await.expect("list DataplaneNodes");
            if let Some(status) = &config.status {
                if self.seen.last() != Some(&status.phase) {
                    self.seen.push(status.phase);
                }
            }
            let degraded = config
                .status
                .as_ref()
                .and_then(|status| find_condition(&status.conditions, condition_types::DEGRADED))
                .filter(|condition| condition.status == ConditionStatus::True)
                .map(|condition| format!("  Degraded {}", condition.reason))
                .unwrap_or_default();
            let line = format!(
                "{}{degraded}",
                progress_line(Some(&config), &nodes, config.spec.mode)
            );
            if line != self.last_line {
                let report = traffic.snapshot();
                println!(
                    "{:>5.1}s {line}  connections {} failed {}",
                    started.elapsed().as_secs_f64(),
                    report.attempts(),
                    report.failure_count()
                );
                self.last_line = line;
            }
            if let Some(value) = check(&config, &nodes) {
                return value;
            }
            assert!(
                waiting_since.elapsed() < timeout,
                "failed to {description} within {timeout:?}: {:#?}",
                config.status
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Phases {
    /// Waits up to 60 s until the DataplaneConfig is Degraded for `reason` on its current spec
    /// (`observedGeneration` is the spec's generation), and returns that condition.
    async fn wait_degraded_on_current_spec(
        &mut self,
        world: &World,
        traffic: &TrafficGenerator,
        reason: &str,
    ) -> switchyard_crds::Condition {
        self.wait_until(
            world,
            traffic,
            &format!("see Degraded {reason}"),
            Duration::from_secs(60),
            |config, _| {
                degraded_condition(config).filter(|condition| {
                    condition.reason == reason
                        && config
                            .status
                            .as_ref()
                            .map(|status| status.observed_generation)
                            == Some(config.metadata.generation)
                })
            },
        )
        .await
    }
}

impl Phases {
    /// Applies mode Ebpf with `rollout` and waits until Preflight refuses it as Degraded
    /// `reason` on the new spec: how scenarios 4b and 6 start. Returns that condition.
    async fn ask_for_ebpf_and_wait_refused(
        &mut self,
        world: &World,
        traffic: &TrafficGenerator,
        rollout: serde_json::Value,
        reason: &str,
    ) -> switchyard_crds::Condition {
        world
            .apply_config(DataplaneMode::Ebpf, rollout)
            .await
            .expect("apply mode Ebpf");
        let refused = self
            .wait_degraded_on_current_spec(world, traffic, reason)
            .await;
        println!("Managed refused: {}", refused.message);
        refused
    }

    /// Applies mode KubeProxy with `rollout`, waits up to `timeout` for Ready on it, and
    /// checks that no connection has failed so far: how scenarios 4, 4b and 6 end.
    async fn roll_back_to_kube_proxy(
        &mut self,
        world: &World,
        traffic: &TrafficGenerator,
        rollout: serde_json::Value,
        timeout: Duration,
    ) -> TrafficReport {
        world
            .apply_config(DataplaneMode::KubeProxy, rollout)
            .await
            .expect("apply mode KubeProxy");
        self.wait_until(
            world,
            traffic,
            "reach Ready on KubeProxy",
            timeout,
            |config, _| config_ready(config, DataplaneMode::KubeProxy).then_some(()),
        )
        .await;
        let report = traffic.snapshot();
        world.assert_no_failed_connections(&report, "so far");
        report
    }
}

fn degraded_condition(config: &DataplaneConfig) -> Option<switchyard_crds::Condition> {
    config
        .status
        .as_ref()
        .and_then(|status| find_condition(&status.conditions, condition_types::DEGRADED))
        .filter(|condition| condition.status == ConditionStatus::True)
        .cloned()
}

fn config_revision(config: &DataplaneConfig) -> u64 {
    config
        .metadata
        .resource_version
        .as_deref()
        .and_then(|version| version.parse().ok())
        .unwrap_or(0)
}

/// When each pod was last written (deleted, or its finalizer removed), per the audit log.
fn pod_gone_at(audit: &[AuditEvent], pod: &str) -> Option<SystemTime> {
    audit
        .iter()
        .filter(|event| {
            ["delete", "patch", "update"]
                .iter()
                .any(|verb| event.is_successful(verb, "pods", pod))
        })
        .map(audit_time)
        .max()
}

fn generations(nodes: &BTreeMap<String, DataplaneNode>) -> BTreeMap<String, i64> {
    nodes
        .iter()
        .map(|(name, node)| (name.clone(), node.metadata.generation.unwrap_or(0)))
        .collect()
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
async fn the_operator_killed_twice_finishes_without_repeating_or_skipping_a_step(
    world: &World,
    traffic: &TrafficGenerator,
) {
    println!("\n(4) the operator killed during ActivatingNodes and during DisablingKubeProxy");
    let before = traffic.snapshot();
    let dataplane_nodes = Recorder::start(Api::<DataplaneNode>::all(world.client.clone()));
    let daemon_sets = Recorder::start(world.kube_proxy_daemon_set());
    let kube_proxy_pods = Recorder::start(world.kube_proxy_pods());
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
    kill(first_pid, libc::SIGKILL);
    let killed_at = Instant::now();
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
    println!("SIGKILL operator pid {first_pid} in ActivatingNodes: told Ebpf {asked:?}, serving {serving:?}");
    assert!(
        asked.len() < 3 || serving.len() < 3,
        "killed too late: every node already served"
    );
    let second = world
        .wait_operator_leading(Some(first_pid), Duration::from_secs(60))
        .await
        .expect("a new operator leads");
    println!(
        "new operator pid {:?} leads {:.1} s after the kill",
        second.pid,
        killed_at.elapsed().as_secs_f64()
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
    kill(second_pid, libc::SIGKILL);
    let killed_at = Instant::now();
    println!(
        "SIGKILL operator pid {second_pid} in DisablingKubeProxy (node-3's kube-proxy pod held)"
    );
    let third = world
        .wait_operator_leading(Some(second_pid), Duration::from_secs(60))
        .await
        .expect("a new operator leads");
    println!(
        "new operator pid {:?} leads {:.1} s after the kill",
        third.pid,
        killed_at.elapsed().as_secs_f64()
    );
    // The new operator had its snapshot and its reconcile: nothing may have moved.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = world.dataplane_nodes().await.expect("list");
    assert!(
        !held["node-3"].spec.iptables_cleanup,
        "node-3 told to clean while its kube-proxy pod is still there"
    );
    assert_eq!(
        generations(&held),
        generations(&at_second_kill),
        "a DataplaneNode was written again by the new operator"
    );
    let phase = world
        .config()
        .await
        .expect("read")
        .and_then(|config| config.status)
        .map(|status| status.phase);
    assert_eq!(phase, Some(DataplanePhase::DisablingKubeProxy));

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
    tokio::time::sleep(Duration::from_secs(1)).await;

    // The evidence.
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
    let disabled_revision = daemon_sets
        .versions()
        .iter()
        .filter(|version| version.revision > start_revision && kube_proxy_disabled(&version.object))
        .map(|version| version.revision)
        .min()
        .expect("the kube-proxy DaemonSet was disabled");
    let node_versions = dataplane_nodes.versions();
    let pod_versions = kube_proxy_pods.versions();
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
    world.assert_no_failed_connections(&report, "with the operator killed twice");
    println!(
        "operator killed twice: Ready; new connections {} made, 0 failed",
        report.attempts() - before.attempts()
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
}

/// Scenario 4b: the operator may not patch the kube-proxy DaemonSet (the chart's RoleBinding
/// for it is deleted, as when a hand-written DataplaneConfig names a DaemonSet the chart's Role
/// does not cover). `Managed` is refused in Preflight (Degraded KubeProxyNotPatchable) before
/// any node is switched; once the binding is back, the transition starts by itself (a refusal
/// is asked again every 10 s, with no watch event needed), and is then turned back to KubeProxy.
async fn a_kube_proxy_the_operator_may_not_patch_is_refused_until_it_may(
    world: &World,
    traffic: &TrafficGenerator,
) {
    println!("\n(4b) the operator may not patch kube-proxy");
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
    tokio::time::sleep(Duration::from_secs(2)).await;
    let config = world
        .config()
        .await
        .expect("read")
        .expect("the DataplaneConfig");
    assert_eq!(
        config.status.as_ref().map(|status| status.phase),
        Some(DataplanePhase::Preflight)
    );
    assert_eq!(
        generations(&world.dataplane_nodes().await.expect("list")),
        generations_before,
        "a node was instructed while refused"
    );
    let daemon_set = world
        .kube_proxy_daemon_set()
        .get("kube-proxy")
        .await
        .expect("read");
    assert_eq!(
        daemon_set.metadata.resource_version, daemon_set_before.metadata.resource_version,
        "the kube-proxy DaemonSet was touched while refused"
    );

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
}

/// Scenario 6: the kube-proxy DaemonSet carries Argo CD's tracking annotation. `Managed` is
/// refused in Preflight (Degraded KubeProxyManagedExternally, a message naming
/// `spec.kubeProxy.management` External) and kube-proxy is left untouched; `External` activates
/// every node and waits in DisablingKubeProxy without touching it; the test deletes the
/// DaemonSet (as Argo CD would) and the transition finishes. Then the DaemonSet comes back
/// (re-synced by its owner): Degraded KubeProxyReturned, cleanup withdrawn where it runs, still
/// untouched; and back to KubeProxy.
async fn a_kube_proxy_owned_by_argo_cd_is_refused_then_waited_for(
    world: &World,
    traffic: &TrafficGenerator,
) {
    println!("\n(6) kube-proxy managed by Argo CD");
    let before = traffic.snapshot();
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
    tokio::time::sleep(Duration::from_secs(3)).await;
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
    let untouched = world
        .kube_proxy_daemon_set()
        .get("kube-proxy")
        .await
        .expect("read");
    assert_eq!(
        untouched.metadata.generation, marked.metadata.generation,
        "a refused kube-proxy DaemonSet was changed"
    );
    assert_eq!(
        untouched.metadata.resource_version,
        marked.metadata.resource_version
    );
    let nodes = world.dataplane_nodes().await.expect("list");
    assert_eq!(
        generations(&nodes),
        generations_before,
        "a node was instructed while refused"
    );
    let pods = world.kube_proxy_pods_by_node().await.expect("pods");
    assert_eq!(
        pods.values()
            .map(|pod| pod.metadata.uid.clone())
            .collect::<Vec<_>>(),
        pods_before
            .values()
            .map(|pod| pod.metadata.uid.clone())
            .collect::<Vec<_>>(),
        "kube-proxy pods replaced while refused"
    );
    for node in NODES {
        let rules = world.kube_proxy_rules(node).expect("iptables-save");
        assert!(
            rules.demo_service,
            "kube-proxy's rules gone on {node} while refused"
        );
    }
    let report = traffic.snapshot();
    world.assert_no_failed_connections(&report, "while refused");

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
    tokio::time::sleep(Duration::from_secs(3)).await;
    let untouched = world
        .kube_proxy_daemon_set()
        .get("kube-proxy")
        .await
        .expect("read");
    assert_eq!(
        untouched.metadata.generation, marked.metadata.generation,
        "External must not change kube-proxy"
    );
    let config = world
        .config()
        .await
        .expect("read")
        .expect("the DataplaneConfig");
    assert_eq!(
        config.status.as_ref().map(|status| status.phase),
        Some(DataplanePhase::DisablingKubeProxy),
        "External went on without kube-proxy's owner"
    );
    for (name, node) in world.dataplane_nodes().await.expect("list") {
        assert!(
            !node.spec.iptables_cleanup,
            "{name} told to clean while kube-proxy runs"
        );
    }

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
    world.assert_no_failed_connections(&report, "External");

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
    tokio::time::sleep(Duration::from_secs(3)).await;
    for node in NODES {
        let rules = world.kube_proxy_rules(node).expect("iptables-save");
        assert!(
            rules.demo_service,
            "rules of the returned kube-proxy cleaned on {node}"
        );
    }
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
    world.assert_no_failed_connections(&report, "kube-proxy returned");

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
        report.attempts() - before.attempts()
    );
}
