//! The conversion rules, bytes in and bytes out. Version 0 entries are encoded here
//! field by field, independently of the converter, so a field the converter puts
//! in the wrong place shows up as a difference.

use switchyard_common::{
    ipv4_mapped, map_names, AffinityKey, AffinityValue, BackendSlotKey, BackendValue, ConntrackKey,
    ConntrackValue, DatapathConfig, FrontendKey, FrontendValue, SocketReverseKey,
    SocketReverseValue, BACKEND_FLAG_LOCAL, CONNTRACK_FLAG_REWRITE_DESTINATION,
    DATAPATH_MODE_ACTIVE, FRONTEND_FLAG_MASQUERADE_REMOTE, FRONTEND_FLAG_SESSION_AFFINITY,
    PROTOCOL_TCP, PROTOCOL_UDP, SCHEMA_VERSION, SCOPE_EXTERNAL, TCP_STATE_FIN_FROM_CLIENT,
};

use super::*;

/// Version 0's bytes, written field by field in version 0's order.
#[derive(Default)]
struct V0Bytes(Vec<u8>);

impl V0Bytes {
    fn u8(mut self, value: u8) -> Self {
        self.0.push(value);
        self
    }
    fn u16(mut self, value: u16) -> Self {
        self.0.extend_from_slice(&value.to_ne_bytes());
        self
    }
    fn u32(mut self, value: u32) -> Self {
        self.0.extend_from_slice(&value.to_ne_bytes());
        self
    }
    fn u64(mut self, value: u64) -> Self {
        self.0.extend_from_slice(&value.to_ne_bytes());
        self
    }
    fn bytes(mut self, value: &[u8]) -> Self {
        self.0.extend_from_slice(value);
        self
    }
}

fn v0() -> V0Bytes {
    V0Bytes::default()
}

fn convert_from_v0(map: &str, key: &[u8], value: &[u8]) -> Result<Option<Entry>, String> {
    SCHEMA.convert_entry(0, map, key, value)
}

fn converted<K: aya::Pod, V: aya::Pod>(map: &str, key: &[u8], value: &[u8]) -> (K, V) {
    let entry = convert_from_v0(map, key, value)
        .expect("converts")
        .expect("kept");
    (
        from_bytes::<K>(&entry.key).expect("current key size"),
        from_bytes::<V>(&entry.value).expect("current value size"),
    )
}

const CLUSTER_IP: [u8; 16] = ipv4_mapped([10, 96, 0, 10]);
const POD_A: [u8; 16] = ipv4_mapped([10, 244, 0, 11]);
const POD_B: [u8; 16] = ipv4_mapped([10, 244, 0, 12]);

#[test]
fn the_current_layouts_are_the_sizes_of_the_shared_types() {
    let shape = |name: &str| {
        CURRENT_LAYOUTS
            .iter()
            .find(|layout| layout.name == name)
            .map(|layout| (layout.shape.key_size, layout.shape.value_size))
    };
    assert_eq!(shape(map_names::FRONTENDS), Some((20, 16)));
    assert_eq!(shape(map_names::BACKEND_SLOTS), Some((8, 20)));
    assert_eq!(shape(map_names::CONNTRACK), Some((40, 48)));
    assert_eq!(shape(map_names::AFFINITY), Some((20, 32)));
    assert_eq!(shape(map_names::CONFIG), Some((4, 48)));
    assert_eq!(shape(map_names::COUNTERS), Some((4, 8)));
    assert_eq!(shape(map_names::SOCKET_REVERSE), Some((32, 20)));
    assert_eq!(shape(map_names::SOURCE_RANGES), Some((4 + 36, 1)));
    assert_eq!(shape(map_names::SOURCE_RANGE_DROPS), Some((4, 8)));
}

#[test]
fn the_agent_knows_every_version_from_zero_to_its_own_and_none_newer() {
    assert!(SCHEMA.is_known(0));
    assert!(SCHEMA.is_known(SCHEMA_VERSION));
    assert!(!SCHEMA.is_known(SCHEMA_VERSION + 1));
    assert_eq!(
        STEPS.last().map(|step| step.from + 1),
        Some(SCHEMA_VERSION),
        "the last step ends at the current version"
    );
}

#[test]
fn a_version_zero_frontend_keeps_every_field_and_gets_the_default_affinity_timeout() {
    let key = v0()
        .u8(PROTOCOL_TCP)
        .u8(SCOPE_EXTERNAL)
        .u16(30080u16.to_be())
        .bytes(&CLUSTER_IP);
    let value = v0()
        .u32(7)
        .u32(3)
        .u32(FRONTEND_FLAG_SESSION_AFFINITY | FRONTEND_FLAG_MASQUERADE_REMOTE);
    let (key, value): (FrontendKey, FrontendValue) =
        converted(map_names::FRONTENDS, &key.0, &value.0);
    assert_eq!(
        key,
        FrontendKey {
            address: CLUSTER_IP,
            port_big_endian: 30080u16.to_be(),
            protocol: PROTOCOL_TCP,
            scope: SCOPE_EXTERNAL,
        }
    );
    assert_eq!(
        value,
        FrontendValue {
            group_id: 7,
            backend_count: 3,
            flags: FRONTEND_FLAG_SESSION_AFFINITY | FRONTEND_FLAG_MASQUERADE_REMOTE,
            affinity_timeout_seconds: 10_800,
        }
    );
}

#[test]
fn a_version_zero_frontend_without_affinity_gets_no_affinity_timeout() {
    let key = v0()
        .u8(PROTOCOL_UDP)
        .u8(0)
        .u16(53u16.to_be())
        .bytes(&CLUSTER_IP);
    let value = v0().u32(1).u32(0).u32(0);
    let (_, value): (FrontendKey, FrontendValue) =
        converted(map_names::FRONTENDS, &key.0, &value.0);
    assert_eq!(value.affinity_timeout_seconds, 0);
    assert_eq!(value.backend_count, 0, "a refusing frontend stays refusing");
}

#[test]
fn a_version_zero_backend_slot_keeps_its_key_and_reorders_its_value() {
    let key = bytes_of(&BackendSlotKey {
        group_id: 7,
        ordinal: 2,
    });
    let value = v0()
        .u16(8080u16.to_be())
        .u16(BACKEND_FLAG_LOCAL)
        .bytes(&POD_A);
    let (key, value): (BackendSlotKey, BackendValue) =
        converted(map_names::BACKEND_SLOTS, &key, &value.0);
    assert_eq!(
        key,
        BackendSlotKey {
            group_id: 7,
            ordinal: 2
        }
    );
    assert_eq!(
        value,
        BackendValue {
            address: POD_A,
            port_big_endian: 8080u16.to_be(),
            flags: BACKEND_FLAG_LOCAL,
        }
    );
}

#[test]
fn a_version_zero_conntrack_entry_of_the_same_size_is_reordered_field_by_field() {
    let key = v0()
        .bytes(&POD_B)
        .u16(40_000u16.to_be())
        .bytes(&CLUSTER_IP)
        .u16(80u16.to_be())
        .u8(PROTOCOL_TCP)
        // Stray reserved bytes are not carried: the programs look keys up with zeroes.
        .bytes(&[1, 2, 3]);
    let value = v0()
        .u64(123_456_789)
        .bytes(&POD_B)
        .u16(40_000u16.to_be())
        .bytes(&POD_A)
        .u16(8080u16.to_be())
        .u8(CONNTRACK_FLAG_REWRITE_DESTINATION)
        .u8(TCP_STATE_FIN_FROM_CLIENT)
        .bytes(&[9, 9]);
    assert_eq!(
        key.0.len(),
        40,
        "same size as version 1: no shape check sees it"
    );
    assert_eq!(value.0.len(), 48);
    let (key, value): (ConntrackKey, ConntrackValue) =
        converted(map_names::CONNTRACK, &key.0, &value.0);
    assert_eq!(
        key,
        ConntrackKey {
            source_address: POD_B,
            destination_address: CLUSTER_IP,
            source_port_big_endian: 40_000u16.to_be(),
            destination_port_big_endian: 80u16.to_be(),
            protocol: PROTOCOL_TCP,
            reserved: [0; 3],
        }
    );
    assert_eq!(
        value,
        ConntrackValue {
            new_source_address: POD_B,
            new_destination_address: POD_A,
            new_source_port_big_endian: 40_000u16.to_be(),
            new_destination_port_big_endian: 8080u16.to_be(),
            flags: CONNTRACK_FLAG_REWRITE_DESTINATION,
            tcp_state: TCP_STATE_FIN_FROM_CLIENT,
            reserved: [0; 2],
            last_seen_nanoseconds: 123_456_789,
        }
    );
}

#[test]
fn a_version_zero_affinity_entry_keeps_client_group_backend_and_time() {
    let key = v0().u32(7).bytes(&POD_B);
    let value = v0()
        .u32(1)
        .u16(8080u16.to_be())
        .u16(0xffff)
        .bytes(&POD_A)
        .u64(42);
    let (key, value): (AffinityKey, AffinityValue) =
        converted(map_names::AFFINITY, &key.0, &value.0);
    assert_eq!(
        key,
        AffinityKey {
            client_address: POD_B,
            group_id: 7
        }
    );
    assert_eq!(
        value,
        AffinityValue {
            backend_address: POD_A,
            backend_port_big_endian: 8080u16.to_be(),
            reserved: 0,
            ordinal: 1,
            last_used_nanoseconds: 42,
        }
    );
}

#[test]
fn the_version_zero_config_keeps_mode_and_timeouts_and_leaves_the_closing_timeout_default() {
    let key = 0u32.to_ne_bytes();
    let value = v0()
        .u32(DATAPATH_MODE_ACTIVE)
        .u32(0x4000)
        .u64(0xdead_beef)
        .bytes(&ipv4_mapped([169, 254, 42, 1]))
        .u32(3600)
        .u32(60);
    let (key, value): (u32, DatapathConfig) = converted(map_names::CONFIG, &key, &value.0);
    assert_eq!(key, 0);
    assert_eq!(
        value,
        DatapathConfig {
            hairpin_address: ipv4_mapped([169, 254, 42, 1]),
            network_namespace_cookie: 0xdead_beef,
            mode: DATAPATH_MODE_ACTIVE,
            masquerade_mark: 0x4000,
            tcp_idle_timeout_seconds: 3600,
            tcp_closing_timeout_seconds: 0,
            udp_idle_timeout_seconds: 60,
            pod_connect_balancing: 0,
        }
    );
}

#[test]
fn an_unchanged_map_passes_through_every_step_as_it_is() {
    let key = bytes_of(&SocketReverseKey {
        socket_cookie: 99,
        backend_address: POD_A,
        backend_port_big_endian: 8080u16.to_be(),
        reserved: [0; 6],
    });
    let value = bytes_of(&SocketReverseValue {
        frontend_address: CLUSTER_IP,
        frontend_port_big_endian: 80u16.to_be(),
        reserved: 0,
    });
    let entry = convert_from_v0(map_names::SOCKET_REVERSE, &key, &value)
        .expect("converts")
        .expect("kept");
    assert_eq!(entry, Entry { key, value });
}

#[test]
fn an_entry_of_the_wrong_size_is_refused_with_the_field_and_sizes_named() {
    let error = convert_from_v0(map_names::CONNTRACK, &[0; 39], &[0; 48]).expect_err("refused");
    assert!(
        error.contains("conntrack key is 39 bytes, not 40"),
        "{error}"
    );
    let error = convert_from_v0(map_names::FRONTENDS, &[0; 20], &[0; 16]).expect_err("refused");
    assert!(
        error.contains("frontend value is 16 bytes, not 12"),
        "{error}"
    );
    let error = convert_from_v0(map_names::BACKEND_SLOTS, &[0; 8], &[0; 19]).expect_err("refused");
    assert!(error.contains("backend value"), "{error}");
    let error = convert_from_v0(map_names::AFFINITY, &[0; 20], &[0; 31]).expect_err("refused");
    assert!(error.contains("affinity value"), "{error}");
    let error = convert_from_v0(map_names::CONFIG, &[0; 8], &[0; 40]).expect_err("refused");
    assert!(error.contains("config key"), "{error}");
}

#[test]
fn an_unchanged_map_with_the_wrong_size_is_refused_at_the_end_of_the_chain() {
    let error =
        convert_from_v0(map_names::SOCKET_REVERSE, &[0; 31], &[0; 20]).expect_err("refused");
    assert!(error.contains("not 32 and 20"), "{error}");
}

#[test]
fn a_map_the_step_has_no_conversion_for_is_an_error_not_a_silent_copy() {
    let error = convert_from_v0(map_names::COUNTERS, &[0; 4], &[0; 8]).expect_err("refused");
    assert!(
        error.contains("no conversion for map SY_COUNTERS"),
        "{error}"
    );
    let error = convert_from_v0("SY_SOMETHING", &[0; 4], &[0; 8]).expect_err("refused");
    assert!(error.contains("not part of the current layout"), "{error}");
}

#[test]
fn entries_of_a_newer_version_are_never_converted() {
    let error = SCHEMA
        .convert_entry(SCHEMA_VERSION + 1, map_names::FRONTENDS, &[0; 20], &[0; 16])
        .expect_err("refused");
    assert!(
        error.contains("no conversion from schema version"),
        "{error}"
    );
}

// ---- Planning -------------------------------------------------------------

fn observation(
    versions: &[u32],
    current: &[&str],
    older: &[(u32, &str, MapShape)],
) -> PinObservation {
    PinObservation {
        versions: versions.iter().copied().collect(),
        current_maps: current.iter().map(|name| name.to_string()).collect(),
        older_maps: older
            .iter()
            .map(|(version, name, shape)| ((*version, name.to_string()), *shape))
            .collect(),
    }
}

fn version_zero_maps() -> Vec<(u32, &'static str, MapShape)> {
    version0::LAYOUTS
        .iter()
        .map(|layout| (0, layout.name, layout.shape))
        .collect()
}

fn all_current() -> Vec<&'static str> {
    CURRENT_LAYOUTS.iter().map(|layout| layout.name).collect()
}

fn source_of(plan: &MigrationPlan, name: &str) -> Option<MapSource> {
    plan.maps
        .iter()
        .find(|(map, _)| *map == name)
        .map(|(_, source)| *source)
}

#[test]
fn an_empty_pin_directory_creates_every_map() {
    let plan = SCHEMA.plan(&PinObservation::default()).expect("plan");
    assert_eq!(plan.maps.len(), CURRENT_LAYOUTS.len());
    assert!(plan
        .maps
        .iter()
        .all(|(_, source)| *source == MapSource::Create));
    assert!(plan.older_versions.is_empty());
    assert!(!plan.converts());
}

#[test]
fn a_restart_of_the_same_version_uses_every_pinned_map() {
    let plan = SCHEMA
        .plan(&observation(&[SCHEMA_VERSION], &all_current(), &[]))
        .expect("plan");
    assert!(plan
        .maps
        .iter()
        .all(|(_, source)| *source == MapSource::Current));
}

#[test]
fn a_pin_directory_of_the_build_before_source_ranges_creates_their_maps_and_uses_the_rest() {
    // The previous build of this same schema version pinned every map but the
    // two source range maps: an upgrade adds them, converts nothing, and is no
    // mix of versions.
    let before: Vec<&str> = all_current()
        .into_iter()
        .filter(|name| *name != map_names::SOURCE_RANGES && *name != map_names::SOURCE_RANGE_DROPS)
        .collect();
    let plan = SCHEMA
        .plan(&observation(&[SCHEMA_VERSION], &before, &[]))
        .expect("an upgrade from the build without source ranges is planned");
    for (name, source) in &plan.maps {
        let expected = if before.contains(name) {
            MapSource::Current
        } else {
            MapSource::Create
        };
        assert_eq!(*source, expected, "{name}");
    }
    assert_eq!(
        source_of(&plan, map_names::SOURCE_RANGES),
        Some(MapSource::Create)
    );
    assert!(!plan.converts());
    assert!(plan.older_versions.is_empty());
}

#[test]
fn version_one_maps_upgrade_with_the_source_range_maps_created_empty() {
    let older: Vec<(u32, &str, MapShape)> = version1::LAYOUTS
        .iter()
        .map(|layout| (1, layout.name, layout.shape))
        .collect();
    let plan = SCHEMA.plan(&observation(&[1], &[], &older)).expect("plan");
    assert_eq!(
        source_of(&plan, map_names::SOURCE_RANGES),
        Some(MapSource::Create)
    );
    assert_eq!(
        source_of(&plan, map_names::SOURCE_RANGE_DROPS),
        Some(MapSource::Create)
    );
    assert_eq!(
        source_of(&plan, map_names::FRONTENDS),
        Some(MapSource::Reuse { version: 1 })
    );
}

#[test]
fn maps_of_version_zero_are_converted_taken_over_or_restarted_as_the_step_says() {
    let plan = SCHEMA
        .plan(&observation(&[0], &[], &version_zero_maps()))
        .expect("plan");
    let convert = Some(MapSource::Convert { version: 0 });
    assert_eq!(source_of(&plan, map_names::FRONTENDS), convert);
    assert_eq!(source_of(&plan, map_names::BACKEND_SLOTS), convert);
    assert_eq!(source_of(&plan, map_names::CONNTRACK), convert);
    assert_eq!(source_of(&plan, map_names::AFFINITY), convert);
    assert_eq!(source_of(&plan, map_names::CONFIG), convert);
    assert_eq!(
        source_of(&plan, map_names::SOCKET_REVERSE),
        Some(MapSource::Reuse { version: 0 })
    );
    assert_eq!(
        source_of(&plan, map_names::COUNTERS),
        Some(MapSource::Create),
        "statistics restart from zero"
    );
    assert_eq!(plan.older_versions, vec![0]);
    assert!(plan.converts());
}

#[test]
fn a_map_missing_from_the_old_version_is_created() {
    let older: Vec<_> = version_zero_maps()
        .into_iter()
        .filter(|(_, name, _)| *name != map_names::AFFINITY)
        .collect();
    let plan = SCHEMA.plan(&observation(&[0], &[], &older)).expect("plan");
    assert_eq!(
        source_of(&plan, map_names::AFFINITY),
        Some(MapSource::Create)
    );
}

#[test]
fn maps_of_a_newer_version_are_refused_even_next_to_current_ones() {
    for observed in [
        observation(&[SCHEMA_VERSION + 1], &[], &[]),
        observation(&[SCHEMA_VERSION, SCHEMA_VERSION + 3], &all_current(), &[]),
        observation(&[0, SCHEMA_VERSION + 1], &[], &version_zero_maps()),
    ] {
        let refusal = SCHEMA.plan(&observed).expect_err("refused");
        assert!(
            matches!(refusal, Refusal::NewerVersion { version, current } if version > SCHEMA_VERSION && current == SCHEMA_VERSION),
            "{refusal:?}"
        );
        let message = refusal.to_string();
        assert!(message.contains("refusing to downgrade"), "{message}");
        assert!(message.contains("nothing was changed"), "{message}");
    }
}

#[test]
fn a_map_whose_shape_is_not_its_versions_layout_is_refused_rather_than_misread() {
    let mut older = version_zero_maps();
    for entry in &mut older {
        if entry.1 == map_names::CONNTRACK {
            entry.2.value_size = 56;
        }
    }
    let refusal = SCHEMA
        .plan(&observation(&[0], &[], &older))
        .expect_err("refused");
    assert_eq!(
        refusal,
        Refusal::UnexpectedShape {
            version: 0,
            map: map_names::CONNTRACK.to_string(),
            found: MapShape {
                map_type: MAP_TYPE_LRU_HASH,
                key_size: 40,
                value_size: 56
            },
            expected: MapShape {
                map_type: MAP_TYPE_LRU_HASH,
                key_size: 40,
                value_size: 48
            },
        }
    );
}

#[test]
fn current_maps_next_to_maps_still_to_take_over_are_refused() {
    let refusal = SCHEMA
        .plan(&observation(
            &[0, SCHEMA_VERSION],
            &[map_names::FRONTENDS],
            &version_zero_maps(),
        ))
        .expect_err("refused");
    assert_eq!(refusal, Refusal::MixedVersions { version: 0 });
}

#[test]
fn an_older_version_left_next_to_a_complete_current_one_is_only_removed() {
    let plan = SCHEMA
        .plan(&observation(
            &[0, SCHEMA_VERSION],
            &all_current(),
            &version_zero_maps(),
        ))
        .expect("plan");
    assert!(plan
        .maps
        .iter()
        .all(|(_, source)| *source == MapSource::Current));
    assert_eq!(plan.older_versions, vec![0]);
}

// ---- A schema with several steps: what the next bumps will look like --------

static TEST_CURRENT: [MapLayout; 2] = [
    layout("A", MAP_TYPE_HASH, 4, 6),
    layout("B", MAP_TYPE_HASH, 4, 4),
];
static TEST_V1: [MapLayout; 2] = [
    layout("A", MAP_TYPE_HASH, 4, 2),
    layout("B", MAP_TYPE_HASH, 4, 4),
];
static TEST_V2: [MapLayout; 2] = [
    layout("A", MAP_TYPE_HASH, 4, 4),
    layout("B", MAP_TYPE_HASH, 4, 4),
];

/// Version 1 -> 2: A's value grows by two bytes (0xaa); entries with key 0 are
/// dropped on purpose.
fn widen_a(_map: &str, key: &[u8], value: &[u8]) -> Result<Option<Entry>, String> {
    if key == [0, 0, 0, 0] {
        return Ok(None);
    }
    let mut value = value.to_vec();
    value.extend_from_slice(&[0xaa, 0xaa]);
    Ok(Some(Entry {
        key: key.to_vec(),
        value,
    }))
}

/// Version 2 -> 3: A's value grows by two more bytes (0xbb).
fn widen_a_again(_map: &str, key: &[u8], value: &[u8]) -> Result<Option<Entry>, String> {
    let mut value = value.to_vec();
    value.extend_from_slice(&[0xbb, 0xbb]);
    Ok(Some(Entry {
        key: key.to_vec(),
        value,
    }))
}

static TEST_STEPS: [VersionStep; 2] = [
    VersionStep {
        from: 1,
        layouts: &TEST_V1,
        changed_maps: &["A"],
        convert: widen_a,
    },
    VersionStep {
        from: 2,
        layouts: &TEST_V2,
        changed_maps: &["A"],
        convert: widen_a_again,
    },
];

static THREE_VERSIONS: Schema = Schema {
    current: 3,
    current_layouts: &TEST_CURRENT,
    steps: &TEST_STEPS,
};

#[test]
fn an_entry_two_versions_old_goes_through_both_steps_in_order() {
    let entry = THREE_VERSIONS
        .convert_entry(1, "A", &[1, 0, 0, 0], &[1, 2])
        .expect("converts")
        .expect("kept");
    assert_eq!(entry.value, vec![1, 2, 0xaa, 0xaa, 0xbb, 0xbb]);
    let entry = THREE_VERSIONS
        .convert_entry(2, "A", &[1, 0, 0, 0], &[1, 2, 3, 4])
        .expect("converts")
        .expect("kept");
    assert_eq!(entry.value, vec![1, 2, 3, 4, 0xbb, 0xbb]);
}

#[test]
fn an_entry_a_step_drops_is_not_carried_further() {
    assert_eq!(
        THREE_VERSIONS.convert_entry(1, "A", &[0, 0, 0, 0], &[1, 2]),
        Ok(None)
    );
}

#[test]
fn a_map_unchanged_by_every_step_is_taken_over_from_the_oldest_known_version() {
    let plan = THREE_VERSIONS
        .plan(&observation(
            &[1],
            &[],
            &[(1, "A", TEST_V1[0].shape), (1, "B", TEST_V1[1].shape)],
        ))
        .expect("plan");
    assert_eq!(
        source_of(&plan, "A"),
        Some(MapSource::Convert { version: 1 })
    );
    assert_eq!(source_of(&plan, "B"), Some(MapSource::Reuse { version: 1 }));
}

#[test]
fn the_newest_older_version_is_the_one_taken_over() {
    let plan = THREE_VERSIONS
        .plan(&observation(
            &[1, 2],
            &[],
            &[
                (1, "A", TEST_V1[0].shape),
                (2, "A", TEST_V2[0].shape),
                (2, "B", TEST_V2[1].shape),
            ],
        ))
        .expect("plan");
    assert_eq!(
        source_of(&plan, "A"),
        Some(MapSource::Convert { version: 2 })
    );
    assert_eq!(plan.older_versions, vec![2, 1], "newest first");
}

#[test]
fn a_version_older_than_every_known_step_is_refused() {
    let refusal = THREE_VERSIONS
        .plan(&observation(&[0], &[], &[(0, "A", TEST_V1[0].shape)]))
        .expect_err("refused");
    assert_eq!(
        refusal,
        Refusal::UnknownVersion {
            version: 0,
            current: 3,
            map: "A".to_string()
        }
    );
    assert!(refusal.to_string().contains("cannot convert"));
    assert!(THREE_VERSIONS
        .convert_entry(0, "A", &[1, 0, 0, 0], &[1, 2])
        .is_err());
}

#[test]
fn a_converter_that_produces_the_wrong_size_is_caught() {
    static BROKEN_STEPS: [VersionStep; 1] = [VersionStep {
        from: 2,
        layouts: &TEST_V2,
        changed_maps: &["A"],
        convert: widen_a,
    }];
    static BROKEN: Schema = Schema {
        current: 3,
        current_layouts: &TEST_CURRENT,
        steps: &BROKEN_STEPS,
    };
    // widen_a adds two bytes to a four-byte value: six, as wanted...
    assert!(BROKEN
        .convert_entry(2, "A", &[1, 0, 0, 0], &[1, 2, 3, 4])
        .is_ok());
    // ...but from a wrong-sized input it would produce four: caught, not written.
    let error = BROKEN
        .convert_entry(2, "A", &[1, 0, 0, 0], &[1, 2])
        .expect_err("refused");
    assert!(error.contains("not 4 and 6"), "{error}");
}

// ---- Merging flow state after the switch -----------------------------------

fn conntrack_value(last_seen: u64) -> Vec<u8> {
    bytes_of(&ConntrackValue {
        new_source_address: POD_B,
        new_destination_address: POD_A,
        new_source_port_big_endian: 1,
        new_destination_port_big_endian: 2,
        flags: 0,
        tcp_state: 0,
        reserved: [0; 2],
        last_seen_nanoseconds: last_seen,
    })
}

fn affinity_value(last_used: u64) -> Vec<u8> {
    bytes_of(&AffinityValue {
        backend_address: POD_A,
        backend_port_big_endian: 1,
        reserved: 0,
        ordinal: 0,
        last_used_nanoseconds: last_used,
    })
}

#[test]
fn an_old_entry_fills_a_gap_but_never_overwrites_a_fresher_new_one() {
    let old = conntrack_value(100);
    assert!(old_entry_wins(map_names::CONNTRACK, None, &old, 0));
    assert!(old_entry_wins(
        map_names::CONNTRACK,
        Some(&conntrack_value(50)),
        &old,
        0
    ));
    assert!(!old_entry_wins(
        map_names::CONNTRACK,
        Some(&conntrack_value(100)),
        &old,
        0
    ));
    assert!(!old_entry_wins(
        map_names::CONNTRACK,
        Some(&conntrack_value(150)),
        &old,
        0
    ));
    assert!(old_entry_wins(
        map_names::AFFINITY,
        Some(&affinity_value(1)),
        &affinity_value(2),
        0
    ));
    assert!(!old_entry_wins(
        map_names::AFFINITY,
        Some(&affinity_value(2)),
        &affinity_value(1),
        0
    ));
}

#[test]
fn a_socket_reverse_entry_present_in_both_keeps_the_new_one() {
    assert!(old_entry_wins(map_names::SOCKET_REVERSE, None, &[0; 20], 5));
    assert!(!old_entry_wins(
        map_names::SOCKET_REVERSE,
        Some(&[1; 20]),
        &[0; 20],
        5
    ));
}

#[test]
fn unreadable_values_never_overwrite() {
    assert!(!old_entry_wins(
        map_names::CONNTRACK,
        Some(&[0; 3]),
        &conntrack_value(9),
        0
    ));
    assert!(!old_entry_wins(
        map_names::AFFINITY,
        Some(&affinity_value(1)),
        &[0; 3],
        0
    ));
}

#[test]
fn entries_the_old_programs_last_used_before_the_conversion_are_not_merged_again() {
    // The conversion at 100 copied them; merging them again would only push live
    // entries out of the LRU (and revive closed flows the new programs let expire).
    assert!(!old_entry_wins(
        map_names::CONNTRACK,
        None,
        &conntrack_value(99),
        100
    ));
    assert!(old_entry_wins(
        map_names::CONNTRACK,
        None,
        &conntrack_value(100),
        100
    ));
    assert!(!old_entry_wins(
        map_names::AFFINITY,
        None,
        &affinity_value(50),
        100
    ));
    assert_eq!(
        last_used_nanoseconds(map_names::CONNTRACK, &conntrack_value(7)),
        Some(7)
    );
    assert_eq!(
        last_used_nanoseconds(map_names::SOCKET_REVERSE, &[0; 20]),
        None
    );
}

#[test]
fn closing_connections_go_first_then_live_ones_least_recently_used_first() {
    let conntrack = |last_seen: u64, tcp_state: u8| Entry {
        key: vec![last_seen as u8],
        value: bytes_of(&ConntrackValue {
            new_source_address: POD_B,
            new_destination_address: POD_A,
            new_source_port_big_endian: 1,
            new_destination_port_big_endian: 2,
            flags: 0,
            tcp_state,
            reserved: [0; 2],
            last_seen_nanoseconds: last_seen,
        }),
    };
    let both_fins = TCP_STATE_FIN_FROM_CLIENT | switchyard_common::TCP_STATE_FIN_FROM_BACKEND;
    let mut entries = vec![
        conntrack(30, 0),
        conntrack(40, both_fins),
        conntrack(10, 0),
        conntrack(50, switchyard_common::TCP_STATE_RESET),
        conntrack(20, TCP_STATE_FIN_FROM_CLIENT),
    ];
    order_for_insertion(map_names::CONNTRACK, &mut entries);
    let order: Vec<u8> = entries.iter().map(|entry| entry.key[0]).collect();
    // Half-closed (20) still carries data: it counts as live.
    assert_eq!(order, vec![40, 50, 10, 20, 30]);
}

#[test]
fn map_types_round_trip_through_their_bytes() {
    let key = FrontendKey {
        address: CLUSTER_IP,
        port_big_endian: 80u16.to_be(),
        protocol: PROTOCOL_TCP,
        scope: 0,
    };
    assert_eq!(from_bytes::<FrontendKey>(&bytes_of(&key)), Some(key));
    assert_eq!(from_bytes::<FrontendKey>(&[0; 19]), None);
}
