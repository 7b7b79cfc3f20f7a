//! The agent's privileges, through the real binary in standalone mode:
//!
//! - the capabilities the chart grants its container (read from
//!   `charts/switchyard/templates/agent.yaml`): with exactly those, set as a
//!   container runtime sets them for a root container (`setpriv`: bounding set,
//!   no inheritable or ambient ones, no_new_privs), the agent serves and serves
//!   again after a restart; without each capability loading needs, it exits
//!   non-zero naming the capability;
//! - the BPF filesystem: where none holds the pin directory the agent mounts one
//!   (once: a second start uses it as is), and where it cannot (no parent
//!   directory, no CAP_SYS_ADMIN, a mount that would not reach the host) it
//!   exits saying how to mount one;
//! - a schema upgrade, which must recognise the hooks that run the new
//!   programs, finishes without CAP_SYS_ADMIN (no program lookups by id).
//!
//! Every test runs in private namespaces (see `datapath_support`): its mounts,
//! including the BPF filesystems the agent mounts, never reach the host's.

mod datapath_support;

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus},
    time::Duration,
};

use datapath_support::*;
use switchyard_agent::loader::{self, schema, Datapath, InterfaceKind};
use switchyard_common::SCHEMA_VERSION;

const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const NODE_PORT: u16 = 30080;
const NODE_NAME: &str = "node-a";

/// The chart's template of the agent DaemonSet.
fn chart_template() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/switchyard/templates/agent.yaml")
}

/// The capabilities the chart adds to the agent container (it drops all others):
/// the `- NAME` items under its one `add:`.
fn chart_capabilities() -> Vec<String> {
    let template =
        std::fs::read_to_string(chart_template()).expect("read the chart's agent template");
    let mut lines = template.lines().skip_while(|line| line.trim() != "add:");
    assert!(
        lines.next().is_some(),
        "the agent template has no capabilities `add:` list"
    );
    let capabilities: Vec<String> = lines
        .map_while(|line| line.trim().strip_prefix("- "))
        .map(|item| {
            item.split('#')
                .next()
                .unwrap_or_default()
                .trim()
                .to_string()
        })
        .collect();
    assert!(!capabilities.is_empty(), "the chart's `add:` list is empty");
    capabilities
}

/// The capability's bit (linux/capability.h) for the ones the chart may name.
fn capability_number(name: &str) -> u32 {
    match name {
        "NET_ADMIN" => 12,
        "NET_RAW" => 13,
        "SYS_ADMIN" => CAP_SYS_ADMIN,
        "SYS_NICE" => 23,
        "SYS_RESOURCE" => 24,
        "PERFMON" => 38,
        "BPF" => 39,
        other => panic!("capability {other} unknown to this test: add its number"),
    }
}

/// The `CapXxx:` mask of `/proc/<pid>/status` (`pid`: "self" or a number).
fn capability_mask(pid: &str, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    status
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{field}:")))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .expect("a capability mask")
}

fn write_manifests(directory: &Path, backend: &Pod) {
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
- {{addresses: [{}], nodeName: {NODE_NAME}}}
",
        backend.ip
    );
    std::fs::create_dir_all(directory).expect("manifest directory");
    std::fs::write(directory.join("web.yaml"), manifests).expect("write manifests");
}

/// One agent process and its log.
struct Agent {
    child: Child,
    log: PathBuf,
}

impl Agent {
    /// Starts `switchyard-agent standalone` on the node's topology with its pins
    /// under `pin_directory`; `capabilities`: run it as a root container with
    /// exactly these (`None`: as this test, with every capability).
    fn start(
        node: &Node,
        pin_directory: &Path,
        log_name: &str,
        capabilities: Option<&[String]>,
    ) -> Self {
        let log = node.work.join(log_name);
        let output = std::fs::File::create(&log).expect("agent log");
        let errors = output.try_clone().expect("agent log");
        let mut command = match capabilities {
            Some(capabilities) => {
                let bounding: Vec<String> = capabilities
                    .iter()
                    .map(|name| format!("+{}", name.to_lowercase()))
                    .collect();
                let mut command = Command::new("setpriv");
                command
                    .args([
                        "--reuid=0",
                        "--regid=0",
                        "--clear-groups",
                        "--inh-caps=-all",
                    ])
                    .arg(format!("--bounding-set=-all,{}", bounding.join(",")))
                    .args(["--no-new-privs", "--"])
                    .arg(env!("CARGO_BIN_EXE_switchyard-agent"));
                command
            }
            None => Command::new(env!("CARGO_BIN_EXE_switchyard-agent")),
        };
        let socket_hooks: Vec<std::ffi::OsString> = match &node.cgroup {
            Some(cgroup) => vec!["--cgroup".into(), cgroup.into()],
            None => vec!["--no-socket-hooks".into()],
        };
        let child = command
            .args(["standalone", "--manifests"])
            .arg(node.work.join("manifests"))
            .args(["--pod-interfaces", "veth-*", "--host-interfaces", "ext0"])
            .args(["--node-ip", "192.168.50.1", "--node-name", NODE_NAME])
            .args(["--min-sync-period-ms", "100", "--bpf-pin-dir"])
            .arg(pin_directory)
            .args(socket_hooks)
            .env("RUST_LOG", "info")
            .stdin(std::process::Stdio::null())
            .stdout(output)
            .stderr(errors)
            .spawn()
            .expect("start switchyard-agent");
        Self { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its exit status, once it exits within `timeout`.
    fn exit_within(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let mut status = None;
        wait_until(timeout, || {
            status = self.child.try_wait().ok().flatten();
            status.is_some()
        });
        status
    }

    fn stop(mut self) {
        // SAFETY: kill has no memory preconditions; the pid is our child's.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.exit_within(Duration::from_secs(10));
        assert!(
            status.is_some_and(|status| status.success()),
            "the agent did not stop cleanly on SIGTERM ({status:?}):\n{}",
            self.log()
        );
    }
}

/// The topology: `pod1` serves, `pod2` is a client, and the external client.
fn topology(node: &Node) -> Vec<Pod> {
    let pods = standard_topology(2);
    start_servers(&pods[0]);
    write_manifests(&node.work.join("manifests"), &pods[0]);
    pods
}

/// Whether the Service answers through every path the agent programs: a pod's
/// ClusterIP (TC on its veth, and the connect hook), the NodePort from outside
/// (TC on ext0), and a host process's ClusterIP (the socket hooks).
fn serves() -> bool {
    [
        (Some("pod2"), SocketAddrV4::new(CLUSTER_IP, 80)),
        (Some("client"), SocketAddrV4::new(NODE_IP, NODE_PORT)),
        (None, SocketAddrV4::new(CLUSTER_IP, 80)),
    ]
    .into_iter()
    .all(|(namespace, address)| {
        in_namespace(namespace, move || {
            tcp_request(address, Duration::from_millis(300)).is_ok()
        })
        .join()
        .unwrap_or(false)
    })
}

/// Waits until the agent has attached everything (its log says so: a restarted
/// agent's predecessor's programs serve before it has) and the Service answers.
fn wait_until_serving(agent: &Agent) {
    assert!(
        wait_until(Duration::from_secs(30), || agent
            .log()
            .contains("socket hooks attached")),
        "the agent never attached its socket hooks:\n{}",
        agent.log()
    );
    assert!(
        wait_until(Duration::from_secs(30), serves),
        "the agent never served:\n{}\n{}",
        agent.log(),
        diagnostics()
    );
}

/// The BPF filesystems mounted exactly at `path`, from `/proc/self/mountinfo`.
fn bpf_mounts_at(path: &Path) -> usize {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("read mountinfo");
    let path = path.to_string_lossy();
    mountinfo
        .lines()
        .filter(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let file_system = fields
                .iter()
                .position(|field| *field == "-")
                .and_then(|separator| fields.get(separator + 1));
            fields.get(4) == Some(&path.as_ref()) && file_system == Some(&"bpf")
        })
        .count()
}

/// Whether the agent's programs are pinned under `pin_directory`: maps, programs,
/// and links.
fn pins_present(pin_directory: &Path) -> bool {
    let count =
        |directory: PathBuf| std::fs::read_dir(directory).map_or(0, |entries| entries.count());
    let version_directory = std::fs::read_dir(pin_directory)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .find(|path| {
            path.file_name()
                .is_some_and(|name| name.to_string_lossy().starts_with('v'))
        });
    version_directory
        .is_some_and(|version| count(version.clone()) > 1 && count(version.join("programs")) > 0)
        && count(pin_directory.join("links")) > 0
}

const MOUNTED_MESSAGE: &str = "mounted a BPF filesystem for the pins";

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn the_agent_serves_with_exactly_the_charts_capabilities_and_again_after_a_restart() {
    run_isolated(
        "the_agent_serves_with_exactly_the_charts_capabilities_and_again_after_a_restart",
        |node| {
            topology(node);
            let capabilities = chart_capabilities();
            let agent = Agent::start(node, &node.pin_directory, "first.log", Some(&capabilities));
            wait_until_serving(&agent);
            // The agent holds exactly the chart's capabilities, as far as this
            // machine's bounding set has them (a runtime cannot grant more).
            let granted = capabilities
                .iter()
                .fold(0u64, |mask, name| mask | 1 << capability_number(name));
            let expected = granted & capability_mask("self", "CapBnd");
            let pid = agent.child.id().to_string();
            assert_eq!(
                capability_mask(&pid, "CapEff"),
                expected,
                "the agent's effective capabilities are not the chart's {capabilities:?}"
            );
            assert_eq!(capability_mask(&pid, "CapBnd"), expected);
            assert_eq!(capability_mask(&pid, "CapAmb"), 0);
            agent.stop();
            // A restart takes over the pinned links, with the same capabilities.
            let agent = Agent::start(node, &node.pin_directory, "second.log", Some(&capabilities));
            wait_until_serving(&agent);
            assert!(!agent.log().contains("ERROR"), "{}", agent.log());
            agent.stop();
        },
    );
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn without_a_capability_loading_needs_the_agent_exits_naming_it() {
    run_isolated(
        "without_a_capability_loading_needs_the_agent_exits_naming_it",
        |node| {
            topology(node);
            let capabilities = chart_capabilities();
            for missing in ["BPF", "PERFMON", "NET_ADMIN"] {
                assert!(
                    capabilities.iter().any(|name| name == missing),
                    "the chart no longer grants {missing}: {capabilities:?}"
                );
                let without: Vec<String> = capabilities
                    .iter()
                    .filter(|name| *name != missing)
                    .cloned()
                    .collect();
                let mut agent = Agent::start(
                    node,
                    &node.pin_directory,
                    &format!("without-{missing}.log"),
                    Some(&without),
                );
                let status = agent.exit_within(Duration::from_secs(30));
                let log = agent.log();
                assert!(
                    status.is_some_and(|status| status.code() == Some(1)),
                    "without {missing} the agent did not exit with 1 ({status:?}):\n{log}"
                );
                assert!(
                    log.contains("failed to load the datapath programs")
                        && log.contains(&format!("this process lacks CAP_{missing}")),
                    "without {missing} the error does not name it:\n{log}"
                );
                assert!(!serves(), "without {missing} something serves the Service");
            }
        },
    );
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn the_agent_mounts_a_bpf_filesystem_where_none_is_and_pins_in_it_once() {
    run_isolated(
        "the_agent_mounts_a_bpf_filesystem_where_none_is_and_pins_in_it_once",
        |node| {
            topology(node);
            // The pin root (the pin directory's parent) does not exist yet; its
            // parent, the test's work directory, does and is no BPF filesystem.
            let root = node.work.join("unmounted");
            let pin_directory = root.join("switchyard");
            assert_eq!(bpf_mounts_at(&root), 0);
            let agent = Agent::start(node, &pin_directory, "first.log", None);
            wait_until_serving(&agent);
            assert_eq!(
                bpf_mounts_at(&root),
                1,
                "no BPF filesystem at {}",
                root.display()
            );
            assert!(
                pins_present(&pin_directory),
                "nothing pinned under {}",
                pin_directory.display()
            );
            assert!(agent.log().contains(MOUNTED_MESSAGE), "{}", agent.log());
            agent.stop();
            // The next agent finds it and stacks no second mount on it.
            let agent = Agent::start(node, &pin_directory, "second.log", None);
            wait_until_serving(&agent);
            assert_eq!(
                bpf_mounts_at(&root),
                1,
                "a second BPF filesystem was stacked"
            );
            assert!(!agent.log().contains(MOUNTED_MESSAGE), "{}", agent.log());
            agent.stop();
        },
    );
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn an_already_mounted_bpf_filesystem_is_used_as_is() {
    run_isolated("an_already_mounted_bpf_filesystem_is_used_as_is", |node| {
        topology(node);
        // The harness mounted one at the pin directory's parent.
        let root = node.pin_directory.parent().expect("pin root").to_path_buf();
        assert_eq!(bpf_mounts_at(&root), 1);
        let agent = Agent::start(node, &node.pin_directory, "agent.log", None);
        wait_until_serving(&agent);
        assert_eq!(
            bpf_mounts_at(&root),
            1,
            "a second BPF filesystem was stacked"
        );
        assert!(pins_present(&node.pin_directory));
        assert!(!agent.log().contains(MOUNTED_MESSAGE), "{}", agent.log());
        agent.stop();
    });
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn a_pin_directory_covered_by_another_file_system_is_refused_without_stacking_a_bpf_filesystem() {
    run_isolated(
        "a_pin_directory_covered_by_another_file_system_is_refused_without_stacking_a_bpf_filesystem",
        |node| {
            topology(node);
            // The harness mounted a BPF filesystem at the pin directory's parent (the
            // control, an_already_mounted_bpf_filesystem_is_used_as_is, serves from it); here
            // a tmpfs covers the pin directory itself, as a mistaken mount on a host would.
            let root = node.pin_directory.parent().expect("pin root").to_path_buf();
            sh(&format!(
                "mkdir -p {pins} && mount -t tmpfs covering-tmpfs {pins}",
                pins = node.pin_directory.display()
            ));
            let mut agent = Agent::start(node, &node.pin_directory, "covered.log", None);
            let status = agent.exit_within(Duration::from_secs(30));
            let log = agent.log();
            assert!(
                status.is_some_and(|status| status.code() == Some(1)),
                "the agent did not exit with 1 ({status:?}):\n{log}"
            );
            assert!(
                log.contains("is covered by another file system mounted over it")
                    && log.contains(&format!("`umount {}`", node.pin_directory.display())),
                "the error does not name what covers the pin directory:\n{log}"
            );
            assert_eq!(
                bpf_mounts_at(&root),
                1,
                "a second BPF filesystem was stacked over the pins"
            );
            assert!(!serves(), "something serves the Service");
        },
    );
}

/// Starts the agent on `pin_directory` and expects it to exit with 1, logging
/// how to mount a BPF filesystem at `root` and mounting none there.
fn expect_exit_saying_how_to_mount(
    node: &Node,
    pin_directory: &Path,
    root: &Path,
    log_name: &str,
    capabilities: Option<&[String]>,
    reason: &str,
) {
    let mut agent = Agent::start(node, pin_directory, log_name, capabilities);
    let status = agent.exit_within(Duration::from_secs(30));
    let log = agent.log();
    assert!(
        status.is_some_and(|status| status.code() == Some(1)),
        "{reason}: the agent did not exit with 1 ({status:?}):\n{log}"
    );
    let command = format!("`mount -t bpf bpf {}`", root.display());
    assert!(
        log.contains(&format!(
            "failed to mount a BPF filesystem at {}",
            root.display()
        )) && log.contains(&command)
            && log.contains("agent.mountBpfFilesystem=true"),
        "{reason}: the error does not say how to mount one ({command}):\n{log}"
    );
    assert_eq!(bpf_mounts_at(root), 0, "{reason}: something was mounted");
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn where_no_bpf_filesystem_can_be_mounted_the_agent_exits_saying_how_to_mount_one() {
    run_isolated(
        "where_no_bpf_filesystem_can_be_mounted_the_agent_exits_saying_how_to_mount_one",
        |node| {
            topology(node);
            // Neither the pin root nor its parent exists.
            let root = node.work.join("missing").join("bpf");
            expect_exit_saying_how_to_mount(
                node,
                &root.join("switchyard"),
                &root,
                "no-parent.log",
                None,
                "no parent",
            );
            let log = std::fs::read_to_string(node.work.join("no-parent.log")).unwrap_or_default();
            assert!(
                log.contains(&format!("`mkdir -p {}`", root.display())),
                "{log}"
            );

            // The chart's capabilities, which leave CAP_SYS_ADMIN out.
            let capabilities = chart_capabilities();
            assert!(!capabilities.iter().any(|name| name == "SYS_ADMIN"));
            let root = node.work.join("unmounted");
            expect_exit_saying_how_to_mount(
                node,
                &root.join("switchyard"),
                &root,
                "no-sys-admin.log",
                Some(&capabilities),
                "without CAP_SYS_ADMIN",
            );

            // A container's hostPath with HostToContainer propagation: a slave
            // of a shared mount. A mount there would stay in this namespace.
            let host = node.work.join("host-directory");
            let container = node.work.join("container-view");
            sh(&format!(
                "mkdir -p {host} {container}
                 mount --bind {host} {host} && mount --make-shared {host}
                 mount --bind {host} {container} && mount --make-slave {container}",
                host = host.display(),
                container = container.display()
            ));
            expect_exit_saying_how_to_mount(
                node,
                &container.join("switchyard"),
                &container,
                "slave.log",
                None,
                "a slave mount",
            );
            let log = std::fs::read_to_string(node.work.join("slave.log")).unwrap_or_default();
            assert!(log.contains("would not reach the host"), "{log}");
            assert!(!serves(), "something serves the Service");
        },
    );
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn mount_bpf_fs_mounts_one_where_none_is_and_then_finds_it() {
    run_isolated(
        "mount_bpf_fs_mounts_one_where_none_is_and_then_finds_it",
        |node| {
            let root = node.work.join("init");
            let mount = || {
                Command::new(env!("CARGO_BIN_EXE_switchyard-agent"))
                    .args(["mount-bpf-fs", "--bpf-pin-dir"])
                    .arg(root.join("switchyard"))
                    .output()
                    .expect("run mount-bpf-fs")
            };
            let first = mount();
            assert!(first.status.success(), "{first:?}");
            assert!(
                String::from_utf8_lossy(&first.stderr).contains(MOUNTED_MESSAGE),
                "{first:?}"
            );
            assert_eq!(bpf_mounts_at(&root), 1);
            let second = mount();
            assert!(second.status.success(), "{second:?}");
            assert!(
                String::from_utf8_lossy(&second.stderr)
                    .contains("a BPF filesystem is mounted already"),
                "{second:?}"
            );
            assert_eq!(
                bpf_mounts_at(&root),
                1,
                "a second BPF filesystem was stacked"
            );
        },
    );
}

/// Removes `capability` from the calling thread's effective set (capabilities are
/// per thread; threads it creates afterwards inherit the set).
fn drop_effective_capability(capability: u32) {
    // struct __user_cap_header_struct and two __user_cap_data_struct (version 3).
    let mut header = [0x2008_0522u32, 0];
    let mut data = [0u32; 6];
    // SAFETY: capget and capset read and write only the two buffers given, of
    // the sizes version 3 defines.
    let result = unsafe { libc::syscall(libc::SYS_capget, header.as_mut_ptr(), data.as_mut_ptr()) };
    assert_eq!(result, 0, "capget: {}", std::io::Error::last_os_error());
    let (word, bit) = ((capability / 32) as usize, capability % 32);
    data[word * 3] &= !(1 << bit);
    let result = unsafe { libc::syscall(libc::SYS_capset, header.as_mut_ptr(), data.as_ptr()) };
    assert_eq!(result, 0, "capset: {}", std::io::Error::last_os_error());
}

/// A history in which the previous version had exactly the current layout (as
/// `datapath_upgrade.rs` uses): every map is taken over.
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

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn a_schema_upgrade_finishes_without_cap_sys_admin() {
    run_isolated("a_schema_upgrade_finishes_without_cap_sys_admin", |node| {
        let pods = standard_topology(1);
        let (datapath, maps) = start_datapath(node, &pods);
        drop((datapath, maps));
        // The running datapath now looks like one of the previous schema version.
        let current = loader::version_directory(&node.pin_directory, SCHEMA_VERSION);
        let older = loader::version_directory(&node.pin_directory, SCHEMA_VERSION - 1);
        std::fs::rename(&current, &older).expect("move the pins to the older version");

        drop_effective_capability(CAP_SYS_ADMIN);
        // Control: this thread can no longer look a program up by its id.
        let link = loader::links_directory(&node.pin_directory).join("cgroup-connect4");
        let link = loader::system::open_pinned(&link).expect("open the connect hook's link");
        let program_id = loader::system::link_info(std::os::fd::AsFd::as_fd(&link))
            .expect("link info")
            .program_id;
        let lookup = loader::system::program_tag_of_id(program_id);
        assert_eq!(
            lookup.as_ref().map_err(std::io::Error::raw_os_error),
            Err(Some(libc::EPERM)),
            "the lookup by id still works: CAP_SYS_ADMIN was not dropped"
        );

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
        assert!(
            !older.exists(),
            "the old version's pins stay: the hooks were not recognised as running the new programs"
        );
    });
}

const CAP_SYS_ADMIN: u32 = 21;

/// Runs `command` (a tool the agent runs: its children inherit its capabilities)
/// as a root container with exactly `capabilities`; its output, or the error.
fn run_tool_with(capabilities: &[String], command: &str) -> Result<String, String> {
    let bounding: Vec<String> = capabilities
        .iter()
        .map(|name| format!("+{}", name.to_lowercase()))
        .collect();
    let output = Command::new("setpriv")
        .args([
            "--reuid=0",
            "--regid=0",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(format!("--bounding-set=-all,{}", bounding.join(",")))
        .args(["--no-new-privs", "--", "bash", "-c", command])
        .output()
        .expect("run setpriv");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if output.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

#[test]
#[ignore = "privileged netns test: run by make datapath-test"]
fn the_charts_capabilities_let_the_agents_tools_edit_both_iptables_backends_and_net_raw_is_legacys()
{
    run_isolated(
        "the_charts_capabilities_let_the_agents_tools_edit_both_iptables_backends_and_net_raw_is_legacys",
        |_node| {
            let capabilities = chart_capabilities();
            // What kube-proxy detection and cleanup and the masquerade rule do:
            // read and write nat chains in both backends, and read nftables.
            let legacy = "iptables-legacy -w -t nat -N SY-PRIVILEGES && iptables-legacy-save -t nat \
                          && iptables-legacy -w -t nat -X SY-PRIVILEGES";
            let nft = "iptables-nft -w -t nat -N SY-PRIVILEGES && iptables-nft-save -t nat \
                       && iptables-nft -w -t nat -X SY-PRIVILEGES && nft list ruleset";
            for command in [legacy, nft] {
                let output = run_tool_with(&capabilities, command);
                assert!(output.is_ok(), "with the chart's capabilities `{command}` failed: {output:?}");
            }
            let without_net_raw: Vec<String> = capabilities
                .iter()
                .filter(|name| *name != "NET_RAW")
                .cloned()
                .collect();
            let output = run_tool_with(&without_net_raw, legacy);
            assert!(
                output.as_ref().is_err_and(|error| error.contains("Permission denied")),
                "iptables-legacy worked without NET_RAW: {output:?}"
            );
            let output = run_tool_with(&without_net_raw, nft);
            assert!(output.is_ok(), "the nf_tables backend needs NET_RAW: {output:?}");
        },
    );
}
