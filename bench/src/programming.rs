//! Programming latency: the time from a change in the API server to traffic
//! using it, for Switchyard and kube-proxy with 10,000 Services present, in
//! several runs per system, each on a fresh node; the systems take turns
//! within a round, starting with another one every round. Each run makes its
//! changes one spacing apart whether or not the earlier ones were seen.

use std::net::SocketAddrV4;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::apiserver;
use crate::control::ControlSuite;
use crate::dataplane::{round_order, BACKENDS};
use crate::error::Result;
use crate::load;
use crate::report::{
    add_system_rows, announce_run, number, percentile, run_result, spread_cells, Figure, RunResult,
    Summary, Table,
};
use crate::systems::{probe_targets, Running, System};
use crate::topology::{
    observe_in_background, service_address, Prober, Topology, CLIENT_NAMESPACE, MARKER_ADDRESS,
    MARKER_POD, SERVICE_TCP_PORT,
};
use crate::Plan;

pub const NAME: &str = "programming-latency";

const SYSTEMS: [System; 3] = [
    System::Switchyard,
    System::KubeProxyLegacy,
    System::KubeProxyNft,
];

/// Hands out distinct TCP Services to change, so no change is a no-op.
#[derive(Default)]
struct ChangeCounter {
    next: u32,
}

impl ChangeCounter {
    fn next_service(&mut self, services: u32) -> u32 {
        let tcp_services = (services / 2).max(1);
        let index = 2 * ((self.next.wrapping_mul(7919)) % tcp_services);
        self.next += 1;
        index
    }
}

/// What one run measured, in milliseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct ProgrammingRun {
    changes: usize,
    p50: f64,
    p90: f64,
    p99: f64,
    max: f64,
    /// Changes seen later than the goal's 100 ms, missed ones included, so a
    /// p99 miss says how many changes it is about.
    over_goal: usize,
    /// Changes not seen within 30 s (not in the percentiles).
    missed: usize,
}

impl ProgrammingRun {
    fn new(samples: &[Duration], missed: usize) -> Self {
        let mut sorted: Vec<u32> = samples.iter().map(|d| d.as_micros() as u32).collect();
        sorted.sort_unstable();
        let ms = |quantile: f64| {
            percentile(&sorted, quantile)
                .map(|us| us as f64 / 1000.0)
                .unwrap_or(f64::NAN)
        };
        Self {
            changes: samples.len() + missed,
            p50: ms(0.5),
            p90: ms(0.9),
            p99: ms(0.99),
            max: ms(1.0),
            over_goal: sorted.iter().filter(|us| **us > 100_000).count() + missed,
            missed,
        }
    }
}

/// The percentiles, whose median (min-max) over the runs is kept, in table order.
fn percentiles(run: &ProgrammingRun) -> Vec<Figure> {
    vec![
        ("p50", run.p50, "ms"),
        ("p90", run.p90, "ms"),
        ("p99", run.p99, "ms"),
        ("max", run.max, "ms"),
    ]
}

/// The counts, added up over the runs, in table order.
fn totals(measured: &[&ProgrammingRun]) -> [(&'static str, u64); 3] {
    let total =
        |count: fn(&ProgrammingRun) -> usize| measured.iter().map(|run| count(run) as u64).sum();
    [
        ("changes", total(|run| run.changes)),
        ("over-100ms", total(|run| run.over_goal)),
        ("missed", total(|run| run.missed)),
    ]
}

pub async fn measure_in_rounds(
    suite: &ControlSuite<'_>,
    summary: &mut Summary,
    tables: &mut Vec<Table>,
) {
    let plan = suite.plan;
    let systems = suite.systems_to_try(&SYSTEMS);
    let mut runs: Vec<Vec<RunResult<ProgrammingRun>>> =
        systems.iter().map(|_| Vec::new()).collect();
    let mut counter = ChangeCounter::default();
    for round in 0..plan.programming_runs {
        for index in round_order(systems.len(), round) {
            let system = systems[index];
            let changes = if system == System::KubeProxyNft {
                plan.nft_changes
            } else {
                plan.changes
            };
            announce_run(
                &format!(
                    "programming latency: {} with {changes} changes",
                    system.label()
                ),
                round,
                plan.programming_runs,
            );
            let measured =
                programming_latency(system, changes, suite, &mut counter, round + 1).await;
            runs[index].push(run_result(
                &format!("programming latency of {}", system.label()),
                measured,
            ));
        }
    }
    for (system, runs) in systems.iter().zip(&runs) {
        record(summary, system.label(), plan.control_scale, runs);
    }
    let not_tried = suite.systems_not_tried(&SYSTEMS);
    let table = table(plan, plan.control_scale, &systems, &runs, &not_tried);
    print!("{}", table.render());
    tables.push(table);
}

/// Totals of the counts over the runs; medians (with `-min` and `-max`) of the
/// percentiles; `runs`, and `failed-to-measure` when a run could not be measured.
fn record(summary: &mut Summary, system: &str, scale: u32, runs: &[RunResult<ProgrammingRun>]) {
    summary.record_counted_runs(
        NAME,
        system,
        u64::from(scale),
        runs,
        percentiles,
        totals,
        "changes",
    );
}

const COLUMNS: [&str; 9] = [
    "system",
    "run",
    "changes",
    "over 100 ms",
    "missed (>30 s)",
    "p50 ms",
    "p90 ms",
    "p99 ms",
    "max ms",
];

fn table(
    plan: &Plan,
    scale: u32,
    systems: &[System],
    runs: &[Vec<RunResult<ProgrammingRun>>],
    not_tried: &[System],
) -> Table {
    let mut table = Table::new(
        &format!(
            "Programming latency: change -> traffic uses it, {} Services, changes {} ms apart, {} runs per system",
            number(scale as f64, 0),
            plan.change_spacing.as_millis(),
            plan.programming_runs
        ),
        &COLUMNS,
    );
    add_system_rows(
        &mut table,
        systems,
        runs,
        not_tried,
        |run| {
            let counts = totals(&[run]).map(|(_, total)| total.to_string());
            let values = percentiles(run)
                .into_iter()
                .map(|(_, value, _)| number(value, 1));
            counts.into_iter().chain(values).collect()
        },
        |measured| {
            let counts = totals(measured).map(|(_, total)| total.to_string());
            let spreads = spread_cells(measured, percentiles, |_, _| 1);
            counts.into_iter().chain(spreads).collect()
        },
    );
    table.note(
        "A change replaces one TCP Service's EndpointSlice endpoints with the marker pod (a patch in the \
         API server); measured until a new connection from the client pod is answered by the marker. \
         Both systems watch the same API server (`switchyard-agent run`, kube-proxy with the default \
         --iptables-min-sync-period 1s and sync period 30s). kube-proxy 1.20 rewrites every rule on each \
         sync; current kube-proxy (1.28+) syncs only the changed Services. Each run has a fresh node; a \
         system's \"all\" row adds up the counts of its runs and gives the median (min-max) of the rest.",
    );
    table
}

async fn programming_latency(
    system: System,
    changes: usize,
    suite: &ControlSuite<'_>,
    counter: &mut ChangeCounter,
    run: usize,
) -> Result<ProgrammingRun> {
    let ControlSuite {
        plan,
        binaries,
        work,
        control_plane,
        ..
    } = *suite;
    let scale = plan.control_scale;
    let client = &control_plane.client;
    let spacing = plan.change_spacing;
    let topology =
        tokio::task::block_in_place(|| Topology::build(work, BACKENDS, &binaries.bench))?;
    let prober = Prober::new(CLIENT_NAMESPACE)?;
    // The default periodic resync of kube-proxy 1.20 (30 s): this is its normal operation.
    let mut running = Running::start(system, binaries, work, "30s")?;
    tokio::task::block_in_place(|| {
        running.wait_serving(&prober, &probe_targets(scale), plan.dataplane.serve_timeout)
    })?;
    // The first change comes one spacing after the system serves, as every later
    // one comes after its predecessor: the start-up sync is a sync too, and a
    // change right behind it would measure the minimum sync period (in a run
    // without this pause the first two changes waited 520 and 211 ms for it).
    tokio::time::sleep(spacing).await;
    let mut touched = Vec::new();
    let original = apiserver::backend_addresses(BACKENDS);
    // A change every `spacing`, whether or not the earlier ones are seen yet: each
    // is watched by an observer of its own.
    let mut observers = Vec::new();
    let mut changed_unix_us = Vec::new();
    let started = Instant::now();
    for change in 0..changes {
        let index = counter.next_service(scale);
        touched.push(index);
        let target = SocketAddrV4::new(service_address(index), SERVICE_TCP_PORT);
        let due = started + spacing * change as u32;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            tokio::time::sleep(wait).await;
        }
        let changed_at = Instant::now();
        changed_unix_us.push(load::unix_micros());
        apiserver::set_endpoints(client, index, &[MARKER_ADDRESS]).await?;
        observers.push(observe_in_background(
            CLIENT_NAMESPACE,
            target,
            MARKER_POD,
            changed_at,
            Duration::from_secs(30),
        ));
    }
    let mut samples = Vec::new();
    let mut missed = 0;
    let mut record = String::from("service,changed_unix_us,latency_ms\n");
    for ((observer, index), changed) in observers.into_iter().zip(&touched).zip(&changed_unix_us) {
        let latency = tokio::task::block_in_place(|| observer.join())
            .ok()
            .flatten();
        record.push_str(&format!(
            "{index},{changed},{}\n",
            latency.map_or("missed".to_string(), |latency| format!(
                "{:.3}",
                latency.as_secs_f64() * 1000.0
            ))
        ));
        match latency {
            Some(latency) => samples.push(latency),
            None => missed += 1,
        }
    }
    keep_for_diagnosis(system, run, &running, &record);
    running.stop();
    drop(topology);
    // Put the API back as it was for the measurements that follow.
    for index in touched {
        apiserver::set_endpoints(client, index, &original).await?;
    }
    Ok(ProgrammingRun::new(&samples, missed))
}

/// With `SWITCHYARD_BENCH_KEEP_LOGS=DIR`, the system's log of the run and each
/// change's time and latency are kept there (the work directory is a tmpfs that
/// goes with the bench), to tell where slow changes spent their time.
fn keep_for_diagnosis(system: System, run: usize, running: &Running, record: &str) {
    let Some(directory) = std::env::var_os("SWITCHYARD_BENCH_KEEP_LOGS") else {
        return;
    };
    let directory = Path::new(&directory);
    let label = system.label();
    let kept = std::fs::create_dir_all(directory)
        .and_then(|()| std::fs::write(directory.join(format!("{label}-changes-{run}.csv")), record))
        .and_then(|()| {
            std::fs::copy(
                &running.log,
                directory.join(format!("{label}-programming-latency-{run}.log")),
            )
            .map(|_| ())
        });
    if let Err(error) = kept {
        eprintln!(
            "bench: failed to keep the logs of {label} in {}: {error}",
            directory.display()
        );
    }
}

#[cfg(test)]
mod tests;
