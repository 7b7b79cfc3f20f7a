//! Flags that `externalTrafficPolicy: Local` adds to a Service's external
//! addresses (NodePorts, external IPs, load-balancer IPs).
//!
//! - The internal-scope twin of such an address (what the node's pods and host
//!   processes use: every endpoint of the cluster, as kube-proxy sends pod
//!   traffic for external destinations to the cluster-wide endpoints) gets
//!   `FRONTEND_FLAG_NO_POD_CONNECT_BALANCING`: the socket hooks take every
//!   network namespace but the node's for a pod, so a client in another
//!   namespace of the node that enters through a host interface (a container
//!   outside Kubernetes, a test's "outside" client) would be balanced over every
//!   endpoint at connect time, about half of its connections going to remote
//!   endpoints, where the TC programs give it the local ones. Pods lose nothing:
//!   TC gives their packets the same cluster-wide endpoints.
//! - The external-scope entry, when it has no backend (no local endpoint) while
//!   the Service has endpoints elsewhere, gets `FRONTEND_FLAG_DROP_WITHOUT_BACKENDS`:
//!   kube-proxy drops such packets (1.20: KUBE-XLB to KUBE-MARK-DROP; current:
//!   the filter table's DROP, counted in
//!   kubeproxy_sync_proxy_rules_no_local_endpoints_total), so that a load
//!   balancer's client retries while the health check catches up. A Service
//!   without any endpoint is refused, as kube-proxy rejects it.

use switchyard_common::{
    FRONTEND_FLAG_DROP_WITHOUT_BACKENDS, FRONTEND_FLAG_NO_POD_CONNECT_BALANCING,
};

use super::{backends_of_view, Candidate, EndpointView, NodeView};
use crate::model::{ServiceModel, TrafficPolicy};

/// Flags added to one Service port's external addresses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct ExternalPolicyFlags {
    /// For the external-scope entries.
    pub external: u32,
    /// For their internal-scope twins.
    pub internal_twin: u32,
}

pub(super) fn external_policy_flags(
    service: &ServiceModel,
    candidates: &[Candidate<'_>],
    node: &NodeView,
) -> ExternalPolicyFlags {
    if service.external_traffic_policy != TrafficPolicy::Local {
        return ExternalPolicyFlags::default();
    }
    let no_local_endpoint = backends_of_view(candidates, EndpointView::Local, node).is_empty();
    let endpoints_elsewhere = !backends_of_view(candidates, EndpointView::All, node).is_empty();
    ExternalPolicyFlags {
        external: if no_local_endpoint && endpoints_elsewhere {
            FRONTEND_FLAG_DROP_WITHOUT_BACKENDS
        } else {
            0
        },
        internal_twin: FRONTEND_FLAG_NO_POD_CONNECT_BALANCING,
    }
}

#[cfg(test)]
mod tests;
