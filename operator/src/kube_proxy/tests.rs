use super::*;
use k8s_openapi::api::apps::v1::DaemonSetSpec;
use k8s_openapi::api::core::v1::{PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

fn daemon_set(selector: &[(&str, &str)]) -> DaemonSet {
    DaemonSet {
        metadata: ObjectMeta {
            name: Some("kube-proxy".into()),
            namespace: Some("kube-system".into()),
            resource_version: Some("41".into()),
            ..ObjectMeta::default()
        },
        spec: Some(DaemonSetSpec {
            template: PodTemplateSpec {
                spec: Some(PodSpec {
                    node_selector: string_map(selector),
                    ..PodSpec::default()
                }),
                ..PodTemplateSpec::default()
            },
            ..DaemonSetSpec::default()
        }),
        status: None,
    }
}

/// `pairs` as the map of an object's field (absent when empty, as the API server returns it).
fn string_map(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    (!pairs.is_empty()).then(|| {
        pairs
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect()
    })
}

/// What the API server does with a JSON merge patch (RFC 7386).
fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(target), Value::Object(patch)) => {
            for (key, value) in patch {
                if value.is_null() {
                    target.remove(key);
                } else {
                    merge(target.entry(key.clone()).or_insert(Value::Null), value);
                }
            }
        }
        (target, patch) => *target = patch.clone(),
    }
}

fn apply(daemon_set: &DaemonSet, patch: &Value) -> DaemonSet {
    let mut value = serde_json::to_value(daemon_set).unwrap();
    if value["spec"]["template"]["spec"]["nodeSelector"].is_null() {
        // The API server drops empty maps, so a patch always finds an object to merge into.
        value["spec"]["template"]["spec"]["nodeSelector"] = json!({});
    }
    if value["metadata"]["annotations"].is_null() {
        value["metadata"]["annotations"] = json!({});
    }
    merge(&mut value, patch);
    serde_json::from_value(value).unwrap()
}

#[test]
fn disabling_adds_a_selector_no_node_matches_and_records_the_previous_one() {
    let before = daemon_set(&[("kubernetes.io/os", "linux")]);
    let patch = disable_patch(&before).unwrap().unwrap();
    assert_eq!(patch["metadata"]["resourceVersion"], "41");
    let after = apply(&before, &patch);
    assert!(disabled_by_switchyard(&after));
    assert_eq!(
        node_selector(&after)
            .get("kubernetes.io/os")
            .map(String::as_str),
        Some("linux")
    );
    assert_eq!(
        previous_selector(&after).unwrap().unwrap(),
        BTreeMap::from([("kubernetes.io/os".to_owned(), "linux".to_owned())])
    );
}

#[test]
fn restoring_puts_back_exactly_the_selector_that_was_there() {
    for selector in [
        vec![],
        vec![("kubernetes.io/os", "linux")],
        vec![("kubernetes.io/os", "linux"), ("node-role", "worker")],
    ] {
        let original = daemon_set(&selector);
        let disabled = apply(&original, &disable_patch(&original).unwrap().unwrap());
        let restored = apply(&disabled, &restore_patch(&disabled).unwrap().unwrap());
        assert_eq!(
            node_selector(&restored),
            node_selector(&original),
            "selector {selector:?}"
        );
        assert!(!disabled_by_switchyard(&restored));
        assert_eq!(
            previous_selector(&restored).unwrap(),
            None,
            "the annotation is left behind"
        );
    }
}

#[test]
fn restoring_removes_keys_added_while_disabled_and_brings_back_keys_removed() {
    let original = daemon_set(&[("kubernetes.io/os", "linux")]);
    let mut disabled = apply(&original, &disable_patch(&original).unwrap().unwrap());
    // Someone edits the selector while kube-proxy is disabled.
    let pod_spec = disabled
        .spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap();
    let selector = pod_spec.node_selector.as_mut().unwrap();
    selector.remove("kubernetes.io/os");
    selector.insert("added-later".into(), "yes".into());
    let restored = apply(&disabled, &restore_patch(&disabled).unwrap().unwrap());
    assert_eq!(node_selector(&restored), node_selector(&original));
}

#[test]
fn disabling_twice_changes_nothing_the_second_time() {
    let original = daemon_set(&[]);
    let disabled = apply(&original, &disable_patch(&original).unwrap().unwrap());
    assert_eq!(disable_patch(&disabled).unwrap(), None);
}

#[test]
fn restoring_a_daemon_set_switchyard_never_disabled_changes_nothing() {
    assert_eq!(
        restore_patch(&daemon_set(&[("kubernetes.io/os", "linux")])).unwrap(),
        None
    );
}

#[test]
fn a_selector_reset_while_disabled_is_disabled_again_and_the_reset_selector_recorded() {
    let original = daemon_set(&[("kubernetes.io/os", "linux")]);
    let disabled = apply(&original, &disable_patch(&original).unwrap().unwrap());
    // `kubeadm upgrade` rewrites the template: Switchyard's key is gone, the stale annotation
    // may stay.
    let mut reset = disabled.clone();
    reset
        .spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap()
        .node_selector = Some(BTreeMap::from([
        ("kubernetes.io/os".into(), "linux".into()),
        ("new".into(), "x".into()),
    ]));
    assert!(!disabled_by_switchyard(&reset));
    let disabled_again = apply(&reset, &disable_patch(&reset).unwrap().unwrap());
    let restored = apply(
        &disabled_again,
        &restore_patch(&disabled_again).unwrap().unwrap(),
    );
    assert_eq!(node_selector(&restored), node_selector(&reset));
}

#[test]
fn restoring_without_the_annotation_removes_only_switchyards_key() {
    let mut disabled = daemon_set(&[
        ("kubernetes.io/os", "linux"),
        (DISABLED_SELECTOR_KEY, DISABLED_SELECTOR_VALUE),
    ]);
    disabled.metadata.annotations = None;
    let patch = restore_patch(&disabled).unwrap().unwrap();
    assert!(patch["metadata"].get("annotations").is_none());
    let restored = apply(&disabled, &patch);
    assert_eq!(
        node_selector(&restored),
        BTreeMap::from([("kubernetes.io/os".into(), "linux".into())])
    );
}

#[test]
fn an_unreadable_recorded_selector_refuses_to_guess() {
    let original = daemon_set(&[]);
    let mut disabled = apply(&original, &disable_patch(&original).unwrap().unwrap());
    disabled
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(PREVIOUS_SELECTOR_ANNOTATION.into(), "not json".into());
    assert!(matches!(
        restore_patch(&disabled),
        Err(PatchRefusal::UnreadablePreviousSelector(_))
    ));
}

#[test]
fn a_patch_is_never_computed_without_a_resource_version_to_guard_it() {
    let mut unread = daemon_set(&[]);
    unread.metadata.resource_version = None;
    assert_eq!(disable_patch(&unread), Err(PatchRefusal::NoResourceVersion));
}

/// The kube-proxy DaemonSet with the labels and annotations another tool writes.
fn marked(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> DaemonSet {
    let mut daemon_set = daemon_set(&[("kubernetes.io/os", "linux")]);
    daemon_set.metadata.labels = string_map(labels);
    daemon_set.metadata.annotations = string_map(annotations);
    daemon_set
}

/// The owner found names the tool (so the refusal does) and the mark that gave it away.
fn assert_owner(daemon_set: &DaemonSet, tool: &str, mark: &str) {
    let owner = external_owner(daemon_set);
    assert!(
        owner
            .as_deref()
            .is_some_and(|owner| owner.contains(&format!("({tool}")) && owner.contains(mark)),
        "expected {tool} through {mark}, found {owner:?}"
    );
}

#[test]
fn a_helm_release_is_an_external_owner() {
    let helm = marked(
        &[
            ("app.kubernetes.io/managed-by", "Helm"),
            ("k8s-app", "kube-proxy"),
        ],
        &[
            ("meta.helm.sh/release-name", "kube-proxy"),
            ("meta.helm.sh/release-namespace", "kube-system"),
        ],
    );
    assert_owner(&helm, "Helm", "meta.helm.sh/release-name=kube-proxy");
    let label_only = marked(&[("app.kubernetes.io/managed-by", "Helm")], &[]);
    assert_owner(&label_only, "Helm", "app.kubernetes.io/managed-by=Helm");
}

#[test]
fn argo_cd_annotation_tracking_alone_or_with_its_label_is_an_external_owner() {
    for label in [
        // What Argo CD's `annotation` tracking method (the default since 3.0) writes.
        ("k8s-app", "kube-proxy"),
        // What its `annotation+label` tracking method writes.
        ("app.kubernetes.io/instance", "cluster-addons"),
    ] {
        let tracked = marked(
            &[label],
            &[(
                "argocd.argoproj.io/tracking-id",
                "cluster-addons:apps/DaemonSet:kube-system/kube-proxy",
            )],
        );
        assert_owner(&tracked, "Argo CD", "argocd.argoproj.io/tracking-id");
    }
}

#[test]
fn argo_cd_label_tracking_with_its_documented_custom_label_is_an_external_owner() {
    let tracked = marked(&[("argocd.argoproj.io/instance", "cluster-addons")], &[]);
    assert_owner(
        &tracked,
        "Argo CD",
        "argocd.argoproj.io/instance=cluster-addons",
    );
}

#[test]
fn argo_cd_default_label_tracking_with_an_argo_cd_annotation_is_an_external_owner() {
    for annotation in [
        ("argocd.argoproj.io/installation-id", "platform-argocd"),
        ("argocd.argoproj.io/sync-options", "Prune=false"),
        ("argocd.argoproj.io/sync-wave", "-1"),
    ] {
        let tracked = marked(
            &[
                ("app.kubernetes.io/instance", "cluster-addons"),
                ("k8s-app", "kube-proxy"),
            ],
            &[annotation],
        );
        assert_owner(&tracked, "Argo CD label tracking", annotation.0);
    }
}

#[test]
fn the_instance_label_alone_is_not_taken_for_argo_cd() {
    // Set by many charts and operators; Argo CD's label tracking cannot be told from them.
    let chart_labelled = marked(
        &[
            ("app.kubernetes.io/instance", "kube-proxy"),
            ("k8s-app", "kube-proxy"),
        ],
        &[("deprecated.daemonset.template.generation", "1")],
    );
    assert_eq!(external_owner(&chart_labelled), None);
    // Argo CD's own way of saying "not one of the application's resources".
    let extraneous = marked(
        &[("app.kubernetes.io/instance", "cluster-addons")],
        &[("argocd.argoproj.io/compare-options", "IgnoreExtraneous")],
    );
    assert_eq!(external_owner(&extraneous), None);
}

#[test]
fn a_flux_kustomization_is_an_external_owner() {
    let applied = marked(
        &[
            ("k8s-app", "kube-proxy"),
            ("kustomize.toolkit.fluxcd.io/name", "infrastructure"),
            ("kustomize.toolkit.fluxcd.io/namespace", "flux-system"),
        ],
        &[],
    );
    assert_owner(
        &applied,
        "Flux Kustomization",
        "kustomize.toolkit.fluxcd.io/name=infrastructure",
    );
}

#[test]
fn a_flux_helm_release_is_named_as_flux_rather_than_helm() {
    // helm-controller installs through Helm, so Helm's marks are there too; Flux is the one
    // that would put the DaemonSet back.
    let released = marked(
        &[
            ("app.kubernetes.io/managed-by", "Helm"),
            ("helm.toolkit.fluxcd.io/name", "kube-proxy"),
            ("helm.toolkit.fluxcd.io/namespace", "kube-system"),
        ],
        &[
            ("meta.helm.sh/release-name", "kube-proxy"),
            ("meta.helm.sh/release-namespace", "kube-system"),
        ],
    );
    assert_owner(
        &released,
        "Flux HelmRelease",
        "helm.toolkit.fluxcd.io/name=kube-proxy",
    );
}

#[test]
fn the_eks_kube_proxy_add_on_is_an_external_owner() {
    let eks = marked(
        &[
            ("eks.amazonaws.com/component", "kube-proxy"),
            ("k8s-app", "kube-proxy"),
        ],
        &[("deprecated.daemonset.template.generation", "1")],
    );
    assert_owner(&eks, "EKS add-on", "eks.amazonaws.com/component=kube-proxy");
}

#[test]
fn the_aks_kube_proxy_is_named_as_aks_rather_than_the_addon_manager() {
    let aks = marked(
        &[
            ("addonmanager.kubernetes.io/mode", "Reconcile"),
            ("component", "kube-proxy"),
            ("kubernetes.azure.com/managedby", "aks"),
            ("tier", "node"),
        ],
        &[],
    );
    assert_owner(
        &aks,
        "AKS managed component",
        "kubernetes.azure.com/managedby=aks",
    );
}

#[test]
fn a_gke_add_on_is_named_as_gke_rather_than_the_addon_manager() {
    let gke = marked(
        &[
            ("addonmanager.kubernetes.io/mode", "Reconcile"),
            ("k8s-app", "kube-proxy"),
        ],
        &[
            ("components.gke.io/component-name", "kube-proxy"),
            ("components.gke.io/component-version", "1.0.0"),
            ("components.gke.io/layer", "addon"),
        ],
    );
    assert_owner(
        &gke,
        "GKE add-on",
        "components.gke.io/component-name=kube-proxy",
    );
}

#[test]
fn the_addon_manager_is_an_external_owner() {
    for mode in ["Reconcile", "EnsureExists"] {
        let addon = marked(&[("addonmanager.kubernetes.io/mode", mode)], &[]);
        assert_owner(&addon, "addon manager", mode);
    }
}

#[test]
fn a_kubeadm_daemon_set_has_no_external_owner() {
    let mut kubeadm = daemon_set(&[("kubernetes.io/os", "linux")]);
    kubeadm.metadata.labels = Some(BTreeMap::from([("k8s-app".into(), "kube-proxy".into())]));
    kubeadm.metadata.annotations = Some(BTreeMap::from([(
        "deprecated.daemonset.template.generation".into(),
        "1".into(),
    )]));
    assert_eq!(external_owner(&kubeadm), None);
}
