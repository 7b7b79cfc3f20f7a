//! Privileged tests of the chain-order guard on real netfilter, in a private
//! network namespace per test (see `kube_proxy_support`). Run by
//! `make coexist-test`.

mod kube_proxy_support;

use std::time::Duration;

use kube_proxy_support::*;
use switchyard_agent::kube_proxy::{
    chain_order::{agent_chains, agent_chains_present, check_chain_order},
    ruleset::SavedRuleset,
    system::{Tools, CHAIN_ORDER_REPAIR_FAILED},
    Backend, Family,
};
use switchyard_crds::reasons;

const MARK: u32 = 0x4000;

/// What kube-proxy does when it starts: its chains, then its jumps with
/// "prepend if missing" (`EnsureRule(Prepend)`), in its own order, so the last
/// one lands first.
const KUBE_PROXY_START: &str = "*filter\n\
:KUBE-FORWARD - [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-EXTERNAL-SERVICES - [0:0]\n:KUBE-PROXY-FIREWALL - [0:0]\n\
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n\
-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j ACCEPT\n\
-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
-I FORWARD 1 -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES\n\
-I FORWARD 1 -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
-I FORWARD 1 -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n\
-I FORWARD 1 -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL\n\
COMMIT\n\
*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n\
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n\
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0\n\
-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n\
-I OUTPUT 1 -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
-I PREROUTING 1 -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
-I POSTROUTING 1 -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
COMMIT\n";

fn first_rule(backend: Backend, table: &str, chain: &str) -> String {
    let text = sh(&format!(
        "{} -t {table}",
        backend.tool(Family::Ipv4, "save")
    ));
    text.lines()
        .find(|line| line.starts_with(&format!("-A {chain} ")))
        .unwrap_or_default()
        .to_string()
}

fn dump(backend: Backend) -> SavedRuleset {
    SavedRuleset::parse(&save_text(backend, Family::Ipv4)).unwrap()
}

fn late_kube_proxy_is_put_behind_the_agent(backend: Backend) {
    let tools = Tools::new();
    // The agent starts first, on a node without kube-proxy, and kube-proxy's image
    // uses `backend`: the agent writes into the default backend, then follows
    // kube-proxy into its backend once its chains appear.
    let start = tools.guard_chain_order(Family::Ipv4, MARK).unwrap();
    assert!(start.status, "{start:?}");
    load(backend, Family::Ipv4, KUBE_PROXY_START);
    assert_eq!(
        first_rule(backend, "filter", "FORWARD"),
        "-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL"
    );
    let before = check_chain_order(&dump(backend), &agent_chains(MARK));
    assert!(!before.safe());

    let repaired = tools.guard_chain_order(Family::Ipv4, MARK).unwrap();
    println!("{backend:?}: {repaired:?}");
    assert!(repaired.status);
    assert_eq!(repaired.reason, reasons::CHAIN_ORDER_RESTORED);
    assert_eq!(
        first_rule(backend, "filter", "FORWARD"),
        "-A FORWARD -j SWITCHYARD-FORWARD"
    );
    assert_eq!(
        first_rule(backend, "nat", "POSTROUTING"),
        "-A POSTROUTING -j SWITCHYARD-POSTROUTING"
    );
    // The rules iptables-save prints are exactly the desired ones.
    assert!(check_chain_order(&dump(backend), &agent_chains(MARK)).safe());
    // kube-proxy's jumps are all still there, behind the agent's.
    let filter = sh(&format!("{} -t filter", backend.tool(Family::Ipv4, "save")));
    let forward: Vec<&str> = filter
        .lines()
        .filter(|line| line.starts_with("-A FORWARD "))
        .collect();
    assert_eq!(forward.len(), 5, "{filter}");
    for (line, jump) in forward[1..].iter().zip([
        "-j KUBE-PROXY-FIREWALL",
        "-j KUBE-FORWARD",
        "-j KUBE-SERVICES",
        "-j KUBE-EXTERNAL-SERVICES",
    ]) {
        assert!(line.ends_with(jump), "{line} should end with {jump}");
    }

    // Quiet afterwards: nothing to repair, the same for a kube-proxy restart (which
    // finds its jumps with `-C` and leaves them).
    for _ in 0..3 {
        let again = tools.guard_chain_order(Family::Ipv4, MARK).unwrap();
        assert_eq!(again.reason, reasons::CHAIN_ORDER_VERIFIED, "{again:?}");
    }
    assert_ne!(repaired.reason, CHAIN_ORDER_REPAIR_FAILED);
}

#[test]
#[ignore = "privileged netns test: run by make coexist-test"]
fn a_kube_proxy_started_after_the_agent_is_put_behind_its_chains_nft() {
    run_isolated(
        "a_kube_proxy_started_after_the_agent_is_put_behind_its_chains_nft",
        || late_kube_proxy_is_put_behind_the_agent(Backend::Nft),
    );
}

#[test]
#[ignore = "privileged netns test: run by make coexist-test"]
fn a_kube_proxy_started_after_the_agent_is_put_behind_its_chains_legacy() {
    run_isolated(
        "a_kube_proxy_started_after_the_agent_is_put_behind_its_chains_legacy",
        || {
            let tools = Tools::new();
            tools.guard_chain_order(Family::Ipv4, MARK).unwrap();
            load(Backend::Legacy, Family::Ipv4, KUBE_PROXY_START);
            let repaired = tools.guard_chain_order(Family::Ipv4, MARK).unwrap();
            println!("legacy: {repaired:?}");
            assert_eq!(repaired.reason, reasons::CHAIN_ORDER_RESTORED);
            assert_eq!(
                first_rule(Backend::Legacy, "filter", "FORWARD"),
                "-A FORWARD -j SWITCHYARD-FORWARD"
            );
            assert_eq!(
                first_rule(Backend::Legacy, "nat", "POSTROUTING"),
                "-A POSTROUTING -j SWITCHYARD-POSTROUTING"
            );
            assert!(check_chain_order(&dump(Backend::Legacy), &agent_chains(MARK)).safe());
            assert!(check_chain_order(&dump(Backend::Nft), &agent_chains(MARK)).safe());
            let again = tools.guard_chain_order(Family::Ipv4, MARK).unwrap();
            assert_eq!(again.reason, reasons::CHAIN_ORDER_VERIFIED);
            // Removing the agent's chains (a node that left eBPF) leaves
            // kube-proxy's as they were, and the next read no longer sees them.
            let present = |tools: &Tools| {
                tools
                    .read_node_rules(&[Family::Ipv4])
                    .unwrap()
                    .iptables
                    .iter()
                    .any(|dump| agent_chains_present(&dump.ruleset))
            };
            assert!(present(&tools));
            tools.remove_agent_chains(Family::Ipv4, MARK).unwrap();
            for backend in [Backend::Legacy, Backend::Nft] {
                assert!(!save_text(backend, Family::Ipv4).contains("SWITCHYARD"));
            }
            assert!(!present(&tools));
            assert_eq!(
                first_rule(Backend::Legacy, "filter", "FORWARD"),
                "-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL"
            );
        },
    );
}

/// The masquerade of translated flows survives a late kube-proxy and a late
/// CNI-style `-j RETURN` in POSTROUTING: once the guard has run, a new marked
/// connection is masqueraded (the server's reply goes to the node's address). A
/// mangle rule sets the mark here, standing in for the TC programs.
#[test]
#[ignore = "privileged netns test: run by make coexist-test"]
fn a_late_return_in_postrouting_is_put_behind_the_agents_masquerade() {
    run_isolated(
        "a_late_return_in_postrouting_is_put_behind_the_agents_masquerade",
        || {
            client_server_topology();
            let tools = Tools::new();
            tools.guard_chain_order(Family::Ipv4, MARK).unwrap();
            load(
                Backend::Nft,
                Family::Ipv4,
                "*mangle\n-A PREROUTING -i c0 -j MARK --set-xmark 0x4000/0x4000\nCOMMIT\n",
            );
            let _server = EchoServer::start();
            let direct = std::net::SocketAddrV4::new(SERVER_IP, BACKEND_PORT);
            let mut first = LongLivedConnection::open_to(direct);
            assert_eq!(first.round_trips(0, 3, Duration::from_millis(10)), 0);
            assert_eq!(masqueraded_connections(), 1);

            // kube-proxy, then a CNI, start after the agent (kube-proxy's own
            // KUBE-POSTROUTING would masquerade the 0x4000 mark too; the CNI's
            // RETURN lands ahead of it and of the agent's chain).
            load(Backend::Nft, Family::Ipv4, KUBE_PROXY_START);
            load(
                Backend::Nft,
                Family::Ipv4,
                "*nat\n-I POSTROUTING 1 -s 10.0.1.0/24 -d 10.0.2.0/24 -j RETURN\nCOMMIT\n",
            );
            let mut second = LongLivedConnection::open_to(direct);
            assert_eq!(second.round_trips(0, 3, Duration::from_millis(10)), 0);
            assert_eq!(
                masqueraded_connections(),
                1,
                "the RETURN skipped the masquerade"
            );

            let report = tools.guard_chain_order(Family::Ipv4, MARK).unwrap();
            println!("{report:?}");
            assert_eq!(report.reason, reasons::CHAIN_ORDER_RESTORED);
            let mut third = LongLivedConnection::open_to(direct);
            assert_eq!(third.round_trips(0, 3, Duration::from_millis(10)), 0);
            assert_eq!(masqueraded_connections(), 2, "masqueraded again");
            // The connections opened before are unaffected.
            assert_eq!(first.round_trips(10, 3, Duration::from_millis(10)), 0);
            assert_eq!(second.round_trips(10, 3, Duration::from_millis(10)), 0);
        },
    );
}

/// Connections to the server whose replies go to the node's address (masqueraded).
fn masqueraded_connections() -> usize {
    sh("conntrack -L -p tcp 2>/dev/null")
        .lines()
        .filter(|line| line.contains("dst=10.0.2.2") && line.contains("src=10.0.2.2 dst=10.0.2.1 "))
        .count()
}

/// A masqueraded flow whose netfilter state is lost (conntrack flushed, no
/// mid-stream pickup): netfilter finds its packets INVALID and cannot SNAT them.
/// The agent's chain drops them; accepting them instead (the control half) leaks
/// the client's own address to the server, which answers with a RST.
#[test]
#[ignore = "privileged netns test: run by make coexist-test"]
fn marked_packets_whose_conntrack_state_is_lost_are_dropped_not_leaked() {
    run_isolated(
        "marked_packets_whose_conntrack_state_is_lost_are_dropped_not_leaked",
        || {
            client_server_topology();
            sh("sysctl -qw net.netfilter.nf_conntrack_tcp_loose=0");
            // Count what reaches the server from the client's own address.
            sh("ip netns exec server iptables-nft -A INPUT -s 10.0.1.2 -p tcp --dport 8080");
            let tools = Tools::new();
            tools.guard_chain_order(Family::Ipv4, MARK).unwrap();
            load(Backend::Nft, Family::Ipv4, KUBE_PROXY_START);
            tools.guard_chain_order(Family::Ipv4, MARK).unwrap();
            load(
                Backend::Nft,
                Family::Ipv4,
                "*mangle\n-A PREROUTING -i c0 -j MARK --set-xmark 0x4000/0x4000\nCOMMIT\n",
            );
            let _server = EchoServer::start();
            let direct = std::net::SocketAddrV4::new(SERVER_IP, BACKEND_PORT);

            let mut guarded = LongLivedConnection::open_to(direct);
            assert_eq!(guarded.round_trips(0, 3, Duration::from_millis(10)), 0);
            assert_eq!(masqueraded_connections(), 1);
            sh("conntrack -F 2>/dev/null");
            let failed = guarded.round_trips(10, 2, Duration::from_millis(10));
            let leaked = leaked_packets();
            println!("agent's INVALID drop: {failed} of 2 round trips failed, {leaked} packets leaked un-NATed");
            assert_eq!(failed, 2);
            assert_eq!(leaked, 0);
            assert!(invalid_drops() > 0);

            // Control: without the INVALID drop, the same packets leak.
            sh("iptables-nft -D SWITCHYARD-FORWARD 1");
            let mut unguarded = LongLivedConnection::open_to(direct);
            assert_eq!(unguarded.round_trips(0, 3, Duration::from_millis(10)), 0);
            sh("conntrack -F 2>/dev/null");
            let error = unguarded.round_trip(10).unwrap_err();
            let leaked = leaked_packets();
            println!("accepting INVALID instead: {leaked} packets leaked un-NATed; the client saw {error}");
            assert!(leaked > 0);
        },
    );
}

fn leaked_packets() -> u64 {
    let text = sh("ip netns exec server iptables-nft -L INPUT -v -x -n");
    text.lines()
        .find(|line| line.contains("10.0.1.2"))
        .and_then(|line| line.split_whitespace().next())
        .and_then(|count| count.parse().ok())
        .unwrap_or(0)
}

fn invalid_drops() -> u64 {
    let text = sh("iptables-nft -L SWITCHYARD-FORWARD -v -x -n");
    text.lines()
        .find(|line| line.contains("DROP"))
        .and_then(|line| line.split_whitespace().next())
        .and_then(|count| count.parse().ok())
        .unwrap_or(0)
}
