//! What kube-proxy's `healthCheckNodePort`s answer, from the agent's view of the
//! cluster: for every `type: LoadBalancer` Service with
//! `externalTrafficPolicy: Local`, its ready endpoints on this node. Pure; the
//! replacement servers (`kube_proxy::health_server`) serve it once kube-proxy
//! has left the node.

use k8s_openapi::api::core::v1::Service;

use crate::kube_proxy::health::LocalServiceHealth;
use crate::model::{EndpointSliceModel, ServiceModel};

/// A Service as the agent keeps it: the datapath's model and, for
/// `externalTrafficPolicy: Local` LoadBalancers, the health check port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceEntry {
    pub model: ServiceModel,
    pub health_check_node_port: Option<u16>,
}

impl From<ServiceModel> for ServiceEntry {
    fn from(model: ServiceModel) -> Self {
        Self {
            model,
            health_check_node_port: None,
        }
    }
}

/// The `healthCheckNodePort` of a Service kube-proxy would serve one for.
pub fn health_check_node_port(service: &Service) -> Option<u16> {
    let spec = service.spec.as_ref()?;
    if spec.type_.as_deref() != Some("LoadBalancer")
        || spec.external_traffic_policy.as_deref() != Some("Local")
    {
        return None;
    }
    spec.health_check_node_port
        .and_then(|port| u16::try_from(port).ok())
        .filter(|port| *port != 0)
}

/// Every health-checked Service with its ready endpoints on `node_name`.
pub fn local_service_health(
    services: &[ServiceEntry],
    slices: &[EndpointSliceModel],
    node_name: &str,
) -> Vec<LocalServiceHealth> {
    let mut health: Vec<LocalServiceHealth> = services
        .iter()
        .filter_map(|entry| {
            let port = entry.health_check_node_port?;
            let name = &entry.model.name;
            let mut addresses: Vec<_> = slices
                .iter()
                .filter(|slice| &slice.service == name)
                .flat_map(|slice| &slice.endpoints)
                .filter(|endpoint| {
                    endpoint.ready && endpoint.node_name.as_deref() == Some(node_name)
                })
                .map(|endpoint| endpoint.address)
                .collect();
            addresses.sort();
            addresses.dedup();
            Some(LocalServiceHealth {
                health_check_node_port: port,
                namespace: name.namespace.clone(),
                name: name.name.clone(),
                local_endpoints: addresses.len(),
            })
        })
        .collect();
    health.sort();
    health
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::discovery::v1::EndpointSlice;

    use super::*;
    use crate::model::{endpoint_slice_from_v1, service_from_v1};

    fn service(type_: &str, policy: &str) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"type": type_, "clusterIP": "10.96.0.20", "externalTrafficPolicy": policy,
                     "healthCheckNodePort": 32000,
                     "ports": [{"name": "http", "port": 80, "nodePort": 30080, "protocol": "TCP"}]}
        }))
        .expect("a valid Service")
    }

    fn slice() -> EndpointSliceModel {
        let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-1", "namespace": "shop",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": ["10.244.1.5"], "nodeName": "node-1", "conditions": {"ready": true}},
                {"addresses": ["10.244.1.6"], "nodeName": "node-1", "conditions": {"ready": false}},
                {"addresses": ["10.244.2.5"], "nodeName": "node-2", "conditions": {"ready": true}}
            ]
        }))
        .expect("a valid EndpointSlice");
        endpoint_slice_from_v1(&slice)
            .expect("converts")
            .expect("used")
    }

    fn entry(service: &Service) -> ServiceEntry {
        ServiceEntry {
            model: service_from_v1(service).expect("converts").expect("used"),
            health_check_node_port: health_check_node_port(service),
        }
    }

    #[test]
    fn only_local_load_balancers_get_a_health_check_port() {
        assert_eq!(
            health_check_node_port(&service("LoadBalancer", "Local")),
            Some(32000)
        );
        assert_eq!(
            health_check_node_port(&service("LoadBalancer", "Cluster")),
            None
        );
        assert_eq!(health_check_node_port(&service("NodePort", "Local")), None);
    }

    #[test]
    fn the_answer_counts_ready_endpoints_on_this_node_only() {
        let services = [entry(&service("LoadBalancer", "Local"))];
        let on_node_1 = local_service_health(&services, &[slice()], "node-1");
        assert_eq!(
            on_node_1,
            vec![LocalServiceHealth {
                health_check_node_port: 32000,
                namespace: "shop".into(),
                name: "web".into(),
                local_endpoints: 1,
            }]
        );
        let on_node_3 = local_service_health(&services, &[slice()], "node-3");
        assert_eq!(
            on_node_3[0].local_endpoints, 0,
            "503 on a node without endpoints"
        );
        let cluster_policy = [entry(&service("LoadBalancer", "Cluster"))];
        assert!(local_service_health(&cluster_policy, &[slice()], "node-1").is_empty());
    }
}
