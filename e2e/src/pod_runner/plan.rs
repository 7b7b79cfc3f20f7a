//! The pod runner's decisions, apart from all I/O: given the pods that want a
//! process and the processes that exist, what to start, signal or forget.
//!
//! Rules (as a kubelet with one container runtime would behave):
//! - A process whose pod is gone or being deleted gets SIGTERM, then SIGKILL
//!   once its grace period has passed. The grace period is fixed when SIGTERM
//!   is sent (as a kubelet does): later changes, such as the hollow kubelet's
//!   final deletion with grace 0, do not shorten it.
//! - A pod's process starts only when no other process with the same owner key
//!   (the same DaemonSet on the same node, the same Deployment) is still
//!   alive: a replacement never overlaps the process it replaces.
//! - A process that exited while its pod still wants it is restarted after a
//!   back-off that doubles up to a limit (restartPolicy Always).
//! - Init containers run in order, each to completion: a container starts only once every
//!   init container before it has exited successfully, and an init container that has
//!   succeeded is not run again (a failed one is restarted with the same back-off).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::spec::ProcessKey;

/// A pod's wish for a process, reduced to what the decisions need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    pub key: ProcessKey,
    pub owner_key: String,
    pub deleting: bool,
    pub grace_period: Duration,
    /// An init container.
    pub run_to_completion: bool,
    /// The init containers that must have succeeded first.
    pub after: Vec<ProcessKey>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessState {
    Running,
    /// SIGTERM was sent at `since` (time since the runner started).
    Terminating {
        since: Duration,
    },
    /// SIGKILL was sent; waiting for the exit to be reaped.
    Killed,
    Exited {
        at: Duration,
        /// It exited with status 0.
        succeeded: bool,
    },
}

/// A process the runner started, as last observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tracked {
    pub key: ProcessKey,
    pub owner_key: String,
    pub state: ProcessState,
    pub grace_period: Duration,
    /// How often this pod's process was started before.
    pub restarts: u32,
}

impl Tracked {
    fn is_alive(&self) -> bool {
        !matches!(self.state, ProcessState::Exited { .. })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    Start(ProcessKey),
    /// Send SIGTERM; SIGKILL follows after this grace period.
    Terminate(ProcessKey, Duration),
    Kill(ProcessKey),
    /// Drop the record of an exited process whose pod is gone.
    Forget(ProcessKey),
}

pub const RESTART_BACKOFF_START: Duration = Duration::from_secs(1);
pub const RESTART_BACKOFF_LIMIT: Duration = Duration::from_secs(10);

pub fn restart_backoff(restarts: u32) -> Duration {
    let factor = 1u32
        .checked_shl(restarts.saturating_sub(1).min(16))
        .unwrap_or(u32::MAX);
    RESTART_BACKOFF_START
        .saturating_mul(factor)
        .min(RESTART_BACKOFF_LIMIT)
}

/// The actions to take now. `now` is the time since the runner started.
pub fn plan(wanted: &[Wanted], tracked: &[Tracked], now: Duration) -> Vec<Action> {
    let wanted_by_key: BTreeMap<&ProcessKey, &Wanted> =
        wanted.iter().map(|item| (&item.key, item)).collect();
    let tracked_by_key: BTreeMap<&ProcessKey, &Tracked> =
        tracked.iter().map(|item| (&item.key, item)).collect();
    let mut actions = Vec::new();

    // Stop what is no longer wanted.
    for process in tracked {
        let still_wanted = wanted_by_key
            .get(&process.key)
            .is_some_and(|item| !item.deleting);
        if still_wanted {
            continue;
        }
        match process.state {
            ProcessState::Running => {
                let grace_period = wanted_by_key
                    .get(&process.key)
                    .map(|item| item.grace_period)
                    .unwrap_or(process.grace_period);
                actions.push(Action::Terminate(process.key.clone(), grace_period))
            }
            ProcessState::Terminating { since } if now >= since + process.grace_period => {
                actions.push(Action::Kill(process.key.clone()))
            }
            ProcessState::Terminating { .. } | ProcessState::Killed => {}
            ProcessState::Exited { .. } => {
                if !wanted_by_key.contains_key(&process.key) {
                    actions.push(Action::Forget(process.key.clone()))
                }
            }
        }
    }

    let succeeded = |key: &ProcessKey| {
        tracked_by_key.get(key).is_some_and(|process| {
            matches!(
                process.state,
                ProcessState::Exited {
                    succeeded: true,
                    ..
                }
            )
        })
    };
    // Start what is wanted, one process per owner key at a time.
    let mut busy_owners: BTreeSet<&str> = tracked
        .iter()
        .filter(|process| process.is_alive())
        .map(|process| process.owner_key.as_str())
        .collect();
    for item in wanted.iter().filter(|item| !item.deleting) {
        let due = match tracked_by_key.get(&item.key) {
            None => true,
            Some(process) => match process.state {
                ProcessState::Exited {
                    succeeded: true, ..
                } if item.run_to_completion => false,
                ProcessState::Exited { at, .. } => now >= at + restart_backoff(process.restarts),
                _ => false,
            },
        };
        if !item.after.iter().all(succeeded) {
            continue;
        }
        if !due || busy_owners.contains(item.owner_key.as_str()) {
            continue;
        }
        busy_owners.insert(item.owner_key.as_str());
        actions.push(Action::Start(item.key.clone()));
    }
    actions
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(uid: &str) -> ProcessKey {
        ProcessKey {
            pod_uid: uid.to_string(),
            container: "kube-proxy".to_string(),
        }
    }

    fn wanted(uid: &str, owner: &str) -> Wanted {
        Wanted {
            key: key(uid),
            owner_key: owner.to_string(),
            deleting: false,
            grace_period: Duration::from_secs(5),
            run_to_completion: false,
            after: Vec::new(),
        }
    }

    fn tracked(uid: &str, owner: &str, state: ProcessState) -> Tracked {
        Tracked {
            key: key(uid),
            owner_key: owner.to_string(),
            state,
            grace_period: Duration::from_secs(5),
            restarts: 0,
        }
    }

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn a_new_pod_gets_its_process_started() {
        assert_eq!(
            plan(&[wanted("a", "ds/node-1")], &[], SECOND),
            vec![Action::Start(key("a"))]
        );
    }

    #[test]
    fn a_running_process_of_a_wanted_pod_is_left_alone() {
        let actions = plan(
            &[wanted("a", "ds/node-1")],
            &[tracked("a", "ds/node-1", ProcessState::Running)],
            SECOND,
        );
        assert!(actions.is_empty(), "{actions:?}");
    }

    #[test]
    fn a_deleted_pod_gets_sigterm_then_sigkill_after_its_grace_period() {
        let mut deleting = wanted("a", "ds/node-1");
        deleting.deleting = true;
        assert_eq!(
            plan(
                &[deleting.clone()],
                &[tracked("a", "ds/node-1", ProcessState::Running)],
                SECOND
            ),
            vec![Action::Terminate(key("a"), 5 * SECOND)]
        );
        let terminating = tracked(
            "a",
            "ds/node-1",
            ProcessState::Terminating { since: SECOND },
        );
        assert!(plan(
            std::slice::from_ref(&deleting),
            std::slice::from_ref(&terminating),
            5 * SECOND
        )
        .is_empty());
        assert_eq!(
            plan(&[deleting], std::slice::from_ref(&terminating), 6 * SECOND),
            vec![Action::Kill(key("a"))]
        );
        // Also when the pod object is already gone from the API.
        assert_eq!(
            plan(&[], &[terminating], 7 * SECOND),
            vec![Action::Kill(key("a"))]
        );
    }

    #[test]
    fn the_grace_period_is_fixed_when_sigterm_is_sent() {
        let mut deleting = wanted("a", "ds/node-1");
        deleting.deleting = true;
        deleting.grace_period = 2 * SECOND;
        assert_eq!(
            plan(
                std::slice::from_ref(&deleting),
                &[tracked("a", "ds/node-1", ProcessState::Running)],
                SECOND
            ),
            vec![Action::Terminate(key("a"), 2 * SECOND)]
        );
        // The runner recorded 2 s when it sent SIGTERM at 1 s; a later grace of
        // 0 (the hollow kubelet's final delete) does not bring SIGKILL sooner.
        let mut terminating = tracked(
            "a",
            "ds/node-1",
            ProcessState::Terminating { since: SECOND },
        );
        terminating.grace_period = 2 * SECOND;
        deleting.grace_period = Duration::ZERO;
        assert!(plan(&[deleting], std::slice::from_ref(&terminating), 2 * SECOND).is_empty());
        assert_eq!(
            plan(&[], &[terminating], 3 * SECOND),
            vec![Action::Kill(key("a"))]
        );
    }

    #[test]
    fn a_replacement_starts_only_after_the_old_process_has_exited() {
        let replacement = wanted("new", "ds/node-2");
        for state in [
            ProcessState::Running,
            ProcessState::Terminating { since: SECOND },
            ProcessState::Killed,
        ] {
            let actions = plan(
                std::slice::from_ref(&replacement),
                &[tracked("old", "ds/node-2", state)],
                2 * SECOND,
            );
            assert!(
                !actions.contains(&Action::Start(key("new"))),
                "started while the old process was {state:?}: {actions:?}"
            );
        }
        let actions = plan(
            &[replacement],
            &[tracked(
                "old",
                "ds/node-2",
                ProcessState::Exited {
                    at: 2 * SECOND,
                    succeeded: true,
                },
            )],
            2 * SECOND,
        );
        assert_eq!(
            actions,
            vec![Action::Forget(key("old")), Action::Start(key("new"))]
        );
    }

    #[test]
    fn pods_of_other_owners_do_not_wait_for_each_other() {
        let actions = plan(
            &[wanted("b", "ds/node-2")],
            &[tracked(
                "a",
                "ds/node-1",
                ProcessState::Terminating { since: SECOND },
            )],
            2 * SECOND,
        );
        assert_eq!(actions, vec![Action::Start(key("b"))]);
    }

    #[test]
    fn two_wanted_pods_of_one_owner_never_start_together() {
        let actions = plan(
            &[wanted("a", "deploy/op"), wanted("b", "deploy/op")],
            &[],
            SECOND,
        );
        assert_eq!(actions, vec![Action::Start(key("a"))]);
    }

    #[test]
    fn a_crashed_process_is_restarted_after_a_growing_backoff() {
        let mut crashed = tracked(
            "a",
            "ds/node-1",
            ProcessState::Exited {
                at: 10 * SECOND,
                succeeded: false,
            },
        );
        crashed.restarts = 3;
        let item = wanted("a", "ds/node-1");
        assert!(plan(
            std::slice::from_ref(&item),
            std::slice::from_ref(&crashed),
            13 * SECOND
        )
        .is_empty());
        assert_eq!(
            plan(&[item], &[crashed], 14 * SECOND),
            vec![Action::Start(key("a"))]
        );
        assert_eq!(restart_backoff(1), SECOND);
        assert_eq!(restart_backoff(2), 2 * SECOND);
        assert_eq!(restart_backoff(40), RESTART_BACKOFF_LIMIT);
    }

    fn container_key(uid: &str, container: &str) -> ProcessKey {
        ProcessKey {
            pod_uid: uid.to_string(),
            container: container.to_string(),
        }
    }

    /// An agent pod: the init container `mount-bpf-fs`, then `agent`.
    fn agent_pod(uid: &str) -> [Wanted; 2] {
        let init = Wanted {
            key: container_key(uid, "mount-bpf-fs"),
            owner_key: "ds/node-1/mount-bpf-fs".into(),
            deleting: false,
            grace_period: 5 * SECOND,
            run_to_completion: true,
            after: Vec::new(),
        };
        let agent = Wanted {
            key: container_key(uid, "agent"),
            owner_key: "ds/node-1/agent".into(),
            after: vec![init.key.clone()],
            run_to_completion: false,
            ..init.clone()
        };
        [init, agent]
    }

    fn tracked_container(uid: &str, container: &str, state: ProcessState) -> Tracked {
        Tracked {
            key: container_key(uid, container),
            owner_key: format!("ds/node-1/{container}"),
            state,
            grace_period: 5 * SECOND,
            restarts: 0,
        }
    }

    #[test]
    fn a_container_starts_only_after_its_init_container_succeeded() {
        let pod = agent_pod("a");
        assert_eq!(
            plan(&pod, &[], SECOND),
            vec![Action::Start(container_key("a", "mount-bpf-fs"))],
            "only the init container starts first"
        );
        for state in [
            ProcessState::Running,
            ProcessState::Exited {
                at: SECOND,
                succeeded: false,
            },
        ] {
            let actions = plan(
                &pod,
                &[tracked_container("a", "mount-bpf-fs", state)],
                SECOND,
            );
            assert!(
                !actions.contains(&Action::Start(container_key("a", "agent"))),
                "the agent started while its init container was {state:?}: {actions:?}"
            );
        }
        let done = tracked_container(
            "a",
            "mount-bpf-fs",
            ProcessState::Exited {
                at: SECOND,
                succeeded: true,
            },
        );
        assert_eq!(
            plan(&pod, std::slice::from_ref(&done), 20 * SECOND),
            vec![Action::Start(container_key("a", "agent"))],
            "the succeeded init container is not run again, the agent starts"
        );
    }

    #[test]
    fn a_failed_init_container_is_restarted_after_the_backoff() {
        let pod = agent_pod("a");
        let failed = tracked_container(
            "a",
            "mount-bpf-fs",
            ProcessState::Exited {
                at: SECOND,
                succeeded: false,
            },
        );
        assert_eq!(
            plan(&pod, std::slice::from_ref(&failed), 2 * SECOND),
            vec![Action::Start(container_key("a", "mount-bpf-fs"))]
        );
    }

    #[test]
    fn an_exited_process_of_a_deleted_pod_is_forgotten_only_once_the_pod_is_gone() {
        let mut deleting = wanted("a", "ds/node-1");
        deleting.deleting = true;
        let exited = tracked(
            "a",
            "ds/node-1",
            ProcessState::Exited {
                at: SECOND,
                succeeded: false,
            },
        );
        assert!(plan(&[deleting], std::slice::from_ref(&exited), 2 * SECOND).is_empty());
        assert_eq!(
            plan(&[], &[exited], 2 * SECOND),
            vec![Action::Forget(key("a"))]
        );
    }
}
