//! The `kubernetes` Service dead during both transitions: its one endpoint (the address the API
//! server advertises, kept in the Service by the API server's endpoint reconciler) drops every
//! packet while the cluster goes KubeProxy -> Ebpf and again while it goes back, and both
//! transitions complete: Switchyard's own pods reach the API server at `apiServer.host`, not
//! through the Service a transition moves between dataplanes.
//!
//! The control is an in-cluster client that does go through that Service: a probe pod on node-1
//! (`manifests/api-probe.yaml`) in a pod network namespace, given the Service's ClusterIP and
//! port by the pod runner as by a kubelet, asking the API server for `/version` twice a second.
//! It reaches the API server through the ClusterIP before the first transition (kube-proxy
//! translates), after it (eBPF translates; kube-proxy's rules are gone from node-1) and after
//! the way back (kube-proxy again), and not once while the endpoint is dead: the break is real,
//! and a Switchyard pod that used the Service would have been cut off just as the probe was.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::Api;
use switchyard_crds::DataplaneMode;
use switchyard_e2e::netns::TestNamespace;
use switchyard_e2e::pod_runner::events::{read_events, running_processes};
use switchyard_e2e::wait::{wait_for, Check, WaitOptions};

use super::checks::*;
use crate::migration_support::*;

/// The probe's Deployment, container and pod network namespace (all named alike).
const PROBE: &str = "api-probe";
/// The probe's address on node-1: 10.244.1.20 (the World's client pod is .10).
const PROBE_HOST_NUMBER: u8 = 20;
/// How long the API server and the probe get to show each state.
const PROBE_TIMEOUT: Duration = Duration::from_secs(60);
/// The way back's drain bound, the suite's usual one: the probe keeps trying the dead endpoint
/// through eBPF, but none of its connections holds node-1's drain: the backend never answered
/// their SYNs (retransmitted or not), and the agent counts only flows whose backend answered
/// (`TCP_STATE_REPLY_SEEN`, `node-agent/loader/src/live_flows.rs`), so the drain ends about a
/// second after it starts, as in a cluster whose clients retry a dead `kubernetes` Service.
const DRAIN_TIMEOUT_SECONDS: u64 = 120;
/// Each transition's bound: the way back includes the drain.
const TRANSITION_TIMEOUT: Duration = Duration::from_secs(DRAIN_TIMEOUT_SECONDS + 100);

/// The scenario: see the module's documentation.
pub async fn play(world: &World) {
    // The scenarios of (5) leave node-3's pin directory hidden and no DataplaneConfig: every
    // node able to serve from eBPF again, and Ready on KubeProxy, first.
    super::harness::recover(world, DataplaneMode::KubeProxy)
        .await
        .expect("the cluster back on KubeProxy with every agent able to serve");
    let traffic = world.short_traffic_flowing().await.expect("traffic");
    let (cluster_ip, endpoint) = kubernetes_service(world)
        .await
        .expect("the kubernetes Service");
    println!(
        "the kubernetes Service: {cluster_ip} -> {endpoint}; Switchyard's pods use {}:6443",
        world.api_server_host
    );
    assert_ne!(
        endpoint.split(':').next(),
        Some(world.api_server_host.as_str()),
        "the Service's endpoint is the address Switchyard's pods are given: the scenario cannot \
         break one without the other"
    );
    let _network = TestNamespace::pod(1, PROBE, PROBE_HOST_NUMBER).expect("the probe's namespace");
    let probe = Probe::start(world).await.expect("the probe pod's process");

    let reached = probe
        .wait_reached(now_ms(), "through kube-proxy before the switch")
        .await;
    assert_via_cluster_ip(&reached, &cluster_ip);

    // KubeProxy -> Ebpf with the Service dead.
    let dead = DeadEndpoint::block(&endpoint).expect("make the Service's endpoint dead");
    probe.wait_failed(dead.since_ms).await;
    world
        .apply_config(DataplaneMode::Ebpf, rollout())
        .await
        .expect("apply mode Ebpf");
    let to_ebpf = wait_config_ready(world, DataplaneMode::Ebpf, &traffic, TRANSITION_TIMEOUT).await;
    assert_endpoint_kept(world, &endpoint).await;
    let dead_window = probe.assert_never_reached_since(dead.since_ms, "KubeProxy -> Ebpf");
    drop(dead);
    let rules = world
        .kube_proxy_rules("node-1")
        .expect("iptables-save on node-1");
    assert_eq!(
        rules.service_chains, 0,
        "kube-proxy's rules are gone from node-1: {rules:?}"
    );
    let reached = probe
        .wait_reached(now_ms(), "through eBPF after the switch")
        .await;
    assert_via_cluster_ip(&reached, &cluster_ip);
    println!(
        "KubeProxy -> Ebpf Ready in {:.1} s with the kubernetes Service dead ({dead_window}); the probe reached the API server through eBPF: {reached}",
        to_ebpf.as_secs_f64()
    );

    // Ebpf -> KubeProxy with the Service dead.
    let dead = DeadEndpoint::block(&endpoint).expect("make the Service's endpoint dead");
    probe.wait_failed(dead.since_ms).await;
    world
        .apply_config(DataplaneMode::KubeProxy, rollout())
        .await
        .expect("apply mode KubeProxy");
    let to_kube_proxy = wait_config_ready(
        world,
        DataplaneMode::KubeProxy,
        &traffic,
        TRANSITION_TIMEOUT,
    )
    .await;
    assert_endpoint_kept(world, &endpoint).await;
    let dead_window = probe.assert_never_reached_since(dead.since_ms, "Ebpf -> KubeProxy");
    drop(dead);
    // So the next answer is kube-proxy's doing: it serves the Service on node-1 again.
    wait_for(
        "see kube-proxy's rules for the kubernetes Service on node-1",
        WaitOptions::new(Duration::from_secs(30)),
        || async {
            let nat =
                switchyard_e2e::netns::run_in_namespace("node-1", "iptables-save", &["-t", "nat"])?;
            let served = nat.lines().any(|line| {
                line.starts_with("-A KUBE-SVC-") && line.contains("default/kubernetes:https")
            });
            Ok::<_, switchyard_e2e::error::E2eError>(if served {
                Check::Ready(())
            } else {
                Check::NotYet("no KUBE-SVC rule for default/kubernetes:https".into())
            })
        },
    )
    .await
    .expect("kube-proxy serving the kubernetes Service on node-1");
    let reached = probe
        .wait_reached(now_ms(), "through kube-proxy after the rollback")
        .await;
    assert_via_cluster_ip(&reached, &cluster_ip);
    println!(
        "Ebpf -> KubeProxy Ready in {:.1} s with the kubernetes Service dead ({dead_window}); the probe reached the API server through kube-proxy: {reached}",
        to_kube_proxy.as_secs_f64()
    );

    let report = traffic.stop().await;
    world.assert_traffic_healthy(
        &report,
        "with the kubernetes Service dead during both transitions",
    );
    probe.stop().await.expect("the probe stopped");
}

/// The rollout of this scenario's transitions: the harness's recovery's, with a drain bounded
/// at [`DRAIN_TIMEOUT_SECONDS`].
fn rollout() -> serde_json::Value {
    serde_json::json!({
        "maxUnavailable": 3,
        "nodeReadyTimeoutSeconds": 60,
        "drainTimeoutSeconds": DRAIN_TIMEOUT_SECONDS,
    })
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as u64)
        .unwrap_or(0)
}

/// The `kubernetes` Service's `ClusterIP:port` and its one endpoint `address:port`.
async fn kubernetes_service(world: &World) -> Outcome<(String, String)> {
    let service = Api::<Service>::namespaced(world.client.clone(), "default")
        .get("kubernetes")
        .await?;
    let spec = service.spec.ok_or("the kubernetes Service has no spec")?;
    let port = spec
        .ports
        .as_ref()
        .and_then(|ports| ports.first())
        .map(|port| port.port)
        .ok_or("the kubernetes Service has no port")?;
    let cluster_ip = format!("{}:{port}", spec.cluster_ip.ok_or("no ClusterIP")?);
    let endpoints = endpoint_addresses(world).await?;
    match endpoints.as_slice() {
        [endpoint] => Ok((cluster_ip, endpoint.clone())),
        other => Err(format!("the kubernetes Service has endpoints {other:?}, not one").into()),
    }
}

/// Every `address:port` of the `kubernetes` Endpoints object.
async fn endpoint_addresses(world: &World) -> Outcome<Vec<String>> {
    let endpoints = Api::<Endpoints>::namespaced(world.client.clone(), "default")
        .get("kubernetes")
        .await?;
    let mut found = Vec::new();
    for subset in endpoints.subsets.iter().flatten() {
        for address in subset.addresses.iter().flatten() {
            for port in subset.ports.iter().flatten() {
                found.push(format!("{}:{}", address.ip, port.port));
            }
        }
    }
    Ok(found)
}

/// The API server's endpoint reconciler kept the Service's endpoint as it was: what broke the
/// Service was the address, not the object (which the reconciler would mend).
async fn assert_endpoint_kept(world: &World, endpoint: &str) {
    let endpoints = endpoint_addresses(world)
        .await
        .expect("the kubernetes Endpoints");
    assert_eq!(
        endpoints,
        vec![endpoint.to_string()],
        "the kubernetes Service's endpoints"
    );
}

fn assert_via_cluster_ip(attempt: &Attempt, cluster_ip: &str) {
    assert!(
        attempt.line.contains(&format!(" via={cluster_ip} ")),
        "the probe reached the API server but not through the ClusterIP {cluster_ip}: {}",
        attempt.line
    );
}

/// A rule in the cluster's namespace (where the API server listens) dropping every packet to
/// the Service's endpoint, as a dead host would; removed when dropped, so a failed assertion
/// leaves no dead Service behind for the scenarios after it.
struct DeadEndpoint {
    rule: Vec<String>,
    /// When the rule was in place (milliseconds since the Unix epoch).
    since_ms: u64,
}

impl DeadEndpoint {
    fn block(endpoint: &str) -> Outcome<Self> {
        let (address, port) = endpoint
            .rsplit_once(':')
            .ok_or_else(|| format!("failed to split the endpoint {endpoint}"))?;
        let rule: Vec<String> = [
            "INPUT", "-d", address, "-p", "tcp", "--dport", port, "-j", "DROP",
        ]
        .iter()
        .map(|word| word.to_string())
        .collect();
        let mut arguments = vec!["-w", "-I"];
        arguments.extend(rule.iter().map(String::as_str));
        run("iptables", &arguments)?;
        Ok(DeadEndpoint {
            rule,
            since_ms: now_ms(),
        })
    }
}

impl Drop for DeadEndpoint {
    fn drop(&mut self) {
        let mut arguments = vec!["-w", "-D"];
        arguments.extend(self.rule.iter().map(String::as_str));
        if let Err(error) = run("iptables", &arguments) {
            eprintln!("failed to remove the rule that made the Service's endpoint dead: {error}");
        }
    }
}

/// One request of the probe, as it printed it.
#[derive(Clone, Debug)]
struct Attempt {
    reached: bool,
    started_ms: u64,
    ended_ms: u64,
    line: String,
}

impl std::fmt::Display for Attempt {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(&self.line)
    }
}

fn parse_attempts(output: &str) -> Vec<Attempt> {
    output
        .lines()
        .filter_map(|line| {
            let reached = if line.starts_with("PROBE_REACHED ") {
                true
            } else if line.starts_with("PROBE_FAILED ") {
                false
            } else {
                return None;
            };
            let field = |name: &str| {
                line.split_whitespace()
                    .find_map(|word| word.strip_prefix(name))
                    .and_then(|value| value.parse().ok())
            };
            Some(Attempt {
                reached,
                started_ms: field("started=")?,
                ended_ms: field("ended=")?,
                line: line.to_string(),
            })
        })
        .collect()
}

/// The probe pod: its Deployment and the output of its process.
struct Probe {
    deployments: Api<Deployment>,
    output: std::path::PathBuf,
    pod_uid: String,
}

impl Probe {
    /// Applies `manifests/api-probe.yaml` and waits until the pod runner runs its process.
    async fn start(world: &World) -> Outcome<Self> {
        let deployment: Deployment = switchyard_e2e::objects::manifest("api-probe.yaml")?;
        let deployments = Api::<Deployment>::namespaced(world.client.clone(), "default");
        deployments
            .patch(
                PROBE,
                &PatchParams::apply("switchyard-e2e").force(),
                &Patch::Apply(&deployment),
            )
            .await?;
        let paths = world.paths.clone();
        let process = wait_for(
            "see the probe pod's process started by the pod runner",
            WaitOptions::new(PROBE_TIMEOUT),
            || {
                let paths = paths.clone();
                async move {
                    let events = read_events(&paths.pod_runner_events())?;
                    Ok::<_, switchyard_e2e::error::E2eError>(
                        match running_processes(&events, PROBE).into_values().next() {
                            Some(process) => Check::Ready(process),
                            None => Check::NotYet("no api-probe process yet".into()),
                        },
                    )
                }
            },
        )
        .await?;
        let output = paths
            .process_directory(
                &process.namespace,
                &process.pod,
                &process.pod_uid,
                &process.container,
            )
            .join("output.log");
        Ok(Probe {
            deployments,
            output,
            pod_uid: process.pod_uid,
        })
    }

    fn attempts(&self) -> Vec<Attempt> {
        parse_attempts(&std::fs::read_to_string(&self.output).unwrap_or_default())
    }

    fn last_lines(&self) -> String {
        let attempts = self.attempts();
        let tail = &attempts[attempts.len().saturating_sub(3)..];
        tail.iter()
            .map(|attempt| attempt.line.as_str())
            .collect::<Vec<_>>()
            .join(" | ")
    }

    /// Waits for an attempt started at or after `since_ms` that reached the API server.
    async fn wait_reached(&self, since_ms: u64, how: &str) -> Attempt {
        wait_for(
            &format!("see the probe reach the API server {how}"),
            WaitOptions::new(PROBE_TIMEOUT).every(Duration::from_millis(200)),
            || async move {
                Ok::<_, String>(
                    match self
                        .attempts()
                        .into_iter()
                        .find(|attempt| attempt.reached && attempt.started_ms >= since_ms)
                    {
                        Some(attempt) => Check::Ready(attempt),
                        None => Check::NotYet(format!("its last attempts: {}", self.last_lines())),
                    },
                )
            },
        )
        .await
        .unwrap_or_else(|error| panic!("{error}"))
    }

    /// The control: an attempt started after the endpoint died has failed (so it is dead for
    /// clients of the Service).
    async fn wait_failed(&self, since_ms: u64) {
        wait_for(
            "see the probe fail to reach the API server through the Service whose endpoint is dead",
            WaitOptions::new(Duration::from_secs(20)).every(Duration::from_millis(200)),
            || async move {
                let attempts: Vec<Attempt> = self
                    .attempts()
                    .into_iter()
                    .filter(|attempt| attempt.started_ms >= since_ms)
                    .collect();
                Ok::<_, String>(match attempts.iter().find(|attempt| attempt.reached) {
                    Some(reached) => Check::Failed(format!("it reached it: {reached}")),
                    None if !attempts.is_empty() => Check::Ready(()),
                    None => Check::NotYet(format!("no attempt since; last: {}", self.last_lines())),
                })
            },
        )
        .await
        .unwrap_or_else(|error| panic!("{error}"))
    }

    /// No attempt started since `since_ms` (when the endpoint died) reached the API server, and
    /// there were enough of them to say so (one at least every 4 s: 3 s at most each, then
    /// 0.5 s). Returns a summary.
    fn assert_never_reached_since(&self, since_ms: u64, transition: &str) -> String {
        let now = now_ms();
        let attempts: Vec<Attempt> = self
            .attempts()
            .into_iter()
            .filter(|attempt| attempt.started_ms >= since_ms)
            .collect();
        if let Some(reached) = attempts.iter().find(|attempt| attempt.reached) {
            panic!("the probe reached the API server through the Service while its endpoint was dead, during {transition}: {reached}");
        }
        let window = Duration::from_millis(now.saturating_sub(since_ms));
        let expected = (window.as_secs() / 4).max(1) as usize;
        assert!(
            attempts.len() >= expected,
            "the probe made {} attempts in the {window:.1?} the endpoint was dead during {transition} (at least {expected} expected): {}",
            attempts.len(),
            self.last_lines()
        );
        let longest = attempts
            .iter()
            .map(|attempt| attempt.ended_ms.saturating_sub(attempt.started_ms))
            .max()
            .unwrap_or(0);
        format!(
            "{window:.1?}: {} probe attempts through the Service, all failed, the longest after {longest} ms",
            attempts.len()
        )
    }

    /// Deletes the Deployment and waits until its process has exited (before its network
    /// namespace goes).
    async fn stop(self) -> Outcome<()> {
        self.deployments
            .delete(PROBE, &DeleteParams::foreground())
            .await?;
        let started = Instant::now();
        let events_path =
            switchyard_e2e::cluster::ClusterPaths::from_environment().pod_runner_events();
        while running_processes(&read_events(&events_path)?, PROBE).contains_key(&self.pod_uid) {
            if started.elapsed() > PROBE_TIMEOUT {
                return Err(format!(
                    "failed to see the probe's process exit within {PROBE_TIMEOUT:?}"
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probes_lines_become_attempts_and_other_output_is_ignored() {
        let attempts = parse_attempts(
            "PROBE_REACHED started=10 ended=25 via=10.96.0.1:443 http=200 version=v1.20.2\n\
             cat: no such file\n\
             PROBE_FAILED started=30 ended=1031 exit=28 curl: (28) Connection timed out\n",
        );
        assert_eq!(attempts.len(), 2);
        assert!(attempts[0].reached && attempts[0].started_ms == 10 && attempts[0].ended_ms == 25);
        assert!(!attempts[1].reached && attempts[1].ended_ms == 1031);
        assert_via_cluster_ip(&attempts[0], "10.96.0.1:443");
    }
}
