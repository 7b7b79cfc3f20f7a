use super::*;
use crate::kube_proxy::{
    ownership::{chain_owner, proves_kube_proxy, ChainOwner},
    ruleset::{quote_word, split_words, SavedRule, SavedRuleset},
};

#[test]
fn a_kube_proxy_1_20_dump_parses_into_its_tables_chains_and_rules() {
    let ruleset = parse(LEGACY_1_20_IPV4);
    let names: Vec<&str> = ruleset
        .tables
        .iter()
        .map(|table| table.name.as_str())
        .collect();
    assert_eq!(names, ["mangle", "filter", "nat"]);
    let nat = ruleset.table("nat").unwrap();
    assert_eq!(nat.chains.len(), 23);
    assert_eq!(nat.rules.len(), 52);
    assert_eq!(nat.chains[0].name, "PREROUTING");
    assert_eq!(nat.chains[0].policy.as_deref(), Some("ACCEPT"));
    assert_eq!(
        ruleset.table("filter").unwrap().chains[1].policy.as_deref(),
        Some("DROP")
    );
    assert!(nat.has_chain("KUBE-XLB-PCF2RVZ4KXQ2FQUG"));
    assert_eq!(nat.rules_of("POSTROUTING").count(), 6);
}

#[test]
fn rule_specs_are_kept_verbatim_with_their_quotes() {
    let ruleset = parse(LEGACY_1_20_IPV4);
    let filter = ruleset.table("filter").unwrap();
    let jump = filter.rules_of("FORWARD").next().unwrap();
    assert_eq!(
        jump.spec,
        "-m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD"
    );
    assert_eq!(
        jump.delete_line(),
        "-D FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD"
    );
    assert_eq!(jump.target().as_deref(), Some("KUBE-FORWARD"));
    assert_eq!(
        jump.comment().as_deref(),
        Some("kubernetes forwarding rules")
    );
}

#[test]
fn the_nft_backend_dump_of_current_kube_proxy_parses_in_both_families() {
    for (text, tables, nat_rules) in [(NFT_1_33_IPV4, 3, 46), (NFT_1_33_IPV6, 3, 20)] {
        let ruleset = parse(text);
        assert_eq!(ruleset.tables.len(), tables);
        assert_eq!(ruleset.table("nat").unwrap().rules.len(), nat_rules);
    }
}

#[test]
fn a_rule_without_a_target_has_no_target() {
    let ruleset = parse(NFT_1_33_IPV4);
    let firewall: Vec<&SavedRule> = ruleset
        .table("nat")
        .unwrap()
        .rules_of("KUBE-FW-5JFPJWWIJ3MRYELP")
        .collect();
    assert_eq!(firewall.len(), 2);
    assert_eq!(firewall[1].target(), None);
    assert_eq!(
        firewall[1].comment().as_deref(),
        Some("other traffic to default/lb-ranges:http will be dropped by KUBE-PROXY-FIREWALL")
    );
}

#[test]
fn goto_targets_and_match_modules_are_read() {
    let rule = SavedRule {
        chain: "X".into(),
        spec: "-m conntrack --ctstate NEW -m comment --comment \"a -j B\" -g KUBE-SVC-ABC".into(),
    };
    assert_eq!(rule.target().as_deref(), Some("KUBE-SVC-ABC"));
    assert_eq!(rule.match_modules(), ["conntrack", "comment"]);
}

#[test]
fn words_split_like_iptables_restore_does() {
    assert_eq!(
        split_words(r#"-m comment --comment "say \"hi\" twice" -j  ACCEPT"#),
        [
            "-m",
            "comment",
            "--comment",
            "say \"hi\" twice",
            "-j",
            "ACCEPT"
        ]
    );
    assert_eq!(split_words(r#"--comment """#), ["--comment", ""]);
    assert_eq!(split_words("  "), Vec::<String>::new());
}

#[test]
fn quoting_round_trips_through_splitting() {
    for text in ["plain", "with space", "with \"quote\"", "back\\slash", ""] {
        let quoted = quote_word(text);
        assert_eq!(split_words(&quoted), [text], "{quoted}");
    }
    assert_eq!(quote_word("plain"), "plain");
}

#[test]
fn counters_from_save_minus_c_are_skipped() {
    let ruleset = parse(
        "*filter\n:INPUT ACCEPT [10:100]\n[5:300] -A INPUT -j KUBE-FIREWALL\n[0:0] -A INPUT\nCOMMIT\n",
    );
    let rules = &ruleset.table("filter").unwrap().rules;
    assert_eq!(rules[0].spec, "-j KUBE-FIREWALL");
    assert_eq!(rules[1].spec, "");
    assert_eq!(rules[1].append_line(), "-A INPUT");
}

#[test]
fn malformed_dumps_are_rejected_with_the_line() {
    for (text, line) in [
        ("-A INPUT -j ACCEPT\n", 1),
        ("*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\n", 3),
        ("*filter\nsomething else\nCOMMIT\n", 2),
        ("*filter\n*nat\nCOMMIT\n", 2),
        ("*filter\n:INPUT\nCOMMIT\n", 2),
    ] {
        match SavedRuleset::parse(text) {
            Err(crate::Error::ParseIptablesSave { line: found, .. }) => {
                assert_eq!(found, line, "{text:?}")
            }
            other => panic!("{text:?} gave {other:?}"),
        }
    }
}

#[test]
fn an_empty_backend_has_no_content() {
    assert!(!parse("").has_content());
    assert!(!parse("# Warning: iptables-legacy tables present\n*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\nCOMMIT\n").has_content());
    assert!(parse("*nat\n:POSTROUTING ACCEPT [0:0]\n:X - [0:0]\nCOMMIT\n").has_content());
    assert!(parse(LEGACY_1_20_IPV4).has_content());
}

#[test]
fn every_chain_kube_proxy_writes_is_kube_proxys() {
    for chain in [
        "KUBE-SERVICES",
        "KUBE-NODEPORTS",
        "KUBE-EXTERNAL-SERVICES",
        "KUBE-FORWARD",
        "KUBE-PROXY-FIREWALL",
        "KUBE-POSTROUTING",
        "KUBE-PROXY-CANARY",
        "KUBE-SVC-NPX46M4PTMTKRN6Y",
        "KUBE-SVL-LOCAL2FN5VV7Q3PK3",
        "KUBE-EXT-7EJNTS7AENER2WX5",
        "KUBE-SEP-3DUYT7B2LYWBYE2T",
        "KUBE-FW-PCF2RVZ4KXQ2FQUG",
        "KUBE-XLB-PCF2RVZ4KXQ2FQUG",
    ] {
        assert_eq!(chain_owner(chain), ChainOwner::KubeProxy, "{chain}");
    }
}

#[test]
fn kubelets_chains_are_kubelets() {
    for chain in [
        "KUBE-MARK-MASQ",
        "KUBE-MARK-DROP",
        "KUBE-FIREWALL",
        "KUBE-KUBELET-CANARY",
        "KUBE-IPTABLES-HINT",
    ] {
        assert_eq!(chain_owner(chain), ChainOwner::Kubelet, "{chain}");
    }
}

#[test]
fn look_alike_chains_of_other_agents_are_nobody_we_touch() {
    for chain in [
        "KUBE-SVC-",
        "KUBE-ROUTER-INPUT",
        "KUBE-NWPLCY-ABCDEF",
        "KUBE-POD-FW-ABCDEF",
        "KUBE-LOAD-BALANCER",
        "KUBE-NODE-PORT",
        "KUBE-SERVICES-EXTRA",
        "DOCKER",
        "FLANNEL-POSTRTG",
        "SWITCHYARD-FORWARD",
        "cali-FORWARD",
        "FORWARD",
    ] {
        assert_eq!(chain_owner(chain), ChainOwner::Other, "{chain}");
    }
}

#[test]
fn kube_postrouting_does_not_prove_kube_proxy_because_old_kubelets_write_it() {
    assert!(!proves_kube_proxy("KUBE-POSTROUTING"));
    assert!(proves_kube_proxy("KUBE-PROXY-CANARY"));
    assert!(!proves_kube_proxy("KUBE-MARK-MASQ"));
}
