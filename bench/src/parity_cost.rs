//! What two of kube-proxy's behaviours cost Switchyard (issue 24), in rounds of
//! their own at the control scale (10,000 Services; 100 with `--quick`):
//!
//! - **loadBalancerSourceRanges**: new connections/s to the load-balancer
//!   addresses of Services with source ranges (the client's address among
//!   eight ranges, so every connection is admitted after the check) against
//!   those of the same kind of Services without, in the same round.
//! - **IPv4 fragment tracking**: UDP requests of 4,000 bytes (three fragments
//!   each on these 1,500-byte links) against whole 7-byte ones to the same UDP
//!   Services, and what the TC programs spend per packet on each, in the same
//!   round.
//!
//! Each round measures the agent as installed (`switchyard`: the connect hook
//! leaves a Service with source ranges to the TC programs, which see the pod's
//! address) and with every packet through the TC programs
//! (`switchyard-tc-only`, where the two kinds of Service differ by the check
//! alone), each on a fresh node running `switchyard-agent standalone` fed a
//! manifest: the data plane's Services plus the LoadBalancer ones. Within a
//! configuration the kinds alternate in short slices, in the other order every
//! slice and every round, so the VM's drift falls on both; the rates come from slices with the
//! kernel's BPF statistics off, the programs' nanoseconds from one slice of
//! each kind with them on (`program_stats`).

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::apiserver::{backend_addresses, endpoint_slice_object, NAMESPACE};
use crate::dataplane::{
    report_failure, round_order, run_load, targets, DataplaneSettings, BACKENDS,
};
use crate::error::{Error, Result};
use crate::flatness;
use crate::load::{LoadOptions, Workload};
use crate::program_stats::{self, ProgramCost};
use crate::report::{Spread, Summary, Table};
use crate::systems::{probe_targets, Binaries, Running, System};
use crate::topology::{
    service_address, Prober, Topology, BACKEND_TCP_PORT, CLIENT_ADDRESS, CLIENT_NAMESPACE,
    LOAD_BALANCER_NETWORK, SERVICE_TCP_PORT,
};

pub const NAME: &str = "parity-cost";
/// Same-round ratio of the connection rates, with ranges over without (percent).
pub const RANGES_OVER_WITHOUT: &str = "with-source-ranges-over-without-same-round";
/// Same-round ratio of the TC programs' ns per packet, 4,000-byte requests over whole ones.
pub const FRAGMENTED_OVER_WHOLE: &str = "fragmented-over-whole-tc-ns-per-packet-same-round";
/// Bytes of the fragmented UDP requests.
pub const FRAGMENTED_BYTES: usize = 4_000;
/// ClusterIPs of the LoadBalancer Services: above the data plane's 30,000.
const FIRST_LOAD_BALANCER_SERVICE: u32 = 60_000;
const FIRST_NODE_PORT: u32 = 30_000;
/// The ranges of each Service with source ranges: the client pod's address
/// among seven others, as a user's list of offices and peers might be.
const OTHER_RANGES: [&str; 7] = [
    "203.0.113.0/24",
    "198.51.100.0/24",
    "192.0.2.0/25",
    "172.16.0.0/12",
    "100.64.0.0/10",
    "10.250.0.0/16",
    "192.168.200.0/24",
];

#[derive(Clone, Debug)]
pub struct ParityCostSettings {
    pub services: u32,
    /// LoadBalancer Services of each kind (with ranges, without).
    pub load_balancers: u32,
    pub rounds: usize,
    /// Slices of each kind per configuration and round, with statistics off.
    pub slices: usize,
    pub slice_duration: Duration,
}

/// The traffic compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    WithRanges,
    WithoutRanges,
    UdpWhole,
    UdpFragmented,
}

const KINDS: [Kind; 4] = [
    Kind::WithRanges,
    Kind::WithoutRanges,
    Kind::UdpWhole,
    Kind::UdpFragmented,
];

/// The load-balancer address of LoadBalancer Service `index` (the first
/// `load_balancers` have source ranges, the next as many have none).
pub fn load_balancer_address(index: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(LOAD_BALANCER_NETWORK.0) + 1 + index)
}

/// LoadBalancer Service `index` (TCP 80 -> 8080, a NodePort, its address in
/// `status`), with the ranges when `ranged`, and its EndpointSlice.
pub fn load_balancer_objects(index: u32, ranged: bool) -> [serde_json::Value; 2] {
    let name = format!("bench-lb-{index}");
    let mut service = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "type": "LoadBalancer",
            "clusterIP": service_address(FIRST_LOAD_BALANCER_SERVICE + index).to_string(),
            "ports": [{
                "name": "p", "protocol": "TCP", "port": SERVICE_TCP_PORT,
                "targetPort": BACKEND_TCP_PORT, "nodePort": FIRST_NODE_PORT + index,
            }],
        },
        "status": {"loadBalancer": {"ingress": [{"ip": load_balancer_address(index).to_string()}]}},
    });
    if ranged {
        let mut ranges: Vec<String> = OTHER_RANGES.iter().map(|range| range.to_string()).collect();
        ranges.insert(3, format!("{CLIENT_ADDRESS}/32"));
        service["spec"]["loadBalancerSourceRanges"] = serde_json::json!(ranges);
    }
    // Service 0's slice is a TCP one: renamed for this Service.
    let mut slice = endpoint_slice_object(0, &backend_addresses(BACKENDS));
    slice["metadata"]["name"] = serde_json::json!(name);
    slice["metadata"]["labels"]["kubernetes.io/service-name"] = serde_json::json!(name);
    [service, slice]
}

fn write_manifest(work: &Path, settings: &ParityCostSettings) -> Result<PathBuf> {
    let mut manifest = flatness::manifest(settings.services)?;
    let items = manifest["items"]
        .as_array_mut()
        .ok_or_else(|| Error::Populate("the data plane's manifest has no items".into()))?;
    for index in 0..2 * settings.load_balancers {
        items.extend(load_balancer_objects(
            index,
            index < settings.load_balancers,
        ));
    }
    let path = work.join(format!("parity-cost-{}-services.json", settings.services));
    let text = serde_json::to_string(&manifest)
        .map_err(|error| Error::Populate(format!("failed to write the manifest: {error}")))?;
    std::fs::write(&path, text)
        .map_err(|error| Error::Populate(format!("failed to write {}: {error}", path.display())))?;
    Ok(path)
}

/// What one kind of traffic did in one configuration and round.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KindRound {
    pub operations: u64,
    pub seconds: f64,
    /// From the slice with statistics on.
    pub costs: Vec<ProgramCost>,
}

impl KindRound {
    pub fn rate(&self) -> Option<f64> {
        (self.seconds > 0.0).then(|| self.operations as f64 / self.seconds)
    }
}

/// Every round of one configuration: per round, one `KindRound` per kind (in
/// the order of `KINDS`).
#[derive(Clone, Debug, Default)]
pub struct Samples {
    pub rounds: Vec<[KindRound; 4]>,
    pub failures: u64,
    pub error: Option<String>,
}

fn index_of(kind: Kind) -> usize {
    KINDS.iter().position(|other| *other == kind).unwrap_or(0)
}

impl Samples {
    /// `figure` of `kind` in each round.
    pub fn per_round(&self, kind: Kind, figure: fn(&KindRound) -> Option<f64>) -> Vec<f64> {
        self.rounds
            .iter()
            .filter_map(|round| figure(&round[index_of(kind)]))
            .collect()
    }

    /// Per round, `figure` of `kind` over `figure` of `base`, in percent.
    pub fn ratios(
        &self,
        kind: Kind,
        base: Kind,
        figure: fn(&KindRound) -> Option<f64>,
    ) -> Vec<f64> {
        self.rounds
            .iter()
            .filter_map(|round| {
                let value = figure(&round[index_of(kind)])?;
                let base = figure(&round[index_of(base)])?;
                (base > 0.0).then(|| 100.0 * value / base)
            })
            .collect()
    }
}

/// One figure of a kind's round: (summary metric, how it is read, unit).
type KindFigure = (&'static str, fn(&KindRound) -> Option<f64>, &'static str);

/// Connections (or requests) per second over the slices with statistics off.
pub fn rate(round: &KindRound) -> Option<f64> {
    round.rate()
}

/// Every program's nanoseconds per connection (or request).
pub fn ns_per_operation(round: &KindRound) -> Option<f64> {
    (!round.costs.is_empty()).then(|| program_stats::total_ns_per_operation(&round.costs))
}

/// The TC programs' nanoseconds per packet.
pub fn tc_ns_per_packet(round: &KindRound) -> Option<f64> {
    program_stats::tc_ns_per_packet(&round.costs)
}

/// The TC programs' runs (packets at a hook) per request.
pub fn tc_packets_per_operation(round: &KindRound) -> Option<f64> {
    let runs: f64 = round
        .costs
        .iter()
        .filter(|cost| cost.tc)
        .map(|cost| cost.runs_per_operation)
        .sum();
    (!round.costs.is_empty()).then_some(runs)
}

/// The configurations measured, in the order of their samples.
pub const CONFIGURATIONS: [System; 2] = [System::Switchyard, System::SwitchyardTc];

/// Measures both configurations in `settings.rounds` rounds and records them.
/// A configuration that fails a round is not measured further.
pub fn measure_in_rounds(
    binaries: &Binaries,
    work: &Path,
    dataplane: &DataplaneSettings,
    settings: &ParityCostSettings,
    summary: &mut Summary,
) -> Vec<Samples> {
    let mut measured = vec![Samples::default(), Samples::default()];
    let manifest = match write_manifest(work, settings) {
        Ok(manifest) => manifest,
        Err(error) => {
            for samples in &mut measured {
                samples.error = Some(error.first_line());
            }
            record(settings, &measured, summary);
            return measured;
        }
    };
    for round in 0..settings.rounds {
        for index in round_order(CONFIGURATIONS.len(), round) {
            let system = CONFIGURATIONS[index];
            let samples = &mut measured[index];
            if samples.error.is_some() {
                continue;
            }
            println!(
                "parity cost: {} with {} Services, round {} of {} starts",
                system.label(),
                settings.services,
                round + 1,
                settings.rounds
            );
            let mut failures = 0;
            let result = measure_round(
                system,
                round,
                binaries,
                work,
                &manifest,
                dataplane,
                settings,
                &mut failures,
            );
            samples.failures += failures;
            match result {
                Ok(kinds) => samples.rounds.push(kinds),
                Err(error) => {
                    eprintln!(
                        "bench: parity cost, {} round {}: {error}",
                        system.label(),
                        round + 1
                    );
                    samples.error = Some(error.first_line());
                }
            }
        }
    }
    record(settings, &measured, summary);
    measured
}

#[allow(clippy::too_many_arguments)]
fn measure_round(
    system: System,
    round: usize,
    binaries: &Binaries,
    work: &Path,
    manifest: &Path,
    dataplane: &DataplaneSettings,
    settings: &ParityCostSettings,
    failures: &mut u64,
) -> Result<[KindRound; 4]> {
    let mut topology = Topology::build(work, BACKENDS, &binaries.bench)?;
    let prober = Prober::new(CLIENT_NAMESPACE)?;
    let mut running = Running::start_standalone_as(system, binaries, work, manifest)?;
    let address = |index| SocketAddrV4::new(load_balancer_address(index), SERVICE_TCP_PORT);
    let ranged: Vec<SocketAddrV4> = (0..settings.load_balancers).map(address).collect();
    let unranged: Vec<SocketAddrV4> = (settings.load_balancers..2 * settings.load_balancers)
        .map(address)
        .collect();
    let mut probes = probe_targets(settings.services);
    probes.extend([ranged[0], unranged[0]]);
    running.wait_serving(&prober, &probes, dataplane.serve_timeout)?;
    let (_, udp) = targets(system, settings.services);
    let options = |kind: Kind, duration: Duration| {
        let (workload, targets, bytes) = match kind {
            Kind::WithRanges => (Workload::Connect, &ranged, 0),
            Kind::WithoutRanges => (Workload::Connect, &unranged, 0),
            Kind::UdpWhole => (Workload::Udp, &udp, 0),
            Kind::UdpFragmented => (Workload::Udp, &udp, FRAGMENTED_BYTES),
        };
        LoadOptions {
            workload,
            targets: targets.clone(),
            concurrency: dataplane.concurrency,
            duration,
            max_operations: 5_000_000,
            rate: None,
            timeout: Duration::from_secs(2),
            timeline: false,
            udp_payload_bytes: bytes,
        }
    };
    let mut run = |kind: Kind, duration: Duration| {
        topology.revive_servers()?;
        let report = run_load(&binaries.bench, work, &options(kind, duration))?;
        *failures += report.failures;
        report_failure(system, &format!("parity cost {kind:?}"), &report);
        Ok::<_, Error>(report)
    };
    // Warm-up: every kind once (the first connections' and fragments' slow paths).
    for kind in KINDS {
        run(kind, dataplane.warm_up / 4)?;
    }
    let mut kinds: [KindRound; 4] = Default::default();
    for slice in 0..settings.slices {
        for position in 0..KINDS.len() {
            let kind = KINDS[slice_order(round, slice)[position]];
            let report = run(kind, settings.slice_duration)?;
            let totals = &mut kinds[index_of(kind)];
            totals.operations += report.operations;
            totals.seconds += report.elapsed_seconds;
        }
    }
    for kind in KINDS {
        let (_, costs) = program_stats::during(&running.pin_directory, || {
            let report = run(kind, settings.slice_duration)?;
            Ok(((), report.operations + report.failures))
        })?;
        kinds[index_of(kind)].costs = costs.ok_or_else(|| {
            Error::System(format!("no {kind:?} request made with the statistics on"))
        })?;
    }
    running.stop();
    drop(topology);
    Ok(kinds)
}

/// The order of `KINDS` in slice `slice` of round `round`: each pair (with and
/// without ranges, whole and fragmented) in the other order every slice and
/// every round, so that neither is always the first after the warm-up.
pub fn slice_order(round: usize, slice: usize) -> [usize; 4] {
    let swap = (round + slice) % 2;
    [0, 1, 2, 3].map(|position| position ^ swap)
}

/// The summary's figures of each configuration: the same-round ratios, the
/// rates and the programs' nanoseconds of each kind.
pub fn record(settings: &ParityCostSettings, measured: &[Samples], summary: &mut Summary) {
    let scale = u64::from(settings.services);
    for (system, samples) in CONFIGURATIONS.iter().zip(measured) {
        let label = system.label();
        if let Some(error) = &samples.error {
            eprintln!("bench: parity cost of {label} not measured: {error}");
            summary.record(
                NAME,
                label,
                scale,
                "failed-to-measure",
                1.0,
                "configurations",
            );
            continue;
        }
        summary.record(
            NAME,
            label,
            scale,
            "rounds",
            samples.rounds.len() as f64,
            "rounds",
        );
        summary.record(
            NAME,
            label,
            scale,
            "failed-operations",
            samples.failures as f64,
            "operations",
        );
        let ratios = [
            (
                RANGES_OVER_WITHOUT,
                samples.ratios(Kind::WithRanges, Kind::WithoutRanges, rate),
            ),
            (
                FRAGMENTED_OVER_WHOLE,
                samples.ratios(Kind::UdpFragmented, Kind::UdpWhole, tc_ns_per_packet),
            ),
        ];
        for (metric, values) in ratios {
            summary.record_runs(NAME, label, scale, metric, &values, "percent");
        }
        for (kind, suffix) in [
            (Kind::WithRanges, "with-source-ranges"),
            (Kind::WithoutRanges, "without-source-ranges"),
        ] {
            let figures: [KindFigure; 2] = [
                ("connections-per-second", rate, "1/s"),
                ("program-ns-per-connection", ns_per_operation, "ns"),
            ];
            for (metric, figure, unit) in figures {
                let values = samples.per_round(kind, figure);
                summary.record_runs(
                    NAME,
                    label,
                    scale,
                    &format!("{metric}-{suffix}"),
                    &values,
                    unit,
                );
            }
        }
        for (kind, suffix) in [
            (Kind::UdpWhole, "whole"),
            (Kind::UdpFragmented, "4000-bytes"),
        ] {
            let figures: [KindFigure; 4] = [
                ("udp-requests-per-second", rate, "1/s"),
                ("program-ns-per-udp-request", ns_per_operation, "ns"),
                ("tc-ns-per-packet", tc_ns_per_packet, "ns"),
                (
                    "tc-packets-per-udp-request",
                    tc_packets_per_operation,
                    "packets",
                ),
            ];
            for (metric, figure, unit) in figures {
                let values = samples.per_round(kind, figure);
                summary.record_runs(
                    NAME,
                    label,
                    scale,
                    &format!("{metric}-{suffix}"),
                    &values,
                    unit,
                );
            }
        }
    }
}

pub fn table(settings: &ParityCostSettings, measured: &[Samples]) -> Table {
    let mut table = Table::new(
        &format!(
            "Cost of kube-proxy parity (issue 24), {} Services + {} LoadBalancer Services with \
             source ranges and {} without, {} rounds (median of rounds, (min-max))",
            crate::report::number(f64::from(settings.services), 0),
            settings.load_balancers,
            settings.load_balancers,
            settings.rounds
        ),
        &[
            "system",
            "new connections/s with ranges",
            "without",
            "with over without, same round",
            "program ns per connection with ranges",
            "without",
            "UDP requests/s whole",
            "4,000 bytes",
            "TC ns per packet whole",
            "4,000 bytes",
            "4,000 bytes over whole, same round",
            "failed",
        ],
    );
    let cell = |values: &[f64], decimals: usize| {
        Spread::of(values)
            .map(|spread| spread.display(decimals))
            .unwrap_or_else(|| "-".into())
    };
    let percent = |values: &[f64]| {
        Spread::of(values)
            .map(|spread| {
                format!(
                    "{:.1}% ({:.1}-{:.1}%)",
                    spread.median, spread.min, spread.max
                )
            })
            .unwrap_or_else(|| "-".into())
    };
    for (system, samples) in CONFIGURATIONS.iter().zip(measured) {
        if let Some(error) = &samples.error {
            let mut cells = vec![system.label().to_string()];
            cells.extend(std::iter::repeat_n("-".to_string(), 10));
            cells.push(format!("FAILED: {error}"));
            table.row(cells);
            continue;
        }
        table.row(vec![
            system.label().to_string(),
            cell(&samples.per_round(Kind::WithRanges, rate), 0),
            cell(&samples.per_round(Kind::WithoutRanges, rate), 0),
            percent(&samples.ratios(Kind::WithRanges, Kind::WithoutRanges, rate)),
            cell(&samples.per_round(Kind::WithRanges, ns_per_operation), 0),
            cell(&samples.per_round(Kind::WithoutRanges, ns_per_operation), 0),
            cell(&samples.per_round(Kind::UdpWhole, rate), 0),
            cell(&samples.per_round(Kind::UdpFragmented, rate), 0),
            cell(&samples.per_round(Kind::UdpWhole, tc_ns_per_packet), 0),
            cell(&samples.per_round(Kind::UdpFragmented, tc_ns_per_packet), 0),
            percent(&samples.ratios(Kind::UdpFragmented, Kind::UdpWhole, tc_ns_per_packet)),
            samples.failures.to_string(),
        ]);
    }
    table.note(
        "Connections go to the load-balancer addresses of TCP LoadBalancer Services with \
         loadBalancerSourceRanges (eight ranges, the client pod's /32 among them: every connection \
         passes the check) and of as many without. As installed, the connect hook leaves a Service \
         with ranges to the TC programs (the check needs the packet's source address), so that \
         column includes the TC path's cost; switchyard-tc-only sends both kinds through TC, where \
         they differ by the check alone. UDP requests go to the data plane's UDP Services, whole \
         (7 bytes) or of 4,000 bytes (three IP fragments each; answers are whole); TC ns per packet \
         is the TC programs' run time over their runs. Rates: slices with the BPF statistics off, \
         the kinds alternating; nanoseconds: one slice of each kind with them on.",
    );
    table
}

#[cfg(test)]
mod tests;
