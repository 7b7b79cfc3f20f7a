//! Schema version 0: a synthetic layout that never shipped (see `STEPS`), and the
//! conversion of its entries into version 1. It differs from version 1 the ways
//! real bumps do: fields in another order with the same total size (which no
//! shape check can see), a value without a field that version 1 added, and a
//! value grown by new fields. Its counters were numbered differently (so they
//! start again from zero), and its socket reverse map is unchanged, so an upgrade
//! from it also takes a map over as it is.
//!
//! Version 0 layouts (host byte order unless `_big_endian`):
//! - frontend key (20): protocol u8, scope u8, port_big_endian u16, address [16]
//! - frontend value (12): group_id u32, backend_count u32, flags u32
//!   (no affinity timeout: version 1 gives affinity frontends Kubernetes' default)
//! - backend slot key (8): as version 1
//! - backend value (20): port_big_endian u16, flags u16, address [16]
//! - conntrack key (40): source_address [16], source_port_big_endian u16,
//!   destination_address [16], destination_port_big_endian u16, protocol u8,
//!   reserved [3]
//! - conntrack value (48): last_seen_nanoseconds u64, new_source_address [16],
//!   new_source_port_big_endian u16, new_destination_address [16],
//!   new_destination_port_big_endian u16, flags u8, tcp_state u8, reserved [2]
//! - affinity key (20): group_id u32, client_address [16]
//! - affinity value (32): ordinal u32, backend_port_big_endian u16, reserved u16,
//!   backend_address [16], last_used_nanoseconds u64
//! - config value (40): mode u32, masquerade_mark u32, network_namespace_cookie
//!   u64, hairpin_address [16], tcp_idle_timeout_seconds u32,
//!   udp_idle_timeout_seconds u32 (no closing timeout: version 1's zero means
//!   the programs' default)

use switchyard_common::{
    map_names, AffinityKey, AffinityValue, BackendValue, ConntrackKey, ConntrackValue,
    DatapathConfig, FrontendKey, FrontendValue, FRONTEND_FLAG_SESSION_AFFINITY,
};

use super::{
    bytes_of, layout, Entry, FieldReader, MapLayout, VersionStep, MAP_TYPE_ARRAY, MAP_TYPE_HASH,
    MAP_TYPE_LRU_HASH, MAP_TYPE_PERCPU_ARRAY,
};

/// `sessionAffinityConfig.clientIP.timeoutSeconds` when a Service leaves it unset.
pub const DEFAULT_AFFINITY_TIMEOUT_SECONDS: u32 = 10_800;

pub const FRONTEND_KEY_SIZE: usize = 20;
pub const FRONTEND_VALUE_SIZE: usize = 12;
pub const BACKEND_KEY_SIZE: usize = 8;
pub const BACKEND_VALUE_SIZE: usize = 20;
pub const CONNTRACK_KEY_SIZE: usize = 40;
pub const CONNTRACK_VALUE_SIZE: usize = 48;
pub const AFFINITY_KEY_SIZE: usize = 20;
pub const AFFINITY_VALUE_SIZE: usize = 32;
pub const CONFIG_VALUE_SIZE: usize = 40;

pub const LAYOUTS: [MapLayout; 7] = [
    layout(
        map_names::FRONTENDS,
        MAP_TYPE_HASH,
        FRONTEND_KEY_SIZE,
        FRONTEND_VALUE_SIZE,
    ),
    layout(
        map_names::BACKEND_SLOTS,
        MAP_TYPE_HASH,
        BACKEND_KEY_SIZE,
        BACKEND_VALUE_SIZE,
    ),
    layout(
        map_names::CONNTRACK,
        MAP_TYPE_LRU_HASH,
        CONNTRACK_KEY_SIZE,
        CONNTRACK_VALUE_SIZE,
    ),
    layout(
        map_names::AFFINITY,
        MAP_TYPE_LRU_HASH,
        AFFINITY_KEY_SIZE,
        AFFINITY_VALUE_SIZE,
    ),
    layout(map_names::CONFIG, MAP_TYPE_ARRAY, 4, CONFIG_VALUE_SIZE),
    layout(map_names::COUNTERS, MAP_TYPE_PERCPU_ARRAY, 4, 8),
    layout(map_names::SOCKET_REVERSE, MAP_TYPE_LRU_HASH, 32, 20),
];

pub const STEP: VersionStep = VersionStep {
    from: 0,
    layouts: &LAYOUTS,
    changed_maps: &[
        map_names::FRONTENDS,
        map_names::BACKEND_SLOTS,
        map_names::CONNTRACK,
        map_names::AFFINITY,
        map_names::CONFIG,
        map_names::COUNTERS,
    ],
    convert,
};

fn convert(map: &str, key: &[u8], value: &[u8]) -> Result<Option<Entry>, String> {
    let entry = match map {
        map_names::FRONTENDS => frontend(key, value)?,
        map_names::BACKEND_SLOTS => backend(key, value)?,
        map_names::CONNTRACK => conntrack(key, value)?,
        map_names::AFFINITY => affinity(key, value)?,
        map_names::CONFIG => config(key, value)?,
        other => return Err(format!("version 0 has no conversion for map {other}")),
    };
    Ok(Some(entry))
}

fn frontend(key: &[u8], value: &[u8]) -> Result<Entry, String> {
    let mut key_fields = FieldReader::new("frontend key", key, FRONTEND_KEY_SIZE)?;
    let protocol = key_fields.u8();
    let scope = key_fields.u8();
    let port_big_endian = key_fields.u16();
    let address = key_fields.address();
    let mut value_fields = FieldReader::new("frontend value", value, FRONTEND_VALUE_SIZE)?;
    let group_id = value_fields.u32();
    let backend_count = value_fields.u32();
    let flags = value_fields.u32();
    let affinity_timeout_seconds = if flags & FRONTEND_FLAG_SESSION_AFFINITY != 0 {
        DEFAULT_AFFINITY_TIMEOUT_SECONDS
    } else {
        0
    };
    Ok(Entry {
        key: bytes_of(&FrontendKey {
            address,
            port_big_endian,
            protocol,
            scope,
        }),
        value: bytes_of(&FrontendValue {
            group_id,
            backend_count,
            flags,
            affinity_timeout_seconds,
        }),
    })
}

fn backend(key: &[u8], value: &[u8]) -> Result<Entry, String> {
    FieldReader::new("backend slot key", key, BACKEND_KEY_SIZE)?;
    let mut fields = FieldReader::new("backend value", value, BACKEND_VALUE_SIZE)?;
    let port_big_endian = fields.u16();
    let flags = fields.u16();
    let address = fields.address();
    Ok(Entry {
        // The slot key kept its layout (group id, ordinal).
        key: key.to_vec(),
        value: bytes_of(&BackendValue {
            address,
            port_big_endian,
            flags,
        }),
    })
}

fn conntrack(key: &[u8], value: &[u8]) -> Result<Entry, String> {
    let mut key_fields = FieldReader::new("conntrack key", key, CONNTRACK_KEY_SIZE)?;
    let source_address = key_fields.address();
    let source_port_big_endian = key_fields.u16();
    let destination_address = key_fields.address();
    let destination_port_big_endian = key_fields.u16();
    let protocol = key_fields.u8();
    let mut value_fields = FieldReader::new("conntrack value", value, CONNTRACK_VALUE_SIZE)?;
    let last_seen_nanoseconds = value_fields.u64();
    let new_source_address = value_fields.address();
    let new_source_port_big_endian = value_fields.u16();
    let new_destination_address = value_fields.address();
    let new_destination_port_big_endian = value_fields.u16();
    let flags = value_fields.u8();
    let tcp_state = value_fields.u8();
    Ok(Entry {
        key: bytes_of(&ConntrackKey {
            source_address,
            destination_address,
            source_port_big_endian,
            destination_port_big_endian,
            protocol,
            // Reserved bytes are written as zero whatever the old ones held: a
            // key with stray bytes would never be found by the programs.
            reserved: [0; 3],
        }),
        value: bytes_of(&ConntrackValue {
            new_source_address,
            new_destination_address,
            new_source_port_big_endian,
            new_destination_port_big_endian,
            flags,
            tcp_state,
            reserved: [0; 2],
            last_seen_nanoseconds,
        }),
    })
}

fn affinity(key: &[u8], value: &[u8]) -> Result<Entry, String> {
    let mut key_fields = FieldReader::new("affinity key", key, AFFINITY_KEY_SIZE)?;
    let group_id = key_fields.u32();
    let client_address = key_fields.address();
    let mut value_fields = FieldReader::new("affinity value", value, AFFINITY_VALUE_SIZE)?;
    let ordinal = value_fields.u32();
    let backend_port_big_endian = value_fields.u16();
    value_fields.skip(2);
    let backend_address = value_fields.address();
    let last_used_nanoseconds = value_fields.u64();
    Ok(Entry {
        key: bytes_of(&AffinityKey {
            client_address,
            group_id,
        }),
        value: bytes_of(&AffinityValue {
            backend_address,
            backend_port_big_endian,
            reserved: 0,
            ordinal,
            last_used_nanoseconds,
        }),
    })
}

fn config(key: &[u8], value: &[u8]) -> Result<Entry, String> {
    FieldReader::new("config key", key, 4)?;
    let mut fields = FieldReader::new("config value", value, CONFIG_VALUE_SIZE)?;
    let mode = fields.u32();
    let masquerade_mark = fields.u32();
    let network_namespace_cookie = fields.u64();
    let hairpin_address = fields.address();
    let tcp_idle_timeout_seconds = fields.u32();
    let udp_idle_timeout_seconds = fields.u32();
    Ok(Entry {
        key: key.to_vec(),
        value: bytes_of(&DatapathConfig {
            hairpin_address,
            network_namespace_cookie,
            mode,
            masquerade_mark,
            tcp_idle_timeout_seconds,
            // Zero: the programs' default (10 s), which version 0 used implicitly.
            tcp_closing_timeout_seconds: 0,
            udp_idle_timeout_seconds,
            // Version 0 had no connect-time translation for pods.
            pod_connect_balancing: switchyard_common::POD_CONNECT_BALANCING_DISABLED,
        }),
    })
}
