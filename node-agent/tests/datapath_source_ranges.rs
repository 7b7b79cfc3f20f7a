//! `loadBalancerSourceRanges` end to end: the real binary (`switchyard-agent
//! standalone`) fed with a LoadBalancer Service and its EndpointSlice, and real
//! sockets from an outside client with two addresses (one inside the ranges, one
//! outside), from a pod and from the node itself.

mod datapath_support;

use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::{Ipv4Addr, SocketAddrV4, TcpStream},
    os::fd::FromRawFd as _,
    path::Path,
    time::{Duration, Instant},
};

use datapath_support::*;
use switchyard_agent::loader::PinnedServiceMaps;

const NODE_NAME: &str = "node-a";
const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 40);
const LOAD_BALANCER_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 7);
const NODE_PORT: u16 = 30040;
/// The outside client's second address: outside the ranges at first.
const OTHER_CLIENT_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 3);

/// The Service (ranges `ranges`, YAML flow items) and its slice over `pods`.
fn write_manifests(node: &Node, ranges: &str, pods: &[&Pod]) {
    let endpoints: String = pods
        .iter()
        .map(|pod| format!("- {{addresses: [{}], nodeName: {NODE_NAME}}}\n", pod.ip))
        .collect();
    let manifests = format!(
        "apiVersion: v1
kind: Service
metadata: {{name: web, namespace: default}}
spec:
  type: LoadBalancer
  clusterIP: {CLUSTER_IP}
  loadBalancerSourceRanges: [{ranges}]
  ports: [{{name: http, port: 80, targetPort: 8080, nodePort: {NODE_PORT}, protocol: TCP}}]
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
{endpoints}"
    );
    let directory = node.work.join("manifests");
    std::fs::create_dir_all(&directory).expect("manifest directory");
    // Written whole, then renamed: the agent never reads half a file.
    let staging = node.work.join("services.yaml.new");
    std::fs::write(&staging, manifests).expect("write manifests");
    std::fs::rename(&staging, directory.join("services.yaml")).expect("move manifests");
}

/// One request over TCP from `source` (bound before connecting) to `target`,
/// in the calling thread's namespace. A connect that gets no answer within
/// `timeout` fails with `TimedOut`.
fn request_from(
    source: Ipv4Addr,
    target: SocketAddrV4,
    timeout: Duration,
) -> std::io::Result<Answer> {
    let address = |ip: Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    let length = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: plain system calls on a descriptor this function owns; it is handed
    // to `TcpStream` at once, which closes it.
    let mut stream = unsafe {
        let descriptor = libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        );
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
        let remote = address(*target.ip(), target.port());
        if libc::connect(
            descriptor,
            (&remote as *const libc::sockaddr_in).cast(),
            length,
        ) != 0
        {
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::EINPROGRESS) {
                return Err(error);
            }
            let mut poll = libc::pollfd {
                fd: descriptor,
                events: libc::POLLOUT,
                revents: 0,
            };
            let milliseconds =
                libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
            match libc::poll(&mut poll, 1, milliseconds) {
                0 => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "no answer to the connect",
                    ))
                }
                result if result < 0 => return Err(std::io::Error::last_os_error()),
                _ => {}
            }
            if let Some(error) = stream.take_error()? {
                return Err(error);
            }
        }
        stream
    };
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.write_all(b"hello\n")?;
    let mut line = String::new();
    BufReader::new(&mut stream).read_line(&mut line)?;
    parse_answer(&line)
}

/// A request from the outside client, from its address `source`.
fn from_client(
    source: Ipv4Addr,
    target: SocketAddrV4,
    timeout: Duration,
) -> std::io::Result<Answer> {
    in_namespace(Some("client"), move || {
        request_from(source, target, timeout)
    })
    .join()
    .expect("client thread")
}

/// A request from `namespace` (`None`: the node) without binding.
fn from_namespace(
    namespace: Option<&'static str>,
    target: SocketAddrV4,
    timeout: Duration,
) -> std::io::Result<Answer> {
    in_namespace(namespace, move || tcp_request(target, timeout))
        .join()
        .expect("client thread")
}

/// A connect that must not be answered: dropped, so it times out (never refused).
fn assert_dropped(what: &str, result: std::io::Result<Answer>) {
    match result {
        Ok(answer) => panic!(
            "{what}: answered by {} as {}",
            answer.backend, answer.seen_client
        ),
        Err(error) => assert!(
            error.kind() == std::io::ErrorKind::TimedOut,
            "{what}: failed with {error} instead of timing out (a drop, as kube-proxy's)"
        ),
    }
}

fn source_range_drops(pin_directory: &Path) -> u64 {
    PinnedServiceMaps::open(pin_directory)
        .expect("open the pinned maps")
        .source_range_drops()
        .expect("read the drop counter")
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn load_balancer_source_ranges_admit_an_allowed_client_and_drop_the_others_but_not_on_the_node_port(
) {
    run_isolated(
        "load_balancer_source_ranges_admit_an_allowed_client_and_drop_the_others_but_not_on_the_node_port",
        |node| {
            let pods = standard_topology(2);
            start_servers(&pods[0]);
            sh(&format!("ip -n client addr add {OTHER_CLIENT_IP}/24 dev eth0"));
            // Only the client's first address is allowed; a range that is no CIDR
            // is skipped with a warning and does not block the other.
            write_manifests(node, &format!("'{CLIENT_IP}/32', not-a-cidr"), &[&pods[0]]);
            // Pods' TCP connects balanced by the connect hook, as by default: a
            // filtered frontend must be left to TC, which sees the pod's address.
            let mut agent = node.start_standalone_agent_with(
                NODE_NAME,
                "agent.log",
                &["--pod-connect-time-load-balancing", "tcp"],
            );
            let load_balancer = SocketAddrV4::new(LOAD_BALANCER_IP, 80);
            let node_port = SocketAddrV4::new(NODE_IP, NODE_PORT);
            let cluster_ip = SocketAddrV4::new(CLUSTER_IP, 80);
            let short = Duration::from_millis(300);

            let served = wait_until(Duration::from_secs(20), || {
                from_client(CLIENT_IP, load_balancer, short).is_ok()
            });
            assert!(served, "the allowed client was never answered:\n{}", agent_log(node));
            let answer = from_client(CLIENT_IP, load_balancer, Duration::from_secs(2))
                .expect("the allowed client is answered");
            assert_eq!(answer.backend, "pod1");
            assert!(
                agent_log(node).contains("not-a-cidr"),
                "the skipped range was not reported:\n{}",
                agent_log(node)
            );

            // The other address of the same client: dropped, and counted.
            let drops_before = source_range_drops(&node.pin_directory);
            assert_dropped(
                "the client outside the ranges",
                from_client(OTHER_CLIENT_IP, load_balancer, Duration::from_secs(1)),
            );
            assert!(source_range_drops(&node.pin_directory) > drops_before);
            // The control: the same client, same address, reaches the NodePort
            // of the same Service (NodePorts are never filtered).
            let answer = from_client(OTHER_CLIENT_IP, node_port, Duration::from_secs(2))
                .expect("the client outside the ranges reaches the NodePort");
            assert_eq!(answer.backend, "pod1");

            // A pod outside the ranges is dropped too, as by kube-proxy; it
            // reaches the ClusterIP of the same Service.
            assert_dropped(
                "a pod outside the ranges",
                from_namespace(Some("pod2"), load_balancer, Duration::from_secs(1)),
            );
            from_namespace(Some("pod2"), cluster_ip, Duration::from_secs(2))
                .expect("the pod reaches the ClusterIP");

            // No range holds the node's address: its own connects are refused at
            // once by the socket hooks (they see no source address to check).
            // Without the test cgroup no hook would run and this check would be skipped.
            assert!(
                node.cgroup.is_some(),
                "no test cgroup for the socket hooks: the node's own connects cannot be checked"
            );
            {
                let started = Instant::now();
                let error = from_namespace(None, load_balancer, Duration::from_secs(2))
                    .expect_err("the node connected to a load balancer that excludes it");
                // EPERM (not a timeout of the 2 s connect) is what says "refused at once".
                assert_eq!(error.kind(), std::io::ErrorKind::PermissionDenied, "{error}");
                println!("the node's connect was refused after {:?}: {error}", started.elapsed());
                from_namespace(None, cluster_ip, Duration::from_secs(2))
                    .expect("the node reaches the ClusterIP");
            }

            // The ranges change: the second address is admitted from now on,
            // the first one no more (a new flow is checked against the new ranges).
            write_manifests(node, &format!("'{OTHER_CLIENT_IP}/32'"), &[&pods[0]]);
            let moved = wait_until(Duration::from_secs(20), || {
                from_client(OTHER_CLIENT_IP, load_balancer, short).is_ok()
            });
            assert!(moved, "the new range was never applied:\n{}", agent_log(node));
            assert_dropped(
                "the client whose range was removed",
                from_client(CLIENT_IP, load_balancer, Duration::from_secs(1)),
            );
            let _ = agent.kill();
            let _ = agent.wait();
        },
    );
}
