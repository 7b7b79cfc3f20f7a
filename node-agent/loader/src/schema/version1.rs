//! Schema version 1: the first shipped layout, and the step into version 2.
//!
//! Version 2 keeps every type as it was and changes two maps: conntrack, from an
//! LRU with per-CPU lists into a plain preallocated hash the agent expires (an LRU
//! insert scans its lists for every new flow), with a new overflow LRU for the
//! flows a full hash cannot take; and the counters, which gained one
//! (`conntrack-overflow`). Conntrack entries are copied as they are into the new
//! hash; counters start again from zero, as every counter change does.

use core::mem::size_of;

use switchyard_common::{
    map_names, AffinityKey, AffinityValue, BackendSlotKey, BackendValue, ConntrackKey,
    ConntrackValue, DatapathConfig, FrontendKey, FrontendValue, SocketReverseKey,
    SocketReverseValue,
};

use super::{
    layout, Entry, MapLayout, VersionStep, MAP_TYPE_ARRAY, MAP_TYPE_HASH, MAP_TYPE_LRU_HASH,
    MAP_TYPE_PERCPU_ARRAY,
};

/// Every map of version 1. Its types are version 2's.
pub const LAYOUTS: [MapLayout; 7] = [
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
];

pub const STEP: VersionStep = VersionStep {
    from: 1,
    layouts: &LAYOUTS,
    changed_maps: &[map_names::CONNTRACK, map_names::COUNTERS],
    convert,
};

/// Conntrack entries keep their bytes; no other map is converted by this step.
fn convert(map: &str, key: &[u8], value: &[u8]) -> Result<Option<Entry>, String> {
    match map {
        map_names::CONNTRACK => Ok(Some(Entry {
            key: key.to_vec(),
            value: value.to_vec(),
        })),
        other => Err(format!(
            "schema version 1 to 2 does not convert map {other}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conntrack_entry_of_version_1_is_carried_into_version_2_byte_for_byte() {
        let key: Vec<u8> = (0..size_of::<ConntrackKey>() as u8).collect();
        let value: Vec<u8> = (0..size_of::<ConntrackValue>() as u8).rev().collect();
        let converted = convert(map_names::CONNTRACK, &key, &value)
            .expect("converts")
            .expect("kept");
        assert_eq!(converted, Entry { key, value });
    }

    #[test]
    fn the_step_refuses_a_map_it_does_not_convert() {
        let error = convert(map_names::FRONTENDS, &[0; 20], &[0; 12]).expect_err("refused");
        assert!(error.contains("SY_FRONTENDS"), "{error}");
    }
}
