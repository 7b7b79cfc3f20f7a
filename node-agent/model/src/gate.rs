//! The start-of-day gate: the agent writes nothing to the maps until it knows
//! everything the desired state depends on.
//!
//! Felix once built its Service maps before it knew the host's addresses, and the
//! first apply erased every NodePort entry of the previous process (RSTs for
//! seconds after each restart). Cilium prunes only after all its sources report
//! initialised. Here a partial view is never written: until every input below has
//! arrived, the previous process's entries keep serving untouched (no write, no
//! prune), and the inputs still missing can be reported by name.
//!
//! Pure state machine; time is passed in, so tests never sleep.

use std::collections::BTreeSet;
use std::fmt;
use std::time::{Duration, Instant};

/// One thing the gate waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GateInput {
    /// The pinned maps' current entries have been read.
    RestoredMaps,
    /// The first set of host addresses (NodePorts are served on them).
    HostAddresses,
    /// This node's Node object.
    Node,
    /// The initial list of Services.
    Services,
    /// The initial list of EndpointSlices.
    EndpointSlices,
    /// Whether this node's DataplaneNode exists (and its spec if it does).
    DataplaneNode,
}

impl GateInput {
    pub const ALL: [GateInput; 6] = [
        GateInput::RestoredMaps,
        GateInput::HostAddresses,
        GateInput::Node,
        GateInput::Services,
        GateInput::EndpointSlices,
        GateInput::DataplaneNode,
    ];

    /// The name status reports use.
    pub fn name(self) -> &'static str {
        match self {
            GateInput::RestoredMaps => "restored maps",
            GateInput::HostAddresses => "host addresses",
            GateInput::Node => "Node",
            GateInput::Services => "Services",
            GateInput::EndpointSlices => "EndpointSlices",
            GateInput::DataplaneNode => "DataplaneNode",
        }
    }
}

impl fmt::Display for GateInput {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.name())
    }
}

/// Proof that the gate is open, required by `Syncer::sync`: only [`Gate::open`]
/// makes one, so no code path can write the maps before the gate opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GateOpen {
    _private: (),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GateStatus {
    Open {
        /// How long the gate stayed closed.
        waited: Duration,
    },
    /// Still closed, within the timeout.
    Waiting { missing: Vec<GateInput> },
    /// Still closed past the timeout: reported (`HostMetadataTimeout`), and the
    /// agent keeps waiting; it never writes a partial view.
    TimedOut {
        missing: Vec<GateInput>,
        waited: Duration,
    },
}

impl GateStatus {
    /// "host addresses, Node": the missing inputs for a status message.
    pub fn missing_names(&self) -> String {
        match self {
            GateStatus::Open { .. } => String::new(),
            GateStatus::Waiting { missing } | GateStatus::TimedOut { missing, .. } => missing
                .iter()
                .map(|input| input.name())
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Gate {
    started_at: Instant,
    timeout: Duration,
    received: BTreeSet<GateInput>,
    opened_at: Option<Instant>,
}

impl Gate {
    pub fn new(now: Instant, timeout: Duration) -> Self {
        Self {
            started_at: now,
            timeout,
            received: BTreeSet::new(),
            opened_at: None,
        }
    }

    /// Records an input; returns true when this input opened the gate. Once open,
    /// the gate stays open: later inputs are updates, not first answers.
    pub fn receive(&mut self, input: GateInput, now: Instant) -> bool {
        self.received.insert(input);
        if self.opened_at.is_none() && self.missing().is_empty() {
            self.opened_at = Some(now);
            return true;
        }
        false
    }

    pub fn missing(&self) -> Vec<GateInput> {
        GateInput::ALL
            .into_iter()
            .filter(|input| !self.received.contains(input))
            .collect()
    }

    pub fn is_open(&self) -> bool {
        self.opened_at.is_some()
    }

    /// The permission to write, if the gate is open.
    pub fn open(&self) -> Option<GateOpen> {
        self.opened_at.map(|_| GateOpen { _private: () })
    }

    pub fn status(&self, now: Instant) -> GateStatus {
        if let Some(opened_at) = self.opened_at {
            return GateStatus::Open {
                waited: opened_at.saturating_duration_since(self.started_at),
            };
        }
        let waited = now.saturating_duration_since(self.started_at);
        let missing = self.missing();
        if waited >= self.timeout {
            GateStatus::TimedOut { missing, waited }
        } else {
            GateStatus::Waiting { missing }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(30);

    #[test]
    fn the_gate_stays_closed_until_every_input_arrived_in_any_order() {
        let start = Instant::now();
        let mut inputs = GateInput::ALL;
        inputs.reverse();
        let mut gate = Gate::new(start, TIMEOUT);
        for (index, input) in inputs.iter().enumerate() {
            assert!(!gate.is_open());
            assert_eq!(gate.open(), None);
            let opened = gate.receive(*input, start + Duration::from_secs(index as u64));
            assert_eq!(opened, index == inputs.len() - 1);
        }
        assert!(gate.open().is_some());
        assert_eq!(
            gate.status(start + Duration::from_secs(100)),
            GateStatus::Open {
                waited: Duration::from_secs(5)
            }
        );
    }

    #[test]
    fn the_missing_inputs_are_reported_by_name() {
        let start = Instant::now();
        let mut gate = Gate::new(start, TIMEOUT);
        gate.receive(GateInput::RestoredMaps, start);
        gate.receive(GateInput::Services, start);
        gate.receive(GateInput::EndpointSlices, start);
        gate.receive(GateInput::DataplaneNode, start);
        let status = gate.status(start + Duration::from_secs(1));
        assert_eq!(
            status,
            GateStatus::Waiting {
                missing: vec![GateInput::HostAddresses, GateInput::Node]
            }
        );
        assert_eq!(status.missing_names(), "host addresses, Node");
    }

    #[test]
    fn a_gate_closed_past_its_timeout_reports_it_and_keeps_waiting() {
        let start = Instant::now();
        let mut gate = Gate::new(start, TIMEOUT);
        for input in GateInput::ALL {
            if input != GateInput::Node {
                gate.receive(input, start);
            }
        }
        let late = start + TIMEOUT + Duration::from_secs(1);
        assert_eq!(
            gate.status(late),
            GateStatus::TimedOut {
                missing: vec![GateInput::Node],
                waited: TIMEOUT + Duration::from_secs(1)
            }
        );
        assert_eq!(gate.open(), None, "a timeout never opens the gate");
        assert!(gate.receive(GateInput::Node, late));
        assert!(gate.is_open());
    }

    #[test]
    fn an_input_received_twice_counts_once_and_the_open_gate_stays_open() {
        let start = Instant::now();
        let mut gate = Gate::new(start, TIMEOUT);
        for _ in 0..3 {
            gate.receive(GateInput::Services, start);
        }
        assert_eq!(gate.missing().len(), GateInput::ALL.len() - 1);
        for input in GateInput::ALL {
            gate.receive(input, start);
        }
        assert!(!gate.receive(GateInput::Services, start), "opens only once");
        assert!(gate.is_open());
    }
}
