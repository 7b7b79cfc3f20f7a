//! Following the DataplaneNode's mode: when to attach, drain and detach. Pure;
//! shared by standalone and cluster mode.
//!
//! `Ebpf`: programs attached, config `ACTIVE`. `KubeProxy` after `Ebpf`: the
//! programs are not pulled at once (that would break every connection they
//! translate): config `DRAINING` keeps translating flows already in Switchyard's
//! conntrack and passes new ones to kube-proxy's rules; the agent detaches once no
//! live TCP flow is left or the drain timeout has passed. `KubeProxy` from the
//! start: nothing attached. Maps are kept in sync in every mode, so switching to
//! `Ebpf` is instant.

use std::time::{Duration, Instant};

use switchyard_crds::DataplaneMode;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attachment {
    Detached,
    Attached,
    Draining { since: Instant },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeAction {
    /// Write config `ACTIVE` and attach (idempotent) on every interface.
    Activate,
    /// Write config `DRAINING`.
    StartDraining,
    /// Remove the programs from every interface and the socket hooks; keep maps.
    Detach,
}

/// The next attachment state and what to do to get there.
pub fn follow_mode(
    current: Attachment,
    mode: DataplaneMode,
    drain_timeout: Duration,
    live_tcp_flows: Option<usize>,
    now: Instant,
) -> (Attachment, Option<ModeAction>) {
    match (mode, current) {
        (DataplaneMode::Ebpf, Attachment::Attached) => (current, None),
        (DataplaneMode::Ebpf, _) => (Attachment::Attached, Some(ModeAction::Activate)),
        (DataplaneMode::KubeProxy, Attachment::Detached) => (current, None),
        (DataplaneMode::KubeProxy, Attachment::Attached) => (
            Attachment::Draining { since: now },
            Some(ModeAction::StartDraining),
        ),
        (DataplaneMode::KubeProxy, Attachment::Draining { since }) => {
            let drained = live_tcp_flows == Some(0);
            let timed_out = now.saturating_duration_since(since) >= drain_timeout;
            if drained || timed_out {
                (Attachment::Detached, Some(ModeAction::Detach))
            } else {
                (current, None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(600);

    #[test]
    fn ebpf_mode_attaches_once() {
        let now = Instant::now();
        let (state, action) = follow_mode(
            Attachment::Detached,
            DataplaneMode::Ebpf,
            TIMEOUT,
            None,
            now,
        );
        assert_eq!(
            (state, action),
            (Attachment::Attached, Some(ModeAction::Activate))
        );
        let (state, action) = follow_mode(state, DataplaneMode::Ebpf, TIMEOUT, None, now);
        assert_eq!((state, action), (Attachment::Attached, None));
    }

    #[test]
    fn kube_proxy_mode_from_the_start_attaches_nothing() {
        let now = Instant::now();
        assert_eq!(
            follow_mode(
                Attachment::Detached,
                DataplaneMode::KubeProxy,
                TIMEOUT,
                Some(3),
                now
            ),
            (Attachment::Detached, None)
        );
    }

    #[test]
    fn kube_proxy_mode_after_ebpf_drains_until_the_last_flow_closes() {
        let start = Instant::now();
        let (state, action) = follow_mode(
            Attachment::Attached,
            DataplaneMode::KubeProxy,
            TIMEOUT,
            Some(5),
            start,
        );
        assert_eq!(state, Attachment::Draining { since: start });
        assert_eq!(action, Some(ModeAction::StartDraining));
        let later = start + Duration::from_secs(10);
        assert_eq!(
            follow_mode(state, DataplaneMode::KubeProxy, TIMEOUT, Some(2), later),
            (state, None)
        );
        // An unreadable flow count never detaches early.
        assert_eq!(
            follow_mode(state, DataplaneMode::KubeProxy, TIMEOUT, None, later),
            (state, None)
        );
        assert_eq!(
            follow_mode(state, DataplaneMode::KubeProxy, TIMEOUT, Some(0), later),
            (Attachment::Detached, Some(ModeAction::Detach))
        );
    }

    #[test]
    fn draining_ends_at_the_timeout_even_with_live_flows() {
        let start = Instant::now();
        let draining = Attachment::Draining { since: start };
        assert_eq!(
            follow_mode(
                draining,
                DataplaneMode::KubeProxy,
                TIMEOUT,
                Some(9),
                start + TIMEOUT
            ),
            (Attachment::Detached, Some(ModeAction::Detach))
        );
    }

    #[test]
    fn ebpf_mode_while_draining_reactivates_without_detaching() {
        let start = Instant::now();
        let draining = Attachment::Draining { since: start };
        assert_eq!(
            follow_mode(draining, DataplaneMode::Ebpf, TIMEOUT, Some(9), start),
            (Attachment::Attached, Some(ModeAction::Activate))
        );
    }
}
