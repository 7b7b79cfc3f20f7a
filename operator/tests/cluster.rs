//! The operator against a real Kubernetes 1.20 API server (the `e2e/` cluster).
//!
//! Run by `make e2e-operator-smoke`: `e2e/cluster up --nodes 3`, then
//! `e2e/cluster exec cargo test -p switchyard-operator --test cluster -- --ignored --test-threads=1`,
//! then `e2e/cluster down`. Every test starts the operator binary as a child process with the
//! admin kubeconfig (inside the cluster's private network namespace) and kills it at the end.
//!
//! Agents are simulated: a task writes each DataplaneNode's status the way an agent would
//! (Ready on the current generation, programs attached in `Ebpf`, rules gone once told to clean
//! with no kube-proxy pod on its node, kube-proxy healthy when its pod runs there), so the
//! operator's whole loop (snapshot, plan, Server-Side Apply, the kube-proxy patch, status,
//! Events) runs against the real server while the datapath is out of the picture.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Event, Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps,
};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use switchyard_crds::{
    condition_types, find_condition, reasons, set_condition, Condition, ConditionStatus,
    DataplaneConfig, DataplaneMode, DataplaneNode, DataplaneNodeStatus, DataplanePhase,
};
use switchyard_e2e::cluster::{admin_client, ClusterPaths};
use switchyard_e2e::objects::create_kube_proxy_daemonset;
use switchyard_e2e::wait::{wait_for, Check, WaitOptions};
use switchyard_operator::kube_proxy::{DISABLED_SELECTOR_KEY, PREVIOUS_SELECTOR_ANNOTATION};
use tokio::task::JoinHandle;

const NAMESPACE: &str = "switchyard-system";
const ORIGINAL_SELECTOR: (&str, &str) = ("kubernetes.io/os", "linux");

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

/// Agents, simulated: every 200 ms each DataplaneNode's status is brought to what an agent on
/// that node would report about the current spec.
fn simulate_agents(client: Client) -> JoinHandle<()> {
    tokio::spawn(async move {
        let nodes: Api<DataplaneNode> = Api::all(client.clone());
        let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
        let agent_pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        loop {
            if let (Ok(dataplane_nodes), Ok(pods), Ok(agent_pods)) = (
                nodes.list(&ListParams::default()).await,
                pods.list(&ListParams::default()).await,
                agent_pods.list(&ListParams::default()).await,
            ) {
                for dataplane_node in dataplane_nodes {
                    let name = dataplane_node.name_any();
                    let kube_proxy_pod = pods.items.iter().find(|pod| {
                        pod.spec.as_ref().and_then(|spec| spec.node_name.as_deref())
                            == Some(name.as_str())
                            && pod
                                .owner_references()
                                .iter()
                                .any(|owner| owner.name == "kube-proxy")
                    });
                    // The agent reports the revision of the pod it runs in (downward API).
                    let agent_revision = agent_pods
                        .items
                        .iter()
                        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
                        // An agent reports once its process runs, not while its pod is pending.
                        .filter(|pod| {
                            pod.status
                                .as_ref()
                                .and_then(|status| status.phase.as_deref())
                                == Some("Running")
                        })
                        .filter(|pod| {
                            pod.spec.as_ref().and_then(|spec| spec.node_name.as_deref())
                                == Some(name.as_str())
                        })
                        .find_map(|pod| pod.labels().get("controller-revision-hash").cloned());
                    let status = simulated_status(&dataplane_node, kube_proxy_pod, agent_revision);
                    if dataplane_node.status.as_ref() != Some(&status) {
                        let patch = json!({ "status": status });
                        let _ = nodes
                            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                            .await;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

fn simulated_status(
    dataplane_node: &DataplaneNode,
    kube_proxy_pod: Option<&Pod>,
    agent_revision: Option<String>,
) -> DataplaneNodeStatus {
    let now = chrono::Utc::now();
    let generation = dataplane_node.metadata.generation;
    let mut status = dataplane_node.status.clone().unwrap_or_default();
    let ebpf = dataplane_node.spec.mode == DataplaneMode::Ebpf;
    let kube_proxy_ready = kube_proxy_pod.is_some_and(|pod| {
        pod.metadata.deletion_timestamp.is_none()
            && pod
                .status
                .as_ref()
                .and_then(|status| status.conditions.as_ref())
                .is_some_and(|conditions| {
                    conditions
                        .iter()
                        .any(|condition| condition.type_ == "Ready" && condition.status == "True")
                })
    });
    let rules_present = kube_proxy_pod.is_some() || !dataplane_node.spec.iptables_cleanup;
    let condition = |type_: &str, holds: bool, reason: &str| {
        Condition::new(
            type_,
            ConditionStatus::from_bool(holds),
            reason,
            "simulated agent",
            generation,
            now,
        )
    };
    for new in [
        condition(
            condition_types::HOST_METADATA_READY,
            true,
            reasons::HOST_METADATA_RECEIVED,
        ),
        condition(
            condition_types::PROGRAMS_ATTACHED,
            ebpf,
            if ebpf {
                reasons::ATTACHED
            } else {
                reasons::DETACHED
            },
        ),
        condition(condition_types::SERVICES_SYNCED, true, reasons::SYNCED),
        condition(
            condition_types::KUBE_PROXY_RULES_PRESENT,
            rules_present,
            if rules_present {
                reasons::RULES_PRESENT
            } else {
                reasons::RULES_ABSENT
            },
        ),
        condition(
            condition_types::KUBE_PROXY_HEALTHY,
            kube_proxy_ready && rules_present,
            if kube_proxy_ready {
                reasons::KUBE_PROXY_HEALTHZ_OK
            } else {
                reasons::KUBE_PROXY_UNHEALTHY
            },
        ),
        condition(
            condition_types::CHAIN_ORDER_SAFE,
            true,
            reasons::CHAIN_ORDER_VERIFIED,
        ),
        condition(condition_types::READY, true, reasons::AGENT_READY),
    ] {
        set_condition(&mut status.conditions, new);
    }
    // Only the generation and the conditions' content change what an agent reports.
    for condition in &mut status.conditions {
        if let Some(previous) = dataplane_node
            .status
            .as_ref()
            .and_then(|previous| find_condition(&previous.conditions, &condition.type_))
        {
            if previous.status == condition.status && previous.reason == condition.reason {
                condition.last_transition_time = previous.last_transition_time;
            }
        }
    }
    status.observed_generation = generation;
    status.agent_version = Some("simulated".into());
    if agent_revision.is_some() {
        status.agent_revision = agent_revision;
    }
    status
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

/// A kubeconfig for the chart's operator ServiceAccount, bound by the chart's own RBAC
/// (`helm template --show-only templates/rbac.yaml`), so the operator runs with exactly the
/// permissions it is installed with.
async fn chart_operator_kubeconfig(client: &Client) -> Result<PathBuf, Box<dyn std::error::Error>> {
    ensure_namespace(client).await?;
    let chart = concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/switchyard");
    let rendered = Command::new("helm")
        .args([
            "template",
            "sy",
            chart,
            "--namespace",
            NAMESPACE,
            "--set",
            "apiServer.host=10.99.0.1",
            "--show-only",
            "templates/rbac.yaml",
        ])
        .output()?;
    if !rendered.status.success() {
        return Err(format!(
            "helm template failed: {}",
            String::from_utf8_lossy(&rendered.stderr)
        )
        .into());
    }
    let mut apply = Command::new("kubectl")
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()?;
    {
        use std::io::Write;
        apply
            .stdin
            .take()
            .ok_or("no stdin for kubectl")?
            .write_all(&rendered.stdout)?;
    }
    if !apply.wait()?.success() {
        return Err("kubectl apply of the chart's RBAC failed".into());
    }
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(client.clone(), NAMESPACE);
    if accounts.get_opt("switchyard-operator").await?.is_none() {
        let account =
            serde_json::from_value(json!({ "metadata": { "name": "switchyard-operator" } }))?;
        accounts.create(&PostParams::default(), &account).await?;
    }
    // 1.20: the token controller writes a token Secret for the account.
    let secret_name = wait_for(
        "see the operator's token Secret",
        WaitOptions::new(Duration::from_secs(30)),
        || async {
            let account = accounts.get("switchyard-operator").await?;
            let name = account
                .secrets
                .unwrap_or_default()
                .into_iter()
                .find_map(|reference| reference.name);
            Ok::<_, kube::Error>(match name {
                Some(name) => Check::Ready(name),
                None => Check::NotYet("no token Secret yet".into()),
            })
        },
    )
    .await?;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), NAMESPACE);
    let secret = secrets.get(&secret_name).await?;
    let data = secret.data.unwrap_or_default();
    let token = String::from_utf8(data.get("token").ok_or("no token in the Secret")?.0.clone())?;
    let certificate_authority = data
        .get("ca.crt")
        .ok_or("no ca.crt in the Secret")?
        .0
        .clone();
    let directory = std::env::temp_dir().join("switchyard-operator-test-account");
    std::fs::create_dir_all(&directory)?;
    let ca_path = directory.join("ca.crt");
    std::fs::write(&ca_path, certificate_authority)?;
    let kubeconfig = directory.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: https://10.99.0.1:6443\n    certificate-authority: {}\nusers:\n- name: operator\n  user:\n    token: {token}\ncontexts:\n- name: operator\n  context:\n    cluster: e2e\n    user: operator\ncurrent-context: operator\n",
            ca_path.display()
        ),
    )?;
    Ok(kubeconfig)
}

async fn prepare(client: &Client) -> Result<DaemonSet, Box<dyn std::error::Error>> {
    ensure_namespace(client).await?;
    // The CRDs, as the operator applies them at start (a fresh cluster has none yet).
    switchyard_operator::crd_apply::apply_crds(
        client.clone(),
        &switchyard_crds::crds(),
        Duration::from_secs(30),
    )
    .await?;
    // No DataplaneConfig and no DataplaneNode from an earlier test.
    let configs: Api<DataplaneConfig> = Api::all(client.clone());
    if configs.get_opt("default").await?.is_some() {
        configs.delete("default", &DeleteParams::default()).await?;
    }
    let dataplane_nodes: Api<DataplaneNode> = Api::all(client.clone());
    dataplane_nodes
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    create_kube_proxy_daemonset(client).await?;
    // A selector of its own, so that "restored exactly" means something.
    let daemon_sets: Api<DaemonSet> = Api::namespaced(client.clone(), "kube-system");
    let patch = json!({ "spec": { "template": { "spec": { "nodeSelector": { ORIGINAL_SELECTOR.0: ORIGINAL_SELECTOR.1 } } } } });
    let daemon_set = daemon_sets
        .patch("kube-proxy", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    wait_for_kube_proxy_pods(client, 3).await?;
    Ok(daemon_set)
}

async fn wait_for_kube_proxy_pods(
    client: &Client,
    expected: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    wait_for(
        &format!("see {expected} running kube-proxy pods"),
        WaitOptions::new(Duration::from_secs(90)),
        || async {
            let list = pods.list(&ListParams::default()).await?;
            let running = list
                .items
                .iter()
                .filter(|pod| {
                    pod.metadata.deletion_timestamp.is_none()
                        && pod
                            .status
                            .as_ref()
                            .and_then(|status| status.phase.as_deref())
                            == Some("Running")
                })
                .count();
            let all = list.items.len();
            Ok::<_, kube::Error>(if running == expected && all == expected {
                Check::Ready(())
            } else {
                Check::NotYet(format!("{running} running of {all} kube-proxy pods"))
            })
        },
    )
    .await?;
    Ok(())
}

fn node_selector(daemon_set: &DaemonSet) -> BTreeMap<String, String> {
    daemon_set
        .spec
        .as_ref()
        .and_then(|spec| spec.template.spec.as_ref())
        .and_then(|spec| spec.node_selector.clone())
        .unwrap_or_default()
}

/// Waits until the `default` DataplaneConfig is Ready in `mode` on its current generation,
/// returning the phases seen on the way.
async fn wait_until_ready(
    client: &Client,
    operator: &Operator,
    mode: DataplaneMode,
) -> Result<Vec<DataplanePhase>, Box<dyn std::error::Error>> {
    let configs: Api<DataplaneConfig> = Api::all(client.clone());
    let phases = std::sync::Mutex::new(Vec::<DataplanePhase>::new());
    let outcome = wait_for(
        &format!("see DataplaneConfig default Ready in mode {mode}"),
        WaitOptions::new(Duration::from_secs(120)).every(Duration::from_millis(100)),
        || async {
            let config = configs.get("default").await?;
            let Some(status) = config.status.as_ref() else {
                return Ok::<_, kube::Error>(Check::NotYet("no status yet".into()));
            };
            if let Ok(mut seen) = phases.lock() {
                if seen.last() != Some(&status.phase) {
                    seen.push(status.phase);
                }
            }
            let ready = find_condition(&status.conditions, condition_types::READY)
                .is_some_and(|condition| condition.status == ConditionStatus::True);
            Ok(
                if config.spec.mode == mode
                    && ready
                    && status.phase == DataplanePhase::Ready
                    && status.observed_generation == config.metadata.generation
                {
                    Check::Ready(())
                } else {
                    Check::NotYet(format!(
                        "phase {}, message {:?}",
                        status.phase, status.message
                    ))
                },
            )
        },
    )
    .await;
    if let Err(error) = outcome {
        return Err(format!("{error}\noperator log:\n{}", operator.log_tail()).into());
    }
    Ok(phases.into_inner().unwrap_or_default())
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
#[ignore = "needs the e2e cluster: make e2e-operator-smoke"]
async fn a_transition_to_ebpf_and_back_disables_kube_proxy_and_restores_it_exactly() -> TestResult {
    let started = Instant::now();
    let client = admin_client(&ClusterPaths::from_environment()).await?;
    let original = prepare(&client).await?;
    let original_selector = node_selector(&original);
    assert_eq!(
        original_selector
            .get(ORIGINAL_SELECTOR.0)
            .map(String::as_str),
        Some(ORIGINAL_SELECTOR.1)
    );
    // The operator runs as the chart's ServiceAccount, with the chart's RBAC only.
    let kubeconfig = chart_operator_kubeconfig(&client).await?;
    let operator = Operator::start_with(
        "operator-a",
        18181,
        &["--api-server-address=10.99.0.1:6443"],
        kubeconfig,
    );
    let agents = simulate_agents(client.clone());

    // Without a DataplaneConfig: every Node gets its DataplaneNode (KubeProxy), owned by it.
    let dataplane_nodes: Api<DataplaneNode> = Api::all(client.clone());
    wait_for(
        "see a DataplaneNode for each of the 3 nodes",
        WaitOptions::new(Duration::from_secs(60)),
        || async {
            let list = dataplane_nodes.list(&ListParams::default()).await?;
            Ok::<_, kube::Error>(if list.items.len() == 3 {
                Check::Ready(list.items)
            } else {
                Check::NotYet(format!("{} DataplaneNodes", list.items.len()))
            })
        },
    )
    .await?;
    for dataplane_node in dataplane_nodes.list(&ListParams::default()).await?.items {
        assert_eq!(dataplane_node.spec.mode, DataplaneMode::KubeProxy);
        let owners = dataplane_node.owner_references();
        assert_eq!(owners.len(), 1);
        assert_eq!(
            (owners[0].kind.as_str(), owners[0].name.as_str()),
            ("Node", dataplane_node.name_any().as_str())
        );
        let managers: Vec<_> = dataplane_node
            .managed_fields()
            .iter()
            .filter_map(|entry| entry.manager.clone())
            .collect();
        assert!(
            managers
                .iter()
                .any(|manager| manager == "switchyard-operator"),
            "{managers:?}"
        );
    }
    // Events about cluster-scoped objects landed on the 1.20 server.
    wait_for_event(&client, "default", "Node", "node-1", "DataplaneNodeCreated").await?;

    // KubeProxy -> Ebpf.
    let configs: Api<DataplaneConfig> = Api::all(client.clone());
    let config: DataplaneConfig = serde_json::from_value(json!({
        "apiVersion": "switchyard.dev/v1alpha1",
        "kind": "DataplaneConfig",
        "metadata": { "name": "default" },
        "spec": { "mode": "Ebpf", "rollout": { "maxUnavailable": 1, "nodeReadyTimeoutSeconds": 60 } },
    }))?;
    let transition_started = Instant::now();
    configs.create(&PostParams::default(), &config).await?;
    let phases = wait_until_ready(&client, &operator, DataplaneMode::Ebpf).await?;
    let to_ebpf = transition_started.elapsed();
    println!(
        "KubeProxy -> Ebpf: Ready after {:.1} s; phases seen: {phases:?}",
        to_ebpf.as_secs_f64()
    );
    for phase in [
        DataplanePhase::ActivatingNodes,
        DataplanePhase::DisablingKubeProxy,
    ] {
        assert!(
            phases.contains(&phase),
            "phase {phase} never seen: {phases:?}"
        );
    }

    let daemon_sets: Api<DaemonSet> = Api::namespaced(client.clone(), "kube-system");
    let disabled = daemon_sets.get("kube-proxy").await?;
    let selector = node_selector(&disabled);
    assert_eq!(
        selector.get(DISABLED_SELECTOR_KEY).map(String::as_str),
        Some("disabled"),
        "{selector:?}"
    );
    assert_eq!(
        selector.get(ORIGINAL_SELECTOR.0).map(String::as_str),
        Some(ORIGINAL_SELECTOR.1)
    );
    let recorded = disabled
        .annotations()
        .get(PREVIOUS_SELECTOR_ANNOTATION)
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        serde_json::from_str::<BTreeMap<String, String>>(&recorded)?,
        original_selector
    );
    wait_for_kube_proxy_pods(&client, 0).await?;
    for dataplane_node in dataplane_nodes.list(&ListParams::default()).await?.items {
        assert_eq!(
            dataplane_node.spec.mode,
            DataplaneMode::Ebpf,
            "{}",
            dataplane_node.name_any()
        );
        assert!(
            dataplane_node.spec.iptables_cleanup,
            "{} not told to clean",
            dataplane_node.name_any()
        );
    }
    let status = configs.get("default").await?.status.unwrap_or_default();
    assert_eq!(status.nodes.serving, 3);
    assert_eq!(status.nodes.kube_proxy_running, 0);
    assert_eq!(status.serving_summary.as_deref(), Some("3/3"));
    // What users type: the Ready condition works with kubectl wait, the columns show.
    let waited = Command::new("kubectl")
        .args([
            "wait",
            "--for=condition=Ready",
            "dpc/default",
            "--timeout=10s",
        ])
        .output()?;
    assert!(
        waited.status.success(),
        "kubectl wait: {}",
        String::from_utf8_lossy(&waited.stderr)
    );
    let table = Command::new("kubectl").args(["get", "dpc,dpn"]).output()?;
    let table = String::from_utf8_lossy(&table.stdout).to_string();
    println!("{table}");
    for expected in [
        "MODE",
        "PHASE",
        "SERVING",
        "3/3",
        "READY",
        "CLEANUP",
        "AGENT",
        "simulated",
    ] {
        assert!(
            table.contains(expected),
            "kubectl get dpc,dpn lacks {expected}:\n{table}"
        );
    }
    for reason in ["PhaseChanged", "NodesInstructed", "KubeProxyDisabled"] {
        wait_for_event(&client, "default", "DataplaneConfig", "default", reason).await?;
    }
    wait_for_event(
        &client,
        "kube-system",
        "DaemonSet",
        "kube-proxy",
        "KubeProxyDisabled",
    )
    .await?;
    let metrics = operator.metrics();
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
    assert!(metric_value(
        &metrics,
        "switchyard_operator_reconcile_duration_seconds_count"
    )
    .is_some_and(|count| count > 0.0));

    // At rest (Ready, nothing changing) the operator does not keep itself busy: no status
    // write feeds back into another reconcile.
    let reconciles = |text: &str| {
        metric_value(text, "switchyard_operator_reconcile_duration_seconds_count").unwrap_or(0.0)
    };
    let before = reconciles(&operator.metrics());
    tokio::time::sleep(Duration::from_secs(10)).await;
    let at_rest = reconciles(&operator.metrics()) - before;
    println!("reconciles at rest: {at_rest} in 10 s");
    assert!(
        at_rest <= 10.0,
        "{at_rest} reconciles in 10 s with nothing changing"
    );

    // Every write was made as Switchyard (the API server's audit log records the User-Agent).
    let audit = std::fs::read_to_string(ClusterPaths::from_environment().audit_log())?;
    let operator_writes: Vec<&str> = audit
        .lines()
        .filter(|line| {
            line.contains(
                "\"username\":\"system:serviceaccount:switchyard-system:switchyard-operator\"",
            )
        })
        .filter(|line| line.contains("\"verb\":\"patch\""))
        .collect();
    assert!(
        !operator_writes.is_empty(),
        "no write of the operator in the audit log"
    );
    let user_agent = format!(
        "\"userAgent\":\"switchyard-operator/{}\"",
        env!("CARGO_PKG_VERSION")
    );
    for line in &operator_writes {
        assert!(
            line.contains(&user_agent),
            "a write without Switchyard's User-Agent: {line}"
        );
    }
    println!(
        "{} writes of the operator in the audit log, all with {user_agent}",
        operator_writes.len()
    );

    // `kubeadm upgrade` resets the nodeSelector: Managed disables kube-proxy again, with an Event.
    let reset = json!({ "spec": { "template": { "spec": { "nodeSelector": { DISABLED_SELECTOR_KEY: null } } } } });
    daemon_sets
        .patch("kube-proxy", &PatchParams::default(), &Patch::Merge(&reset))
        .await?;
    wait_for(
        "see the reset kube-proxy DaemonSet disabled again",
        WaitOptions::new(Duration::from_secs(60)),
        || async {
            let daemon_set = daemon_sets.get("kube-proxy").await?;
            Ok::<_, kube::Error>(
                if node_selector(&daemon_set).contains_key(DISABLED_SELECTOR_KEY) {
                    Check::Ready(())
                } else {
                    Check::NotYet(format!("selector {:?}", node_selector(&daemon_set)))
                },
            )
        },
    )
    .await?;
    wait_for_event(
        &client,
        "default",
        "DataplaneConfig",
        "default",
        "KubeProxyDisabledAgain",
    )
    .await?;
    // The spec did not change (same generation), so a Ready status read before the operator
    // wrote its next one proves nothing: wait for the whole sequence instead (kube-proxy gone
    // again, every node told to clean again, then Ready).
    wait_for_kube_proxy_pods(&client, 0).await?;
    let dataplane_nodes_again: Api<DataplaneNode> = Api::all(client.clone());
    wait_for(
        "see every node told to clean again",
        WaitOptions::new(Duration::from_secs(60)),
        || async {
            let waiting: Vec<String> = dataplane_nodes_again
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter(|node| !node.spec.iptables_cleanup)
                .map(|node| node.name_any())
                .collect();
            Ok::<_, kube::Error>(if waiting.is_empty() {
                Check::Ready(())
            } else {
                Check::NotYet(format!("not told to clean: {waiting:?}"))
            })
        },
    )
    .await?;
    let phases = wait_until_ready(&client, &operator, DataplaneMode::Ebpf).await?;
    println!("kube-proxy came back and was disabled again; phases seen: {phases:?}");

    // Ebpf -> KubeProxy: the DaemonSet gets back exactly the selector it had.
    let rollback_started = Instant::now();
    let rollback = json!({ "spec": { "mode": "KubeProxy" } });
    configs
        .patch("default", &PatchParams::default(), &Patch::Merge(&rollback))
        .await?;
    let phases = wait_until_ready(&client, &operator, DataplaneMode::KubeProxy).await?;
    println!(
        "Ebpf -> KubeProxy: Ready after {:.1} s; phases seen: {phases:?}",
        rollback_started.elapsed().as_secs_f64()
    );
    assert!(
        phases.contains(&DataplanePhase::RestoringKubeProxy),
        "{phases:?}"
    );
    let restored = daemon_sets.get("kube-proxy").await?;
    assert_eq!(
        node_selector(&restored),
        original_selector,
        "the nodeSelector was not restored exactly"
    );
    assert!(!restored
        .annotations()
        .contains_key(PREVIOUS_SELECTOR_ANNOTATION));
    wait_for_kube_proxy_pods(&client, 3).await?;
    for dataplane_node in dataplane_nodes.list(&ListParams::default()).await?.items {
        assert_eq!(dataplane_node.spec.mode, DataplaneMode::KubeProxy);
        assert!(!dataplane_node.spec.iptables_cleanup);
    }
    wait_for_event(
        &client,
        "default",
        "DataplaneConfig",
        "default",
        "KubeProxyRestored",
    )
    .await?;

    // Deleting the DataplaneConfig leaves the dataplane as it is.
    configs.delete("default", &DeleteParams::default()).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = daemon_sets.get("kube-proxy").await?;
    assert_eq!(node_selector(&after), original_selector);
    assert_eq!(
        dataplane_nodes
            .list(&ListParams::default())
            .await?
            .items
            .len(),
        3
    );

    agents.abort();
    println!("whole scenario: {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

#[tokio::test]
#[ignore = "needs the e2e cluster: make e2e-operator-smoke"]
async fn managed_is_refused_on_a_kube_proxy_owned_by_another_tool_and_preflight_needs_the_api_server_address(
) -> TestResult {
    let client = admin_client(&ClusterPaths::from_environment()).await?;
    prepare(&client).await?;
    let daemon_sets: Api<DaemonSet> = Api::namespaced(client.clone(), "kube-system");
    let mark = json!({ "metadata": { "annotations": { "argocd.argoproj.io/tracking-id": "addons:apps/DaemonSet:kube-system/kube-proxy" } } });
    daemon_sets
        .patch("kube-proxy", &PatchParams::default(), &Patch::Merge(&mark))
        .await?;
    let before = daemon_sets.get("kube-proxy").await?;

    // First without --api-server-address: Preflight refuses to start.
    let mut operator = Operator::start("operator-b", 18182, &[]);
    let agents = simulate_agents(client.clone());
    let configs: Api<DataplaneConfig> = Api::all(client.clone());
    let config: DataplaneConfig = serde_json::from_value(json!({
        "apiVersion": "switchyard.dev/v1alpha1",
        "kind": "DataplaneConfig",
        "metadata": { "name": "default" },
        "spec": { "mode": "Ebpf", "rollout": { "nodeReadyTimeoutSeconds": 60 } },
    }))?;
    configs.create(&PostParams::default(), &config).await?;
    let degraded_with = |reason: &'static str| {
        let configs = configs.clone();
        move || {
            let configs = configs.clone();
            async move {
                let status = configs.get("default").await?.status.unwrap_or_default();
                let degraded =
                    find_condition(&status.conditions, condition_types::DEGRADED).cloned();
                Ok::<_, kube::Error>(match degraded {
                    Some(condition)
                        if condition.status == ConditionStatus::True
                            && condition.reason == reason =>
                    {
                        Check::Ready(condition)
                    }
                    other => Check::NotYet(format!("phase {}, Degraded {other:?}", status.phase)),
                })
            }
        }
    };
    let missing = wait_for(
        "see Degraded ApiServerAddressMissing",
        WaitOptions::new(Duration::from_secs(60)),
        degraded_with(reasons::API_SERVER_ADDRESS_MISSING),
    )
    .await?;
    println!("without --api-server-address: {}", missing.message);
    wait_for_event(
        &client,
        "default",
        "DataplaneConfig",
        "default",
        reasons::API_SERVER_ADDRESS_MISSING,
    )
    .await?;
    operator.kill();

    // With it, the Argo CD mark refuses Managed.
    let operator = Operator::start(
        "operator-c",
        18183,
        &["--api-server-address=10.99.0.1:6443"],
    );
    let refused = wait_for(
        "see Degraded KubeProxyManagedExternally",
        WaitOptions::new(Duration::from_secs(60)),
        degraded_with(reasons::KUBE_PROXY_MANAGED_EXTERNALLY),
    )
    .await
    .map_err(|error| format!("{error}\noperator log:\n{}", operator.log_tail()))?;
    println!(
        "Managed on an Argo CD-owned kube-proxy: {}",
        refused.message
    );
    assert!(
        refused.message.contains("External"),
        "the message must tell the user what to do: {}",
        refused.message
    );
    wait_for_event(
        &client,
        "default",
        "DataplaneConfig",
        "default",
        reasons::KUBE_PROXY_MANAGED_EXTERNALLY,
    )
    .await?;
    let after = daemon_sets.get("kube-proxy").await?;
    assert_eq!(
        node_selector(&after),
        node_selector(&before),
        "a refused DaemonSet must not be touched"
    );
    assert_eq!(after.metadata.generation, before.metadata.generation);

    // Non-default DataplaneConfigs are ignored, and say so.
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

    configs.delete("other", &DeleteParams::default()).await?;
    configs.delete("default", &DeleteParams::default()).await?;
    let unmark =
        json!({ "metadata": { "annotations": { "argocd.argoproj.io/tracking-id": null } } });
    daemon_sets
        .patch(
            "kube-proxy",
            &PatchParams::default(),
            &Patch::Merge(&unmark),
        )
        .await?;
    agents.abort();
    Ok(())
}

#[tokio::test]
#[ignore = "needs the e2e cluster: make e2e-operator-smoke"]
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
    // The follower serves its endpoint and does not lead while the leader renews.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        metric_value(&second.metrics(), leader_gauge),
        Some(0.0),
        "two leaders at once"
    );
    assert_eq!(metric_value(&first.metrics(), leader_gauge), Some(1.0));

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
#[ignore = "needs the e2e cluster: make e2e-operator-smoke"]
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
#[ignore = "needs the e2e cluster: make e2e-operator-smoke"]
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
#[ignore = "needs the e2e cluster: make e2e-operator-smoke"]
async fn agents_are_upgraded_one_node_at_a_time_by_deleting_their_pods() -> TestResult {
    let client = admin_client(&ClusterPaths::from_environment()).await?;
    prepare(&client).await?;
    let daemon_sets: Api<DaemonSet> = Api::namespaced(client.clone(), NAMESPACE);
    if daemon_sets.get_opt("switchyard-agent").await?.is_some() {
        daemon_sets
            .delete("switchyard-agent", &DeleteParams::foreground())
            .await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    // An OnDelete DaemonSet whose image the pod runner does not run: the hollow kubelet reports
    // its pods Running, which is all the operator looks at (the simulated agents report).
    let agent: DaemonSet = serde_json::from_value(json!({
        "metadata": { "name": "switchyard-agent" },
        "spec": {
            "selector": { "matchLabels": { "app": "switchyard-agent" } },
            "updateStrategy": { "type": "OnDelete" },
            "template": {
                "metadata": { "labels": { "app": "switchyard-agent" }, "annotations": { "version": "1" } },
                "spec": {
                    "tolerations": [{ "operator": "Exists" }],
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{ "name": "agent", "image": "switchyard/simulated-agent:1" }],
                },
            },
        },
    }))?;
    daemon_sets.create(&PostParams::default(), &agent).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let revisions_of_running_pods = || async {
        let list = pods.list(&ListParams::default()).await?;
        Ok::<_, kube::Error>(
            list.items
                .iter()
                .filter(|pod| pod.metadata.deletion_timestamp.is_none())
                .filter(|pod| {
                    pod.status
                        .as_ref()
                        .and_then(|status| status.phase.as_deref())
                        == Some("Running")
                })
                .filter_map(|pod| pod.labels().get("controller-revision-hash").cloned())
                .collect::<Vec<_>>(),
        )
    };
    let first = wait_for(
        "see 3 agent pods running",
        WaitOptions::new(Duration::from_secs(60)),
        || async {
            let revisions = revisions_of_running_pods().await?;
            Ok::<_, kube::Error>(if revisions.len() == 3 {
                Check::Ready(revisions[0].clone())
            } else {
                Check::NotYet(format!("{revisions:?}"))
            })
        },
    )
    .await?;

    let kubeconfig = chart_operator_kubeconfig(&client).await?;
    let operator = Operator::start_with(
        "operator-d",
        18186,
        &["--api-server-address=10.99.0.1:6443"],
        kubeconfig,
    );
    let agents = simulate_agents(client.clone());
    let configs: Api<DataplaneConfig> = Api::all(client.clone());
    let config: DataplaneConfig = serde_json::from_value(json!({
        "apiVersion": "switchyard.dev/v1alpha1",
        "kind": "DataplaneConfig",
        "metadata": { "name": "default" },
        "spec": { "mode": "KubeProxy", "rollout": { "maxUnavailable": 1, "nodeReadyTimeoutSeconds": 60 } },
    }))?;
    configs.create(&PostParams::default(), &config).await?;
    wait_until_ready(&client, &operator, DataplaneMode::KubeProxy).await?;

    // A new agent version: the DaemonSet gets a new revision, and only the operator replaces pods.
    let upgrade =
        json!({ "spec": { "template": { "metadata": { "annotations": { "version": "2" } } } } });
    daemon_sets
        .patch(
            "switchyard-agent",
            &PatchParams::default(),
            &Patch::Merge(&upgrade),
        )
        .await?;
    let upgrade_started = Instant::now();
    let mut most_missing = 0;
    let mut phases = Vec::new();
    let new_revision = loop {
        if upgrade_started.elapsed() > Duration::from_secs(120) {
            return Err(format!(
                "the agents were not upgraded within 120 s\noperator log:\n{}",
                operator.log_tail()
            )
            .into());
        }
        let revisions = revisions_of_running_pods().await?;
        let missing = 3 - revisions.len().min(3);
        most_missing = most_missing.max(missing);
        if let Some(status) = configs.get("default").await?.status {
            if phases.last() != Some(&status.phase) {
                phases.push(status.phase);
            }
        }
        if revisions.len() == 3
            && revisions.iter().all(|revision| revision != &first)
            && revisions.windows(2).all(|pair| pair[0] == pair[1])
        {
            break revisions[0].clone();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!(
        "agents upgraded from {first} to {new_revision} in {:.1} s; at most {most_missing} node(s) without a running agent at once; phases seen: {phases:?}",
        upgrade_started.elapsed().as_secs_f64()
    );
    assert!(
        most_missing <= 1,
        "more than maxUnavailable agents were down at once: {most_missing}"
    );
    assert!(
        phases.contains(&DataplanePhase::UpgradingAgents),
        "{phases:?}"
    );
    wait_for_event(
        &client,
        "default",
        "DataplaneConfig",
        "default",
        "AgentPodsDeleted",
    )
    .await?;
    let daemon_set = daemon_sets.get("switchyard-agent").await?;
    assert!(
        !daemon_set
            .managed_fields()
            .iter()
            .any(|entry| entry.manager.as_deref() == Some("switchyard-operator")),
        "the operator must never write the agent DaemonSet (Helm and Argo CD own it)"
    );
    wait_until_ready(&client, &operator, DataplaneMode::KubeProxy).await?;

    agents.abort();
    configs.delete("default", &DeleteParams::default()).await?;
    daemon_sets
        .delete("switchyard-agent", &DeleteParams::default())
        .await?;
    Ok(())
}

#[tokio::test]
#[ignore = "needs the e2e cluster: make e2e-operator-smoke"]
async fn external_management_waits_for_kube_proxy_to_go_and_reports_its_return() -> TestResult {
    let client = admin_client(&ClusterPaths::from_environment()).await?;
    let original = prepare(&client).await?;
    let kubeconfig = chart_operator_kubeconfig(&client).await?;
    let operator = Operator::start_with(
        "operator-e",
        18187,
        &["--api-server-address=10.99.0.1:6443"],
        kubeconfig,
    );
    let agents = simulate_agents(client.clone());
    let configs: Api<DataplaneConfig> = Api::all(client.clone());
    let config: DataplaneConfig = serde_json::from_value(json!({
        "apiVersion": "switchyard.dev/v1alpha1",
        "kind": "DataplaneConfig",
        "metadata": { "name": "default" },
        "spec": {
            "mode": "Ebpf",
            "kubeProxy": { "management": "External" },
            "rollout": { "maxUnavailable": 3, "nodeReadyTimeoutSeconds": 60 },
        },
    }))?;
    configs.create(&PostParams::default(), &config).await?;

    // Every node serves from eBPF; the operator waits for someone else to remove kube-proxy.
    let waiting = wait_for(
        "see the transition wait in DisablingKubeProxy",
        WaitOptions::new(Duration::from_secs(60)),
        || async {
            let status = configs.get("default").await?.status.unwrap_or_default();
            Ok::<_, kube::Error>(if status.phase == DataplanePhase::DisablingKubeProxy {
                Check::Ready(status.message.unwrap_or_default())
            } else {
                Check::NotYet(format!("phase {}", status.phase))
            })
        },
    )
    .await?;
    println!("External, waiting: {waiting}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let daemon_sets: Api<DaemonSet> = Api::namespaced(client.clone(), "kube-system");
    let untouched = daemon_sets.get("kube-proxy").await?;
    assert_eq!(
        node_selector(&untouched),
        node_selector(&original),
        "External must not patch kube-proxy"
    );
    assert_eq!(
        configs
            .get("default")
            .await?
            .status
            .unwrap_or_default()
            .phase,
        DataplanePhase::DisablingKubeProxy
    );

    // GitOps removes kube-proxy: the transition continues to Ready.
    daemon_sets
        .delete("kube-proxy", &DeleteParams::foreground())
        .await?;
    let phases = wait_until_ready(&client, &operator, DataplaneMode::Ebpf).await?;
    println!("External, after kube-proxy was deleted: phases seen {phases:?}");

    // kube-proxy comes back (someone re-applied it): External reports Degraded, touches nothing.
    create_kube_proxy_daemonset(&client).await?;
    let returned = wait_for(
        "see Degraded KubeProxyReturned",
        WaitOptions::new(Duration::from_secs(60)),
        || async {
            let status = configs.get("default").await?.status.unwrap_or_default();
            let degraded = find_condition(&status.conditions, condition_types::DEGRADED).cloned();
            Ok::<_, kube::Error>(match degraded {
                Some(condition)
                    if condition.status == ConditionStatus::True
                        && condition.reason == reasons::KUBE_PROXY_RETURNED =>
                {
                    Check::Ready(condition.message)
                }
                other => Check::NotYet(format!("phase {}, Degraded {other:?}", status.phase)),
            })
        },
    )
    .await
    .map_err(|error| format!("{error}\noperator log:\n{}", operator.log_tail()))?;
    println!("External, kube-proxy returned: {returned}");
    wait_for_event(
        &client,
        "default",
        "DataplaneConfig",
        "default",
        reasons::KUBE_PROXY_RETURNED,
    )
    .await?;
    let back = daemon_sets.get("kube-proxy").await?;
    assert!(
        !node_selector(&back).contains_key(DISABLED_SELECTOR_KEY),
        "External must not disable kube-proxy"
    );
    // No node cleans rules while kube-proxy runs on it.
    wait_for_kube_proxy_pods(&client, 3).await?;
    let dataplane_nodes: Api<DataplaneNode> = Api::all(client.clone());
    wait_for(
        "see cleanup turned off on every node running kube-proxy",
        WaitOptions::new(Duration::from_secs(30)),
        || async {
            let cleaning: Vec<String> = dataplane_nodes
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter(|node| node.spec.iptables_cleanup)
                .map(|node| node.name_any())
                .collect();
            Ok::<_, kube::Error>(if cleaning.is_empty() {
                Check::Ready(())
            } else {
                Check::NotYet(format!("still told to clean: {cleaning:?}"))
            })
        },
    )
    .await?;

    agents.abort();
    configs.delete("default", &DeleteParams::default()).await?;
    Ok(())
}

#[tokio::test]
#[ignore = "needs the e2e cluster: make e2e-operator-smoke"]
async fn an_operator_killed_mid_transition_is_replaced_by_one_that_neither_repeats_nor_skips_a_step(
) -> TestResult {
    let client = admin_client(&ClusterPaths::from_environment()).await?;
    prepare(&client).await?;
    let kubeconfig = chart_operator_kubeconfig(&client).await?;
    let mut first = Operator::start_with(
        "operator-f",
        18188,
        &["--api-server-address=10.99.0.1:6443"],
        kubeconfig.clone(),
    );
    let dataplane_nodes: Api<DataplaneNode> = Api::all(client.clone());
    // Agents report Ready, then fall silent: the first node asked for eBPF stays in flight.
    let agents = simulate_agents(client.clone());
    wait_for(
        "see 3 DataplaneNodes reported Ready",
        WaitOptions::new(Duration::from_secs(60)),
        || async {
            let ready = dataplane_nodes
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .filter(|node| {
                    node.status.as_ref().is_some_and(|status| {
                        status.observed_generation == node.metadata.generation
                            && status.condition_is_true(condition_types::READY)
                    })
                })
                .count();
            Ok::<_, kube::Error>(if ready == 3 {
                Check::Ready(())
            } else {
                Check::NotYet(format!("{ready} Ready"))
            })
        },
    )
    .await?;
    agents.abort();
    let configs: Api<DataplaneConfig> = Api::all(client.clone());
    let config: DataplaneConfig = serde_json::from_value(json!({
        "apiVersion": "switchyard.dev/v1alpha1",
        "kind": "DataplaneConfig",
        "metadata": { "name": "default" },
        "spec": { "mode": "Ebpf", "rollout": { "maxUnavailable": 1, "nodeReadyTimeoutSeconds": 120 } },
    }))?;
    configs.create(&PostParams::default(), &config).await?;
    let asked = wait_for(
        "see one node asked for eBPF",
        WaitOptions::new(Duration::from_secs(30)),
        || async {
            let asked: Vec<DataplaneNode> = dataplane_nodes
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter(|node| node.spec.mode == DataplaneMode::Ebpf)
                .collect();
            Ok::<_, kube::Error>(if asked.is_empty() {
                Check::NotYet("none asked yet".into())
            } else {
                Check::Ready(asked)
            })
        },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(asked.len(), 1, "more than maxUnavailable nodes in flight");
    let in_flight = asked[0].name_any();
    let requested_at = asked[0].spec.requested_at;
    assert_eq!(
        configs
            .get("default")
            .await?
            .status
            .unwrap_or_default()
            .phase,
        DataplanePhase::ActivatingNodes
    );

    // Killed: no Lease release, no goodbye. The replacement waits out the Lease, then goes on.
    first.kill();
    let second = Operator::start_with(
        "operator-g",
        18189,
        &["--api-server-address=10.99.0.1:6443"],
        kubeconfig,
    );
    wait_for(
        "see operator-g lead",
        WaitOptions::new(Duration::from_secs(40)),
        || async {
            Ok::<_, String>(
                if metric_value(&second.metrics(), "switchyard_operator_leader") == Some(1.0) {
                    Check::Ready(())
                } else {
                    Check::NotYet("not leading".into())
                },
            )
        },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Nothing repeated: the node in flight was not asked again, no other node was asked.
    let after: Vec<DataplaneNode> = dataplane_nodes.list(&ListParams::default()).await?.items;
    for node in &after {
        if node.name_any() == in_flight {
            assert_eq!(node.spec.mode, DataplaneMode::Ebpf);
            assert_eq!(
                node.spec.requested_at, requested_at,
                "the node in flight was asked again"
            );
        } else {
            assert_eq!(
                node.spec.mode,
                DataplaneMode::KubeProxy,
                "{} asked while {in_flight} is in flight",
                node.name_any()
            );
        }
    }
    // The agents speak again: the transition finishes from where it stood.
    let agents = simulate_agents(client.clone());
    let phases = wait_until_ready(&client, &second, DataplaneMode::Ebpf).await?;
    println!("after the replacement took over: phases seen {phases:?}");
    assert!(
        !phases.contains(&DataplanePhase::Preflight),
        "the replacement went back to Preflight: {phases:?}"
    );
    let daemon_sets: Api<DaemonSet> = Api::namespaced(client.clone(), "kube-system");
    assert!(
        node_selector(&daemon_sets.get("kube-proxy").await?).contains_key(DISABLED_SELECTOR_KEY)
    );

    agents.abort();
    // Back to kube-proxy for the next test.
    let rollback = json!({ "spec": { "mode": "KubeProxy" } });
    configs
        .patch("default", &PatchParams::default(), &Patch::Merge(&rollback))
        .await?;
    let agents = simulate_agents(client.clone());
    wait_until_ready(&client, &second, DataplaneMode::KubeProxy).await?;
    agents.abort();
    configs.delete("default", &DeleteParams::default()).await?;
    Ok(())
}

#[tokio::test]
#[ignore = "needs the e2e cluster: make e2e-operator-smoke"]
async fn a_helm_installed_operator_runs_in_the_cluster_leads_and_creates_dataplane_nodes(
) -> TestResult {
    let images = std::env::var("SWITCHYARD_E2E_IMAGES").unwrap_or_default();
    let mapped = std::fs::read_to_string(&images).unwrap_or_default();
    if !mapped.contains("switchyard-operator") {
        return Err(format!(
            "the cluster must run the operator image: start it with SWITCHYARD_E2E_IMAGES naming the operator binary (got {images:?})"
        )
        .into());
    }
    let client = admin_client(&ClusterPaths::from_environment()).await?;
    ensure_namespace(&client).await?;
    let chart = concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/switchyard");
    // One replica: the pod runner starts a Deployment's pods one after the other.
    let installed = Command::new("helm")
        .args([
            "install",
            "sy",
            chart,
            "--namespace",
            NAMESPACE,
            "--set",
            "apiServer.host=10.99.0.1",
            "--set",
            "operator.replicas=1",
        ])
        .output()?;
    assert!(
        installed.status.success(),
        "helm install: {}",
        String::from_utf8_lossy(&installed.stderr)
    );

    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), NAMESPACE);
    let holder = wait_for(
        "see the operator pod hold the leader Lease",
        WaitOptions::new(Duration::from_secs(90)),
        || async {
            let holder = leases
                .get_opt("switchyard-operator")
                .await?
                .and_then(|lease| lease.spec)
                .and_then(|spec| spec.holder_identity);
            Ok::<_, kube::Error>(match holder {
                Some(holder) if holder.starts_with("switchyard-operator-") => Check::Ready(holder),
                other => Check::NotYet(format!("holder {other:?}")),
            })
        },
    )
    .await?;
    println!("the helm-installed operator pod {holder} leads");
    let dataplane_nodes: Api<DataplaneNode> = Api::all(client.clone());
    wait_for(
        "see the installed operator create 3 DataplaneNodes",
        WaitOptions::new(Duration::from_secs(60)),
        || async {
            let count = dataplane_nodes
                .list(&ListParams::default())
                .await?
                .items
                .len();
            Ok::<_, kube::Error>(if count == 3 {
                Check::Ready(())
            } else {
                Check::NotYet(format!("{count} DataplaneNodes"))
            })
        },
    )
    .await?;

    let uninstalled = Command::new("helm")
        .args(["uninstall", "sy", "--namespace", NAMESPACE])
        .output()?;
    assert!(
        uninstalled.status.success(),
        "helm uninstall: {}",
        String::from_utf8_lossy(&uninstalled.stderr)
    );
    // The operator pod goes (helm removes its RBAC at the same moment, so its goodbye release
    // of the Lease may be refused: the Lease then expires after its duration).
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    wait_for(
        "see the operator pod gone",
        WaitOptions::new(Duration::from_secs(60)),
        || async {
            let left: Vec<String> = pods
                .list(&ListParams::default().labels("app.kubernetes.io/component=operator"))
                .await?
                .items
                .iter()
                .map(|pod| pod.name_any())
                .collect();
            Ok::<_, kube::Error>(if left.is_empty() {
                Check::Ready(())
            } else {
                Check::NotYet(format!("left: {left:?}"))
            })
        },
    )
    .await?;
    Ok(())
}
