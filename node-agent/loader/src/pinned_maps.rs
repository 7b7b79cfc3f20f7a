//! The real `ServiceMaps`: the pinned maps of the current schema version, opened
//! by path, so any process (the agent, a test, a status reader) can use them.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use aya::maps::{
    lpm_trie::{Key as LpmKey, LpmTrie},
    Array, HashMap, Map, MapData, PerCpuArray,
};
use switchyard_common::{
    counter, map_names, port_filter, BackendSlotKey, BackendValue, ConntrackKey, ConntrackValue,
    DatapathConfig, FrontendKey, FrontendValue, SocketReverseKey, SocketReverseValue,
    SourceRangeKey, SCHEMA_VERSION, SOURCE_RANGE_ADMITTED, SOURCE_RANGE_FRONTEND_BITS,
};

use super::{schema, system, version_directory};
use switchyard_model::diff::RemovedUdpBackends;
use switchyard_model::error::MapFault;
use switchyard_model::maps::{ServiceMaps, SourcePrefix, SourceRangeEntry};
use switchyard_model::Error as MapError;

use crate::Error;

/// Opens one pinned map as an `aya::maps::Map`.
pub(crate) fn open_map(directory: &Path, name: &'static str) -> Result<Map, MapError> {
    let data = MapData::from_pin(directory.join(name))
        .map_err(|error| read_error(name)(format!("cannot open the pin: {error}")))?;
    Map::from_map_data(data).map_err(read_error(name))
}

/// Opens the pin of map `name` in `directory` as a bare descriptor (for batch
/// reads and shape checks, which aya's typed maps do not expose).
pub(super) fn open_pin(
    directory: &Path,
    name: &'static str,
) -> Result<std::os::fd::OwnedFd, MapError> {
    system::open_pinned(&directory.join(name))
        .map_err(|error| read_error(name)(format!("cannot open the pin: {error}")))
}

/// The error of a failed read of map `name`, for `map_err`.
pub(super) fn read_error<E: Into<MapFault>>(name: &'static str) -> impl Fn(E) -> MapError {
    move |error| MapError::ReadMap {
        map: name,
        source: error.into(),
    }
}

fn typed<T>(map: Map, name: &'static str) -> Result<T, MapError>
where
    T: TryFrom<Map, Error = aya::maps::MapError>,
{
    T::try_from(map).map_err(|error| MapError::ReadMap {
        map: name,
        source: format!("unexpected map type or layout: {error}").into(),
    })
}

/// The per-CPU counters, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub translated: u64,
    pub no_backend: u64,
    pub conntrack_hit: u64,
    pub conntrack_miss: u64,
    pub error: u64,
    pub passed_untracked: u64,
    pub reverse_translated: u64,
    pub conntrack_overflow: u64,
}

pub struct PinnedServiceMaps {
    frontends: HashMap<MapData, FrontendKey, FrontendValue>,
    backend_slots: HashMap<MapData, BackendSlotKey, BackendValue>,
    /// Read in batches through its descriptor (see `conntrack_entries`).
    conntrack: std::os::fd::OwnedFd,
    /// The LRU holding the flows a full `conntrack` could not take.
    conntrack_overflow: std::os::fd::OwnedFd,
    config: Array<MapData, DatapathConfig>,
    counters: PerCpuArray<MapData, u64>,
    port_filter: Array<MapData, u8>,
    source_ranges: LpmTrie<MapData, SourceRangeKey, u8>,
    source_range_drops: PerCpuArray<MapData, u64>,
    /// Port filter entries this process has marked: each is written once.
    marked_ports: BTreeSet<u32>,
    /// Where the maps are pinned (batch reads open their own descriptors).
    directory: PathBuf,
}

impl PinnedServiceMaps {
    /// Opens the maps pinned under `<pin directory>/v<SCHEMA_VERSION>/`.
    pub fn open(pin_directory: &Path) -> Result<Self, Error> {
        Self::open_version(&version_directory(pin_directory, SCHEMA_VERSION))
    }

    pub(crate) fn open_version(directory: &Path) -> Result<Self, Error> {
        Ok(Self {
            frontends: typed(
                open_map(directory, map_names::FRONTENDS)?,
                map_names::FRONTENDS,
            )?,
            backend_slots: typed(
                open_map(directory, map_names::BACKEND_SLOTS)?,
                map_names::BACKEND_SLOTS,
            )?,
            conntrack: open_conntrack(directory, map_names::CONNTRACK)?.0,
            conntrack_overflow: open_conntrack(directory, map_names::CONNTRACK_OVERFLOW)?.0,
            config: typed(open_map(directory, map_names::CONFIG)?, map_names::CONFIG)?,
            counters: typed(
                open_map(directory, map_names::COUNTERS)?,
                map_names::COUNTERS,
            )?,
            port_filter: typed(
                open_map(directory, map_names::PORT_FILTER)?,
                map_names::PORT_FILTER,
            )?,
            source_ranges: typed(
                open_map(directory, map_names::SOURCE_RANGES)?,
                map_names::SOURCE_RANGES,
            )?,
            source_range_drops: typed(
                open_map(directory, map_names::SOURCE_RANGE_DROPS)?,
                map_names::SOURCE_RANGE_DROPS,
            )?,
            marked_ports: BTreeSet::new(),
            directory: directory.to_path_buf(),
        })
    }

    /// Marks one port filter entry (`port_filter::index`), once per process.
    fn mark_port(&mut self, index: u32) -> Result<(), MapError> {
        if self.marked_ports.contains(&index) {
            return Ok(());
        }
        self.port_filter
            .set(index, port_filter::MARKED, 0)
            .map_err(update_error(map_names::PORT_FILTER))?;
        self.marked_ports.insert(index);
        Ok(())
    }

    /// Marks every port the frontends, backend slots, conntrack entries and the
    /// socket hooks' reverse entries hold (see `port_filter::ports_in_use`): a
    /// port filter that is new (the first
    /// start of an agent that has one, or a schema migration) must let through
    /// every flow the maps already serve before a program that reads it is
    /// attached. Read in batches: about 0.1 s at 10,000 Services x 10 endpoints.
    pub fn mark_ports_in_use(&mut self) -> Result<usize, Error> {
        let frontends = self.frontends()?;
        let backend_slots = self.backend_slots()?;
        let conntrack = self.conntrack_entries()?;
        let translated_sockets: Vec<(SocketReverseKey, SocketReverseValue)> = entries_in_batches(
            std::os::fd::AsFd::as_fd(&open_pin(&self.directory, map_names::SOCKET_REVERSE)?),
            map_names::SOCKET_REVERSE,
        )?;
        let indexes = super::port_filter::ports_in_use(
            frontends.keys(),
            backend_slots.values(),
            &conntrack,
            translated_sockets.iter().map(|(key, _)| key),
        );
        for index in &indexes {
            self.mark_port(*index)?;
        }
        self.mark_port(port_filter::BUILT)?;
        Ok(indexes.len())
    }

    /// Whether a load has marked every port of the maps in the port filter
    /// (`mark_ports_in_use` ran to its end): since then, each write marks its own.
    pub fn port_filter_built(&self) -> Result<bool, Error> {
        let value = self
            .port_filter
            .get(&port_filter::BUILT, 0)
            .map_err(read_error(map_names::PORT_FILTER))?;
        Ok(value == port_filter::MARKED)
    }

    pub fn counters(&self) -> Result<Counters, Error> {
        let mut sums = [0u64; counter::COUNT as usize];
        for (index, sum) in sums.iter_mut().enumerate() {
            let values = self
                .counters
                .get(&(index as u32), 0)
                .map_err(read_error(map_names::COUNTERS))?;
            *sum = values.iter().sum();
        }
        Ok(Counters {
            translated: sums[counter::TRANSLATED as usize],
            no_backend: sums[counter::NO_BACKEND as usize],
            conntrack_hit: sums[counter::CONNTRACK_HIT as usize],
            conntrack_miss: sums[counter::CONNTRACK_MISS as usize],
            error: sums[counter::ERROR as usize],
            passed_untracked: sums[counter::PASSED_UNTRACKED as usize],
            reverse_translated: sums[counter::REVERSE_TRANSLATED as usize],
            conntrack_overflow: sums[counter::CONNTRACK_OVERFLOW as usize],
        })
    }

    /// Packets (and the node's connects and sends) dropped because their source
    /// was outside a load-balancer frontend's `loadBalancerSourceRanges`, summed
    /// over CPUs.
    pub fn source_range_drops(&self) -> Result<u64, Error> {
        let values = self
            .source_range_drops
            .get(&0, 0)
            .map_err(read_error(map_names::SOURCE_RANGE_DROPS))?;
        Ok(values.iter().sum())
    }

    /// Every conntrack entry, of the hash and of the overflow (a snapshot; the
    /// programs keep writing). A key in both is the hash's: the programs look
    /// there first. Read in batches: a key-by-key walk starts over whenever the
    /// LRU evicts the key it would continue from, and so counts entries twice.
    pub fn conntrack_entries(&self) -> Result<Vec<(ConntrackKey, ConntrackValue)>, Error> {
        use std::os::fd::AsFd as _;
        let mut entries: Vec<(ConntrackKey, ConntrackValue)> =
            entries_in_batches(self.conntrack.as_fd(), map_names::CONNTRACK)?;
        let overflow: Vec<(ConntrackKey, ConntrackValue)> = entries_in_batches(
            self.conntrack_overflow.as_fd(),
            map_names::CONNTRACK_OVERFLOW,
        )?;
        if !overflow.is_empty() {
            let in_hash: std::collections::HashSet<ConntrackKey> =
                entries.iter().map(|(key, _)| *key).collect();
            entries.extend(
                overflow
                    .into_iter()
                    .filter(|(key, _)| !in_hash.contains(key)),
            );
        }
        Ok(entries)
    }

    /// Aborts the node's connected UDP sockets that the connect hook sent to a
    /// backend `removed` names (see `udp_sockets`); returns how many.
    pub fn abort_udp_sockets(&self, removed: &RemovedUdpBackends) -> Result<usize, MapError> {
        let translated: std::collections::HashMap<SocketReverseKey, SocketReverseValue> =
            entries_in_batches(
                std::os::fd::AsFd::as_fd(&open_pin(&self.directory, map_names::SOCKET_REVERSE)?),
                map_names::SOCKET_REVERSE,
            )?
            .into_iter()
            .collect();
        if translated.is_empty() {
            return Ok(0);
        }
        let fault = |error: std::io::Error| MapError::UpdateMap {
            map: map_names::SOCKET_REVERSE,
            source: format!("failed to abort UDP sockets over sock_diag: {error}").into(),
        };
        let mut diag = crate::udp_sockets::SockDiag::open().map_err(fault)?;
        let sockets = diag.connected_udp_sockets().map_err(fault)?;
        let chosen = crate::udp_sockets::sockets_to_abort(&sockets, &translated, removed);
        for socket in &chosen {
            diag.abort(socket).map_err(fault)?;
        }
        Ok(chosen.len())
    }

    /// Live TCP flows in Switchyard's conntrack: what a draining agent waits for.
    pub fn live_tcp_flows(&self) -> Result<usize, Error> {
        let config = self.config()?.unwrap_or_default();
        let entries = self.conntrack_entries()?;
        Ok(live_tcp_flow_count(
            &entries,
            &config,
            system::monotonic_nanoseconds(),
        ))
    }
}

pub use super::live_flows::live_tcp_flow_count;

/// Opens a conntrack map (the hash or the overflow), checking its layout, with
/// its shape.
pub(super) fn open_conntrack(
    directory: &Path,
    name: &'static str,
) -> Result<(std::os::fd::OwnedFd, system::MapShape), MapError> {
    let map = open_pin(directory, name)?;
    let shape = system::map_shape(std::os::fd::AsFd::as_fd(&map)).map_err(read_error(name))?;
    let expected = (
        std::mem::size_of::<ConntrackKey>() as u32,
        std::mem::size_of::<ConntrackValue>() as u32,
    );
    if (shape.key_size, shape.value_size) != expected {
        return Err(read_error(name)(format!(
            "unexpected layout: key {} and value {} bytes, not {} and {}",
            shape.key_size, shape.value_size, expected.0, expected.1
        )));
    }
    Ok((map, shape))
}

/// Every entry of the hash map pinned as `name` in `directory`, read in batches
/// (see `system::map_entries`).
fn batch_entries<K: aya::Pod, V: aya::Pod>(
    directory: &Path,
    name: &'static str,
) -> Result<Vec<(K, V)>, MapError> {
    let map = open_pin(directory, name)?;
    entries_in_batches(std::os::fd::AsFd::as_fd(&map), name)
}

/// Every entry of the hash map `map` (named `name` in errors), read in batches.
fn entries_in_batches<K: aya::Pod, V: aya::Pod>(
    map: std::os::fd::BorrowedFd<'_>,
    name: &'static str,
) -> Result<Vec<(K, V)>, MapError> {
    let raw = system::map_entries(map, std::mem::size_of::<K>(), std::mem::size_of::<V>())
        .map_err(read_error(name))?;
    Ok(raw
        .iter()
        .filter_map(|(key, value)| Some((schema::from_bytes(key)?, schema::from_bytes(value)?)))
        .collect())
}

fn update_error(name: &'static str) -> impl Fn(aya::maps::MapError) -> MapError {
    move |error| MapError::UpdateMap {
        map: name,
        source: error.into(),
    }
}

/// Deleting an absent entry is not an error: the desired state is reached.
fn ignore_missing(result: Result<(), aya::maps::MapError>) -> Result<(), aya::maps::MapError> {
    match result {
        Err(aya::maps::MapError::KeyNotFound) => Ok(()),
        Err(aya::maps::MapError::SyscallError(error))
            if error.io_error.raw_os_error() == Some(libc::ENOENT) =>
        {
            Ok(())
        }
        other => other,
    }
}

/// The trie key of a source range entry (see `switchyard_common::SourceRangeKey`).
fn source_range_key(entry: &SourceRangeEntry) -> LpmKey<SourceRangeKey> {
    LpmKey::new(
        SOURCE_RANGE_FRONTEND_BITS + u32::from(entry.prefix.length),
        SourceRangeKey {
            frontend: entry.frontend,
            source_address: entry.prefix.address,
        },
    )
}

/// The entry of a trie key; `None` for a key no agent writes (a prefix that
/// does not cover the whole frontend, or longer than an address).
fn source_range_entry(key: &LpmKey<SourceRangeKey>) -> Option<SourceRangeEntry> {
    let length = key.prefix_len().checked_sub(SOURCE_RANGE_FRONTEND_BITS)?;
    let length = u8::try_from(length).ok().filter(|length| *length <= 128)?;
    let data = key.data();
    Some(SourceRangeEntry {
        frontend: data.frontend,
        prefix: SourcePrefix {
            address: data.source_address,
            length,
        },
    })
}

impl ServiceMaps for PinnedServiceMaps {
    fn source_ranges(&self) -> Result<BTreeSet<SourceRangeEntry>, MapError> {
        let mut entries = BTreeSet::new();
        for key in self.source_ranges.keys() {
            let key = key.map_err(read_error(map_names::SOURCE_RANGES))?;
            // A key this agent would never write is still restored as what it
            // is not: it is skipped, and stays until the map is rebuilt.
            if let Some(entry) = source_range_entry(&key) {
                entries.insert(entry);
            }
        }
        Ok(entries)
    }

    fn write_source_range(&mut self, entry: &SourceRangeEntry) -> Result<(), MapError> {
        self.source_ranges
            .insert(&source_range_key(entry), SOURCE_RANGE_ADMITTED, 0)
            .map_err(update_error(map_names::SOURCE_RANGES))
    }

    fn delete_source_range(&mut self, entry: &SourceRangeEntry) -> Result<(), MapError> {
        ignore_missing(self.source_ranges.remove(&source_range_key(entry)))
            .map_err(update_error(map_names::SOURCE_RANGES))
    }

    fn frontends(&self) -> Result<BTreeMap<FrontendKey, FrontendValue>, MapError> {
        // In batches: a restart restores 10,000s of entries, and a key-by-key walk
        // costs two system calls per entry (0.6 s at 10,000 Services, CPU the
        // traffic flowing meanwhile needs).
        Ok(batch_entries(&self.directory, map_names::FRONTENDS)?
            .into_iter()
            .collect())
    }

    fn backend_slots(&self) -> Result<BTreeMap<BackendSlotKey, BackendValue>, MapError> {
        Ok(batch_entries(&self.directory, map_names::BACKEND_SLOTS)?
            .into_iter()
            .collect())
    }

    fn write_frontend(&mut self, key: &FrontendKey, value: &FrontendValue) -> Result<(), MapError> {
        // Marked first: the programs must not skip the frontend's first packets.
        self.mark_port(port_filter::index(
            port_filter::FRONTEND_PORTS,
            key.port_big_endian,
        ))?;
        self.frontends
            .insert(key, value, 0)
            .map_err(update_error(map_names::FRONTENDS))
    }

    fn delete_frontend(&mut self, key: &FrontendKey) -> Result<(), MapError> {
        ignore_missing(self.frontends.remove(key)).map_err(update_error(map_names::FRONTENDS))
    }

    fn write_backend_slot(
        &mut self,
        key: &BackendSlotKey,
        value: &BackendValue,
    ) -> Result<(), MapError> {
        // Marked first: the programs must not skip the backend's first replies.
        self.mark_port(port_filter::index(
            port_filter::BACKEND_PORTS,
            value.port_big_endian,
        ))?;
        self.backend_slots
            .insert(key, value, 0)
            .map_err(update_error(map_names::BACKEND_SLOTS))
    }

    fn delete_backend_slot(&mut self, key: &BackendSlotKey) -> Result<(), MapError> {
        ignore_missing(self.backend_slots.remove(key))
            .map_err(update_error(map_names::BACKEND_SLOTS))
    }

    fn config(&self) -> Result<Option<DatapathConfig>, MapError> {
        let config = self
            .config
            .get(&0, 0)
            .map_err(read_error(map_names::CONFIG))?;
        // An array entry always exists; all zeroes means never written.
        let unwritten = config.mode == 0 && config.network_namespace_cookie == 0;
        Ok((!unwritten).then_some(config))
    }

    fn write_config(&mut self, config: &DatapathConfig) -> Result<(), MapError> {
        self.config
            .set(0, config, 0)
            .map_err(update_error(map_names::CONFIG))
    }
    fn release_udp_flows(&mut self, removed: &RemovedUdpBackends) -> Result<usize, MapError> {
        use std::os::fd::AsFd as _;
        let deleted = crate::udp_flows::release(
            self.conntrack.as_fd(),
            self.conntrack_overflow.as_fd(),
            removed,
        )?;
        // The node's sockets the connect hook connected to those backends:
        // best effort (a kernel without `CONFIG_INET_DIAG_DESTROY` cannot), so
        // a failure is logged and never holds back the flows' release.
        match self.abort_udp_sockets(removed) {
            Ok(0) => {}
            Ok(aborted) => tracing::info!(
                aborted,
                "aborted the node's UDP sockets connected to removed backends"
            ),
            Err(error) => tracing::warn!(
                error = %switchyard_model::error::chain(&error),
                "failed to abort the node's UDP sockets connected to removed backends; they keep their backend until reconnected"
            ),
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_common::PROTOCOL_TCP;

    #[test]
    fn a_source_range_entry_round_trips_through_its_trie_key_and_foreign_keys_are_skipped() {
        let entry = SourceRangeEntry {
            frontend: FrontendKey {
                address: switchyard_common::ipv4_mapped([198, 51, 100, 7]),
                port_big_endian: 80u16.to_be(),
                protocol: PROTOCOL_TCP,
                scope: switchyard_common::SCOPE_EXTERNAL,
            },
            prefix: SourcePrefix {
                address: switchyard_common::ipv4_mapped([192, 168, 60, 0]),
                length: 96 + 24,
            },
        };
        let key = source_range_key(&entry);
        assert_eq!(key.prefix_len(), 160 + 120);
        assert_eq!(source_range_entry(&key), Some(entry));
        let data = key.data();
        // A prefix that does not cover the whole frontend, or longer than an address.
        assert_eq!(source_range_entry(&LpmKey::new(100, data)), None);
        assert_eq!(source_range_entry(&LpmKey::new(160 + 129, data)), None);
    }
}
