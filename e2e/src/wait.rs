//! Waiting for a condition with a deadline and a clear failure message, and
//! asserting that a condition holds over a whole window.
//!
//! A condition is polled until it reports [`Check::Ready`]; every
//! [`Check::NotYet`] carries a description of what was observed, and the last
//! one is part of the timeout error, so a failing test says what it saw.
//! [`hold_for`] is the opposite: a condition observed all through a window
//! ("nothing changes"), failing at the first observation that breaks it.

use std::future::Future;
use std::time::Duration;

use crate::error::{E2eError, Result};

/// One poll of a condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check<T> {
    Ready(T),
    /// Not there yet; the text says what was observed instead.
    NotYet(String),
    /// Can never become true (e.g. a process crashed): stop waiting.
    Failed(String),
}

/// How long and how often to poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitOptions {
    pub timeout: Duration,
    pub interval: Duration,
}

impl WaitOptions {
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            interval: Duration::from_millis(250),
        }
    }

    pub fn every(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }
}

/// Polls `condition` until it is ready, it fails, or `options.timeout` passes.
/// `description` completes "failed to ..." (e.g. "see 3 nodes Ready").
/// Errors of the condition itself are observations, not the end: an API call
/// that fails once is retried until the deadline.
pub async fn wait_for<T, E, F, Fut>(
    description: &str,
    options: WaitOptions,
    mut condition: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<Check<T>, E>>,
    E: std::fmt::Display,
{
    let started = tokio::time::Instant::now();
    let deadline = started + options.timeout;
    let mut last_observation = String::from("nothing observed yet");
    loop {
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(remaining.max(Duration::from_millis(1)), condition()).await {
            Ok(Ok(Check::Ready(value))) => return Ok(value),
            Ok(Ok(Check::NotYet(observation))) => last_observation = observation,
            Ok(Ok(Check::Failed(message))) => {
                return Err(E2eError::WaitAborted {
                    description: description.to_string(),
                    message,
                })
            }
            Ok(Err(error)) => last_observation = format!("error: {error}"),
            Err(_) => {
                last_observation = format!("the check itself did not finish ({last_observation})")
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(E2eError::WaitTimedOut {
                description: description.to_string(),
                waited: started.elapsed(),
                last_observation,
            });
        }
        tokio::time::sleep(
            options
                .interval
                .min(deadline.saturating_duration_since(tokio::time::Instant::now())),
        )
        .await;
    }
}

/// Observes `condition` at the start of the window, every `options.interval`, and at its
/// end (`options.timeout` after the start); fails at the first observation that breaks it
/// ([`Check::NotYet`] or [`Check::Failed`], with what was seen) or that cannot be made (an
/// error of the check). For "nothing changes for a while" assertions: one look after a fixed
/// sleep would miss a change that came and went. Returns how many observations held.
/// `description` completes "failed to keep ..." (e.g. "kube-proxy's DaemonSet untouched").
pub async fn hold_for<E, F, Fut>(
    description: &str,
    options: WaitOptions,
    mut condition: F,
) -> Result<u32>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<Check<()>, E>>,
    E: std::fmt::Display,
{
    let started = tokio::time::Instant::now();
    let end = started + options.timeout;
    let mut held = 0;
    loop {
        let violation = match condition().await {
            Ok(Check::Ready(())) => None,
            Ok(Check::NotYet(observation)) | Ok(Check::Failed(observation)) => Some(observation),
            Err(error) => Some(format!("the check failed: {error}")),
        };
        if let Some(violation) = violation {
            return Err(E2eError::HoldBroken {
                description: description.to_string(),
                window: options.timeout,
                after: started.elapsed(),
                violation,
            });
        }
        held += 1;
        let now = tokio::time::Instant::now();
        if now >= end {
            return Ok(held);
        }
        tokio::time::sleep(options.interval.min(end - now)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test(start_paused = true)]
    async fn a_condition_that_becomes_ready_returns_its_value() {
        let polls = AtomicU32::new(0);
        let value = wait_for(
            "count to three",
            WaitOptions::new(Duration::from_secs(5)),
            || async {
                let count = polls.fetch_add(1, Ordering::SeqCst) + 1;
                Ok::<_, String>(if count >= 3 {
                    Check::Ready(count)
                } else {
                    Check::NotYet(format!("count is {count}"))
                })
            },
        )
        .await
        .unwrap();
        assert_eq!(value, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_timeout_reports_the_description_and_the_last_observation() {
        let error = wait_for(
            "see node-1 Ready",
            WaitOptions::new(Duration::from_secs(2)),
            || async { Ok::<Check<()>, String>(Check::NotYet("node-1 is NotReady".into())) },
        )
        .await
        .unwrap_err();
        let message = error.to_string();
        assert!(
            message.starts_with("failed to see node-1 Ready within"),
            "{message}"
        );
        assert!(
            message.ends_with("last observation: node-1 is NotReady"),
            "{message}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn errors_of_the_check_are_retried_and_reported() {
        let polls = AtomicU32::new(0);
        let error = wait_for(
            "list pods",
            WaitOptions::new(Duration::from_secs(1)),
            || async {
                polls.fetch_add(1, Ordering::SeqCst);
                Err::<Check<()>, _>("connection refused")
            },
        )
        .await
        .unwrap_err();
        assert!(polls.load(Ordering::SeqCst) > 1);
        assert!(
            error.to_string().contains("error: connection refused"),
            "{error}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_check_stops_waiting_at_once() {
        let started = tokio::time::Instant::now();
        let error = wait_for(
            "see kube-proxy run",
            WaitOptions::new(Duration::from_secs(60)),
            || async {
                Ok::<Check<()>, String>(Check::Failed("kube-proxy exited with status 1".into()))
            },
        )
        .await
        .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(
            error.to_string(),
            "failed to see kube-proxy run: kube-proxy exited with status 1"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_check_that_hangs_cannot_outlive_the_deadline() {
        let error = wait_for(
            "answer",
            WaitOptions::new(Duration::from_secs(3)),
            || async { std::future::pending::<std::result::Result<Check<()>, String>>().await },
        )
        .await
        .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("the check itself did not finish"),
            "{error}"
        );
    }
    #[tokio::test(start_paused = true)]
    async fn a_condition_that_holds_is_observed_from_the_start_to_the_end_of_the_window() {
        let started = tokio::time::Instant::now();
        let held = hold_for(
            "node-1 Ready",
            WaitOptions::new(Duration::from_secs(2)).every(Duration::from_millis(500)),
            || async { Ok::<Check<()>, String>(Check::Ready(())) },
        )
        .await
        .unwrap();
        assert_eq!(held, 5, "at 0, 0.5, 1, 1.5 and 2 s");
        assert_eq!(started.elapsed(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_condition_broken_inside_the_window_fails_with_when_and_what_was_seen() {
        let polls = AtomicU32::new(0);
        let error = hold_for(
            "kube-proxy untouched",
            WaitOptions::new(Duration::from_secs(3)).every(Duration::from_secs(1)),
            || async {
                let count = polls.fetch_add(1, Ordering::SeqCst);
                Ok::<Check<()>, String>(if count < 2 {
                    Check::Ready(())
                } else {
                    Check::NotYet("generation 2".into())
                })
            },
        )
        .await
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "failed to keep kube-proxy untouched for 3s: after 2s: generation 2"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_check_that_cannot_be_made_breaks_the_window() {
        let error = hold_for(
            "node-1 Ready",
            WaitOptions::new(Duration::from_secs(3)),
            || async { Err::<Check<()>, _>("connection refused") },
        )
        .await
        .unwrap_err();
        assert!(
            error
                .to_string()
                .ends_with("the check failed: connection refused"),
            "{error}"
        );
    }
}
