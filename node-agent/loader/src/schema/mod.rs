//! Map schema versions, and the pure part of an upgrade: which map comes from
//! where, and how one entry of an older layout becomes an entry of the current one.
//!
//! Everything here is bytes in, bytes out: no map is touched (that is `migrate`),
//! so every rule is unit-tested.
//!
//! A schema bump adds one [`VersionStep`] to [`STEPS`]: the previous version's
//! layouts (its key and value sizes per map), the maps whose layout or meaning
//! changed, and a function converting one entry of a changed map. Maps the step
//! does not list are the very same objects in both versions (taken over, nothing
//! copied). Converting from a version several steps back chains the steps.
//!
//! Why shapes alone cannot decide: a layout can change without changing size (two
//! fields swapped), so only the version in the pin path tells which layout a map
//! has; the observed shape is checked against the layout the version declares, as
//! a safety net against misreading.

mod version0;
mod version1;

use std::collections::{BTreeMap, BTreeSet};

use switchyard_common::{
    map_names, AffinityKey, AffinityValue, BackendSlotKey, BackendValue, ConntrackKey,
    ConntrackValue, DatapathConfig, FrontendKey, FrontendValue, SocketReverseKey,
    SocketReverseValue, SourceRangeKey, SCHEMA_VERSION, TCP_STATE_FIN_FROM_BACKEND,
    TCP_STATE_FIN_FROM_CLIENT, TCP_STATE_RESET,
};

/// Kernel map types used by the datapath (`enum bpf_map_type`).
pub const MAP_TYPE_HASH: u32 = 1;
pub const MAP_TYPE_ARRAY: u32 = 2;
pub const MAP_TYPE_PERCPU_ARRAY: u32 = 6;
pub const MAP_TYPE_LRU_HASH: u32 = 9;
pub const MAP_TYPE_LPM_TRIE: u32 = 11;

/// What must match for a pinned map to be read with a given layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct MapShape {
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
}

/// One map of one schema version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapLayout {
    pub name: &'static str,
    pub shape: MapShape,
}

const fn layout(
    name: &'static str,
    map_type: u32,
    key_size: usize,
    value_size: usize,
) -> MapLayout {
    MapLayout {
        name,
        shape: MapShape {
            map_type,
            key_size: key_size as u32,
            value_size: value_size as u32,
        },
    }
}

/// The maps of the current layout ([`SCHEMA_VERSION`]).
///
/// The last two (`loadBalancerSourceRanges`) came after version 2 had shipped
/// without them, as additive maps: a version 2 pin directory without them plans
/// them as [`MapSource::Create`] next to the maps it uses as they are (no
/// conversion, no bump), and the programs that read them replace the old ones.
/// They are listed here so that the next bump's step carries them over.
pub const CURRENT_LAYOUTS: [MapLayout; 10] = {
    use core::mem::size_of;
    [
        layout(
            map_names::FRONTENDS,
            MAP_TYPE_HASH,
            size_of::<FrontendKey>(),
            size_of::<FrontendValue>(),
        ),
        layout(
            map_names::BACKEND_SLOTS,
            MAP_TYPE_HASH,
            size_of::<BackendSlotKey>(),
            size_of::<BackendValue>(),
        ),
        layout(
            map_names::CONNTRACK,
            MAP_TYPE_HASH,
            size_of::<ConntrackKey>(),
            size_of::<ConntrackValue>(),
        ),
        layout(
            map_names::CONNTRACK_OVERFLOW,
            MAP_TYPE_LRU_HASH,
            size_of::<ConntrackKey>(),
            size_of::<ConntrackValue>(),
        ),
        layout(
            map_names::AFFINITY,
            MAP_TYPE_LRU_HASH,
            size_of::<AffinityKey>(),
            size_of::<AffinityValue>(),
        ),
        layout(
            map_names::CONFIG,
            MAP_TYPE_ARRAY,
            size_of::<u32>(),
            size_of::<DatapathConfig>(),
        ),
        layout(
            map_names::COUNTERS,
            MAP_TYPE_PERCPU_ARRAY,
            size_of::<u32>(),
            size_of::<u64>(),
        ),
        layout(
            map_names::SOCKET_REVERSE,
            MAP_TYPE_LRU_HASH,
            size_of::<SocketReverseKey>(),
            size_of::<SocketReverseValue>(),
        ),
        layout(
            map_names::SOURCE_RANGES,
            MAP_TYPE_LPM_TRIE,
            // The trie's key: its prefix length, then the data.
            size_of::<u32>() + size_of::<SourceRangeKey>(),
            size_of::<u8>(),
        ),
        layout(
            map_names::SOURCE_RANGE_DROPS,
            MAP_TYPE_PERCPU_ARRAY,
            size_of::<u32>(),
            size_of::<u64>(),
        ),
    ]
};

/// One entry as the kernel stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

/// Converts one entry of `map` from the step's version into the next version's
/// layout. `Ok(None)` drops the entry on purpose; `Err` names what is wrong with
/// the bytes.
pub type ConvertEntry = fn(map: &str, key: &[u8], value: &[u8]) -> Result<Option<Entry>, String>;

/// How to get from version `from` to version `from + 1`.
pub struct VersionStep {
    pub from: u32,
    /// Every map of version `from`.
    pub layouts: &'static [MapLayout],
    /// Maps whose layout or meaning changed in `from + 1`: their entries are
    /// converted into new maps. Every other map is taken over as it is.
    pub changed_maps: &'static [&'static str],
    pub convert: ConvertEntry,
}

/// Every version this agent can upgrade from, oldest first. The last step's
/// `from + 1` is [`SCHEMA_VERSION`].
///
/// Version 0 never shipped: it is a synthetic layout (fields reordered, a field
/// narrower, one missing) kept so that the conversion machinery is exercised end
/// to end by the tests (`node-agent/tests/datapath_schema.rs` pins maps of it and
/// runs the agent), and as the template for the first real bump. Version 1 is
/// the first layout that shipped; version 2 moved flows into a plain hash.
pub static STEPS: &[VersionStep] = &[version0::STEP, version1::STEP];

/// Maps that are never converted when their layout changes: the per-CPU
/// statistics counters start again from zero (Prometheus counters tolerate a
/// reset; per-CPU values have no per-entry meaning worth carrying).
pub const NOT_CONVERTED: &[&str] = &[map_names::COUNTERS, map_names::SOURCE_RANGE_DROPS];

/// Maps the programs write (flow state): converted at load, and merged once more
/// after every hook runs the new programs, for entries the old programs wrote in
/// between. The other maps are written by the agent, which owns the new ones
/// from the moment they exist.
pub const FLOW_STATE_MAPS: &[&str] = &[
    map_names::CONNTRACK,
    map_names::CONNTRACK_OVERFLOW,
    map_names::AFFINITY,
    map_names::SOCKET_REVERSE,
];

/// A set of layouts and the steps between them: [`SCHEMA`] in the agent; tests
/// build others (several steps, unknown versions) to check the rules.
pub struct Schema {
    pub current: u32,
    pub current_layouts: &'static [MapLayout],
    /// Oldest first; the last step's `from + 1` is `current`.
    pub steps: &'static [VersionStep],
}

impl std::fmt::Debug for Schema {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Schema")
            .field("current", &self.current)
            .field(
                "steps_from",
                &self.steps.iter().map(|step| step.from).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// The agent's schema: [`SCHEMA_VERSION`], [`CURRENT_LAYOUTS`] and [`STEPS`].
pub static SCHEMA: Schema = Schema {
    current: SCHEMA_VERSION,
    current_layouts: &CURRENT_LAYOUTS,
    steps: STEPS,
};

impl Schema {
    fn step_from(&self, version: u32) -> Option<&VersionStep> {
        self.steps.iter().find(|step| step.from == version)
    }

    /// The layouts of a version this agent knows.
    pub fn layouts_of(&self, version: u32) -> Option<&[MapLayout]> {
        if version == self.current {
            Some(self.current_layouts)
        } else {
            self.step_from(version).map(|step| step.layouts)
        }
    }

    /// Whether every step from `version` to the current one exists.
    pub fn is_known(&self, version: u32) -> bool {
        version <= self.current
            && (version..self.current).all(|from| self.step_from(from).is_some())
    }

    /// Whether `map` changed anywhere between `version` and the current one.
    fn changed_since(&self, version: u32, map: &str) -> bool {
        (version..self.current)
            .filter_map(|from| self.step_from(from))
            .any(|step| step.changed_maps.contains(&map))
    }

    /// Converts one entry of `map` from `version` to the current layout, step by
    /// step; maps a step does not list pass through it unchanged.
    pub fn convert_entry(
        &self,
        version: u32,
        map: &str,
        key: &[u8],
        value: &[u8],
    ) -> Result<Option<Entry>, String> {
        if !self.is_known(version) {
            return Err(format!("no conversion from schema version {version}"));
        }
        let mut entry = Entry {
            key: key.to_vec(),
            value: value.to_vec(),
        };
        for from in version..self.current {
            let Some(step) = self.step_from(from) else {
                return Err(format!("no conversion from schema version {from}"));
            };
            if !step.changed_maps.contains(&map) {
                continue;
            }
            match (step.convert)(map, &entry.key, &entry.value)? {
                Some(next) => entry = next,
                None => return Ok(None),
            }
        }
        let expected = self
            .current_layouts
            .iter()
            .find(|layout| layout.name == map)
            .ok_or_else(|| format!("map {map} is not part of the current layout"))?;
        if entry.key.len() != expected.shape.key_size as usize
            || entry.value.len() != expected.shape.value_size as usize
        {
            return Err(format!(
                "the conversion of {map} produced a key of {} and a value of {} bytes, not {} and {}",
                entry.key.len(),
                entry.value.len(),
                expected.shape.key_size,
                expected.shape.value_size
            ));
        }
        Ok(Some(entry))
    }
}

/// What the pin directory holds, as far as planning is concerned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PinObservation {
    /// Every `v<N>` directory found, whatever N.
    pub versions: BTreeSet<u32>,
    /// Maps pinned in the current version's directory.
    pub current_maps: BTreeSet<String>,
    /// Maps pinned in older versions' directories, with their shapes.
    pub older_maps: BTreeMap<(u32, String), MapShape>,
}

/// Where one map of the current layout comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapSource {
    /// Pinned in the current version's directory already: used as it is.
    Current,
    /// Nothing to take over: created empty.
    Create,
    /// The very same object as in `version` (its layout did not change).
    Reuse { version: u32 },
    /// A new map, filled with the converted entries of `version`'s map.
    Convert { version: u32 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationPlan {
    pub maps: Vec<(&'static str, MapSource)>,
    /// Older version directories, removed once the new programs run everywhere.
    pub older_versions: Vec<u32>,
}

impl MigrationPlan {
    pub fn converts(&self) -> bool {
        self.maps
            .iter()
            .any(|(_, source)| matches!(source, MapSource::Convert { .. }))
    }
}

/// Why an upgrade is refused. Nothing has been touched when one is returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Maps of a version newer than this agent (a downgrade): their layout is
    /// unknown, so they can be neither read nor replaced without losing state.
    NewerVersion { version: u32, current: u32 },
    /// An older version this agent has no conversion from.
    UnknownVersion {
        version: u32,
        current: u32,
        map: String,
    },
    /// A map whose shape is not the one its version declares.
    UnexpectedShape {
        version: u32,
        map: String,
        found: MapShape,
        expected: MapShape,
    },
    /// The current version's directory holds some maps while others would be
    /// converted from an older version: a mix no process leaves behind.
    MixedVersions { version: u32 },
}

impl Refusal {
    /// The version whose maps are refused.
    pub fn version(&self) -> u32 {
        match self {
            Self::NewerVersion { version, .. }
            | Self::UnknownVersion { version, .. }
            | Self::UnexpectedShape { version, .. }
            | Self::MixedVersions { version } => *version,
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NewerVersion { version, current } => write!(
                formatter,
                "schema version {version} is newer than this agent's version {current}, \
                 and its layout is unknown to it; refusing to downgrade (nothing was changed): \
                 run an agent of version {version} or later, or remove the pin directory to \
                 start afresh (every tracked connection is lost)"
            ),
            Self::UnknownVersion {
                version,
                current,
                map,
            } => write!(
                formatter,
                "map {map} has the layout of schema version {version}, which this agent \
                 (version {current}) cannot convert; nothing was changed: remove the \
                 version's directory to start afresh (every tracked connection is lost)"
            ),
            Self::UnexpectedShape {
                version,
                map,
                found,
                expected,
            } => write!(
                formatter,
                "map {map} of schema version {version} has {found:?}, not the {expected:?} \
                 that version declares; refusing to misread it (nothing was changed)"
            ),
            Self::MixedVersions { version } => write!(
                formatter,
                "the current version's directory holds only some maps while others are still \
                 in version {version}'s; refusing to mix them (nothing was changed)"
            ),
        }
    }
}

impl Schema {
    /// Decides, for every map of the current layout, where it comes from.
    pub fn plan(&self, observation: &PinObservation) -> Result<MigrationPlan, Refusal> {
        let current_version = self.current;
        if let Some(newer) = observation
            .versions
            .iter()
            .find(|version| **version > current_version)
        {
            return Err(Refusal::NewerVersion {
                version: *newer,
                current: current_version,
            });
        }
        let mut maps = Vec::new();
        for current in self.current_layouts {
            if observation.current_maps.contains(current.name) {
                maps.push((current.name, MapSource::Current));
                continue;
            }
            // The newest older version holding this map is the one to take it from.
            let found = observation
                .older_maps
                .iter()
                .filter(|((version, name), _)| name == current.name && *version < current_version)
                .max_by_key(|((version, _), _)| *version);
            let Some(((version, _), shape)) = found else {
                maps.push((current.name, MapSource::Create));
                continue;
            };
            let version = *version;
            if !self.is_known(version) {
                return Err(Refusal::UnknownVersion {
                    version,
                    current: current_version,
                    map: current.name.to_string(),
                });
            }
            let declared = self
                .layouts_of(version)
                .and_then(|layouts| layouts.iter().find(|layout| layout.name == current.name));
            match declared {
                Some(declared) if declared.shape == *shape => {}
                Some(declared) => {
                    return Err(Refusal::UnexpectedShape {
                        version,
                        map: current.name.to_string(),
                        found: *shape,
                        expected: declared.shape,
                    })
                }
                // A map the old version did not have (a pin left by someone
                // else): never read it.
                None => {
                    maps.push((current.name, MapSource::Create));
                    continue;
                }
            }
            let source = if !self.changed_since(version, current.name) {
                MapSource::Reuse { version }
            } else if NOT_CONVERTED.contains(&current.name) {
                MapSource::Create
            } else {
                MapSource::Convert { version }
            };
            maps.push((current.name, source));
        }
        let has_current = maps.iter().any(|(_, source)| *source == MapSource::Current);
        let converted_from = maps.iter().find_map(|(_, source)| match source {
            MapSource::Convert { version } | MapSource::Reuse { version } => Some(*version),
            _ => None,
        });
        if let (true, Some(version)) = (has_current, converted_from) {
            return Err(Refusal::MixedVersions { version });
        }
        Ok(MigrationPlan {
            older_versions: observation
                .versions
                .iter()
                .copied()
                .filter(|version| *version < current_version)
                .rev()
                .collect(),
            maps,
        })
    }
}

/// When a flow-state entry was last used by the programs (`bpf_ktime_get_ns`), for
/// the maps that record it.
pub fn last_used_nanoseconds(map: &str, value: &[u8]) -> Option<u64> {
    match map {
        map_names::CONNTRACK | map_names::CONNTRACK_OVERFLOW => {
            from_bytes::<ConntrackValue>(value).map(|value| value.last_seen_nanoseconds)
        }
        map_names::AFFINITY => {
            from_bytes::<AffinityValue>(value).map(|value| value.last_used_nanoseconds)
        }
        _ => None,
    }
}

/// Orders entries for writing into a new LRU map: least recently used first, so
/// that if the map's share on a CPU fills up, what it evicts is the stalest, and
/// connections already closing go before every live one (they only still
/// translate a teardown).
pub fn order_for_insertion(map: &str, entries: &mut [Entry]) {
    let both_fins = TCP_STATE_FIN_FROM_CLIENT | TCP_STATE_FIN_FROM_BACKEND;
    entries.sort_by_key(|entry| {
        let closing = (map == map_names::CONNTRACK || map == map_names::CONNTRACK_OVERFLOW)
            && from_bytes::<ConntrackValue>(&entry.value).is_some_and(|value| {
                value.tcp_state & TCP_STATE_RESET != 0 || value.tcp_state & both_fins == both_fins
            });
        (
            !closing,
            last_used_nanoseconds(map, &entry.value).unwrap_or(0),
        )
    });
}

/// For a flow-state map, after the switch: whether a converted entry of the old
/// map should be written over what the new map holds (`existing`). Only entries
/// the old programs used since `since_nanoseconds` (the conversion, which copied
/// everything older) are candidates; an entry the new programs wrote or refreshed
/// more recently wins; an absent one is written.
pub fn old_entry_wins(
    map: &str,
    existing: Option<&[u8]>,
    converted: &[u8],
    since_nanoseconds: u64,
) -> bool {
    if last_used_nanoseconds(map, converted).is_some_and(|used| used < since_nanoseconds) {
        return false;
    }
    let Some(existing) = existing else {
        return true;
    };
    // Either value unreadable, or a map that records no use: the new map's entry stays.
    match (
        last_used_nanoseconds(map, existing),
        last_used_nanoseconds(map, converted),
    ) {
        (Some(existing), Some(converted)) => converted > existing,
        _ => false,
    }
}

/// The bytes of a map type, as the kernel stores them.
pub fn bytes_of<T: aya::Pod>(value: &T) -> Vec<u8> {
    // SAFETY: `aya::Pod` types of switchyard-common are `#[repr(C)]` integers and
    // byte arrays without padding (asserted in switchyard-common), so every byte
    // of the value is initialised.
    unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
}

/// A map type read from bytes of exactly its size.
pub fn from_bytes<T: aya::Pod>(bytes: &[u8]) -> Option<T> {
    (bytes.len() == size_of::<T>()).then(|| {
        // SAFETY: the length is checked, and any bit pattern is a valid `Pod`.
        unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) }
    })
}

use core::mem::size_of;

/// Reads fields of an older layout in order, host byte order for integers.
pub(crate) struct FieldReader<'a> {
    bytes: &'a [u8],
    offset: usize,
}

impl<'a> FieldReader<'a> {
    /// A reader over `bytes`, which must be exactly `size` long.
    pub(crate) fn new(what: &str, bytes: &'a [u8], size: usize) -> Result<Self, String> {
        if bytes.len() != size {
            return Err(format!("{what} is {} bytes, not {size}", bytes.len()));
        }
        Ok(Self { bytes, offset: 0 })
    }

    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        // The constructor checked the total size against the layout, and each
        // layout reads exactly its size, so this never runs past the end.
        if let Some(slice) = self.bytes.get(self.offset..self.offset + N) {
            out.copy_from_slice(slice);
        }
        self.offset += N;
        out
    }

    pub(crate) fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    pub(crate) fn u16(&mut self) -> u16 {
        u16::from_ne_bytes(self.take())
    }
    pub(crate) fn u32(&mut self) -> u32 {
        u32::from_ne_bytes(self.take())
    }
    pub(crate) fn u64(&mut self) -> u64 {
        u64::from_ne_bytes(self.take())
    }
    pub(crate) fn address(&mut self) -> [u8; 16] {
        self.take()
    }
    pub(crate) fn skip(&mut self, count: usize) {
        self.offset += count;
    }
}

#[cfg(test)]
mod tests;
