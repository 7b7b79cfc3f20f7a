//! Kubernetes objects e2e tests create on the 1.20 API server.
//!
//! The 1.20 server serves EndpointSlices as `discovery.k8s.io/v1beta1` only,
//! and k8s-openapi (built for 1.33) has no v1beta1 types, so slices are
//! dynamic objects here.

use std::net::Ipv4Addr;

use k8s_openapi::api::apps::v1::DaemonSet;
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use kube::{Api, Client};

use crate::error::{E2eError, Result};

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Slices the tests write carry this manager, so no controller claims them.
pub const SLICE_MANAGER: &str = "switchyard-e2e";

pub fn endpoint_slice_v1beta1_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("discovery.k8s.io", "v1beta1", "EndpointSlice"),
        "endpointslices",
    )
}

pub fn endpoint_slices_v1beta1(client: &Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        namespace,
        &endpoint_slice_v1beta1_resource(),
    )
}

/// One ready endpoint: an address on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub address: Ipv4Addr,
    pub node: String,
}

/// A v1beta1 EndpointSlice for a selectorless Service's TCP port.
pub fn endpoint_slice_v1beta1(
    namespace: &str,
    name: &str,
    service: &str,
    port_name: &str,
    port: u16,
    endpoints: &[Endpoint],
) -> Result<DynamicObject> {
    let endpoints: Vec<serde_json::Value> = endpoints
        .iter()
        .map(|endpoint| {
            serde_json::json!({
                "addresses": [endpoint.address.to_string()],
                "conditions": {"ready": true},
                "topology": {"kubernetes.io/hostname": endpoint.node},
            })
        })
        .collect();
    let value = serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1beta1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                SERVICE_NAME_LABEL: service,
                "endpointslice.kubernetes.io/managed-by": SLICE_MANAGER,
            },
        },
        "addressType": "IPv4",
        "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
        "endpoints": endpoints,
    });
    serde_json::from_value(value).map_err(|error| E2eError::ParseManifest {
        name: format!("EndpointSlice {namespace}/{name}"),
        source: serde::de::Error::custom(error.to_string()),
    })
}

/// Reads a manifest shipped in `e2e/manifests/`.
pub fn manifest<T: serde::de::DeserializeOwned>(file_name: &str) -> Result<T> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("manifests")
        .join(file_name);
    let text = std::fs::read_to_string(&path).map_err(|source| E2eError::ReadFile {
        path: path.clone(),
        source,
    })?;
    serde_yaml::from_str(&text).map_err(|source| E2eError::ParseManifest {
        name: path.display().to_string(),
        source,
    })
}

/// Creates the kube-proxy DaemonSet of `e2e/manifests/kube-proxy.yaml`,
/// replacing one left from an earlier test.
pub async fn create_kube_proxy_daemonset(client: &Client) -> Result<DaemonSet> {
    let daemonset: DaemonSet = manifest("kube-proxy.yaml")?;
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), "kube-system");
    let name = daemonset.metadata.name.clone().unwrap_or_default();
    if api
        .get_opt(&name)
        .await
        .map_err(|source| E2eError::Kubernetes {
            action: format!("look up DaemonSet kube-system/{name}"),
            source,
        })?
        .is_some()
    {
        api.delete(&name, &DeleteParams::foreground())
            .await
            .map_err(|source| E2eError::Kubernetes {
                action: format!("delete the old DaemonSet kube-system/{name}"),
                source,
            })?;
    }
    // Deletion is asynchronous (the pods go first): wait until the name is free.
    crate::wait::wait_for(
        &format!("see the old DaemonSet kube-system/{name} gone"),
        crate::wait::WaitOptions::new(std::time::Duration::from_secs(60)),
        || async {
            Ok::<_, kube::Error>(match api.get_opt(&name).await? {
                None => crate::wait::Check::Ready(()),
                Some(_) => crate::wait::Check::NotYet("it still exists".to_string()),
            })
        },
    )
    .await?;
    api.create(&PostParams::default(), &daemonset)
        .await
        .map_err(|source| E2eError::Kubernetes {
            action: format!("create DaemonSet kube-system/{name}"),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slice_names_its_service_and_manager_and_lists_every_endpoint() {
        let slice = endpoint_slice_v1beta1(
            "default",
            "web-1",
            "web",
            "http",
            8080,
            &[
                Endpoint {
                    address: Ipv4Addr::new(10, 244, 2, 10),
                    node: "node-2".into(),
                },
                Endpoint {
                    address: Ipv4Addr::new(10, 244, 3, 10),
                    node: "node-3".into(),
                },
            ],
        )
        .unwrap();
        let labels = slice.metadata.labels.clone().unwrap();
        assert_eq!(labels[SERVICE_NAME_LABEL], "web");
        assert_eq!(
            labels["endpointslice.kubernetes.io/managed-by"],
            SLICE_MANAGER
        );
        assert_eq!(slice.data["ports"][0]["port"], 8080);
        assert_eq!(slice.data["endpoints"][1]["addresses"][0], "10.244.3.10");
        let types = slice.types.unwrap();
        assert_eq!(types.api_version, "discovery.k8s.io/v1beta1");
    }

    #[test]
    fn the_kube_proxy_manifest_runs_iptables_mode_with_the_node_name() {
        let daemonset: DaemonSet = manifest("kube-proxy.yaml").unwrap();
        let container = &daemonset.spec.unwrap().template.spec.unwrap().containers[0];
        assert_eq!(
            container.image.as_deref(),
            Some("registry.k8s.io/kube-proxy:v1.20.2")
        );
        let command = container.command.clone().unwrap();
        assert!(command.contains(&"--proxy-mode=iptables".to_string()));
        assert!(command.contains(&"--hostname-override=$(NODE_NAME)".to_string()));
        assert!(command.contains(&"--conntrack-max-per-core=0".to_string()));
    }
}
