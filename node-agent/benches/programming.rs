//! Programming latency of the syncer: prints a table, asserts nothing.
//!
//! 1. 10,000 Services x 10 endpoints into empty maps.
//! 2. A single-Service update (one endpoint replaced) with 10,000 present.
//! 3. Restoring the state from the maps (what a restarted agent does first).
//!
//! Each against the in-memory fake maps, and against real pinned BPF maps when
//! the programs can be loaded (root, bpffs): `SWITCHYARD_BENCH_PIN_DIR` (default
//! `/sys/fs/bpf/switchyard-bench-<pid>`, removed at the end). Loading attaches
//! nothing, so no traffic is affected.
//!
//! Run: `make bench-programming` (or `cargo bench -p switchyard-agent --bench programming`).

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use switchyard_agent::desired::{
    desired_services, lay_out, service_desired, services_desired, DesiredServices, NodeView,
};
use switchyard_agent::diff::plan;
use switchyard_agent::gate::{Gate, GateInput, GateOpen};
use switchyard_agent::maps::{FakeServiceMaps, MapState, ServiceMaps};
use switchyard_agent::model::{
    AddressFamily, EndpointModel, EndpointPortModel, EndpointSliceModel, Protocol, ServiceModel,
    ServiceName, ServicePortModel, TargetPort, TrafficPolicy,
};
use switchyard_agent::sync::{apply, Syncer};

const SERVICES: u32 = 10_000;
const ENDPOINTS: u32 = 10;
const REPETITIONS: usize = 20;

fn service(index: u32) -> ServiceModel {
    ServiceModel {
        name: ServiceName::new("bench", format!("service-{index}")),
        cluster_ips: vec![IpAddr::V4(Ipv4Addr::from(0x0a60_0000 + index))],
        external_ips: vec![],
        load_balancer_ips: vec![],
        ports: vec![ServicePortModel {
            name: "http".into(),
            protocol: Protocol::Tcp,
            port: 80,
            node_port: None,
            target_port: TargetPort::Number(8080),
        }],
        external_traffic_policy: TrafficPolicy::Cluster,
        internal_traffic_policy: TrafficPolicy::Cluster,
        session_affinity_timeout_seconds: None,
        load_balancer_source_ranges: Vec::new(),
    }
}

fn slice(index: u32, generation: u32) -> EndpointSliceModel {
    EndpointSliceModel {
        slice_name: ServiceName::new("bench", format!("service-{index}-slice")),
        service: ServiceName::new("bench", format!("service-{index}")),
        family: AddressFamily::Ipv4,
        ports: vec![EndpointPortModel {
            name: "http".into(),
            protocol: Protocol::Tcp,
            port: 8080,
        }],
        endpoints: (0..ENDPOINTS)
            .map(|endpoint| EndpointModel {
                // The first endpoint changes with the generation.
                address: IpAddr::V4(Ipv4Addr::from(
                    0x0a00_0000
                        + index * 16
                        + endpoint
                        + if endpoint == 0 {
                            generation * 0x0100_0000
                        } else {
                            0
                        },
                )),
                ready: true,
                serving: true,
                terminating: false,
                node_name: Some(format!("node-{}", endpoint % 50)),
                hints: Default::default(),
            })
            .collect(),
        last_change_trigger_time: None,
    }
}

fn open_gate() -> GateOpen {
    let now = Instant::now();
    let mut gate = Gate::new(now, Duration::from_secs(1));
    for input in GateInput::ALL {
        gate.receive(input, now);
    }
    gate.open()
        .unwrap_or_else(|| unreachable!("every input was received"))
}

fn milliseconds(duration: Duration) -> String {
    format!("{:.3}", duration.as_secs_f64() * 1000.0)
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

struct Row {
    scenario: String,
    compute: Duration,
    plan: Duration,
    apply: Duration,
    operations: usize,
}

/// Timings of one sync split into its parts: desired state, layout + plan, apply.
fn timed_sync(
    services: &[ServiceModel],
    slices: &[EndpointSliceModel],
    node: &NodeView,
    tracked: &mut MapState,
    maps: &mut impl ServiceMaps,
) -> (Duration, Duration, Duration, usize) {
    let started = Instant::now();
    let desired: DesiredServices = desired_services(services, slices, node);
    let computed = Instant::now();
    let entries = lay_out(&desired, tracked);
    let change = plan(tracked, &entries);
    let planned = Instant::now();
    let (report, failed) = apply(&change, maps, tracked);
    if !failed.is_empty() {
        eprintln!("apply failed: {failed:?}");
        std::process::exit(1);
    }
    let applied = Instant::now();
    (
        computed - started,
        planned - computed,
        applied - planned,
        report.operation_count(),
    )
}

fn run<M: ServiceMaps>(label: &str, mut fresh_maps: impl FnMut() -> M, rows: &mut Vec<Row>) {
    let node = NodeView {
        name: "node-0".into(),
        zone: None,
        addresses: vec![IpAddr::V4(Ipv4Addr::new(192, 168, 1, 10))],
    };
    let services: Vec<ServiceModel> = (0..SERVICES).map(service).collect();
    let mut slices: Vec<EndpointSliceModel> = (0..SERVICES).map(|index| slice(index, 0)).collect();

    // 1. Everything into empty maps (few repetitions: each needs fresh maps).
    let mut full = Vec::new();
    let mut maps = fresh_maps();
    let mut tracked = MapState::default();
    for repetition in 0..3 {
        if repetition > 0 {
            drop(maps);
            maps = fresh_maps();
            tracked = MapState::default();
        }
        full.push(timed_sync(
            &services,
            &slices,
            &node,
            &mut tracked,
            &mut maps,
        ));
    }
    full.sort_by_key(|sample| sample.0 + sample.1 + sample.2);
    let (compute, plan_time, apply_time, operations) = full[full.len() / 2];
    rows.push(Row {
        scenario: format!("{label}: {SERVICES} Services x {ENDPOINTS} endpoints into empty maps"),
        compute,
        plan: plan_time,
        apply: apply_time,
        operations,
    });

    // 2. One Service changes one endpoint, 10,000 present.
    let (mut computes, mut plans, mut applies) = (Vec::new(), Vec::new(), Vec::new());
    let mut operations = 0;
    for repetition in 0..REPETITIONS {
        let index = (repetition as u32 * 37) % SERVICES;
        slices[index as usize] = slice(index, 1 + repetition as u32 % 2);
        let (compute, plan_time, apply_time, count) =
            timed_sync(&services, &slices, &node, &mut tracked, &mut maps);
        computes.push(compute);
        plans.push(plan_time);
        applies.push(apply_time);
        operations = count;
    }
    rows.push(Row {
        scenario: format!(
            "{label}: single-Service update, {SERVICES} present (median of {REPETITIONS})"
        ),
        compute: median(computes),
        plan: median(plans),
        apply: median(applies),
        operations,
    });

    // 2b. The same through a partial sync (only the changed Service is planned).
    let mut syncer = match Syncer::restore(&maps) {
        Ok(syncer) => syncer,
        Err(error) => {
            eprintln!("restore failed: {error}");
            std::process::exit(1);
        }
    };
    let started = Instant::now();
    let shares = services_desired(&services, &slices, &node);
    let indexed = syncer.sync_services(open_gate(), shares, &mut maps);
    let index_time = started.elapsed();
    rows.push(Row {
        scenario: format!("{label}: full sync that builds the partial-sync index, no change"),
        compute: index_time,
        plan: Duration::ZERO,
        apply: Duration::ZERO,
        operations: indexed
            .map(|report| report.operation_count())
            .unwrap_or(usize::MAX),
    });
    let (mut computes, mut applies) = (Vec::new(), Vec::new());
    for repetition in 0..REPETITIONS {
        let index = (repetition as u32 * 53 + 11) % SERVICES;
        slices[index as usize] = slice(index, 1 + repetition as u32 % 2);
        let started = Instant::now();
        let share = service_desired(&services[index as usize], &[&slices[index as usize]], &node);
        let computed = Instant::now();
        let Some(partial) = syncer.partial() else {
            eprintln!("the partial sync asked for a full one");
            std::process::exit(1);
        };
        match partial.sync_changes(
            open_gate(),
            vec![(services[index as usize].name.clone(), Some(share))],
            &mut maps,
        ) {
            Ok(report) => operations = report.operation_count(),
            Err(error) => {
                eprintln!("partial sync failed: {error}");
                std::process::exit(1);
            }
        }
        computes.push(computed - started);
        applies.push(computed.elapsed());
    }
    rows.push(Row {
        scenario: format!("{label}: single-Service update, partial sync (median of {REPETITIONS})"),
        compute: median(computes),
        plan: Duration::ZERO,
        apply: median(applies),
        operations,
    });

    // 3. Restore (a restarted agent reads the maps), then its first sync.
    let started = Instant::now();
    let mut syncer = match Syncer::restore(&maps) {
        Ok(syncer) => syncer,
        Err(error) => {
            eprintln!("restore failed: {error}");
            std::process::exit(1);
        }
    };
    let restored = started.elapsed();
    let desired = desired_services(&services, &slices, &node);
    let started = Instant::now();
    let report = syncer.sync(open_gate(), &desired, &mut maps);
    let first_sync = started.elapsed();
    rows.push(Row {
        scenario: format!(
            "{label}: restart (restore {} entries, then first sync)",
            syncer.current().frontends.len() + syncer.current().backend_slots.len()
        ),
        compute: restored,
        plan: Duration::ZERO,
        apply: first_sync,
        operations: report
            .map(|report| report.operation_count())
            .unwrap_or(usize::MAX),
    });
}

#[cfg(target_os = "linux")]
fn real_maps(rows: &mut Vec<Row>) {
    use switchyard_agent::loader::{detach_everything, Datapath, LoaderSettings};
    let pin_directory = std::env::var_os("SWITCHYARD_BENCH_PIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(format!(
                "/sys/fs/bpf/switchyard-bench-{}",
                std::process::id()
            ))
        });
    let settings = LoaderSettings {
        pin_directory: pin_directory.clone(),
        cgroup_path: None,
        ..LoaderSettings::default()
    };
    let datapath = match Datapath::load(settings) {
        Ok(datapath) => datapath,
        Err(error) => {
            println!("\n(real BPF maps skipped: {error})");
            let _ = detach_everything(&pin_directory);
            return;
        }
    };
    let fresh = || {
        let maps = match datapath.service_maps() {
            Ok(maps) => maps,
            Err(error) => {
                eprintln!("cannot open the maps: {error}");
                std::process::exit(1);
            }
        };
        // Empty them: a fresh run starts from empty maps.
        let mut maps = maps;
        let state = MapState::restore(&maps).unwrap_or_default();
        let mut tracked = state.clone();
        let _ = apply(&plan(&state, &MapState::default()), &mut maps, &mut tracked);
        maps
    };
    run("real BPF maps", fresh, rows);
    drop(datapath);
    if let Err(error) = detach_everything(&pin_directory) {
        eprintln!("cleanup of {} failed: {error}", pin_directory.display());
    }
}

/// Standalone mode's share: reading 10,000 Services and their slices from YAML.
fn manifests(rows: &mut Vec<Row>) {
    use std::fmt::Write as _;
    let mut text = String::new();
    for index in 0..SERVICES {
        let _ = write!(
            text,
            "apiVersion: v1\nkind: Service\nmetadata: {{name: service-{index}, namespace: bench}}\n\
             spec: {{clusterIP: {}, ports: [{{name: http, port: 80, targetPort: 8080}}]}}\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{name: service-{index}-slice, namespace: bench, labels: {{kubernetes.io/service-name: service-{index}}}}}\n\
             addressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints:\n",
            Ipv4Addr::from(0x0a60_0000 + index)
        );
        for endpoint in 0..ENDPOINTS {
            let _ = writeln!(
                text,
                "- {{addresses: [{}], nodeName: node-{}}}",
                Ipv4Addr::from(0x0a00_0000 + index * 16 + endpoint),
                endpoint % 50
            );
        }
        text.push_str("---\n");
    }
    let started = Instant::now();
    let parsed = switchyard_agent::standalone::manifests::parse(
        &[(PathBuf::from("bench.yaml"), text)],
        "node-0",
    );
    let elapsed = started.elapsed();
    let services = parsed
        .map(|manifests| manifests.services.len())
        .unwrap_or(0);
    rows.push(Row {
        scenario: format!("YAML: parse {services} Services and their EndpointSlices (standalone)"),
        compute: elapsed,
        plan: Duration::ZERO,
        apply: Duration::ZERO,
        operations: 0,
    });
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is accepted.
    let mut rows = Vec::new();
    manifests(&mut rows);
    run("fake maps", FakeServiceMaps::default, &mut rows);
    real_maps(&mut rows);
    println!();
    println!(
        "| {:<78} | {:>12} | {:>12} | {:>12} | {:>12} | {:>10} |",
        "scenario", "desired ms", "plan ms", "apply ms", "total ms", "map ops"
    );
    println!(
        "|{:-<80}|{:->14}|{:->14}|{:->14}|{:->14}|{:->12}|",
        "", "", "", "", "", ""
    );
    for row in rows {
        println!(
            "| {:<78} | {:>12} | {:>12} | {:>12} | {:>12} | {:>10} |",
            row.scenario,
            milliseconds(row.compute),
            milliseconds(row.plan),
            milliseconds(row.apply),
            milliseconds(row.compute + row.plan + row.apply),
            row.operations
        );
    }
    println!();
    println!(
        "Targets (issue 3): 10k x 10 programmed in under 1 s; a single-Service update under 5 ms."
    );
    println!("Partial-sync rows: 'desired ms' computes the one Service's share; 'apply ms' plans and applies it.");
    println!("Restart rows: 'desired ms' is the restore (reading the maps); 'apply ms' the whole first sync (0 map ops expected).");
}
