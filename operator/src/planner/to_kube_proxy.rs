//! Ebpf -> KubeProxy: cleanup withdrawn, kube-proxy restored and healthy, then nodes back in
//! batches (see the module documentation of [`super`]).

use switchyard_crds::{reasons, DataplaneMode, DataplanePhase, KubeProxyManagement};

use super::context::{Context, Decision, DesiredNode};
use super::{name_list, naming, KubeProxyAction};

impl<'a> Context<'a> {
    /// Ebpf -> KubeProxy, from wherever the cluster stands.
    pub(super) fn toward_kube_proxy(&self) -> Decision {
        // A missing DataplaneNode is created on eBPF until the rollback is over (see
        // `created_mode`): `deactivate` then brings it back like any other node, once its own
        // agent reports kube-proxy healthy, and it keeps the rollback from being Ready before.
        let desired: Vec<DesiredNode> = self
            .facts
            .iter()
            .map(|node| DesiredNode {
                mode: node.mode().unwrap_or(self.created_mode),
                cleanup: false,
            })
            .collect();
        let not_detached = self.names_where(|_, node| node.spec.is_some() && !node.detached());
        let daemon_set = self.observed.kube_proxy_daemon_set.as_ref();
        let managed = self.settings.management == KubeProxyManagement::Managed;
        // What Switchyard disabled, Switchyard restores, even if management became External
        // since: nobody else knows the nodeSelector it recorded.
        let restore_pending = daemon_set.is_some_and(|set| set.disabled_by_switchyard);
        // Agents must have stopped cleaning kube-proxy's rules and handed its health ports back
        // (its healthz and the healthCheckNodePorts, which an agent serves only while told
        // `Ebpf` with cleanup) before kube-proxy comes back, so the two never fight over them
        // and kube-proxy binds its ports at once: nodes still told to clean, or whose agent has
        // not yet reported on its current spec (an agent reports a spec only once it has acted
        // on it, ports closed). A failed node is not waited for: the rollback must not hang on
        // a node whose agent is gone, and an agent that is there gives the ports back as soon
        // as it sees kube-proxy's rules.
        let still_cleaning = self.names_where(|index, node| {
            !self.failed[index]
                && (node.cleanup_requested() || (node.status.is_some() && !node.acknowledged))
        });

        if not_detached.is_empty() && !restore_pending && still_cleaning.is_empty() {
            return self.ready(
                desired,
                "every node is detached and kube-proxy implements Services",
            );
        }
        if self.failed_count() > self.settings.max_failed_nodes {
            return self.halted(desired, "going back to kube-proxy");
        }

        let mut decision = self.decision(
            desired,
            DataplanePhase::RestoringKubeProxy,
            reasons::TRANSITION_IN_PROGRESS,
            String::new(),
        );
        let waiting_for_cleanup_to_stop = || {
            format!(
                "waiting for the agents on {} to report on their current spec (iptablesCleanup: false)",
                name_list(still_cleaning.iter().copied())
            )
        };
        if restore_pending {
            if still_cleaning.is_empty() {
                decision.kube_proxy = KubeProxyAction::Restore;
                decision.message = "restoring the kube-proxy DaemonSet".into();
            } else {
                decision.message = format!(
                    "{} before restoring kube-proxy",
                    waiting_for_cleanup_to_stop()
                );
            }
            return decision;
        }

        let unhealthy =
            self.names_where(|index, node| !self.failed[index] && !node.kube_proxy_healthy());
        if !unhealthy.is_empty() {
            decision.reason = reasons::WAITING_FOR_KUBE_PROXY;
            let who = match (managed, daemon_set) {
                (true, None) => {
                    decision.degraded = Some((
                        reasons::KUBE_PROXY_NOT_FOUND,
                        "the kube-proxy DaemonSet named in spec.kubeProxy does not exist, so it cannot be restored".into(),
                    ));
                    " (the kube-proxy DaemonSet does not exist)"
                }
                (false, _) => " (restored by its owner: spec.kubeProxy.management External)",
                (true, Some(_)) => "",
            };
            decision.message = if !managed && !still_cleaning.is_empty() {
                // The owner restores kube-proxy when it likes; this tells it when it may
                // without kube-proxy finding its ports taken.
                format!(
                    "{} (kube-proxy's health ports handed back); restore kube-proxy only then{who}",
                    waiting_for_cleanup_to_stop()
                )
            } else {
                format!(
                    "waiting for kube-proxy to be healthy{who} on {} before any node leaves eBPF",
                    name_list(unhealthy.iter().copied())
                )
            };
            return decision;
        }
        if not_detached.is_empty() {
            decision.message = waiting_for_cleanup_to_stop();
            return decision;
        }
        self.deactivate(decision)
    }

    /// `DeactivatingNodes`: the next batch of nodes back to `KubeProxy`.
    pub(super) fn deactivate(&self, mut decision: Decision) -> Decision {
        decision.phase = DataplanePhase::DeactivatingNodes;
        let in_flight = self.names_where(|index, node| {
            node.mode() == Some(DataplaneMode::KubeProxy)
                && !node.detached()
                && !node.draining()
                && !self.failed[index]
        });
        let draining = self.names_where(|index, node| node.draining() && !self.failed[index]);
        let capacity = self
            .settings
            .max_unavailable
            .saturating_sub(in_flight.len());
        let mut deactivated = Vec::new();
        let mut chosen = vec![false; self.facts.len()];
        for (index, node) in self.facts.iter().enumerate() {
            if deactivated.len() < capacity
                && node.mode() == Some(DataplaneMode::Ebpf)
                && node.kube_proxy_healthy()
                && !self.failed[index]
            {
                decision.desired[index].mode = DataplaneMode::KubeProxy;
                deactivated.push(node.name);
                chosen[index] = true;
            }
        }
        let queued = self.names_where(|index, node| {
            node.mode() == Some(DataplaneMode::Ebpf) && !self.failed[index] && !chosen[index]
        });
        let failed = self.failed_names();
        if self.only_failed_nodes_left(&[&in_flight, &draining, &deactivated, &queued]) {
            return self.halted(decision.desired, "finishing the return to kube-proxy");
        }
        let mut parts = naming(&[
            (&deactivated, "switching {} back to kube-proxy"),
            (&in_flight, "waiting for {} to detach"),
            (&draining, "draining live connections on {}"),
        ]);
        if !queued.is_empty() {
            parts.push(format!(
                "{} more node(s) queued (rollout.maxUnavailable {})",
                queued.len(),
                self.settings.max_unavailable
            ));
        }
        if !failed.is_empty() {
            parts.push(format!("failed: {}", name_list(failed.iter().copied())));
            decision.degraded = Some((
                reasons::NODES_FAILED,
                format!(
                    "{} node(s) failed ({})",
                    failed.len(),
                    name_list(failed.iter().copied())
                ),
            ));
        }
        decision.message = parts.join("; ");
        decision
    }
}
