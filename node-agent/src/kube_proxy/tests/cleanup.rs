use super::*;
use crate::kube_proxy::{
    cleanup::{
        holds_conntrack, keeps_translating_after, plan_iptables_cleanup, table_keeps_translating,
        KEEP_ALIVE_CHAIN, KEEP_ALIVE_COMMENT, KEEP_ALIVE_SPEC,
    },
    ownership::{chain_owner, is_kube_proxy_chain, ChainOwner},
    ruleset::{SavedRule, SavedRuleset},
};

const ALL_DUMPS: [(&str, &str); 6] = [
    ("1.20 legacy IPv4", LEGACY_1_20_IPV4),
    ("captured 1.20.2 legacy", CAPTURED_1_20_LEGACY),
    ("captured 1.20.2 nft", CAPTURED_1_20_NFT),
    ("current nft IPv4", NFT_1_33_IPV4),
    ("current nft IPv6", NFT_1_33_IPV6),
    ("nat only kube-proxy's", ONLY_NAT),
];

fn cleaned(text: &str) -> (SavedRuleset, SavedRuleset) {
    let before = parse(text);
    let plan = plan_iptables_cleanup(&before);
    let after = match apply_restore(&before, &plan.restore_input()) {
        Ok(after) => after,
        Err(error) => panic!(
            "the restore input would fail: {error}\n{}",
            plan.restore_input()
        ),
    };
    (before, after)
}

/// The rules of `ruleset` that the cleanup must keep: not in a kube-proxy chain and
/// not jumping to one.
fn surviving_rules(ruleset: &SavedRuleset, table: &str) -> Vec<String> {
    ruleset
        .table(table)
        .map(|table| {
            table
                .rules
                .iter()
                .filter(|rule| !is_kube_proxy_chain(&rule.chain))
                .filter(|rule| {
                    !rule
                        .target()
                        .is_some_and(|target| is_kube_proxy_chain(&target))
                })
                .map(|rule| format!("{} {}", rule.chain, rule.spec))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_cleanup_removes_every_kube_proxy_chain_in_every_table() {
    for (name, text) in ALL_DUMPS {
        let (_, after) = cleaned(text);
        for table in &after.tables {
            for chain in &table.chains {
                assert!(
                    !is_kube_proxy_chain(&chain.name),
                    "{name}: {} {} survived",
                    table.name,
                    chain.name
                );
            }
            for rule in &table.rules {
                assert!(
                    !rule
                        .target()
                        .is_some_and(|target| is_kube_proxy_chain(&target)),
                    "{name}: jump survived: {} {}",
                    rule.chain,
                    rule.spec
                );
            }
        }
    }
}

#[test]
fn kubelets_chains_and_every_unrelated_rule_survive_in_order() {
    for (name, text) in ALL_DUMPS {
        let (before, after) = cleaned(text);
        for table in &before.tables {
            let kept: Vec<String> = rule_lines(&after, &table.name)
                .into_iter()
                .filter(|line| !line.contains(KEEP_ALIVE_COMMENT))
                .collect();
            assert_eq!(
                kept,
                surviving_rules(&before, &table.name),
                "{name} {}",
                table.name
            );
            for chain in &table.chains {
                if chain_owner(&chain.name) != ChainOwner::KubeProxy {
                    assert!(
                        after.table(&table.name).unwrap().has_chain(&chain.name),
                        "{name}: {} {} was removed",
                        table.name,
                        chain.name
                    );
                }
            }
        }
    }
}

#[test]
fn kubelet_chains_named_in_the_1_20_dump_are_all_still_there() {
    let (_, after) = cleaned(LEGACY_1_20_IPV4);
    assert_eq!(
        chain_names(&after, "nat"),
        [
            "PREROUTING",
            "INPUT",
            "OUTPUT",
            "POSTROUTING",
            "DOCKER",
            "KUBE-KUBELET-CANARY",
            "KUBE-MARK-DROP",
            "KUBE-MARK-MASQ"
        ]
    );
    assert_eq!(
        chain_names(&after, "mangle").last().unwrap(),
        "KUBE-KUBELET-CANARY"
    );
    let filter = after.table("filter").unwrap();
    assert_eq!(
        filter.rules_of("KUBE-FIREWALL").count(),
        2,
        "kubelet's KUBE-FIREWALL rules stay"
    );
    assert_eq!(
        rule_lines(&after, "filter")
            .iter()
            .filter(|line| line.starts_with("INPUT ") || line.starts_with("OUTPUT "))
            .collect::<Vec<_>>(),
        ["INPUT -j KUBE-FIREWALL", "OUTPUT -j KUBE-FIREWALL"]
    );
}

#[test]
fn the_1_20_plan_lists_the_jumps_and_chains_it_removes() {
    let plan = plan_iptables_cleanup(&parse(LEGACY_1_20_IPV4));
    let tables: Vec<&str> = plan
        .tables
        .iter()
        .map(|table| table.table.as_str())
        .collect();
    assert_eq!(tables, ["mangle", "filter", "nat"]);
    let filter = &plan.tables[1];
    assert_eq!(
        filter.removed_chains,
        [
            "KUBE-EXTERNAL-SERVICES",
            "KUBE-FORWARD",
            "KUBE-PROXY-CANARY",
            "KUBE-SERVICES"
        ]
    );
    assert_eq!(filter.deleted_jumps.len(), 5);
    let nat = &plan.tables[2];
    assert_eq!(nat.removed_chains.len(), 15);
    assert_eq!(nat.deleted_jumps.len(), 3);
    assert!(
        !plan.keep_alive_added(),
        "flannel and docker MASQUERADE rules remain"
    );
    assert_eq!(plan.removed_rules(), 45 + 8);
}

#[test]
fn the_restore_input_deletes_jumps_then_flushes_then_deletes_chains() {
    let ruleset = parse(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-A - [0:0]\n\
         -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A POSTROUTING -s 10.244.0.0/16 -j MASQUERADE\n\
         -A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m tcp --dport 443 -j KUBE-SVC-A\n\
         -A KUBE-SVC-A -p tcp -m tcp -j DNAT --to-destination 10.0.0.1:6443\nCOMMIT\n",
    );
    assert_eq!(
        plan_iptables_cleanup(&ruleset).restore_input(),
        "*nat\n\
         -D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -F KUBE-SERVICES\n-F KUBE-SVC-A\n-X KUBE-SERVICES\n-X KUBE-SVC-A\nCOMMIT\n"
    );
}

#[test]
fn a_nat_table_left_empty_gets_the_keep_alive_rule_first() {
    let before = parse(ONLY_NAT);
    let plan = plan_iptables_cleanup(&before);
    let nat = plan
        .tables
        .iter()
        .find(|table| table.table == "nat")
        .unwrap();
    assert!(nat.keep_alive_added);
    assert!(plan.keep_alive_added());
    let input = plan.restore_input();
    let nat_block = &input[input.find("*nat").unwrap()..];
    assert_eq!(
        nat_block.lines().nth(1).unwrap(),
        format!("-A {KEEP_ALIVE_CHAIN} {KEEP_ALIVE_SPEC}"),
        "the keep-alive is added before anything is removed"
    );
    let after = apply_restore(&before, &input).unwrap();
    let mut nat_rules = rule_lines(&after, "nat");
    nat_rules.sort();
    assert_eq!(
        nat_rules,
        [
            "KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000".to_string(),
            format!("POSTROUTING {KEEP_ALIVE_SPEC}"),
        ]
    );
    assert!(table_keeps_translating(after.table("nat").unwrap()));
    assert!(keeps_translating_after(&before, &plan));
}

#[test]
fn the_keep_alive_rule_holds_conntrack_and_changes_no_verdict() {
    let rule = SavedRule {
        chain: KEEP_ALIVE_CHAIN.into(),
        spec: KEEP_ALIVE_SPEC.into(),
    };
    assert!(holds_conntrack(&rule));
    assert_eq!(rule.target(), None, "no target: it only counts packets");
    assert_eq!(rule.comment().as_deref(), Some(KEEP_ALIVE_COMMENT));
}

#[test]
fn only_the_nat_table_gets_a_keep_alive() {
    let plan = plan_iptables_cleanup(&parse(ONLY_NAT));
    for table in &plan.tables {
        assert_eq!(
            table.keep_alive_added,
            table.table == "nat",
            "{}",
            table.table
        );
    }
}

#[test]
fn a_comment_only_rule_does_not_keep_nat_alive_but_a_masquerade_does() {
    let base =
        "*nat\n:PREROUTING ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n\
                -A PREROUTING -j KUBE-SERVICES\n";
    for (extra, keep_alive) in [
        ("", true),
        (
            "-A POSTROUTING -m comment --comment \"just a comment\"\n",
            true,
        ),
        ("-A POSTROUTING -s 10.0.0.0/8 -j RETURN\n", true),
        ("-A POSTROUTING -s 10.0.0.0/8 -j MASQUERADE\n", false),
        ("-A POSTROUTING -m conntrack --ctstate DNAT\n", false),
        ("-A POSTROUTING -m state --state NEW -j RETURN\n", false),
        (
            "-A PREROUTING -d 192.0.2.1/32 -p tcp -j DNAT --to-destination 10.0.0.1\n",
            false,
        ),
        (
            "-A POSTROUTING -o eth0 -j SNAT --to-source 192.0.2.2\n",
            false,
        ),
    ] {
        let ruleset = parse(&format!("{base}{extra}COMMIT\n"));
        let plan = plan_iptables_cleanup(&ruleset);
        assert_eq!(plan.keep_alive_added(), keep_alive, "{extra:?}");
        assert!(keeps_translating_after(&ruleset, &plan), "{extra:?}");
    }
}

#[test]
fn a_masquerade_in_a_user_chain_with_a_jump_from_a_base_chain_keeps_nat_alive() {
    let (_, after) = cleaned(NFT_1_33_IPV4);
    assert!(!plan_iptables_cleanup(&parse(NFT_1_33_IPV4)).keep_alive_added());
    assert_eq!(
        rule_lines(&after, "nat")[0],
        "POSTROUTING -m comment --comment \"flanneld masq\" -j FLANNEL-POSTRTG"
    );
    assert!(table_keeps_translating(after.table("nat").unwrap()));
}

#[test]
fn the_cleanup_is_idempotent_and_adds_the_keep_alive_once() {
    for (name, text) in ALL_DUMPS {
        let (_, after) = cleaned(text);
        let second = plan_iptables_cleanup(&after);
        assert!(second.is_empty(), "{name}: {second:?}");
        let keep_alives = rule_lines(&after, "nat")
            .iter()
            .filter(|line| line.contains(KEEP_ALIVE_COMMENT))
            .count();
        assert!(keep_alives <= 1, "{name}");
    }
}

#[test]
fn nothing_is_planned_for_a_node_without_kube_proxy() {
    let ruleset = parse(
        "*filter\n:INPUT ACCEPT [0:0]\n:KUBE-FIREWALL - [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\n\
         -A INPUT -j KUBE-FIREWALL\n-A KUBE-FIREWALL -m mark --mark 0x8000/0x8000 -j DROP\nCOMMIT\n\
         *nat\n:POSTROUTING ACCEPT [0:0]\n:KUBE-MARK-MASQ - [0:0]\n-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\nCOMMIT\n",
    );
    let plan = plan_iptables_cleanup(&ruleset);
    assert!(plan.is_empty());
    assert_eq!(plan.restore_input(), "");
}

#[test]
fn jumps_from_another_agents_chain_into_kube_proxys_are_deleted_too() {
    let before = parse(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:CNI-HOSTPORT-DNAT - [0:0]\n:KUBE-SERVICES - [0:0]\n\
         -A PREROUTING -j CNI-HOSTPORT-DNAT\n\
         -A CNI-HOSTPORT-DNAT -p tcp -j DNAT --to-destination 10.0.0.9:80\n\
         -A CNI-HOSTPORT-DNAT -j KUBE-SERVICES\nCOMMIT\n",
    );
    let after = apply_restore(&before, &plan_iptables_cleanup(&before).restore_input()).unwrap();
    assert_eq!(
        rule_lines(&after, "nat"),
        [
            "PREROUTING -j CNI-HOSTPORT-DNAT",
            "CNI-HOSTPORT-DNAT -p tcp -j DNAT --to-destination 10.0.0.9:80"
        ]
    );
}

#[test]
fn identical_duplicate_jumps_are_each_deleted() {
    let before = parse(
        "*nat\n:POSTROUTING ACCEPT [0:0]\n:KUBE-POSTROUTING - [0:0]\n\
         -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
         -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
         -A POSTROUTING -j MASQUERADE\n\
         -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\nCOMMIT\n",
    );
    let plan = plan_iptables_cleanup(&before);
    assert_eq!(plan.tables[0].deleted_jumps.len(), 2);
    let after = apply_restore(&before, &plan.restore_input()).unwrap();
    assert_eq!(rule_lines(&after, "nat"), ["POSTROUTING -j MASQUERADE"]);
}

#[test]
fn a_jump_to_an_undeclared_kube_proxy_chain_is_left_alone() {
    // Not a state iptables can be in, but a partial dump must not make the plan
    // delete something it cannot account for.
    let ruleset = parse("*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j KUBE-SERVICES\nCOMMIT\n");
    assert!(plan_iptables_cleanup(&ruleset).is_empty());
}

#[test]
fn kube_proxys_canary_chains_go_in_mangle_too_but_kubelets_stay() {
    let (_, after) = cleaned(NFT_1_33_IPV4);
    assert_eq!(
        chain_names(&after, "mangle"),
        [
            "PREROUTING",
            "INPUT",
            "FORWARD",
            "OUTPUT",
            "POSTROUTING",
            "KUBE-IPTABLES-HINT",
            "KUBE-KUBELET-CANARY"
        ]
    );
}

#[test]
fn ipv6_cleanup_keeps_the_cni_masquerade_and_needs_no_keep_alive() {
    let (_, after) = cleaned(NFT_1_33_IPV6);
    assert_eq!(
        rule_lines(&after, "nat"),
        [
            "POSTROUTING -s fd00:10:244::/56 ! -d fd00:10:244::/56 -m comment --comment \"cni masquerade\" -j MASQUERADE",
            "KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000"
        ]
    );
    assert!(!plan_iptables_cleanup(&parse(NFT_1_33_IPV6)).keep_alive_added());
}

#[test]
fn the_real_kube_proxy_1_20_dumps_clean_down_to_the_mark_chains_and_the_keep_alive() {
    for text in [CAPTURED_1_20_LEGACY, CAPTURED_1_20_NFT] {
        let before = parse(text);
        let plan = plan_iptables_cleanup(&before);
        assert_eq!(plan.removed_rules(), 45 + 8);
        // Without kubelet or a CNI, kube-proxy's were the only nat rules: the
        // cleanup would leave the nat table without conntrack.
        assert!(plan.keep_alive_added());
        let after = apply_restore(&before, &plan.restore_input()).unwrap();
        let mut nat = rule_lines(&after, "nat");
        nat.sort();
        assert_eq!(
            nat,
            [
                "KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000".to_string(),
                format!("POSTROUTING {KEEP_ALIVE_SPEC}"),
            ]
        );
        // kube-proxy 1.20 creates KUBE-MARK-DROP empty for kubelet to fill: kept.
        assert!(after.table("nat").unwrap().has_chain("KUBE-MARK-DROP"));
        assert!(rule_lines(&after, "filter").is_empty());
        assert_eq!(
            chain_names(&after, "mangle").len(),
            5,
            "only the built-in chains"
        );
    }
}
