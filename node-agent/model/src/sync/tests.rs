use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use switchyard_common::{BackendSlotKey, BackendValue, FrontendKey, FrontendValue, SCOPE_INTERNAL};

use super::*;
use crate::desired::tests::{scenario_node, scenario_strategy};
use crate::desired::{desired_services, frontend_key, NodeView};
use crate::gate::{Gate, GateInput};
use crate::maps::{FakeServiceMaps, MapMutation};
use crate::model::{
    EndpointModel, EndpointPortModel, EndpointSliceModel, Protocol, ServiceModel, ServiceName,
    ServicePortModel, TargetPort, TrafficPolicy,
};

/// The gate once every start-of-day input has arrived (what a sync needs).
pub(crate) fn open_gate() -> GateOpen {
    let now = Instant::now();
    let mut gate = Gate::new(now, Duration::from_secs(30));
    for input in GateInput::ALL {
        gate.receive(input, now);
    }
    gate.open().expect("every input was received")
}

fn ip(text: &str) -> IpAddr {
    text.parse().expect("test address is valid")
}

fn service(index: u32, node_port: Option<u16>) -> ServiceModel {
    ServiceModel {
        name: ServiceName::new("default", format!("svc-{index}")),
        cluster_ips: vec![ip(&format!("10.96.{}.{}", index / 256, index % 256))],
        external_ips: vec![],
        load_balancer_ips: vec![],
        ports: vec![ServicePortModel {
            name: "http".into(),
            protocol: Protocol::Tcp,
            port: 80,
            node_port,
            target_port: TargetPort::Number(8080),
        }],
        external_traffic_policy: TrafficPolicy::Cluster,
        internal_traffic_policy: TrafficPolicy::Cluster,
        session_affinity_timeout_seconds: None,
        load_balancer_source_ranges: Vec::new(),
    }
}

fn slice(index: u32, hosts: std::ops::Range<u32>) -> EndpointSliceModel {
    EndpointSliceModel {
        slice_name: ServiceName::new("default", format!("svc-{index}-abc")),
        service: ServiceName::new("default", format!("svc-{index}")),
        family: crate::model::AddressFamily::Ipv4,
        ports: vec![EndpointPortModel {
            name: "http".into(),
            protocol: Protocol::Tcp,
            port: 8080,
        }],
        endpoints: hosts
            .map(|host| EndpointModel {
                address: ip(&format!("10.{}.{}.{}", index % 200, host / 256, host % 256)),
                ready: true,
                serving: true,
                terminating: false,
                node_name: Some("node-a".into()),
                hints: Default::default(),
            })
            .collect(),
        last_change_trigger_time: None,
    }
}

fn node() -> NodeView {
    NodeView {
        name: "node-a".into(),
        zone: None,
        addresses: vec![ip("192.168.1.10")],
    }
}

fn entries_of(desired: &DesiredServices, current: &MapState) -> MapState {
    lay_out(desired, current)
}

/// Before: three Services with three endpoints each. After: one deleted, one
/// scaled down, one scaled up, one new, and a node port added: every phase of the
/// plan has work.
fn before_and_after() -> (DesiredServices, DesiredServices) {
    let before = desired_services(
        &[service(1, None), service(2, None), service(3, None)],
        &[slice(1, 0..3), slice(2, 0..3), slice(3, 0..3)],
        &node(),
    );
    let after = desired_services(
        &[service(1, Some(30001)), service(2, None), service(4, None)],
        &[slice(1, 0..1), slice(2, 0..6), slice(4, 0..2)],
        &node(),
    );
    (before, after)
}

/// Maps that record every moment a frontend points at a missing slot, and a syncer that has
/// synced `desired` into them.
fn synced(desired: &DesiredServices) -> (FakeServiceMaps, Syncer) {
    let mut maps = FakeServiceMaps {
        watch_for_missing_slots: true,
        ..FakeServiceMaps::default()
    };
    let mut syncer = Syncer::restore(&maps).expect("restores");
    syncer
        .sync(open_gate(), desired, &mut maps)
        .expect("applies");
    (maps, syncer)
}

#[test]
fn an_apply_into_empty_maps_writes_exactly_the_desired_entries() {
    let (before, _) = before_and_after();
    let mut maps = FakeServiceMaps {
        watch_for_missing_slots: true,
        ..FakeServiceMaps::default()
    };
    let mut syncer = Syncer::restore(&maps).expect("restores");
    let report = syncer
        .sync(open_gate(), &before, &mut maps)
        .expect("applies");
    let expected = entries_of(&before, &MapState::default());
    assert_eq!(maps.state, expected);
    assert_eq!(syncer.current(), &expected);
    assert_eq!(report.frontends_written, 3);
    assert_eq!(report.backend_slots_written, 9);
    assert_eq!(report.frontends_deleted + report.backend_slots_deleted, 0);
    assert!(maps.missing_slot_violations.is_empty());
}

#[test]
fn a_restarted_agent_with_unchanged_inputs_writes_nothing() {
    let (before, _) = before_and_after();
    let (mut maps, _) = synced(&before);
    let writes_before_restart = maps.mutations_attempted;

    // A new process: restore from the maps and sync the same inputs.
    let mut restarted = Syncer::restore(&maps).expect("restores");
    let report = restarted
        .sync(open_gate(), &before, &mut maps)
        .expect("applies");
    assert_eq!(report, ApplyReport::default());
    assert_eq!(maps.mutations_attempted, writes_before_restart);
}

#[test]
fn a_change_deletes_stale_frontends_first_and_unused_slots_last() {
    let (before, after) = before_and_after();
    let (mut maps, mut syncer) = synced(&before);
    let current = syncer.current().clone();
    let expected = entries_of(&after, &current);
    let change = plan(&current, &expected);
    assert_eq!(
        change.stale_frontends,
        vec![frontend_key(
            &ip("10.96.0.3"),
            80,
            Protocol::Tcp,
            SCOPE_INTERNAL
        )]
    );
    assert!(!change.unused_backend_slots.is_empty());
    let report = syncer
        .sync(open_gate(), &after, &mut maps)
        .expect("applies");
    assert_eq!(report.operation_count(), change.operation_count());
    assert_eq!(maps.state, expected);
    assert!(maps.missing_slot_violations.is_empty());
}

#[test]
fn a_plan_between_equal_states_is_empty() {
    let (before, _) = before_and_after();
    let entries = entries_of(&before, &MapState::default());
    assert!(plan(&entries, &entries).is_empty());
}

#[test]
fn a_failure_at_any_point_of_an_apply_leaves_no_frontend_on_a_missing_slot_and_the_next_apply_converges(
) {
    let (before, after) = before_and_after();
    let (reference, reference_syncer) = synced(&before);
    let operations = plan(
        reference_syncer.current(),
        &entries_of(&after, reference_syncer.current()),
    )
    .operation_count() as u64;
    assert!(operations > 10, "the scenario exercises every phase");

    for failing in 0..operations {
        let mut maps = reference.clone();
        maps.failing_mutations
            .insert(maps.mutations_attempted + failing);
        let mut syncer = Syncer::restore(&maps).expect("restores");
        let result = syncer.sync(open_gate(), &after, &mut maps);
        assert!(result.is_err(), "mutation {failing} was made to fail");
        assert!(
            maps.missing_slot_violations.is_empty(),
            "failing mutation {failing}: {:?}",
            maps.missing_slot_violations
        );
        assert!(maps.state.frontends_with_missing_slots().is_empty());

        syncer
            .sync(open_gate(), &after, &mut maps)
            .expect("the retry applies");
        assert!(maps.missing_slot_violations.is_empty());
        assert_eq!(&maps.state, syncer.current());
        // Converged: what every frontend balances over is the desired state.
        assert!(plan(&maps.state, &entries_of(&after, &maps.state)).is_empty());
        assert_eq!(
            maps.state.frontends.keys().collect::<Vec<_>>(),
            after.frontends.keys().collect::<Vec<_>>()
        );
    }
}

/// The defect of the old apply: it stopped at the first failed operation, so
/// an entry that always fails (a full map, an entry the kernel refuses) kept
/// every later entry from being written, the periodic resync's included.
#[test]
fn an_entry_that_always_fails_blocks_no_other_write_and_is_reported_for_its_service() {
    let services = [service(1, None), service(2, None)];
    let slices = [slice(1, 0..2), slice(2, 0..2)];
    let desired = desired_services(&services, &slices, &node());
    // The first frontend in apply order always fails.
    let (failing_key, failing_frontend) = desired
        .frontends
        .iter()
        .next()
        .map(|(key, frontend)| (*key, frontend.clone()))
        .expect("two Services have frontends");
    let failing_service = failing_frontend.group.service.clone();
    let mut maps = FakeServiceMaps {
        watch_for_missing_slots: true,
        ..FakeServiceMaps::default()
    };
    maps.failing_frontends.insert(failing_key);
    let mut syncer = Syncer::restore(&maps).expect("restores");

    let error = syncer
        .sync(open_gate(), &desired, &mut maps)
        .expect_err("one entry failed");
    assert_eq!(
        error.failed_services(),
        Some(BTreeMap::from([(failing_service.to_string(), 1)])),
        "{}",
        crate::error::chain(&error)
    );
    let everything_else: Vec<&FrontendKey> = desired
        .frontends
        .keys()
        .filter(|key| **key != failing_key)
        .collect();
    assert!(!everything_else.is_empty());
    for key in &everything_else {
        assert!(
            maps.state.frontends.contains_key(*key),
            "{key:?} is not written: the failing entry blocked it"
        );
    }
    assert!(!maps.state.frontends.contains_key(&failing_key));
    assert!(maps.missing_slot_violations.is_empty());

    // The retry (a full sync re-reading the maps) tries the failing entry
    // again and still writes what changed meanwhile.
    let attempts = maps.mutations_attempted;
    let grown = desired_services(
        &[service(1, None), service(2, None), service(3, None)],
        &[slice(1, 0..2), slice(2, 0..2), slice(3, 0..2)],
        &node(),
    );
    assert!(syncer.sync(open_gate(), &grown, &mut maps).is_err());
    assert!(maps.mutations_attempted > attempts, "the retry tried again");
    for key in grown.frontends.keys().filter(|key| **key != failing_key) {
        assert!(maps.state.frontends.contains_key(key), "{key:?} written");
    }
    // Once the entry can be written, the next sync converges.
    maps.failing_frontends.clear();
    syncer
        .sync(open_gate(), &grown, &mut maps)
        .expect("the retry applies");
    assert!(plan(&maps.state, &entries_of(&grown, &maps.state)).is_empty());
    assert!(maps.missing_slot_violations.is_empty());
}

#[test]
fn a_failed_apply_makes_the_next_sync_reread_the_maps() {
    let (before, after) = before_and_after();
    let (mut maps, mut syncer) = synced(&before);
    maps.failing_kinds.insert(MapMutation::WriteFrontend);
    assert!(syncer.sync(open_gate(), &after, &mut maps).is_err());
    // Something else changed the map meanwhile (an operator with bpftool).
    let intruder = frontend_key(&ip("10.96.9.9"), 80, Protocol::Tcp, SCOPE_INTERNAL);
    maps.state.frontends.insert(
        intruder,
        FrontendValue {
            group_id: 999,
            backend_count: 0,
            flags: 0,
            affinity_timeout_seconds: 0,
        },
    );
    maps.failing_kinds.clear();
    syncer
        .sync(open_gate(), &after, &mut maps)
        .expect("applies");
    assert!(
        !maps.state.frontends.contains_key(&intruder),
        "re-read and pruned"
    );
}

#[test]
fn a_full_map_fails_the_apply_safely_and_a_bigger_one_converges() {
    let (before, after) = before_and_after();
    let (mut maps, mut syncer) = synced(&before);
    maps.backend_slot_capacity = Some(maps.state.backend_slots.len() + 1);
    assert!(syncer.sync(open_gate(), &after, &mut maps).is_err());
    assert!(maps.missing_slot_violations.is_empty());
    maps.backend_slot_capacity = None;
    syncer
        .sync(open_gate(), &after, &mut maps)
        .expect("applies");
    assert_eq!(maps.state, *syncer.current());
}

#[test]
fn an_unreadable_map_fails_the_restore() {
    let maps = FakeServiceMaps {
        failing_reads: true,
        ..FakeServiceMaps::default()
    };
    assert!(matches!(Syncer::restore(&maps), Err(Error::ReadMap { .. })));
}

#[test]
fn a_restored_frontend_without_its_slots_is_repaired_by_the_first_sync() {
    let (before, _) = before_and_after();
    let mut maps = FakeServiceMaps::default();
    Syncer::restore(&maps)
        .expect("restores")
        .sync(open_gate(), &before, &mut maps)
        .expect("applies");
    let damaged: BackendSlotKey = *maps.state.backend_slots.keys().next().expect("a slot");
    maps.state.backend_slots.remove(&damaged);
    let mut restarted = Syncer::restore(&maps).expect("restores");
    let report = restarted
        .sync(open_gate(), &before, &mut maps)
        .expect("applies");
    assert_eq!(report.backend_slots_written, 1);
    assert!(maps.state.frontends_with_missing_slots().is_empty());
}

/// Applies a plan to a plain map state, checking the slot invariant after each
/// operation: the order's safety, independent of the fake.
fn apply_checked(mut state: MapState, plan: &Plan) -> Result<MapState, String> {
    let check = |state: &MapState, step: &str| {
        let missing = state.frontends_with_missing_slots();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("after {step}: {missing:?}"))
        }
    };
    for key in &plan.stale_frontends {
        state.frontends.remove(key);
        check(&state, "a frontend delete")?;
    }
    for (key, value) in &plan.backend_slot_writes {
        state.backend_slots.insert(*key, *value);
        check(&state, "a slot write")?;
    }
    for (key, value) in &plan.frontend_writes {
        state.frontends.insert(*key, *value);
        check(&state, "a frontend write")?;
    }
    for key in &plan.unused_backend_slots {
        state.backend_slots.remove(key);
        check(&state, "a slot delete")?;
    }
    Ok(state)
}

fn arbitrary_state() -> impl Strategy<Value = MapState> {
    // Small id and ordinal ranges so that states overlap.
    let frontend = (0u8..6, 1u32..4, 0u32..4);
    prop::collection::vec(frontend, 0..8).prop_map(|frontends| {
        let mut state = MapState::default();
        for (address, group_id, backend_count) in frontends {
            let key = FrontendKey {
                address: switchyard_common::ipv4_mapped([10, 96, 0, address]),
                port_big_endian: 80u16.to_be(),
                protocol: switchyard_common::PROTOCOL_TCP,
                scope: SCOPE_INTERNAL,
            };
            state.frontends.insert(
                key,
                FrontendValue {
                    group_id,
                    backend_count,
                    flags: 0,
                    affinity_timeout_seconds: 0,
                },
            );
            for ordinal in 0..backend_count {
                state.backend_slots.insert(
                    BackendSlotKey { group_id, ordinal },
                    BackendValue {
                        address: switchyard_common::ipv4_mapped([10, 0, address, 1]),
                        port_big_endian: 8080u16.to_be(),
                        flags: 0,
                    },
                );
            }
        }
        state
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn applying_the_diff_to_the_current_state_always_yields_the_desired_state(
        current in arbitrary_state(),
        desired in arbitrary_state(),
    ) {
        let plan = plan(&current, &desired);
        let applied = apply_checked(current, &plan);
        prop_assert_eq!(applied, Ok(desired));
    }

    #[test]
    fn the_apply_order_never_leaves_a_frontend_pointing_at_a_missing_slot(
        (services_before, slices_before) in scenario_strategy(),
        (services_after, slices_after) in scenario_strategy(),
        failing in prop::option::of(0u64..64),
    ) {
        let node_view = scenario_node();
        let before = desired_services(&services_before, &slices_before, &node_view);
        let after = desired_services(&services_after, &slices_after, &node_view);
        let mut maps = FakeServiceMaps { watch_for_missing_slots: true, ..FakeServiceMaps::default() };
        let mut syncer = Syncer::restore(&maps).expect("restores");
        syncer.sync(open_gate(), &before, &mut maps).expect("applies");
        if let Some(failing) = failing {
            maps.failing_mutations.insert(maps.mutations_attempted + failing);
        }
        // The first attempt may fail at the injected point; the second converges.
        let _ = syncer.sync(open_gate(), &after, &mut maps);
        syncer.sync(open_gate(), &after, &mut maps).expect("the retry applies");
        prop_assert!(maps.missing_slot_violations.is_empty(), "{:?}", maps.missing_slot_violations);
        prop_assert_eq!(&maps.state, syncer.current());
        let expected = lay_out(&after, &maps.state);
        prop_assert_eq!(&maps.state, &expected);
        // And a restart then changes nothing.
        let mut restarted = Syncer::restore(&maps).expect("restores");
        prop_assert_eq!(restarted.sync(open_gate(), &after, &mut maps).expect("applies"), ApplyReport::default());
    }

    /// Any set of failed operations: the others are all made, what depends on
    /// a failure is held back, and no frontend ever points at a missing slot.
    #[test]
    fn an_apply_with_failures_makes_every_operation_that_does_not_depend_on_one(
        current in arbitrary_state(),
        desired in arbitrary_state(),
        failing in prop::collection::btree_set(0u64..48, 0..6),
    ) {
        prop_assume!(current.frontends_with_missing_slots().is_empty());
        let plan = plan(&current, &desired);
        let mut maps = FakeServiceMaps::with_state(current.clone());
        maps.watch_for_missing_slots = true;
        maps.failing_mutations = failing;
        let mut tracked = current;
        let (report, failed) = apply(&plan, &mut maps, &mut tracked);
        prop_assert!(maps.missing_slot_violations.is_empty(), "{:?}", maps.missing_slot_violations);
        prop_assert_eq!(&maps.state, &tracked);
        let left: BTreeSet<EntryKey> = failed.iter().map(|entry| entry.entry).collect();
        prop_assert_eq!(report.operation_count() + failed.len(), plan.operation_count());
        for key in &plan.stale_frontends {
            prop_assert!(left.contains(&EntryKey::Frontend(*key)) || !maps.state.frontends.contains_key(key));
        }
        for (key, value) in &plan.backend_slot_writes {
            prop_assert!(left.contains(&EntryKey::BackendSlot(*key)) || maps.state.backend_slots.get(key) == Some(value));
        }
        for (key, value) in &plan.frontend_writes {
            prop_assert!(left.contains(&EntryKey::Frontend(*key)) || maps.state.frontends.get(key) == Some(value));
        }
        for key in &plan.unused_backend_slots {
            prop_assert!(left.contains(&EntryKey::BackendSlot(*key)) || !maps.state.backend_slots.contains_key(key));
        }
        // Held back only what depends on a failure: with none, nothing is left.
        if failed.iter().all(|entry| matches!(entry.fault, EntryFault::HeldBack)) {
            prop_assert!(failed.is_empty());
        }
    }
}

/// What each frontend balances over, independent of ids and slot order (the sync tests
/// compare maps by it).
pub(crate) fn semantics(state: &MapState) -> BTreeMap<FrontendKey, (u32, u32, Vec<BackendValue>)> {
    state
        .frontends
        .iter()
        .map(|(key, value)| {
            let mut backends: Vec<BackendValue> = (0..value.backend_count)
                .filter_map(|ordinal| {
                    state
                        .backend_slots
                        .get(&BackendSlotKey {
                            group_id: value.group_id,
                            ordinal,
                        })
                        .copied()
                })
                .collect();
            backends.sort();
            (
                *key,
                (value.flags, value.affinity_timeout_seconds, backends),
            )
        })
        .collect()
}

mod partial {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::desired::{merge, services_desired, ServiceDesired};

    fn changes_between(
        before: &BTreeMap<ServiceName, ServiceDesired>,
        after: &BTreeMap<ServiceName, ServiceDesired>,
    ) -> Vec<(ServiceName, Option<ServiceDesired>)> {
        crate::desired::changed_services(before, after)
    }

    #[test]
    fn a_one_service_change_writes_only_that_services_entries() {
        let services: Vec<ServiceModel> = (1..=50).map(|index| service(index, None)).collect();
        let mut slices: Vec<EndpointSliceModel> =
            (1..=50).map(|index| slice(index, 0..4)).collect();
        let mut maps = FakeServiceMaps {
            watch_for_missing_slots: true,
            ..FakeServiceMaps::default()
        };
        let mut syncer = Syncer::restore(&maps).expect("restores");
        let before = services_desired(&services, &slices, &node());
        syncer
            .sync_services(open_gate(), before.clone(), &mut maps)
            .expect("applies");
        assert!(!syncer.needs_full_sync());

        slices[6] = slice(7, 1..4);
        let after = services_desired(&services, &slices, &node());
        let changes = changes_between(&before, &after);
        assert_eq!(changes.len(), 1);
        let report = syncer
            .partial()
            .expect("a partial sync")
            .sync_changes(open_gate(), changes, &mut maps)
            .expect("applies");
        // One endpoint gone: the last slot moves into its place, the frontend's
        // count shrinks, the last slot goes.
        assert_eq!(report.backend_slots_written, 1);
        assert_eq!(report.frontends_written, 1);
        assert_eq!(report.backend_slots_deleted, 1);
        assert_eq!(report.frontends_deleted, 0);
        assert!(maps.missing_slot_violations.is_empty());
        assert_eq!(
            semantics(&maps.state),
            semantics(&lay_out(&merge(after.values()), &MapState::default()))
        );
    }

    #[test]
    fn an_address_passes_to_the_next_service_when_its_owner_is_deleted() {
        let mut first = service(1, None);
        first.name = ServiceName::new("default", "a-first");
        first.external_ips = vec![ip("192.0.2.10")];
        let mut second = service(2, None);
        second.name = ServiceName::new("default", "b-second");
        second.external_ips = vec![ip("192.0.2.10")];
        let mut first_slice = slice(1, 0..2);
        first_slice.service = first.name.clone();
        let mut second_slice = slice(2, 0..3);
        second_slice.service = second.name.clone();
        let slices = vec![first_slice, second_slice];

        let mut maps = FakeServiceMaps {
            watch_for_missing_slots: true,
            ..FakeServiceMaps::default()
        };
        let mut syncer = Syncer::restore(&maps).expect("restores");
        let before = services_desired(&[first.clone(), second.clone()], &slices, &node());
        syncer
            .sync_services(open_gate(), before.clone(), &mut maps)
            .expect("applies");
        let external = frontend_key(
            &ip("192.0.2.10"),
            80,
            Protocol::Tcp,
            switchyard_common::SCOPE_EXTERNAL,
        );
        assert_eq!(maps.state.frontends[&external].backend_count, 2);

        let after = services_desired(&[second.clone()], &slices, &node());
        syncer
            .partial()
            .expect("a partial sync")
            .sync_changes(open_gate(), changes_between(&before, &after), &mut maps)
            .expect("applies");
        assert_eq!(
            maps.state.frontends[&external].backend_count, 3,
            "b-second took over"
        );
        assert!(maps.missing_slot_violations.is_empty());
        let expected = lay_out(&merge(after.values()), &maps.state);
        assert_eq!(maps.state, expected, "a full sync would change nothing");

        // And back: a-first returns and takes the address again.
        syncer
            .partial()
            .expect("a partial sync")
            .sync_changes(open_gate(), changes_between(&after, &before), &mut maps)
            .expect("applies");
        assert_eq!(maps.state.frontends[&external].backend_count, 2);
        assert_eq!(maps.state, lay_out(&merge(before.values()), &maps.state));
    }

    #[test]
    fn a_partial_sync_before_any_full_sync_asks_for_a_full_one() {
        let maps = FakeServiceMaps::default();
        let mut syncer = Syncer::restore(&maps).expect("restores");
        assert!(syncer.needs_full_sync());
        assert!(
            syncer.partial().is_none(),
            "no partial syncer without an index"
        );
        assert_eq!(maps.mutations_attempted, 0);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        #[test]
        fn partial_syncs_reach_the_state_a_full_sync_would_keep(
            scenarios in prop::collection::vec(scenario_strategy(), 2..5),
            failing in prop::option::of(0u64..48),
        ) {
            let node_view = scenario_node();
            let shares: Vec<BTreeMap<ServiceName, ServiceDesired>> = scenarios
                .iter()
                .map(|(services, slices)| services_desired(services, slices, &node_view))
                .collect();
            let mut maps = FakeServiceMaps { watch_for_missing_slots: true, ..FakeServiceMaps::default() };
            let mut syncer = Syncer::restore(&maps).expect("restores");
            syncer.sync_services(open_gate(), shares[0].clone(), &mut maps).expect("applies");
            if let Some(failing) = failing {
                maps.failing_mutations.insert(maps.mutations_attempted + failing);
            }
            for window in shares.windows(2) {
                let (before, after) = (&window[0], &window[1]);
                let partial = syncer
                    .partial()
                    .map(|partial| partial.sync_changes(open_gate(), changes_between(before, after), &mut maps));
                match partial {
                    Some(Ok(_)) => {}
                    // After a failure (or without an index) the caller falls back
                    // to a full sync.
                    None | Some(Err(_)) => {
                        prop_assert!(syncer.needs_full_sync());
                        syncer.sync_services(open_gate(), after.clone(), &mut maps).expect("the full sync applies");
                    }
                }
                prop_assert!(maps.missing_slot_violations.is_empty(), "{:?}", maps.missing_slot_violations);
                prop_assert_eq!(&maps.state, syncer.current());
                let desired = merge(after.values());
                // Exactly what a full sync keeps: it would write nothing.
                prop_assert_eq!(&maps.state, &lay_out(&desired, &maps.state));
                prop_assert_eq!(
                    semantics(&maps.state),
                    semantics(&lay_out(&desired, &MapState::default()))
                );
            }
        }
    }
}
