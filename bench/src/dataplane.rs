//! Data plane: new-connection rate and connect latency, kept-alive requests and
//! UDP request/response through each system, in rounds that measure every
//! system once each on a fresh node, so the systems compared are measured
//! minutes apart at most.

use std::net::SocketAddrV4;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::load::{LoadOptions, LoadReport, Workload};
use crate::program_stats;
use crate::report::{number, percentile, Spread, Summary, Table};
use crate::systems::{probe_targets, Binaries, Running, System};
use crate::topology::{
    backend_address, service_address, service_is_tcp, Prober, Topology, BACKEND_TCP_PORT,
    BACKEND_UDP_PORT, CLIENT_NAMESPACE, NODE_NAMESPACE, SERVICE_TCP_PORT, SERVICE_UDP_PORT,
};

pub const BACKENDS: u32 = 10;
pub const NAME: &str = "dataplane";
/// Set (to anything): the `direct` row runs with netfilter connection tracking
/// on in the node's namespace (see `measure_round`), labelled `direct-with-conntrack`.
pub const DIRECT_WITH_CONNTRACK: &str = "SWITCHYARD_BENCH_DIRECT_CONNTRACK";

#[derive(Clone, Debug)]
pub struct DataplaneSettings {
    /// Rounds per scale: each builds a fresh node for every system in turn and
    /// runs every workload once (see `measure_in_rounds`).
    pub rounds: usize,
    pub run_duration: Duration,
    pub warm_up: Duration,
    pub concurrency: usize,
    /// Connections per second of the fixed-rate latency run: well below what any
    /// system sustains here, so its latencies are the path's own, not the queue
    /// behind a saturated CPU (in the closed loop at full load a whole operation
    /// takes concurrency / rate on average, by Little's law, so the connect's
    /// latency rises whenever the rate drifts down).
    pub latency_rate: f64,
    /// How long a system may take to serve every Service before it is reported as failed.
    pub serve_timeout: Duration,
}

/// Runs the load generator in the client pod and reads its report.
pub fn run_load(bench: &Path, work: &Path, options: &LoadOptions) -> Result<LoadReport> {
    let path = work.join("load-options.json");
    let text = serde_json::to_string(options)
        .map_err(|error| Error::Load(format!("failed to encode the load options: {error}")))?;
    std::fs::write(&path, text).map_err(|error| Error::Output {
        path: path.display().to_string(),
        detail: error.to_string(),
    })?;
    let output = Command::new("ip")
        .args(["netns", "exec", CLIENT_NAMESPACE])
        .arg(bench)
        .arg("load")
        .arg("--options")
        .arg(&path)
        .output()
        .map_err(|error| Error::Load(format!("failed to start the load generator: {error}")))?;
    if !output.status.success() {
        return Err(Error::Load(format!(
            "failed to run the load generator ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    serde_json::from_slice(&output.stdout).map_err(|error| {
        Error::Load(format!(
            "failed to read the load generator's report: {error}"
        ))
    })
}

/// TCP and UDP targets: every Service's ClusterIP, or the backends' pod IPs (direct).
pub fn targets(system: System, services: u32) -> (Vec<SocketAddrV4>, Vec<SocketAddrV4>) {
    if system == System::Direct {
        let tcp = (0..BACKENDS)
            .map(|o| SocketAddrV4::new(backend_address(o), BACKEND_TCP_PORT))
            .collect();
        let udp = (0..BACKENDS)
            .map(|o| SocketAddrV4::new(backend_address(o), BACKEND_UDP_PORT))
            .collect();
        return (tcp, udp);
    }
    let tcp = (0..services)
        .filter(|index| service_is_tcp(*index))
        .map(|index| SocketAddrV4::new(service_address(index), SERVICE_TCP_PORT))
        .collect();
    let udp = (0..services)
        .filter(|index| !service_is_tcp(*index))
        .map(|index| SocketAddrV4::new(service_address(index), SERVICE_UDP_PORT))
        .collect();
    (tcp, udp)
}

/// One row of the table: the figures of one system at one scale, one sample per round.
#[derive(Clone, Debug, Default)]
pub struct Row {
    pub system: String,
    pub connections: Vec<f64>,
    pub connect_p50: Vec<f64>,
    pub connect_p99: Vec<f64>,
    /// Connect latency at `DataplaneSettings::latency_rate`, open loop.
    pub fixed_rate_p50: Vec<f64>,
    pub fixed_rate_p99: Vec<f64>,
    pub kept_alive: Vec<f64>,
    pub udp: Vec<f64>,
    pub failures: u64,
    pub time_to_serve: Vec<f64>,
    /// Backend servers found dead (and restarted) between runs.
    pub servers_restarted: usize,
    /// Share of one core the system's own process used, per round.
    pub process_cpu: Vec<f64>,
    /// Flows netfilter tracked in the node's namespace after each round.
    pub tracked_flows: Vec<f64>,
    /// The programs' counters, summed over the rounds (each round's agent starts at zero).
    pub counters: Vec<(&'static str, u64)>,
    /// The programs' CPU per connection and per UDP request, per round (Switchyard only).
    pub program_costs: program_stats::Samples,
    /// Why this configuration could not be measured.
    pub error: Option<String>,
}

impl Row {
    /// A configuration (labelled `label`) that could not be measured, with the
    /// first line of why.
    pub fn failed(label: &str, error: &Error) -> Self {
        Self {
            system: label.to_string(),
            error: Some(error.first_line()),
            ..Self::default()
        }
    }

    /// An empty row for `system`, filled by the rounds.
    fn empty(system: System) -> Self {
        let mut label = system.label().to_string();
        if system == System::Direct && std::env::var_os(DIRECT_WITH_CONNTRACK).is_some() {
            label = format!("{label}-with-conntrack");
        }
        Self {
            system: label,
            ..Self::default()
        }
    }
}

/// The order in which round `round` measures `count` systems: rotated by one
/// per round, so over `count` rounds each system is measured once in every
/// position (first, second, ...), not always first or always last.
pub fn round_order(count: usize, round: usize) -> Vec<usize> {
    (0..count).map(|index| (index + round) % count).collect()
}

/// What the rounds of one scale produced: a row per system, in the order given,
/// and the systems that failed (with the row saying why).
pub struct Measured {
    pub rows: Vec<Row>,
    pub failed: Vec<System>,
}

/// Measures every system at one scale in `settings.rounds` rounds. Each round
/// builds a fresh node for each system in turn and runs every workload once, so
/// the runs of the systems compared are minutes apart at most and this shared
/// VM's drift in speed (whole configurations measured a few minutes apart here
/// differed by up to a third, direct pod IP included, and nothing of ours was
/// found to explain it) falls on all of them alike. A system that fails in any
/// round is not measured in later rounds and is reported as failed.
pub fn measure_in_rounds(
    systems: &[System],
    services: u32,
    binaries: &Binaries,
    work: &Path,
    settings: &DataplaneSettings,
    summary: &mut Summary,
) -> Measured {
    let mut rows: Vec<Row> = systems.iter().map(|system| Row::empty(*system)).collect();
    for round in 0..settings.rounds {
        for index in round_order(systems.len(), round) {
            let system = systems[index];
            if rows[index].error.is_some() {
                continue;
            }
            println!(
                "data plane: {} with {services} Services, round {} of {} starts",
                system.label(),
                round + 1,
                settings.rounds
            );
            match measure_round(system, services, binaries, work, settings, &mut rows[index]) {
                Ok(()) => println!(
                    "data plane: {} with {services} Services, round {}: {} new connections/s",
                    system.label(),
                    round + 1,
                    rows[index]
                        .connections
                        .last()
                        .map(|rate| number(*rate, 0))
                        .unwrap_or_else(|| "-".into())
                ),
                Err(error) => {
                    // Keep the row's label (`direct-with-conntrack` stays that).
                    let label = std::mem::take(&mut rows[index].system);
                    eprintln!(
                        "bench: {} with {services} Services, round {}: {error}",
                        system.label(),
                        round + 1
                    );
                    rows[index] = Row::failed(&label, &error);
                    summary.record(
                        NAME,
                        &rows[index].system,
                        services as u64,
                        "failed-to-measure",
                        1.0,
                        "configurations",
                    );
                }
            }
        }
    }
    record_relative_to_direct(systems, services, &rows, summary);
    let mut failed = Vec::new();
    for (system, row) in systems.iter().zip(&rows) {
        if row.error.is_some() {
            failed.push(*system);
        } else {
            record(row, services, summary);
            if matches!(system, System::Switchyard | System::SwitchyardTc) {
                program_stats::record(&row.system, services as u64, &row.program_costs, summary);
            }
        }
    }
    Measured { rows, failed }
}

/// Each system's new-connection rate over direct's in the same round, in
/// percent: pairs measured within a round's few minutes of each other.
pub fn paired_ratios(row: &Row, direct: &Row) -> Vec<f64> {
    row.connections
        .iter()
        .zip(&direct.connections)
        .filter(|(_, direct)| **direct > 0.0)
        .map(|(rate, direct)| rate / direct * 100.0)
        .collect()
}

fn record_relative_to_direct(
    systems: &[System],
    services: u32,
    rows: &[Row],
    summary: &mut Summary,
) {
    let Some(direct) = systems
        .iter()
        .position(|system| *system == System::Direct)
        .map(|index| &rows[index])
        .filter(|direct| direct.error.is_none())
    else {
        return;
    };
    for (system, row) in systems.iter().zip(rows) {
        if *system == System::Direct || row.error.is_some() {
            continue;
        }
        summary.record_runs(
            NAME,
            &row.system,
            services as u64,
            "new-connections-per-second-over-direct-same-round",
            &paired_ratios(row, direct),
            "percent",
        );
    }
}

/// One round of one system: a fresh node, the system started and serving, a
/// warm-up, then one run of each workload, added to `row`.
fn measure_round(
    system: System,
    services: u32,
    binaries: &Binaries,
    work: &Path,
    settings: &DataplaneSettings,
    row: &mut Row,
) -> Result<()> {
    let mut topology = Topology::build(work, BACKENDS, &binaries.bench)?;
    let prober = Prober::new(CLIENT_NAMESPACE)?;
    let mut running = Running::start(system, binaries, work, "1h")?;
    if system == System::Direct && std::env::var_os(DIRECT_WITH_CONNTRACK).is_some() {
        // Diagnostic: with no rule at all, netfilter does not track connections in
        // the node's namespace, while the agent's rules (like kube-proxy's or any
        // CNI's) turn connection tracking on for every packet. This rule (what
        // kube-proxy's KUBE-FORWARD holds) turns it on for the direct path too, so
        // the difference to Switchyard is the TC programs alone.
        crate::topology::sh(&format!(
            "ip netns exec {NODE_NAMESPACE} iptables -A FORWARD -m conntrack --ctstate INVALID -j DROP"
        ))?;
    }
    if system != System::Direct {
        let serving =
            running.wait_serving(&prober, &probe_targets(services), settings.serve_timeout)?;
        row.time_to_serve.push(serving.as_secs_f64());
    }
    let (tcp, udp) = targets(system, services);
    // The system's own process competes with the client and the servers for the
    // two cores: its CPU time over the runs says how much of a gap it explains.
    let system_pid = running.process.as_ref().and_then(|process| process.pid());
    let cpu_before = system_pid.and_then(cpu_seconds);
    let measuring_since = std::time::Instant::now();
    let load = |workload: Workload, targets: &[SocketAddrV4], duration: Duration| LoadOptions {
        workload,
        targets: targets.to_vec(),
        concurrency: settings.concurrency,
        duration,
        max_operations: 5_000_000,
        rate: None,
        timeout: Duration::from_secs(2),
        timeline: false,
        udp_payload_bytes: 0,
    };
    // Warm-up: caches, conntrack, the first connections' slow paths.
    run_load(
        &binaries.bench,
        work,
        &load(Workload::Connect, &tcp, settings.warm_up),
    )?;
    // Each run: dead backends restarted first (counted), failures added and the first reported.
    let mut run = |workload: &str, options: LoadOptions, row: &mut Row| -> Result<LoadReport> {
        row.servers_restarted += topology.revive_servers()?;
        let report = run_load(&binaries.bench, work, &options)?;
        row.failures += report.failures;
        report_failure(system, workload, &report);
        Ok(report)
    };
    let for_a_run =
        |workload, targets: &[SocketAddrV4]| load(workload, targets, settings.run_duration);
    let connect = run("connect", for_a_run(Workload::Connect, &tcp), row)?;
    row.connections.push(connect.rate());
    push_median_and_p99(&connect, &mut row.connect_p50, &mut row.connect_p99);
    let paced = run(
        "connect at a fixed rate",
        LoadOptions {
            rate: Some(settings.latency_rate),
            ..for_a_run(Workload::Connect, &tcp)
        },
        row,
    )?;
    push_median_and_p99(&paced, &mut row.fixed_rate_p50, &mut row.fixed_rate_p99);
    let kept = run("kept-alive", for_a_run(Workload::KeptAlive, &tcp), row)?;
    row.kept_alive.push(kept.rate());
    if !udp.is_empty() {
        let datagrams = run("udp", for_a_run(Workload::Udp, &udp), row)?;
        row.udp.push(datagrams.rate());
    }
    if matches!(system, System::Switchyard | System::SwitchyardTc)
        && row.program_costs.error.is_none()
    {
        // After the rates: the statistics cost every run two clock reads.
        let pins = running.pin_directory.clone();
        let mut with_statistics = |workload, targets: &[SocketAddrV4], row: &mut Row| {
            program_stats::during(&pins, || {
                let report = run("with BPF statistics on", for_a_run(workload, targets), row)?;
                Ok(((), report.operations + report.failures))
            })
        };
        let measured = with_statistics(Workload::Connect, &tcp, row).and_then(|(_, connection)| {
            let udp = if udp.is_empty() {
                None
            } else {
                with_statistics(Workload::Udp, &udp, row)?.1
            };
            Ok((connection, udp))
        });
        match measured {
            Ok((Some(connection), udp)) => {
                row.program_costs.connection.push(connection);
                row.program_costs.udp.extend(udp);
            }
            Ok((None, _)) => {
                row.program_costs.error = Some("no connection made with the statistics on".into())
            }
            Err(error) => row.program_costs.error = Some(error.first_line()),
        }
    }
    let label = row.system.clone();
    if let (Some(before), Some(after)) = (cpu_before, system_pid.and_then(cpu_seconds)) {
        let share = (after - before) / measuring_since.elapsed().as_secs_f64() * 100.0;
        eprintln!(
            "bench: {label} at {services} Services: its process (and the commands it ran) used {share:.1}% of one core during the runs"
        );
        row.process_cpu.push(share);
    }
    // Whether netfilter's connection tracking was on in the node's namespace
    // (any nat rule or conntrack match turns it on for every forwarded flow):
    // the flows it holds right after the runs (closed ones linger 2 s).
    let tracked = netfilter_tracked_flows();
    eprintln!(
        "bench: {label} at {services} Services: netfilter tracks {tracked} flows in the node's namespace{}",
        if tracked == 0 { " (its connection tracking is off there)" } else { "" }
    );
    row.tracked_flows.push(tracked as f64);
    if matches!(system, System::Switchyard | System::SwitchyardTc) {
        // What the programs counted over the round (warm-up included): errors,
        // and flows the programs could not translate, say where a failure came from.
        match datapath_counters(&running.pin_directory) {
            Ok(counters) => {
                eprintln!(
                    "bench: switchyard datapath counters at {services} Services: {}",
                    counters
                        .iter()
                        .map(|(name, value)| format!("{name} {value}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                add_counters(&mut row.counters, &counters);
            }
            Err(error) => eprintln!("bench: switchyard datapath counters: {error}"),
        }
    }
    running.stop();
    drop(topology);
    Ok(())
}

/// Adds one round's counters to the sums so far.
fn add_counters(sums: &mut Vec<(&'static str, u64)>, round: &[(&'static str, u64)]) {
    for (name, value) in round {
        match sums.iter_mut().find(|(summed, _)| summed == name) {
            Some((_, sum)) => *sum += value,
            None => sums.push((name, *value)),
        }
    }
}

/// Writes a measured row's figures to the summary.
fn record(row: &Row, services: u32, summary: &mut Summary) {
    let scale = services as u64;
    let label = row.system.as_str();
    let runs = [
        ("new-connections-per-second", &row.connections, "1/s"),
        ("connect-latency-p50", &row.connect_p50, "us"),
        ("connect-latency-p99", &row.connect_p99, "us"),
        ("fixed-rate-connect-latency-p50", &row.fixed_rate_p50, "us"),
        ("fixed-rate-connect-latency-p99", &row.fixed_rate_p99, "us"),
        ("kept-alive-requests-per-second", &row.kept_alive, "1/s"),
        ("udp-requests-per-second", &row.udp, "1/s"),
        ("time-to-serve", &row.time_to_serve, "s"),
        ("process-cpu", &row.process_cpu, "percent-of-a-core"),
        ("netfilter-tracked-flows", &row.tracked_flows, "flows"),
    ];
    for (metric, samples, unit) in runs {
        summary.record_runs(NAME, label, scale, metric, samples, unit);
    }
    summary.record(
        NAME,
        label,
        scale,
        "failed-operations",
        row.failures as f64,
        "operations",
    );
    summary.record(
        NAME,
        label,
        scale,
        "backend-servers-restarted",
        row.servers_restarted as f64,
        "servers",
    );
    for (name, value) in &row.counters {
        summary.record(
            NAME,
            label,
            scale,
            &format!("datapath-{name}"),
            *value as f64,
            "packets",
        );
    }
}

/// Names of the programs' per-CPU counters, by index (`switchyard_common::counter`).
const COUNTER_NAMES: [&str; 8] = [
    "translated",
    "no-backend",
    "conntrack-hit",
    "conntrack-miss",
    "error",
    "passed-untracked",
    "reverse-translated",
    "conntrack-overflow",
];

/// The programs' per-CPU counters, summed over CPUs, read with bpftool from the
/// agent's pins (the bench does not link the agent's map code).
/// Flows netfilter tracks in the node's namespace (zero when its connection
/// tracking is off there).
pub fn netfilter_tracked_flows() -> u64 {
    crate::topology::sh(&format!(
        "ip netns exec {NODE_NAMESPACE} cat /proc/sys/net/netfilter/nf_conntrack_count 2>/dev/null || echo 0"
    ))
    .ok()
    .and_then(|count| count.trim().parse::<u64>().ok())
    .unwrap_or(0)
}

pub fn datapath_counters(pin_directory: &Path) -> Result<Vec<(&'static str, u64)>> {
    let pattern = format!("{}/v*/SY_COUNTERS", pin_directory.display());
    let output = crate::topology::sh(&format!(
        "for map in {pattern}; do bpftool --json map dump pinned \"$map\"; done"
    ))?;
    let entries: Vec<serde_json::Value> = serde_json::from_str(output.trim())
        .map_err(|error| Error::Load(format!("failed to read the counters: {error}")))?;
    let mut sums = vec![0u64; COUNTER_NAMES.len()];
    for entry in entries {
        // bpftool prints a per-CPU array as {"key": n, "values": [{"cpu", "value"}]}
        // when the map has BTF, and as byte arrays otherwise.
        let index = entry
            .get("key")
            .and_then(json_number)
            .or_else(|| entry.get("formatted")?.get("key").and_then(json_number));
        let values = entry
            .get("values")
            .or_else(|| entry.get("formatted")?.get("values"))
            .and_then(|values| values.as_array());
        let (Some(index), Some(values)) = (index, values) else {
            continue;
        };
        if let Some(sum) = sums.get_mut(index as usize) {
            *sum += values
                .iter()
                .filter_map(|value| value.get("value").and_then(json_number))
                .sum::<u64>();
        }
    }
    Ok(COUNTER_NAMES.iter().copied().zip(sums).collect())
}

/// A number as bpftool prints it: a JSON number, or little-endian hex bytes.
fn json_number(value: &serde_json::Value) -> Option<u64> {
    if let Some(number) = value.as_u64() {
        return Some(number);
    }
    let bytes = value.as_array()?;
    let mut number = 0u64;
    for (index, byte) in bytes.iter().enumerate().take(8) {
        let text = byte.as_str()?;
        let byte = u64::from_str_radix(text.trim_start_matches("0x"), 16).ok()?;
        number |= byte << (8 * index);
    }
    Some(number)
}

/// Adds a run's median and 99th percentile latency to a row's samples; a run
/// in which nothing succeeded adds none (it would read as zero latency).
pub fn push_median_and_p99(report: &LoadReport, medians: &mut Vec<f64>, p99s: &mut Vec<f64>) {
    if report.latencies_us.is_empty() {
        return;
    }
    medians.push(percentile(&report.latencies_us, 0.5).unwrap_or(0) as f64);
    p99s.push(percentile(&report.latencies_us, 0.99).unwrap_or(0) as f64);
}

pub fn report_failure(system: System, workload: &str, report: &LoadReport) {
    if let Some(failure) = &report.first_failure {
        eprintln!(
            "bench: {} {workload}: {} of {} failed; first: {failure}",
            system.label(),
            report.failures,
            report.operations + report.failures
        );
    }
}

pub fn table(services: u32, latency_rate: f64, rows: &[Row]) -> Table {
    let paced_p50 = format!("p50 µs at {}/s", number(latency_rate, 0));
    let paced_p99 = format!("p99 µs at {}/s", number(latency_rate, 0));
    let mut table = Table::new(
        &format!(
            "Data plane, {} Services x {BACKENDS} endpoints (median of rounds, (min-max)); \
             connect latency at full load, then at a fixed rate",
            number(services as f64, 0)
        ),
        &[
            "system",
            "new connections/s",
            "connect p50 µs",
            "connect p99 µs",
            &paced_p50,
            &paced_p99,
            "kept-alive requests/s",
            "UDP requests/s",
            "new connections/s over direct, same round",
            "failed",
            "serving after",
        ],
    );
    let cell = Spread::cell;
    let direct = rows
        .iter()
        .find(|row| row.system.starts_with(System::Direct.label()) && row.error.is_none());
    for row in rows {
        if let Some(error) = &row.error {
            let mut cells = vec![row.system.clone()];
            cells.extend(std::iter::repeat_n("-".to_string(), 9));
            cells.push(format!("FAILED: {error}"));
            table.row(cells);
            continue;
        }
        let serving = match Spread::of(&row.time_to_serve) {
            Some(spread) => format!("{:.1} s", spread.median),
            None => "-".into(),
        };
        table.row(vec![
            row.system.clone(),
            cell(&row.connections),
            cell(&row.connect_p50),
            cell(&row.connect_p99),
            cell(&row.fixed_rate_p50),
            cell(&row.fixed_rate_p99),
            cell(&row.kept_alive),
            cell(&row.udp),
            match direct {
                Some(direct) if !std::ptr::eq(direct, row) => {
                    Spread::of(&paired_ratios(row, direct))
                        .map(|spread| {
                            format!(
                                "{:.0}% ({:.0}-{:.0}%)",
                                spread.median, spread.min, spread.max
                            )
                        })
                        .unwrap_or_else(|| "-".into())
                }
                _ => "-".into(),
            },
            if row.servers_restarted > 0 {
                format!("{} ({} backends died)", row.failures, row.servers_restarted)
            } else {
                row.failures.to_string()
            },
            serving,
        ]);
    }
    table
}

/// CPU time of process `pid` and of the children it waited for (utime, stime,
/// cutime, cstime of `/proc/PID/stat`), in seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; the fields after it are plain.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // Fields 14-17 of the file are 12-15 after the name and the state.
    let ticks: u64 = fields
        .get(11..15)?
        .iter()
        .map(|field| field.parse::<u64>().ok())
        .sum::<Option<u64>>()?;
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (per_second > 0).then(|| ticks as f64 / per_second as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_system_is_measured_once_per_round_and_each_comes_first_in_some_round() {
        for count in 1..=5 {
            let mut first = std::collections::BTreeSet::new();
            for round in 0..count {
                let order = round_order(count, round);
                let mut sorted = order.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..count).collect::<Vec<_>>(), "round {round}");
                first.insert(order[0]);
            }
            assert_eq!(first.len(), count, "{count} systems");
        }
    }

    #[test]
    fn each_rate_is_paired_with_directs_rate_of_the_same_round() {
        let direct = Row {
            connections: vec![10_000.0, 20_000.0, 0.0],
            ..Row::default()
        };
        let switchyard = Row {
            connections: vec![9_000.0, 19_000.0, 5_000.0],
            ..Row::default()
        };
        // A round in which direct connected nothing pairs with nothing.
        let rounded = |ratios: Vec<f64>| ratios.iter().map(|r| r.round()).collect::<Vec<_>>();
        assert_eq!(
            rounded(paired_ratios(&switchyard, &direct)),
            vec![90.0, 95.0]
        );
        let shorter = Row {
            connections: vec![11_000.0],
            ..Row::default()
        };
        assert_eq!(rounded(paired_ratios(&shorter, &direct)), vec![110.0]);
    }

    #[test]
    fn the_counters_of_every_round_are_summed() {
        let mut sums = Vec::new();
        add_counters(&mut sums, &[("translated", 5), ("error", 0)]);
        add_counters(&mut sums, &[("translated", 7), ("error", 1)]);
        assert_eq!(sums, vec![("translated", 12), ("error", 1)]);
    }

    #[test]
    fn the_table_shows_each_systems_rate_over_directs_in_the_same_round() {
        let direct = Row {
            system: "direct".into(),
            connections: vec![10_000.0, 20_000.0, 16_000.0],
            ..Row::default()
        };
        let switchyard = Row {
            system: "switchyard".into(),
            connections: vec![9_000.0, 19_000.0, 12_000.0],
            time_to_serve: vec![2.0, 1.0, 3.0],
            ..Row::default()
        };
        let failed = Row::failed(System::KubeProxyNft.label(), &Error::System("no".into()));
        let text = table(10_000, 2_000.0, &[direct, switchyard, failed]).render();
        let line = |system: &str| {
            text.lines()
                .find(|line| line.starts_with(&format!("| {system} ")))
                .unwrap_or_default()
                .to_string()
        };
        assert!(line("switchyard").contains("90% (75-95%)"), "{text}");
        assert!(line("switchyard").contains("2.0 s"), "{text}");
        assert!(
            line("kube-proxy-iptables-nft").contains("FAILED: no"),
            "{text}"
        );
        let cells = |system: &str| line(system).matches('|').count();
        assert_eq!(cells("direct"), cells("kube-proxy-iptables-nft"), "{text}");
    }
}
