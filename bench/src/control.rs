//! The data plane at every scale, and at the control-plane scale (10,000
//! Services) the control plane: programming latency, agent cold start, and
//! restart disruption.

use std::path::Path;
use std::time::Instant;

use crate::apiserver::{self, ControlPlane};
use crate::cold_start;
use crate::dataplane::{self, BACKENDS};
use crate::error::{Error, Result};
use crate::flatness;
use crate::parity_cost;
use crate::program_stats;
use crate::programming;
use crate::report::{Summary, Table};
use crate::restart;
use crate::systems::{Binaries, System, NODE_NAME};
use crate::topology::NODE_ADDRESS;
use crate::Plan;

pub async fn data_and_control_plane(
    plan: &Plan,
    parts: &[&str],
    binaries: &Binaries,
    work: &Path,
    summary: &mut Summary,
    tables: &mut Vec<Table>,
) -> Result<()> {
    let control_plane = ControlPlane::start(&binaries.kubernetes, work, "apiserver").await?;
    apiserver::prepare_node(&control_plane.client, NODE_NAME, NODE_ADDRESS).await?;
    println!(
        "API server ready in {:.1} s",
        control_plane.started_in.as_secs_f64()
    );
    let client = control_plane.client.clone();
    let mut populated = 0;
    let mut scales = plan.scales.clone();
    if parts.contains(&"control") && !scales.contains(&plan.control_scale) {
        scales.push(plan.control_scale);
    }
    scales.sort_unstable();
    scales.dedup();
    // A system that could not serve at one scale is not tried at larger ones.
    let mut failed_at: Vec<(System, u32)> = Vec::new();
    for scale in scales {
        if scale > populated {
            let started = Instant::now();
            apiserver::create_services(&client, populated, scale, BACKENDS).await?;
            let elapsed = started.elapsed().as_secs_f64();
            println!(
                "created Services {populated}..{scale} and their EndpointSlices in {elapsed:.1} s ({:.0} objects/s)",
                2.0 * f64::from(scale - populated) / elapsed
            );
            populated = scale;
        }
        if parts.contains(&"dataplane") && plan.scales.contains(&scale) {
            let (untried, systems): (Vec<System>, Vec<System>) = plan
                .systems
                .iter()
                .partition(|system| failed_at.iter().any(|(failed, _)| failed == *system));
            let measured = tokio::task::block_in_place(|| {
                dataplane::measure_in_rounds(
                    &systems,
                    scale,
                    binaries,
                    work,
                    &plan.dataplane,
                    summary,
                )
            });
            failed_at.extend(measured.failed.iter().map(|system| (*system, scale)));
            // The table lists the systems in the plan's order, which `systems` keeps.
            let mut measured_rows = measured.rows.into_iter();
            let mut rows = Vec::new();
            for system in &plan.systems {
                let smaller = untried
                    .contains(system)
                    .then(|| failed_at.iter().find(|(failed, _)| failed == system))
                    .flatten();
                match smaller {
                    Some((_, smaller)) => {
                        let error =
                            Error::System(format!("not tried: failed at {smaller} Services"));
                        rows.push(dataplane::Row::failed(system.label(), &error));
                    }
                    None => rows.extend(measured_rows.next()),
                }
            }
            let table = dataplane::table(scale, plan.dataplane.latency_rate, &rows);
            print!("{}", table.render());
            tables.push(table);
            let measured_programs: Vec<(&str, &program_stats::Samples)> = rows
                .iter()
                .filter(|row| {
                    row.error.is_none()
                        && [System::Switchyard, System::SwitchyardTc]
                            .iter()
                            .any(|system| row.system == system.label())
                })
                .map(|row| (row.system.as_str(), &row.program_costs))
                .collect();
            if !measured_programs.is_empty() {
                let table = program_stats::table(scale, &measured_programs);
                print!("{}", table.render());
                tables.push(table);
            }
        }
        if parts.contains(&"control") && scale == plan.control_scale {
            let unservable: Vec<System> = failed_at.iter().map(|(system, _)| *system).collect();
            let suite = ControlSuite {
                plan,
                binaries,
                work,
                control_plane: &control_plane,
                unservable: &unservable,
            };
            control_plane_suite(&suite, summary, tables).await?;
        }
    }
    if parts.contains(&"dataplane") && plan.systems.contains(&System::Switchyard) {
        if let Some(settings) = &plan.flatness {
            if let Some((_, scale)) = failed_at
                .iter()
                .find(|(system, _)| *system == System::Switchyard)
            {
                println!("latency flatness: not measured: switchyard failed at {scale} Services");
                flatness::record_failed_to_measure(settings, summary);
            } else {
                let measured = tokio::task::block_in_place(|| {
                    flatness::measure_in_rounds(binaries, work, &plan.dataplane, settings, summary)
                });
                let table = flatness::table(&measured, settings, plan.dataplane.latency_rate);
                print!("{}", table.render());
                tables.push(table);
            }
        }
    }
    let parity_systems = parity_cost::CONFIGURATIONS;
    if parts.contains(&"dataplane")
        && parity_systems
            .iter()
            .any(|system| plan.systems.contains(system))
    {
        let settings = &plan.parity_cost;
        let measured = tokio::task::block_in_place(|| {
            parity_cost::measure_in_rounds(binaries, work, &plan.dataplane, settings, summary)
        });
        let table = parity_cost::table(settings, &measured);
        print!("{}", table.render());
        tables.push(table);
    }
    control_plane.stop();
    Ok(())
}

/// What each control-plane measurement at the control scale works with.
pub struct ControlSuite<'a> {
    /// Its control scale is the number of Services present.
    pub plan: &'a Plan,
    pub binaries: &'a Binaries,
    pub work: &'a Path,
    pub control_plane: &'a ControlPlane,
    /// Systems that could not serve this many Services in the data plane run:
    /// listed as not tried.
    pub unservable: &'a [System],
}

impl ControlSuite<'_> {
    /// The `candidates` the plan asks for that could serve this many Services.
    pub fn systems_to_try(&self, candidates: &[System]) -> Vec<System> {
        self.wanted(candidates)
            .filter(|system| !self.unservable.contains(system))
            .collect()
    }

    /// The `candidates` the plan asks for that could not.
    pub fn systems_not_tried(&self, candidates: &[System]) -> Vec<System> {
        self.wanted(candidates)
            .filter(|system| self.unservable.contains(system))
            .collect()
    }

    fn wanted<'s>(&'s self, candidates: &'s [System]) -> impl Iterator<Item = System> + 's {
        candidates
            .iter()
            .copied()
            .filter(|system| self.plan.systems.contains(system))
    }
}

async fn control_plane_suite(
    suite: &ControlSuite<'_>,
    summary: &mut Summary,
    tables: &mut Vec<Table>,
) -> Result<()> {
    programming::measure_in_rounds(suite, summary, tables).await;
    tokio::task::block_in_place(|| cold_start::measure_in_runs(suite, summary, tables));
    tokio::task::block_in_place(|| restart::measure_in_rounds(suite, summary, tables))
}
