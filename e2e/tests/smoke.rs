//! The e2e smoke test: a real 1.20 control plane, three hollow nodes, a real
//! kube-proxy on each (run by the pod runner), a selectorless Service with
//! v1beta1 EndpointSlices pointing at backends in pod namespaces, traffic
//! through kube-proxy's ClusterIP and NodePort, and a kube-proxy pod deleted
//! and replaced.
//!
//! It needs a running cluster and runs inside its namespaces:
//! `make e2e-smoke` does `e2e/cluster up --nodes 3`, then
//! `e2e/cluster exec cargo test -p switchyard-e2e --test smoke -- --ignored`,
//! then `e2e/cluster down` and checks nothing is left.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use switchyard_e2e::audit::read_audit_events;
use switchyard_e2e::cluster::{admin_client, ClusterPaths};
use switchyard_e2e::netns::{run_in_namespace, run_in_node, TestNamespace};
use switchyard_e2e::objects::{
    create_kube_proxy_daemonset, endpoint_slice_v1beta1, endpoint_slices_v1beta1, Endpoint,
};
use switchyard_e2e::pod_runner::events::{
    find_replacement, now_unix_ms, read_events, running_processes, EventKind, RunnerEvent,
};
use switchyard_e2e::traffic::{
    EchoServer, Flow, FlowMode, Timeouts, TrafficGenerator, TrafficReport,
};
use switchyard_e2e::wait::{wait_for, Check, WaitOptions};

const BACKEND_PORT: u16 = 8080;
const SERVICE_PORT: u16 = 80;
const NODE_PORT: u16 = 30080;

fn kube_proxy_events(paths: &ClusterPaths) -> Vec<RunnerEvent> {
    read_events(&paths.pod_runner_events())
        .unwrap_or_default()
        .into_iter()
        .filter(|event| event.container == "kube-proxy")
        .collect()
}

/// The kube-proxy process running now on each node.
fn running_kube_proxies(events: &[RunnerEvent]) -> BTreeMap<String, RunnerEvent> {
    running_processes(events, "kube-proxy")
        .into_values()
        .map(|event| (event.node.clone(), event))
        .collect()
}

async fn wait_for_rules(node: &str, needle: &str, description: &str) {
    let node_name = node.to_string();
    let needle_text = needle.to_string();
    wait_for(
        description,
        WaitOptions::new(Duration::from_secs(30)),
        || {
            let node_name = node_name.clone();
            let needle_text = needle_text.clone();
            async move {
                let rules = run_in_namespace(&node_name, "iptables-save", &[])?;
                let matching = rules
                    .lines()
                    .filter(|line| line.contains(&needle_text))
                    .count();
                Ok::<_, switchyard_e2e::E2eError>(if matching > 0 {
                    Check::Ready(())
                } else {
                    Check::NotYet(format!(
                        "no iptables rule of {node_name} mentions {needle_text:?}"
                    ))
                })
            }
        },
    )
    .await
    .unwrap();
}

async fn create_service(client: &Client, name: &str, node_port: Option<u16>) -> Service {
    let mut port = serde_json::json!({"name": "http", "port": SERVICE_PORT, "targetPort": BACKEND_PORT, "protocol": "TCP"});
    if let Some(node_port) = node_port {
        port["nodePort"] = node_port.into();
    }
    let service: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"type": if node_port.is_some() { "NodePort" } else { "ClusterIP" }, "ports": [port]},
    }))
    .unwrap();
    Api::<Service>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &service)
        .await
        .unwrap_or_else(|error| panic!("failed to create Service {name}: {error}"))
}

const LONG_LIVED_CONNECTIONS: usize = 4;

fn assert_clean(report: &TrafficReport, backends: &[&str], what: &str) {
    assert_eq!(
        report.failure_count(),
        0,
        "{what}: every connection must succeed\n{report}"
    );
    for (name, flow) in &report.flows {
        assert!(
            flow.successes >= 20,
            "{what}: flow {name} made too few exchanges\n{report}"
        );
        if name.contains("long-lived") {
            // Each long-lived connection sticks to one backend; none may have
            // been reopened.
            assert_eq!(
                flow.connections_opened, LONG_LIVED_CONNECTIONS as u64,
                "{what}: long-lived connections were reopened\n{report}"
            );
            continue;
        }
        for backend in backends {
            assert!(
                flow.backends.contains_key(*backend),
                "{what}: flow {name} never reached {backend}\n{report}"
            );
        }
    }
}

#[tokio::test]
#[ignore = "needs a running e2e cluster: run by `make e2e-smoke` inside `e2e/cluster exec`"]
async fn kube_proxy_serves_cluster_ip_and_node_port_and_is_replaced_after_its_pod_is_deleted() {
    let paths = ClusterPaths::from_environment();
    let client = admin_client(&paths).await.unwrap();
    let node_count = paths.node_count().unwrap();
    assert_eq!(node_count, 3, "the smoke test needs 3 nodes");

    wait_for(
        "see 3 nodes Ready",
        WaitOptions::new(Duration::from_secs(60)),
        || async {
            let nodes = Api::<Node>::all(client.clone())
                .list(&ListParams::default())
                .await?;
            let ready: Vec<String> = nodes
                .items
                .iter()
                .filter(|node| {
                    node.status
                        .as_ref()
                        .and_then(|status| status.conditions.as_ref())
                        .is_some_and(|conditions| {
                            conditions
                                .iter()
                                .any(|c| c.type_ == "Ready" && c.status == "True")
                        })
                })
                .filter_map(|node| node.metadata.name.clone())
                .collect();
            Ok::<_, kube::Error>(if ready.len() == 3 {
                Check::Ready(())
            } else {
                Check::NotYet(format!("Ready nodes: {ready:?}"))
            })
        },
    )
    .await
    .unwrap();

    // Objects of an earlier run in the same cluster.
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    for name in ["smoke", "smoke-after"] {
        let _ = services.delete(name, &DeleteParams::default()).await;
    }
    let _ = endpoint_slices_v1beta1(&client, "default")
        .delete("smoke-1", &DeleteParams::default())
        .await;

    // kube-proxy on every node, run for real by the pod runner.
    create_kube_proxy_daemonset(&client).await.unwrap();
    let runner_paths = paths.clone();
    wait_for(
        "see the pod runner start kube-proxy on 3 nodes",
        WaitOptions::new(Duration::from_secs(60)),
        || {
            let running = running_kube_proxies(&kube_proxy_events(&runner_paths));
            async move {
                Ok::<_, String>(if running.len() == 3 {
                    Check::Ready(())
                } else {
                    Check::NotYet(format!(
                        "kube-proxy runs on {:?}",
                        running.keys().collect::<Vec<_>>()
                    ))
                })
            }
        },
    )
    .await
    .unwrap();

    // Backends on node-2 and node-3, a client pod on node-1, an outside client.
    let client_pod = TestNamespace::pod(1, "smoke-client", 10).unwrap();
    let backend_2 = TestNamespace::pod(2, "smoke-be-2", 10).unwrap();
    let backend_3 = TestNamespace::pod(3, "smoke-be-3", 10).unwrap();
    let outside = TestNamespace::external("smoke-ext", 200).unwrap();
    let any_address = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, BACKEND_PORT));
    let server_2 = EchoServer::start(&backend_2.thread().unwrap(), any_address, "backend-2")
        .await
        .unwrap();
    let server_3 = EchoServer::start(&backend_3.thread().unwrap(), any_address, "backend-3")
        .await
        .unwrap();

    // A selectorless NodePort Service whose endpoints the test writes itself.
    let service = create_service(&client, "smoke", Some(NODE_PORT)).await;
    let cluster_ip: Ipv4Addr = service
        .spec
        .as_ref()
        .and_then(|spec| spec.cluster_ip.as_deref())
        .and_then(|ip| ip.parse().ok())
        .expect("the Service got a ClusterIP");
    let slice = endpoint_slice_v1beta1(
        "default",
        "smoke-1",
        "smoke",
        "http",
        BACKEND_PORT,
        &[
            Endpoint {
                address: backend_2.address,
                node: "node-2".into(),
            },
            Endpoint {
                address: backend_3.address,
                node: "node-3".into(),
            },
        ],
    )
    .unwrap();
    endpoint_slices_v1beta1(&client, "default")
        .create(&PostParams::default(), &slice)
        .await
        .unwrap();
    for node in ["node-1", "node-2", "node-3"] {
        wait_for_rules(
            node,
            "default/smoke:http",
            &format!("see kube-proxy on {node} program default/smoke"),
        )
        .await;
        wait_for_rules(
            node,
            &format!("{}:{BACKEND_PORT}", backend_3.address),
            &format!("see {node}'s rules reach backend-3"),
        )
        .await;
    }

    let node_1_address: Ipv4Addr = paths.node_address("node-1").unwrap().parse().unwrap();
    let short = FlowMode::ShortConnections {
        interval: Duration::from_millis(25),
        workers: 2,
    };
    let flows = || {
        vec![
            Flow {
                name: "client pod -> ClusterIP".into(),
                source: client_pod.thread().unwrap(),
                destination: SocketAddr::V4(SocketAddrV4::new(cluster_ip, SERVICE_PORT)),
                mode: short,
            },
            Flow {
                name: "outside -> node-1 NodePort".into(),
                source: outside.thread().unwrap(),
                destination: SocketAddr::V4(SocketAddrV4::new(node_1_address, NODE_PORT)),
                mode: short,
            },
            Flow {
                name: "client pod -> ClusterIP, long-lived".into(),
                source: client_pod.thread().unwrap(),
                destination: SocketAddr::V4(SocketAddrV4::new(cluster_ip, SERVICE_PORT)),
                mode: FlowMode::LongLived {
                    connections: LONG_LIVED_CONNECTIONS,
                    message_interval: Duration::from_millis(100),
                },
            },
        ]
    };
    let generator = TrafficGenerator::start(flows(), Timeouts::default());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let report = generator.stop().await;
    println!("before the kube-proxy pod is deleted: {report}");
    assert_clean(&report, &["backend-2", "backend-3"], "through kube-proxy");

    // Delete node-2's kube-proxy pod: the pod runner stops its process and
    // starts the replacement's only after the old one has exited. Traffic goes
    // on meanwhile (the rules stay while kube-proxy restarts).
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    let old = running_kube_proxies(&kube_proxy_events(&paths))
        .remove("node-2")
        .expect("kube-proxy runs on node-2");
    let generator = TrafficGenerator::start(flows(), Timeouts::default());
    let deleted_at = now_unix_ms();
    pods.delete(&old.pod, &DeleteParams::default())
        .await
        .unwrap();
    let replacement = wait_for(
        "see node-2's kube-proxy replaced by a new process",
        WaitOptions::new(Duration::from_secs(60)),
        || {
            let events = kube_proxy_events(&paths);
            let found = find_replacement(
                &events,
                &old.pod_uid,
                "kube-proxy",
                Some("node-2"),
                deleted_at,
            );
            let old_events: Vec<EventKind> = events
                .iter()
                .filter(|event| event.pod_uid == old.pod_uid)
                .map(|event| event.kind)
                .collect();
            async move {
                Ok::<_, String>(match found {
                    Some(replacement) => Check::Ready(replacement),
                    None => {
                        Check::NotYet(format!("events of the old process so far: {old_events:?}"))
                    }
                })
            }
        },
    )
    .await
    .unwrap();
    assert!(
        replacement.is_ordered(),
        "the replacement started at {} before the old process exited at {}",
        replacement.started.at_unix_ms,
        replacement.exited.at_unix_ms
    );
    let started = replacement.started;
    // The audit log shows the deletion the test made, before the new pod's
    // process started.
    let audit = read_audit_events(&paths.audit_log()).unwrap();
    let deletion = audit
        .iter()
        .find(|event| event.is_successful("delete", "pods", &old.pod))
        .unwrap_or_else(|| panic!("the audit log has no successful delete of pod {}", old.pod));
    assert_eq!(deletion.user.username, "switchyard-e2e-admin");
    let new_pod = pods.get(&started.pod).await.unwrap();
    assert_eq!(
        new_pod.metadata.uid.as_deref(),
        Some(started.pod_uid.as_str())
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let report = generator.stop().await;
    println!("while node-2's kube-proxy was replaced: {report}");
    assert_clean(
        &report,
        &["backend-2", "backend-3"],
        "during the kube-proxy replacement",
    );

    // The new process is live: it programs a Service created after it started.
    create_service(&client, "smoke-after", None).await;
    wait_for_rules(
        "node-2",
        "default/smoke-after:http",
        "see the new kube-proxy on node-2 program a new Service",
    )
    .await;

    server_2.stop().await;
    server_3.stop().await;
    drop((client_pod, backend_2, backend_3, outside));
}

fn process_output(paths: &ClusterPaths, event: &RunnerEvent) -> String {
    let path = paths
        .process_directory(
            &event.namespace,
            &event.pod,
            &event.pod_uid,
            &event.container,
        )
        .join("output.log");
    std::fs::read_to_string(path).unwrap_or_default()
}

fn probe_events(paths: &ClusterPaths) -> Vec<RunnerEvent> {
    read_events(&paths.pod_runner_events())
        .unwrap_or_default()
        .into_iter()
        .filter(|event| event.namespace == "default" && event.container == "probe")
        .collect()
}

/// Waits for the probe process of a pod started at or after `since` (other
/// than `except`) to have printed its credentials, and returns its start event.
async fn wait_for_probe(paths: &ClusterPaths, since: u64, except: Option<&str>) -> RunnerEvent {
    wait_for(
        "see the probe Deployment's process print its environment",
        WaitOptions::new(Duration::from_secs(60)),
        || {
            let events = probe_events(paths);
            let started = events.into_iter().find(|e| {
                e.kind == EventKind::Started
                    && e.at_unix_ms >= since
                    && Some(e.pod_uid.as_str()) != except
            });
            let output = started
                .as_ref()
                .map(|event| process_output(paths, event))
                .unwrap_or_default();
            async move {
                Ok::<_, String>(match started {
                    Some(event) if output.contains("PROBE_NAMESPACE=default") => {
                        Check::Ready(event)
                    }
                    Some(event) => {
                        Check::NotYet(format!("{} started; output so far: {output:?}", event.pod))
                    }
                    None => Check::NotYet("no probe process started yet".into()),
                })
            }
        },
    )
    .await
    .unwrap()
}

#[tokio::test]
#[ignore = "needs a running e2e cluster started with e2e/manifests/smoke-images.conf: run by `make e2e-smoke`"]
async fn a_deployment_process_gets_the_downward_api_and_credentials_and_its_replacement_waits_for_its_exit(
) {
    use k8s_openapi::api::apps::v1::Deployment;
    let paths = ClusterPaths::from_environment();
    let client = admin_client(&paths).await.unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let _ = deployments
        .delete("probe", &DeleteParams::foreground())
        .await;
    wait_for(
        "see an earlier probe Deployment gone",
        WaitOptions::new(Duration::from_secs(60)),
        || async {
            Ok::<_, kube::Error>(match deployments.get_opt("probe").await? {
                None => Check::Ready(()),
                Some(_) => Check::NotYet("it still exists".into()),
            })
        },
    )
    .await
    .unwrap();

    let since = now_unix_ms();
    let deployment: Deployment =
        switchyard_e2e::objects::manifest("probe-deployment.yaml").unwrap();
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    let first = wait_for_probe(&paths, since, None).await;
    let output = process_output(&paths, &first);
    // The API server as a kubelet names it: the `kubernetes` Service's ClusterIP and port.
    let expected = format!(
        "PROBE_POD={} PROBE_NODE={} PROBE_APP=probe PROBE_API=10.96.0.1:443",
        first.pod, first.node
    );
    assert!(
        output.contains(&expected),
        "expected {expected:?} in the probe's output {output:?}"
    );
    assert!(
        output.contains("PROBE_TOKEN=present"),
        "no service-account token: {output:?}"
    );

    // Deleting the pod: SIGTERM reaches the process (it says so), and the
    // ReplicaSet's new pod gets its process only after the old one exited.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let deleted_at = now_unix_ms();
    pods.delete(&first.pod, &DeleteParams::default())
        .await
        .unwrap();
    let second = wait_for_probe(&paths, deleted_at, Some(&first.pod_uid)).await;
    let replacement = find_replacement(
        &probe_events(&paths),
        &first.pod_uid,
        "probe",
        None,
        deleted_at,
    )
    .expect("the first probe process exited and a new one started");
    assert_eq!(replacement.started.pod_uid, second.pod_uid);
    assert!(
        replacement.is_ordered(),
        "the replacement started at {} before the old process exited at {}",
        replacement.started.at_unix_ms,
        replacement.exited.at_unix_ms
    );
    assert!(
        process_output(&paths, &first).contains("PROBE_TERMINATED"),
        "the first probe was not stopped with SIGTERM: {:?}",
        process_output(&paths, &first)
    );

    deployments
        .delete("probe", &DeleteParams::foreground())
        .await
        .unwrap();
    wait_for(
        "see the last probe process exit",
        WaitOptions::new(Duration::from_secs(60)),
        || {
            let exited = probe_events(&paths)
                .iter()
                .any(|e| e.pod_uid == second.pod_uid && e.kind == EventKind::Exited);
            async move {
                Ok::<_, String>(if exited {
                    Check::Ready(())
                } else {
                    Check::NotYet("it still runs".into())
                })
            }
        },
    )
    .await
    .unwrap();
}

/// The name of the BPF map the smoke test pins; `e2e/cluster verify-clean`
/// fails while a map of this name exists, so the teardown proves the pin died
/// with the node's bpffs.
const PROBE_MAP: &str = "sye2e_probe";

#[tokio::test]
#[ignore = "needs a running e2e cluster: run by `make e2e-smoke` inside `e2e/cluster exec`"]
async fn every_node_has_a_bpf_filesystem_of_its_own() {
    let paths = ClusterPaths::from_environment();
    let pin = format!("/sys/fs/bpf/{PROBE_MAP}");
    run_in_node(
        &paths,
        "node-1",
        "bpftool",
        &[
            "map", "create", &pin, "type", "array", "key", "4", "value", "4", "entries", "1",
            "name", PROBE_MAP,
        ],
    )
    .unwrap();
    let listing = |node: &str| run_in_node(&paths, node, "ls", &["/sys/fs/bpf"]).unwrap();
    assert!(
        listing("node-1").contains(PROBE_MAP),
        "node-1 must see its own pin"
    );
    assert!(
        !listing("node-2").contains(PROBE_MAP),
        "node-2 must not see node-1's pin"
    );
    let cluster_listing = std::fs::read_dir("/sys/fs/bpf")
        .map(|entries| {
            entries
                .flatten()
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    assert!(
        !cluster_listing.iter().any(|name| name == PROBE_MAP),
        "the host's bpffs must not see node-1's pin: {cluster_listing:?}"
    );
    // The pin stays: the teardown must free it (checked by verify-clean).
}
