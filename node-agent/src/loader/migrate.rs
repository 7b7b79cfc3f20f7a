//! Schema-version migration.
//!
//! Maps are pinned under `<pin dir>/v<SCHEMA_VERSION>/`. When a process with a new
//! schema version starts and finds maps of an older version:
//! - a map whose shape (type, key size, value size) did not change between the
//!   versions is *reused*: the new programs are loaded against the very same map
//!   object, which is then pinned under the new version directory too. Nothing is
//!   copied, so no entry written in the meantime can be lost, and connections
//!   tracked by the old programs keep their state without a gap;
//! - a map whose layout changed needs a converter from that older layout; none
//!   exists yet (version 1 is the first layout), so such a map is refused with an
//!   error naming it, rather than misread. A converter would create the new map,
//!   copy converted entries, and copy conntrack entries once more after the new
//!   programs are attached.
//!
//! The old version's pins are removed by `finish` once the new programs are
//! attached everywhere (the links themselves are version independent and are
//! updated in place).

use std::{
    mem::size_of,
    os::fd::AsFd as _,
    path::{Path, PathBuf},
};

use switchyard_common::{
    map_names, AffinityKey, AffinityValue, BackendSlotKey, BackendValue, ConntrackKey,
    ConntrackValue, DatapathConfig, FrontendKey, FrontendValue, SocketReverseKey,
    SocketReverseValue, SCHEMA_VERSION,
};

use super::{system, version_directory};
use crate::Error;

const MAP_TYPE_HASH: u32 = 1;
const MAP_TYPE_ARRAY: u32 = 2;
const MAP_TYPE_PERCPU_ARRAY: u32 = 6;
const MAP_TYPE_LRU_HASH: u32 = 9;

/// Every map of the current layout: name, kernel map type, key and value size.
fn current_shapes() -> [(&'static str, u32, usize, usize); 7] {
    [
        (
            map_names::FRONTENDS,
            MAP_TYPE_HASH,
            size_of::<FrontendKey>(),
            size_of::<FrontendValue>(),
        ),
        (
            map_names::BACKEND_SLOTS,
            MAP_TYPE_HASH,
            size_of::<BackendSlotKey>(),
            size_of::<BackendValue>(),
        ),
        (
            map_names::CONNTRACK,
            MAP_TYPE_LRU_HASH,
            size_of::<ConntrackKey>(),
            size_of::<ConntrackValue>(),
        ),
        (
            map_names::AFFINITY,
            MAP_TYPE_LRU_HASH,
            size_of::<AffinityKey>(),
            size_of::<AffinityValue>(),
        ),
        (
            map_names::CONFIG,
            MAP_TYPE_ARRAY,
            size_of::<u32>(),
            size_of::<DatapathConfig>(),
        ),
        (
            map_names::COUNTERS,
            MAP_TYPE_PERCPU_ARRAY,
            size_of::<u32>(),
            size_of::<u64>(),
        ),
        (
            map_names::SOCKET_REVERSE,
            MAP_TYPE_LRU_HASH,
            size_of::<SocketReverseKey>(),
            size_of::<SocketReverseValue>(),
        ),
    ]
}

/// Versions present under the pin directory, older than the current one, newest
/// first.
pub(crate) fn older_versions(pin_directory: &Path) -> Vec<u32> {
    let mut versions: Vec<u32> = std::fs::read_dir(pin_directory)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            entry
                .file_name()
                .to_string_lossy()
                .strip_prefix('v')
                .and_then(|version| version.parse().ok())
        })
        .filter(|version| *version < SCHEMA_VERSION)
        .collect();
    versions.sort_unstable_by(|a, b| b.cmp(a));
    versions
}

/// A map of an older version that the new programs will use as it is.
pub(crate) struct ReusedMap {
    pub name: &'static str,
    pub old_path: PathBuf,
}

/// For every current map without a pin of its own yet: the newest older version's
/// map of the same name, if its shape is unchanged. A changed shape is an error.
pub(crate) fn reusable_maps(pin_directory: &Path) -> Result<Vec<ReusedMap>, Error> {
    let current_directory = version_directory(pin_directory, SCHEMA_VERSION);
    let mut reused = Vec::new();
    for (name, map_type, key_size, value_size) in current_shapes() {
        if current_directory.join(name).exists() {
            continue;
        }
        for version in older_versions(pin_directory) {
            let old_path = version_directory(pin_directory, version).join(name);
            let map = match system::open_pinned(&old_path) {
                Ok(map) => map,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                Err(error) => {
                    return Err(Error::MigrateMaps {
                        from_version: version,
                        reason: format!("cannot open {}: {error}", old_path.display()),
                    })
                }
            };
            let shape = system::map_shape(map.as_fd()).map_err(|error| Error::MigrateMaps {
                from_version: version,
                reason: format!("cannot read {}: {error}", old_path.display()),
            })?;
            let unchanged = shape.map_type == map_type
                && shape.key_size as usize == key_size
                && shape.value_size as usize == value_size;
            if !unchanged {
                return Err(Error::MigrateMaps {
                    from_version: version,
                    reason: format!(
                        "map {name} changed layout ({shape:?} -> type {map_type}, key {key_size} \
                         bytes, value {value_size} bytes) and no converter from version \
                         {version} exists; remove {} to start afresh",
                        version_directory(pin_directory, version).display()
                    ),
                });
            }
            reused.push(ReusedMap { name, old_path });
            break;
        }
    }
    Ok(reused)
}

/// Pins a reused map under the current version directory too.
pub(crate) fn pin_reused(pin_directory: &Path, map: &ReusedMap) -> Result<(), Error> {
    let new_path = version_directory(pin_directory, SCHEMA_VERSION).join(map.name);
    let fd = system::open_pinned(&map.old_path).map_err(|error| Error::MigrateMaps {
        from_version: 0,
        reason: format!("cannot open {}: {error}", map.old_path.display()),
    })?;
    super::pin_fd(&fd.as_fd(), &new_path)
}

/// After the new programs are attached everywhere: removes an old version's pins.
pub(crate) fn finish(pin_directory: &Path, version: u32) -> Result<(), Error> {
    let directory = version_directory(pin_directory, version);
    std::fs::remove_dir_all(&directory).map_err(|source| Error::PreparePinDirectory {
        step: "remove the old schema version of",
        path: directory,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn older_version_directories_are_found_newest_first_and_others_ignored() {
        let directory =
            std::env::temp_dir().join(format!("switchyard-migrate-test-{}", std::process::id()));
        for name in ["v0", "links", "vx", &format!("v{SCHEMA_VERSION}")] {
            std::fs::create_dir_all(directory.join(name)).expect("create");
        }
        let versions = older_versions(&directory);
        std::fs::remove_dir_all(&directory).expect("remove");
        assert_eq!(versions, vec![0]);
    }

    #[test]
    fn every_pinned_map_has_a_known_shape() {
        let names: Vec<&str> = current_shapes().iter().map(|shape| shape.0).collect();
        assert_eq!(names.len(), 7);
        assert!(names.contains(&map_names::CONNTRACK));
        assert!(names.contains(&map_names::SOCKET_REVERSE));
    }
}
