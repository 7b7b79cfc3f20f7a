//! No DataplaneConfig named `default` (never created, or deleted): the missing DataplaneNodes
//! are created and cleanup is withdrawn wherever kube-proxy runs or could start; nothing else.
//!
//! Both are safe by construction. A created DataplaneNode asks for no cleanup, in the mode
//! [`created_mode`] picks from the whole cluster (a Node must not wait for a DataplaneConfig to
//! get one). A node told to clean kube-proxy's rules while kube-proxy runs there again (it came
//! back after the cluster had got rid of it) flaps between kube-proxy and eBPF until the
//! cleanup is withdrawn, DataplaneConfig or not. Everything else (switching modes, kube-proxy,
//! agent upgrades, a node's drain timeout) waits for a DataplaneConfig to ask for it.

use chrono::{DateTime, Utc};
use switchyard_crds::{DataplaneConfigSpec, DataplaneMode, DataplaneNodeSpec};

use super::{
    created_mode, DataplaneNodeWrite, KubeProxyDaemonSet, NodeFacts, ObservedCluster, ObservedNode,
    Plan,
};

/// The plan without a DataplaneConfig: `nodes` in node-name order, one per name.
pub(super) fn plan(
    nodes: &[&ObservedNode],
    observed: &ObservedCluster,
    now: DateTime<Utc>,
) -> Plan {
    let facts: Vec<NodeFacts> = nodes.iter().map(|node| NodeFacts::new(node)).collect();
    let kube_proxy_daemon_set = observed.kube_proxy_daemon_set.as_ref();
    // No transition is requested: `created_mode` decides from what the cluster shows alone.
    let created_mode = created_mode(DataplaneMode::KubeProxy, kube_proxy_daemon_set, &facts);
    let kube_proxy_schedules =
        kube_proxy_daemon_set.is_some_and(KubeProxyDaemonSet::would_schedule);
    let drain_timeout_seconds = DataplaneConfigSpec::default().rollout.drain_timeout_seconds;
    let dataplane_nodes = facts
        .iter()
        .filter_map(|node| {
            let spec = match node.spec {
                None => DataplaneNodeSpec {
                    mode: created_mode,
                    iptables_cleanup: false,
                    requested_at: Some(now),
                    drain_timeout_seconds,
                },
                Some(current)
                    if current.iptables_cleanup
                        && (kube_proxy_schedules || node.has_kube_proxy_pod()) =>
                {
                    // Only the cleanup changes: the node keeps its mode and drain timeout.
                    DataplaneNodeSpec {
                        iptables_cleanup: false,
                        requested_at: Some(now),
                        ..current.clone()
                    }
                }
                Some(_) => return None,
            };
            Some(DataplaneNodeWrite {
                node_name: node.name.to_owned(),
                create: node.spec.is_none(),
                spec,
            })
        })
        .collect();
    Plan {
        dataplane_nodes,
        ..Plan::nothing()
    }
}
