use super::*;
use crate::model::ServiceName;
use switchyard_crds::DataplaneMode;

fn parse_one(text: &str) -> Result<Manifests, Error> {
    parse(
        &[(PathBuf::from("/manifests/web.yaml"), text.to_string())],
        "node-a",
    )
}

const GOOD: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: http}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: shop
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [10.0.0.5]
  nodeName: node-a
---
# an empty document
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec: {}
---
apiVersion: switchyard.dev/v1alpha1
kind: DataplaneNode
metadata: {name: node-b}
spec: {mode: KubeProxy}
---
apiVersion: switchyard.dev/v1alpha1
kind: DataplaneNode
metadata: {name: node-a}
spec: {mode: Ebpf, drainTimeoutSeconds: 30}
"#;

#[test]
fn services_slices_and_this_nodes_dataplane_node_are_read_and_other_kinds_skipped() {
    let manifests = parse_one(GOOD).expect("parses");
    assert_eq!(manifests.services.len(), 1);
    assert_eq!(manifests.services[0].name, ServiceName::new("shop", "web"));
    assert_eq!(manifests.endpoint_slices.len(), 1);
    assert_eq!(
        manifests.endpoint_slices[0].endpoints[0]
            .node_name
            .as_deref(),
        Some("node-a")
    );
    let spec = manifests.dataplane_node.expect("node-a's DataplaneNode");
    assert_eq!(spec.mode, DataplaneMode::Ebpf);
    assert_eq!(spec.drain_timeout_seconds, 30);
}

#[test]
fn this_nodes_zone_is_read_from_its_node_and_a_second_one_is_an_error() {
    let nodes = "apiVersion: v1\nkind: Node\nmetadata: {name: node-b, labels: {topology.kubernetes.io/zone: zone-b}}\n---\napiVersion: v1\nkind: Node\nmetadata: {name: node-a, labels: {topology.kubernetes.io/zone: zone-a}}\n";
    assert_eq!(
        parse_one(nodes).expect("parses").node_zone.as_deref(),
        Some("zone-a")
    );
    assert_eq!(parse_one(GOOD).expect("parses").node_zone, None);
    let twice = format!("{nodes}---\napiVersion: v1\nkind: Node\nmetadata: {{name: node-a}}\n");
    match parse_one(&twice) {
        Err(Error::InvalidManifest { document, .. }) => assert_eq!(document, 3),
        other => panic!("expected a duplicate error, got {other:?}"),
    }
}

#[test]
fn a_list_and_a_v1beta1_slice_are_read() {
    let manifests = parse_one(
        r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: web}
  spec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}
- apiVersion: discovery.k8s.io/v1beta1
  kind: EndpointSlice
  metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
  addressType: IPv4
  ports: [{port: 8080}]
  endpoints: [{addresses: [10.0.0.5], topology: {kubernetes.io/hostname: node-a}}]
"#,
    )
    .expect("parses");
    assert_eq!(manifests.services.len(), 1);
    assert_eq!(
        manifests.endpoint_slices[0].endpoints[0]
            .node_name
            .as_deref(),
        Some("node-a")
    );
    assert_eq!(manifests.dataplane_node, None);
}

fn error_of(text: &str) -> (usize, String) {
    match parse_one(text) {
        Err(Error::InvalidManifest {
            path,
            document,
            field,
            ..
        }) => {
            assert_eq!(path, PathBuf::from("/manifests/web.yaml"));
            (document, field)
        }
        other => panic!("expected an invalid manifest, got {other:?}"),
    }
}

#[test]
fn a_bad_field_is_reported_with_file_document_and_field() {
    // A type error found by the deserializer.
    let (document, field) = error_of(
        "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: b}\nspec: {clusterIP: 10.96.0.2, ports: [{port: eighty}]}\n",
    );
    assert_eq!(document, 2);
    assert_eq!(field, "spec.ports[0].port");
    // A value found wrong by the model.
    let (document, field) = error_of(
        "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.96.0.999, ports: [{port: 80}]}\n",
    );
    assert_eq!((document, field.as_str()), (1, "spec.clusterIP"));
    // Inside a List.
    let (document, field) = error_of(
        "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Service, metadata: {name: a}, spec: {clusterIP: 10.96.0.1, ports: [{port: 0}]}}\n",
    );
    assert_eq!(
        (document, field.as_str()),
        (1, "items[0].spec.ports[0].port")
    );
    // A missing kind.
    let (_, field) = error_of("apiVersion: v1\nmetadata: {name: a}\n");
    assert_eq!(field, "kind");
    // Broken YAML.
    let (document, field) =
        error_of("apiVersion: v1\nkind: Service\nmetadata: {name: a}\n---\nkind: [unclosed\n");
    assert_eq!((document, field.as_str()), (2, "(document)"));
}

#[test]
fn an_object_defined_twice_is_an_error_naming_both_places() {
    let text = "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.96.0.1}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.96.0.2}\n";
    match parse_one(text) {
        Err(Error::InvalidManifest {
            document, reason, ..
        }) => {
            assert_eq!(document, 2);
            assert!(reason.contains("document 1"), "{reason}");
        }
        other => panic!("expected a duplicate error, got {other:?}"),
    }
}

#[test]
fn a_directory_is_read_in_name_order_ignoring_other_files() {
    let directory =
        std::env::temp_dir().join(format!("switchyard-manifests-test-{}", std::process::id()));
    std::fs::create_dir_all(&directory).expect("temp dir");
    std::fs::write(
        directory.join("b.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: {name: b}\nspec: {clusterIP: 10.96.0.2}\n",
    )
    .expect("write");
    std::fs::write(
        directory.join("a.yml"),
        "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.96.0.1}\n",
    )
    .expect("write");
    std::fs::write(directory.join("notes.txt"), "not: [yaml").expect("write");
    let loaded = load(&directory, "node-a");
    let print = fingerprint(&directory);
    std::fs::remove_dir_all(&directory).expect("cleanup");
    let names: Vec<String> = loaded
        .expect("loads")
        .services
        .iter()
        .map(|service| service.name.name.clone())
        .collect();
    assert_eq!(names, vec!["a", "b"]);
    assert_eq!(print.expect("fingerprints").len(), 2);
}

#[test]
fn the_cache_follows_changed_added_and_removed_files() {
    let directory = std::env::temp_dir().join(format!(
        "switchyard-manifest-cache-test-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&directory).expect("temp dir");
    let service = |name: &str, ip: &str| {
        format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\nspec: {{clusterIP: {ip}}}\n")
    };
    let names = |manifests: Manifests| -> Vec<String> {
        manifests
            .services
            .iter()
            .map(|service| format!("{}={}", service.name.name, service.cluster_ips[0]))
            .collect()
    };
    let mut cache = ManifestCache::default();
    std::fs::write(directory.join("a.yaml"), service("a", "10.96.0.1")).expect("write");
    std::fs::write(directory.join("b.yaml"), service("b", "10.96.0.2")).expect("write");
    let first = cache.load(&directory, "node-a");
    std::fs::write(directory.join("a.yaml"), service("a", "10.96.0.11")).expect("write");
    std::fs::remove_file(directory.join("b.yaml")).expect("remove");
    std::fs::write(directory.join("c.yaml"), service("c", "10.96.0.3")).expect("write");
    let second = cache.load(&directory, "node-a");
    // A Service moved into a second file is a duplicate naming both files.
    std::fs::write(directory.join("d.yaml"), service("c", "10.96.0.4")).expect("write");
    let duplicate = cache.load(&directory, "node-a");
    std::fs::remove_dir_all(&directory).expect("cleanup");
    assert_eq!(
        names(first.expect("loads")),
        vec!["a=10.96.0.1", "b=10.96.0.2"]
    );
    assert_eq!(
        names(second.expect("loads")),
        vec!["a=10.96.0.11", "c=10.96.0.3"]
    );
    match duplicate {
        Err(Error::InvalidManifest { path, reason, .. }) => {
            assert!(path.ends_with("d.yaml"), "{path:?}");
            assert!(reason.contains("c.yaml"), "{reason}");
        }
        other => panic!("expected a duplicate error, got {other:?}"),
    }
}
