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
