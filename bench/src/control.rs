//! The data plane at every scale, and at the control-plane scale (10,000
//! Services) the control plane: programming latency, agent cold start, and
//! restart disruption.

use std::net::SocketAddrV4;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::apiserver::{self, ControlPlane};
use crate::cold_start;
use crate::dataplane::{self, BACKENDS};
use crate::error::{Error, Result};
use crate::flatness;
use crate::load;
use crate::report::{number, percentile, Summary, Table};
use crate::restart;
use crate::systems::{probe_targets, Binaries, Running, System, NODE_NAME};
use crate::topology::{
    observe_in_background, service_address, Prober, Topology, CLIENT_NAMESPACE, MARKER_ADDRESS,
    MARKER_POD, NODE_ADDRESS, SERVICE_TCP_PORT,
};
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
    let mut changed = ChangeCounter::default();
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
        }
        if parts.contains(&"control") && scale == plan.control_scale {
            let unservable: Vec<System> = failed_at.iter().map(|(system, _)| *system).collect();
            control_plane_suite(
                plan,
                binaries,
                work,
                &control_plane,
                &mut changed,
                &unservable,
                summary,
                tables,
            )
            .await?;
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
    control_plane.stop();
    Ok(())
}

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

#[allow(clippy::too_many_arguments)]
async fn control_plane_suite(
    plan: &Plan,
    binaries: &Binaries,
    work: &Path,
    control_plane: &ControlPlane,
    changed: &mut ChangeCounter,
    unservable: &[System],
    summary: &mut Summary,
    tables: &mut Vec<Table>,
) -> Result<()> {
    let scale = plan.control_scale;
    let client = &control_plane.client;
    // Programming latency.
    let mut latency_table = Table::new(
        &format!(
            "Programming latency: change -> traffic uses it, {} Services, changes {} ms apart",
            number(scale as f64, 0),
            plan.change_spacing.as_millis()
        ),
        &[
            "system",
            "changes",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "max ms",
            "over 100 ms",
            "missed (>30 s)",
        ],
    );
    for system in [
        System::Switchyard,
        System::KubeProxyLegacy,
        System::KubeProxyNft,
    ] {
        let changes = if system == System::KubeProxyNft {
            plan.nft_changes
        } else {
            plan.changes
        };
        println!(
            "programming latency: {} ({changes} changes)",
            system.label()
        );
        if !plan.systems.contains(&system) {
            continue;
        }
        if unservable.contains(&system) {
            latency_table.row(vec![
                system.label().to_string(),
                "not tried: could not serve this many Services in the data plane run".into(),
            ]);
            continue;
        }
        let measured = programming_latency(
            system, scale, changes, plan, binaries, work, client, changed,
        )
        .await;
        let (samples, missed) = match measured {
            Ok(measured) => measured,
            Err(error) => {
                eprintln!("bench: programming latency of {}: {error}", system.label());
                failed(summary, "programming-latency", system.label(), scale);
                let mut cells = vec![system.label().to_string()];
                cells.push(format!("FAILED: {}", error.first_line()));
                latency_table.row(cells);
                continue;
            }
        };
        let mut sorted: Vec<u32> = samples.iter().map(|d| d.as_micros() as u32).collect();
        sorted.sort_unstable();
        let ms = |q: f64| {
            percentile(&sorted, q)
                .map(|us| us as f64 / 1000.0)
                .unwrap_or(f64::NAN)
        };
        let name = "programming-latency";
        // Changes seen later than the goal's 100 ms (missed ones included), so
        // a p99 miss says how many changes it is about.
        let over_goal = sorted.iter().filter(|us| **us > 100_000).count() + missed;
        summary.record(name, system.label(), scale as u64, "p50", ms(0.5), "ms");
        summary.record(name, system.label(), scale as u64, "p90", ms(0.9), "ms");
        summary.record(name, system.label(), scale as u64, "p99", ms(0.99), "ms");
        summary.record(
            name,
            system.label(),
            scale as u64,
            "over-100ms",
            over_goal as f64,
            "changes",
        );
        summary.record(name, system.label(), scale as u64, "max", ms(1.0), "ms");
        summary.record(
            name,
            system.label(),
            scale as u64,
            "changes",
            changes as f64,
            "changes",
        );
        summary.record(
            name,
            system.label(),
            scale as u64,
            "missed",
            missed as f64,
            "changes",
        );
        latency_table.row(vec![
            system.label().into(),
            changes.to_string(),
            number(ms(0.5), 1),
            number(ms(0.9), 1),
            number(ms(0.99), 1),
            number(ms(1.0), 1),
            over_goal.to_string(),
            missed.to_string(),
        ]);
    }
    latency_table.note(
        "A change replaces one TCP Service's EndpointSlice endpoints with the marker pod (a patch in the \
         API server); measured until a new connection from the client pod is answered by the marker. \
         Both systems watch the same API server (`switchyard-agent run`, kube-proxy with the default \
         --iptables-min-sync-period 1s and sync period 30s). kube-proxy 1.20 rewrites every rule on each \
         sync; current kube-proxy (1.28+) syncs only the changed Services.",
    );
    print!("{}", latency_table.render());
    tables.push(latency_table);

    tokio::task::block_in_place(|| {
        cold_start::measure_in_runs(plan, scale, binaries, work, summary, tables)
    });
    tokio::task::block_in_place(|| {
        restart::measure_in_rounds(
            plan,
            scale,
            binaries,
            work,
            control_plane,
            unservable,
            summary,
            tables,
        )
    })?;
    Ok(())
}

/// Records that a measurement could not be taken (the tables say why).
fn failed(summary: &mut Summary, name: &str, system: &str, scale: u32) {
    summary.record(
        name,
        system,
        scale as u64,
        "failed-to-measure",
        1.0,
        "configurations",
    );
}

#[allow(clippy::too_many_arguments)]
async fn programming_latency(
    system: System,
    scale: u32,
    changes: usize,
    plan: &Plan,
    binaries: &Binaries,
    work: &Path,
    client: &kube::Client,
    counter: &mut ChangeCounter,
) -> Result<(Vec<Duration>, usize)> {
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
    keep_for_diagnosis(system, &running, &record);
    running.stop();
    drop(topology);
    // Put the API back as it was for the measurements that follow.
    for index in touched {
        apiserver::set_endpoints(client, index, &original).await?;
    }
    Ok((samples, missed))
}

/// With `SWITCHYARD_BENCH_KEEP_LOGS=DIR`, the system's log of the run and each
/// change's time and latency are kept there (the work directory is a tmpfs that
/// goes with the bench), to tell where slow changes spent their time.
fn keep_for_diagnosis(system: System, running: &Running, record: &str) {
    let Some(directory) = std::env::var_os("SWITCHYARD_BENCH_KEEP_LOGS") else {
        return;
    };
    let directory = Path::new(&directory);
    let label = system.label();
    let kept = std::fs::create_dir_all(directory)
        .and_then(|()| std::fs::write(directory.join(format!("{label}-changes.csv")), record))
        .and_then(|()| {
            std::fs::copy(
                &running.log,
                directory.join(format!("{label}-programming-latency.log")),
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
mod tests {
    use super::*;
    #[test]
    fn changes_go_to_distinct_tcp_services() {
        let mut counter = ChangeCounter::default();
        let picked: Vec<u32> = (0..500).map(|_| counter.next_service(10_000)).collect();
        let mut unique = picked.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), picked.len());
        assert!(picked.iter().all(|index| index % 2 == 0 && *index < 10_000));
    }
}
