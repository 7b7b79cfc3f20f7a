//! The migration world shared by `make demo` (`src/bin/switchyard-demo.rs`) and the
//! migration scenarios (`tests/migration_scenarios.rs`): real kube-proxy on every node,
//! a NodePort Service whose backends are echo servers in pod namespaces on node-2 and
//! node-3, a client pod on node-1 and an outside namespace on the bridge, the chart
//! installed by helm (its images mapped by the pod runner's image table to the local
//! binaries), and a recorder of every version of the objects a transition touches, so
//! that orderings are proved by etcd revision (one etcd: one revision counter for every
//! resource), not by the timing of polls.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use switchyard_crds::{
    condition_types, find_condition, ConditionStatus, DataplaneConfig, DataplaneMode,
    DataplaneNode, DataplanePhase,
};
use switchyard_e2e::cluster::{admin_client, ClusterPaths};
use switchyard_e2e::netns::TestNamespace;
use switchyard_e2e::objects::{
    create_kube_proxy_daemonset, endpoint_slice_v1beta1, endpoint_slices_v1beta1, Endpoint,
};
use switchyard_e2e::pod_runner::events::{read_events, running_processes, RunnerEvent};
use switchyard_e2e::traffic::{
    exchange_once, EchoServer, Flow, FlowMode, Timeouts, TrafficGenerator, TrafficReport,
};

pub const NODES: [&str; 3] = ["node-1", "node-2", "node-3"];
pub const BACKEND_PORT: u16 = 8080;
pub const SERVICE_PORT: u16 = 80;
pub const NODE_PORT: u16 = 30080;
pub const SERVICE_NAME: &str = "demo";
pub const RELEASE: &str = "switchyard";
pub const RELEASE_NAMESPACE: &str = "switchyard-system";
/// The nodeSelector key the operator adds to disable kube-proxy.
pub const KUBE_PROXY_DISABLED_KEY: &str = "switchyard.dev/kube-proxy";
pub const AGENT_SERVICE_ACCOUNT: &str = "system:serviceaccount:switchyard-system:switchyard-agent";
pub const OPERATOR_SERVICE_ACCOUNT: &str =
    "system:serviceaccount:switchyard-system:switchyard-operator";
/// The operator's container in the chart's Deployment (the pod runner's event log names it).
pub const OPERATOR_CONTAINER: &str = "operator";
/// The chart's `operator.metricsPort` (the operator pod serves it in its node's namespace).
pub const OPERATOR_METRICS_PORT: u16 = 8080;
/// The annotation in which the operator records kube-proxy's nodeSelector before disabling it.
pub const PREVIOUS_SELECTOR_ANNOTATION: &str = "switchyard.dev/previous-node-selector";
/// A finalizer of the tests' own: a kube-proxy pod carrying it stays (terminating, its
/// process gone) until the test removes it, which holds a transition in DisablingKubeProxy.
pub const HOLD_FINALIZER: &str = "switchyard.dev/e2e-hold";

pub type Failure = Box<dyn std::error::Error + Send + Sync>;
pub type Outcome<T> = Result<T, Failure>;

fn repository_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default()
}

/// Runs a command from the repository root; its standard output, or an error with its
/// standard error.
pub fn run(program: &str, arguments: &[&str]) -> Outcome<String> {
    let output = Command::new(program)
        .args(arguments)
        .current_dir(repository_root())
        .output()
        .map_err(|error| format!("failed to run {program} {arguments:?}: {error}"))?;
    if !output.status.success() {
        return Err(format!(
            "failed to run {program} {arguments:?}: {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The API server's real address: the `server` of the admin kubeconfig (the bridge
/// address every node routes to), which the agents use instead of the `kubernetes`
/// Service they take over.
pub fn api_server_host(paths: &ClusterPaths) -> Outcome<String> {
    let kubeconfig = std::fs::read_to_string(paths.admin_kubeconfig())?;
    kubeconfig
        .lines()
        .find_map(|line| line.trim().strip_prefix("server: https://"))
        .and_then(|address| address.rsplit_once(':'))
        .map(|(host, _port)| host.to_string())
        .ok_or_else(|| "failed to find the API server's address in the admin kubeconfig".into())
}

/// Whether a DataplaneNode serves Services from eBPF: told `Ebpf`, and its agent reports
/// Ready and ProgramsAttached about that very spec.
pub fn is_serving(dataplane_node: &DataplaneNode) -> bool {
    let Some(status) = &dataplane_node.status else {
        return false;
    };
    let current = status.observed_generation >= dataplane_node.metadata.generation
        && dataplane_node.metadata.generation.is_some();
    let condition_true = |type_: &str| {
        find_condition(&status.conditions, type_)
            .is_some_and(|condition| condition.status == ConditionStatus::True)
    };
    dataplane_node.spec.mode == DataplaneMode::Ebpf
        && current
        && condition_true(condition_types::READY)
        && condition_true(condition_types::PROGRAMS_ATTACHED)
}

/// Whether the node's programs are detached (its agent says so about the current spec).
pub fn is_detached(dataplane_node: &DataplaneNode) -> bool {
    let Some(status) = &dataplane_node.status else {
        return false;
    };
    status.observed_generation >= dataplane_node.metadata.generation
        && find_condition(&status.conditions, condition_types::PROGRAMS_ATTACHED)
            .is_some_and(|condition| condition.status == ConditionStatus::False)
}

pub fn is_draining(dataplane_node: &DataplaneNode) -> bool {
    dataplane_node.status.as_ref().is_some_and(|status| {
        find_condition(&status.conditions, condition_types::DRAINING)
            .is_some_and(|condition| condition.status == ConditionStatus::True)
    })
}

pub fn live_flows(dataplane_node: &DataplaneNode) -> i64 {
    dataplane_node
        .status
        .as_ref()
        .and_then(|status| status.live_flows)
        .unwrap_or(0)
}

pub fn kube_proxy_disabled(daemon_set: &DaemonSet) -> bool {
    daemon_set
        .spec
        .as_ref()
        .and_then(|spec| spec.template.spec.as_ref())
        .and_then(|spec| spec.node_selector.as_ref())
        .is_some_and(|selector| selector.contains_key(KUBE_PROXY_DISABLED_KEY))
}

/// Whether the DataplaneConfig is Ready in `mode` about its current generation.
pub fn config_ready(config: &DataplaneConfig, mode: DataplaneMode) -> bool {
    let Some(status) = &config.status else {
        return false;
    };
    config.spec.mode == mode
        && status.phase == DataplanePhase::Ready
        && status.observed_generation == config.metadata.generation
        && find_condition(&status.conditions, condition_types::READY)
            .is_some_and(|condition| condition.status == ConditionStatus::True)
}

mod recorder;
// The demo (which shares this module) records nothing.
#[allow(unused_imports)]
pub use recorder::*;

// ---------------------------------------------------------------------------
// The world
// ---------------------------------------------------------------------------

pub struct World {
    pub paths: ClusterPaths,
    pub client: Client,
    pub client_pod: TestNamespace,
    pub backend_2: TestNamespace,
    pub backend_3: TestNamespace,
    pub outside: TestNamespace,
    pub servers: Vec<EchoServer>,
    pub cluster_ip: Ipv4Addr,
    pub api_server_host: String,
}

impl World {
    /// kube-proxy on every node, the demo Service and its backends, both clients; returns
    /// once both paths answer through kube-proxy.
    pub async fn new() -> Outcome<World> {
        let paths = ClusterPaths::from_environment();
        let client = admin_client(&paths).await?;
        let api_server_host = api_server_host(&paths)?;
        create_kube_proxy_daemonset(&client).await?;
        let client_pod = TestNamespace::pod(1, "demo-client", 10)?;
        let backend_2 = TestNamespace::pod(2, "demo-b2", 10)?;
        let backend_3 = TestNamespace::pod(3, "demo-b3", 10)?;
        let outside = TestNamespace::external("demo-outside", 110)?;
        let any = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, BACKEND_PORT));
        let servers = vec![
            EchoServer::start(&backend_2.thread()?, any, "backend-2").await?,
            EchoServer::start(&backend_3.thread()?, any, "backend-3").await?,
        ];
        let cluster_ip = create_service(&client).await?;
        let endpoints = [
            Endpoint {
                address: backend_2.address,
                node: "node-2".into(),
            },
            Endpoint {
                address: backend_3.address,
                node: "node-3".into(),
            },
        ];
        let slice_name = format!("{SERVICE_NAME}-1");
        let slice = endpoint_slice_v1beta1(
            "default",
            &slice_name,
            SERVICE_NAME,
            "http",
            BACKEND_PORT,
            &endpoints,
        )?;
        endpoint_slices_v1beta1(&client, "default")
            .patch(
                &slice_name,
                &PatchParams::apply("switchyard-demo").force(),
                &Patch::Apply(&slice),
            )
            .await?;
        let world = World {
            paths,
            client,
            client_pod,
            backend_2,
            backend_3,
            outside,
            servers,
            cluster_ip,
            api_server_host,
        };
        // No connection before kube-proxy has programmed the demo Service on node-1: a SYN
        // to the ClusterIP that leaves untranslated (no rules yet) leaves a netfilter
        // conntrack entry without NAT (SYN_SENT, 120 s), and a later connection that happens to
        // reuse its source port would follow that entry untranslated too.
        let started = Instant::now();
        while !world.kube_proxy_rules("node-1")?.demo_service {
            if started.elapsed() > Duration::from_secs(60) {
                return Err(
                    "failed to see kube-proxy's rules for the demo Service on node-1 within 60 s"
                        .into(),
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for (source, destination) in [
            (world.client_pod.thread()?, world.cluster_ip_address()),
            (world.outside.thread()?, world.node_port_address()),
        ] {
            let started = Instant::now();
            loop {
                let timeouts = Timeouts {
                    connect: Duration::from_millis(300),
                    reply: Duration::from_millis(500),
                };
                match exchange_once(&source, destination, timeouts).await {
                    Ok(_) => break,
                    Err(cause) if started.elapsed() > Duration::from_secs(60) => {
                        return Err(format!(
                            "failed to reach {destination} through kube-proxy within 60 s: {cause}"
                        )
                        .into())
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        }
        Ok(world)
    }

    pub fn node_address(&self, node: &str) -> Ipv4Addr {
        self.paths
            .node_address(node)
            .ok()
            .and_then(|address| address.trim().parse().ok())
            .unwrap_or(Ipv4Addr::UNSPECIFIED)
    }

    pub fn cluster_ip_address(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(self.cluster_ip, SERVICE_PORT))
    }

    pub fn node_port_address(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(self.node_address("node-1"), NODE_PORT))
    }

    /// New connections all the time: the client pod to the ClusterIP, outside to node-1's
    /// NodePort (each ~100 a second).
    pub fn short_traffic(&self) -> Outcome<TrafficGenerator> {
        let short = FlowMode::ShortConnections {
            interval: Duration::from_millis(20),
            workers: 2,
        };
        Ok(TrafficGenerator::start(
            vec![
                Flow {
                    name: "client pod -> ClusterIP".into(),
                    source: self.client_pod.thread()?,
                    destination: self.cluster_ip_address(),
                    mode: short,
                },
                Flow {
                    name: "outside -> NodePort".into(),
                    source: self.outside.thread()?,
                    destination: self.node_port_address(),
                    mode: short,
                },
            ],
            Timeouts::default(),
        ))
    }

    /// [`Self::short_traffic`], returned once every flow has been answered by every backend
    /// (so that what follows runs under traffic that is known to work).
    pub async fn short_traffic_flowing(&self) -> Outcome<TrafficGenerator> {
        let traffic = self.short_traffic()?;
        let started = Instant::now();
        loop {
            let report = traffic.snapshot();
            let flowing = report.flows.values().all(|flow| {
                BACKENDS
                    .iter()
                    .all(|backend| flow.backends.contains_key(*backend))
            });
            if flowing {
                return Ok(traffic);
            }
            if report.failure_count() > 0 || started.elapsed() > TRAFFIC_START {
                return Err(format!(
                    "failed to see both backends answer every flow within {TRAFFIC_START:?}\n{report}"
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// [`Self::long_lived_traffic`], returned once all `count` connections of each client are
    /// open and have been answered (so that a transition after it meets them all).
    pub async fn long_lived_traffic_open(&self, count: usize) -> Outcome<TrafficGenerator> {
        let traffic = self.long_lived_traffic(count)?;
        let started = Instant::now();
        loop {
            let report = traffic.snapshot();
            let open = report.flows.values().all(|flow| {
                flow.connections_opened == count as u64 && flow.successes >= count as u64
            });
            if open {
                return Ok(traffic);
            }
            if report.failure_count() > 0 || started.elapsed() > TRAFFIC_START {
                return Err(format!(
                    "failed to open {count} answered long-lived connections per client within {TRAFFIC_START:?}\n{report}"
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `count` long-lived connections from each client, a line every 200 ms; a broken one
    /// is counted as a failure and reopened (so `connections_opened` above `count` means
    /// some broke).
    pub fn long_lived_traffic(&self, count: usize) -> Outcome<TrafficGenerator> {
        let long = FlowMode::LongLived {
            connections: count,
            message_interval: Duration::from_millis(200),
        };
        Ok(TrafficGenerator::start(
            vec![
                Flow {
                    name: "long-lived client pod -> ClusterIP".into(),
                    source: self.client_pod.thread()?,
                    destination: self.cluster_ip_address(),
                    mode: long,
                },
                Flow {
                    name: "long-lived outside -> NodePort".into(),
                    source: self.outside.thread()?,
                    destination: self.node_port_address(),
                    mode: long,
                },
            ],
            Timeouts::default(),
        ))
    }

    /// `helm upgrade --install` of `charts/switchyard`, sized and wired for the local
    /// cluster: the API server's real address, pod veths `p-*`, `eth0` facing outside, no
    /// socket hooks (every hollow node shares the machine's cgroup tree), one operator
    /// replica (operator pods run in their node's network namespace, where two on one
    /// node would share the metrics port).
    pub fn helm_install(&self, extra: &[&str]) -> Outcome<String> {
        let host = format!("apiServer.host={}", self.api_server_host);
        let mut arguments = vec![
            "upgrade",
            "--install",
            RELEASE,
            "charts/switchyard",
            "--namespace",
            RELEASE_NAMESPACE,
            "--create-namespace",
            "--set",
            &host,
            "--set",
            "operator.replicas=1",
            "--set",
            "agent.podInterfaces=p-*",
            "--set",
            "agent.hostInterfaces=eth0",
            "--set",
            "agent.maps.frontends=4096",
            "--set",
            "agent.maps.backends=16384",
            "--set",
            "agent.maps.conntrack=65536",
            "--set-json",
            r#"agent.extraArgs=["--no-socket-hooks","--gate-timeout=10s"]"#,
        ];
        arguments.extend_from_slice(extra);
        run("helm", &arguments)
    }

    /// Waits until every node has a DataplaneNode whose agent reported about its spec.
    pub async fn wait_agents_reporting(&self, timeout: Duration) -> Outcome<()> {
        let api: Api<DataplaneNode> = Api::all(self.client.clone());
        let started = Instant::now();
        loop {
            let list = api.list(&ListParams::default()).await;
            let reporting = list
                .as_ref()
                .map(|list| {
                    list.items
                        .iter()
                        .filter(|node| {
                            node.status.as_ref().is_some_and(|status| {
                                status.observed_generation >= node.metadata.generation
                                    && find_condition(&status.conditions, condition_types::READY)
                                        .is_some()
                            })
                        })
                        .count()
                })
                .unwrap_or(0);
            if reporting == NODES.len() {
                return Ok(());
            }
            if started.elapsed() > timeout {
                return Err(format!(
                    "failed to see an agent report on every node within {timeout:?}: {reporting} of {} ({list:?})",
                    NODES.len()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Creates or updates the DataplaneConfig `default` (Server-Side Apply).
    pub async fn apply_config(
        &self,
        mode: DataplaneMode,
        rollout: serde_json::Value,
    ) -> Outcome<()> {
        let config = serde_json::json!({
            "apiVersion": "switchyard.dev/v1alpha1",
            "kind": "DataplaneConfig",
            "metadata": {"name": "default"},
            "spec": {"mode": mode.to_string(), "rollout": rollout},
        });
        Api::<DataplaneConfig>::all(self.client.clone())
            .patch(
                "default",
                &PatchParams::apply("switchyard-demo").force(),
                &Patch::Apply(&config),
            )
            .await?;
        Ok(())
    }

    pub async fn config(&self) -> Outcome<Option<DataplaneConfig>> {
        Ok(Api::<DataplaneConfig>::all(self.client.clone())
            .get_opt("default")
            .await?)
    }

    /// The default DataplaneConfig's resourceVersion, which is its etcd revision: the
    /// point after which the scenarios look for the operator's steps.
    pub async fn config_revision(&self) -> u64 {
        self.config()
            .await
            .expect("read the DataplaneConfig")
            .and_then(|config| config.metadata.resource_version)
            .and_then(|version| version.parse::<u64>().ok())
            .expect("the DataplaneConfig's revision")
    }

    pub async fn dataplane_nodes(&self) -> Outcome<BTreeMap<String, DataplaneNode>> {
        let list = Api::<DataplaneNode>::all(self.client.clone())
            .list(&ListParams::default())
            .await?;
        Ok(list
            .items
            .into_iter()
            .map(|node| (node.metadata.name.clone().unwrap_or_default(), node))
            .collect())
    }

    /// kube-proxy's Service chains (`KUBE-SVC-*`) and its rules naming the demo Service in
    /// a node's nat table.
    pub fn kube_proxy_rules(&self, node: &str) -> Outcome<KubeProxyRules> {
        let dump = switchyard_e2e::netns::run_in_namespace(node, "iptables-save", &["-t", "nat"])?;
        Ok(KubeProxyRules::parse(&dump))
    }

    pub fn kube_proxy_pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), "kube-system")
    }

    pub fn kube_proxy_daemon_set(&self) -> Api<DaemonSet> {
        Api::namespaced(self.client.clone(), "kube-system")
    }

    /// kube-proxy's pod on each node (pods not yet terminating).
    pub async fn kube_proxy_pods_by_node(&self) -> Outcome<BTreeMap<String, Pod>> {
        let pods = self
            .kube_proxy_pods()
            .list(&ListParams::default().labels("k8s-app=kube-proxy"))
            .await?;
        Ok(pods
            .items
            .into_iter()
            .filter(|pod| pod.metadata.deletion_timestamp.is_none())
            .filter_map(|pod| Some((pod.spec.as_ref()?.node_name.clone()?, pod)))
            .collect())
    }

    /// The operator's process, as the pod runner reports it (the chart runs one replica here).
    pub fn operator_process(&self) -> Outcome<RunnerEvent> {
        let events = read_events(&self.paths.pod_runner_events())?;
        let running = running_processes(&events, OPERATOR_CONTAINER);
        let mut processes = running.into_values();
        match (processes.next(), processes.next()) {
            (Some(process), None) if process.pid.is_some() => Ok(process),
            other => Err(format!("failed to find the one operator process: {other:?}").into()),
        }
    }

    /// The operator's `/metrics`, read from its node's address.
    pub fn operator_metrics(&self, process: &RunnerEvent) -> Outcome<String> {
        let address = SocketAddr::V4(SocketAddrV4::new(
            self.node_address(&process.node),
            OPERATOR_METRICS_PORT,
        ));
        http_get(address, "/metrics")
    }

    /// Waits until an operator process other than `replaced` (by pid) runs and holds the
    /// leader Lease (its `switchyard_operator_leader` gauge is 1); returns it.
    pub async fn wait_operator_leading(
        &self,
        replaced: Option<u32>,
        timeout: Duration,
    ) -> Outcome<RunnerEvent> {
        let started = Instant::now();
        let mut last = String::from("nothing observed yet");
        while started.elapsed() < timeout {
            match self.operator_process() {
                Ok(process) if process.pid != replaced => match self.operator_metrics(&process) {
                    Ok(metrics)
                        if metric_value(&metrics, "switchyard_operator_leader") == Some(1.0) =>
                    {
                        return Ok(process)
                    }
                    Ok(_) => last = format!("pid {:?} not leading yet", process.pid),
                    Err(error) => last = format!("pid {:?}: {error}", process.pid),
                },
                Ok(process) => last = format!("still pid {:?}", process.pid),
                Err(error) => last = error.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!("failed to see a new operator lead within {timeout:?}: {last}").into())
    }

    /// Adds (`true`) or removes (`false`) [`HOLD_FINALIZER`] on a kube-proxy pod.
    pub async fn hold_pod(&self, name: &str, hold: bool) -> Outcome<()> {
        let finalizers = if hold {
            serde_json::json!([HOLD_FINALIZER])
        } else {
            serde_json::Value::Null
        };
        let patch = serde_json::json!({"metadata": {"finalizers": finalizers}});
        self.kube_proxy_pods()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// The sum of the `count` of the Events with `reason` about `kind` `name` in `namespace`
    /// (the operator folds repeats of one Event into its count).
    pub async fn event_count(
        &self,
        namespace: &str,
        kind: &str,
        name: &str,
        reason: &str,
    ) -> Outcome<i32> {
        let events: Api<k8s_openapi::api::core::v1::Event> =
            Api::namespaced(self.client.clone(), namespace);
        Ok(events
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|event| {
                event.involved_object.kind.as_deref() == Some(kind)
                    && event.involved_object.name.as_deref() == Some(name)
                    && event.reason.as_deref() == Some(reason)
            })
            .map(|event| event.count.unwrap_or(1))
            .sum())
    }

    /// The count of matching Events once it exceeds `more_than`, or as it stands after
    /// `EVENT_WAIT`: the operator publishes Events from a queue, off the reconcile path, so
    /// one may land a moment after the status that reports the same step.
    pub async fn event_count_above(
        &self,
        namespace: &str,
        kind: &str,
        name: &str,
        reason: &str,
        more_than: i32,
    ) -> Outcome<i32> {
        let started = Instant::now();
        loop {
            let count = self.event_count(namespace, kind, name, reason).await?;
            if count > more_than || started.elapsed() >= EVENT_WAIT {
                return Ok(count);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// How long new traffic may take to be answered by every backend.
const TRAFFIC_START: Duration = Duration::from_secs(15);

/// How long a test waits for an Event the operator has queued.
const EVENT_WAIT: Duration = Duration::from_secs(15);

/// A plain HTTP/1.1 GET; the body.
pub fn http_get(address: SocketAddr, path: &str) -> Outcome<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: e2e\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or(answer))
}

/// The value of a Prometheus series (`name{labels}` as printed) in a metrics text.
pub fn metric_value(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?;
        rest.starts_with(' ').then(|| rest.trim().parse().ok())?
    })
}

/// The template's nodeSelector of a DaemonSet (empty when it has none).
pub fn node_selector(daemon_set: &DaemonSet) -> BTreeMap<String, String> {
    daemon_set
        .spec
        .as_ref()
        .and_then(|spec| spec.template.spec.as_ref())
        .and_then(|spec| spec.node_selector.clone())
        .unwrap_or_default()
}

async fn create_service(client: &Client) -> Outcome<Ipv4Addr> {
    let service: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": SERVICE_NAME, "namespace": "default"},
        "spec": {"type": "NodePort", "ports": [{
            "name": "http", "port": SERVICE_PORT, "targetPort": BACKEND_PORT,
            "protocol": "TCP", "nodePort": NODE_PORT,
        }]},
    }))?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let existing = services.get_opt(SERVICE_NAME).await?;
    let service = match existing {
        Some(existing) => existing,
        None => services.create(&PostParams::default(), &service).await?,
    };
    service
        .spec
        .and_then(|spec| spec.cluster_ip)
        .and_then(|ip| ip.parse().ok())
        .ok_or_else(|| "failed to get a ClusterIP for the demo Service".into())
}

impl World {
    /// node-1's netfilter conntrack entries towards the ClusterIP that carry no translation
    /// (their reply comes from the ClusterIP itself): a new connection reusing the source port
    /// of one follows it untranslated, out to the cluster's router ("net unreachable").
    pub fn untranslated_cluster_ip_flows(&self) -> String {
        let cluster_ip = self.cluster_ip.to_string();
        match switchyard_e2e::netns::run_in_namespace(
            "node-1",
            "conntrack",
            &["-L", "-p", "tcp", "--orig-dst", &cluster_ip],
        ) {
            Ok(listing) => listing
                .lines()
                .filter(|line| {
                    line.split_whitespace()
                        .filter(|field| field.starts_with("src="))
                        .nth(1)
                        .is_some_and(|reply_source| reply_source == format!("src={cluster_ip}"))
                })
                .collect::<Vec<_>>()
                .join("\n"),
            Err(error) => format!("(conntrack: {error})"),
        }
    }

    /// Fails the test when `report` shows anything but healthy traffic: a failed connection
    /// (a dead traffic worker included; with node-1's untranslated conntrack entries), a flow
    /// with fewer answers than [`minimum_answers`] for its duration (a generator that stalled
    /// would otherwise read as "no failures"), or a backend that never answered a flow.
    pub fn assert_traffic_healthy(&self, report: &TrafficReport, what: &str) {
        if report.failure_count() > 0 {
            panic!(
                "failed new connections, {what}\n{report}\nnode-1 conntrack entries to the ClusterIP without translation:\n{}",
                self.untranslated_cluster_ip_flows()
            );
        }
        let minimum = minimum_answers(report.duration);
        for (name, flow) in &report.flows {
            assert!(
                flow.successes >= minimum,
                "{what}: {name} answered only {} times in {:.1?} (at least {minimum} expected)\n{report}",
                flow.successes,
                report.duration
            );
            for backend in BACKENDS {
                assert!(
                    flow.backends.contains_key(backend),
                    "{what}: {name} never reached {backend}\n{report}"
                );
            }
        }
    }
}

/// The echo servers behind the demo Service.
pub const BACKENDS: [&str; 2] = ["backend-2", "backend-3"];

/// The fewest answers a flow of [`World::short_traffic`] (two workers, a connection every
/// 20 ms each: about 100 a second when healthy) must have over `duration`: 5 a second, at
/// least 20. Twenty times below the healthy rate, so two busy cores do not fail it; a
/// generator that stopped working fails it.
pub fn minimum_answers(duration: Duration) -> u64 {
    (duration.as_secs() * 5).max(20)
}

/// What kube-proxy left in a nat table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KubeProxyRules {
    /// `:KUBE-SVC-…` chains.
    pub service_chains: usize,
    /// Rules (`-A`) in chains named `KUBE-*`.
    pub kube_rules: usize,
    /// Whether the demo Service's rules are there (its comment `default/demo:http`).
    pub demo_service: bool,
}

impl KubeProxyRules {
    pub fn parse(dump: &str) -> Self {
        let mut rules = KubeProxyRules::default();
        for line in dump.lines() {
            if line.starts_with(":KUBE-SVC-") {
                rules.service_chains += 1;
            }
            if line.starts_with("-A KUBE-") {
                rules.kube_rules += 1;
            }
            if line.starts_with("-A KUBE-SVC-") && line.contains("default/demo:http") {
                rules.demo_service = true;
            }
        }
        rules
    }
}

/// A one-line view of a transition: phase, a progress bar, every node's state.
pub fn progress_line(
    config: Option<&DataplaneConfig>,
    nodes: &BTreeMap<String, DataplaneNode>,
    target: DataplaneMode,
) -> String {
    let phase = config
        .and_then(|config| config.status.as_ref())
        .map(|status| status.phase.to_string())
        .unwrap_or_else(|| "-".into());
    // Two steps a node: Ebpf serving, then cleaned (or told KubeProxy, then detached).
    let steps: usize = nodes
        .values()
        .map(|node| match target {
            DataplaneMode::Ebpf => {
                usize::from(is_serving(node))
                    + usize::from(is_serving(node) && node.spec.iptables_cleanup)
            }
            DataplaneMode::KubeProxy => {
                let told = node.spec.mode == DataplaneMode::KubeProxy;
                usize::from(told) + usize::from(told && is_detached(node))
            }
        })
        .sum();
    let serving = nodes.values().filter(|node| is_serving(node)).count();
    let total = nodes.len().max(1);
    let width = 24;
    let filled = steps * width / (2 * total);
    let bar: String = "#".repeat(filled) + &"-".repeat(width - filled);
    let per_node: Vec<String> = nodes
        .iter()
        .map(|(name, node)| {
            let state = if is_draining(node) {
                format!("draining({} flows)", live_flows(node))
            } else if is_serving(node) {
                if node.spec.iptables_cleanup {
                    "eBPF+cleaned".to_string()
                } else {
                    "eBPF".to_string()
                }
            } else if node.spec.mode == DataplaneMode::Ebpf {
                "activating".to_string()
            } else if is_detached(node) {
                "kube-proxy".to_string()
            } else {
                "switching".to_string()
            };
            format!("{name}={state}")
        })
        .collect();
    format!(
        "[{bar}] {phase:<19} serving {serving}/{total}  {}",
        per_node.join(" ")
    )
}
