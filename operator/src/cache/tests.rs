use super::*;
use k8s_openapi::api::core::v1::PodCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, OwnerReference};
use kube::runtime::reflector;
use switchyard_crds::{DataplaneMode, DataplaneNodeSpec};

#[test]
fn the_watches_of_the_kinds_the_operator_writes_report_its_writes_and_no_other_watch_does() {
    use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
    assert_eq!(
        WrittenKind::of::<DataplaneConfig>(),
        Some(WrittenKind::DataplaneConfig)
    );
    assert_eq!(
        WrittenKind::of::<DataplaneNode>(),
        Some(WrittenKind::DataplaneNode)
    );
    assert_eq!(WrittenKind::of::<DaemonSet>(), Some(WrittenKind::DaemonSet));
    assert_eq!(WrittenKind::of::<Pod>(), Some(WrittenKind::Pod));
    assert_eq!(WrittenKind::of::<Node>(), None);
    assert_eq!(WrittenKind::of::<ControllerRevision>(), None);
}

fn dataplane_node(name: &str, version: &str) -> DataplaneNode {
    let mut node = DataplaneNode::new(name, DataplaneNodeSpec::new(DataplaneMode::Ebpf));
    node.metadata.resource_version = Some(version.into());
    node
}

fn written(name: &str) -> WrittenObject {
    WrittenObject::new(WrittenKind::DataplaneNode, None, name)
}

fn apply(name: &str, version: &str) -> watcher::Event<DataplaneNode> {
    watcher::Event::Apply(dataplane_node(name, version))
}

/// A write to DataplaneNode `name` begun, and answered by the API server with `version`.
fn answered(writes: &OwnWrites, name: &str, version: &str) {
    writes.begin(&written(name));
    writes.written(&written(name), Some(version.into()));
}

/// The DataplaneNode watch reports `name` at `version`.
fn watched(writes: &OwnWrites, name: &str, version: &str) {
    writes.observe(WrittenKind::DataplaneNode, &apply(name, version));
}

#[test]
fn a_write_is_pending_until_its_version_comes_back_through_the_watch() {
    let writes = OwnWrites::default();
    writes.begin(&written("a"));
    assert_eq!(writes.pending(), 1);
    writes.written(&written("a"), Some("7".into()));
    watched(&writes, "a", "6");
    assert_eq!(writes.pending(), 1, "an older version proves nothing");
    watched(&writes, "b", "7");
    assert_eq!(writes.pending(), 1, "another object proves nothing");
    writes.observe(WrittenKind::DataplaneConfig, &apply("a", "7"));
    assert_eq!(writes.pending(), 1, "another kind proves nothing");
    watched(&writes, "a", "7");
    assert_eq!(writes.pending(), 0);
}

#[test]
fn a_watch_event_that_arrives_before_the_answer_still_counts() {
    let writes = OwnWrites::default();
    writes.begin(&written("a"));
    watched(&writes, "a", "7");
    watched(&writes, "a", "8");
    assert_eq!(writes.pending(), 1, "the answer is not in yet");
    writes.written(&written("a"), Some("7".into()));
    assert_eq!(writes.pending(), 0);
}

#[test]
fn a_second_write_to_the_same_object_is_waited_for_too() {
    let writes = OwnWrites::default();
    answered(&writes, "a", "7");
    writes.begin(&written("a"));
    watched(&writes, "a", "7");
    assert_eq!(writes.pending(), 1, "the second write is still in flight");
    writes.written(&written("a"), Some("9".into()));
    assert_eq!(writes.pending(), 1);
    watched(&writes, "a", "9");
    assert_eq!(writes.pending(), 0);
}

#[test]
fn a_failed_write_or_one_without_a_version_leaves_nothing_to_wait_for() {
    let writes = OwnWrites::default();
    writes.begin(&written("a"));
    writes.begin(&written("b"));
    writes.abandon(&written("a"));
    writes.written(&written("b"), None);
    assert_eq!(writes.pending(), 0);
}

#[test]
fn a_deletion_is_observed_by_the_delete_event() {
    let writes = OwnWrites::default();
    writes.begin(&written("a"));
    writes.deleted(&written("a"));
    watched(&writes, "a", "3");
    assert_eq!(writes.pending(), 1);
    writes.observe(
        WrittenKind::DataplaneNode,
        &watcher::Event::Delete(dataplane_node("a", "4")),
    );
    assert_eq!(writes.pending(), 0);
}

#[test]
fn a_relist_proves_only_the_writes_answered_before_it_started() {
    let writes = OwnWrites::default();
    answered(&writes, "answered", "7");
    writes.begin(&written("in-flight"));
    writes.observe::<DataplaneNode>(WrittenKind::DataplaneNode, &watcher::Event::Init);
    writes.written(&written("in-flight"), Some("8".into()));
    writes.observe::<DataplaneNode>(WrittenKind::DataplaneNode, &watcher::Event::InitDone);
    assert_eq!(
        writes.pending(),
        1,
        "a list that may have started before the answer may miss the write"
    );
    watched(&writes, "in-flight", "8");
    assert_eq!(writes.pending(), 0);
}

#[tokio::test]
async fn waiting_ends_when_the_last_write_is_observed_or_fails_after_the_timeout() {
    let writes = Arc::new(OwnWrites::default());
    writes
        .wait_until_observed(Duration::from_millis(10))
        .await
        .expect("nothing pending");
    answered(&writes, "a", "7");
    let error = writes
        .wait_until_observed(Duration::from_millis(10))
        .await
        .expect_err("still pending");
    assert!(matches!(error, Error::ObserveOwnWrites { pending: 1, .. }));
    let waiter = {
        let writes = writes.clone();
        tokio::spawn(async move { writes.wait_until_observed(Duration::from_secs(5)).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    watched(&writes, "a", "7");
    waiter.await.expect("joined").expect("observed");
}

fn ready_condition(status: &str) -> NodeCondition {
    NodeCondition {
        type_: "Ready".into(),
        status: status.into(),
        message: Some("kubelet is posting ready status".into()),
        ..NodeCondition::default()
    }
}

#[test]
fn a_trimmed_node_keeps_its_identity_labels_and_readiness_only() {
    let mut node = Node {
        metadata: ObjectMeta {
            name: Some("a".into()),
            uid: Some("uid-a".into()),
            resource_version: Some("5".into()),
            labels: Some(BTreeMap::from([("zone".into(), "x".into())])),
            managed_fields: Some(vec![ManagedFieldsEntry::default()]),
            ..ObjectMeta::default()
        },
        status: Some(NodeStatus {
            conditions: Some(vec![
                NodeCondition {
                    type_: "MemoryPressure".into(),
                    status: "False".into(),
                    ..NodeCondition::default()
                },
                ready_condition("True"),
            ]),
            ..NodeStatus::default()
        }),
        ..Node::default()
    };
    trim_node(&mut node);
    assert_eq!(node.metadata.name.as_deref(), Some("a"));
    assert_eq!(node.metadata.uid.as_deref(), Some("uid-a"));
    assert_eq!(node.metadata.resource_version.as_deref(), Some("5"));
    // Labels stay: a canary nodeSelector (spec.rollout.canary) matches them.
    assert_eq!(
        node.metadata.labels,
        Some(BTreeMap::from([("zone".into(), "x".into())]))
    );
    assert_eq!(node.metadata.managed_fields, None);
    let conditions = node.status.as_ref().unwrap().conditions.as_ref().unwrap();
    assert_eq!(conditions.len(), 1);
    assert_eq!(conditions[0].message, None);
    assert!(snapshot::node_is_ready(&node));
}

fn daemon_set_pod(owner_kind: &str) -> Pod {
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("kube-proxy-x".into()),
            namespace: Some("kube-system".into()),
            uid: Some("uid-p".into()),
            labels: Some(BTreeMap::from([
                (REVISION_HASH_LABEL.into(), "r1".into()),
                ("k8s-app".into(), "kube-proxy".into()),
            ])),
            owner_references: Some(vec![OwnerReference {
                kind: owner_kind.into(),
                name: "kube-proxy".into(),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        }),
    };
    snapshot::tests::pinned_by_affinity(pod, "node-b")
}

#[test]
fn a_trimmed_pod_keeps_what_the_snapshot_reads() {
    let mut pod = daemon_set_pod("DaemonSet");
    trim_pod(&mut pod);
    assert_eq!(snapshot::pod_node(&pod).as_deref(), Some("node-b"));
    assert_eq!(pod.spec.as_ref().unwrap().affinity, None);
    assert_eq!(
        pod.labels().get(REVISION_HASH_LABEL).map(String::as_str),
        Some("r1")
    );
    assert_eq!(pod.labels().len(), 1);
    assert_eq!(pod.owner_references().len(), 1);
    assert_eq!(pod.metadata.uid.as_deref(), Some("uid-p"));
    assert_eq!(pod.metadata.namespace.as_deref(), Some("kube-system"));
    assert_eq!(
        pod.status.as_ref().unwrap().conditions.as_ref().unwrap()[0].status,
        "True"
    );
}

#[test]
fn only_daemon_set_pods_reach_the_store() {
    let mut foreign = daemon_set_pod("ReplicaSet");
    trim_pod(&mut foreign);
    assert!(!owned_by_a_daemon_set(&foreign));
    assert!(only_daemon_set_pods(watcher::Event::InitApply(foreign.clone())).is_none());
    assert!(matches!(
        only_daemon_set_pods(watcher::Event::Apply(foreign.clone())),
        Some(watcher::Event::Delete(_))
    ));
    let mut owned = daemon_set_pod("DaemonSet");
    trim_pod(&mut owned);
    assert!(matches!(
        only_daemon_set_pods(watcher::Event::Apply(owned)),
        Some(watcher::Event::Apply(_))
    ));
    assert!(matches!(
        only_daemon_set_pods(watcher::Event::<Pod>::InitDone),
        Some(watcher::Event::InitDone)
    ));
}

#[test]
fn a_snapshot_from_the_stores_takes_each_daemon_set_and_its_namespaces_pods() {
    let (configs, _configs_writer) = reflector::store::<DataplaneConfig>();
    let (nodes, _nodes_writer) = reflector::store::<Node>();
    let (dataplane_nodes, mut dataplane_nodes_writer) = reflector::store::<DataplaneNode>();
    let (daemon_sets, mut daemon_sets_writer) = reflector::store::<DaemonSet>();
    let (pods, mut pods_writer) = reflector::store::<Pod>();
    let (revisions, _revisions_writer) = reflector::store::<ControllerRevision>();
    let daemon_set = |namespace: &str, name: &str| DaemonSet {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..ObjectMeta::default()
        },
        ..DaemonSet::default()
    };
    for set in [
        daemon_set("kube-system", "kube-proxy"),
        daemon_set("kube-system", "other"),
    ] {
        daemon_sets_writer.apply_watcher_event(&watcher::Event::Apply(set));
    }
    dataplane_nodes_writer.apply_watcher_event(&apply("a", "1"));
    let mut kube_proxy_pod = daemon_set_pod("DaemonSet");
    trim_pod(&mut kube_proxy_pod);
    let mut elsewhere = kube_proxy_pod.clone();
    elsewhere.metadata.namespace = Some("monitoring".into());
    for pod in [kube_proxy_pod, elsewhere] {
        pods_writer.apply_watcher_event(&watcher::Event::Apply(pod));
    }
    let stores = Stores {
        configs,
        nodes,
        dataplane_nodes,
        daemon_sets,
        pods,
        revisions,
        unsupported_services: Arc::default(),
    };
    let objects = stores.objects(
        &KubeProxySpec::default(),
        "switchyard-system",
        "switchyard-agent",
    );
    assert_eq!(
        objects
            .kube_proxy_daemon_set
            .as_ref()
            .and_then(|set| set.metadata.name.as_deref()),
        Some("kube-proxy")
    );
    assert_eq!(objects.kube_proxy_namespace_pods.len(), 1);
    assert_eq!(objects.dataplane_nodes.len(), 1);
    assert!(objects.agent_daemon_set.is_none());
    assert!(
        objects.agent_namespace_pods.is_empty(),
        "without the agent DaemonSet its pods are not read"
    );
    assert!(stores.config("default").is_none());
}
