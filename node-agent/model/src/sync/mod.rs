//! Applying plans to the maps, and the syncer that ties the pure parts together:
//! desired services -> laid-out entries -> plan -> apply, against the state it
//! restored at start and has tracked since.

pub mod coalesce;
pub mod incremental;
pub mod inputs;

use std::collections::BTreeMap;

use crate::desired::{lay_out, merge, DesiredServices, ServiceDesired};
use crate::diff::{plan, Plan};
use crate::gate::GateOpen;
use crate::maps::{MapState, ServiceMaps};
use crate::model::ServiceName;
use crate::Error;

use self::incremental::Index;

/// What an apply did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApplyReport {
    pub frontends_deleted: usize,
    pub backend_slots_written: usize,
    pub frontends_written: usize,
    pub backend_slots_deleted: usize,
}

impl ApplyReport {
    pub fn operation_count(&self) -> usize {
        self.frontends_deleted
            + self.backend_slots_written
            + self.frontends_written
            + self.backend_slots_deleted
    }
}

/// Applies `plan` phase by phase (see `diff` for why the order is safe), stopping
/// at the first failure. `tracked` follows every operation that succeeded, so
/// after a failure it still equals the maps (a failed BPF map update changes
/// nothing).
pub fn apply(
    plan: &Plan,
    maps: &mut impl ServiceMaps,
    tracked: &mut MapState,
) -> Result<ApplyReport, Error> {
    let mut report = ApplyReport::default();
    for key in &plan.stale_frontends {
        maps.delete_frontend(key)?;
        tracked.frontends.remove(key);
        report.frontends_deleted += 1;
    }
    for (key, value) in &plan.backend_slot_writes {
        maps.write_backend_slot(key, value)?;
        tracked.backend_slots.insert(*key, *value);
        report.backend_slots_written += 1;
    }
    for (key, value) in &plan.frontend_writes {
        maps.write_frontend(key, value)?;
        tracked.frontends.insert(*key, *value);
        report.frontends_written += 1;
    }
    for key in &plan.unused_backend_slots {
        maps.delete_backend_slot(key)?;
        tracked.backend_slots.remove(key);
        report.backend_slots_deleted += 1;
    }
    Ok(report)
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
}

impl Syncer {
    /// Starts from the entries the maps hold (the previous process's, after a
    /// restart): nothing is written here.
    pub fn restore(maps: &impl ServiceMaps) -> Result<Self, Error> {
        Ok(Self {
            current: MapState::restore(maps)?,
            reread_before_next_sync: false,
            index: None,
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
        apply(&plan, maps, &mut self.current).inspect_err(|_| {
            self.reread_before_next_sync = true;
        })
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

    /// A partial sync: only the Services in `changes` changed (`None`: deleted).
    /// Returns `Ok(None)` without writing when a full sync is needed instead.
    pub fn sync_changes(
        &mut self,
        _gate_is_open: GateOpen,
        changes: Vec<(ServiceName, Option<ServiceDesired>)>,
        maps: &mut impl ServiceMaps,
    ) -> Result<Option<ApplyReport>, Error> {
        if self.reread_before_next_sync {
            return Ok(None);
        }
        let Some(index) = self.index.as_mut() else {
            return Ok(None);
        };
        let (plan, released) = index.change(changes, &self.current);
        match apply(&plan, maps, &mut self.current) {
            Ok(report) => {
                index.applied(&released);
                Ok(Some(report))
            }
            Err(error) => {
                self.index = None;
                self.reread_before_next_sync = true;
                Err(error)
            }
        }
    }
}

#[cfg(test)]
mod tests;
