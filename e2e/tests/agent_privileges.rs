//! Switchyard's pods run as a kubelet would run them (issue 26): from their images, with
//! their securityContext. The pod runner starts them with crun; these tests look at what
//! the kernel says of the processes and at what a pod lacking a capability does.
//!
//! Run inside a cluster (`e2e/cluster exec cargo test ... -- --ignored`):
//! - `make e2e-agent` runs every test here whose name has `agent` in it, after the agent
//!   scenarios, on the cluster of `e2e/manifests/agent.yaml`;
//! - `make e2e-operator` runs the `running_switchyard` ones after the migration scenarios,
//!   on the cluster where the chart is installed.

mod agent_support;

use std::collections::BTreeSet;
use std::time::Duration;

use agent_support::*;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde::Deserialize;
use switchyard_crds::{condition_types, find_condition, ConditionStatus};
use switchyard_e2e::cluster::{admin_client, ClusterPaths};
use switchyard_e2e::pod_runner::bundle::held_capabilities;
use switchyard_e2e::pod_runner::container::{capabilities, capability_names};
use switchyard_e2e::pod_runner::events::{read_events, running_processes, EventKind, RunnerEvent};
use switchyard_e2e::wait::{wait_for, Check, WaitOptions};

/// What the kernel says of a process's privileges (`/proc/PID/status`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Privileges {
    effective: BTreeSet<String>,
    permitted: BTreeSet<String>,
    bounding: BTreeSet<String>,
    inheritable: BTreeSet<String>,
    ambient: BTreeSet<String>,
    no_new_privileges: bool,
    /// Real, effective, saved and filesystem user IDs.
    user_ids: Vec<u32>,
    group_ids: Vec<u32>,
    /// 0 none, 1 strict, 2 filter.
    seccomp: u32,
}

fn read_privileges(status_path: &str) -> Result<Privileges, String> {
    let status = std::fs::read_to_string(status_path)
        .map_err(|error| format!("failed to read {status_path}: {error}"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{name}:")))
            .map(str::trim)
            .ok_or_else(|| format!("{status_path} has no {name}"))
    };
    let mask = |name: &str| -> Result<BTreeSet<String>, String> {
        let text = field(name)?;
        u64::from_str_radix(text, 16)
            .map(capability_names)
            .map_err(|_| format!("{name} of {status_path} is not hex: {text:?}"))
    };
    let numbers = |name: &str| -> Result<Vec<u32>, String> {
        field(name)?
            .split_whitespace()
            .map(|word| {
                word.parse()
                    .map_err(|_| format!("{name} of {status_path}: {word:?}"))
            })
            .collect()
    };
    Ok(Privileges {
        effective: mask("CapEff")?,
        permitted: mask("CapPrm")?,
        bounding: mask("CapBnd")?,
        inheritable: mask("CapInh")?,
        ambient: mask("CapAmb")?,
        no_new_privileges: field("NoNewPrivs")? == "1",
        user_ids: numbers("Uid")?,
        group_ids: numbers("Gid")?,
        seccomp: field("Seccomp")?
            .parse()
            .map_err(|_| format!("Seccomp of {status_path}"))?,
    })
}

/// The privileges of every thread of a process (they may differ: each thread has its own
/// credentials).
fn thread_privileges(pid: u32) -> Result<Vec<(String, Privileges)>, String> {
    let tasks = format!("/proc/{pid}/task");
    let listing =
        std::fs::read_dir(&tasks).map_err(|error| format!("failed to list {tasks}: {error}"))?;
    let mut threads = Vec::new();
    for task in listing.flatten() {
        let path = format!("{}/status", task.path().display());
        threads.push((path.clone(), read_privileges(&path)?));
    }
    Ok(threads)
}

async fn client() -> (ClusterPaths, Client) {
    let paths = ClusterPaths::from_environment();
    let client = admin_client(&paths).await.expect("an admin client");
    (paths, client)
}

/// The running processes of a container name, with their pods.
async fn running(
    paths: &ClusterPaths,
    client: &Client,
    container: &str,
) -> Vec<(RunnerEvent, Pod)> {
    let events = read_events(&paths.pod_runner_events()).expect("the pod runner's events");
    let mut found = Vec::new();
    for event in running_processes(&events, container).into_values() {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &event.namespace);
        let pod = pods.get(&event.pod).await.unwrap_or_else(|error| {
            panic!(
                "failed to read pod {}/{}: {error}",
                event.namespace, event.pod
            )
        });
        found.push((event, pod));
    }
    found
}

fn container_of<'a>(pod: &'a Pod, name: &str) -> &'a Container {
    pod.spec
        .as_ref()
        .and_then(|spec| {
            spec.containers
                .iter()
                .find(|container| container.name == name)
        })
        .unwrap_or_else(|| panic!("pod {:?} has no container {name}", pod.metadata.name))
}

/// What the pod's securityContext grants the container (as a kubelet with containerd
/// gives it), limited to what this machine lets the runner hold.
fn granted(container: &Container) -> BTreeSet<String> {
    let context = container.security_context.clone().unwrap_or_default();
    let spec = capabilities(
        context.privileged == Some(true),
        context.capabilities.as_ref(),
    );
    let held = held_capabilities().expect("this process's own capabilities");
    spec.intersection(&held).cloned().collect()
}

#[tokio::test]
#[ignore = "needs the e2e cluster: make e2e-agent or make e2e-operator"]
async fn running_switchyard_agents_hold_exactly_the_capabilities_their_pod_grants() {
    let (paths, client) = client().await;
    let agents = running(&paths, &client, "agent").await;
    assert!(!agents.is_empty(), "no agent process runs");
    for (event, pod) in &agents {
        let container = container_of(pod, "agent");
        let wanted = granted(container);
        assert!(
            !wanted.contains("CAP_SYS_ADMIN"),
            "the agent's pod grants SYS_ADMIN: {wanted:?}"
        );
        let pid = event.pid.expect("the runner reports the container's pid");
        let threads = thread_privileges(pid).expect("the agent's threads");
        println!(
            "agent {} on {}: pid {pid}, {} threads, {:?}",
            event.pod,
            event.node,
            threads.len(),
            threads[0].1
        );
        for (path, privileges) in threads {
            for (set, held) in [
                ("effective", &privileges.effective),
                ("permitted", &privileges.permitted),
                ("bounding", &privileges.bounding),
            ] {
                assert_eq!(held, &wanted, "{path}: the {set} set");
            }
            assert!(privileges.inheritable.is_empty(), "{path}: {privileges:?}");
            assert!(privileges.ambient.is_empty(), "{path}: {privileges:?}");
            assert!(
                privileges.no_new_privileges,
                "{path}: allowPrivilegeEscalation is false, so no_new_privs is set"
            );
        }
    }
}

#[tokio::test]
#[ignore = "needs the e2e cluster with the chart installed: make e2e-operator"]
async fn running_switchyard_operators_run_as_their_non_root_user_with_no_capability() {
    let (paths, client) = client().await;
    let operators = running(&paths, &client, "operator").await;
    assert!(!operators.is_empty(), "no operator process runs");
    for (event, pod) in &operators {
        let run_as = pod
            .spec
            .as_ref()
            .and_then(|spec| spec.security_context.as_ref())
            .and_then(|context| context.run_as_user)
            .expect("the chart sets the operator's runAsUser");
        assert_ne!(run_as, 0);
        let pid = event.pid.expect("the runner reports the container's pid");
        for (path, privileges) in thread_privileges(pid).expect("the operator's threads") {
            assert!(
                privileges
                    .user_ids
                    .iter()
                    .all(|id| i64::from(*id) == run_as),
                "{path}: user IDs {:?}, the pod says {run_as}",
                privileges.user_ids
            );
            assert!(
                privileges.group_ids.iter().all(|id| *id != 0),
                "{path}: group IDs {:?}",
                privileges.group_ids
            );
            for set in [
                &privileges.effective,
                &privileges.permitted,
                &privileges.bounding,
                &privileges.ambient,
            ] {
                assert!(set.is_empty(), "{path}: {privileges:?}");
            }
            assert!(privileges.no_new_privileges, "{path}: {privileges:?}");
            assert_eq!(
                privileges.seccomp, 2,
                "{path}: seccomp RuntimeDefault is a filter"
            );
        }
        println!(
            "operator {} on {}: pid {pid}, user {run_as}",
            event.pod, event.node
        );
    }
}

fn capability_list(daemon_set: &DaemonSet) -> Vec<String> {
    daemon_set
        .spec
        .as_ref()
        .and_then(|spec| spec.template.spec.as_ref())
        .and_then(|spec| spec.containers.iter().find(|c| c.name == "agent"))
        .and_then(|container| container.security_context.as_ref())
        .and_then(|context| context.capabilities.as_ref())
        .and_then(|capabilities| capabilities.add.clone())
        .expect("the agent container adds capabilities")
}

async fn set_agent_capabilities(daemon_sets: &Api<DaemonSet>, add: &[String]) {
    let patch = serde_json::json!({"spec": {"template": {"spec": {"containers": [
        {"name": "agent", "securityContext": {"capabilities": {"add": add}}}
    ]}}}});
    daemon_sets
        .patch(
            "switchyard-agent",
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await
        .unwrap_or_else(|error| panic!("failed to patch the agent DaemonSet: {error}"));
}

/// Deletes node-1's agent pod (the DaemonSet's OnDelete strategy makes its replacement
/// from the current template); gives the deleted pod's UID.
async fn replace_node_1_agent_pod(client: &Client) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    let listed = pods
        .list(
            &ListParams::default()
                .labels("app.kubernetes.io/name=switchyard-agent")
                .fields("spec.nodeName=node-1"),
        )
        .await
        .expect("list the agent pods");
    let pod = listed
        .items
        .into_iter()
        .find(|pod| pod.metadata.deletion_timestamp.is_none())
        .expect("node-1 has an agent pod");
    let name = pod.metadata.name.clone().expect("a name");
    pods.delete(&name, &DeleteParams::default())
        .await
        .unwrap_or_else(|error| panic!("failed to delete pod {name}: {error}"));
    pod.metadata.uid.expect("a uid")
}

#[tokio::test]
#[ignore = "needs the e2e cluster: make e2e-agent"]
async fn an_agent_without_net_admin_exits_with_the_reason_in_its_log_and_its_dataplane_node() {
    let cluster = setup().await;
    let daemon_sets: Api<DaemonSet> = Api::namespaced(cluster.client.clone(), "kube-system");
    let daemon_set = daemon_sets
        .get("switchyard-agent")
        .await
        .expect("the agent DaemonSet");
    let chart_capabilities = capability_list(&daemon_set);
    assert!(chart_capabilities.iter().any(|name| name == "NET_ADMIN"));
    let without: Vec<String> = chart_capabilities
        .iter()
        .filter(|name| name.as_str() != "NET_ADMIN")
        .cloned()
        .collect();
    set_agent_capabilities(&daemon_sets, &without).await;
    let since = switchyard_e2e::pod_runner::events::now_unix_ms();
    let old_uid = replace_node_1_agent_pod(&cluster.client).await;

    // The new pod's agent starts (its image and volumes are fine) and exits.
    let exited = wait_for(
        "see node-1's new agent (without NET_ADMIN) exit",
        WaitOptions::new(Duration::from_secs(90)).every(Duration::from_millis(200)),
        || async {
            let events = read_events(&cluster.paths.pod_runner_events())
                .map_err(|error| error.to_string())?;
            let exited = events.into_iter().find(|event| {
                event.kind == EventKind::Exited
                    && event.container == "agent"
                    && event.node == "node-1"
                    && event.pod_uid != old_uid
                    && event.at_unix_ms >= since
            });
            Ok::<_, String>(match exited {
                Some(event) => Check::Ready(event),
                None => Check::NotYet("no exit yet".into()),
            })
        },
    )
    .await
    .unwrap();
    assert_ne!(
        exited.detail.as_deref(),
        Some("exit status: 0"),
        "the agent failed: {exited:?}"
    );
    let log_path = cluster
        .paths
        .process_directory(&exited.namespace, &exited.pod, &exited.pod_uid, "agent")
        .join("output.log");
    let log = std::fs::read_to_string(&log_path)
        .unwrap_or_else(|error| panic!("failed to read {}: {error}", log_path.display()));
    println!("the agent's log without NET_ADMIN:\n{log}");
    let error_line = log
        .lines()
        .find(|line| line.contains("ERROR"))
        .unwrap_or_else(|| panic!("no ERROR line in {}", log_path.display()));
    assert!(
        error_line.contains("failed to load the datapath")
            && error_line.contains("lacks CAP_NET_ADMIN")
            && error_line.contains("Operation not permitted"),
        "the error says what failed, why and what is missing: {error_line}"
    );

    // The DataplaneNode says it too.
    cluster
        .wait_reported(
            "node-1",
            condition_types::PROGRAMS_ATTACHED,
            ConditionStatus::False,
            Some("DatapathLoadFailed"),
            false,
            Duration::from_secs(60),
        )
        .await;
    let status = cluster
        .dataplane_node("node-1")
        .await
        .status
        .expect("a status");
    for type_ in [condition_types::PROGRAMS_ATTACHED, condition_types::READY] {
        let condition = find_condition(&status.conditions, type_).expect("the condition");
        assert_eq!(condition.status, ConditionStatus::False, "{condition:?}");
        assert!(
            condition.message.starts_with("failed to load the datapath")
                && condition.message.contains("lacks CAP_NET_ADMIN")
                && condition.message.contains("Operation not permitted"),
            "{condition:?}"
        );
        println!("node-1's {type_}: {}", condition.message);
    }

    // The control: the chart's capabilities back, the agent runs and is Ready again.
    set_agent_capabilities(&daemon_sets, &chart_capabilities).await;
    replace_node_1_agent_pod(&cluster.client).await;
    cluster
        .wait_agent_ready("node-1", Duration::from_secs(90))
        .await;
    let running = cluster
        .running_agent("node-1")
        .expect("an agent runs on node-1");
    let privileges = thread_privileges(running.pid.expect("a pid")).expect("its threads");
    assert!(
        privileges
            .iter()
            .all(|(_, privileges)| privileges.effective.contains("CAP_NET_ADMIN")),
        "{privileges:?}"
    );
}

/// The agent suite's DaemonSet stands for the chart's: the same securityContext and volume
/// mounts, so what the tests above see of it holds for the chart's pods.
#[test]
#[ignore = "needs helm (in the e2e cluster's PATH): make e2e-agent"]
fn the_agent_daemonset_of_the_agent_suite_has_the_charts_security_context_and_mounts() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository")
        .to_path_buf();
    let output = std::process::Command::new("helm")
        .args([
            "template",
            "switchyard",
            "charts/switchyard",
            "--namespace",
            "switchyard",
        ])
        .current_dir(&root)
        .output()
        .expect("run helm template");
    assert!(
        output.status.success(),
        "helm template failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let agent_container = |text: &str| -> Container {
        for document in serde_yaml::Deserializer::from_str(text) {
            let value = serde_yaml::Value::deserialize(document).expect("YAML");
            if value["kind"] == "DaemonSet" {
                let daemon_set: DaemonSet = serde_yaml::from_value(value).expect("a DaemonSet");
                let spec = daemon_set
                    .spec
                    .and_then(|spec| spec.template.spec)
                    .expect("a pod spec");
                return spec
                    .containers
                    .into_iter()
                    .find(|container| container.name == "agent")
                    .expect("the agent container");
            }
        }
        panic!("no DaemonSet");
    };
    let chart = agent_container(&String::from_utf8_lossy(&output.stdout));
    let suite = agent_container(
        &std::fs::read_to_string(root.join("e2e/manifests/agent.yaml")).expect("the manifest"),
    );
    assert_eq!(suite.security_context, chart.security_context);
    assert_eq!(suite.volume_mounts, chart.volume_mounts);
}
