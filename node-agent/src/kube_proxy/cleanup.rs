//! The cleanup of kube-proxy's iptables rules, planned from an `iptables-save`
//! dump: an `iptables-restore --noflush` input that, table by table and
//! atomically per table, deletes the rules that jump to kube-proxy's chains (by
//! their exact saved specification), flushes those chains and deletes them.
//! Nothing else is touched: kubelet's chains, other agents' chains and every rule
//! that does not jump to a kube-proxy chain stay as they are.
//!
//! ## Why the nat table may get a keep-alive rule
//!
//! Connections that kube-proxy's DNAT rules translated before the switch keep
//! being translated by their netfilter conntrack entries after the rules are
//! gone; the TC programs leave them alone (a non-SYN TCP packet without a
//! Switchyard conntrack entry passes untranslated). That only holds while
//! netfilter still tracks and NATs packets in this network namespace, and both
//! are registered on demand: the conntrack hooks exist while some rule needs
//! conntrack (a NAT target, a `conntrack` or `state` match, ...; the kernel's
//! `nf_ct_netns_get`), the NAT hooks while some nat chain exists. Measured on this
//! machine's kernel (6.18) with iptables 1.8.9, both backends, and with nft 1.0.6
//! for kube-proxy's nftables table: when the cleanup deletes the last such rule
//! (kube-proxy's DNAT rules are, on a node whose other nat rules hold no
//! conntrack), every established DNAT'd connection stops being translated at once
//! and breaks. Issue 8 describes the condition as "a nat base chain still holds a
//! rule"; measured more precisely, a rule without conntrack (a bare comment rule
//! in POSTROUTING) does not keep them alive, a `-m conntrack` rule does. So when
//! the nat table would be left without a base-chain rule or without a rule that
//! holds conntrack, the same transaction adds [`KEEP_ALIVE_SPEC`] to POSTROUTING:
//! it matches with conntrack and has no target, so it only counts packets and
//! never changes a verdict. The condition is conservative: it looks at the nat
//! table only (kubelet's `KUBE-FIREWALL` conntrack match in filter often keeps
//! conntrack registered anyway), and an unneeded keep-alive is harmless. The
//! privileged tests `an_established_dnat_connection_survives_a_cleanup_that_empties_the_nat_table_*`
//! and `without_the_keep_alive_the_same_cleanup_breaks_the_connection` check both
//! sides on this kernel. The rule stays after the cleanup (it
//! costs nothing, and removing it later would break the same flows).

use std::collections::BTreeSet;

use super::{
    ownership::is_kube_proxy_chain,
    ruleset::{is_builtin_chain, SavedRule, SavedRuleset, SavedTable},
};

/// The comment that identifies the agent's nat keep-alive rule.
pub const KEEP_ALIVE_COMMENT: &str =
    "switchyard: keeps netfilter NAT of established Service connections alive";
/// The keep-alive rule: a conntrack match (so conntrack stays registered), no target.
pub const KEEP_ALIVE_SPEC: &str = "-m conntrack --ctstate DNAT -m comment --comment \"switchyard: keeps netfilter NAT of established Service connections alive\"";
/// The chain the keep-alive rule goes to.
pub const KEEP_ALIVE_CHAIN: &str = "POSTROUTING";

/// Match modules whose rules take a conntrack reference in the kernel.
const CONNTRACK_MATCHES: [&str; 7] = [
    "conntrack",
    "state",
    "connmark",
    "connlimit",
    "connbytes",
    "connlabel",
    "helper",
];
/// Targets whose rules take a conntrack reference (every NAT target does).
const CONNTRACK_TARGETS: [&str; 6] = [
    "MASQUERADE",
    "SNAT",
    "DNAT",
    "REDIRECT",
    "NETMAP",
    "CONNMARK",
];

/// What the cleanup does to one table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableCleanup {
    pub table: String,
    /// Rules outside kube-proxy's chains that jump to them, deleted one by one.
    pub deleted_jumps: Vec<SavedRule>,
    /// kube-proxy's chains, flushed and deleted.
    pub removed_chains: Vec<String>,
    /// How many rules those chains held.
    pub removed_chain_rules: usize,
    /// Whether the nat keep-alive rule is added (see the module comment).
    pub keep_alive_added: bool,
}

/// The cleanup of one backend and family: empty when there is nothing to remove.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IptablesCleanupPlan {
    pub tables: Vec<TableCleanup>,
}

impl IptablesCleanupPlan {
    pub fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }

    /// Rules removed in all, jumps and chain contents.
    pub fn removed_rules(&self) -> usize {
        self.tables
            .iter()
            .map(|table| table.deleted_jumps.len() + table.removed_chain_rules)
            .sum()
    }

    pub fn keep_alive_added(&self) -> bool {
        self.tables.iter().any(|table| table.keep_alive_added)
    }

    /// The `iptables-restore --noflush` input. Per table: the keep-alive first
    /// (added before anything is removed), then the jumps, then `-F` of every chain
    /// (so no kube-proxy chain still references another), then `-X`.
    pub fn restore_input(&self) -> String {
        let mut text = String::new();
        for table in &self.tables {
            text.push_str(&format!("*{}\n", table.table));
            if table.keep_alive_added {
                text.push_str(&format!("-A {KEEP_ALIVE_CHAIN} {KEEP_ALIVE_SPEC}\n"));
            }
            for jump in &table.deleted_jumps {
                text.push_str(&jump.delete_line());
                text.push('\n');
            }
            for chain in &table.removed_chains {
                text.push_str(&format!("-F {chain}\n"));
            }
            for chain in &table.removed_chains {
                text.push_str(&format!("-X {chain}\n"));
            }
            text.push_str("COMMIT\n");
        }
        text
    }
}

/// Plans the removal of kube-proxy's chains and the rules jumping to them from one
/// backend's dump of one family.
pub fn plan_iptables_cleanup(ruleset: &SavedRuleset) -> IptablesCleanupPlan {
    let tables = ruleset
        .tables
        .iter()
        .filter_map(plan_table_cleanup)
        .collect();
    IptablesCleanupPlan { tables }
}

fn plan_table_cleanup(table: &SavedTable) -> Option<TableCleanup> {
    let removed_chains: Vec<String> = table
        .chains
        .iter()
        .filter(|chain| chain.policy.is_none() && is_kube_proxy_chain(&chain.name))
        .map(|chain| chain.name.clone())
        .collect();
    let removed: BTreeSet<&str> = removed_chains.iter().map(String::as_str).collect();
    // A jump into a kube-proxy chain from any surviving chain (a built-in one, or
    // another agent's) must go, or the chain could not be deleted; it is also
    // kube-proxy's hook into the traffic. Rules naming a kube-proxy chain that was
    // never declared are left alone: there is nothing to delete behind them.
    let mut deleted_jumps = Vec::new();
    let mut remaining = Vec::new();
    for rule in &table.rules {
        if removed.contains(rule.chain.as_str()) {
            continue;
        }
        match rule.target() {
            Some(target) if removed.contains(target.as_str()) => deleted_jumps.push(rule.clone()),
            _ => remaining.push(rule),
        }
    }
    if removed_chains.is_empty() && deleted_jumps.is_empty() {
        return None;
    }
    let removed_chain_rules = table
        .rules
        .iter()
        .filter(|rule| removed.contains(rule.chain.as_str()))
        .count();
    let keep_alive_added = table.name == "nat" && !nat_keeps_translating(&remaining);
    Some(TableCleanup {
        table: table.name.clone(),
        deleted_jumps,
        removed_chains,
        removed_chain_rules,
        keep_alive_added,
    })
}

/// Whether the nat rules that remain keep established NAT'd flows translated: a
/// rule in a built-in chain and a rule that holds conntrack (see the module comment).
pub fn nat_keeps_translating(remaining: &[&SavedRule]) -> bool {
    remaining.iter().any(|rule| is_builtin_chain(&rule.chain))
        && remaining.iter().any(|rule| holds_conntrack(rule))
}

/// Whether the kernel keeps conntrack registered because of this rule.
pub fn holds_conntrack(rule: &SavedRule) -> bool {
    rule.match_modules()
        .iter()
        .any(|module| CONNTRACK_MATCHES.contains(&module.as_str()))
        || rule
            .target()
            .is_some_and(|target| CONNTRACK_TARGETS.contains(&target.as_str()))
}

/// Whether a saved nat table, as it is, keeps established NAT'd flows translated.
pub fn table_keeps_translating(table: &SavedTable) -> bool {
    let rules: Vec<&SavedRule> = table.rules.iter().collect();
    nat_keeps_translating(&rules)
}

/// The nat table of `ruleset` after `plan` is applied keeps NAT'd flows translated.
pub fn keeps_translating_after(ruleset: &SavedRuleset, plan: &IptablesCleanupPlan) -> bool {
    let Some(nat) = ruleset.table("nat") else {
        return false;
    };
    let Some(cleanup) = plan.tables.iter().find(|table| table.table == "nat") else {
        return table_keeps_translating(nat);
    };
    if cleanup.keep_alive_added {
        return true;
    }
    let remaining: Vec<&SavedRule> = nat
        .rules
        .iter()
        .filter(|rule| !cleanup.removed_chains.contains(&rule.chain))
        .filter(|rule| !cleanup.deleted_jumps.contains(rule))
        .collect();
    nat_keeps_translating(&remaining)
}
