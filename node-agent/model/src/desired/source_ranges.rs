//! Which sources a Service's load-balancer frontends admit
//! (`loadBalancerSourceRanges`), as kube-proxy decides it (iptables `KUBE-FW-*`
//! and, since 1.25, `KUBE-PROXY-FIREWALL`; nftables `firewall-check`):
//! - only the load-balancer ingress addresses are filtered, never the cluster
//!   IPs, external IPs or NodePorts of the same Service;
//! - per address family: the ranges of the frontend's family; none of it, or
//!   one that is the whole space (`0.0.0.0/0`), means no filter;
//! - if a range holds an address of the node, a source equal to one of the
//!   Service's load-balancer addresses is admitted too (kube-proxy's
//!   "allowFromNode": a VIP routed locally answers from itself);
//! - traffic from everywhere else is dropped, whoever sends it (outside
//!   clients, the node's pods, its processes).
//!
//! kube-proxy asks whether a range holds its primary node IP; the agent knows
//! the addresses it serves NodePorts on, not which one is primary, and asks
//! whether a range holds any of them (docs/parity.md says so).

use std::net::IpAddr;

use switchyard_common::{FRONTEND_FLAG_NODE_OUTSIDE_SOURCE_RANGES, FRONTEND_FLAG_SOURCE_RANGES};

use super::{address_bytes, NodeView};
use crate::maps::SourcePrefix;
use crate::model::source_ranges::Cidr;
use crate::model::{AddressFamily, ServiceModel};

/// The filter of one Service's load-balancer frontends in one family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadBalancerFilter {
    /// `FRONTEND_FLAG_SOURCE_RANGES`, with `FRONTEND_FLAG_NODE_OUTSIDE_SOURCE_RANGES`
    /// when no range holds an address of the node.
    pub flags: u32,
    /// What each such frontend admits, sorted, distinct.
    pub prefixes: Vec<SourcePrefix>,
}

/// A range in the maps' form (see [`SourcePrefix`]).
pub fn source_prefix(range: &Cidr) -> SourcePrefix {
    let length = match range.address {
        IpAddr::V4(_) => 96 + range.prefix_length,
        IpAddr::V6(_) => range.prefix_length,
    };
    SourcePrefix {
        address: address_bytes(&range.address),
        length,
    }
}

/// The filter of `service`'s load-balancer frontends of `family`; `None`: they
/// admit every source.
pub fn load_balancer_filter(
    service: &ServiceModel,
    family: AddressFamily,
    node: &NodeView,
) -> Option<LoadBalancerFilter> {
    let ranges: Vec<&Cidr> = service
        .load_balancer_source_ranges
        .iter()
        .filter(|range| range.family() == family)
        .collect();
    if ranges.is_empty() || ranges.iter().any(|range| range.is_everything()) {
        return None;
    }
    // 127.0.0.1 (localhost NodePorts) is no address the node sends from to a
    // load-balancer address.
    let node_inside = node
        .addresses
        .iter()
        .filter(|address| !address.is_loopback())
        .any(|address| ranges.iter().any(|range| range.contains(address)));
    let mut prefixes: Vec<SourcePrefix> = ranges.iter().map(|range| source_prefix(range)).collect();
    if node_inside {
        prefixes.extend(
            service
                .load_balancer_ips
                .iter()
                .filter(|address| AddressFamily::of(address) == family)
                .map(|address| SourcePrefix {
                    address: address_bytes(address),
                    length: 128,
                }),
        );
    }
    prefixes.sort();
    prefixes.dedup();
    let flags = if node_inside {
        FRONTEND_FLAG_SOURCE_RANGES
    } else {
        FRONTEND_FLAG_SOURCE_RANGES | FRONTEND_FLAG_NODE_OUTSIDE_SOURCE_RANGES
    };
    Some(LoadBalancerFilter { flags, prefixes })
}

#[cfg(test)]
mod tests;
