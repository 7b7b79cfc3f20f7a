//! Is kube-proxy on this node, in which mode, and may the agent clean up after it?
//! Pure: counts over parsed rules, and the state machine that decides when to clean
//! and when to stop (never fight kube-proxy).

use std::time::{Duration, Instant};

use switchyard_crds::reasons;

use super::{
    nftables::NftRuleset,
    ownership::{is_kube_proxy_chain, proves_kube_proxy},
    IptablesDump, NodeRules,
};

/// The interface kube-proxy's IPVS mode puts every Service address on.
pub const IPVS_INTERFACE: &str = "kube-ipvs0";
/// Chains and ipsets only kube-proxy's IPVS mode creates.
const IPVS_CHAINS: [&str; 2] = ["KUBE-LOAD-BALANCER", "KUBE-NODE-PORT"];
const IPVS_SETS: [&str; 2] = ["KUBE-CLUSTER-IP", "KUBE-LOOP-BACK"];

/// How much of kube-proxy is on the node. Only what kube-proxy alone writes is
/// counted (not `KUBE-POSTROUTING`, which old kubelets put back on their own).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KubeProxyFootprint {
    /// kube-proxy chains declared, over every backend, family and table.
    pub chains: usize,
    /// Rules in those chains plus the rules jumping to them.
    pub rules: usize,
    /// `kube-proxy` nftables tables.
    pub nft_tables: usize,
    /// Rules in those tables.
    pub nft_rules: usize,
}

impl KubeProxyFootprint {
    pub fn present(&self) -> bool {
        self.chains + self.rules + self.nft_tables + self.nft_rules > 0
    }

    /// Rules of both kinds, for status and metrics.
    pub fn total_rules(&self) -> usize {
        self.rules + self.nft_rules
    }
}

pub fn footprint(rules: &NodeRules) -> KubeProxyFootprint {
    let mut footprint = KubeProxyFootprint::default();
    for dump in &rules.iptables {
        let (chains, rule_count) = iptables_footprint(dump);
        footprint.chains += chains;
        footprint.rules += rule_count;
    }
    footprint.nft_tables = rules.nftables.kube_proxy_tables().len();
    footprint.nft_rules = rules.nftables.kube_proxy_rule_count();
    footprint
}

fn iptables_footprint(dump: &IptablesDump) -> (usize, usize) {
    let mut chains = 0;
    let mut rule_count = 0;
    for table in &dump.ruleset.tables {
        chains += table
            .chains
            .iter()
            .filter(|chain| chain.policy.is_none() && proves_kube_proxy(&chain.name))
            .count();
        rule_count += table
            .rules
            .iter()
            .filter(|rule| {
                proves_kube_proxy(&rule.chain)
                    || (!is_kube_proxy_chain(&rule.chain)
                        && rule
                            .target()
                            .is_some_and(|target| proves_kube_proxy(&target)))
            })
            .count();
    }
    (chains, rule_count)
}

/// kube-proxy runs in IPVS mode, which Switchyard does not take over from: its
/// `kube-ipvs0` interface exists, or its IPVS-only chains or ipset matches do.
pub fn ipvs_mode(interface_names: &[String], rules: &NodeRules) -> bool {
    interface_names.iter().any(|name| name == IPVS_INTERFACE)
        || rules.iptables.iter().any(|dump| {
            dump.ruleset.tables.iter().any(|table| {
                table
                    .chains
                    .iter()
                    .any(|chain| IPVS_CHAINS.contains(&chain.name.as_str()))
                    || table.rules.iter().any(|rule| {
                        let words = rule.words();
                        words.windows(2).any(|pair| {
                            pair[0] == "--match-set" && IPVS_SETS.contains(&pair[1].as_str())
                        })
                    })
            })
        })
}

/// What probing kube-proxy's healthz found.
///
/// Only a refused connection (nothing listens on the port) or an agent's
/// replacement server says that kube-proxy has left; an answer of the agent's own
/// server is never kube-proxy's health. Anything else that is not a
/// clean answer (a timeout, a reset, an answer that is not HTTP) says nothing
/// about kube-proxy's absence: a CPU-starved or busy kube-proxy answers late, and
/// taking that for "gone" would flush its rules under it while it still runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KubeProxyHealth {
    /// kube-proxy answered 200.
    Healthy,
    /// kube-proxy answered with another status: it runs, but is not healthy.
    Unhealthy { status: u16 },
    /// Something may listen but gave no usable answer (timed out, reset, closed
    /// early, not HTTP): kube-proxy may be running.
    NoAnswer { reason: String },
    /// The connection was refused: nothing listens on kube-proxy's healthz port.
    Absent { reason: String },
    /// An agent's replacement server answered (its answer carries the agent's
    /// header: another agent process, such as the previous pod still shutting down,
    /// or this one): kube-proxy has left.
    AnsweredByAgent,
    /// This agent's own server received the probe (known by the connection, not by
    /// the answer): this process holds the port, so kube-proxy cannot, and whatever
    /// it answered is not kube-proxy's health.
    AnsweredByThisAgent,
}

impl KubeProxyHealth {
    /// A kube-proxy process may be running: it answered, or something on its port
    /// did not answer cleanly.
    pub fn kube_proxy_may_run(&self) -> bool {
        !self.kube_proxy_has_left()
    }

    /// Nothing of kube-proxy listens on its healthz port any more.
    pub fn kube_proxy_has_left(&self) -> bool {
        matches!(
            self,
            Self::Absent { .. } | Self::AnsweredByAgent | Self::AnsweredByThisAgent
        )
    }
}

/// One condition as the agent reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionReport {
    pub status: bool,
    pub reason: &'static str,
    pub message: String,
}

/// `KubeProxyHealthy`: kube-proxy's rules are present and its healthz answers 200.
pub fn kube_proxy_healthy_condition(
    footprint: &KubeProxyFootprint,
    health: &KubeProxyHealth,
) -> ConditionReport {
    let rules = footprint.total_rules();
    match (footprint.present(), health) {
        (true, KubeProxyHealth::Healthy) => ConditionReport {
            status: true,
            reason: reasons::KUBE_PROXY_HEALTHZ_OK,
            message: format!("kube-proxy's healthz answered 200; {rules} kube-proxy rules present"),
        },
        (false, _) => ConditionReport {
            status: false,
            reason: reasons::KUBE_PROXY_UNHEALTHY,
            message: "no kube-proxy rule is present".into(),
        },
        (true, KubeProxyHealth::Unhealthy { status }) => ConditionReport {
            status: false,
            reason: reasons::KUBE_PROXY_UNHEALTHY,
            message: format!("kube-proxy's healthz answered {status}"),
        },
        (true, KubeProxyHealth::NoAnswer { reason }) => ConditionReport {
            status: false,
            reason: reasons::KUBE_PROXY_UNHEALTHY,
            message: format!("kube-proxy's healthz did not answer: {reason}"),
        },
        (true, KubeProxyHealth::Absent { reason }) => ConditionReport {
            status: false,
            reason: reasons::KUBE_PROXY_UNHEALTHY,
            message: format!("nothing listens on kube-proxy's healthz port: {reason}"),
        },
        (true, KubeProxyHealth::AnsweredByAgent) => ConditionReport {
            status: false,
            reason: reasons::KUBE_PROXY_UNHEALTHY,
            message: "kube-proxy's rules are present but it has left the node (the agent serves its healthz port)".into(),
        },
        (true, KubeProxyHealth::AnsweredByThisAgent) => ConditionReport {
            status: false,
            reason: reasons::KUBE_PROXY_UNHEALTHY,
            message: "kube-proxy's rules are present but this agent holds its healthz port, so kube-proxy cannot serve it".into(),
        },
    }
}

/// Everything the cleanup decision looks at, observed in one round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoexistenceObservation {
    /// `Some(generation)` while the node's spec says `iptablesCleanup: true`; the
    /// generation of that spec. A new generation re-arms a cleanup that stopped on
    /// a conflict (the operator asked again).
    pub cleanup_requested: Option<i64>,
    pub ipvs_mode: bool,
    pub footprint: KubeProxyFootprint,
    pub health: KubeProxyHealth,
    /// When the round read the rules and probed (a monotonic clock: the state
    /// machine measures how long kube-proxy has stayed away).
    pub observed_at: Instant,
}

/// How long kube-proxy's healthz must stay refused (in every round, at least two
/// of them) before its rules are removed: longer than a container restart's gap,
/// so a kube-proxy that restarts in place is never taken for gone.
pub const DEFAULT_ABSENCE_CONFIRMATION: Duration = Duration::from_secs(6);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CleanupDecision {
    /// Apply the cleanup plan now, then call `cleanup_succeeded` or `cleanup_failed`.
    Clean,
    /// Touch nothing.
    Wait,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// No cleanup done for the current request.
    Watching,
    /// The node was cleaned (or found clean) for this request generation.
    Clean { generation: i64 },
    /// kube-proxy's rules came back after the cleanup of this generation: never
    /// clean again until the operator asks again with a new generation.
    Conflict { generation: i64 },
}

/// Decides, round after round, whether to clean and what `KubeProxyRulesPresent`
/// says. It cleans at most once per request, never while kube-proxy may run, and
/// only after kube-proxy's healthz has been refused for the absence confirmation;
/// rules that come back after a cleanup mean kube-proxy runs again, so it stops.
#[derive(Clone, Debug)]
pub struct CleanupStateMachine {
    phase: Phase,
    failure: Option<String>,
    absence_confirmation: Duration,
    /// The first of the consecutive rounds that found kube-proxy gone, and how
    /// many rounds that run holds.
    left_since: Option<(Instant, u32)>,
}

impl Default for CleanupStateMachine {
    fn default() -> Self {
        Self::new(DEFAULT_ABSENCE_CONFIRMATION)
    }
}

/// The state machine's answer for one round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoexistenceVerdict {
    pub decision: CleanupDecision,
    /// `KubeProxyRulesPresent`.
    pub rules_present: ConditionReport,
    /// Whether the agent may serve kube-proxy's health ports (see
    /// [`CleanupStateMachine::replacement_health_allowed`]).
    pub replacement_health_allowed: bool,
}

impl CleanupStateMachine {
    pub fn new(absence_confirmation: Duration) -> Self {
        Self {
            phase: Phase::Watching,
            failure: None,
            absence_confirmation,
            left_since: None,
        }
    }

    /// How long kube-proxy has stayed away, counted from the first of the
    /// consecutive rounds that found it gone, once at least two such rounds (a
    /// single refused probe proves nothing about the next second).
    fn confirmed_absence(&self, now: Instant) -> Option<Duration> {
        match self.left_since {
            Some((since, rounds)) if rounds >= 2 => Some(now.saturating_duration_since(since)),
            _ => None,
        }
    }

    pub fn observe(&mut self, observation: &CoexistenceObservation) -> CoexistenceVerdict {
        self.left_since = if observation.health.kube_proxy_has_left() {
            match self.left_since {
                Some((since, rounds)) => Some((since, rounds.saturating_add(1))),
                None => Some((observation.observed_at, 1)),
            }
        } else {
            None
        };
        let footprint = &observation.footprint;
        let rules = footprint.total_rules();
        let present_report = |reason: &'static str, message: String| ConditionReport {
            status: footprint.present(),
            reason,
            message,
        };
        let plain_report = || {
            if footprint.present() {
                present_report(
                    reasons::RULES_PRESENT,
                    format!(
                        "{rules} kube-proxy rules in {} chains and {} nftables tables",
                        footprint.chains, footprint.nft_tables
                    ),
                )
            } else {
                present_report(
                    reasons::RULES_ABSENT,
                    "no kube-proxy rule is present".into(),
                )
            }
        };
        let (decision, report) = if observation.ipvs_mode {
            // IPVS kube-proxy: its rules and the kube-ipvs0 addresses are not
            // Switchyard's to remove (projectcalico/calico#12476).
            (
                CleanupDecision::Wait,
                ConditionReport {
                    status: true,
                    reason: reasons::UNSUPPORTED_KUBE_PROXY_MODE,
                    message: format!(
                        "kube-proxy runs in IPVS mode ({IPVS_INTERFACE} or IPVS chains found); Switchyard takes over only from iptables and nftables modes"
                    ),
                },
            )
        } else {
            match observation.cleanup_requested {
                None => {
                    self.phase = Phase::Watching;
                    self.failure = None;
                    (CleanupDecision::Wait, plain_report())
                }
                Some(generation) => self.requested(generation, observation, plain_report()),
            }
        };
        CoexistenceVerdict {
            decision,
            rules_present: report,
            replacement_health_allowed: self.replacement_health_allowed(observation),
        }
    }

    fn requested(
        &mut self,
        generation: i64,
        observation: &CoexistenceObservation,
        plain_report: ConditionReport,
    ) -> (CleanupDecision, ConditionReport) {
        let footprint = &observation.footprint;
        let rules = footprint.total_rules();
        let conflict = |message: String| ConditionReport {
            status: true,
            reason: reasons::KUBE_PROXY_CONFLICT,
            message,
        };
        match self.phase {
            Phase::Conflict { generation: seen } if seen == generation => {
                let report = if footprint.present() {
                    conflict(format!(
                        "kube-proxy's rules came back after the cleanup ({rules} rules): kube-proxy runs again, so the agent stopped cleaning"
                    ))
                } else {
                    plain_report
                };
                (CleanupDecision::Wait, report)
            }
            Phase::Clean { generation: seen } if seen == generation => {
                if footprint.present() {
                    self.phase = Phase::Conflict { generation };
                    (
                        CleanupDecision::Wait,
                        conflict(format!(
                            "kube-proxy's rules came back after the cleanup ({rules} rules): kube-proxy runs again, so the agent stopped cleaning"
                        )),
                    )
                } else {
                    (CleanupDecision::Wait, plain_report)
                }
            }
            _ => {
                if !footprint.present() {
                    self.phase = Phase::Clean { generation };
                    self.failure = None;
                    (CleanupDecision::Wait, plain_report)
                } else if observation.health.kube_proxy_may_run() {
                    (
                        CleanupDecision::Wait,
                        conflict(format!(
                            "kube-proxy still answers on its healthz port; not removing its {rules} rules while it runs"
                        )),
                    )
                } else if self
                    .confirmed_absence(observation.observed_at)
                    .is_none_or(|absent| absent < self.absence_confirmation)
                {
                    (
                        CleanupDecision::Wait,
                        ConditionReport {
                            status: true,
                            reason: reasons::RULES_PRESENT,
                            message: format!(
                                "kube-proxy has left its healthz port; removing its {rules} rules once it has stayed away for {} s",
                                self.absence_confirmation.as_secs_f64()
                            ),
                        },
                    )
                } else {
                    self.phase = Phase::Clean { generation };
                    let report = match &self.failure {
                        Some(failure) => ConditionReport {
                            status: true,
                            reason: reasons::CLEANUP_FAILED,
                            message: format!(
                                "retrying the cleanup of {rules} kube-proxy rules after: {failure}"
                            ),
                        },
                        None => ConditionReport {
                            status: true,
                            reason: reasons::RULES_PRESENT,
                            message: format!("removing {rules} kube-proxy rules"),
                        },
                    };
                    (CleanupDecision::Clean, report)
                }
            }
        }
    }

    /// The cleanup decided in the last round was applied.
    pub fn cleanup_succeeded(&mut self) {
        self.failure = None;
    }

    /// The cleanup decided in the last round failed: the next round tries again
    /// (a failure is not a conflict; nothing was proven about kube-proxy).
    pub fn cleanup_failed(&mut self, message: String) {
        self.phase = Phase::Watching;
        self.failure = Some(message);
    }

    /// Whether the agent stopped cleaning because kube-proxy came back.
    pub fn in_conflict(&self) -> bool {
        matches!(self.phase, Phase::Conflict { .. })
    }

    /// The agent may serve kube-proxy's health ports (10256 and the
    /// `healthCheckNodePort`s) only once kube-proxy has left the node: its healthz
    /// does not answer (or the agent's own server does), it is not in IPVS mode, and
    /// its rules did not come back. Before that the ports collide
    /// (projectcalico/calico#10748).
    pub fn replacement_health_allowed(&self, observation: &CoexistenceObservation) -> bool {
        !observation.ipvs_mode && observation.health.kube_proxy_has_left() && !self.in_conflict()
    }
}

/// Every kube-proxy table of the nftables dump, for messages.
pub fn describe_nft_tables(ruleset: &NftRuleset) -> String {
    ruleset
        .kube_proxy_tables()
        .iter()
        .map(|family| format!("{} kube-proxy", family.nft_name()))
        .collect::<Vec<_>>()
        .join(", ")
}
