//! Living next to kube-proxy, and after it: detecting its rules and its mode,
//! removing its Service rules when told to (`iptablesCleanup`), keeping the
//! agent's own chains ahead of its chains, probing its healthz, and serving its
//! health ports once it has left the node.
//!
//! Pure parts (exhaustively unit-tested) and thin I/O:
//! - `ruleset`: `iptables-save` text, parsed (both backends, both families).
//! - `ownership`: which chains are kube-proxy's, kubelet's, anyone else's.
//! - `cleanup`: the `iptables-restore --noflush` input removing kube-proxy's chains
//!   and jumps, with the nat keep-alive rule that keeps established DNAT'd
//!   connections translated (measured; see that module).
//! - `nftables`: kube-proxy's nftables-mode tables (`ip`/`ip6 kube-proxy`).
//! - `detection`: footprint counts, IPVS mode, and the cleanup state machine
//!   (clean once, never while kube-proxy answers, stop on its return).
//! - `chain_order`: the agent's `SWITCHYARD-FORWARD` / `SWITCHYARD-POSTROUTING`
//!   chains, what must come first and why, the check and the repair.
//! - `health`: kube-proxy's healthz and `healthCheckNodePort` answers, as data.
//! - `system` (I/O): running the save/restore tools and `nft`, per backend.
//! - `health_server` (I/O): the probe and the replacement health servers.
//! - `metrics`: kube-proxy's metrics under their names, from the core's inputs and syncs.
//! - `metrics_server` (I/O): kube-proxy's health ports and metrics address, opened and
//!   handed back together.
//! - `round` (I/O): one round of the loop (read, probe, decide, clean), for the
//!   cluster-mode wiring.

pub mod chain_order;
pub mod cleanup;
pub mod detection;
pub mod health;
pub mod health_server;
pub mod metrics;
pub mod metrics_server;
pub mod nftables;
pub mod ownership;
pub mod round;
pub mod ruleset;
pub mod system;

#[cfg(test)]
mod tests;

use cleanup::{keeps_translating_after, plan_iptables_cleanup, IptablesCleanupPlan};
use nftables::{NftRuleset, NftablesCleanupPlan};
use ruleset::SavedRuleset;

/// The two iptables implementations, which keep separate rules in the kernel: a
/// node may have rules in both (kubelet in one, kube-proxy's image in the other).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Backend {
    Legacy,
    Nft,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    Ipv4,
    Ipv6,
}

impl Backend {
    pub const ALL: [Backend; 2] = [Backend::Legacy, Backend::Nft];

    pub fn name(self) -> &'static str {
        match self {
            Backend::Legacy => "legacy",
            Backend::Nft => "nft",
        }
    }

    /// `iptables-legacy-save`, `ip6tables-nft-restore`, ...
    pub fn tool(self, family: Family, action: &str) -> String {
        format!("{}-{}-{action}", family.iptables_command(), self.name())
    }
}

impl Family {
    pub const ALL: [Family; 2] = [Family::Ipv4, Family::Ipv6];

    pub fn iptables_command(self) -> &'static str {
        match self {
            Family::Ipv4 => "iptables",
            Family::Ipv6 => "ip6tables",
        }
    }

    pub fn nft_name(self) -> &'static str {
        match self {
            Family::Ipv4 => "ip",
            Family::Ipv6 => "ip6",
        }
    }

    pub fn from_nft(name: &str) -> Option<Self> {
        match name {
            "ip" => Some(Family::Ipv4),
            "ip6" => Some(Family::Ipv6),
            _ => None,
        }
    }
}

/// One backend's dump of one family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IptablesDump {
    pub backend: Backend,
    pub family: Family,
    pub ruleset: SavedRuleset,
}

/// Everything netfilter holds on the node, as read in one round.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeRules {
    pub iptables: Vec<IptablesDump>,
    pub nftables: NftRuleset,
}

/// One backend and family's part of a cleanup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IptablesCleanup {
    pub backend: Backend,
    pub family: Family,
    pub plan: IptablesCleanupPlan,
}

/// The whole cleanup of a node: iptables (each backend and family) and nftables.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeCleanupPlan {
    pub iptables: Vec<IptablesCleanup>,
    pub nftables: NftablesCleanupPlan,
}

impl NodeCleanupPlan {
    pub fn is_empty(&self) -> bool {
        self.iptables.is_empty() && self.nftables.is_empty()
    }

    pub fn removed_rules(&self) -> usize {
        self.iptables
            .iter()
            .map(|cleanup| cleanup.plan.removed_rules())
            .sum()
    }
}

/// Plans the removal of every kube-proxy Service rule on the node. A family whose
/// `kube-proxy` nftables table goes away also gets the nftables keep-alive unless
/// something that remains keeps its NAT working (an iptables nat table, after its
/// own cleanup, or another native table; see `cleanup` for why this matters).
pub fn plan_node_cleanup(rules: &NodeRules) -> NodeCleanupPlan {
    let iptables: Vec<IptablesCleanup> = rules
        .iptables
        .iter()
        .map(|dump| IptablesCleanup {
            backend: dump.backend,
            family: dump.family,
            plan: plan_iptables_cleanup(&dump.ruleset),
        })
        .collect();
    let deleted_tables = rules.nftables.kube_proxy_tables();
    let keep_alive = deleted_tables
        .iter()
        .copied()
        .filter(|family| {
            let iptables_keeps = rules
                .iptables
                .iter()
                .zip(&iptables)
                .filter(|(dump, _)| dump.family == *family)
                .any(|(dump, cleanup)| keeps_translating_after(&dump.ruleset, &cleanup.plan));
            !iptables_keeps && !rules.nftables.other_tables_keep_translating(*family)
        })
        .collect();
    NodeCleanupPlan {
        iptables: iptables
            .into_iter()
            .filter(|cleanup| !cleanup.plan.is_empty())
            .collect(),
        nftables: NftablesCleanupPlan {
            deleted_tables,
            keep_alive,
        },
    }
}
