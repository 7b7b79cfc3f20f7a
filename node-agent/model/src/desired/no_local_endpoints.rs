//! kube-proxy's `kubeproxy_sync_proxy_rules_no_local_endpoints_total`, from the same inputs
//! as the desired state: the Service ports a `Local` traffic policy leaves without a
//! backend on this node while the Service has endpoints elsewhere. kube-proxy drops such
//! packets (the filter table's DROP for "has no local endpoints") and counts each Service
//! port once per policy, in the proxier of each address family, at the end of every sync:
//! - `internal`: `internalTrafficPolicy: Local`;
//! - `external`: `externalTrafficPolicy: Local` on a Service reachable from outside
//!   (kube-proxy's `ExternalPolicyLocal` holds only for an externally accessible Service).
//!
//! A Service port without any endpoint is not counted: kube-proxy rejects its packets as
//! "has no endpoints" instead. Local endpoints are what the desired state gives the local
//! view (ready ones, else serving terminating ones), and "endpoints elsewhere" is any ready
//! or serving terminating endpoint, as kube-proxy's `CategorizeEndpoints` pre-scan finds them.

use std::ops::AddAssign;

use super::{backends_of_view, candidates, EndpointView, NodeView};
use crate::model::{AddressFamily, EndpointSliceModel, ServiceModel, TrafficPolicy};

/// Service ports with a `Local` policy and no local endpoint, by policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoLocalEndpoints {
    /// Under `internalTrafficPolicy: Local` (the `internal` label value).
    pub internal: u64,
    /// Under `externalTrafficPolicy: Local` (the `external` label value).
    pub external: u64,
}

impl NoLocalEndpoints {
    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }
}

impl AddAssign for NoLocalEndpoints {
    fn add_assign(&mut self, other: Self) {
        self.internal += other.internal;
        self.external += other.external;
    }
}

/// kube-proxy's `ExternallyAccessible`, from what the model keeps: a NodePort (NodePort
/// and LoadBalancer Services), an external IP or a load-balancer ingress IP. A LoadBalancer
/// Service without NodePorts (`allocateLoadBalancerNodePorts: false`) whose ingress is not
/// assigned yet has no external address here, and nothing of it can be reached from outside.
fn externally_accessible(service: &ServiceModel) -> bool {
    service.ports.iter().any(|port| port.node_port.is_some())
        || !service.external_ips.is_empty()
        || !service.load_balancer_ips.is_empty()
}

/// One Service's count in `family` (none unless the Service has a cluster IP of it, as each
/// of kube-proxy's per-family proxiers sees only such Services).
pub fn no_local_endpoints(
    service: &ServiceModel,
    slices: &[&EndpointSliceModel],
    node: &NodeView,
    family: AddressFamily,
) -> NoLocalEndpoints {
    let internal_local = service.internal_traffic_policy == TrafficPolicy::Local;
    let external_local =
        service.external_traffic_policy == TrafficPolicy::Local && externally_accessible(service);
    let mut counts = NoLocalEndpoints::default();
    // Most Services have neither policy: they cost two comparisons.
    if (!internal_local && !external_local) || !service.families().contains(&family) {
        return counts;
    }
    for port in &service.ports {
        let candidates = candidates(port, family, slices, &node.name);
        let has_endpoints = candidates
            .iter()
            .any(|candidate| candidate.ready || candidate.serving_terminating);
        if !has_endpoints || !backends_of_view(&candidates, EndpointView::Local, node).is_empty() {
            continue;
        }
        if internal_local {
            counts.internal += 1;
        }
        if external_local {
            counts.external += 1;
        }
    }
    counts
}

#[cfg(test)]
mod tests;
