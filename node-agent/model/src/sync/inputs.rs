//! The inputs of the desired state (Services, EndpointSlices, the node's view),
//! indexed by Service, with the Services changed since the last successful sync:
//! what lets both agent modes plan only what changed.
//!
//! A Service's share of the desired state ([`service_desired`]) depends only on
//! the Service, the EndpointSlices labelled with its name and the node's view;
//! Services interact only where two claim one frontend address, which the
//! syncer's partial-sync index settles. So a change marks Services dirty:
//! - a Service added, changed or deleted: that Service;
//! - an EndpointSlice added, changed or deleted: the Service it belongs to, and
//!   the one it belonged to before when its `kubernetes.io/service-name` label
//!   moved it (both shares change);
//! - a relist: every Service whose object or slices differ from the last list;
//! - the node's view (its addresses serve every NodePort, its name decides
//!   which endpoints are local): everything, as a full sync.
//!
//! [`SyncInputs::sync`] then recomputes only the dirty Services' shares and
//! hands them to [`super::PartialSync::sync_changes`]; it falls back to a full sync when
//! the node changed, when the syncer has no index (the first sync after start,
//! from the restored pinned state) or lost it (a failed apply), and when the
//! caller asks for the periodic full resync. Dirty marks are cleared only by a
//! successful sync, so a change that arrives while an apply fails is never lost.
//! Pure: no I/O beyond the maps handed in.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::desired::no_local_endpoints::{no_local_endpoints, NoLocalEndpoints};
use crate::desired::{masquerades_remote_backends, service_desired, NodeView, ServiceDesired};
use crate::gate::GateOpen;
use crate::maps::ServiceMaps;
use crate::model::{
    AddressFamily, EndpointSliceModel, ServedFamilies, ServiceModel, ServiceName, TrafficPolicy,
};
use crate::Error;

use super::{ApplyReport, Syncer};

/// How a sync was done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncKind {
    /// Only these many changed Services were recomputed and planned.
    Partial { services: usize },
    /// Every Service was recomputed and diffed against the tracked entries.
    Full,
    /// A full sync that re-read the maps first (the periodic safety net).
    Resync,
}

impl SyncKind {
    pub fn name(self) -> &'static str {
        match self {
            SyncKind::Partial { .. } => "partial",
            SyncKind::Full => "full",
            SyncKind::Resync => "resync",
        }
    }
}

/// What [`SyncInputs::sync`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncOutcome {
    pub kind: SyncKind,
    pub report: ApplyReport,
    /// Service ports with a `Local` policy and no local endpoint once this sync is done,
    /// in IPv4, the family the datapath serves ([`crate::desired::no_local_endpoints`]).
    pub no_local_endpoints: NoLocalEndpoints,
}

#[derive(Clone, Debug, Default)]
pub struct SyncInputs {
    services: BTreeMap<ServiceName, ServiceModel>,
    /// Every EndpointSlice by its own namespace and name.
    slices: HashMap<ServiceName, EndpointSliceModel>,
    /// Names of the slices that belong to each Service (by their label; the
    /// Service need not exist), sorted. A vector: most Services have one slice,
    /// and a set would allocate room for eleven.
    slices_of: HashMap<ServiceName, Vec<ServiceName>>,
    node: Option<NodeView>,
    /// Services whose share may differ from what the maps hold.
    dirty: BTreeSet<ServiceName>,
    /// The node's view changed since the last successful sync.
    node_changed: bool,
    /// Services with a frontend the agent's masquerade rule serves: kept with
    /// every change so that asking costs nothing at 30,000 Services.
    masquerading: BTreeSet<ServiceName>,
    /// Each synced Service's no-local-endpoints count, where it is not zero: updated
    /// with the Services a successful sync recomputed, so the total describes the
    /// synced state, as kube-proxy sets its gauge at the end of a sync.
    no_local: BTreeMap<ServiceName, NoLocalEndpoints>,
    /// The families the datapath serves: Services are kept restricted to them
    /// ([`ServiceModel::restricted_to`]), so nothing downstream sees the others.
    served_families: ServedFamilies,
}

impl SyncInputs {
    /// Inputs that keep only the `served` families of every Service; set once,
    /// before any Service arrives (those kept are already restricted).
    pub fn serving(served: ServedFamilies) -> Self {
        Self {
            served_families: served,
            ..Self::default()
        }
    }

    pub fn served_families(&self) -> ServedFamilies {
        self.served_families
    }

    /// Whether anything changed since the last successful sync.
    pub fn has_changes(&self) -> bool {
        self.node_changed || !self.dirty.is_empty()
    }

    /// Services changed since the last successful sync (for tests and logs).
    pub fn dirty_services(&self) -> &BTreeSet<ServiceName> {
        &self.dirty
    }

    /// Whether some Service needs the agent's masquerade rule
    /// ([`masquerades_remote_backends`]).
    pub fn masquerade_needed(&self) -> bool {
        !self.masquerading.is_empty()
    }

    pub fn node(&self) -> Option<&NodeView> {
        self.node.as_ref()
    }

    pub fn service_count(&self) -> usize {
        self.services.len()
    }

    pub fn slice_count(&self) -> usize {
        self.slices.len()
    }

    pub fn services(&self) -> impl Iterator<Item = &ServiceModel> {
        self.services.values()
    }

    /// The EndpointSlices of one Service, in slice name order.
    pub fn slices_of(&self, service: &ServiceName) -> Vec<&EndpointSliceModel> {
        self.slices_of
            .get(service)
            .into_iter()
            .flatten()
            .filter_map(|slice_name| self.slices.get(slice_name))
            .collect()
    }

    /// Records the node's view; returns whether it changed.
    pub fn set_node(&mut self, node: NodeView) -> bool {
        if self.node.as_ref() == Some(&node) {
            return false;
        }
        self.node = Some(node);
        self.node_changed = true;
        true
    }

    /// A Service was added or changed; returns whether it differs.
    pub fn upsert_service(&mut self, service: ServiceModel) -> bool {
        // A Service of no served family is, for the datapath, one it does not use.
        let Some(service) = service.restricted_to(self.served_families) else {
            return self.remove_service(&service.name);
        };
        if self.services.get(&service.name) == Some(&service) {
            return false;
        }
        self.dirty.insert(service.name.clone());
        if masquerades_remote_backends(&service) {
            self.masquerading.insert(service.name.clone());
        } else {
            self.masquerading.remove(&service.name);
        }
        self.services.insert(service.name.clone(), service);
        true
    }

    /// A Service was deleted (or became one the datapath does not use).
    pub fn remove_service(&mut self, name: &ServiceName) -> bool {
        if self.services.remove(name).is_none() {
            return false;
        }
        self.masquerading.remove(name);
        self.dirty.insert(name.clone());
        true
    }

    /// A complete list of Services: everything not in it is gone.
    pub fn replace_services(&mut self, services: impl IntoIterator<Item = ServiceModel>) -> bool {
        let listed: BTreeMap<ServiceName, ServiceModel> = services
            .into_iter()
            .map(|service| (service.name.clone(), service))
            .collect();
        let present: Vec<ServiceName> = self.services.keys().cloned().collect();
        self.replace(present, listed, Self::remove_service, Self::upsert_service)
    }

    /// Makes a complete list (`listed`, by name) of what `present` names:
    /// removes what is not listed, upserts the rest; returns whether
    /// anything changed.
    fn replace<V>(
        &mut self,
        present: Vec<ServiceName>,
        listed: impl IntoIterator<Item = (ServiceName, V)>,
        remove: fn(&mut Self, &ServiceName) -> bool,
        upsert: fn(&mut Self, V) -> bool,
    ) -> bool {
        let listed: HashMap<ServiceName, V> = listed.into_iter().collect();
        let mut changed = false;
        for name in present.iter().filter(|name| !listed.contains_key(*name)) {
            changed |= remove(self, name);
        }
        for value in listed.into_values() {
            changed |= upsert(self, value);
        }
        changed
    }

    /// An EndpointSlice was added or changed; returns whether it differs.
    pub fn upsert_slice(&mut self, slice: EndpointSliceModel) -> bool {
        if self.slices.get(&slice.slice_name) == Some(&slice) {
            return false;
        }
        self.remove_slice(&slice.slice_name.clone());
        self.dirty.insert(slice.service.clone());
        let names = self.slices_of.entry(slice.service.clone()).or_default();
        if let Err(position) = names.binary_search(&slice.slice_name) {
            names.insert(position, slice.slice_name.clone());
        }
        self.slices.insert(slice.slice_name.clone(), slice);
        true
    }

    /// An EndpointSlice was deleted (or became one the datapath does not use).
    pub fn remove_slice(&mut self, slice_name: &ServiceName) -> bool {
        let Some(old) = self.slices.remove(slice_name) else {
            return false;
        };
        if let Some(names) = self.slices_of.get_mut(&old.service) {
            names.retain(|name| name != slice_name);
            if names.is_empty() {
                self.slices_of.remove(&old.service);
            }
        }
        self.dirty.insert(old.service);
        true
    }

    /// A complete list of EndpointSlices: everything not in it is gone.
    pub fn replace_slices(&mut self, slices: impl IntoIterator<Item = EndpointSliceModel>) -> bool {
        let listed = slices
            .into_iter()
            .map(|slice| (slice.slice_name.clone(), slice));
        let present: Vec<ServiceName> = self.slices.keys().cloned().collect();
        self.replace(present, listed, Self::remove_slice, Self::upsert_slice)
    }

    /// A Service's no-local-endpoints count (zero once it is gone).
    fn no_local_of(&self, name: &ServiceName, node: &NodeView) -> NoLocalEndpoints {
        let Some(service) = self.services.get(name) else {
            return NoLocalEndpoints::default();
        };
        // Most Services have no Local policy: their slices are not even gathered.
        if service.internal_traffic_policy != TrafficPolicy::Local
            && service.external_traffic_policy != TrafficPolicy::Local
        {
            return NoLocalEndpoints::default();
        }
        no_local_endpoints(service, &self.slices_of(name), node, AddressFamily::Ipv4)
    }

    /// Records the counts of the Services a successful sync recomputed, and returns the
    /// total.
    fn record_no_local(
        &mut self,
        counts: impl IntoIterator<Item = (ServiceName, NoLocalEndpoints)>,
    ) -> NoLocalEndpoints {
        for (name, count) in counts {
            if count.is_zero() {
                self.no_local.remove(&name);
            } else {
                self.no_local.insert(name, count);
            }
        }
        let mut total = NoLocalEndpoints::default();
        for count in self.no_local.values() {
            total += *count;
        }
        total
    }

    fn share_of(&self, name: &ServiceName, node: &NodeView) -> Option<ServiceDesired> {
        let service = self.services.get(name)?;
        Some(service_desired(service, &self.slices_of(name), node))
    }

    /// Every Service's share, by name (what a full sync applies).
    pub fn all_shares(&self, node: &NodeView) -> BTreeMap<ServiceName, ServiceDesired> {
        self.services
            .iter()
            .map(|(name, service)| {
                (
                    name.clone(),
                    service_desired(service, &self.slices_of(name), node),
                )
            })
            .collect()
    }

    /// Makes the maps equal to the desired state of the current inputs: a
    /// partial sync of the dirty Services when possible, a full one otherwise,
    /// and a full one that re-reads the maps first with `resync`. `Ok(None)`:
    /// the node's view is not known yet, nothing was written.
    ///
    /// On failure the dirty marks stay and the syncer has dropped its index, so
    /// the next call is a full sync from re-read maps: a failed apply stops at
    /// its first failed operation, which the plan's phase order makes safe (no
    /// frontend ever points at a missing slot), and leaves the rest to that
    /// full sync.
    pub fn sync(
        &mut self,
        gate_is_open: GateOpen,
        syncer: &mut Syncer,
        maps: &mut impl ServiceMaps,
        resync: bool,
    ) -> Result<Option<SyncOutcome>, Error> {
        let Some(node) = self.node.clone() else {
            return Ok(None);
        };
        // The one place that decides: a partial sync of the dirty Services
        // unless the caller wants the periodic resync, the node's view changed
        // (every NodePort moves), or the syncer cannot make one (no index yet,
        // or the last apply failed).
        let partial_possible = !resync && !self.node_changed;
        if let Some(partial) = syncer.partial().filter(|_| partial_possible) {
            let changes: Vec<(ServiceName, Option<ServiceDesired>)> = self
                .dirty
                .iter()
                .map(|name| (name.clone(), self.share_of(name, &node)))
                .collect();
            for (name, share) in &changes {
                for conflict in share.iter().flat_map(|share| &share.conflicts) {
                    tracing::warn!(service = %name, kept = %conflict.kept, dropped = %conflict.dropped, "two ports of one Service claim one address and port");
                }
            }
            let services = changes.len();
            let no_local: Vec<(ServiceName, NoLocalEndpoints)> = self
                .dirty
                .iter()
                .map(|name| (name.clone(), self.no_local_of(name, &node)))
                .collect();
            let report = partial.sync_changes(gate_is_open, changes, maps)?;
            self.dirty.clear();
            return Ok(Some(SyncOutcome {
                kind: SyncKind::Partial { services },
                report,
                no_local_endpoints: self.record_no_local(no_local),
            }));
        }
        if resync {
            syncer.reread_maps_before_next_sync();
        }
        let shares = self.all_shares(&node);
        // Only the Services that count: the rest are dropped with the old counts below.
        let no_local: Vec<(ServiceName, NoLocalEndpoints)> = self
            .services
            .keys()
            .filter_map(|name| {
                let count = self.no_local_of(name, &node);
                (!count.is_zero()).then(|| (name.clone(), count))
            })
            .collect();
        let report = syncer.sync_services(gate_is_open, shares, maps)?;
        self.dirty.clear();
        self.node_changed = false;
        // Every Service was recomputed: the counts of Services gone are dropped too.
        self.no_local.clear();
        Ok(Some(SyncOutcome {
            kind: if resync {
                SyncKind::Resync
            } else {
                SyncKind::Full
            },
            report,
            no_local_endpoints: self.record_no_local(no_local),
        }))
    }
}

#[cfg(test)]
mod tests;
