//! A container run from its image with an OCI runtime, as a kubelet with containerd would
//! run it: the pure translation of a container's `securityContext`, its volumes and its
//! image's config into an OCI runtime config (`config.json`) for crun.
//!
//! What follows containerd's CRI plugin (1.6) and the kubelet (1.20):
//! - capabilities: containerd's default set, or every capability when privileged; then
//!   `add: [ALL]`, `drop: [ALL]`, the other adds, the other drops, in that order. The
//!   result is the bounding, effective and permitted set alike; inheritable and ambient
//!   stay empty (so a non-root process keeps none of them after `execve`, as on a node);
//! - `allowPrivilegeEscalation: false` is `noNewPrivileges` (never for a privileged
//!   container, nor one that adds SYS_ADMIN: the API server refuses those);
//! - `readOnlyRootFilesystem` is a read-only root; `runAsNonRoot` refuses to start a
//!   container whose user would be 0 (kubelet's "container has runAsNonRoot and image will
//!   run as root");
//! - seccomp `RuntimeDefault` is [`runtime_default_seccomp`], `Unconfined` (the default of
//!   1.20) none;
//! - the mounts every container gets (`/proc`, `/dev`, `/dev/pts`, `/dev/shm`,
//!   `/dev/mqueue`, a read-only `/sys` unless privileged), containerd's masked and
//!   read-only paths unless privileged, then the container's volume mounts with their
//!   propagation (`HostToContainer` is `rslave`, `Bidirectional` `rshared`);
//! - PID, IPC and mount namespaces of the container's own; a UTS namespace unless the pod
//!   is `hostNetwork`; never a network namespace: the runtime is started in the node's (or
//!   the pod's) network namespace, which the container shares.
//!
//! Not done: cgroup limits (the hollow nodes have no resource accounting; the runtime runs
//! with `--cgroup-manager=disabled`), AppArmor and SELinux, devices of privileged
//! containers, `/dev/termination-log`.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Capabilities, Container, Pod, SecurityContext, Volume};
use serde::Deserialize;
use serde_json::{json, Value};

use super::spec::{SpecProblem, SERVICE_ACCOUNT_MOUNT_PATH};

/// Every capability the runtime knows (Linux 5.9+), by number.
pub const ALL_CAPABILITIES: [&str; 41] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

/// containerd's default capabilities of a container (`oci.defaultUnixCaps`).
pub const DEFAULT_CAPABILITIES: [&str; 14] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// A capability's name as the runtime spells it: `NET_ADMIN` is `CAP_NET_ADMIN`.
fn runtime_name(capability: &str) -> String {
    let upper = capability.to_ascii_uppercase();
    if upper.starts_with("CAP_") {
        upper
    } else {
        format!("CAP_{upper}")
    }
}

/// The capabilities a container gets (see the module's documentation).
pub fn capabilities(privileged: bool, requested: Option<&Capabilities>) -> BTreeSet<String> {
    let all = || ALL_CAPABILITIES.iter().map(|name| name.to_string());
    let mut set: BTreeSet<String> = if privileged {
        all().collect()
    } else {
        DEFAULT_CAPABILITIES
            .iter()
            .map(|name| name.to_string())
            .collect()
    };
    if privileged {
        return set;
    }
    let add = requested.and_then(|c| c.add.clone()).unwrap_or_default();
    let drop = requested.and_then(|c| c.drop.clone()).unwrap_or_default();
    let is_all = |name: &String| name.eq_ignore_ascii_case("ALL");
    if add.iter().any(is_all) {
        set.extend(all());
    }
    if drop.iter().any(is_all) {
        set.clear();
    }
    for name in add.iter().filter(|name| !is_all(name)) {
        set.insert(runtime_name(name));
    }
    for name in drop.iter().filter(|name| !is_all(name)) {
        set.remove(&runtime_name(name));
    }
    set
}

/// The seccomp profile a container runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seccomp {
    Unconfined,
    RuntimeDefault,
}

/// A container's effective security settings: the pod's `securityContext` overridden by
/// the container's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Security {
    pub privileged: bool,
    pub run_as_user: Option<i64>,
    pub run_as_group: Option<i64>,
    pub run_as_non_root: bool,
    /// Bounding, effective and permitted alike (runtime names, `CAP_...`).
    pub capabilities: BTreeSet<String>,
    pub no_new_privileges: bool,
    pub read_only_root_filesystem: bool,
    pub seccomp: Seccomp,
}

fn seccomp_of(type_: &str) -> Result<Seccomp, SpecProblem> {
    match type_ {
        "RuntimeDefault" => Ok(Seccomp::RuntimeDefault),
        "Unconfined" => Ok(Seccomp::Unconfined),
        other => Err(SpecProblem::Unsupported(format!(
            "seccompProfile type {other}"
        ))),
    }
}

impl Security {
    pub fn of(pod: &Pod, container: &Container) -> Result<Self, SpecProblem> {
        let pod_context = pod
            .spec
            .as_ref()
            .and_then(|spec| spec.security_context.clone())
            .unwrap_or_default();
        let context: SecurityContext = container.security_context.clone().unwrap_or_default();
        let privileged = context.privileged == Some(true);
        let capabilities = capabilities(privileged, context.capabilities.as_ref());
        // The API's default is true; privileged and SYS_ADMIN containers always may.
        let allow_escalation = context.allow_privilege_escalation.unwrap_or(true)
            || privileged
            || capabilities.contains("CAP_SYS_ADMIN");
        let seccomp = match context
            .seccomp_profile
            .as_ref()
            .or(pod_context.seccomp_profile.as_ref())
        {
            Some(profile) => seccomp_of(&profile.type_)?,
            None => Seccomp::Unconfined,
        };
        Ok(Self {
            privileged,
            run_as_user: context.run_as_user.or(pod_context.run_as_user),
            run_as_group: context.run_as_group.or(pod_context.run_as_group),
            run_as_non_root: context
                .run_as_non_root
                .or(pod_context.run_as_non_root)
                .unwrap_or(false),
            capabilities,
            no_new_privileges: !allow_escalation,
            read_only_root_filesystem: context.read_only_root_filesystem == Some(true),
            seccomp: if privileged {
                Seccomp::Unconfined
            } else {
                seccomp
            },
        })
    }
}

/// How a volume mount propagates mounts (`mountPropagation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    /// `None` (the default): `rprivate`.
    Private,
    /// `HostToContainer`: `rslave`.
    HostToContainer,
    /// `Bidirectional`: `rshared`.
    Bidirectional,
}

/// What a `hostPath` volume's `type` requires of its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostPathType {
    /// `""`: nothing is checked.
    Unchecked,
    Directory,
    DirectoryOrCreate,
    File,
    FileOrCreate,
    Socket,
}

/// Where a volume mount's content comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountSource {
    /// A path of the node.
    HostPath { path: String, type_: HostPathType },
    /// A directory of the pod's own, shared by its containers.
    EmptyDir { volume: String },
    /// The service account's token, CA and namespace the runner writes for the container.
    ServiceAccount,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeMount {
    pub destination: String,
    pub source: MountSource,
    pub read_only: bool,
    pub propagation: Propagation,
}

/// The container's volume mounts, in the order it lists them.
pub fn volume_mounts(pod: &Pod, container: &Container) -> Result<Vec<VolumeMount>, SpecProblem> {
    let volumes: BTreeMap<&str, &Volume> = pod
        .spec
        .iter()
        .flat_map(|spec| spec.volumes.iter().flatten())
        .map(|volume| (volume.name.as_str(), volume))
        .collect();
    let mut mounts = Vec::new();
    for mount in container.volume_mounts.iter().flatten() {
        let volume = volumes.get(mount.name.as_str()).ok_or_else(|| {
            SpecProblem::Unsupported(format!("volume mount {} names no volume", mount.name))
        })?;
        let destination = mount.mount_path.trim_end_matches('/').to_string();
        let source = if let Some(host_path) = &volume.host_path {
            let type_ = match host_path.type_.as_deref().unwrap_or("") {
                "" => HostPathType::Unchecked,
                "Directory" => HostPathType::Directory,
                "DirectoryOrCreate" => HostPathType::DirectoryOrCreate,
                "File" => HostPathType::File,
                "FileOrCreate" => HostPathType::FileOrCreate,
                "Socket" => HostPathType::Socket,
                other => {
                    return Err(SpecProblem::Unsupported(format!(
                        "hostPath type {other} of volume {}",
                        volume.name
                    )))
                }
            };
            MountSource::HostPath {
                path: host_path.path.clone(),
                type_,
            }
        } else if volume.empty_dir.is_some() {
            MountSource::EmptyDir {
                volume: volume.name.clone(),
            }
        } else if (volume.secret.is_some() || volume.projected.is_some())
            && destination == SERVICE_ACCOUNT_MOUNT_PATH
        {
            MountSource::ServiceAccount
        } else {
            return Err(SpecProblem::Unsupported(format!(
                "the kind of volume {} (only hostPath, emptyDir and the service account's)",
                volume.name
            )));
        };
        if mount.sub_path.as_deref().is_some_and(|sub| !sub.is_empty()) {
            return Err(SpecProblem::Unsupported(format!(
                "subPath of volume mount {}",
                mount.name
            )));
        }
        let propagation = match mount.mount_propagation.as_deref() {
            None | Some("None") => Propagation::Private,
            Some("HostToContainer") => Propagation::HostToContainer,
            Some("Bidirectional") => Propagation::Bidirectional,
            Some(other) => {
                return Err(SpecProblem::Unsupported(format!(
                    "mountPropagation {other}"
                )))
            }
        };
        mounts.push(VolumeMount {
            destination,
            source,
            read_only: mount.read_only == Some(true),
            propagation,
        });
    }
    Ok(mounts)
}

/// The part of an OCI image config a container's process is made from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct ImageConfig {
    #[serde(rename = "Entrypoint", default)]
    pub entrypoint: Option<Vec<String>>,
    #[serde(rename = "Cmd", default)]
    pub cmd: Option<Vec<String>>,
    #[serde(rename = "Env", default)]
    pub env: Option<Vec<String>>,
    #[serde(rename = "User", default)]
    pub user: Option<String>,
    #[serde(rename = "WorkingDir", default)]
    pub working_dir: Option<String>,
}

/// An OCI image config blob (only its `config`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ImageConfigBlob {
    #[serde(default)]
    pub config: ImageConfig,
}

/// The command line, as Kubernetes makes it from the container and the image: `command`
/// replaces the image's entrypoint (and drops its cmd), `args` replaces the cmd.
pub fn process_arguments(
    image: &ImageConfig,
    command: Option<&[String]>,
    args: Option<&[String]>,
) -> Vec<String> {
    match (command, args) {
        (Some(command), args) => command
            .iter()
            .chain(args.unwrap_or_default())
            .cloned()
            .collect(),
        (None, Some(args)) => image
            .entrypoint
            .iter()
            .flatten()
            .chain(args)
            .cloned()
            .collect(),
        (None, None) => image
            .entrypoint
            .iter()
            .flatten()
            .chain(image.cmd.iter().flatten())
            .cloned()
            .collect(),
    }
}

/// The numeric user and group the process runs as: `runAsUser`/`runAsGroup`, else the
/// image's `User` (`uid[:gid]`; names would need the image's passwd file, which the
/// kubelet reads and this runner does not).
pub fn process_user(security: &Security, image: &ImageConfig) -> Result<(u32, u32), String> {
    let image_user = image.user.as_deref().unwrap_or("").trim();
    let (image_uid, image_gid) = match image_user.split_once(':') {
        Some((uid, gid)) => (uid, Some(gid)),
        None => (image_user, None),
    };
    let parse = |text: &str, what: &str| {
        text.parse::<u32>()
            .map_err(|_| format!("the image's {what} {text:?} is not numeric"))
    };
    let uid = match security.run_as_user {
        Some(uid) => u32::try_from(uid).map_err(|_| format!("runAsUser {uid} is out of range"))?,
        None if image_uid.is_empty() => 0,
        None => parse(image_uid, "user")?,
    };
    let gid = match (security.run_as_group, image_gid) {
        (Some(gid), _) => {
            u32::try_from(gid).map_err(|_| format!("runAsGroup {gid} is out of range"))?
        }
        (None, Some(gid)) if security.run_as_user.is_none() => parse(gid, "group")?,
        _ => 0,
    };
    if security.run_as_non_root && uid == 0 {
        return Err("container has runAsNonRoot and image will run as root".to_string());
    }
    Ok((uid, gid))
}

/// A container's process and everything the runtime config needs that the pod gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerRun {
    pub command: Option<Vec<String>>,
    pub args: Option<Vec<String>>,
    pub working_dir: Option<String>,
    pub security: Security,
    pub mounts: Vec<VolumeMount>,
    pub host_network: bool,
    /// The container's hostname when it has a UTS namespace of its own (not hostNetwork).
    pub hostname: String,
}

/// Paths on the node that the runner resolved for one start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedSources {
    pub rootfs: String,
    /// Per volume mount (same order as [`ContainerRun::mounts`]): the source path.
    pub mount_sources: Vec<String>,
    pub hosts_file: String,
    pub resolv_conf: String,
}

/// containerd's masked paths of an unprivileged container.
const MASKED_PATHS: [&str; 10] = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/sys/firmware",
    "/proc/scsi",
];

/// containerd's read-only paths of an unprivileged container.
const READONLY_PATHS: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// The OCI runtime config of a container's start. `environment` is the kubelet's (the
/// Services' variables and the container's own), laid over the image's; `capabilities`
/// are those the runtime can grant (see [`grantable`]).
pub fn runtime_config(
    run: &ContainerRun,
    image: &ImageConfig,
    sources: &ResolvedSources,
    environment: &[(String, String)],
    capabilities: &BTreeSet<String>,
) -> Result<Value, String> {
    let (uid, gid) = process_user(&run.security, image)?;
    let arguments = process_arguments(image, run.command.as_deref(), run.args.as_deref());
    if arguments.is_empty() {
        return Err("neither the container nor its image names a command".to_string());
    }
    let mut variables: Vec<(String, String)> = image
        .env
        .iter()
        .flatten()
        .filter_map(|line| line.split_once('='))
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect();
    for (name, value) in environment {
        variables.retain(|(existing, _)| existing != name);
        variables.push((name.clone(), value.clone()));
    }
    let capability_list: Vec<&String> = capabilities.iter().collect();
    let mut process = json!({
        "terminal": false,
        "user": {"uid": uid, "gid": gid},
        "args": arguments,
        "env": variables.iter().map(|(name, value)| format!("{name}={value}")).collect::<Vec<_>>(),
        "cwd": run.working_dir.clone()
            .or_else(|| image.working_dir.clone())
            .filter(|dir| !dir.is_empty())
            .unwrap_or_else(|| "/".to_string()),
        "capabilities": {
            "bounding": capability_list,
            "effective": capability_list,
            "permitted": capability_list,
            "inheritable": [],
            "ambient": [],
        },
        "noNewPrivileges": run.security.no_new_privileges,
    });
    if uid != 0 || gid != 0 {
        process["user"]["additionalGids"] = json!([gid]);
    }
    let sysfs_options = if run.security.privileged {
        json!(["nosuid", "noexec", "nodev", "rw"])
    } else {
        json!(["nosuid", "noexec", "nodev", "ro"])
    };
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc",
               "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts",
               "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]}),
        json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
               "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}),
        json!({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
               "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": sysfs_options}),
        // The node's files, as the kubelet gives a pod (read-only here: one file serves
        // every hollow node).
        json!({"destination": "/etc/hosts", "type": "bind", "source": sources.hosts_file,
               "options": ["rbind", "rprivate", "ro"]}),
        json!({"destination": "/etc/resolv.conf", "type": "bind", "source": sources.resolv_conf,
               "options": ["rbind", "rprivate", "ro"]}),
    ];
    let mut root_propagation = "rprivate";
    for (mount, source) in run.mounts.iter().zip(&sources.mount_sources) {
        let propagation = match mount.propagation {
            Propagation::Private => "rprivate",
            Propagation::HostToContainer => "rslave",
            Propagation::Bidirectional => "rshared",
        };
        // As containerd: the root's propagation lets the mount's work.
        root_propagation = match (root_propagation, propagation) {
            (_, "rshared") | ("rshared", _) => "rshared",
            (_, "rslave") | ("rslave", _) => "rslave",
            _ => "rprivate",
        };
        let mut options = vec!["rbind", propagation];
        if mount.read_only {
            options.push("ro");
        }
        mounts.push(json!({"destination": mount.destination, "type": "bind",
                           "source": source, "options": options}));
    }
    let mut namespaces = vec![
        json!({"type": "pid"}),
        json!({"type": "ipc"}),
        json!({"type": "mount"}),
    ];
    let mut config = json!({
        "ociVersion": "1.0.2",
        "process": process,
        "root": {"path": sources.rootfs, "readonly": run.security.read_only_root_filesystem},
        "mounts": mounts,
        "linux": {
            "rootfsPropagation": root_propagation,
        },
    });
    if !run.host_network {
        namespaces.push(json!({"type": "uts"}));
        config["hostname"] = json!(run.hostname);
    }
    config["linux"]["namespaces"] = json!(namespaces);
    if !run.security.privileged {
        config["linux"]["maskedPaths"] = json!(MASKED_PATHS.as_slice());
        config["linux"]["readonlyPaths"] = json!(READONLY_PATHS.as_slice());
    }
    if run.security.seccomp == Seccomp::RuntimeDefault {
        config["linux"]["seccomp"] = runtime_default_seccomp();
    }
    Ok(config)
}

/// The capabilities of `wanted` this runtime can grant (those in `held`, the runner's own
/// bounding set), and those it cannot. A node's container runtime holds every capability;
/// a machine that withholds some from the runner (a sandbox) cannot pass them on, and
/// `capset` would refuse the whole start.
pub fn grantable(
    wanted: &BTreeSet<String>,
    held: &BTreeSet<String>,
) -> (BTreeSet<String>, BTreeSet<String>) {
    wanted.iter().cloned().partition(|name| held.contains(name))
}

/// The capability names of a `/proc/PID/status` mask (`CapBnd:` and the like, in hex).
pub fn capability_names(mask: u64) -> BTreeSet<String> {
    ALL_CAPABILITIES
        .iter()
        .enumerate()
        .filter(|(bit, _)| mask & (1u64 << bit) != 0)
        .map(|(_, name)| name.to_string())
        .collect()
}

/// The system calls refused under seccomp `RuntimeDefault` here, with EPERM: those
/// containerd's (and Docker's) default profile allows to no unprivileged container (module,
/// kexec, clock, swap, accounting, reboot, keyring and namespace/mount calls, ptrace and
/// cross-process memory access, `bpf` and `perf_event_open`, which containerd grants only
/// with CAP_SYS_ADMIN, CAP_BPF or CAP_PERFMON). Every other call is allowed: a
/// deny-dangerous profile rather than containerd's allow-list, which is the same for the
/// operator's calls (it makes none of these).
pub const SECCOMP_DENIED: [&str; 41] = [
    "acct",
    "add_key",
    "bpf",
    "clock_adjtime",
    "clock_settime",
    "create_module",
    "delete_module",
    "finit_module",
    "fsconfig",
    "fsmount",
    "fsopen",
    "get_kernel_syms",
    "init_module",
    "ioperm",
    "iopl",
    "kcmp",
    "kexec_file_load",
    "kexec_load",
    "keyctl",
    "lookup_dcookie",
    "mount",
    "move_mount",
    "nfsservctl",
    "open_by_handle_at",
    "open_tree",
    "perf_event_open",
    "pivot_root",
    "process_vm_readv",
    "process_vm_writev",
    "ptrace",
    "query_module",
    "quotactl",
    "reboot",
    "request_key",
    "setns",
    "settimeofday",
    "swapoff",
    "swapon",
    "umount2",
    "unshare",
    "userfaultfd",
];

/// The seccomp profile of `RuntimeDefault` (see [`SECCOMP_DENIED`]).
pub fn runtime_default_seccomp() -> Value {
    json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "syscalls": [{
            "names": SECCOMP_DENIED.as_slice(),
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": 1,
        }],
    })
}

#[cfg(test)]
mod tests;
