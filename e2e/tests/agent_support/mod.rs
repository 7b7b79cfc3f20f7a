//! Shared setup and helpers of the agent scenarios (`make e2e-agent`): the CRDs,
//! the agent DaemonSet of `e2e/manifests/agent.yaml`, a DataplaneNode per node
//! (the test plays the operator), metrics and `/readyz` of an agent, and the pod
//! runner's view of the agent processes.

#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Node, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use switchyard_crds::{
    condition_types, find_condition, ConditionStatus, DataplaneMode, DataplaneNode,
    DataplaneNodeSpec,
};
use switchyard_e2e::cluster::{admin_client, ClusterPaths};
use switchyard_e2e::netns::NamespaceThread;
use switchyard_e2e::pod_runner::events::{read_events, EventKind, RunnerEvent};
use switchyard_e2e::traffic::{exchange_once, Timeouts};
use switchyard_e2e::wait::{wait_for, Check, WaitOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub const METRICS_PORT: u16 = 9964;
pub const BACKEND_PORT: u16 = 8080;
pub const SERVICE_PORT: u16 = 80;
pub const NODES: [&str; 3] = ["node-1", "node-2", "node-3"];

pub struct AgentCluster {
    pub paths: ClusterPaths,
    pub client: Client,
}

fn repository_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e/ is inside the repository")
        .to_path_buf()
}

fn kubectl(arguments: &[&str]) {
    let output = Command::new("kubectl")
        .args(arguments)
        .current_dir(repository_root())
        .output()
        .unwrap_or_else(|error| panic!("failed to run kubectl {arguments:?}: {error}"));
    assert!(
        output.status.success(),
        "kubectl {arguments:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Installs the CRDs and the agent DaemonSet (idempotent), gives every node a
/// DataplaneNode in `Ebpf` mode, and waits until every agent reports Ready.
pub async fn setup() -> AgentCluster {
    let paths = ClusterPaths::from_environment();
    let client = admin_client(&paths).await.expect("an admin client");
    kubectl(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        "crds/switchyard.dev_crds.yaml",
    ]);
    kubectl(&[
        "wait",
        "--for=condition=Established",
        "--timeout=30s",
        "crd/dataplanenodes.switchyard.dev",
    ]);
    let dataplane_nodes: Api<DataplaneNode> = Api::all(client.clone());
    for node in NODES {
        if dataplane_nodes.get_opt(node).await.expect("read").is_none() {
            let object = DataplaneNode::new(node, DataplaneNodeSpec::new(DataplaneMode::Ebpf));
            dataplane_nodes
                .create(&PostParams::default(), &object)
                .await
                .unwrap_or_else(|error| panic!("failed to create DataplaneNode {node}: {error}"));
        }
    }
    kubectl(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        "e2e/manifests/agent.yaml",
    ]);
    let cluster = AgentCluster { paths, client };
    for node in NODES {
        cluster
            .wait_agent_ready(node, Duration::from_secs(90))
            .await;
    }
    cluster
}

/// A Prometheus text exposition, parsed only as far as the tests need.
pub struct Metrics(pub String);

impl Metrics {
    /// The value of the sample `name` (with its labels, e.g. `x{map="frontends"}`).
    pub fn value(&self, name: &str) -> Option<f64> {
        self.0.lines().find_map(|line| {
            let (sample, value) = line.rsplit_once(' ')?;
            (sample == name).then(|| value.parse().ok()).flatten()
        })
    }

    pub fn required(&self, name: &str) -> f64 {
        self.value(name)
            .unwrap_or_else(|| panic!("metric {name} is missing from:\n{}", self.0))
    }
}

/// One HTTP/1.0 GET; the status code and body.
pub async fn http_get(address: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(address).await?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes())
            .await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        let text = String::from_utf8_lossy(&answer).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or(0);
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_string())
            .unwrap_or_default();
        Ok((status, body))
    };
    tokio::time::timeout(Duration::from_secs(2), attempt)
        .await
        .unwrap_or_else(|_| Err(std::io::Error::other("no answer within 2 s")))
}

impl AgentCluster {
    pub fn node_address(&self, node: &str) -> Ipv4Addr {
        self.paths
            .node_address(node)
            .expect("the node's address")
            .trim()
            .parse()
            .expect("an IPv4 address")
    }

    fn metrics_address(&self, node: &str) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(self.node_address(node), METRICS_PORT))
    }

    pub async fn metrics(&self, node: &str) -> std::io::Result<Metrics> {
        let (status, body) = http_get(self.metrics_address(node), "/metrics").await?;
        if status != 200 {
            return Err(std::io::Error::other(format!("/metrics answered {status}")));
        }
        Ok(Metrics(body))
    }

    /// `/readyz` of the agent on `node` (200 once its gate is open).
    pub async fn readyz(&self, node: &str) -> std::io::Result<u16> {
        http_get(self.metrics_address(node), "/readyz")
            .await
            .map(|(status, _)| status)
    }

    pub async fn dataplane_node(&self, node: &str) -> DataplaneNode {
        Api::<DataplaneNode>::all(self.client.clone())
            .get(node)
            .await
            .unwrap_or_else(|error| panic!("failed to read DataplaneNode {node}: {error}"))
    }

    /// Waits until the node's agent reports the condition with `status` (and,
    /// if given, `reason`) about the current spec.
    pub async fn wait_condition(
        &self,
        node: &str,
        type_: &str,
        status: ConditionStatus,
        reason: Option<&str>,
        timeout: Duration,
    ) {
        self.wait_reported(node, type_, status, reason, true, timeout)
            .await
    }

    /// As [`Self::wait_condition`]; `about_current_spec: false` also accepts a
    /// report about no spec yet (an agent whose gate never opened).
    pub async fn wait_reported(
        &self,
        node: &str,
        type_: &str,
        status: ConditionStatus,
        reason: Option<&str>,
        about_current_spec: bool,
        timeout: Duration,
    ) {
        let api: Api<DataplaneNode> = Api::all(self.client.clone());
        wait_for(
            &format!("see {node} report {type_}={status:?} {reason:?}"),
            WaitOptions::new(timeout).every(Duration::from_millis(200)),
            || {
                let api = api.clone();
                async move {
                    let object = api.get(node).await?;
                    let generation = object.metadata.generation;
                    let found = object.status.as_ref().and_then(|status| {
                        find_condition(&status.conditions, type_)
                            .cloned()
                            .map(|condition| (condition, status.observed_generation))
                    });
                    Ok::<_, kube::Error>(match found {
                        Some((condition, observed))
                            if condition.status == status
                                && reason.is_none_or(|reason| condition.reason == reason)
                                && (!about_current_spec || observed >= generation) =>
                        {
                            Check::Ready(())
                        }
                        other => Check::NotYet(format!("{other:?} (generation {generation:?})")),
                    })
                }
            },
        )
        .await
        .unwrap();
    }

    pub async fn wait_agent_ready(&self, node: &str, timeout: Duration) {
        self.wait_condition(
            node,
            condition_types::READY,
            ConditionStatus::True,
            None,
            timeout,
        )
        .await;
    }

    /// Sets the node's DataplaneNode spec fields (merge patch).
    pub async fn patch_spec(&self, node: &str, spec: serde_json::Value) {
        Api::<DataplaneNode>::all(self.client.clone())
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(&serde_json::json!({ "spec": spec })),
            )
            .await
            .unwrap_or_else(|error| panic!("failed to patch DataplaneNode {node}: {error}"));
    }

    /// The agent process running on `node` now, from the pod runner's events.
    pub fn running_agent(&self, node: &str) -> Option<RunnerEvent> {
        let events = read_events(&self.paths.pod_runner_events()).unwrap_or_default();
        let mut running: Option<RunnerEvent> = None;
        for event in events
            .into_iter()
            .filter(|event| event.container == "agent" && event.node == node)
        {
            match event.kind {
                EventKind::Started => running = Some(event),
                EventKind::Exited
                    if running.as_ref().is_some_and(|current| {
                        current.pod_uid == event.pod_uid && current.pid == event.pid
                    }) =>
                {
                    running = None;
                }
                _ => {}
            }
        }
        running
    }

    /// Waits for an agent process on `node` other than `previous_pid` and its
    /// `/readyz` 200; returns the new process's event and how long it took.
    pub async fn wait_new_agent_ready(
        &self,
        node: &str,
        previous_pid: Option<u32>,
        timeout: Duration,
    ) -> (RunnerEvent, Duration) {
        let started = Instant::now();
        let event = wait_for(
            &format!("see a new agent process on {node}"),
            WaitOptions::new(timeout).every(Duration::from_millis(100)),
            || {
                let running = self.running_agent(node);
                async move {
                    Ok::<_, String>(match running {
                        Some(event) if event.pid != previous_pid => Check::Ready(event),
                        other => Check::NotYet(format!("running: {other:?}")),
                    })
                }
            },
        )
        .await
        .unwrap();
        wait_for(
            &format!("see the new agent on {node} ready"),
            WaitOptions::new(timeout).every(Duration::from_millis(100)),
            || async {
                Ok::<_, String>(match self.readyz(node).await {
                    Ok(200) => Check::Ready(()),
                    other => Check::NotYet(format!("/readyz: {other:?}")),
                })
            },
        )
        .await
        .unwrap();
        (event, started.elapsed())
    }

    /// A NodePort (or ClusterIP, without `node_port`) Service without selector.
    pub async fn create_service(&self, name: &str, node_port: Option<u16>) -> Ipv4Addr {
        let mut port = serde_json::json!({"name": "http", "port": SERVICE_PORT, "targetPort": BACKEND_PORT, "protocol": "TCP"});
        if let Some(node_port) = node_port {
            port["nodePort"] = node_port.into();
        }
        let service: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"type": if node_port.is_some() { "NodePort" } else { "ClusterIP" }, "ports": [port]},
        }))
        .expect("a valid Service");
        let services: Api<Service> = Api::namespaced(self.client.clone(), "default");
        let _ = services.delete(name, &DeleteParams::default()).await;
        let created = services
            .create(&PostParams::default(), &service)
            .await
            .unwrap_or_else(|error| panic!("failed to create Service {name}: {error}"));
        created
            .spec
            .and_then(|spec| spec.cluster_ip)
            .and_then(|ip| ip.parse().ok())
            .expect("the Service got a ClusterIP")
    }

    pub async fn nodes_ready(&self) {
        wait_for(
            "see 3 nodes",
            WaitOptions::new(Duration::from_secs(60)),
            || async {
                let nodes = Api::<Node>::all(self.client.clone())
                    .list(&ListParams::default())
                    .await?;
                Ok::<_, kube::Error>(if nodes.items.len() == 3 {
                    Check::Ready(())
                } else {
                    Check::NotYet(format!("{} nodes", nodes.items.len()))
                })
            },
        )
        .await
        .unwrap();
    }
}

/// Polls one connection at a time from `source` to `destination` until
/// `accept` says yes; returns how long that took.
pub async fn time_until<F>(
    description: &str,
    source: &NamespaceThread,
    destination: SocketAddr,
    timeout: Duration,
    accept: F,
) -> Duration
where
    F: Fn(&Result<String, switchyard_e2e::traffic::FailureCause>) -> bool,
{
    let started = Instant::now();
    let timeouts = Timeouts {
        connect: Duration::from_millis(300),
        reply: Duration::from_millis(500),
    };
    loop {
        let outcome = exchange_once(source, destination, timeouts).await;
        if accept(&outcome) {
            return started.elapsed();
        }
        if started.elapsed() > timeout {
            panic!("failed to {description} within {timeout:?}; last outcome: {outcome:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs a command inside a named network namespace of the cluster; panics on failure.
pub fn in_namespace(namespace: &str, program: &str, arguments: &[&str]) -> String {
    switchyard_e2e::netns::run_in_namespace(namespace, program, arguments)
        .unwrap_or_else(|error| panic!("{error}"))
}

/// The component the agent names in its Events (`switchyard_agent::cluster::events_writer`).
pub const AGENT_EVENT_COMPONENT: &str = "switchyard-agent";

/// Events counted by reason: an Event repeated bumps its `count` instead of making another.
pub type EventCounts = std::collections::BTreeMap<String, i32>;

pub fn count_by_reason(events: &[Event]) -> EventCounts {
    let mut counts = EventCounts::new();
    for event in events {
        *counts
            .entry(event.reason.clone().unwrap_or_default())
            .or_default() += event.count.unwrap_or(1);
    }
    counts
}

impl AgentCluster {
    /// The agent's core/v1 Events about `node`'s DataplaneNode. They live in `default`, the
    /// namespace of Events about cluster-scoped objects.
    pub async fn agent_events(&self, node: &str) -> Result<Vec<Event>, kube::Error> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), "default");
        let selector = format!("involvedObject.kind=DataplaneNode,involvedObject.name={node}");
        Ok(events
            .list(&ListParams::default().fields(&selector))
            .await?
            .items
            .into_iter()
            .filter(|event| event.reporting_component.as_deref() == Some(AGENT_EVENT_COMPONENT))
            .collect())
    }

    pub async fn agent_event_counts(&self, node: &str) -> EventCounts {
        let events = self
            .agent_events(node)
            .await
            .unwrap_or_else(|error| panic!("failed to list the Events about {node}: {error}"));
        count_by_reason(&events)
    }

    /// Waits until the agent has recorded an Event of `reason` about `node` beyond the counts
    /// of `before` (a new one, or a repeat of an earlier one), and asserts its shape (see
    /// [`Self::assert_agent_event_shape`]) and its type (`Normal` or `Warning`).
    pub async fn expect_agent_event(
        &self,
        node: &str,
        reason: &str,
        type_: &str,
        before: &EventCounts,
        timeout: Duration,
    ) {
        let event = self.wait_agent_event(node, reason, before, timeout).await;
        self.assert_agent_event_shape(node, &event, type_).await;
    }

    /// Waits until the agent has recorded an Event of `reason` about `node` beyond the counts
    /// of `before` (a new one, or a repeat of an earlier one); that Event.
    pub async fn wait_agent_event(
        &self,
        node: &str,
        reason: &str,
        before: &EventCounts,
        timeout: Duration,
    ) -> Event {
        let already = before.get(reason).copied().unwrap_or(0);
        wait_for(
            &format!("see the agent on {node} record a {reason} Event"),
            WaitOptions::new(timeout).every(Duration::from_millis(250)),
            || async move {
                let events = self.agent_events(node).await?;
                let counts = count_by_reason(&events);
                Ok::<_, kube::Error>(if counts.get(reason).copied().unwrap_or(0) > already {
                    let newest = events
                        .into_iter()
                        .filter(|event| event.reason.as_deref() == Some(reason))
                        .max_by_key(|event| event.last_timestamp.clone().map(|time| time.0));
                    match newest {
                        Some(event) => Check::Ready(event),
                        None => Check::NotYet(format!("{counts:?}")),
                    }
                } else {
                    Check::NotYet(format!("the agent's Events by reason: {counts:?}"))
                })
            },
        )
        .await
        .unwrap()
    }

    /// Asserts what every Event of the agent must be to reach a 1.20 API server and to be
    /// found from its DataplaneNode: about that very object (its UID), in `default`, without
    /// `eventTime`, from the agent on that node.
    pub async fn assert_agent_event_shape(&self, node: &str, event: &Event, type_: &str) {
        let object = self.dataplane_node(node).await;
        assert_eq!(event.type_.as_deref(), Some(type_), "{event:?}");
        assert_eq!(event.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(event.event_time, None, "{event:?}");
        assert_eq!(event.involved_object.uid, object.metadata.uid, "{event:?}");
        assert_eq!(
            event.involved_object.api_version.as_deref(),
            Some("switchyard.dev/v1alpha1")
        );
        assert_eq!(
            event
                .source
                .as_ref()
                .and_then(|source| source.host.as_deref()),
            Some(node),
            "{event:?}"
        );
    }
}
