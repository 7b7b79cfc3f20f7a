//! The programs' own CPU, from the kernel's BPF run-time statistics (issue 29):
//! for each Switchyard program, how often it ran and how long, per connection
//! (or per UDP request) made in a measured window, and the instructions the
//! verifier checked (`verified_insns`).
//!
//! Why these figures: they count only the programs' own work, so they move far
//! less with this VM's speed than the rates do (the rates of one configuration
//! differ by 10-20% a minute apart); they are the regression guard, the rates
//! confirm them.
//!
//! The kernel counts run time only while statistics are on. They are turned on
//! with `BPF_ENABLE_STATS` rather than by writing `kernel.bpf_stats_enabled`:
//! the kernel keeps them on while the returned descriptor is open and restores
//! the earlier state when it closes, however the bench ends (a crash cannot
//! leave the machine-wide switch on). Only the windows measured here run with
//! them on: timing each run costs the programs two clock reads, which the
//! data plane's rates must not pay.
//!
//! Programs are found where the agent pins them (`<pin dir>/v<N>/programs/`),
//! so another agent loaded on the same machine (another helper's test) is never
//! counted. Readings are `bpf_prog_info` (`BPF_OBJ_GET_INFO_BY_FD`): bpftool
//! 7.1 (Debian bookworm) prints neither `verified_insns` nor zero counts.

use std::ffi::CString;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::Path;

use crate::error::{Error, Result};
use crate::report::{number, Spread, Summary, Table};

pub const NAME: &str = "program-cpu";
/// `BPF_PROG_TYPE_SCHED_CLS`: the TC programs.
const PROGRAM_TYPE_SCHED_CLS: u32 = 3;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_ENABLE_STATS: libc::c_long = 32;
const BPF_STATS_RUN_TIME: u32 = 0;

/// One program's counters at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct ProgramReading {
    pub name: String,
    /// A TC program (the packet path); the others are socket hooks.
    pub tc: bool,
    pub run_time_ns: u64,
    pub run_count: u64,
    pub verified_instructions: u32,
}

/// What one program cost per operation (connection, request) over a window.
#[derive(Clone, Debug, PartialEq)]
pub struct ProgramCost {
    pub program: String,
    pub tc: bool,
    pub runs: u64,
    pub run_time_ns: u64,
    pub runs_per_operation: f64,
    /// `None` when it did not run.
    pub ns_per_run: Option<f64>,
    pub ns_per_operation: f64,
    pub verified_instructions: u32,
}

/// The programs' cost per operation between two readings: each program's runs
/// and run time in the window divided by the `operations` made in it (`None`
/// when none was: nothing to divide by). A program in only one reading, or
/// whose counters went down (loaded again in between), is left out: its window
/// is not this one.
pub fn costs(
    before: &[ProgramReading],
    after: &[ProgramReading],
    operations: u64,
) -> Option<Vec<ProgramCost>> {
    if operations == 0 {
        return None;
    }
    let operations = operations as f64;
    let costs = after
        .iter()
        .filter_map(|now| {
            let then = before.iter().find(|then| then.name == now.name)?;
            let runs = now.run_count.checked_sub(then.run_count)?;
            let run_time_ns = now.run_time_ns.checked_sub(then.run_time_ns)?;
            Some(ProgramCost {
                program: now.name.clone(),
                tc: now.tc,
                runs,
                run_time_ns,
                runs_per_operation: runs as f64 / operations,
                ns_per_run: (runs > 0).then(|| run_time_ns as f64 / runs as f64),
                ns_per_operation: run_time_ns as f64 / operations,
                verified_instructions: now.verified_instructions,
            })
        })
        .collect();
    Some(costs)
}

/// Every program's nanoseconds per operation, added up.
pub fn total_ns_per_operation(costs: &[ProgramCost]) -> f64 {
    costs.iter().map(|cost| cost.ns_per_operation).sum()
}

/// The TC programs' nanoseconds per run over all their runs (each run is one
/// packet at one hook): `None` when they did not run.
pub fn tc_ns_per_packet(costs: &[ProgramCost]) -> Option<f64> {
    let (runs, time) = costs
        .iter()
        .filter(|cost| cost.tc)
        .fold((0u64, 0u64), |(runs, time), cost| {
            (runs + cost.runs, time + cost.run_time_ns)
        });
    (runs > 0).then(|| time as f64 / runs as f64)
}

/// Runs `run` (which returns what it made and how many operations) with the
/// statistics on, and returns that with the programs' cost per operation.
pub fn during<T>(
    pin_directory: &Path,
    run: impl FnOnce() -> Result<(T, u64)>,
) -> Result<(T, Option<Vec<ProgramCost>>)> {
    let statistics = RunTimeStatistics::enable()?;
    let before = read_programs(pin_directory)?;
    let (made, operations) = run()?;
    let after = read_programs(pin_directory)?;
    drop(statistics);
    Ok((made, costs(&before, &after, operations)))
}

/// Every round's program costs of one system at one scale.
#[derive(Clone, Debug, Default)]
pub struct Samples {
    /// Per round: each program's cost per new connection.
    pub connection: Vec<Vec<ProgramCost>>,
    /// Per round: each program's cost per UDP request.
    pub udp: Vec<Vec<ProgramCost>>,
    /// Why a round's statistics could not be read.
    pub error: Option<String>,
}

/// What a program's cost per operation shows.
type Field = fn(&ProgramCost) -> Option<f64>;

impl Samples {
    /// The programs that ran in any round, by name.
    pub fn programs(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .connection
            .iter()
            .chain(&self.udp)
            .flatten()
            .filter(|cost| cost.runs > 0)
            .map(|cost| cost.program.clone())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// `field` of `program` in each round of `rounds` where it was read.
    pub fn per_round(rounds: &[Vec<ProgramCost>], program: &str, field: Field) -> Vec<f64> {
        rounds
            .iter()
            .filter_map(|round| round.iter().find(|cost| cost.program == program))
            .filter_map(field)
            .collect()
    }

    /// All programs' nanoseconds per operation in each round of `rounds`.
    pub fn totals(rounds: &[Vec<ProgramCost>]) -> Vec<f64> {
        rounds
            .iter()
            .map(|round| total_ns_per_operation(round))
            .collect()
    }

    fn verified_instructions(&self, program: &str) -> Option<u32> {
        self.connection
            .iter()
            .chain(&self.udp)
            .flatten()
            .find(|cost| cost.program == program)
            .map(|cost| cost.verified_instructions)
    }
}

const RUNS_PER_OPERATION: Field = |cost| Some(cost.runs_per_operation);
const NS_PER_RUN: Field = |cost| cost.ns_per_run;
const NS_PER_OPERATION: Field = |cost| Some(cost.ns_per_operation);

/// Writes one system's program costs at `scale` to the summary: all programs'
/// nanoseconds per connection and per UDP request, and per program its runs,
/// nanoseconds per run and per operation, and verified instructions.
pub fn record(system: &str, scale: u64, samples: &Samples, summary: &mut Summary) {
    if let Some(error) = &samples.error {
        eprintln!("bench: {system} program CPU at {scale} Services: {error}");
        summary.record(NAME, system, scale, "failed-to-measure", 1.0, "rounds");
        return;
    }
    if samples.connection.is_empty() {
        return;
    }
    summary.record(
        NAME,
        system,
        scale,
        "rounds",
        samples.connection.len() as f64,
        "rounds",
    );
    let totals = [
        ("ns-per-connection", &samples.connection),
        ("ns-per-udp-request", &samples.udp),
    ];
    for (metric, rounds) in totals {
        summary.record_runs(NAME, system, scale, metric, &Samples::totals(rounds), "ns");
    }
    for program in samples.programs() {
        let figures = [
            (
                "runs-per-connection",
                &samples.connection,
                RUNS_PER_OPERATION,
                "runs",
            ),
            ("ns-per-run", &samples.connection, NS_PER_RUN, "ns"),
            (
                "ns-per-connection",
                &samples.connection,
                NS_PER_OPERATION,
                "ns",
            ),
            (
                "runs-per-udp-request",
                &samples.udp,
                RUNS_PER_OPERATION,
                "runs",
            ),
            ("ns-per-udp-request", &samples.udp, NS_PER_OPERATION, "ns"),
        ];
        for (metric, rounds, field, unit) in figures {
            summary.record_runs(
                NAME,
                system,
                scale,
                &format!("{program}-{metric}"),
                &Samples::per_round(rounds, &program, field),
                unit,
            );
        }
        if let Some(instructions) = samples.verified_instructions(&program) {
            summary.record(
                NAME,
                system,
                scale,
                &format!("{program}-verified-instructions"),
                f64::from(instructions),
                "instructions",
            );
        }
    }
}

/// The programs' CPU per connection and per UDP request at one scale, for each
/// system (label, samples) measured.
pub fn table(services: u32, systems: &[(&str, &Samples)]) -> Table {
    let mut table = Table::new(
        &format!(
            "Program CPU, {} Services: the kernel's BPF run-time statistics per program \
             (median of rounds, (min-max))",
            number(f64::from(services), 0)
        ),
        &[
            "system",
            "program",
            "verified instructions",
            "runs per connection",
            "ns per run",
            "ns per connection",
            "runs per UDP request",
            "ns per UDP request",
        ],
    );
    let cell = |samples: &[f64], decimals: usize| {
        Spread::of(samples)
            .map(|spread| spread.display(decimals))
            .unwrap_or_else(|| "-".into())
    };
    for (system, samples) in systems {
        if let Some(error) = &samples.error {
            let mut cells = vec![system.to_string(), format!("FAILED: {error}")];
            cells.extend(std::iter::repeat_n(String::new(), 6));
            table.row(cells);
            continue;
        }
        for program in samples.programs() {
            let connection = |field| Samples::per_round(&samples.connection, &program, field);
            let udp = |field| Samples::per_round(&samples.udp, &program, field);
            table.row(vec![
                system.to_string(),
                program.clone(),
                samples
                    .verified_instructions(&program)
                    .map(|count| number(f64::from(count), 0))
                    .unwrap_or_else(|| "-".into()),
                cell(&connection(RUNS_PER_OPERATION), 2),
                cell(&connection(NS_PER_RUN), 0),
                cell(&connection(NS_PER_OPERATION), 0),
                cell(&udp(RUNS_PER_OPERATION), 2),
                cell(&udp(NS_PER_OPERATION), 0),
            ]);
        }
        table.row(vec![
            system.to_string(),
            "all programs".into(),
            String::new(),
            String::new(),
            String::new(),
            cell(&Samples::totals(&samples.connection), 0),
            String::new(),
            cell(&Samples::totals(&samples.udp), 0),
        ]);
    }
    table.note(
        "Each round's switchyard configuration runs one extra connect run and one extra UDP run \
         with the kernel's run-time statistics on (BPF_ENABLE_STATS; off again after them, and \
         off during every other run, whose rates they would slow): each program's runs and run \
         time in that window over the connections (or requests) made in it. A TC program runs \
         once per packet at each hook; a socket hook once per connect (sy_connect4) or per \
         datagram sent and received (sy_sendmsg4, sy_recvmsg4). Run time includes the \
         statistics' own two clock reads per run. Verified instructions: the verifier's count \
         for the whole program (bpf_prog_info.verified_insns), not per packet; this VM has no \
         hardware counters for `bpftool prog profile`.",
    );
    table
}

/// The kernel's run-time statistics, on while this lives.
pub struct RunTimeStatistics {
    _descriptor: OwnedFd,
}

impl RunTimeStatistics {
    /// Turns them on (`BPF_ENABLE_STATS`); they go back to what they were when
    /// this is dropped.
    pub fn enable() -> Result<Self> {
        #[repr(C)]
        struct EnableStats {
            kind: u32,
        }
        let attribute = EnableStats {
            kind: BPF_STATS_RUN_TIME,
        };
        let descriptor = bpf(BPF_ENABLE_STATS, &attribute).map_err(|error| {
            Error::System(format!(
                "failed to turn on the kernel's BPF run-time statistics: {error}"
            ))
        })?;
        // SAFETY: the kernel returned a new descriptor that nothing else owns.
        Ok(Self {
            _descriptor: unsafe { OwnedFd::from_raw_fd(descriptor) },
        })
    }
}

/// Reads every program pinned under `pin_directory/v*/programs/`.
pub fn read_programs(pin_directory: &Path) -> Result<Vec<ProgramReading>> {
    let versions = std::fs::read_dir(pin_directory).map_err(|error| {
        Error::System(format!(
            "failed to list {}: {error}",
            pin_directory.display()
        ))
    })?;
    let mut readings = Vec::new();
    for version in versions.flatten() {
        let programs = version.path().join("programs");
        let Ok(entries) = std::fs::read_dir(&programs) else {
            continue;
        };
        for entry in entries.flatten() {
            readings.push(read_program(&entry.path())?);
        }
    }
    if readings.is_empty() {
        return Err(Error::System(format!(
            "failed to find any program pinned under {}/v*/programs",
            pin_directory.display()
        )));
    }
    readings.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(readings)
}

/// `struct bpf_prog_info` of the kernel's UAPI (linux/bpf.h), up to the fields
/// read here; the kernel fills what it has and zeroes the rest.
#[repr(C)]
#[derive(Default)]
struct ProgramInfo {
    kind: u32,
    id: u32,
    tag: [u8; 8],
    jited_prog_len: u32,
    xlated_prog_len: u32,
    jited_prog_insns: u64,
    xlated_prog_insns: u64,
    load_time: u64,
    created_by_uid: u32,
    nr_map_ids: u32,
    map_ids: u64,
    name: [u8; 16],
    ifindex: u32,
    gpl_compatible: u32,
    netns_dev: u64,
    netns_ino: u64,
    nr_jited_ksyms: u32,
    nr_jited_func_lens: u32,
    jited_ksyms: u64,
    jited_func_lens: u64,
    btf_id: u32,
    func_info_rec_size: u32,
    func_info: u64,
    nr_func_info: u32,
    nr_line_info: u32,
    line_info: u64,
    jited_line_info: u64,
    nr_jited_line_info: u32,
    line_info_rec_size: u32,
    jited_line_info_rec_size: u32,
    nr_prog_tags: u32,
    prog_tags: u64,
    run_time_ns: u64,
    run_cnt: u64,
    recursion_misses: u64,
    verified_insns: u32,
    attach_btf_obj_id: u32,
    attach_btf_id: u32,
    /// Where Rust would put padding (left as the stack had it): a field, so it
    /// is zero. The kernel refuses (E2BIG) an info longer than its own
    /// structure unless the extra bytes are zero.
    tail: u32,
}

fn read_program(path: &Path) -> Result<ProgramReading> {
    use std::os::unix::ffi::OsStrExt as _;
    let failed =
        |error: String| Error::System(format!("failed to read {}: {error}", path.display()));
    let path_text = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| failed("a NUL in the path".into()))?;
    #[repr(C)]
    struct ObjectGet {
        pathname: u64,
        bpf_fd: u32,
        file_flags: u32,
    }
    let get = ObjectGet {
        pathname: path_text.as_ptr() as u64,
        bpf_fd: 0,
        file_flags: 0,
    };
    let descriptor =
        bpf(BPF_OBJ_GET, &get).map_err(|error| failed(format!("BPF_OBJ_GET: {error}")))?;
    // SAFETY: a new descriptor the kernel just returned, owned here alone.
    let descriptor = unsafe { OwnedFd::from_raw_fd(descriptor) };
    let mut info = ProgramInfo::default();
    #[repr(C)]
    struct InfoByFd {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    let request = InfoByFd {
        bpf_fd: descriptor.as_raw_fd() as u32,
        info_len: std::mem::size_of::<ProgramInfo>() as u32,
        info: &mut info as *mut ProgramInfo as u64,
    };
    bpf(BPF_OBJ_GET_INFO_BY_FD, &request)
        .map_err(|error| failed(format!("BPF_OBJ_GET_INFO_BY_FD: {error}")))?;
    let length = info
        .name
        .iter()
        .position(|byte| *byte == 0)
        .unwrap_or(info.name.len());
    Ok(ProgramReading {
        name: String::from_utf8_lossy(&info.name[..length]).into_owned(),
        tc: info.kind == PROGRAM_TYPE_SCHED_CLS,
        run_time_ns: info.run_time_ns,
        run_count: info.run_cnt,
        verified_instructions: info.verified_insns,
    })
}

/// The `bpf(2)` system call with `attribute` (a `union bpf_attr` member).
fn bpf<T>(command: libc::c_long, attribute: &T) -> std::io::Result<i32> {
    // SAFETY: `attribute` is a live `repr(C)` value of the size given, laid out
    // as the command's member of `union bpf_attr`; pointers inside it point at
    // live buffers of the sizes they state.
    let result = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            attribute as *const T,
            std::mem::size_of::<T>() as libc::c_long,
        )
    };
    if result < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(result as i32)
    }
}

#[cfg(test)]
mod tests;
