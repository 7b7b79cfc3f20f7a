//! Partial syncs: when only some Services changed, plan only their entries.
//!
//! A full sync recomputes, lays out and diffs every Service (about 100 ms for
//! 10,000 Services); a one-Service change must not cost that (kube-proxy's
//! partial syncs, KEP-3453). The index below remembers, from the last successful
//! sync, each Service's share of the desired state, which Services claim each
//! frontend address (the first by name wins, as in [`crate::desired::merge`]),
//! each live group's id and how many winning frontends use it. A change of some
//! Services then touches only:
//! - the frontend keys those Services had or have,
//! - the groups of those Services, and the groups whose winning frontends changed
//!   because of them (another Service taking over or giving up an address).
//!
//! The plan has the same four phases as a full one, restricted to these keys and
//! groups, so the same argument rules out a frontend on a missing slot: slots
//! are only deleted from touched groups, every frontend of a touched group is a
//! touched key (a group's frontends belong to its own Service, and a group that
//! gains or loses winning frontends is touched), and the deletes come last.
//!
//! The result equals what a full sync would keep: a full sync afterwards writes
//! nothing (a property test checks this).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use switchyard_common::{BackendSlotKey, FrontendKey, FrontendValue};

use crate::desired::layout::{first_free_id, place_backends, stable_group_hash};
use crate::desired::{DesiredFrontend, GroupKey, ServiceDesired};
use crate::diff::Plan;
use crate::maps::{MapState, SourceRangeEntry};
use crate::model::ServiceName;

#[derive(Clone, Debug, Default)]
pub struct Index {
    services: HashMap<ServiceName, ServiceDesired>,
    /// What the Services claiming each frontend key want there, sorted by
    /// Service (a frontend's group names its Service); the first wins. A
    /// vector, as nearly every key has a single claimant.
    claims: HashMap<FrontendKey, Vec<DesiredFrontend>>,
    /// Ids of live groups (used by at least one winning frontend).
    group_ids: HashMap<GroupKey, u32>,
    /// Ids in use in the maps or assigned: never handed to a new group.
    used_ids: HashSet<u32>,
    /// Winning frontends per live group.
    references: HashMap<GroupKey, usize>,
}

impl Index {
    /// The index of a state a full sync just applied: `services` are every
    /// Service's share, `state` the entries now in the maps.
    pub fn build(services: BTreeMap<ServiceName, ServiceDesired>, state: &MapState) -> Self {
        let mut index = Index::default();
        for (name, desired) in services {
            for (key, frontend) in &desired.frontends {
                index.claim(*key, frontend.clone());
            }
            index.services.insert(name, desired);
        }
        for (key, claimants) in &index.claims {
            let Some(winner) = claimants.first() else {
                continue;
            };
            if let Some(value) = state.frontends.get(key) {
                index.group_ids.insert(winner.group.clone(), value.group_id);
            }
            *index.references.entry(winner.group.clone()).or_default() += 1;
        }
        index
            .used_ids
            .extend(state.frontends.values().map(|value| value.group_id));
        index
            .used_ids
            .extend(state.backend_slots.keys().map(|key| key.group_id));
        index
    }

    /// The Service whose frontend wins `key`, as far as the index knows.
    pub fn owner(&self, key: &FrontendKey) -> Option<ServiceName> {
        self.winner(key)
            .map(|frontend| frontend.group.service.clone())
    }

    fn winner(&self, key: &FrontendKey) -> Option<&DesiredFrontend> {
        self.claims.get(key).and_then(|claimants| claimants.first())
    }

    /// Records (or replaces) the claim of `frontend`'s Service on `key`.
    fn claim(&mut self, key: FrontendKey, frontend: DesiredFrontend) {
        let claimants = self.claims.entry(key).or_default();
        match claimants
            .binary_search_by(|claimant| claimant.group.service.cmp(&frontend.group.service))
        {
            Ok(position) => claimants[position] = frontend,
            Err(position) => claimants.insert(position, frontend),
        }
    }

    fn unclaim(&mut self, key: &FrontendKey, service: &ServiceName) {
        if let Some(claimants) = self.claims.get_mut(key) {
            claimants.retain(|claimant| &claimant.group.service != service);
            if claimants.is_empty() {
                self.claims.remove(key);
            }
        }
    }

    fn backends_of(&self, group: &GroupKey) -> Option<&Vec<switchyard_common::BackendValue>> {
        self.services
            .get(&group.service)
            .and_then(|service| service.backends_of(group))
    }

    /// Records `changes` (a Service's new share, or `None` when it is gone) and
    /// returns the plan that takes `current` to the new desired state. Ids of
    /// groups that die are released by [`Index::applied`] once the plan is applied.
    pub fn change(
        &mut self,
        changes: Vec<(ServiceName, Option<ServiceDesired>)>,
        current: &MapState,
    ) -> (Plan, Vec<u32>) {
        let mut touched_keys: BTreeSet<FrontendKey> = BTreeSet::new();
        let mut touched_groups: BTreeSet<GroupKey> = BTreeSet::new();
        for (name, new) in &changes {
            if let Some(old) = self.services.get(name) {
                touched_keys.extend(old.frontend_keys().copied());
                touched_groups.extend(old.group_keys().cloned());
            }
            if let Some(new) = new {
                touched_keys.extend(new.frontend_keys().copied());
                touched_groups.extend(new.group_keys().cloned());
            }
        }
        let old_winners: HashMap<FrontendKey, GroupKey> = touched_keys
            .iter()
            .filter_map(|key| Some((*key, self.winner(key)?.group.clone())))
            .collect();

        for (name, new) in changes {
            if let Some(old) = self.services.remove(&name) {
                for key in old.frontend_keys() {
                    self.unclaim(key, &name);
                }
            }
            if let Some(new) = new {
                for (key, frontend) in &new.frontends {
                    self.claim(*key, frontend.clone());
                }
                self.services.insert(name, new);
            }
        }

        for key in &touched_keys {
            let new_winner = self.winner(key).map(|frontend| frontend.group.clone());
            let old_winner = old_winners.get(key);
            if old_winner == new_winner.as_ref() {
                continue;
            }
            if let Some(old) = old_winner {
                if let Some(count) = self.references.get_mut(old) {
                    *count = count.saturating_sub(1);
                }
                touched_groups.insert(old.clone());
            }
            if let Some(new) = new_winner {
                *self.references.entry(new.clone()).or_default() += 1;
                touched_groups.insert(new);
            }
        }

        let mut plan = Plan::default();
        let mut released = Vec::new();
        for group in &touched_groups {
            let backends = self.backends_of(group).cloned();
            let live = self.references.get(group).copied().unwrap_or(0) > 0 && backends.is_some();
            let old_id = self.group_ids.get(group).copied();
            let mut desired_slots = BTreeSet::new();
            if let (true, Some(backends)) = (live, backends) {
                let id = match old_id {
                    Some(id) => id,
                    None => {
                        let id = first_free_id(stable_group_hash(group), &self.used_ids);
                        self.used_ids.insert(id);
                        self.group_ids.insert(group.clone(), id);
                        id
                    }
                };
                for (ordinal, backend) in (0u32..).zip(place_backends(id, &backends, current)) {
                    let key = BackendSlotKey {
                        group_id: id,
                        ordinal,
                    };
                    desired_slots.insert(key);
                    if current.backend_slots.get(&key) != Some(&backend) {
                        plan.backend_slot_writes.push((key, backend));
                    }
                }
            } else {
                self.references.remove(group);
                if let Some(id) = self.group_ids.remove(group) {
                    released.push(id);
                }
            }
            if let Some(id) = old_id {
                let first = BackendSlotKey {
                    group_id: id,
                    ordinal: 0,
                };
                let last = BackendSlotKey {
                    group_id: id,
                    ordinal: u32::MAX,
                };
                plan.unused_backend_slots.extend(
                    current
                        .backend_slots
                        .range(first..=last)
                        .map(|(key, _)| *key)
                        .filter(|key| !desired_slots.contains(key)),
                );
            }
        }

        for key in &touched_keys {
            let desired = self.winner(key).and_then(|frontend| {
                let group_id = *self.group_ids.get(&frontend.group)?;
                let backend_count = self.backends_of(&frontend.group)?.len();
                Some(FrontendValue {
                    group_id,
                    backend_count: u32::try_from(backend_count).unwrap_or(u32::MAX),
                    flags: frontend.flags,
                    affinity_timeout_seconds: frontend.affinity_timeout_seconds,
                })
            });
            // The winner's source ranges, where its frontend is written, are
            // written before it and pruned after it, as in a full plan (`diff`).
            let desired_ranges: BTreeSet<SourceRangeEntry> = match (&desired, self.winner(key)) {
                (Some(_), Some(frontend)) => frontend
                    .source_ranges
                    .iter()
                    .map(|prefix| SourceRangeEntry {
                        frontend: *key,
                        prefix: *prefix,
                    })
                    .collect(),
                _ => BTreeSet::new(),
            };
            let current_ranges: BTreeSet<SourceRangeEntry> =
                current.source_ranges_of(key).copied().collect();
            plan.source_range_writes
                .extend(desired_ranges.difference(&current_ranges).copied());
            plan.stale_source_ranges
                .extend(current_ranges.difference(&desired_ranges).copied());
            match (desired, current.frontends.get(key)) {
                (Some(value), Some(existing)) if value == *existing => {}
                (Some(value), _) => plan.frontend_writes.push((*key, value)),
                (None, Some(_)) => plan.stale_frontends.push(*key),
                (None, None) => {}
            }
        }
        (plan, released)
    }

    /// The plan of the last [`Index::change`] was applied: the released ids no
    /// longer appear in the maps.
    pub fn applied(&mut self, released: &[u32]) {
        for id in released {
            self.used_ids.remove(id);
        }
    }
}
