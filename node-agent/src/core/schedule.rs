//! When the agent wants its next tick without new input, and the retry of UDP
//! flow releases that failed: such a release leaves flows sending their
//! datagrams to a backend that is gone, so it is retried soon by a sync of its
//! own, not left for the next change or the periodic resync; with backoff, so
//! that a conntrack map that keeps failing is not walked every period.

use std::time::{Duration, Instant};

use super::NodeAgent;
use crate::datapath::Datapath;
use crate::follow::Attachment;
use crate::sync::coalesce::Next;
use crate::sync::ApplyReport;

/// The delay before the first retry of a failed UDP flow release.
pub(super) const FIRST_RELEASE_RETRY_DELAY: Duration = Duration::from_secs(1);
/// The longest delay between retries.
pub(super) const MAX_RELEASE_RETRY_DELAY: Duration = Duration::from_secs(60);

/// The retry of UDP flow releases that failed: when the next is due, and how
/// many failed in a row (each doubles the delay, up to the maximum).
#[derive(Clone, Debug, Default)]
pub(super) struct UdpReleaseRetry {
    failures_in_a_row: u32,
    due: Option<Instant>,
}

impl UdpReleaseRetry {
    /// After a sync at `now`: a release still pending is retried after the
    /// next delay; none pending clears the retry and its backoff.
    pub(super) fn after_sync(&mut self, releases_pending: bool, now: Instant) {
        if !releases_pending {
            *self = Self::default();
            return;
        }
        let delay = FIRST_RELEASE_RETRY_DELAY
            .saturating_mul(2u32.saturating_pow(self.failures_in_a_row))
            .min(MAX_RELEASE_RETRY_DELAY);
        self.failures_in_a_row = self.failures_in_a_row.saturating_add(1);
        self.due = Some(now + delay);
    }

    pub(super) fn due_at(&self) -> Option<Instant> {
        self.due
    }

    /// Whether the retry is due at `now`; if so, it is taken (the sync it
    /// starts schedules the next one if the release fails again).
    fn take_if_due(&mut self, now: Instant) -> bool {
        if self.due.is_some_and(|due| now >= due) {
            self.due = None;
            return true;
        }
        false
    }
}

impl<D: Datapath> NodeAgent<D> {
    /// When the agent wants its next tick without new input.
    pub fn next_deadline(&mut self, now: Instant) -> Option<Instant> {
        let mut deadline = None;
        if !self.gate.is_open() {
            // To notice the gate timeout.
            deadline = Some(now + Duration::from_secs(1));
        }
        if let Attachment::Draining { .. } | Attachment::Detaching = self.attachment {
            // Drain progress, or the retry of the interfaces left to detach.
            deadline = Some(now + Duration::from_secs(1));
        }
        if let Some(due) = self.resync_due_at().filter(|_| !self.resync_wanted) {
            deadline = Some(deadline.map_or(due, |current: Instant| current.min(due)));
        }
        if let Some(due) = self.udp_release_retry.due_at() {
            deadline = Some(deadline.map_or(due, |current: Instant| current.min(due)));
        }
        if self.gate.is_open() && self.coalescer.is_pending() {
            // `poll` only tells when without starting an apply if one is not due.
            let due = match self.peek_coalescer(now) {
                Next::WaitUntil(at) => at,
                _ => now,
            };
            deadline = Some(deadline.map_or(due, |current: Instant| current.min(due)));
        }
        deadline
    }

    /// When the next periodic full resync is due (after the first full sync).
    pub(super) fn resync_due_at(&self) -> Option<Instant> {
        self.last_full_sync
            .map(|at| at + self.settings.full_resync_period)
    }

    fn peek_coalescer(&self, now: Instant) -> Next {
        let mut copy = self.coalescer.clone();
        copy.poll(now)
    }

    /// A due retry of failed UDP flow releases asks the coalescer for a sync
    /// (a partial one with no Service changed still retries the releases),
    /// within the minimum sync period like any change.
    pub(super) fn start_udp_release_retry_if_due(&mut self, now: Instant) {
        if self.udp_release_retry.take_if_due(now) {
            self.coalescer.changed();
        }
    }

    /// Schedules the retry of the UDP flow releases `report` says are pending.
    pub(super) fn after_udp_flow_release(&mut self, report: &ApplyReport, now: Instant) {
        self.udp_release_retry
            .after_sync(report.udp_flow_releases_pending, now);
    }
}
