//! The desired state of a whole set of Services at once, from slices of
//! objects: what the tests and benchmarks compare the agent's incremental path
//! against (`testing` feature). The agent itself goes through
//! [`crate::sync::inputs::SyncInputs`], one Service at a time.

use std::collections::{BTreeMap, HashMap};

use super::{lay_out, merge, service_desired, DesiredServices, NodeView, ServiceDesired};
use crate::maps::MapState;
use crate::model::{EndpointSliceModel, ServiceModel, ServiceName};

/// EndpointSlices grouped by the Service they belong to.
pub fn slices_by_service(
    slices: &[EndpointSliceModel],
) -> HashMap<&ServiceName, Vec<&EndpointSliceModel>> {
    let mut by_service: HashMap<&ServiceName, Vec<&EndpointSliceModel>> = HashMap::new();
    for slice in slices {
        by_service.entry(&slice.service).or_default().push(slice);
    }
    by_service
}

/// Every Service's share, by name.
pub fn services_desired(
    services: &[ServiceModel],
    slices: &[EndpointSliceModel],
    node: &NodeView,
) -> BTreeMap<ServiceName, ServiceDesired> {
    let by_service = slices_by_service(slices);
    services
        .iter()
        .map(|service| {
            let service_slices = by_service
                .get(&service.name)
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            (
                service.name.clone(),
                service_desired(service, service_slices, node),
            )
        })
        .collect()
}

/// The Services whose share differs between `before` and `after`, with their
/// new share (`None`: gone): the input of a partial sync.
pub fn changed_services(
    before: &BTreeMap<ServiceName, ServiceDesired>,
    after: &BTreeMap<ServiceName, ServiceDesired>,
) -> Vec<(ServiceName, Option<ServiceDesired>)> {
    let gone = before
        .keys()
        .filter(|name| !after.contains_key(*name))
        .map(|name| (name.clone(), None));
    let changed = after
        .iter()
        .filter(|(name, share)| before.get(*name) != Some(share))
        .map(|(name, share)| (name.clone(), Some(share.clone())));
    gone.chain(changed).collect()
}

/// Frontends and groups of every Service; pure.
pub fn desired_services(
    services: &[ServiceModel],
    slices: &[EndpointSliceModel],
    node: &NodeView,
) -> DesiredServices {
    merge(services_desired(services, slices, node).values())
}

/// The desired map entries: [`desired_services`] laid out against `current` (the
/// restored or last applied state; an empty state gives the entries of a fresh
/// start).
pub fn desired_entries(
    services: &[ServiceModel],
    slices: &[EndpointSliceModel],
    node: &NodeView,
    current: &MapState,
) -> MapState {
    lay_out(&desired_services(services, slices, node), current)
}
