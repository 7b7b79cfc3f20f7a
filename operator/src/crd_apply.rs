//! Applying the operator's own CustomResourceDefinitions at start.
//!
//! Helm installs `crds/` once and never upgrades them, so a chart upgrade that adds a field
//! would leave the old schema served (and the API server would prune the new field). The
//! operator therefore applies the CRDs it was built with by Server-Side Apply, as field manager
//! `switchyard-operator`, at every start (`--apply-crds=false` turns this off where GitOps owns
//! CRDs), and waits until the API server reports them `Established`.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};

use crate::controller::FIELD_MANAGER;
use crate::error::Error;

/// Applies `crds` and waits up to `timeout` for each to be `Established`.
pub async fn apply_crds(
    client: Client,
    crds: &[CustomResourceDefinition],
    timeout: Duration,
) -> Result<(), Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for crd in crds {
        let name = crd.name_any();
        api.patch(&name, &params, &Patch::Apply(crd))
            .await
            .map_err(|source| Error::ApplyCrd {
                name: name.clone(),
                source: source.into(),
            })?;
        tracing::info!(crd = %name, "applied CustomResourceDefinition");
    }
    let deadline = tokio::time::Instant::now() + timeout;
    for crd in crds {
        let name = crd.name_any();
        loop {
            let current = api.get(&name).await.map_err(|source| Error::ApplyCrd {
                name: name.clone(),
                source: source.into(),
            })?;
            if is_established(&current) {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(crd = %name, "CustomResourceDefinition not Established yet; continuing");
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

/// The API server serves the CRD (`Established` is `True`).
pub fn is_established(crd: &CustomResourceDefinition) -> bool {
    crd.status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|condition| condition.type_ == "Established" && condition.status == "True")
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceDefinitionCondition, CustomResourceDefinitionStatus,
    };

    #[test]
    fn a_crd_is_established_only_when_the_server_says_so() {
        let mut crd = switchyard_crds::crds().remove(0);
        assert!(!is_established(&crd));
        crd.status = Some(CustomResourceDefinitionStatus {
            conditions: Some(vec![CustomResourceDefinitionCondition {
                type_: "Established".into(),
                status: "True".into(),
                ..CustomResourceDefinitionCondition::default()
            }]),
            ..CustomResourceDefinitionStatus::default()
        });
        assert!(is_established(&crd));
    }

    #[test]
    fn the_applied_crds_carry_their_kind_for_server_side_apply() {
        for crd in switchyard_crds::crds() {
            let applied = serde_json::to_value(&crd).unwrap();
            assert_eq!(applied["apiVersion"], "apiextensions.k8s.io/v1");
            assert_eq!(applied["kind"], "CustomResourceDefinition");
            assert!(applied["metadata"]["name"]
                .as_str()
                .unwrap()
                .ends_with(".switchyard.dev"));
        }
    }
}
