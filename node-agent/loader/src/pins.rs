//! What the pins need from the node: a BPF filesystem under the pin directory,
//! and the capabilities to load and attach what gets pinned there.
//!
//! The pins outlive the agent only in the host's BPF filesystem. When none holds
//! the pin directory, the agent mounts one at the pin root ([`pin_root`]:
//! `/sys/fs/bpf`, or the parent of a pin directory elsewhere), as Cilium and
//! Calico do; when it cannot, it stops and says how to mount one. In a container
//! a mount only reaches the host through a hostPath mount with `Bidirectional`
//! propagation, which Kubernetes grants to privileged containers only: the chart
//! mounts from a privileged init container (`switchyard-agent mount-bpf-fs`) and
//! gives the agent itself `HostToContainer`. An agent whose mount would stay in
//! its own mount namespace refuses to mount there: its pins would vanish with it,
//! and with them every attached program.

use std::{
    ffi::CString,
    io,
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
};

/// `statfs(2)`'s `f_type` of a BPF filesystem (linux/magic.h).
pub const BPF_FS_MAGIC: u32 = 0xcafe_4a11;

/// What to do when the agent cannot mount the BPF filesystem itself.
fn mount_advice(root: &Path) -> String {
    format!(
        "mount it on the host with `mount -t bpf bpf {root}` (in the Helm chart, \
         agent.mountBpfFilesystem=true, the default, mounts it from an init container)",
        root = root.display()
    )
}

#[derive(Debug, thiserror::Error)]
pub enum BpfFilesystemError {
    #[error("failed to find where to mount a BPF filesystem for the pin directory {}: it has no parent directory", pin_directory.display())]
    NoPinRoot { pin_directory: PathBuf },
    #[error("failed to check which file system holds {}", path.display())]
    Inspect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "failed to mount a BPF filesystem at {}: neither it nor its parent exists; create it \
         with `mkdir -p {}` and {}",
        root.display(),
        root.display(),
        mount_advice(root)
    )]
    NoParent { root: PathBuf },
    #[error("failed to create {} to mount a BPF filesystem at; {}", root.display(), mount_advice(root))]
    CreateRoot {
        root: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "failed to mount a BPF filesystem at {}: none is mounted there, and a mount made here \
         would not reach the host (this mount namespace only receives the host's mounts, as a \
         container's HostToContainer hostPath does), so the pins would vanish with the agent \
         and detach its programs; {}",
        root.display(),
        mount_advice(root)
    )]
    WouldNotReachHost { root: PathBuf },
    #[error(
        "failed to pin in {}: the BPF filesystem at {} holds it, but {} is covered by another \
         file system mounted over it; unmount that (`umount {}`) rather than stack a second BPF \
         filesystem over {}, which would hide every pin already there",
        pin_directory.display(),
        root.display(),
        covered.display(),
        covered.display(),
        root.display()
    )]
    CoveredByAnotherFilesystem {
        pin_directory: PathBuf,
        root: PathBuf,
        covered: PathBuf,
    },
    #[error(
        "failed to mount a BPF filesystem at {} (none is mounted there; mounting needs \
         CAP_SYS_ADMIN and a writable mount point); {}",
        root.display(),
        mount_advice(root)
    )]
    Mount {
        root: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// How the pin directory came to be on a BPF filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BpfFilesystem {
    /// One was mounted already; `at` is the pin directory or its nearest
    /// existing ancestor.
    Found { at: PathBuf },
    /// None was: this process mounted one at the pin root.
    Mounted { at: PathBuf },
}

/// Where the BPF filesystem is usually mounted, and the chart's hostPath.
pub const DEFAULT_BPF_FILESYSTEM: &str = "/sys/fs/bpf";

/// Where a BPF filesystem is mounted when none holds the pin directory:
/// `/sys/fs/bpf` for a pin directory under it (at any depth, as the chart
/// allows), else the pin directory's parent.
pub fn pin_root(pin_directory: &Path) -> Result<&Path, BpfFilesystemError> {
    if pin_directory.starts_with(DEFAULT_BPF_FILESYSTEM) {
        return Ok(Path::new(DEFAULT_BPF_FILESYSTEM));
    }
    pin_directory
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
        .ok_or_else(|| BpfFilesystemError::NoPinRoot {
            pin_directory: pin_directory.to_path_buf(),
        })
}

/// Makes sure the pin directory is on a BPF filesystem: uses the one that holds
/// its nearest existing ancestor, or mounts one at the pin root (creating that
/// directory when its parent exists). Never stacks a second mount on a BPF
/// filesystem.
pub fn ensure_bpf_filesystem(pin_directory: &Path) -> Result<BpfFilesystem, BpfFilesystemError> {
    let existing = nearest_existing(pin_directory);
    if let Some(existing) = &existing {
        if is_bpf_filesystem(existing)? {
            return Ok(BpfFilesystem::Found {
                at: existing.clone(),
            });
        }
    }
    let root = pin_root(pin_directory)?;
    // The pin root is a BPF filesystem but the pin directory is not on it: something else
    // (a tmpfs, say) is mounted over the pin directory. A second BPF filesystem stacked on the
    // root would hide the pins the programs running now keep their maps in, so a restarted
    // agent would start from empty maps. Refuse and name what covers it.
    if root.exists() && is_bpf_filesystem(root)? {
        return Err(BpfFilesystemError::CoveredByAnotherFilesystem {
            pin_directory: pin_directory.to_path_buf(),
            root: root.to_path_buf(),
            covered: existing.unwrap_or_else(|| pin_directory.to_path_buf()),
        });
    }
    if !root.exists() {
        let parent_exists = root.parent().is_some_and(|parent| parent.is_dir());
        if !parent_exists {
            return Err(BpfFilesystemError::NoParent {
                root: root.to_path_buf(),
            });
        }
        std::fs::create_dir(root).map_err(|source| BpfFilesystemError::CreateRoot {
            root: root.to_path_buf(),
            source,
        })?;
    }
    if mount_would_not_reach_host(root) {
        return Err(BpfFilesystemError::WouldNotReachHost {
            root: root.to_path_buf(),
        });
    }
    mount_bpf_filesystem(root).map_err(|source| BpfFilesystemError::Mount {
        root: root.to_path_buf(),
        source,
    })?;
    tracing::info!(
        at = %root.display(),
        "mounted a BPF filesystem for the pins: none was mounted there"
    );
    Ok(BpfFilesystem::Mounted {
        at: root.to_path_buf(),
    })
}

/// `path` or its nearest ancestor that exists.
fn nearest_existing(path: &Path) -> Option<PathBuf> {
    path.ancestors()
        .filter(|ancestor| !ancestor.as_os_str().is_empty())
        .find(|ancestor| ancestor.exists())
        .map(Path::to_path_buf)
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "the path holds a NUL byte"))
}

/// Whether `path` lies on a BPF filesystem (`statfs(2)`'s magic number).
pub fn is_bpf_filesystem(path: &Path) -> Result<bool, BpfFilesystemError> {
    let inspect = |source| BpfFilesystemError::Inspect {
        path: path.to_path_buf(),
        source,
    };
    let c_path = c_path(path).map_err(inspect)?;
    // SAFETY: statfs only writes into the zeroed struct we pass, and reads the
    // NUL-terminated path.
    let mut status: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c_path.as_ptr(), &mut status) } != 0 {
        return Err(inspect(io::Error::last_os_error()));
    }
    // f_type's width differs between architectures; the magic fits in 32 bits.
    Ok(status.f_type as u32 == BPF_FS_MAGIC)
}

fn mount_bpf_filesystem(root: &Path) -> io::Result<()> {
    let source = c"bpf";
    let target = c_path(root)?;
    // Only root may create pins, as with the default mount systemd makes.
    let options = c"mode=0700";
    // SAFETY: every pointer is a valid NUL-terminated string living across the call.
    let result = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            source.as_ptr(),
            0,
            options.as_ptr().cast(),
        )
    };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether a mount at `root` would stay in this mount namespace although this
/// namespace follows the host's: the mount holding `root` is a slave (it
/// receives propagation, `master:N`) and shares nothing back (`shared:N`). That
/// is a container's hostPath mount with `HostToContainer` propagation, the
/// chart's. A private mount (a test's own mount namespace, or a hostPath without
/// propagation) cannot be told from one whose mounts are meant to stay there, so
/// it is mounted on.
fn mount_would_not_reach_host(root: &Path) -> bool {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    holding_mount_propagation(&mountinfo, &root)
        .is_some_and(|fields| fields.receives && !fields.shares)
}

/// The propagation of a mount: `master:N` (receives the peer group N's mounts),
/// `shared:N` (shares its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Propagation {
    receives: bool,
    shares: bool,
}

/// The propagation of the mount that holds `path` in `/proc/self/mountinfo`'s
/// text: the last listed among those with the longest mount point containing
/// `path` (the one on top).
fn holding_mount_propagation(mountinfo: &str, path: &Path) -> Option<Propagation> {
    let mut best: Option<(usize, Propagation)> = None;
    for line in mountinfo.lines() {
        // id parent major:minor root mount-point options [optional fields...] - type source super-options
        let fields: Vec<&str> = line.split(' ').collect();
        let (Some(mount_point), Some(separator)) =
            (fields.get(4), fields.iter().position(|field| *field == "-"))
        else {
            continue;
        };
        let mount_point = PathBuf::from(unescape_mount_point(mount_point));
        if !path.starts_with(&mount_point) {
            continue;
        }
        let depth = mount_point.components().count();
        let optional = fields.get(6..separator).unwrap_or_default();
        let propagation = Propagation {
            receives: optional.iter().any(|field| field.starts_with("master:")),
            shares: optional.iter().any(|field| field.starts_with("shared:")),
        };
        if best.is_none_or(|(best_depth, _)| depth >= best_depth) {
            best = Some((depth, propagation));
        }
    }
    best.map(|(_, propagation)| propagation)
}

/// mountinfo writes space, tab, newline and backslash in mount points as `\ooo`.
fn unescape_mount_point(escaped: &str) -> String {
    let bytes = escaped.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let octal = bytes.get(index + 1..index + 4).and_then(|digits| {
            let text = std::str::from_utf8(digits).ok()?;
            u8::from_str_radix(text, 8).ok()
        });
        match (bytes[index], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                index += 4;
            }
            (byte, _) => {
                out.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Capability numbers (linux/capability.h) of the capabilities loading and
/// attaching the programs needs, with what each one is for.
const LOADING_CAPABILITIES: [(u32, &str, &str); 3] = [
    (39, "CAP_BPF", "create maps and load programs"),
    (
        38,
        "CAP_PERFMON",
        "load programs that read kernel memory and pointers",
    ),
    (
        12,
        "CAP_NET_ADMIN",
        "load and attach TC and socket programs",
    ),
];
const CAP_SYS_ADMIN: u32 = 21;

/// The capabilities loading needs that `status` (`/proc/self/status`) lacks in
/// its effective set. CAP_SYS_ADMIN stands in for CAP_BPF and CAP_PERFMON (as
/// the kernel's `bpf_capable` and `perfmon_capable` let it), not for
/// CAP_NET_ADMIN.
fn lacking_loading_capabilities(status: &str) -> Vec<(&'static str, &'static str)> {
    let Some(effective) = status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
    else {
        return Vec::new();
    };
    let has = |capability: u32| effective & (1 << capability) != 0;
    LOADING_CAPABILITIES
        .iter()
        .filter(|(number, _, _)| !has(*number) && (*number == 12 || !has(CAP_SYS_ADMIN)))
        .map(|(_, name, purpose)| (*name, *purpose))
        .collect()
}

/// A sentence naming the capabilities this process lacks for loading, to add
/// to a load error; empty when it has them all (the error is then another one).
pub(crate) fn lacking_capabilities_hint() -> String {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return String::new();
    };
    let lacking = lacking_loading_capabilities(&status);
    if lacking.is_empty() {
        return String::new();
    }
    let named: Vec<String> = lacking
        .iter()
        .map(|(name, purpose)| format!("{name} ({purpose})"))
        .collect();
    format!(
        "; this process lacks {}: grant it in the agent's securityContext \
         (the Helm chart does; see the README's Privileges)",
        named.join(", ")
    )
}

#[cfg(test)]
mod tests;
