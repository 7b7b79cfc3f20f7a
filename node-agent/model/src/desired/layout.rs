//! Numbering groups and placing backends in slots, against the current map state.
//!
//! Group ids are inherited, not recomputed: a desired group takes the id that
//! the current entries of its own frontends already use (restored from the pinned
//! maps after a restart, or tracked since the last apply). Only a group none of
//! whose frontends exists yet gets a new id, derived from a stable hash of its
//! key and probed past every id the current maps still use, so a new group never
//! shares slots with entries that are about to be replaced or pruned. The hash is
//! FNV-1a over the key's fields, which does not change between builds or
//! processes, so even groups that lost every frontend come back with their old id
//! when no collision moved them.
//!
//! Slots are placed to move as little as possible: a backend that already sits
//! in a slot below the new backend count stays there, and the remaining backends
//! fill the free slots in sorted order. Slots stay dense (`0..backend_count`), as
//! the programs pick `random % backend_count`.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap, HashSet};

use switchyard_common::{BackendSlotKey, BackendValue, FrontendValue};

use super::{DesiredServices, EndpointView, GroupKey};
use crate::maps::{MapState, SourceRangeEntry};
use crate::model::{AddressFamily, Protocol};

/// FNV-1a (32-bit) of a group key's fields, with a separator between strings so
/// that `("ab", "c")` and `("a", "bc")` differ.
pub fn stable_group_hash(key: &GroupKey) -> u32 {
    const OFFSET_BASIS: u32 = 0x811c_9dc5;
    const PRIME: u32 = 0x0100_0193;
    let mut hash = OFFSET_BASIS;
    let mut feed = |bytes: &[u8]| {
        for byte in bytes {
            hash ^= u32::from(*byte);
            hash = hash.wrapping_mul(PRIME);
        }
    };
    feed(key.service.namespace.as_bytes());
    feed(&[0xff]);
    feed(key.service.name.as_bytes());
    feed(&[0xff]);
    feed(key.port_name.as_bytes());
    feed(&[0xff]);
    feed(&[
        match key.protocol {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
        },
        match key.family {
            AddressFamily::Ipv4 => 4,
            AddressFamily::Ipv6 => 6,
        },
        match key.view {
            EndpointView::All => 0,
            EndpointView::Local => 1,
        },
    ]);
    hash
}

/// The first id from `preferred` on (wrapping, skipping 0, which is never used so
/// that a zeroed value is never mistaken for a group) that is not in `taken`.
pub fn first_free_id(preferred: u32, taken: &HashSet<u32>) -> u32 {
    let mut candidate = preferred.max(1);
    // `taken` holds at most a few hundred thousand ids, far fewer than 2^32, so
    // the probe ends.
    while taken.contains(&candidate) {
        candidate = candidate.checked_add(1).unwrap_or(1);
    }
    candidate
}

/// Group ids for every desired group (see the module documentation).
pub fn assign_group_ids<'a>(
    desired: &'a DesiredServices,
    current: &MapState,
) -> BTreeMap<&'a GroupKey, u32> {
    // Votes: how many of a group's desired frontends currently use each id.
    let mut votes: HashMap<(&GroupKey, u32), u32> = HashMap::new();
    for (key, frontend) in &desired.frontends {
        if let Some(value) = current.frontends.get(key) {
            *votes.entry((&frontend.group, value.group_id)).or_default() += 1;
        }
    }
    let mut ranked: Vec<(Reverse<u32>, &GroupKey, u32)> = votes
        .into_iter()
        .map(|((group, id), count)| (Reverse(count), group, id))
        .collect();
    // Most votes first; ties by key and id, so the outcome never depends on
    // hash-map iteration order.
    ranked.sort();

    let mut assigned: BTreeMap<&GroupKey, u32> = BTreeMap::new();
    let mut taken: HashSet<u32> = HashSet::new();
    for (_, group, id) in ranked {
        if id == 0 || assigned.contains_key(group) || taken.contains(&id) {
            continue;
        }
        if desired.groups.contains_key(group) {
            assigned.insert(group, id);
            taken.insert(id);
        }
    }

    // New groups avoid every id still present in the maps.
    taken.extend(current.frontends.values().map(|value| value.group_id));
    let mut last_group = None;
    for key in current.backend_slots.keys() {
        if last_group != Some(key.group_id) {
            taken.insert(key.group_id);
            last_group = Some(key.group_id);
        }
    }
    for group in desired.groups.keys() {
        if assigned.contains_key(group) {
            continue;
        }
        let id = first_free_id(stable_group_hash(group), &taken);
        taken.insert(id);
        assigned.insert(group, id);
    }
    assigned
}

/// Places `backends` (sorted, distinct) into slots `0..backends.len()`, keeping
/// each backend that already sits in one of those slots of group `group_id`.
pub fn place_backends(
    group_id: u32,
    backends: &[BackendValue],
    current: &MapState,
) -> Vec<BackendValue> {
    let count = backends.len();
    let mut slots: Vec<Option<BackendValue>> = vec![None; count];
    let mut placed = vec![false; count];
    if count > 0 {
        let first = BackendSlotKey {
            group_id,
            ordinal: 0,
        };
        let last = BackendSlotKey {
            group_id,
            ordinal: u32::try_from(count - 1).unwrap_or(u32::MAX),
        };
        for (key, value) in current.backend_slots.range(first..=last) {
            let ordinal = key.ordinal as usize;
            if let Ok(index) = backends.binary_search(value) {
                if !placed[index] {
                    placed[index] = true;
                    slots[ordinal] = Some(*value);
                }
            }
        }
    }
    let mut remaining = backends
        .iter()
        .zip(&placed)
        .filter(|(_, placed)| !**placed)
        .map(|(backend, _)| *backend);
    slots
        .into_iter()
        .map(|slot| match slot {
            Some(backend) => backend,
            // There are exactly as many unplaced backends as empty slots.
            None => remaining.next().unwrap_or(backends[0]),
        })
        .collect()
}

/// The desired map entries: groups numbered and slots placed against `current`.
pub fn lay_out(desired: &DesiredServices, current: &MapState) -> MapState {
    let ids = assign_group_ids(desired, current);
    let mut state = MapState::default();
    let mut counts: HashMap<&GroupKey, u32> = HashMap::with_capacity(desired.groups.len());
    for (group, backends) in &desired.groups {
        let Some(&group_id) = ids.get(group) else {
            continue;
        };
        let slots = place_backends(group_id, backends, current);
        counts.insert(group, u32::try_from(slots.len()).unwrap_or(u32::MAX));
        for (ordinal, backend) in (0u32..).zip(slots) {
            state
                .backend_slots
                .insert(BackendSlotKey { group_id, ordinal }, backend);
        }
    }
    for (key, frontend) in &desired.frontends {
        let (Some(&group_id), Some(&backend_count)) =
            (ids.get(&frontend.group), counts.get(&frontend.group))
        else {
            continue;
        };
        state.frontends.insert(
            *key,
            FrontendValue {
                group_id,
                backend_count,
                flags: frontend.flags,
                affinity_timeout_seconds: frontend.affinity_timeout_seconds,
            },
        );
        state.source_ranges.extend(
            frontend
                .source_ranges
                .iter()
                .map(|prefix| SourceRangeEntry {
                    frontend: *key,
                    prefix: *prefix,
                }),
        );
    }
    state
}
