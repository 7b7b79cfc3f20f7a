//! Leader election with a `coordination.k8s.io/v1` Lease, so two operator replicas are safe.
//!
//! The rules are client-go's: the holder renews the Lease every `retry_period`; another replica
//! takes it over only when the Lease record has not changed for `lease_duration` as measured by
//! its own clock (never by comparing its clock with the holder's `renewTime`, so clock skew
//! cannot make two leaders); every write carries the `resourceVersion` it read, so of two
//! replicas racing for the same Lease exactly one wins. A leader that has not renewed within
//! `renew_deadline` (shorter than `lease_duration`) stops acting before anyone else may start.

use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::time::Instant;

use crate::error::Error;

/// Timing of the election (client-go's defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTiming {
    /// How long a Lease that stopped changing keeps others away.
    pub lease_duration: Duration,
    /// How long the leader keeps acting without a successful renewal.
    pub renew_deadline: Duration,
    /// How often the Lease is read and renewed.
    pub retry_period: Duration,
}

impl Default for LeaseTiming {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// What a replica does with the Lease it just read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseDecision {
    /// No Lease exists: create it, holding it.
    Create,
    /// The replica holds it: write a new `renewTime`.
    Renew,
    /// Free, released or expired: write the replica as holder (`leaseTransitions` + 1).
    TakeOver,
    /// Someone else holds it.
    Wait { holder: String },
}

/// Decides from the Lease read now, whether its record changed since the last read, and when
/// that last change was seen. Pure: every input is given.
pub fn decide(
    lease: Option<&LeaseSpec>,
    identity: &str,
    record_last_changed_at: Instant,
    now: Instant,
    timing: &LeaseTiming,
) -> LeaseDecision {
    let Some(spec) = lease else {
        return LeaseDecision::Create;
    };
    match spec.holder_identity.as_deref() {
        Some(holder) if holder == identity => LeaseDecision::Renew,
        None | Some("") => LeaseDecision::TakeOver,
        Some(holder) => {
            // The holder's own duration counts when it wrote one: it promised to renew within it.
            let duration = spec
                .lease_duration_seconds
                .and_then(|seconds| u64::try_from(seconds).ok())
                .filter(|seconds| *seconds > 0)
                .map_or(timing.lease_duration, Duration::from_secs);
            if now.duration_since(record_last_changed_at) >= duration {
                LeaseDecision::TakeOver
            } else {
                LeaseDecision::Wait {
                    holder: holder.to_owned(),
                }
            }
        }
    }
}

/// The Lease spec to write for `decision` (`None` for [`LeaseDecision::Wait`]).
pub fn lease_spec_for(
    decision: &LeaseDecision,
    current: Option<&LeaseSpec>,
    identity: &str,
    timing: &LeaseTiming,
    now: DateTime<Utc>,
) -> Option<LeaseSpec> {
    let now = micro_time(now);
    // Whole seconds on the wire, rounded up: a holder never promises less than it keeps.
    let whole_seconds =
        timing.lease_duration.as_secs() + u64::from(timing.lease_duration.subsec_nanos() > 0);
    let duration_seconds = i32::try_from(whole_seconds.max(1)).unwrap_or(i32::MAX);
    match decision {
        LeaseDecision::Wait { .. } => None,
        LeaseDecision::Create => Some(LeaseSpec {
            holder_identity: Some(identity.to_owned()),
            lease_duration_seconds: Some(duration_seconds),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        }),
        LeaseDecision::Renew => {
            let mut spec = current.cloned().unwrap_or_default();
            spec.renew_time = Some(now);
            spec.lease_duration_seconds = Some(duration_seconds);
            Some(spec)
        }
        LeaseDecision::TakeOver => {
            let previous = current.and_then(|spec| spec.lease_transitions).unwrap_or(0);
            Some(LeaseSpec {
                holder_identity: Some(identity.to_owned()),
                lease_duration_seconds: Some(duration_seconds),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(previous.saturating_add(1)),
                ..current.cloned().unwrap_or_default()
            })
        }
    }
}

fn micro_time(time: DateTime<Utc>) -> MicroTime {
    let timestamp =
        Timestamp::from_microsecond(time.timestamp_micros()).unwrap_or(Timestamp::UNIX_EPOCH);
    MicroTime(timestamp)
}

/// One replica's side of the election.
pub struct LeaderElector {
    leases: Api<Lease>,
    name: String,
    identity: String,
    timing: LeaseTiming,
    /// The last record read (holder and renew time), and when it was first seen as it is.
    last_record: Option<(Option<String>, Option<MicroTime>)>,
    record_last_changed_at: Instant,
}

/// The outcome of one round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Round {
    /// This replica holds the Lease (acquired or renewed just now).
    Leading,
    /// Another replica holds it.
    Following { holder: String },
}

impl LeaderElector {
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        timing: LeaseTiming,
    ) -> Self {
        Self {
            leases: Api::namespaced(client, namespace),
            name: name.to_owned(),
            identity: identity.to_owned(),
            timing,
            last_record: None,
            record_last_changed_at: Instant::now(),
        }
    }

    pub fn timing(&self) -> LeaseTiming {
        self.timing
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Reads the Lease and acquires, renews or waits. A lost race (409) is a `Following` round.
    pub async fn try_acquire_or_renew(&mut self) -> Result<Round, Error> {
        let lease = self
            .leases
            .get_opt(&self.name)
            .await
            .map_err(|source| Error::ReadLease {
                source: source.into(),
            })?;
        let now = Instant::now();
        let spec = lease.as_ref().and_then(|lease| lease.spec.as_ref());
        let record = spec.map(|spec| (spec.holder_identity.clone(), spec.renew_time.clone()));
        if record != self.last_record {
            self.last_record = record;
            self.record_last_changed_at = now;
        }
        let decision = decide(
            spec,
            &self.identity,
            self.record_last_changed_at,
            now,
            &self.timing,
        );
        let Some(new_spec) =
            lease_spec_for(&decision, spec, &self.identity, &self.timing, Utc::now())
        else {
            let holder = match decision {
                LeaseDecision::Wait { holder } => holder,
                _ => String::new(),
            };
            return Ok(Round::Following { holder });
        };
        let written = match lease {
            None => {
                let new_lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(new_spec),
                };
                self.leases.create(&PostParams::default(), &new_lease).await
            }
            Some(mut existing) => {
                // `replace` carries the resourceVersion read above: a concurrent writer wins 409.
                existing.spec = Some(new_spec);
                self.leases
                    .replace(&self.name, &PostParams::default(), &existing)
                    .await
            }
        };
        match written {
            Ok(lease) => {
                let spec = lease.spec.as_ref();
                self.last_record =
                    spec.map(|spec| (spec.holder_identity.clone(), spec.renew_time.clone()));
                self.record_last_changed_at = Instant::now();
                Ok(Round::Leading)
            }
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Round::Following {
                holder: "another replica (lost a race for the Lease)".to_owned(),
            }),
            Err(source) => Err(Error::WriteLease {
                source: source.into(),
            }),
        }
    }

    /// Waits until this replica holds the Lease.
    pub async fn acquire(&mut self) -> Result<(), Error> {
        let mut last_holder = None;
        loop {
            let round =
                tokio::time::timeout(self.timing.lease_duration, self.try_acquire_or_renew())
                    .await
                    .unwrap_or_else(|_| {
                        Ok(Round::Following {
                            holder: "unknown (reading the Lease timed out)".to_owned(),
                        })
                    });
            match round {
                Ok(Round::Leading) => {
                    tracing::info!(identity = %self.identity, lease = %self.name, "became the leader");
                    return Ok(());
                }
                Ok(Round::Following { holder }) => {
                    if last_holder.as_ref() != Some(&holder) {
                        tracing::info!(%holder, "waiting for the leader Lease");
                        last_holder = Some(holder);
                    }
                }
                Err(error) => {
                    tracing::warn!(error = %crate::error::describe(&error), "failed to read or write the leader Lease")
                }
            }
            tokio::time::sleep(self.timing.retry_period).await;
        }
    }

    /// Renews every `retry_period` while leading; returns (with the reason) once this replica
    /// can no longer prove it leads: the Lease was taken, or no renewal succeeded within
    /// `renew_deadline`. The caller must stop acting at once.
    pub async fn keep_renewing(&mut self) -> Error {
        // The last write that proved leadership: the acquisition or the last renewal.
        let mut last_renewal = self.record_last_changed_at;
        loop {
            tokio::time::sleep(self.timing.retry_period).await;
            // A request that hangs must not keep this replica acting past its deadline: each
            // round gets only the time left before it.
            let left = self
                .timing
                .renew_deadline
                .saturating_sub(last_renewal.elapsed());
            match tokio::time::timeout(left, self.try_acquire_or_renew()).await {
                Ok(Ok(Round::Leading)) => last_renewal = self.record_last_changed_at,
                Ok(Ok(Round::Following { holder })) => {
                    return Error::LeadershipLost {
                        reason: format!("the Lease is held by {holder}"),
                    }
                }
                Ok(Err(error)) => {
                    tracing::warn!(error = %crate::error::describe(&error), "failed to renew the leader Lease")
                }
                Err(_) => tracing::warn!("renewing the leader Lease did not finish in time"),
            }
            if last_renewal.elapsed() >= self.timing.renew_deadline {
                return Error::LeadershipLost {
                    reason: format!(
                        "no renewal succeeded within {:?}",
                        self.timing.renew_deadline
                    ),
                };
            }
        }
    }

    /// Gives the Lease up (on a clean shutdown), so the other replica takes over at once rather
    /// than after `lease_duration`.
    pub async fn release(&mut self) -> Result<(), Error> {
        let Some(mut lease) =
            self.leases
                .get_opt(&self.name)
                .await
                .map_err(|source| Error::ReadLease {
                    source: source.into(),
                })?
        else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        self.leases
            .replace(&self.name, &PostParams::default(), &lease)
            .await
            .map(|_| ())
            .map_err(|source| Error::WriteLease {
                source: source.into(),
            })
    }
}

#[cfg(test)]
mod tests;

/// The election against an in-process fake of the Lease API (optimistic concurrency as the API
/// server does it: a write with a stale `resourceVersion`, or a create of an existing Lease, is
/// a 409), so races, hangs and takeovers are tested without a cluster.
#[cfg(test)]
mod fake_api_tests;
