//! Operator scale: the real operator binary against a local API server (etcd and
//! kube-apiserver only: no kubelets, no controllers), Node objects created
//! directly, and simulated agents (`switchyard-bench simulated-agents`, a process
//! of its own) that answer each DataplaneNode spec change after a random
//! 50-500 ms. Measured: a KubeProxy -> Ebpf transition with maxUnavailable 10%.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use switchyard_crds::{DataplaneConfig, DataplaneNode, DataplanePhase};

use crate::apiserver::{kubeconfig_path, ControlPlane};
use crate::error::{Error, Result};
use crate::load::unix_micros;
use crate::report::{
    add_run_rows, announce_run, measured, number, run_result, spread_cells, Figure, RunResult,
    Spread, Summary, Table,
};
use crate::systems::Binaries;
use crate::topology::Process;
use crate::Plan;

mod metrics;
mod simulated;

use metrics::reconcile_histogram;
pub use metrics::{count_audit_requests, waiting_on_agents};
pub use simulated::simulated_agents;

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
            announce_run(
                &format!("operator scale: {nodes} nodes"),
                run,
                plan.operator_runs,
            );
            let measured = transition(nodes, run_number, binaries, work).await;
            run_number += 1;
            runs.push(run_result(
                &format!("operator transition with {nodes} nodes"),
                measured,
            ));
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

#[cfg(test)]
mod tests;
