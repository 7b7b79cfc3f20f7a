//! Privileged datapath tests: Services through the real TC programs and socket
//! hooks, in a private topology (see `datapath_support`). Run by
//! `make datapath-test` (root, serially):
//! `cargo test -p switchyard-agent --test 'datapath_*' -- --ignored --test-threads=1`.

mod datapath_support;

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, SocketAddrV4},
    time::{Duration, Instant},
};

use datapath_support::*;
use switchyard_agent::maps::ServiceMaps;
use switchyard_common::{
    FRONTEND_FLAG_MASQUERADE_REMOTE, FRONTEND_FLAG_PRESERVE_CLIENT_ADDRESS,
    FRONTEND_FLAG_SESSION_AFFINITY, PROTOCOL_TCP, PROTOCOL_UDP, SCOPE_EXTERNAL, SCOPE_INTERNAL,
};

const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const SERVICE_PORT: u16 = 80;
const NODE_PORT: u16 = 30080;

fn cluster_ip_address() -> SocketAddrV4 {
    SocketAddrV4::new(CLUSTER_IP, SERVICE_PORT)
}

fn node_port_address() -> SocketAddrV4 {
    SocketAddrV4::new(NODE_IP, NODE_PORT)
}

fn backends_hit(results: &[std::io::Result<Answer>]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (index, result) in results.iter().enumerate() {
        match result {
            Ok(answer) => *counts.entry(answer.backend.clone()).or_insert(0) += 1,
            Err(error) => panic!("request {index} failed: {error}\n{}", diagnostics()),
        }
    }
    counts
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn the_test_topology_routes_between_pods_and_the_client_without_the_datapath() {
    run_isolated(
        "the_test_topology_routes_between_pods_and_the_client_without_the_datapath",
        |_node| {
            let pods = standard_topology(2);
            start_servers(&pods[0]);
            let pod_address = SocketAddrV4::new(pods[0].ip, TCP_PORT);
            for namespace in [Some("pod2"), Some("client"), None] {
                let results = tcp_requests_from(namespace, pod_address, 3);
                assert_eq!(
                    backends_hit(&results).get("pod1"),
                    Some(&3),
                    "{namespace:?}"
                );
            }
        },
    );
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn cluster_ip_and_node_port_reach_every_backend_from_pods_host_and_outside() {
    run_isolated(
        "cluster_ip_and_node_port_reach_every_backend_from_pods_host_and_outside",
        |node| {
            let pods = standard_topology(4);
            for pod in &pods[..3] {
                start_servers(pod);
            }
            let (_datapath, mut maps) = start_datapath(node, &pods);
            let backends: Vec<&Pod> = pods[..3].iter().collect();
            write_service(
                &mut maps,
                &ServiceEntry::cluster_ip(1, CLUSTER_IP, SERVICE_PORT, PROTOCOL_TCP)
                    .with_node_port(NODE_PORT)
                    .with_backends(&backends),
            );
            write_service(
                &mut maps,
                &ServiceEntry::cluster_ip(2, CLUSTER_IP, 53, PROTOCOL_UDP).with_backends(&backends),
            );

            // From a pod that is not a backend.
            let from_pod = tcp_requests_from(Some("pod4"), cluster_ip_address(), 60);
            let counts = backends_hit(&from_pod);
            assert_eq!(counts.len(), 3, "every backend gets traffic: {counts:?}");
            // The pod's connections were translated by TC (conntrack entries from
            // its address), not by the socket hooks: those act only in the node's
            // network namespace, although the pod's sockets are in their cgroup.
            let pod4 = switchyard_common::ipv4_mapped(pods[3].ip.octets());
            let from_pod4 = maps
                .conntrack_entries()
                .expect("conntrack")
                .iter()
                .filter(|(key, value)| {
                    key.source_address == pod4
                        && value.flags & switchyard_common::CONNTRACK_FLAG_REPLY == 0
                })
                .count();
            assert!(from_pod4 >= 60, "{from_pod4} conntrack entries from pod4");
            // From the node's own network namespace (socket hooks).
            let from_host = tcp_requests_from(None, cluster_ip_address(), 60);
            assert_eq!(backends_hit(&from_host).len(), 3);
            assert_eq!(
                socket_reverse_entries(&node.pin_directory),
                0,
                "the node's closed TCP sockets left no reverse entry"
            );
            // NodePort from outside, and from a pod.
            let from_outside = tcp_requests_from(Some("client"), node_port_address(), 60);
            let counts = backends_hit(&from_outside);
            assert_eq!(counts.len(), 3, "{counts:?}");
            let from_pod = tcp_requests_from(Some("pod4"), node_port_address(), 30);
            assert!(!backends_hit(&from_pod).is_empty());
            // UDP to a ClusterIP from a pod and from the host: the answer comes
            // from the Service address (reverse translation), every backend used.
            for namespace in [Some("pod4"), None] {
                let answers = in_namespace(namespace, || {
                    (0..60)
                        .map(|_| {
                            udp_request(SocketAddrV4::new(CLUSTER_IP, 53), Duration::from_secs(2))
                        })
                        .collect::<Vec<_>>()
                })
                .join()
                .expect("udp client");
                assert_eq!(backends_hit(&answers).len(), 3, "udp from {namespace:?}");
            }
            // The node's UDP sockets were connected (translated by the connect
            // hook): their entries went with them too.
            assert_eq!(
                socket_reverse_entries(&node.pin_directory),
                0,
                "the node's closed UDP sockets left no reverse entry"
            );
            let counters = maps.counters().expect("counters");
            assert!(counters.translated >= 240, "{counters:?}");
            assert_eq!(counters.error, 0, "{counters:?}");
        },
    );
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn a_pod_reaching_a_service_that_picks_itself_gets_its_answer_hairpin() {
    run_isolated(
        "a_pod_reaching_a_service_that_picks_itself_gets_its_answer_hairpin",
        |node| {
            let pods = standard_topology(1);
            start_servers(&pods[0]);
            let (_datapath, mut maps) = start_datapath(node, &pods);
            write_service(
                &mut maps,
                &ServiceEntry::cluster_ip(1, CLUSTER_IP, SERVICE_PORT, PROTOCOL_TCP)
                    .with_backends(&[&pods[0]]),
            );
            let results = tcp_requests_from(Some("pod1"), cluster_ip_address(), 20);
            for result in &results {
                let answer = result.as_ref().expect("hairpin request");
                assert_eq!(answer.backend, "pod1");
                assert_eq!(answer.seen_client.ip(), std::net::IpAddr::V4(HAIRPIN_IP));
            }
        },
    );
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn client_ip_affinity_sends_a_client_back_to_the_same_backend() {
    run_isolated(
        "client_ip_affinity_sends_a_client_back_to_the_same_backend",
        |node| {
            let pods = standard_topology(4);
            for pod in &pods[..3] {
                start_servers(pod);
            }
            let (_datapath, mut maps) = start_datapath(node, &pods);
            let mut service = ServiceEntry::cluster_ip(1, CLUSTER_IP, SERVICE_PORT, PROTOCOL_TCP)
                .with_node_port(NODE_PORT)
                .with_backends(&pods[..3].iter().collect::<Vec<_>>());
            service.flags = FRONTEND_FLAG_SESSION_AFFINITY;
            service.affinity_timeout_seconds = 10_800;
            write_service(&mut maps, &service);
            for (namespace, address) in [
                (Some("pod4"), cluster_ip_address()),
                (Some("client"), node_port_address()),
                (None, cluster_ip_address()),
            ] {
                let counts = backends_hit(&tcp_requests_from(namespace, address, 40));
                assert_eq!(
                    counts.len(),
                    1,
                    "{namespace:?} stuck to one backend: {counts:?}"
                );
            }
        },
    );
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn external_traffic_policy_local_uses_only_local_endpoints_and_keeps_the_client_ip() {
    run_isolated(
        "external_traffic_policy_local_uses_only_local_endpoints_and_keeps_the_client_ip",
        |node| {
            let pods = standard_topology(3);
            for pod in &pods {
                start_servers(pod);
            }
            let (_datapath, mut maps) = start_datapath(node, &pods);
            // Cluster-wide group: all three (pod3 stands for a remote endpoint).
            let mut cluster = ServiceEntry::cluster_ip(1, CLUSTER_IP, SERVICE_PORT, PROTOCOL_TCP)
                .with_backends(&[&pods[0], &pods[1], &pods[2]]);
            cluster.backends[2].2 = false;
            write_service(&mut maps, &cluster);
            // The external view of the NodePort: its own group, local endpoints only.
            let mut local = ServiceEntry::cluster_ip(2, NODE_IP, NODE_PORT, PROTOCOL_TCP)
                .with_backends(&[&pods[0], &pods[1]]);
            local.frontends = vec![(NODE_IP, NODE_PORT, SCOPE_EXTERNAL)];
            local.flags = FRONTEND_FLAG_PRESERVE_CLIENT_ADDRESS;
            write_service(&mut maps, &local);

            let results = tcp_requests_from(Some("client"), node_port_address(), 60);
            let counts = backends_hit(&results);
            assert_eq!(
                counts.keys().cloned().collect::<Vec<_>>(),
                vec!["pod1".to_string(), "pod2".to_string()],
                "only local endpoints: {counts:?}"
            );
            for result in &results {
                let answer = result.as_ref().expect("request");
                assert_eq!(
                    answer.seen_client.ip(),
                    std::net::IpAddr::V4(CLIENT_IP),
                    "the client IP is kept"
                );
            }
        },
    );
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn removing_a_backend_moves_only_new_flows() {
    run_isolated("removing_a_backend_moves_only_new_flows", |node| {
        let pods = standard_topology(3);
        for pod in &pods[..2] {
            start_servers(pod);
        }
        let (_datapath, mut maps) = start_datapath(node, &pods);
        let both = ServiceEntry::cluster_ip(1, CLUSTER_IP, SERVICE_PORT, PROTOCOL_TCP)
            .with_backends(&[&pods[0], &pods[1]]);
        write_service(&mut maps, &both);
        // Long-lived connections until both backends hold some.
        let mut connections = Vec::new();
        for _ in 0..20 {
            connections.push(LongLivedConnection::open(
                Some("pod3"),
                cluster_ip_address(),
                Duration::from_millis(100),
            ));
        }
        std::thread::sleep(Duration::from_millis(300));
        // pod2 leaves the Service (terminating: existing flows continue).
        write_service(
            &mut maps,
            &ServiceEntry::cluster_ip(1, CLUSTER_IP, SERVICE_PORT, PROTOCOL_TCP)
                .with_backends(&[&pods[0]]),
        );
        let new_flows = backends_hit(&tcp_requests_from(Some("pod3"), cluster_ip_address(), 40));
        assert_eq!(
            new_flows.keys().collect::<Vec<_>>(),
            vec!["pod1"],
            "{new_flows:?}"
        );
        std::thread::sleep(Duration::from_secs(1));
        let reports: Vec<LongLivedReport> = connections
            .into_iter()
            .map(LongLivedConnection::close)
            .collect();
        let on_pod2 = reports
            .iter()
            .filter(|report| report.backends == ["pod2"])
            .count();
        assert!(on_pod2 > 0, "some connections were on pod2: {reports:?}");
        for report in &reports {
            assert!(report.failure.is_none(), "{report:?}");
            assert_eq!(
                report.backends.len(),
                1,
                "a flow kept its backend: {report:?}"
            );
            assert!(report.requests >= 10, "{report:?}");
        }
    });
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn a_service_without_endpoints_refuses_within_100_milliseconds() {
    run_isolated(
        "a_service_without_endpoints_refuses_within_100_milliseconds",
        |node| {
            let pods = standard_topology(1);
            let (_datapath, mut maps) = start_datapath(node, &pods);
            write_service(
                &mut maps,
                &ServiceEntry::cluster_ip(1, CLUSTER_IP, SERVICE_PORT, PROTOCOL_TCP)
                    .with_node_port(NODE_PORT),
            );
            write_service(
                &mut maps,
                &ServiceEntry::cluster_ip(2, CLUSTER_IP, 53, PROTOCOL_UDP),
            );
            for (namespace, address) in [
                (Some("pod1"), cluster_ip_address()),
                (Some("client"), node_port_address()),
                (None, cluster_ip_address()),
            ] {
                let elapsed = in_namespace(namespace, move || {
                    let started = Instant::now();
                    let result = std::net::TcpStream::connect_timeout(
                        &address.into(),
                        Duration::from_secs(3),
                    );
                    (
                        started.elapsed(),
                        result.map(|_| ()).map_err(|error| error.kind()),
                    )
                })
                .join()
                .expect("client");
                assert!(elapsed.1.is_err(), "{namespace:?}: connected to nothing?");
                assert_ne!(
                    elapsed.1,
                    Err(std::io::ErrorKind::TimedOut),
                    "{namespace:?}: the client hung"
                );
                assert!(
                    elapsed.0 < Duration::from_millis(100),
                    "{namespace:?}: refused after {:?}",
                    elapsed.0
                );
            }
            // UDP: the ICMP error reaches the client's next call.
            let udp = in_namespace(Some("pod1"), || {
                udp_request(
                    SocketAddrV4::new(CLUSTER_IP, 53),
                    Duration::from_millis(500),
                )
                .map_err(|error| error.kind())
            })
            .join()
            .expect("udp client");
            assert_eq!(udp, Err(std::io::ErrorKind::ConnectionRefused));
            let counters = maps.counters().expect("counters");
            assert!(counters.no_backend >= 3, "{counters:?}");
            // The Service gets an endpoint: it answers at once.
            let pods_with_server = &pods[..1];
            start_servers(&pods_with_server[0]);
            write_service(
                &mut maps,
                &ServiceEntry::cluster_ip(1, CLUSTER_IP, SERVICE_PORT, PROTOCOL_TCP)
                    .with_backends(&[&pods_with_server[0]]),
            );
            let results = tcp_requests_from(Some("pod1"), cluster_ip_address(), 5);
            assert_eq!(backends_hit(&results).len(), 1);
        },
    );
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn external_and_load_balancer_ips_reach_backends_from_outside_and_from_pods() {
    run_isolated(
        "external_and_load_balancer_ips_reach_backends_from_outside_and_from_pods",
        |node| {
            let pods = standard_topology(2);
            start_servers(&pods[0]);
            let (_datapath, mut maps) = start_datapath(node, &pods);
            let external_ip = Ipv4Addr::new(203, 0, 113, 10);
            let mut service = ServiceEntry::cluster_ip(1, CLUSTER_IP, SERVICE_PORT, PROTOCOL_TCP)
                .with_backends(&[&pods[0]]);
            service
                .frontends
                .push((external_ip, SERVICE_PORT, SCOPE_INTERNAL));
            service
                .frontends
                .push((external_ip, SERVICE_PORT, SCOPE_EXTERNAL));
            write_service(&mut maps, &service);
            // The client's default route is the node, as a router's would be.
            let address = SocketAddrV4::new(external_ip, SERVICE_PORT);
            for namespace in [Some("client"), Some("pod2")] {
                let results = tcp_requests_from(namespace, address, 10);
                assert_eq!(
                    backends_hit(&results).get("pod1"),
                    Some(&10),
                    "{namespace:?}"
                );
            }
        },
    );
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn node_port_traffic_to_a_remote_backend_is_marked_for_masquerade_and_comes_back() {
    run_isolated(
        "node_port_traffic_to_a_remote_backend_is_marked_for_masquerade_and_comes_back",
        |node| {
            let pods = standard_topology(2);
            start_servers(&pods[0]);
            start_servers(&pods[1]);
            // The agent's masquerade rule (the standalone agent installs its own
            // SWITCHYARD-POSTROUTING chain; this is the same match).
            sh(&format!(
                "iptables -t nat -A POSTROUTING -m mark --mark {MASQUERADE_MARK:#x}/{MASQUERADE_MARK:#x} -j MASQUERADE"
            ));
            let (_datapath, mut maps) = start_datapath(node, &pods);
            // pod1 stands for an endpoint on another node (no LOCAL flag).
            let mut remote = ServiceEntry::cluster_ip(1, CLUSTER_IP, SERVICE_PORT, PROTOCOL_TCP)
                .with_node_port(NODE_PORT)
                .with_backends(&[&pods[0]]);
            remote.backends[0].2 = false;
            remote.flags = FRONTEND_FLAG_MASQUERADE_REMOTE;
            write_service(&mut maps, &remote);
            let results = tcp_requests_from(Some("client"), node_port_address(), 10);
            for result in &results {
                let answer = result.as_ref().expect("request");
                assert_eq!(answer.backend, "pod1");
                assert_eq!(
                    answer.seen_client.ip(),
                    std::net::IpAddr::V4(NODE_IP),
                    "the backend saw the node's address, so its reply comes back here"
                );
            }
            // A local backend is never masqueraded: the client address is kept.
            let local = ServiceEntry::cluster_ip(2, NODE_IP, NODE_PORT + 1, PROTOCOL_TCP)
                .with_node_port(NODE_PORT + 1)
                .with_backends(&[&pods[1]]);
            let mut local = local;
            local.frontends.retain(|frontend| frontend.0 == NODE_IP);
            local.flags = FRONTEND_FLAG_MASQUERADE_REMOTE;
            write_service(&mut maps, &local);
            let results =
                tcp_requests_from(Some("client"), SocketAddrV4::new(NODE_IP, NODE_PORT + 1), 5);
            for result in &results {
                let answer = result.as_ref().expect("request");
                assert_eq!(answer.seen_client.ip(), std::net::IpAddr::V4(CLIENT_IP));
            }
        },
    );
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn a_udp_flow_keeps_its_backend_until_its_idle_timeout_then_chooses_again() {
    run_isolated(
        "a_udp_flow_keeps_its_backend_until_its_idle_timeout_then_chooses_again",
        |node| {
            let pods = standard_topology(3);
            start_servers(&pods[0]);
            start_servers(&pods[1]);
            let (_datapath, mut maps) = start_datapath(node, &pods);
            let mut config = active_config();
            config.udp_idle_timeout_seconds = 2;
            maps.write_config(&config).expect("config");
            write_service(
                &mut maps,
                &ServiceEntry::cluster_ip(1, CLUSTER_IP, 53, PROTOCOL_UDP)
                    .with_backends(&[&pods[0]]),
            );
            let (sender, receiver) = std::sync::mpsc::channel::<Duration>();
            let (answer_sender, answers) = std::sync::mpsc::channel::<String>();
            let client = in_namespace(Some("pod3"), move || {
                let socket = std::net::UdpSocket::bind("0.0.0.0:0").expect("bind");
                socket
                    .set_read_timeout(Some(Duration::from_secs(2)))
                    .expect("timeout");
                socket
                    .connect(SocketAddrV4::new(CLUSTER_IP, 53))
                    .expect("connect");
                // One datagram per instruction; the pause comes first.
                while let Ok(pause) = receiver.recv() {
                    std::thread::sleep(pause);
                    socket.send(b"hello").expect("send");
                    let mut buffer = [0u8; 1500];
                    let length = socket.recv(&mut buffer).expect("answer");
                    let text = String::from_utf8_lossy(&buffer[..length]).into_owned();
                    let backend = text.split(' ').next().unwrap_or_default().to_string();
                    answer_sender.send(backend).expect("report");
                }
            });
            let ask = |pause: Duration| {
                sender.send(pause).expect("instruct");
                answers.recv().expect("answer")
            };
            assert_eq!(ask(Duration::ZERO), "pod1");
            // pod1 leaves the Service; the flow is established and keeps it.
            write_service(
                &mut maps,
                &ServiceEntry::cluster_ip(1, CLUSTER_IP, 53, PROTOCOL_UDP)
                    .with_backends(&[&pods[1]]),
            );
            for _ in 0..5 {
                assert_eq!(ask(Duration::from_millis(300)), "pod1");
            }
            // Idle past the timeout: the next datagram is a new flow.
            assert_eq!(ask(Duration::from_millis(2500)), "pod2");
            drop(sender);
            client.join().expect("client");
        },
    );
}

/// Client-direction conntrack entries from `pod` (flows the TC programs translated).
fn tc_flows_from(
    maps: &switchyard_agent::loader::PinnedServiceMaps,
    pod: &Pod,
    protocol: u8,
) -> usize {
    let address = switchyard_common::ipv4_mapped(pod.ip.octets());
    maps.conntrack_entries()
        .expect("conntrack")
        .iter()
        .filter(|(key, value)| {
            key.source_address == address
                && key.protocol == protocol
                && value.flags & switchyard_common::CONNTRACK_FLAG_REPLY == 0
        })
        .count()
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn a_pods_tcp_connect_goes_straight_to_a_backend_while_udp_affinity_and_refusals_stay_with_tc() {
    run_isolated(
        "a_pods_tcp_connect_goes_straight_to_a_backend_while_udp_affinity_and_refusals_stay_with_tc",
        |node| {
            let pods = standard_topology(4);
            for pod in &pods[..3] {
                start_servers(pod);
            }
            let (_datapath, mut maps) = start_datapath(node, &pods);
            maps.write_config(&switchyard_common::DatapathConfig {
                pod_connect_balancing: switchyard_common::POD_CONNECT_BALANCING_TCP,
                ..active_config()
            })
            .expect("write config");
            let backends: Vec<&Pod> = pods[..3].iter().collect();
            write_service(
                &mut maps,
                &ServiceEntry::cluster_ip(1, CLUSTER_IP, SERVICE_PORT, PROTOCOL_TCP)
                    .with_backends(&backends),
            );
            write_service(
                &mut maps,
                &ServiceEntry::cluster_ip(2, CLUSTER_IP, 53, PROTOCOL_UDP).with_backends(&backends),
            );
            let mut sticky = ServiceEntry::cluster_ip(3, CLUSTER_IP, 81, PROTOCOL_TCP)
                .with_backends(&backends);
            sticky.flags = FRONTEND_FLAG_SESSION_AFFINITY;
            sticky.affinity_timeout_seconds = 10_800;
            write_service(&mut maps, &sticky);
            write_service(
                &mut maps,
                &ServiceEntry::cluster_ip(4, CLUSTER_IP, 82, PROTOCOL_TCP),
            );
            let pod4 = &pods[3];

            // TCP: every backend, the pod's own address seen, no conntrack entry
            // (the socket itself is connected to the backend), and the application
            // still sees the Service address as its peer, through a reverse entry
            // that lives exactly as long as the socket.
            let counts = backends_hit(&tcp_requests_from(Some("pod4"), cluster_ip_address(), 60));
            assert_eq!(counts.len(), 3, "every backend gets traffic: {counts:?}");
            assert_eq!(tc_flows_from(&maps, pod4, PROTOCOL_TCP), 0, "TC translated none");
            assert_eq!(
                socket_reverse_entries(&node.pin_directory),
                0,
                "the 60 closed sockets left no reverse entry"
            );
            let pin_directory = node.pin_directory.clone();
            let (peer, entries_while_open) = in_namespace(Some("pod4"), move || {
                let stream = std::net::TcpStream::connect_timeout(
                    &cluster_ip_address().into(),
                    Duration::from_secs(2),
                )
                .expect("connect");
                let peer = stream.peer_addr().expect("peer");
                (peer, socket_reverse_entries(&pin_directory))
            })
            .join()
            .expect("client");
            assert_eq!(peer, std::net::SocketAddr::V4(cluster_ip_address()));
            assert_eq!(entries_while_open, 1, "the open socket's reverse entry");
            assert_eq!(
                socket_reverse_entries(&node.pin_directory),
                0,
                "removed when the socket closed"
            );
            let seen = tcp_requests_from(Some("pod4"), cluster_ip_address(), 1)
                .pop()
                .expect("one answer")
                .expect("answered");
            assert_eq!(seen.seen_client.ip(), std::net::IpAddr::V4(pod4.ip));

            // UDP: per packet, by TC, answered from the Service address.
            let answers = in_namespace(Some("pod4"), || {
                (0..30)
                    .map(|_| udp_request(SocketAddrV4::new(CLUSTER_IP, 53), Duration::from_secs(2)))
                    .collect::<Vec<_>>()
            })
            .join()
            .expect("udp client");
            assert_eq!(backends_hit(&answers).len(), 3);
            assert!(tc_flows_from(&maps, pod4, PROTOCOL_UDP) >= 1, "UDP went through TC");

            // Session affinity: TC, keyed by the pod's address, one backend.
            let sticky_address = SocketAddrV4::new(CLUSTER_IP, 81);
            let counts = backends_hit(&tcp_requests_from(Some("pod4"), sticky_address, 30));
            assert_eq!(counts.len(), 1, "stuck to one backend: {counts:?}");
            assert!(tc_flows_from(&maps, pod4, PROTOCOL_TCP) >= 30, "affinity went through TC");

            // No endpoints: refused as by TC (ICMP, "connection refused"), not
            // failed with the hook's EPERM.
            let refused = in_namespace(Some("pod4"), || {
                std::net::TcpStream::connect_timeout(
                    &SocketAddrV4::new(CLUSTER_IP, 82).into(),
                    Duration::from_secs(3),
                )
                .map(|_| ())
                .map_err(|error| error.kind())
            })
            .join()
            .expect("client");
            assert_eq!(refused, Err(std::io::ErrorKind::ConnectionRefused));

            // Switched off: the pod's TCP goes through TC again.
            maps.write_config(&active_config()).expect("write config");
            let before = tc_flows_from(&maps, pod4, PROTOCOL_TCP);
            let counts = backends_hit(&tcp_requests_from(Some("pod4"), cluster_ip_address(), 30));
            assert_eq!(counts.len(), 3, "{counts:?}");
            assert!(
                tc_flows_from(&maps, pod4, PROTOCOL_TCP) >= before + 30,
                "TC translated the pod's connections once the hook left them alone"
            );
            let counters = maps.counters().expect("counters");
            assert_eq!(counters.error, 0, "{counters:?}");
        },
    );
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn a_connection_to_a_pod_ip_from_the_port_of_a_closed_translated_flow_is_left_alone() {
    run_isolated(
        "a_connection_to_a_pod_ip_from_the_port_of_a_closed_translated_flow_is_left_alone",
        |node| {
            let pods = standard_topology(2);
            start_servers(&pods[0]);
            let (_datapath, mut maps) = start_datapath(node, &pods);
            write_service(
                &mut maps,
                &ServiceEntry::cluster_ip(1, CLUSTER_IP, SERVICE_PORT, PROTOCOL_TCP)
                    .with_backends(&[&pods[0]]),
            );
            let pod_address = SocketAddrV4::new(pods[0].ip, TCP_PORT);
            let source_ports: Vec<u16> = (41_000..41_008).collect();
            // Translated flows from these ports, closed: their conntrack entries
            // live on for the closing timeout (10 s), so that their teardown is
            // translated.
            let ports = source_ports.clone();
            let translated = in_namespace(Some("pod2"), move || {
                ports
                    .iter()
                    .map(|port| {
                        tcp_request_from_port(*port, cluster_ip_address(), Duration::from_secs(2))
                    })
                    .collect::<Vec<_>>()
            })
            .join()
            .expect("client");
            assert_eq!(backends_hit(&translated).get("pod1"), Some(&8));
            // New connections from the same ports straight to the backend's pod
            // IP (as an application, or the connect hook, makes them): the same
            // tuple at the backend as the closed flows had. Their answers must not
            // be taken for the closed flows' and rewritten to the Service address.
            let ports = source_ports.clone();
            let direct = in_namespace(Some("pod2"), move || {
                ports
                    .iter()
                    // 3 s: a SYN meeting the closed flow's TIME_WAIT at the backend may be
                    // answered only by its retransmission, 1 s later (seen once on a busy CI).
                    .map(|port| tcp_request_from_port(*port, pod_address, Duration::from_secs(3)))
                    .collect::<Vec<_>>()
            })
            .join()
            .expect("client");
            assert_eq!(
                backends_hit(&direct).get("pod1"),
                Some(&8),
                "{}",
                diagnostics()
            );
            // The same through the connect hook, which takes only sockets not yet
            // bound (a bound one goes to TC), so the kernel chooses the port after
            // the hook: a pod namespace with one ephemeral port makes that the
            // port of a closed translated flow.
            // (Both connects pick their port the same way: a port taken by an
            // explicit bind stays off limits to connect's choice while its
            // TIME_WAIT lasts.)
            let hook_port: u16 = 41_100;
            sh(&format!(
                "ip netns exec pod2 sysctl -qw net.ipv4.ip_local_port_range='{hook_port} {hook_port}'"
            ));
            let closed = in_namespace(Some("pod2"), || {
                tcp_request(cluster_ip_address(), Duration::from_secs(2))
            })
            .join()
            .expect("client");
            assert_eq!(
                closed
                    .map(|answer| answer.seen_client.port())
                    .map_err(|error| error.kind()),
                Ok(hook_port),
                "a translated flow from the one port"
            );
            maps.write_config(&switchyard_common::DatapathConfig {
                pod_connect_balancing: switchyard_common::POD_CONNECT_BALANCING_TCP,
                ..active_config()
            })
            .expect("write config");
            let misses_before = maps.counters().expect("counters").conntrack_miss;
            let through_hook = in_namespace(Some("pod2"), || {
                tcp_request(cluster_ip_address(), Duration::from_secs(1))
            })
            .join()
            .expect("client");
            assert_eq!(
                through_hook
                    .map(|answer| answer.seen_client.port())
                    .map_err(|error| error.kind()),
                Ok(hook_port),
                "{}",
                diagnostics()
            );
            // Through the hook, not TC: no packet to a frontend went by.
            assert_eq!(
                maps.counters().expect("counters").conntrack_miss,
                misses_before,
                "the TC programs opened a flow the connect hook should have taken"
            );
        },
    );
}
