//! What the planner concludes about each node from its observed objects.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use switchyard_crds::{
    condition_is_false, condition_types, reasons, DataplaneMode, DataplaneNodeSpec,
    DataplaneNodeStatus,
};

use super::observed::{ObservedNode, ObservedPod};
use super::settings::Settings;

/// One node's state, as the planner reads it. Everything the agent reports counts only when it
/// reports on the current spec (`status.observedGeneration == metadata.generation`): a report
/// about an older spec says nothing about what the node does now.
#[derive(Clone, Debug)]
pub(crate) struct NodeFacts<'a> {
    pub(crate) name: &'a str,
    pub(crate) node_ready: bool,
    pub(crate) labels: &'a BTreeMap<String, String>,
    /// The DataplaneNode's spec; `None` when the DataplaneNode does not exist.
    pub(crate) spec: Option<&'a DataplaneNodeSpec>,
    pub(crate) status: Option<&'a DataplaneNodeStatus>,
    /// The agent reported on the current spec.
    pub(crate) acknowledged: bool,
    pub(crate) kube_proxy_pod: Option<&'a ObservedPod>,
    pub(crate) agent_pod: Option<&'a ObservedPod>,
}

impl<'a> NodeFacts<'a> {
    pub(crate) fn new(node: &'a ObservedNode) -> Self {
        let dataplane_node = node.dataplane_node.as_deref();
        let status = dataplane_node.and_then(|dataplane_node| dataplane_node.status.as_ref());
        let generation =
            dataplane_node.and_then(|dataplane_node| dataplane_node.metadata.generation);
        let observed_generation = status.and_then(|status| status.observed_generation);
        Self {
            name: &node.name,
            node_ready: node.ready,
            labels: &node.labels,
            spec: dataplane_node.map(|dataplane_node| &dataplane_node.spec),
            status,
            // A DataplaneNode read back from the API always has a generation; one without (built
            // by hand) is acknowledged by any report.
            acknowledged: match (generation, observed_generation) {
                (Some(generation), Some(observed)) => observed >= generation,
                (None, Some(_)) => true,
                (_, None) => false,
            },
            kube_proxy_pod: node.kube_proxy_pod.as_ref(),
            agent_pod: node.agent_pod.as_ref(),
        }
    }

    pub(crate) fn mode(&self) -> Option<DataplaneMode> {
        self.spec.map(|spec| spec.mode)
    }

    pub(crate) fn cleanup_requested(&self) -> bool {
        self.spec.is_some_and(|spec| spec.iptables_cleanup)
    }

    /// A condition the agent reports `True` about the current spec.
    fn reports_true(&self, type_: &str) -> bool {
        self.acknowledged
            && self
                .status
                .is_some_and(|status| status.condition_is_true(type_))
    }

    /// A condition the agent reports `False` about the current spec.
    fn reports_false(&self, type_: &str) -> bool {
        self.acknowledged
            && self
                .status
                .is_some_and(|status| condition_is_false(&status.conditions, type_))
    }

    /// A condition `True` in the last report, whichever spec it was about.
    fn last_report_says(&self, type_: &str) -> bool {
        self.status
            .is_some_and(|status| status.condition_is_true(type_))
    }

    /// The agent's start-of-day gate is open and it follows the current spec.
    pub(crate) fn agent_ready(&self) -> bool {
        self.reports_true(condition_types::READY)
    }

    /// The node serves Services from eBPF: told `Ebpf`, programs attached, Services synced.
    pub(crate) fn serving_from_ebpf(&self) -> bool {
        self.mode() == Some(DataplaneMode::Ebpf)
            && self.reports_true(condition_types::PROGRAMS_ATTACHED)
            && self.reports_true(condition_types::SERVICES_SYNCED)
    }

    /// eBPF serves the node, wholly or partly: told `Ebpf`, or still draining live flows.
    pub(crate) fn ebpf_serves(&self) -> bool {
        self.mode() == Some(DataplaneMode::Ebpf) || self.draining()
    }

    /// Told `KubeProxy`, the node still translates the flows it carries before detaching.
    pub(crate) fn draining(&self) -> bool {
        self.mode() == Some(DataplaneMode::KubeProxy)
            && self.last_report_says(condition_types::DRAINING)
    }

    /// Told `KubeProxy`, the node has no program attached: its agent says so about the current
    /// spec, or it never reported anything (an agent reports once it has attached, so one that
    /// never reported never attached).
    pub(crate) fn detached(&self) -> bool {
        self.mode() == Some(DataplaneMode::KubeProxy)
            && match self.status {
                None => true,
                Some(_) => {
                    self.acknowledged
                        && !self.last_report_says(condition_types::PROGRAMS_ATTACHED)
                        && !self.last_report_says(condition_types::DRAINING)
                }
            }
    }

    /// Told to clean, the node reports that no kube-proxy rule is left.
    pub(crate) fn rules_cleaned(&self) -> bool {
        self.cleanup_requested() && self.reports_false(condition_types::KUBE_PROXY_RULES_PRESENT)
    }

    /// kube-proxy's rules are present on the node and its healthz answers 200, as the agent
    /// reports about the current spec. A Ready kube-proxy pod alone proves nothing (kubeadm's
    /// kube-proxy has no readiness probe).
    pub(crate) fn kube_proxy_healthy(&self) -> bool {
        self.reports_true(condition_types::KUBE_PROXY_HEALTHY)
    }

    /// The agent found kube-proxy in a mode Switchyard does not take over from (IPVS).
    pub(crate) fn unsupported_kube_proxy_mode(&self) -> bool {
        self.status.is_some_and(|status| {
            status
                .conditions
                .iter()
                .any(|condition| condition.reason == reasons::UNSUPPORTED_KUBE_PROXY_MODE)
        })
    }

    pub(crate) fn has_kube_proxy_pod(&self) -> bool {
        self.kube_proxy_pod.is_some()
    }

    /// The node did what its current spec asks: `Ebpf` serving (and cleaned if asked),
    /// `KubeProxy` detached with its agent Ready.
    pub(crate) fn satisfied(&self) -> bool {
        match self.mode() {
            None => false,
            Some(DataplaneMode::Ebpf) => {
                self.serving_from_ebpf() && (!self.cleanup_requested() || self.rules_cleaned())
            }
            Some(DataplaneMode::KubeProxy) => self.detached() && self.agent_ready(),
        }
    }

    /// When the node's current request times out: `nodeReadyTimeoutSeconds` after the latest of
    /// `spec.requestedAt`, the agent pod's start (a restarted agent gets the full timeout) and the
    /// last change of a condition the agent reports (a node that stops serving long after it was
    /// asked, for example because a sync fails, gets the full timeout to recover before it
    /// counts as failed), plus the drain timeout while the node drains. `None` without a
    /// request time.
    pub(crate) fn deadline(&self, settings: &Settings) -> Option<DateTime<Utc>> {
        let requested_at = self.spec?.requested_at?;
        let agent_started_at = self.agent_pod.and_then(|pod| pod.created_at);
        let last_condition_change = self.status.and_then(|status| {
            status
                .conditions
                .iter()
                .map(|condition| condition.last_transition_time)
                .max()
        });
        let base = [Some(requested_at), agent_started_at, last_condition_change]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(requested_at);
        let drain = if self.draining() {
            self.spec.map_or(settings.drain_timeout_seconds, |spec| {
                spec.drain_timeout_seconds
            })
        } else {
            0
        };
        // try_seconds: a timeout too long for a time has no deadline rather than a panic.
        Duration::try_seconds(settings.node_ready_timeout_seconds.saturating_add(drain))
            .and_then(|timeout| base.checked_add_signed(timeout))
    }

    /// The node did not do what was asked within its timeout.
    pub(crate) fn failed(&self, settings: &Settings, now: DateTime<Utc>) -> bool {
        !self.satisfied()
            && self
                .deadline(settings)
                .is_some_and(|deadline| now >= deadline)
    }
}
