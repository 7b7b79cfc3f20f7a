//! The chain-order guard: the agent's own chains stay ahead of kube-proxy's in
//! filter FORWARD and nat POSTROUTING, whichever of the two started first.
//!
//! ## What must be first, and why
//!
//! kube-proxy hooks its chains in with "insert at the top if missing"
//! (`EnsureRule(Prepend)`): a kube-proxy that starts after the agent (a node
//! rolled back, a DaemonSet that came back, the e2e "kube-proxy starts late"
//! scenario) lands ahead of the agent's jumps; one that restarts later finds its
//! jumps and leaves them where they are. So the agent puts its jumps at position 1
//! whenever something of kube-proxy's, or a rule with a final verdict, got ahead
//! of them; kube-proxy never moves its jumps back, so there is no fight.
//!
//! - **filter FORWARD -> `SWITCHYARD-FORWARD`**, holding two rules for the packets
//!   the TC programs mark with the datapath's masquerade mark M (translated to a
//!   backend on another node, to be masqueraded):
//!   `-m mark --mark M/M -m conntrack --ctstate INVALID -j DROP`, then
//!   `-m mark --mark M/M -j ACCEPT`. This is kube-proxy's own `KUBE-FORWARD`
//!   (INVALID drop, then `--mark 0x4000/0x4000 -j ACCEPT`) for the agent's mark,
//!   kept once the cleanup has removed `KUBE-FORWARD`: on hosts whose FORWARD
//!   policy is DROP (Docker sets it) the accept is what forwards these packets,
//!   and it must come before any DROP/REJECT that a later kube-proxy, a CNI or an
//!   administrator puts in FORWARD.
//!
//!   Why INVALID is dropped and not accepted: the datapath keeps netfilter's view
//!   of a translated flow self-consistent. Netfilter sees a new flow's SYN after
//!   translation (client -> backend) and its replies before the reverse
//!   translation at TC egress (backend -> client), so they are NEW and
//!   ESTABLISHED, never INVALID; hairpin flows (both directions) and ICMP answers
//!   leave through `bpf_redirect` and never reach netfilter. So cilium/cilium#8614
//!   (replies reverse-NATed *before* netfilter, hence INVALID and dropped by
//!   `KUBE-FORWARD`) cannot happen here by construction, whichever chain comes
//!   first. A packet of a masqueraded flow that netfilter does find INVALID (an
//!   out-of-window segment, a flow whose conntrack entry was lost) is one netfilter
//!   will not SNAT: forwarded, it reaches the backend with the client's own
//!   address, the backend answers with a RST for a connection it does not know,
//!   and that RST kills the client's connection (kubernetes/kubernetes#74839,
//!   which is why kube-proxy drops INVALID). Dropping it lets TCP retransmit. The
//!   privileged test `marked_packets_whose_conntrack_state_is_lost_are_dropped_not_leaked`
//!   measures the lost-state case: with this chain first nothing reaches the
//!   server; with an accept instead, the packets reach it with the client's own
//!   address (a masqueraded flow cannot be saved by accepting).
//!   Flows the programs translate without masquerade carry no mark and are not
//!   touched here; netfilter tracks them as plain client <-> backend flows.
//! - **nat POSTROUTING -> `SWITCHYARD-POSTROUTING`**, holding `-m mark --mark M/M
//!   -j MASQUERADE` (the same rule the standalone agent installs). nat chains see
//!   only a connection's first packet: anything ahead of it that ends POSTROUTING
//!   for that packet (`-j RETURN`/`-j ACCEPT` in the base chain, as CNIs write for
//!   pod-to-pod traffic) means the flow is never masqueraded, the remote backend
//!   answers the client directly and the reply is never translated back. kube-proxy's
//!   `KUBE-POSTROUTING` masquerades its own mark and returns, so it is not harmful
//!   in itself, but the rule "the agent's jump precedes kube-proxy's" keeps one
//!   simple invariant for both chains.
//!
//! Other agents' jumps (a CNI's or Docker's chains, which hold no kube-proxy DROP)
//! may precede the agent's: they are not moved, so the agent never fights an agent
//! that also wants to be first. A base-chain rule with a final verdict that can
//! lose the packet (DROP, REJECT in FORWARD; ACCEPT, RETURN in POSTROUTING) ahead
//! of the agent's jump is displacement too.
//!
//! The chains exist only once some Service masquerades (a NodePort, external or
//! load-balancer address with `externalTrafficPolicy: Cluster`): before that the
//! programs mark no packet, so both chains would judge nothing, and their mere
//! presence (a nat table, a conntrack match) turns on netfilter's connection
//! tracking for every flow the node forwards, which the programs already track
//! themselves. Once installed they stay while the node serves from eBPF, and the
//! guard keeps any it finds (a previous process's) first.
//!
//! The guard runs in every backend that holds kube-proxy's rules (an ACCEPT in one
//! backend's FORWARD does not stop a DROP in the other's: each backend has its
//! own hooks and a packet traverses both) and in the default backend.

use super::{
    ownership::is_kube_proxy_chain,
    ruleset::{quote_word, SavedRule, SavedRuleset},
};

pub const FORWARD_CHAIN: &str = "SWITCHYARD-FORWARD";
pub const POSTROUTING_CHAIN: &str = "SWITCHYARD-POSTROUTING";
pub const FORWARD_COMMENT: &str = "switchyard: forward Service traffic the datapath translated";
pub const FORWARD_INVALID_COMMENT: &str =
    "switchyard: never forward a translated packet netfilter cannot masquerade";

/// One of the agent's chains and where it hooks in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentChain {
    pub table: &'static str,
    pub base_chain: &'static str,
    pub chain: &'static str,
    /// The chain's rules, as `iptables-save` prints them (after `-A CHAIN `).
    pub rules: Vec<String>,
    /// Verdicts that, ahead of the jump in the base chain, can lose the packet.
    pub harmful_verdicts: &'static [&'static str],
}

/// The agent's chains for a datapath whose masquerade mark is `masquerade_mark`.
pub fn agent_chains(masquerade_mark: u32) -> Vec<AgentChain> {
    let mark = format!("{masquerade_mark:#x}/{masquerade_mark:#x}");
    vec![
        AgentChain {
            table: "filter",
            base_chain: "FORWARD",
            chain: FORWARD_CHAIN,
            rules: vec![
                format!(
                    "-m mark --mark {mark} -m conntrack --ctstate INVALID -m comment --comment {} -j DROP",
                    quote_word(FORWARD_INVALID_COMMENT)
                ),
                format!(
                    "-m mark --mark {mark} -m comment --comment {} -j ACCEPT",
                    quote_word(FORWARD_COMMENT)
                ),
            ],
            harmful_verdicts: &["DROP", "REJECT"],
        },
        AgentChain {
            table: "nat",
            base_chain: "POSTROUTING",
            chain: POSTROUTING_CHAIN,
            rules: vec![format!("-m mark --mark {mark} -j MASQUERADE")],
            harmful_verdicts: &["ACCEPT", "RETURN", "DROP"],
        },
    ]
}

/// Why one agent chain is not safe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OrderProblem {
    MissingChain {
        table: String,
        chain: String,
    },
    /// The chain's rules differ from the desired ones.
    WrongRules {
        table: String,
        chain: String,
    },
    MissingJump {
        table: String,
        base_chain: String,
        chain: String,
    },
    /// More than one jump: harmless, but the repair leaves exactly one.
    DuplicateJumps {
        table: String,
        base_chain: String,
        count: usize,
    },
    /// A rule ahead of the agent's jump that can lose its packets.
    Displaced {
        table: String,
        base_chain: String,
        by: String,
    },
}

/// The result of checking one backend's dump.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChainOrderCheck {
    pub problems: Vec<OrderProblem>,
}

impl ChainOrderCheck {
    /// `ChainOrderSafe`.
    pub fn safe(&self) -> bool {
        self.problems.is_empty()
    }

    /// The rules that displaced the agent's jumps (for the status message).
    pub fn displaced_by(&self) -> Vec<String> {
        self.problems
            .iter()
            .filter_map(|problem| match problem {
                OrderProblem::Displaced {
                    table,
                    base_chain,
                    by,
                } => Some(format!("{table} {base_chain}: {by}")),
                _ => None,
            })
            .collect()
    }
}

/// Checks the agent's chains in one backend's dump of one family.
pub fn check_chain_order(ruleset: &SavedRuleset, chains: &[AgentChain]) -> ChainOrderCheck {
    let mut problems = Vec::new();
    for agent in chains {
        let table_name = agent.table.to_string();
        let Some(table) = ruleset.table(agent.table) else {
            problems.push(OrderProblem::MissingChain {
                table: table_name,
                chain: agent.chain.into(),
            });
            continue;
        };
        if !table.has_chain(agent.chain) {
            problems.push(OrderProblem::MissingChain {
                table: table_name.clone(),
                chain: agent.chain.into(),
            });
        } else {
            let current: Vec<&str> = table
                .rules_of(agent.chain)
                .map(|rule| rule.spec.as_str())
                .collect();
            let desired: Vec<&str> = agent.rules.iter().map(String::as_str).collect();
            if current != desired {
                problems.push(OrderProblem::WrongRules {
                    table: table_name.clone(),
                    chain: agent.chain.into(),
                });
            }
        }
        let base: Vec<&SavedRule> = table.rules_of(agent.base_chain).collect();
        let jumps: Vec<usize> = base
            .iter()
            .enumerate()
            .filter(|(_, rule)| is_jump_to(rule, agent.chain))
            .map(|(index, _)| index)
            .collect();
        let Some(&first_jump) = jumps.first() else {
            problems.push(OrderProblem::MissingJump {
                table: table_name,
                base_chain: agent.base_chain.into(),
                chain: agent.chain.into(),
            });
            continue;
        };
        if jumps.len() > 1 {
            problems.push(OrderProblem::DuplicateJumps {
                table: table_name.clone(),
                base_chain: agent.base_chain.into(),
                count: jumps.len(),
            });
        }
        for rule in &base[..first_jump] {
            if displaces(rule, agent) {
                problems.push(OrderProblem::Displaced {
                    table: table_name.clone(),
                    base_chain: agent.base_chain.into(),
                    by: rule.spec.clone(),
                });
            }
        }
    }
    ChainOrderCheck { problems }
}

fn is_jump_to(rule: &SavedRule, chain: &str) -> bool {
    rule.spec == format!("-j {chain}")
}

fn displaces(rule: &SavedRule, agent: &AgentChain) -> bool {
    match rule.target() {
        Some(target) => {
            is_kube_proxy_chain(&target) || agent.harmful_verdicts.contains(&target.as_str())
        }
        None => false,
    }
}

/// The `iptables-restore --noflush` input that makes the agent's chains safe in
/// this dump: empty when the check passes. Per table, atomically: the chain is
/// declared (which, with `--noflush`, creates it or empties it) and refilled, every
/// jump to it is deleted and one is inserted at position 1.
pub fn plan_chain_order_repair(ruleset: &SavedRuleset, chains: &[AgentChain]) -> String {
    let check = check_chain_order(ruleset, chains);
    let mut text = String::new();
    for agent in chains {
        let affected = check.problems.iter().any(|problem| match problem {
            OrderProblem::MissingChain { table, .. }
            | OrderProblem::WrongRules { table, .. }
            | OrderProblem::MissingJump { table, .. }
            | OrderProblem::DuplicateJumps { table, .. }
            | OrderProblem::Displaced { table, .. } => table == agent.table,
        });
        if !affected {
            continue;
        }
        text.push_str(&format!("*{}\n:{} - [0:0]\n", agent.table, agent.chain));
        for rule in &agent.rules {
            text.push_str(&format!("-A {} {rule}\n", agent.chain));
        }
        if let Some(table) = ruleset.table(agent.table) {
            for jump in table
                .rules_of(agent.base_chain)
                .filter(|rule| is_jump_to(rule, agent.chain))
            {
                text.push_str(&jump.delete_line());
                text.push('\n');
            }
        }
        text.push_str(&format!(
            "-I {} 1 -j {}\nCOMMIT\n",
            agent.base_chain, agent.chain
        ));
    }
    text
}

/// Whether any of the agent's chains, or a jump to one, is in the dump: what
/// [`plan_agent_chain_removal`] would remove once the node has left eBPF.
pub fn agent_chains_present(ruleset: &SavedRuleset) -> bool {
    ruleset.tables.iter().any(|table| {
        [FORWARD_CHAIN, POSTROUTING_CHAIN].iter().any(|chain| {
            table.has_chain(chain)
                || table
                    .rules
                    .iter()
                    .any(|rule| rule.target().as_deref() == Some(*chain))
        })
    })
}

/// The `iptables-restore --noflush` input that removes the agent's chains (when the
/// node no longer serves from eBPF): jumps first, then the chains.
pub fn plan_agent_chain_removal(ruleset: &SavedRuleset, chains: &[AgentChain]) -> String {
    let mut text = String::new();
    for agent in chains {
        let Some(table) = ruleset.table(agent.table) else {
            continue;
        };
        let jumps: Vec<&SavedRule> = table
            .rules
            .iter()
            .filter(|rule| rule.target().as_deref() == Some(agent.chain))
            .collect();
        if jumps.is_empty() && !table.has_chain(agent.chain) {
            continue;
        }
        text.push_str(&format!("*{}\n", agent.table));
        for jump in jumps {
            text.push_str(&jump.delete_line());
            text.push('\n');
        }
        if table.has_chain(agent.chain) {
            text.push_str(&format!("-F {0}\n-X {0}\n", agent.chain));
        }
        text.push_str("COMMIT\n");
    }
    text
}
