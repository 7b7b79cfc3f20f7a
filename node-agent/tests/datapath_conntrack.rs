//! Privileged datapath tests of Switchyard's connection tracking: a plain hash the
//! agent expires, and an overflow LRU for the flows a full hash cannot take (see
//! `loader::expiry`). Run by `make datapath-test`.

mod datapath_support;

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    os::fd::AsFd as _,
    time::Duration,
};

use datapath_support::*;
use switchyard_agent::{
    loader::{self, schema, system, Datapath, InterfaceKind},
    maps::ServiceMaps,
};
use switchyard_common::{
    ipv4_mapped, map_names, ConntrackKey, ConntrackValue, CONNTRACK_FLAG_REPLY, PROTOCOL_TCP,
    PROTOCOL_UDP, SCHEMA_VERSION,
};

const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const SERVICE_PORT: u16 = 80;

fn cluster_ip_address() -> SocketAddrV4 {
    SocketAddrV4::new(CLUSTER_IP, SERVICE_PORT)
}

/// Loads the datapath with a conntrack hash of `conntrack` entries and attaches
/// it to every pod interface.
fn start_with_conntrack_size(
    node: &Node,
    pods: &[Pod],
    conntrack: u32,
) -> (Datapath, loader::PinnedServiceMaps) {
    let mut settings = node.loader_settings();
    settings.map_sizes.conntrack = conntrack;
    let mut datapath = Datapath::load(settings).expect("load the datapath");
    for pod in pods {
        datapath
            .attach_interface(&pod.host_interface(), InterfaceKind::Pod)
            .expect("attach pod interface");
    }
    let mut maps = datapath.service_maps().expect("open maps");
    maps.write_config(&active_config()).expect("write config");
    (datapath, maps)
}

fn conntrack_map_path(node: &Node, name: &str) -> std::path::PathBuf {
    loader::version_directory(&node.pin_directory, SCHEMA_VERSION).join(name)
}

fn entry_count(node: &Node, name: &str) -> usize {
    let map = system::open_pinned(&conntrack_map_path(node, name)).expect("open the pin");
    system::map_entries(
        map.as_fd(),
        std::mem::size_of::<ConntrackKey>(),
        std::mem::size_of::<ConntrackValue>(),
    )
    .expect("read the map")
    .len()
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn a_full_conntrack_hash_sends_new_flows_to_the_overflow_and_every_connection_keeps_working() {
    run_isolated(
        "a_full_conntrack_hash_sends_new_flows_to_the_overflow_and_every_connection_keeps_working",
        |node| {
            let pods = standard_topology(3);
            for pod in &pods[..2] {
                start_servers(pod);
            }
            // 64 entries: 32 flows (two entries each) fill it; closed flows keep
            // theirs for the 10 s closing timeout, so the hash stays full.
            let (_datapath, mut maps) = start_with_conntrack_size(node, &pods, 64);
            let backends: Vec<&Pod> = pods[..2].iter().collect();
            write_service(
                &mut maps,
                &ServiceEntry::cluster_ip(1, CLUSTER_IP, SERVICE_PORT, PROTOCOL_TCP)
                    .with_backends(&backends),
            );
            let before_full = LongLivedConnection::open(
                Some("pod3"),
                cluster_ip_address(),
                Duration::from_millis(50),
            );
            let results = tcp_requests_from(Some("pod3"), cluster_ip_address(), 100);
            let failures: Vec<String> = results
                .iter()
                .filter_map(|result| result.as_ref().err().map(|error| error.to_string()))
                .collect();
            assert_eq!(results.len(), 100, "{failures:?}\n{}", diagnostics());
            assert!(failures.is_empty(), "{failures:?}\n{}", diagnostics());
            assert_eq!(
                entry_count(node, map_names::CONNTRACK),
                64,
                "the hash is full"
            );
            let overflowed = entry_count(node, map_names::CONNTRACK_OVERFLOW);
            assert!(overflowed >= 100, "{overflowed} entries in the overflow");
            let counters = maps.counters().expect("counters");
            assert!(counters.conntrack_overflow >= 100, "{counters:?}");
            assert_eq!(counters.error, 0, "{counters:?}");
            // A connection opened while the hash is full lives in the overflow,
            // and keeps its backend through more new flows.
            let while_full = LongLivedConnection::open(
                Some("pod3"),
                cluster_ip_address(),
                Duration::from_millis(50),
            );
            let more = tcp_requests_from(Some("pod3"), cluster_ip_address(), 50);
            assert!(more.iter().all(|result| result.is_ok()), "{more:?}");
            std::thread::sleep(Duration::from_millis(300));
            for (name, connection) in [
                ("before the hash filled", before_full),
                ("while it was full", while_full),
            ] {
                let report = connection.close();
                assert_eq!(report.failure, None, "connection opened {name}: {report:?}");
                assert!(report.requests >= 3, "connection opened {name}: {report:?}");
                assert_eq!(
                    report.backends.len(),
                    1,
                    "connection opened {name}: {report:?}"
                );
            }
            // Drain counts the flows in the overflow too.
            let entries = maps.conntrack_entries().expect("entries");
            assert!(entries.len() >= 164, "{} entries read", entries.len());
        },
    );
}

fn stale_udp_entry(index: u16, last_seen_nanoseconds: u64) -> (ConntrackKey, ConntrackValue) {
    (
        ConntrackKey {
            source_address: ipv4_mapped([10, 244, 9, 9]),
            destination_address: ipv4_mapped([10, 96, 9, 9]),
            source_port_big_endian: (20_000 + index).to_be(),
            destination_port_big_endian: 53u16.to_be(),
            protocol: PROTOCOL_UDP,
            reserved: [0; 3],
        },
        ConntrackValue {
            new_source_address: ipv4_mapped([10, 244, 9, 9]),
            new_destination_address: ipv4_mapped([10, 244, 8, 8]),
            new_source_port_big_endian: (20_000 + index).to_be(),
            new_destination_port_big_endian: 8053u16.to_be(),
            flags: 0,
            tcp_state: 0,
            reserved: [0; 2],
            last_seen_nanoseconds,
        },
    )
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn the_agent_removes_expired_conntrack_entries_and_keeps_live_flows_working() {
    run_isolated(
        "the_agent_removes_expired_conntrack_entries_and_keeps_live_flows_working",
        |node| {
            let pods = standard_topology(3);
            for pod in &pods[..2] {
                start_servers(pod);
            }
            let (datapath, mut maps) = start_with_conntrack_size(node, &pods, 65_536);
            // A closing timeout of 1 s, so closed flows expire within the test.
            let mut config = active_config();
            config.tcp_closing_timeout_seconds = 1;
            maps.write_config(&config).expect("write config");
            let backends: Vec<&Pod> = pods[..2].iter().collect();
            write_service(
                &mut maps,
                &ServiceEntry::cluster_ip(1, CLUSTER_IP, SERVICE_PORT, PROTOCOL_TCP)
                    .with_backends(&backends),
            );
            // Entries well past the UDP idle timeout (120 s), written as if by the
            // programs long ago, and fresh ones.
            let map = system::open_pinned(&conntrack_map_path(node, map_names::CONNTRACK))
                .expect("open the hash");
            let now = system::monotonic_nanoseconds();
            let stale_stamp = now.saturating_sub(600 * 1_000_000_000);
            for index in 0..200u16 {
                let (key, value) = stale_udp_entry(index, stale_stamp);
                system::map_update(
                    map.as_fd(),
                    &schema::bytes_of(&key),
                    &schema::bytes_of(&value),
                    system::UPDATE_ANY,
                )
                .expect("write a stale entry");
            }
            for index in 200..210u16 {
                let (key, value) = stale_udp_entry(index, now);
                system::map_update(
                    map.as_fd(),
                    &schema::bytes_of(&key),
                    &schema::bytes_of(&value),
                    system::UPDATE_ANY,
                )
                .expect("write a fresh entry");
            }
            let live = LongLivedConnection::open(
                Some("pod3"),
                cluster_ip_address(),
                Duration::from_millis(100),
            );
            let closed = tcp_requests_from(Some("pod3"), cluster_ip_address(), 20);
            assert!(closed.iter().all(|result| result.is_ok()), "{closed:?}");
            let pod3 = ipv4_mapped(pods[2].ip.octets());
            let tcp_flows_from_pod3 = |maps: &loader::PinnedServiceMaps| {
                maps.conntrack_entries()
                    .expect("entries")
                    .iter()
                    .filter(|(key, value)| {
                        key.protocol == PROTOCOL_TCP
                            && key.source_address == pod3
                            && value.flags & CONNTRACK_FLAG_REPLY == 0
                    })
                    .count()
            };
            assert!(
                tcp_flows_from_pod3(&maps) >= 21,
                "{}",
                tcp_flows_from_pod3(&maps)
            );
            let stale_left = |maps: &loader::PinnedServiceMaps| {
                maps.conntrack_entries()
                    .expect("entries")
                    .iter()
                    .filter(|(key, _)| {
                        key.protocol == PROTOCOL_UDP
                            && key.source_address == ipv4_mapped([10, 244, 9, 9])
                    })
                    .count()
            };
            // The first sweep comes 1 s after the load, the next ones at most 10 s
            // apart; closed flows expire 1 s after their teardown.
            let swept = wait_until(Duration::from_secs(30), || {
                stale_left(&maps) == 10 && tcp_flows_from_pod3(&maps) == 1
            });
            assert!(
                swept,
                "{} of the UDP entries and {} TCP flows from pod3 left (want the 10 fresh ones and the live connection)",
                stale_left(&maps),
                tcp_flows_from_pod3(&maps)
            );
            let report = live.close();
            assert_eq!(report.failure, None, "{report:?}");
            assert_eq!(report.backends.len(), 1, "{report:?}");
            assert!(report.requests >= 20, "{report:?}");
            let counters = maps.counters().expect("counters");
            assert_eq!(counters.conntrack_overflow, 0, "{counters:?}");
            // What the agent's metrics read: the 200 stale entries and the 20
            // closed flows' 40 entries removed, the hash's size.
            let report = datapath.conntrack_sweep_report().expect("a sweep has run");
            assert!(report.removed_total >= 240, "{report:?}");
            assert_eq!(report.capacity, 65_536, "{report:?}");
        },
    );
}

fn entry_of(map: &std::os::fd::OwnedFd, key: &ConntrackKey) -> Option<ConntrackValue> {
    system::map_lookup(
        map.as_fd(),
        &schema::bytes_of(key),
        std::mem::size_of::<ConntrackValue>(),
    )
    .expect("look the key up")
    .and_then(|bytes| schema::from_bytes::<ConntrackValue>(&bytes))
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn a_key_the_programs_rewrote_after_the_sweep_read_it_as_expired_is_kept() {
    run_isolated(
        "a_key_the_programs_rewrote_after_the_sweep_read_it_as_expired_is_kept",
        |node| {
            let pods = standard_topology(1);
            let (_datapath, _maps) = start_with_conntrack_size(node, &pods, 4096);
            let directory = loader::version_directory(&node.pin_directory, SCHEMA_VERSION);
            let map =
                system::open_pinned(&directory.join(map_names::CONNTRACK)).expect("open the hash");
            let write = |index: u16, last_seen: u64| {
                let (key, value) = stale_udp_entry(index, last_seen);
                system::map_update(
                    map.as_fd(),
                    &schema::bytes_of(&key),
                    &schema::bytes_of(&value),
                    system::UPDATE_ANY,
                )
                .expect("write an entry");
                (key, value)
            };
            let long_ago = system::monotonic_nanoseconds().saturating_sub(600 * 1_000_000_000);
            for removal in [
                loader::expiry::Removal::TakeAndCheck,
                loader::expiry::Removal::BatchDelete,
            ] {
                let maps = loader::expiry::ConntrackMaps::open(&directory)
                    .expect("open the conntrack maps")
                    .with_removal(removal);
                let lifetimes = maps.lifetimes().expect("lifetimes");
                // Both keys were read as expired; then a client reused the first
                // tuple, and the programs wrote its new flow under it.
                let (rewritten, fresh) = write(1, system::monotonic_nanoseconds());
                let (expired, _) = write(2, long_ago);
                let mut keys = schema::bytes_of(&rewritten).to_vec();
                keys.extend_from_slice(&schema::bytes_of(&expired));
                let removed = maps.remove_expired(&keys, &lifetimes).expect("remove");
                assert_eq!(
                    entry_of(&map, &expired),
                    None,
                    "{removal:?}: the expired entry is gone"
                );
                match removal {
                    loader::expiry::Removal::TakeAndCheck => {
                        assert_eq!(removed, 1, "{removal:?}");
                        assert_eq!(
                            entry_of(&map, &rewritten),
                            Some(fresh),
                            "{removal:?}: the new flow's entry is kept as the programs wrote it"
                        );
                    }
                    // What the fallback for old kernels costs, and why it is not
                    // the default: the new flow's entry goes too.
                    loader::expiry::Removal::BatchDelete => {
                        assert_eq!(removed, 2, "{removal:?}");
                        assert_eq!(entry_of(&map, &rewritten), None, "{removal:?}");
                    }
                }
            }
        },
    );
}
