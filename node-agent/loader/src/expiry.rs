//! Expiry of conntrack entries. The programs keep flows in a plain preallocated
//! hash, which never evicts (an LRU insert scans its lists on every new flow, the
//! largest single cost of a new connection after the kernel's own work), so the
//! agent removes the entries the programs already treat as absent: past the idle
//! timeout, or past the closing timeout once a TCP flow has been reset or closed
//! from both sides. Nothing live is removed: the rule is the programs' `is_live`.
//!
//! A thread walks the hash in batches and removes each batch's expired keys at
//! once, each taken out with the value it holds at that moment and put back if
//! the programs wrote a new flow under it since the read (see `Removal`). How
//! often depends on how full the hash is: a fuller hash is swept sooner, so the
//! overflow LRU (`SY_CT_OVERFLOW`, where the programs put flows a full hash cannot
//! take) stays the exception. While no agent runs, nothing expires and the
//! overflow takes the surplus.

use std::{
    cell::Cell,
    os::fd::{AsFd as _, BorrowedFd, OwnedFd},
    path::Path,
    sync::{mpsc, Arc, Mutex},
    time::Duration,
};

use switchyard_common::{
    map_names, ConntrackKey, ConntrackValue, DatapathConfig, DEFAULT_TCP_CLOSING_TIMEOUT_SECONDS,
    DEFAULT_TCP_IDLE_TIMEOUT_SECONDS, DEFAULT_UDP_IDLE_TIMEOUT_SECONDS, PROTOCOL_TCP,
    TCP_STATE_FIN_FROM_BACKEND, TCP_STATE_FIN_FROM_CLIENT, TCP_STATE_RESET,
};

use super::{
    pinned_maps::{open_conntrack, open_pin, read_error},
    schema, system,
};
use crate::Error;

/// How long each kind of entry lives after its last packet, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetimes {
    pub tcp_idle: u64,
    pub tcp_closing: u64,
    pub udp_idle: u64,
}

fn seconds_or_default(seconds: u32, default: u32) -> u64 {
    let seconds = if seconds == 0 { default } else { seconds };
    u64::from(seconds) * 1_000_000_000
}

impl Lifetimes {
    /// The lifetimes the programs apply for `config` (zero means the default).
    pub fn of(config: &DatapathConfig) -> Self {
        Self {
            tcp_idle: seconds_or_default(
                config.tcp_idle_timeout_seconds,
                DEFAULT_TCP_IDLE_TIMEOUT_SECONDS,
            ),
            tcp_closing: seconds_or_default(
                config.tcp_closing_timeout_seconds,
                DEFAULT_TCP_CLOSING_TIMEOUT_SECONDS,
            ),
            udp_idle: seconds_or_default(
                config.udp_idle_timeout_seconds,
                DEFAULT_UDP_IDLE_TIMEOUT_SECONDS,
            ),
        }
    }
}

/// Whether the programs would treat the entry as absent at `now_nanoseconds`
/// (`CLOCK_MONOTONIC`, the clock of `bpf_ktime_get_ns`): the rule of their
/// `is_live`, negated.
pub fn is_expired(
    key: &ConntrackKey,
    value: &ConntrackValue,
    lifetimes: &Lifetimes,
    now_nanoseconds: u64,
) -> bool {
    let both_fins = TCP_STATE_FIN_FROM_CLIENT | TCP_STATE_FIN_FROM_BACKEND;
    let lifetime = if key.protocol == PROTOCOL_TCP {
        if value.tcp_state & TCP_STATE_RESET != 0 || value.tcp_state & both_fins == both_fins {
            lifetimes.tcp_closing
        } else {
            lifetimes.tcp_idle
        }
    } else {
        lifetimes.udp_idle
    };
    // Saturating: an entry the programs refreshed after the sweep read the clock
    // carries a stamp in the sweep's future, and is as live as it gets.
    now_nanoseconds.saturating_sub(value.last_seen_nanoseconds) >= lifetime
}

/// The longest pause between two sweeps: a quiet node's hash is swept at this
/// pace, which is far below every lifetime but the closing one.
pub const LONGEST_SWEEP_INTERVAL: Duration = Duration::from_secs(10);
/// The shortest pause, for a hash more than half full.
pub const SHORTEST_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// How many times as long as a sweep took the pause after it lasts at least: the
/// sweeps then take at most a twentieth of one core, however large the hash. A
/// sweep reads every entry, so its cost grows with the table; Calico's conntrack
/// housekeeping took 1.2 cores at about 4 million entries (projectcalico/calico#10642).
/// A hash too large to sweep at the pace its fill asks for is swept less often
/// instead, and the overflow LRU takes the new flows it has no room for meanwhile.
pub const PAUSE_PER_SWEEP_TIME: u32 = 19;

/// How long to wait before the next sweep, given how many entries the hash kept
/// after this one out of `capacity` and how long this one took: the longest
/// interval while it is at most a tenth full, the shortest from half full, linear
/// in between (a busy node's closed flows, 10 s each, then never pile up to fill
/// it), and never less than [`PAUSE_PER_SWEEP_TIME`] times the sweep itself.
pub fn next_sweep_after(kept: usize, capacity: u32, sweep_took: Duration) -> Duration {
    let by_share_of_a_core = sweep_took.saturating_mul(PAUSE_PER_SWEEP_TIME);
    if capacity == 0 {
        return LONGEST_SWEEP_INTERVAL.max(by_share_of_a_core);
    }
    let fill = kept as f64 / f64::from(capacity);
    let (low, high) = (0.1, 0.5);
    let share = ((fill - low) / (high - low)).clamp(0.0, 1.0);
    let longest = LONGEST_SWEEP_INTERVAL.as_secs_f64();
    let shortest = SHORTEST_SWEEP_INTERVAL.as_secs_f64();
    Duration::from_secs_f64(longest - share * (longest - shortest)).max(by_share_of_a_core)
}

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sweep {
    /// Entries read.
    pub seen: usize,
    /// Expired entries deleted.
    pub deleted: usize,
}

impl Sweep {
    pub fn kept(&self) -> usize {
        self.seen.saturating_sub(self.deleted)
    }
}

/// Walks the conntrack map `map` (the hash or its overflow LRU) batch by batch
/// and deletes, as each batch is read, the entries `select` picks: `select`
/// judges an entry with the monotonic time (nanoseconds) its batch was read,
/// and `delete` removes the picked keys, packed back to back, returning how
/// many it removed. Deleting while walking keeps the memory to one batch
/// however large the map. Entries that do not parse are left alone.
pub fn delete_conntrack_entries_where(
    map: BorrowedFd<'_>,
    mut select: impl FnMut(&ConntrackKey, &ConntrackValue, u64) -> bool,
    mut delete: impl FnMut(&[u8]) -> std::io::Result<usize>,
) -> std::io::Result<Sweep> {
    let mut walk = Sweep::default();
    let mut picked_keys = Vec::with_capacity(KEY_SIZE * system::LOOKUP_CHUNK);
    system::map_entries_in_chunks(map, KEY_SIZE, VALUE_SIZE, |keys, values, count| {
        let read_at = system::monotonic_nanoseconds();
        picked_keys.clear();
        let entries = keys
            .chunks_exact(KEY_SIZE)
            .zip(values.chunks_exact(VALUE_SIZE));
        for (key_bytes, value_bytes) in entries.take(count) {
            let (Some(key), Some(value)) = (
                schema::from_bytes::<ConntrackKey>(key_bytes),
                schema::from_bytes::<ConntrackValue>(value_bytes),
            ) else {
                continue;
            };
            if select(&key, &value, read_at) {
                picked_keys.extend_from_slice(key_bytes);
            }
        }
        walk.seen += count;
        if !picked_keys.is_empty() {
            walk.deleted += delete(&picked_keys)?;
        }
        Ok(())
    })?;
    Ok(walk)
}

/// How a sweep removes the entries it read as expired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// Each key is taken out with the value it holds at that moment
    /// (`BPF_MAP_LOOKUP_AND_DELETE_ELEM`) and put back if that value is live: the
    /// programs may have written a new flow under the key (a client reusing the
    /// tuple of an expired flow) between the sweep's read and its removal, and
    /// deleting that would break the new connection.
    TakeAndCheck,
    /// Each batch's keys deleted in one call (`BPF_MAP_DELETE_BATCH`), for kernels
    /// before 5.14, which cannot take from a hash: a key rewritten between the read
    /// and the delete (microseconds) loses its new flow.
    BatchDelete,
}

/// The conntrack hash, its overflow and the configuration map of one schema
/// version's directory.
pub struct ConntrackMaps {
    conntrack: OwnedFd,
    overflow: OwnedFd,
    config: OwnedFd,
    capacity: u32,
    removal: Cell<Removal>,
}

const KEY_SIZE: usize = std::mem::size_of::<ConntrackKey>();
const VALUE_SIZE: usize = std::mem::size_of::<ConntrackValue>();

impl ConntrackMaps {
    /// Opens the maps pinned in `directory` (`<pin dir>/v<SCHEMA_VERSION>`).
    pub fn open(directory: &Path) -> Result<Self, Error> {
        let (conntrack, shape) = open_conntrack(directory, map_names::CONNTRACK)?;
        let (overflow, _) = open_conntrack(directory, map_names::CONNTRACK_OVERFLOW)?;
        Ok(Self {
            conntrack,
            overflow,
            config: open_pin(directory, map_names::CONFIG)?,
            capacity: shape.max_entries,
            removal: Cell::new(Removal::TakeAndCheck),
        })
    }

    /// The same maps, removing entries the way `removal` says (a kernel without
    /// `TakeAndCheck` falls back to `BatchDelete` by itself).
    pub fn with_removal(self, removal: Removal) -> Self {
        self.removal.set(removal);
        self
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// The lifetimes the programs apply now, from the configuration map.
    pub fn lifetimes(&self) -> Result<Lifetimes, Error> {
        let value = system::map_lookup(
            self.config.as_fd(),
            &0u32.to_ne_bytes(),
            std::mem::size_of::<DatapathConfig>(),
        )
        .map_err(read_error(map_names::CONFIG))?;
        let config = value
            .as_deref()
            .and_then(schema::from_bytes::<DatapathConfig>)
            .unwrap_or_default();
        Ok(Lifetimes::of(&config))
    }

    /// Deletes every expired entry, judged at the moment each batch is read (and,
    /// with `TakeAndCheck`, again as each entry is removed).
    pub fn sweep(&self) -> Result<Sweep, Error> {
        let lifetimes = self.lifetimes()?;
        delete_conntrack_entries_where(
            self.conntrack.as_fd(),
            |key, value, read_at| is_expired(key, value, &lifetimes, read_at),
            |keys| self.remove_expired(keys, &lifetimes),
        )
        .map_err(|source| switchyard_model::Error::UpdateMap {
            map: map_names::CONNTRACK,
            source: Box::new(Error::DeleteConntrackEntries {
                what: "remove expired entries",
                source,
            }),
        })
        .map_err(Error::from)
    }

    /// Removes the keys packed back to back in `keys`, read as expired moments
    /// ago; returns how many it removed.
    pub fn remove_expired(&self, keys: &[u8], lifetimes: &Lifetimes) -> std::io::Result<usize> {
        if keys.is_empty() {
            return Ok(0);
        }
        if self.removal.get() == Removal::TakeAndCheck {
            match self.take_each_if_expired(keys, lifetimes) {
                Err(error) if error.kind() == std::io::ErrorKind::Unsupported => {
                    tracing::info!(
                        %error,
                        "this kernel cannot take entries out of a hash: expired conntrack entries are deleted in batches"
                    );
                    self.removal.set(Removal::BatchDelete);
                }
                result => return result,
            }
        }
        system::map_delete_keys(self.conntrack.as_fd(), keys, KEY_SIZE)
    }

    fn take_each_if_expired(&self, keys: &[u8], lifetimes: &Lifetimes) -> std::io::Result<usize> {
        let mut removed = 0;
        for key_bytes in keys.chunks_exact(KEY_SIZE) {
            let Some(taken) = system::map_take(self.conntrack.as_fd(), key_bytes, VALUE_SIZE)?
            else {
                // Removed meanwhile (by another agent process sweeping the same
                // pinned hash during a rolling update): nothing to do.
                continue;
            };
            let live = match (
                schema::from_bytes::<ConntrackKey>(key_bytes),
                schema::from_bytes::<ConntrackValue>(&taken),
            ) {
                (Some(key), Some(value)) => {
                    !is_expired(&key, &value, lifetimes, system::monotonic_nanoseconds())
                }
                _ => false,
            };
            if live {
                self.put_back(key_bytes, &taken)?;
            } else {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Puts back an entry the programs wrote after the sweep read its key,
    /// unless they have written it again since (theirs is newer).
    fn put_back(&self, key: &[u8], value: &[u8]) -> std::io::Result<()> {
        match system::map_update(self.conntrack.as_fd(), key, value, system::UPDATE_NO_EXIST) {
            Ok(()) => Ok(()),
            Err(error) if error.raw_os_error() == Some(libc::EEXIST) => Ok(()),
            // The programs filled the hash meanwhile: where they put what it
            // cannot take.
            Err(error) if error.raw_os_error() == Some(libc::E2BIG) => {
                system::map_update(self.overflow.as_fd(), key, value, system::UPDATE_ANY)
            }
            Err(error) => Err(error),
        }
    }
}

/// What the sweeps have done so far, for the agent's metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Entries the last sweep left in the hash.
    pub entries: usize,
    /// The hash's size.
    pub capacity: u32,
    /// How long the last sweep took.
    pub last_sweep_took: Duration,
    /// Expired entries removed by every sweep of this process.
    pub removed_total: u64,
}

/// The sweeping thread; dropping it stops the thread (and waits for it).
pub struct ConntrackExpiry {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    report: Arc<Mutex<Option<SweepReport>>>,
}

impl ConntrackExpiry {
    /// Starts sweeping the conntrack hash pinned in `directory`.
    pub fn start(directory: &Path) -> Result<Self, Error> {
        let maps = ConntrackMaps::open(directory)?;
        let (stop, stopped) = mpsc::channel::<()>();
        let report = Arc::new(Mutex::new(None));
        let reported = Arc::clone(&report);
        let thread = std::thread::Builder::new()
            .name("conntrack-expiry".into())
            .spawn(move || sweep_until_stopped(&maps, &stopped, &reported))
            .map_err(|source| Error::StartExpiryThread { source })?;
        Ok(Self {
            stop: Some(stop),
            thread: Some(thread),
            report,
        })
    }

    /// What the sweeps have done, once one has run.
    pub fn report(&self) -> Option<SweepReport> {
        // A poisoned lock only means the thread panicked while writing a copy.
        *self
            .report
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn sweep_until_stopped(
    maps: &ConntrackMaps,
    stopped: &mpsc::Receiver<()>,
    report: &Mutex<Option<SweepReport>>,
) {
    let mut removed_total = 0u64;
    let mut interval = SHORTEST_SWEEP_INTERVAL;
    let mut failing = false;
    loop {
        match stopped.recv_timeout(interval) {
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            // A message or a dropped sender: stop.
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
        let started = std::time::Instant::now();
        match maps.sweep() {
            Ok(sweep) => {
                if failing {
                    tracing::info!("conntrack expiry works again");
                    failing = false;
                }
                let took = started.elapsed();
                if sweep.deleted > 0 {
                    tracing::debug!(
                        seen = sweep.seen,
                        deleted = sweep.deleted,
                        took_ms = took.as_secs_f64() * 1e3,
                        "removed expired conntrack entries"
                    );
                }
                interval = next_sweep_after(sweep.kept(), maps.capacity(), took);
                removed_total += sweep.deleted as u64;
                *report
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(SweepReport {
                    entries: sweep.kept(),
                    capacity: maps.capacity(),
                    last_sweep_took: took,
                    removed_total,
                });
            }
            Err(error) => {
                // Logged once per failing stretch; the overflow LRU keeps new
                // flows working meanwhile.
                if !failing {
                    tracing::warn!(error = %switchyard_model::error::chain(&error), "failed to remove expired conntrack entries; retrying");
                    failing = true;
                }
                interval = LONGEST_SWEEP_INTERVAL;
            }
        }
    }
}

impl Drop for ConntrackExpiry {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests;
