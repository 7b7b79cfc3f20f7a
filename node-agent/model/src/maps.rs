//! What the syncer needs from the BPF maps, behind a trait so that the pure parts
//! of the agent are tested against an in-memory fake (with injected faults), and
//! the real implementation (`loader`) stays a thin layer over aya.

use std::collections::{BTreeMap, BTreeSet};

use switchyard_common::{
    Address, BackendSlotKey, BackendValue, DatapathConfig, FrontendKey, FrontendValue,
};

use crate::diff::RemovedUdpBackends;
use crate::Error;

/// The Service maps as the syncer sees them.
pub trait ServiceMaps {
    /// Every frontend entry currently in the map (used to restore state at start).
    fn frontends(&self) -> Result<BTreeMap<FrontendKey, FrontendValue>, Error>;
    /// Every backend slot entry currently in the map.
    fn backend_slots(&self) -> Result<BTreeMap<BackendSlotKey, BackendValue>, Error>;
    fn write_frontend(&mut self, key: &FrontendKey, value: &FrontendValue) -> Result<(), Error>;
    fn delete_frontend(&mut self, key: &FrontendKey) -> Result<(), Error>;
    fn write_backend_slot(
        &mut self,
        key: &BackendSlotKey,
        value: &BackendValue,
    ) -> Result<(), Error>;
    fn delete_backend_slot(&mut self, key: &BackendSlotKey) -> Result<(), Error>;
    /// The datapath configuration entry, if it has been written.
    fn config(&self) -> Result<Option<DatapathConfig>, Error>;
    fn write_config(&mut self, config: &DatapathConfig) -> Result<(), Error>;
    /// Every source range entry currently in the map.
    fn source_ranges(&self) -> Result<BTreeSet<SourceRangeEntry>, Error>;
    fn write_source_range(&mut self, entry: &SourceRangeEntry) -> Result<(), Error>;
    fn delete_source_range(&mut self, entry: &SourceRangeEntry) -> Result<(), Error>;
    /// Deletes the UDP flows (both conntrack entries of each) that `removed`
    /// names, so each flow's next datagram is balanced again (or refused);
    /// returns how many entries it deleted.
    fn release_udp_flows(&mut self, removed: &RemovedUdpBackends) -> Result<usize, Error>;
}

/// A source address prefix in the maps' 16-byte form: `length` counts bits of
/// the 128-bit address, so an IPv4 `/n` (IPv4-mapped) is `96 + n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SourcePrefix {
    /// Bits past `length` are zero.
    pub address: Address,
    pub length: u8,
}

/// One entry of the source ranges map (`loadBalancerSourceRanges`): `frontend`
/// admits new flows from `prefix`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SourceRangeEntry {
    pub frontend: FrontendKey,
    pub prefix: SourcePrefix,
}

/// The Service entries of the maps, as last read or written: what the syncer
/// diffs the desired state against.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MapState {
    pub frontends: BTreeMap<FrontendKey, FrontendValue>,
    pub backend_slots: BTreeMap<BackendSlotKey, BackendValue>,
    /// Sorted by frontend first, so one frontend's entries are a range.
    pub source_ranges: BTreeSet<SourceRangeEntry>,
}

impl MapState {
    /// Reads the current entries: at start (restoring what the previous process
    /// left), and after a failed apply (when the tracked state may be uncertain).
    pub fn restore(maps: &impl ServiceMaps) -> Result<Self, Error> {
        Ok(Self {
            frontends: maps.frontends()?,
            backend_slots: maps.backend_slots()?,
            source_ranges: maps.source_ranges()?,
        })
    }

    /// The source range entries of `frontend`.
    pub fn source_ranges_of(
        &self,
        frontend: &FrontendKey,
    ) -> impl Iterator<Item = &SourceRangeEntry> + '_ {
        let first = SourceRangeEntry {
            frontend: *frontend,
            prefix: SourcePrefix {
                address: [0; 16],
                length: 0,
            },
        };
        let last = SourceRangeEntry {
            frontend: *frontend,
            prefix: SourcePrefix {
                address: [0xff; 16],
                length: u8::MAX,
            },
        };
        self.source_ranges.range(first..=last)
    }

    /// Frontends whose slots `0..backend_count` are not all present: the state the
    /// apply order exists to rule out (a program would pick a missing slot).
    pub fn frontends_with_missing_slots(&self) -> Vec<FrontendKey> {
        self.frontends
            .iter()
            .filter(|(_, value)| !self.has_slots_of(value))
            .map(|(key, _)| *key)
            .collect()
    }

    /// Whether every slot `value` can pick exists.
    pub fn has_slots_of(&self, value: &FrontendValue) -> bool {
        (0..value.backend_count).all(|ordinal| {
            self.backend_slots.contains_key(&BackendSlotKey {
                group_id: value.group_id,
                ordinal,
            })
        })
    }
}

#[cfg(feature = "testing")]
mod fake;
#[cfg(feature = "testing")]
pub use fake::{FakeServiceMaps, MapMutation};
