//! One start of a container from its image: the volume sources resolved on the node (a
//! kubelet's volume set-up), the OCI bundle written, and the OCI runtime's command line.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::container::{
    grantable, runtime_config, ContainerRun, HostPathType, MountSource, ResolvedSources,
};
use super::image_store::UnpackedImage;

/// Where a node's paths are seen from the runner: through the node holder's root.
pub fn node_path(holder: u32, path: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{holder}/root")).join(path.trim_start_matches('/'))
}

/// Checks (and for the `...OrCreate` types, makes) a hostPath volume's path on the node, as
/// the kubelet does before it starts a container; the message is the kubelet's.
pub fn prepare_host_path(
    holder: u32,
    volume_path: &str,
    type_: HostPathType,
) -> Result<(), String> {
    let seen = node_path(holder, volume_path);
    let metadata = std::fs::metadata(&seen);
    let failed = |what: &str| format!("hostPath type check failed: {volume_path} is not a {what}");
    match type_ {
        HostPathType::Unchecked => Ok(()),
        HostPathType::Directory => match metadata {
            Ok(metadata) if metadata.is_dir() => Ok(()),
            _ => Err(failed("directory")),
        },
        HostPathType::File => match metadata {
            Ok(metadata) if metadata.is_file() => Ok(()),
            _ => Err(failed("file")),
        },
        HostPathType::Socket => {
            use std::os::unix::fs::FileTypeExt;
            match metadata {
                Ok(metadata) if metadata.file_type().is_socket() => Ok(()),
                _ => Err(failed("socket")),
            }
        }
        HostPathType::DirectoryOrCreate => match metadata {
            Ok(metadata) if metadata.is_dir() => Ok(()),
            Ok(_) => Err(failed("directory")),
            Err(_) => std::fs::create_dir_all(&seen)
                .map_err(|error| format!("failed to create the hostPath {volume_path}: {error}")),
        },
        HostPathType::FileOrCreate => match metadata {
            Ok(metadata) if metadata.is_file() => Ok(()),
            Ok(_) => Err(failed("file")),
            Err(_) => {
                if let Some(parent) = seen.parent() {
                    std::fs::create_dir_all(parent).map_err(|error| {
                        format!("failed to create the hostPath {volume_path}'s directory: {error}")
                    })?;
                }
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&seen)
                    .map(|_| ())
                    .map_err(|error| {
                        format!("failed to create the hostPath {volume_path}: {error}")
                    })
            }
        },
    }
}

/// What a start needs from the runner.
pub struct BundleInputs<'a> {
    pub holder: u32,
    pub run: &'a ContainerRun,
    pub image: &'a UnpackedImage,
    pub environment: &'a [(String, String)],
    /// The directory of the container's files (the bundle goes in a directory of its own
    /// per start).
    pub directory: &'a Path,
    /// The pod's directory for emptyDir volumes.
    pub pod_volumes: &'a Path,
    pub service_account: Option<&'a Path>,
    /// The node's hosts and resolv.conf files.
    pub hosts_file: &'a Path,
    pub resolv_conf: &'a Path,
    /// The capabilities the runner itself holds (its bounding set).
    pub held_capabilities: &'a BTreeSet<String>,
    pub start_number: u32,
}

/// A written bundle.
pub struct Bundle {
    pub directory: PathBuf,
    /// Capabilities the spec grants that this machine withholds from the runtime.
    pub withheld_capabilities: BTreeSet<String>,
}

/// Resolves the volumes and writes `config.json` (and, for a writable root filesystem, a
/// copy of the image's root of the start's own).
pub fn write_bundle(inputs: &BundleInputs) -> Result<Bundle, String> {
    let mut mount_sources = Vec::new();
    for mount in &inputs.run.mounts {
        let source = match &mount.source {
            MountSource::HostPath { path, type_ } => {
                prepare_host_path(inputs.holder, path, *type_)?;
                path.clone()
            }
            MountSource::EmptyDir { volume } => {
                let path = inputs.pod_volumes.join(volume);
                std::fs::create_dir_all(&path).map_err(|error| {
                    format!("failed to create emptyDir {}: {error}", path.display())
                })?;
                path.display().to_string()
            }
            MountSource::ServiceAccount => inputs
                .service_account
                .ok_or("the service account's token is not written")?
                .display()
                .to_string(),
        };
        mount_sources.push(source);
    }
    let bundle = inputs
        .directory
        .join(format!("bundle-{}", inputs.start_number));
    let _ = std::fs::remove_dir_all(&bundle);
    std::fs::create_dir_all(&bundle)
        .map_err(|error| format!("failed to create {}: {error}", bundle.display()))?;
    let rootfs = if inputs.run.security.read_only_root_filesystem {
        inputs.image.rootfs.clone()
    } else {
        // A writable root of the start's own: the unpacked image is shared.
        let copy = bundle.join("rootfs");
        let status = Command::new("cp")
            .arg("-a")
            .arg(&inputs.image.rootfs)
            .arg(&copy)
            .status()
            .map_err(|error| format!("failed to run cp: {error}"))?;
        if !status.success() {
            return Err(format!(
                "failed to copy {} to {}: {status}",
                inputs.image.rootfs.display(),
                copy.display()
            ));
        }
        copy
    };
    let (capabilities, withheld) =
        grantable(&inputs.run.security.capabilities, inputs.held_capabilities);
    let config = runtime_config(
        inputs.run,
        &inputs.image.config,
        &ResolvedSources {
            rootfs: rootfs.display().to_string(),
            mount_sources,
            hosts_file: inputs.hosts_file.display().to_string(),
            resolv_conf: inputs.resolv_conf.display().to_string(),
        },
        inputs.environment,
        &capabilities,
    )?;
    let path = bundle.join("config.json");
    let text = serde_json::to_string_pretty(&config)
        .map_err(|error| format!("failed to write {}: {error}", path.display()))?;
    std::fs::write(&path, text)
        .map_err(|error| format!("failed to write {}: {error}", path.display()))?;
    Ok(Bundle {
        directory: bundle,
        withheld_capabilities: withheld,
    })
}

/// The runner's own bounding set, from `/proc/self/status`.
pub fn held_capabilities() -> std::io::Result<BTreeSet<String>> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let mask = status
        .lines()
        .find_map(|line| line.strip_prefix("CapBnd:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "no CapBnd in /proc/self/status",
            )
        })?;
    Ok(super::container::capability_names(mask))
}
