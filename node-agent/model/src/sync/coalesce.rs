//! When to apply: a change after a quiet period is applied at once; a burst of
//! changes is coalesced so that applies start at least `min_sync_period` apart
//! (kube-proxy's `minSyncPeriod`, default 1 s). Pure; time is passed in.

use std::time::{Duration, Instant};

pub const DEFAULT_MIN_SYNC_PERIOD: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Apply now (the coalescer has recorded it as started).
    Apply,
    /// Something is pending; apply at this instant.
    WaitUntil(Instant),
    /// Nothing to do until the next change.
    Idle,
}

#[derive(Clone, Debug)]
pub struct Coalescer {
    min_sync_period: Duration,
    last_apply_started: Option<Instant>,
    pending: bool,
}

impl Coalescer {
    pub fn new(min_sync_period: Duration) -> Self {
        Self {
            min_sync_period,
            last_apply_started: None,
            pending: false,
        }
    }

    /// An input changed.
    pub fn changed(&mut self) {
        self.pending = true;
    }

    pub fn is_pending(&self) -> bool {
        self.pending
    }

    /// Whether to apply now; `Apply` clears the pending change and starts the
    /// period, so call it only when the caller will apply.
    pub fn poll(&mut self, now: Instant) -> Next {
        if !self.pending {
            return Next::Idle;
        }
        if let Some(last) = self.last_apply_started {
            let earliest = last + self.min_sync_period;
            if now < earliest {
                return Next::WaitUntil(earliest);
            }
        }
        self.pending = false;
        self.last_apply_started = Some(now);
        Next::Apply
    }

    /// The apply that `poll` started failed: try again, no sooner than one
    /// period after it started (a failing map is not hammered).
    pub fn failed(&mut self) {
        self.pending = true;
    }

    /// An apply started at `now` without `poll` (the periodic resync, which
    /// does not hold back the changes behind it) failed: try again through
    /// `poll`, no sooner than one period after `now`.
    pub fn failed_outside(&mut self, now: Instant) {
        self.pending = true;
        self.last_apply_started = Some(self.last_apply_started.map_or(now, |last| last.max(now)));
    }
}

#[cfg(test)]
mod tests;
