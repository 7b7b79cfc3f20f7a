use super::*;

fn tc_cost(program: &str, runs: u64, run_time_ns: u64, operations: u64) -> ProgramCost {
    ProgramCost {
        program: program.into(),
        tc: true,
        runs,
        run_time_ns,
        runs_per_operation: runs as f64 / operations as f64,
        ns_per_run: (runs > 0).then(|| run_time_ns as f64 / runs as f64),
        ns_per_operation: run_time_ns as f64 / operations as f64,
        verified_instructions: 1,
    }
}

fn kind(operations: u64, seconds: f64, costs: Vec<ProgramCost>) -> KindRound {
    KindRound {
        operations,
        seconds,
        costs,
    }
}

/// Two rounds: connections with ranges at 95% and 99% of without; fragmented
/// requests' packets at 110% and 100% of whole ones' TC time per packet.
fn samples() -> Samples {
    let round = |with: u64, fragment_ns: u64| {
        [
            kind(
                with,
                1.0,
                vec![tc_cost("sy_ingress_pod", 4_000, 2_000_000, 1_000)],
            ),
            kind(
                10_000,
                1.0,
                vec![tc_cost("sy_ingress_pod", 2_000, 800_000, 1_000)],
            ),
            kind(
                5_000,
                1.0,
                vec![tc_cost("sy_egress", 2_000, 400_000, 1_000)],
            ),
            kind(
                2_000,
                1.0,
                vec![tc_cost("sy_egress", 4_000, fragment_ns, 1_000)],
            ),
        ]
    };
    Samples {
        rounds: vec![round(9_500, 880_000), round(9_900, 800_000)],
        failures: 0,
        error: None,
    }
}

#[test]
fn each_rounds_rate_with_ranges_is_paired_with_the_rate_without_of_the_same_round() {
    let ratios = samples().ratios(Kind::WithRanges, Kind::WithoutRanges, rate);
    let rounded: Vec<f64> = ratios.iter().map(|ratio| ratio.round()).collect();
    assert_eq!(rounded, [95.0, 99.0]);
}

#[test]
fn fragmented_requests_are_judged_on_the_tc_programs_time_per_packet() {
    // Whole: 400,000 ns over 2,000 runs = 200 ns; fragmented 880,000 / 4,000 = 220 ns.
    let ratios = samples().ratios(Kind::UdpFragmented, Kind::UdpWhole, tc_ns_per_packet);
    let rounded: Vec<f64> = ratios.iter().map(|ratio| ratio.round()).collect();
    assert_eq!(rounded, [110.0, 100.0]);
    assert_eq!(
        samples().per_round(Kind::UdpFragmented, tc_packets_per_operation),
        [4.0, 4.0]
    );
}

#[test]
fn a_kind_without_statistics_or_time_has_no_figure_and_no_ratio() {
    let mut samples = samples();
    samples.rounds[0][index_of(Kind::WithoutRanges)] = KindRound::default();
    assert_eq!(samples.per_round(Kind::WithoutRanges, rate), [10_000.0]);
    assert_eq!(
        samples
            .ratios(Kind::WithRanges, Kind::WithoutRanges, rate)
            .len(),
        1
    );
    assert_eq!(ns_per_operation(&KindRound::default()), None);
}

fn settings() -> ParityCostSettings {
    ParityCostSettings {
        services: 10_000,
        load_balancers: 50,
        rounds: 2,
        slices: 1,
        slice_duration: Duration::from_millis(300),
    }
}

#[test]
fn the_summary_holds_the_same_round_ratios_and_a_failed_configuration_as_not_measured() {
    let failed = Samples {
        error: Some("failed to see switchyard-tc-only serve".into()),
        ..Samples::default()
    };
    let mut summary = Summary::default();
    record(&settings(), &[samples(), failed], &mut summary);
    let ratio = summary
        .find_runs(NAME, "switchyard", 10_000, RANGES_OVER_WITHOUT)
        .expect("recorded");
    assert_eq!((ratio.min.round(), ratio.max.round()), (95.0, 99.0));
    assert_eq!(
        summary.find(
            NAME,
            "switchyard",
            10_000,
            "program-ns-per-connection-with-source-ranges"
        ),
        Some(2_000.0)
    );
    assert_eq!(
        summary.find(NAME, "switchyard-tc-only", 10_000, "failed-to-measure"),
        Some(1.0)
    );
    assert_eq!(
        summary.find(NAME, "switchyard-tc-only", 10_000, RANGES_OVER_WITHOUT),
        None
    );
}

#[test]
fn only_services_with_ranges_carry_them_and_the_client_is_inside_them() {
    let [ranged, slice] = load_balancer_objects(0, true);
    let ranges = ranged["spec"]["loadBalancerSourceRanges"]
        .as_array()
        .expect("ranges");
    assert_eq!(ranges.len(), 8);
    assert!(ranges.contains(&serde_json::json!("10.244.0.100/32")));
    assert_eq!(
        ranged["status"]["loadBalancer"]["ingress"][0]["ip"],
        "10.97.0.1"
    );
    assert_eq!(
        slice["metadata"]["labels"]["kubernetes.io/service-name"],
        "bench-lb-0"
    );
    let [unranged, _] = load_balancer_objects(50, false);
    assert!(unranged["spec"].get("loadBalancerSourceRanges").is_none());
    assert_eq!(
        unranged["status"]["loadBalancer"]["ingress"][0]["ip"],
        "10.97.0.51"
    );
    // ClusterIPs above the data plane's 30,000 Services, in the service range.
    assert_eq!(
        unranged["spec"]["clusterIP"],
        service_address(60_050).to_string()
    );
}

#[test]
fn the_table_shows_both_ratios_and_a_failed_configuration() {
    let failed = Samples {
        error: Some("no".into()),
        ..Samples::default()
    };
    let text = table(&settings(), &[samples(), failed]).render();
    let line = |system: &str| {
        text.lines()
            .find(|line| line.starts_with(&format!("| {system} ")))
            .unwrap_or_default()
            .to_string()
    };
    assert!(line("switchyard").contains("97.0% (95.0-99.0%)"), "{text}");
    assert!(
        line("switchyard").contains("105.0% (100.0-110.0%)"),
        "{text}"
    );
    assert!(line("switchyard-tc-only").contains("FAILED: no"), "{text}");
}

#[test]
fn each_pair_comes_first_as_often_as_the_other_over_rounds_and_slices() {
    assert_eq!(slice_order(0, 0), [0, 1, 2, 3]);
    assert_eq!(slice_order(0, 1), [1, 0, 3, 2]);
    // One slice per round (quick runs): the order still alternates by round.
    assert_eq!(slice_order(1, 0), [1, 0, 3, 2]);
    assert_eq!(slice_order(2, 0), [0, 1, 2, 3]);
}
