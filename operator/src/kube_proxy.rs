//! Disabling and restoring the kube-proxy DaemonSet, decided from the object alone.
//!
//! Disabling adds one key to the pod template's nodeSelector
//! ([`DISABLED_SELECTOR_KEY`]` = `[`DISABLED_SELECTOR_VALUE`]) that no node carries, so the
//! DaemonSet controller removes kube-proxy from every node and starts it on none; the selector
//! the DaemonSet had before is recorded in the annotation [`PREVIOUS_SELECTOR_ANNOTATION`].
//! Restoring puts back exactly that selector (keys added since are removed, keys removed since
//! come back) and drops the annotation. Both are JSON merge patches carrying the
//! `resourceVersion` they were computed from, so the API server refuses them (409) when the
//! DaemonSet changed in between, and the next reconcile computes them again from what is there.
//!
//! A DaemonSet that another tool owns (Helm, Argo CD, Flux, the addon manager, an EKS, GKE or
//! AKS add-on) is never patched: that tool would put it back, and the two would fight.
//! [`external_owner`] names the tool and the mark found.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use kube::ResourceExt as _;
use serde_json::{json, Map, Value};

/// The nodeSelector key Switchyard adds to disable kube-proxy.
pub const DISABLED_SELECTOR_KEY: &str = "switchyard.dev/kube-proxy";
/// Its value. No node carries the label, so the DaemonSet schedules nowhere.
pub const DISABLED_SELECTOR_VALUE: &str = "disabled";
/// The annotation holding the nodeSelector as it was before Switchyard disabled kube-proxy:
/// a JSON object (`{}` when there was none).
pub const PREVIOUS_SELECTOR_ANNOTATION: &str = "switchyard.dev/previous-node-selector";

/// The nodeSelector of the DaemonSet's pod template (empty when it has none).
pub fn node_selector(daemon_set: &DaemonSet) -> BTreeMap<String, String> {
    daemon_set
        .spec
        .as_ref()
        .and_then(|spec| spec.template.spec.as_ref())
        .and_then(|pod_spec| pod_spec.node_selector.clone())
        .unwrap_or_default()
}

/// Whether the DaemonSet carries Switchyard's disabling nodeSelector.
pub fn disabled_by_switchyard(daemon_set: &DaemonSet) -> bool {
    node_selector(daemon_set)
        .get(DISABLED_SELECTOR_KEY)
        .is_some_and(|value| value == DISABLED_SELECTOR_VALUE)
}

/// The ownership mark of another tool that manages the DaemonSet, described for a human with
/// the tool named (`label kustomize.toolkit.fluxcd.io/name=infra (Flux)`), or `None` when
/// nothing but kubeadm-style manifests own it. Those tools would revert Switchyard's
/// nodeSelector, so `management: Managed` is refused on such a DaemonSet.
///
/// The most specific mark is named first: an object Flux installs through Helm carries both
/// Flux's and Helm's labels, and an AKS or GKE add-on both the cloud's mark and the addon
/// manager's, and the message should name who actually puts the object back.
pub fn external_owner(daemon_set: &DaemonSet) -> Option<String> {
    let metadata = &daemon_set.metadata;
    let labels = metadata.labels.as_ref();
    let annotations = metadata.annotations.as_ref();
    let label = |key: &str| labels.and_then(|labels| labels.get(key));
    let annotation = |key: &str| annotations.and_then(|annotations| annotations.get(key));
    let found = |kind: &str, key: &str, value: &str, owner: &str| {
        Some(format!("{kind} {key}={value} ({owner})"))
    };

    for (key, owner) in OWNER_LABELS {
        if let Some(value) = label(key) {
            return found("label", key, value, owner);
        }
    }
    for (key, owner) in OWNER_ANNOTATIONS {
        if let Some(value) = annotation(key) {
            return found("annotation", key, value, owner);
        }
    }
    // Argo CD's label tracking writes nothing but `app.kubernetes.io/instance=<application>`,
    // which many Helm charts and operators also set; alone it proves nothing. It counts
    // together with an annotation in Argo CD's own `argocd.argoproj.io/` prefix, which only
    // Argo CD (`installation-id`) or people syncing the object with Argo CD (`sync-options`,
    // `sync-wave`, ...) write. `compare-options: IgnoreExtraneous` is the exception: it tells
    // Argo CD the object is *not* one of the application's.
    if let Some(instance) = label(ARGO_CD_DEFAULT_TRACKING_LABEL) {
        let argo_cd_annotation = annotations.and_then(|annotations| {
            annotations.iter().find(|(key, value)| {
                key.starts_with(ARGO_CD_PREFIX)
                    && !(key.as_str() == ARGO_CD_COMPARE_OPTIONS
                        && value.contains("IgnoreExtraneous"))
            })
        });
        if let Some((key, value)) = argo_cd_annotation {
            return Some(format!(
                "label {ARGO_CD_DEFAULT_TRACKING_LABEL}={instance} with annotation {key}={value} (Argo CD label tracking)"
            ));
        }
    }
    // Last, because the marks above are more specific: Helm's standard label (other tools,
    // kustomize pipelines and operators, use the same label) and the addon manager, which
    // re-creates (EnsureExists) or reconciles (Reconcile) the object.
    if let Some(manager) = label(MANAGED_BY_LABEL) {
        return found("label", MANAGED_BY_LABEL, manager, manager);
    }
    if let Some(mode) = label(ADDON_MANAGER_LABEL) {
        return found("label", ADDON_MANAGER_LABEL, mode, "addon manager");
    }
    None
}

/// Argo CD's default tracking label (its `label` and `annotation+label` tracking methods).
const ARGO_CD_DEFAULT_TRACKING_LABEL: &str = "app.kubernetes.io/instance";
/// The prefix of every label and annotation Argo CD defines.
const ARGO_CD_PREFIX: &str = "argocd.argoproj.io/";
const ARGO_CD_COMPARE_OPTIONS: &str = "argocd.argoproj.io/compare-options";

/// Labels only one tool writes, with that tool's name.
const OWNER_LABELS: [(&str, &str); 7] = [
    // Flux's kustomize-controller and helm-controller label every object they apply with the
    // name and namespace of the Kustomization or HelmRelease.
    ("kustomize.toolkit.fluxcd.io/name", "Flux Kustomization"),
    (
        "kustomize.toolkit.fluxcd.io/namespace",
        "Flux Kustomization",
    ),
    ("helm.toolkit.fluxcd.io/name", "Flux HelmRelease"),
    ("helm.toolkit.fluxcd.io/namespace", "Flux HelmRelease"),
    // The tracking label Argo CD's documentation configures instead of the default one.
    ("argocd.argoproj.io/instance", "Argo CD"),
    // EKS labels the kube-proxy it installs (`eks.amazonaws.com/component: kube-proxy`),
    // whether as an EKS add-on (reconciled by EKS) or the self-managed default; the label
    // cannot tell them apart, so both are refused: a wrong refusal costs setting External, a
    // wrong patch a fight with EKS.
    ("eks.amazonaws.com/component", "EKS add-on"),
    // AKS labels the system components it manages in kube-system.
    ("kubernetes.azure.com/managedby", "AKS managed component"),
];

/// Annotations only one tool writes, with that tool's name.
const OWNER_ANNOTATIONS: [(&str, &str); 4] = [
    // Argo CD's `annotation` and `annotation+label` tracking methods.
    ("argocd.argoproj.io/tracking-id", "Argo CD"),
    // GKE names its add-ons (applied by GKE's addon manager) with this annotation.
    ("components.gke.io/component-name", "GKE add-on"),
    ("meta.helm.sh/release-name", "Helm"),
    ("meta.helm.sh/release-namespace", "Helm"),
];

/// The standard label naming the tool that manages an object (its value names the tool).
const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The addon manager's mode label (Kubernetes' cluster add-ons, GKE, AKS).
const ADDON_MANAGER_LABEL: &str = "addonmanager.kubernetes.io/mode";

/// Why a kube-proxy patch could not be computed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PatchRefusal {
    /// The DaemonSet has no `metadata.resourceVersion` (it was not read from the API), so the
    /// patch could not be guarded against concurrent changes.
    NoResourceVersion,
    /// The annotation recording the previous selector is not a JSON object of strings, so
    /// "exactly what was there" is unknown; a human has to look.
    UnreadablePreviousSelector(String),
}

impl std::fmt::Display for PatchRefusal {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoResourceVersion => formatter.write_str("the DaemonSet has no resourceVersion"),
            Self::UnreadablePreviousSelector(reason) => write!(
                formatter,
                "the annotation {PREVIOUS_SELECTOR_ANNOTATION} is not a JSON object of strings: {reason}"
            ),
        }
    }
}

/// The JSON merge patch that disables kube-proxy, or `None` when it is already disabled.
pub fn disable_patch(daemon_set: &DaemonSet) -> Result<Option<Value>, PatchRefusal> {
    if disabled_by_switchyard(daemon_set) {
        return Ok(None);
    }
    let resource_version = resource_version(daemon_set)?;
    let previous = serde_json::to_string(&node_selector(daemon_set))
        .map_err(|error| PatchRefusal::UnreadablePreviousSelector(error.to_string()))?;
    Ok(Some(json!({
        "metadata": {
            "resourceVersion": resource_version,
            "annotations": { PREVIOUS_SELECTOR_ANNOTATION: previous },
        },
        "spec": { "template": { "spec": { "nodeSelector": {
            DISABLED_SELECTOR_KEY: DISABLED_SELECTOR_VALUE,
        }}}},
    })))
}

/// The JSON merge patch that restores kube-proxy's previous nodeSelector exactly, or `None` when
/// Switchyard's selector is not there (nothing to restore). Without the annotation (someone
/// removed it), only Switchyard's key is removed.
pub fn restore_patch(daemon_set: &DaemonSet) -> Result<Option<Value>, PatchRefusal> {
    let current = node_selector(daemon_set);
    let has_annotation = daemon_set
        .annotations()
        .contains_key(PREVIOUS_SELECTOR_ANNOTATION);
    if !disabled_by_switchyard(daemon_set) && !current.contains_key(DISABLED_SELECTOR_KEY) {
        return Ok(None);
    }
    let resource_version = resource_version(daemon_set)?;
    let previous = match previous_selector(daemon_set)? {
        Some(previous) => previous,
        None => {
            let mut without_switchyard = current.clone();
            without_switchyard.remove(DISABLED_SELECTOR_KEY);
            without_switchyard
        }
    };
    // A merge patch sets the keys it names and removes those it sets to null.
    let mut selector_patch = Map::new();
    for key in current.keys() {
        if !previous.contains_key(key) {
            selector_patch.insert(key.clone(), Value::Null);
        }
    }
    for (key, value) in &previous {
        if current.get(key) != Some(value) {
            selector_patch.insert(key.clone(), Value::String(value.clone()));
        }
    }
    let mut metadata = json!({ "resourceVersion": resource_version });
    if has_annotation {
        metadata["annotations"] = json!({ PREVIOUS_SELECTOR_ANNOTATION: null });
    }
    Ok(Some(json!({
        "metadata": metadata,
        "spec": { "template": { "spec": { "nodeSelector": Value::Object(selector_patch) }}},
    })))
}

/// The nodeSelector recorded before disabling, `None` when the annotation is absent.
pub fn previous_selector(
    daemon_set: &DaemonSet,
) -> Result<Option<BTreeMap<String, String>>, PatchRefusal> {
    let Some(recorded) = daemon_set.annotations().get(PREVIOUS_SELECTOR_ANNOTATION) else {
        return Ok(None);
    };
    serde_json::from_str(recorded)
        .map(Some)
        .map_err(|error| PatchRefusal::UnreadablePreviousSelector(error.to_string()))
}

fn resource_version(daemon_set: &DaemonSet) -> Result<String, PatchRefusal> {
    daemon_set
        .metadata
        .resource_version
        .clone()
        .ok_or(PatchRefusal::NoResourceVersion)
}

#[cfg(test)]
mod tests;
