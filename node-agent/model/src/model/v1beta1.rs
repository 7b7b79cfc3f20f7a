//! `discovery.k8s.io/v1beta1` EndpointSlices, which k8s-openapi 0.29 no longer
//! has types for, and which Kubernetes 1.20 (the oldest test cluster) serves
//! instead of v1. The shape is v1's, except that the endpoint's node is in
//! `topology["kubernetes.io/hostname"]` (`nodeName` came later, behind a gate),
//! and that hints (1.21+) have zones only.

use std::collections::BTreeMap;

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
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    #[serde(default)]
    pub addresses: Vec<String>,
    #[serde(default)]
    pub conditions: Option<EndpointConditions>,
    #[serde(default)]
    pub hostname: Option<String>,
    #[serde(default)]
    pub node_name: Option<String>,
    #[serde(default)]
    pub topology: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub hints: Option<EndpointHints>,
}

/// `hints` of a v1beta1 endpoint (TopologyAwareHints, 1.21+).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointHints {
    #[serde(default)]
    pub for_zones: Option<Vec<ForZone>>,
    /// Not in the v1beta1 API (`forNodes` is v1 only, 1.33+), so always absent
    /// from a server's objects; here so that both versions read through one
    /// conversion.
    #[serde(default)]
    pub for_nodes: Option<Vec<ForNode>>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ForZone {
    pub name: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ForNode {
    pub name: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointConditions {
    #[serde(default)]
    pub ready: Option<bool>,
    #[serde(default)]
    pub serving: Option<bool>,
    #[serde(default)]
    pub terminating: Option<bool>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointPort {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub protocol: Option<String>,
    #[serde(default)]
    pub port: Option<i32>,
    #[serde(default)]
    pub app_protocol: Option<String>,
}

/// A v1beta1 EndpointSlice in the model; `Ok(None)` for slices the datapath does
/// not use.
pub fn endpoint_slice_from_v1beta1(
    slice: &EndpointSlice,
) -> Result<Option<EndpointSliceModel>, FieldError> {
    endpoint_slice_fields!(slice, topology)
}
