//! Unit tests of the pure parts, on `iptables-save` dumps written as kube-proxy
//! 1.20 (legacy backend, with kubelet 1.20, Docker and flannel rules) and current
//! kube-proxy (nft backend, IPv4 and IPv6) write them, an IPVS-mode dump, a node
//! whose nat rules are all kube-proxy's, and an `nft -j list ruleset` of
//! kube-proxy's nftables mode (produced by nft 1.0.6 from kube-proxy's table); and
//! what the real kube-proxy 1.20.2 binary wrote, captured from both backends.
//!
//! Plans are checked by applying them to the parsed dump with a small model of
//! `iptables-restore --noflush` ([`apply_restore`]), which fails where the real
//! tool would (deleting a rule that is not there, deleting a chain still
//! referenced or not empty): the resulting dump is then inspected.

mod chain_order;
mod cleanup;
mod detection;
mod health;
mod nftables;
mod parsing;

use super::ruleset::{split_words, SavedChain, SavedRule, SavedRuleset};

pub const LEGACY_1_20_IPV4: &str = include_str!("fixtures/kube-proxy-1.20-legacy-ipv4.txt");
pub const NFT_1_33_IPV4: &str = include_str!("fixtures/kube-proxy-1.33-nft-ipv4.txt");
pub const NFT_1_33_IPV6: &str = include_str!("fixtures/kube-proxy-1.33-nft-ipv6.txt");
pub const ONLY_NAT: &str = include_str!("fixtures/kube-proxy-only-nat.txt");
pub const IPVS_1_20_IPV4: &str = include_str!("fixtures/kube-proxy-1.20-ipvs-ipv4.txt");
pub const NFTABLES_MODE_JSON: &str = include_str!("fixtures/nftables-mode-ruleset.json");
/// What the real kube-proxy 1.20.2 binary wrote (`fixtures/capture-kube-proxy-1.20.sh`).
pub const CAPTURED_1_20_LEGACY: &str =
    include_str!("fixtures/kube-proxy-1.20.2-captured-legacy.txt");
pub const CAPTURED_1_20_NFT: &str = include_str!("fixtures/kube-proxy-1.20.2-captured-nft.txt");

pub fn parse(text: &str) -> SavedRuleset {
    match SavedRuleset::parse(text) {
        Ok(ruleset) => ruleset,
        Err(error) => panic!("fixture does not parse: {error}"),
    }
}

/// Applies an `iptables-restore --noflush` input to a dump, as the kernel would
/// (each table's block atomically; an error leaves nothing applied).
pub fn apply_restore(ruleset: &SavedRuleset, input: &str) -> Result<SavedRuleset, String> {
    let mut result = ruleset.clone();
    let mut table_index: Option<usize> = None;
    for line in input.lines().map(str::trim).filter(|line| !line.is_empty()) {
        if let Some(name) = line.strip_prefix('*') {
            let index = match result.tables.iter().position(|table| table.name == name) {
                Some(index) => index,
                None => {
                    result.tables.push(super::ruleset::SavedTable {
                        name: name.into(),
                        ..Default::default()
                    });
                    result.tables.len() - 1
                }
            };
            table_index = Some(index);
            continue;
        }
        if line == "COMMIT" {
            table_index = None;
            continue;
        }
        let table = &mut result.tables[table_index.ok_or(format!("outside a table: {line}"))?];
        if let Some(declaration) = line.strip_prefix(':') {
            let name = declaration
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string();
            if table.has_chain(&name) {
                table.rules.retain(|rule| rule.chain != name);
            } else {
                table.chains.push(SavedChain { name, policy: None });
            }
            continue;
        }
        let words = split_words(line);
        let (operation, chain) = (words[0].as_str(), words[1].clone());
        let builtin = super::ruleset::is_builtin_chain(&chain);
        let implicitly_created = builtin && matches!(operation, "-A" | "-I");
        if !table.has_chain(&chain) && !implicitly_created {
            return Err(format!("no chain {chain} in {}: {line}", table.name));
        }
        if builtin && !table.has_chain(&chain) {
            // iptables-nft creates built-in chains on first use.
            table.chains.push(SavedChain {
                name: chain.clone(),
                policy: Some("ACCEPT".into()),
            });
        }
        let spec_after = |skip: usize| -> String {
            // The spec as the line has it, after the operation, chain (and position).
            let mut rest = line;
            for _ in 0..skip {
                rest = rest.trim_start();
                rest = rest.split_once(' ').map(|(_, after)| after).unwrap_or("");
            }
            rest.trim().to_string()
        };
        let target_exists = |table: &super::ruleset::SavedTable, spec: &str| {
            let rule = SavedRule {
                chain: chain.clone(),
                spec: spec.to_string(),
            };
            match rule.target() {
                Some(target)
                    if target.starts_with("KUBE-") || target.starts_with("SWITCHYARD-") =>
                {
                    table.has_chain(&target)
                }
                _ => true,
            }
        };
        match operation {
            "-A" => {
                let spec = spec_after(2);
                if !target_exists(table, &spec) {
                    return Err(format!("jump to a missing chain: {line}"));
                }
                table.rules.push(SavedRule { chain, spec });
            }
            "-I" => {
                let position: usize = words[2]
                    .parse()
                    .map_err(|_| format!("bad position: {line}"))?;
                let spec = spec_after(3);
                if !target_exists(table, &spec) {
                    return Err(format!("jump to a missing chain: {line}"));
                }
                // Insert before the chain's `position`-th rule (1-based).
                let indexes: Vec<usize> = table
                    .rules
                    .iter()
                    .enumerate()
                    .filter(|(_, rule)| rule.chain == chain)
                    .map(|(index, _)| index)
                    .collect();
                let at = match indexes.get(position - 1) {
                    Some(index) => *index,
                    None => indexes
                        .last()
                        .map(|index| index + 1)
                        .unwrap_or(table.rules.len()),
                };
                table.rules.insert(at, SavedRule { chain, spec });
            }
            "-D" => {
                let spec = spec_after(2);
                let wanted = split_words(&spec);
                let index = table
                    .rules
                    .iter()
                    .position(|rule| rule.chain == chain && rule.words() == wanted)
                    .ok_or(format!("no such rule: {line}"))?;
                table.rules.remove(index);
            }
            "-F" => table.rules.retain(|rule| rule.chain != chain),
            "-X" => {
                if builtin {
                    return Err(format!("cannot delete a built-in chain: {line}"));
                }
                if table.rules.iter().any(|rule| rule.chain == chain) {
                    return Err(format!("chain not empty: {line}"));
                }
                if table
                    .rules
                    .iter()
                    .any(|rule| rule.target().as_deref() == Some(chain.as_str()))
                {
                    return Err(format!("chain still referenced: {line}"));
                }
                table.chains.retain(|declared| declared.name != chain);
            }
            _ => return Err(format!("unknown operation: {line}")),
        }
    }
    Ok(result)
}

/// Every rule of `table`, as `CHAIN spec` lines, in order.
pub fn rule_lines(ruleset: &SavedRuleset, table: &str) -> Vec<String> {
    ruleset
        .table(table)
        .map(|table| {
            table
                .rules
                .iter()
                .map(|rule| format!("{} {}", rule.chain, rule.spec))
                .collect()
        })
        .unwrap_or_default()
}

pub fn chain_names(ruleset: &SavedRuleset, table: &str) -> Vec<String> {
    ruleset
        .table(table)
        .map(|table| {
            table
                .chains
                .iter()
                .map(|chain| chain.name.clone())
                .collect()
        })
        .unwrap_or_default()
}
