//! Privileged datapath tests for the requests `make bench` saw go unanswered
//! (issue 7): two flows from the same client address and port to two different
//! Services that pick the same backend look identical from the backend's side
//! (same address and port at both ends), so their reply entries collide. The
//! client's kernel only keeps (source port, Service) unique, not (source port,
//! backend), so this happens with sequential reuse of a source port (UDP, DNS
//! style) and with concurrent connections sharing one (TCP connect shares
//! ephemeral ports across destinations). Netfilter's NAT avoids it by giving the
//! second flow another source port; so must we.
//!
//! Run by `make datapath-test` (root, serially), like the other `datapath_*.rs`.

mod datapath_support;

use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::{Ipv4Addr, SocketAddrV4, TcpStream, UdpSocket},
    time::Duration,
};

use datapath_support::*;
use switchyard_agent::maps::ServiceMaps as _;
use switchyard_common::{PROTOCOL_TCP, PROTOCOL_UDP};

const SERVICE_IPS: [Ipv4Addr; 4] = [
    Ipv4Addr::new(10, 96, 0, 10),
    Ipv4Addr::new(10, 96, 0, 11),
    Ipv4Addr::new(10, 96, 0, 12),
    Ipv4Addr::new(10, 96, 0, 13),
];
const TCP_SERVICE_PORT: u16 = 80;
const UDP_SERVICE_PORT: u16 = 53;
/// How long a connect, and then an answer, may take.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(900);

/// Writes one Service per address in `SERVICE_IPS`, all with the same backends.
fn services_sharing_backends(
    maps: &mut switchyard_agent::loader::PinnedServiceMaps,
    protocol: u8,
    backends: &[&Pod],
) {
    let port = if protocol == PROTOCOL_UDP {
        UDP_SERVICE_PORT
    } else {
        TCP_SERVICE_PORT
    };
    for (index, ip) in SERVICE_IPS.iter().enumerate() {
        write_service(
            maps,
            &ServiceEntry::cluster_ip(index as u32 + 1, *ip, port, protocol)
                .with_backends(backends),
        );
    }
}

fn exchange(stream: &mut TcpStream) -> std::io::Result<String> {
    stream.write_all(b"hello\n")?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line)?;
    if line.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "closed without an answer",
        ));
    }
    Ok(line.trim().to_string())
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn short_udp_exchanges_reusing_few_source_ports_across_services_all_get_answers() {
    run_isolated(
        "short_udp_exchanges_reusing_few_source_ports_across_services_all_get_answers",
        |node| {
            let pods = standard_topology(3);
            start_servers(&pods[0]);
            start_servers(&pods[1]);
            let (_datapath, mut maps) = start_datapath(node, &pods);
            services_sharing_backends(&mut maps, PROTOCOL_UDP, &[&pods[0], &pods[1]]);
            // Sixteen source ports for the client pod: each port soon comes back,
            // to another Service, as it does at a few thousand requests per second
            // over the usual 28,000 ephemeral ports.
            sh("ip netns exec pod3 sysctl -qw net.ipv4.ip_local_port_range='40000 40015'");
            let failures = in_namespace(Some("pod3"), || {
                let mut failures = Vec::new();
                let mut seed = 0x2545_f491_u32;
                for request in 0..600 {
                    seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    let service = SERVICE_IPS[(seed >> 24) as usize % SERVICE_IPS.len()];
                    let target = SocketAddrV4::new(service, UDP_SERVICE_PORT);
                    // A connected socket takes only datagrams from the Service
                    // address: an answer whose reply was not translated back to
                    // this Service is lost, as it is for a DNS client.
                    if let Err(error) = udp_request(target, Duration::from_millis(300)) {
                        failures.push(format!("request {request} to {target}: {error}"));
                    }
                }
                failures
            })
            .join()
            .expect("udp client");
            assert!(
                failures.is_empty(),
                "{} of 600 UDP requests unanswered, first ones: {:?}\n{:?}\n{}",
                failures.len(),
                &failures[..failures.len().min(5)],
                maps.counters(),
                diagnostics()
            );
        },
    );
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn one_udp_socket_asking_two_services_with_the_same_backend_gets_each_answer_from_its_service() {
    run_isolated(
        "one_udp_socket_asking_two_services_with_the_same_backend_gets_each_answer_from_its_service",
        |node| {
            let pods = standard_topology(2);
            start_servers(&pods[0]);
            let (_datapath, mut maps) = start_datapath(node, &pods);
            services_sharing_backends(&mut maps, PROTOCOL_UDP, &[&pods[0]]);
            let answers = in_namespace(Some("pod2"), || {
                // One unconnected socket asking two Services at once, as musl's
                // resolver asks every name server from one socket.
                let socket = UdpSocket::bind("0.0.0.0:0").expect("bind");
                socket
                    .set_read_timeout(Some(Duration::from_millis(500)))
                    .expect("timeout");
                let mut answers = Vec::new();
                for round in 0..20 {
                    for service in &SERVICE_IPS[..2] {
                        socket
                            .send_to(b"hello", SocketAddrV4::new(*service, UDP_SERVICE_PORT))
                            .expect("send");
                    }
                    let mut from = Vec::new();
                    for _ in 0..2 {
                        let mut buffer = [0u8; 1500];
                        match socket.recv_from(&mut buffer) {
                            Ok((_, peer)) => from.push(peer.to_string()),
                            Err(error) => from.push(format!("round {round}: {error}")),
                        }
                    }
                    from.sort();
                    answers.push(from);
                }
                answers
            })
            .join()
            .expect("udp client");
            let expected = vec![
                format!("{}:{UDP_SERVICE_PORT}", SERVICE_IPS[0]),
                format!("{}:{UDP_SERVICE_PORT}", SERVICE_IPS[1]),
            ];
            for (round, from) in answers.iter().enumerate() {
                assert_eq!(
                    from,
                    &expected,
                    "round {round}: each answer comes from the Service asked\n{:?}\n{}",
                    maps.counters(),
                    diagnostics()
                );
            }
        },
    );
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn concurrent_tcp_connections_sharing_a_source_port_to_services_with_the_same_backend_both_work() {
    run_isolated(
        "concurrent_tcp_connections_sharing_a_source_port_to_services_with_the_same_backend_both_work",
        |node| {
            let pods = standard_topology(2);
            start_servers(&pods[0]);
            let (_datapath, mut maps) = start_datapath(node, &pods);
            services_sharing_backends(&mut maps, PROTOCOL_TCP, &[&pods[0]]);
            // With pods' TCP through the TC programs, and with the connect hook on
            // (which leaves a socket bound to its port to TC: pointed at the
            // backend itself, the second connect would find its tuple taken).
            let hook = switchyard_common::DatapathConfig {
                pod_connect_balancing: switchyard_common::POD_CONNECT_BALANCING_TCP,
                ..active_config()
            };
            for (first_port, config) in [(41_000, active_config()), (41_100, hook)] {
                maps.write_config(&config).expect("write config");
                let failed = in_namespace(Some("pod2"), move || {
                    two_connections_per_port(first_port)
                })
                .join()
                .expect("tcp client");
                assert!(
                    failed.is_empty(),
                    "failed rounds with pod_connect_balancing {}: {failed:?}\n{:?}\n{}",
                    config.pod_connect_balancing,
                    maps.counters(),
                    diagnostics()
                );
            }
        },
    );
}

/// Ten rounds, each from its own local port from `first_port` on: a connection
/// to the first Service, then one to the second (the same backend) from the
/// same port, and a request on each. Returns the rounds that failed, and how.
fn two_connections_per_port(first_port: u16) -> Vec<String> {
    let first_target = SocketAddrV4::new(SERVICE_IPS[0], TCP_SERVICE_PORT);
    let second_target = SocketAddrV4::new(SERVICE_IPS[1], TCP_SERVICE_PORT);
    let step = |name: &'static str| {
        move |error: std::io::Error| std::io::Error::new(error.kind(), format!("{name}: {error}"))
    };
    let mut failed = Vec::new();
    for port in first_port..first_port + 10 {
        let result = (|| -> std::io::Result<()> {
            let mut first = connect_from_port(port, first_target, CONNECT_TIMEOUT)
                .map_err(step("first connect"))?;
            exchange(&mut first).map_err(step("first request"))?;
            // Same client address and port, another Service, the same backend:
            // to the backend this must look like another connection, not a SYN
            // inside the first one.
            let mut second = connect_from_port(port, second_target, CONNECT_TIMEOUT)
                .map_err(step("second connect"))?;
            exchange(&mut second).map_err(step("second request"))?;
            exchange(&mut first).map_err(step("first connection's second request"))?;
            exchange(&mut second).map_err(step("second connection's second request"))?;
            Ok(())
        })();
        if let Err(error) = result {
            failed.push(format!("port {port}: {error}"));
        }
    }
    failed
}
