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
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(600);

    #[test]
    fn a_retried_detach_works_on_the_interfaces_left_and_a_first_one_on_every_interface() {
        let left: BTreeSet<String> = ["veth-b".to_string()].into();
        let current = [
            "veth-a".to_string(),
            "veth-b".to_string(),
            "eth0".to_string(),
        ];
        assert_eq!(
            interfaces_to_detach(Attachment::Detaching, &left, current.iter()),
            vec!["veth-b".to_string()]
        );
        assert_eq!(
            interfaces_to_detach(
                Attachment::Draining {
                    since: Instant::now()
                },
                &left,
                current.iter()
            ),
            current.to_vec()
        );
    }

    #[test]
    fn ebpf_mode_attaches_once() {
        let now = Instant::now();
        let (state, action) = follow_mode(Attachment::Detached, Mode::Ebpf, TIMEOUT, None, now);
        assert_eq!(
            (state, action),
            (Attachment::Attached, Some(ModeAction::Activate))
        );
        let (state, action) = follow_mode(state, Mode::Ebpf, TIMEOUT, None, now);
        assert_eq!((state, action), (Attachment::Attached, None));
    }

    #[test]
    fn kube_proxy_mode_from_the_start_attaches_nothing() {
        let now = Instant::now();
        assert_eq!(
            follow_mode(Attachment::Detached, Mode::KubeProxy, TIMEOUT, Some(3), now),
            (Attachment::Detached, None)
        );
    }

    #[test]
    fn kube_proxy_mode_after_ebpf_drains_until_the_last_flow_closes() {
        let start = Instant::now();
        let (state, action) = follow_mode(
            Attachment::Attached,
            Mode::KubeProxy,
            TIMEOUT,
            Some(5),
            start,
        );
        assert_eq!(state, Attachment::Draining { since: start });
        assert_eq!(action, Some(ModeAction::StartDraining));
        let later = start + Duration::from_secs(10);
        assert_eq!(
            follow_mode(state, Mode::KubeProxy, TIMEOUT, Some(2), later),
            (state, None)
        );
        // An unreadable flow count never detaches early.
        assert_eq!(
            follow_mode(state, Mode::KubeProxy, TIMEOUT, None, later),
            (state, None)
        );
        assert_eq!(
            follow_mode(state, Mode::KubeProxy, TIMEOUT, Some(0), later),
            (Attachment::Detached, Some(ModeAction::Detach))
        );
    }

    #[test]
    fn draining_ends_at_the_timeout_even_with_live_flows() {
        let start = Instant::now();
        let draining = Attachment::Draining { since: start };
        assert_eq!(
            follow_mode(draining, Mode::KubeProxy, TIMEOUT, Some(9), start + TIMEOUT),
            (Attachment::Detached, Some(ModeAction::Detach))
        );
    }

    fn spec(mode: Mode) -> ModeSpec {
        ModeSpec::new(mode)
    }

    /// The instruction and what following it does to `attachment`.
    fn follow(
        dataplane_node: Option<&ModeSpec>,
        last_seen: Option<&ModeSpec>,
        attachment: Attachment,
        now: Instant,
    ) -> (Instruction, Attachment, Option<ModeAction>) {
        let followed = instruction(dataplane_node, last_seen, attachment);
        let (next, action) = follow_mode(
            attachment,
            followed.mode(),
            followed.drain_timeout(),
            Some(4),
            now,
        );
        (followed, next, action)
    }

    #[test]
    fn a_deleted_dataplane_node_after_ebpf_keeps_an_attached_node_serving() {
        let ebpf = spec(Mode::Ebpf);
        let (followed, next, action) =
            follow(None, Some(&ebpf), Attachment::Attached, Instant::now());
        assert_eq!(followed, Instruction::DataplaneNodeGone(ebpf));
        assert_eq!((next, action), (Attachment::Attached, None));
    }

    #[test]
    fn a_node_that_never_had_a_dataplane_node_and_has_nothing_attached_follows_kube_proxy() {
        let (followed, next, action) = follow(None, None, Attachment::Detached, Instant::now());
        assert_eq!(followed, Instruction::NoDataplaneNode);
        assert_eq!(followed.mode(), Mode::KubeProxy);
        assert_eq!((next, action), (Attachment::Detached, None));
    }

    #[test]
    fn programs_an_earlier_process_attached_keep_serving_without_a_dataplane_node() {
        let (followed, next, action) = follow(None, None, Attachment::Attached, Instant::now());
        assert_eq!(followed, Instruction::AttachedBefore(Mode::Ebpf));
        assert_eq!((next, action), (Attachment::Attached, None));
    }

    #[test]
    fn a_drain_an_earlier_process_began_goes_on_without_a_dataplane_node() {
        let start = Instant::now();
        let draining = Attachment::Draining { since: start };
        let (followed, next, action) = follow(None, None, draining, start);
        assert_eq!(followed, Instruction::AttachedBefore(Mode::KubeProxy));
        assert_eq!((next, action), (draining, None));
    }

    #[test]
    fn an_explicit_kube_proxy_mode_drains_an_attached_node() {
        let now = Instant::now();
        let ebpf = spec(Mode::Ebpf);
        let mut kube_proxy = spec(Mode::KubeProxy);
        kube_proxy.drain_timeout_seconds = 30;
        let (followed, next, action) =
            follow(Some(&kube_proxy), Some(&ebpf), Attachment::Attached, now);
        assert_eq!(followed.drain_timeout(), Duration::from_secs(30));
        assert_eq!(next, Attachment::Draining { since: now });
        assert_eq!(action, Some(ModeAction::StartDraining));
    }

    #[test]
    fn a_dataplane_node_recreated_with_ebpf_continues_without_reattaching() {
        let now = Instant::now();
        let ebpf = spec(Mode::Ebpf);
        let (_, gone, action) = follow(None, Some(&ebpf), Attachment::Attached, now);
        assert_eq!((gone, action), (Attachment::Attached, None));
        let recreated = spec(Mode::Ebpf);
        let (followed, next, action) = follow(Some(&recreated), Some(&ebpf), gone, now);
        assert_eq!(followed, Instruction::DataplaneNode(recreated));
        assert_eq!((next, action), (Attachment::Attached, None));
    }

    fn failing_on<'a>(names: &'a [&'a str]) -> impl FnMut(&str) -> Result<(), String> + 'a {
        move |name| {
            if names.contains(&name) {
                Err(format!(
                    "failed to detach from {name}: device or resource busy"
                ))
            } else {
                Ok(())
            }
        }
    }

    #[test]
    fn a_failed_detach_leaves_the_node_detaching_with_the_interfaces_left_and_their_errors() {
        let interfaces: Vec<String> = ["eth0", "p-a", "p-b"].map(String::from).to_vec();
        let round = detach_interfaces(&interfaces, failing_on(&["p-a"]));
        assert_eq!(round.remaining, BTreeSet::from(["p-a".to_string()]));
        assert_eq!(round.attachment(), Attachment::Detaching);
        assert_eq!(
            round.error().as_deref(),
            Some("failed to detach from p-a: device or resource busy")
        );
    }

    #[test]
    fn detaching_retries_the_interfaces_left_every_round_and_ends_detached_once_none_is() {
        let (next, action) = follow_mode(
            Attachment::Detaching,
            Mode::KubeProxy,
            TIMEOUT,
            None,
            Instant::now(),
        );
        assert_eq!(
            (next, action),
            (Attachment::Detached, Some(ModeAction::Detach))
        );
        let left = BTreeSet::from(["p-a".to_string()]);
        let mut tried = Vec::new();
        let round = detach_interfaces(&left, |name| {
            tried.push(name.to_string());
            Ok::<(), String>(())
        });
        assert_eq!(tried, vec!["p-a".to_string()]);
        assert_eq!(round.attachment(), Attachment::Detached);
        assert_eq!(round.error(), None);
    }

    #[test]
    fn a_start_finds_serving_draining_or_never_activated_programs_by_the_config_mode() {
        let now = Instant::now();
        assert_eq!(
            restored_attachment(false, Some(DATAPATH_MODE_ACTIVE), now),
            Attachment::Detached
        );
        assert_eq!(
            restored_attachment(true, Some(DATAPATH_MODE_ACTIVE), now),
            Attachment::Attached
        );
        assert_eq!(
            restored_attachment(true, Some(DATAPATH_MODE_DRAINING), now),
            Attachment::Draining { since: now }
        );
        assert_eq!(restored_attachment(true, None, now), Attachment::Detached);
        assert_eq!(
            restored_attachment(true, Some(0), now),
            Attachment::Detached
        );
    }

    #[test]
    fn ebpf_mode_while_detaching_reactivates() {
        assert_eq!(
            follow_mode(
                Attachment::Detaching,
                Mode::Ebpf,
                TIMEOUT,
                None,
                Instant::now()
            ),
            (Attachment::Attached, Some(ModeAction::Activate))
        );
    }

    #[test]
    fn ebpf_mode_while_draining_reactivates_without_detaching() {
        let start = Instant::now();
        let draining = Attachment::Draining { since: start };
        assert_eq!(
            follow_mode(draining, Mode::Ebpf, TIMEOUT, Some(9), start),
            (Attachment::Attached, Some(ModeAction::Activate))
        );
    }
}
