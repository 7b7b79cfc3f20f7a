use super::*;
use crate::kube_proxy::chain_order::{
    agent_chains, agent_chains_present, check_chain_order, plan_agent_chain_removal,
    plan_chain_order_repair, OrderProblem, FORWARD_CHAIN, FORWARD_COMMENT, FORWARD_INVALID_COMMENT,
    POSTROUTING_CHAIN,
};

const MARK: u32 = 0x4000;

/// The agent's chains as iptables-save prints them, first in both base chains.
const AGENT_FIRST: &str = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
:SWITCHYARD-FORWARD - [0:0]\n\
-A FORWARD -j SWITCHYARD-FORWARD\n\
-A FORWARD -s 10.244.0.0/16 -j ACCEPT\n\
-A SWITCHYARD-FORWARD -m mark --mark 0x4000/0x4000 -m conntrack --ctstate INVALID -m comment --comment \"switchyard: never forward a translated packet netfilter cannot masquerade\" -j DROP\n\
-A SWITCHYARD-FORWARD -m mark --mark 0x4000/0x4000 -m comment --comment \"switchyard: forward Service traffic the datapath translated\" -j ACCEPT\n\
COMMIT\n\
*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n\
:SWITCHYARD-POSTROUTING - [0:0]\n\
-A POSTROUTING -j SWITCHYARD-POSTROUTING\n\
-A POSTROUTING -s 10.244.0.0/16 -d 10.244.0.0/16 -j RETURN\n\
-A SWITCHYARD-POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE\n\
COMMIT\n";

/// What a kube-proxy that starts after the agent leaves: its jumps prepended.
fn kube_proxy_started_late() -> SavedRuleset {
    let agent_first = parse(AGENT_FIRST);
    apply_restore(
        &agent_first,
        "*filter\n:KUBE-FORWARD - [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-PROXY-FIREWALL - [0:0]\n\
         -A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n\
         -A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j ACCEPT\n\
         -I FORWARD 1 -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n\
         -I FORWARD 1 -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -I FORWARD 1 -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL\n\
         COMMIT\n\
         *nat\n:KUBE-POSTROUTING - [0:0]\n\
         -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
         -I POSTROUTING 1 -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
         COMMIT\n",
    )
    .unwrap()
}

#[test]
fn the_agents_chains_first_are_safe() {
    let check = check_chain_order(&parse(AGENT_FIRST), &agent_chains(MARK));
    assert!(check.safe(), "{:?}", check.problems);
    assert_eq!(
        plan_chain_order_repair(&parse(AGENT_FIRST), &agent_chains(MARK)),
        ""
    );
}

#[test]
fn the_desired_rules_are_written_as_iptables_save_prints_them() {
    let chains = agent_chains(MARK);
    assert_eq!(chains[0].chain, FORWARD_CHAIN);
    assert_eq!(
        chains[0].rules,
        [
            format!(
                "-m mark --mark 0x4000/0x4000 -m conntrack --ctstate INVALID -m comment --comment \"{FORWARD_INVALID_COMMENT}\" -j DROP"
            ),
            format!(
                "-m mark --mark 0x4000/0x4000 -m comment --comment \"{FORWARD_COMMENT}\" -j ACCEPT"
            )
        ]
    );
    assert_eq!(chains[1].chain, POSTROUTING_CHAIN);
    assert_eq!(
        chains[1].rules,
        ["-m mark --mark 0x4000/0x4000 -j MASQUERADE"]
    );
    assert_eq!(
        agent_chains(0x100)[1].rules,
        ["-m mark --mark 0x100/0x100 -j MASQUERADE"]
    );
}

#[test]
fn a_late_kube_proxy_displaces_the_agents_jumps() {
    let ruleset = kube_proxy_started_late();
    let check = check_chain_order(&ruleset, &agent_chains(MARK));
    assert!(!check.safe());
    assert_eq!(
        check.displaced_by(),
        [
            "filter FORWARD: -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL",
            "filter FORWARD: -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
            "filter FORWARD: -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD",
            "nat POSTROUTING: -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING",
        ]
    );
}

#[test]
fn the_repair_puts_the_agents_jumps_first_and_leaves_kube_proxys_in_their_order() {
    let before = kube_proxy_started_late();
    let repair = plan_chain_order_repair(&before, &agent_chains(MARK));
    let after = apply_restore(&before, &repair).unwrap();
    assert!(check_chain_order(&after, &agent_chains(MARK)).safe());
    let forward: Vec<String> = rule_lines(&after, "filter")
        .into_iter()
        .filter(|line| line.starts_with("FORWARD "))
        .collect();
    assert_eq!(
        forward,
        [
            "FORWARD -j SWITCHYARD-FORWARD",
            "FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL",
            "FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
            "FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD",
            "FORWARD -s 10.244.0.0/16 -j ACCEPT",
        ]
    );
    assert_eq!(
        rule_lines(&after, "nat")
            .into_iter()
            .filter(|line| line.starts_with("POSTROUTING "))
            .collect::<Vec<_>>(),
        [
            "POSTROUTING -j SWITCHYARD-POSTROUTING",
            "POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING",
            "POSTROUTING -s 10.244.0.0/16 -d 10.244.0.0/16 -j RETURN",
        ]
    );
    // A second look finds nothing to do: no fight, no churn.
    assert_eq!(plan_chain_order_repair(&after, &agent_chains(MARK)), "");
}

#[test]
fn the_repair_is_one_atomic_block_per_table() {
    let repair = plan_chain_order_repair(&kube_proxy_started_late(), &agent_chains(MARK));
    assert_eq!(
        repair,
        format!(
            "*filter\n:SWITCHYARD-FORWARD - [0:0]\n\
             -A SWITCHYARD-FORWARD -m mark --mark 0x4000/0x4000 -m conntrack --ctstate INVALID -m comment --comment \"{FORWARD_INVALID_COMMENT}\" -j DROP\n\
             -A SWITCHYARD-FORWARD -m mark --mark 0x4000/0x4000 -m comment --comment \"{FORWARD_COMMENT}\" -j ACCEPT\n\
             -D FORWARD -j SWITCHYARD-FORWARD\n-I FORWARD 1 -j SWITCHYARD-FORWARD\nCOMMIT\n\
             *nat\n:SWITCHYARD-POSTROUTING - [0:0]\n\
             -A SWITCHYARD-POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE\n\
             -D POSTROUTING -j SWITCHYARD-POSTROUTING\n-I POSTROUTING 1 -j SWITCHYARD-POSTROUTING\nCOMMIT\n"
        )
    );
}

#[test]
fn missing_chains_are_created_first_in_a_kube_proxy_node() {
    let before = parse(NFT_1_33_IPV4);
    let check = check_chain_order(&before, &agent_chains(MARK));
    assert!(check.problems.contains(&OrderProblem::MissingChain {
        table: "filter".into(),
        chain: FORWARD_CHAIN.into()
    }));
    assert!(check.problems.contains(&OrderProblem::MissingJump {
        table: "nat".into(),
        base_chain: "POSTROUTING".into(),
        chain: POSTROUTING_CHAIN.into()
    }));
    let after = apply_restore(
        &before,
        &plan_chain_order_repair(&before, &agent_chains(MARK)),
    )
    .unwrap();
    assert!(check_chain_order(&after, &agent_chains(MARK)).safe());
    assert_eq!(
        rule_lines(&after, "filter")
            .iter()
            .find(|line| line.starts_with("FORWARD "))
            .unwrap(),
        "FORWARD -j SWITCHYARD-FORWARD"
    );
}

#[test]
fn a_missing_table_is_reported_and_created() {
    let before = parse("");
    let check = check_chain_order(&before, &agent_chains(MARK));
    assert_eq!(check.problems.len(), 2);
    let after = apply_restore(
        &before,
        &plan_chain_order_repair(&before, &agent_chains(MARK)),
    )
    .unwrap();
    assert!(check_chain_order(&after, &agent_chains(MARK)).safe());
}

#[test]
fn other_agents_jumps_ahead_are_tolerated() {
    let ruleset = apply_restore(
        &parse(AGENT_FIRST),
        "*filter\n:DOCKER-USER - [0:0]\n:cali-FORWARD - [0:0]\n\
         -I FORWARD 1 -j DOCKER-USER\n-I FORWARD 1 -m comment --comment \"cali:wUHhoiAYhphO9Mso\" -j cali-FORWARD\n\
         -I FORWARD 1 -j ACCEPT\nCOMMIT\n\
         *nat\n:FLANNEL-POSTRTG - [0:0]\n-I POSTROUTING 1 -j FLANNEL-POSTRTG\n-I POSTROUTING 1 -j MASQUERADE\nCOMMIT\n",
    )
    .unwrap();
    let check = check_chain_order(&ruleset, &agent_chains(MARK));
    assert!(check.safe(), "{:?}", check.problems);
}

#[test]
fn verdicts_that_lose_packets_ahead_are_displacement() {
    for (table, rule) in [
        (
            "filter",
            "-I FORWARD 1 -m conntrack --ctstate INVALID -j DROP",
        ),
        (
            "filter",
            "-I FORWARD 1 -j REJECT --reject-with icmp-port-unreachable",
        ),
        (
            "nat",
            "-I POSTROUTING 1 -s 10.244.0.0/16 -d 10.244.0.0/16 -j RETURN",
        ),
        ("nat", "-I POSTROUTING 1 -j ACCEPT"),
    ] {
        let ruleset =
            apply_restore(&parse(AGENT_FIRST), &format!("*{table}\n{rule}\nCOMMIT\n")).unwrap();
        let check = check_chain_order(&ruleset, &agent_chains(MARK));
        assert_eq!(check.displaced_by().len(), 1, "{rule}");
        let after = apply_restore(
            &ruleset,
            &plan_chain_order_repair(&ruleset, &agent_chains(MARK)),
        )
        .unwrap();
        assert!(
            check_chain_order(&after, &agent_chains(MARK)).safe(),
            "{rule}"
        );
    }
}

#[test]
fn a_changed_rule_in_the_agents_chain_is_put_back() {
    let ruleset = apply_restore(
        &parse(AGENT_FIRST),
        "*nat\n-A SWITCHYARD-POSTROUTING -j RETURN\nCOMMIT\n",
    )
    .unwrap();
    let check = check_chain_order(&ruleset, &agent_chains(MARK));
    assert_eq!(
        check.problems,
        [OrderProblem::WrongRules {
            table: "nat".into(),
            chain: POSTROUTING_CHAIN.into()
        }]
    );
    let after = apply_restore(
        &ruleset,
        &plan_chain_order_repair(&ruleset, &agent_chains(MARK)),
    )
    .unwrap();
    assert_eq!(
        after
            .table("nat")
            .unwrap()
            .rules_of(POSTROUTING_CHAIN)
            .count(),
        1
    );
    assert!(check_chain_order(&after, &agent_chains(MARK)).safe());
    // A different mark is a different rule.
    assert!(!check_chain_order(&parse(AGENT_FIRST), &agent_chains(0x8000)).safe());
}

#[test]
fn duplicate_jumps_are_reduced_to_one() {
    let ruleset = apply_restore(
        &parse(AGENT_FIRST),
        "*filter\n-A FORWARD -j SWITCHYARD-FORWARD\nCOMMIT\n",
    )
    .unwrap();
    let check = check_chain_order(&ruleset, &agent_chains(MARK));
    assert_eq!(
        check.problems,
        [OrderProblem::DuplicateJumps {
            table: "filter".into(),
            base_chain: "FORWARD".into(),
            count: 2
        }]
    );
    let after = apply_restore(
        &ruleset,
        &plan_chain_order_repair(&ruleset, &agent_chains(MARK)),
    )
    .unwrap();
    assert_eq!(
        rule_lines(&after, "filter")
            .iter()
            .filter(|line| *line == "FORWARD -j SWITCHYARD-FORWARD")
            .count(),
        1
    );
}

#[test]
fn removal_takes_the_jumps_and_chains_away_and_nothing_else() {
    let before = kube_proxy_started_late();
    let after = apply_restore(
        &before,
        &plan_agent_chain_removal(&before, &agent_chains(MARK)),
    )
    .unwrap();
    for table in ["filter", "nat"] {
        assert!(!rule_lines(&after, table)
            .iter()
            .any(|line| line.contains("SWITCHYARD")));
        assert!(!chain_names(&after, table)
            .iter()
            .any(|name| name.starts_with("SWITCHYARD")));
    }
    assert_eq!(
        rule_lines(&after, "filter").len(),
        rule_lines(&before, "filter").len() - 3
    );
    assert_eq!(plan_agent_chain_removal(&after, &agent_chains(MARK)), "");
}

#[test]
fn the_agents_chains_are_seen_until_their_removal_is_applied() {
    let agent_first = parse(AGENT_FIRST);
    assert!(agent_chains_present(&agent_first));
    let removed = apply_restore(
        &agent_first,
        &plan_agent_chain_removal(&agent_first, &agent_chains(MARK)),
    )
    .unwrap();
    assert!(!agent_chains_present(&removed));
    // A dangling jump alone (its chain gone by hand) still counts: removal takes it.
    let dangling = parse(
        "*nat\n:POSTROUTING ACCEPT [0:0]\n-A POSTROUTING -j SWITCHYARD-POSTROUTING\nCOMMIT\n",
    );
    assert!(agent_chains_present(&dangling));
    assert!(!agent_chains_present(&parse(
        "*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD -s 10.244.0.0/16 -j ACCEPT\nCOMMIT\n"
    )));
}
