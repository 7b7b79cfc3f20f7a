//! The labels that hide a Service or an EndpointSlice from kube-proxy.
//!
//! kube-proxy's informers list Services and EndpointSlices with one label
//! selector, the same for both kinds in every release since 1.14
//! (`cmd/kube-proxy/app/server.go`): `service.kubernetes.io/service-proxy-name`
//! does not exist, and `service.kubernetes.io/headless` does not exist.
//! - A Service with a proxy name, whatever the value, belongs to another proxy;
//!   the EndpointSlice controller copies the Service's labels to its slices, so
//!   those are hidden too.
//! - The controller labels the slices of a Service without a cluster IP as
//!   headless.
//!
//! The agent watches with the same selector ([`KUBE_PROXY_LABEL_SELECTOR`]), and
//! the conversion to the model leaves such objects out as well, so that the
//! standalone mode's manifests (which no API server filters) and any object
//! that reaches the conversion another way behave the same.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// A Service (and its slices) owned by another proxy: any value.
pub const SERVICE_PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";
/// Set by the EndpointSlice controller on the slices of headless Services.
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";
/// kube-proxy's selector for both its Service and EndpointSlice informers.
pub const KUBE_PROXY_LABEL_SELECTOR: &str =
    "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";

/// Whether kube-proxy's selector leaves the object out.
pub fn hidden_from_kube_proxy(metadata: &ObjectMeta) -> bool {
    metadata.labels.as_ref().is_some_and(|labels| {
        labels.contains_key(SERVICE_PROXY_NAME_LABEL) || labels.contains_key(HEADLESS_LABEL)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labelled(labels: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            labels: Some(
                labels
                    .iter()
                    .map(|(key, value)| (key.to_string(), value.to_string()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn either_label_with_any_value_hides_an_object_and_other_labels_do_not() {
        assert!(hidden_from_kube_proxy(&labelled(&[(
            SERVICE_PROXY_NAME_LABEL,
            "cilium"
        )])));
        assert!(hidden_from_kube_proxy(&labelled(&[(
            SERVICE_PROXY_NAME_LABEL,
            ""
        )])));
        assert!(hidden_from_kube_proxy(&labelled(&[(HEADLESS_LABEL, "")])));
        assert!(!hidden_from_kube_proxy(&labelled(&[
            ("app", "web"),
            ("kubernetes.io/service-name", "web")
        ])));
        assert!(!hidden_from_kube_proxy(&ObjectMeta::default()));
    }

    fn service(labels: &str) -> k8s_openapi::api::core::v1::Service {
        serde_yaml::from_str(&format!(
            "metadata: {{name: web, namespace: default, labels: {{{labels}}}}}
spec: {{clusterIP: 10.96.0.10, ports: [{{port: 80}}]}}"
        ))
        .expect("a valid Service")
    }

    fn slice_yaml(labels: &str) -> String {
        format!(
            "metadata: {{name: web-1, namespace: default, labels: {{kubernetes.io/service-name: web{labels}}}}}
addressType: IPv4
ports: [{{port: 8080}}]
endpoints: [{{addresses: [10.0.0.5], nodeName: node-a}}]"
        )
    }

    fn v1_slice(labels: &str) -> Option<crate::model::EndpointSliceModel> {
        let object: k8s_openapi::api::discovery::v1::EndpointSlice =
            serde_yaml::from_str(&slice_yaml(labels)).expect("a valid EndpointSlice");
        crate::model::endpoint_slice_from_v1(&object).expect("converts")
    }

    fn v1beta1_slice(labels: &str) -> Option<crate::model::EndpointSliceModel> {
        let object: crate::model::v1beta1::EndpointSlice =
            serde_yaml::from_str(&slice_yaml(labels)).expect("a valid EndpointSlice");
        crate::model::v1beta1::endpoint_slice_from_v1beta1(&object).expect("converts")
    }

    #[test]
    fn a_service_owned_by_another_proxy_is_left_out_and_one_without_the_label_is_not() {
        let convert = |labels: &str| crate::model::service_from_v1(&service(labels));
        assert_eq!(
            convert("service.kubernetes.io/service-proxy-name: other-proxy"),
            Ok(None)
        );
        assert_eq!(convert("service.kubernetes.io/headless: ''"), Ok(None));
        let served = convert("app: web").expect("converts").expect("served");
        assert_eq!(served.name.name, "web");
    }

    #[test]
    fn slices_of_either_version_with_either_label_are_left_out_and_others_are_not() {
        for labels in [
            ", service.kubernetes.io/service-proxy-name: other-proxy",
            ", service.kubernetes.io/headless: ''",
        ] {
            assert_eq!(v1_slice(labels), None, "{labels}");
            assert_eq!(v1beta1_slice(labels), None, "{labels}");
        }
        assert_eq!(v1_slice("").expect("used").endpoints.len(), 1);
        assert_eq!(v1beta1_slice("").expect("used").endpoints.len(), 1);
    }

    #[test]
    fn the_selector_names_exactly_the_two_labels_as_absent() {
        assert_eq!(
            KUBE_PROXY_LABEL_SELECTOR,
            format!("!{SERVICE_PROXY_NAME_LABEL},!{HEADLESS_LABEL}")
        );
    }
}
