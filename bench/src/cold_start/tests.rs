use super::*;

fn run(gate_open: f64, programmed: f64, peak_rss_mib: f64) -> ColdStart {
    ColdStart {
        gate_open,
        programmed,
        serving: programmed + 0.01,
        rss_mib: peak_rss_mib - 1.0,
        peak_rss_mib,
    }
}

#[test]
fn the_summary_keeps_the_median_and_spread_of_every_figure_over_the_runs() {
    let runs = vec![
        Ok(run(0.5, 0.75, 80.0)),
        Ok(run(0.5, 1.5, 82.0)),
        Err("failed to start the agent".to_string()),
        Ok(run(1.0, 1.5, 81.0)),
    ];
    let mut summary = Summary::default();
    record(&mut summary, 10_000, &runs);
    let find = |metric: &str| summary.find(NAME, SYSTEM, 10_000, metric);
    assert_eq!(find("runs"), Some(3.0));
    assert_eq!(find("failed-to-measure"), Some(1.0));
    assert_eq!(find("programmed-after-gate"), Some(0.5));
    assert_eq!(find("programmed-after-gate-min"), Some(0.25));
    assert_eq!(find("programmed-after-gate-max"), Some(1.0));
    assert_eq!(find("peak-rss"), Some(81.0));
    assert_eq!(find("peak-rss-max"), Some(82.0));
    assert_eq!(find("gate-open-max"), Some(1.0));
}

#[test]
fn the_table_shows_every_run_and_their_medians() {
    let runs = vec![
        Ok(run(0.5, 0.75, 80.0)),
        Err("failed to start the agent".to_string()),
        Ok(run(0.5, 1.25, 82.0)),
    ];
    let text = table(10_000, &runs).render();
    assert!(text.contains("3 runs"), "{text}");
    assert!(text.contains("FAILED: failed to start the agent"), "{text}");
    let all = text
        .lines()
        .find(|line| line.starts_with("| all"))
        .unwrap_or_default();
    assert!(all.contains("0.500 (0.250-0.750)"), "{text}");
    assert!(all.contains("81.0 (80.0-82.0)"), "{text}");
}
