//! Schema-version migration: when `SCHEMA_VERSION` changes, the new process creates
//! its maps under the new version directory, copies the entries of the older
//! version's maps over (converting each layout), attaches its programs (the links
//! are version independent and updated in place), copies conntrack entries the old
//! programs created in the meantime, and only then removes the old pins.
//!
//! Each older layout that can still be found on a node needs a converter here.
//! Version 1 is the first layout, so there is nothing older to convert yet; an
//! older directory of an unknown layout is refused rather than misread.

use std::path::Path;

use switchyard_common::SCHEMA_VERSION;

use super::{pinned_maps::PinnedServiceMaps, version_directory};
use crate::{maps::ServiceMaps, Error};

/// Versions present under the pin directory, older than the current one.
fn older_versions(pin_directory: &Path) -> Vec<u32> {
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
    versions.sort_unstable();
    versions
}

/// Copies every older version's entries into the (new, empty) current maps.
/// Returns the versions copied, for [`finish`].
pub(crate) fn copy_older_versions(pin_directory: &Path) -> Result<Vec<u32>, Error> {
    let versions = older_versions(pin_directory);
    if versions.is_empty() {
        return Ok(versions);
    }
    let mut current = PinnedServiceMaps::open(pin_directory)?;
    for version in &versions {
        copy_version(pin_directory, *version, &mut current, true)?;
    }
    Ok(versions)
}

/// After the new programs are attached: copies the conntrack entries the old
/// programs made since the first copy, then removes the old version's pins.
pub(crate) fn finish(pin_directory: &Path, version: u32) -> Result<(), Error> {
    let mut current = PinnedServiceMaps::open(pin_directory)?;
    copy_version(pin_directory, version, &mut current, false)?;
    let directory = version_directory(pin_directory, version);
    std::fs::remove_dir_all(&directory).map_err(|source| Error::PreparePinDirectory {
        step: "remove the old schema version of",
        path: directory,
        source,
    })
}

fn copy_version(
    pin_directory: &Path,
    version: u32,
    current: &mut PinnedServiceMaps,
    with_services: bool,
) -> Result<(), Error> {
    let directory = version_directory(pin_directory, version);
    match version {
        // Same layout (a version directory left by a process that was stopped
        // between creating maps and migrating): copy as they are.
        SCHEMA_VERSION => {
            let old = PinnedServiceMaps::open_version(&directory)?;
            if with_services {
                copy_services(&old, current)?;
            }
            for (key, value) in old.conntrack_entries()? {
                current.insert_conntrack_if_absent(&key, &value)?;
            }
            for (key, value) in old.affinity_entries()? {
                current.write_affinity(&key, &value)?;
            }
            Ok(())
        }
        unknown => Err(Error::MigrateMaps {
            from_version: unknown,
            reason: format!(
                "no converter from schema version {unknown} to {SCHEMA_VERSION}; remove {} to start afresh",
                directory.display()
            ),
        }),
    }
}

fn copy_services(old: &PinnedServiceMaps, current: &mut PinnedServiceMaps) -> Result<(), Error> {
    // Backends before frontends, as the syncer orders writes: a frontend never
    // points at a slot that is not there yet.
    for (key, value) in old.backend_slots()? {
        current.write_backend_slot(&key, &value)?;
    }
    for (key, value) in old.frontends()? {
        current.write_frontend(&key, &value)?;
    }
    if let Some(config) = old.config()? {
        current.write_config(&config)?;
    }
    Ok(())
}
