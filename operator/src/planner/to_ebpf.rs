//! KubeProxy -> Ebpf: preflight, activation in batches, disabling kube-proxy, cleaning its
//! rules (see the module documentation of [`super`]).

use switchyard_crds::{
    reasons, DataplaneMode, DataplanePhase, IptablesCleanupPolicy, KubeProxyManagement,
};

use super::canary::CanaryGate;
use super::context::{Context, Decision, DesiredNode};
use super::facts::NodeFacts;
use super::parity;
use super::{name_list, naming, KubeProxyAction, KubeProxyDaemonSet};

impl<'a> Context<'a> {
    /// KubeProxy -> Ebpf, from wherever the cluster stands.
    pub(super) fn toward_ebpf(&self) -> Decision {
        let gate = self.canary_gate();
        let mut decision = self.toward_ebpf_through(&gate);
        decision.canary_deadlines.extend(gate.deadlines());
        decision
    }

    /// KubeProxy -> Ebpf, switching only the nodes `gate` admits (see [`super::canary`]).
    fn toward_ebpf_through(&self, gate: &CanaryGate) -> Decision {
        let desired = self.unchanged();
        if let Some(stop) = self.canary_stop(gate, desired.clone()) {
            return stop;
        }
        let not_serving = self.names_where(|_, node| !node.serving_from_ebpf());
        if !not_serving.is_empty() {
            let started = self
                .facts
                .iter()
                .any(|node| node.mode() == Some(DataplaneMode::Ebpf));
            if !started {
                if let Some(refusal) = self.preflight_refusal() {
                    return refusal;
                }
            }
            let mut decision = self.activate(desired, gate);
            // Withdrawing cleanup when kube-proxy came back leaves no node serving from eBPF on
            // the current spec until its agent reports on it, so these rounds land here (not in
            // DisablingKubeProxy, which needs every node serving): the warning must last through
            // them, or the next round no longer knows kube-proxy came back.
            if started
                && !self.kube_proxy_gone
                && decision.phase == DataplanePhase::ActivatingNodes
                && self.kube_proxy_returned()
            {
                self.report_kube_proxy_returned(&mut decision);
            }
            return decision;
        }

        // Every node serves from eBPF.
        if gate.watching() {
            // The last batch soaks before kube-proxy goes: until then a node over budget can
            // still go back to it.
            let message = self.canary_message(gate).join("; ");
            return self.decision(
                desired,
                DataplanePhase::ActivatingNodes,
                reasons::TRANSITION_IN_PROGRESS,
                format!("every node serves from eBPF; {message} before kube-proxy is disabled"),
            );
        }
        if !self.kube_proxy_gone {
            return self.disable_kube_proxy(desired);
        }

        if self.settings.cleanup == IptablesCleanupPolicy::Auto {
            let not_cleaned = self.names_where(|_, node| !node.rules_cleaned());
            if !not_cleaned.is_empty() {
                if self.failed_count() > self.settings.max_failed_nodes
                    || self
                        .names_where(|index, node| !node.rules_cleaned() && !self.failed[index])
                        .is_empty()
                {
                    return self.halted(desired, "finishing the cleanup of kube-proxy's rules");
                }
                let message = format!(
                    "cleaning kube-proxy's rules on {}",
                    name_list(not_cleaned.iter().copied())
                );
                return self.decision(
                    desired,
                    DataplanePhase::CleaningRules,
                    reasons::TRANSITION_IN_PROGRESS,
                    message,
                );
            }
        }

        self.ready(
            desired,
            "every node serves Services from eBPF and kube-proxy is gone",
        )
    }

    /// Why the transition may not start, if it may not.
    pub(super) fn preflight_refusal(&self) -> Option<Decision> {
        let mut problems: Vec<String> = Vec::new();
        let mut degraded_reason: Option<&'static str> = None;

        let missing = self.names_where(|_, node| node.spec.is_none());
        let not_ready = self
            .names_where(|_, node| node.spec.is_some() && !(node.agent_ready() && node.node_ready));
        problems.extend(naming(&[
            (&missing, "DataplaneNodes being created for {}"),
            (&not_ready, "agent or Node not Ready on {}"),
        ]));
        let unsupported = self.names_where(|_, node| node.unsupported_kube_proxy_mode());
        if !unsupported.is_empty() {
            problems.push(format!(
                "kube-proxy runs in a mode Switchyard cannot take over from (IPVS) on {}",
                name_list(unsupported.iter().copied())
            ));
            degraded_reason = Some(reasons::UNSUPPORTED_KUBE_PROXY_MODE);
        }
        if !self.unsupported_services.is_empty() {
            problems.push(format!(
                "{} (kube-proxy serves them; without it they would stop working)",
                parity::unsupported_summary(&self.unsupported_services)
            ));
            degraded_reason.get_or_insert(reasons::UNSUPPORTED_SERVICES);
        }
        if !self.observed.api_server_address_configured {
            problems.push("the operator has no API server address to give the agents (they must not depend on the kubernetes Service)".into());
            degraded_reason.get_or_insert(reasons::API_SERVER_ADDRESS_MISSING);
        }
        if self.settings.management == KubeProxyManagement::Managed {
            if let Some(owner) = self
                .observed
                .kube_proxy_daemon_set
                .as_ref()
                .and_then(|set| set.external_owner.as_deref())
            {
                problems.push(format!(
                    "the kube-proxy DaemonSet is managed by another tool ({owner}): set spec.kubeProxy.management to External"
                ));
                degraded_reason.get_or_insert(reasons::KUBE_PROXY_MANAGED_EXTERNALLY);
            }
            let patch_refused = self
                .observed
                .kube_proxy_daemon_set
                .as_ref()
                .is_some_and(KubeProxyDaemonSet::patch_refused);
            if patch_refused {
                problems.push(
                    "the operator may not patch the kube-proxy DaemonSet that spec.kubeProxy names (RBAC): grant it patch on that DaemonSet, or set spec.kubeProxy.management to External".into(),
                );
                degraded_reason.get_or_insert(reasons::KUBE_PROXY_NOT_PATCHABLE);
            }
        }
        if problems.is_empty() {
            return None;
        }
        let failed = self.failed_names();
        if !failed.is_empty() {
            problems.push(format!(
                "failed node(s): {}",
                name_list(failed.iter().copied())
            ));
            degraded_reason.get_or_insert(reasons::NODES_FAILED);
        }
        if self.observed.kube_proxy_daemon_set.is_none() {
            problems.push("the kube-proxy DaemonSet is not there (already absent)".into());
        }
        let message = format!("preflight: {}", problems.join("; "));
        let mut decision = self.decision(
            self.unchanged(),
            DataplanePhase::Preflight,
            reasons::PREFLIGHT_FAILED,
            message.clone(),
        );
        decision.degraded = degraded_reason.map(|reason| (reason, message));
        Some(decision)
    }

    /// `ActivatingNodes`: the next batch of nodes to `Ebpf`.
    pub(super) fn activate(&self, mut desired: Vec<DesiredNode>, gate: &CanaryGate) -> Decision {
        let settings = self.settings;
        if self.failed_count() > settings.max_failed_nodes {
            return self.halted(desired, "activating more nodes");
        }
        let in_flight = self.names_where(|index, node| {
            node.mode() == Some(DataplaneMode::Ebpf)
                && !node.serving_from_ebpf()
                && !self.failed[index]
        });
        let capacity = settings.max_unavailable.saturating_sub(in_flight.len());
        // The canary rules may admit fewer nodes, or only some (see `super::canary`).
        let capacity = gate.limit().map_or(capacity, |limit| capacity.min(limit));
        // Missing DataplaneNodes created on eBPF need no activation: kube-proxy cannot serve
        // them, so they are not made unavailable and do not use up maxUnavailable.
        let created = self.names_where(|_, node| self.created_on_ebpf(node));
        let ready = |index: usize, node: &NodeFacts| {
            node.mode() != Some(DataplaneMode::Ebpf)
                && !self.created_on_ebpf(node)
                && !self.failed[index]
                // Once kube-proxy is gone a node not on eBPF serves nothing, so waiting for its
                // agent gains nothing; before, only a node whose agent is ready may switch.
                && (self.kube_proxy_gone || (node.agent_ready() && node.node_ready && !node.unsupported_kube_proxy_mode()))
        };
        let eligible = |index: usize, node: &NodeFacts| ready(index, node) && gate.admits(index);
        let mut activated = Vec::new();
        let mut chosen = vec![false; self.facts.len()];
        for (index, node) in self.facts.iter().enumerate() {
            if activated.len() < capacity && eligible(index, node) {
                desired[index] = DesiredNode {
                    mode: DataplaneMode::Ebpf,
                    cleanup: false,
                };
                activated.push(node.name);
                chosen[index] = true;
            }
        }
        let waiting = self.names_where(|index, node| {
            node.mode() != Some(DataplaneMode::Ebpf)
                && !self.created_on_ebpf(node)
                && !self.failed[index]
                && !chosen[index]
        });
        let failed = self.failed_names();
        if self.only_failed_nodes_left(&[&in_flight, &activated, &created, &waiting]) {
            return self.halted(
                desired,
                "disabling kube-proxy (it needs every node serving from eBPF)",
            );
        }

        let blocked = self.names_where(|index, node| {
            node.mode() != Some(DataplaneMode::Ebpf)
                && !self.created_on_ebpf(node)
                && !self.failed[index]
                && !chosen[index]
                && !ready(index, node)
        });
        let mut parts = naming(&[
            (&activated, "switching {} to eBPF"),
            (
                &created,
                "creating the DataplaneNodes of {} on eBPF (kube-proxy cannot serve them)",
            ),
            (
                &in_flight,
                "waiting for {} to report programs attached and Services synced",
            ),
            (
                &blocked,
                "waiting for the agent and the Node to be Ready on {}",
            ),
        ]);
        parts.extend(self.canary_message(gate));
        let queued = waiting.len() - blocked.len();
        if queued > 0 {
            parts.push(format!(
                "{queued} more node(s) queued (rollout.maxUnavailable {})",
                settings.max_unavailable
            ));
        }
        parts.extend(naming(&[(&failed, "failed: {}")]));
        if self.observed.kube_proxy_daemon_set.is_none() {
            parts.push("the kube-proxy DaemonSet is not there (already absent)".into());
        }
        let (reason, prefix) = if self.kube_proxy_gone {
            (
                reasons::NODES_JOINING,
                "bringing nodes without kube-proxy to eBPF: ",
            )
        } else {
            (reasons::TRANSITION_IN_PROGRESS, "")
        };
        let mut decision = self.decision(
            desired,
            DataplanePhase::ActivatingNodes,
            reason,
            format!("{prefix}{}", parts.join("; ")),
        );
        if !failed.is_empty() {
            decision.degraded = Some((
                reasons::NODES_FAILED,
                format!(
                    "{} node(s) failed ({}), {} allowed by rollout.maxFailedNodes",
                    failed.len(),
                    name_list(failed.iter().copied()),
                    settings.max_failed_nodes
                ),
            ));
        }
        decision
    }

    /// Whether kube-proxy left after the cluster had cleaned its rules and is now back.
    pub(super) fn kube_proxy_returned(&self) -> bool {
        self.kube_proxy_reported_returned || self.facts.iter().any(NodeFacts::cleanup_requested)
    }

    /// `; kube-proxy pods left on a and b`, or nothing when no node has one.
    fn kube_proxy_pods_left(&self) -> String {
        let with_pods = self.names_where(|_, node| node.has_kube_proxy_pod());
        if with_pods.is_empty() {
            String::new()
        } else {
            format!(
                "; kube-proxy pods left on {}",
                name_list(with_pods.iter().copied())
            )
        }
    }

    /// Marks `decision` as kube-proxy having come back on a cluster on eBPF: the reason, and
    /// with External management a Degraded condition, since only its owner can remove it.
    fn report_kube_proxy_returned(&self, decision: &mut Decision) {
        decision.reason = reasons::KUBE_PROXY_RETURNED;
        if self.settings.management == KubeProxyManagement::External {
            decision.degraded = Some((
                reasons::KUBE_PROXY_RETURNED,
                format!(
                    "kube-proxy came back while the cluster is on eBPF and is managed externally: remove it{}",
                    self.kube_proxy_pods_left()
                ),
            ));
        }
    }

    /// `DisablingKubeProxy`: every node serves from eBPF; kube-proxy has to go.
    pub(super) fn disable_kube_proxy(&self, desired: Vec<DesiredNode>) -> Decision {
        let pods = self.kube_proxy_pods_left();
        let returned = self.kube_proxy_returned();
        let mut decision = self.decision(
            desired,
            DataplanePhase::DisablingKubeProxy,
            reasons::TRANSITION_IN_PROGRESS,
            String::new(),
        );
        let daemon_set = self.observed.kube_proxy_daemon_set.as_ref();
        match self.settings.management {
            KubeProxyManagement::Managed => match daemon_set {
                Some(daemon_set) if daemon_set.would_schedule() => {
                    if let Some(owner) = daemon_set.external_owner.as_deref() {
                        let message = format!(
                            "refusing to disable the kube-proxy DaemonSet: it is managed by another tool ({owner}); \
                             set spec.kubeProxy.management to External and remove it there{pods}"
                        );
                        decision.degraded = Some((reasons::KUBE_PROXY_MANAGED_EXTERNALLY, message.clone()));
                        decision.message = message;
                    } else {
                        decision.kube_proxy = KubeProxyAction::Disable;
                        decision.message = if returned {
                            format!("kube-proxy came back while the cluster is on eBPF: disabling its DaemonSet again{pods}")
                        } else {
                            format!("every node serves from eBPF: disabling the kube-proxy DaemonSet{pods}")
                        };
                    }
                }
                Some(_) => decision.message = format!("kube-proxy DaemonSet disabled: waiting for its pods to leave{pods}"),
                None => decision.message = format!("kube-proxy DaemonSet not found: waiting for the remaining kube-proxy pods to leave{pods}"),
            },
            KubeProxyManagement::External => {
                decision.message = format!("waiting for kube-proxy to be removed by its owner (spec.kubeProxy.management External){pods}");
            }
        }
        if returned {
            self.report_kube_proxy_returned(&mut decision);
        }
        decision
    }
}
