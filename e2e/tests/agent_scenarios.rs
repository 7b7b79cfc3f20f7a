//! The agent in a real cluster (issue 5's scenarios), under continuous traffic
//! counting failed connections. One 3-node cluster for all of them:
//! `make e2e-agent` starts it, runs this binary inside it with one test thread,
//! and tears it down. The tests play the operator: they write DataplaneNodes.
//!
//! Topology of every scenario: echo backends in pod namespaces on node-2 and
//! node-3, a client pod on node-1 hitting a ClusterIP, an external namespace on
//! the bridge hitting node-1's NodePort; node-1's agent is the one disturbed.

mod agent_support;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use agent_support::*;
use chrono::Timelike;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::Api;
use switchyard_crds::{condition_types, reasons, ConditionStatus};
use switchyard_e2e::netns::TestNamespace;
use switchyard_e2e::objects::{
    create_kube_proxy_daemonset, endpoint_slice_v1beta1, endpoint_slices_v1beta1, Endpoint,
};
use switchyard_e2e::traffic::{
    EchoServer, Flow, FlowMode, Timeouts, TrafficGenerator, TrafficReport,
};
use switchyard_e2e::wait::{hold_for, wait_for, Check, WaitOptions};

/// Backends, a client pod and an outside client, and a NodePort Service.
struct World {
    cluster: AgentCluster,
    client_pod: TestNamespace,
    backend_2: TestNamespace,
    backend_3: TestNamespace,
    outside: TestNamespace,
    servers: Vec<EchoServer>,
    cluster_ip: Ipv4Addr,
    node_port: u16,
    service: String,
    /// When the setup last wrote the Service's EndpointSlice (the agent syncs after it).
    slice_written_at: chrono::DateTime<chrono::Utc>,
}

impl World {
    /// `tag` (at most 6 characters) keeps the namespaces of scenarios apart;
    /// `number` picks host numbers and the NodePort.
    async fn new(tag: &str, number: u8) -> World {
        let cluster = setup().await;
        let client_pod = TestNamespace::pod(1, &format!("{tag}-cl"), 10 + number).unwrap();
        let backend_2 = TestNamespace::pod(2, &format!("{tag}-b2"), 10 + number).unwrap();
        let backend_3 = TestNamespace::pod(3, &format!("{tag}-b3"), 10 + number).unwrap();
        let outside = TestNamespace::external(&format!("{tag}-x"), 100 + number).unwrap();
        let any = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, BACKEND_PORT));
        let servers = vec![
            EchoServer::start(&backend_2.thread().unwrap(), any, "backend-2")
                .await
                .unwrap(),
            EchoServer::start(&backend_3.thread().unwrap(), any, "backend-3")
                .await
                .unwrap(),
        ];
        let service = format!("{tag}-svc");
        let node_port = 30100 + u16::from(number);
        let cluster_ip = cluster.create_service(&service, Some(node_port)).await;
        let world = World {
            cluster,
            client_pod,
            backend_2,
            backend_3,
            outside,
            servers,
            cluster_ip,
            node_port,
            service,
            slice_written_at: chrono::Utc::now(),
        };
        world.write_slice(true, true).await;
        // Served on node-1 from both sides before the scenario starts.
        for (source, destination) in [
            (
                world.client_pod.thread().unwrap(),
                world.cluster_ip_address(),
            ),
            (world.outside.thread().unwrap(), world.node_port_address()),
        ] {
            time_until(
                "reach the Service through node-1",
                &source,
                destination,
                Duration::from_secs(30),
                |outcome| outcome.is_ok(),
            )
            .await;
        }
        world
    }

    fn cluster_ip_address(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(self.cluster_ip, SERVICE_PORT))
    }

    fn node_port_address(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(
            self.cluster.node_address("node-1"),
            self.node_port,
        ))
    }

    async fn write_slice(&self, on_node_2: bool, on_node_3: bool) {
        let mut endpoints = Vec::new();
        if on_node_2 {
            endpoints.push(Endpoint {
                address: self.backend_2.address,
                node: "node-2".into(),
            });
        }
        if on_node_3 {
            endpoints.push(Endpoint {
                address: self.backend_3.address,
                node: "node-3".into(),
            });
        }
        let name = format!("{}-1", self.service);
        let slice = endpoint_slice_v1beta1(
            "default",
            &name,
            &self.service,
            "http",
            BACKEND_PORT,
            &endpoints,
        )
        .unwrap();
        let slices = endpoint_slices_v1beta1(&self.cluster.client, "default");
        slices
            .patch(
                &name,
                &PatchParams::apply("switchyard-e2e").force(),
                &Patch::Apply(&slice),
            )
            .await
            .unwrap();
    }

    /// [`Self::traffic`], returned once both backends have answered every flow (so that what
    /// follows is done under traffic known to work).
    async fn traffic_flowing(&self) -> TrafficGenerator {
        let generator = self.traffic();
        wait_for(
            "see both backends answer every flow",
            WaitOptions::new(Duration::from_secs(15)).every(Duration::from_millis(50)),
            || {
                let report = generator.snapshot();
                async move {
                    let flowing = report.flows.values().all(|flow| {
                        ["backend-2", "backend-3"]
                            .iter()
                            .all(|backend| flow.backends.contains_key(*backend))
                    });
                    Ok::<_, String>(if report.failure_count() > 0 {
                        Check::Failed(format!("{report}"))
                    } else if flowing {
                        Check::Ready(())
                    } else {
                        Check::NotYet(format!("{report}"))
                    })
                }
            },
        )
        .await
        .unwrap();
        generator
    }

    /// ClusterIP from the client pod and node-1's NodePort from outside.
    fn traffic(&self) -> TrafficGenerator {
        let short = FlowMode::ShortConnections {
            interval: Duration::from_millis(20),
            workers: 2,
        };
        TrafficGenerator::start(
            vec![
                Flow {
                    name: "client pod -> ClusterIP".into(),
                    source: self.client_pod.thread().unwrap(),
                    destination: self.cluster_ip_address(),
                    mode: short,
                },
                Flow {
                    name: "outside -> node-1 NodePort".into(),
                    source: self.outside.thread().unwrap(),
                    destination: self.node_port_address(),
                    mode: short,
                },
            ],
            Timeouts::default(),
        )
    }

    async fn finish(self) {
        let services: Api<Service> = Api::namespaced(self.cluster.client.clone(), "default");
        let _ = services
            .delete(&self.service, &DeleteParams::default())
            .await;
        let _ = endpoint_slices_v1beta1(&self.cluster.client, "default")
            .delete(&format!("{}-1", self.service), &DeleteParams::default())
            .await;
        for server in self.servers {
            server.stop().await;
        }
    }
}

fn assert_no_failures(report: &TrafficReport, what: &str) {
    println!("{what}: {report}");
    assert_eq!(
        report.failure_count(),
        0,
        "{what}: failed connections\n{report}"
    );
    for (name, flow) in &report.flows {
        assert!(
            flow.successes >= 50,
            "{what}: {name} made too few connections\n{report}"
        );
        for backend in ["backend-2", "backend-3"] {
            assert!(
                flow.backends.contains_key(backend),
                "{what}: {name} never reached {backend}\n{report}"
            );
        }
    }
}

fn kill(pid: u32, signal: i32) {
    // SAFETY: kill(2) on a pid the pod runner reported for our agent.
    let result = unsafe { libc::kill(pid as i32, signal) };
    assert_eq!(result, 0, "kill {pid}: {}", std::io::Error::last_os_error());
}

/// Scenario 1: five restarts of node-1's agent (twice SIGKILL, three times by
/// deleting its pod: SIGTERM and a new pod) under traffic: zero failures, and
/// the restarted agents attach nothing and write nothing.
#[tokio::test]
#[ignore = "needs the e2e cluster: make e2e-agent"]
async fn an_agent_restarted_five_times_twice_killed_drops_no_connection() {
    let world = World::new("rs", 1).await;
    let cluster = &world.cluster;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "kube-system");
    let ready_since = |status: &switchyard_crds::DataplaneNodeStatus| {
        switchyard_crds::find_condition(&status.conditions, condition_types::READY)
            .map(|condition| condition.last_transition_time)
    };
    let before = cluster
        .dataplane_node("node-1")
        .await
        .status
        .unwrap_or_default();
    let generator = world.traffic_flowing().await;
    for round in 1..=5 {
        let current = cluster
            .running_agent("node-1")
            .expect("an agent runs on node-1");
        let pid = current.pid.expect("the runner reports pids");
        let killed = round == 2 || round == 4;
        if killed {
            kill(pid, libc::SIGKILL);
        } else {
            pods.delete(&current.pod, &DeleteParams::default())
                .await
                .unwrap();
        }
        let (started, took) = cluster
            .wait_new_agent_ready("node-1", Some(pid), Duration::from_secs(60))
            .await;
        println!(
            "restart {round} ({}): new agent pid {:?} ready after {took:.1?}",
            if killed {
                "SIGKILL"
            } else {
                "pod deleted, SIGTERM"
            },
            started.pid
        );
        // A deliberate traffic window: the new agent serves alone for a second before the next
        // restart; the report asserted below covers all of it.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let report = generator.stop().await;
    let metrics = cluster.metrics("node-1").await.unwrap();
    let attaches = metrics.required("switchyard_agent_program_attach_total");
    let writes = metrics.required("switchyard_agent_map_operations_total");
    println!("last agent: program attaches {attaches}, map operations {writes}");
    let dataplane_node = cluster.dataplane_node("node-1").await;
    let status = dataplane_node.status.clone().unwrap_or_default();
    println!(
        "node-1's DataplaneNode status: {}",
        serde_json::to_string_pretty(&status).unwrap_or_default()
    );
    assert_no_failures(&report, "five restarts of node-1's agent");
    assert_eq!(
        ready_since(&status),
        ready_since(&before),
        "Ready changed during the restarts"
    );
    assert_eq!(
        status.observed_generation,
        dataplane_node.metadata.generation
    );
    assert_eq!(status.agent_version.as_deref(), Some("0.1.0"));
    assert!(status
        .agent_revision
        .as_deref()
        .is_some_and(|revision| !revision.is_empty()));
    assert!(status.services_programmed.unwrap_or(0) >= 4, "{status:?}");
    assert!(status.last_sync_time.is_some());
    for type_ in [
        condition_types::HOST_METADATA_READY,
        condition_types::PROGRAMS_ATTACHED,
        condition_types::SERVICES_SYNCED,
        condition_types::CHAIN_ORDER_SAFE,
        condition_types::READY,
    ] {
        assert!(
            status.condition_is_true(type_),
            "{type_} is not True: {status:?}"
        );
    }
    for type_ in [
        condition_types::DRAINING,
        condition_types::KUBE_PROXY_RULES_PRESENT,
    ] {
        assert!(
            switchyard_crds::condition_is_false(&status.conditions, type_),
            "{type_} is not False: {status:?}"
        );
    }
    // With the chart's capabilities (no SYS_ADMIN) the agent cannot look the attached
    // program up by its id, so it updates each pinned link in place to its identical new
    // program (an atomic replacement, loader/src/attach.rs: `is_attached_as`): at most one
    // counted attach per served interface (eth0 and the client pod's), never a new link.
    assert!(
        attaches <= 2.0,
        "a restarted agent attached {attaches} times on node-1's two interfaces"
    );
    assert_eq!(writes, 0.0, "a restarted agent rewrote its maps");
    world.finish().await;
}

/// Scenario 6: a Service and its EndpointSlices created, scaled and deleted are
/// served within 2 s of each change and gone within 2 s of deletion.
#[tokio::test]
#[ignore = "needs the e2e cluster: make e2e-agent"]
async fn a_service_created_scaled_and_deleted_is_served_and_gone_within_two_seconds() {
    let world = World::new("sv", 2).await;
    let cluster = &world.cluster;
    let client = world.client_pod.thread().unwrap();
    let name = "sv-new";
    let slice_name = "sv-new-1";
    let slices = endpoint_slices_v1beta1(&cluster.client, "default");
    let _ = slices.delete(slice_name, &DeleteParams::default()).await;

    let created = Instant::now();
    let cluster_ip = cluster.create_service(name, None).await;
    let only_backend_2 = endpoint_slice_v1beta1(
        "default",
        slice_name,
        name,
        "http",
        BACKEND_PORT,
        &[Endpoint {
            address: world.backend_2.address,
            node: "node-2".into(),
        }],
    )
    .unwrap();
    slices
        .create(&PostParams::default(), &only_backend_2)
        .await
        .unwrap();
    let destination = SocketAddr::V4(SocketAddrV4::new(cluster_ip, SERVICE_PORT));
    time_until(
        "reach the new Service",
        &client,
        destination,
        Duration::from_secs(10),
        |o| o.is_ok(),
    )
    .await;
    let reachable = created.elapsed();

    let scaled = Instant::now();
    let both = endpoint_slice_v1beta1(
        "default",
        slice_name,
        name,
        "http",
        BACKEND_PORT,
        &[
            Endpoint {
                address: world.backend_2.address,
                node: "node-2".into(),
            },
            Endpoint {
                address: world.backend_3.address,
                node: "node-3".into(),
            },
        ],
    )
    .unwrap();
    slices
        .patch(
            slice_name,
            &PatchParams::apply("switchyard-e2e").force(),
            &Patch::Apply(&both),
        )
        .await
        .unwrap();
    time_until(
        "reach the added backend",
        &client,
        destination,
        Duration::from_secs(10),
        |o| o.as_deref() == Ok("backend-3"),
    )
    .await;
    let scaled_up = scaled.elapsed();

    let deleted = Instant::now();
    Api::<Service>::namespaced(cluster.client.clone(), "default")
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    slices
        .delete(slice_name, &DeleteParams::default())
        .await
        .unwrap();
    time_until(
        "see the deleted Service gone",
        &client,
        destination,
        Duration::from_secs(10),
        |o| o.is_err(),
    )
    .await;
    let gone = deleted.elapsed();
    // Gone for good: three more attempts fail.
    for _ in 0..3 {
        let outcome =
            switchyard_e2e::traffic::exchange_once(&client, destination, Timeouts::default()).await;
        assert!(
            outcome.is_err(),
            "the deleted Service answered: {outcome:?}"
        );
    }
    println!(
        "Service created -> reachable {reachable:.2?}; scaled -> new backend {scaled_up:.2?}; deleted -> gone {gone:.2?}"
    );
    assert!(
        reachable <= Duration::from_secs(2),
        "reachable after {reachable:?}"
    );
    assert!(
        scaled_up <= Duration::from_secs(2),
        "new backend after {scaled_up:?}"
    );
    assert!(gone <= Duration::from_secs(2), "gone after {gone:?}");
    world.finish().await;
}

/// Scenario 3: the Node is patched every second for three minutes (status
/// heartbeats and conditions, an unrelated annotation: 180 updates, as the issue
/// asks, since a 1.20 kubelet writes Node status only every 5 minutes). At least
/// 150 updates are ignored, with zero
/// attaches and zero map writes; then an address added to node-1's eth0 and its
/// Node is served on its NodePort within 2 s.
#[tokio::test]
#[ignore = "needs the e2e cluster: make e2e-agent"]
async fn node_churn_is_ignored_and_a_new_node_address_is_served_within_two_seconds() {
    let world = World::new("nc", 3).await;
    let cluster = &world.cluster;
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    // The status write of the setup's last sync lands, and is counted, first: node-1's status
    // reports a sync in or after the second the setup wrote the EndpointSlice (the time is
    // written to the second), and neither the agent's count of status writes nor the
    // DataplaneNode has changed between two polls 1.5 s apart (the agent counts a write at its
    // next round, at most a second after it: a write seen at the first poll is counted by the
    // second).
    let dataplane_nodes: Api<switchyard_crds::DataplaneNode> = Api::all(cluster.client.clone());
    let slice_second = world
        .slice_written_at
        .with_nanosecond(0)
        .unwrap_or(world.slice_written_at);
    let previous = std::sync::Mutex::new(None);
    wait_for(
        "see node-1's status report the setup's last sync, with no status write after it",
        WaitOptions::new(Duration::from_secs(20)).every(Duration::from_millis(1500)),
        || async {
            let object = dataplane_nodes.get("node-1").await.map_err(|error| error.to_string())?;
            let writes = cluster
                .metrics("node-1")
                .await
                .map_err(|error| error.to_string())?
                .required("switchyard_agent_status_writes_total");
            let synced = object.status.as_ref().and_then(|status| status.last_sync_time);
            let now = (writes, object.metadata.resource_version.clone());
            let unchanged = previous
                .lock()
                .map(|mut previous| previous.replace(now.clone()) == Some(now.clone()))
                .unwrap_or(false);
            Ok::<_, String>(match synced {
                Some(at) if at >= slice_second && unchanged => Check::Ready(()),
                other => Check::NotYet(format!(
                    "last sync {other:?}, EndpointSlice written at {}; status writes and resourceVersion {now:?} (unchanged since the poll before: {unchanged})",
                    world.slice_written_at
                )),
            })
        },
    )
    .await
    .unwrap();
    let before = cluster.metrics("node-1").await.unwrap();
    let generator = world.traffic();
    let patches = 180;
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    for index in 0..patches {
        ticker.tick().await;
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        if index % 2 == 0 {
            nodes
                .patch(
                    "node-1",
                    &PatchParams::default(),
                    &Patch::Merge(&serde_json::json!({
                        "metadata": {"annotations": {"switchyard.dev/e2e-churn": index.to_string()}}
                    })),
                )
                .await
                .unwrap();
        } else {
            nodes
                .patch_status(
                    "node-1",
                    &PatchParams::default(),
                    &Patch::Strategic(serde_json::json!({
                        "status": {"conditions": [{
                            "type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": format!("kubelet is posting ready status (churn {index})"),
                            "lastHeartbeatTime": now
                        }]}
                    })),
                )
                .await
                .unwrap();
        }
    }
    // The agent has taken in the updates before they are counted.
    let ignored_before = before.required("switchyard_agent_node_updates_ignored_total");
    let after = wait_for(
        "see node-1's agent ignore at least 150 of the Node updates",
        WaitOptions::new(Duration::from_secs(15)).every(Duration::from_millis(100)),
        || async {
            let metrics = cluster.metrics("node-1").await?;
            let ignored = metrics.required("switchyard_agent_node_updates_ignored_total");
            Ok::<_, std::io::Error>(if ignored - ignored_before >= 150.0 {
                Check::Ready(metrics)
            } else {
                Check::NotYet(format!("{} ignored", ignored - ignored_before))
            })
        },
    )
    .await
    .unwrap();
    let delta = |name: &str| after.required(name) - before.required(name);
    let ignored = delta("switchyard_agent_node_updates_ignored_total");
    let attaches = delta("switchyard_agent_program_attach_total");
    let writes = delta("switchyard_agent_map_operations_total");
    let status_writes = delta("switchyard_agent_status_writes_total");
    // The disruption report is published at a bounded rate whatever the Nodes do (the canary
    // soak reads its windows): those writes change nothing else and are counted apart.
    let disruption_writes = delta("switchyard_agent_status_writes_disruption_only_total");
    println!("{patches} Node patches: {ignored} ignored updates, {attaches} attaches, {writes} map operations, {status_writes} status writes ({disruption_writes} with only a new disruption report)");
    assert_eq!(
        status_writes - disruption_writes,
        0.0,
        "the status was rewritten without a change"
    );
    assert!(ignored >= 150.0, "only {ignored} Node updates ignored");
    assert_eq!(attaches, 0.0);
    assert_eq!(writes, 0.0);

    // One change that matters: a new address on node-1's external interface
    // and in its Node's status.
    let new_address = "10.99.0.111";
    let changed = Instant::now();
    in_namespace(
        "node-1",
        "ip",
        &["addr", "add", &format!("{new_address}/24"), "dev", "eth0"],
    );
    let node_1 = cluster.node_address("node-1").to_string();
    nodes
        .patch_status(
            "node-1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({
                "status": {"addresses": [
                    {"type": "InternalIP", "address": node_1},
                    {"type": "InternalIP", "address": new_address},
                    {"type": "Hostname", "address": "node-1"}
                ]}
            })),
        )
        .await
        .unwrap();
    let destination = SocketAddr::V4(SocketAddrV4::new(
        new_address.parse().unwrap(),
        world.node_port,
    ));
    let outside = world.outside.thread().unwrap();
    time_until(
        "reach the NodePort on the new address",
        &outside,
        destination,
        Duration::from_secs(10),
        |o| o.is_ok(),
    )
    .await;
    let served = changed.elapsed();
    let report = generator.stop().await;
    in_namespace(
        "node-1",
        "ip",
        &["addr", "del", &format!("{new_address}/24"), "dev", "eth0"],
    );
    println!("new node address served on its NodePort after {served:.2?}");
    assert!(served <= Duration::from_secs(2), "served after {served:?}");
    assert_no_failures(&report, "Node churn");
    world.finish().await;
}

/// Scenario 2: node-1's agent killed and started while the API server is
/// unreachable from node-1 for 20 s: the previous entries keep serving (zero
/// failures), the new agent is not ready and writes nothing until its gate opens
/// once the API server is back.
#[tokio::test]
#[ignore = "needs the e2e cluster: make e2e-agent"]
async fn an_agent_starting_while_the_api_server_is_unreachable_writes_nothing_and_drops_nothing() {
    let world = World::new("ap", 4).await;
    let cluster = &world.cluster;
    let block = [
        "OUTPUT",
        "-p",
        "tcp",
        "-d",
        "10.99.0.1",
        "--dport",
        "6443",
        "-j",
        "REJECT",
        "--reject-with",
        "tcp-reset",
    ];
    let insert: Vec<&str> = ["-w", "-I"].iter().copied().chain(block).collect();
    let delete: Vec<&str> = ["-w", "-D"].iter().copied().chain(block).collect();
    let generator = world.traffic();
    let current = cluster.running_agent("node-1").expect("an agent runs");
    in_namespace("node-1", "iptables", &insert);
    let blocked = Instant::now();
    kill(current.pid.expect("a pid"), libc::SIGKILL);
    let mut samples = Vec::new();
    // Sampled every 2 s over the whole 20 s outage; every sample is asserted below.
    while blocked.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_secs(2)).await;
        if let (Ok(readyz), Ok(metrics)) = (
            cluster.readyz("node-1").await,
            cluster.metrics("node-1").await,
        ) {
            samples.push((
                blocked.elapsed(),
                readyz,
                metrics.required("switchyard_agent_map_operations_total"),
                metrics.required("switchyard_agent_gate_wait_seconds"),
            ));
        }
    }
    in_namespace("node-1", "iptables", &delete);
    let unblocked = Instant::now();
    let (_, took) = cluster
        .wait_new_agent_ready("node-1", current.pid, Duration::from_secs(60))
        .await;
    let metrics = cluster.metrics("node-1").await.unwrap();
    // A deliberate traffic window: a second served by the agent whose gate just opened; the
    // report asserted below covers it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let report = generator.stop().await;
    for (at, readyz, writes, waited) in &samples {
        println!("at {at:.1?} of the outage: /readyz {readyz}, map operations {writes}, gate waited {waited:.1} s");
    }
    println!(
        "gate open {:.1?} after the API server came back ({took:.1?} waiting for ready); map operations then: {}, gate wait {} s",
        unblocked.elapsed(),
        metrics.required("switchyard_agent_map_operations_total"),
        metrics.required("switchyard_agent_gate_wait_seconds"),
    );
    assert!(
        samples.len() >= 5,
        "the new agent's metrics did not answer during the outage: {samples:?}"
    );
    for (at, readyz, writes, _) in &samples {
        assert_eq!(*readyz, 503, "ready at {at:?} without the API server");
        assert_eq!(*writes, 0.0, "a map write at {at:?} before the gate opened");
    }
    assert_no_failures(&report, "agent start with the API server unreachable");
    world.finish().await;
}

fn kube_proxy_rule_count(node: &str) -> usize {
    in_namespace(node, "iptables-save", &[])
        .lines()
        .filter(|line| {
            line.starts_with("-A KUBE-SERVICES")
                || line.starts_with("-A KUBE-SVC-")
                || line.starts_with("-A KUBE-SEP-")
                || line.starts_with("-A KUBE-NODEPORTS")
        })
        .count()
}

/// Scenarios 4 and 5: kube-proxy started after the agent on nodes that serve
/// from eBPF: traffic keeps working and the agent's chains stay first. Then
/// `iptablesCleanup` with kube-proxy running: conflict reported, its rule count
/// stable (no flapping) for 60 s; with kube-proxy gone: every Service chain
/// removed, traffic unharmed throughout. Each step is an Event of the agent on
/// the DataplaneNode (conflict, rules cleaned, cleanup stopped), and no
/// rules-cleaned Event comes while kube-proxy runs.
#[tokio::test]
#[ignore = "needs the e2e cluster: make e2e-agent"]
async fn kube_proxy_started_after_the_agent_breaks_nothing_and_is_cleaned_only_once_gone() {
    let world = World::new("kp", 5).await;
    let cluster = &world.cluster;
    let generator = world.traffic();
    create_kube_proxy_daemonset(&cluster.client).await.unwrap();
    // kube-proxy writes its rules, then binds its healthz (the agent must not
    // hold the port while kube-proxy's rules are there).
    cluster
        .wait_condition(
            "node-1",
            condition_types::KUBE_PROXY_HEALTHY,
            ConditionStatus::True,
            None,
            Duration::from_secs(60),
        )
        .await;
    cluster
        .wait_condition(
            "node-1",
            condition_types::CHAIN_ORDER_SAFE,
            ConditionStatus::True,
            None,
            Duration::from_secs(10),
        )
        .await;
    // A deliberate traffic window: 3 s with kube-proxy's rules beside the agent's; the
    // report asserted below covers it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let report = generator.stop().await;
    let rules = kube_proxy_rule_count("node-1");
    println!("kube-proxy started after the agent: {rules} kube-proxy rules on node-1");
    assert!(rules > 0, "kube-proxy wrote no rules");
    assert_no_failures(&report, "kube-proxy started after the agent");

    // Cleanup requested while kube-proxy runs: refused, reported, stable.
    let generator = world.traffic();
    let events_before_cleanup = cluster.agent_event_counts("node-1").await;
    cluster
        .patch_spec("node-1", serde_json::json!({"iptablesCleanup": true}))
        .await;
    cluster
        .wait_condition(
            "node-1",
            condition_types::KUBE_PROXY_RULES_PRESENT,
            ConditionStatus::True,
            Some(reasons::KUBE_PROXY_CONFLICT),
            Duration::from_secs(15),
        )
        .await;
    // Sampled every 2 s for 60 s; every sample is asserted below.
    let mut counts = Vec::new();
    for _ in 0..30 {
        counts.push(kube_proxy_rule_count("node-1"));
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    println!("kube-proxy rules on node-1 every 2 s with cleanup requested and kube-proxy running: {counts:?}");
    assert!(
        counts.iter().all(|count| *count == counts[0] && *count > 0),
        "kube-proxy's rules flapped: {counts:?}"
    );
    // The refusal is an Event on the DataplaneNode; a cleaning one is not, while kube-proxy runs
    // (the control for the rules-cleaned Event below).
    cluster
        .expect_agent_event(
            "node-1",
            "KubeProxyConflict",
            "Warning",
            &events_before_cleanup,
            Duration::from_secs(15),
        )
        .await;
    let events_while_refused = cluster.agent_event_counts("node-1").await;
    assert_eq!(
        events_while_refused.get("KubeProxyRulesCleaned"),
        events_before_cleanup.get("KubeProxyRulesCleaned"),
        "a rules-cleaned Event while kube-proxy ran: {events_while_refused:?}"
    );

    // kube-proxy gone: the agent cleans.
    let daemonsets: Api<DaemonSet> = Api::namespaced(cluster.client.clone(), "kube-system");
    daemonsets
        .delete("kube-proxy", &DeleteParams::foreground())
        .await
        .unwrap();
    let gone = Instant::now();
    cluster
        .wait_condition(
            "node-1",
            condition_types::KUBE_PROXY_RULES_PRESENT,
            ConditionStatus::False,
            Some(reasons::RULES_ABSENT),
            Duration::from_secs(60),
        )
        .await;
    let cleaned_after = gone.elapsed();
    cluster
        .expect_agent_event(
            "node-1",
            "KubeProxyRulesCleaned",
            "Normal",
            &events_while_refused,
            Duration::from_secs(15),
        )
        .await;
    let remaining: Vec<String> = in_namespace("node-1", "iptables-save", &[])
        .lines()
        .filter(|line| {
            [
                "KUBE-SERVICES",
                "KUBE-NODEPORTS",
                "KUBE-SVC-",
                "KUBE-SEP-",
                "KUBE-EXTERNAL-SERVICES",
                "KUBE-FORWARD",
            ]
            .iter()
            .any(|chain| line.contains(chain))
        })
        .map(str::to_string)
        .collect();
    // kube-proxy has left node-1: the agent answers its health ports, with the
    // local endpoints of an externalTrafficPolicy Local LoadBalancer.
    let node_1 = cluster.node_address("node-1");
    let healthz = SocketAddr::V4(SocketAddrV4::new(node_1, 10256));
    let load_balancer: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "kp-lb", "namespace": "default"},
        "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local",
                 "ports": [{"name": "http", "port": 80, "targetPort": BACKEND_PORT, "protocol": "TCP"}]}
    }))
    .unwrap();
    let services: Api<Service> = Api::namespaced(cluster.client.clone(), "default");
    let _ = services.delete("kp-lb", &DeleteParams::default()).await;
    let created = services
        .create(&PostParams::default(), &load_balancer)
        .await
        .unwrap();
    let health_port = created
        .spec
        .and_then(|spec| spec.health_check_node_port)
        .expect("a healthCheckNodePort") as u16;
    let slice = endpoint_slice_v1beta1(
        "default",
        "kp-lb-1",
        "kp-lb",
        "http",
        BACKEND_PORT,
        &[
            Endpoint {
                address: world.client_pod.address,
                node: "node-1".into(),
            },
            Endpoint {
                address: world.backend_2.address,
                node: "node-2".into(),
            },
        ],
    )
    .unwrap();
    let slices = endpoint_slices_v1beta1(&cluster.client, "default");
    let _ = slices.delete("kp-lb-1", &DeleteParams::default()).await;
    slices.create(&PostParams::default(), &slice).await.unwrap();
    let health_check = SocketAddr::V4(SocketAddrV4::new(node_1, health_port));
    let started = Instant::now();
    let (healthz_answer, service_answer) = loop {
        let healthz_answer = http_get(healthz, "/healthz").await;
        let service_answer = http_get(health_check, "/").await;
        let done = matches!(&healthz_answer, Ok((200, _)))
            && matches!(&service_answer, Ok((200, body)) if body.contains("\"localEndpoints\": 1"));
        if done || started.elapsed() > Duration::from_secs(15) {
            break (healthz_answer, service_answer);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    println!("after kube-proxy left: :10256/healthz {healthz_answer:?}; healthCheckNodePort {health_port}: {service_answer:?}");
    let _ = services.delete("kp-lb", &DeleteParams::default()).await;
    let _ = slices.delete("kp-lb-1", &DeleteParams::default()).await;
    // A deliberate traffic window: 2 s more on the demo Service after the cleanup and the
    // LoadBalancer's removal; the report asserted below covers it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let report = generator.stop().await;
    println!("kube-proxy's rules cleaned {cleaned_after:.1?} after its DaemonSet was deleted");
    assert!(
        matches!(&healthz_answer, Ok((200, _))),
        "{healthz_answer:?}"
    );
    assert!(
        matches!(&service_answer, Ok((200, body)) if body.contains("\"localEndpoints\": 1")),
        "{service_answer:?}"
    );
    let events_before_stop = cluster.agent_event_counts("node-1").await;
    cluster
        .patch_spec("node-1", serde_json::json!({"iptablesCleanup": false}))
        .await;
    cluster
        .expect_agent_event(
            "node-1",
            "KubeProxyCleanupStopped",
            "Normal",
            &events_before_stop,
            Duration::from_secs(15),
        )
        .await;
    assert!(
        remaining.is_empty(),
        "kube-proxy rules left: {remaining:#?}"
    );
    assert_no_failures(&report, "cleanup refused, then done");
    world.finish().await;
}

/// Issue 8's draining, as the agent does it: told `KubeProxy` after `Ebpf`,
/// node-1 keeps translating the connections it carries (`Draining` True,
/// `liveFlows` counted), and detaches within 5 s of the last one closing. The
/// agent records drain started and, only once the flows have ended, drain
/// finished as Events on the DataplaneNode.
#[tokio::test]
#[ignore = "needs the e2e cluster: make e2e-agent"]
async fn told_kube_proxy_after_ebpf_the_agent_drains_live_flows_then_detaches() {
    let world = World::new("dr", 6).await;
    let cluster = &world.cluster;
    let long_lived = TrafficGenerator::start(
        vec![Flow {
            name: "client pod -> ClusterIP, long-lived".into(),
            source: world.client_pod.thread().unwrap(),
            destination: world.cluster_ip_address(),
            mode: FlowMode::LongLived {
                connections: 3,
                message_interval: Duration::from_millis(200),
            },
        }],
        Timeouts::default(),
    );
    // Every connection open and answered before the agent is told to go back.
    wait_for(
        "see the 3 long-lived connections open and answered",
        WaitOptions::new(Duration::from_secs(15)).every(Duration::from_millis(50)),
        || {
            let report = long_lived.snapshot();
            async move {
                let open = report
                    .flows
                    .values()
                    .all(|flow| flow.connections_opened == 3 && flow.successes >= 3);
                Ok::<_, String>(if report.failure_count() > 0 {
                    Check::Failed(format!("{report}"))
                } else if open {
                    Check::Ready(())
                } else {
                    Check::NotYet(format!("{report}"))
                })
            }
        },
    )
    .await
    .unwrap();
    let events_before_drain = cluster.agent_event_counts("node-1").await;
    cluster
        .patch_spec(
            "node-1",
            serde_json::json!({"mode": "KubeProxy", "drainTimeoutSeconds": 60}),
        )
        .await;
    cluster
        .wait_condition(
            "node-1",
            condition_types::DRAINING,
            ConditionStatus::True,
            Some(reasons::DRAINING_FLOWS),
            Duration::from_secs(10),
        )
        .await;
    // The agent reads live flows every second: wait until it reports the three.
    let dataplane_nodes: Api<switchyard_crds::DataplaneNode> = Api::all(cluster.client.clone());
    let live_flows = wait_for(
        "see node-1 report its 3 live flows while draining",
        WaitOptions::new(Duration::from_secs(10)).every(Duration::from_millis(200)),
        || async {
            let live_flows = dataplane_nodes
                .get("node-1")
                .await?
                .status
                .and_then(|status| status.live_flows);
            Ok::<_, kube::Error>(if live_flows.unwrap_or(0) >= 3 {
                Check::Ready(live_flows)
            } else {
                Check::NotYet(format!("liveFlows {live_flows:?}"))
            })
        },
    )
    .await
    .unwrap();
    // The connections are carried through 3 s of draining: node-1 drains and every message is
    // answered all along.
    hold_for(
        "node-1 draining with its live connections answered",
        WaitOptions::new(Duration::from_secs(3)).every(Duration::from_millis(250)),
        || async {
            let draining = dataplane_nodes
                .get("node-1")
                .await?
                .status
                .is_some_and(|status| status.condition_is_true(condition_types::DRAINING));
            let failed = long_lived.snapshot().failure_count();
            Ok::<_, kube::Error>(if draining && failed == 0 {
                Check::Ready(())
            } else {
                Check::NotYet(format!("draining {draining}, {failed} failed messages"))
            })
        },
    )
    .await
    .unwrap();
    // Drain started is an Event; drain finished is not, while the flows live (the control for
    // the drain-finished Event below).
    cluster
        .expect_agent_event(
            "node-1",
            "DrainStarted",
            "Normal",
            &events_before_drain,
            Duration::from_secs(10),
        )
        .await;
    let events_while_draining = cluster.agent_event_counts("node-1").await;
    assert_eq!(
        events_while_draining.get("DrainFinished"),
        events_before_drain.get("DrainFinished"),
        "a drain-finished Event while flows were live: {events_while_draining:?}"
    );
    let report = long_lived.stop().await;
    let closed = Instant::now();
    cluster
        .wait_condition(
            "node-1",
            condition_types::DRAINING,
            ConditionStatus::False,
            Some(reasons::DRAIN_COMPLETE),
            Duration::from_secs(20),
        )
        .await;
    let detached_after = closed.elapsed();
    cluster
        .expect_agent_event(
            "node-1",
            "DrainFinished",
            "Normal",
            &events_while_draining,
            Duration::from_secs(10),
        )
        .await;
    let detached = cluster
        .dataplane_node("node-1")
        .await
        .status
        .unwrap_or_default();
    // Back to eBPF for the other scenarios.
    cluster
        .patch_spec("node-1", serde_json::json!({"mode": "Ebpf"}))
        .await;
    cluster
        .wait_condition(
            "node-1",
            condition_types::PROGRAMS_ATTACHED,
            ConditionStatus::True,
            Some(reasons::ATTACHED),
            Duration::from_secs(10),
        )
        .await;
    cluster
        .wait_agent_ready("node-1", Duration::from_secs(10))
        .await;
    println!(
        "draining: liveFlows {live_flows:?} while 3 long-lived connections were open; detached {detached_after:.2?} after they closed\n{report}"
    );
    assert_eq!(
        report.failure_count(),
        0,
        "a live connection broke while draining\n{report}"
    );
    let flow = report.flows.values().next().expect("one flow");
    assert_eq!(
        flow.connections_opened, 3,
        "a connection was reopened\n{report}"
    );
    assert!(flow.successes >= 30, "too few messages\n{report}");
    assert!(live_flows.unwrap_or(0) >= 3, "liveFlows {live_flows:?}");
    assert!(
        detached_after <= Duration::from_secs(5),
        "detached after {detached_after:?}"
    );
    assert!(!detached.condition_is_true(condition_types::PROGRAMS_ATTACHED));
    assert_eq!(detached.live_flows, None);
    world.finish().await;
}

/// The start-of-day gate past its timeout: node-1's agent restarted while it may
/// not list EndpointSlices reports Ready False, reason `HostMetadataTimeout`,
/// naming the missing input, keeps the previous entries serving (zero failures)
/// and keeps waiting; with the permission back it opens and reports Ready.
#[tokio::test]
#[ignore = "needs the e2e cluster: make e2e-agent"]
async fn an_agent_missing_an_input_past_the_timeout_names_it_and_keeps_serving() {
    use k8s_openapi::api::rbac::v1::ClusterRole;
    let world = World::new("gt", 7).await;
    let cluster = &world.cluster;
    let roles: Api<ClusterRole> = Api::all(cluster.client.clone());
    let role = roles.get("switchyard-e2e:agent").await.unwrap();
    let without_slices: Vec<serde_json::Value> = role
        .rules
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|rule| {
            !rule
                .resources
                .iter()
                .flatten()
                .any(|r| r == "endpointslices")
        })
        .map(|rule| serde_json::to_value(rule).unwrap())
        .collect();
    let generator = world.traffic();
    roles
        .patch(
            "switchyard-e2e:agent",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({ "rules": without_slices })),
        )
        .await
        .unwrap();
    let current = cluster.running_agent("node-1").expect("an agent runs");
    kill(current.pid.expect("a pid"), libc::SIGKILL);
    // The manifest's --gate-timeout is 10 s.
    cluster
        .wait_reported(
            "node-1",
            condition_types::READY,
            ConditionStatus::False,
            Some(reasons::HOST_METADATA_TIMEOUT),
            false,
            Duration::from_secs(30),
        )
        .await;
    let status = cluster
        .dataplane_node("node-1")
        .await
        .status
        .unwrap_or_default();
    let ready = switchyard_crds::find_condition(&status.conditions, condition_types::READY)
        .cloned()
        .expect("Ready");
    let readyz = cluster.readyz("node-1").await;
    let writes = cluster
        .metrics("node-1")
        .await
        .unwrap()
        .required("switchyard_agent_map_operations_total");
    // Permission back (the manifest's role): the gate opens.
    let restored = Instant::now();
    roles
        .patch(
            "switchyard-e2e:agent",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({ "rules": role.rules })),
        )
        .await
        .unwrap();
    cluster
        .wait_agent_ready("node-1", Duration::from_secs(30))
        .await;
    let opened_after = restored.elapsed();
    // A deliberate traffic window: a second served after the gate opened; the report asserted
    // below covers it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let report = generator.stop().await;
    println!(
        "gate past its timeout: Ready {:?} {} {:?}; /readyz {readyz:?}; map operations {writes}; Ready again {opened_after:.1?} after the permission came back",
        ready.status, ready.reason, ready.message
    );
    assert!(
        ready.message.contains("EndpointSlices"),
        "{}",
        ready.message
    );
    assert!(matches!(readyz, Ok(503)), "{readyz:?}");
    assert_eq!(writes, 0.0, "a map write before the gate opened");
    assert_no_failures(&report, "an agent waiting past its gate timeout");
    world.finish().await;
}

/// Issue 24: a Service labelled `service.kubernetes.io/service-proxy-name` belongs to
/// another proxy, and kube-proxy never sees it (its informers' label selector): the agent,
/// which watches with the same selector, stops serving a Service that gains the label, and
/// serves it again once the label is gone (the control: the Service works unlabelled).
#[tokio::test]
#[ignore = "needs the e2e cluster: make e2e-agent"]
async fn a_service_labelled_for_another_proxy_is_not_served_until_the_label_goes() {
    let world = World::new("px", 8).await;
    let client = world.client_pod.thread().unwrap();
    let destination = world.cluster_ip_address();
    let services: Api<Service> = Api::namespaced(world.cluster.client.clone(), "default");
    let label = |value: serde_json::Value| {
        serde_json::json!({
            "metadata": {"labels": {"service.kubernetes.io/service-proxy-name": value}}
        })
    };
    services
        .patch(
            &world.service,
            &PatchParams::default(),
            &Patch::Merge(&label("other-proxy".into())),
        )
        .await
        .unwrap();
    let gone = time_until(
        "see the labelled Service no longer served",
        &client,
        destination,
        Duration::from_secs(10),
        |outcome| outcome.is_err(),
    )
    .await;
    for _ in 0..3 {
        let outcome =
            switchyard_e2e::traffic::exchange_once(&client, destination, Timeouts::default()).await;
        assert!(
            outcome.is_err(),
            "the Service of another proxy answered: {outcome:?}"
        );
    }
    services
        .patch(
            &world.service,
            &PatchParams::default(),
            &Patch::Merge(&label(serde_json::Value::Null)),
        )
        .await
        .unwrap();
    let back = time_until(
        "reach the Service again without the label",
        &client,
        destination,
        Duration::from_secs(10),
        |outcome| outcome.is_ok(),
    )
    .await;
    println!("labelled -> not served {gone:.2?}; unlabelled -> served {back:.2?}");
    // Generous bounds (1.27 s measured): the watch, a sync and the probe's own timeouts on
    // two busy cores; the speed of programming is measured by make bench, not here.
    assert!(
        gone <= Duration::from_secs(5),
        "still served after {gone:?}"
    );
    assert!(
        back <= Duration::from_secs(5),
        "served again after {back:?}"
    );
    world.finish().await;
}
