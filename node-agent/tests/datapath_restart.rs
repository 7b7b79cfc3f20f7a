//! Restart without disruption, through the real binary: `switchyard-agent
//! standalone` is killed and started again twice (once with SIGTERM, once with
//! SIGKILL) while new connections pour through a ClusterIP and a NodePort.

mod datapath_support;

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    path::Path,
    process::Child,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use datapath_support::*;

const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const NODE_PORT: u16 = 30080;
const NODE_NAME: &str = "node-a";

fn write_manifests(directory: &Path, pods: &[Pod]) {
    let endpoints: String = pods
        .iter()
        .map(|pod| format!("- {{addresses: [{}], nodeName: {NODE_NAME}}}\n", pod.ip))
        .collect();
    let manifests = format!(
        "apiVersion: v1
kind: Service
metadata: {{name: web, namespace: default}}
spec:
  type: NodePort
  clusterIP: {CLUSTER_IP}
  ports: [{{name: http, port: 80, targetPort: 8080, nodePort: {NODE_PORT}, protocol: TCP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: web-1, namespace: default, labels: {{kubernetes.io/service-name: web}}}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints:
{endpoints}"
    );
    std::fs::create_dir_all(directory).expect("manifest directory");
    std::fs::write(directory.join("web.yaml"), manifests).expect("write manifests");
}

/// Starts the agent binary; its output goes to `<work>/agent-<n>.log`.
fn start_agent(node: &Node, generation: usize) -> Child {
    node.start_standalone_agent(NODE_NAME, &format!("agent-{generation}.log"))
}

fn agent_logs(node: &Node) -> String {
    (0..3)
        .map(|generation| {
            let path = node.work.join(format!("agent-{generation}.log"));
            format!(
                "--- agent {generation} ---\n{}",
                std::fs::read_to_string(path).unwrap_or_default()
            )
        })
        .collect()
}

struct Load {
    stop: Arc<AtomicBool>,
    successes: Arc<AtomicUsize>,
    failures: Arc<AtomicUsize>,
    first_failure: Arc<std::sync::Mutex<Option<String>>>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

/// Closed-loop clients: each worker opens a connection, sends a line, reads the
/// answer, closes, and starts again.
fn start_load(namespace: Option<&'static str>, address: SocketAddrV4, workers: usize) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let successes = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(AtomicUsize::new(0));
    let first_failure = Arc::new(std::sync::Mutex::new(None));
    let workers = (0..workers)
        .map(|_| {
            let (stop, successes, failures, first_failure) = (
                stop.clone(),
                successes.clone(),
                failures.clone(),
                first_failure.clone(),
            );
            let load_started = Instant::now();
            in_namespace(namespace, move || {
                while !stop.load(Ordering::Relaxed) {
                    match tcp_request(address, Duration::from_secs(2)) {
                        Ok(_) => {
                            successes.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(error) => {
                            failures.fetch_add(1, Ordering::Relaxed);
                            if let Ok(mut first) = first_failure.lock() {
                                first.get_or_insert_with(|| {
                                    format!("{error} at {:?}", load_started.elapsed())
                                });
                            }
                        }
                    }
                }
            })
        })
        .collect();
    Load {
        stop,
        successes,
        failures,
        first_failure,
        workers,
    }
}

impl Load {
    fn stop(self) -> (usize, usize, Option<String>) {
        self.stop.store(true, Ordering::Relaxed);
        for worker in self.workers {
            worker.join().expect("load worker");
        }
        let first_failure = self
            .first_failure
            .lock()
            .ok()
            .and_then(|first| first.clone());
        (
            self.successes.load(Ordering::Relaxed),
            self.failures.load(Ordering::Relaxed),
            first_failure,
        )
    }
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn killing_and_restarting_the_agent_twice_fails_no_connection() {
    run_isolated(
        "killing_and_restarting_the_agent_twice_fails_no_connection",
        |node| {
            let pods = standard_topology(3);
            start_servers(&pods[0]);
            start_servers(&pods[1]);
            write_manifests(&node.work.join("manifests"), &pods[..2]);
            let mut agent = start_agent(node, 0);
            let cluster_ip = SocketAddrV4::new(CLUSTER_IP, 80);
            let node_port = SocketAddrV4::new(NODE_IP, NODE_PORT);
            // Serving means every interface is attached: the ClusterIP from a pod
            // and the NodePort from outside both answer.
            let serving = wait_until(Duration::from_secs(20), || {
                [("pod3", cluster_ip), ("client", node_port)]
                    .into_iter()
                    .all(|(namespace, address)| {
                        in_namespace(Some(namespace), move || {
                            tcp_request(address, Duration::from_millis(300)).is_ok()
                        })
                        .join()
                        .unwrap_or(false)
                    })
            });
            assert!(serving, "the agent never served:\n{}", agent_logs(node));

            let through_cluster_ip = start_load(Some("pod3"), cluster_ip, 2);
            let through_node_port = start_load(Some("client"), node_port, 2);
            // Host processes too (socket hooks, pinned like the TC links).
            let from_host = start_load(None, cluster_ip, 1);
            let started = Instant::now();
            std::thread::sleep(Duration::from_secs(2));
            // SIGTERM: the agent leaves everything in place; a new one takes over.
            println!("SIGTERM at {:?}", started.elapsed());
            sh(&format!("kill -TERM {}", agent.id()));
            let _ = agent.wait();
            agent = start_agent(node, 1);
            std::thread::sleep(Duration::from_secs(4));
            // SIGKILL: no chance to clean up or to finish anything.
            println!("SIGKILL at {:?}", started.elapsed());
            agent.kill().expect("SIGKILL the agent");
            let _ = agent.wait();
            agent = start_agent(node, 2);
            let remaining = Duration::from_secs(10).saturating_sub(started.elapsed());
            std::thread::sleep(remaining);
            let elapsed = started.elapsed().as_secs_f64();
            let (cluster_ip_successes, cluster_ip_failures, cluster_ip_error) =
                through_cluster_ip.stop();
            let (node_port_successes, node_port_failures, node_port_error) =
                through_node_port.stop();
            let (host_successes, host_failures, host_error) = from_host.stop();
            let still_running = agent.try_wait().expect("agent status").is_none();
            let _ = agent.kill();
            let _ = agent.wait();

            let cluster_ip_rate = cluster_ip_successes as f64 / elapsed;
            let node_port_rate = node_port_successes as f64 / elapsed;
            println!(
                "restart test: {elapsed:.1} s; ClusterIP {cluster_ip_successes} ok / \
                 {cluster_ip_failures} failed ({cluster_ip_rate:.0}/s); NodePort \
                 {node_port_successes} ok / {node_port_failures} failed ({node_port_rate:.0}/s)"
            );
            println!("from the host: {host_successes} ok / {host_failures} failed");
            assert!(still_running, "the last agent died:\n{}", agent_logs(node));
            assert_eq!(host_failures, 0, "host connections failed: {host_error:?}");
            assert!(host_successes > 0);
            assert_eq!(
                (cluster_ip_failures, node_port_failures),
                (0, 0),
                "failed connections ({cluster_ip_error:?} / {node_port_error:?}):\n{}",
                agent_logs(node)
            );
            assert!(
                cluster_ip_rate >= 500.0 && node_port_rate >= 500.0,
                "at least 500 new connections per second each: {cluster_ip_rate:.0}/s, {node_port_rate:.0}/s"
            );
        },
    );
}
