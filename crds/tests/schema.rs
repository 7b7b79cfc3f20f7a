//! The CRDs as the API server sees them: committed file in sync, structural schemas a
//! Kubernetes 1.20 API server accepts, descriptions everywhere, defaults and enums in place.

use serde_json::Value;
use switchyard_crds::{crds, crds_yaml};

const COMMITTED_CRDS: &str = "switchyard.dev_crds.yaml";

fn committed_crds_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(COMMITTED_CRDS)
}

fn schema_of(kind: &str) -> Value {
    let crd = crds()
        .into_iter()
        .find(|crd| crd.spec.names.kind == kind)
        .unwrap_or_else(|| panic!("no CRD of kind {kind}"));
    assert_eq!(crd.spec.versions.len(), 1, "{kind} has exactly one version");
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|validation| validation.open_api_v3_schema.as_ref())
        .unwrap_or_else(|| panic!("{kind} has a schema"));
    serde_json::to_value(schema).expect("a schema serializes to JSON")
}

fn at<'a>(schema: &'a Value, path: &[&str]) -> &'a Value {
    path.iter().fold(schema, |node, key| {
        node.get("properties")
            .and_then(|properties| properties.get(*key))
            .unwrap_or_else(|| panic!("no property {key} on the way to {path:?}"))
    })
}

#[test]
fn the_committed_crd_file_equals_what_crdgen_prints() {
    let generated = crds_yaml().expect("the CRDs render");
    let committed = std::fs::read_to_string(committed_crds_path()).unwrap_or_default();
    assert!(
        generated == committed,
        "crds/{COMMITTED_CRDS} is out of date with the Rust types; regenerate it with\n    \
         cargo run -p switchyard-crds --bin crdgen > crds/{COMMITTED_CRDS}\n(or `make crds`)"
    );
}

#[test]
fn both_crds_are_cluster_scoped_with_their_short_names_and_a_status_subresource() {
    let crds = crds();
    let names: Vec<_> = crds
        .iter()
        .map(|crd| crd.metadata.name.clone().unwrap_or_default())
        .collect();
    assert_eq!(
        names,
        [
            "dataplaneconfigs.switchyard.dev",
            "dataplanenodes.switchyard.dev"
        ]
    );
    for (crd, short_name) in crds.iter().zip(["dpc", "dpn"]) {
        assert_eq!(crd.spec.scope, "Cluster");
        assert_eq!(crd.spec.group, "switchyard.dev");
        assert_eq!(
            crd.spec.names.short_names.as_deref(),
            Some(&[short_name.to_owned()][..])
        );
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1alpha1");
        assert!(version.served && version.storage);
        assert!(
            version
                .subresources
                .as_ref()
                .and_then(|subresources| subresources.status.as_ref())
                .is_some(),
            "{short_name} has the status subresource"
        );
    }
}

#[test]
fn printer_columns_are_the_ones_the_api_promises() {
    let columns = |index: usize| -> Vec<(String, String)> {
        crds()[index].spec.versions[0]
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|column| (column.name.clone(), column.json_path.clone()))
            .collect()
    };
    let owned = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(name, path)| (name.to_string(), path.to_string()))
            .collect()
    };
    assert_eq!(
        columns(0),
        owned(&[
            ("Mode", ".spec.mode"),
            ("Phase", ".status.phase"),
            ("Serving", ".status.servingSummary"),
            ("Age", ".metadata.creationTimestamp"),
        ])
    );
    assert_eq!(
        columns(1),
        owned(&[
            ("Mode", ".spec.mode"),
            ("Ready", ".status.conditions[?(@.type==\"Ready\")].status"),
            ("Cleanup", ".spec.iptablesCleanup"),
            ("Agent", ".status.agentVersion"),
        ])
    );
}

/// Walks every schema node and reports what a 1.20 API server (or `kubectl explain`) would
/// object to: a missing description or type, CEL rules, references, logical junctors other than
/// the int-or-string form, or keywords structural schemas forbid.
fn problems_in(schema: &Value, path: &str, problems: &mut Vec<String>) {
    let Some(object) = schema.as_object() else {
        problems.push(format!("{path}: not an object"));
        return;
    };
    if object
        .get("description")
        .and_then(Value::as_str)
        .is_none_or(|text| text.trim().is_empty())
    {
        problems.push(format!("{path}: no description"));
    }
    let int_or_string = object.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    if !int_or_string && object.get("type").and_then(Value::as_str).is_none() {
        problems.push(format!("{path}: no type"));
    }
    if int_or_string && object.contains_key("nullable") {
        problems.push(format!(
            "{path}: an int-or-string field must not be nullable"
        ));
    }
    for forbidden in [
        "x-kubernetes-validations",
        "$ref",
        "const",
        "oneOf",
        "allOf",
        "not",
        "definitions",
        "$schema",
    ] {
        if object.contains_key(forbidden) {
            problems.push(format!("{path}: uses {forbidden}"));
        }
    }
    if object.contains_key("anyOf") {
        problems.push(format!("{path}: uses anyOf"));
    }
    if let Some(format) = object.get("format").and_then(Value::as_str) {
        if !["int32", "int64", "date-time"].contains(&format) {
            problems.push(format!(
                "{path}: format {format} is not one the API server knows"
            ));
        }
    }
    if let Some(values) = object.get("enum").and_then(Value::as_array) {
        if values.iter().any(Value::is_null) {
            problems.push(format!("{path}: null among the enum values"));
        }
    }
    if let Some(properties) = object.get("properties").and_then(Value::as_object) {
        for (name, property) in properties {
            problems_in(property, &format!("{path}.{name}"), problems);
        }
        if let Some(required) = object.get("required").and_then(Value::as_array) {
            for name in required.iter().filter_map(Value::as_str) {
                if !properties.contains_key(name) {
                    problems.push(format!("{path}: requires {name}, which it does not define"));
                }
            }
        }
    }
    if let Some(items) = object.get("items") {
        problems_in(items, &format!("{path}[]"), problems);
    }
}

#[test]
fn every_field_has_a_description_and_the_schemas_are_structural_without_cel() {
    for kind in ["DataplaneConfig", "DataplaneNode"] {
        let mut problems = Vec::new();
        problems_in(&schema_of(kind), kind, &mut problems);
        assert!(problems.is_empty(), "{kind}:\n{}", problems.join("\n"));
    }
}

#[test]
fn the_rendered_yaml_has_no_cel_and_two_documents() {
    let yaml = crds_yaml().expect("the CRDs render");
    assert!(!yaml.contains("x-kubernetes-validations"));
    assert_eq!(
        yaml.matches("\n---\n").count() + usize::from(yaml.starts_with("---\n")),
        2
    );
    let documents: Vec<Value> = yaml
        .split("---\n")
        .filter(|document| !document.trim().is_empty())
        .map(|document| serde_yaml::from_str(document).expect("each document is YAML"))
        .collect();
    assert_eq!(documents.len(), 2);
    for document in documents {
        assert_eq!(document["apiVersion"], "apiextensions.k8s.io/v1");
        assert_eq!(document["kind"], "CustomResourceDefinition");
    }
}

#[test]
fn spec_defaults_are_in_the_schema_so_the_api_server_applies_them() {
    let schema = schema_of("DataplaneConfig");
    let spec = at(&schema, &["spec"]);
    assert_eq!(spec["required"], serde_json::json!(["mode"]));
    assert_eq!(at(&schema, &["spec", "paused"])["default"], false);
    assert_eq!(at(&schema, &["spec", "iptablesCleanup"])["default"], "Auto");
    assert_eq!(
        at(&schema, &["spec", "kubeProxy", "management"])["default"],
        "Managed"
    );
    assert_eq!(
        at(&schema, &["spec", "kubeProxy", "namespace"])["default"],
        "kube-system"
    );
    assert_eq!(
        at(&schema, &["spec", "kubeProxy", "daemonSetName"])["default"],
        "kube-proxy"
    );
    assert_eq!(
        at(&schema, &["spec", "rollout", "maxUnavailable"])["default"],
        1
    );
    assert_eq!(
        at(&schema, &["spec", "rollout", "nodeReadyTimeoutSeconds"])["default"],
        300
    );
    assert_eq!(
        at(&schema, &["spec", "rollout", "maxFailedNodes"])["default"],
        0
    );
    assert_eq!(
        at(&schema, &["spec", "rollout", "drainTimeoutSeconds"])["default"],
        600
    );
    // Absent parent objects get their children's defaults too.
    assert_eq!(
        at(&schema, &["spec", "rollout"])["default"]["drainTimeoutSeconds"],
        600
    );
    assert_eq!(
        at(&schema, &["spec", "kubeProxy"])["default"]["namespace"],
        "kube-system"
    );

    let node = schema_of("DataplaneNode");
    assert_eq!(
        at(&node, &["spec"])["required"],
        serde_json::json!(["mode"])
    );
    assert_eq!(at(&node, &["spec", "iptablesCleanup"])["default"], false);
    assert_eq!(at(&node, &["spec", "drainTimeoutSeconds"])["default"], 600);
}

#[test]
fn the_canary_is_opt_in_and_its_fields_default_only_inside_a_given_canary() {
    let schema = schema_of("DataplaneConfig");
    let rollout_default = &at(&schema, &["spec", "rollout"])["default"];
    // Opt-in: the server must not add a canary to a spec that has none.
    assert!(
        rollout_default.get("canary").is_none(),
        "the rollout default has no canary: {rollout_default}"
    );
    assert!(
        at(&schema, &["spec", "rollout", "canary"])
            .get("default")
            .is_none(),
        "rollout.canary has no default of its own"
    );
    // Control: a canary given as `{}` gets its soak from the schema.
    assert_eq!(
        at(&schema, &["spec", "rollout", "canary", "soakSeconds"])["default"],
        60
    );
}

#[test]
fn canary_budget_defaults_and_ranges_are_in_the_schema_so_older_objects_get_them() {
    let schema = schema_of("DataplaneConfig");
    let rollout_default = &at(&schema, &["spec", "rollout"])["default"];
    assert_eq!(rollout_default["onBudgetExceeded"], "Rollback");
    assert_eq!(
        rollout_default["disruptionBudget"]["failedConnectsPerMinute"],
        30
    );
    assert_eq!(
        at(&schema, &["spec", "rollout", "canary", "soakSeconds"])["minimum"],
        0.0
    );
    assert_eq!(
        at(&schema, &["spec", "rollout", "canary", "count"])["minimum"],
        1.0
    );
    assert_eq!(
        at(&schema, &["spec", "rollout", "onBudgetExceeded"])["enum"],
        serde_json::json!(["Rollback", "Halt"])
    );
    for field in [
        "failedConnectsPerMinute",
        "failedConnectsPercent",
        "resetsPerMinute",
        "resetsPercent",
        "probeFailuresPerMinute",
    ] {
        assert_eq!(
            at(&schema, &["spec", "rollout", "disruptionBudget", field])["minimum"],
            0.0,
            "{field}"
        );
    }
    let evidence = &at(&schema, &["status", "budgetExceeded", "evidence"])["items"];
    assert_eq!(
        evidence["properties"]["signal"]["enum"],
        serde_json::json!(["FailedConnects", "ResetsByPeer", "ProbeFailures"])
    );

    let node = schema_of("DataplaneNode");
    let window = at(&node, &["status", "disruption", "current"]);
    assert_eq!(window["properties"]["start"]["format"], "date-time");
    assert_eq!(
        window["properties"]["connections"]["properties"]["failedConnects"]["minimum"],
        0.0
    );
    assert!(
        at(&node, &["status"])["required"]
            .as_array()
            .is_none_or(|required| !required.iter().any(|name| name == "disruption")),
        "an agent that measures nothing stays valid"
    );
}

#[test]
fn enums_and_ranges_are_enforced_by_the_schema() {
    let schema = schema_of("DataplaneConfig");
    assert_eq!(
        at(&schema, &["spec", "mode"])["enum"],
        serde_json::json!(["KubeProxy", "Ebpf"])
    );
    assert_eq!(
        at(&schema, &["spec", "kubeProxy", "management"])["enum"],
        serde_json::json!(["Managed", "External"])
    );
    assert_eq!(
        at(&schema, &["spec", "iptablesCleanup"])["enum"],
        serde_json::json!(["Auto", "Disabled"])
    );
    assert_eq!(
        at(&schema, &["status", "phase"])["enum"],
        serde_json::json!([
            "Pending",
            "Preflight",
            "ActivatingNodes",
            "DisablingKubeProxy",
            "CleaningRules",
            "RestoringKubeProxy",
            "DeactivatingNodes",
            "UpgradingAgents",
            "Ready",
            "Paused",
            "Halted"
        ])
    );
    assert_eq!(
        at(&schema, &["spec", "rollout", "nodeReadyTimeoutSeconds"])["minimum"],
        1.0
    );
    assert_eq!(
        at(&schema, &["spec", "rollout", "maxFailedNodes"])["minimum"],
        0.0
    );
    assert_eq!(
        at(&schema, &["spec", "rollout", "drainTimeoutSeconds"])["minimum"],
        0.0
    );
    let max_unavailable = at(&schema, &["spec", "rollout", "maxUnavailable"]);
    assert_eq!(max_unavailable["x-kubernetes-int-or-string"], true);

    let conditions = at(&schema, &["status", "conditions"]);
    assert_eq!(conditions["x-kubernetes-list-type"], "map");
    assert_eq!(
        conditions["x-kubernetes-list-map-keys"],
        serde_json::json!(["type"])
    );
    let condition = &conditions["items"];
    // Kubernetes 1.20 takes "" in an array item for null: an empty message must stay valid.
    assert_eq!(condition["properties"]["message"]["nullable"], true);
    assert!(condition["properties"]["message"].get("default").is_none());
    assert_eq!(
        condition["properties"]["status"]["enum"],
        serde_json::json!(["True", "False", "Unknown"])
    );
    assert_eq!(
        condition["required"],
        serde_json::json!(["lastTransitionTime", "reason", "status", "type"])
    );

    let node = schema_of("DataplaneNode");
    assert_eq!(
        at(&node, &["spec", "mode"])["enum"],
        serde_json::json!(["KubeProxy", "Ebpf"])
    );
    assert_eq!(
        at(&node, &["status", "conditions"])["x-kubernetes-list-type"],
        "map"
    );
    assert_eq!(at(&node, &["status", "liveFlows"])["minimum"], 0.0);
    assert_eq!(at(&node, &["spec", "requestedAt"])["format"], "date-time");
}
