//! The port filter in front of the conntrack lookups (`switchyard_common::port_filter`):
//! a process that finds no port filter pinned (the first start of an agent that
//! has one, or a schema migration) builds it from the maps before it attaches a
//! program that reads it. A Service deleted before that start is in no map but
//! conntrack, and its established connections must still be translated.

mod datapath_support;

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    time::Duration,
};

use datapath_support::*;
use switchyard_agent::{loader, maps::ServiceMaps};
use switchyard_common::{
    ipv4_mapped, map_names, BackendSlotKey, FrontendKey, PROTOCOL_TCP, SCHEMA_VERSION,
    SCOPE_INTERNAL,
};

const KEPT_CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const DELETED_CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 20);
/// Ports no other Service or backend of the test uses, so only the deleted
/// Service's conntrack entries can get them marked.
const DELETED_SERVICE_PORT: u16 = 7777;
const DELETED_BACKEND_PORT: u16 = 9797;

/// Removes the deleted Service's frontend and its one backend slot (group 2).
fn delete_the_deleted_service(maps: &mut loader::PinnedServiceMaps) {
    maps.delete_frontend(&FrontendKey {
        address: ipv4_mapped(DELETED_CLUSTER_IP.octets()),
        port_big_endian: DELETED_SERVICE_PORT.to_be(),
        protocol: PROTOCOL_TCP,
        scope: SCOPE_INTERNAL,
    })
    .expect("delete the frontend");
    maps.delete_backend_slot(&BackendSlotKey {
        group_id: 2,
        ordinal: 0,
    })
    .expect("delete the backend slot");
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn a_new_port_filter_lets_through_the_connections_of_a_service_deleted_before_the_start() {
    run_isolated(
        "a_new_port_filter_lets_through_the_connections_of_a_service_deleted_before_the_start",
        |node| {
            let pods = standard_topology(3);
            start_servers(&pods[0]);
            start_tcp_server(&pods[1], DELETED_BACKEND_PORT);
            let (datapath, mut maps) = start_datapath(node, &pods);
            drop(datapath);
            write_service(
                &mut maps,
                &ServiceEntry::cluster_ip(1, KEPT_CLUSTER_IP, 80, PROTOCOL_TCP)
                    .with_backends(&[&pods[0]]),
            );
            let mut deleted =
                ServiceEntry::cluster_ip(2, DELETED_CLUSTER_IP, DELETED_SERVICE_PORT, PROTOCOL_TCP);
            deleted.backends = vec![(pods[1].ip, DELETED_BACKEND_PORT, true)];
            write_service(&mut maps, &deleted);

            let open = |cluster_ip, port| {
                (0..5)
                    .map(|_| {
                        LongLivedConnection::open(
                            Some("pod3"),
                            SocketAddrV4::new(cluster_ip, port),
                            Duration::from_millis(100),
                        )
                    })
                    .collect::<Vec<_>>()
            };
            let to_deleted = open(DELETED_CLUSTER_IP, DELETED_SERVICE_PORT);
            let to_kept = open(KEPT_CLUSTER_IP, 80);

            // The Service goes; its connections stay in conntrack only.
            delete_the_deleted_service(&mut maps);
            drop(maps);
            std::thread::sleep(Duration::from_millis(300));

            // The next process finds no port filter: as after an upgrade from a
            // version without one. Its programs use the new filter (a new map is
            // a new program identity), and replace the running ones in place.
            let filter_pin = loader::version_directory(&node.pin_directory, SCHEMA_VERSION)
                .join(map_names::PORT_FILTER);
            std::fs::remove_file(&filter_pin).expect("remove the port filter's pin");
            let (_datapath, maps) = start_datapath(node, &pods);
            assert!(filter_pin.exists(), "a new port filter is pinned");
            assert!(
                maps.port_filter_built().expect("read the port filter"),
                "the new port filter is marked built, so the next start keeps it as it is"
            );

            std::thread::sleep(Duration::from_secs(2));
            let answers =
                tcp_requests_from(Some("pod3"), SocketAddrV4::new(KEPT_CLUSTER_IP, 80), 20);
            assert!(
                answers.iter().all(|answer| answer.is_ok()),
                "new connections to the kept Service: {answers:?}"
            );
            for (what, connections) in [("deleted", to_deleted), ("kept", to_kept)] {
                for report in connections.into_iter().map(LongLivedConnection::close) {
                    assert!(
                        report.failure.is_none(),
                        "a connection to the {what} Service failed: {report:?}"
                    );
                    assert!(
                        report.requests >= 15,
                        "a connection to the {what} Service got too few answers: {report:?}"
                    );
                }
            }
        },
    );
}

/// A pod's connection the connect hook pointed at a backend has no conntrack
/// entry: only its reverse entry (socket -> Service) names the backend's port.
/// A port filter built after its Service was deleted marks that port too, so
/// the socket's `getpeername` still finds its entry and shows the Service.
#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn a_new_port_filter_keeps_the_service_address_of_a_socket_the_connect_hook_translated() {
    run_isolated(
        "a_new_port_filter_keeps_the_service_address_of_a_socket_the_connect_hook_translated",
        |node| {
            let pods = standard_topology(2);
            start_tcp_server(&pods[0], DELETED_BACKEND_PORT);
            let (datapath, mut maps) = start_datapath(node, &pods);
            drop(datapath);
            maps.write_config(&switchyard_common::DatapathConfig {
                pod_connect_balancing: switchyard_common::POD_CONNECT_BALANCING_TCP,
                ..active_config()
            })
            .expect("write config");
            let mut deleted =
                ServiceEntry::cluster_ip(2, DELETED_CLUSTER_IP, DELETED_SERVICE_PORT, PROTOCOL_TCP);
            deleted.backends = vec![(pods[0].ip, DELETED_BACKEND_PORT, true)];
            write_service(&mut maps, &deleted);
            let service = SocketAddrV4::new(DELETED_CLUSTER_IP, DELETED_SERVICE_PORT);

            // A socket connected through the hook, kept open across the restart.
            let (connected_sender, connected) = std::sync::mpsc::channel();
            let (restarted, restarted_receiver) = std::sync::mpsc::channel::<()>();
            let client = in_namespace(Some("pod2"), move || {
                let stream =
                    std::net::TcpStream::connect_timeout(&service.into(), Duration::from_secs(2))
                        .expect("connect");
                let _ = connected_sender.send(stream.peer_addr().expect("peer before"));
                let _ = restarted_receiver.recv();
                stream.peer_addr().expect("peer after")
            });
            let before = connected.recv().expect("the client connected");
            assert_eq!(before, std::net::SocketAddr::V4(service));

            // The Service goes, then a process finds no port filter and builds one.
            delete_the_deleted_service(&mut maps);
            drop(maps);
            let filter_pin = loader::version_directory(&node.pin_directory, SCHEMA_VERSION)
                .join(map_names::PORT_FILTER);
            std::fs::remove_file(&filter_pin).expect("remove the port filter's pin");
            let (_datapath, mut maps) = start_datapath(node, &pods);
            assert!(maps.port_filter_built().expect("read the port filter"));
            maps.write_config(&switchyard_common::DatapathConfig {
                pod_connect_balancing: switchyard_common::POD_CONNECT_BALANCING_TCP,
                ..active_config()
            })
            .expect("write config");

            let _ = restarted.send(());
            let after = client.join().expect("client");
            assert_eq!(
                after,
                std::net::SocketAddr::V4(service),
                "the socket still shows the Service it connected to"
            );
        },
    );
}
