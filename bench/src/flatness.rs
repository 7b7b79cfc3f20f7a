//! Latency flatness in interleaved rounds: Switchyard's connect p99 at a fixed
//! rate on a node serving the fewest Services and on one serving the most,
//! measured in the same rounds.
//!
//! Why rounds of their own: the data plane's scales are measured one after the
//! other, so the p99 at 100 Services and the one at 30,000 are some 35 minutes
//! apart, and this VM's speed drifts more than the goal's 10% over that time
//! (direct pod IP, which no Service count touches, moved +38% between the two
//! scales' rounds in one run). Here each round measures both counts on fresh
//! nodes, minutes apart at most, in alternating order, so the drift falls on
//! both alike.
//!
//! Both nodes run the agent in `standalone` mode, fed a manifest file with their
//! own Service count (the API server holds one set of Services at a time): the
//! same programs and map sizes as the data plane's `switchyard`, with only the
//! number of Services in the maps differing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::apiserver::{backend_addresses, endpoint_slice_object, service_object};
use crate::dataplane::{
    cpu_seconds, datapath_counters, netfilter_tracked_flows, push_median_and_p99, report_failure,
    round_order, run_load, targets, DataplaneSettings, BACKENDS,
};
use crate::error::{Error, Result};
use crate::load::{LoadOptions, Workload};
use crate::report::{number, Spread, Summary, Table};
use crate::systems::{probe_targets, Binaries, Running, System, NODE_NAME};
use crate::topology::{Prober, Topology, CLIENT_NAMESPACE};

pub const NAME: &str = "latency-flatness";
const SYSTEM: &str = "switchyard";
pub const P99: &str = "fixed-rate-connect-latency-p99";
pub const CHANGE_SAME_ROUND: &str = "p99-change-from-fewest-services-same-round";

/// The two Service counts compared and how long each fixed-rate run lasts.
#[derive(Clone, Debug)]
pub struct FlatnessSettings {
    pub fewest: u32,
    pub most: u32,
    pub run_duration: Duration,
}

/// Every round's figures of one Service count.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Samples {
    pub p50: Vec<f64>,
    pub p99: Vec<f64>,
    /// Connects that failed (they have no latency, so the p99 leaves them out).
    pub failures: u64,
    /// Share of one core the agent used during each round's runs.
    pub agent_cpu: Vec<f64>,
    /// The most flows netfilter tracked in the node's namespace after a round
    /// (zero: its connection tracking stayed off, as in the data plane's rounds).
    pub netfilter_tracked_flows: u64,
    /// The programs' counters, summed over the rounds.
    pub translated: u64,
    pub datapath_errors: u64,
    /// Backend servers found dead (and restarted) before a run.
    pub servers_restarted: usize,
}

/// What the rounds measured: the samples of the fewest and the most Services,
/// or why they stopped.
#[derive(Clone, Debug, Default)]
pub struct Measured {
    pub fewest: Samples,
    pub most: Samples,
    pub error: Option<String>,
}

/// The manifest of a node serving Services `0..count` (the same objects the API
/// server gets) and this node's DataplaneNode in mode `Ebpf`, as one `v1` List.
pub fn manifest(count: u32) -> Result<serde_json::Value> {
    use switchyard_crds::{DataplaneMode, DataplaneNode, DataplaneNodeSpec};
    let node = serde_json::to_value(DataplaneNode::new(
        NODE_NAME,
        DataplaneNodeSpec::new(DataplaneMode::Ebpf),
    ))
    .map_err(|error| Error::Populate(format!("failed to build the DataplaneNode: {error}")))?;
    let backends = backend_addresses(BACKENDS);
    let mut items = vec![node];
    for index in 0..count {
        items.push(service_object(index));
        items.push(endpoint_slice_object(index, &backends));
    }
    Ok(serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}))
}

fn write_manifest(work: &Path, count: u32) -> Result<PathBuf> {
    // JSON, which the agent's YAML reader takes as it is.
    let path = work.join(format!("flatness-{count}-services.json"));
    let text = serde_json::to_string(&manifest(count)?)
        .map_err(|error| Error::Populate(format!("failed to write the manifest: {error}")))?;
    std::fs::write(&path, text)
        .map_err(|error| Error::Populate(format!("failed to write {}: {error}", path.display())))?;
    Ok(path)
}

/// The p99 change from the fewest to the most Services in each round, in
/// percent: pairs measured minutes apart at most.
pub fn same_round_changes(fewest: &[f64], most: &[f64]) -> Vec<f64> {
    fewest
        .iter()
        .zip(most)
        .filter(|(fewest, _)| **fewest > 0.0)
        .map(|(fewest, most)| 100.0 * (most / fewest - 1.0))
        .collect()
}

/// Measures both counts in `rounds` rounds (the order alternating), records
/// what was measured, and returns it. A round that fails ends the measurement:
/// its reason is reported, and what the rounds before it measured is kept.
pub fn measure_in_rounds(
    binaries: &Binaries,
    work: &Path,
    dataplane: &DataplaneSettings,
    settings: &FlatnessSettings,
    summary: &mut Summary,
) -> Measured {
    let mut measured = Measured::default();
    let counts = [settings.fewest, settings.most];
    let manifests = match counts
        .iter()
        .map(|count| write_manifest(work, *count))
        .collect::<Result<Vec<_>>>()
    {
        Ok(manifests) => manifests,
        Err(error) => {
            measured.error = Some(error.first_line());
            record_failed_to_measure(settings, summary);
            return measured;
        }
    };
    'rounds: for round in 0..dataplane.rounds {
        for index in round_order(counts.len(), round) {
            let count = counts[index];
            println!(
                "latency flatness: {count} Services, round {} of {} starts",
                round + 1,
                dataplane.rounds
            );
            let samples = if index == 0 {
                &mut measured.fewest
            } else {
                &mut measured.most
            };
            if let Err(error) = measure_round(
                binaries,
                work,
                &manifests[index],
                count,
                dataplane,
                settings,
                samples,
            ) {
                eprintln!(
                    "bench: latency flatness at {count} Services, round {}: {error}",
                    round + 1
                );
                measured.error = Some(format!("{count} Services: {}", error.first_line()));
                break 'rounds;
            }
        }
    }
    // Only complete rounds are paired and recorded.
    let complete = measured.fewest.p99.len().min(measured.most.p99.len());
    measured.fewest.p99.truncate(complete);
    measured.fewest.p50.truncate(complete);
    measured.most.p99.truncate(complete);
    measured.most.p50.truncate(complete);
    record(&measured, settings, summary);
    measured
}

fn measure_round(
    binaries: &Binaries,
    work: &Path,
    manifest: &Path,
    count: u32,
    dataplane: &DataplaneSettings,
    settings: &FlatnessSettings,
    samples: &mut Samples,
) -> Result<()> {
    let mut topology = Topology::build(work, BACKENDS, &binaries.bench)?;
    let prober = Prober::new(CLIENT_NAMESPACE)?;
    let mut running = Running::start_standalone(binaries, work, manifest)?;
    running.wait_serving(&prober, &probe_targets(count), dataplane.serve_timeout)?;
    let (tcp, _) = targets(System::Switchyard, count);
    let load = |rate: Option<f64>, duration: Duration| LoadOptions {
        workload: Workload::Connect,
        targets: tcp.clone(),
        concurrency: dataplane.concurrency,
        duration,
        max_operations: 5_000_000,
        rate,
        timeout: Duration::from_secs(2),
        timeline: false,
        udp_payload_bytes: 0,
    };
    let agent_pid = running.process.as_ref().and_then(|process| process.pid());
    let cpu_before = agent_pid.and_then(cpu_seconds);
    let measuring_since = std::time::Instant::now();
    // Warm-up, as the data plane's rounds do: caches, the first connections' slow paths.
    run_load(&binaries.bench, work, &load(None, dataplane.warm_up))?;
    samples.servers_restarted += topology.revive_servers()?;
    let report = run_load(
        &binaries.bench,
        work,
        &load(Some(dataplane.latency_rate), settings.run_duration),
    )?;
    samples.failures += report.failures;
    report_failure(
        System::Switchyard,
        &format!("latency flatness at {count} Services"),
        &report,
    );
    if report.latencies_us.is_empty() {
        return Err(Error::System(format!(
            "no connection succeeded at {count} Services"
        )));
    }
    push_median_and_p99(&report, &mut samples.p50, &mut samples.p99);
    if let (Some(before), Some(after)) = (cpu_before, agent_pid.and_then(cpu_seconds)) {
        samples
            .agent_cpu
            .push((after - before) / measuring_since.elapsed().as_secs_f64() * 100.0);
    }
    samples.netfilter_tracked_flows = samples
        .netfilter_tracked_flows
        .max(netfilter_tracked_flows());
    match datapath_counters(&running.pin_directory) {
        Ok(counters) => {
            for (name, value) in counters {
                match name {
                    "translated" => samples.translated += value,
                    "error" => samples.datapath_errors += value,
                    _ => {}
                }
            }
        }
        Err(error) => eprintln!("bench: latency flatness: datapath counters: {error}"),
    }
    println!(
        "latency flatness: {count} Services: p99 {} µs at {}/s",
        samples.p99.last().copied().unwrap_or(0.0),
        number(dataplane.latency_rate, 0)
    );
    running.stop();
    drop(topology);
    Ok(())
}

fn record(measured: &Measured, settings: &FlatnessSettings, summary: &mut Summary) {
    for (count, samples) in [
        (settings.fewest, &measured.fewest),
        (settings.most, &measured.most),
    ] {
        summary.record_runs(NAME, SYSTEM, count as u64, P99, &samples.p99, "us");
        summary.record_runs(
            NAME,
            SYSTEM,
            count as u64,
            "fixed-rate-connect-latency-p50",
            &samples.p50,
            "us",
        );
        summary.record(
            NAME,
            SYSTEM,
            count as u64,
            "failed-connections",
            samples.failures as f64,
            "connections",
        );
        summary.record_runs(
            NAME,
            SYSTEM,
            count as u64,
            "process-cpu",
            &samples.agent_cpu,
            "percent-of-a-core",
        );
        for (metric, value, unit) in [
            (
                "netfilter-tracked-flows-max",
                samples.netfilter_tracked_flows as f64,
                "flows",
            ),
            ("datapath-translated", samples.translated as f64, "flows"),
            ("datapath-errors", samples.datapath_errors as f64, "packets"),
            (
                "backend-servers-restarted",
                samples.servers_restarted as f64,
                "servers",
            ),
        ] {
            summary.record(NAME, SYSTEM, count as u64, metric, value, unit);
        }
    }
    summary.record_runs(
        NAME,
        SYSTEM,
        settings.most as u64,
        CHANGE_SAME_ROUND,
        &same_round_changes(&measured.fewest.p99, &measured.most.p99),
        "percent",
    );
    if measured.error.is_some() {
        record_failed_to_measure(settings, summary);
    }
}

/// The mark the flatness goal reads as "not judged".
pub fn record_failed_to_measure(settings: &FlatnessSettings, summary: &mut Summary) {
    summary.record(
        NAME,
        SYSTEM,
        settings.most as u64,
        "failed-to-measure",
        1.0,
        "configurations",
    );
}

pub fn table(measured: &Measured, settings: &FlatnessSettings, latency_rate: f64) -> Table {
    let mut table = Table::new(
        &format!(
            "Latency flatness: switchyard's connect latency at {}/s with {} and {} Services, \
             in the same rounds (median of rounds, (min-max))",
            number(latency_rate, 0),
            number(settings.fewest as f64, 0),
            number(settings.most as f64, 0)
        ),
        &[
            "Services",
            "p50 µs",
            "p99 µs",
            "p99 change from the fewest Services, same round",
            "failed",
        ],
    );
    let cell = Spread::cell;
    let changes = Spread::of(&same_round_changes(
        &measured.fewest.p99,
        &measured.most.p99,
    ))
    .map(|spread| {
        format!(
            "{:+.0}% ({:+.0}% to {:+.0}%)",
            spread.median, spread.min, spread.max
        )
    })
    .unwrap_or_else(|| "-".into());
    for (count, samples, change) in [
        (settings.fewest, &measured.fewest, "-".to_string()),
        (settings.most, &measured.most, changes),
    ] {
        table.row(vec![
            number(count as f64, 0),
            cell(&samples.p50),
            cell(&samples.p99),
            change,
            samples.failures.to_string(),
        ]);
    }
    table.note(
        "Both nodes run the agent in standalone mode with the data plane's map sizes; \
         each round builds both afresh, in alternating order.",
    );
    for (count, samples) in [
        (settings.fewest, &measured.fewest),
        (settings.most, &measured.most),
    ] {
        table.note(&format!(
            "{} Services: the agent used {} of a core; netfilter tracked at most {} flows; \
             the programs translated {} connections with {} errors; {} backend servers restarted.",
            number(count as f64, 0),
            Spread::of(&samples.agent_cpu)
                .map(|spread| format!("{:.1}%", spread.median))
                .unwrap_or_else(|| "-".into()),
            samples.netfilter_tracked_flows,
            number(samples.translated as f64, 0),
            samples.datapath_errors,
            samples.servers_restarted,
        ));
    }
    if let Some(error) = &measured.error {
        table.note(&format!("FAILED: {error}"));
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_holds_the_dataplane_node_and_each_service_with_its_slice() {
        let manifest = manifest(3).expect("manifest");
        assert_eq!(manifest["kind"], "List");
        let items = manifest["items"].as_array().expect("items");
        assert_eq!(items.len(), 1 + 2 * 3);
        assert_eq!(items[0]["kind"], "DataplaneNode");
        assert_eq!(items[0]["metadata"]["name"], NODE_NAME);
        assert_eq!(items[0]["spec"]["mode"], "Ebpf");
        let kinds: Vec<&str> = items[1..]
            .iter()
            .map(|item| item["kind"].as_str().unwrap_or_default())
            .collect();
        assert_eq!(
            kinds,
            [
                "Service",
                "EndpointSlice",
                "Service",
                "EndpointSlice",
                "Service",
                "EndpointSlice"
            ]
        );
        assert_eq!(items[1], service_object(0));
        assert_eq!(
            items[6]["endpoints"].as_array().map(Vec::len),
            Some(BACKENDS as usize)
        );
    }

    #[test]
    fn each_round_pairs_the_most_services_p99_with_the_fewest_services_p99_of_that_round() {
        let changes = same_round_changes(&[100.0, 200.0, 0.0], &[110.0, 190.0, 50.0]);
        assert_eq!(
            changes.len(),
            2,
            "a round without a p99 at the fewest is skipped"
        );
        assert!((changes[0] - 10.0).abs() < 1e-9);
        assert!((changes[1] + 5.0).abs() < 1e-9);
    }

    #[test]
    fn the_summary_holds_both_counts_p99_and_the_same_round_changes() {
        let settings = FlatnessSettings {
            fewest: 100,
            most: 30_000,
            run_duration: Duration::from_secs(1),
        };
        let measured = Measured {
            fewest: Samples {
                p50: vec![60.0, 70.0, 65.0],
                p99: vec![300.0, 400.0, 350.0],
                ..Samples::default()
            },
            most: Samples {
                p50: vec![61.0, 69.0, 66.0],
                p99: vec![315.0, 380.0, 364.0],
                failures: 1,
                translated: 30_000,
                ..Samples::default()
            },
            error: None,
        };
        let mut summary = Summary::default();
        record(&measured, &settings, &mut summary);
        assert_eq!(summary.find(NAME, SYSTEM, 100, P99), Some(350.0));
        assert_eq!(summary.find(NAME, SYSTEM, 30_000, P99), Some(364.0));
        assert_eq!(
            summary.find(NAME, SYSTEM, 30_000, "failed-connections"),
            Some(1.0)
        );
        let change = summary
            .find(NAME, SYSTEM, 30_000, CHANGE_SAME_ROUND)
            .expect("median change");
        assert!((change - 4.0).abs() < 1e-9, "{change}");
        assert_eq!(
            summary.find(NAME, SYSTEM, 30_000, "datapath-translated"),
            Some(30_000.0)
        );
        let rendered = table(&measured, &settings, 2_000.0).render();
        assert!(rendered.contains("+4% (-5% to +5%)"), "{rendered}");
        assert!(
            rendered.contains("the programs translated 30,000 connections with 0 errors"),
            "{rendered}"
        );
    }
}
