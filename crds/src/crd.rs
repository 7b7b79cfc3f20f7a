//! Rendering the CustomResourceDefinitions.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps,
};
use kube::CustomResourceExt;

use crate::{DataplaneConfig, DataplaneNode};

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Serializing a CustomResourceDefinition to YAML failed.
    #[error("failed to render the CustomResourceDefinition {name} as YAML")]
    RenderCrd {
        name: String,
        #[source]
        source: serde_yaml::Error,
    },
}

/// Both CustomResourceDefinitions of the API, `DataplaneConfig` first.
pub fn crds() -> Vec<CustomResourceDefinition> {
    let mut crds = vec![DataplaneConfig::crd(), DataplaneNode::crd()];
    for crd in &mut crds {
        for version in &mut crd.spec.versions {
            if let Some(schema) = version
                .schema
                .as_mut()
                .and_then(|validation| validation.open_api_v3_schema.as_mut())
            {
                make_int_or_string_not_nullable(schema);
            }
        }
    }
    crds
}

/// kube's schema rewriter marks int-or-string fields `nullable`. A null there would be kept
/// (defaults apply only to absent fields) and then fail to deserialize, so the schema must
/// reject it instead.
fn make_int_or_string_not_nullable(schema: &mut JSONSchemaProps) {
    if schema.x_kubernetes_int_or_string == Some(true) {
        schema.nullable = None;
    }
    for property in schema
        .properties
        .iter_mut()
        .flat_map(|properties| properties.values_mut())
    {
        make_int_or_string_not_nullable(property);
    }
    if let Some(k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaPropsOrArray::Schema(items)) = schema.items.as_mut() {
        make_int_or_string_not_nullable(items);
    }
}

/// Both CustomResourceDefinitions as multi-document YAML, exactly as committed in
/// `crds/switchyard.dev_crds.yaml`.
pub fn crds_yaml() -> Result<String, Error> {
    let mut rendered = String::new();
    for crd in crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let document =
            serde_yaml::to_string(&crd).map_err(|source| Error::RenderCrd { name, source })?;
        rendered.push_str("---\n");
        rendered.push_str(&document);
    }
    Ok(rendered)
}
