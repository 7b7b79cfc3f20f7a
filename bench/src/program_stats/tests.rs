use super::*;

fn reading(name: &str, tc: bool, run_time_ns: u64, run_count: u64) -> ProgramReading {
    ProgramReading {
        name: name.into(),
        tc,
        run_time_ns,
        run_count,
        verified_instructions: 1_000,
    }
}

#[test]
fn each_programs_runs_and_time_in_the_window_are_divided_by_the_connections_made() {
    let before = [
        reading("sy_connect4", false, 1_000, 10),
        reading("sy_ingress_pod", true, 50_000, 100),
    ];
    let after = [
        reading("sy_connect4", false, 201_000, 1_010),
        reading("sy_ingress_pod", true, 2_050_000, 4_100),
    ];
    let costs = costs(&before, &after, 1_000).expect("connections were made");
    let connect = &costs[0];
    assert_eq!(connect.program, "sy_connect4");
    assert_eq!(connect.runs, 1_000);
    assert_eq!(connect.runs_per_operation, 1.0);
    assert_eq!(connect.ns_per_run, Some(200.0));
    assert_eq!(connect.ns_per_operation, 200.0);
    let ingress = &costs[1];
    assert_eq!(ingress.runs_per_operation, 4.0);
    assert_eq!(ingress.ns_per_run, Some(500.0));
    assert_eq!(ingress.ns_per_operation, 2_000.0);
    assert_eq!(total_ns_per_operation(&costs), 2_200.0);
    // Only the TC program's runs are packets: 2,000,000 ns over 4,000 runs.
    assert_eq!(tc_ns_per_packet(&costs), Some(500.0));
}

#[test]
fn a_window_without_connections_has_no_cost_per_connection() {
    let readings = [reading("sy_egress", true, 5, 1)];
    assert_eq!(costs(&readings, &readings, 0), None);
}

#[test]
fn a_program_that_did_not_run_has_no_time_per_run_and_adds_nothing() {
    let readings = [reading("sy_getpeername4", false, 7, 3)];
    let costs = costs(&readings, &readings, 10).expect("connections were made");
    assert_eq!(costs[0].ns_per_run, None);
    assert_eq!(costs[0].ns_per_operation, 0.0);
    assert_eq!(tc_ns_per_packet(&costs), None);
}

#[test]
fn a_program_loaded_again_or_missing_from_a_reading_is_left_out() {
    let before = [
        reading("sy_egress", true, 9_000, 90),
        reading("sy_connect4", false, 0, 0),
    ];
    // sy_egress's counters went down (a new program under the old name);
    // sy_ingress_host was not there before.
    let after = [
        reading("sy_egress", true, 10, 1),
        reading("sy_ingress_host", true, 10, 1),
        reading("sy_connect4", false, 300, 3),
    ];
    let costs = costs(&before, &after, 3).expect("connections were made");
    let names: Vec<&str> = costs.iter().map(|cost| cost.program.as_str()).collect();
    assert_eq!(names, ["sy_connect4"]);
}

#[test]
fn the_kernels_program_info_has_its_fields_where_linux_bpf_h_puts_them() {
    assert_eq!(std::mem::offset_of!(ProgramInfo, name), 64);
    assert_eq!(std::mem::offset_of!(ProgramInfo, btf_id), 128);
    assert_eq!(std::mem::offset_of!(ProgramInfo, run_time_ns), 192);
    assert_eq!(std::mem::offset_of!(ProgramInfo, run_cnt), 200);
    assert_eq!(std::mem::offset_of!(ProgramInfo, verified_insns), 216);
    assert_eq!(std::mem::size_of::<ProgramInfo>(), 232);
}

fn cost(program: &str, ns_per_operation: f64, runs: u64) -> ProgramCost {
    ProgramCost {
        program: program.into(),
        tc: true,
        runs,
        run_time_ns: 0,
        runs_per_operation: runs as f64 / 100.0,
        ns_per_run: (runs > 0).then_some(ns_per_operation * 100.0 / runs as f64),
        ns_per_operation,
        verified_instructions: 4_242,
    }
}

fn samples() -> Samples {
    Samples {
        connection: vec![
            vec![
                cost("sy_egress", 1_000.0, 200),
                cost("sy_ingress_pod", 3_000.0, 300),
            ],
            vec![
                cost("sy_egress", 1_200.0, 200),
                cost("sy_ingress_pod", 2_800.0, 300),
            ],
            vec![
                cost("sy_egress", 1_100.0, 200),
                cost("sy_ingress_pod", 3_300.0, 300),
            ],
        ],
        udp: vec![vec![
            cost("sy_egress", 500.0, 200),
            cost("sy_sendmsg4", 0.0, 0),
        ]],
        error: None,
    }
}

#[test]
fn the_summary_holds_each_rounds_total_per_connection_as_median_and_spread() {
    let mut summary = Summary::default();
    record("switchyard", 10_000, &samples(), &mut summary);
    let total = summary
        .find_runs(NAME, "switchyard", 10_000, "ns-per-connection")
        .expect("recorded");
    assert_eq!(
        (total.median, total.min, total.max),
        (4_000.0, 4_000.0, 4_400.0)
    );
    let egress = summary
        .find_runs(NAME, "switchyard", 10_000, "sy_egress-ns-per-connection")
        .expect("recorded");
    assert_eq!(egress.median, 1_100.0);
    assert_eq!(
        summary.find(
            NAME,
            "switchyard",
            10_000,
            "sy_egress-verified-instructions"
        ),
        Some(4_242.0)
    );
    assert_eq!(
        summary.find(NAME, "switchyard", 10_000, "ns-per-udp-request"),
        Some(500.0)
    );
    // A program that never ran is not a row of its own.
    assert_eq!(
        summary.find(NAME, "switchyard", 10_000, "sy_sendmsg4-ns-per-run"),
        None
    );
}

#[test]
fn statistics_that_could_not_be_read_are_recorded_as_not_measured() {
    let mut summary = Summary::default();
    let failed = Samples {
        error: Some("failed to turn on the statistics".into()),
        ..samples()
    };
    record("switchyard-tc-only", 100, &failed, &mut summary);
    assert_eq!(
        summary.find(NAME, "switchyard-tc-only", 100, "failed-to-measure"),
        Some(1.0)
    );
    assert_eq!(
        summary.find(NAME, "switchyard-tc-only", 100, "ns-per-connection"),
        None
    );
}

#[test]
fn the_table_shows_a_row_per_program_that_ran_and_the_total() {
    let measured = samples();
    let text = table(10_000, &[("switchyard", &measured)]).render();
    let line = |program: &str| {
        text.lines()
            .find(|line| line.contains(&format!("| {program} ")))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        line("sy_ingress_pod").contains("3,000 (2,800-3,300)"),
        "{text}"
    );
    assert!(line("sy_ingress_pod").contains("4,242"), "{text}");
    assert!(
        line("all programs").contains("4,000 (4,000-4,400)"),
        "{text}"
    );
    assert!(line("sy_sendmsg4").is_empty(), "{text}");
}
