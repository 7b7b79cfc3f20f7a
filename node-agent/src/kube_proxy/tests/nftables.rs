use super::*;
use crate::kube_proxy::{
    nftables::{NftRuleset, NftablesCleanupPlan, KEEP_ALIVE_COMMENT},
    plan_node_cleanup, Backend, Family, IptablesDump, NodeRules,
};

fn nftables_mode() -> NftRuleset {
    match NftRuleset::parse_json(NFTABLES_MODE_JSON) {
        Ok(ruleset) => ruleset,
        Err(error) => panic!("fixture does not parse: {error}"),
    }
}

fn dump(backend: Backend, family: Family, text: &str) -> IptablesDump {
    IptablesDump {
        backend,
        family,
        ruleset: parse(text),
    }
}

#[test]
fn the_nftables_mode_ruleset_parses_with_its_tables_chains_and_rules() {
    let ruleset = nftables_mode();
    let tables: Vec<String> = ruleset
        .tables
        .iter()
        .map(|table| format!("{} {}", table.family, table.name))
        .collect();
    assert_eq!(
        tables,
        [
            "ip kube-proxy",
            "ip6 kube-proxy",
            "inet filter-host",
            "ip filter",
            "ip nat"
        ]
    );
    assert_eq!(ruleset.kube_proxy_tables(), [Family::Ipv4, Family::Ipv6]);
    assert_eq!(ruleset.kube_proxy_rule_count(), 28 + 6);
    let nat_prerouting = ruleset
        .chains
        .iter()
        .find(|chain| chain.table == "kube-proxy" && chain.name == "nat-prerouting")
        .unwrap();
    assert_eq!(nat_prerouting.chain_type.as_deref(), Some("nat"));
    assert_eq!(nat_prerouting.hook.as_deref(), Some("prerouting"));
}

#[test]
fn the_plain_table_list_parses_too() {
    let ruleset =
        NftRuleset::parse_table_list("table ip kube-proxy\ntable ip6 kube-proxy\ntable inet fw\n")
            .unwrap();
    assert_eq!(ruleset.kube_proxy_tables(), [Family::Ipv4, Family::Ipv6]);
    assert_eq!(ruleset.kube_proxy_rule_count(), 0);
    assert!(NftRuleset::parse_table_list("chain ip x y\n").is_err());
}

#[test]
fn a_kube_proxy_table_in_another_family_is_not_ours_to_delete() {
    let ruleset = NftRuleset::parse_table_list("table inet kube-proxy\n").unwrap();
    assert!(ruleset.kube_proxy_tables().is_empty());
}

#[test]
fn a_node_served_over_ipv4_alone_never_loses_its_ipv6_kube_proxy_table() {
    let mut ruleset = nftables_mode();
    ruleset.retain_families(&[Family::Ipv4]);
    assert_eq!(ruleset.kube_proxy_tables(), [Family::Ipv4]);
    assert!(ruleset.tables.iter().all(|table| table.family == "ip"));
    assert!(ruleset.chains.iter().all(|chain| chain.family == "ip"));
    assert!(ruleset.rules.iter().all(|rule| rule.family == "ip"));
    let plan = plan_node_cleanup(&NodeRules {
        iptables: Vec::new(),
        nftables: ruleset,
    });
    assert_eq!(plan.nftables.deleted_tables, [Family::Ipv4]);
    assert!(
        !plan.nftables.script().contains("ip6"),
        "{}",
        plan.nftables.script()
    );
    // Both families served: both tables are kube-proxy's to delete.
    let mut both = nftables_mode();
    both.retain_families(&Family::ALL);
    assert_eq!(both.kube_proxy_tables(), [Family::Ipv4, Family::Ipv6]);
}

#[test]
fn malformed_nft_output_is_an_error() {
    for text in [
        "",
        "{",
        "{\"nothing\": []}",
        "{\"nftables\": [{\"table\": {\"name\": \"x\"}}]}",
    ] {
        assert!(NftRuleset::parse_json(text).is_err(), "{text:?}");
    }
    assert_eq!(
        NftRuleset::parse_json("{\"nftables\": [{\"metainfo\": {}}]}").unwrap(),
        NftRuleset::default()
    );
}

#[test]
fn deleting_kube_proxys_tables_alone_gets_a_keep_alive_per_family() {
    let plan = plan_node_cleanup(&NodeRules {
        iptables: Vec::new(),
        nftables: nftables_mode(),
    });
    assert!(plan.iptables.is_empty());
    assert_eq!(plan.nftables.deleted_tables, [Family::Ipv4, Family::Ipv6]);
    assert_eq!(plan.nftables.keep_alive, [Family::Ipv4, Family::Ipv6]);
}

#[test]
fn the_nft_script_adds_the_keep_alive_before_deleting_and_tolerates_a_vanished_table() {
    let plan = NftablesCleanupPlan {
        deleted_tables: vec![Family::Ipv4],
        keep_alive: vec![Family::Ipv4],
    };
    assert_eq!(
        plan.script(),
        format!(
            "add table ip switchyard-keepalive\n\
             add chain ip switchyard-keepalive postrouting {{ type nat hook postrouting priority srcnat + 100; policy accept; }}\n\
             flush chain ip switchyard-keepalive postrouting\n\
             add rule ip switchyard-keepalive postrouting ct status dnat counter comment \"{KEEP_ALIVE_COMMENT}\"\n\
             add table ip kube-proxy\n\
             delete table ip kube-proxy\n"
        )
    );
    assert_eq!(NftablesCleanupPlan::default().script(), "");
}

#[test]
fn an_iptables_masquerade_that_remains_makes_the_nft_keep_alive_unneeded() {
    let plan = plan_node_cleanup(&NodeRules {
        iptables: vec![dump(Backend::Nft, Family::Ipv4, NFT_1_33_IPV4)],
        nftables: nftables_mode(),
    });
    assert_eq!(plan.nftables.deleted_tables, [Family::Ipv4, Family::Ipv6]);
    assert_eq!(
        plan.nftables.keep_alive,
        [Family::Ipv6],
        "IPv4 keeps flannel's MASQUERADE"
    );
}

#[test]
fn an_iptables_keep_alive_in_the_same_plan_counts_for_the_family() {
    let plan = plan_node_cleanup(&NodeRules {
        iptables: vec![dump(Backend::Legacy, Family::Ipv4, ONLY_NAT)],
        nftables: nftables_mode(),
    });
    assert!(plan.iptables[0].plan.keep_alive_added());
    assert_eq!(plan.nftables.keep_alive, [Family::Ipv6]);
}

#[test]
fn another_native_nat_table_with_masquerade_makes_the_keep_alive_unneeded() {
    let mut ruleset = nftables_mode();
    let extra = NftRuleset::parse_json(
        r#"{"nftables": [
            {"table": {"family": "ip", "name": "cni-nat", "handle": 9}},
            {"chain": {"family": "ip", "table": "cni-nat", "name": "post", "handle": 1, "type": "nat", "hook": "postrouting", "prio": 100, "policy": "accept"}},
            {"rule": {"family": "ip", "table": "cni-nat", "chain": "post", "handle": 2, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": {"prefix": {"addr": "10.244.0.0", "len": 16}}}}, {"masquerade": null}]}}
        ]}"#,
    )
    .unwrap();
    ruleset.tables.extend(extra.tables);
    ruleset.chains.extend(extra.chains);
    ruleset.rules.extend(extra.rules);
    assert!(ruleset.other_tables_keep_translating(Family::Ipv4));
    assert!(!ruleset.other_tables_keep_translating(Family::Ipv6));
    let plan = plan_node_cleanup(&NodeRules {
        iptables: Vec::new(),
        nftables: ruleset,
    });
    assert_eq!(plan.nftables.keep_alive, [Family::Ipv6]);
}

#[test]
fn a_filter_only_native_table_does_not_keep_nat_alive() {
    // `inet filter-host` uses `ct state` but has no nat chain.
    assert!(!nftables_mode().other_tables_keep_translating(Family::Ipv4));
}

#[test]
fn a_node_with_both_backends_gets_a_plan_for_each_and_none_for_an_empty_one() {
    let plan = plan_node_cleanup(&NodeRules {
        iptables: vec![
            dump(Backend::Legacy, Family::Ipv4, LEGACY_1_20_IPV4),
            dump(Backend::Nft, Family::Ipv4, NFT_1_33_IPV4),
            dump(Backend::Nft, Family::Ipv6, NFT_1_33_IPV6),
            dump(
                Backend::Legacy,
                Family::Ipv6,
                "*filter\n:INPUT ACCEPT [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n",
            ),
        ],
        nftables: NftRuleset::default(),
    });
    let parts: Vec<(Backend, Family)> = plan
        .iptables
        .iter()
        .map(|cleanup| (cleanup.backend, cleanup.family))
        .collect();
    assert_eq!(
        parts,
        [
            (Backend::Legacy, Family::Ipv4),
            (Backend::Nft, Family::Ipv4),
            (Backend::Nft, Family::Ipv6)
        ]
    );
    assert!(plan.nftables.is_empty());
    assert_eq!(plan.removed_rules(), 53 + 57 + 31);
}

#[test]
fn a_clean_node_needs_no_plan() {
    let plan = plan_node_cleanup(&NodeRules::default());
    assert!(plan.is_empty());
}
