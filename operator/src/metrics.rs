//! The operator's Prometheus metrics, served by `switchyard-telemetry` on `/metrics`.

use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use switchyard_crds::{DataplaneConfigStatus, DataplanePhase};

/// Every phase, so that the phase gauge always has one series per phase (1 for the current one).
pub const PHASES: [DataplanePhase; 11] = [
    DataplanePhase::Pending,
    DataplanePhase::Preflight,
    DataplanePhase::ActivatingNodes,
    DataplanePhase::DisablingKubeProxy,
    DataplanePhase::CleaningRules,
    DataplanePhase::RestoringKubeProxy,
    DataplanePhase::DeactivatingNodes,
    DataplanePhase::UpgradingAgents,
    DataplanePhase::Ready,
    DataplanePhase::Paused,
    DataplanePhase::Halted,
];

/// The operator's metrics.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// `switchyard_operator_reconcile_duration_seconds`: how long one reconcile took.
    pub reconcile_duration: Histogram,
    /// `switchyard_operator_reconcile_errors_total{step}`: failed reconciles by failing step.
    pub reconcile_errors: IntCounterVec,
    /// `switchyard_operator_transition_phase{phase}`: 1 for the current phase, 0 for the others.
    pub transition_phase: IntGaugeVec,
    /// `switchyard_operator_nodes{state}`: nodes by state, as in the DataplaneConfig status.
    pub nodes: IntGaugeVec,
    /// `switchyard_operator_leader`: 1 while this replica holds the leader Lease.
    pub leader: IntGauge,
}

impl Metrics {
    /// Creates and registers every metric in a new registry.
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let reconcile_duration = Histogram::with_opts(
            HistogramOpts::new(
                "switchyard_operator_reconcile_duration_seconds",
                "How long one reconcile of the DataplaneConfig took (snapshot, plan, apply, status).",
            )
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
        )?;
        let reconcile_errors = IntCounterVec::new(
            Opts::new(
                "switchyard_operator_reconcile_errors_total",
                "Failed reconciles, by the step that failed.",
            ),
            &["step"],
        )?;
        let transition_phase = IntGaugeVec::new(
            Opts::new(
                "switchyard_operator_transition_phase",
                "The DataplaneConfig's phase: 1 for the current phase, 0 for every other.",
            ),
            &["phase"],
        )?;
        let nodes = IntGaugeVec::new(
            Opts::new(
                "switchyard_operator_nodes",
                "Nodes by state, as published in the DataplaneConfig status.",
            ),
            &["state"],
        )?;
        let leader = IntGauge::new(
            "switchyard_operator_leader",
            "1 while this replica holds the leader Lease.",
        )?;
        registry.register(Box::new(reconcile_duration.clone()))?;
        registry.register(Box::new(reconcile_errors.clone()))?;
        registry.register(Box::new(transition_phase.clone()))?;
        registry.register(Box::new(nodes.clone()))?;
        registry.register(Box::new(leader.clone()))?;
        Ok(Self {
            registry,
            reconcile_duration,
            reconcile_errors,
            transition_phase,
            nodes,
            leader,
        })
    }

    /// The registry to serve.
    pub fn registry(&self) -> Registry {
        self.registry.clone()
    }

    /// Records a published status: its phase and node counts.
    pub fn observe_status(&self, status: &DataplaneConfigStatus) {
        for phase in PHASES {
            self.transition_phase
                .with_label_values(&[&phase.to_string()])
                .set(i64::from(phase == status.phase));
        }
        let counts = &status.nodes;
        for (state, count) in [
            ("total", counts.total),
            ("serving", counts.serving),
            ("kube_proxy_running", counts.kube_proxy_running),
            ("rules_cleaned", counts.rules_cleaned),
            ("agent_up_to_date", counts.agent_up_to_date),
            ("failed", counts.failed),
            ("draining", counts.draining),
        ] {
            self.nodes.with_label_values(&[state]).set(i64::from(count));
        }
    }
}

#[cfg(test)]
mod tests;
