//! The disruption signals the agent reports (issue 28), end to end: the real binary
//! (`switchyard-agent standalone`, which logs each published report as the DataplaneNode status
//! would carry it) on the test topology, and real traffic that the datapath drops or refuses:
//! a client outside a load balancer's source ranges, a lone IP fragment, and new flows to a
//! Service without endpoints and to a `Local` Service whose only endpoint is on another node.
//! The control: served traffic first, reported as zero on every signal.

mod datapath_support;

use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::{Ipv4Addr, SocketAddrV4, TcpStream},
    os::fd::FromRawFd as _,
    time::Duration,
};

use datapath_support::*;

const NODE_NAME: &str = "node-a";
const OTHER_NODE: &str = "node-b";
const LOAD_BALANCER_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 7);
const FILTERED_CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 40);
/// A Service without any endpoint.
const DOWN_CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 41);
/// `internalTrafficPolicy: Local`, its only endpoint on another node.
const LOCAL_CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 42);
/// The outside client's second address, outside the ranges.
const OTHER_CLIENT_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 3);
/// How long a published report may take: a sample every 5 s, a change published at most every
/// 10 s, unchanged figures every 30 s, with room for a busy machine.
const REPORT_DEADLINE: Duration = Duration::from_secs(60);

fn write_manifests(node: &Node, serving: &Pod, remote: &Pod) {
    let manifests = format!(
        "apiVersion: v1
kind: Service
metadata: {{name: web, namespace: default}}
spec:
  type: LoadBalancer
  clusterIP: {FILTERED_CLUSTER_IP}
  loadBalancerSourceRanges: ['{CLIENT_IP}/32']
  ports: [{{name: http, port: 80, targetPort: 8080, nodePort: 30040, protocol: TCP}}]
status:
  loadBalancer:
    ingress: [{{ip: {LOAD_BALANCER_IP}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: web-1, namespace: default, labels: {{kubernetes.io/service-name: web}}}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints:
- {{addresses: [{serving}], nodeName: {NODE_NAME}}}
---
apiVersion: v1
kind: Service
metadata: {{name: down, namespace: default}}
spec:
  clusterIP: {DOWN_CLUSTER_IP}
  ports: [{{name: http, port: 80, targetPort: 8080, protocol: TCP}}]
---
apiVersion: v1
kind: Service
metadata: {{name: local, namespace: default}}
spec:
  clusterIP: {LOCAL_CLUSTER_IP}
  internalTrafficPolicy: Local
  ports: [{{name: http, port: 80, targetPort: 8080, protocol: TCP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: local-1, namespace: default, labels: {{kubernetes.io/service-name: local}}}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints:
- {{addresses: [{remote}], nodeName: {OTHER_NODE}}}
",
        serving = serving.ip,
        remote = remote.ip,
    );
    publish_manifests(node, &manifests);
}

/// One request over TCP from `source` (bound first) to `target`, from the outside client.
fn from_client(
    source: Ipv4Addr,
    target: SocketAddrV4,
    timeout: Duration,
) -> std::io::Result<Answer> {
    in_namespace(Some("client"), move || {
        let address = |ip: Ipv4Addr, port: u16| libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(ip).to_be(),
            },
            sin_zero: [0; 8],
        };
        let length = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: plain system calls on a descriptor handed to `TcpStream` at once, which
        // closes it.
        let mut stream = unsafe {
            let descriptor = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            if descriptor < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let stream = TcpStream::from_raw_fd(descriptor);
            let local = address(source, 0);
            if libc::bind(
                descriptor,
                (&local as *const libc::sockaddr_in).cast(),
                length,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // A blocking connect cut off by the send timeout (Linux applies SO_SNDTIMEO to
            // connect).
            stream.set_write_timeout(Some(timeout))?;
            let remote = address(*target.ip(), target.port());
            if libc::connect(
                descriptor,
                (&remote as *const libc::sockaddr_in).cast(),
                length,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            stream
        };
        stream.set_read_timeout(Some(timeout))?;
        stream.write_all(b"hello\n")?;
        let mut line = String::new();
        BufReader::new(&mut stream).read_line(&mut line)?;
        parse_answer(&line)
    })
    .join()
    .expect("client thread")
}

/// A pod's connect that the datapath must refuse at once (ICMP port unreachable).
fn assert_refused(what: &str, target: SocketAddrV4) {
    let result = in_namespace(Some("pod2"), move || {
        tcp_request(target, Duration::from_secs(2))
    })
    .join()
    .expect("pod thread");
    match result {
        Ok(answer) => panic!("{what}: answered by {}", answer.backend),
        Err(error) => assert_eq!(
            error.kind(),
            std::io::ErrorKind::ConnectionRefused,
            "{what}: {error}"
        ),
    }
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn the_reported_disruption_signals_count_source_range_drops_lone_fragments_and_refusals_by_cause() {
    run_isolated(
        "the_reported_disruption_signals_count_source_range_drops_lone_fragments_and_refusals_by_cause",
        |node| {
            let pods = standard_topology(2);
            start_servers(&pods[0]);
            sh(&format!("ip -n client addr add {OTHER_CLIENT_IP}/24 dev eth0"));
            write_manifests(node, &pods[0], &pods[1]);
            let mut agent = node.start_standalone_agent(NODE_NAME, "agent.log");
            let load_balancer = SocketAddrV4::new(LOAD_BALANCER_IP, 80);
            let served = wait_until(Duration::from_secs(20), || {
                from_client(CLIENT_IP, load_balancer, Duration::from_millis(300)).is_ok()
            });
            assert!(served, "the allowed client was never answered:\n{}", agent_log(node));

            // The control: served traffic (the allowed client, a pod through the ClusterIP)
            // moves no signal. Waits for a window that ends after it.
            for _ in 0..5 {
                from_client(CLIENT_IP, load_balancer, Duration::from_secs(2))
                    .expect("the allowed client is answered");
            }
            in_namespace(Some("pod2"), move || {
                tcp_request(SocketAddrV4::new(FILTERED_CLUSTER_IP, 80), Duration::from_secs(2))
            })
            .join()
            .expect("pod thread")
            .expect("the pod reaches the ClusterIP");
            let served_until = chrono::Utc::now().timestamp();
            let control = wait_for_window(node, REPORT_DEADLINE, "covering the served traffic", |window| {
                window.end.timestamp() > served_until
            });
            assert_eq!(control.expected.source_range_drops, Some(0), "{control:#?}");
            assert_eq!(control.datapath.fragments_without_first, Some(0), "{control:#?}");
            assert_eq!(control.expected.refused_without_ready_endpoints, Some(0), "{control:#?}");
            assert_eq!(
                control.datapath.refused_with_endpoints_ready_elsewhere,
                Some(0),
                "{control:#?}"
            );
            assert_eq!(control.datapath.translation_errors, Some(0), "{control:#?}");

            // The other address of the same client: dropped by the source ranges.
            let dropped = from_client(OTHER_CLIENT_IP, load_balancer, Duration::from_secs(1));
            assert!(dropped.is_err(), "the client outside the ranges was answered");
            // A later fragment whose first never came.
            send_a_later_fragment_alone(NODE_IP);
            // A Service without endpoints, and a Local one whose endpoint is elsewhere.
            assert_refused("the Service without endpoints", SocketAddrV4::new(DOWN_CLUSTER_IP, 80));
            assert_refused(
                "the Local Service with its endpoint elsewhere",
                SocketAddrV4::new(LOCAL_CLUSTER_IP, 80),
            );

            let moved = wait_for_window(node, REPORT_DEADLINE, "with the drops and refusals", |window| {
                window.expected.source_range_drops.unwrap_or(0) >= 1
                    && window.datapath.fragments_without_first == Some(1)
                    && window.expected.refused_without_ready_endpoints == Some(1)
                    && window.datapath.refused_with_endpoints_ready_elsewhere == Some(1)
            });
            println!("reported after the faults: {moved:#?}");
            assert_eq!(moved.datapath.translation_errors, Some(0), "{moved:#?}");
            let _ = agent.kill();
            let _ = agent.wait();
        },
    );
}
