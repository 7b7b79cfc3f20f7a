//! What the agent takes from its own Node object, and whether an update of it
//! matters.
//!
//! Calico 3.29.1 re-attached every TC program on every Node heartbeat (tc storms,
//! stuck rollouts: projectcalico/calico#10143). Here a Node update is projected to
//! the few facts the desired state uses ([`NodeFacts`]), and only a change of those
//! reaches the syncer; heartbeats, conditions, `resourceVersion`, labels other
//! than the zone and annotations are counted as ignored and cause no map write
//! and no attach.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Node address types whose addresses NodePorts are served on (with the host's
/// local addresses, as `nodePortAddresses` selects), in the order kube-proxy
/// picks its primary node IP from (`GetNodeHostIPs`: InternalIP, then
/// ExternalIP).
const SERVED_ADDRESS_TYPES: [&str; 2] = ["InternalIP", "ExternalIP"];
/// The Node label topology hints are matched against (kube-proxy reads this
/// one label for them).
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// The facts of the Node the desired state depends on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeFacts {
    pub name: String,
    /// `status.addresses` of type InternalIP, then those of type ExternalIP,
    /// each in the Node's order, that parse as IP addresses, without
    /// duplicates: the first of a family is the node's primary address
    /// (`nodePortAddresses: primary`).
    pub addresses: Vec<IpAddr>,
    /// The [`ZONE_LABEL`] label, if set and not empty.
    pub zone: Option<String>,
}

impl NodeFacts {
    pub fn from_node(node: &Node) -> Self {
        let listed: Vec<_> = node
            .status
            .iter()
            .flat_map(|status| status.addresses.iter().flatten())
            .collect();
        let mut addresses: Vec<IpAddr> = Vec::new();
        for address_type in SERVED_ADDRESS_TYPES {
            for address in listed
                .iter()
                .filter(|address| address.type_ == address_type)
            {
                if let Ok(parsed) = address.address.trim().parse::<IpAddr>() {
                    if !addresses.contains(&parsed) {
                        addresses.push(parsed);
                    }
                }
            }
        }
        Self {
            name: node.metadata.name.clone().unwrap_or_default(),
            addresses,
            zone: zone_of(&node.metadata),
        }
    }
}

/// The zone label of a Node's metadata, if set and not empty.
pub fn zone_of(metadata: &ObjectMeta) -> Option<String> {
    metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(ZONE_LABEL))
        .filter(|zone| !zone.is_empty())
        .cloned()
}

/// Whether a Node update changes anything the agent uses. Pure, so the rule
/// ("heartbeats never reach the datapath") is tested on its own.
pub fn node_update_is_relevant(previous: Option<&NodeFacts>, next: &NodeFacts) -> bool {
    previous != Some(next)
}

#[cfg(test)]
mod tests;
