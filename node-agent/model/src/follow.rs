//! Following the DataplaneNode's mode: when to attach, drain and detach. Pure;
//! shared by standalone and cluster mode. The mode and its spec are this
//! crate's own small types ([`Mode`], [`ModeSpec`]): the agent maps the
//! DataplaneNode CRD onto them, so that nothing of kube sits beneath the core.
//!
//! `Ebpf`: programs attached, config `ACTIVE`. `KubeProxy` after `Ebpf`: the
//! programs are not pulled at once (that would break every connection they
//! translate): config `DRAINING` keeps translating flows already in Switchyard's
//! conntrack and passes new ones to kube-proxy's rules; the agent detaches once no
//! live TCP flow is left or the drain timeout has passed. `KubeProxy` from the
//! start: nothing attached. Maps are kept in sync in every mode, so switching to
//! `Ebpf` is instant.
//!
//! A detach that fails on some interface leaves the node `Detaching`: reporting
//! it detached would hide programs still translating there, so the interfaces
//! left are retried every round until none is.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use switchyard_common::{DATAPATH_MODE_ACTIVE, DATAPATH_MODE_DRAINING};

/// Which dataplane serves the node's Services.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    Ebpf,
    KubeProxy,
}

/// The drain timeout a DataplaneNode has when its spec does not say (the CRD's
/// default; the agent checks that the two agree in a test).
pub const DEFAULT_DRAIN_TIMEOUT_SECONDS: i64 = 600;

/// What the agent follows of a DataplaneNode's spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModeSpec {
    pub mode: Mode,
    pub drain_timeout_seconds: i64,
}

impl ModeSpec {
    /// `mode` with the default drain timeout.
    pub fn new(mode: Mode) -> Self {
        Self {
            mode,
            drain_timeout_seconds: DEFAULT_DRAIN_TIMEOUT_SECONDS,
        }
    }

    pub fn drain_timeout(&self) -> Duration {
        Duration::from_secs(u64::try_from(self.drain_timeout_seconds).unwrap_or(0))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attachment {
    Detached,
    Attached,
    Draining {
        since: Instant,
    },
    /// The drain ended but some interfaces could not be detached; they are
    /// retried every round (the caller keeps which ones).
    Detaching,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeAction {
    /// Write config `ACTIVE` and attach (idempotent) on every interface.
    Activate,
    /// Write config `DRAINING`.
    StartDraining,
    /// Remove the programs from every interface (from `Detaching`: from the
    /// interfaces left); keep the maps. The state after it is `Detached` only
    /// if every detach succeeded ([`DetachRound::attachment`]).
    Detach,
}

/// The next attachment state and what to do to get there.
pub fn follow_mode(
    current: Attachment,
    mode: Mode,
    drain_timeout: Duration,
    live_tcp_flows: Option<usize>,
    now: Instant,
) -> (Attachment, Option<ModeAction>) {
    match (mode, current) {
        (Mode::Ebpf, Attachment::Attached) => (current, None),
        (Mode::Ebpf, _) => (Attachment::Attached, Some(ModeAction::Activate)),
        (Mode::KubeProxy, Attachment::Detached) => (current, None),
        (Mode::KubeProxy, Attachment::Attached) => (
            Attachment::Draining { since: now },
            Some(ModeAction::StartDraining),
        ),
        (Mode::KubeProxy, Attachment::Draining { since }) => {
            let drained = live_tcp_flows == Some(0);
            let timed_out = now.saturating_duration_since(since) >= drain_timeout;
            if drained || timed_out {
                (Attachment::Detached, Some(ModeAction::Detach))
            } else {
                (current, None)
            }
        }
        (Mode::KubeProxy, Attachment::Detaching) => {
            (Attachment::Detached, Some(ModeAction::Detach))
        }
    }
}

/// The attachment a starting agent finds: `attached` says whether a previous
/// process left programs on some interface, `config_mode` is the config entry's
/// mode (`None`: never written).
///
/// Programs attached but never activated (a process that died between
/// attaching and writing `ACTIVE`) count as `Detached`: they never served, so
/// the node is activated as if nothing were attached (attaching again keeps
/// the links) instead of being taken for a node already serving, which would
/// leave the config inactive and the Services untranslated.
pub fn restored_attachment(attached: bool, config_mode: Option<u32>, now: Instant) -> Attachment {
    if !attached {
        return Attachment::Detached;
    }
    match config_mode {
        Some(DATAPATH_MODE_ACTIVE) => Attachment::Attached,
        Some(DATAPATH_MODE_DRAINING) => Attachment::Draining { since: now },
        _ => Attachment::Detached,
    }
}

/// What one round of detaching left behind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DetachRound {
    /// The interfaces whose detach failed, to retry next round.
    pub remaining: BTreeSet<String>,
    /// Their errors (each "failed to ..."), in interface order.
    pub errors: Vec<String>,
}

impl DetachRound {
    /// `Detached` only once every interface detached; until then `Detaching`,
    /// so that the node is never reported detached with programs still on it.
    pub fn attachment(&self) -> Attachment {
        if self.remaining.is_empty() {
            Attachment::Detached
        } else {
            Attachment::Detaching
        }
    }

    /// The error to report while interfaces are left, `None` once none is.
    pub fn error(&self) -> Option<String> {
        (!self.errors.is_empty()).then(|| self.errors.join("; "))
    }
}

/// The interfaces a detach round works on: when a failed round is being
/// retried, the ones it left; otherwise every interface the node has now.
pub fn interfaces_to_detach<'a>(
    attachment: Attachment,
    left: &BTreeSet<String>,
    current: impl IntoIterator<Item = &'a String>,
) -> Vec<String> {
    if attachment == Attachment::Detaching {
        left.iter().cloned().collect()
    } else {
        current.into_iter().cloned().collect()
    }
}

/// Detaches every interface in `names` with `detach`, carrying on past a failure
/// (one stuck interface must not keep the others translating), and says which
/// are left.
pub fn detach_interfaces<'a, E: std::fmt::Display>(
    names: impl IntoIterator<Item = &'a String>,
    mut detach: impl FnMut(&str) -> Result<(), E>,
) -> DetachRound {
    let mut round = DetachRound::default();
    for name in names {
        if let Err(error) = detach(name) {
            tracing::warn!(interface = %name, %error, "cannot detach; retrying next round");
            round.remaining.insert(name.clone());
            round.errors.push(error.to_string());
        }
    }
    round
}

/// What a cluster agent follows, and why.
#[derive(Clone, Debug, PartialEq)]
pub enum Instruction {
    /// This node's DataplaneNode says so.
    DataplaneNode(ModeSpec),
    /// The DataplaneNode disappeared after the agent had seen it: deleted, or
    /// garbage-collected with a Node that re-registered under the same name.
    /// Its last spec stays: kube-proxy may be long gone (its rules cleaned), so
    /// draining now would break new Service connections; the operator recreates
    /// the DataplaneNode with the cluster's mode.
    DataplaneNodeGone(ModeSpec),
    /// No DataplaneNode seen since start, but an earlier process left programs
    /// attached: the attachment stays as that process left it (serving, or
    /// draining after an explicit `KubeProxy`).
    AttachedBefore(Mode),
    /// No DataplaneNode ever and nothing attached: kube-proxy serves the node.
    NoDataplaneNode,
}

impl Instruction {
    pub fn mode(&self) -> Mode {
        match self {
            Self::DataplaneNode(spec) | Self::DataplaneNodeGone(spec) => spec.mode,
            Self::AttachedBefore(mode) => *mode,
            Self::NoDataplaneNode => Mode::KubeProxy,
        }
    }

    pub fn drain_timeout(&self) -> Duration {
        match self {
            Self::DataplaneNode(spec) | Self::DataplaneNodeGone(spec) => spec.drain_timeout(),
            Self::AttachedBefore(_) | Self::NoDataplaneNode => {
                ModeSpec::new(Mode::KubeProxy).drain_timeout()
            }
        }
    }
}

/// The instruction a cluster agent follows. Only an explicit `mode: KubeProxy`
/// starts a drain: a missing DataplaneNode means `KubeProxy` only on a node
/// that never had one and has nothing attached.
///
/// `dataplane_node`: the spec of the DataplaneNode as it exists now;
/// `last_seen`: the spec of the last one seen by this process; `attachment`:
/// the programs as they are (at start, as the pins showed them).
pub fn instruction(
    dataplane_node: Option<&ModeSpec>,
    last_seen: Option<&ModeSpec>,
    attachment: Attachment,
) -> Instruction {
    match (dataplane_node, last_seen) {
        (Some(spec), _) => Instruction::DataplaneNode(spec.clone()),
        (None, Some(spec)) => Instruction::DataplaneNodeGone(spec.clone()),
        (None, None) => match attachment {
            Attachment::Detached => Instruction::NoDataplaneNode,
            Attachment::Attached => Instruction::AttachedBefore(Mode::Ebpf),
            // Only an explicit KubeProxy starts a drain, so a drain in progress
            // finishes what that instruction began.
            Attachment::Draining { .. } | Attachment::Detaching => {
                Instruction::AttachedBefore(Mode::KubeProxy)
            }
        },
    }
}

#[cfg(test)]
mod tests;
