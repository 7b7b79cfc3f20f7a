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
