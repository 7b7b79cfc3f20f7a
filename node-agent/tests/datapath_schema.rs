//! Map schema upgrades through the real binary (`switchyard-agent standalone`).
//!
//! Converted layouts: the running datapath is turned into an install of schema
//! version 0, a layout the agent knows only to convert from (fields reordered,
//! one narrower, one missing; see `loader::schema`): every map is re-created in
//! version 0's layout from its live entries, encoded here field by field,
//! independently of the agent's converter, and pinned under `v0/`; the socket
//! reverse map (unchanged in version 0) is pinned there as the same object; `v1/`
//! is removed. Then the agent is started and must convert every map, replace the
//! programs on every hook (the new programs have the same instructions but other
//! maps), and remove `v0/`, while established connections keep working.
//!
//! What the simulation cannot do: the programs running during the switch are
//! version 1 programs writing into the maps they were loaded with, not into the
//! `v0/` pins, so flows they open after the snapshot are invisible to the
//! conversion. In a real upgrade those are merged after the switch; here no new
//! connection is opened between the snapshot and the end of the migration.
//!
//! Refusal: maps of a newer version are refused by the loader and by the binary,
//! with nothing touched.

mod datapath_support;

use std::{
    collections::BTreeSet,
    net::{Ipv4Addr, SocketAddrV4},
    os::fd::AsFd as _,
    path::{Path, PathBuf},
    process::Child,
    time::{Duration, Instant},
};

use datapath_support::*;
use switchyard_agent::{
    loader::{self, schema, system, Datapath},
    maps::ServiceMaps,
};
use switchyard_common::{
    map_names, AffinityKey, AffinityValue, BackendValue, ConntrackKey, ConntrackValue,
    DatapathConfig, FrontendKey, FrontendValue, DATAPATH_MODE_ACTIVE, SCHEMA_VERSION,
};

const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const STICKY_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 11);
const NODE_PORT: u16 = 30080;
const NODE_NAME: &str = "node-a";

fn write_manifests(directory: &Path, pods: &[Pod]) {
    let endpoints: String = pods
        .iter()
        .map(|pod| format!("- {{addresses: [{}], nodeName: {NODE_NAME}}}\n", pod.ip))
        .collect();
    let manifests = format!(
        "apiVersion: v1
kind: Service
metadata: {{name: web, namespace: default}}
spec:
  type: NodePort
  clusterIP: {CLUSTER_IP}
  ports: [{{name: http, port: 80, targetPort: 8080, nodePort: {NODE_PORT}, protocol: TCP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: web-1, namespace: default, labels: {{kubernetes.io/service-name: web}}}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints:
{endpoints}---
apiVersion: v1
kind: Service
metadata: {{name: sticky, namespace: default}}
spec:
  clusterIP: {STICKY_IP}
  sessionAffinity: ClientIP
  ports: [{{name: http, port: 80, targetPort: 8080, protocol: TCP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: sticky-1, namespace: default, labels: {{kubernetes.io/service-name: sticky}}}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints:
{endpoints}"
    );
    std::fs::create_dir_all(directory).expect("manifest directory");
    std::fs::write(directory.join("services.yaml"), manifests).expect("write manifests");
}

fn start_agent(node: &Node, generation: usize) -> Child {
    node.start_standalone_agent(NODE_NAME, &format!("agent-{generation}.log"))
}

fn agent_log_path(node: &Node, generation: usize) -> PathBuf {
    node.work.join(format!("agent-{generation}.log"))
}

fn agent_log(node: &Node, generation: usize) -> String {
    std::fs::read_to_string(agent_log_path(node, generation)).unwrap_or_default()
}

fn stop_agent(mut agent: Child) {
    sh(&format!("kill -TERM {}", agent.id()));
    let _ = agent.wait();
}

/// Entries of a map as raw bytes (key, value).
type RawEntries = Vec<(Vec<u8>, Vec<u8>)>;

/// Every entry of a pinned map, as raw bytes.
fn raw_entries(path: &Path) -> RawEntries {
    let map = system::open_pinned(path).expect("open map");
    let shape = system::map_shape(map.as_fd()).expect("map shape");
    system::map_entries(
        map.as_fd(),
        shape.key_size as usize,
        shape.value_size as usize,
    )
    .expect("read the entries")
}

fn pod<T: aya::Pod>(bytes: &[u8]) -> T {
    schema::from_bytes(bytes).expect("an entry of the current layout")
}

/// Version 0's bytes, field by field in version 0's order (host byte order).
#[derive(Default)]
struct Bytes(Vec<u8>);

impl Bytes {
    fn u8(mut self, value: u8) -> Self {
        self.0.push(value);
        self
    }
    fn u16(mut self, value: u16) -> Self {
        self.0.extend_from_slice(&value.to_ne_bytes());
        self
    }
    fn u32(mut self, value: u32) -> Self {
        self.0.extend_from_slice(&value.to_ne_bytes());
        self
    }
    fn u64(mut self, value: u64) -> Self {
        self.0.extend_from_slice(&value.to_ne_bytes());
        self
    }
    fn bytes(mut self, value: &[u8]) -> Self {
        self.0.extend_from_slice(value);
        self
    }
}

/// One version 1 entry of `map` in version 0's layout.
fn to_version_zero(map: &str, key: &[u8], value: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let zero = Bytes::default;
    match map {
        map_names::FRONTENDS => {
            let key: FrontendKey = pod(key);
            let value: FrontendValue = pod(value);
            (
                zero()
                    .u8(key.protocol)
                    .u8(key.scope)
                    .u16(key.port_big_endian)
                    .bytes(&key.address)
                    .0,
                zero()
                    .u32(value.group_id)
                    .u32(value.backend_count)
                    .u32(value.flags)
                    .0,
            )
        }
        map_names::BACKEND_SLOTS => {
            let value: BackendValue = pod(value);
            (
                key.to_vec(),
                zero()
                    .u16(value.port_big_endian)
                    .u16(value.flags)
                    .bytes(&value.address)
                    .0,
            )
        }
        map_names::CONNTRACK => {
            let key: ConntrackKey = pod(key);
            let value: ConntrackValue = pod(value);
            (
                zero()
                    .bytes(&key.source_address)
                    .u16(key.source_port_big_endian)
                    .bytes(&key.destination_address)
                    .u16(key.destination_port_big_endian)
                    .u8(key.protocol)
                    .bytes(&[0; 3])
                    .0,
                zero()
                    .u64(value.last_seen_nanoseconds)
                    .bytes(&value.new_source_address)
                    .u16(value.new_source_port_big_endian)
                    .bytes(&value.new_destination_address)
                    .u16(value.new_destination_port_big_endian)
                    .u8(value.flags)
                    .u8(value.tcp_state)
                    .bytes(&[0; 2])
                    .0,
            )
        }
        map_names::AFFINITY => {
            let key: AffinityKey = pod(key);
            let value: AffinityValue = pod(value);
            (
                zero().u32(key.group_id).bytes(&key.client_address).0,
                zero()
                    .u32(value.ordinal)
                    .u16(value.backend_port_big_endian)
                    .u16(0)
                    .bytes(&value.backend_address)
                    .u64(value.last_used_nanoseconds)
                    .0,
            )
        }
        map_names::CONFIG => {
            let value: DatapathConfig = pod(value);
            (
                key.to_vec(),
                zero()
                    .u32(value.mode)
                    .u32(value.masquerade_mark)
                    .u64(value.network_namespace_cookie)
                    .bytes(&value.hairpin_address)
                    .u32(value.tcp_idle_timeout_seconds)
                    .u32(value.udp_idle_timeout_seconds)
                    .0,
            )
        }
        other => panic!("no version 0 encoding for {other}"),
    }
}

/// Version 0's shapes: (map type, key size, value size), as the test knows them.
fn version_zero_shape(map: &str) -> (u32, u32, u32) {
    match map {
        map_names::FRONTENDS => (schema::MAP_TYPE_HASH, 20, 12),
        map_names::BACKEND_SLOTS => (schema::MAP_TYPE_HASH, 8, 20),
        map_names::CONNTRACK => (schema::MAP_TYPE_LRU_HASH, 40, 48),
        map_names::AFFINITY => (schema::MAP_TYPE_LRU_HASH, 20, 32),
        map_names::CONFIG => (schema::MAP_TYPE_ARRAY, 4, 40),
        map_names::COUNTERS => (schema::MAP_TYPE_PERCPU_ARRAY, 4, 8),
        other => panic!("no version 0 shape for {other}"),
    }
}

/// Turns the running install into one of schema version 0 (see the module
/// comment). Returns the version 1 entries each converted map had.
fn rewrite_as_version_zero(pin_directory: &Path) -> Vec<(&'static str, RawEntries)> {
    let current = loader::version_directory(pin_directory, SCHEMA_VERSION);
    let older = loader::version_directory(pin_directory, 0);
    std::fs::create_dir_all(&older).expect("create v0");
    let mut snapshots = Vec::new();
    for name in [
        map_names::FRONTENDS,
        map_names::BACKEND_SLOTS,
        map_names::CONNTRACK,
        map_names::AFFINITY,
        map_names::CONFIG,
    ] {
        let path = current.join(name);
        let entries = raw_entries(&path);
        let capacity = {
            let map = system::open_pinned(&path).expect("open");
            system::map_shape(map.as_fd()).expect("shape").max_entries
        };
        let (map_type, key_size, value_size) = version_zero_shape(name);
        let map = system::map_create(map_type, key_size, value_size, capacity, name)
            .expect("create a version 0 map");
        for (key, value) in &entries {
            let (key, value) = to_version_zero(name, key, value);
            assert_eq!(
                (key.len(), value.len()),
                (key_size as usize, value_size as usize)
            );
            system::map_update(map.as_fd(), &key, &value, system::UPDATE_ANY)
                .expect("write a version 0 entry");
        }
        system::pin_object(map.as_fd(), &older.join(name)).expect("pin");
        snapshots.push((name, entries));
    }
    let (map_type, key_size, value_size) = version_zero_shape(map_names::COUNTERS);
    let counters = system::map_create(
        map_type,
        key_size,
        value_size,
        switchyard_common::counter::COUNT,
        map_names::COUNTERS,
    )
    .expect("create counters");
    system::pin_object(counters.as_fd(), &older.join(map_names::COUNTERS)).expect("pin");
    // Unchanged in version 0: the very same object.
    let socket_reverse =
        system::open_pinned(&current.join(map_names::SOCKET_REVERSE)).expect("open");
    system::pin_object(
        socket_reverse.as_fd(),
        &older.join(map_names::SOCKET_REVERSE),
    )
    .expect("pin");
    std::fs::remove_dir_all(&current).expect("remove v1");
    snapshots
}

/// For every pinned TCX link: the ids of the maps its program uses.
fn map_ids_of_attached_programs(pin_directory: &Path) -> Vec<(String, Vec<u32>)> {
    let mut programs = Vec::new();
    for entry in std::fs::read_dir(loader::links_directory(pin_directory))
        .expect("links")
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("tcx-") {
            continue;
        }
        let link = system::open_pinned(&entry.path()).expect("open link");
        let info = system::link_info(link.as_fd()).expect("link info");
        let (_, map_ids) = system::program_identity_of_id(info.program_id).expect("program");
        programs.push((name, map_ids));
    }
    programs
}

fn map_id(path: &Path) -> u32 {
    let map = system::open_pinned(path).expect("open map");
    system::map_id(map.as_fd()).expect("map id")
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn maps_of_an_older_layout_are_converted_and_established_connections_survive() {
    run_isolated(
        "maps_of_an_older_layout_are_converted_and_established_connections_survive",
        |node| {
            let pods = standard_topology(3);
            start_servers(&pods[0]);
            start_servers(&pods[1]);
            write_manifests(&node.work.join("manifests"), &pods[..2]);
            let cluster_ip = SocketAddrV4::new(CLUSTER_IP, 80);
            let sticky = SocketAddrV4::new(STICKY_IP, 80);
            let node_port = SocketAddrV4::new(NODE_IP, NODE_PORT);

            // The version 1 install, serving.
            let agent = start_agent(node, 0);
            let serving = wait_until(Duration::from_secs(20), || {
                [
                    ("pod3", cluster_ip),
                    ("client", node_port),
                    ("pod3", sticky),
                ]
                .into_iter()
                .all(|(namespace, address)| {
                    in_namespace(Some(namespace), move || {
                        tcp_request(address, Duration::from_millis(300)).is_ok()
                    })
                    .join()
                    .unwrap_or(false)
                })
            });
            assert!(serving, "never served:\n{}", agent_log(node, 0));
            stop_agent(agent);
            let sticky_backend = tcp_requests_from(Some("pod3"), sticky, 1)
                .remove(0)
                .expect("sticky request")
                .backend;
            let frontends_before = loader::PinnedServiceMaps::open(&node.pin_directory)
                .expect("maps")
                .frontends()
                .expect("frontends");

            // Established connections, through the ClusterIP, the NodePort and
            // the sticky Service.
            let mut connections: Vec<(&str, LongLivedConnection)> = Vec::new();
            for _ in 0..8 {
                connections.push((
                    "ClusterIP",
                    LongLivedConnection::open(Some("pod3"), cluster_ip, Duration::from_millis(50)),
                ));
            }
            for _ in 0..4 {
                connections.push((
                    "NodePort",
                    LongLivedConnection::open(Some("client"), node_port, Duration::from_millis(50)),
                ));
            }
            for _ in 0..2 {
                connections.push((
                    "sticky",
                    LongLivedConnection::open(Some("pod3"), sticky, Duration::from_millis(50)),
                ));
            }
            std::thread::sleep(Duration::from_millis(300));

            let snapshots = rewrite_as_version_zero(&node.pin_directory);
            let older = loader::version_directory(&node.pin_directory, 0);
            let current = loader::version_directory(&node.pin_directory, SCHEMA_VERSION);
            let conntrack_before: BTreeSet<Vec<u8>> = snapshots
                .iter()
                .find(|(name, _)| *name == map_names::CONNTRACK)
                .map(|(_, entries)| entries.iter().map(|(key, _)| key.clone()).collect())
                .unwrap_or_default();
            let affinity_before = snapshots
                .iter()
                .find(|(name, _)| *name == map_names::AFFINITY)
                .map(|(_, entries)| entries.len())
                .unwrap_or(0);
            assert!(
                conntrack_before.len() >= 2 * connections.len(),
                "both entries of every established connection are in the snapshot: {}",
                conntrack_before.len()
            );
            assert!(affinity_before >= 1, "an affinity entry to convert");

            // The upgrade: the agent finds version 0 and converts it.
            let started = Instant::now();
            let agent = start_agent(node, 1);
            let finished = wait_until(Duration::from_secs(20), || !older.exists());
            let migration_time = started.elapsed();
            assert!(
                finished,
                "the old version's pins were never removed:\n{}",
                agent_log(node, 1)
            );
            println!("migration finished (v0 removed) {migration_time:?} after the agent started");
            let log = agent_log(node, 1);
            println!("{log}");
            for name in [
                map_names::FRONTENDS,
                map_names::BACKEND_SLOTS,
                map_names::CONNTRACK,
                map_names::AFFINITY,
                map_names::CONFIG,
            ] {
                let expected = snapshots
                    .iter()
                    .find(|(map, _)| *map == name)
                    .map(|(_, entries)| entries.len())
                    .unwrap_or(0);
                let line = format!("map={name} from_version=0 entries={expected}");
                assert!(
                    log.lines()
                        .any(|text| text.contains("converted a map") && text.contains(&line)),
                    "the agent logs converting {name} with {expected} entries:\n{log}"
                );
            }
            assert!(
                log.contains("took over a map of an older schema version")
                    && log.contains(map_names::SOCKET_REVERSE),
                "the unchanged socket reverse map is taken over:\n{log}"
            );
            assert!(!migrate_staging(&node.pin_directory).exists());

            // Every established connection's entries are in the new map,
            // converted (a misplaced field would not find them).
            let conntrack_after: BTreeSet<Vec<u8>> =
                raw_entries(&current.join(map_names::CONNTRACK))
                    .into_iter()
                    .map(|(key, _)| key)
                    .collect();
            assert!(
                conntrack_before.is_subset(&conntrack_after),
                "{} of {} conntrack entries missing after the conversion",
                conntrack_before.difference(&conntrack_after).count(),
                conntrack_before.len()
            );
            let maps = loader::PinnedServiceMaps::open(&node.pin_directory).expect("maps");
            assert_eq!(
                maps.frontends().expect("frontends"),
                frontends_before,
                "the frontends are the same after conversion and the agent's sync"
            );
            let config = maps.config().expect("config").expect("a config entry");
            assert_eq!(config.mode, DATAPATH_MODE_ACTIVE);

            // Every hook runs a program using the new conntrack map.
            let new_conntrack = map_id(&current.join(map_names::CONNTRACK));
            let attached = map_ids_of_attached_programs(&node.pin_directory);
            assert!(attached.len() >= 8, "links: {attached:?}");
            for (link, map_ids) in &attached {
                assert!(
                    map_ids.contains(&new_conntrack),
                    "{link} still runs a program on the old maps: {map_ids:?}"
                );
            }

            // Established connections keep working through the new programs.
            std::thread::sleep(Duration::from_secs(3));
            let counters = maps.counters().expect("counters");
            assert!(
                counters.conntrack_hit > 0,
                "the new programs (fresh counters) translate the established flows: {counters:?}"
            );
            let mut requests = 0;
            for (kind, connection) in connections {
                let report = connection.close();
                assert!(report.failure.is_none(), "{kind}: {report:?}");
                assert!(report.requests >= 40, "{kind}: {report:?}");
                requests += report.requests;
            }
            println!("established connections: 14, {requests} requests, 0 failures");

            // New connections after the upgrade: both backends, the converted
            // affinity entry still picks the same backend.
            let answers = tcp_requests_from(Some("pod3"), cluster_ip, 100);
            let backends: BTreeSet<String> = answers
                .iter()
                .map(|answer| answer.as_ref().expect("request").backend.clone())
                .collect();
            assert_eq!(backends.len(), 2, "both backends: {backends:?}");
            let answers = tcp_requests_from(Some("client"), node_port, 50);
            assert!(answers.iter().all(Result::is_ok), "{answers:?}");
            let sticky_answers = tcp_requests_from(Some("pod3"), sticky, 12);
            for answer in &sticky_answers {
                assert_eq!(
                    answer.as_ref().expect("sticky request").backend,
                    sticky_backend,
                    "the converted affinity entry keeps the client on its backend"
                );
            }
            stop_agent(agent);
        },
    );
}

fn migrate_staging(pin_directory: &Path) -> PathBuf {
    pin_directory.join(format!("v{SCHEMA_VERSION}-converting"))
}

/// Everything under a directory, with the kind of each entry (a bpffs listing).
fn listing(directory: &Path) -> Vec<String> {
    let mut names = Vec::new();
    let mut stack = vec![directory.to_path_buf()];
    while let Some(path) = stack.pop() {
        for entry in std::fs::read_dir(&path).expect("read").flatten() {
            names.push(entry.path().display().to_string());
            if entry.file_type().map(|kind| kind.is_dir()).unwrap_or(false) {
                stack.push(entry.path());
            }
        }
    }
    names.sort();
    names
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn maps_of_a_newer_schema_version_are_refused_and_left_untouched() {
    run_isolated(
        "maps_of_a_newer_schema_version_are_refused_and_left_untouched",
        |node| {
            let pods = standard_topology(1);
            // What a newer agent left: its version directory with a map whose
            // layout this agent does not know, and a link directory.
            let newer = loader::version_directory(&node.pin_directory, SCHEMA_VERSION + 1);
            std::fs::create_dir_all(&newer).expect("create");
            std::fs::create_dir_all(loader::links_directory(&node.pin_directory)).expect("create");
            let map = system::map_create(schema::MAP_TYPE_HASH, 24, 24, 16, map_names::FRONTENDS)
                .expect("create");
            system::map_update(map.as_fd(), &[7; 24], &[9; 24], system::UPDATE_ANY).expect("write");
            system::pin_object(map.as_fd(), &newer.join(map_names::FRONTENDS)).expect("pin");
            let before = listing(&node.pin_directory);

            let error = match Datapath::load(node.loader_settings()) {
                Ok(_) => panic!("the loader took over maps of a newer version"),
                // With its causes: the refusal is the cause of the failed step.
                Err(error) => switchyard_model::error::chain(&error),
            };
            assert!(
                error.contains(&format!(
                    "failed to migrate the maps of schema version {}",
                    SCHEMA_VERSION + 1
                )) && error.contains("refusing to downgrade"),
                "{error}"
            );
            assert_eq!(listing(&node.pin_directory), before, "nothing touched");

            // The binary refuses too, exits non-zero at once, and touches nothing.
            write_manifests(&node.work.join("manifests"), &pods);
            let mut agent = start_agent(node, 0);
            let exited = wait_until(Duration::from_secs(10), || {
                agent.try_wait().ok().flatten().is_some()
            });
            assert!(exited, "the agent kept running:\n{}", agent_log(node, 0));
            let status = agent.wait().expect("status");
            assert!(!status.success(), "the agent exits with an error");
            let log = agent_log(node, 0);
            assert!(log.contains("refusing to downgrade"), "{log}");
            assert_eq!(listing(&node.pin_directory), before, "nothing touched");
            assert!(
                sh("bpftool net show 2>/dev/null || true")
                    .lines()
                    .all(|line| !line.contains("sy_")),
                "no program attached"
            );
            let entries = raw_entries(&newer.join(map_names::FRONTENDS));
            assert_eq!(
                entries,
                vec![(vec![7; 24], vec![9; 24])],
                "the newer map keeps its entry"
            );
        },
    );
}

/// A history in which the previous version's maps must be converted (new maps,
/// every entry copied) although the bytes are the same: the switch then has
/// exactly the dynamics of a real layout change (old programs on the old maps,
/// new programs on new ones, flow state merged after the switch), with live
/// traffic through both, which version 0 cannot have (no version 0 programs).
static COPYING_CONVERSION: schema::Schema = schema::Schema {
    current: SCHEMA_VERSION,
    current_layouts: &schema::CURRENT_LAYOUTS,
    steps: &[schema::VersionStep {
        from: SCHEMA_VERSION - 1,
        layouts: &schema::CURRENT_LAYOUTS,
        changed_maps: &[
            map_names::FRONTENDS,
            map_names::BACKEND_SLOTS,
            map_names::CONNTRACK,
            map_names::AFFINITY,
            map_names::CONFIG,
            map_names::COUNTERS,
            map_names::SOCKET_REVERSE,
        ],
        convert: |_, key, value| {
            Ok(Some(schema::Entry {
                key: key.to_vec(),
                value: value.to_vec(),
            }))
        },
    }],
};

/// One request like `tcp_request`, with the failing step and its timing named.
fn timed_request(address: SocketAddrV4) -> Result<(), String> {
    use std::io::{BufRead as _, Write as _};
    let started = Instant::now();
    let mut stream = std::net::TcpStream::connect_timeout(&address.into(), Duration::from_secs(3))
        .map_err(|error| format!("connect after {:?}: {error}", started.elapsed()))?;
    let connected = started.elapsed();
    let local = stream.local_addr().map_err(|error| error.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(3)))
        .map_err(|error| error.to_string())?;
    stream
        .write_all(b"hello\n")
        .map_err(|error| format!("write: {error}"))?;
    let mut line = String::new();
    std::io::BufReader::new(&mut stream)
        .read_line(&mut line)
        .map_err(|error| {
            format!(
                "read from {local} (connected after {connected:?}) after {:?}: {error}",
                started.elapsed()
            )
        })?;
    if line.is_empty() {
        return Err(format!("closed from {local} after {:?}", started.elapsed()));
    }
    Ok(())
}

/// A failed request: when it started and ended, and why.
#[derive(Debug)]
struct FailedRequest {
    started: Instant,
    ended: Instant,
    error: String,
}

/// What one load worker saw: successes, failures, durations over 200 ms.
type LoadOutcome = (usize, Vec<FailedRequest>, Vec<Duration>);

/// Closed-loop new connections from `namespace`, each timed, until stopped.
struct TimedLoad {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    workers: Vec<std::thread::JoinHandle<LoadOutcome>>,
}

impl TimedLoad {
    fn start(namespace: Option<&'static str>, address: SocketAddrV4, workers: usize) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let workers = (0..workers)
            .map(|_| {
                let stop = stop.clone();
                in_namespace(namespace, move || {
                    let (mut successes, mut failures, mut slow) = (0, Vec::new(), Vec::new());
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let started = Instant::now();
                        let result = timed_request(address);
                        let ended = Instant::now();
                        match result {
                            Ok(()) => successes += 1,
                            Err(error) => failures.push(FailedRequest {
                                started,
                                ended,
                                error,
                            }),
                        }
                        if ended - started > Duration::from_millis(200) {
                            slow.push(ended - started);
                        }
                    }
                    (successes, failures, slow)
                })
            })
            .collect();
        Self { stop, workers }
    }

    /// Successes, failures, and how long the requests over 200 ms took.
    fn stop(self) -> LoadOutcome {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut total = (0, Vec::new(), Vec::new());
        for worker in self.workers {
            let (successes, failures, slow) = worker.join().expect("load worker");
            total.0 += successes;
            total.1.extend(failures);
            total.2.extend(slow);
        }
        total
    }
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn a_conversion_under_load_keeps_established_connections_and_fails_only_flows_in_the_switch_window()
{
    run_isolated(
        "a_conversion_under_load_keeps_established_connections_and_fails_only_flows_in_the_switch_window",
        |node| {
            let pods = standard_topology(3);
            start_servers(&pods[0]);
            start_servers(&pods[1]);
            let (datapath, mut maps) = start_datapath(node, &pods);
            drop(datapath);
            write_service(
                &mut maps,
                &ServiceEntry::cluster_ip(1, CLUSTER_IP, 80, tcp())
                    .with_node_port(NODE_PORT)
                    .with_backends(&[&pods[0], &pods[1]]),
            );
            drop(maps);
            let cluster_ip = SocketAddrV4::new(CLUSTER_IP, 80);
            let node_port = SocketAddrV4::new(NODE_IP, NODE_PORT);
            let connections: Vec<LongLivedConnection> = (0..10)
                .map(|_| {
                    LongLivedConnection::open(Some("pod3"), cluster_ip, Duration::from_millis(20))
                })
                .collect();
            let loads = [
                TimedLoad::start(Some("pod3"), cluster_ip, 2),
                TimedLoad::start(Some("client"), node_port, 2),
            ];
            std::thread::sleep(Duration::from_millis(500));

            let current = loader::version_directory(&node.pin_directory, SCHEMA_VERSION);
            let older = loader::version_directory(&node.pin_directory, SCHEMA_VERSION - 1);
            std::fs::rename(&current, &older).expect("move the pins to the older version");
            let old_conntrack = map_id(&older.join(map_names::CONNTRACK));

            let started = Instant::now();
            let mut datapath = Datapath::load(loader::LoaderSettings {
                schema: &COPYING_CONVERSION,
                ..node.loader_settings()
            })
            .expect("load");
            let loaded = started.elapsed();
            // Opened after the conversion copied the old maps, before any hook
            // switched: only in the old map until the merge before the switch.
            let opened_meanwhile: Vec<LongLivedConnection> = (0..6)
                .map(|index| {
                    let (namespace, address) = if index % 2 == 0 {
                        ("pod3", cluster_ip)
                    } else {
                        ("client", node_port)
                    };
                    LongLivedConnection::open(Some(namespace), address, Duration::from_millis(5))
                })
                .collect();
            let switch_started = Instant::now();
            for pod in &pods {
                datapath
                    .attach_interface(&pod.host_interface(), loader::InterfaceKind::Pod)
                    .expect("attach");
            }
            datapath
                .attach_interface("ext0", loader::InterfaceKind::Host)
                .expect("attach");
            datapath.attach_socket_hooks().expect("socket hooks");
            let switched = switch_started.elapsed();
            datapath.finish_migration().expect("finish the migration");
            let finished = switch_started.elapsed();
            assert!(!older.exists(), "the old version's pins are removed");
            let new_conntrack = map_id(&current.join(map_names::CONNTRACK));
            assert_ne!(new_conntrack, old_conntrack, "a new conntrack map");
            for (link, map_ids) in map_ids_of_attached_programs(&node.pin_directory) {
                assert!(map_ids.contains(&new_conntrack), "{link}: {map_ids:?}");
            }
            println!(
                "load with conversion {loaded:?}; attach calls (the merge before the first \
                 switch included) {switched:?}; flow state merged again and old pins removed \
                 {finished:?} after the first attach call"
            );

            std::thread::sleep(Duration::from_secs(3));
            let [cluster_ip_load, node_port_load] = loads;
            let mut report = Vec::new();
            let mut failures = Vec::new();
            for (name, load) in [("ClusterIP", cluster_ip_load), ("NodePort", node_port_load)] {
                let (successes, failed, slow) = load.stop();
                report.push(format!(
                    "{name}: {successes} ok, {} failed, {} over 200 ms {slow:?}",
                    failed.len(),
                    slow.len()
                ));
                assert!(successes > 200, "{name}: {successes}");
                failures.extend(failed);
            }
            let mut requests = 0;
            for connection in connections.into_iter().chain(opened_meanwhile) {
                let long_lived = connection.close();
                assert!(long_lived.failure.is_none(), "{long_lived:?}");
                requests += long_lived.requests;
            }
            println!("new connections: {}", report.join("; "));
            println!(
                "established: 10 before the conversion and 6 after it, {requests} requests, \
                 0 failures"
            );
            // The design's stated limit: a connection whose first reply crosses
            // the switch before the merge (opened by an old ingress program, its
            // reply seen by a new egress program that has no entry yet) loses it.
            // No other new connection may fail. The 4 closed-loop clients open
            // hundreds of connections in the window; a failure usually holds its
            // client for the 3 s read timeout, so more than two per client would
            // mean the merges do not work at all.
            let window = (switch_started, switch_started + finished);
            for failure in &failures {
                assert!(
                    failure.started <= window.1 && failure.ended >= window.0,
                    "a new connection failed outside the switch window: {failure:?}"
                );
            }
            assert!(failures.len() <= 8, "{failures:?}");
            println!(
                "new connections failed in the switch window: {} ({:?})",
                failures.len(),
                failures.iter().map(|failure| &failure.error).collect::<Vec<_>>()
            );
        },
    );
}
