//! Is kube-proxy on this node, in which mode, and may the agent clean up after it?
//! Pure: counts over parsed rules, and the state machine that decides when to clean
//! and when to stop (never fight kube-proxy).

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
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KubeProxyHealth {
    /// kube-proxy answered 200.
    Healthy,
    /// kube-proxy answered with another status: it runs, but is not healthy.
    Unhealthy { status: u16 },
    /// Nothing answered (refused, timed out, not HTTP): no kube-proxy listening.
    Unreachable { reason: String },
    /// The agent's own replacement server answered: kube-proxy has left.
    AnsweredByAgent,
}

impl KubeProxyHealth {
    /// A kube-proxy process answers on its healthz port.
    pub fn kube_proxy_answers(&self) -> bool {
        matches!(self, Self::Healthy | Self::Unhealthy { .. })
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
        (true, KubeProxyHealth::Unreachable { reason }) => ConditionReport {
            status: false,
            reason: reasons::KUBE_PROXY_UNHEALTHY,
            message: format!("kube-proxy's healthz did not answer: {reason}"),
        },
        (true, KubeProxyHealth::AnsweredByAgent) => ConditionReport {
            status: false,
            reason: reasons::KUBE_PROXY_UNHEALTHY,
            message: "kube-proxy's rules are present but it has left the node (the agent serves its healthz port)".into(),
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
}

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
/// says. It cleans at most once per request and never while kube-proxy answers;
/// rules that come back after a cleanup mean kube-proxy runs again, so it stops.
#[derive(Clone, Debug)]
pub struct CleanupStateMachine {
    phase: Phase,
    failure: Option<String>,
}

impl Default for CleanupStateMachine {
    fn default() -> Self {
        Self {
            phase: Phase::Watching,
            failure: None,
        }
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
    pub fn observe(&mut self, observation: &CoexistenceObservation) -> CoexistenceVerdict {
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
                } else if observation.health.kube_proxy_answers() {
                    (
                        CleanupDecision::Wait,
                        conflict(format!(
                            "kube-proxy still answers on its healthz port; not removing its {rules} rules while it runs"
                        )),
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
        !observation.ipvs_mode && !observation.health.kube_proxy_answers() && !self.in_conflict()
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
