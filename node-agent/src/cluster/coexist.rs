//! Living next to kube-proxy in cluster mode: every round (a few seconds) reads the
//! node's netfilter rules, probes kube-proxy's healthz, lets the `kube_proxy`
//! module's state machine decide about `iptablesCleanup` (clean once, never while
//! kube-proxy answers, stop when its rules come back), keeps the agent's chains
//! first while the node serves from eBPF, and serves kube-proxy's `:10256/healthz`
//! once kube-proxy has left. The decisions are the `kube_proxy` module's; this is
//! the wiring.

use std::time::{Duration, SystemTime};

use switchyard_crds::{reasons, ConditionStatus};
use tokio::sync::watch;

use super::status::{CoexistenceReport, ConditionValue};
use crate::kube_proxy::detection::{
    footprint, ipvs_mode, kube_proxy_healthy_condition, CleanupDecision, CleanupStateMachine,
    CoexistenceObservation, ConditionReport,
};
use crate::kube_proxy::health::{HealthzTarget, LocalServiceHealth, NodeHealth};
use crate::kube_proxy::health_server::{probe_kube_proxy, HealthServerSettings, HealthServers};
use crate::kube_proxy::system::Tools;
use crate::kube_proxy::{plan_node_cleanup, Family};

/// What the agent tells the coexistence loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoexistenceRequest {
    /// `Some(generation)` while the DataplaneNode says `iptablesCleanup: true`.
    pub cleanup_generation: Option<i64>,
    /// Programs attached (or draining): the agent's chains must come first.
    pub serving_from_ebpf: bool,
    /// The maps are in sync (what the replacement healthz reports).
    pub healthy: bool,
    pub last_sync: SystemTime,
    /// The `healthCheckNodePort` answers.
    pub services: Vec<LocalServiceHealth>,
}

impl Default for CoexistenceRequest {
    fn default() -> Self {
        Self {
            cleanup_generation: None,
            serving_from_ebpf: false,
            healthy: false,
            last_sync: SystemTime::UNIX_EPOCH,
            services: Vec::new(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct CoexistenceSettings {
    pub round_interval: Duration,
    pub kube_proxy_healthz: HealthzTarget,
    pub masquerade_mark: u32,
    /// Serve `:10256/healthz` once kube-proxy has left.
    pub serve_replacement_healthz: bool,
    pub healthz_port: u16,
}

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
    }
}

/// Runs rounds until the request channel closes, publishing each round's report.
pub async fn run_coexistence(
    settings: CoexistenceSettings,
    mut requests: watch::Receiver<CoexistenceRequest>,
    reports: watch::Sender<CoexistenceReport>,
) {
    let tools = Tools::new();
    let mut machine = CleanupStateMachine::default();
    let mut health_servers = HealthServers::new(HealthServerSettings {
        healthz_port: settings.healthz_port,
        ..HealthServerSettings::default()
    });
    loop {
        let request = requests.borrow_and_update().clone();
        let report = round(
            &settings,
            &tools,
            &mut machine,
            &mut health_servers,
            &request,
        )
        .await;
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
    health_servers.stop().await;
}

async fn round(
    settings: &CoexistenceSettings,
    tools: &Tools,
    machine: &mut CleanupStateMachine,
    health_servers: &mut HealthServers,
    request: &CoexistenceRequest,
) -> CoexistenceReport {
    let read_tools = tools.clone();
    let read = tokio::task::spawn_blocking(move || {
        let rules = read_tools.read_node_rules(&[Family::Ipv4])?;
        let names = read_tools.interface_names()?;
        Ok::<_, crate::Error>((rules, names))
    })
    .await;
    let (rules, names) = match read {
        Ok(Ok(read)) => read,
        Ok(Err(error)) => return failed_read(error.to_string()),
        Err(error) => return failed_read(format!("the rule reader failed: {error}")),
    };
    let found = footprint(&rules);
    let health = probe_kube_proxy(&settings.kube_proxy_healthz, Duration::from_millis(500)).await;
    let observation = CoexistenceObservation {
        cleanup_requested: request.cleanup_generation,
        ipvs_mode: ipvs_mode(&names, &rules),
        footprint: found,
        health: health.clone(),
    };
    let verdict = machine.observe(&observation);
    let mut rules_present = value(verdict.rules_present.clone());
    if verdict.decision == CleanupDecision::Clean {
        let plan = plan_node_cleanup(&rules);
        let apply_tools = tools.clone();
        let applied = tokio::task::spawn_blocking(move || apply_tools.apply_cleanup(&plan)).await;
        match applied {
            Ok(Ok(())) => {
                machine.cleanup_succeeded();
                tracing::info!(
                    rules = found.total_rules(),
                    "removed kube-proxy's Service rules"
                );
                rules_present = ConditionValue::new(
                    false,
                    reasons::RULES_ABSENT,
                    "kube-proxy's rules were removed",
                );
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "cleanup failed; retrying");
                machine.cleanup_failed(error.to_string());
            }
            Err(error) => machine.cleanup_failed(error.to_string()),
        }
    }
    let chain_order_safe = if request.serving_from_ebpf {
        let guard_tools = tools.clone();
        let mark = settings.masquerade_mark;
        match tokio::task::spawn_blocking(move || guard_tools.guard_chain_order(Family::Ipv4, mark))
            .await
        {
            Ok(Ok(report)) => {
                if report.reason == reasons::CHAIN_ORDER_RESTORED {
                    tracing::info!(message = %report.message, "chain order restored");
                }
                value(report)
            }
            Ok(Err(error)) => ConditionValue::new(
                false,
                crate::kube_proxy::system::CHAIN_ORDER_REPAIR_FAILED,
                error.to_string(),
            ),
            Err(error) => ConditionValue::new(
                false,
                crate::kube_proxy::system::CHAIN_ORDER_REPAIR_FAILED,
                error.to_string(),
            ),
        }
    } else {
        ConditionValue::new(
            true,
            reasons::CHAIN_ORDER_VERIFIED,
            "no program attached: nothing the datapath translates can be dropped",
        )
    };
    if settings.serve_replacement_healthz {
        // Also never while kube-proxy's rules are on the node: a kube-proxy that
        // starts (again) binds its healthz before it writes rules, and holding
        // the port would hide it from the probe (projectcalico/calico#10748).
        let allowed =
            verdict.replacement_health_allowed && request.serving_from_ebpf && !found.present();
        let errors = health_servers
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
            tracing::debug!(%error, "cannot serve kube-proxy's health port yet");
        }
    }
    let remaining = if verdict.decision == CleanupDecision::Clean
        && rules_present.status == ConditionStatus::False
    {
        0
    } else {
        found.total_rules()
    };
    CoexistenceReport {
        rules_present,
        chain_order_safe,
        kube_proxy_healthy: value(kube_proxy_healthy_condition(&found, &health)),
        kube_proxy_rules: Some(remaining),
    }
}
