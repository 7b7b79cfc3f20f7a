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
mod tests {
    use super::*;

    fn node(value: serde_json::Value) -> Node {
        serde_json::from_value(value).expect("a valid Node")
    }

    fn base() -> serde_json::Value {
        serde_json::json!({
            "metadata": {
                "name": "node-1",
                "resourceVersion": "100",
                "labels": {"kubernetes.io/hostname": "node-1"},
                "annotations": {"node.alpha.kubernetes.io/ttl": "0"}
            },
            "spec": {"podCIDR": "10.244.1.0/24"},
            "status": {
                "addresses": [
                    {"type": "InternalIP", "address": "10.99.0.11"},
                    {"type": "Hostname", "address": "node-1"}
                ],
                "conditions": [{
                    "type": "Ready", "status": "True", "reason": "KubeletReady",
                    "lastHeartbeatTime": "2026-11-22T01:00:00Z",
                    "lastTransitionTime": "2026-11-22T00:00:00Z"
                }]
            }
        })
    }

    fn facts(value: serde_json::Value) -> NodeFacts {
        NodeFacts::from_node(&node(value))
    }

    #[test]
    fn the_facts_are_the_name_and_the_internal_and_external_addresses() {
        let mut value = base();
        value["status"]["addresses"] = serde_json::json!([
            {"type": "ExternalIP", "address": "192.0.2.7"},
            {"type": "InternalIP", "address": "10.99.0.11"},
            {"type": "InternalIP", "address": "10.99.0.11"},
            {"type": "Hostname", "address": "node-1"},
            {"type": "InternalDNS", "address": "node-1.internal"},
            {"type": "InternalIP", "address": "not-an-address"}
        ]);
        assert_eq!(
            facts(value),
            NodeFacts {
                name: "node-1".into(),
                addresses: vec![
                    "10.99.0.11".parse().expect("valid"),
                    "192.0.2.7".parse().expect("valid")
                ],
                zone: None,
            }
        );
    }

    #[test]
    fn the_zone_label_is_a_fact_and_a_change_of_it_is_relevant() {
        let mut zoned = base();
        zoned["metadata"]["labels"][ZONE_LABEL] = "zone-a".into();
        let before = facts(zoned.clone());
        assert_eq!(before.zone.as_deref(), Some("zone-a"));
        let mut moved = zoned.clone();
        moved["metadata"]["labels"][ZONE_LABEL] = "zone-b".into();
        assert!(node_update_is_relevant(Some(&before), &facts(moved)));
        // The control: another label changing is not relevant.
        let mut relabelled = zoned;
        relabelled["metadata"]["labels"]["churn"] = "yes".into();
        assert!(!node_update_is_relevant(Some(&before), &facts(relabelled)));
        // An empty label is no zone.
        let mut empty = base();
        empty["metadata"]["labels"][ZONE_LABEL] = "".into();
        assert_eq!(facts(empty).zone, None);
    }

    #[test]
    fn heartbeats_conditions_resource_versions_labels_and_annotations_are_not_relevant() {
        let before = facts(base());
        let mut after = base();
        after["metadata"]["resourceVersion"] = "101".into();
        after["metadata"]["annotations"]["switchyard.dev/e2e-churn"] = "42".into();
        after["metadata"]["labels"]["churn"] = "yes".into();
        after["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-11-22T01:00:10Z".into();
        after["status"]["conditions"][0]["status"] = "False".into();
        after["status"]["conditions"][0]["reason"] = "KubeletNotReady".into();
        after["status"]["conditions"]
            .as_array_mut()
            .expect("an array")
            .push(serde_json::json!({"type": "MemoryPressure", "status": "False"}));
        after["spec"]["podCIDR"] = "10.244.9.0/24".into();
        assert!(!node_update_is_relevant(Some(&before), &facts(after)));
    }

    #[test]
    fn internal_ips_come_before_external_ips_in_the_nodes_order() {
        let mut value = base();
        value["status"]["addresses"] = serde_json::json!([
            {"type": "ExternalIP", "address": "192.0.2.7"},
            {"type": "InternalIP", "address": "10.99.0.12"},
            {"type": "InternalIP", "address": "fd00::12"},
            {"type": "InternalIP", "address": "10.99.0.11"}
        ]);
        let addresses: Vec<IpAddr> = ["10.99.0.12", "fd00::12", "10.99.0.11", "192.0.2.7"]
            .iter()
            .map(|text| text.parse().expect("valid"))
            .collect();
        assert_eq!(facts(value.clone()).addresses, addresses);
        // Another first InternalIP is another primary address: relevant.
        let mut swapped = value.clone();
        swapped["status"]["addresses"][1]["address"] = "10.99.0.11".into();
        swapped["status"]["addresses"][3]["address"] = "10.99.0.12".into();
        assert!(node_update_is_relevant(
            Some(&facts(value)),
            &facts(swapped)
        ));
    }

    #[test]
    fn moved_address_types_or_repeated_addresses_are_not_relevant() {
        let mut before = base();
        before["status"]["addresses"] = serde_json::json!([
            {"type": "InternalIP", "address": "10.99.0.11"},
            {"type": "ExternalIP", "address": "192.0.2.7"}
        ]);
        let mut after = base();
        after["status"]["addresses"] = serde_json::json!([
            {"type": "ExternalIP", "address": "192.0.2.7"},
            {"type": "InternalIP", "address": "10.99.0.11"},
            {"type": "ExternalIP", "address": "192.0.2.7"}
        ]);
        assert!(!node_update_is_relevant(
            Some(&facts(before)),
            &facts(after)
        ));
    }

    #[test]
    fn an_added_or_removed_address_and_the_first_sight_of_the_node_are_relevant() {
        let before = facts(base());
        let mut added = base();
        added["status"]["addresses"]
            .as_array_mut()
            .expect("an array")
            .push(serde_json::json!({"type": "InternalIP", "address": "10.99.0.111"}));
        assert!(node_update_is_relevant(Some(&before), &facts(added)));
        let mut removed = base();
        removed["status"]["addresses"] = serde_json::json!([]);
        assert!(node_update_is_relevant(Some(&before), &facts(removed)));
        assert!(node_update_is_relevant(None, &before));
    }
}
