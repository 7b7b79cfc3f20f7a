//! Living next to kube-proxy in cluster mode: every round (a few seconds) runs the
//! `kube_proxy` module's coexistence round (read the node's netfilter rules, probe
//! kube-proxy's healthz, let the state machine decide about `iptablesCleanup`:
//! clean once, never while kube-proxy may run, only after it has stayed away, stop
//! when its rules come back), keeps the agent's chains first while the node serves
//! from eBPF and removes them once it does not, and serves kube-proxy's
//! `:10256/healthz` once kube-proxy has left. The decisions are the `kube_proxy`
//! module's; this is the wiring.
//!
//! kube-proxy's health ports and its metrics address (`KubeProxyPorts`: one decision for
//! both) are served only while the spec permits it
//! (`CoexistenceRequest::health_ports_permitted`), and a round whose request does
//! not permit it closes them before anything else; each report says which spec
//! generation its round acted on, and the status reports a generation as observed
//! only once a round has (`core::status::observable_generation`). So a node told to
//! go back has handed kube-proxy's ports back before the operator, which waits for
//! every node to report that spec, restores kube-proxy.

use std::time::Duration;

use switchyard_crds::{reasons, ConditionStatus};
use tokio::sync::watch;

use switchyard_model::error::chain;

use crate::core::round::CoexistenceRequest;
use crate::core::status::{CoexistenceProgress, CoexistenceReport, ConditionValue};
use crate::kube_proxy::detection::{CleanupStateMachine, ConditionReport};
use switchyard_telemetry::Heartbeat;

use crate::kube_proxy::health::{HealthzTarget, NodeHealth};
use crate::kube_proxy::health_server::HealthServerSettings;
use crate::kube_proxy::metrics_server::{KubeProxyMetricsPort, KubeProxyPorts};
use crate::kube_proxy::round::{coexistence_round_beside, RoundSettings};
use crate::kube_proxy::system::Tools;
use crate::kube_proxy::Family;

#[derive(Clone, Debug)]
pub struct CoexistenceSettings {
    pub round_interval: Duration,
    pub kube_proxy_healthz: HealthzTarget,
    pub masquerade_mark: u32,
    /// Serve `:10256/healthz` once kube-proxy has left.
    pub serve_replacement_healthz: bool,
    pub healthz_port: u16,
    /// Serve kube-proxy's metrics once kube-proxy has left, with its health ports.
    pub kube_proxy_metrics: Option<KubeProxyMetricsPort>,
    /// How long kube-proxy's healthz must stay refused before its rules go.
    pub absence_confirmation: Duration,
    /// Liveness of the rounds: each round is one step (the interval between is waiting).
    pub heartbeat: Heartbeat,
}

/// The address families the datapath serves (IPv4 today): kube-proxy's rules
/// are read, counted and cleaned only in these, and the agent's chains live
/// only there.
const SERVED_FAMILIES: [Family; 1] = [Family::Ipv4];

/// Short: a node whose kube-proxy is gone must not slow the loop down.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

fn value(report: ConditionReport) -> ConditionValue {
    ConditionValue::new(report.status, report.reason, report.message)
}

fn failed_read(message: String) -> CoexistenceReport {
    let unknown = || ConditionValue {
        status: ConditionStatus::Unknown,
        reason: "RulesUnreadable".into(),
        message: message.clone(),
    };
    CoexistenceReport {
        rules_present: unknown(),
        chain_order_safe: unknown(),
        kube_proxy_healthy: unknown(),
        kube_proxy_rules: None,
        progress: CoexistenceProgress::NoRoundYet,
    }
}

/// Runs rounds until the request channel closes, publishing each round's report.
pub async fn run_coexistence(
    settings: CoexistenceSettings,
    mut requests: watch::Receiver<CoexistenceRequest>,
    reports: watch::Sender<CoexistenceReport>,
) {
    let tools = Tools::new();
    let mut machine = CleanupStateMachine::new(settings.absence_confirmation);
    let mut kube_proxy_ports = KubeProxyPorts::new(
        HealthServerSettings {
            healthz_port: settings.healthz_port,
            ..HealthServerSettings::default()
        },
        settings.serve_replacement_healthz,
        settings.kube_proxy_metrics.clone(),
    );
    // Rounds in a row whose request said "not serving from eBPF".
    let mut rounds_not_serving = 0_u32;
    loop {
        let request = requests.borrow_and_update().clone();
        rounds_not_serving = if request.serving_from_ebpf {
            0
        } else {
            rounds_not_serving.saturating_add(1)
        };
        // The agent's chains go only when the node has not served from eBPF for two rounds
        // and still does not as the removal starts: an activation ensures the chains and
        // attaches before its request says so, and a round that began just before must not
        // remove them under the new programs.
        let chains_may_go = rounds_not_serving >= 2;
        let still_not_serving = || !requests.borrow().serving_from_ebpf;
        let step = settings.heartbeat.step();
        let mut report = round(
            &settings,
            &tools,
            &mut machine,
            &mut kube_proxy_ports,
            &request,
            chains_may_go,
            still_not_serving,
        )
        .await;
        drop(step);
        report.progress = CoexistenceProgress::ActedOn(request.spec_generation);
        reports.send_if_modified(|current| {
            let changed = *current != report;
            *current = report;
            changed
        });
        tokio::select! {
            changed = requests.changed() => if changed.is_err() { break },
            _ = tokio::time::sleep(settings.round_interval) => {}
        }
    }
    kube_proxy_ports.stop().await;
}

async fn round(
    settings: &CoexistenceSettings,
    tools: &Tools,
    machine: &mut CleanupStateMachine,
    kube_proxy_ports: &mut KubeProxyPorts,
    request: &CoexistenceRequest,
    chains_may_go: bool,
    still_not_serving: impl Fn() -> bool,
) -> CoexistenceReport {
    let permitted = request.health_ports_permitted;
    if !permitted {
        // First, before the rules are read (which may fail, or take long): the spec took the
        // permission back, and the round's report tells the core it acted on this spec.
        kube_proxy_ports.stop().await;
    }
    let round_settings = RoundSettings {
        families: SERVED_FAMILIES.to_vec(),
        healthz: settings.kube_proxy_healthz.clone(),
        probe_timeout: PROBE_TIMEOUT,
    };
    let outcome = match coexistence_round_beside(
        tools,
        machine,
        request.cleanup_generation,
        &round_settings,
        &kube_proxy_ports.own_probes(),
    )
    .await
    {
        Ok(outcome) => outcome,
        Err(error) => return failed_read(chain(&error)),
    };
    let found = outcome.footprint;
    let mut rules_present = value(outcome.verdict.rules_present.clone());
    match &outcome.cleanup {
        Some(Ok(removed)) => {
            tracing::info!(rules = removed, "removed kube-proxy's Service rules");
            rules_present = ConditionValue::new(
                false,
                reasons::RULES_ABSENT,
                "kube-proxy's rules were removed",
            );
        }
        Some(Err(error)) => tracing::warn!(%error, "cleanup failed; retrying"),
        None => {}
    }
    if chains_may_go && outcome.agent_chains_present && still_not_serving() {
        remove_agent_chains(tools, settings.masquerade_mark).await;
    }
    // Chains a previous process left are guarded whether or not a Service
    // needs them now: they stay until the node leaves eBPF.
    let chains_guarded = request.netfilter_chains_wanted || outcome.agent_chains_present;
    let chain_order_safe = if request.serving_from_ebpf && chains_guarded {
        let guard_tools = tools.clone();
        let mark = settings.masquerade_mark;
        let guarded = run_blocking(move || {
            SERVED_FAMILIES
                .iter()
                .map(|family| guard_tools.guard_chain_order(*family, mark))
                .collect::<Result<Vec<_>, _>>()
        })
        .await;
        match guarded.map(most_telling_report) {
            Ok(Some(report)) => {
                if report.reason == reasons::CHAIN_ORDER_RESTORED {
                    tracing::info!(message = %report.message, "chain order restored");
                }
                value(report)
            }
            Ok(None) => ConditionValue::new(
                true,
                reasons::CHAIN_ORDER_VERIFIED,
                "no address family served",
            ),
            Err(message) => ConditionValue::new(
                false,
                crate::kube_proxy::system::CHAIN_ORDER_REPAIR_FAILED,
                message,
            ),
        }
    } else if request.serving_from_ebpf {
        ConditionValue::new(
            true,
            reasons::CHAIN_ORDER_VERIFIED,
            "no Service masquerades: the datapath marks no packet for netfilter, so the agent needs no chain",
        )
    } else {
        ConditionValue::new(
            true,
            reasons::CHAIN_ORDER_VERIFIED,
            "no program attached: nothing the datapath translates can be dropped",
        )
    };
    // Also never while kube-proxy's rules are on the node: a kube-proxy that
    // starts (again) binds its healthz before it writes rules, and holding
    // the port would hide it from the probe (projectcalico/calico#10748).
    let allowed = permitted
        && outcome.verdict.replacement_health_allowed
        && request.serving_from_ebpf
        && !found.present();
    let errors = kube_proxy_ports
        .reconcile(
            allowed,
            NodeHealth {
                healthy: request.healthy,
                last_updated: request.last_sync,
            },
            &request.services,
        )
        .await;
    for error in errors {
        tracing::debug!(error = %chain(&error), "cannot serve kube-proxy's port yet");
    }
    let remaining = if matches!(outcome.cleanup, Some(Ok(_))) {
        0
    } else {
        found.total_rules()
    };
    CoexistenceReport {
        rules_present,
        chain_order_safe,
        kube_proxy_healthy: value(outcome.kube_proxy_healthy),
        kube_proxy_rules: Some(remaining),
        progress: CoexistenceProgress::NoRoundYet,
    }
}

/// The node no longer serves from eBPF: the agent's chains go, in every backend.
/// They hold the masquerade mark's accept, INVALID drop and MASQUERADE ahead of
/// everything else, and the mark may be kube-proxy's own (0x4000): left behind,
/// they would keep judging kube-proxy's traffic after a rollback. A failure is
/// retried by the next round, which finds the chains still there.
async fn remove_agent_chains(tools: &Tools, masquerade_mark: u32) {
    let removal_tools = tools.clone();
    let removed = run_blocking(move || {
        SERVED_FAMILIES
            .iter()
            .try_for_each(|family| removal_tools.remove_agent_chains(*family, masquerade_mark))
    })
    .await;
    match removed {
        Ok(()) => tracing::info!("removed the agent's netfilter chains (the node left eBPF)"),
        Err(error) => {
            tracing::warn!(%error, "failed to remove the agent's netfilter chains; retrying")
        }
    }
}

/// Runs netfilter work (external commands) off the agent's loop; a task that
/// panicked reads as a failure like any other.
async fn run_blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, crate::Error> + Send + 'static,
) -> Result<T, String> {
    match tokio::task::spawn_blocking(work).await {
        Ok(Ok(value)) => Ok(value),
        // With its causes: the string is what the logs and conditions show.
        Ok(Err(error)) => Err(chain(&error)),
        Err(error) => Err(format!("failed to run the netfilter task: {error}")),
    }
}

/// One `ChainOrderSafe` report for every served family: the first that is not
/// safe, else the first that restored the order, else the first.
fn most_telling_report(reports: Vec<ConditionReport>) -> Option<ConditionReport> {
    let position = reports
        .iter()
        .position(|report| !report.status)
        .or_else(|| {
            reports
                .iter()
                .position(|report| report.reason == reasons::CHAIN_ORDER_RESTORED)
        })
        .unwrap_or(0);
    reports.into_iter().nth(position)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(status: bool, reason: &'static str) -> ConditionReport {
        ConditionReport {
            status,
            reason,
            message: reason.to_string(),
        }
    }

    #[test]
    fn an_unsafe_family_outweighs_a_restored_or_verified_one() {
        let chosen = most_telling_report(vec![
            report(true, reasons::CHAIN_ORDER_VERIFIED),
            report(true, reasons::CHAIN_ORDER_RESTORED),
            report(false, "ChainOrderRepairFailed"),
        ]);
        assert_eq!(chosen.map(|report| report.status), Some(false));
    }

    #[test]
    fn a_restored_order_is_reported_over_a_verified_one() {
        let chosen = most_telling_report(vec![
            report(true, reasons::CHAIN_ORDER_VERIFIED),
            report(true, reasons::CHAIN_ORDER_RESTORED),
        ]);
        assert_eq!(
            chosen.map(|report| report.reason),
            Some(reasons::CHAIN_ORDER_RESTORED)
        );
    }

    #[test]
    fn no_served_family_gives_no_report() {
        assert!(most_telling_report(Vec::new()).is_none());
    }
}
