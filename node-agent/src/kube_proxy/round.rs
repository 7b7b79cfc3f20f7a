//! One round of the coexistence loop, as the cluster-mode agent runs it every few
//! seconds: read the node's rules and interfaces, probe kube-proxy's healthz, let
//! the state machine decide, apply the cleanup if it says so. The conditions it
//! returns go to the DataplaneNode status; the rule count to the metrics.

use std::time::Duration;

use super::{
    chain_order::agent_chains_present,
    detection::{
        footprint, ipvs_mode, kube_proxy_healthy_condition, CleanupDecision, CleanupStateMachine,
        CoexistenceObservation, CoexistenceVerdict, ConditionReport, KubeProxyFootprint,
        KubeProxyHealth,
    },
    health::HealthzTarget,
    health_server::{probe_kube_proxy_beside, OwnProbes},
    plan_node_cleanup,
    system::Tools,
    Family, NodeRules,
};
use crate::Error;

/// What a round looks at.
#[derive(Clone, Debug)]
pub struct RoundSettings {
    /// The families whose iptables rules are read (IPv4 always; IPv6 on dual-stack nodes).
    pub families: Vec<Family>,
    pub healthz: HealthzTarget,
    /// Short: a node whose kube-proxy is gone must not slow the loop.
    pub probe_timeout: Duration,
}

/// What a round found and did.
#[derive(Clone, Debug)]
pub struct RoundOutcome {
    pub verdict: CoexistenceVerdict,
    /// kube-proxy's footprint before any cleanup of this round.
    pub footprint: KubeProxyFootprint,
    pub health: KubeProxyHealth,
    /// `KubeProxyHealthy`.
    pub kube_proxy_healthy: ConditionReport,
    /// `Some` when the round cleaned: the rules removed, or why it failed.
    pub cleanup: Option<Result<usize, String>>,
    /// The agent's own chains (or jumps to them) are in some backend.
    pub agent_chains_present: bool,
}

pub async fn coexistence_round(
    tools: &Tools,
    machine: &mut CleanupStateMachine,
    cleanup_requested: Option<i64>,
    settings: &RoundSettings,
) -> Result<RoundOutcome, Error> {
    coexistence_round_beside(
        tools,
        machine,
        cleanup_requested,
        settings,
        &OwnProbes::default(),
    )
    .await
}

/// [`coexistence_round`] of an agent that serves kube-proxy's health ports itself: `own`
/// comes from its servers, so their answers are never taken for kube-proxy's.
pub async fn coexistence_round_beside(
    tools: &Tools,
    machine: &mut CleanupStateMachine,
    cleanup_requested: Option<i64>,
    settings: &RoundSettings,
    own: &OwnProbes,
) -> Result<RoundOutcome, Error> {
    let reader = tools.clone();
    let families = settings.families.clone();
    let (rules, interfaces) = blocking(move || {
        Ok::<_, Error>((
            reader.read_node_rules(&families)?,
            reader.interface_names()?,
        ))
    })
    .await?;
    let health = probe_kube_proxy_beside(&settings.healthz, settings.probe_timeout, own).await;
    let found = footprint(&rules);
    let agent_chains = rules
        .iptables
        .iter()
        .any(|dump| agent_chains_present(&dump.ruleset));
    let observation = CoexistenceObservation {
        cleanup_requested,
        ipvs_mode: ipvs_mode(&interfaces, &rules),
        footprint: found,
        health: health.clone(),
        observed_at: std::time::Instant::now(),
    };
    let verdict = machine.observe(&observation);
    let cleanup = if verdict.decision == CleanupDecision::Clean {
        let result = clean(tools, rules).await;
        match &result {
            Ok(_) => machine.cleanup_succeeded(),
            Err(message) => machine.cleanup_failed(message.clone()),
        }
        Some(result)
    } else {
        None
    };
    Ok(RoundOutcome {
        kube_proxy_healthy: kube_proxy_healthy_condition(&found, &health),
        verdict,
        footprint: found,
        health,
        cleanup,
        agent_chains_present: agent_chains,
    })
}

async fn clean(tools: &Tools, rules: NodeRules) -> Result<usize, String> {
    let plan = plan_node_cleanup(&rules);
    let removed = plan.removed_rules() + rules.nftables.kube_proxy_rule_count();
    let applier = tools.clone();
    blocking(move || applier.apply_cleanup(&plan))
        .await
        .map(|()| removed)
        .map_err(|error| error.to_string())
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| Error::RunNetfilterTool {
            command: "the netfilter tools".into(),
            source: Box::new(error),
        })?
}
