use super::*;

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|name| name.to_string()).collect()
}

fn capabilities_of(add: &[&str], drop: &[&str]) -> Capabilities {
    Capabilities {
        add: Some(add.iter().map(|name| name.to_string()).collect()),
        drop: Some(drop.iter().map(|name| name.to_string()).collect()),
    }
}

/// The chart's agent pod, as the API server gives it to a node (the service account's
/// volume added by admission).
fn agent_pod() -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "switchyard-agent-x", "namespace": "switchyard", "uid": "u1"},
        "spec": {
            "nodeName": "node-1", "hostNetwork": true,
            "initContainers": [{
                "name": "mount-bpf-fs", "image": "ghcr.io/switchyard/switchyard-agent:0.1.0",
                "args": ["mount-bpf-fs", "--bpf-pin-dir=/sys/fs/bpf/switchyard"],
                "securityContext": {"privileged": true},
                "volumeMounts": [{"name": "bpffs", "mountPath": "/sys/fs/bpf",
                                  "mountPropagation": "Bidirectional"}]
            }],
            "containers": [{
                "name": "agent", "image": "ghcr.io/switchyard/switchyard-agent:0.1.0",
                "args": ["run"],
                "securityContext": {
                    "privileged": false, "allowPrivilegeEscalation": false,
                    "readOnlyRootFilesystem": true,
                    "capabilities": {"drop": ["ALL"],
                                     "add": ["BPF", "PERFMON", "NET_ADMIN", "NET_RAW", "SYS_RESOURCE", "SYS_NICE"]}
                },
                "volumeMounts": [
                    {"name": "bpffs", "mountPath": "/sys/fs/bpf", "mountPropagation": "HostToContainer"},
                    {"name": "cgroup", "mountPath": "/sys/fs/cgroup", "readOnly": true},
                    {"name": "xtables-lock", "mountPath": "/run/xtables.lock"},
                    {"name": "switchyard-agent-token-abc", "mountPath": SERVICE_ACCOUNT_MOUNT_PATH, "readOnly": true}
                ]
            }],
            "volumes": [
                {"name": "bpffs", "hostPath": {"path": "/sys/fs/bpf", "type": "Directory"}},
                {"name": "cgroup", "hostPath": {"path": "/sys/fs/cgroup", "type": "Directory"}},
                {"name": "xtables-lock", "hostPath": {"path": "/run/xtables.lock", "type": "FileOrCreate"}},
                {"name": "switchyard-agent-token-abc", "secret": {"secretName": "switchyard-agent-token-abc"}}
            ]
        }
    }))
    .unwrap()
}

fn operator_pod() -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "switchyard-operator-x", "namespace": "switchyard", "uid": "u2"},
        "spec": {
            "nodeName": "node-2",
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "operator", "image": "ghcr.io/switchyard/switchyard-operator:0.1.0",
                "args": ["--apply-crds=true"],
                "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                                    "capabilities": {"drop": ["ALL"]}}
            }]
        }
    }))
    .unwrap()
}

fn container<'a>(pod: &'a Pod, name: &str) -> &'a Container {
    let spec = pod.spec.as_ref().unwrap();
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .find(|container| container.name == name)
        .unwrap()
}

fn agent_image() -> ImageConfig {
    ImageConfig {
        entrypoint: Some(vec!["/usr/local/bin/switchyard-agent".into()]),
        cmd: Some(vec!["run".into()]),
        env: Some(vec!["PATH=/usr/local/sbin:/usr/bin".into()]),
        user: Some("0:0".into()),
        working_dir: Some("/".into()),
    }
}

fn operator_image() -> ImageConfig {
    ImageConfig {
        entrypoint: Some(vec!["/usr/local/bin/switchyard-operator".into()]),
        cmd: None,
        env: None,
        user: Some("65532:65532".into()),
        working_dir: None,
    }
}

#[test]
fn an_unprivileged_container_gets_containerds_defaults_plus_its_adds_minus_its_drops() {
    let set = capabilities(
        false,
        Some(&capabilities_of(&["NET_ADMIN"], &["MKNOD", "chown"])),
    );
    let mut expected: BTreeSet<String> = names(&DEFAULT_CAPABILITIES);
    expected.insert("CAP_NET_ADMIN".into());
    expected.remove("CAP_MKNOD");
    expected.remove("CAP_CHOWN");
    assert_eq!(set, expected);
    assert_eq!(capabilities(false, None), names(&DEFAULT_CAPABILITIES));
}

#[test]
fn drop_all_leaves_only_the_adds_and_add_all_gives_every_capability_but_the_drops() {
    assert_eq!(
        capabilities(
            false,
            Some(&capabilities_of(&["BPF", "net_admin"], &["ALL"]))
        ),
        names(&["CAP_BPF", "CAP_NET_ADMIN"])
    );
    let set = capabilities(false, Some(&capabilities_of(&["ALL"], &["SYS_ADMIN"])));
    assert_eq!(set.len(), ALL_CAPABILITIES.len() - 1);
    assert!(!set.contains("CAP_SYS_ADMIN"));
    assert_eq!(
        capabilities(true, Some(&capabilities_of(&[], &["ALL"]))),
        names(&ALL_CAPABILITIES),
        "a privileged container gets every capability whatever it drops"
    );
}

#[test]
fn the_charts_agent_gets_exactly_its_six_capabilities_no_new_privileges_and_a_read_only_root() {
    let pod = agent_pod();
    let security = Security::of(&pod, container(&pod, "agent")).unwrap();
    assert_eq!(
        security.capabilities,
        names(&[
            "CAP_BPF",
            "CAP_PERFMON",
            "CAP_NET_ADMIN",
            "CAP_NET_RAW",
            "CAP_SYS_RESOURCE",
            "CAP_SYS_NICE"
        ])
    );
    assert!(security.no_new_privileges);
    assert!(security.read_only_root_filesystem);
    assert!(!security.privileged);
    assert_eq!(
        security.seccomp,
        Seccomp::Unconfined,
        "the chart sets none for the agent"
    );
    let init = Security::of(&pod, container(&pod, "mount-bpf-fs")).unwrap();
    assert!(init.privileged);
    assert!(
        !init.no_new_privileges,
        "a privileged container may always escalate"
    );
    assert_eq!(init.capabilities, names(&ALL_CAPABILITIES));
}

#[test]
fn the_operator_takes_the_pods_user_group_and_seccomp_and_holds_no_capability() {
    let pod = operator_pod();
    let security = Security::of(&pod, container(&pod, "operator")).unwrap();
    assert_eq!(security.run_as_user, Some(65532));
    assert_eq!(security.run_as_group, Some(65532));
    assert!(security.run_as_non_root);
    assert!(security.capabilities.is_empty());
    assert_eq!(security.seccomp, Seccomp::RuntimeDefault);
    assert_eq!(
        process_user(&security, &operator_image()),
        Ok((65532, 65532))
    );
}

#[test]
fn run_as_non_root_refuses_a_container_that_would_run_as_root() {
    let pod = operator_pod();
    let mut security = Security::of(&pod, container(&pod, "operator")).unwrap();
    security.run_as_user = None;
    assert_eq!(
        process_user(&security, &agent_image()),
        Err("container has runAsNonRoot and image will run as root".to_string())
    );
    security.run_as_non_root = false;
    assert_eq!(
        process_user(&security, &agent_image()),
        Ok((0, 65532)),
        "the image's user, the pod's group"
    );
}

#[test]
fn the_command_line_follows_kubernetes_rules_for_command_args_and_the_image() {
    let image = agent_image();
    let words = |list: &[&str]| list.iter().map(|w| w.to_string()).collect::<Vec<_>>();
    assert_eq!(
        process_arguments(&image, None, None),
        words(&["/usr/local/bin/switchyard-agent", "run"])
    );
    assert_eq!(
        process_arguments(&image, None, Some(&words(&["mount-bpf-fs"]))),
        words(&["/usr/local/bin/switchyard-agent", "mount-bpf-fs"])
    );
    assert_eq!(
        process_arguments(&image, Some(&words(&["/bin/other"])), None),
        words(&["/bin/other"]),
        "a command drops the image's cmd"
    );
    assert_eq!(
        process_arguments(&image, Some(&words(&["/bin/other"])), Some(&words(&["x"]))),
        words(&["/bin/other", "x"])
    );
}

#[test]
fn volume_mounts_keep_their_host_paths_types_and_propagation() {
    let pod = agent_pod();
    let mounts = volume_mounts(&pod, container(&pod, "agent")).unwrap();
    assert_eq!(
        mounts,
        vec![
            VolumeMount {
                destination: "/sys/fs/bpf".into(),
                source: MountSource::HostPath {
                    path: "/sys/fs/bpf".into(),
                    type_: HostPathType::Directory
                },
                read_only: false,
                propagation: Propagation::HostToContainer,
            },
            VolumeMount {
                destination: "/sys/fs/cgroup".into(),
                source: MountSource::HostPath {
                    path: "/sys/fs/cgroup".into(),
                    type_: HostPathType::Directory
                },
                read_only: true,
                propagation: Propagation::Private,
            },
            VolumeMount {
                destination: "/run/xtables.lock".into(),
                source: MountSource::HostPath {
                    path: "/run/xtables.lock".into(),
                    type_: HostPathType::FileOrCreate
                },
                read_only: false,
                propagation: Propagation::Private,
            },
            VolumeMount {
                destination: SERVICE_ACCOUNT_MOUNT_PATH.into(),
                source: MountSource::ServiceAccount,
                read_only: true,
                propagation: Propagation::Private,
            },
        ]
    );
    let init = volume_mounts(&pod, container(&pod, "mount-bpf-fs")).unwrap();
    assert_eq!(init[0].propagation, Propagation::Bidirectional);
}

#[test]
fn a_volume_the_runner_cannot_give_is_a_problem_not_a_missing_mount() {
    let mut pod = agent_pod();
    let spec = pod.spec.as_mut().unwrap();
    spec.volumes.as_mut().unwrap()[1] = serde_json::from_value(serde_json::json!(
        {"name": "cgroup", "configMap": {"name": "settings"}}
    ))
    .unwrap();
    let problem = volume_mounts(&pod, container(&pod, "agent")).unwrap_err();
    assert!(
        matches!(&problem, SpecProblem::Unsupported(what) if what.contains("volume cgroup")),
        "{problem:?}"
    );
}

fn agent_run(pod: &Pod) -> ContainerRun {
    let agent = container(pod, "agent");
    ContainerRun {
        command: None,
        args: agent.args.clone(),
        working_dir: None,
        security: Security::of(pod, agent).unwrap(),
        mounts: volume_mounts(pod, agent).unwrap(),
        host_network: true,
        hostname: "switchyard-agent-x".into(),
    }
}

fn sources(mounts: usize) -> ResolvedSources {
    ResolvedSources {
        rootfs: "/cache/rootfs".into(),
        mount_sources: (0..mounts)
            .map(|index| format!("/source/{index}"))
            .collect(),
        hosts_file: "/state/nodes/hosts".into(),
        resolv_conf: "/state/nodes/resolv.conf".into(),
    }
}

#[test]
fn the_agents_runtime_config_grants_what_the_runtime_holds_and_shares_the_nodes_network() {
    let pod = agent_pod();
    let run = agent_run(&pod);
    let held = names(&ALL_CAPABILITIES[..24]); // up to SYS_NICE, without SYS_RESOURCE (24)
    let (grantable_now, withheld) = grantable(&run.security.capabilities, &held);
    assert_eq!(
        withheld,
        names(&["CAP_SYS_RESOURCE", "CAP_PERFMON", "CAP_BPF"])
    );
    let config = runtime_config(
        &run,
        &agent_image(),
        &sources(run.mounts.len()),
        &[("NODE_NAME".into(), "node-1".into())],
        &grantable_now,
    )
    .unwrap();
    let process = &config["process"];
    assert_eq!(
        process["args"],
        serde_json::json!(["/usr/local/bin/switchyard-agent", "run"])
    );
    assert_eq!(
        process["env"],
        serde_json::json!(["PATH=/usr/local/sbin:/usr/bin", "NODE_NAME=node-1"])
    );
    for set in ["bounding", "effective", "permitted"] {
        assert_eq!(
            process["capabilities"][set],
            serde_json::json!(["CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_SYS_NICE"]),
            "{set}"
        );
    }
    for set in ["inheritable", "ambient"] {
        assert_eq!(process["capabilities"][set], serde_json::json!([]), "{set}");
    }
    assert_eq!(process["noNewPrivileges"], serde_json::json!(true));
    assert_eq!(config["root"]["readonly"], serde_json::json!(true));
    let namespaces: Vec<&str> = config["linux"]["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|namespace| namespace["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        namespaces,
        vec!["pid", "ipc", "mount"],
        "no network, no UTS namespace"
    );
    assert!(config.get("hostname").is_none());
    assert!(config["linux"].get("seccomp").is_none());
    assert_eq!(
        config["linux"]["rootfsPropagation"],
        serde_json::json!("rslave")
    );
    let bpffs = config["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|mount| mount["destination"] == "/sys/fs/bpf")
        .unwrap();
    assert_eq!(bpffs["source"], serde_json::json!("/source/0"));
    assert_eq!(bpffs["options"], serde_json::json!(["rbind", "rslave"]));
    let cgroup = config["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|mount| mount["destination"] == "/sys/fs/cgroup")
        .unwrap();
    assert_eq!(
        cgroup["options"],
        serde_json::json!(["rbind", "rprivate", "ro"])
    );
    let sysfs = config["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|mount| mount["destination"] == "/sys")
        .unwrap();
    assert_eq!(sysfs["options"][3], serde_json::json!("ro"));
    assert!(config["linux"]["maskedPaths"]
        .as_array()
        .unwrap()
        .contains(&serde_json::json!("/proc/kcore")));
}

#[test]
fn the_operators_runtime_config_runs_it_as_its_user_under_runtime_default_seccomp() {
    let pod = operator_pod();
    let operator = container(&pod, "operator");
    let run = ContainerRun {
        command: None,
        args: operator.args.clone(),
        working_dir: None,
        security: Security::of(&pod, operator).unwrap(),
        mounts: Vec::new(),
        host_network: false,
        hostname: "switchyard-operator-x".into(),
    };
    let config = runtime_config(
        &run,
        &operator_image(),
        &sources(0),
        &[],
        &run.security.capabilities,
    )
    .unwrap();
    assert_eq!(config["process"]["user"]["uid"], serde_json::json!(65532));
    assert_eq!(config["process"]["user"]["gid"], serde_json::json!(65532));
    assert_eq!(
        config["process"]["capabilities"]["bounding"],
        serde_json::json!([])
    );
    assert_eq!(
        config["process"]["args"],
        serde_json::json!(["/usr/local/bin/switchyard-operator", "--apply-crds=true"])
    );
    assert_eq!(
        config["hostname"],
        serde_json::json!("switchyard-operator-x")
    );
    let seccomp = &config["linux"]["seccomp"];
    assert_eq!(
        seccomp["defaultAction"],
        serde_json::json!("SCMP_ACT_ALLOW")
    );
    let denied = seccomp["syscalls"][0]["names"].as_array().unwrap();
    for call in ["bpf", "mount", "unshare", "ptrace", "kexec_load"] {
        assert!(denied.contains(&serde_json::json!(call)), "{call}");
    }
}

#[test]
fn capability_masks_read_from_proc_name_their_bits() {
    assert_eq!(
        capability_names(0x0000_0000_0000_3000),
        names(&["CAP_NET_ADMIN", "CAP_NET_RAW"])
    );
    assert_eq!(capability_names(0x1ff_ffff_ffff), names(&ALL_CAPABILITIES));
    assert!(capability_names(0).is_empty());
}
