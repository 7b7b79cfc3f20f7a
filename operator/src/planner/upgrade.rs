//! Rolling agent upgrades, only while `Ready` (see the module documentation of [`super`]).

use switchyard_crds::{reasons, DataplanePhase};

use super::context::{Context, Decision};
use super::facts::NodeFacts;
use super::{name_list, AgentPodDeletion};

impl<'a> Context<'a> {
    /// Rolling agent upgrade, only while `Ready`.
    pub(super) fn upgrade_agents(&self, decision: &mut Decision) {
        let Some(update_revision) = self
            .observed
            .agent_daemon_set
            .as_ref()
            .and_then(|set| set.update_revision.as_deref())
        else {
            return;
        };
        let mut outdated = Vec::new();
        let mut in_flight = Vec::new();
        let mut timed_out = Vec::new();
        for node in self.facts {
            if agent_up_to_date(node, update_revision) {
                continue;
            }
            match node.agent_pod {
                Some(pod)
                    if pod.revision.as_deref() != Some(update_revision) && !pod.terminating =>
                {
                    outdated.push((node.name, pod));
                }
                pod => {
                    // Being replaced: the old pod shuts down, or the new one has not reported
                    // Ready from the update revision yet, or there is no pod while the node's
                    // last report came from an older agent. A node that never had an agent is
                    // not part of the upgrade.
                    let older_agent_reported = node
                        .status
                        .and_then(|status| status.agent_revision.as_deref())
                        .is_some_and(|revision| revision != update_revision);
                    if pod.is_none() && !older_agent_reported {
                        continue;
                    }
                    in_flight.push(node.name);
                    // try_seconds: a timeout too long for a time has no deadline, no panic.
                    let timeout =
                        chrono::Duration::try_seconds(self.settings.node_ready_timeout_seconds);
                    let deadline = pod
                        .filter(|pod| !pod.terminating)
                        .and_then(|pod| pod.created_at)
                        .and_then(|created| created.checked_add_signed(timeout?));
                    match deadline {
                        Some(deadline) if self.now >= deadline => timed_out.push(node.name),
                        Some(deadline) => decision.upgrade_deadlines.push(deadline),
                        None => {}
                    }
                }
            }
        }
        if outdated.is_empty() && in_flight.is_empty() {
            return;
        }
        if !timed_out.is_empty() {
            let message = format!(
                "agent upgrade to revision {update_revision} halted: {} did not come back Ready within {}s",
                name_list(timed_out.iter().copied()),
                self.settings.node_ready_timeout_seconds
            );
            decision.phase = DataplanePhase::Halted;
            decision.reason = reasons::AGENT_UPGRADE_FAILED;
            decision.degraded = Some((reasons::AGENT_UPGRADE_FAILED, message.clone()));
            decision.message = message;
            return;
        }
        decision.phase = DataplanePhase::UpgradingAgents;
        decision.reason = reasons::AGENT_UPGRADE_IN_PROGRESS;
        if !in_flight.is_empty() {
            // Never two batches in flight.
            decision.message = format!(
                "upgrading agents to revision {update_revision}: waiting for {} to report Ready; {} more to go",
                name_list(in_flight.iter().copied()),
                outdated.len()
            );
            return;
        }
        let batch: Vec<_> = outdated
            .iter()
            .take(self.settings.max_unavailable)
            .collect();
        decision.agent_pods_to_delete = batch
            .iter()
            .map(|(node_name, pod)| AgentPodDeletion {
                node_name: (*node_name).to_owned(),
                pod_name: pod.name.clone(),
            })
            .collect();
        decision.message = format!(
            "upgrading agents to revision {update_revision}: replacing the agent on {}; {} more to go",
            name_list(batch.iter().map(|(name, _)| *name)),
            outdated.len() - batch.len()
        );
    }
}

/// The node runs the agent DaemonSet's update revision and its agent reports Ready from it.
pub(crate) fn agent_up_to_date(node: &NodeFacts, update_revision: &str) -> bool {
    node.agent_pod
        .is_some_and(|pod| pod.revision.as_deref() == Some(update_revision))
        && node
            .status
            .is_some_and(|status| status.agent_revision.as_deref() == Some(update_revision))
        && node.agent_ready()
}
