//! The pod runner's event log: one JSON object a line, appended for every
//! process started, signalled or seen exiting, so tests can prove the order
//! of what happened (e.g. that a replacement started after the old exited).

use std::collections::BTreeMap;
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

/// The processes that run now (started, not yet exited), keyed by pod UID,
/// for events of one container name.
pub fn running_processes(events: &[RunnerEvent], container: &str) -> BTreeMap<String, RunnerEvent> {
    let mut running = BTreeMap::new();
    for event in events.iter().filter(|event| event.container == container) {
        match event.kind {
            EventKind::Started => {
                running.insert(event.pod_uid.clone(), event.clone());
            }
            EventKind::Exited | EventKind::StartFailed => {
                running.remove(&event.pod_uid);
            }
            EventKind::Terminating | EventKind::Killed => {}
        }
    }
    running
}

/// How a process was replaced: the old one's exit and the new one's start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replacement {
    pub exited: RunnerEvent,
    pub started: RunnerEvent,
}

impl Replacement {
    /// Whether the new process started only after the old one had exited.
    pub fn is_ordered(&self) -> bool {
        self.exited.at_unix_ms <= self.started.at_unix_ms
    }
}

/// The replacement of the process of pod `old_uid`: its exit, and the first
/// start of another pod's process of the same container on `node` (any node
/// for `None`) at or after `since` (milliseconds since the epoch).
pub fn find_replacement(
    events: &[RunnerEvent],
    old_uid: &str,
    container: &str,
    node: Option<&str>,
    since: u64,
) -> Option<Replacement> {
    let exited = events.iter().find(|event| {
        event.pod_uid == old_uid && event.container == container && event.kind == EventKind::Exited
    })?;
    let started = events.iter().find(|event| {
        event.kind == EventKind::Started
            && event.container == container
            && event.pod_uid != old_uid
            && event.at_unix_ms >= since
            && node.is_none_or(|node| event.node == node)
    })?;
    Some(Replacement {
        exited: exited.clone(),
        started: started.clone(),
    })
}

#[cfg(test)]
mod tests;
