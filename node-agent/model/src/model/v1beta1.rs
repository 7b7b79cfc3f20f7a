//! `discovery.k8s.io/v1beta1` EndpointSlices, which k8s-openapi 0.29 no longer
//! has types for, and which Kubernetes 1.20 (the oldest test cluster) serves
//! instead of v1. The shape is v1's, except that the endpoint's node is in
//! `topology["kubernetes.io/hostname"]` (`nodeName` came later, behind a gate),
//! and that hints (1.21+) have zones only.

use std::collections::BTreeMap;

/// The parts v1beta1 shares with v1 (a v1beta1 server never sends the v1-only
/// `hints.forNodes`, 1.33+), so both versions read through one conversion.
pub use k8s_openapi::api::discovery::v1::{EndpointConditions, EndpointHints, EndpointPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::{
    endpoint_slice_fields, endpoint_slice_from_fields, EndpointFields, EndpointPortFields,
    EndpointSliceModel, FieldError,
};

pub const API_VERSION: &str = "discovery.k8s.io/v1beta1";

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSlice {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub address_type: String,
    #[serde(default)]
    pub endpoints: Vec<Endpoint>,
    #[serde(default)]
    pub ports: Option<Vec<EndpointPort>>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Endpoint {
    pub addresses: Vec<String>,
    pub conditions: Option<EndpointConditions>,
    pub hostname: Option<String>,
    pub node_name: Option<String>,
    pub topology: Option<BTreeMap<String, String>>,
    pub hints: Option<EndpointHints>,
}

/// A v1beta1 EndpointSlice in the model; `Ok(None)` for slices the datapath does
/// not use.
pub fn endpoint_slice_from_v1beta1(
    slice: &EndpointSlice,
) -> Result<Option<EndpointSliceModel>, FieldError> {
    endpoint_slice_fields!(slice, topology)
}
