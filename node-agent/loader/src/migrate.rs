//! Schema-version migration: the I/O around the pure rules of `schema`.
//!
//! Maps are pinned under `<pin dir>/v<SCHEMA_VERSION>/`. When a process finds
//! maps of an older version (see `docs/datapath.md`, "Restart and upgrade safety"):
//! 1. [`observe`] reads which versions and maps are pinned (reads only), and
//!    `schema::plan` decides per map: take it over as it is (layout unchanged),
//!    convert it, or create it. A newer version (a downgrade), an unknown older
//!    one, or a map whose shape is not its version's layout is refused before
//!    anything is touched.
//! 2. The new maps are built in a staging directory (`v<N>-converting`): created
//!    maps by aya, taken-over maps pinned there too, converted maps filled entry
//!    by entry ([`convert_map`]); then the directory is renamed to `v<N>` in one
//!    step, so a process that dies half way leaves a staging directory (removed
//!    and redone by the next one), never a half-filled `v<N>`.
//! 3. The new programs are loaded against the new maps; the caller attaches them
//!    (each hook's link is updated in place, so no hook is ever empty). Right
//!    before the first hook switches, [`merge_flow_state`] copies into the new
//!    flow-state maps what the old programs wrote while the new ones were
//!    verified.
//! 4. Once every pinned hook runs one of the new programs, [`merge_flow_state`]
//!    copies what the old programs wrote since, and [`finish`] removes the old
//!    version's pins.

use std::{
    os::fd::AsFd as _,
    path::{Path, PathBuf},
};

use switchyard_common::SCHEMA_VERSION;

use super::{
    schema::{self, MapShape, PinObservation},
    system, version_directory,
};
use crate::Error;

/// Where a conversion builds the new version's maps before they are complete.
pub(crate) fn staging_directory(pin_directory: &Path) -> PathBuf {
    pin_directory.join(format!("v{SCHEMA_VERSION}-converting"))
}

fn migrate_error(version: u32, cause: String) -> Error {
    Error::MigrateMaps {
        from_version: version,
        source: cause.into(),
    }
}

/// What is pinned: version directories, the current version's maps, and the
/// shapes of the older versions' maps. Reads only.
pub(crate) fn observe(pin_directory: &Path) -> Result<PinObservation, Error> {
    let mut observation = PinObservation::default();
    let entries = match std::fs::read_dir(pin_directory) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(observation),
        Err(source) => {
            return Err(Error::PreparePinDirectory {
                step: "read",
                path: pin_directory.to_path_buf(),
                source,
            })
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(version) = name.strip_prefix('v').and_then(|text| text.parse().ok()) {
            observation.versions.insert(version);
        }
    }
    let current = version_directory(pin_directory, SCHEMA_VERSION);
    for layout in &schema::CURRENT_LAYOUTS {
        if current.join(layout.name).exists() {
            observation.current_maps.insert(layout.name.to_string());
        }
    }
    let older: Vec<u32> = observation
        .versions
        .iter()
        .copied()
        .filter(|version| *version < SCHEMA_VERSION)
        .collect();
    for version in older {
        let directory = version_directory(pin_directory, version);
        for layout in &schema::CURRENT_LAYOUTS {
            let path = directory.join(layout.name);
            let map = match system::open_pinned(&path) {
                Ok(map) => map,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                Err(error) => {
                    return Err(migrate_error(
                        version,
                        format!("cannot open {}: {error}", path.display()),
                    ))
                }
            };
            let shape = system::map_shape(map.as_fd()).map_err(|error| {
                migrate_error(version, format!("cannot read {}: {error}", path.display()))
            })?;
            observation.older_maps.insert(
                (version, layout.name.to_string()),
                MapShape {
                    map_type: shape.map_type,
                    key_size: shape.key_size,
                    value_size: shape.value_size,
                },
            );
        }
    }
    Ok(observation)
}

/// Removes a directory tree if it exists.
pub(crate) fn remove_directory(path: &Path, step: &'static str) -> Result<(), Error> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(Error::PreparePinDirectory {
            step,
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn open(version: u32, path: &Path) -> Result<(std::os::fd::OwnedFd, system::MapShape), Error> {
    let map = system::open_pinned(path).map_err(|error| {
        migrate_error(version, format!("cannot open {}: {error}", path.display()))
    })?;
    let shape = system::map_shape(map.as_fd()).map_err(|error| {
        migrate_error(version, format!("cannot read {}: {error}", path.display()))
    })?;
    Ok((map, shape))
}

/// The entries of an old map, converted to the current layout.
fn converted_entries(
    schema: &schema::Schema,
    version: u32,
    name: &str,
    old_path: &Path,
) -> Result<Vec<schema::Entry>, Error> {
    let (old, shape) = open(version, old_path)?;
    let raw = system::map_entries(
        old.as_fd(),
        shape.key_size as usize,
        shape.value_size as usize,
    )
    .map_err(|error| migrate_error(version, format!("cannot read {name}: {error}")))?;
    let mut entries = Vec::with_capacity(raw.len());
    for (key, value) in raw {
        match schema.convert_entry(version, name, &key, &value) {
            Ok(Some(entry)) => entries.push(entry),
            Ok(None) => {}
            Err(reason) => {
                return Err(migrate_error(
                    version,
                    format!("cannot convert an entry of {name}: {reason}"),
                ))
            }
        }
    }
    Ok(entries)
}

/// Fills the new map at `new_path` with the converted entries of the old one.
/// Returns how many entries were written.
pub(crate) fn convert_map(
    schema: &schema::Schema,
    version: u32,
    name: &str,
    old_path: &Path,
    new_path: &Path,
) -> Result<usize, Error> {
    let mut entries = converted_entries(schema, version, name, old_path)?;
    let (new, shape) = open(version, new_path)?;
    schema::order_for_insertion(name, &mut entries);
    write_entries(version, name, &new, shape.map_type, &entries)?;
    Ok(entries.len())
}

/// Writes entries into a new map. An LRU map gets them from every CPU in turn, in
/// their order (so each CPU's share of a per-CPU-list LRU holds its part, and
/// within it the entries written last are the last to be evicted).
fn write_entries(
    version: u32,
    name: &str,
    map: &std::os::fd::OwnedFd,
    map_type: u32,
    entries: &[schema::Entry],
) -> Result<(), Error> {
    let write = |entry: &schema::Entry| {
        system::map_update(map.as_fd(), &entry.key, &entry.value, system::UPDATE_ANY)
    };
    let result = if map_type == schema::MAP_TYPE_LRU_HASH && entries.len() > 1 {
        system::on_each_cpu(|index, cpus| {
            entries
                .iter()
                .enumerate()
                .filter(|(position, _)| position % cpus == index)
                .try_for_each(|(_, entry)| write(entry))
        })
    } else if map_type == schema::MAP_TYPE_HASH {
        // A plain hash never evicts: when it is full (a merge into a busy new
        // map), the most recently used entries go first, and the rest are left
        // out and said so, as an LRU of that size would have evicted them: a UDP
        // flow among them chooses a backend again, a TCP one breaks. Only a node
        // with more flows than the map holds gets here.
        let mut left_out = 0usize;
        let result = entries
            .iter()
            .rev()
            .try_for_each(|entry| match write(entry) {
                Err(error) if error.raw_os_error() == Some(libc::E2BIG) => {
                    left_out += 1;
                    Ok(())
                }
                other => other,
            });
        if left_out > 0 {
            tracing::warn!(map = %name, left_out, "the new map is full: entries of the old version were left out");
        }
        result
    } else {
        entries.iter().try_for_each(write)
    };
    result.map_err(|error| migrate_error(version, format!("cannot write {name}: {error}")))
}

/// After the switch: copies into the current flow-state map `name` the entries of
/// the old version's map that the old programs wrote or refreshed since
/// `since_nanoseconds` (the conversion) and that the new map lacks or holds
/// older. Older entries were converted already; copying them again would only
/// push live entries out of the LRU. Nothing to do when both pins are the same
/// object (a map taken over). Returns how many were written.
pub(crate) fn merge_flow_state(
    schema: &schema::Schema,
    pin_directory: &Path,
    version: u32,
    name: &str,
    since_nanoseconds: u64,
) -> Result<usize, Error> {
    let old_path = version_directory(pin_directory, version).join(name);
    let new_path = version_directory(pin_directory, SCHEMA_VERSION).join(name);
    let (old, old_shape) = match open(version, &old_path) {
        Ok(opened) => opened,
        Err(_) if !old_path.exists() => return Ok(0),
        Err(error) => return Err(error),
    };
    let (new, new_shape) = open(version, &new_path)?;
    let same_object = system::map_id(old.as_fd()).ok() == system::map_id(new.as_fd()).ok();
    if same_object {
        return Ok(0);
    }
    let declared = schema
        .layouts_of(version)
        .and_then(|layouts| layouts.iter().find(|layout| layout.name == name))
        .map(|layout| layout.shape);
    let observed = MapShape {
        map_type: old_shape.map_type,
        key_size: old_shape.key_size,
        value_size: old_shape.value_size,
    };
    if declared != Some(observed) {
        return Err(migrate_error(
            version,
            format!("map {name} has {observed:?}, not its version's layout; not merged"),
        ));
    }
    drop(old);
    let mut winners = Vec::new();
    for entry in converted_entries(schema, version, name, &old_path)? {
        // Most entries predate the conversion: skip them before any syscall, so
        // the merge (and with it the moment the switch is complete) is quick.
        if schema::last_used_nanoseconds(name, &entry.value)
            .is_some_and(|used| used < since_nanoseconds)
        {
            continue;
        }
        let existing =
            system::map_lookup(new.as_fd(), &entry.key, new_shape.value_size as usize)
                .map_err(|error| migrate_error(version, format!("cannot read {name}: {error}")))?;
        if schema::old_entry_wins(name, existing.as_deref(), &entry.value, since_nanoseconds) {
            winners.push(entry);
        }
    }
    schema::order_for_insertion(name, &mut winners);
    write_entries(version, name, &new, new_shape.map_type, &winners)?;
    Ok(winners.len())
}

/// Removes an old version's pins (its maps disappear with their last user).
pub(crate) fn finish(pin_directory: &Path, version: u32) -> Result<(), Error> {
    remove_directory(
        &version_directory(pin_directory, version),
        "remove the old schema version of",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_directories_are_observed_and_other_entries_ignored() {
        let directory =
            std::env::temp_dir().join(format!("switchyard-migrate-test-{}", std::process::id()));
        for name in [
            "v0",
            "links",
            "vx",
            &format!("v{SCHEMA_VERSION}"),
            &format!("v{SCHEMA_VERSION}-converting"),
        ] {
            std::fs::create_dir_all(directory.join(name)).expect("create");
        }
        let observation = observe(&directory);
        std::fs::remove_dir_all(&directory).expect("remove");
        let observation = observation.expect("observe");
        assert_eq!(
            observation.versions.iter().copied().collect::<Vec<_>>(),
            vec![0, SCHEMA_VERSION],
            "the staging directory is not a version"
        );
        assert!(observation.current_maps.is_empty());
        assert!(observation.older_maps.is_empty());
    }

    #[test]
    fn a_missing_pin_directory_is_observed_as_empty() {
        let observation = observe(Path::new("/nonexistent/switchyard-pins")).expect("observe");
        assert_eq!(observation, PinObservation::default());
    }
}
