//! The Events the agent publishes about its node's DataplaneNode: which transitions deserve one,
//! and how often. Pure: the cluster loop feeds it each status it hands to the writer, and
//! `events_writer` publishes what it returns.
//!
//! Every Event follows from a change of the conditions the agent reports, so `kubectl get
//! events` tells the same story as the conditions' history, and an agent restarted in the middle
//! of a transition compares with the status its previous process wrote (read back) instead of
//! announcing the current state again. A condition reported `Unknown` (rules not read yet, or a
//! failed read) is no news: the last known value stands for it.
//!
//! | transition | Event |
//! | --- | --- |
//! | `Draining` becomes True | `DrainStarted` (Normal) |
//! | `Draining` True → False, `DrainComplete` | `DrainFinished` (Normal) |
//! | `Draining` True → False, `DrainTimeoutExpired` | `DrainFinished` (Warning) |
//! | `Draining` True → False, otherwise (told `Ebpf` again) | `DrainFinished` (Normal) |
//! | `KubeProxyRulesPresent` True → False while `iptablesCleanup` is on | `KubeProxyRulesCleaned` (Normal) |
//! | `KubeProxyRulesPresent` becomes `KubeProxyConflict` while rules were there | `KubeProxyConflict` (Warning): kube-proxy still runs |
//! | `KubeProxyRulesPresent` False → `KubeProxyConflict` | `KubeProxyConflict` and `KubeProxyCleanupStopped` (Warning): the rules came back, the agent stops cleaning |
//! | `iptablesCleanup` turned off | `KubeProxyCleanupStopped` (Normal) |
//!
//! Repeats are limited twice over, as client-go's `EventCorrelator` does in two stages:
//! - aggregation: the messages are stable (no counts, no times), so the same Event again gets
//!   the same name (see [`switchyard_telemetry::events::event_name`]) and bumps `count` on the
//!   existing object instead of creating another;
//! - a rate limit per reason ([`RateLimiter`]), so that a flapping condition (a kube-proxy
//!   crash-looping beside a cleanup, a mode flipped back and forth) cannot flood the API server.
//!   Dropped Events are only logged: the conditions always say the current state.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use switchyard_crds::{condition_types, find_condition, reasons, Condition, ConditionStatus};
use switchyard_telemetry::events::Occurrence;

/// The reasons of the agent's Events.
pub mod event_reasons {
    pub const DRAIN_STARTED: &str = "DrainStarted";
    pub const DRAIN_FINISHED: &str = "DrainFinished";
    pub const KUBE_PROXY_RULES_CLEANED: &str = "KubeProxyRulesCleaned";
    pub const KUBE_PROXY_CONFLICT: &str = "KubeProxyConflict";
    pub const KUBE_PROXY_CLEANUP_STOPPED: &str = "KubeProxyCleanupStopped";
}

use event_reasons::*;

/// What the agent reported after a round: the conditions handed to the status writer, and
/// whether the DataplaneNode asks for kube-proxy's rules to be cleaned.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reported {
    pub conditions: Vec<Condition>,
    /// `Some(generation)` while the spec says `iptablesCleanup: true`.
    pub cleanup_generation: Option<i64>,
}

/// The Events that the change from `previous` to `current` deserves, in the order they happened
/// (a drain's start before its end is impossible in one change, so the order is by kind).
pub fn occurrences(previous: &Reported, current: &Reported) -> Vec<Occurrence> {
    let mut found = Vec::new();
    found.extend(drain(
        find_condition(&previous.conditions, condition_types::DRAINING),
        find_condition(&current.conditions, condition_types::DRAINING),
    ));
    found.extend(kube_proxy_rules(previous, current));
    if previous.cleanup_generation.is_some() && current.cleanup_generation.is_none() {
        found.push(Occurrence::normal(
            KUBE_PROXY_CLEANUP_STOPPED,
            "StopCleanup",
            "iptablesCleanup was turned off: the agent no longer removes kube-proxy's rules, so kube-proxy can take this node back",
        ));
    }
    found
}

fn is_true(condition: Option<&Condition>) -> bool {
    condition.is_some_and(|condition| condition.status == ConditionStatus::True)
}

fn is_false(condition: Option<&Condition>) -> bool {
    condition.is_some_and(|condition| condition.status == ConditionStatus::False)
}

fn drain(previous: Option<&Condition>, current: Option<&Condition>) -> Option<Occurrence> {
    if !is_true(previous) && is_true(current) {
        return Some(Occurrence::normal(
            DRAIN_STARTED,
            "Drain",
            "told KubeProxy: the eBPF programs keep translating the live flows they carry until they end or the drain timeout passes; new connections go to kube-proxy's rules",
        ));
    }
    if !(is_true(previous) && is_false(current)) {
        return None;
    }
    let reason = current.map(|condition| condition.reason.as_str());
    Some(if reason == Some(reasons::DRAIN_TIMEOUT_EXPIRED) {
        Occurrence::warning(
            DRAIN_FINISHED,
            "Detach",
            "the drain timeout passed with live flows left: the programs detached, and the connections still open lost their eBPF translation",
        )
    } else if reason == Some(reasons::DRAIN_COMPLETE) {
        Occurrence::normal(
            DRAIN_FINISHED,
            "Detach",
            "no live flow was left: the programs detached, and kube-proxy's rules serve every connection",
        )
    } else {
        Occurrence::normal(
            DRAIN_FINISHED,
            "Attach",
            "the drain ended before the programs detached: the node was told Ebpf again, so the programs serve every connection",
        )
    })
}

fn kube_proxy_rules(previous: &Reported, current: &Reported) -> Vec<Occurrence> {
    let before = find_condition(
        &previous.conditions,
        condition_types::KUBE_PROXY_RULES_PRESENT,
    );
    let after = find_condition(
        &current.conditions,
        condition_types::KUBE_PROXY_RULES_PRESENT,
    );
    let conflict = |condition: Option<&Condition>| {
        condition.is_some_and(|condition| condition.reason == reasons::KUBE_PROXY_CONFLICT)
    };
    if current.cleanup_generation.is_some() && is_true(before) && is_false(after) {
        return vec![Occurrence::normal(
            KUBE_PROXY_RULES_CLEANED,
            "CleanKubeProxyRules",
            "kube-proxy's Service rules are gone from this node: the agent removed them (iptablesCleanup) after kube-proxy had left",
        )];
    }
    if !conflict(after) || conflict(before) {
        return Vec::new();
    }
    if is_false(before) {
        // The rules were gone (cleaned, or found clean) and are back: kube-proxy runs again. The
        // cleanup state machine stops for this request (`kube_proxy::detection`).
        vec![
            Occurrence::warning(
                KUBE_PROXY_CONFLICT,
                "CleanKubeProxyRules",
                "kube-proxy's rules came back after the cleanup: kube-proxy runs on this node again",
            ),
            Occurrence::warning(
                KUBE_PROXY_CLEANUP_STOPPED,
                "StopCleanup",
                "the agent stopped cleaning kube-proxy's rules on this node, so as never to fight kube-proxy; it cleans again only when asked again (a new DataplaneNode generation with iptablesCleanup)",
            ),
        ]
    } else {
        vec![Occurrence::warning(
            KUBE_PROXY_CONFLICT,
            "CleanKubeProxyRules",
            "iptablesCleanup is on but kube-proxy still answers on its healthz port: the agent does not remove its rules while it runs",
        )]
    }
}

/// At most [`RateLimiter::BURST`] Events of one reason at once, then one more per
/// [`RateLimiter::REFILL`]: a token bucket per reason, as client-go's spam filter keeps one per
/// object (there, a burst of 25 and one per 5 minutes; the agent's object is its one
/// DataplaneNode, so per reason is the finer key).
///
/// Why these numbers: a transition gives each reason at most one Event per node, and a user
/// going there and back a few times in a row (the demo, the e2e suites) must see every one, so a
/// burst of 5. A flapping condition gets one Event per reason every 5 minutes after that (12 an
/// hour at most), enough to show it still flaps, too few to load the API server or bury other
/// Events.
#[derive(Clone, Debug, Default)]
pub struct RateLimiter {
    buckets: BTreeMap<String, Bucket>,
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: u32,
    /// When the last token was counted as regained (or the bucket made).
    refilled_at: Instant,
}

impl RateLimiter {
    pub const BURST: u32 = 5;
    pub const REFILL: Duration = Duration::from_secs(5 * 60);

    /// Whether an Event of `reason` may be published at `now` (and if so, takes its token).
    pub fn allow(&mut self, reason: &str, now: Instant) -> bool {
        let bucket = self.buckets.entry(reason.to_owned()).or_insert(Bucket {
            tokens: Self::BURST,
            refilled_at: now,
        });
        let elapsed = now.saturating_duration_since(bucket.refilled_at);
        let regained = elapsed.as_nanos() / Self::REFILL.as_nanos();
        if regained > 0 {
            let regained = u32::try_from(regained).unwrap_or(u32::MAX);
            bucket.tokens = bucket.tokens.saturating_add(regained).min(Self::BURST);
            // Keep the fraction of a period already waited for the next token.
            bucket.refilled_at += Self::REFILL * regained.min(Self::BURST);
            if bucket.tokens == Self::BURST {
                bucket.refilled_at = now;
            }
        }
        if bucket.tokens == 0 {
            return false;
        }
        bucket.tokens -= 1;
        true
    }
}

/// `current`, with every condition it reports `Unknown` replaced by the one `previous` knew.
/// `Unknown` is no news: the rules not read yet after a start (`NotYetChecked`) or a failed read
/// (`RulesUnreadable`). Compared as such, a conflict going on across a restart or a failed read
/// would be announced again when the next read finds it.
fn known_or_previous(previous: &Reported, mut current: Reported) -> Reported {
    for condition in &mut current.conditions {
        if condition.status != ConditionStatus::Unknown {
            continue;
        }
        if let Some(known) = find_condition(&previous.conditions, &condition.type_) {
            *condition = known.clone();
        }
    }
    current
}

/// The agent's Event decisions between rounds: the last report and the rate limit.
#[derive(Clone, Debug, Default)]
pub struct EventDecisions {
    last: Option<Reported>,
    limiter: RateLimiter,
}

/// The decisions of one report: what to publish, and what the rate limit dropped.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decided {
    pub publish: Vec<Occurrence>,
    pub suppressed: Vec<Occurrence>,
}

impl EventDecisions {
    /// The Events for `current`, the report the agent just handed to the status writer. The
    /// first report is compared with `read_back`, the conditions a previous process wrote (with
    /// the same cleanup request, which a restart does not change): a restart announces nothing
    /// that had already happened.
    pub fn after_report(
        &mut self,
        current: Reported,
        read_back: Option<&[Condition]>,
        now: Instant,
    ) -> Decided {
        let previous = self.last.take().unwrap_or_else(|| Reported {
            conditions: read_back.map(<[Condition]>::to_vec).unwrap_or_default(),
            cleanup_generation: current.cleanup_generation,
        });
        let current = known_or_previous(&previous, current);
        let (publish, suppressed) = occurrences(&previous, &current)
            .into_iter()
            .partition(|occurrence| self.limiter.allow(&occurrence.reason, now));
        self.last = Some(current);
        Decided {
            publish,
            suppressed,
        }
    }
}

#[cfg(test)]
mod tests;
