//! Issue 8's datapath tests: long-lived connections survive the switch from
//! kube-proxy-style iptables rules to Switchyard, and back (draining).

mod datapath_support;

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    time::{Duration, Instant},
};

use datapath_support::*;
use switchyard_agent::{loader, maps::ServiceMaps};
use switchyard_common::{
    ipv4_mapped, CONNTRACK_FLAG_RECORDS_REPLY, CONNTRACK_FLAG_REPLY, DATAPATH_MODE_DRAINING,
    PROTOCOL_TCP, TCP_STATE_REPLY_SEEN,
};

const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const NODE_PORT: u16 = 30080;

/// kube-proxy's iptables mode for one Service (ClusterIP 10.96.0.10:80, NodePort
/// 30080) with endpoints pod1 and pod2, as `iptables-save` shows it (chains,
/// jumps, statistic random), plus a masquerade rule in POSTROUTING like every real
/// node has: deleting kube-proxy's rules must never leave the nat table with only
/// empty base chains, or netfilter drops the DNAT of established connections.
fn kube_proxy_rules() -> String {
    format!(
        "*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-SVC-TESTSERVICE0001 - [0:0]
:KUBE-SEP-TESTENDPOINT001 - [0:0]
:KUBE-SEP-TESTENDPOINT002 - [0:0]
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING
-A POSTROUTING -s 10.244.0.0/16 ! -d 10.244.0.0/16 -o ext9 -j MASQUERADE
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -j MASQUERADE
-A KUBE-SERVICES -d {CLUSTER_IP}/32 -p tcp -m comment --comment \"default/test:http cluster IP\" -m tcp --dport 80 -j KUBE-SVC-TESTSERVICE0001
-A KUBE-NODEPORTS -p tcp -m comment --comment \"default/test:http\" -m tcp --dport {NODE_PORT} -j KUBE-SVC-TESTSERVICE0001
-A KUBE-SVC-TESTSERVICE0001 -m comment --comment \"default/test:http -> 10.244.0.11:8080\" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-TESTENDPOINT001
-A KUBE-SVC-TESTSERVICE0001 -m comment --comment \"default/test:http -> 10.244.0.12:8080\" -j KUBE-SEP-TESTENDPOINT002
-A KUBE-SEP-TESTENDPOINT001 -p tcp -m comment --comment \"default/test:http\" -m tcp -j DNAT --to-destination 10.244.0.11:8080
-A KUBE-SEP-TESTENDPOINT002 -p tcp -m comment --comment \"default/test:http\" -m tcp -j DNAT --to-destination 10.244.0.12:8080
-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
COMMIT
"
    )
}

/// What is left after kube-proxy's Service rules are removed: the node's own
/// masquerade rule (so the nat table keeps a non-empty base chain).
fn rules_after_cleanup() -> &'static str {
    "*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A POSTROUTING -s 10.244.0.0/16 ! -d 10.244.0.0/16 -o ext9 -j MASQUERADE
COMMIT
"
}

fn iptables_restore(rules: &str) {
    let path = std::env::temp_dir().join(format!("switchyard-rules-{}", std::process::id()));
    std::fs::write(&path, rules).expect("write rules");
    sh(&format!("iptables-restore < {}", path.display()));
    let _ = std::fs::remove_file(path);
}

fn open_connections(count: usize) -> Vec<LongLivedConnection> {
    (0..count)
        .map(|index| {
            if index % 2 == 0 {
                LongLivedConnection::open(
                    Some("pod3"),
                    SocketAddrV4::new(CLUSTER_IP, 80),
                    Duration::from_millis(100),
                )
            } else {
                LongLivedConnection::open(
                    Some("client"),
                    SocketAddrV4::new(NODE_IP, NODE_PORT),
                    Duration::from_millis(100),
                )
            }
        })
        .collect()
}

fn service(pods: &[Pod]) -> ServiceEntry {
    ServiceEntry::cluster_ip(1, CLUSTER_IP, 80, PROTOCOL_TCP)
        .with_node_port(NODE_PORT)
        .with_backends(&[&pods[0], &pods[1]])
}

fn new_connections_succeed(count: usize) {
    for (namespace, address) in [
        (Some("pod3"), SocketAddrV4::new(CLUSTER_IP, 80)),
        (Some("client"), SocketAddrV4::new(NODE_IP, NODE_PORT)),
    ] {
        let results = tcp_requests_from(namespace, address, count);
        assert_eq!(
            results.iter().filter(|result| result.is_ok()).count(),
            count,
            "new connections from {namespace:?}: {results:?}"
        );
    }
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn connections_opened_through_iptables_rules_survive_the_switch_to_switchyard() {
    run_isolated(
        "connections_opened_through_iptables_rules_survive_the_switch_to_switchyard",
        |node| {
            let pods = standard_topology(3);
            start_servers(&pods[0]);
            start_servers(&pods[1]);
            iptables_restore(&kube_proxy_rules());
            new_connections_succeed(5);
            let connections = open_connections(50);

            // The agent starts and takes over; then kube-proxy's rules are deleted.
            let (_datapath, mut maps) = start_datapath(node, &pods);
            write_service(&mut maps, &service(&pods));
            std::thread::sleep(Duration::from_secs(1));
            iptables_restore(rules_after_cleanup());
            let rules = sh("iptables-save -t nat");
            assert!(!rules.contains("KUBE-"), "{rules}");

            // New connections go through Switchyard while the old ones keep going.
            let translated_before = maps.counters().expect("counters").translated;
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(30) {
                new_connections_succeed(2);
                std::thread::sleep(Duration::from_secs(1));
            }
            let counters = maps.counters().expect("counters");
            assert!(
                counters.translated >= translated_before + 100,
                "new connections were translated by Switchyard: {counters:?}"
            );
            assert!(
                counters.passed_untracked > 0,
                "the old connections' packets were left to netfilter: {counters:?}"
            );
            let reports: Vec<LongLivedReport> = connections
                .into_iter()
                .map(LongLivedConnection::close)
                .collect();
            let failed: Vec<&LongLivedReport> = reports
                .iter()
                .filter(|report| report.failure.is_some())
                .collect();
            assert!(
                failed.is_empty(),
                "{} of 50 broke: {failed:?}",
                failed.len()
            );
            for report in &reports {
                assert!(report.requests >= 250, "{report:?}");
            }
        },
    );
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn connections_opened_through_switchyard_survive_draining_while_new_ones_go_to_iptables() {
    run_isolated(
        "connections_opened_through_switchyard_survive_draining_while_new_ones_go_to_iptables",
        |node| {
            let pods = standard_topology(3);
            start_servers(&pods[0]);
            start_servers(&pods[1]);
            let (_datapath, mut maps) = start_datapath(node, &pods);
            write_service(&mut maps, &service(&pods));
            let connections = open_connections(50);
            assert_eq!(maps.live_tcp_flows().expect("live flows"), 50);

            // Rollback: kube-proxy's rules come back, the datapath drains.
            iptables_restore(&kube_proxy_rules());
            let mut config = active_config();
            config.mode = DATAPATH_MODE_DRAINING;
            maps.write_config(&config).expect("drain");
            let translated_before = maps.counters().expect("counters").translated;
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(10) {
                new_connections_succeed(2);
                std::thread::sleep(Duration::from_millis(500));
            }
            assert_eq!(
                maps.counters().expect("counters").translated,
                translated_before,
                "draining translates no new flow"
            );
            assert_eq!(maps.live_tcp_flows().expect("live flows"), 50);

            let reports: Vec<LongLivedReport> = connections
                .into_iter()
                .map(LongLivedConnection::close)
                .collect();
            let failed: Vec<&LongLivedReport> = reports
                .iter()
                .filter(|report| report.failure.is_some())
                .collect();
            assert!(
                failed.is_empty(),
                "{} of 50 broke: {failed:?}",
                failed.len()
            );
            // Closing the last connection ends the drain: the agent may detach.
            assert!(
                wait_until(Duration::from_secs(5), || maps
                    .live_tcp_flows()
                    .is_ok_and(|count| count == 0)),
                "live flows after closing: {:?}",
                maps.live_tcp_flows()
            );
            drop(maps);
            loader::detach_everything(&node.pin_directory).expect("detach");
            new_connections_succeed(5);
        },
    );
}

/// A Service whose only backend drops every packet (pod2, behind an iptables DROP):
/// nothing ever answers its SYNs.
const SILENT_CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 20);

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn a_drain_waits_for_an_idle_connection_but_not_for_syns_a_silent_backend_never_answered() {
    run_isolated(
        "a_drain_waits_for_an_idle_connection_but_not_for_syns_a_silent_backend_never_answered",
        |node| {
            let pods = standard_topology(3);
            start_servers(&pods[0]);
            sh(&format!(
                "ip netns exec {} iptables -A INPUT -p tcp --dport {TCP_PORT} -j DROP",
                pods[1].name
            ));
            let (_datapath, mut maps) = start_datapath(node, &pods);
            write_service(
                &mut maps,
                &ServiceEntry::cluster_ip(1, CLUSTER_IP, 80, PROTOCOL_TCP)
                    .with_backends(&[&pods[0]]),
            );
            write_service(
                &mut maps,
                &ServiceEntry::cluster_ip(2, SILENT_CLUSTER_IP, 80, PROTOCOL_TCP)
                    .with_backends(&[&pods[1]]),
            );

            // The control: an established connection, idle since its handshake, whose
            // last packet (the client's ACK) came after the backend's SYN-ACK.
            let idle = in_namespace(Some("pod3"), || {
                std::net::TcpStream::connect_timeout(
                    &SocketAddrV4::new(CLUSTER_IP, 80).into(),
                    Duration::from_secs(2),
                )
            })
            .join()
            .expect("client thread")
            .expect("the idle connection is established");
            // A client retrying its SYN to the silent backend (the kernel retransmits
            // after 1 s, 3 s, 7 s, ...); it never connects.
            let retrying = in_namespace(Some("pod3"), || {
                std::net::TcpStream::connect_timeout(
                    &SocketAddrV4::new(SILENT_CLUSTER_IP, 80).into(),
                    Duration::from_secs(60),
                )
            });
            let pod3 = ipv4_mapped(pods[2].ip.octets());
            let flow_to = |maps: &loader::PinnedServiceMaps, backend: &Pod| {
                let backend = ipv4_mapped(backend.ip.octets());
                let entries = maps.conntrack_entries().expect("conntrack entries");
                let forward = entries.iter().find(|(key, value)| {
                    key.source_address == pod3
                        && value.flags & CONNTRACK_FLAG_REPLY == 0
                        && value.new_destination_address == backend
                })?;
                let reply = entries.iter().find(|(key, value)| {
                    key.source_address == backend
                        && value.flags & CONNTRACK_FLAG_REPLY != 0
                        && value.new_destination_address == pod3
                })?;
                Some((forward.1, reply.1))
            };
            assert!(
                wait_until(Duration::from_secs(5), || flow_to(&maps, &pods[1])
                    .is_some()),
                "the retried flow's entries: {}",
                diagnostics()
            );

            // Rollback: the datapath drains; it still translates both flows.
            let mut config = active_config();
            config.mode = DATAPATH_MODE_DRAINING;
            maps.write_config(&config).expect("drain");
            let draining_since = loader::system::monotonic_nanoseconds();
            // A SYN retransmitted while draining: the client's entry moves past the
            // reply entry, which still holds the flow's start (the entries' shape of an
            // idle connection whose client spoke last).
            assert!(
                wait_until(Duration::from_secs(10), || flow_to(&maps, &pods[1])
                    .is_some_and(
                        |(forward, _)| forward.last_seen_nanoseconds > draining_since
                    )),
                "no SYN retransmitted while draining: {:?}",
                flow_to(&maps, &pods[1])
            );
            let (retried, retried_reply) = flow_to(&maps, &pods[1]).expect("the retried flow");
            assert!(
                retried.last_seen_nanoseconds > retried_reply.last_seen_nanoseconds,
                "{retried:?} {retried_reply:?}"
            );
            assert_eq!(
                retried.flags & CONNTRACK_FLAG_RECORDS_REPLY,
                CONNTRACK_FLAG_RECORDS_REPLY,
                "{retried:?}"
            );
            assert_eq!(retried.tcp_state & TCP_STATE_REPLY_SEEN, 0, "{retried:?}");
            assert!(!retrying.is_finished(), "the silent backend answered");
            let (answered, answered_reply) = flow_to(&maps, &pods[0]).expect("the idle flow");
            assert!(
                answered.last_seen_nanoseconds > answered_reply.last_seen_nanoseconds,
                "the idle connection's client spoke last: {answered:?} {answered_reply:?}"
            );
            // Only the idle connection holds the drain.
            assert_eq!(maps.live_tcp_flows().expect("live flows"), 1);

            // Closing it ends the drain, though the client still retries.
            drop(idle);
            assert!(
                wait_until(Duration::from_secs(5), || maps
                    .live_tcp_flows()
                    .is_ok_and(|count| count == 0)),
                "live flows after closing the idle connection: {:?}",
                maps.live_tcp_flows()
            );
            assert!(!retrying.is_finished(), "the silent backend answered");
        },
    );
}
