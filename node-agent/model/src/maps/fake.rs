//! In-memory `ServiceMaps` with injected faults (`testing` feature): what the
//! core's tests, the agent's tests and the benchmarks run the syncer against.

use std::collections::{BTreeMap, BTreeSet};

use switchyard_common::{BackendSlotKey, BackendValue, DatapathConfig, FrontendKey, FrontendValue};

use super::{MapState, ServiceMaps, SourceRangeEntry};
use crate::diff::RemovedUdpBackends;
use crate::Error;

/// A kind of map mutation, for fault injection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MapMutation {
    WriteFrontend,
    DeleteFrontend,
    WriteBackendSlot,
    DeleteBackendSlot,
    WriteConfig,
    WriteSourceRange,
    DeleteSourceRange,
}

impl MapMutation {
    /// The map this mutation changes, as its errors name it.
    fn map(self) -> &'static str {
        use switchyard_common::map_names;
        match self {
            Self::WriteFrontend | Self::DeleteFrontend => map_names::FRONTENDS,
            Self::WriteBackendSlot | Self::DeleteBackendSlot => map_names::BACKEND_SLOTS,
            Self::WriteConfig => map_names::CONFIG,
            Self::WriteSourceRange | Self::DeleteSourceRange => map_names::SOURCE_RANGES,
        }
    }
}

/// In-memory `ServiceMaps` for tests and benchmarks, with injected faults.
///
/// A failed mutation changes nothing, as a failed `bpf(BPF_MAP_UPDATE_ELEM)` does.
/// With `watch_for_missing_slots`, every mutation is followed by a check that no
/// frontend points at a missing slot, and any violation is recorded, so a test can
/// prove that no moment of an apply exposed one.
#[derive(Clone, Debug, Default)]
pub struct FakeServiceMaps {
    pub state: MapState,
    pub config: Option<DatapathConfig>,
    /// Mutations attempted so far (successful or not), counting from zero.
    pub mutations_attempted: u64,
    /// Mutations that succeeded.
    pub mutations_applied: u64,
    /// Indexes (in `mutations_attempted` order) of mutations that fail.
    pub failing_mutations: std::collections::BTreeSet<u64>,
    /// Kinds of mutation that always fail.
    pub failing_kinds: std::collections::BTreeSet<MapMutation>,
    /// Frontends whose writes always fail (an entry the kernel keeps refusing).
    pub failing_frontends: std::collections::BTreeSet<FrontendKey>,
    /// Reads fail (as an unreadable pinned map would).
    pub failing_reads: bool,
    /// Capacities of the frontends and backend slots maps: writing a new key into
    /// a full map fails, as with a BPF hash map.
    pub frontend_capacity: Option<usize>,
    pub backend_slot_capacity: Option<usize>,
    pub watch_for_missing_slots: bool,
    /// Frontends seen pointing at missing slots, with the mutation index after
    /// which they were seen.
    pub missing_slot_violations: Vec<(u64, FrontendKey)>,
    /// Every `release_udp_flows` call that succeeded, in order (not counted as
    /// mutations: it changes no Service entry).
    pub udp_flow_releases: Vec<RemovedUdpBackends>,
    /// `release_udp_flows` fails (as an unreadable conntrack map would).
    pub failing_udp_flow_releases: bool,
}

impl FakeServiceMaps {
    pub fn with_state(state: MapState) -> Self {
        Self {
            state,
            ..Self::default()
        }
    }

    /// Counts the attempt and decides whether it fails.
    fn attempt(&mut self, mutation: MapMutation) -> Result<(), Error> {
        let map = mutation.map();
        let index = self.mutations_attempted;
        self.mutations_attempted += 1;
        if self.failing_mutations.contains(&index) || self.failing_kinds.contains(&mutation) {
            return Err(Error::UpdateMap {
                map,
                source: format!("injected fault in mutation {index} ({mutation:?})").into(),
            });
        }
        Ok(())
    }

    fn applied(&mut self) {
        self.mutations_applied += 1;
        if self.watch_for_missing_slots {
            let index = self.mutations_attempted - 1;
            for key in self.state.frontends_with_missing_slots() {
                self.missing_slot_violations.push((index, key));
            }
        }
    }

    /// Writes `key` into the entries `select` picks, a map of `capacity`
    /// named `map`: a new key into a full BPF hash map fails.
    fn write<K: Ord + Copy, V: Copy>(
        &mut self,
        select: impl FnOnce(&mut MapState) -> &mut BTreeMap<K, V>,
        capacity: Option<usize>,
        map: &'static str,
        key: &K,
        value: &V,
    ) -> Result<(), Error> {
        let entries = select(&mut self.state);
        if capacity.is_some_and(|capacity| !entries.contains_key(key) && entries.len() >= capacity)
        {
            return Err(Error::UpdateMap {
                map,
                source: "map is full".into(),
            });
        }
        entries.insert(*key, *value);
        self.applied();
        Ok(())
    }

    /// A delete of `key` from the map `select` picks, as the kernel does it: a
    /// missing key is no error.
    fn delete<K: Ord, V>(
        &mut self,
        mutation: MapMutation,
        select: impl FnOnce(&mut MapState) -> &mut BTreeMap<K, V>,
        key: &K,
    ) -> Result<(), Error> {
        self.attempt(mutation)?;
        select(&mut self.state).remove(key);
        self.applied();
        Ok(())
    }

    fn read_check(&self, map: &'static str) -> Result<(), Error> {
        if self.failing_reads {
            return Err(Error::ReadMap {
                map,
                source: "injected read fault".into(),
            });
        }
        Ok(())
    }
}

impl ServiceMaps for FakeServiceMaps {
    fn frontends(&self) -> Result<BTreeMap<FrontendKey, FrontendValue>, Error> {
        self.read_check(switchyard_common::map_names::FRONTENDS)?;
        Ok(self.state.frontends.clone())
    }

    fn backend_slots(&self) -> Result<BTreeMap<BackendSlotKey, BackendValue>, Error> {
        self.read_check(switchyard_common::map_names::BACKEND_SLOTS)?;
        Ok(self.state.backend_slots.clone())
    }

    fn write_frontend(&mut self, key: &FrontendKey, value: &FrontendValue) -> Result<(), Error> {
        let map = switchyard_common::map_names::FRONTENDS;
        self.attempt(MapMutation::WriteFrontend)?;
        if self.failing_frontends.contains(key) {
            return Err(Error::UpdateMap {
                map,
                source: "injected fault: this frontend always fails".into(),
            });
        }
        let capacity = self.frontend_capacity;
        self.write(|state| &mut state.frontends, capacity, map, key, value)
    }

    fn delete_frontend(&mut self, key: &FrontendKey) -> Result<(), Error> {
        self.delete(
            MapMutation::DeleteFrontend,
            |state| &mut state.frontends,
            key,
        )
    }

    fn write_backend_slot(
        &mut self,
        key: &BackendSlotKey,
        value: &BackendValue,
    ) -> Result<(), Error> {
        let map = switchyard_common::map_names::BACKEND_SLOTS;
        self.attempt(MapMutation::WriteBackendSlot)?;
        let capacity = self.backend_slot_capacity;
        self.write(|state| &mut state.backend_slots, capacity, map, key, value)
    }

    fn delete_backend_slot(&mut self, key: &BackendSlotKey) -> Result<(), Error> {
        self.delete(
            MapMutation::DeleteBackendSlot,
            |state| &mut state.backend_slots,
            key,
        )
    }

    fn config(&self) -> Result<Option<DatapathConfig>, Error> {
        self.read_check(switchyard_common::map_names::CONFIG)?;
        Ok(self.config)
    }

    fn source_ranges(&self) -> Result<BTreeSet<SourceRangeEntry>, Error> {
        self.read_check(switchyard_common::map_names::SOURCE_RANGES)?;
        Ok(self.state.source_ranges.clone())
    }

    fn write_source_range(&mut self, entry: &SourceRangeEntry) -> Result<(), Error> {
        self.attempt(MapMutation::WriteSourceRange)?;
        self.state.source_ranges.insert(*entry);
        self.applied();
        Ok(())
    }

    fn delete_source_range(&mut self, entry: &SourceRangeEntry) -> Result<(), Error> {
        self.attempt(MapMutation::DeleteSourceRange)?;
        self.state.source_ranges.remove(entry);
        self.applied();
        Ok(())
    }

    /// Counts one deleted entry per (frontend, backend) pair: the fake holds no flows.
    fn release_udp_flows(&mut self, removed: &RemovedUdpBackends) -> Result<usize, Error> {
        if self.failing_udp_flow_releases {
            return Err(Error::UpdateMap {
                map: switchyard_common::map_names::CONNTRACK,
                source: "injected fault in releasing UDP flows".into(),
            });
        }
        self.udp_flow_releases.push(removed.clone());
        Ok(removed
            .by_frontend
            .values()
            .map(|backends| backends.len())
            .sum())
    }

    fn write_config(&mut self, config: &DatapathConfig) -> Result<(), Error> {
        self.attempt(MapMutation::WriteConfig)?;
        self.config = Some(*config);
        self.applied();
        Ok(())
    }
}
