//! `switchyard-bench`: Switchyard side by side with kube-proxy 1.20, and at
//! scale. `make bench` runs `switchyard-bench run`, which re-executes itself in
//! private network, mount and PID namespaces (so every process, interface, rule,
//! pin and mount it makes goes away with it, however it ends), prints tables and
//! writes `target/bench/summary.json`. See bench/README.md.

mod apiserver;
mod cold_start;
mod control;
mod dataplane;
mod error;
mod flatness;
mod goals;
mod load;
mod operator_scale;
mod parity_cost;
mod program_stats;
mod programming;
mod report;
mod restart;
mod systems;
mod topology;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};

use crate::error::{Error, Result};
use crate::report::{Summary, Table};
use crate::systems::{Binaries, System};

const INSIDE: &str = "SWITCHYARD_BENCH_INSIDE";
const WORK: &str = "SWITCHYARD_BENCH_WORK";

#[derive(Debug, Parser)]
#[command(
    name = "switchyard-bench",
    about = "Switchyard side by side with kube-proxy, and at scale."
)]
struct Cli {
    #[command(subcommand)]
    command: CommandLine,
}

#[derive(Debug, Subcommand)]
enum CommandLine {
    /// Run the benchmarks (as root; everything happens in private namespaces).
    Run(RunArguments),
    /// Load generator (run by the bench inside the client pod).
    Load {
        #[arg(long)]
        options: PathBuf,
    },
    /// Backend server (run by the bench inside each backend pod).
    Serve {
        #[arg(long)]
        name: String,
        #[arg(long, default_value_t = topology::BACKEND_TCP_PORT)]
        tcp_port: u16,
        #[arg(long, default_value_t = topology::BACKEND_UDP_PORT)]
        udp_port: u16,
    },
    /// A simulated agent for the operator scale test (run by the bench).
    SimulatedAgents {
        #[arg(long)]
        seed: u64,
    },
}

#[derive(Debug, Clone, clap::Args)]
struct RunArguments {
    /// Smallest sizes, a few seconds each: checks that the harness works.
    #[arg(long)]
    quick: bool,
    /// Where the flat list of measurements goes.
    #[arg(long, default_value = "target/bench/summary.json")]
    output: PathBuf,
    /// `switchyard-agent` binary.
    #[arg(long)]
    agent: PathBuf,
    /// `switchyard-operator` binary.
    #[arg(long)]
    operator: PathBuf,
    /// Directory with kube-apiserver, etcd and kube-proxy 1.20.2.
    #[arg(long)]
    kubernetes_bin: PathBuf,
    /// Which parts to run (comma-separated): dataplane, control, operator.
    #[arg(long, default_value = "dataplane,control,operator")]
    parts: String,
    /// Override the data plane scales (comma-separated Service counts).
    #[arg(long)]
    scales: Option<String>,
    /// Override the number of programming-latency changes.
    #[arg(long)]
    changes: Option<usize>,
    /// Only these systems in the data plane (comma-separated labels, e.g. `switchyard,direct`).
    #[arg(long)]
    systems: Option<String>,
    /// Override the operator scale node counts (comma-separated).
    #[arg(long)]
    nodes: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        CommandLine::Run(arguments) => {
            if std::env::var_os(INSIDE).is_some() {
                inside(arguments)
            } else {
                isolate(&arguments)
            }
        }
        CommandLine::Load { options } => run_load_command(&options),
        CommandLine::Serve {
            name,
            tcp_port,
            udp_port,
        } => runtime(1).and_then(|runtime| runtime.block_on(load::serve(name, tcp_port, udp_port))),
        CommandLine::SimulatedAgents { seed } => {
            runtime(2).and_then(|runtime| runtime.block_on(operator_scale::simulated_agents(seed)))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("switchyard-bench: {error}");
            ExitCode::FAILURE
        }
    }
}

fn runtime(workers: usize) -> Result<tokio::runtime::Runtime> {
    let mut builder = if workers <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(workers);
        builder
    };
    builder
        .enable_all()
        .build()
        .map_err(|error| Error::System(format!("failed to start the async runtime: {error}")))
}

fn run_load_command(options: &Path) -> Result<()> {
    let text = std::fs::read_to_string(options)
        .map_err(|error| Error::Load(format!("failed to read {}: {error}", options.display())))?;
    let options: load::LoadOptions = serde_json::from_str(&text)
        .map_err(|error| Error::Load(format!("failed to parse {}: {error}", options.display())))?;
    let report = runtime(2)?.block_on(load::run(options))?;
    let json = serde_json::to_string(&report)
        .map_err(|error| Error::Load(format!("failed to encode the report: {error}")))?;
    println!("{json}");
    Ok(())
}

/// Re-executes `run` under `unshare` and removes what the child left on the host
/// file system (its work directory, a mount point).
fn isolate(arguments: &RunArguments) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Error::Isolate(
            "the bench needs root (network namespaces, BPF, iptables)".into(),
        ));
    }
    for (what, path) in [
        ("switchyard-agent", arguments.agent.clone()),
        ("switchyard-operator", arguments.operator.clone()),
        (
            "kube-apiserver",
            arguments.kubernetes_bin.join("kube-apiserver"),
        ),
        ("etcd", arguments.kubernetes_bin.join("etcd")),
        ("kube-proxy", arguments.kubernetes_bin.join("kube-proxy")),
    ] {
        if !path.exists() {
            return Err(Error::Isolate(format!(
                "failed to find {what} at {}",
                path.display()
            )));
        }
    }
    let work = std::env::temp_dir().join(format!("switchyard-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work)
        .map_err(|error| Error::Isolate(format!("failed to create {}: {error}", work.display())))?;
    let output = absolute(&arguments.output);
    if let Some(parent) = output.parent() {
        std::fs::create_dir_all(parent).map_err(|error| Error::Output {
            path: parent.display().to_string(),
            detail: error.to_string(),
        })?;
    }
    let _ = std::fs::remove_file(&output);
    let executable = std::env::current_exe().map_err(|error| {
        Error::Isolate(format!("failed to find the bench's own binary: {error}"))
    })?;
    // A cgroup of the bench's own for the agent's socket hooks, so they can
    // act on the client pod and never on another process of the machine.
    let cgroup = bench_cgroup(&work);
    let mut command = Command::new("unshare");
    if let Some(cgroup) = &cgroup {
        command.env(systems::BENCH_CGROUP, cgroup);
    }
    let status = command
        .args([
            "--net",
            "--mount",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            "--propagation",
            "private",
            "--",
        ])
        .arg(&executable)
        .args(std::env::args_os().skip(1))
        .env(INSIDE, "1")
        .env(WORK, &work)
        .env("SWITCHYARD_BENCH_OUTPUT", &output)
        .status()
        .map_err(|error| Error::Isolate(format!("failed to run unshare: {error}")))?;
    let _ = std::fs::remove_dir_all(&work);
    if let Some(cgroup) = &cgroup {
        // Empty once the isolated bench and its children have exited.
        if let Err(error) = std::fs::remove_dir(cgroup) {
            eprintln!("bench: failed to remove {}: {error}", cgroup.display());
        }
    }
    if !status.success() {
        return Err(Error::Isolate(format!(
            "the isolated bench failed: {status}"
        )));
    }
    if !output.exists() {
        return Err(Error::Isolate(format!(
            "the isolated bench wrote no {}",
            output.display()
        )));
    }
    Ok(())
}

/// Creates a child of the cgroup v2 root for the bench, named after its work
/// directory; `None` (the agent then gets no socket hooks) without cgroup v2.
fn bench_cgroup(work: &Path) -> Option<PathBuf> {
    // Where cgroup v2 is mounted: `/sys/fs/cgroup`, or `/sys/fs/cgroup/unified`
    // on hybrid hierarchies.
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let Some(root) = mounts.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(fields[1]))
    }) else {
        eprintln!("bench: no cgroup v2 mounted: the agent runs without socket hooks");
        return None;
    };
    let cgroup = root.join(work.file_name()?);
    match std::fs::create_dir_all(&cgroup) {
        Ok(()) => Some(cgroup),
        Err(error) => {
            eprintln!(
                "bench: failed to create {}: {error}; the agent runs without socket hooks",
                cgroup.display()
            );
            None
        }
    }
}

/// Moves the isolated bench (and so every process it starts) into its cgroup,
/// and mounts cgroup v2 under the work directory, where the agent (behind `ip
/// netns exec`, which hides `/sys/fs/cgroup`) finds it.
fn join_bench_cgroup(work: &Path) -> Result<()> {
    let Some(cgroup) = std::env::var_os(systems::BENCH_CGROUP).map(PathBuf::from) else {
        return Ok(());
    };
    let procs = cgroup.join("cgroup.procs");
    std::fs::write(&procs, "0")
        .map_err(|error| Error::Isolate(format!("failed to join {}: {error}", procs.display())))?;
    let mount_point = work.join("cgroup2");
    topology::sh(&format!(
        "mkdir -p {mount} && mount -t cgroup2 cgroup2 {mount}",
        mount = mount_point.display()
    ))?;
    let name = cgroup
        .file_name()
        .ok_or_else(|| Error::Isolate(format!("{} names no cgroup", cgroup.display())))?;
    let _ = systems::AGENT_CGROUP.set(mount_point.join(name));
    Ok(())
}

fn absolute(path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|directory| directory.join(path))
            .unwrap_or_else(|_| path.to_path_buf())
    }
}

/// The sizes of one run.
#[derive(Clone, Debug)]
pub struct Plan {
    pub quick: bool,
    pub scales: Vec<u32>,
    pub systems: Vec<System>,
    pub dataplane: dataplane::DataplaneSettings,
    /// Latency flatness in rounds of its own (`flatness`): the fewest and the
    /// most Services of the data plane's scales (none when there is one scale);
    /// with `--quick`, 100 and 1,000 Services whatever the scales, so the rounds
    /// run end to end (the goal, at 100 and 30,000, is not judged then).
    pub flatness: Option<flatness::FlatnessSettings>,
    /// The cost of source ranges and fragment tracking (`parity_cost`), in
    /// rounds of its own at the control scale.
    pub parity_cost: parity_cost::ParityCostSettings,
    /// Services present during the control-plane measurements.
    pub control_scale: u32,
    pub changes: usize,
    pub nft_changes: usize,
    pub change_spacing: Duration,
    pub restart_rate: f64,
    pub restart_duration: Duration,
    /// Programming-latency runs per system (`programming`), each of `changes`.
    pub programming_runs: usize,
    /// Agent cold starts measured (`cold_start`): the goals use the worst.
    pub cold_start_runs: usize,
    /// Restarts measured per system (`restart`): the goal uses their median.
    pub restart_runs: usize,
    pub node_counts: Vec<u32>,
    /// Transitions measured per node count (`operator_scale`): the goals use
    /// the worst run and the median requests per node.
    pub operator_runs: usize,
}

impl Plan {
    fn new(arguments: &RunArguments) -> Self {
        let list = |text: &Option<String>, default: Vec<u32>| {
            text.as_ref()
                .map(|text| {
                    text.split(',')
                        .filter_map(|v| v.trim().parse().ok())
                        .collect()
                })
                .unwrap_or(default)
        };
        let quick = arguments.quick;
        let scales = list(
            &arguments.scales,
            if quick {
                vec![100]
            } else {
                vec![100, 1_000, 10_000, 30_000]
            },
        );
        let control_scale = if quick {
            100
        } else {
            10_000.min(scales.iter().copied().max().unwrap_or(100))
        };
        let flatness = if quick {
            // Two counts, so the rounds run end to end; the goal is not judged.
            Some(flatness::FlatnessSettings {
                fewest: 100,
                most: 1_000,
                run_duration: Duration::from_millis(300),
            })
        } else {
            match (scales.iter().min(), scales.iter().max()) {
                (Some(fewest), Some(most)) if fewest < most => Some(flatness::FlatnessSettings {
                    fewest: *fewest,
                    most: *most,
                    // Longer than the data plane's 2 s runs: 10,000 connections,
                    // so the p99 rests on 100 of them.
                    run_duration: Duration::from_secs(5),
                }),
                _ => None,
            }
        };
        Self {
            quick,
            flatness,
            scales,
            systems: [
                System::Direct,
                System::Switchyard,
                System::SwitchyardTc,
                System::KubeProxyLegacy,
                System::KubeProxyNft,
            ]
            .into_iter()
            .filter(|system| {
                arguments.systems.as_ref().is_none_or(|wanted| {
                    wanted
                        .split(',')
                        .any(|label| label.trim() == system.label())
                })
            })
            .collect(),
            dataplane: if quick {
                dataplane::DataplaneSettings {
                    rounds: 3,
                    run_duration: Duration::from_millis(300),
                    warm_up: Duration::from_millis(200),
                    concurrency: 16,
                    latency_rate: 2_000.0,
                    serve_timeout: Duration::from_secs(60),
                }
            } else {
                dataplane::DataplaneSettings {
                    // Runs of one configuration on this VM differ by 10-20% from
                    // one minute to the next: five rounds make the medians steadier.
                    rounds: 5,
                    run_duration: Duration::from_secs(2),
                    warm_up: Duration::from_secs(1),
                    concurrency: 16,
                    latency_rate: 2_000.0,
                    serve_timeout: Duration::from_secs(180),
                }
            },
            parity_cost: parity_cost::ParityCostSettings {
                services: control_scale,
                load_balancers: if quick { 10 } else { 50 },
                rounds: if quick { 2 } else { 5 },
                slices: if quick { 1 } else { 2 },
                slice_duration: if quick {
                    Duration::from_millis(300)
                } else {
                    Duration::from_secs(1)
                },
            },
            control_scale,
            changes: arguments.changes.unwrap_or(if quick { 3 } else { 200 }),
            nft_changes: if quick { 2 } else { 10 },
            change_spacing: Duration::from_millis(1500),
            restart_rate: 2_000.0,
            restart_duration: if quick {
                Duration::from_secs(3)
            } else {
                Duration::from_secs(12)
            },
            programming_runs: 3,
            cold_start_runs: 3,
            operator_runs: 3,
            restart_runs: if quick { 3 } else { 5 },
            node_counts: list(
                &arguments.nodes,
                if quick {
                    vec![20]
                } else {
                    vec![100, 1_000, 5_000]
                },
            ),
        }
    }
}

#[cfg(test)]
impl Plan {
    /// The plan `switchyard-bench run ARGUMENTS` makes (the binaries' paths
    /// are given: they do not change the plan).
    pub fn from_arguments(arguments: &[&str]) -> Self {
        let binaries = ["--agent", "a", "--operator", "o", "--kubernetes-bin", "k"];
        let command_line = ["switchyard-bench", "run"]
            .iter()
            .chain(&binaries)
            .chain(arguments);
        match Cli::parse_from(command_line).command {
            CommandLine::Run(arguments) => Plan::new(&arguments),
            other => panic!("parsed as another command: {other:?}"),
        }
    }
}

/// The isolated bench: the namespaces' basics, then each part.
fn inside(arguments: RunArguments) -> Result<()> {
    let work = PathBuf::from(
        std::env::var_os(WORK).ok_or_else(|| Error::Isolate("no work directory".into()))?,
    );
    let output = PathBuf::from(
        std::env::var_os("SWITCHYARD_BENCH_OUTPUT")
            .ok_or_else(|| Error::Isolate("no output path".into()))?,
    );
    topology::sh(&format!(
        "mount -t tmpfs -o mode=0700 switchyard-bench {work}
         mkdir -p {work}/bpffs /run/netns
         mount -t bpf bpf {work}/bpffs
         mount -t tmpfs tmpfs /run/netns
         ip link set lo up",
        work = work.display()
    ))?;
    join_bench_cgroup(&work)?;
    let binaries = Binaries {
        bench: std::env::current_exe().map_err(|error| {
            Error::Isolate(format!("failed to find the bench's own binary: {error}"))
        })?,
        agent: absolute(&arguments.agent),
        operator: absolute(&arguments.operator),
        kubernetes: absolute(&arguments.kubernetes_bin),
    };
    let plan = Plan::new(&arguments);
    let parts: Vec<&str> = arguments.parts.split(',').map(str::trim).collect();
    let started = Instant::now();
    let mut summary = Summary::default();
    let mut tables: Vec<Table> = Vec::new();
    let machine = machine_description();
    println!(
        "switchyard-bench {}: {} on {machine}",
        if plan.quick { "QUICK" } else { "full" },
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC")
    );
    let runtime = runtime(2)?;
    let result = runtime.block_on(async {
        if parts.contains(&"dataplane") || parts.contains(&"control") {
            control::data_and_control_plane(
                &plan,
                &parts,
                &binaries,
                &work,
                &mut summary,
                &mut tables,
            )
            .await?;
        }
        if parts.contains(&"operator") {
            operator_scale::run(&plan, &binaries, &work, &mut summary, &mut tables).await?;
        }
        Ok::<(), Error>(())
    });
    summary.record(
        "bench",
        "bench",
        0,
        "total-runtime",
        started.elapsed().as_secs_f64(),
        "s",
    );
    let json = summary.to_json().map_err(|error| Error::Output {
        path: output.display().to_string(),
        detail: error.to_string(),
    })?;
    std::fs::write(&output, json).map_err(|error| Error::Output {
        path: output.display().to_string(),
        detail: error.to_string(),
    })?;
    if parts.contains(&"dataplane") || parts.contains(&"operator") || parts.contains(&"control") {
        tables.push(goals::table(
            &summary,
            &plan.scales,
            plan.dataplane.latency_rate,
            &plan.node_counts,
        ));
    }
    if parts.contains(&"dataplane") {
        tables.push(goals::cost::table(&summary));
    }
    println!(
        "\n## Summary ({machine}, {})",
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC")
    );
    for table in &tables {
        print!("{}", table.render());
    }
    println!(
        "\n{} measurements in {}; total {:.0} s",
        summary.measurements.len(),
        output.display(),
        started.elapsed().as_secs_f64()
    );
    result
}

/// CPU model, cores, memory and kernel, for the tables' heading.
fn machine_description() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .next()
                .and_then(|line| line.split_whitespace().nth(1))
                .and_then(|kib| kib.parse::<f64>().ok())
        })
        .map(|kib| kib / 1024.0 / 1024.0)
        .unwrap_or(0.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    format!(
        "{cpu}, {cores} cores, {memory:.0} GiB, Linux {}, load average {}",
        kernel.trim(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    )
}
