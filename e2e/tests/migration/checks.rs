//! What the migration scenarios share: the recorders of a transition's writes, reading the
//! audit log, waiting for a DataplaneConfig to be Ready while printing the transition, the
//! phases a transition went through, long-lived connections kept intact, kube-proxy's rules
//! seen coming back, and a capture of the client pod's ICMP and ARP for diagnosing a failed
//! connection.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use switchyard_crds::{
    condition_types, find_condition, ConditionStatus, DataplaneConfig, DataplaneMode,
    DataplaneNode, DataplanePhase,
};
use switchyard_e2e::audit::AuditEvent;
use switchyard_e2e::traffic::{TrafficGenerator, TrafficReport};

use crate::migration_support::*;

/// The recorders of a KubeProxy -> Ebpf transition's writes, by etcd revision: every
/// DataplaneNode, the kube-proxy DaemonSet and its pods.
pub struct TransitionRecorders {
    pub dataplane_nodes: Recorder<DataplaneNode>,
    pub daemon_sets: Recorder<DaemonSet>,
    pub kube_proxy_pods: Recorder<Pod>,
}

impl TransitionRecorders {
    /// Starts the three recorders, each from a list of what is there now.
    pub async fn start(world: &World) -> Self {
        Self {
            dataplane_nodes: Recorder::start_listed(Api::all(world.client.clone()))
                .await
                .expect("record DataplaneNodes"),
            daemon_sets: Recorder::start_listed(world.kube_proxy_daemon_set())
                .await
                .expect("record DaemonSets"),
            kube_proxy_pods: Recorder::start_listed(world.kube_proxy_pods())
                .await
                .expect("record kube-proxy pods"),
        }
    }

    /// Waits until the recorders have every write of the transition: a watch delivers a moment
    /// after the write, and a deleted pod is no longer listed, so the deletion of each of
    /// `pods_before` (kube-proxy's pods by node, before the transition) is waited for by name.
    pub async fn wait_caught_up(&self, world: &World, pods_before: &BTreeMap<String, String>) {
        self.dataplane_nodes
            .wait_caught_up(&Api::all(world.client.clone()))
            .await
            .expect("DataplaneNodes recorded");
        self.daemon_sets
            .wait_caught_up(&world.kube_proxy_daemon_set())
            .await
            .expect("the kube-proxy DaemonSet recorded");
        self.kube_proxy_pods
            .wait_recorded("the deletion of every kube-proxy pod", |versions| {
                pods_before
                    .values()
                    .all(|pod| revision_deleted(versions, pod).is_some())
            })
            .await
            .expect("kube-proxy pods recorded");
    }
}

/// The field managers that have written an object (its `managedFields`).
pub fn field_managers(metadata: &ObjectMeta) -> Vec<String> {
    metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|entry| entry.manager.clone())
        .collect()
}

/// `dataplane_node` is Node `node`'s as the operator creates it: owned by the Node (so it goes
/// with it) and written by the operator.
pub fn assert_made_by_the_operator(dataplane_node: &DataplaneNode, node: &str) {
    let owners = dataplane_node
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default();
    assert!(
        owners.len() == 1 && owners[0].kind == "Node" && owners[0].name == node,
        "DataplaneNode {node} owned by {owners:?}"
    );
    let managers = field_managers(&dataplane_node.metadata);
    assert!(
        managers
            .iter()
            .any(|manager| manager == "switchyard-operator"),
        "DataplaneNode {node} managed by {managers:?}"
    );
}

/// Long-lived connections opened from each client before the transitions of (1) and (3).
pub const LONG_LIVED: usize = 20;

pub fn audit_time(event: &AuditEvent) -> SystemTime {
    chrono::DateTime::parse_from_rfc3339(&event.stage_timestamp)
        .map(SystemTime::from)
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// Successful completed writes (`verb`) of `resource` (no subresource) by `user`.
pub fn audit_writes<'a>(
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

pub fn object_name(event: &AuditEvent) -> &str {
    event
        .object_ref
        .as_ref()
        .and_then(|object| object.name.as_deref())
        .unwrap_or_default()
}

/// Waits until the DataplaneConfig is Ready in `mode`, printing the transition as it goes;
/// returns how long it took.
pub async fn wait_config_ready(
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

/// Every long-lived connection of `report` stayed open and exchanged all along, and both
/// backends carried some.
pub fn assert_long_lived_intact(report: &TrafficReport, what: &str) {
    println!("{what}: {report}");
    for (name, flow) in &report.flows {
        for backend in BACKENDS {
            assert!(
                flow.backends.contains_key(backend),
                "{what}: no connection of {name} reached {backend}\n{report}"
            );
        }
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
pub fn poll_kube_proxy_rules() -> (
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
pub struct ClientCapture(Option<std::process::Child>);

impl ClientCapture {
    pub fn start(world: &World) -> Self {
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
pub fn kill(pid: u32, signal: i32) {
    // SAFETY: kill(2) on a pid the pod runner reported for the operator's container.
    let result = unsafe { libc::kill(pid as i32, signal) };
    assert_eq!(result, 0, "kill {pid}: {}", std::io::Error::last_os_error());
}

/// The phases a DataplaneConfig went through, as polled (each one once in a row).
#[derive(Default)]
pub struct Phases {
    pub seen: Vec<DataplanePhase>,
    started: Option<Instant>,
    last_line: String,
}

impl Phases {
    /// Polls every 100 ms, printing each change, until `check` returns `Some`; fails the test
    /// after `timeout`.
    pub async fn wait_until<T>(
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
    pub async fn wait_degraded_on_current_spec(
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
    pub async fn ask_for_ebpf_and_wait_refused(
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
    pub async fn roll_back_to_kube_proxy(
        &mut self,
        world: &World,
        traffic: &TrafficGenerator,
        rollout: serde_json::Value,
        timeout: Duration,
    ) -> TrafficReport {
        // Switchyard restores (and so restarts) kube-proxy only where it disabled it.
        let kube_proxy_restarts = world
            .kube_proxy_daemon_set()
            .get_opt("kube-proxy")
            .await
            .expect("read the kube-proxy DaemonSet")
            .is_some_and(|daemon_set| kube_proxy_disabled(&daemon_set));
        let asked_at = SystemTime::now();
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
        assert_kube_proxy_found_its_health_ports_free(world, asked_at, kube_proxy_restarts).await;
        let report = traffic.snapshot();
        world.assert_traffic_healthy(&report, "so far");
        report
    }
}

pub fn degraded_condition(config: &DataplaneConfig) -> Option<switchyard_crds::Condition> {
    config
        .status
        .as_ref()
        .and_then(|status| find_condition(&status.conditions, condition_types::DEGRADED))
        .filter(|condition| condition.status == ConditionStatus::True)
        .cloned()
}

pub fn config_revision(config: &DataplaneConfig) -> u64 {
    config
        .metadata
        .resource_version
        .as_deref()
        .and_then(|version| version.parse().ok())
        .unwrap_or(0)
}

/// When each pod was last written (deleted, or its finalizer removed), per the audit log.
pub fn pod_gone_at(audit: &[AuditEvent], pod: &str) -> Option<SystemTime> {
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

pub fn generations(nodes: &BTreeMap<String, DataplaneNode>) -> BTreeMap<String, i64> {
    nodes
        .iter()
        .map(|(name, node)| (name.clone(), node.metadata.generation.unwrap_or(0)))
        .collect()
}

/// kube-proxy's Events with `reason`, last seen at or after `since`, as "node: message" lines
/// (kube-proxy 1.20 records them about its Node, through the core/v1 Events API).
async fn kube_proxy_events_since(
    world: &World,
    reason: &str,
    since: SystemTime,
) -> Outcome<Vec<String>> {
    // Event times have whole seconds: the second `since` falls in counts.
    let since = since
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|elapsed| SystemTime::UNIX_EPOCH + Duration::from_secs(elapsed.as_secs()))
        .unwrap_or(since);
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::all(world.client.clone());
    Ok(events
        .list(&kube::api::ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|event| {
            event.reason.as_deref() == Some(reason)
                && event
                    .source
                    .as_ref()
                    .and_then(|source| source.component.as_deref())
                    == Some("kube-proxy")
        })
        .filter(|event| {
            let last_seen = event
                .last_timestamp
                .as_ref()
                .or(event.first_timestamp.as_ref())
                .map(|time| time.0)
                .or(event.event_time.as_ref().map(|time| time.0))
                .or(event
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|time| time.0));
            last_seen.is_some_and(|time| SystemTime::from(time) >= since)
        })
        .map(|event| {
            format!(
                "{}: {}",
                event.involved_object.name.unwrap_or_default(),
                event.message.unwrap_or_default()
            )
        })
        .collect())
}

/// A way back to kube-proxy hands kube-proxy's health ports back before kube-proxy starts: no
/// kube-proxy recorded `FailedToStartProxierHealthcheck` (its healthz port taken) since
/// `since`, when the rollback was asked for. The control, when this rollback restarted
/// kube-proxy (`kube_proxy_started`): kube-proxy's own `Starting` Event since then is read
/// here, so its Events reach the API server and this reads them. kube-proxy records the
/// failure before `Starting` (it starts its healthz server first) and one recorder writes its
/// Events in order, so once `Starting` is there the failure would be too.
pub async fn assert_kube_proxy_found_its_health_ports_free(
    world: &World,
    since: SystemTime,
    kube_proxy_started: bool,
) {
    let wait = Instant::now();
    let started = loop {
        let started = kube_proxy_events_since(world, "Starting", since)
            .await
            .expect("list Events");
        if !kube_proxy_started || !started.is_empty() {
            break started;
        }
        assert!(
            wait.elapsed() < Duration::from_secs(30),
            "failed to see kube-proxy's Starting Event within 30 s of the rollback's end"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let taken = kube_proxy_events_since(world, "FailedToStartProxierHealthcheck", since)
        .await
        .expect("list Events");
    assert!(
        taken.is_empty(),
        "kube-proxy found its healthz port taken during the way back: {taken:?}"
    );
    println!(
        "no FailedToStartProxierHealthcheck since the rollback began; kube-proxy Starting Events since then: {}",
        started.len()
    );
}
