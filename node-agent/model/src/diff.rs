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

use std::collections::{BTreeMap, BTreeSet};

use switchyard_common::{
    Address, BackendSlotKey, BackendValue, FrontendKey, FrontendValue, PROTOCOL_UDP,
};

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

/// A frontend's or a backend's address and port (network byte order), as a
/// UDP flow's conntrack entries name them.
pub type AddressPort = (Address, u16);

/// The UDP backends that left each UDP frontend address and port (every scope
/// of it counted together) in one apply: the flows still pointing at them are
/// deleted, so their next datagram is balanced again to a live backend, or
/// refused if none is left (kube-proxy deletes the conntrack entries NATed to a
/// removed UDP endpoint, `pkg/proxy/conntrack`). TCP is not here: kube-proxy
/// leaves TCP connections to a removed endpoint to time out or be reset.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RemovedUdpBackends {
    pub by_frontend: BTreeMap<AddressPort, BTreeSet<AddressPort>>,
}

impl RemovedUdpBackends {
    pub fn is_empty(&self) -> bool {
        self.by_frontend.is_empty()
    }

    /// Whether a flow to `frontend` that was sent to `backend` must be deleted.
    pub fn contains(&self, frontend: &AddressPort, backend: &AddressPort) -> bool {
        self.by_frontend
            .get(frontend)
            .is_some_and(|backends| backends.contains(backend))
    }

    /// Adds `other`'s pairs (a release that failed, retried with the next one).
    pub fn merge(&mut self, other: RemovedUdpBackends) {
        for (frontend, backends) in other.by_frontend {
            self.by_frontend
                .entry(frontend)
                .or_default()
                .extend(backends);
        }
    }

    /// Keeps only the pairs whose backend `state` does not serve at the frontend
    /// again: a backend that came back before a failed release was retried keeps
    /// its flows.
    pub fn still_removed_in(mut self, state: &MapState) -> Self {
        let frontends: BTreeSet<AddressPort> = self.by_frontend.keys().copied().collect();
        let served = udp_backends_of(state, &frontends);
        for (frontend, backends) in &mut self.by_frontend {
            if let Some(served) = served.get(frontend) {
                backends.retain(|backend| !served.contains(backend));
            }
        }
        self.by_frontend.retain(|_, backends| !backends.is_empty());
        self
    }
}

/// The UDP frontend addresses and ports whose backends `plan` may change, with
/// their backends in `current` (before the apply): frontends it deletes or
/// rewrites, and those whose group's slots it writes or deletes. Empty (and no
/// walk of the frontends) when the plan changes neither UDP frontends nor slots.
pub fn udp_backends_before(
    plan: &Plan,
    current: &MapState,
) -> BTreeMap<AddressPort, BTreeSet<AddressPort>> {
    let mut frontends: BTreeSet<AddressPort> = plan
        .stale_frontends
        .iter()
        .chain(plan.frontend_writes.iter().map(|(key, _)| key))
        .filter(|key| key.protocol == PROTOCOL_UDP)
        .map(|key| (key.address, key.port_big_endian))
        .collect();
    let groups: BTreeSet<u32> = plan
        .backend_slot_writes
        .iter()
        .map(|(key, _)| key.group_id)
        .chain(plan.unused_backend_slots.iter().map(|key| key.group_id))
        .collect();
    if !groups.is_empty() {
        frontends.extend(
            current
                .frontends
                .iter()
                .filter(|(key, value)| {
                    key.protocol == PROTOCOL_UDP && groups.contains(&value.group_id)
                })
                .map(|(key, _)| (key.address, key.port_big_endian)),
        );
    }
    if frontends.is_empty() {
        return BTreeMap::new();
    }
    udp_backends_of(current, &frontends)
}

/// The backends `state` gives each of `frontends` (UDP, every scope together;
/// a frontend without any is absent).
pub fn udp_backends_of(
    state: &MapState,
    frontends: &BTreeSet<AddressPort>,
) -> BTreeMap<AddressPort, BTreeSet<AddressPort>> {
    let mut backends: BTreeMap<AddressPort, BTreeSet<AddressPort>> = BTreeMap::new();
    for (key, value) in &state.frontends {
        let frontend = (key.address, key.port_big_endian);
        if key.protocol != PROTOCOL_UDP || !frontends.contains(&frontend) {
            continue;
        }
        let served = backends.entry(frontend).or_default();
        for ordinal in 0..value.backend_count {
            let slot = BackendSlotKey {
                group_id: value.group_id,
                ordinal,
            };
            if let Some(backend) = state.backend_slots.get(&slot) {
                served.insert((backend.address, backend.port_big_endian));
            }
        }
    }
    backends
}

/// The backends each frontend of `before` (from [`udp_backends_before`]) no
/// longer has in `after` (the state the apply left), a frontend `after` lacks
/// losing all of them (a deleted Service: its flows go too, as kube-proxy does
/// since kubernetes#141371).
pub fn removed_udp_backends(
    before: BTreeMap<AddressPort, BTreeSet<AddressPort>>,
    after: &MapState,
) -> RemovedUdpBackends {
    if before.is_empty() {
        return RemovedUdpBackends::default();
    }
    let frontends: BTreeSet<AddressPort> = before.keys().copied().collect();
    let now = udp_backends_of(after, &frontends);
    let mut removed = RemovedUdpBackends::default();
    for (frontend, mut backends) in before {
        if let Some(served) = now.get(&frontend) {
            backends.retain(|backend| !served.contains(backend));
        }
        if !backends.is_empty() {
            removed.by_frontend.insert(frontend, backends);
        }
    }
    removed
}
