//! The ordered plan that takes the maps from their current entries to the
//! desired ones.
//!
//! The plan has four phases, applied strictly in this order (Felix's order):
//! 1. delete stale frontends (keys no longer desired),
//! 2. write new and changed backend slots,
//! 3. write new and changed frontends,
//! 4. delete backend slots no longer desired.
//!
//! Why no moment of it exposes a frontend to a missing slot (a program picking
//! `random % backend_count` must always find slot `ordinal` of its group), given
//! that every frontend's slots exist before the apply:
//! - Phase 1 only removes frontends, which removes constraints.
//! - Phase 2 only adds or overwrites slots: no slot disappears, and a frontend
//!   that still has its old value sees every slot it saw before (possibly with a
//!   new backend in it, which is the backend set being rolled out).
//! - Phase 3 writes each desired frontend after phase 2 wrote (or found) every
//!   desired slot `0..backend_count` of its group.
//! - Phase 4 deletes only slots outside the desired state. By then the maps hold
//!   exactly the desired frontends (phase 1 removed the others, phase 3 wrote
//!   these), and every slot they use is desired, so none of them loses a slot.
//!
//! An apply stops at its first failed operation. Phases 1-3 never break the
//! invariant whatever prefix of them ran, and phase 4 starts only once 1-3 all
//! succeeded, so a failed apply leaves a safe state that the next apply, planned
//! from the actual entries, completes.
//!
//! Source range entries (`loadBalancerSourceRanges`) follow the same order:
//! new ones are written in phase 2, before the frontends that need them, and
//! stale ones deleted in phase 4, after the frontends stopped needing them. A
//! missing entry only ever admits fewer sources, and a stale one only lives
//! until phase 4, so a filtered frontend never admits a source outside both its
//! old and its new ranges.
//!
//! Deleting stale frontends first also frees room in the frontends map before new
//! keys are written, and makes a deleted Service stop accepting new flows before
//! anything else changes.

use std::collections::BTreeMap;

use switchyard_common::{BackendSlotKey, BackendValue, FrontendKey, FrontendValue};

use crate::maps::{MapState, SourceRangeEntry};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Phase 1.
    pub stale_frontends: Vec<FrontendKey>,
    /// Phase 2.
    pub backend_slot_writes: Vec<(BackendSlotKey, BackendValue)>,
    /// Phase 2, after the slots.
    pub source_range_writes: Vec<SourceRangeEntry>,
    /// Phase 3.
    pub frontend_writes: Vec<(FrontendKey, FrontendValue)>,
    /// Phase 4.
    pub unused_backend_slots: Vec<BackendSlotKey>,
    /// Phase 4, after the slots.
    pub stale_source_ranges: Vec<SourceRangeEntry>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.operation_count() == 0
    }

    /// Number of map operations the plan makes.
    pub fn operation_count(&self) -> usize {
        self.stale_frontends.len()
            + self.backend_slot_writes.len()
            + self.frontend_writes.len()
            + self.unused_backend_slots.len()
            + self.source_range_writes.len()
            + self.stale_source_ranges.len()
    }
}

/// The plan from `current` to `desired`; pure. Entries already equal are not
/// rewritten, so a restart with unchanged inputs plans nothing.
pub fn plan(current: &MapState, desired: &MapState) -> Plan {
    Plan {
        stale_frontends: keys_not_in(&current.frontends, &desired.frontends),
        backend_slot_writes: entries_to_write(&current.backend_slots, &desired.backend_slots),
        frontend_writes: entries_to_write(&current.frontends, &desired.frontends),
        unused_backend_slots: keys_not_in(&current.backend_slots, &desired.backend_slots),
        source_range_writes: desired
            .source_ranges
            .difference(&current.source_ranges)
            .copied()
            .collect(),
        stale_source_ranges: current
            .source_ranges
            .difference(&desired.source_ranges)
            .copied()
            .collect(),
    }
}

/// The keys of `current` that `desired` does not hold.
fn keys_not_in<K: Ord + Copy, V>(current: &BTreeMap<K, V>, desired: &BTreeMap<K, V>) -> Vec<K> {
    current
        .keys()
        .filter(|key| !desired.contains_key(key))
        .copied()
        .collect()
}

/// The entries of `desired` that `current` lacks or holds with another value.
fn entries_to_write<K: Ord + Copy, V: PartialEq + Copy>(
    current: &BTreeMap<K, V>,
    desired: &BTreeMap<K, V>,
) -> Vec<(K, V)> {
    desired
        .iter()
        .filter(|(key, value)| current.get(key) != Some(value))
        .map(|(key, value)| (*key, *value))
        .collect()
}
