use std::path::Path;

use switchyard_common::DATAPATH_MODE_ACTIVE;
use switchyard_crds::{condition_types, ConditionStatus};

use super::*;
use crate::datapath::fake::FakeDatapath;
use crate::datapath::{DatapathOptions, PodConnectBalancing, SocketHookCgroup};
use crate::follow::Attachment;
use crate::gate::{GateInput, GateStatus};
use crate::interfaces::Globs;
use crate::interfaces::{InterfaceRole, IpAddressInfo, IpInterface, DEFAULT_POD_INTERFACE_GLOBS};

struct FakeHost(Vec<IpInterface>);

/// The standalone agent as `run` drives it, without the threads: the manifests
/// polled, the host's interfaces as the netlink watcher would send them (every
/// round: the core ignores a view that did not change), one round of the core.
struct Harness {
    standalone: Standalone<FakeDatapath>,
    host: FakeHost,
}

impl Harness {
    fn start(
        options: StandaloneOptions,
        datapath: FakeDatapath,
        host: FakeHost,
        now: Instant,
    ) -> Result<Self, Error> {
        Ok(Self {
            standalone: Standalone::start(options, datapath, now)?,
            host,
        })
    }

    fn tick(&mut self, now: Instant) -> RoundReport {
        self.standalone.poll_manifests(now);
        self.standalone
            .agent
            .receive(Input::Host(self.host.0.clone()), now);
        self.standalone.tick(now)
    }

    /// The agent started on the web Service's manifest (in a directory of its own, `name`),
    /// after its first round: programmed and attached.
    fn serving_web(name: &str) -> (TempDirectory, Self, Instant) {
        let directory = TempDirectory::new(name);
        write(&directory, "web.yaml", SERVICE);
        let now = Instant::now();
        let mut agent = Self::start(options(&directory.0), FakeDatapath::default(), host(), now)
            .expect("starts");
        agent.tick(now);
        (directory, agent, now)
    }

    fn shut_down(&mut self) -> Result<(), Error> {
        self.standalone.shut_down()
    }
}

impl std::ops::Deref for Harness {
    type Target = NodeAgent<FakeDatapath>;
    fn deref(&self) -> &Self::Target {
        &self.standalone.agent
    }
}

impl std::ops::DerefMut for Harness {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.standalone.agent
    }
}

fn host() -> FakeHost {
    let interface = |index: u32, name: &str, address: Option<&str>| IpInterface {
        ifindex: index,
        ifname: name.to_string(),
        addr_info: address
            .into_iter()
            .map(|local| IpAddressInfo {
                family: "inet".to_string(),
                local: Some(local.to_string()),
                scope: Some("global".to_string()),
            })
            .collect(),
    };
    FakeHost(vec![
        interface(1, "lo", Some("127.0.0.1")),
        interface(2, "eth0", Some("192.168.1.10")),
        interface(3, "veth0", None),
        interface(4, "veth1", None),
    ])
}

struct TempDirectory(PathBuf);

impl TempDirectory {
    fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "switchyard-standalone-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("temp dir");
        Self(path)
    }
}

impl Drop for TempDirectory {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn options(manifests: &Path) -> StandaloneOptions {
    StandaloneOptions {
        manifests: manifests.to_path_buf(),
        datapath: DatapathOptions {
            pin_directory: PathBuf::from("/nonexistent"),
            map_sizes: crate::loader::MapSizes::default(),
            pod_interfaces: Globs::parse(DEFAULT_POD_INTERFACE_GLOBS),
            host_interfaces: None,
            masquerade_mark: 0x4000,
            manage_masquerade_rule: false,
            socket_hook_cgroup: SocketHookCgroup::Root,
            pod_connect_balancing: PodConnectBalancing::Tcp,
            served_families: Default::default(),
        },
        // Localhost NodePorts (on by default) would add an internal-scope
        // frontend per NodePort to the counts below; they have their own tests.
        node_ports: crate::desired::node_port_addresses::NodePortSettings {
            localhost: false,
            ..Default::default()
        },
        node_name: "node-a".to_string(),
        detach_on_exit: false,
        min_sync_period: Duration::ZERO,
        poll_interval: Duration::from_millis(200),
        gate_timeout: Duration::from_secs(30),
    }
}

const SERVICE: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, nodePort: 30080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.0.0.5], nodeName: node-a}
- {addresses: [10.0.0.6], nodeName: node-a}
"#;

fn write(directory: &TempDirectory, name: &str, text: &str) {
    // Modification times can be coarse: a distinct size also marks the change.
    std::fs::write(directory.0.join(name), text).expect("write manifest");
}

fn node_port_key() -> switchyard_common::FrontendKey {
    crate::desired::frontend_key(
        &"192.168.1.10".parse().expect("valid"),
        30080,
        crate::model::Protocol::Tcp,
        switchyard_common::SCOPE_EXTERNAL,
    )
}

#[test]
fn nothing_is_written_or_attached_before_the_manifests_are_read() {
    let directory = TempDirectory::new("gate");
    let manifests = directory.0.join("missing.yaml");
    let now = Instant::now();
    let mut agent =
        Harness::start(options(&manifests), FakeDatapath::default(), host(), now).expect("starts");
    agent.tick(now);
    agent.tick(now + Duration::from_secs(1));
    assert_eq!(agent.datapath.maps.mutations_attempted, 0);
    assert_eq!(agent.datapath.attach_calls, 0);
    assert_eq!(
        agent.gate_status(now + Duration::from_secs(1)),
        GateStatus::Waiting {
            missing: vec![
                GateInput::Services,
                GateInput::EndpointSlices,
                GateInput::DataplaneNode
            ]
        }
    );
}

#[test]
fn manifests_are_programmed_and_every_interface_attached_without_a_dataplane_node() {
    let (_directory, mut agent, now) = Harness::serving_web("program");
    let datapath = &agent.datapath;
    assert_eq!(
        datapath.maps.state.frontends[&node_port_key()].backend_count,
        2
    );
    assert_eq!(
        datapath.maps.config.map(|config| config.mode),
        Some(DATAPATH_MODE_ACTIVE)
    );
    assert!(datapath.socket_hooks);
    assert_eq!(
        datapath.attached.clone().into_iter().collect::<Vec<_>>(),
        vec![
            ("eth0".to_string(), InterfaceRole::Host),
            ("veth0".to_string(), InterfaceRole::Pod),
            ("veth1".to_string(), InterfaceRole::Pod),
        ]
    );
    // Nothing changed: the next ticks neither write nor attach.
    let (writes, attaches) = (datapath.maps.mutations_attempted, datapath.attach_calls);
    agent.tick(now + Duration::from_millis(200));
    agent.tick(now + Duration::from_millis(400));
    assert_eq!(agent.datapath.maps.mutations_attempted, writes);
    assert_eq!(agent.datapath.attach_calls, attaches);
}

#[test]
fn a_bad_manifest_keeps_the_last_good_state_and_a_fixed_one_is_applied() {
    let (directory, mut agent, now) = Harness::serving_web("bad");
    let good = agent.datapath.maps.state.clone();
    write(
        &directory,
        "web.yaml",
        &SERVICE.replace("nodePort: 30080", "nodePort: banana"),
    );
    agent.tick(now + Duration::from_secs(1));
    assert_eq!(agent.datapath.maps.state, good);
    write(
        &directory,
        "web.yaml",
        &SERVICE.replace("- {addresses: [10.0.0.6], nodeName: node-a}\n", ""),
    );
    agent.tick(now + Duration::from_secs(2));
    assert_eq!(
        agent.datapath.maps.state.frontends[&node_port_key()].backend_count,
        1
    );
}

#[test]
fn a_kube_proxy_dataplane_node_keeps_maps_in_sync_with_nothing_attached() {
    let directory = TempDirectory::new("kubeproxy");
    write(&directory, "web.yaml", SERVICE);
    write(
        &directory,
        "node.yaml",
        "apiVersion: switchyard.dev/v1alpha1\nkind: DataplaneNode\nmetadata: {name: node-a}\nspec: {mode: KubeProxy}\n",
    );
    let now = Instant::now();
    let mut agent = Harness::start(options(&directory.0), FakeDatapath::default(), host(), now)
        .expect("starts");
    agent.tick(now);
    assert!(agent
        .datapath
        .maps
        .state
        .frontends
        .contains_key(&node_port_key()));
    assert_eq!(agent.datapath.attach_calls, 0);
    assert_eq!(agent.attachment(), Attachment::Detached);
}

#[test]
fn switching_to_kube_proxy_drains_and_detaches_when_the_last_flow_closes() {
    let (directory, mut agent, now) = Harness::serving_web("drain");
    agent.datapath.live_flows = 2;
    write(
        &directory,
        "node.yaml",
        "apiVersion: switchyard.dev/v1alpha1\nkind: DataplaneNode\nmetadata: {name: node-a}\nspec: {mode: KubeProxy, drainTimeoutSeconds: 600}\n",
    );
    agent.tick(now + Duration::from_secs(1));
    assert!(matches!(agent.attachment(), Attachment::Draining { .. }));
    assert_eq!(
        agent.datapath.maps.config.map(|config| config.mode),
        Some(switchyard_common::DATAPATH_MODE_DRAINING)
    );
    assert_eq!(
        agent.datapath.attached.len(),
        3,
        "still attached while draining"
    );
    agent.datapath.live_flows = 0;
    agent.tick(now + Duration::from_secs(2));
    assert_eq!(agent.attachment(), Attachment::Detached);
    assert!(agent.datapath.attached.is_empty());
    assert!(
        !agent.datapath.maps.state.frontends.is_empty(),
        "maps are kept"
    );
}

#[test]
fn a_failed_detach_is_retried_every_round_and_the_node_is_detached_only_once_it_succeeds() {
    let (directory, mut agent, now) = Harness::serving_web("detach-retry");
    agent.datapath.failing_detaches.insert("veth1".into());
    write(
        &directory,
        "node.yaml",
        "apiVersion: switchyard.dev/v1alpha1\nkind: DataplaneNode\nmetadata: {name: node-a}\nspec: {mode: KubeProxy, drainTimeoutSeconds: 600}\n",
    );
    agent.tick(now + Duration::from_secs(1));
    assert!(matches!(agent.attachment(), Attachment::Draining { .. }));
    agent.tick(now + Duration::from_secs(2));
    assert_eq!(agent.attachment(), Attachment::Detaching);
    assert_eq!(
        agent.datapath.attached.keys().cloned().collect::<Vec<_>>(),
        vec!["veth1".to_string()]
    );
    let attach_calls = agent.datapath.attach_calls;
    agent.tick(now + Duration::from_secs(3));
    assert_eq!(agent.attachment(), Attachment::Detaching);
    assert_eq!(
        agent.datapath.attach_calls, attach_calls,
        "nothing re-attached"
    );
    agent.datapath.failing_detaches.clear();
    agent.tick(now + Duration::from_secs(4));
    assert_eq!(agent.attachment(), Attachment::Detached);
    assert!(agent.datapath.attached.is_empty());
}

#[test]
fn a_restarted_agent_writes_nothing_and_detaches_only_when_asked() {
    let directory = TempDirectory::new("restart");
    write(&directory, "web.yaml", SERVICE);
    let now = Instant::now();
    let mut first = Harness::start(options(&directory.0), FakeDatapath::default(), host(), now)
        .expect("starts");
    first.tick(now);
    first.shut_down().expect("shuts down");
    assert!(!first.datapath.detached_everything);
    let mut survivor = std::mem::take(&mut first.datapath);
    survivor.attach_calls = 0;
    let writes = survivor.maps.mutations_attempted;

    let mut second_options = options(&directory.0);
    second_options.detach_on_exit = true;
    let mut second = Harness::start(second_options, survivor, host(), now).expect("starts");
    assert_eq!(second.attachment(), Attachment::Attached);
    second.tick(now);
    assert_eq!(
        second.datapath.maps.mutations_attempted, writes,
        "no map write"
    );
    second.shut_down().expect("shuts down");
    assert!(second.datapath.detached_everything);
}

#[test]
fn each_round_reports_whether_the_maps_are_synced_and_hands_over_the_status_only_when_it_changed() {
    // The Ready condition of the status a round hands over.
    let ready_of = |round: RoundReport| {
        round
            .status
            .and_then(|written| written.status)
            .expect("a status is handed over")
            .conditions
            .into_iter()
            .find(|condition| condition.type_ == condition_types::READY)
            .expect("a Ready condition")
    };
    let directory = TempDirectory::new("round");
    let manifests = directory.0.join("later.yaml");
    let now = Instant::now();
    let mut agent =
        Harness::start(options(&manifests), FakeDatapath::default(), host(), now).expect("starts");
    // Before any manifest: the gate waits within its timeout, so there is no status yet, and
    // the catch-up priority must not end.
    let waiting = agent.tick(now);
    assert!(!waiting.synced && !waiting.ready, "{waiting:?}");
    assert_eq!(waiting.status, None);

    std::fs::write(&manifests, SERVICE).expect("write manifest");
    let synced = agent.tick(now + Duration::from_secs(1));
    assert!(synced.synced && synced.ready, "{synced:?}");
    assert_eq!(synced.sync.map(|(kind, _)| kind), Some("full"));
    assert_eq!(
        synced.frontends, 3,
        "the ClusterIP and the NodePort in two scopes"
    );
    assert_eq!(ready_of(synced).status, ConditionStatus::True);

    let unchanged = agent.tick(now + Duration::from_secs(2));
    assert!(unchanged.synced);
    assert_eq!(unchanged.status, None, "nothing changed, nothing to write");

    // A sync that fails to write an entry: not synced (a catch-up would go on), and the
    // status handed over says so.
    agent
        .datapath
        .maps
        .failing_frontends
        .insert(node_port_key());
    std::fs::write(
        &manifests,
        SERVICE.replace("- {addresses: [10.0.0.6], nodeName: node-a}\n", ""),
    )
    .expect("write manifest");
    let failed = agent.tick(now + Duration::from_secs(3));
    assert!(!failed.synced, "{failed:?}");
    assert!(
        failed.failed_entries.contains_key("default/web"),
        "{failed:?}"
    );
    let ready = ready_of(failed);
    assert_eq!(
        (ready.status, ready.reason.as_str()),
        (ConditionStatus::False, "SyncFailed")
    );
}

#[test]
fn manifests_that_appear_later_are_programmed_then() {
    let directory = TempDirectory::new("later");
    let manifests = directory.0.join("later.yaml");
    let now = Instant::now();
    let mut agent =
        Harness::start(options(&manifests), FakeDatapath::default(), host(), now).expect("starts");
    for tick in 0..3 {
        agent.tick(now + Duration::from_millis(200 * tick));
    }
    assert_eq!(agent.datapath.maps.mutations_attempted, 0);
    std::fs::write(&manifests, SERVICE).expect("write manifest");
    agent.tick(now + Duration::from_secs(1));
    assert!(agent
        .datapath
        .maps
        .state
        .frontends
        .contains_key(&node_port_key()));
}

#[test]
fn a_new_node_address_adds_its_node_ports() {
    let (_directory, mut agent, now) = Harness::serving_web("address");
    agent.host.0[1].addr_info.push(IpAddressInfo {
        family: "inet".to_string(),
        local: Some("192.168.1.11".to_string()),
        scope: Some("global".to_string()),
    });
    agent.tick(now + Duration::from_secs(1));
    let new_address = crate::desired::frontend_key(
        &"192.168.1.11".parse().expect("valid"),
        30080,
        crate::model::Protocol::Tcp,
        switchyard_common::SCOPE_EXTERNAL,
    );
    assert_eq!(
        agent.datapath.maps.state.frontends[&new_address].backend_count,
        2
    );
    assert!(agent
        .datapath
        .maps
        .state
        .frontends
        .contains_key(&node_port_key()));
}

#[test]
fn programs_found_attached_but_never_activated_are_activated() {
    let directory = TempDirectory::new("unactivated");
    write(&directory, "web.yaml", SERVICE);
    let mut datapath = FakeDatapath::default();
    datapath
        .attached
        .insert("veth0".to_string(), InterfaceRole::Pod);
    let now = Instant::now();
    let mut agent = Harness::start(options(&directory.0), datapath, host(), now).expect("starts");
    assert_eq!(agent.attachment(), Attachment::Detached);
    agent.tick(now);
    assert_eq!(agent.attachment(), Attachment::Attached);
    assert_eq!(
        agent.datapath.maps.config.map(|config| config.mode),
        Some(DATAPATH_MODE_ACTIVE)
    );
}

#[test]
fn a_change_to_one_services_manifest_is_a_partial_sync_and_a_resync_follows_the_period() {
    let directory = TempDirectory::new("partial");
    write(&directory, "web.yaml", SERVICE);
    // "name: web}" also renames the slice's service-name label.
    let api = SERVICE
        .replace("name: web}", "name: api}")
        .replace("name: web-1,", "name: api-1,")
        .replace("10.96.0.10", "10.96.0.20")
        .replace("nodePort: 30080", "nodePort: 30081");
    write(&directory, "api.yaml", &api);
    let now = Instant::now();
    let mut agent = Harness::start(options(&directory.0), FakeDatapath::default(), host(), now)
        .expect("starts");
    agent.tick(now);
    assert_eq!(
        (
            agent.counts.full_syncs,
            agent.counts.partial_syncs,
            agent.counts.resyncs
        ),
        (1, 0, 0)
    );
    let api_entries: Vec<_> = agent
        .datapath
        .maps
        .state
        .frontends
        .iter()
        .filter(|(key, _)| u16::from_be(key.port_big_endian) == 30081 || key.address[15] == 20)
        .map(|(key, value)| (*key, *value))
        .collect();
    assert_eq!(api_entries.len(), 3, "ClusterIP and NodePort in two scopes");

    // web loses an endpoint: only web is recomputed and written.
    let writes = agent.datapath.maps.mutations_attempted;
    write(
        &directory,
        "web.yaml",
        &SERVICE.replace("- {addresses: [10.0.0.6], nodeName: node-a}\n", ""),
    );
    agent.tick(now + Duration::from_secs(1));
    assert_eq!(agent.counts.partial_syncs, 1);
    assert_eq!(
        agent.datapath.maps.state.frontends[&node_port_key()].backend_count,
        1
    );
    // web's 3 frontends (new count) and its vacated slot; api untouched.
    assert_eq!(agent.datapath.maps.mutations_attempted - writes, 4);
    for (key, value) in &api_entries {
        assert_eq!(agent.datapath.maps.state.frontends.get(key), Some(value));
    }

    // The periodic resync re-reads the maps and finds nothing to correct.
    let writes = agent.datapath.maps.mutations_attempted;
    agent.tick(now + FULL_RESYNC_PERIOD - Duration::from_secs(1));
    assert_eq!(
        agent.counts.resyncs, 0,
        "not yet: a period after the first sync"
    );
    agent.tick(now + FULL_RESYNC_PERIOD);
    assert_eq!(agent.counts.resyncs, 1);
    assert_eq!(agent.datapath.maps.mutations_attempted, writes);
}

fn cluster_ip_key(address: &str) -> switchyard_common::FrontendKey {
    crate::desired::frontend_key(
        &address.parse().expect("valid"),
        80,
        crate::model::Protocol::Tcp,
        switchyard_common::SCOPE_INTERNAL,
    )
}

#[test]
fn a_service_owned_by_another_proxy_is_not_served_and_its_unlabelled_twin_is() {
    let directory = TempDirectory::new("proxy-name");
    let other = SERVICE
        .replace(
            "metadata: {name: web}",
            "metadata: {name: other, labels: {service.kubernetes.io/service-proxy-name: other-proxy}}",
        )
        .replace("10.96.0.10", "10.96.0.11")
        .replace("nodePort: 30080", "nodePort: 30081")
        .replace(
            "metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}",
            "metadata: {name: other-1, labels: {kubernetes.io/service-name: other, service.kubernetes.io/service-proxy-name: other-proxy}}",
        );
    write(&directory, "web.yaml", SERVICE);
    write(&directory, "other.yaml", &other);
    let now = Instant::now();
    let mut agent = Harness::start(options(&directory.0), FakeDatapath::default(), host(), now)
        .expect("starts");
    agent.tick(now);
    let frontends = &agent.datapath.maps.state.frontends;
    assert_eq!(frontends[&cluster_ip_key("10.96.0.10")].backend_count, 2);
    assert!(
        !frontends.contains_key(&cluster_ip_key("10.96.0.11")),
        "the other proxy's Service is served"
    );
    // web's ClusterIP and its NodePort in both scopes: nothing of `other`.
    assert_eq!(frontends.len(), 3);

    // The label removed: kube-proxy (and the agent) take the Service over.
    write(
        &directory,
        "other.yaml",
        &other.replace(
            "service.kubernetes.io/service-proxy-name: other-proxy",
            "app: other",
        ),
    );
    agent.tick(now + Duration::from_secs(1));
    assert_eq!(
        agent.datapath.maps.state.frontends[&cluster_ip_key("10.96.0.11")].backend_count,
        2
    );
}

#[test]
fn the_zone_of_the_node_manifest_narrows_hinted_endpoints_and_a_change_of_it_is_applied() {
    let directory = TempDirectory::new("zone");
    let hinted = SERVICE
        .replace(
            "- {addresses: [10.0.0.5], nodeName: node-a}",
            "- {addresses: [10.0.0.5], nodeName: node-a, hints: {forZones: [{name: zone-a}]}}",
        )
        .replace(
            "- {addresses: [10.0.0.6], nodeName: node-a}",
            "- {addresses: [10.0.0.6], nodeName: node-b, hints: {forZones: [{name: zone-b}]}}",
        );
    let node = |zone: &str| {
        format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: node-a, labels: {{topology.kubernetes.io/zone: {zone}}}}}\n---\napiVersion: v1\nkind: Node\nmetadata: {{name: node-b, labels: {{topology.kubernetes.io/zone: zone-b}}}}\n"
        )
    };
    write(&directory, "web.yaml", &hinted);
    write(&directory, "node.yaml", &node("zone-a"));
    let now = Instant::now();
    let mut agent = Harness::start(options(&directory.0), FakeDatapath::default(), host(), now)
        .expect("starts");
    agent.tick(now);
    let backends = |agent: &Harness| {
        agent.datapath.maps.state.frontends[&cluster_ip_key("10.96.0.10")].backend_count
    };
    assert_eq!(backends(&agent), 1, "zone-a keeps its one endpoint");
    // A zone no endpoint is hinted for: every endpoint (the control).
    write(&directory, "node.yaml", &node("zone-cc"));
    agent.tick(now + Duration::from_secs(1));
    assert_eq!(backends(&agent), 2);
    write(&directory, "node.yaml", &node("zone-b"));
    agent.tick(now + Duration::from_secs(2));
    assert_eq!(backends(&agent), 1, "zone-b keeps its one endpoint");
    // Without a Node manifest the node has no zone: every endpoint.
    std::fs::remove_file(directory.0.join("node.yaml")).expect("remove");
    agent.tick(now + Duration::from_secs(3));
    assert_eq!(backends(&agent), 2);
}
