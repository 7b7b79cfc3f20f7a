//! Measurements, their statistics, the printed tables and `summary.json`.
//! Pure: nothing here touches the network or the clock.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::systems::System;

/// One figure of the summary: `{"name","system","scale","metric","value","unit"}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// The benchmark (e.g. `dataplane`, `programming-latency`, `operator-transition`).
    pub name: String,
    /// `switchyard`, `kube-proxy` (with the backend, e.g. `kube-proxy-iptables-legacy`), `direct`.
    pub system: String,
    /// Services or nodes.
    pub scale: u64,
    pub metric: String,
    pub value: f64,
    pub unit: String,
}

/// Every measurement of a run, in the order taken.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    pub measurements: Vec<Measurement>,
}

impl Summary {
    pub fn record(
        &mut self,
        name: &str,
        system: &str,
        scale: u64,
        metric: &str,
        value: f64,
        unit: &str,
    ) {
        self.measurements.push(Measurement {
            name: name.to_string(),
            system: system.to_string(),
            scale,
            metric: metric.to_string(),
            value,
            unit: unit.to_string(),
        });
    }

    /// Records the median of `samples` as `metric`, and their minimum and maximum
    /// as `metric-min` and `metric-max` (the spread across runs).
    pub fn record_runs(
        &mut self,
        name: &str,
        system: &str,
        scale: u64,
        metric: &str,
        samples: &[f64],
        unit: &str,
    ) {
        let Some(spread) = Spread::of(samples) else {
            return;
        };
        self.record(name, system, scale, metric, spread.median, unit);
        self.record(
            name,
            system,
            scale,
            &format!("{metric}-min"),
            spread.min,
            unit,
        );
        self.record(
            name,
            system,
            scale,
            &format!("{metric}-max"),
            spread.max,
            unit,
        );
    }

    pub fn find(&self, name: &str, system: &str, scale: u64, metric: &str) -> Option<f64> {
        self.measurements
            .iter()
            .find(|m| {
                m.name == name && m.system == system && m.scale == scale && m.metric == metric
            })
            .map(|m| m.value)
    }

    /// For a measurement taken in several runs: how many were measured
    /// (`runs`), how many could not be (`failed-to-measure`, when any), and
    /// the median and spread (`record_runs`) of each of `figures` over the
    /// measured ones. Returns the measured runs.
    pub fn record_measured_runs<'a, T>(
        &mut self,
        name: &str,
        system: &str,
        scale: u64,
        runs: &'a [RunResult<T>],
        figures: impl Fn(&T) -> Vec<Figure>,
    ) -> Vec<&'a T> {
        let measured = measured(runs);
        let failed = runs.len() - measured.len();
        if failed > 0 {
            self.record(
                name,
                system,
                scale,
                "failed-to-measure",
                failed as f64,
                "runs",
            );
        }
        if measured.is_empty() {
            return measured;
        }
        self.record(name, system, scale, "runs", measured.len() as f64, "runs");
        for (index, (metric, _, unit)) in figures(measured[0]).into_iter().enumerate() {
            let samples: Vec<f64> = measured.iter().map(|run| figures(run)[index].1).collect();
            self.record_runs(name, system, scale, metric, &samples, unit);
        }
        measured
    }

    /// [`record_measured_runs`](Self::record_measured_runs), and each count that
    /// `totals` adds up over the measured runs (in `unit`), when any was measured.
    #[allow(clippy::too_many_arguments)]
    pub fn record_counted_runs<T, const N: usize>(
        &mut self,
        name: &str,
        system: &str,
        scale: u64,
        runs: &[RunResult<T>],
        figures: impl Fn(&T) -> Vec<Figure>,
        totals: impl Fn(&[&T]) -> [(&'static str, u64); N],
        unit: &str,
    ) {
        let measured = self.record_measured_runs(name, system, scale, runs, figures);
        if measured.is_empty() {
            return;
        }
        for (metric, total) in totals(&measured) {
            self.record(name, system, scale, metric, total as f64, unit);
        }
    }

    /// The median and spread `record_runs` recorded as `metric`.
    pub fn find_runs(&self, name: &str, system: &str, scale: u64, metric: &str) -> Option<Spread> {
        Some(Spread {
            median: self.find(name, system, scale, metric)?,
            min: self.find(name, system, scale, &format!("{metric}-min"))?,
            max: self.find(name, system, scale, &format!("{metric}-max"))?,
        })
    }

    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string_pretty(&self.measurements)
    }
}

/// Says on stdout that run `run` (counting from zero) of `runs` of `what` starts.
pub fn announce_run(what: &str, run: usize, runs: usize) {
    println!("{what} (run {} of {runs})", run + 1);
}

/// One run of a measurement: its figures, or the first line of the error
/// that stopped it.
pub type RunResult<T> = Result<T, String>;

/// The [`RunResult`] of a run of `what`: a failure is logged whole and kept as
/// its first line, which is what a table cell has room for.
pub fn run_result<T>(what: &str, measured: crate::error::Result<T>) -> RunResult<T> {
    measured.map_err(|error| {
        eprintln!("bench: {what}: {error}");
        error.first_line()
    })
}

/// One figure of a run: (summary metric, value, unit).
pub type Figure = (&'static str, f64, &'static str);

/// The runs that were measured.
pub fn measured<T>(runs: &[RunResult<T>]) -> Vec<&T> {
    runs.iter().filter_map(|run| run.as_ref().ok()).collect()
}

/// Table cells with the median (min-max) of each of `figures` over
/// `measured`, each with the decimals `decimals` gives its metric and unit.
pub fn spread_cells<T>(
    measured: &[&T],
    figures: impl Fn(&T) -> Vec<Figure>,
    decimals: impl Fn(&str, &str) -> usize,
) -> Vec<String> {
    let Some(first) = measured.first() else {
        return Vec::new();
    };
    figures(first)
        .into_iter()
        .enumerate()
        .map(|(index, (metric, _, unit))| {
            let samples: Vec<f64> = measured.iter().map(|run| figures(run)[index].1).collect();
            Spread::of(&samples)
                .map(|spread| spread.display(decimals(metric, unit)))
                .unwrap_or_else(|| "-".into())
        })
        .collect()
}

/// Adds a row for each of `runs` (the `label` cells, the run's number, then
/// `run_cells` of it, or why it failed) and, if any run was measured, an "all"
/// row (the `label` cells, "all", then `all_cells` of the measured runs).
pub fn add_run_rows<T>(
    table: &mut Table,
    label: &[String],
    runs: &[RunResult<T>],
    run_cells: impl Fn(&T) -> Vec<String>,
    all_cells: impl Fn(&[&T]) -> Vec<String>,
) {
    for (index, run) in runs.iter().enumerate() {
        let mut cells = label.to_vec();
        cells.push((index + 1).to_string());
        match run {
            Ok(run) => cells.extend(run_cells(run)),
            Err(error) => cells.push(format!("FAILED: {error}")),
        }
        table.row(cells);
    }
    let measured = measured(runs);
    if measured.is_empty() {
        return;
    }
    let mut cells = label.to_vec();
    cells.push("all".to_string());
    cells.extend(all_cells(&measured));
    table.row(cells);
}

/// Why a system has no runs at a scale its data plane run could not serve.
pub const NOT_TRIED_UNSERVABLE: &str =
    "not tried: could not serve this many Services in the data plane run";

/// The rows of a table that compares systems: one "not tried" row for each system
/// its data plane run could not serve, then each tried system's runs and its "all"
/// row (see [`add_run_rows`]), in the order of `systems`.
pub fn add_system_rows<T>(
    table: &mut Table,
    systems: &[System],
    runs: &[Vec<RunResult<T>>],
    not_tried: &[System],
    run_cells: impl Fn(&T) -> Vec<String>,
    all_cells: impl Fn(&[&T]) -> Vec<String>,
) {
    for system in not_tried {
        table.row(vec![
            system.label().to_string(),
            NOT_TRIED_UNSERVABLE.into(),
        ]);
    }
    for (system, runs) in systems.iter().zip(runs) {
        add_run_rows(
            table,
            &[system.label().to_string()],
            runs,
            &run_cells,
            &all_cells,
        );
    }
}

/// Median, minimum and maximum of a few runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// A table cell: the median and (min-max) of `samples`, or "-" without any.
    pub fn cell(samples: &[f64]) -> String {
        Self::of(samples)
            .map(|spread| spread.display(0))
            .unwrap_or_else(|| "-".into())
    }

    pub fn of(samples: &[f64]) -> Option<Self> {
        let mut sorted: Vec<f64> = samples.iter().copied().filter(|v| v.is_finite()).collect();
        if sorted.is_empty() {
            return None;
        }
        sorted.sort_by(f64::total_cmp);
        let middle = sorted.len() / 2;
        let median = if sorted.len() % 2 == 1 {
            sorted[middle]
        } else {
            (sorted[middle - 1] + sorted[middle]) / 2.0
        };
        Some(Self {
            median,
            min: sorted[0],
            max: sorted[sorted.len() - 1],
        })
    }

    /// `12,345 (12,000-12,600)`
    pub fn display(&self, decimals: usize) -> String {
        format!(
            "{} ({}-{})",
            number(self.median, decimals),
            number(self.min, decimals),
            number(self.max, decimals)
        )
    }
}

/// The `quantile` (0..=1) of samples by the nearest-rank method; `None` if empty.
pub fn percentile(sorted: &[u32], quantile: f64) -> Option<u32> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (quantile * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// A number with thousands separators: `12345.6` -> `12,346` (0 decimals).
pub fn number(value: f64, decimals: usize) -> String {
    if !value.is_finite() {
        return "-".to_string();
    }
    let text = format!("{:.*}", decimals, value.abs());
    let (integer, fraction) = match text.split_once('.') {
        Some((integer, fraction)) => (integer.to_string(), Some(fraction.to_string())),
        None => (text.clone(), None),
    };
    let mut grouped = String::new();
    for (index, digit) in integer.chars().enumerate() {
        if index > 0 && (integer.len() - index) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    let sign = if value < 0.0 && value.abs() >= 0.5 * 10f64.powi(-(decimals as i32)) {
        "-"
    } else {
        ""
    };
    match fraction {
        Some(fraction) => format!("{sign}{grouped}.{fraction}"),
        None => format!("{sign}{grouped}"),
    }
}

/// A plain-text table with a header row, columns padded to their widest cell.
pub struct Table {
    pub title: String,
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
    pub notes: Vec<String>,
}

impl Table {
    pub fn new(title: &str, header: &[&str]) -> Self {
        Self {
            title: title.to_string(),
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn note(&mut self, note: &str) {
        self.notes.push(note.to_string());
    }

    /// Markdown-compatible: `| a | b |` lines, so the README can quote it as is.
    pub fn render(&self) -> String {
        let columns = self.header.len();
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (column, cell) in row.iter().enumerate().take(columns) {
                widths[column] = widths[column].max(cell.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let mut text = String::from("|");
            for (column, width) in widths.iter().enumerate() {
                let cell = cells.get(column).map(String::as_str).unwrap_or("");
                let padding = width - cell.chars().count();
                // Numbers right-aligned, words left-aligned.
                if column > 0 && cell.starts_with(|c: char| c.is_ascii_digit() || c == '-') {
                    let _ = write!(text, " {}{} |", " ".repeat(padding), cell);
                } else {
                    let _ = write!(text, " {}{} |", cell, " ".repeat(padding));
                }
            }
            text
        };
        let mut text = format!("\n### {}\n\n", self.title);
        text.push_str(&line(&self.header));
        text.push('\n');
        text.push('|');
        for width in &widths {
            let _ = write!(text, "{}|", "-".repeat(width + 2));
        }
        text.push('\n');
        for row in &self.rows {
            text.push_str(&line(row));
            text.push('\n');
        }
        for note in &self.notes {
            let _ = writeln!(text, "\n{note}");
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_run_gets_a_row_with_its_number_or_its_failure_and_the_measured_ones_an_all_row() {
        let mut table = Table::new("runs", &["system", "run", "value"]);
        let runs: Vec<RunResult<f64>> = vec![Ok(3.0), Err("no answer".into()), Ok(5.0)];
        add_run_rows(
            &mut table,
            &["switchyard".to_string()],
            &runs,
            |value| vec![value.to_string()],
            |measured| vec![measured.iter().copied().sum::<f64>().to_string()],
        );
        assert_eq!(
            table.rows,
            [
                ["switchyard", "1", "3"].as_slice(),
                &["switchyard", "2", "FAILED: no answer"],
                &["switchyard", "3", "5"],
                &["switchyard", "all", "8"],
            ]
            .map(|row| row.iter().map(|cell| cell.to_string()).collect::<Vec<_>>())
        );

        let mut none_measured = Table::new("runs", &["run", "value"]);
        let failed: Vec<RunResult<f64>> = vec![Err("no answer".into())];
        add_run_rows(
            &mut none_measured,
            &[],
            &failed,
            |_| unreachable!("no run was measured"),
            |_| unreachable!("no run was measured"),
        );
        assert_eq!(none_measured.rows, [["1", "FAILED: no answer"]]);
    }

    #[test]
    fn the_spread_of_three_runs_is_their_median_minimum_and_maximum() {
        let spread = Spread::of(&[30.0, 10.0, 20.0]).expect("three samples");
        assert_eq!((spread.median, spread.min, spread.max), (20.0, 10.0, 30.0));
        let even = Spread::of(&[4.0, 1.0, 2.0, 3.0]).expect("four samples");
        assert_eq!(even.median, 2.5);
        assert_eq!(Spread::of(&[]), None);
        assert_eq!(Spread::of(&[f64::NAN]), None);
    }

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let samples: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile(&samples, 0.5), Some(50));
        assert_eq!(percentile(&samples, 0.99), Some(99));
        assert_eq!(percentile(&samples, 1.0), Some(100));
        assert_eq!(percentile(&samples, 0.0), Some(1));
        assert_eq!(percentile(&[7], 0.99), Some(7));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn numbers_get_thousands_separators_and_the_asked_decimals() {
        assert_eq!(number(12345.6, 0), "12,346");
        assert_eq!(number(1234567.891, 2), "1,234,567.89");
        assert_eq!(number(999.0, 0), "999");
        assert_eq!(number(-1500.0, 0), "-1,500");
        assert_eq!(number(f64::NAN, 0), "-");
    }

    #[test]
    fn a_summary_serializes_as_a_flat_list_with_the_six_fields() {
        let mut summary = Summary::default();
        summary.record_runs(
            "dataplane",
            "direct",
            100,
            "connections-per-second",
            &[3.0, 1.0, 2.0],
            "1/s",
        );
        let json: serde_json::Value =
            serde_json::from_str(&summary.to_json().expect("serializes")).expect("parses");
        let list = json.as_array().expect("a list");
        assert_eq!(list.len(), 3);
        for entry in list {
            let object = entry.as_object().expect("an object");
            let mut keys: Vec<&str> = object.keys().map(String::as_str).collect();
            keys.sort();
            assert_eq!(keys, ["metric", "name", "scale", "system", "unit", "value"]);
        }
        assert_eq!(
            summary.find("dataplane", "direct", 100, "connections-per-second-max"),
            Some(3.0)
        );
    }

    #[test]
    fn a_table_pads_every_column_to_its_widest_cell() {
        let mut table = Table::new("t", &["system", "rate"]);
        table.row(vec!["direct".into(), "40,000".into()]);
        table.row(vec!["kube-proxy".into(), "9".into()]);
        let text = table.render();
        assert!(text.contains("| direct     | 40,000 |"), "{text}");
        assert!(text.contains("| kube-proxy |      9 |"), "{text}");
    }

    #[test]
    fn runs_that_failed_are_counted_apart_and_the_rest_summarised_figure_by_figure() {
        let runs: Vec<RunResult<(f64, f64)>> = vec![
            Ok((1.0, 10.0)),
            Err("failed".into()),
            Ok((3.0, 30.0)),
            Ok((2.0, 20.0)),
        ];
        let figures = |run: &(f64, f64)| vec![("first", run.0, "s"), ("second", run.1, "MiB")];
        let mut summary = Summary::default();
        let measured = summary.record_measured_runs("name", "system", 1, &runs, figures);
        assert_eq!(measured.len(), 3);
        let find = |metric: &str| summary.find("name", "system", 1, metric);
        assert_eq!(find("runs"), Some(3.0));
        assert_eq!(find("failed-to-measure"), Some(1.0));
        assert_eq!(find("first"), Some(2.0));
        assert_eq!(find("second-max"), Some(30.0));
        assert_eq!(
            summary.find_runs("name", "system", 1, "second"),
            Some(Spread {
                median: 20.0,
                min: 10.0,
                max: 30.0
            })
        );
        let cells = spread_cells(&measured, figures, |_, unit| usize::from(unit == "s"));
        assert_eq!(cells, vec!["2.0 (1.0-3.0)", "20 (10-30)"]);
        assert!(spread_cells(&[], figures, |_, _| 0).is_empty());
    }
}
