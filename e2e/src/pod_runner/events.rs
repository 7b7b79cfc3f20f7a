//! The pod runner's event log: one JSON object a line, appended for every
//! process started, signalled or seen exiting, so tests can prove the order
//! of what happened (e.g. that a replacement started after the old exited).

use std::io::Write;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::error::{E2eError, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Started,
    StartFailed,
    Terminating,
    Killed,
    Exited,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunnerEvent {
    /// Wall-clock time in milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
    pub kind: EventKind,
    pub namespace: String,
    pub pod: String,
    pub pod_uid: String,
    pub container: String,
    pub node: String,
    pub pid: Option<u32>,
    pub detail: Option<String>,
}

pub fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as u64)
        .unwrap_or(0)
}

pub fn append_event(path: &Path, event: &RunnerEvent) -> Result<()> {
    let mut line = serde_json::to_string(event).map_err(|error| E2eError::WriteFile {
        path: path.to_path_buf(),
        source: std::io::Error::other(error),
    })?;
    line.push('\n');
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut file| file.write_all(line.as_bytes()))
        .map_err(|source| E2eError::WriteFile {
            path: path.to_path_buf(),
            source,
        })
}

/// Every event in the log; a missing log is an empty one. A torn last line
/// (the runner was writing it) is skipped.
pub fn read_events(path: &Path) -> Result<Vec<RunnerEvent>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(E2eError::ReadFile {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    Ok(text
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_through_the_log_and_a_torn_line_is_skipped() {
        let path = std::env::temp_dir().join(format!("sy-e2e-events-{}.jsonl", std::process::id()));
        let _ = std::fs::remove_file(&path);
        assert!(read_events(&path).unwrap().is_empty());
        let event = RunnerEvent {
            at_unix_ms: 5,
            kind: EventKind::Started,
            namespace: "kube-system".into(),
            pod: "kube-proxy-x".into(),
            pod_uid: "u".into(),
            container: "kube-proxy".into(),
            node: "node-1".into(),
            pid: Some(42),
            detail: None,
        };
        append_event(&path, &event).unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut file| file.write_all(b"{\"at_unix_ms\": 6, \"ki"))
            .unwrap();
        let events = read_events(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(events, vec![event]);
    }
}
