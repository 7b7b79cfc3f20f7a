//! kube-proxy's nftables mode keeps everything in one table per family,
//! `ip kube-proxy` and `ip6 kube-proxy`; its cleanup is deleting those tables.
//! Read from `nft -j list ruleset` (tables, chains, rules) or, for the table list
//! alone, `nft list tables`.
//!
//! The nat keep-alive of `cleanup` applies here too: kube-proxy's table holds nat
//! base chains and DNAT rules, and deleting it may unregister the family's last
//! conntrack and NAT hooks. When nothing else keeps them (see
//! [`super::plan_node_cleanup`]), the same nft transaction creates the table
//! `switchyard-keepalive` with a nat base chain and one rule matching on
//! conntrack, with no verdict of its own.

use serde_json::Value;

use super::Family;
use crate::Error;

/// kube-proxy's nftables-mode table, in both families.
pub const KUBE_PROXY_TABLE: &str = "kube-proxy";
/// The agent's keep-alive table (see the module comment).
pub const KEEP_ALIVE_TABLE: &str = "switchyard-keepalive";
pub const KEEP_ALIVE_CHAIN: &str = "postrouting";
pub const KEEP_ALIVE_COMMENT: &str =
    "switchyard: keeps netfilter NAT of established Service connections alive";
/// Table names iptables-nft uses; their rules are planned from `iptables-nft-save`.
const IPTABLES_NFT_TABLES: [&str; 5] = ["filter", "nat", "mangle", "raw", "security"];

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NftTable {
    pub family: String,
    pub name: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NftChain {
    pub family: String,
    pub table: String,
    pub name: String,
    /// `filter`, `nat`, `route` for base chains; `None` for regular chains.
    pub chain_type: Option<String>,
    pub hook: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct NftRule {
    pub family: String,
    pub table: String,
    pub chain: String,
    /// The rule's `expr` array as nft prints it.
    pub expressions: Value,
}

/// What `nft -j list ruleset` (or `nft list tables`) says.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NftRuleset {
    pub tables: Vec<NftTable>,
    pub chains: Vec<NftChain>,
    pub rules: Vec<NftRule>,
}

impl NftRuleset {
    /// Parses `nft -j list ruleset` or `nft -j list tables`.
    pub fn parse_json(text: &str) -> Result<Self, Error> {
        let invalid = |reason: String| Error::ParseNftables { reason };
        let document: Value =
            serde_json::from_str(text).map_err(|error| invalid(format!("not JSON: {error}")))?;
        let Some(objects) = document.get("nftables").and_then(Value::as_array) else {
            return Err(invalid("no `nftables` array".into()));
        };
        let text_field = |object: &Value, field: &str| -> Result<String, Error> {
            object
                .get(field)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| invalid(format!("an object without `{field}`: {object}")))
        };
        let mut ruleset = Self::default();
        for object in objects {
            if let Some(table) = object.get("table") {
                ruleset.tables.push(NftTable {
                    family: text_field(table, "family")?,
                    name: text_field(table, "name")?,
                });
            } else if let Some(chain) = object.get("chain") {
                ruleset.chains.push(NftChain {
                    family: text_field(chain, "family")?,
                    table: text_field(chain, "table")?,
                    name: text_field(chain, "name")?,
                    chain_type: chain
                        .get("type")
                        .and_then(Value::as_str)
                        .map(str::to_string),
                    hook: chain
                        .get("hook")
                        .and_then(Value::as_str)
                        .map(str::to_string),
                });
            } else if let Some(rule) = object.get("rule") {
                ruleset.rules.push(NftRule {
                    family: text_field(rule, "family")?,
                    table: text_field(rule, "table")?,
                    chain: text_field(rule, "chain")?,
                    expressions: rule.get("expr").cloned().unwrap_or(Value::Null),
                });
            }
        }
        Ok(ruleset)
    }

    /// Parses `nft list tables` (`table ip kube-proxy` lines): tables only.
    pub fn parse_table_list(text: &str) -> Result<Self, Error> {
        let mut ruleset = Self::default();
        for line in text.lines().map(str::trim).filter(|line| !line.is_empty()) {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["table", family, name] => ruleset.tables.push(NftTable {
                    family: family.to_string(),
                    name: name.to_string(),
                }),
                _ => {
                    return Err(Error::ParseNftables {
                        reason: format!("not a `table FAMILY NAME` line: {line:?}"),
                    })
                }
            }
        }
        Ok(ruleset)
    }

    /// Keeps only the tables, chains and rules of `families`: the agent reads,
    /// counts and cleans kube-proxy's rules only in the families its datapath
    /// serves (deleting `ip6 kube-proxy` on a dual-stack node served over IPv4
    /// alone would cut every IPv6 Service off).
    pub fn retain_families(&mut self, families: &[Family]) {
        let served = |family: &str| {
            Family::from_nft(family).is_some_and(|family| families.contains(&family))
        };
        self.tables.retain(|table| served(&table.family));
        self.chains.retain(|chain| served(&chain.family));
        self.rules.retain(|rule| served(&rule.family));
    }

    /// kube-proxy's nftables-mode tables present, in the families Switchyard knows.
    pub fn kube_proxy_tables(&self) -> Vec<Family> {
        self.tables
            .iter()
            .filter(|table| table.name == KUBE_PROXY_TABLE)
            .filter_map(|table| Family::from_nft(&table.family))
            .collect()
    }

    /// Rules in kube-proxy's tables.
    pub fn kube_proxy_rule_count(&self) -> usize {
        self.rules
            .iter()
            .filter(|rule| {
                rule.table == KUBE_PROXY_TABLE && Family::from_nft(&rule.family).is_some()
            })
            .count()
    }

    /// Whether a native nftables table other than kube-proxy's (and other than
    /// iptables-nft's, which are judged from `iptables-nft-save`) keeps the
    /// family's conntrack and NAT hooks: a nat base chain and a rule that uses
    /// conntrack or NAT.
    pub fn other_tables_keep_translating(&self, family: Family) -> bool {
        let nft_family = family.nft_name();
        let candidates = self.tables.iter().filter(|table| {
            table.family == nft_family
                && table.name != KUBE_PROXY_TABLE
                && !IPTABLES_NFT_TABLES.contains(&table.name.as_str())
        });
        for table in candidates {
            let has_nat_chain = self.chains.iter().any(|chain| {
                chain.family == table.family
                    && chain.table == table.name
                    && chain.chain_type.as_deref() == Some("nat")
            });
            let has_conntrack_rule = self.rules.iter().any(|rule| {
                rule.family == table.family
                    && rule.table == table.name
                    && uses_conntrack(&rule.expressions)
            });
            if has_nat_chain && has_conntrack_rule {
                return true;
            }
        }
        false
    }
}

/// Whether an nft expression tree uses conntrack (a `ct` expression or any NAT).
fn uses_conntrack(value: &Value) -> bool {
    match value {
        Value::Object(object) => object.iter().any(|(key, inner)| {
            matches!(
                key.as_str(),
                "ct" | "masquerade" | "snat" | "dnat" | "redirect"
            ) || uses_conntrack(inner)
        }),
        Value::Array(items) => items.iter().any(uses_conntrack),
        _ => false,
    }
}

/// The nftables part of a cleanup.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NftablesCleanupPlan {
    /// Families whose `kube-proxy` table is deleted.
    pub deleted_tables: Vec<Family>,
    /// Families that get the keep-alive table.
    pub keep_alive: Vec<Family>,
}

impl NftablesCleanupPlan {
    pub fn is_empty(&self) -> bool {
        self.deleted_tables.is_empty()
    }

    /// One `nft -f -` transaction. `add table` before `delete table` makes the
    /// deletion succeed even if the table vanished since it was listed.
    pub fn script(&self) -> String {
        let mut script = String::new();
        for family in &self.keep_alive {
            let family = family.nft_name();
            script.push_str(&format!("add table {family} {KEEP_ALIVE_TABLE}\n"));
            script.push_str(&format!(
                "add chain {family} {KEEP_ALIVE_TABLE} {KEEP_ALIVE_CHAIN} {{ type nat hook postrouting priority srcnat + 100; policy accept; }}\n"
            ));
            script.push_str(&format!(
                "flush chain {family} {KEEP_ALIVE_TABLE} {KEEP_ALIVE_CHAIN}\n"
            ));
            script.push_str(&format!(
                "add rule {family} {KEEP_ALIVE_TABLE} {KEEP_ALIVE_CHAIN} ct status dnat counter comment \"{KEEP_ALIVE_COMMENT}\"\n"
            ));
        }
        for family in &self.deleted_tables {
            let family = family.nft_name();
            script.push_str(&format!("add table {family} {KUBE_PROXY_TABLE}\n"));
            script.push_str(&format!("delete table {family} {KUBE_PROXY_TABLE}\n"));
        }
        script
    }
}
