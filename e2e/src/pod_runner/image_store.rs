//! The pod runner's unpacked images: each OCI image archive's root filesystem, unpacked
//! once with umoci and kept under its manifest digest, so a cluster's starts (and the next
//! cluster's, while the images stay the same) reuse it.
//!
//! Layout of the cache directory: `<manifest digest hex>/rootfs` and
//! `<manifest digest hex>/image-config.json`; an entry is complete once its directory has
//! its final name (it is unpacked under a temporary name and renamed).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use serde::Deserialize;

use super::container::{ImageConfig, ImageConfigBlob};
use crate::error::{E2eError, Result};

/// An image's unpacked root filesystem and its config.
#[derive(Debug, Clone)]
pub struct UnpackedImage {
    /// `sha256:...` of the image's manifest.
    pub digest: String,
    pub rootfs: PathBuf,
    pub config: ImageConfig,
}

#[derive(Debug, Deserialize)]
struct Index {
    manifests: Vec<Descriptor>,
}

#[derive(Debug, Deserialize)]
struct Descriptor {
    digest: String,
    #[serde(default)]
    annotations: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
struct Manifest {
    config: Descriptor,
}

/// Entries kept beside the newest ones: older ones unused for an hour are removed.
const KEPT_ENTRIES: usize = 6;
const UNUSED_FOR: Duration = Duration::from_secs(3600);

fn run(command: &mut Command) -> Result<Vec<u8>> {
    let described = format!("{command:?}");
    let output = command.output().map_err(|source| E2eError::RunCommand {
        command: described.clone(),
        message: source.to_string(),
    })?;
    if !output.status.success() {
        return Err(E2eError::RunCommand {
            command: described,
            message: format!(
                "{}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        });
    }
    Ok(output.stdout)
}

fn parse<T: for<'a> Deserialize<'a>>(bytes: &[u8], path: &Path) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|error| E2eError::ReadFile {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, error),
    })
}

/// The hex part of a `sha256:` digest, refused when it is anything but hex (it names a
/// directory).
fn digest_hex(digest: &str, archive: &Path) -> Result<String> {
    match digest.strip_prefix("sha256:") {
        Some(hex) if hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit()) => {
            Ok(hex.to_string())
        }
        _ => Err(E2eError::ReadFile {
            path: archive.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("not a sha256 digest: {digest:?}"),
            ),
        }),
    }
}

/// The image of a one-image OCI archive, unpacked into `cache` unless it is there already.
pub fn unpack(archive: &Path, cache: &Path) -> Result<UnpackedImage> {
    let index_bytes = run(Command::new("tar")
        .arg("-xOf")
        .arg(archive)
        .arg("index.json"))?;
    let index: Index = parse(&index_bytes, &archive.join("index.json"))?;
    let [manifest] = index.manifests.as_slice() else {
        return Err(E2eError::ReadFile {
            path: archive.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("holds {} images, not one", index.manifests.len()),
            ),
        });
    };
    let hex = digest_hex(&manifest.digest, archive)?;
    let entry = cache.join(&hex);
    if !entry.is_dir() {
        unpack_into(archive, manifest, &hex, cache, &entry)?;
        prune(cache, &entry);
    }
    // The entry's time says when it was last used (see `prune`).
    let _ = std::fs::File::open(&entry).and_then(|file| file.set_modified(SystemTime::now()));
    let config_path = entry.join("image-config.json");
    let bytes = std::fs::read(&config_path).map_err(|source| E2eError::ReadFile {
        path: config_path.clone(),
        source,
    })?;
    let blob: ImageConfigBlob = parse(&bytes, &config_path)?;
    Ok(UnpackedImage {
        digest: manifest.digest.clone(),
        rootfs: entry.join("rootfs"),
        config: blob.config,
    })
}

fn unpack_into(
    archive: &Path,
    manifest: &Descriptor,
    hex: &str,
    cache: &Path,
    entry: &Path,
) -> Result<()> {
    let temporary = cache.join(format!(".unpacking-{hex}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&temporary);
    let layout = temporary.join("layout");
    std::fs::create_dir_all(&layout).map_err(|source| E2eError::WriteFile {
        path: layout.clone(),
        source,
    })?;
    let result = (|| {
        run(Command::new("tar")
            .arg("-xf")
            .arg(archive)
            .arg("-C")
            .arg(&layout))?;
        // umoci finds the image by its reference name in the layout's index.
        let reference = manifest
            .annotations
            .get("org.opencontainers.image.ref.name")
            .cloned()
            .ok_or_else(|| E2eError::ReadFile {
                path: archive.to_path_buf(),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "its image has no org.opencontainers.image.ref.name",
                ),
            })?;
        run(Command::new("umoci")
            .args(["raw", "unpack", "--image"])
            .arg(format!("{}:{reference}", layout.display()))
            .arg(temporary.join("rootfs")))?;
        let manifest_path = layout.join("blobs/sha256").join(hex);
        let manifest_bytes =
            std::fs::read(&manifest_path).map_err(|source| E2eError::ReadFile {
                path: manifest_path.clone(),
                source,
            })?;
        let manifest: Manifest = parse(&manifest_bytes, &manifest_path)?;
        let config_blob = layout
            .join("blobs/sha256")
            .join(digest_hex(&manifest.config.digest, archive)?);
        let config_path = temporary.join("image-config.json");
        std::fs::copy(&config_blob, &config_path).map_err(|source| E2eError::WriteFile {
            path: config_path,
            source,
        })?;
        std::fs::remove_dir_all(&layout).map_err(|source| E2eError::WriteFile {
            path: layout.clone(),
            source,
        })?;
        std::fs::rename(&temporary, entry).map_err(|source| E2eError::WriteFile {
            path: entry.to_path_buf(),
            source,
        })
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&temporary);
        // Another runner may have finished the same entry meanwhile.
        if entry.is_dir() {
            return Ok(());
        }
    }
    result
}

/// Removes entries beyond the newest [`KEPT_ENTRIES`] that were not used for
/// [`UNUSED_FOR`] (never `keep`): each is an image's whole root filesystem.
fn prune(cache: &Path, keep: &Path) {
    let Ok(listing) = std::fs::read_dir(cache) else {
        return;
    };
    let mut entries: Vec<(SystemTime, PathBuf)> = listing
        .flatten()
        .filter(|entry| !entry.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|entry| {
            let modified = entry.metadata().ok()?.modified().ok()?;
            Some((modified, entry.path()))
        })
        .collect();
    entries.sort_by_key(|entry| std::cmp::Reverse(entry.0));
    let now = SystemTime::now();
    for (modified, path) in entries.into_iter().skip(KEPT_ENTRIES) {
        let unused = now.duration_since(modified).unwrap_or_default() > UNUSED_FOR;
        if unused && path != keep {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}
