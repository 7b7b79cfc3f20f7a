//! Restart disruption: connections at a fixed rate while the agent (or
//! kube-proxy) is restarted, in several runs per system, each on a fresh
//! topology. The systems alternate within a round and swap their order from
//! one round to the next, so a slow minute of this VM does not land on one
//! system only. The summary and the goal use the runs' medians, with their
//! spread beside them.

use std::path::Path;
use std::time::Duration;

use crate::control::ControlSuite;
use crate::dataplane::{self, round_order, BACKENDS};
use crate::error::{Error, Result};
use crate::load::{self, LoadOptions, LoadReport, Workload};
use crate::report::{
    add_system_rows, announce_run, number, percentile, run_result, spread_cells, Figure, RunResult,
    Summary, Table,
};
use crate::systems::{probe_targets, Binaries, Running, System};
use crate::topology::{Prober, Topology, CLIENT_NAMESPACE};
use crate::Plan;

pub const NAME: &str = "restart-disruption";
/// The p99 during the restart over the p99 before it, per run.
pub const RATIO: &str = "p99-during-over-steady";

/// The nice value of etcd and the API server while a restart is measured.
const CONTROL_PLANE_NICE: i32 = 19;

/// What one run measured.
#[derive(Clone, Debug, PartialEq)]
pub struct RestartFigures {
    pub connections: u64,
    pub failed: u64,
    pub failed_during: u64,
    pub p99_steady_ms: f64,
    pub p99_during_ms: f64,
    pub achieved_rate: f64,
}

impl RestartFigures {
    fn ratio(&self) -> f64 {
        self.p99_during_ms / self.p99_steady_ms
    }
}

/// The runs of one system, in the order they ran.
type Runs = Vec<RunResult<RestartFigures>>;

const SYSTEMS: [System; 2] = [System::Switchyard, System::KubeProxyLegacy];

pub fn measure_in_rounds(
    suite: &ControlSuite<'_>,
    summary: &mut Summary,
    tables: &mut Vec<Table>,
) -> Result<()> {
    let ControlSuite {
        plan,
        binaries,
        work,
        control_plane,
        ..
    } = *suite;
    let scale = plan.control_scale;
    let systems = suite.systems_to_try(&SYSTEMS);
    let mut runs: Vec<Runs> = systems.iter().map(|_| Runs::new()).collect();
    for round in 0..plan.restart_runs {
        for index in round_order(systems.len(), round) {
            let system = systems[index];
            announce_run(
                &format!("restart disruption: {}", system.label()),
                round,
                plan.restart_runs,
            );
            // The control plane stands in for one on other machines (see the note).
            control_plane.set_nice(CONTROL_PLANE_NICE)?;
            let measured = restart_disruption(system, scale, plan, binaries, work);
            control_plane.set_nice(0)?;
            let measured = run_result(
                &format!("restart disruption of {}", system.label()),
                measured,
            );
            runs[index].push(measured);
        }
    }
    for (system, runs) in systems.iter().zip(&runs) {
        record(summary, system.label(), scale, runs);
    }
    let not_tried = suite.systems_not_tried(&SYSTEMS);
    let table = table(plan, scale, &systems, &runs, &not_tried);
    print!("{}", table.render());
    tables.push(table);
    Ok(())
}

/// Totals of the counts over the runs; medians (with `-min` and `-max`) of the
/// rest; `failed-to-measure` when a run could not be measured.
fn record(summary: &mut Summary, system: &str, scale: u32, runs: &Runs) {
    summary.record_counted_runs(
        NAME,
        system,
        u64::from(scale),
        runs,
        medians,
        totals,
        "connections",
    );
}

/// The figures whose median (min-max) over the runs is kept, in table order.
fn medians(run: &RestartFigures) -> Vec<Figure> {
    vec![
        ("p99-steady", run.p99_steady_ms, "ms"),
        ("p99-during-restart", run.p99_during_ms, "ms"),
        (RATIO, run.ratio(), "ratio"),
        ("achieved-rate", run.achieved_rate, "1/s"),
    ]
}

/// The counts, added up over the runs, in table order.
fn totals(measured: &[&RestartFigures]) -> [(&'static str, u64); 3] {
    let total = |figure: fn(&RestartFigures) -> u64| measured.iter().map(|run| figure(run)).sum();
    [
        ("connections", total(|run| run.connections)),
        ("failed", total(|run| run.failed)),
        ("failed-during-restart", total(|run| run.failed_during)),
    ]
}

fn table(
    plan: &Plan,
    scale: u32,
    systems: &[System],
    runs: &[Runs],
    not_tried: &[System],
) -> Table {
    let mut table = Table::new(
        &format!(
            "Restart disruption at {} new connections/s, {} Services, {} runs per system",
            number(plan.restart_rate, 0),
            number(scale as f64, 0),
            plan.restart_runs
        ),
        &[
            "system",
            "run",
            "connections",
            "failed",
            "failed during restart",
            "p99 steady ms",
            "p99 during restart ms",
            "ratio",
            "achieved rate /s",
        ],
    );
    add_system_rows(
        &mut table,
        systems,
        runs,
        not_tried,
        |run| {
            let counts = totals(&[run]).map(|(_, total)| count(total));
            let values = medians(run)
                .into_iter()
                .map(|(metric, value, unit)| number(value, decimals(metric, unit)));
            counts.into_iter().chain(values).collect()
        },
        |measured| {
            let counts = totals(measured).map(|(_, total)| count(total));
            let spreads = spread_cells(measured, medians, decimals);
            counts.into_iter().chain(spreads).collect()
        },
    );
    table.note(&format!(
        "Open loop: one new connection every {:.2} ms whatever the earlier ones do; the process gets SIGTERM \
         {} s in and a new one is started at once; \"during restart\" is the {:.1} s after the signal. Each run \
         has a fresh topology; the systems alternate, in the other order every round. A system's \"all\" row \
         adds up the counts of its runs and gives the median (min-max) of the rest. \
         etcd and the API server run at nice {CONTROL_PLANE_NICE} during these runs, standing in for \
         a control plane on other machines: on this one VM, serving the restarted process's lists of {} \
         Services and EndpointSlices would otherwise take the CPU from the very connections measured \
         (bench/results/2026-11-25-0935-restart-p99.md: 3.9-6.6x with them at nice 0, the agent unchanged).",
        1000.0 / plan.restart_rate,
        kill_offset(plan).as_secs_f64(),
        window(plan).as_secs_f64(),
        number(scale as f64, 0)
    ));
    table
}

fn decimals(_metric: &str, unit: &str) -> usize {
    if unit == "1/s" {
        0
    } else {
        2
    }
}

fn count(value: u64) -> String {
    number(value as f64, 0)
}

fn kill_offset(plan: &Plan) -> Duration {
    plan.restart_duration / 3
}

fn window(plan: &Plan) -> Duration {
    if plan.quick {
        Duration::from_millis(1500)
    } else {
        Duration::from_secs(5)
    }
}

fn restart_disruption(
    system: System,
    scale: u32,
    plan: &Plan,
    binaries: &Binaries,
    work: &Path,
) -> Result<RestartFigures> {
    let topology = Topology::build(work, BACKENDS, &binaries.bench)?;
    let prober = Prober::new(CLIENT_NAMESPACE)?;
    let mut running = Running::start(system, binaries, work, "30s")?;
    running.wait_serving(&prober, &probe_targets(scale), plan.dataplane.serve_timeout)?;
    let (tcp, _) = dataplane::targets(system, scale);
    let options = LoadOptions {
        workload: Workload::Connect,
        targets: tcp,
        concurrency: 1024,
        duration: plan.restart_duration,
        max_operations: 5_000_000,
        rate: Some(plan.restart_rate),
        timeout: Duration::from_secs(3),
        timeline: true,
        udp_payload_bytes: 0,
    };
    let bench = binaries.bench.clone();
    let load_work = work.to_path_buf();
    let load = std::thread::spawn(move || dataplane::run_load(&bench, &load_work, &options));
    std::thread::sleep(kill_offset(plan));
    let signalled_unix_us = load::unix_micros();
    running.restart()?;
    let report = load
        .join()
        .map_err(|_| Error::Load("failed to join the load generator thread".into()))??;
    running.stop();
    drop(topology);
    Ok(restart_figures(&report, signalled_unix_us, window(plan)))
}

fn restart_figures(
    report: &LoadReport,
    signalled_unix_us: u64,
    window: Duration,
) -> RestartFigures {
    let restart_at = signalled_unix_us.saturating_sub(report.started_unix_us);
    let window_end = restart_at + window.as_micros() as u64;
    let mut steady = Vec::new();
    let mut during = Vec::new();
    let mut failed_during = 0;
    for event in &report.timeline {
        let in_window = event.start_us >= restart_at && event.start_us < window_end;
        if !event.ok {
            if in_window {
                failed_during += 1;
            }
            continue;
        }
        if event.start_us < restart_at {
            steady.push(event.latency_us);
        } else if in_window {
            during.push(event.latency_us);
        }
    }
    steady.sort_unstable();
    during.sort_unstable();
    let ms = |sorted: &[u32]| {
        percentile(sorted, 0.99)
            .map(|us| us as f64 / 1000.0)
            .unwrap_or(f64::NAN)
    };
    RestartFigures {
        connections: report.operations + report.failures,
        failed: report.failures,
        failed_during,
        p99_steady_ms: ms(&steady),
        p99_during_ms: ms(&during),
        achieved_rate: report.rate(),
    }
}

#[cfg(test)]
mod tests;
