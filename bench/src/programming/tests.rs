use super::*;

#[test]
fn changes_go_to_distinct_tcp_services() {
    let mut counter = ChangeCounter::default();
    let picked: Vec<u32> = (0..500).map(|_| counter.next_service(10_000)).collect();
    let mut unique = picked.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), picked.len());
    assert!(picked.iter().all(|index| index % 2 == 0 && *index < 10_000));
}

fn run_of(milliseconds: &[u64], missed: usize) -> ProgrammingRun {
    let samples: Vec<Duration> = milliseconds
        .iter()
        .map(|ms| Duration::from_millis(*ms))
        .collect();
    ProgrammingRun::new(&samples, missed)
}

#[test]
fn a_run_counts_missed_changes_as_over_the_goal_and_leaves_them_out_of_the_percentiles() {
    let run = run_of(&[5, 7, 9, 150], 2);
    assert_eq!(run.changes, 6);
    assert_eq!(run.over_goal, 3);
    assert_eq!(run.missed, 2);
    assert_eq!(run.p50, 7.0);
    assert_eq!(run.max, 150.0);
}

#[test]
fn the_summary_and_table_give_every_run_and_the_median_of_the_runs() {
    let runs = vec![
        Ok(run_of(&[5, 10], 0)),
        Err("failed to start the agent".to_string()),
        Ok(run_of(&[7, 30], 1)),
    ];
    let mut summary = Summary::default();
    record(&mut summary, "switchyard", 10_000, &runs);
    let find = |metric: &str| summary.find(NAME, "switchyard", 10_000, metric);
    assert_eq!(find("runs"), Some(2.0));
    assert_eq!(find("failed-to-measure"), Some(1.0));
    assert_eq!(find("changes"), Some(5.0));
    assert_eq!(find("missed"), Some(1.0));
    assert_eq!(find("p99"), Some(20.0));
    assert_eq!(find("p99-max"), Some(30.0));
    let plan = Plan::from_arguments(&["--quick"]);
    let text = table(&plan, 10_000, &[System::Switchyard], &[runs], &[]).render();
    assert!(text.contains("FAILED: failed to start the agent"), "{text}");
    let all = text
        .lines()
        .find(|line| line.contains("| all"))
        .unwrap_or_default();
    assert!(all.contains("20.0 (10.0-30.0)"), "{text}");
}
