//! Agent cold start: `switchyard-agent run` started on a fresh node with the
//! Services already in the API server, in several runs, each on a fresh
//! topology (so nothing is pinned from an earlier run). The summary keeps the
//! median and spread of every figure; the goals take the worst run.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::control::ControlSuite;
use crate::dataplane::BACKENDS;
use crate::error::{Error, Result};
use crate::report::{
    add_run_rows, announce_run, number, run_result, spread_cells, Figure, RunResult, Summary, Table,
};
use crate::systems::{probe_targets, Binaries, Running, System};
use crate::topology::{Prober, Topology, CLIENT_NAMESPACE};

pub const NAME: &str = "agent-cold-start";
const SYSTEM: &str = "switchyard";

/// What one cold start measured, in seconds from process start and MiB.
#[derive(Clone, Debug, PartialEq)]
pub struct ColdStart {
    pub gate_open: f64,
    pub programmed: f64,
    pub serving: f64,
    pub rss_mib: f64,
    pub peak_rss_mib: f64,
}

impl ColdStart {
    fn programmed_after_gate(&self) -> f64 {
        self.programmed - self.gate_open
    }
}

/// The figures of a run, in table order.
fn figures(run: &ColdStart) -> Vec<Figure> {
    vec![
        ("gate-open", run.gate_open, "s"),
        ("all-programmed", run.programmed, "s"),
        ("programmed-after-gate", run.programmed_after_gate(), "s"),
        ("serving", run.serving, "s"),
        ("rss", run.rss_mib, "MiB"),
        ("peak-rss", run.peak_rss_mib, "MiB"),
    ]
}

fn decimals(_metric: &str, unit: &str) -> usize {
    if unit == "s" {
        3
    } else {
        1
    }
}

pub fn measure_in_runs(suite: &ControlSuite<'_>, summary: &mut Summary, tables: &mut Vec<Table>) {
    let ControlSuite {
        plan,
        binaries,
        work,
        ..
    } = *suite;
    let scale = plan.control_scale;
    let runs: Vec<_> = (0..plan.cold_start_runs)
        .map(|run| {
            let what = format!("agent cold start with {scale} Services");
            announce_run(&what, run, plan.cold_start_runs);
            run_result("agent cold start", cold_start(scale, binaries, work))
        })
        .collect();
    record(summary, scale, &runs);
    let table = table(scale, &runs);
    print!("{}", table.render());
    tables.push(table);
}

/// Every figure's median, `-min` and `-max` over the measured runs; the
/// number of runs; `failed-to-measure` when a run could not be measured.
fn record(summary: &mut Summary, scale: u32, runs: &[RunResult<ColdStart>]) {
    summary.record_measured_runs(NAME, SYSTEM, u64::from(scale), runs, figures);
}

fn table(scale: u32, runs: &[RunResult<ColdStart>]) -> Table {
    let mut table = Table::new(
        &format!(
            "Agent cold start, {} Services (time from process start), {} runs",
            number(scale as f64, 0),
            runs.len()
        ),
        &[
            "run",
            "gate open s",
            "all programmed s",
            "programmed after gate s",
            "first probe answered s",
            "RSS MiB",
            "peak RSS MiB",
        ],
    );
    add_run_rows(
        &mut table,
        &[],
        runs,
        |run| {
            figures(run)
                .into_iter()
                .map(|(metric, value, unit)| number(value, decimals(metric, unit)))
                .collect()
        },
        |measured| spread_cells(measured, figures, decimals),
    );
    table.note(
        "`switchyard-agent run` on a fresh node each run: \"gate open\" is when the agent logs its \
         start-of-day gate open (Services, EndpointSlices, its Node and DataplaneNode listed, pinned maps \
         restored); \"all programmed\" is the end of its first sync (\"synced the maps\"). The \"all\" row gives \
         the median (min-max) of the runs.",
    );
    table
}

fn cold_start(scale: u32, binaries: &Binaries, work: &Path) -> Result<ColdStart> {
    let topology = Topology::build(work, BACKENDS, &binaries.bench)?;
    let prober = Prober::new(CLIENT_NAMESPACE)?;
    let mut running = Running::start(System::Switchyard, binaries, work, "30s")?;
    let (process_started, log) = match &running.process {
        Some(process) => (process.started, process.log.clone()),
        None => return Err(Error::System("failed to start the agent".into())),
    };
    let mut gate_open = None;
    let mut programmed = None;
    let deadline = process_started + Duration::from_secs(300);
    while programmed.is_none() && Instant::now() < deadline {
        let exited = running
            .process
            .as_mut()
            .is_some_and(|process| !process.is_running());
        if exited {
            break;
        }
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if gate_open.is_none() && text.contains("start-of-day gate open") {
            gate_open = Some(process_started.elapsed());
        }
        if text.contains("synced the maps") {
            programmed = Some(process_started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let (Some(gate_open), Some(programmed)) = (gate_open, programmed) else {
        return Err(Error::System(format!(
            "failed to see the agent open its gate and sync within 300 s:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )));
    };
    let serving = running.wait_serving(&prober, &probe_targets(scale), Duration::from_secs(300))?;
    let (rss_mib, peak_rss_mib) = running
        .process
        .as_ref()
        .and_then(|process| process.memory_mib())
        .unwrap_or((f64::NAN, f64::NAN));
    running.stop();
    drop(topology);
    Ok(ColdStart {
        gate_open: gate_open.as_secs_f64(),
        programmed: programmed.as_secs_f64(),
        serving: serving.as_secs_f64(),
        rss_mib,
        peak_rss_mib,
    })
}

#[cfg(test)]
mod tests;
