//! Map schema upgrade: a process of a newer schema version takes over the maps of
//! an older one without a failed connection.
//!
//! The "older version" is made by moving the running datapath's pins from
//! `v<SCHEMA_VERSION>` to `v<SCHEMA_VERSION - 1>` (renaming pins changes nothing
//! for the programs using the maps), and the new process is given a schema whose
//! previous version has the current layout (a bump that changed no layout). It
//! must take every map over, attach its programs in place, and remove the old
//! version's pins, while long-lived and new connections keep working. A bump
//! that changes layouts is `datapath_schema.rs`.

mod datapath_support;

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use datapath_support::*;
use switchyard_agent::{
    loader::{self, schema, Datapath, InterfaceKind},
    maps::ServiceMaps,
};
use switchyard_common::{map_names, PROTOCOL_TCP, SCHEMA_VERSION};

/// A history in which the previous version had exactly the current layout.
static UNCHANGED_LAYOUT_BUMP: schema::Schema = schema::Schema {
    current: SCHEMA_VERSION,
    current_layouts: &schema::CURRENT_LAYOUTS,
    steps: &[schema::VersionStep {
        from: SCHEMA_VERSION - 1,
        layouts: &schema::CURRENT_LAYOUTS,
        changed_maps: &[],
        convert: |map, _, _| Err(format!("{map} did not change: nothing to convert")),
    }],
};

const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const NODE_PORT: u16 = 30080;

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn maps_of_an_older_schema_version_are_taken_over_without_a_failed_connection() {
    run_isolated(
        "maps_of_an_older_schema_version_are_taken_over_without_a_failed_connection",
        |node| {
            let pods = standard_topology(3);
            start_servers(&pods[0]);
            start_servers(&pods[1]);
            let (datapath, mut maps) = start_datapath(node, &pods);
            drop(datapath);
            write_service(
                &mut maps,
                &ServiceEntry::cluster_ip(1, CLUSTER_IP, 80, PROTOCOL_TCP)
                    .with_node_port(NODE_PORT)
                    .with_backends(&[&pods[0], &pods[1]]),
            );
            let frontends_before = maps.frontends().expect("frontends");
            drop(maps);
            let connections: Vec<LongLivedConnection> = (0..10)
                .map(|_| {
                    LongLivedConnection::open(
                        Some("pod3"),
                        SocketAddrV4::new(CLUSTER_IP, 80),
                        Duration::from_millis(100),
                    )
                })
                .collect();
            let stop = Arc::new(AtomicBool::new(false));
            let (successes, failures) =
                (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
            let load = {
                let (stop, successes, failures) =
                    (stop.clone(), successes.clone(), failures.clone());
                in_namespace(Some("client"), move || {
                    while !stop.load(Ordering::Relaxed) {
                        match tcp_request(
                            SocketAddrV4::new(NODE_IP, NODE_PORT),
                            Duration::from_secs(2),
                        ) {
                            Ok(_) => successes.fetch_add(1, Ordering::Relaxed),
                            Err(_) => failures.fetch_add(1, Ordering::Relaxed),
                        };
                    }
                })
            };
            std::thread::sleep(Duration::from_millis(500));

            // The running datapath now looks like one installed by the previous
            // schema version.
            let current = loader::version_directory(&node.pin_directory, SCHEMA_VERSION);
            let older = loader::version_directory(&node.pin_directory, SCHEMA_VERSION - 1);
            std::fs::rename(&current, &older).expect("move the pins to the older version");
            std::thread::sleep(Duration::from_millis(500));

            // The new process: takes the maps over, attaches, finishes.
            let mut datapath = Datapath::load(loader::LoaderSettings {
                schema: &UNCHANGED_LAYOUT_BUMP,
                ..node.loader_settings()
            })
            .expect("load");
            for pod in &pods {
                datapath
                    .attach_interface(&pod.host_interface(), InterfaceKind::Pod)
                    .expect("attach");
            }
            datapath
                .attach_interface("ext0", InterfaceKind::Host)
                .expect("attach");
            datapath.attach_socket_hooks().expect("socket hooks");
            datapath.finish_migration().expect("finish the migration");
            assert!(!older.exists(), "the old version's pins are removed");
            for name in [
                map_names::FRONTENDS,
                map_names::BACKEND_SLOTS,
                map_names::CONNTRACK,
                map_names::AFFINITY,
                map_names::CONFIG,
                map_names::COUNTERS,
                map_names::SOCKET_REVERSE,
            ] {
                assert!(
                    current.join(name).exists(),
                    "{name} is pinned in the new version"
                );
            }
            let maps = datapath.service_maps().expect("maps");
            assert_eq!(maps.frontends().expect("frontends"), frontends_before);
            assert!(
                maps.config().expect("config").is_some(),
                "the config came along"
            );
            assert!(
                maps.live_tcp_flows().expect("live flows") >= 10,
                "the long-lived connections' conntrack entries came along"
            );

            std::thread::sleep(Duration::from_secs(2));
            stop.store(true, Ordering::Relaxed);
            load.join().expect("load");
            let reports: Vec<LongLivedReport> = connections
                .into_iter()
                .map(LongLivedConnection::close)
                .collect();
            for report in &reports {
                assert!(report.failure.is_none(), "{report:?}");
                assert!(report.requests >= 20, "{report:?}");
            }
            assert!(successes.load(Ordering::Relaxed) > 100);
            assert_eq!(
                failures.load(Ordering::Relaxed),
                0,
                "failed new connections"
            );
        },
    );
}

const LOAD_BALANCER_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 7);

/// A load-balancer frontend on port 80 with `flags`, over pod1.
fn write_load_balancer(maps: &mut loader::PinnedServiceMaps, pods: &[Pod], flags: u32) {
    let mut entry =
        ServiceEntry::cluster_ip(2, LOAD_BALANCER_IP, 80, PROTOCOL_TCP).with_backends(&[&pods[0]]);
    entry.frontends = vec![(LOAD_BALANCER_IP, 80, switchyard_common::SCOPE_EXTERNAL)];
    entry.flags = flags;
    write_service(maps, &entry);
}

fn client_range() -> switchyard_agent::maps::SourceRangeEntry {
    switchyard_agent::maps::SourceRangeEntry {
        frontend: switchyard_common::FrontendKey {
            address: switchyard_common::ipv4_mapped(LOAD_BALANCER_IP.octets()),
            port_big_endian: 80u16.to_be(),
            protocol: PROTOCOL_TCP,
            scope: switchyard_common::SCOPE_EXTERNAL,
        },
        prefix: switchyard_agent::maps::SourcePrefix {
            address: switchyard_common::ipv4_mapped(CLIENT_IP.octets()),
            length: 128,
        },
    }
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn a_pin_directory_of_the_build_before_source_ranges_is_upgraded_in_place_without_a_failed_connection(
) {
    run_isolated(
        "a_pin_directory_of_the_build_before_source_ranges_is_upgraded_in_place_without_a_failed_connection",
        |node| {
            let pods = standard_topology(3);
            start_servers(&pods[0]);
            start_servers(&pods[1]);
            let (datapath, mut maps) = start_datapath(node, &pods);
            drop(datapath);
            write_service(
                &mut maps,
                &ServiceEntry::cluster_ip(1, CLUSTER_IP, 80, PROTOCOL_TCP)
                    .with_backends(&[&pods[0], &pods[1]]),
            );
            let frontends_before = maps.frontends().expect("frontends");
            drop(maps);
            let connections: Vec<LongLivedConnection> = (0..5)
                .map(|_| {
                    LongLivedConnection::open(
                        Some("pod3"),
                        SocketAddrV4::new(CLUSTER_IP, 80),
                        Duration::from_millis(100),
                    )
                })
                .collect();

            // The pins now look like those of the build before the source range
            // maps (same schema version): the running programs keep their maps.
            let current = loader::version_directory(&node.pin_directory, SCHEMA_VERSION);
            for name in [map_names::SOURCE_RANGES, map_names::SOURCE_RANGE_DROPS] {
                std::fs::remove_file(current.join(name)).expect("unpin a source range map");
            }

            let mut datapath = Datapath::load(node.loader_settings()).expect("load");
            for pod in &pods {
                datapath
                    .attach_interface(&pod.host_interface(), InterfaceKind::Pod)
                    .expect("attach");
            }
            datapath
                .attach_interface("ext0", InterfaceKind::Host)
                .expect("attach");
            datapath.attach_socket_hooks().expect("socket hooks");
            for name in [map_names::SOURCE_RANGES, map_names::SOURCE_RANGE_DROPS] {
                assert!(current.join(name).exists(), "{name} is pinned again");
            }
            let mut maps = datapath.service_maps().expect("maps");
            assert_eq!(maps.frontends().expect("frontends"), frontends_before);
            assert!(maps.source_ranges().expect("source ranges").is_empty());

            // The new programs read the new map: a filtered frontend answers the
            // client its range holds, and drops it once the range is gone.
            maps.write_source_range(&client_range()).expect("write a range");
            assert_eq!(
                maps.source_ranges().expect("source ranges"),
                std::collections::BTreeSet::from([client_range()]),
                "a range reads back as it was written (what a restart restores)"
            );
            write_load_balancer(&mut maps, &pods, switchyard_common::FRONTEND_FLAG_SOURCE_RANGES);
            let load_balancer = SocketAddrV4::new(LOAD_BALANCER_IP, 80);
            let request = move || {
                in_namespace(Some("client"), move || {
                    tcp_request(load_balancer, Duration::from_millis(500))
                })
                .join()
                .expect("client")
            };
            request().expect("the client in the range is answered");
            maps.delete_source_range(&client_range()).expect("delete the range");
            let error = request().expect_err("the client outside the ranges is answered");
            assert_eq!(error.kind(), std::io::ErrorKind::TimedOut, "{error}");
            assert!(maps.source_range_drops().expect("drops") > 0);

            for report in connections.into_iter().map(LongLivedConnection::close) {
                assert!(report.failure.is_none(), "{report:?}");
                assert!(report.requests >= 5, "{report:?}");
            }
        },
    );
}
