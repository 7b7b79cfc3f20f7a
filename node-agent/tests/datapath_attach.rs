//! Privileged datapath tests of attaching: idempotence (one program per hook and
//! direction however often the agent starts), in-place upgrade without a moment
//! with no program, clsact fallback, new interfaces attached by the agent's
//! netlink watcher within a second, and complete detach.

mod datapath_support;

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    os::fd::AsFd as _,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use aya::programs::{SchedClassifier, TcAttachType};
use datapath_support::*;
use switchyard_agent::loader::{self, system, AttachMode, AttachOutcome, Datapath, InterfaceKind};
use switchyard_agent::maps::ServiceMaps;
use switchyard_common::PROTOCOL_TCP;

const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const NODE_PORT: u16 = 30080;

/// Our programs on one hook, as the kernel reports them (TCX query).
fn tcx_programs(interface: &str, direction: TcAttachType) -> Vec<String> {
    let (_, programs) = SchedClassifier::query_tcx(interface, direction).expect("query tcx");
    programs
        .iter()
        .filter_map(|program| program.name_as_str().map(str::to_string))
        .collect()
}

/// Our pinned links (`<pin dir>/links/*`), as kernel link ids.
fn pinned_link_ids(node: &Node) -> Vec<u64> {
    let mut ids: Vec<u64> = std::fs::read_dir(node.pin_directory.join("links"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| {
            let link = system::open_pinned(&entry.path()).expect("open pinned link");
            u64::from(system::link_info(link.as_fd()).expect("link info").link_id)
        })
        .collect();
    ids.sort_unstable();
    ids
}

/// Program names of the given links according to bpftool (`bpftool link show`;
/// it lists every link on the machine, so only ours are looked at).
fn bpftool_link_program_names(link_ids: &[u64]) -> Vec<String> {
    let links: serde_json::Value =
        serde_json::from_str(&sh("bpftool -j link show")).expect("bpftool json");
    let programs: serde_json::Value =
        serde_json::from_str(&sh("bpftool -j prog show")).expect("bpftool json");
    let name_of = |id: &serde_json::Value| {
        programs
            .as_array()
            .into_iter()
            .flatten()
            .find(|program| &program["id"] == id)
            .and_then(|program| program["name"].as_str())
            .unwrap_or("?")
            .to_string()
    };
    let mut names: Vec<String> = links
        .as_array()
        .into_iter()
        .flatten()
        .filter(|link| link["id"].as_u64().is_some_and(|id| link_ids.contains(&id)))
        .map(|link| name_of(&link["prog_id"]))
        .collect();
    names.sort();
    names
}

fn start_agent_once(node: &Node, pods: &[Pod], mode: AttachMode) -> Vec<AttachOutcome> {
    let mut settings = node.loader_settings();
    settings.attach_mode = mode;
    let mut datapath = Datapath::load(settings).expect("load");
    let mut outcomes = Vec::new();
    for pod in pods {
        outcomes.extend(
            datapath
                .attach_interface(&pod.host_interface(), InterfaceKind::Pod)
                .expect("attach pod"),
        );
    }
    outcomes.extend(
        datapath
            .attach_interface("ext0", InterfaceKind::Host)
            .expect("attach ext0"),
    );
    if mode != AttachMode::Clsact {
        outcomes.extend(datapath.attach_socket_hooks().expect("socket hooks"));
    }
    // The process "exits": everything it holds is closed.
    drop(datapath);
    outcomes
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn starting_the_agent_five_times_leaves_exactly_one_program_per_hook_and_direction() {
    run_isolated(
        "starting_the_agent_five_times_leaves_exactly_one_program_per_hook_and_direction",
        |node| {
            let pods = standard_topology(2);
            for start in 0..5 {
                let outcomes = start_agent_once(node, &pods, AttachMode::Tcx);
                let expected = if start == 0 {
                    AttachOutcome::Created
                } else {
                    AttachOutcome::Kept
                };
                assert!(
                    outcomes.iter().all(|outcome| *outcome == expected),
                    "start {start}: {outcomes:?}"
                );
                for pod in &pods {
                    assert_eq!(
                        tcx_programs(&pod.host_interface(), TcAttachType::Ingress),
                        ["sy_ingress_pod"]
                    );
                    assert_eq!(
                        tcx_programs(&pod.host_interface(), TcAttachType::Egress),
                        ["sy_egress"]
                    );
                }
                assert_eq!(
                    tcx_programs("ext0", TcAttachType::Ingress),
                    ["sy_ingress_host"]
                );
                assert_eq!(tcx_programs("ext0", TcAttachType::Egress), ["sy_egress"]);
                // bpftool agrees: 3 interfaces x 2 directions + 4 socket
                // address hooks + the release hook + the sock_ops program
                // (attached at every load, kept as the others).
                let link_ids = pinned_link_ids(node);
                assert_eq!(link_ids.len(), 12, "{link_ids:?}");
                let names = bpftool_link_program_names(&link_ids);
                assert_eq!(names.len(), 12, "{names:?}");
                for hook in ["sy_sock_release", "sy_sock_ops"] {
                    assert_eq!(
                        names.iter().filter(|name| *name == hook).count(),
                        1,
                        "{names:?}"
                    );
                }
                assert_eq!(names.iter().filter(|name| *name == "sy_egress").count(), 3);
                assert_eq!(
                    names
                        .iter()
                        .filter(|name| *name == "sy_ingress_pod")
                        .count(),
                    2
                );
            }
            // Detach removes every program, link and pin.
            let link_ids = pinned_link_ids(node);
            loader::detach_everything(&node.pin_directory).expect("detach");
            for interface in ["veth-pod1", "veth-pod2", "ext0"] {
                assert!(tcx_programs(interface, TcAttachType::Ingress).is_empty());
                assert!(tcx_programs(interface, TcAttachType::Egress).is_empty());
            }
            assert!(bpftool_link_program_names(&link_ids).is_empty());
            assert!(!node.pin_directory.exists());
        },
    );
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn under_clsact_attaching_again_replaces_the_filter_instead_of_adding_one() {
    run_isolated(
        "under_clsact_attaching_again_replaces_the_filter_instead_of_adding_one",
        |node| {
            let pods = standard_topology(1);
            for _ in 0..5 {
                start_agent_once(node, &pods, AttachMode::Clsact);
                for (interface, ingress) in
                    [("veth-pod1", "sy_ingress_pod"), ("ext0", "sy_ingress_host")]
                {
                    for (direction, program) in [("ingress", ingress), ("egress", "sy_egress")] {
                        let filters = sh(&format!("tc filter show dev {interface} {direction}"));
                        let programs: Vec<&str> = filters
                            .lines()
                            .filter(|line| line.contains("direct-action"))
                            .collect();
                        assert_eq!(programs.len(), 1, "{interface} {direction}: {filters}");
                        assert!(
                            programs[0].contains(&format!("name {program} ")),
                            "{filters}"
                        );
                    }
                }
            }
            // And the programs translate under clsact too.
            start_servers(&pods[0]);
            let mut maps = loader::PinnedServiceMaps::open(&node.pin_directory).expect("maps");
            maps.write_config(&active_config()).expect("config");
            write_service(
                &mut maps,
                &ServiceEntry::cluster_ip(1, CLUSTER_IP, 80, PROTOCOL_TCP)
                    .with_node_port(NODE_PORT)
                    .with_backends(&[&pods[0]]),
            );
            let results =
                tcp_requests_from(Some("client"), SocketAddrV4::new(NODE_IP, NODE_PORT), 10);
            assert_eq!(
                results.iter().filter(|result| result.is_ok()).count(),
                10,
                "{results:?}"
            );
            loader::detach_everything(&node.pin_directory).expect("detach");
            for interface in ["veth-pod1", "ext0"] {
                let filters = sh(&format!(
                    "tc filter show dev {interface} ingress; tc filter show dev {interface} egress"
                ));
                assert!(!filters.contains("sy_"), "{filters}");
            }
        },
    );
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn an_upgraded_program_replaces_the_old_one_in_place_without_a_failed_connection() {
    run_isolated(
        "an_upgraded_program_replaces_the_old_one_in_place_without_a_failed_connection",
        |node| {
            let pods = standard_topology(2);
            start_servers(&pods[0]);
            let (datapath, mut maps) = start_datapath(node, &pods);
            drop(datapath);
            write_service(
                &mut maps,
                &ServiceEntry::cluster_ip(1, CLUSTER_IP, 80, PROTOCOL_TCP)
                    .with_node_port(NODE_PORT)
                    .with_backends(&[&pods[0]]),
            );
            let link_path = node.pin_directory.join("links").join(format!(
                "tcx-{}-ingress",
                system::interface_index("ext0").expect("ext0")
            ));
            let link_id = || {
                let link = system::open_pinned(&link_path).expect("open link");
                // The link object is the same across updates: same program id
                // changes, link id stays. Read both.
                system::link_info(link.as_fd()).expect("link info")
            };
            let before = link_id();

            // Continuous new connections through the NodePort from outside while
            // ext0's ingress program is swapped back and forth 20 times (the two
            // ingress programs differ, so each swap is a real link update).
            let stop = Arc::new(AtomicBool::new(false));
            let failures = Arc::new(AtomicUsize::new(0));
            let successes = Arc::new(AtomicUsize::new(0));
            let client = {
                let (stop, failures, successes) =
                    (stop.clone(), failures.clone(), successes.clone());
                in_namespace(Some("client"), move || {
                    let address = SocketAddrV4::new(NODE_IP, NODE_PORT);
                    while !stop.load(Ordering::Relaxed) {
                        match tcp_request(address, Duration::from_secs(2)) {
                            Ok(_) => successes.fetch_add(1, Ordering::Relaxed),
                            Err(_) => failures.fetch_add(1, Ordering::Relaxed),
                        };
                    }
                })
            };
            let mut outcomes = Vec::new();
            for swap in 0..20 {
                let kind = if swap % 2 == 0 {
                    InterfaceKind::Pod
                } else {
                    InterfaceKind::Host
                };
                let mut datapath = Datapath::load(node.loader_settings()).expect("load");
                outcomes.push(datapath.attach_interface("ext0", kind).expect("attach")[0]);
                let expected = if swap % 2 == 0 {
                    "sy_ingress_pod"
                } else {
                    "sy_ingress_host"
                };
                assert_eq!(tcx_programs("ext0", TcAttachType::Ingress), [expected]);
                std::thread::sleep(Duration::from_millis(50));
            }
            stop.store(true, Ordering::Relaxed);
            client.join().expect("client");
            assert!(
                outcomes
                    .iter()
                    .all(|outcome| *outcome == AttachOutcome::Replaced),
                "{outcomes:?}"
            );
            let after = link_id();
            assert_eq!(before.link_type, after.link_type);
            assert_ne!(before.program_id, after.program_id, "the program changed");
            assert!(successes.load(Ordering::Relaxed) > 50);
            assert_eq!(
                failures.load(Ordering::Relaxed),
                0,
                "failed connections during swaps"
            );
        },
    );
}

/// Our programs on one hook, or none when the interface does not exist (yet).
fn tcx_programs_if_any(interface: &str, direction: TcAttachType) -> Vec<String> {
    SchedClassifier::query_tcx(interface, direction)
        .map(|(_, programs)| {
            programs
                .iter()
                .filter_map(|program| program.name_as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `interface` has the pod programs on both hooks.
fn has_pod_programs(interface: &str) -> bool {
    tcx_programs_if_any(interface, TcAttachType::Ingress) == ["sy_ingress_pod"]
        && tcx_programs_if_any(interface, TcAttachType::Egress) == ["sy_egress"]
}

/// The agent's own path, end to end: the standalone agent binary (the core and
/// the netlink host watcher both modes use) attaches a pod interface that
/// appears while it runs. Its manifests and interfaces are polled only every
/// 30 s here, so an attach within a second can only come from the netlink
/// notification (the bound is what the test checks, not a speed: the path it
/// measures takes a few tens of milliseconds; the old polling path took up to
/// the poll interval).
#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn a_new_pod_interface_is_attached_within_a_second_of_appearing() {
    run_isolated(
        "a_new_pod_interface_is_attached_within_a_second_of_appearing",
        |node| {
            let pods = standard_topology(1);
            std::fs::create_dir_all(node.work.join("manifests")).expect("manifest directory");
            let mut agent = node.start_standalone_agent_with(
                "node-a",
                "agent.log",
                &["--poll-interval-ms", "30000"],
            );
            let log = || std::fs::read_to_string(node.work.join("agent.log")).unwrap_or_default();
            // Its first round: the gate opens on the (empty) manifests and the
            // host, and every interface there gets its programs.
            assert!(
                wait_until(Duration::from_secs(20), || has_pod_programs(
                    &pods[0].host_interface()
                )),
                "the agent attached the pod there at start; log:\n{}",
                log()
            );
            let created = Instant::now();
            let new_pod = add_pod("pod9", Ipv4Addr::new(10, 244, 0, 99));
            let attached = wait_until(Duration::from_secs(5), || {
                has_pod_programs(&new_pod.host_interface())
            });
            let elapsed = created.elapsed();
            assert!(
                attached,
                "the new interface got no programs; log:\n{}",
                log()
            );
            assert!(
                elapsed < Duration::from_secs(1),
                "attached after {elapsed:?}; log:\n{}",
                log()
            );
            // SIGTERM leaves everything in place; the pod then goes away and
            // the loader's listing prunes its defunct links.
            sh(&format!("kill -TERM {}", agent.id()));
            let status = agent.wait().expect("the agent exits");
            assert!(
                status.success(),
                "the agent exited with {status}; log:\n{}",
                log()
            );
            let index = system::interface_index(&new_pod.host_interface()).expect("index");
            let datapath = Datapath::load(node.loader_settings()).expect("load the datapath");
            assert!(datapath
                .attached_interfaces()
                .expect("list")
                .contains(&index));
            sh(&format!("ip link del {}", new_pod.host_interface()));
            assert!(
                wait_until(Duration::from_secs(2), || !datapath
                    .attached_interfaces()
                    .expect("list")
                    .contains(&index)),
                "the removed interface's links were pruned"
            );
            let remaining = datapath.attached_interfaces().expect("list");
            assert_eq!(remaining.len(), 2, "veth-pod1 and ext0 stay: {remaining:?}");
        },
    );
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn the_restart_priority_check_reads_the_pinned_links_without_pruning_them() {
    run_isolated(
        "the_restart_priority_check_reads_the_pinned_links_without_pruning_them",
        |node| {
            let link_pins = || {
                std::fs::read_dir(loader::links_directory(&node.pin_directory))
                    .map(|entries| entries.count())
                    .unwrap_or(0)
            };
            assert!(
                !loader::programs_attached_under(&node.pin_directory),
                "nothing attached before the first start"
            );
            let pods = standard_topology(1);
            let (datapath, _maps) = start_datapath(node, &pods);
            assert!(loader::programs_attached_under(&node.pin_directory));
            let pins_before = link_pins();

            // The pod goes away: its links are defunct. The check (made before a
            // load that may still be refused) sees ext0's links and removes nothing.
            let index = system::interface_index(&pods[0].host_interface()).expect("index");
            sh(&format!("ip link del {}", pods[0].host_interface()));
            std::thread::sleep(Duration::from_millis(200));
            assert!(loader::programs_attached_under(&node.pin_directory));
            assert_eq!(link_pins(), pins_before, "the check pruned nothing");
            // The loaded datapath's own listing prunes them.
            assert!(
                wait_until(Duration::from_secs(2), || !datapath
                    .attached_interfaces()
                    .expect("list")
                    .contains(&index)),
                "the removed interface's links were pruned"
            );
            assert!(link_pins() < pins_before);

            loader::detach_everything(&node.pin_directory).expect("detach");
            assert!(!loader::programs_attached_under(&node.pin_directory));
        },
    );
}
