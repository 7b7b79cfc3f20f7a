//! Applying plans to the maps, and the syncer that ties the pure parts together:
//! desired services -> laid-out entries -> plan -> apply, against the state it
//! restored at start and has tracked since.

pub mod coalesce;
pub mod incremental;
pub mod inputs;

use std::collections::BTreeMap;

use crate::desired::{lay_out, merge, DesiredServices, ServiceDesired};
use crate::diff::{plan, removed_udp_backends, udp_backends_before, Plan, RemovedUdpBackends};
use crate::gate::GateOpen;
use crate::maps::{MapState, ServiceMaps, SourceRangeEntry};
use crate::model::ServiceName;
use crate::Error;
use switchyard_common::{BackendSlotKey, FrontendKey, FrontendValue};

use self::incremental::Index;

/// What an apply did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApplyReport {
    pub frontends_deleted: usize,
    pub backend_slots_written: usize,
    pub frontends_written: usize,
    pub backend_slots_deleted: usize,
    pub source_ranges_written: usize,
    pub source_ranges_deleted: usize,
    /// UDP flow entries deleted because their backend left their frontend
    /// (not a Service map operation: not in [`ApplyReport::operation_count`]).
    pub udp_flow_entries_deleted: usize,
    /// The UDP flows of some removed backends are still in the conntrack maps:
    /// their release failed and is retried with the next apply, which the
    /// caller should start soon even without a change (a stale flow keeps
    /// sending its datagrams to a backend that is gone).
    pub udp_flow_releases_pending: bool,
    /// How long the release of the UDP flows of removed backends took (the walk of the
    /// conntrack maps), when this apply ran one, whether it succeeded or not: kube-proxy's
    /// conntrack reconciler is timed the same way.
    pub udp_flow_release_elapsed: Option<std::time::Duration>,
}

impl ApplyReport {
    pub fn operation_count(&self) -> usize {
        self.frontends_deleted
            + self.backend_slots_written
            + self.frontends_written
            + self.backend_slots_deleted
            + self.source_ranges_written
            + self.source_ranges_deleted
    }
}

/// A map entry, by its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum EntryKey {
    Frontend(FrontendKey),
    BackendSlot(BackendSlotKey),
    SourceRange(SourceRangeEntry),
}

/// Why an entry was not brought to its desired state.
#[derive(Debug)]
pub enum EntryFault {
    /// Its write or delete failed.
    Failed(Error),
    /// Held back to keep every frontend on existing slots: a frontend whose
    /// slots could not all be written, or a slot a frontend still uses.
    HeldBack,
}

impl std::fmt::Display for EntryFault {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EntryFault::Failed(error) => write!(formatter, "{}", crate::error::Chain(error)),
            EntryFault::HeldBack => formatter.write_str(
                "held back: it depends on an entry that failed (a frontend never points at a missing slot)",
            ),
        }
    }
}

/// An entry an apply could not bring to its desired state, with the Services
/// it belongs to (empty when it belongs to none that is desired: a stale entry).
#[derive(Debug)]
pub struct FailedEntry {
    pub entry: EntryKey,
    pub services: Vec<ServiceName>,
    pub fault: EntryFault,
}

/// Applies `plan` phase by phase (see `diff` for why the order is safe). A
/// failed operation does not stop the apply: every other entry is still
/// written, so that one entry that always fails (a full map) blocks nothing
/// else, as Cilium's load-balancer reconciler goes on per frontend. Only what
/// depends on a failure is held back, to keep the order's guarantee: a
/// frontend whose slots are not all in the maps is not written, and a slot a
/// frontend still uses is not deleted. `tracked` follows every operation that
/// succeeded, so it still equals the maps (a failed BPF map update changes
/// nothing). Returns what was done and what was not (without Services yet).
pub fn apply(
    plan: &Plan,
    maps: &mut impl ServiceMaps,
    tracked: &mut MapState,
) -> (ApplyReport, Vec<FailedEntry>) {
    let mut progress = Progress::default();
    for key in &plan.stale_frontends {
        if progress.record(EntryKey::Frontend(*key), maps.delete_frontend(key)) {
            tracked.frontends.remove(key);
            progress.report.frontends_deleted += 1;
        }
    }
    for (key, value) in &plan.backend_slot_writes {
        if progress.record(
            EntryKey::BackendSlot(*key),
            maps.write_backend_slot(key, value),
        ) {
            tracked.backend_slots.insert(*key, *value);
            progress.report.backend_slots_written += 1;
        }
    }
    // A range that failed to be written leaves its frontend admitting fewer
    // sources, never more: nothing is held back for it.
    for entry in &plan.source_range_writes {
        if progress.record(
            EntryKey::SourceRange(*entry),
            maps.write_source_range(entry),
        ) {
            tracked.source_ranges.insert(*entry);
            progress.report.source_ranges_written += 1;
        }
    }
    for (key, value) in &plan.frontend_writes {
        // Without failures the plan's order guarantees the slots; after one,
        // each frontend is checked (a few lookups).
        if progress.any_failed && !tracked.has_slots_of(value) {
            progress.hold_back(EntryKey::Frontend(*key));
        } else if progress.record(EntryKey::Frontend(*key), maps.write_frontend(key, value)) {
            tracked.frontends.insert(*key, *value);
            progress.report.frontends_written += 1;
        }
    }
    // After a failure a frontend may still use a slot the plan deletes (its
    // delete or rewrite failed): how many slots each group's frontends use.
    let mut slots_in_use: BTreeMap<u32, u32> = BTreeMap::new();
    if progress.any_failed {
        for value in tracked.frontends.values() {
            let count = slots_in_use.entry(value.group_id).or_default();
            *count = (*count).max(value.backend_count);
        }
    }
    for key in &plan.unused_backend_slots {
        let in_use = slots_in_use
            .get(&key.group_id)
            .is_some_and(|count| key.ordinal < *count);
        if in_use {
            progress.hold_back(EntryKey::BackendSlot(*key));
        } else if progress.record(EntryKey::BackendSlot(*key), maps.delete_backend_slot(key)) {
            tracked.backend_slots.remove(key);
            progress.report.backend_slots_deleted += 1;
        }
    }
    for entry in &plan.stale_source_ranges {
        if progress.record(
            EntryKey::SourceRange(*entry),
            maps.delete_source_range(entry),
        ) {
            tracked.source_ranges.remove(entry);
            progress.report.source_ranges_deleted += 1;
        }
    }
    (progress.report, progress.failed)
}

/// [`apply`], then the release of the UDP flows whose backend the apply took
/// from their frontend, in the same round, so that a flow's next datagram is
/// balanced again to a live backend, or refused if none is left. A release
/// that fails is kept in `unreleased` and retried with the next apply (minus
/// the backends that came back meanwhile), and the report says so
/// ([`ApplyReport::udp_flow_releases_pending`]) for the caller to start that
/// apply soon; it never fails the apply, whose Service entries are written.
pub fn apply_and_release_udp_flows(
    plan: &Plan,
    maps: &mut impl ServiceMaps,
    tracked: &mut MapState,
    unreleased: &mut RemovedUdpBackends,
) -> (ApplyReport, Vec<FailedEntry>) {
    let before = udp_backends_before(plan, tracked);
    let (mut report, failed) = apply(plan, maps, tracked);
    let mut removed = std::mem::take(unreleased).still_removed_in(tracked);
    removed.merge(removed_udp_backends(before, tracked));
    if removed.is_empty() {
        return (report, failed);
    }
    let started = std::time::Instant::now();
    let released = maps.release_udp_flows(&removed);
    report.udp_flow_release_elapsed = Some(started.elapsed());
    match released {
        Ok(deleted) => report.udp_flow_entries_deleted = deleted,
        Err(error) => {
            tracing::warn!(error = %crate::error::chain(&error), "failed to delete the UDP flows of removed backends; retrying with the next sync");
            *unreleased = removed;
            report.udp_flow_releases_pending = true;
        }
    }
    (report, failed)
}

/// What an apply has done so far, and what it could not.
#[derive(Default)]
struct Progress {
    report: ApplyReport,
    failed: Vec<FailedEntry>,
    /// Some operation failed: what depends on one is checked from now on.
    any_failed: bool,
}

impl Progress {
    /// Records the failure of `entry`'s operation, if it failed; returns
    /// whether it succeeded.
    fn record(&mut self, entry: EntryKey, result: Result<(), Error>) -> bool {
        let Err(error) = result else {
            return true;
        };
        self.any_failed = true;
        self.failed.push(FailedEntry {
            entry,
            services: Vec::new(),
            fault: EntryFault::Failed(error),
        });
        false
    }

    fn hold_back(&mut self, entry: EntryKey) {
        self.failed.push(FailedEntry {
            entry,
            services: Vec::new(),
            fault: EntryFault::HeldBack,
        });
    }
}

/// Names the Services of each failed entry: a frontend's owner, and for a
/// backend slot the owners of the frontends of its group (in `frontends`:
/// the entries desired and those in the maps).
fn attribute<'a>(
    failed: &mut [FailedEntry],
    frontends: impl Iterator<Item = (&'a FrontendKey, &'a FrontendValue)> + Clone,
    owner: impl Fn(&FrontendKey) -> Option<ServiceName>,
) {
    for entry in failed.iter_mut() {
        let mut services: Vec<ServiceName> = match entry.entry {
            EntryKey::Frontend(key) => owner(&key).into_iter().collect(),
            EntryKey::SourceRange(entry) => owner(&entry.frontend).into_iter().collect(),
            EntryKey::BackendSlot(slot) => frontends
                .clone()
                .filter(|(_, value)| value.group_id == slot.group_id)
                .filter_map(|(key, _)| owner(key))
                .collect(),
        };
        services.sort();
        services.dedup();
        entry.services = services;
    }
}

/// Keeps the Service maps equal to the desired state.
#[derive(Debug)]
pub struct Syncer {
    current: MapState,
    /// Set when an apply failed: the next sync re-reads the maps instead of
    /// trusting the tracked state (a failure of the map itself, rather than of
    /// one update, may have changed more than we know).
    reread_before_next_sync: bool,
    /// What partial syncs need, from the last successful full sync by
    /// [`Syncer::sync_services`] (`None` before it, and after any failure).
    index: Option<Index>,
    /// UDP flows to removed backends whose deletion failed: retried with the
    /// next apply.
    unreleased_udp_flows: RemovedUdpBackends,
}

impl Syncer {
    /// Starts from the entries the maps hold (the previous process's, after a
    /// restart): nothing is written here.
    pub fn restore(maps: &impl ServiceMaps) -> Result<Self, Error> {
        Ok(Self {
            current: MapState::restore(maps)?,
            reread_before_next_sync: false,
            index: None,
            unreleased_udp_flows: RemovedUdpBackends::default(),
        })
    }

    /// The entries the maps hold, as far as the syncer knows.
    pub fn current(&self) -> &MapState {
        &self.current
    }

    /// Makes the maps equal to `desired` (a whole desired state, as the tests
    /// build it). Requires the start-of-day gate to be open: before that the
    /// agent must not write (nor prune) anything.
    #[cfg(feature = "testing")]
    pub fn sync(
        &mut self,
        _gate_is_open: GateOpen,
        desired: &DesiredServices,
        maps: &mut impl ServiceMaps,
    ) -> Result<ApplyReport, Error> {
        self.index = None;
        self.sync_full(desired, maps)
    }

    fn sync_full(
        &mut self,
        desired: &DesiredServices,
        maps: &mut impl ServiceMaps,
    ) -> Result<ApplyReport, Error> {
        if self.reread_before_next_sync {
            self.current = MapState::restore(maps)?;
            self.reread_before_next_sync = false;
        }
        let entries = lay_out(desired, &self.current);
        let plan = plan(&self.current, &entries);
        let (report, mut failed) = apply_and_release_udp_flows(
            &plan,
            maps,
            &mut self.current,
            &mut self.unreleased_udp_flows,
        );
        if failed.is_empty() {
            return Ok(report);
        }
        self.reread_before_next_sync = true;
        let owner = |key: &FrontendKey| {
            desired
                .frontends
                .get(key)
                .map(|frontend| frontend.group.service.clone())
        };
        attribute(
            &mut failed,
            entries
                .frontends
                .iter()
                .chain(self.current.frontends.iter()),
            owner,
        );
        Err(Error::incomplete(report, failed))
    }

    /// A full sync from every Service's share (in name order), which also
    /// prepares partial syncs ([`Syncer::sync_changes`]).
    pub fn sync_services(
        &mut self,
        _gate_is_open: GateOpen,
        services: BTreeMap<ServiceName, ServiceDesired>,
        maps: &mut impl ServiceMaps,
    ) -> Result<ApplyReport, Error> {
        self.index = None;
        let desired = merge(services.values());
        for conflict in &desired.conflicts {
            tracing::warn!(kept = %conflict.kept, dropped = %conflict.dropped, "two Services claim one address and port");
        }
        let report = self.sync_full(&desired, maps)?;
        self.index = Some(Index::build(services, &self.current));
        Ok(report)
    }

    /// Makes the next full sync read the maps again instead of trusting the
    /// tracked entries (the periodic resync: it also repairs entries that
    /// something else changed, and any drift of the partial syncs' bookkeeping).
    pub fn reread_maps_before_next_sync(&mut self) {
        self.reread_before_next_sync = true;
        self.index = None;
    }

    /// Whether the next sync must be a full one: no index yet, or the last apply
    /// failed (the maps are re-read and everything planned again).
    pub fn needs_full_sync(&self) -> bool {
        self.index.is_none() || self.reread_before_next_sync
    }

    /// The syncer as a partial syncer, when it can be one: it has the index of
    /// its last full sync and trusts its tracked entries. `None`: the next
    /// sync must be a full one. A partial sync cannot be asked of a syncer
    /// that cannot make one, so whoever holds the syncer decides full versus
    /// partial in one place ([`inputs::SyncInputs::sync`]).
    pub fn partial(&mut self) -> Option<PartialSync<'_>> {
        if self.reread_before_next_sync {
            return None;
        }
        let index = self.index.take()?;
        Some(PartialSync {
            syncer: self,
            index: Some(index),
        })
    }
}

/// A syncer that can sync only what changed ([`Syncer::partial`]). It holds
/// the syncer's index; dropping it gives the index back.
pub struct PartialSync<'a> {
    syncer: &'a mut Syncer,
    index: Option<Index>,
}

impl PartialSync<'_> {
    /// A partial sync: only the Services in `changes` changed (`None`: deleted).
    /// After a failure the syncer has no index: its next sync is a full one
    /// from re-read maps.
    pub fn sync_changes(
        mut self,
        _gate_is_open: GateOpen,
        changes: Vec<(ServiceName, Option<ServiceDesired>)>,
        maps: &mut impl ServiceMaps,
    ) -> Result<ApplyReport, Error> {
        let Some(index) = self.index.as_mut() else {
            // Only `Syncer::partial` makes one, always with an index.
            return Ok(ApplyReport::default());
        };
        let current = &mut self.syncer.current;
        let (plan, released) = index.change(changes, current);
        let (report, mut failed) = apply_and_release_udp_flows(
            &plan,
            maps,
            current,
            &mut self.syncer.unreleased_udp_flows,
        );
        if failed.is_empty() {
            index.applied(&released);
            return Ok(report);
        }
        attribute(
            &mut failed,
            plan.frontend_writes
                .iter()
                .map(|(key, value)| (key, value))
                .chain(current.frontends.iter()),
            |key| index.owner(key),
        );
        self.index = None;
        self.syncer.reread_before_next_sync = true;
        Err(Error::incomplete(report, failed))
    }
}

impl Drop for PartialSync<'_> {
    fn drop(&mut self) {
        if let Some(index) = self.index.take() {
            self.syncer.index = Some(index);
        }
    }
}

#[cfg(test)]
mod dual_stack_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod udp_flow_tests;
