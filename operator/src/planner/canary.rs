//! Canary transitions: during KubeProxy -> Ebpf, while kube-proxy still serves the cluster,
//! switched nodes are watched before more nodes switch, and a node showing more disruption than
//! `spec.rollout.disruptionBudget` allows stops the transition.
//!
//! Opt-in: only with `spec.rollout.canary` set (even `{}`). Without it the gate stays open
//! ([`CanaryGate::open`]): batches of `maxUnavailable`, no soak, no wait for disruption signals,
//! the budget not read, as before canaries existed. Not all the budgeted signals are measured
//! yet and no end-to-end suite proves this path; once `make e2e-canary` does, one canary of 60 s
//! becomes the default.
//!
//! # Which nodes go first
//! `canary.count` (default one): the first nodes the activation picks (node-name order among
//! the eligible ones); once that many are told `Ebpf`, the first ones told (by `requestedAt`,
//! then name) are the canaries. `canary.nodeSelector`: every node carrying its labels; no other
//! node switches before they all have. No matching node holds the transition
//! (`CanaryNodesNotFound`).
//!
//! # Soak
//! A switched node soaks from the moment its programs attached (its `ProgramsAttached`
//! condition's `lastTransitionTime`, written by its agent, the same clock as its windows) for
//! `soakSeconds` (canaries) or `batchSoakSeconds` (later batches). The later batches go only
//! once every canary serves and passed its soak, and each batch only while no switched node is
//! still soaking or waited for. The snapshot's clock decides; the plan asks to be planned again
//! when a soak ends.
//!
//! # Judging a node
//! Against its own baseline (`status.disruption.baseline`, under kube-proxy, ending at or before
//! the switch), with a window that starts at or after the switch (`status.disruption.current`).
//! Rates are per minute over at least a minute (a shorter window counts as a whole minute, so a
//! few events right after the switch do not look like a storm, while a real storm still shows
//! before the soak ends). A signal is over budget when its rate exceeds both the baseline plus
//! the absolute allowance and the baseline times (1 + the relative allowance). A signal the
//! agent reports after the switch but not in the baseline counts from a baseline of zero. A node
//! is judged as soon as such a window exists, so a faulty canary is caught during its soak.
//!
//! - No `status.disruption` at all: the agent does not measure. There is nothing to compare, so
//!   the node is not soaked; the status says it was not measured.
//! - Baseline missing, or no window yet that covers the soak: wait, until
//!   `nodeReadyTimeoutSeconds` after the soak's end. At that bound a node with a window but no
//!   baseline is judged against none (only the absolute allowances can pass it: a baseline is
//!   measured under kube-proxy, so none will come for a switched node); a node without a window
//!   halts the transition (`DisruptionSignalsMissing`, nothing rolled back: there is no evidence
//!   of harm), which resumes by itself when the signals arrive.
//!
//! # Over budget
//! The evidence (node, signal, baseline and observed rates, the allowance, the Services most
//! affected) goes into `status.budgetExceeded` and the `Degraded` condition (an Event each).
//! `Rollback`: the nodes over budget go back to kube-proxy (each once its agent reports
//! kube-proxy healthy there; the agent drains its flows for `drainTimeoutSeconds`), the phase is
//! `Halted`, and while `metadata.generation` stays the one recorded no node is activated again,
//! whatever the signals say later. `Halt`: nothing is switched while a node is over budget; once
//! its window is back within budget the transition goes on. Either way the evidence recorded
//! first under a spec is kept until the spec changes.

use chrono::{DateTime, Duration, Utc};
use switchyard_crds::{
    condition_types, find_condition, reasons, AffectedService, BudgetExceeded,
    BudgetExceededAction, BudgetedSignal, DataplaneMode, DataplanePhase, DisruptionBudget,
    DisruptionEvidence, ServiceSignals, SignalWindow,
};

use super::context::{Context, Decision, DesiredNode};
use super::facts::NodeFacts;
use super::settings::CanaryNodes;
use super::{name_list, naming};

/// The most affected Services named per signal in the evidence.
const SERVICES_IN_EVIDENCE: usize = 5;

/// How far (seconds) a window's edge may be from the `ProgramsAttached` condition's time and
/// still be taken as the moment of the switch (see `verdict`).
const SWITCH_TIME_TOLERANCE_SECONDS: i64 = 2;

/// Windows shorter than this count as this long (see "Judging a node").
const SHORTEST_WINDOW_SECONDS: i64 = 60;

/// What the planner concludes about one switched node's disruption.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Verdict {
    /// Not switched and serving from eBPF, or not watched (no transition to watch).
    NotWatched,
    /// Serving, but its agent reports no disruption signals: judged on readiness alone.
    Unmeasured,
    /// Within budget so far; its soak ends at `until`.
    Soaking { until: DateTime<Utc> },
    /// The soak ended but `missing` has not arrived; waited for until `until`.
    WaitingForSignals {
        until: DateTime<Utc>,
        missing: &'static str,
    },
    /// `WaitingForSignals` past its bound.
    SignalsMissing { missing: &'static str },
    /// Soaked, and within budget over a window covering the soak.
    Passed,
    /// Soaked, no baseline by the bound, and within the absolute allowances over a window
    /// covering the soak.
    PassedWithoutBaseline,
    /// Over budget: one piece of evidence per signal.
    OverBudget(Vec<DisruptionEvidence>),
}

impl Verdict {
    /// Still watched: its soak or its signals are awaited.
    fn watched(&self) -> bool {
        matches!(self, Self::Soaking { .. } | Self::WaitingForSignals { .. })
    }

    /// Done with: nothing more to wait for on this node.
    fn cleared(&self) -> bool {
        matches!(
            self,
            Self::Passed | Self::PassedWithoutBaseline | Self::Unmeasured
        )
    }
}

/// Which nodes the activation may switch now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Any node, as `maxUnavailable` allows.
    Any,
    /// Only the nodes marked, and at most `limit` of them when given.
    Only {
        nodes: Vec<bool>,
        limit: Option<usize>,
    },
    /// None: switched nodes are still watched.
    Nothing,
}

/// The canary rules applied to one snapshot.
#[derive(Clone, Debug)]
pub(crate) struct CanaryGate {
    /// Per node (facts order).
    pub(crate) verdicts: Vec<Verdict>,
    /// Per node: a canary.
    pub(crate) canary: Vec<bool>,
    pub(crate) admission: Admission,
}

impl CanaryGate {
    /// The gate of a snapshot where nothing is watched: activation as before.
    fn open(node_count: usize) -> Self {
        Self {
            verdicts: vec![Verdict::NotWatched; node_count],
            canary: vec![false; node_count],
            admission: Admission::Any,
        }
    }

    /// Whether the activation may switch the node at `index`.
    pub(crate) fn admits(&self, index: usize) -> bool {
        match &self.admission {
            Admission::Any => true,
            Admission::Only { nodes, .. } => nodes[index],
            Admission::Nothing => false,
        }
    }

    /// At most this many nodes may be switched now (beyond `maxUnavailable`'s own limit).
    pub(crate) fn limit(&self) -> Option<usize> {
        match &self.admission {
            Admission::Any => None,
            Admission::Only { limit, .. } => *limit,
            Admission::Nothing => Some(0),
        }
    }

    /// Some switched node is still soaking or waited for.
    pub(crate) fn watching(&self) -> bool {
        self.verdicts.iter().any(Verdict::watched)
    }

    /// When a soak ends or a wait for signals reaches its bound: the plan must be made again
    /// then, even if nothing else changes.
    pub(crate) fn deadlines(&self) -> impl Iterator<Item = DateTime<Utc>> + '_ {
        self.verdicts.iter().filter_map(|verdict| match verdict {
            Verdict::Soaking { until } | Verdict::WaitingForSignals { until, .. } => Some(*until),
            _ => None,
        })
    }
}

impl<'a> Context<'a> {
    /// Whether switched nodes are watched now: the spec asks for a canary (it is opt-in), toward
    /// `Ebpf`, while kube-proxy still serves the cluster (a node over budget can go back to it)
    /// and has not come back after leaving.
    fn canary_applies(&self) -> bool {
        self.settings.canary.is_some()
            && self.settings.mode == DataplaneMode::Ebpf
            && !self.kube_proxy_gone
            && !self
                .observed
                .kube_proxy_daemon_set
                .as_ref()
                .is_some_and(|set| set.disabled_by_switchyard)
            && !self.kube_proxy_returned()
    }

    /// The canary rules on this snapshot.
    pub(super) fn canary_gate(&self) -> CanaryGate {
        // Without `rollout.canary` the gate stays open: batches of maxUnavailable, no soak, no
        // wait for disruption signals, as before canaries existed.
        let Some(canary_settings) = self
            .settings
            .canary
            .as_ref()
            .filter(|_| self.canary_applies())
        else {
            return CanaryGate::open(self.facts.len());
        };
        let told: Vec<bool> = self
            .facts
            .iter()
            .map(|node| node.mode() == Some(DataplaneMode::Ebpf))
            .collect();
        let canary: Vec<bool> = match &canary_settings.canaries {
            CanaryNodes::Selector(selector) => self
                .facts
                .iter()
                .map(|node| {
                    selector
                        .iter()
                        .all(|(key, value)| node.labels.get(key) == Some(value))
                })
                .collect(),
            CanaryNodes::Count(count) => {
                let mut order: Vec<usize> = (0..self.facts.len()).filter(|i| told[*i]).collect();
                order.sort_by_key(|index| {
                    let node = &self.facts[*index];
                    (node.spec.and_then(|spec| spec.requested_at), node.name)
                });
                let mut canary = vec![false; self.facts.len()];
                for index in order.into_iter().take(*count) {
                    canary[index] = true;
                }
                canary
            }
        };
        let verdicts: Vec<Verdict> = self
            .facts
            .iter()
            .zip(&canary)
            .map(|(node, is_canary)| {
                let soak = if *is_canary {
                    canary_settings.soak_seconds
                } else {
                    canary_settings.batch_soak_seconds
                };
                self.verdict(node, soak, &canary_settings.budget)
            })
            .collect();
        let watched = verdicts.iter().any(Verdict::watched);
        // A failed canary proves nothing either way; maxFailedNodes decides about it.
        let canaries_cleared = (0..self.facts.len())
            .filter(|index| canary[*index] && !self.failed[*index])
            .all(|index| told[index] && verdicts[index].cleared());
        let admission = match &canary_settings.canaries {
            CanaryNodes::Count(count) => {
                let told_count = told.iter().filter(|told| **told).count();
                if told_count < *count {
                    Admission::Only {
                        nodes: told.iter().map(|told| !told).collect(),
                        limit: Some(count - told_count),
                    }
                } else if watched || !canaries_cleared {
                    Admission::Nothing
                } else {
                    Admission::Any
                }
            }
            CanaryNodes::Selector(_) => {
                let untold_canaries: Vec<bool> = canary
                    .iter()
                    .zip(&told)
                    .map(|(canary, told)| *canary && !told)
                    .collect();
                if untold_canaries.iter().any(|untold| *untold) {
                    Admission::Only {
                        nodes: untold_canaries,
                        limit: None,
                    }
                } else if watched || !canaries_cleared {
                    Admission::Nothing
                } else {
                    Admission::Any
                }
            }
        };
        CanaryGate {
            verdicts,
            canary,
            admission,
        }
    }

    /// One node's verdict, with `soak_seconds` of soak, judged against `budget`.
    fn verdict(&self, node: &NodeFacts, soak_seconds: i64, budget: &DisruptionBudget) -> Verdict {
        if !node.serving_from_ebpf() {
            return Verdict::NotWatched;
        }
        let Some(report) = node.status.and_then(|status| status.disruption.as_ref()) else {
            return Verdict::Unmeasured;
        };
        let Some(switched_at) = node.status.and_then(|status| {
            find_condition(&status.conditions, condition_types::PROGRAMS_ATTACHED)
                .map(|condition| condition.last_transition_time)
        }) else {
            return Verdict::NotWatched;
        };
        let soak_end = seconds_after(switched_at, soak_seconds);
        // The agent samples its counters at the switch and writes the condition right after,
        // both in whole seconds: a window edge a second or two off the condition's time is the
        // same moment.
        let tolerance = Duration::seconds(SWITCH_TIME_TOLERANCE_SECONDS);
        let baseline = report
            .baseline
            .as_ref()
            .filter(|window| window.end > window.start && window.end <= switched_at + tolerance);
        let current = report
            .current
            .as_ref()
            .filter(|window| window.end > window.start && window.start + tolerance >= switched_at);
        if let (Some(baseline), Some(current)) = (baseline, current) {
            let evidence = over_budget(node.name, baseline, current, budget);
            if !evidence.is_empty() {
                return Verdict::OverBudget(evidence);
            }
        }
        if self.now < soak_end {
            return Verdict::Soaking { until: soak_end };
        }
        let bound = seconds_after(soak_end, self.settings.node_ready_timeout_seconds);
        let missing = match (baseline, current) {
            (Some(_), Some(current)) if current.end >= soak_end => return Verdict::Passed,
            // No baseline will come for a node already switched (it is measured under
            // kube-proxy), unless its agent finds one it wrote before: at the bound the node is
            // judged against none, which only the absolute allowances can pass.
            (None, Some(current)) if current.end >= soak_end && self.now >= bound => {
                let nothing_before = SignalWindow {
                    start: current.start - Duration::seconds(SHORTEST_WINDOW_SECONDS),
                    end: current.start,
                    datapath: Default::default(),
                    expected: Default::default(),
                    connections: Default::default(),
                    probes: Default::default(),
                    services: Vec::new(),
                };
                let evidence = over_budget(node.name, &nothing_before, current, budget);
                return if evidence.is_empty() {
                    Verdict::PassedWithoutBaseline
                } else {
                    Verdict::OverBudget(evidence)
                };
            }
            (None, _) => "a baseline measured before the switch",
            (Some(_), _) => "a window of signals covering the soak",
        };
        if self.now >= bound {
            Verdict::SignalsMissing { missing }
        } else {
            Verdict::WaitingForSignals {
                until: bound,
                missing,
            }
        }
    }

    /// The budget stops the transition here: a `Rollback` recorded under this spec, a node over
    /// budget, or signals missing past their bound. `None`: the activation goes on, as `gate`
    /// admits.
    pub(super) fn canary_stop(
        &self,
        gate: &CanaryGate,
        desired: Vec<DesiredNode>,
    ) -> Option<Decision> {
        let recorded = self.recorded_budget_exceeded;
        let mut new_evidence: Vec<DisruptionEvidence> = Vec::new();
        for verdict in &gate.verdicts {
            if let Verdict::OverBudget(evidence) = verdict {
                new_evidence.extend(evidence.iter().cloned());
            }
        }
        let rolling_back = recorded
            .is_some_and(|recorded| recorded.action == BudgetExceededAction::Rollback)
            || (!new_evidence.is_empty()
                && self.settings.canary.as_ref().is_some_and(|canary| {
                    canary.on_budget_exceeded == BudgetExceededAction::Rollback
                }));
        if rolling_back {
            let record = self.record(BudgetExceededAction::Rollback, new_evidence);
            return Some(self.roll_back(desired, record));
        }
        if !new_evidence.is_empty() {
            let record = self.record(BudgetExceededAction::Halt, new_evidence);
            let message = format!(
                "halted (rollout.onBudgetExceeded Halt): {}; nothing switches until the node is back within budget",
                describe_evidence(&record.evidence)
            );
            let mut decision = self.budget_decision(desired, message);
            decision.budget_exceeded = Some(record);
            return Some(decision);
        }
        let missing: Vec<(&str, &str)> = self
            .facts
            .iter()
            .zip(&gate.verdicts)
            .filter_map(|(node, verdict)| match verdict {
                Verdict::SignalsMissing { missing } => Some((node.name, *missing)),
                _ => None,
            })
            .collect();
        if !missing.is_empty() {
            let described: Vec<String> = missing
                .iter()
                .map(|(name, what)| format!("{name} ({what})"))
                .collect();
            let message = format!(
                "halted: no disruption signals from {} within rollout.nodeReadyTimeoutSeconds ({}s) after the soak; nothing is rolled back (no evidence of harm) and the transition resumes when the signals arrive",
                name_list(described.iter().map(String::as_str)),
                self.settings.node_ready_timeout_seconds
            );
            let mut decision = self.decision(
                desired,
                DataplanePhase::Halted,
                reasons::DISRUPTION_SIGNALS_MISSING,
                message.clone(),
            );
            decision.degraded = Some((reasons::DISRUPTION_SIGNALS_MISSING, message));
            return Some(decision);
        }
        if let Some(CanaryNodes::Selector(selector)) =
            self.settings.canary.as_ref().map(|canary| &canary.canaries)
        {
            if self.canary_applies() && !gate.canary.iter().any(|canary| *canary) {
                let labels: Vec<String> = selector
                    .iter()
                    .map(|(key, value)| format!("{key}={value}"))
                    .collect();
                let message = format!(
                    "no node carries the labels of rollout.canary.nodeSelector ({}): no node switches until one does",
                    labels.join(", ")
                );
                let mut decision = self.decision(
                    desired,
                    DataplanePhase::Preflight,
                    reasons::CANARY_NODES_NOT_FOUND,
                    message.clone(),
                );
                decision.degraded = Some((reasons::CANARY_NODES_NOT_FOUND, message));
                return Some(decision);
            }
        }
        None
    }

    /// The evidence to publish: what was recorded first under this spec, with the pieces about
    /// (node, signal) pairs not recorded yet added. Figures recorded first are kept, so that the
    /// status does not change with every new window and the first evidence is not lost.
    fn record(
        &self,
        action: BudgetExceededAction,
        new_evidence: Vec<DisruptionEvidence>,
    ) -> BudgetExceeded {
        let mut record = match self.recorded_budget_exceeded {
            Some(recorded)
                if recorded.action == BudgetExceededAction::Rollback
                    || action == recorded.action =>
            {
                recorded.clone()
            }
            _ => BudgetExceeded {
                observed_generation: self.generation.unwrap_or_default(),
                action,
                detected_at: self.now,
                evidence: Vec::new(),
            },
        };
        for piece in new_evidence {
            let known = record
                .evidence
                .iter()
                .any(|known| known.node == piece.node && known.signal == piece.signal);
            if !known {
                record.evidence.push(piece);
            }
        }
        record
    }

    /// `Rollback`: the nodes named in the evidence go back to kube-proxy, each once its agent
    /// reports kube-proxy healthy there; nothing is activated while the spec stays the same.
    fn roll_back(&self, mut desired: Vec<DesiredNode>, record: BudgetExceeded) -> Decision {
        let mut switching_back = Vec::new();
        let mut waiting_for_kube_proxy = Vec::new();
        let mut queued = Vec::new();
        let mut back = Vec::new();
        // As the usual way back: at most maxUnavailable nodes in flight (told KubeProxy, not yet
        // detached nor draining), the rest queued.
        let in_flight = self
            .facts
            .iter()
            .enumerate()
            .filter(|(index, node)| {
                node.mode() == Some(DataplaneMode::KubeProxy)
                    && !node.detached()
                    && !node.draining()
                    && !self.failed[*index]
            })
            .count();
        let mut capacity = self.settings.max_unavailable.saturating_sub(in_flight);
        for (index, node) in self.facts.iter().enumerate() {
            if !record.evidence.iter().any(|piece| piece.node == node.name) {
                continue;
            }
            match node.mode() {
                Some(DataplaneMode::Ebpf) if !node.kube_proxy_healthy() => {
                    waiting_for_kube_proxy.push(node.name)
                }
                Some(DataplaneMode::Ebpf) if capacity > 0 => {
                    capacity -= 1;
                    desired[index].mode = DataplaneMode::KubeProxy;
                    switching_back.push(node.name);
                }
                Some(DataplaneMode::Ebpf) => queued.push(node.name),
                _ if node.detached() => back.push(node.name),
                _ => switching_back.push(node.name),
            }
        }
        let mut parts = vec![format!(
            "rolled back by itself (rollout.onBudgetExceeded Rollback): {}",
            describe_evidence(&record.evidence)
        )];
        parts.extend(naming(&[
            (
                &switching_back,
                "taking {} back to kube-proxy (draining their flows)",
            ),
            (
                &waiting_for_kube_proxy,
                "waiting for kube-proxy to be healthy on {} before it leaves eBPF",
            ),
            (&queued, "{} queued (rollout.maxUnavailable)"),
            (&back, "{} back on kube-proxy"),
        ]));
        parts.push("the transition starts again when the spec changes".into());
        let mut decision = self.budget_decision(desired, parts.join("; "));
        decision.budget_exceeded = Some(record);
        decision
    }

    /// `Halted` for `DisruptionBudgetExceeded`, `Degraded` with the same message.
    fn budget_decision(&self, desired: Vec<DesiredNode>, message: String) -> Decision {
        let mut decision = self.decision(
            desired,
            DataplanePhase::Halted,
            reasons::DISRUPTION_BUDGET_EXCEEDED,
            message.clone(),
        );
        decision.degraded = Some((reasons::DISRUPTION_BUDGET_EXCEEDED, message));
        decision
    }

    /// What the activation's message says about watched nodes, if anything.
    pub(super) fn canary_message(&self, gate: &CanaryGate) -> Vec<String> {
        let names = |wanted: fn(&Verdict) -> bool| {
            self.names_where(|index, _| wanted(&gate.verdicts[index]))
        };
        let soaking = names(|verdict| matches!(verdict, Verdict::Soaking { .. }));
        let waiting = names(|verdict| matches!(verdict, Verdict::WaitingForSignals { .. }));
        let without_baseline = names(|verdict| *verdict == Verdict::PassedWithoutBaseline);
        let unmeasured_canaries = self.names_where(|index, _| {
            gate.canary[index] && gate.verdicts[index] == Verdict::Unmeasured
        });
        let untold_canaries = self.names_where(|index, node| {
            gate.canary[index] && node.mode() != Some(DataplaneMode::Ebpf)
        });
        let mut parts = naming(&[
            (
                &soaking,
                "soaking {} (disruption signals compared with their baseline under kube-proxy)",
            ),
            (
                &waiting,
                "waiting for disruption signals (a baseline and a window covering the soak) from {}",
            ),
            (
                &without_baseline,
                "{} judged without a baseline (none measured before the switch)",
            ),
            (
                &unmeasured_canaries,
                "canary {} not measured (its agent reports no disruption signals)",
            ),
            (&untold_canaries, "canary node(s) {} go first"),
        ]);
        if let (Admission::Only { limit: Some(_), .. }, Some(canary)) =
            (&gate.admission, self.settings.canary.as_ref())
        {
            if let CanaryNodes::Count(count) = canary.canaries {
                parts.push(format!(
                    "canaries go first (rollout.canary.count {count}, soak {}s)",
                    canary.soak_seconds
                ));
            }
        }
        if gate.admission == Admission::Nothing && soaking.is_empty() && waiting.is_empty() {
            parts.push("the next batch waits for every canary to serve and pass its soak".into());
        }
        parts
    }
}

/// `seconds` after `time`; the end of time when that is beyond what a time can hold (a spec
/// written before the schema had its ranges may carry any number; waiting forever is then
/// the safe reading, and the planner must not panic).
fn seconds_after(time: DateTime<Utc>, seconds: i64) -> DateTime<Utc> {
    Duration::try_seconds(seconds)
        .and_then(|duration| time.checked_add_signed(duration))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// One budgeted signal: where its counts are, and its allowances.
struct BudgetRule {
    signal: BudgetedSignal,
    count_of: fn(&SignalWindow) -> Option<i64>,
    service_count_of: fn(&ServiceSignals) -> Option<i64>,
    absolute: i64,
    relative_percent: Option<i64>,
}

/// Each budgeted signal of `current` over budget against `baseline`, as evidence about `node`.
pub(crate) fn over_budget(
    node: &str,
    baseline: &SignalWindow,
    current: &SignalWindow,
    budget: &DisruptionBudget,
) -> Vec<DisruptionEvidence> {
    let rules = [
        BudgetRule {
            signal: BudgetedSignal::FailedConnects,
            count_of: |window| window.connections.failed_connects,
            service_count_of: |service| service.failed_connects,
            absolute: budget.failed_connects_per_minute,
            relative_percent: Some(budget.failed_connects_percent),
        },
        BudgetRule {
            signal: BudgetedSignal::ResetsByPeer,
            count_of: |window| window.connections.resets_by_peer,
            service_count_of: |service| service.resets_by_peer,
            absolute: budget.resets_per_minute,
            relative_percent: Some(budget.resets_percent),
        },
        BudgetRule {
            signal: BudgetedSignal::ProbeFailures,
            count_of: |window| window.probes.failures,
            service_count_of: |service| service.probe_failures,
            absolute: budget.probe_failures_per_minute,
            relative_percent: None,
        },
    ];
    let mut evidence = Vec::new();
    for BudgetRule {
        signal,
        count_of,
        service_count_of,
        absolute,
        relative_percent,
    } in rules
    {
        let Some(observed_count) = count_of(current) else {
            continue;
        };
        let before = Rate::of(count_of(baseline).unwrap_or(0), baseline);
        let after = Rate::of(observed_count, current);
        if !after.exceeds(&before, absolute, relative_percent) {
            continue;
        }
        let allowed = allowed_per_minute(before.per_minute(), absolute, relative_percent);
        let (before, after) = (before.per_minute(), after.per_minute());
        let mut services: Vec<AffectedService> = current
            .services
            .iter()
            .filter_map(|service| {
                let count = service_count_of(service).filter(|count| *count > 0)?;
                Some(AffectedService {
                    namespace: service.namespace.clone(),
                    name: service.name.clone(),
                    count,
                })
            })
            .collect();
        services.sort_by(|left, right| {
            right
                .count
                .cmp(&left.count)
                .then_with(|| (&left.namespace, &left.name).cmp(&(&right.namespace, &right.name)))
        });
        services.truncate(SERVICES_IN_EVIDENCE);
        evidence.push(DisruptionEvidence {
            node: node.to_owned(),
            signal,
            baseline_per_minute: format!("{before:.1}"),
            observed_per_minute: format!("{after:.1}"),
            allowed_per_minute: format!("{allowed:.1}"),
            services,
        });
    }
    evidence
}

/// A rate per minute as a fraction, `count × 60 / seconds`, compared exactly (no float rounding
/// may decide whether a node goes back).
#[derive(Clone, Copy, Debug)]
struct Rate {
    count: i128,
    seconds: i128,
}

impl Rate {
    /// `count` events over `window`, at least a minute long.
    fn of(count: i64, window: &SignalWindow) -> Self {
        let seconds = (window.end - window.start)
            .num_seconds()
            .max(SHORTEST_WINDOW_SECONDS);
        Self {
            count: i128::from(count.max(0)),
            seconds: i128::from(seconds),
        }
    }

    /// Whether this rate exceeds `before` by more than `absolute` per minute and, with a
    /// relative allowance, by more than `relative_percent` of `before`.
    fn exceeds(&self, before: &Rate, absolute: i64, relative_percent: Option<i64>) -> bool {
        // Both sides of `count × 60 / seconds` compared times `self.seconds × before.seconds`
        // (both positive).
        // Saturating: allowances near i64::MAX (any number a spec may carry) allow everything
        // rather than overflow.
        let after = self.count * 60 * before.seconds;
        let base = before.count * 60 * self.seconds;
        let absolute = i128::from(absolute)
            .saturating_mul(self.seconds)
            .saturating_mul(before.seconds);
        let beyond_absolute = after > base.saturating_add(absolute);
        let beyond_relative = relative_percent.is_none_or(|percent| {
            after.saturating_mul(100) > base.saturating_mul(100 + i128::from(percent))
        });
        beyond_absolute && beyond_relative
    }

    /// For people: the rate per minute.
    fn per_minute(&self) -> f64 {
        self.count as f64 * 60.0 / self.seconds as f64
    }
}

/// The highest rate the budget allows over a baseline rate of `before`: both the absolute and
/// the relative allowance must be exceeded, so the larger of the two limits applies.
fn allowed_per_minute(before: f64, absolute: i64, relative_percent: Option<i64>) -> f64 {
    let by_absolute = before + absolute as f64;
    match relative_percent {
        Some(percent) => by_absolute.max(before * (1.0 + percent as f64 / 100.0)),
        None => by_absolute,
    }
}

/// `node-1: failed connects 0.0 -> 42.0 per minute (allowed 30.0; shop/cart 40)`, joined.
pub(crate) fn describe_evidence(evidence: &[DisruptionEvidence]) -> String {
    let pieces: Vec<String> = evidence
        .iter()
        .map(|piece| {
            let services: Vec<String> = piece
                .services
                .iter()
                .map(|service| format!("{}/{} {}", service.namespace, service.name, service.count))
                .collect();
            let services = if services.is_empty() {
                String::new()
            } else {
                format!("; most affected: {}", services.join(", "))
            };
            format!(
                "{}: {} {} -> {} per minute (allowed {}{services})",
                piece.node,
                piece.signal,
                piece.baseline_per_minute,
                piece.observed_per_minute,
                piece.allowed_per_minute
            )
        })
        .collect();
    format!("disruption budget exceeded on {}", pieces.join("; "))
}
