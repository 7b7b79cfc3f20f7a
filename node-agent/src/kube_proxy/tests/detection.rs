use std::{
    sync::OnceLock,
    time::{Duration, Instant},
};

use proptest::prelude::*;
use switchyard_crds::reasons;

use super::*;
use crate::kube_proxy::{
    cleanup::plan_iptables_cleanup,
    detection::{
        footprint, ipvs_mode, kube_proxy_healthy_condition, CleanupDecision, CleanupStateMachine,
        CoexistenceObservation, KubeProxyFootprint, KubeProxyHealth,
    },
    nftables::NftRuleset,
    Backend, Family, IptablesDump, NodeRules,
};

fn rules_of(dumps: &[(Backend, Family, &str)]) -> NodeRules {
    NodeRules {
        iptables: dumps
            .iter()
            .map(|(backend, family, text)| IptablesDump {
                backend: *backend,
                family: *family,
                ruleset: parse(text),
            })
            .collect(),
        nftables: NftRuleset::default(),
    }
}

const PRESENT: KubeProxyFootprint = KubeProxyFootprint {
    chains: 20,
    rules: 50,
    nft_tables: 0,
    nft_rules: 0,
};
const ABSENT: KubeProxyFootprint = KubeProxyFootprint {
    chains: 0,
    rules: 0,
    nft_tables: 0,
    nft_rules: 0,
};

fn gone() -> KubeProxyHealth {
    KubeProxyHealth::Absent {
        reason: "connection refused".into(),
    }
}

fn timed_out() -> KubeProxyHealth {
    KubeProxyHealth::NoAnswer {
        reason: "no answer within 500 ms".into(),
    }
}

const CONFIRMATION: Duration = Duration::from_secs(6);

/// The test's clock: `at(0)` is a fixed instant, `at(n)` n milliseconds later.
fn at(milliseconds: u64) -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now) + Duration::from_millis(milliseconds)
}

/// After the settling rounds of [`settled`].
fn later() -> Instant {
    at(CONFIRMATION.as_millis() as u64 + 1_000)
}

fn observation_at(
    request: Option<i64>,
    footprint: KubeProxyFootprint,
    health: KubeProxyHealth,
    observed_at: Instant,
) -> CoexistenceObservation {
    CoexistenceObservation {
        cleanup_requested: request,
        ipvs_mode: false,
        footprint,
        health,
        observed_at,
    }
}

fn observation(
    request: Option<i64>,
    footprint: KubeProxyFootprint,
    health: KubeProxyHealth,
) -> CoexistenceObservation {
    observation_at(request, footprint, health, later())
}

/// A machine that has already seen kube-proxy's healthz refused for the whole
/// confirmation (no cleanup requested yet), so that a test can look at what
/// happens after that.
fn settled() -> CleanupStateMachine {
    let mut machine = CleanupStateMachine::new(CONFIRMATION);
    machine.observe(&observation_at(None, ABSENT, gone(), at(0)));
    machine.observe(&observation_at(
        None,
        ABSENT,
        gone(),
        at(CONFIRMATION.as_millis() as u64),
    ));
    machine
}

#[test]
fn a_single_refused_probe_is_no_proof_and_the_cleanup_waits_for_the_confirmation() {
    let mut machine = CleanupStateMachine::new(CONFIRMATION);
    for (milliseconds, expected) in [
        (0, CleanupDecision::Wait),
        (2_000, CleanupDecision::Wait),
        (5_999, CleanupDecision::Wait),
        (6_000, CleanupDecision::Clean),
    ] {
        let verdict = machine.observe(&observation_at(Some(1), PRESENT, gone(), at(milliseconds)));
        assert_eq!(verdict.decision, expected, "at {milliseconds} ms");
        if expected == CleanupDecision::Wait {
            assert_eq!(verdict.rules_present.reason, reasons::RULES_PRESENT);
            assert!(
                verdict
                    .rules_present
                    .message
                    .contains("stayed away for 6 s"),
                "{}",
                verdict.rules_present.message
            );
        }
    }
}

#[test]
fn a_kube_proxy_that_answers_again_restarts_the_confirmation() {
    let mut machine = CleanupStateMachine::new(CONFIRMATION);
    machine.observe(&observation_at(Some(1), PRESENT, gone(), at(0)));
    // A container restart: the healthz answers again before the confirmation ends.
    let back = machine.observe(&observation_at(
        Some(1),
        PRESENT,
        KubeProxyHealth::Healthy,
        at(5_000),
    ));
    assert_eq!(back.decision, CleanupDecision::Wait);
    assert_eq!(back.rules_present.reason, reasons::KUBE_PROXY_CONFLICT);
    for milliseconds in [6_000, 9_000, 11_999] {
        let verdict = machine.observe(&observation_at(Some(1), PRESENT, gone(), at(milliseconds)));
        assert_eq!(
            verdict.decision,
            CleanupDecision::Wait,
            "at {milliseconds} ms"
        );
    }
    let verdict = machine.observe(&observation_at(Some(1), PRESENT, gone(), at(12_000)));
    assert_eq!(verdict.decision, CleanupDecision::Clean);
}

#[test]
fn a_healthz_that_times_out_never_counts_as_kube_proxy_gone() {
    let mut machine = CleanupStateMachine::new(CONFIRMATION);
    for second in 0..60 {
        let verdict = machine.observe(&observation_at(
            Some(1),
            PRESENT,
            timed_out(),
            at(second * 1_000),
        ));
        assert_eq!(verdict.decision, CleanupDecision::Wait);
        assert_eq!(verdict.rules_present.reason, reasons::KUBE_PROXY_CONFLICT);
        assert!(
            !verdict.replacement_health_allowed,
            "something still holds kube-proxy's port"
        );
    }
}

#[test]
fn even_without_a_confirmation_time_two_rounds_must_find_kube_proxy_gone() {
    let mut machine = CleanupStateMachine::new(Duration::ZERO);
    let first = machine.observe(&observation_at(Some(1), PRESENT, gone(), at(0)));
    assert_eq!(first.decision, CleanupDecision::Wait);
    let second = machine.observe(&observation_at(Some(1), PRESENT, gone(), at(0)));
    assert_eq!(second.decision, CleanupDecision::Clean);
}

#[test]
fn the_footprint_counts_kube_proxys_chains_and_rules_in_every_dump() {
    for (text, chains, rules) in [
        (LEGACY_1_20_IPV4, 19, 49),
        (NFT_1_33_IPV4, 22, 53),
        (NFT_1_33_IPV6, 14, 27),
        (ONLY_NAT, 9, 13),
        (CAPTURED_1_20_LEGACY, 19, 49),
        (CAPTURED_1_20_NFT, 19, 49),
    ] {
        let found = footprint(&rules_of(&[(Backend::Nft, Family::Ipv4, text)]));
        assert_eq!((found.chains, found.rules), (chains, rules));
        assert!(found.present());
    }
    let both = footprint(&rules_of(&[
        (Backend::Legacy, Family::Ipv4, LEGACY_1_20_IPV4),
        (Backend::Nft, Family::Ipv6, NFT_1_33_IPV6),
    ]));
    assert_eq!((both.chains, both.rules), (19 + 14, 49 + 27));
}

#[test]
fn the_footprint_counts_nftables_mode_tables_and_rules() {
    let found = footprint(&NodeRules {
        iptables: Vec::new(),
        nftables: NftRuleset::parse_json(NFTABLES_MODE_JSON).unwrap(),
    });
    assert_eq!((found.nft_tables, found.nft_rules), (2, 34));
    assert_eq!(found.total_rules(), 34);
}

#[test]
fn nothing_is_left_after_the_cleanup_even_when_kubelet_puts_kube_postrouting_back() {
    let before = parse(LEGACY_1_20_IPV4);
    let mut after =
        apply_restore(&before, &plan_iptables_cleanup(&before).restore_input()).unwrap();
    let cleaned = NodeRules {
        iptables: vec![IptablesDump {
            backend: Backend::Legacy,
            family: Family::Ipv4,
            ruleset: after.clone(),
        }],
        nftables: NftRuleset::default(),
    };
    assert!(!footprint(&cleaned).present());
    // kubelet 1.20's periodic sync recreates KUBE-POSTROUTING and its jump.
    after = apply_restore(
        &after,
        "*nat\n:KUBE-POSTROUTING - [0:0]\n\
         -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
         -A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0\n\
         -A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n\
         -I POSTROUTING 1 -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\nCOMMIT\n",
    )
    .unwrap();
    let with_kubelet = NodeRules {
        iptables: vec![IptablesDump {
            backend: Backend::Legacy,
            family: Family::Ipv4,
            ruleset: after,
        }],
        nftables: NftRuleset::default(),
    };
    assert!(
        !footprint(&with_kubelet).present(),
        "not a sign of kube-proxy"
    );
}

#[test]
fn ipvs_mode_is_found_by_its_interface_or_its_chains() {
    let iptables_mode = rules_of(&[(Backend::Legacy, Family::Ipv4, LEGACY_1_20_IPV4)]);
    assert!(!ipvs_mode(&["lo".into(), "eth0".into()], &iptables_mode));
    assert!(ipvs_mode(
        &["lo".into(), "kube-ipvs0".into()],
        &iptables_mode
    ));
    let ipvs = rules_of(&[(Backend::Legacy, Family::Ipv4, IPVS_1_20_IPV4)]);
    assert!(ipvs_mode(&["lo".into()], &ipvs));
    for text in [NFT_1_33_IPV4, NFT_1_33_IPV6, ONLY_NAT] {
        assert!(!ipvs_mode(
            &[],
            &rules_of(&[(Backend::Nft, Family::Ipv4, text)])
        ));
    }
}

#[test]
fn cleanup_is_never_requested_while_kube_proxy_runs() {
    for health in [
        KubeProxyHealth::Healthy,
        KubeProxyHealth::Unhealthy { status: 503 },
    ] {
        let mut machine = settled();
        for _ in 0..5 {
            let verdict = machine.observe(&observation(Some(1), PRESENT, health.clone()));
            assert_eq!(verdict.decision, CleanupDecision::Wait);
            assert!(verdict.rules_present.status);
            assert_eq!(verdict.rules_present.reason, reasons::KUBE_PROXY_CONFLICT);
            assert!(!verdict.replacement_health_allowed);
        }
    }
}

#[test]
fn once_kube_proxy_is_gone_the_rules_are_cleaned_once_and_reported_absent() {
    let mut machine = settled();
    let verdict = machine.observe(&observation(Some(3), PRESENT, gone()));
    assert_eq!(verdict.decision, CleanupDecision::Clean);
    assert_eq!(verdict.rules_present.reason, reasons::RULES_PRESENT);
    machine.cleanup_succeeded();
    for _ in 0..3 {
        let verdict = machine.observe(&observation(Some(3), ABSENT, gone()));
        assert_eq!(verdict.decision, CleanupDecision::Wait);
        assert!(!verdict.rules_present.status);
        assert_eq!(verdict.rules_present.reason, reasons::RULES_ABSENT);
        assert!(verdict.replacement_health_allowed);
    }
}

#[test]
fn rules_that_come_back_after_the_cleanup_stop_the_agent_for_good() {
    let mut machine = settled();
    assert_eq!(
        machine
            .observe(&observation(Some(3), PRESENT, gone()))
            .decision,
        CleanupDecision::Clean
    );
    machine.cleanup_succeeded();
    machine.observe(&observation(Some(3), ABSENT, gone()));
    // kube-proxy is back (its healthz may not even answer yet).
    for health in [gone(), KubeProxyHealth::Healthy, gone()] {
        let verdict = machine.observe(&observation(Some(3), PRESENT, health));
        assert_eq!(verdict.decision, CleanupDecision::Wait);
        assert!(verdict.rules_present.status);
        assert_eq!(verdict.rules_present.reason, reasons::KUBE_PROXY_CONFLICT);
        assert!(
            verdict.rules_present.message.contains("came back"),
            "{}",
            verdict.rules_present.message
        );
        assert!(
            !verdict.replacement_health_allowed,
            "the ports are kube-proxy's again"
        );
    }
    assert!(machine.in_conflict());
}

#[test]
fn rules_that_come_back_right_after_the_cleanup_are_a_conflict_too() {
    let mut machine = settled();
    machine.observe(&observation(Some(1), PRESENT, gone()));
    machine.cleanup_succeeded();
    let verdict = machine.observe(&observation(Some(1), PRESENT, gone()));
    assert_eq!(verdict.decision, CleanupDecision::Wait);
    assert_eq!(verdict.rules_present.reason, reasons::KUBE_PROXY_CONFLICT);
}

#[test]
fn a_node_found_clean_reports_a_conflict_when_kube_proxy_appears() {
    let mut machine = settled();
    assert_eq!(
        machine
            .observe(&observation(Some(1), ABSENT, gone()))
            .decision,
        CleanupDecision::Wait
    );
    let verdict = machine.observe(&observation(Some(1), PRESENT, gone()));
    assert_eq!(verdict.decision, CleanupDecision::Wait);
    assert_eq!(verdict.rules_present.reason, reasons::KUBE_PROXY_CONFLICT);
}

#[test]
fn a_conflict_whose_rules_vanish_reports_absent_but_still_never_cleans() {
    let mut machine = settled();
    machine.observe(&observation(Some(1), PRESENT, gone()));
    machine.cleanup_succeeded();
    machine.observe(&observation(Some(1), PRESENT, gone()));
    let verdict = machine.observe(&observation(Some(1), ABSENT, gone()));
    assert!(!verdict.rules_present.status);
    assert_eq!(verdict.rules_present.reason, reasons::RULES_ABSENT);
    let verdict = machine.observe(&observation(Some(1), PRESENT, gone()));
    assert_eq!(verdict.decision, CleanupDecision::Wait);
    assert_eq!(verdict.rules_present.reason, reasons::KUBE_PROXY_CONFLICT);
}

#[test]
fn a_new_request_generation_re_arms_the_cleanup() {
    let mut machine = settled();
    machine.observe(&observation(Some(1), PRESENT, gone()));
    machine.cleanup_succeeded();
    machine.observe(&observation(Some(1), PRESENT, gone()));
    assert!(machine.in_conflict());
    let verdict = machine.observe(&observation(Some(2), PRESENT, gone()));
    assert_eq!(verdict.decision, CleanupDecision::Clean);
}

#[test]
fn withdrawing_the_request_stops_cleaning_and_reports_plain_presence() {
    let mut machine = settled();
    for footprint in [PRESENT, ABSENT] {
        let verdict = machine.observe(&observation(None, footprint, gone()));
        assert_eq!(verdict.decision, CleanupDecision::Wait);
        assert_eq!(verdict.rules_present.status, footprint.present());
        assert_eq!(
            verdict.rules_present.reason,
            if footprint.present() {
                reasons::RULES_PRESENT
            } else {
                reasons::RULES_ABSENT
            }
        );
    }
    machine.observe(&observation(Some(1), PRESENT, gone()));
    machine.cleanup_succeeded();
    machine.observe(&observation(Some(1), PRESENT, gone()));
    assert!(machine.in_conflict());
    machine.observe(&observation(None, PRESENT, gone()));
    assert!(!machine.in_conflict());
}

#[test]
fn a_failed_cleanup_is_retried_and_reported_as_failed() {
    let mut machine = settled();
    assert_eq!(
        machine
            .observe(&observation(Some(1), PRESENT, gone()))
            .decision,
        CleanupDecision::Clean
    );
    machine.cleanup_failed("iptables-nft-restore: exit status 4".into());
    let verdict = machine.observe(&observation(Some(1), PRESENT, gone()));
    assert_eq!(verdict.decision, CleanupDecision::Clean);
    assert_eq!(verdict.rules_present.reason, reasons::CLEANUP_FAILED);
    assert!(verdict.rules_present.message.contains("exit status 4"));
    machine.cleanup_succeeded();
    let verdict = machine.observe(&observation(Some(1), ABSENT, gone()));
    assert_eq!(verdict.rules_present.reason, reasons::RULES_ABSENT);
}

#[test]
fn ipvs_mode_is_reported_and_never_cleaned() {
    let mut machine = settled();
    for health in [gone(), KubeProxyHealth::Healthy] {
        let verdict = machine.observe(&CoexistenceObservation {
            cleanup_requested: Some(1),
            ipvs_mode: true,
            footprint: PRESENT,
            health,
            observed_at: later(),
        });
        assert_eq!(verdict.decision, CleanupDecision::Wait);
        assert!(verdict.rules_present.status);
        assert_eq!(
            verdict.rules_present.reason,
            reasons::UNSUPPORTED_KUBE_PROXY_MODE
        );
        assert!(!verdict.replacement_health_allowed);
    }
}

#[test]
fn the_agents_own_health_server_answering_means_kube_proxy_has_left() {
    let mut machine = settled();
    let verdict = machine.observe(&observation(
        Some(1),
        PRESENT,
        KubeProxyHealth::AnsweredByAgent,
    ));
    assert_eq!(verdict.decision, CleanupDecision::Clean);
    assert!(verdict.replacement_health_allowed);
}

#[test]
fn kube_proxy_healthy_needs_its_rules_and_a_200() {
    let healthy = kube_proxy_healthy_condition(&PRESENT, &KubeProxyHealth::Healthy);
    assert!(healthy.status);
    assert_eq!(healthy.reason, reasons::KUBE_PROXY_HEALTHZ_OK);
    for (footprint, health) in [
        (ABSENT, KubeProxyHealth::Healthy),
        (PRESENT, KubeProxyHealth::Unhealthy { status: 503 }),
        (PRESENT, gone()),
        (PRESENT, KubeProxyHealth::AnsweredByAgent),
        (PRESENT, KubeProxyHealth::AnsweredByThisAgent),
    ] {
        let report = kube_proxy_healthy_condition(&footprint, &health);
        assert!(!report.status, "{footprint:?} {health:?}");
        assert_eq!(report.reason, reasons::KUBE_PROXY_UNHEALTHY);
    }
}

fn any_health() -> impl Strategy<Value = KubeProxyHealth> {
    prop_oneof![
        Just(KubeProxyHealth::Healthy),
        Just(KubeProxyHealth::Unhealthy { status: 503 }),
        Just(KubeProxyHealth::AnsweredByAgent),
        Just(KubeProxyHealth::AnsweredByThisAgent),
        Just(KubeProxyHealth::Absent {
            reason: "refused".into()
        }),
        Just(KubeProxyHealth::NoAnswer {
            reason: "no answer within 500 ms".into()
        }),
    ]
}

#[derive(Clone, Debug)]
enum Step {
    Observe {
        /// The spec asks for the cleanup.
        requested: bool,
        /// The spec's generation moved on (generations never go back).
        bump: bool,
        present: bool,
        ipvs: bool,
        health: KubeProxyHealth,
        /// Milliseconds since the previous round.
        advance: u64,
    },
    /// The cleanup decided in the previous round failed.
    Fail,
}

fn any_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => (prop::bool::weighted(0.8), prop::bool::weighted(0.2), any::<bool>(), prop::bool::weighted(0.1), any_health(), 0_u64..4_000)
            .prop_map(|(requested, bump, present, ipvs, health, advance)| Step::Observe { requested, bump, present, ipvs, health, advance }),
        1 => Just(Step::Fail),
    ]
}

proptest! {
    /// Never fight kube-proxy: no cleanup while it may run or in IPVS mode, none
    /// before its healthz has been refused in at least two rounds spanning the
    /// confirmation, and at most one successful cleanup per request generation (a
    /// failure allows a retry).
    #[test]
    fn the_state_machine_never_fights_kube_proxy(steps in prop::collection::vec(any_step(), 1..60)) {
        let mut machine = CleanupStateMachine::new(CONFIRMATION);
        let mut cleaned_generations: Vec<i64> = Vec::new();
        let mut last_clean: Option<i64> = None;
        let mut generation = 1_i64;
        let mut now = 0_u64;
        // The rounds since kube-proxy was last seen possibly running: (first, count).
        let mut gone_since: Option<(u64, u32)> = None;
        for step in steps {
            match step {
                Step::Fail => {
                    if let Some(generation) = last_clean.take() {
                        machine.cleanup_failed("injected".into());
                        cleaned_generations.retain(|seen| *seen != generation);
                    }
                }
                Step::Observe { requested, bump, present, ipvs, health, advance } => {
                    generation += i64::from(bump);
                    now += advance;
                    gone_since = match (health.kube_proxy_has_left(), gone_since) {
                        (false, _) => None,
                        (true, None) => Some((now, 1)),
                        (true, Some((first, rounds))) => Some((first, rounds + 1)),
                    };
                    let request = requested.then_some(generation);
                    let verdict = machine.observe(&CoexistenceObservation {
                        cleanup_requested: request,
                        ipvs_mode: ipvs,
                        footprint: if present { PRESENT } else { ABSENT },
                        health: health.clone(),
                        observed_at: at(now),
                    });
                    last_clean = None;
                    if verdict.decision == CleanupDecision::Clean {
                        prop_assert!(!ipvs);
                        prop_assert!(!health.kube_proxy_may_run());
                        let confirmed = gone_since.is_some_and(|(first, rounds)| {
                            rounds >= 2 && now - first >= CONFIRMATION.as_millis() as u64
                        });
                        prop_assert!(confirmed, "cleaned before kube-proxy stayed away: {gone_since:?} at {now}");
                        prop_assert!(present, "nothing to clean");
                        prop_assert!(request.is_some(), "cleaning without a request");
                        prop_assert!(
                            !cleaned_generations.contains(&generation),
                            "cleaned twice for generation {generation}"
                        );
                        cleaned_generations.push(generation);
                        last_clean = Some(generation);
                    }
                    if request.is_none() {
                        cleaned_generations.clear();
                    }
                    if verdict.replacement_health_allowed {
                        prop_assert!(!ipvs && health.kube_proxy_has_left());
                    }
                    prop_assert_eq!(verdict.rules_present.status, present || ipvs);
                }
            }
        }
    }
}
