//! The operator against a real Kubernetes 1.20 API server (the `e2e/` cluster), for what the
//! real-agent scenarios of `e2e/tests/migration_scenarios.rs` do not cover: leader election
//! between two replicas, the CRD self-apply of an upgraded CRD, Events about cluster-scoped
//! objects on a 1.20 server, Preflight without the API server address, and the parity preflight
//! refusing while an SCTP Service exists (the Service watch on a 1.20 server).
//!
//! Run by `make e2e-operator` (`e2e/scripts/migration.sh`) on the migration scenarios' cluster,
//! before them, inside its private network namespace: `cargo test -p switchyard-operator --test
//! cluster -- --ignored --test-threads=1`. Every test starts the operator binary as a child
//! process with the admin kubeconfig and stops it at the end, and leaves no DataplaneConfig and
//! no Lease holder behind (the chart's operator is installed next).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Namespace, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps,
};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use switchyard_crds::{
    condition_types, find_condition, reasons, ConditionStatus, DataplaneConfig, DataplaneMode,
    DataplaneNode, DataplanePhase,
};
use switchyard_e2e::cluster::{admin_client, ClusterPaths};
use switchyard_e2e::wait::{hold_for, wait_for, Check, WaitOptions};

const NAMESPACE: &str = "switchyard-system";

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The operator binary running as a child process; killed on drop.
struct Operator {
    child: Child,
    metrics_port: u16,
    log: PathBuf,
}

impl Operator {
    fn start(identity: &str, metrics_port: u16, extra: &[&str]) -> Self {
        Self::start_with(
            identity,
            metrics_port,
            extra,
            ClusterPaths::from_environment().admin_kubeconfig(),
        )
    }

    fn start_with(identity: &str, metrics_port: u16, extra: &[&str], kubeconfig: PathBuf) -> Self {
        let log = std::env::temp_dir().join(format!("switchyard-operator-test-{identity}.log"));
        let output = std::fs::File::create(&log).expect("create the operator's log file");
        let child = Command::new(env!("CARGO_BIN_EXE_switchyard-operator"))
            .arg(format!("--metrics-address=127.0.0.1:{metrics_port}"))
            .arg(format!("--agent-namespace={NAMESPACE}"))
            .args(extra)
            .env("KUBECONFIG", kubeconfig)
            .env("POD_NAME", identity)
            .env("POD_NAMESPACE", NAMESPACE)
            .env("RUST_LOG", "info,kube=warn")
            .env("NO_COLOR", "1")
            .stdout(Stdio::from(output.try_clone().expect("clone the log file")))
            .stderr(Stdio::from(output))
            .spawn()
            .expect("start the operator binary");
        Self {
            child,
            metrics_port,
            log,
        }
    }

    fn metrics(&self) -> String {
        http_get(self.metrics_port, "/metrics")
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// SIGKILL: the process gets no chance to release its Lease.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, as the kubelet does: the operator releases its Lease and exits.
    fn stop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(self.child.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        self.kill();
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.stop();
    }
}

fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    );
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
}

fn metric_value(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

/// The operator's namespace (the chart's release namespace), where its Lease lives.
async fn ensure_namespace(client: &Client) -> TestResult {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt(NAMESPACE).await?.is_none() {
        let namespace: Namespace =
            serde_json::from_value(json!({ "metadata": { "name": NAMESPACE } }))?;
        namespaces
            .create(&PostParams::default(), &namespace)
            .await?;
    }
    Ok(())
}

async fn event_reasons(
    client: &Client,
    namespace: &str,
    kind: &str,
    name: &str,
) -> Result<Vec<String>, kube::Error> {
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    Ok(events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|event| {
            event.involved_object.kind.as_deref() == Some(kind)
                && event.involved_object.name.as_deref() == Some(name)
        })
        .filter_map(|event| event.reason)
        .collect())
}

async fn wait_for_event(
    client: &Client,
    namespace: &str,
    kind: &str,
    name: &str,
    reason: &str,
) -> TestResult {
    wait_for(
        &format!("see Event {reason} about {kind} {name} in {namespace}"),
        WaitOptions::new(Duration::from_secs(30)),
        || async {
            let reasons = event_reasons(client, namespace, kind, name).await?;
            Ok::<_, kube::Error>(if reasons.iter().any(|found| found == reason) {
                Check::Ready(())
            } else {
                Check::NotYet(format!("reasons so far: {reasons:?}"))
            })
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
#[ignore = "needs the e2e cluster: make e2e-operator"]
async fn a_second_replica_waits_and_takes_over_when_the_leader_dies() -> TestResult {
    let client = admin_client(&ClusterPaths::from_environment()).await?;
    ensure_namespace(&client).await?;
    let mut first = Operator::start("replica-1", 18184, &["--api-server-address=10.99.0.1:6443"]);
    let leader_gauge = "switchyard_operator_leader";
    wait_for(
        "see replica-1 lead",
        WaitOptions::new(Duration::from_secs(40)),
        || async {
            Ok::<_, String>(
                if metric_value(&first.metrics(), leader_gauge) == Some(1.0) {
                    Check::Ready(())
                } else {
                    Check::NotYet("not leading".into())
                },
            )
        },
    )
    .await?;
    let second = Operator::start("replica-2", 18185, &["--api-server-address=10.99.0.1:6443"]);
    // The follower serves its endpoint, as a follower.
    wait_for(
        "see replica-2 serve its metrics as a follower",
        WaitOptions::new(Duration::from_secs(40)),
        || async {
            let gauge = metric_value(&second.metrics(), leader_gauge);
            Ok::<_, String>(if gauge == Some(0.0) {
                Check::Ready(())
            } else if gauge == Some(1.0) {
                Check::Failed("replica-2 leads while replica-1 renews".into())
            } else {
                Check::NotYet(format!("leader gauge {gauge:?}"))
            })
        },
    )
    .await?;
    // And it does not lead while the leader renews: observed all through a window longer than
    // the Lease duration (15 s), after which a follower that ignored the renewals would take
    // the Lease.
    hold_for(
        "replica-1 the only leader while it renews",
        WaitOptions::new(Duration::from_secs(20)).every(Duration::from_millis(500)),
        || async {
            let leaders = (
                metric_value(&first.metrics(), leader_gauge),
                metric_value(&second.metrics(), leader_gauge),
            );
            Ok::<_, String>(if leaders == (Some(1.0), Some(0.0)) {
                Check::Ready(())
            } else {
                Check::NotYet(format!(
                    "leader gauges of replica-1 and replica-2: {leaders:?}"
                ))
            })
        },
    )
    .await?;

    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), NAMESPACE);
    let lease = leases.get("switchyard-operator").await?;
    assert_eq!(
        lease.spec.and_then(|spec| spec.holder_identity).as_deref(),
        Some("replica-1")
    );

    // SIGKILL: no release. The second takes over once the Lease stops changing for its duration.
    let killed_at = Instant::now();
    first.kill();
    wait_for(
        "see replica-2 take over",
        WaitOptions::new(Duration::from_secs(40)),
        || async {
            Ok::<_, String>(
                if metric_value(&second.metrics(), leader_gauge) == Some(1.0) {
                    Check::Ready(())
                } else {
                    Check::NotYet("not leading".into())
                },
            )
        },
    )
    .await?;
    println!(
        "replica-2 took over {:.1} s after the leader was killed",
        killed_at.elapsed().as_secs_f64()
    );
    let lease = leases.get("switchyard-operator").await?;
    assert_eq!(
        lease.spec.and_then(|spec| spec.holder_identity).as_deref(),
        Some("replica-2")
    );
    Ok(())
}

#[tokio::test]
#[ignore = "needs the e2e cluster: make e2e-operator"]
async fn an_upgraded_crd_with_a_new_field_is_applied_and_served() -> TestResult {
    let client = admin_client(&ClusterPaths::from_environment()).await?;
    // What a newer operator would ship: DataplaneConfig's spec with one more field.
    let mut crds = switchyard_crds::crds();
    let schema = crds[0].spec.versions[0]
        .schema
        .as_mut()
        .and_then(|validation| validation.open_api_v3_schema.as_mut())
        .and_then(|schema| schema.properties.as_mut())
        .and_then(|properties| properties.get_mut("spec"))
        .and_then(|spec| spec.properties.as_mut())
        .ok_or("the DataplaneConfig CRD has no spec properties")?;
    schema.insert(
        "upgradeProbe".into(),
        JSONSchemaProps {
            type_: Some("string".into()),
            description: Some("Added by the upgrade test.".into()),
            ..JSONSchemaProps::default()
        },
    );
    switchyard_operator::crd_apply::apply_crds(client.clone(), &crds, Duration::from_secs(30))
        .await?;

    let configs: Api<DataplaneConfig> = Api::all(client.clone());
    if configs.get_opt("upgrade-probe").await?.is_some() {
        configs
            .delete("upgrade-probe", &DeleteParams::default())
            .await?;
    }
    let dynamic: Api<kube::api::DynamicObject> = Api::all_with(
        client.clone(),
        &kube::api::ApiResource::erase::<DataplaneConfig>(&()),
    );
    let object: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "switchyard.dev/v1alpha1",
        "kind": "DataplaneConfig",
        "metadata": { "name": "upgrade-probe" },
        "spec": { "mode": "KubeProxy", "upgradeProbe": "kept" },
    }))?;
    // Served means kept: an unknown field would be pruned by the structural schema.
    let created = wait_for(
        "create an object using the new field",
        WaitOptions::new(Duration::from_secs(20)),
        || async {
            let created = dynamic.create(&PostParams::default(), &object).await?;
            Ok::<_, kube::Error>(Check::Ready(created))
        },
    )
    .await?;
    assert_eq!(created.data["spec"]["upgradeProbe"], "kept");
    let crd = Api::<CustomResourceDefinition>::all(client.clone())
        .get("dataplaneconfigs.switchyard.dev")
        .await?;
    assert!(crd
        .managed_fields()
        .iter()
        .any(
            |entry| entry.manager.as_deref() == Some("switchyard-operator")
                && entry.operation.as_deref() == Some("Apply")
        ));

    // And the operator's own CRDs again (what a restart of the current operator does).
    configs
        .delete("upgrade-probe", &DeleteParams::default())
        .await?;
    switchyard_operator::crd_apply::apply_crds(
        client.clone(),
        &switchyard_crds::crds(),
        Duration::from_secs(30),
    )
    .await?;
    Ok(())
}

#[tokio::test]
#[ignore = "needs the e2e cluster: make e2e-operator"]
async fn a_1_20_server_rejects_event_time_events_about_cluster_scoped_objects_in_default_but_takes_ours(
) -> TestResult {
    let client = admin_client(&ClusterPaths::from_environment()).await?;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let node = nodes.get("node-1").await?;
    let reference = switchyard_operator::events::reference_to(&node);

    // What kube-rs's recorder writes (events.k8s.io/v1, eventTime set) for a cluster-scoped object.
    let events_v1: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &kube::api::ApiResource::erase::<k8s_openapi::api::events::v1::Event>(&()),
    );
    let theirs: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": { "generateName": "probe-" },
        "eventTime": "2026-11-22T01:00:00.000000Z",
        "reportingController": "switchyard.dev/operator",
        "reportingInstance": "probe",
        "action": "Probe",
        "reason": "Probe",
        "type": "Normal",
        "regarding": { "apiVersion": "v1", "kind": "Node", "name": "node-1", "uid": reference.uid },
    }))?;
    match events_v1.create(&PostParams::default(), &theirs).await {
        Err(kube::Error::Api(status)) => {
            println!(
                "events.k8s.io/v1 with eventTime: {} {}",
                status.code, status.message
            );
            assert_eq!(status.code, 422);
            assert!(
                status.message.contains("does not match"),
                "{}",
                status.message
            );
        }
        other => {
            return Err(
                format!("the 1.20 server was expected to refuse the Event, got {other:?}").into(),
            )
        }
    }

    // Ours (core/v1, no eventTime, in default) is accepted, and a repeat bumps its count.
    let recorder = switchyard_operator::events::Recorder::new(client.clone(), "probe");
    let occurrence =
        switchyard_operator::events::Occurrence::normal("Probe", "Probe", "an Event about a Node");
    recorder.publish(&reference, &occurrence).await?;
    recorder.publish(&reference, &occurrence).await?;
    let name = switchyard_operator::events::event_name(&reference, &occurrence);
    let stored = Api::<Event>::namespaced(client.clone(), "default")
        .get(&name)
        .await?;
    assert_eq!(stored.count, Some(2));
    Ok(())
}

#[tokio::test]
#[ignore = "needs the e2e cluster: make e2e-operator"]
async fn preflight_refuses_without_the_api_server_address_and_other_configs_are_ignored(
) -> TestResult {
    let client = admin_client(&ClusterPaths::from_environment()).await?;
    ensure_namespace(&client).await?;
    // Without --api-server-address: Preflight refuses to start a transition, whatever else.
    let operator = Operator::start("operator-preflight", 18182, &[]);
    let configs: Api<DataplaneConfig> = Api::all(client.clone());
    for name in ["default", "other"] {
        if configs.get_opt(name).await?.is_some() {
            configs.delete(name, &DeleteParams::default()).await?;
        }
    }
    let config: DataplaneConfig = serde_json::from_value(json!({
        "apiVersion": "switchyard.dev/v1alpha1",
        "kind": "DataplaneConfig",
        "metadata": { "name": "default" },
        "spec": { "mode": "Ebpf", "rollout": { "nodeReadyTimeoutSeconds": 60 } },
    }))?;
    // The operator applies the CRDs at start: create once they are served.
    wait_for(
        "create DataplaneConfig default",
        WaitOptions::new(Duration::from_secs(30)),
        || async {
            configs.create(&PostParams::default(), &config).await?;
            Ok::<_, kube::Error>(Check::Ready(()))
        },
    )
    .await?;
    let missing = wait_for(
        "see Degraded ApiServerAddressMissing",
        WaitOptions::new(Duration::from_secs(60)),
        || async {
            let status = configs.get("default").await?.status.unwrap_or_default();
            let degraded = find_condition(&status.conditions, condition_types::DEGRADED).cloned();
            Ok::<_, kube::Error>(match degraded {
                Some(condition)
                    if condition.status == ConditionStatus::True
                        && condition.reason == reasons::API_SERVER_ADDRESS_MISSING =>
                {
                    Check::Ready((status.phase, condition))
                }
                other => Check::NotYet(format!("phase {}, Degraded {other:?}", status.phase)),
            })
        },
    )
    .await
    .map_err(|error| format!("{error}\noperator log:\n{}", operator.log_tail()))?;
    println!(
        "without --api-server-address: phase {}, {}",
        missing.0, missing.1.message
    );
    assert_eq!(missing.0, DataplanePhase::Preflight);
    wait_for_event(
        &client,
        "default",
        "DataplaneConfig",
        "default",
        reasons::API_SERVER_ADDRESS_MISSING,
    )
    .await?;
    let dataplane_nodes: Api<DataplaneNode> = Api::all(client.clone());
    for node in dataplane_nodes.list(&ListParams::default()).await?.items {
        assert_eq!(
            node.spec.mode,
            DataplaneMode::KubeProxy,
            "{} told to move while Preflight refuses",
            node.name_any()
        );
    }

    // DataplaneConfigs not named default are ignored, and say so.
    let other: DataplaneConfig = serde_json::from_value(json!({
        "apiVersion": "switchyard.dev/v1alpha1",
        "kind": "DataplaneConfig",
        "metadata": { "name": "other" },
        "spec": { "mode": "Ebpf" },
    }))?;
    configs.create(&PostParams::default(), &other).await?;
    wait_for(
        "see DataplaneConfig other Degraded NotDefault",
        WaitOptions::new(Duration::from_secs(30)),
        || async {
            let status = configs.get("other").await?.status.unwrap_or_default();
            let degraded = find_condition(&status.conditions, condition_types::DEGRADED).cloned();
            Ok::<_, kube::Error>(match degraded {
                Some(condition) if condition.reason == reasons::NOT_DEFAULT => Check::Ready(()),
                other => Check::NotYet(format!("{other:?}")),
            })
        },
    )
    .await?;
    // Leave the cluster as found: no DataplaneConfig (the migration scenarios run next on it).
    configs.delete("other", &DeleteParams::default()).await?;
    configs.delete("default", &DeleteParams::default()).await?;
    Ok(())
}

/// Waits until DataplaneConfig `default` has the condition `type_` for which `holds` is true;
/// returns it.
async fn wait_for_condition(
    configs: &Api<DataplaneConfig>,
    what: &str,
    type_: &str,
    holds: impl Fn(&switchyard_crds::Condition) -> bool,
) -> Result<switchyard_crds::Condition, Box<dyn std::error::Error>> {
    let condition = wait_for(what, WaitOptions::new(Duration::from_secs(60)), || async {
        let status = configs.get("default").await?.status.unwrap_or_default();
        let found = find_condition(&status.conditions, type_).cloned();
        Ok::<_, kube::Error>(match found {
            Some(condition) if holds(&condition) => Check::Ready(condition),
            other => Check::NotYet(format!("phase {}, {type_} {other:?}", status.phase)),
        })
    })
    .await?;
    Ok(condition)
}

#[tokio::test]
#[ignore = "needs the e2e cluster: make e2e-operator"]
async fn the_parity_preflight_refuses_while_an_sctp_service_exists_and_not_once_it_is_deleted(
) -> TestResult {
    let client = admin_client(&ClusterPaths::from_environment()).await?;
    ensure_namespace(&client).await?;
    let operator = Operator::start(
        "operator-parity",
        18185,
        &["--api-server-address=10.99.0.1:6443"],
    );
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let sctp_service = |name: &str, labels: serde_json::Value| {
        serde_json::from_value::<Service>(json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": { "name": name, "labels": labels },
            "spec": { "ports": [{ "name": "sctp", "protocol": "SCTP", "port": 9999 }] },
        }))
    };
    for name in ["parity-sctp", "parity-other-proxy"] {
        if services.get_opt(name).await?.is_some() {
            services.delete(name, &DeleteParams::default()).await?;
        }
    }
    services
        .create(
            &PostParams::default(),
            &sctp_service("parity-sctp", json!({}))?,
        )
        .await?;
    // Another proxy's Service: kube-proxy does not serve it, so it is never named.
    services
        .create(
            &PostParams::default(),
            &sctp_service(
                "parity-other-proxy",
                json!({ "service.kubernetes.io/service-proxy-name": "other-proxy" }),
            )?,
        )
        .await?;

    let configs: Api<DataplaneConfig> = Api::all(client.clone());
    if configs.get_opt("default").await?.is_some() {
        configs.delete("default", &DeleteParams::default()).await?;
    }
    // Paused: the refusal is reported all the same, and nothing can move on this shared cluster
    // once the Service is gone.
    let config: DataplaneConfig = serde_json::from_value(json!({
        "apiVersion": "switchyard.dev/v1alpha1",
        "kind": "DataplaneConfig",
        "metadata": { "name": "default" },
        "spec": { "mode": "Ebpf", "paused": true },
    }))?;
    wait_for(
        "create DataplaneConfig default",
        WaitOptions::new(Duration::from_secs(30)),
        || async {
            configs.create(&PostParams::default(), &config).await?;
            Ok::<_, kube::Error>(Check::Ready(()))
        },
    )
    .await?;

    let degraded = wait_for_condition(
        &configs,
        "see Degraded UnsupportedServices",
        condition_types::DEGRADED,
        |condition| {
            condition.status == ConditionStatus::True
                && condition.reason == reasons::UNSUPPORTED_SERVICES
        },
    )
    .await
    .map_err(|error| format!("{error}\noperator log:\n{}", operator.log_tail()))?;
    println!("with an SCTP Service: {}", degraded.message);
    assert!(
        degraded
            .message
            .contains("1 Service(s) use what the eBPF datapath does not serve yet: default/parity-sctp (SCTP ports)"),
        "{}",
        degraded.message
    );
    assert!(!degraded.message.contains("parity-other-proxy"));
    let supported = wait_for_condition(
        &configs,
        "see ServicesSupported False",
        condition_types::SERVICES_SUPPORTED,
        |condition| condition.status == ConditionStatus::False,
    )
    .await?;
    assert_eq!(supported.reason, reasons::UNSUPPORTED_SERVICES);
    wait_for_event(
        &client,
        "default",
        "DataplaneConfig",
        "default",
        reasons::UNSUPPORTED_SERVICES,
    )
    .await?;
    let dataplane_nodes: Api<DataplaneNode> = Api::all(client.clone());
    for node in dataplane_nodes.list(&ListParams::default()).await?.items {
        assert_eq!(
            node.spec.mode,
            DataplaneMode::KubeProxy,
            "{} told to move while the preflight refuses",
            node.name_any()
        );
    }

    // The SCTP Service deleted: the refusal goes (the Service watch triggers the reconcile).
    services
        .delete("parity-sctp", &DeleteParams::default())
        .await?;
    wait_for_condition(
        &configs,
        "see ServicesSupported True",
        condition_types::SERVICES_SUPPORTED,
        |condition| {
            condition.status == ConditionStatus::True
                && condition.reason == reasons::ALL_SERVICES_SUPPORTED
        },
    )
    .await
    .map_err(|error| format!("{error}\noperator log:\n{}", operator.log_tail()))?;
    let degraded = wait_for_condition(
        &configs,
        "see Degraded no longer UnsupportedServices",
        condition_types::DEGRADED,
        |condition| condition.reason != reasons::UNSUPPORTED_SERVICES,
    )
    .await?;
    println!(
        "without it: Degraded {:?} {}",
        degraded.status, degraded.reason
    );

    // Leave the cluster as found.
    services
        .delete("parity-other-proxy", &DeleteParams::default())
        .await?;
    configs.delete("default", &DeleteParams::default()).await?;
    Ok(())
}
