//! From the objects read from the API to the planner's [`ObservedCluster`]: a pure conversion,
//! so every rule about which pod belongs to which node, which revision is current and which
//! DaemonSet status can be trusted is unit-tested without a cluster.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod, PodCondition};
use kube::ResourceExt;
use switchyard_crds::DataplaneNode;

use crate::kube_proxy;
use crate::planner::{
    AgentDaemonSet, KubeProxyDaemonSet, ObservedCluster, ObservedNode, ObservedPod,
    UnsupportedService,
};

/// The label a DaemonSet puts on its pods and ControllerRevisions: the revision's hash.
pub const REVISION_HASH_LABEL: &str = "controller-revision-hash";

/// Everything one reconcile reads, shared with the stores it comes from (no copies).
#[derive(Clone, Debug, Default)]
pub struct ClusterObjects {
    pub nodes: Vec<Arc<Node>>,
    pub dataplane_nodes: Vec<Arc<DataplaneNode>>,
    /// The kube-proxy DaemonSet, if it exists.
    pub kube_proxy_daemon_set: Option<Arc<DaemonSet>>,
    /// Pods of the kube-proxy DaemonSet's namespace (others are filtered out here).
    pub kube_proxy_namespace_pods: Vec<Arc<Pod>>,
    /// The agent DaemonSet, if it exists.
    pub agent_daemon_set: Option<Arc<DaemonSet>>,
    /// ControllerRevisions of the agent DaemonSet's namespace.
    pub agent_namespace_revisions: Vec<Arc<ControllerRevision>>,
    /// Pods of the agent DaemonSet's namespace.
    pub agent_namespace_pods: Vec<Arc<Pod>>,
    /// The Services the eBPF datapath does not serve yet (summaries).
    pub unsupported_services: Vec<Arc<UnsupportedService>>,
}

/// Names the snapshot is built around.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotNames {
    pub kube_proxy_daemon_set: String,
    pub agent_daemon_set: String,
}

/// The planner's view of `objects` at `now`.
pub fn observe(
    objects: &ClusterObjects,
    names: &SnapshotNames,
    now: DateTime<Utc>,
    api_server_address_configured: bool,
) -> ObservedCluster {
    let dataplane_nodes: BTreeMap<&str, &Arc<DataplaneNode>> = objects
        .dataplane_nodes
        .iter()
        .filter_map(|dataplane_node| {
            Some((dataplane_node.metadata.name.as_deref()?, dataplane_node))
        })
        .collect();
    let kube_proxy_pods = pods_by_node(
        &objects.kube_proxy_namespace_pods,
        &names.kube_proxy_daemon_set,
    );
    let agent_pods = pods_by_node(&objects.agent_namespace_pods, &names.agent_daemon_set);

    let nodes = objects
        .nodes
        .iter()
        .map(|node| {
            let name = node.name_any();
            ObservedNode {
                ready: node_is_ready(node),
                labels: node.metadata.labels.clone().unwrap_or_default(),
                dataplane_node: dataplane_nodes
                    .get(name.as_str())
                    .map(|found| Arc::clone(found)),
                kube_proxy_pod: kube_proxy_pods.get(&name).cloned(),
                agent_pod: agent_pods.get(&name).cloned(),
                name,
            }
        })
        .collect();

    ObservedCluster {
        now,
        nodes,
        kube_proxy_daemon_set: objects
            .kube_proxy_daemon_set
            .as_ref()
            .map(|daemon_set| observe_kube_proxy(daemon_set)),
        agent_daemon_set: objects
            .agent_daemon_set
            .as_ref()
            .map(|daemon_set| AgentDaemonSet {
                update_revision: update_revision(daemon_set, &objects.agent_namespace_revisions),
            }),
        api_server_address_configured,
        unsupported_services: objects.unsupported_services.clone(),
    }
}

fn observe_kube_proxy(daemon_set: &DaemonSet) -> KubeProxyDaemonSet {
    let status_is_current = daemon_set.status.as_ref().is_some_and(|status| {
        status.observed_generation.is_some()
            && status.observed_generation == daemon_set.metadata.generation
    });
    KubeProxyDaemonSet {
        disabled_by_switchyard: kube_proxy::disabled_by_switchyard(daemon_set),
        desired_number_scheduled: if status_is_current {
            daemon_set
                .status
                .as_ref()
                .map(|status| status.desired_number_scheduled)
        } else {
            None
        },
        external_owner: kube_proxy::external_owner(daemon_set),
        // Asked by the controller (an API call), not read from the object.
        patch_allowed: None,
    }
}

/// A status condition of an API object. Each API group declares its own condition type
/// (`NodeCondition`, `PodCondition`, ...) with the same `type` and `status` fields.
trait StatusCondition {
    fn type_and_status(&self) -> (&str, &str);
}

impl StatusCondition for NodeCondition {
    fn type_and_status(&self) -> (&str, &str) {
        (&self.type_, &self.status)
    }
}

impl StatusCondition for PodCondition {
    fn type_and_status(&self) -> (&str, &str) {
        (&self.type_, &self.status)
    }
}

/// Whether `conditions` (absent: none reported yet) hold a condition `type_` that is `True`.
fn condition_is_true<C: StatusCondition>(conditions: Option<&Vec<C>>, type_: &str) -> bool {
    conditions.is_some_and(|conditions| {
        conditions
            .iter()
            .any(|condition| condition.type_and_status() == (type_, "True"))
    })
}

/// The Node's `Ready` condition is `True`.
pub fn node_is_ready(node: &Node) -> bool {
    condition_is_true(
        node.status
            .as_ref()
            .and_then(|status| status.conditions.as_ref()),
        "Ready",
    )
}

/// Whether the pod's controller is the DaemonSet named `daemon_set_name`. By name, not UID: the
/// pods of a DaemonSet that was deleted and recreated under the same name still count (they may
/// still run, and the new DaemonSet adopts them).
fn owned_by_daemon_set(pod: &Pod, daemon_set_name: &str) -> bool {
    pod.owner_references()
        .iter()
        .any(|owner| owner.kind == "DaemonSet" && owner.name == daemon_set_name)
}

/// The node a pod runs on: `spec.nodeName` once bound, else the node its DaemonSet's node
/// affinity (`matchFields metadata.name`) pins it to.
pub fn pod_node(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if let Some(node_name) = spec.node_name.as_ref().filter(|name| !name.is_empty()) {
        return Some(node_name.clone());
    }
    spec.affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms
        .iter()
        .flat_map(|term| term.match_fields.iter().flatten())
        .find(|requirement| requirement.key == "metadata.name" && requirement.operator == "In")
        .and_then(|requirement| requirement.values.as_ref()?.first().cloned())
}

fn observe_pod(pod: &Pod) -> ObservedPod {
    ObservedPod {
        name: pod.name_any(),
        ready: condition_is_true(
            pod.status
                .as_ref()
                .and_then(|status| status.conditions.as_ref()),
            "Ready",
        ),
        revision: pod.labels().get(REVISION_HASH_LABEL).cloned(),
        created_at: pod
            .metadata
            .creation_timestamp
            .as_ref()
            .and_then(|time| DateTime::from_timestamp(time.0.as_second(), 0)),
        terminating: pod.metadata.deletion_timestamp.is_some(),
    }
}

/// The DaemonSet's pod on each node. With two (an old one terminating, a new one starting), the
/// one not terminating is the node's pod: it is the one that will stay.
fn pods_by_node(pods: &[Arc<Pod>], daemon_set_name: &str) -> BTreeMap<String, ObservedPod> {
    let mut by_node: BTreeMap<String, ObservedPod> = BTreeMap::new();
    let mut owned: Vec<&Pod> = pods
        .iter()
        .map(Arc::as_ref)
        .filter(|pod| owned_by_daemon_set(pod, daemon_set_name))
        .collect();
    // Same input, same choice: order by name so ties do not depend on list order.
    owned.sort_by_key(|pod| pod.name_any());
    for pod in owned {
        let Some(node) = pod_node(pod) else { continue };
        let observed = observe_pod(pod);
        match by_node.get(&node) {
            Some(kept) if !kept.terminating => {}
            Some(_) if observed.terminating => {}
            _ => {
                by_node.insert(node, observed);
            }
        }
    }
    by_node
}

/// The revision the agent DaemonSet's pods should run: the `controller-revision-hash` of its
/// newest ControllerRevision (highest `revision`), `None` while none is known.
pub fn update_revision(
    daemon_set: &DaemonSet,
    revisions: &[Arc<ControllerRevision>],
) -> Option<String> {
    let uid = daemon_set.metadata.uid.as_deref()?;
    revisions
        .iter()
        .filter(|revision| {
            revision
                .owner_references()
                .iter()
                .any(|owner| owner.uid == uid && owner.controller == Some(true))
        })
        .max_by_key(|revision| revision.revision)
        .and_then(|revision| revision.labels().get(REVISION_HASH_LABEL).cloned())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::{DaemonSetSpec, DaemonSetStatus};
    use k8s_openapi::api::core::v1::{
        Affinity, NodeAffinity, NodeCondition, NodeSelector, NodeSelectorRequirement,
        NodeSelectorTerm, NodeStatus, PodCondition, PodSpec, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
    use switchyard_crds::{DataplaneMode, DataplaneNodeSpec};

    fn shared<T>(items: Vec<T>) -> Vec<Arc<T>> {
        items.into_iter().map(Arc::new).collect()
    }

    fn names() -> SnapshotNames {
        SnapshotNames {
            kube_proxy_daemon_set: "kube-proxy".into(),
            agent_daemon_set: "switchyard-agent".into(),
        }
    }

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-22T01:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    fn node(name: &str, ready: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(format!("uid-{name}")),
                ..ObjectMeta::default()
            },
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: ready.into(),
                    ..NodeCondition::default()
                }]),
                ..NodeStatus::default()
            }),
            ..Node::default()
        }
    }

    fn owner(kind: &str, name: &str, uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: "apps/v1".into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
            controller: Some(true),
            ..OwnerReference::default()
        }
    }

    fn pod(name: &str, daemon_set: &str, node: Option<&str>, revision: &str, ready: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                owner_references: Some(vec![owner("DaemonSet", daemon_set, "ds-uid")]),
                labels: Some(BTreeMap::from([(
                    REVISION_HASH_LABEL.into(),
                    revision.into(),
                )])),
                creation_timestamp: Some(Time(
                    k8s_openapi::jiff::Timestamp::from_second(now().timestamp() - 60).unwrap(),
                )),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: node.map(str::to_owned),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
        }
    }

    /// `pod` as its DaemonSet creates it before scheduling: pinned to `node` by node affinity.
    pub(crate) fn pinned_by_affinity(mut pod: Pod, node: &str) -> Pod {
        pod.spec.get_or_insert_with(PodSpec::default).affinity = Some(Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_fields: Some(vec![NodeSelectorRequirement {
                            key: "metadata.name".into(),
                            operator: "In".into(),
                            values: Some(vec![node.into()]),
                        }]),
                        ..NodeSelectorTerm::default()
                    }],
                }),
                ..NodeAffinity::default()
            }),
            ..Affinity::default()
        });
        pod
    }

    fn daemon_set(
        name: &str,
        generation: i64,
        observed_generation: i64,
        desired: i32,
    ) -> DaemonSet {
        DaemonSet {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some("ds-uid".into()),
                generation: Some(generation),
                resource_version: Some("1".into()),
                ..ObjectMeta::default()
            },
            spec: Some(DaemonSetSpec::default()),
            status: Some(DaemonSetStatus {
                observed_generation: Some(observed_generation),
                desired_number_scheduled: desired,
                ..DaemonSetStatus::default()
            }),
        }
    }

    fn revision(hash: &str, number: i64, owner_uid: &str) -> ControllerRevision {
        ControllerRevision {
            metadata: ObjectMeta {
                name: Some(format!("switchyard-agent-{hash}")),
                labels: Some(BTreeMap::from([(REVISION_HASH_LABEL.into(), hash.into())])),
                owner_references: Some(vec![owner("DaemonSet", "switchyard-agent", owner_uid)]),
                ..ObjectMeta::default()
            },
            revision: number,
            data: None,
        }
    }

    #[test]
    fn every_node_is_observed_with_its_dataplane_node_and_pods() {
        let mut labelled = node("a", "True");
        labelled.metadata.labels = Some(BTreeMap::from([(
            "switchyard.dev/canary".to_owned(),
            "true".to_owned(),
        )]));
        let objects = ClusterObjects {
            nodes: shared(vec![labelled, node("b", "False")]),
            dataplane_nodes: shared(vec![
                DataplaneNode::new("a", DataplaneNodeSpec::new(DataplaneMode::Ebpf)),
                DataplaneNode::new("gone", DataplaneNodeSpec::new(DataplaneMode::Ebpf)),
            ]),
            kube_proxy_namespace_pods: shared(vec![
                pod("kube-proxy-1", "kube-proxy", Some("a"), "k1", true),
                pod("coredns-1", "coredns", Some("a"), "c1", true),
            ]),
            agent_namespace_pods: shared(vec![pod(
                "agent-1",
                "switchyard-agent",
                Some("b"),
                "r1",
                false,
            )]),
            ..ClusterObjects::default()
        };
        let observed = observe(&objects, &names(), now(), true);
        assert_eq!(observed.now, now());
        assert!(observed.api_server_address_configured);
        assert_eq!(observed.nodes.len(), 2);
        let a = &observed.nodes[0];
        assert_eq!((a.name.as_str(), a.ready), ("a", true));
        assert_eq!(
            a.dataplane_node.as_ref().map(|dpn| dpn.spec.mode),
            Some(DataplaneMode::Ebpf)
        );
        assert_eq!(
            a.kube_proxy_pod.as_ref().map(|pod| pod.name.as_str()),
            Some("kube-proxy-1")
        );
        assert_eq!(a.agent_pod, None);
        assert_eq!(
            a.labels.get("switchyard.dev/canary").map(String::as_str),
            Some("true"),
            "the Node's labels, for a canary nodeSelector"
        );
        let b = &observed.nodes[1];
        assert!(b.labels.is_empty());
        assert!(!b.ready);
        assert_eq!(b.dataplane_node, None);
        assert_eq!(
            b.kube_proxy_pod, None,
            "a pod of another DaemonSet is no kube-proxy pod"
        );
        let agent = b.agent_pod.as_ref().unwrap();
        assert_eq!(
            (agent.name.as_str(), agent.ready, agent.revision.as_deref()),
            ("agent-1", false, Some("r1"))
        );
        assert_eq!(
            agent.created_at,
            Some(now() - chrono::Duration::seconds(60))
        );
        assert_eq!(observed.kube_proxy_daemon_set, None);
        assert_eq!(observed.agent_daemon_set, None);
        assert!(observed.unsupported_services.is_empty());
    }

    #[test]
    fn the_unsupported_services_are_shared_with_the_snapshot() {
        let pbx = Arc::new(UnsupportedService {
            namespace: "shop".into(),
            name: "pbx".into(),
            uid: None,
            features: vec![crate::planner::UnsupportedFeature::SctpPorts],
        });
        let objects = ClusterObjects {
            unsupported_services: vec![Arc::clone(&pbx)],
            ..ClusterObjects::default()
        };
        let observed = observe(&objects, &names(), now(), true);
        assert_eq!(observed.unsupported_services.len(), 1);
        assert!(Arc::ptr_eq(&observed.unsupported_services[0], &pbx));
    }

    #[test]
    fn a_pending_daemon_set_pod_belongs_to_the_node_its_affinity_names() {
        let pending = pinned_by_affinity(pod("kube-proxy-x", "kube-proxy", None, "k1", false), "b");
        assert_eq!(pod_node(&pending), Some("b".into()));
        let objects = ClusterObjects {
            nodes: shared(vec![node("b", "True")]),
            kube_proxy_namespace_pods: shared(vec![pending]),
            ..ClusterObjects::default()
        };
        let observed = observe(&objects, &names(), now(), true);
        assert!(observed.nodes[0].kube_proxy_pod.is_some());
    }

    #[test]
    fn a_terminating_kube_proxy_pod_still_counts_and_yields_to_its_replacement() {
        let mut old = pod("kube-proxy-old", "kube-proxy", Some("a"), "k1", true);
        old.metadata.deletion_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(now().timestamp()).unwrap(),
        ));
        let alone = ClusterObjects {
            nodes: shared(vec![node("a", "True")]),
            kube_proxy_namespace_pods: shared(vec![old.clone()]),
            ..ClusterObjects::default()
        };
        let observed = observe(&alone, &names(), now(), true);
        assert!(
            observed.nodes[0]
                .kube_proxy_pod
                .as_ref()
                .unwrap()
                .terminating
        );

        for order in [
            vec![
                old.clone(),
                pod("kube-proxy-new", "kube-proxy", Some("a"), "k2", false),
            ],
            vec![
                pod("kube-proxy-new", "kube-proxy", Some("a"), "k2", false),
                old.clone(),
            ],
        ] {
            let both = ClusterObjects {
                nodes: shared(vec![node("a", "True")]),
                kube_proxy_namespace_pods: shared(order),
                ..ClusterObjects::default()
            };
            let kept = observe(&both, &names(), now(), true).nodes[0]
                .kube_proxy_pod
                .clone()
                .unwrap();
            assert_eq!(kept.name, "kube-proxy-new");
        }
    }

    #[test]
    fn a_daemon_set_status_counts_only_when_it_is_current() {
        let mut objects = ClusterObjects {
            kube_proxy_daemon_set: Some(Arc::new(daemon_set("kube-proxy", 2, 2, 0))),
            ..ClusterObjects::default()
        };
        let current = observe(&objects, &names(), now(), true)
            .kube_proxy_daemon_set
            .unwrap();
        assert_eq!(current.desired_number_scheduled, Some(0));
        assert!(!current.would_schedule());

        objects.kube_proxy_daemon_set = Some(Arc::new(daemon_set("kube-proxy", 3, 2, 0)));
        let stale = observe(&objects, &names(), now(), true)
            .kube_proxy_daemon_set
            .unwrap();
        assert_eq!(
            stale.desired_number_scheduled, None,
            "a stale status proves nothing"
        );
        assert!(stale.would_schedule());
    }

    #[test]
    fn the_kube_proxy_daemon_set_reports_switchyards_selector_and_other_owners() {
        let mut daemon_set = daemon_set("kube-proxy", 1, 1, 3);
        daemon_set.spec.as_mut().unwrap().template.spec = Some(PodSpec {
            node_selector: Some(BTreeMap::from([(
                kube_proxy::DISABLED_SELECTOR_KEY.into(),
                kube_proxy::DISABLED_SELECTOR_VALUE.into(),
            )])),
            ..PodSpec::default()
        });
        daemon_set.metadata.labels = Some(BTreeMap::from([(
            "app.kubernetes.io/managed-by".into(),
            "Helm".into(),
        )]));
        let objects = ClusterObjects {
            kube_proxy_daemon_set: Some(Arc::new(daemon_set)),
            ..ClusterObjects::default()
        };
        let observed = observe(&objects, &names(), now(), false)
            .kube_proxy_daemon_set
            .unwrap();
        assert!(observed.disabled_by_switchyard);
        assert!(observed.external_owner.unwrap().contains("Helm"));
    }

    #[test]
    fn the_agent_update_revision_is_the_newest_revision_the_daemon_set_owns() {
        let agent = daemon_set("switchyard-agent", 1, 1, 3);
        let revisions = shared(vec![
            revision("old", 1, "ds-uid"),
            revision("new", 2, "ds-uid"),
            revision("foreign", 9, "other-uid"),
        ]);
        assert_eq!(update_revision(&agent, &revisions), Some("new".into()));
        assert_eq!(update_revision(&agent, &[]), None);
        let objects = ClusterObjects {
            agent_daemon_set: Some(Arc::new(agent)),
            agent_namespace_revisions: revisions,
            ..ClusterObjects::default()
        };
        assert_eq!(
            observe(&objects, &names(), now(), true).agent_daemon_set,
            Some(AgentDaemonSet {
                update_revision: Some("new".into())
            })
        );
    }

    #[test]
    fn a_node_without_a_ready_condition_is_not_ready() {
        assert!(!node_is_ready(&Node::default()));
        assert!(node_is_ready(&node("a", "True")));
        assert!(!node_is_ready(&node("a", "Unknown")));
    }
}
