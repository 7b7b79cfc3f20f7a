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
mod tests;
