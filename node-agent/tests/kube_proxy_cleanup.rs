//! Privileged tests of kube-proxy's rule cleanup on real netfilter, in a private
//! network namespace per test (see `kube_proxy_support`). Run by
//! `make coexist-test`:
//! `cargo test -p switchyard-agent --test 'kube_proxy_*' -- --ignored`.

mod kube_proxy_support;

use std::time::Duration;

use kube_proxy_support::*;
use switchyard_agent::kube_proxy::{
    cleanup::KEEP_ALIVE_COMMENT,
    detection::footprint,
    ownership::{chain_owner, is_kube_proxy_chain, ChainOwner},
    plan_node_cleanup,
    ruleset::SavedRuleset,
    system::Tools,
    Backend, Family,
};

/// Names that must not appear anywhere in a dump after the cleanup.
const KUBE_PROXY_NAMES: [&str; 13] = [
    "KUBE-SERVICES",
    "KUBE-NODEPORTS",
    "KUBE-EXTERNAL-SERVICES",
    "KUBE-FORWARD",
    "KUBE-PROXY-FIREWALL",
    "KUBE-POSTROUTING",
    "KUBE-PROXY-CANARY",
    "KUBE-SVC-",
    "KUBE-SVL-",
    "KUBE-EXT-",
    "KUBE-SEP-",
    "KUBE-FW-",
    "KUBE-XLB-",
];

fn parsed(text: &str) -> SavedRuleset {
    SavedRuleset::parse(text).unwrap_or_else(|error| panic!("{error}\n{text}"))
}

/// Per table, the rules the cleanup must keep, in order, as `CHAIN spec`.
fn unrelated_rules(ruleset: &SavedRuleset) -> Vec<(String, Vec<String>)> {
    ruleset
        .tables
        .iter()
        .map(|table| {
            let rules = table
                .rules
                .iter()
                .filter(|rule| !is_kube_proxy_chain(&rule.chain))
                .filter(|rule| {
                    !rule
                        .target()
                        .is_some_and(|target| is_kube_proxy_chain(&target))
                })
                .map(|rule| format!("{} {}", rule.chain, rule.spec))
                .collect();
            (table.name.clone(), rules)
        })
        .collect()
}

fn without_keep_alive(mut tables: Vec<(String, Vec<String>)>) -> Vec<(String, Vec<String>)> {
    for (_, rules) in &mut tables {
        rules.retain(|rule| !rule.contains(KEEP_ALIVE_COMMENT));
    }
    tables
}

#[test]
#[ignore = "privileged netns test: run by make coexist-test"]
fn the_cleanup_removes_every_kube_proxy_chain_and_keeps_kubelets_in_both_backends_and_nftables() {
    run_isolated(
        "the_cleanup_removes_every_kube_proxy_chain_and_keeps_kubelets_in_both_backends_and_nftables",
        || {
            // A node with kube-proxy 1.20's rules in the legacy backend, current
            // kube-proxy's in the nft backend (both families) and its nftables mode.
            load(Backend::Legacy, Family::Ipv4, LEGACY_1_20_IPV4);
            load(Backend::Nft, Family::Ipv4, &without_nfacct(NFT_1_33_IPV4));
            load(Backend::Nft, Family::Ipv6, NFT_1_33_IPV6);
            sh(&format!("nft -f - <<'EOF'\n{NFTABLES_MODE}\nEOF"));
            let parts = [
                (Backend::Legacy, Family::Ipv4),
                (Backend::Nft, Family::Ipv4),
                (Backend::Nft, Family::Ipv6),
            ];
            let before: Vec<SavedRuleset> = parts
                .iter()
                .map(|(backend, family)| parsed(&save_text(*backend, *family)))
                .collect();

            let tools = Tools::new();
            let rules = tools.read_node_rules(&Family::ALL).unwrap();
            let found = footprint(&rules);
            println!("before: {found:?}");
            assert_eq!((found.nft_tables, found.nft_rules), (2, 34));
            // The same counts as the pure tests find in the fixtures.
            assert_eq!((found.chains, found.rules), (19 + 22 + 14, 49 + 53 + 27));
            let plan = plan_node_cleanup(&rules);
            println!(
                "plan: {} iptables rules in {} backend/family parts, nft tables {:?}, keep-alive {:?}",
                plan.removed_rules(),
                plan.iptables.len(),
                plan.nftables.deleted_tables,
                plan.nftables.keep_alive
            );
            assert_eq!(plan.iptables.len(), 3);
            tools.apply_cleanup(&plan).unwrap();

            let rules_after = tools.read_node_rules(&Family::ALL).unwrap();
            assert!(!footprint(&rules_after).present(), "{:?}", footprint(&rules_after));
            for ((backend, family), before) in parts.iter().zip(&before) {
                let text = save_text(*backend, *family);
                for name in KUBE_PROXY_NAMES {
                    assert!(
                        !text.contains(name),
                        "{backend:?} {family:?}: {name} survived:\n{text}"
                    );
                }
                let after = parsed(&text);
                // Every kubelet chain and every rule unrelated to kube-proxy is
                // still there, in its order.
                for table in &before.tables {
                    for chain in &table.chains {
                        if chain_owner(&chain.name) == ChainOwner::Kubelet {
                            assert!(
                                after.table(&table.name).unwrap().has_chain(&chain.name),
                                "{backend:?} {family:?}: kubelet's {} {} is gone",
                                table.name,
                                chain.name
                            );
                        }
                    }
                }
                assert_eq!(
                    without_keep_alive(unrelated_rules(&after)),
                    unrelated_rules(before),
                    "{backend:?} {family:?}"
                );
            }
            let legacy = save_text(Backend::Legacy, Family::Ipv4);
            for kept in [
                ":KUBE-MARK-MASQ",
                ":KUBE-MARK-DROP",
                ":KUBE-FIREWALL",
                ":KUBE-KUBELET-CANARY",
                "-A KUBE-FIREWALL -m comment --comment \"kubernetes firewall for dropping marked packets\"",
                "-A POSTROUTING -s 10.244.0.0/16 ! -d 224.0.0.0/4 -j MASQUERADE --random-fully",
                ":DOCKER-USER",
            ] {
                assert!(legacy.contains(kept), "{kept} is gone:\n{legacy}");
            }
            let tables = sh("nft list tables");
            assert!(!tables.contains("kube-proxy"), "{tables}");
            assert!(tables.contains("table inet filter-host"), "{tables}");

            // Nothing is left to plan: the cleanup is idempotent.
            let again = plan_node_cleanup(&rules_after);
            assert!(again.is_empty(), "{again:?}");
        },
    );
}

/// Loads the node whose only nat rules are kube-proxy's into `backend`, opens a
/// connection through its DNAT, then cleans up, with or without the keep-alive.
/// Returns how many round trips after the cleanup failed: of 30, 100 ms apart,
/// with the keep-alive; of [`FAILURE_PROBES`] without (each failure waits 1 s).
fn round_trips_after_cleanup(backend: Backend, keep_alive: bool) -> u32 {
    client_server_topology();
    load(backend, Family::Ipv4, ONLY_NAT);
    let _server = EchoServer::start();
    let mut connection = LongLivedConnection::open();
    assert_eq!(connection.round_trips(0, 10, Duration::from_millis(20)), 0);
    let conntrack = sh("conntrack -L -p tcp 2>/dev/null");
    assert!(
        conntrack.contains("dst=10.96.0.20") && conntrack.contains("src=10.0.2.2"),
        "the connection was DNAT'd by kube-proxy's rules: {conntrack}"
    );

    let tools = Tools::new();
    let rules = tools.read_node_rules(&[Family::Ipv4]).unwrap();
    let mut plan = plan_node_cleanup(&rules);
    assert_eq!(plan.iptables.len(), 1);
    assert!(
        plan.iptables[0].plan.keep_alive_added(),
        "the cleanup would empty every nat base chain"
    );
    if !keep_alive {
        for table in &mut plan.iptables[0].plan.tables {
            table.keep_alive_added = false;
        }
    }
    tools.apply_cleanup(&plan).unwrap();
    let nat = sh(&format!("{} -t nat", backend.tool(Family::Ipv4, "save")));
    assert!(
        !nat.contains("KUBE-SVC-") && !nat.contains("KUBE-SERVICES"),
        "{nat}"
    );
    assert_eq!(nat.contains(KEEP_ALIVE_COMMENT), keep_alive, "{nat}");
    let count = if keep_alive { 30 } else { FAILURE_PROBES };
    let failed = connection.round_trips(100, count, Duration::from_millis(100));
    println!("{backend:?}, keep-alive {keep_alive}: {failed} of {count} round trips failed after the cleanup");
    failed
}

const FAILURE_PROBES: u32 = 4;

#[test]
#[ignore = "privileged netns test: run by make coexist-test"]
fn an_established_dnat_connection_survives_a_cleanup_that_empties_the_nat_table_legacy() {
    run_isolated(
        "an_established_dnat_connection_survives_a_cleanup_that_empties_the_nat_table_legacy",
        || assert_eq!(round_trips_after_cleanup(Backend::Legacy, true), 0),
    );
}

#[test]
#[ignore = "privileged netns test: run by make coexist-test"]
fn an_established_dnat_connection_survives_a_cleanup_that_empties_the_nat_table_nft() {
    run_isolated(
        "an_established_dnat_connection_survives_a_cleanup_that_empties_the_nat_table_nft",
        || assert_eq!(round_trips_after_cleanup(Backend::Nft, true), 0),
    );
}

/// The premise of the keep-alive, checked on this kernel: without it, the same
/// cleanup breaks the connection (so the tests above do test something).
#[test]
#[ignore = "privileged netns test: run by make coexist-test"]
fn without_the_keep_alive_the_same_cleanup_breaks_the_connection() {
    run_isolated(
        "without_the_keep_alive_the_same_cleanup_breaks_the_connection",
        || {
            assert_eq!(
                round_trips_after_cleanup(Backend::Nft, false),
                FAILURE_PROBES
            )
        },
    );
}

/// kube-proxy's nftables mode, shaped as it writes it, for `SERVICE`.
const NFTABLES_SERVICE: &str = r#"table ip kube-proxy {
  comment "rules for kube-proxy"
  chain endpoint-AAAAAAAA-default/web/tcp/http__10.0.2.2/8080 { ip saddr 10.0.2.2 jump mark-for-masquerade; meta l4proto tcp dnat to 10.0.2.2:8080; }
  chain service-BBBBBBBB-default/web/tcp/http { ip daddr 10.96.0.20 tcp dport 80 ip saddr != 10.0.1.0/24 jump mark-for-masquerade; numgen random mod 1 vmap { 0 : goto endpoint-AAAAAAAA-default/web/tcp/http__10.0.2.2/8080 }; }
  map service-ips { type ipv4_addr . inet_proto . inet_service : verdict; elements = { 10.96.0.20 . tcp . 80 : goto service-BBBBBBBB-default/web/tcp/http } }
  chain mark-for-masquerade { mark set mark or 0x4000; }
  chain masquerading { meta mark & 0x4000 == 0 return; meta mark set meta mark ^ 0x4000; masquerade fully-random; }
  chain services { ip daddr . meta l4proto . th dport vmap @service-ips; }
  chain nat-prerouting { type nat hook prerouting priority -100; policy accept; jump services; }
  chain nat-output { type nat hook output priority -100; policy accept; jump services; }
  chain nat-postrouting { type nat hook postrouting priority 100; policy accept; jump masquerading; }
}"#;

#[test]
#[ignore = "privileged netns test: run by make coexist-test"]
fn an_established_connection_survives_deleting_kube_proxys_nftables_table() {
    run_isolated(
        "an_established_connection_survives_deleting_kube_proxys_nftables_table",
        || {
            client_server_topology();
            sh(&format!("nft -f - <<'EOF'\n{NFTABLES_SERVICE}\nEOF"));
            let _server = EchoServer::start();
            let mut connection = LongLivedConnection::open();
            assert_eq!(connection.round_trips(0, 10, Duration::from_millis(20)), 0);
            let tools = Tools::new();
            let rules = tools.read_node_rules(&[Family::Ipv4]).unwrap();
            let plan = plan_node_cleanup(&rules);
            assert_eq!(plan.nftables.deleted_tables, [Family::Ipv4]);
            assert_eq!(plan.nftables.keep_alive, [Family::Ipv4]);
            tools.apply_cleanup(&plan).unwrap();
            let tables = sh("nft list tables");
            assert!(!tables.contains("kube-proxy"), "{tables}");
            assert!(tables.contains("switchyard-keepalive"), "{tables}");
            let failed = connection.round_trips(100, 30, Duration::from_millis(100));
            println!("nftables mode: {failed} of 30 round trips failed after the cleanup");
            assert_eq!(failed, 0);
            // Idempotent: the keep-alive table is found and not added again.
            let again = plan_node_cleanup(&tools.read_node_rules(&[Family::Ipv4]).unwrap());
            assert!(again.is_empty(), "{again:?}");
        },
    );
}

/// The real kube-proxy 1.20.2's rules (captured), an established connection through
/// them (DNAT to a `default/web` endpoint and masquerade), the cleanup: the
/// connection keeps working and only kubelet's mark chains and the keep-alive stay.
fn real_kube_proxy_rules_cleaned_under_a_live_connection(backend: Backend, dump: &str) {
    client_server_topology();
    serve_captured_web_endpoints();
    load(backend, Family::Ipv4, dump);
    let _server = EchoServer::start();
    let mut connection = LongLivedConnection::open();
    assert_eq!(connection.round_trips(0, 10, Duration::from_millis(20)), 0);
    let conntrack = sh("conntrack -L -p tcp 2>/dev/null");
    assert!(
        conntrack.contains("dst=10.96.0.20") && conntrack.contains("dst=10.0.2.1"),
        "DNAT'd and masqueraded by kube-proxy's rules: {conntrack}"
    );
    let tools = Tools::new();
    let rules = tools.read_node_rules(&[Family::Ipv4]).unwrap();
    let before = footprint(&rules);
    let plan = plan_node_cleanup(&rules);
    assert!(plan.iptables[0].plan.keep_alive_added());
    tools.apply_cleanup(&plan).unwrap();
    let after = tools.read_node_rules(&[Family::Ipv4]).unwrap();
    assert!(!footprint(&after).present());
    let failed = connection.round_trips(100, 30, Duration::from_millis(100));
    println!(
        "{backend:?}: real kube-proxy 1.20.2 rules ({} rules in {} chains) removed; {failed} of 30 round trips failed after",
        before.rules, before.chains
    );
    assert_eq!(failed, 0);
    let text = save_text(backend, Family::Ipv4);
    for name in KUBE_PROXY_NAMES {
        assert!(!text.contains(name), "{name} survived:\n{text}");
    }
    assert!(
        text.contains(":KUBE-MARK-MASQ") && text.contains(":KUBE-MARK-DROP"),
        "{text}"
    );
}

#[test]
#[ignore = "privileged netns test: run by make coexist-test"]
fn real_kube_proxy_1_20_rules_are_cleaned_under_a_live_connection_legacy() {
    run_isolated(
        "real_kube_proxy_1_20_rules_are_cleaned_under_a_live_connection_legacy",
        || {
            real_kube_proxy_rules_cleaned_under_a_live_connection(
                Backend::Legacy,
                CAPTURED_1_20_LEGACY,
            )
        },
    );
}

#[test]
#[ignore = "privileged netns test: run by make coexist-test"]
fn real_kube_proxy_1_20_rules_are_cleaned_under_a_live_connection_nft() {
    run_isolated(
        "real_kube_proxy_1_20_rules_are_cleaned_under_a_live_connection_nft",
        || real_kube_proxy_rules_cleaned_under_a_live_connection(Backend::Nft, CAPTURED_1_20_NFT),
    );
}
