//! The desired map state: a pure function of Services, EndpointSlices, the node's
//! addresses and its name.
//!
//! It is computed in two steps:
//! 1. [`desired_services`]: which frontends exist, which group each uses, and
//!    which backends each group holds. Groups are named by a [`GroupKey`]
//!    (Service, port, address family, endpoint view), not by a number.
//! 2. [`layout::lay_out`]: numbers the groups and orders each group's slots,
//!    reusing the numbers and slot positions found in the current map state, so
//!    that an unchanged Service maps to the very same entries after an agent
//!    restart (its first apply is a no-op) and a changed one moves as few slots as
//!    possible (affinity entries stay valid for backends that did not move).
//!
//! [`desired_entries`] runs both.
//!
//! Which endpoints a frontend balances over follows kube-proxy:
//! - A ClusterIP frontend (scope internal) uses `internalTrafficPolicy`.
//! - NodePort, external and load-balancer frontends have two entries. Scope
//!   external (packets from outside the node) uses `externalTrafficPolicy`; with
//!   `Local` it keeps the client address and uses only local endpoints, and
//!   drops rather than refuses without one ([`traffic_policy`]). Scope
//!   internal (this node's pods and host processes) uses every endpoint of the
//!   cluster, as kube-proxy sends pod traffic for external destinations to the
//!   Service's cluster-wide chain whatever the external policy says.
//! - A view's backends are its ready endpoints; if none is ready, its serving
//!   terminating endpoints (kube-proxy since 1.26); otherwise none, and new flows
//!   are refused.
//! - The cluster-wide view's ready endpoints are narrowed by topology hints
//!   (same node, else same zone) when the hints allow it ([`topology`]).

pub mod layout;
pub mod no_local_endpoints;
pub mod node_port_addresses;
pub mod source_ranges;
pub mod topology;
pub mod traffic_policy;

use std::collections::{btree_map::Entry, BTreeMap};
use std::net::IpAddr;

use switchyard_common::{
    Address, BackendValue, FrontendKey, BACKEND_FLAG_LOCAL, FRONTEND_FLAG_ENDPOINTS_ELSEWHERE,
    FRONTEND_FLAG_MASQUERADE_REMOTE, FRONTEND_FLAG_PRESERVE_CLIENT_ADDRESS,
    FRONTEND_FLAG_SESSION_AFFINITY, SCOPE_EXTERNAL, SCOPE_INTERNAL,
};

use crate::model::{
    AddressFamily, EndpointSliceModel, Protocol, ServiceModel, ServiceName, ServicePortModel,
    TrafficPolicy,
};

pub use layout::lay_out;

/// What the agent knows about its own node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeView {
    /// Endpoints whose `nodeName` (or hostname topology) equals this are local.
    pub name: String,
    /// Addresses NodePorts are served on ([`node_port_addresses`]); a loopback
    /// one in the internal scope only.
    pub addresses: Vec<IpAddr>,
    /// The Node's `topology.kubernetes.io/zone` label (topology hints).
    pub zone: Option<String>,
}

/// Which endpoints of a Service port a group holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EndpointView {
    /// Every endpoint in the cluster.
    All,
    /// Only this node's endpoints (a `Local` traffic policy).
    Local,
}

/// Names one set of backends: all frontends of one Service port that see the same
/// endpoints share it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupKey {
    pub service: ServiceName,
    pub port_name: String,
    pub protocol: Protocol,
    pub family: AddressFamily,
    pub view: EndpointView,
}

/// A frontend before its group is numbered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredFrontend {
    pub group: GroupKey,
    /// `FRONTEND_FLAG_*`.
    pub flags: u32,
    pub affinity_timeout_seconds: u32,
    /// The sources a frontend with `FRONTEND_FLAG_SOURCE_RANGES` admits (sorted,
    /// distinct; empty otherwise): see [`source_ranges`].
    pub source_ranges: Vec<crate::maps::SourcePrefix>,
}

/// Two Services claim the same address, port and protocol; the first by
/// namespace and name keeps it (the choice must not depend on arrival order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrontendConflict {
    pub key: FrontendKey,
    pub kept: ServiceName,
    pub dropped: ServiceName,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DesiredServices {
    pub frontends: BTreeMap<FrontendKey, DesiredFrontend>,
    /// Backends of every group some frontend uses, sorted, without duplicates.
    pub groups: BTreeMap<GroupKey, Vec<BackendValue>>,
    pub conflicts: Vec<FrontendConflict>,
}

/// The 16-byte form of an address used in map keys and values.
pub fn address_bytes(address: &IpAddr) -> Address {
    match address {
        IpAddr::V4(v4) => switchyard_common::ipv4_mapped(v4.octets()),
        IpAddr::V6(v6) => v6.octets(),
    }
}

pub fn frontend_key(address: &IpAddr, port: u16, protocol: Protocol, scope: u8) -> FrontendKey {
    FrontendKey {
        address: address_bytes(address),
        port_big_endian: port.to_be(),
        protocol: protocol.number(),
        scope,
    }
}

/// One endpoint candidate of a Service port, before the ready/serving choice.
#[derive(Clone, Copy, Debug)]
struct Candidate<'a> {
    backend: BackendValue,
    ready: bool,
    serving_terminating: bool,
    hints: topology::Hints<'a>,
}

/// Endpoints of one Service port in one family, deduplicated by address and port
/// (several slices may list the same endpoint while they are being updated; the
/// best condition wins).
fn candidates<'a>(
    port: &ServicePortModel,
    family: AddressFamily,
    slices: &[&'a EndpointSliceModel],
    node_name: &str,
) -> Vec<Candidate<'a>> {
    let mut by_backend: BTreeMap<(Address, u16), Candidate<'a>> = BTreeMap::new();
    for slice in slices
        .iter()
        .copied()
        .filter(|slice| slice.family == family)
    {
        // EndpointSlice ports carry the Service port's name and the resolved
        // target port (named target ports are resolved per pod by the
        // EndpointSlice controller), so they are matched by name and protocol.
        let Some(slice_port) = slice
            .ports
            .iter()
            .find(|candidate| candidate.name == port.name && candidate.protocol == port.protocol)
        else {
            continue;
        };
        for endpoint in slice.endpoints.iter() {
            let local = !node_name.is_empty() && endpoint.node_name.as_deref() == Some(node_name);
            let candidate = Candidate {
                backend: BackendValue {
                    address: address_bytes(&endpoint.address),
                    port_big_endian: slice_port.port.to_be(),
                    flags: if local { BACKEND_FLAG_LOCAL } else { 0 },
                },
                ready: endpoint.ready,
                serving_terminating: endpoint.serving && endpoint.terminating,
                hints: topology::Hints::of(&endpoint.hints),
            };
            by_backend
                .entry((candidate.backend.address, slice_port.port))
                .and_modify(|existing| {
                    existing.ready |= candidate.ready;
                    existing.serving_terminating |= candidate.serving_terminating;
                    existing.backend.flags |= candidate.backend.flags;
                    existing.hints = existing.hints.merged(candidate.hints);
                })
                .or_insert(candidate);
        }
    }
    by_backend.into_values().collect()
}

/// Ready endpoints of the view (the cluster-wide view narrowed by topology
/// hints, see [`topology`]), or its serving terminating ones if none is ready.
fn backends_of_view(
    candidates: &[Candidate],
    view: EndpointView,
    node: &NodeView,
) -> Vec<BackendValue> {
    let in_view = |candidate: &&Candidate| {
        view == EndpointView::All || candidate.backend.flags & BACKEND_FLAG_LOCAL != 0
    };
    let topology = match view {
        EndpointView::All => topology::mode(candidates, node),
        // A Local policy never looks at hints (kube-proxy's CategorizeEndpoints).
        EndpointView::Local => topology::Mode::Every,
    };
    let mut backends: Vec<BackendValue> = candidates
        .iter()
        .filter(in_view)
        .filter(|candidate| candidate.ready)
        .filter(|candidate| topology.admits(candidate.hints, node))
        .map(|candidate| candidate.backend)
        .collect();
    if backends.is_empty() {
        backends = candidates
            .iter()
            .filter(in_view)
            .filter(|candidate| candidate.serving_terminating)
            .map(|candidate| candidate.backend)
            .collect();
    }
    backends.sort();
    backends
}

fn view_of(policy: TrafficPolicy) -> EndpointView {
    match policy {
        TrafficPolicy::Cluster => EndpointView::All,
        TrafficPolicy::Local => EndpointView::Local,
    }
}

/// One Service's share of the desired state, before other Services are
/// considered: what the incremental syncer caches per Service.
///
/// Sorted vectors rather than maps: the syncer keeps one share per Service
/// (10,000 and more), most with one or two frontends and groups, and a
/// `BTreeMap` allocates a node for eleven entries even for one (about 3 KiB per
/// Service instead of a few hundred bytes).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceDesired {
    /// Sorted by key, keys distinct.
    pub frontends: Vec<(FrontendKey, DesiredFrontend)>,
    /// Sorted by group, groups distinct; backends sorted, distinct.
    pub groups: Vec<(GroupKey, Vec<BackendValue>)>,
    /// Addresses the Service claims twice with different meanings.
    pub conflicts: Vec<FrontendConflict>,
}

impl ServiceDesired {
    pub fn frontend_keys(&self) -> impl Iterator<Item = &FrontendKey> {
        self.frontends.iter().map(|(key, _)| key)
    }

    pub fn group_keys(&self) -> impl Iterator<Item = &GroupKey> {
        self.groups.iter().map(|(group, _)| group)
    }

    /// The backends of one of this Service's groups.
    pub fn backends_of(&self, group: &GroupKey) -> Option<&Vec<BackendValue>> {
        self.groups
            .binary_search_by(|(candidate, _)| candidate.cmp(group))
            .ok()
            .map(|index| &self.groups[index].1)
    }
}

/// One Service's frontends and groups; pure.
pub fn service_desired(
    service: &ServiceModel,
    slices: &[&EndpointSliceModel],
    node: &NodeView,
) -> ServiceDesired {
    let mut desired = DesiredServices::default();
    add_service(&mut desired, service, slices, node);
    ServiceDesired {
        // Collected from sorted maps: sorted, distinct, and exactly sized.
        frontends: desired.frontends.into_iter().collect(),
        groups: desired.groups.into_iter().collect(),
        conflicts: desired.conflicts,
    }
}

/// Combines Services' shares, given in namespace/name order: a frontend claimed
/// by several Services goes to the first, and a group is kept only if some
/// frontend that won uses it.
pub fn merge<'a>(services: impl IntoIterator<Item = &'a ServiceDesired>) -> DesiredServices {
    let mut desired = DesiredServices::default();
    for service in services {
        desired.conflicts.extend(service.conflicts.iter().cloned());
        for (key, frontend) in &service.frontends {
            match desired.frontends.entry(*key) {
                Entry::Vacant(vacant) => {
                    if !desired.groups.contains_key(&frontend.group) {
                        if let Some(backends) = service.backends_of(&frontend.group) {
                            desired
                                .groups
                                .insert(frontend.group.clone(), backends.clone());
                        }
                    }
                    vacant.insert(frontend.clone());
                }
                Entry::Occupied(occupied) => desired.conflicts.push(FrontendConflict {
                    key: *key,
                    kept: occupied.get().group.service.clone(),
                    dropped: frontend.group.service.clone(),
                }),
            }
        }
    }
    desired
}

/// Whether `service` can give a frontend [`FRONTEND_FLAG_MASQUERADE_REMOTE`]:
/// a NodePort, external or load-balancer address with `externalTrafficPolicy:
/// Cluster`. Only those flows are masqueraded (the programs mark them, the
/// agent's netfilter rule rewrites them), so the agent installs its netfilter
/// rules, and with them netfilter's connection tracking of every forwarded flow,
/// only once some Service says yes here (see `standalone::masquerade`).
///
/// It may say yes where no frontend ends up flagged (a NodePort on a node with no
/// address of the Service's family): the rule is then installed for nothing,
/// which costs tracking, never a connection. It never says no where a frontend
/// is flagged (the desired-state tests check both against [`desired_services`]).
pub fn masquerades_remote_backends(service: &ServiceModel) -> bool {
    service.external_traffic_policy == TrafficPolicy::Cluster
        && (service.ports.iter().any(|port| port.node_port.is_some())
            || !service.external_ips.is_empty()
            || !service.load_balancer_ips.is_empty())
}

fn add_service(
    desired: &mut DesiredServices,
    service: &ServiceModel,
    slices: &[&EndpointSliceModel],
    node: &NodeView,
) {
    let (affinity_flag, affinity_timeout_seconds) = match service.session_affinity_timeout_seconds {
        Some(timeout) => (FRONTEND_FLAG_SESSION_AFFINITY, timeout),
        None => (0, 0),
    };
    let external_view = view_of(service.external_traffic_policy);
    let external_flags = affinity_flag
        | match service.external_traffic_policy {
            TrafficPolicy::Local => FRONTEND_FLAG_PRESERVE_CLIENT_ADDRESS,
            TrafficPolicy::Cluster => FRONTEND_FLAG_MASQUERADE_REMOTE,
        };
    for family in service.families() {
        let in_family = |address: &&IpAddr| AddressFamily::of(address) == family;
        let load_balancer_filter = source_ranges::load_balancer_filter(service, family, node);
        for port in &service.ports {
            let candidates = candidates(port, family, slices, &node.name);
            let policy_flags = traffic_policy::external_policy_flags(service, &candidates, node);
            // Whether the Service has endpoints anywhere, as kube-proxy's "has endpoints" (ready
            // or serving terminating): a frontend left without backends by its view is then
            // flagged, so that the programs count its refusals apart (see
            // `FRONTEND_FLAG_ENDPOINTS_ELSEWHERE`).
            let endpoints_anywhere = candidates
                .iter()
                .any(|candidate| candidate.ready || candidate.serving_terminating);
            let group = |view: EndpointView| GroupKey {
                service: service.name.clone(),
                port_name: port.name.clone(),
                protocol: port.protocol,
                family,
                view,
            };
            let add = |desired: &mut DesiredServices,
                       address: &IpAddr,
                       number: u16,
                       scope: u8,
                       view: EndpointView,
                       flags: u32,
                       filter: Option<&source_ranges::LoadBalancerFilter>| {
                let key = frontend_key(address, number, port.protocol, scope);
                // The group's backends, computed once per group (kept for the insert below).
                let computed = (!desired.groups.contains_key(&group(view)))
                    .then(|| backends_of_view(&candidates, view, node));
                let without_backends = computed.as_ref().map_or_else(
                    || desired.groups.get(&group(view)).is_some_and(Vec::is_empty),
                    Vec::is_empty,
                );
                let frontend = DesiredFrontend {
                    group: group(view),
                    flags: flags
                        | filter.map_or(0, |filter| filter.flags)
                        | if without_backends && endpoints_anywhere {
                            FRONTEND_FLAG_ENDPOINTS_ELSEWHERE
                        } else {
                            0
                        },
                    affinity_timeout_seconds,
                    source_ranges: filter
                        .map(|filter| filter.prefixes.clone())
                        .unwrap_or_default(),
                };
                match desired.frontends.entry(key) {
                    Entry::Vacant(vacant) => {
                        if let Some(backends) = computed {
                            desired.groups.insert(frontend.group.clone(), backends);
                        }
                        vacant.insert(frontend);
                    }
                    Entry::Occupied(occupied) => {
                        // The same address listed twice by one Service is not a
                        // conflict; anything else is.
                        if occupied.get() != &frontend {
                            desired.conflicts.push(FrontendConflict {
                                key,
                                kept: occupied.get().group.service.clone(),
                                dropped: service.name.clone(),
                            });
                        }
                    }
                }
            };
            for cluster_ip in service.cluster_ips.iter().filter(in_family) {
                add(
                    desired,
                    cluster_ip,
                    port.port,
                    SCOPE_INTERNAL,
                    view_of(service.internal_traffic_policy),
                    affinity_flag,
                    None,
                );
            }
            // Only load-balancer addresses are filtered by source ranges.
            let mut external: Vec<(&IpAddr, u16, Option<&source_ranges::LoadBalancerFilter>)> =
                Vec::new();
            if let Some(node_port) = port.node_port {
                external.extend(
                    node.addresses
                        .iter()
                        .filter(in_family)
                        .map(|address| (address, node_port, None)),
                );
            }
            external.extend(
                service
                    .external_ips
                    .iter()
                    .filter(in_family)
                    .map(|address| (address, port.port, None)),
            );
            external.extend(
                service
                    .load_balancer_ips
                    .iter()
                    .filter(in_family)
                    .map(|address| (address, port.port, load_balancer_filter.as_ref())),
            );
            for (address, number, filter) in external {
                // Localhost NodePorts: only the node's own processes reach them.
                if !node_port_addresses::internal_scope_only(address) {
                    add(
                        desired,
                        address,
                        number,
                        SCOPE_EXTERNAL,
                        external_view,
                        external_flags | policy_flags.external,
                        filter,
                    );
                }
                add(
                    desired,
                    address,
                    number,
                    SCOPE_INTERNAL,
                    EndpointView::All,
                    affinity_flag | policy_flags.internal_twin,
                    filter,
                );
            }
        }
    }
}

#[cfg(feature = "testing")]
mod whole;
#[cfg(feature = "testing")]
pub use whole::{
    changed_services, desired_entries, desired_services, services_desired, slices_by_service,
};

#[cfg(test)]
pub(crate) mod tests;
