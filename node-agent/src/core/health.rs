//! What kube-proxy's `healthCheckNodePort`s answer, from the agent's view of the
//! cluster: for every `type: LoadBalancer` Service with
//! `externalTrafficPolicy: Local`, its ready endpoints on this node. Pure; the
//! replacement servers (`kube_proxy::health_server`) serve it once kube-proxy
//! has left the node.

use k8s_openapi::api::core::v1::Service;

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

/// How many distinct ready endpoints of `slices` (one Service's) run on
/// `node_name`: what its `healthCheckNodePort` reports (503 when zero).
pub fn local_endpoint_count(slices: &[&EndpointSliceModel], node_name: &str) -> usize {
    let mut addresses: Vec<_> = slices
        .iter()
        .flat_map(|slice| &slice.endpoints)
        .filter(|endpoint| endpoint.ready && endpoint.node_name.as_deref() == Some(node_name))
        .map(|endpoint| endpoint.address)
        .collect();
    addresses.sort();
    addresses.dedup();
    addresses.len()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::discovery::v1::EndpointSlice;

    use super::*;
    use crate::model::endpoint_slice_from_v1;

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
        let slice = slice();
        assert_eq!(local_endpoint_count(&[&slice], "node-1"), 1);
        assert_eq!(
            local_endpoint_count(&[&slice], "node-3"),
            0,
            "503 on a node without endpoints"
        );
    }

    #[test]
    fn an_endpoint_listed_in_two_slices_of_the_service_counts_once() {
        let first = slice();
        let mut second = slice();
        second.slice_name = crate::model::ServiceName::new("shop", "web-2");
        assert_eq!(local_endpoint_count(&[&first, &second], "node-1"), 1);
    }
}
