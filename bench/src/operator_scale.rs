//! Operator scale: the real operator binary against a local API server (etcd and
//! kube-apiserver only: no kubelets, no controllers), Node objects created
//! directly, and simulated agents (`switchyard-bench simulated-agents`, a process
//! of its own) that answer each DataplaneNode spec change after a random
//! 50-500 ms. Measured: a KubeProxy -> Ebpf transition with maxUnavailable 10%.

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::ResourceExt as _;
use serde_json::json;
use switchyard_crds::{
    condition_types, reasons, set_condition, Condition, ConditionStatus, DataplaneConfig,
    DataplaneMode, DataplaneNode, DataplaneNodeStatus, DataplanePhase,
};

use crate::apiserver::{kubeconfig_path, ControlPlane};
use crate::error::{Error, Result};
use crate::load::{unix_micros, Picker};
use crate::report::{
    add_run_rows, measured, number, spread_cells, Figure, RunResult, Spread, Summary, Table,
};
use crate::systems::Binaries;
use crate::topology::Process;
use crate::Plan;

pub const NAME: &str = "operator-transition";
const OPERATOR_NAMESPACE: &str = "switchyard-system";
const METRICS_ADDRESS: &str = "127.0.0.1:18080";

pub async fn run(
    plan: &Plan,
    binaries: &Binaries,
    work: &Path,
    summary: &mut Summary,
    tables: &mut Vec<Table>,
) -> Result<()> {
    let mut table = Table::new(
        &format!(
            "Operator: KubeProxy -> Ebpf with maxUnavailable 10%, simulated agents answering after 50-500 ms, \
             {} runs per node count",
            plan.operator_runs
        ),
        &COLUMNS,
    );
    let mut requests_table = Table::new(
        "Operator API requests during the transition, by verb and resource (median of the runs, (min-max))",
        &REQUEST_COLUMNS,
    );
    // Each run gets a control plane, seed and log names of its own.
    let mut run_number = 0;
    for nodes in plan.node_counts.iter().copied() {
        let mut runs = Vec::new();
        for run in 0..plan.operator_runs {
            println!(
                "operator scale: {nodes} nodes (run {} of {})",
                run + 1,
                plan.operator_runs
            );
            let measured = transition(nodes, run_number, binaries, work).await;
            run_number += 1;
            runs.push(measured.map_err(|error| {
                eprintln!("bench: operator transition with {nodes} nodes: {error}");
                error.first_line()
            }));
        }
        record(summary, nodes, &runs);
        rows(&mut table, &mut requests_table, nodes, &runs);
    }
    table.note(
        "\"waiting on agents\": time during which at least one simulated agent was still sitting on its \
         random 50-500 ms delay; \"operator time\" is the rest. Reconcile quantiles are interpolated \
         from the operator's `switchyard_operator_reconcile_duration_seconds` histogram buckets. API \
         requests: the operator's own requests in the API server's audit log from the DataplaneConfig's \
         creation to Ready (watches count once, when opened). Each run has a fresh API server; a node \
         count's \"all\" row gives the median (min-max) of its runs.",
    );
    print!("{}", table.render());
    tables.push(table);
    requests_table.note(
        "From the API server's audit log, the operator's user only, from the DataplaneConfig's \
         creation to Ready; a watch counts once, when it is opened.",
    );
    print!("{}", requests_table.render());
    tables.push(requests_table);
    Ok(())
}

const COLUMNS: [&str; 12] = [
    "nodes",
    "run",
    "total s",
    "waiting on agents s",
    "operator time s",
    "reconciles",
    "reconcile p50 ms",
    "reconcile p99 ms",
    "operator API requests",
    "per node",
    "operator RSS MiB",
    "peak RSS MiB",
];
const REQUEST_COLUMNS: [&str; 4] = ["nodes", "request", "count", "per node"];

type Run = RunResult<TransitionFigures>;

const SYSTEM: &str = "switchyard-operator";

/// Every figure's median, `-min` and `-max` over the measured runs (the
/// per-verb requests per node too); the number of runs; `failed-to-measure`
/// when a run could not be measured.
fn record(summary: &mut Summary, nodes: u32, runs: &[Run]) {
    let scale = u64::from(nodes);
    let measured =
        summary.record_measured_runs(NAME, SYSTEM, scale, runs, |run| run.figures(nodes));
    for verb in keys(&measured, |run| &run.requests_by_verb) {
        let samples: Vec<f64> = measured
            .iter()
            .map(|run| run.requests_by_verb.get(&verb).copied().unwrap_or(0) as f64 / nodes as f64)
            .collect();
        summary.record_runs(
            NAME,
            SYSTEM,
            scale,
            &format!("api-requests-per-node-{verb}"),
            &samples,
            "requests",
        );
    }
}

/// Every key any run has in the map `of` picks.
fn keys(
    runs: &[&TransitionFigures],
    of: impl Fn(&TransitionFigures) -> &BTreeMap<String, u64>,
) -> Vec<String> {
    let mut keys: Vec<String> = runs
        .iter()
        .flat_map(|run| of(run).keys().cloned())
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

fn rows(table: &mut Table, requests_table: &mut Table, nodes: u32, runs: &[Run]) {
    let count = number(nodes as f64, 0);
    let decimals = |metric: &str| match metric {
        "api-requests-per-node" => 2,
        "reconciles" | "api-requests" | "reconcile-p50" | "reconcile-p99" | "rss" | "peak-rss" => 0,
        _ => 1,
    };
    add_run_rows(
        table,
        std::slice::from_ref(&count),
        runs,
        |run| {
            run.figures(nodes)
                .into_iter()
                .map(|(metric, value, _)| {
                    let cell = number(value, decimals(metric));
                    if metric != "api-requests" {
                        return cell;
                    }
                    let mut verbs: Vec<String> = run
                        .requests_by_verb
                        .iter()
                        .map(|(verb, count)| format!("{verb} {count}"))
                        .collect();
                    verbs.sort();
                    format!("{cell} ({})", verbs.join(", "))
                })
                .collect()
        },
        |measured| {
            spread_cells(
                measured,
                |run| run.figures(nodes),
                |metric, _| decimals(metric),
            )
        },
    );
    let measured = measured(runs);
    for request in keys(&measured, |run| &run.requests_by_verb_and_resource) {
        let samples: Vec<f64> = measured
            .iter()
            .map(|run| {
                run.requests_by_verb_and_resource
                    .get(&request)
                    .copied()
                    .unwrap_or(0) as f64
            })
            .collect();
        let per_node: Vec<f64> = samples.iter().map(|count| count / nodes as f64).collect();
        requests_table.row(vec![
            count.clone(),
            request,
            Spread::of(&samples)
                .map(|spread| spread.display(0))
                .unwrap_or_else(|| "-".into()),
            Spread::of(&per_node)
                .map(|spread| spread.display(3))
                .unwrap_or_else(|| "-".into()),
        ]);
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
struct TransitionFigures {
    total: f64,
    waiting_on_agents: f64,
    reconciles: f64,
    reconcile_p50: f64,
    reconcile_p99: f64,
    requests: u64,
    requests_by_verb: BTreeMap<String, u64>,
    requests_by_verb_and_resource: BTreeMap<String, u64>,
    rss_mib: f64,
    peak_rss_mib: f64,
}

impl TransitionFigures {
    /// The figures of a run with `nodes` nodes, as (summary metric, value,
    /// unit), in table order.
    fn figures(&self, nodes: u32) -> Vec<Figure> {
        vec![
            ("total-time", self.total, "s"),
            ("waiting-on-agents", self.waiting_on_agents, "s"),
            ("operator-time", self.total - self.waiting_on_agents, "s"),
            ("reconciles", self.reconciles, "reconciles"),
            ("reconcile-p50", self.reconcile_p50 * 1000.0, "ms"),
            ("reconcile-p99", self.reconcile_p99 * 1000.0, "ms"),
            ("api-requests", self.requests as f64, "requests"),
            (
                "api-requests-per-node",
                self.requests as f64 / nodes as f64,
                "requests",
            ),
            ("rss", self.rss_mib, "MiB"),
            ("peak-rss", self.peak_rss_mib, "MiB"),
        ]
    }
}

async fn transition(
    nodes: u32,
    round: usize,
    binaries: &Binaries,
    work: &Path,
) -> Result<TransitionFigures> {
    let control_plane = ControlPlane::start(
        &binaries.kubernetes,
        work,
        &format!("operator-apiserver-{round}"),
    )
    .await?;
    let client = control_plane.client.clone();
    prepare(&client, nodes).await?;
    let answers = work.join(format!("agent-answers-{round}.jsonl"));
    let _ = std::fs::remove_file(&answers);
    let mut agents = Process::start(
        "simulated agents",
        None,
        &binaries.bench,
        &[
            "simulated-agents".into(),
            "--seed".into(),
            (round as u64 + 1).to_string(),
        ],
        &[
            (
                "KUBECONFIG".into(),
                kubeconfig_path(work, "simulated-agents", "")
                    .display()
                    .to_string(),
            ),
            (
                "SWITCHYARD_BENCH_ANSWERS".into(),
                answers.display().to_string(),
            ),
        ],
        &work.join(format!("simulated-agents-{round}.log")),
    )?;
    let mut operator = Process::start(
        "switchyard-operator",
        None,
        &binaries.operator,
        &[
            format!("--metrics-address={METRICS_ADDRESS}"),
            "--api-server-address=127.0.0.1:6443".into(),
            "--identity=bench-operator".into(),
        ],
        &[
            (
                "KUBECONFIG".into(),
                kubeconfig_path(work, "switchyard-operator", "")
                    .display()
                    .to_string(),
            ),
            ("POD_NAMESPACE".into(), OPERATOR_NAMESPACE.into()),
            (
                "RUST_LOG".into(),
                "info,switchyard_operator::controller=debug".into(),
            ),
        ],
        &work.join(format!("operator-{round}.log")),
    )?;
    // Before the transition: every Node has its DataplaneNode, answered by its agent.
    let dataplane_nodes: Api<DataplaneNode> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let list = dataplane_nodes.list(&Default::default()).await;
        let answered = list
            .map(|list| {
                list.items
                    .iter()
                    .filter(|node| {
                        node.status
                            .as_ref()
                            .and_then(|status| status.observed_generation)
                            == node.metadata.generation
                    })
                    .count()
            })
            .unwrap_or(0);
        if answered == nodes as usize {
            break;
        }
        if Instant::now() > deadline || !operator.is_running() {
            return Err(Error::System(format!(
                "failed to see {nodes} DataplaneNodes created and answered ({answered} so far); operator log:\n{}",
                tail(&operator.log_text(), 20)
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let reconcile_before = reconcile_histogram().unwrap_or_default();
    let configs: Api<DataplaneConfig> = Api::all(client.clone());
    let config: DataplaneConfig = serde_json::from_value(json!({
        "apiVersion": "switchyard.dev/v1alpha1",
        "kind": "DataplaneConfig",
        "metadata": {"name": "default"},
        "spec": {"mode": "Ebpf", "rollout": {"maxUnavailable": "10%", "nodeReadyTimeoutSeconds": 120}},
    }))
    .map_err(|error| Error::System(format!("failed to build the DataplaneConfig: {error}")))?;
    let started_unix_us = unix_micros();
    let started = Instant::now();
    configs
        .create(&PostParams::default(), &config)
        .await
        .map_err(|error| Error::System(format!("failed to create the DataplaneConfig: {error}")))?;
    let deadline = started + Duration::from_secs(1200);
    let mut peak_rss_mib: f64 = 0.0;
    loop {
        if let Some((_, peak)) = operator.memory_mib() {
            peak_rss_mib = peak_rss_mib.max(peak);
        }
        if let Ok(config) = configs.get("default").await {
            let ready = config.status.as_ref().is_some_and(|status| {
                status.phase == DataplanePhase::Ready
                    && status.observed_generation == config.metadata.generation
            });
            if ready {
                break;
            }
            if Instant::now() > deadline || !operator.is_running() {
                return Err(Error::System(format!(
                    "failed to see the transition of {nodes} nodes reach Ready within 1200 s (phase {:?}); operator log:\n{}",
                    config.status.as_ref().map(|status| status.phase),
                    tail(&operator.log_text(), 20)
                )));
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let total = started.elapsed().as_secs_f64();
    let ended_unix_us = unix_micros();
    let (rss_mib, peak) = operator.memory_mib().unwrap_or((f64::NAN, f64::NAN));
    peak_rss_mib = peak_rss_mib.max(peak);
    let reconcile_after = reconcile_histogram().unwrap_or_default();
    let reconciles = reconcile_after.subtract(&reconcile_before);
    // The audit log is written in batches: let the last ones land.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let audit = count_audit_requests(
        &control_plane.audit_log,
        "switchyard-operator",
        started_unix_us,
        ended_unix_us,
    );
    let waiting_on_agents = waiting_on_agents(&answers, started_unix_us, ended_unix_us);
    keep_logs(&[
        (
            &control_plane.audit_log,
            format!("audit-{nodes}-{round}.log"),
        ),
        (
            &work.join(format!("operator-{round}.log")),
            format!("operator-{nodes}-{round}.log"),
        ),
    ]);
    operator.stop(Duration::from_secs(5));
    agents.stop(Duration::from_secs(2));
    control_plane.stop();
    Ok(TransitionFigures {
        total,
        waiting_on_agents,
        reconciles: reconciles.count,
        reconcile_p50: reconciles.quantile(0.5),
        reconcile_p99: reconciles.quantile(0.99),
        requests: audit.total,
        requests_by_verb: audit.by_verb,
        requests_by_verb_and_resource: audit.by_verb_and_resource,
        rss_mib,
        peak_rss_mib,
    })
}

/// With `SWITCHYARD_BENCH_KEEP_OPERATOR_LOGS=<directory>`, copies the audit log and the
/// operator's log there (the work directory goes away with the run), for a closer look.
fn keep_logs(files: &[(&Path, String)]) {
    let Some(directory) = std::env::var_os("SWITCHYARD_BENCH_KEEP_OPERATOR_LOGS") else {
        return;
    };
    let directory = Path::new(&directory);
    let _ = std::fs::create_dir_all(directory);
    for (source, name) in files {
        if let Err(error) = std::fs::copy(source, directory.join(name)) {
            eprintln!("bench: failed to keep {}: {error}", source.display());
        }
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The operator's namespace, a kube-proxy DaemonSet (nothing runs it: no
/// controllers), and `nodes` Ready Nodes.
async fn prepare(client: &kube::Client, nodes: u32) -> Result<()> {
    let failed = |what: &str, error: kube::Error| {
        Error::Populate(format!("failed to create {what}: {error}"))
    };
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": OPERATOR_NAMESPACE}}))
            .map_err(|error| Error::Populate(error.to_string()))?;
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .map_err(|error| failed("the operator's namespace", error))?;
    let daemon_sets: Api<DaemonSet> = Api::namespaced(client.clone(), "kube-system");
    let daemon_set: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "kube-proxy", "namespace": "kube-system", "labels": {"k8s-app": "kube-proxy"}},
        "spec": {
            "selector": {"matchLabels": {"k8s-app": "kube-proxy"}},
            "template": {
                "metadata": {"labels": {"k8s-app": "kube-proxy"}},
                "spec": {
                    "hostNetwork": true,
                    "nodeSelector": {"kubernetes.io/os": "linux"},
                    "containers": [{
                        "name": "kube-proxy",
                        "image": "k8s.gcr.io/kube-proxy:v1.20.2",
                        "command": ["/usr/local/bin/kube-proxy", "--proxy-mode=iptables"],
                    }],
                },
            },
        },
    }))
    .map_err(|error| Error::Populate(error.to_string()))?;
    daemon_sets
        .create(&PostParams::default(), &daemon_set)
        .await
        .map_err(|error| failed("the kube-proxy DaemonSet", error))?;
    let node_api: Api<Node> = Api::all(client.clone());
    futures::stream::iter(0..nodes)
        .map(|index| {
            let node_api = node_api.clone();
            async move {
                let name = node_name(index);
                let node: Node = serde_json::from_value(json!({
                    "metadata": {"name": name, "labels": {"kubernetes.io/os": "linux", "kubernetes.io/hostname": name}},
                }))
                .map_err(|error| Error::Populate(error.to_string()))?;
                node_api
                    .create(&PostParams::default(), &node)
                    .await
                    .map_err(|error| failed(&name, error))?;
                let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
                let status = json!({"status": {
                    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                    "message": "simulated", "lastHeartbeatTime": now, "lastTransitionTime": now}],
                    "addresses": [{"type": "InternalIP", "address": node_address(index)}],
                }});
                node_api
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await
                    .map_err(|error| failed(&format!("{name}'s status"), error))?;
                Ok::<(), Error>(())
            }
        })
        .buffer_unordered(64)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

fn node_name(index: u32) -> String {
    format!("node-{index:05}")
}

fn node_address(index: u32) -> String {
    format!(
        "10.{}.{}.{}",
        100 + index / 65536,
        (index / 256) % 256,
        index % 256
    )
}

/// A snapshot of a Prometheus histogram (bucket upper bounds -> cumulative counts).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Histogram {
    pub buckets: Vec<(f64, f64)>,
    pub count: f64,
}

impl Histogram {
    pub fn parse(metrics: &str, name: &str) -> Option<Self> {
        let bucket_prefix = format!("{name}_bucket{{le=\"");
        let mut buckets = Vec::new();
        let mut count = None;
        for line in metrics.lines() {
            if let Some(rest) = line.strip_prefix(&bucket_prefix) {
                let (bound, value) = rest.split_once("\"}")?;
                let bound = if bound == "+Inf" {
                    f64::INFINITY
                } else {
                    bound.parse().ok()?
                };
                buckets.push((bound, value.trim().parse().ok()?));
            } else if let Some(value) = line.strip_prefix(&format!("{name}_count ")) {
                count = value.trim().parse().ok();
            }
        }
        Some(Self {
            buckets,
            count: count?,
        })
    }

    pub fn subtract(&self, earlier: &Histogram) -> Histogram {
        let buckets = self
            .buckets
            .iter()
            .map(|(bound, value)| {
                let before = earlier
                    .buckets
                    .iter()
                    .find(|(b, _)| b == bound)
                    .map(|(_, v)| *v)
                    .unwrap_or(0.0);
                (*bound, value - before)
            })
            .collect();
        Histogram {
            buckets,
            count: self.count - earlier.count,
        }
    }

    /// As Prometheus' `histogram_quantile`: linear within the bucket holding the rank.
    pub fn quantile(&self, quantile: f64) -> f64 {
        if self.count <= 0.0 {
            return f64::NAN;
        }
        let rank = quantile * self.count;
        let mut lower_bound = 0.0;
        let mut lower_count = 0.0;
        for (bound, cumulative) in &self.buckets {
            if *cumulative >= rank {
                if bound.is_infinite() {
                    return lower_bound;
                }
                let in_bucket = cumulative - lower_count;
                if in_bucket <= 0.0 {
                    return *bound;
                }
                return lower_bound + (bound - lower_bound) * (rank - lower_count) / in_bucket;
            }
            lower_bound = *bound;
            lower_count = *cumulative;
        }
        lower_bound
    }
}

fn reconcile_histogram() -> Option<Histogram> {
    let output = std::process::Command::new("curl")
        .args([
            "-sf",
            "--max-time",
            "5",
            &format!("http://{METRICS_ADDRESS}/metrics"),
        ])
        .output()
        .ok()?;
    Histogram::parse(
        &String::from_utf8_lossy(&output.stdout),
        "switchyard_operator_reconcile_duration_seconds",
    )
}

/// Requests by one user in an audit log window: in all, per verb, and per verb and
/// resource (`patch dataplanenodes`, `patch dataplaneconfigs/status`, ...).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AuditCount {
    pub total: u64,
    pub by_verb: BTreeMap<String, u64>,
    pub by_verb_and_resource: BTreeMap<String, u64>,
}

/// Requests by `user` in a JSON audit log between two instants (µs since the
/// epoch, by `requestReceivedTimestamp`).
pub fn count_audit_requests(log: &Path, user: &str, from_us: u64, to_us: u64) -> AuditCount {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut count = AuditCount::default();
    for line in text.lines() {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if event["user"]["username"] != user {
            continue;
        }
        let received = event["requestReceivedTimestamp"]
            .as_str()
            .and_then(|time| chrono::DateTime::parse_from_rfc3339(time).ok())
            .map(|time| time.timestamp_micros() as u64)
            .unwrap_or(0);
        if received < from_us || received > to_us {
            continue;
        }
        count.total += 1;
        let verb = event["verb"].as_str().unwrap_or("?").to_string();
        let resource = match (
            event["objectRef"]["resource"].as_str(),
            event["objectRef"]["subresource"].as_str(),
        ) {
            (Some(resource), Some(subresource)) => format!("{resource}/{subresource}"),
            (Some(resource), None) => resource.to_owned(),
            (None, _) => "(no resource)".to_owned(),
        };
        *count
            .by_verb_and_resource
            .entry(format!("{verb} {resource}"))
            .or_insert(0) += 1;
        *count.by_verb.entry(verb).or_insert(0) += 1;
    }
    count
}

/// The time within `[from, to]` during which at least one agent was sitting on
/// its delay (the union of `[seen, answered]` intervals), in seconds.
pub fn waiting_on_agents(answers: &Path, from_us: u64, to_us: u64) -> f64 {
    let text = std::fs::read_to_string(answers).unwrap_or_default();
    let mut intervals: Vec<(u64, u64)> = text
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|answer| Some((answer["seen_us"].as_u64()?, answer["answered_us"].as_u64()?)))
        .map(|(seen, answered)| (seen.max(from_us), answered.min(to_us)))
        .filter(|(seen, answered)| answered > seen)
        .collect();
    union_seconds(&mut intervals)
}

pub fn union_seconds(intervals: &mut [(u64, u64)]) -> f64 {
    intervals.sort_unstable();
    let mut total = 0;
    let mut current: Option<(u64, u64)> = None;
    for (start, end) in intervals.iter().copied() {
        current = match current {
            Some((current_start, current_end)) if start <= current_end => {
                Some((current_start, current_end.max(end)))
            }
            Some((current_start, current_end)) => {
                total += current_end - current_start;
                Some((start, end))
            }
            None => Some((start, end)),
        };
    }
    if let Some((start, end)) = current {
        total += end - start;
    }
    total as f64 / 1e6
}

/// What an agent reports about `node`'s spec (no kube-proxy pods run anywhere:
/// its rules are present until the agent is told to clean them).
pub fn simulated_status(
    node: &DataplaneNode,
    now: chrono::DateTime<chrono::Utc>,
) -> DataplaneNodeStatus {
    let generation = node.metadata.generation;
    let mut status = node.status.clone().unwrap_or_default();
    let ebpf = node.spec.mode == DataplaneMode::Ebpf;
    let rules_present = !node.spec.iptables_cleanup;
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
            rules_present && !ebpf,
            if rules_present && !ebpf {
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
    status.observed_generation = generation;
    status.agent_version = Some("simulated".into());
    status
}

/// `switchyard-bench simulated-agents`: watches every DataplaneNode and answers
/// each new generation after a random 50-500 ms, as its agent would. Each answer
/// is appended to `$SWITCHYARD_BENCH_ANSWERS` as `{"seen_us","answered_us"}`.
pub async fn simulated_agents(seed: u64) -> Result<()> {
    let client = kube::Client::try_default().await.map_err(|error| {
        Error::ApiServer(format!("failed to build a client from KUBECONFIG: {error}"))
    })?;
    let answers_path = std::env::var_os("SWITCHYARD_BENCH_ANSWERS")
        .ok_or_else(|| Error::System("failed to find SWITCHYARD_BENCH_ANSWERS".into()))?;
    let answers = Arc::new(Mutex::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&answers_path)
            .map_err(|error| Error::System(format!("failed to open the answers file: {error}")))?,
    ));
    let api: Api<DataplaneNode> = Api::all(client);
    // name -> the generation already being answered.
    let mut answering: HashMap<String, i64> = HashMap::new();
    let mut picker = Picker::new(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut events = watcher(api.clone(), watcher::Config::default()).boxed();
    while let Some(event) = events.next().await {
        let nodes = match event {
            Ok(watcher::Event::Apply(node)) | Ok(watcher::Event::InitApply(node)) => vec![node],
            Ok(_) => continue,
            Err(error) => {
                eprintln!("simulated agents: watch error: {error}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        for node in nodes {
            let Some(generation) = node.metadata.generation else {
                continue;
            };
            let observed = node
                .status
                .as_ref()
                .and_then(|status| status.observed_generation);
            let name = node.name_any();
            if observed == Some(generation) || answering.get(&name) == Some(&generation) {
                continue;
            }
            answering.insert(name.clone(), generation);
            let delay = Duration::from_millis(50 + picker.below(451) as u64);
            let seen_us = unix_micros();
            let (api, answers) = (api.clone(), answers.clone());
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let status = simulated_status(&node, chrono::Utc::now());
                let patch = json!({"status": status});
                for attempt in 0..5u64 {
                    match api
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                    {
                        Ok(_) => break,
                        Err(error) => {
                            eprintln!("simulated agents: failed to patch {name}'s status: {error}");
                            tokio::time::sleep(Duration::from_millis(100 * (attempt + 1))).await;
                        }
                    }
                }
                let line = json!({"name": name, "seen_us": seen_us, "answered_us": unix_micros()});
                if let Ok(mut file) = answers.lock() {
                    let _ = writeln!(file, "{line}");
                }
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transition_figures(
        total: f64,
        reconcile_p99: f64,
        requests_by_verb: &[(&str, u64)],
    ) -> TransitionFigures {
        let requests_by_verb: BTreeMap<String, u64> = requests_by_verb
            .iter()
            .map(|(verb, count)| (verb.to_string(), *count))
            .collect();
        TransitionFigures {
            total,
            waiting_on_agents: total / 2.0,
            reconciles: 10.0,
            reconcile_p50: reconcile_p99 / 2.0,
            reconcile_p99,
            requests: requests_by_verb.values().sum(),
            requests_by_verb_and_resource: requests_by_verb
                .iter()
                .map(|(verb, count)| (format!("{verb} dataplanenodes"), *count))
                .collect(),
            requests_by_verb,
            rss_mib: 20.0,
            peak_rss_mib: 21.0,
        }
    }

    #[test]
    fn the_summary_keeps_each_figure_over_the_runs_and_every_verb_any_run_made() {
        let runs: Vec<Run> = vec![
            Ok(transition_figures(
                10.0,
                0.1,
                &[("patch", 200), ("update", 4)],
            )),
            Err("failed to start the operator".into()),
            Ok(transition_figures(20.0, 0.3, &[("patch", 220)])),
        ];
        let mut summary = Summary::default();
        record(&mut summary, 100, &runs);
        let find = |metric: &str| summary.find(NAME, SYSTEM, 100, metric);
        assert_eq!(find("runs"), Some(2.0));
        assert_eq!(find("failed-to-measure"), Some(1.0));
        assert_eq!(find("total-time"), Some(15.0));
        assert_eq!(find("operator-time-max"), Some(10.0));
        assert_eq!(find("reconcile-p99-max"), Some(300.0));
        assert_eq!(find("api-requests-per-node"), Some(2.12));
        assert_eq!(find("api-requests-per-node-update-min"), Some(0.0));
        assert_eq!(find("api-requests-per-node-update-max"), Some(0.04));
    }

    #[test]
    fn the_tables_show_every_run_and_the_medians_of_a_node_count() {
        let runs: Vec<Run> = vec![
            Ok(transition_figures(10.0, 0.1, &[("patch", 200)])),
            Err("failed to start the operator".into()),
            Ok(transition_figures(
                20.0,
                0.3,
                &[("patch", 220), ("update", 4)],
            )),
        ];
        let mut table = Table::new("operator", &COLUMNS);
        let mut requests = Table::new("requests", &REQUEST_COLUMNS);
        rows(&mut table, &mut requests, 100, &runs);
        let text = table.render();
        assert!(text.contains("patch 200"), "{text}");
        assert!(
            text.contains("FAILED: failed to start the operator"),
            "{text}"
        );
        let all = text
            .lines()
            .find(|line| line.contains("| all"))
            .unwrap_or_default();
        assert!(all.contains("15.0 (10.0-20.0)"), "{text}");
        assert!(all.contains("200 (100-300)"), "{text}");
        let requests = requests.render();
        let update = requests
            .lines()
            .find(|line| line.contains("update dataplanenodes"))
            .unwrap_or_default();
        assert!(update.contains("2 (0-4)"), "{requests}");
    }

    #[test]
    fn quantiles_are_interpolated_within_the_bucket_holding_the_rank() {
        let metrics = "x_bucket{le=\"0.1\"} 50\nx_bucket{le=\"0.2\"} 100\nx_bucket{le=\"+Inf\"} 100\nx_count 100\n";
        let histogram = Histogram::parse(metrics, "x").expect("parses");
        assert_eq!(histogram.count, 100.0);
        assert!((histogram.quantile(0.5) - 0.1).abs() < 1e-9);
        assert!((histogram.quantile(0.75) - 0.15).abs() < 1e-9);
        let empty = Histogram {
            buckets: vec![],
            count: 0.0,
        };
        assert!(empty.quantile(0.5).is_nan());
        let later = Histogram::parse(
            "x_bucket{le=\"0.1\"} 60\nx_bucket{le=\"0.2\"} 130\nx_bucket{le=\"+Inf\"} 130\nx_count 130\n",
            "x",
        )
        .expect("parses");
        let difference = later.subtract(&histogram);
        assert_eq!(difference.count, 30.0);
        assert_eq!(difference.buckets[0], (0.1, 10.0));
    }

    #[test]
    fn overlapping_waits_count_once() {
        let mut intervals = vec![(0, 1_000_000), (500_000, 1_500_000), (3_000_000, 3_500_000)];
        assert!((union_seconds(&mut intervals) - 2.0).abs() < 1e-9);
        assert_eq!(union_seconds(&mut []), 0.0);
    }

    #[test]
    fn audit_requests_are_counted_for_the_user_within_the_window() {
        let directory =
            std::env::temp_dir().join(format!("switchyard-bench-audit-{}", std::process::id()));
        std::fs::create_dir_all(&directory).expect("directory");
        let log = directory.join("audit.log");
        std::fs::write(
            &log,
            concat!(
                "{\"user\":{\"username\":\"switchyard-operator\"},\"verb\":\"list\",\"objectRef\":{\"resource\":\"nodes\"},\"requestReceivedTimestamp\":\"2026-01-01T00:00:01.000000Z\"}\n",
                "{\"user\":{\"username\":\"switchyard-operator\"},\"verb\":\"patch\",\"objectRef\":{\"resource\":\"dataplanenodes\"},\"requestReceivedTimestamp\":\"2026-01-01T00:00:02.000000Z\"}\n",
                "{\"user\":{\"username\":\"bench\"},\"verb\":\"create\",\"requestReceivedTimestamp\":\"2026-01-01T00:00:02.000000Z\"}\n",
                "{\"user\":{\"username\":\"switchyard-operator\"},\"verb\":\"get\",\"requestReceivedTimestamp\":\"2026-01-01T00:00:09.000000Z\"}\n",
            ),
        )
        .expect("write");
        let start = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .expect("time")
            .timestamp_micros() as u64;
        let count = count_audit_requests(&log, "switchyard-operator", start, start + 5_000_000);
        let _ = std::fs::remove_dir_all(&directory);
        assert_eq!(count.total, 2);
        assert_eq!(count.by_verb.get("list"), Some(&1));
        assert_eq!(count.by_verb.get("patch"), Some(&1));
        assert_eq!(
            count.by_verb_and_resource.get("patch dataplanenodes"),
            Some(&1)
        );
        assert_eq!(count.by_verb_and_resource.get("list nodes"), Some(&1));
    }

    #[test]
    fn a_simulated_agent_reports_the_spec_it_was_given() {
        let mut node = DataplaneNode::new(
            "node-00001",
            switchyard_crds::DataplaneNodeSpec::new(DataplaneMode::Ebpf),
        );
        node.metadata.generation = Some(3);
        node.spec.iptables_cleanup = true;
        let status = simulated_status(&node, chrono::Utc::now());
        assert_eq!(status.observed_generation, Some(3));
        assert!(status.condition_is_true(condition_types::PROGRAMS_ATTACHED));
        assert!(!status.condition_is_true(condition_types::KUBE_PROXY_RULES_PRESENT));
        assert!(status.condition_is_true(condition_types::READY));
    }
}
