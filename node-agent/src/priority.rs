//! The agent's CPU priority while it catches up after a restart.
//!
//! A process that finds a previous one's programs attached starts into a datapath
//! that already serves every Service from the pinned maps. Its catch-up (restoring
//! the maps' state, listing Services and EndpointSlices, the first full sync, which
//! writes nothing when nothing changed meanwhile) is not urgent, while the node's
//! workloads, whose connections that datapath carries, are: on a busy node the
//! catch-up would otherwise take CPU time from the very connections a restart must
//! not disturb. So it runs at the lowest priority (nice 19) until the first sync
//! (or `CATCH_UP_LIMIT`), then goes back to the priority the process started with.
//! A first start (nothing attached) keeps its priority: nothing serves until it
//! has synced. An exiting agent, whose programs keep serving, yields the same way.
//!
//! `CatchUpPriority` decides (pure); `set_nice_of_every_thread` does it. Linux
//! keeps a nice value per thread, and threads inherit their creator's, so both
//! lowering and restoring go through every thread of the process.

use std::time::{Duration, Instant};

/// The nice value of a catch-up.
pub const CATCH_UP_NICE: i32 = 19;

/// A catch-up that has not synced by then (a node whose workloads leave it almost
/// no CPU at nice 19) goes back to its normal priority anyway.
pub const CATCH_UP_LIMIT: Duration = Duration::from_secs(30);

/// `CAP_SYS_NICE`'s bit in the capability sets (linux/capability.h).
const CAPABILITY_SYS_NICE: u32 = 23;

/// Whether a process whose `/proc/self/status` is `status` may raise its threads'
/// priority back: it has `CAP_SYS_NICE` in its effective set. Without it a lowered
/// agent would stay lowered for good, so it does not lower at all.
pub fn may_restore_priority(status: &str) -> bool {
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << CAPABILITY_SYS_NICE) != 0)
}

/// `may_restore_priority` for this process.
pub fn this_process_may_restore_priority() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| may_restore_priority(&status))
}

/// What to do with the process's priority now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PriorityStep {
    Keep,
    /// Every thread to `CATCH_UP_NICE`.
    Lower,
    /// Every thread back to the nice value the process started with.
    Restore,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// A first start: the priority is never touched.
    Normal,
    Lowered {
        since: Instant,
    },
    Restored,
}

/// The priority decisions of one process's life.
#[derive(Debug)]
pub struct CatchUpPriority {
    state: State,
}

impl CatchUpPriority {
    /// `serving`: programs of an earlier process are attached, so the datapath
    /// serves while this one catches up; `may_restore`: the process may raise its
    /// priority back afterwards (`may_restore_priority`). Returns the first step too.
    pub fn start(serving: bool, may_restore: bool, now: Instant) -> (Self, PriorityStep) {
        if serving && may_restore {
            let state = State::Lowered { since: now };
            (Self { state }, PriorityStep::Lower)
        } else {
            let state = State::Normal;
            (Self { state }, PriorityStep::Keep)
        }
    }

    /// After each round of the agent's loop; `synced`: the maps have been synced
    /// with the desired state at least once by this process.
    pub fn after_round(&mut self, synced: bool, now: Instant) -> PriorityStep {
        match self.state {
            State::Lowered { since }
                if synced || now.saturating_duration_since(since) >= CATCH_UP_LIMIT =>
            {
                self.state = State::Restored;
                PriorityStep::Restore
            }
            State::Normal | State::Lowered { .. } | State::Restored => PriorityStep::Keep,
        }
    }

    pub fn is_lowered(&self) -> bool {
        matches!(self.state, State::Lowered { .. })
    }
}

/// The calling thread's nice value.
pub fn current_nice() -> std::io::Result<i32> {
    thread_nice(0)
}

/// The nice value of thread `thread_id` of this process (0: the calling thread).
pub fn thread_nice(thread_id: u32) -> std::io::Result<i32> {
    // getpriority(2) may return -1 as a value: errno tells it from an error.
    // SAFETY: errno is thread-local; getpriority only reads its arguments.
    unsafe {
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS as _, thread_id as _);
        if nice == -1 && *libc::__errno_location() != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(nice)
    }
}

/// Sets the nice value of every thread of this process; returns how many were
/// set. A thread that exits meanwhile is skipped; any other failure (raising the
/// priority needs `CAP_SYS_NICE`) is returned after every thread was tried.
pub fn set_nice_of_every_thread(nice: i32) -> std::io::Result<usize> {
    let mut set = 0;
    let mut first_error = None;
    for entry in std::fs::read_dir("/proc/self/task")? {
        let Some(thread_id) = entry?
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<u32>().ok())
        else {
            continue;
        };
        // SAFETY: setpriority only reads its arguments; with PRIO_PROCESS and a
        // thread id it changes that one thread (Linux).
        let result = unsafe { libc::setpriority(libc::PRIO_PROCESS as _, thread_id as _, nice) };
        if result == 0 {
            set += 1;
            continue;
        }
        let error = std::io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::ESRCH) && first_error.is_none() {
            first_error = Some(error);
        }
    }
    match first_error {
        Some(error) => Err(error),
        None => Ok(set),
    }
}

/// Carries out `step`, logging what it did; `original_nice` is the process's
/// nice value at start. A failure costs only the priority, so it is logged.
pub fn apply(step: PriorityStep, original_nice: i32) {
    let (nice, what) = match step {
        PriorityStep::Keep => return,
        PriorityStep::Lower => (
            CATCH_UP_NICE.max(original_nice),
            "programs of an earlier process are serving: catching up at the lowest CPU priority",
        ),
        PriorityStep::Restore => (original_nice, "caught up: back to the normal CPU priority"),
    };
    match set_nice_of_every_thread(nice) {
        Ok(threads) => tracing::info!(nice, threads, "{what}"),
        Err(error) => {
            tracing::warn!(nice, %error, "failed to set the CPU priority of the agent's threads")
        }
    }
}

/// An exiting agent leaves its programs and maps serving, so its shutdown is no
/// more urgent than a catch-up: every thread goes to `CATCH_UP_NICE`.
pub fn yield_for_exit() {
    if !this_process_may_restore_priority() {
        // Lowering is harmless here, but a process that cannot restore does not
        // change priorities at all: one rule, easy to reason about.
        return;
    }
    if let Err(error) = set_nice_of_every_thread(CATCH_UP_NICE) {
        tracing::warn!(%error, "failed to lower the CPU priority for the exit");
    }
}

#[cfg(test)]
mod tests;
