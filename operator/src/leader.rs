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
mod tests {
    use super::*;

    fn held_by(holder: &str, duration_seconds: Option<i32>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: duration_seconds,
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn a_missing_lease_is_created() {
        let now = Instant::now();
        assert_eq!(
            decide(None, "a", now, now, &LeaseTiming::default()),
            LeaseDecision::Create
        );
    }

    #[test]
    fn the_holder_renews() {
        let now = Instant::now();
        assert_eq!(
            decide(
                Some(&held_by("a", Some(15))),
                "a",
                now,
                now,
                &LeaseTiming::default()
            ),
            LeaseDecision::Renew
        );
    }

    #[test]
    fn a_lease_held_by_another_replica_keeps_this_one_waiting_until_it_stops_changing_for_its_duration(
    ) {
        let timing = LeaseTiming::default();
        let seen = Instant::now();
        let lease = held_by("b", Some(15));
        assert_eq!(
            decide(
                Some(&lease),
                "a",
                seen,
                seen + Duration::from_secs(14),
                &timing
            ),
            LeaseDecision::Wait { holder: "b".into() }
        );
        assert_eq!(
            decide(
                Some(&lease),
                "a",
                seen,
                seen + Duration::from_secs(15),
                &timing
            ),
            LeaseDecision::TakeOver
        );
    }

    #[test]
    fn the_holders_own_lease_duration_counts_over_ours() {
        let timing = LeaseTiming::default();
        let seen = Instant::now();
        let lease = held_by("b", Some(60));
        assert!(matches!(
            decide(
                Some(&lease),
                "a",
                seen,
                seen + Duration::from_secs(30),
                &timing
            ),
            LeaseDecision::Wait { .. }
        ));
    }

    #[test]
    fn a_released_lease_is_taken_over_at_once() {
        let now = Instant::now();
        let released = LeaseSpec {
            holder_identity: None,
            ..LeaseSpec::default()
        };
        assert_eq!(
            decide(Some(&released), "a", now, now, &LeaseTiming::default()),
            LeaseDecision::TakeOver
        );
        let emptied = held_by("", Some(15));
        assert_eq!(
            decide(Some(&emptied), "a", now, now, &LeaseTiming::default()),
            LeaseDecision::TakeOver
        );
    }

    #[test]
    fn taking_over_counts_a_transition_and_renewing_does_not() {
        let timing = LeaseTiming::default();
        let now = Utc::now();
        let mut current = held_by("b", Some(15));
        current.lease_transitions = Some(4);
        let taken =
            lease_spec_for(&LeaseDecision::TakeOver, Some(&current), "a", &timing, now).unwrap();
        assert_eq!(taken.holder_identity.as_deref(), Some("a"));
        assert_eq!(taken.lease_transitions, Some(5));
        let renewed =
            lease_spec_for(&LeaseDecision::Renew, Some(&taken), "a", &timing, now).unwrap();
        assert_eq!(renewed.lease_transitions, Some(5));
        assert_eq!(renewed.holder_identity.as_deref(), Some("a"));
        assert!(renewed.renew_time.is_some());
        assert_eq!(
            lease_spec_for(
                &LeaseDecision::Wait { holder: "b".into() },
                Some(&current),
                "a",
                &timing,
                now
            ),
            None
        );
    }

    #[test]
    fn a_leader_stops_acting_before_anyone_else_may_start() {
        let timing = LeaseTiming::default();
        assert!(timing.renew_deadline < timing.lease_duration);
        assert!(timing.retry_period < timing.renew_deadline);
    }
}

/// The election against an in-process fake of the Lease API (optimistic concurrency as the API
/// server does it: a write with a stale `resourceVersion`, or a create of an existing Lease, is
/// a 409), so races, hangs and takeovers are tested without a cluster.
#[cfg(test)]
mod fake_api_tests {
    use super::*;
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper::{Request, Response, StatusCode};
    use serde_json::{json, Value};

    #[derive(Default)]
    struct FakeLeases {
        lease: Mutex<Option<Value>>,
        resource_version: Mutex<u64>,
        hang: AtomicBool,
    }

    fn status(code: StatusCode, reason: &str) -> Response<Full<Bytes>> {
        let body = json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code.as_u16(), "message": reason });
        let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
        *response.status_mut() = code;
        response
    }

    fn ok(code: StatusCode, value: &Value) -> Response<Full<Bytes>> {
        let mut response = Response::new(Full::new(Bytes::from(value.to_string())));
        *response.status_mut() = code;
        response
    }

    async fn serve(
        fake: Arc<FakeLeases>,
        request: Request<hyper::body::Incoming>,
    ) -> Result<Response<Full<Bytes>>, Infallible> {
        if fake.hang.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        let method = request.method().clone();
        let body: Value = match request.into_body().collect().await {
            Ok(collected) => serde_json::from_slice(&collected.to_bytes()).unwrap_or(Value::Null),
            Err(_) => Value::Null,
        };
        let mut lease = fake.lease.lock().unwrap();
        let mut version = fake.resource_version.lock().unwrap();
        let response = match method.as_str() {
            "GET" => match lease.as_ref() {
                Some(stored) => ok(StatusCode::OK, stored),
                None => status(StatusCode::NOT_FOUND, "NotFound"),
            },
            "POST" if lease.is_some() => status(StatusCode::CONFLICT, "AlreadyExists"),
            "PUT"
                if lease
                    .as_ref()
                    .map(|stored| &stored["metadata"]["resourceVersion"])
                    != Some(&body["metadata"]["resourceVersion"]) =>
            {
                status(StatusCode::CONFLICT, "Conflict")
            }
            "POST" | "PUT" => {
                *version += 1;
                let mut stored = body;
                stored["metadata"]["resourceVersion"] = json!(version.to_string());
                *lease = Some(stored.clone());
                ok(
                    if method == "POST" {
                        StatusCode::CREATED
                    } else {
                        StatusCode::OK
                    },
                    &stored,
                )
            }
            _ => status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed"),
        };
        Ok(response)
    }

    async fn fake_api() -> (Client, Arc<FakeLeases>) {
        let fake = Arc::new(FakeLeases::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let served = fake.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let fake = served.clone();
                tokio::spawn(async move {
                    let service =
                        hyper::service::service_fn(move |request| serve(fake.clone(), request));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        let client = Client::try_from(kube::Config::new(
            format!("http://{address}").parse().unwrap(),
        ))
        .unwrap();
        (client, fake)
    }

    fn fast() -> LeaseTiming {
        LeaseTiming {
            lease_duration: Duration::from_millis(1000),
            renew_deadline: Duration::from_millis(300),
            retry_period: Duration::from_millis(50),
        }
    }

    fn elector(client: &Client, identity: &str) -> LeaderElector {
        LeaderElector::new(
            client.clone(),
            "switchyard-system",
            "switchyard-operator",
            identity,
            fast(),
        )
    }

    fn holder(fake: &FakeLeases) -> Option<String> {
        fake.lease
            .lock()
            .unwrap()
            .as_ref()
            .and_then(|lease| lease["spec"]["holderIdentity"].as_str().map(str::to_owned))
    }

    #[tokio::test]
    async fn two_replicas_racing_for_the_lease_never_lead_at_once() {
        let (client, fake) = fake_api().await;
        let mut first = elector(&client, "replica-1");
        let mut second = elector(&client, "replica-2");
        for round in 0..10 {
            let (one, two) =
                tokio::join!(first.try_acquire_or_renew(), second.try_acquire_or_renew());
            let leaders = [one.unwrap(), two.unwrap()]
                .iter()
                .filter(|round| **round == Round::Leading)
                .count();
            assert!(leaders <= 1, "round {round}: two leaders");
            if round > 0 {
                assert_eq!(leaders, 1, "round {round}: the holder must keep renewing");
            }
        }
        let lease_holder = holder(&fake).unwrap();
        assert!(lease_holder == "replica-1" || lease_holder == "replica-2");
    }

    #[tokio::test]
    async fn a_follower_takes_over_only_after_the_holder_stops_renewing_for_the_lease_duration() {
        let (client, fake) = fake_api().await;
        let mut first = elector(&client, "replica-1");
        let mut second = elector(&client, "replica-2");
        first.acquire().await.unwrap();
        assert_eq!(
            second.try_acquire_or_renew().await.unwrap(),
            Round::Following {
                holder: "replica-1".into()
            }
        );
        // replica-1 stops renewing (it died): replica-2 waits the whole lease duration.
        let stopped = Instant::now();
        second.acquire().await.unwrap();
        assert!(
            stopped.elapsed() >= fast().lease_duration,
            "took over after {:?}",
            stopped.elapsed()
        );
        assert_eq!(holder(&fake).as_deref(), Some("replica-2"));
        let transitions =
            fake.lease.lock().unwrap().as_ref().unwrap()["spec"]["leaseTransitions"].as_i64();
        assert_eq!(transitions, Some(1));
    }

    #[tokio::test]
    async fn a_leader_whose_lease_was_taken_stops_at_its_next_renewal() {
        let (client, fake) = fake_api().await;
        let mut leader = elector(&client, "replica-1");
        leader.acquire().await.unwrap();
        {
            let mut lease = fake.lease.lock().unwrap();
            lease.as_mut().unwrap()["spec"]["holderIdentity"] = json!("replica-2");
        }
        let lost = tokio::time::timeout(Duration::from_secs(2), leader.keep_renewing())
            .await
            .unwrap();
        assert!(
            matches!(&lost, Error::LeadershipLost { reason } if reason.contains("replica-2")),
            "{lost}"
        );
    }

    #[tokio::test]
    async fn a_leader_that_cannot_renew_stops_within_its_renew_deadline() {
        let (client, fake) = fake_api().await;
        let mut leader = elector(&client, "replica-1");
        leader.acquire().await.unwrap();
        // The API server stops answering (requests hang, they do not fail).
        fake.hang.store(true, Ordering::SeqCst);
        let started = Instant::now();
        let lost = tokio::time::timeout(Duration::from_secs(5), leader.keep_renewing())
            .await
            .expect("a leader whose renewals hang must give up");
        assert!(matches!(lost, Error::LeadershipLost { .. }));
        let timing = fast();
        assert!(
            started.elapsed() < timing.renew_deadline + timing.retry_period * 2,
            "stopped acting only after {:?}",
            started.elapsed()
        );
        // Another replica may only take over after the lease duration: the leader has stopped
        // before then.
        assert!(timing.renew_deadline + timing.retry_period * 2 < timing.lease_duration);
    }

    #[tokio::test]
    async fn a_released_lease_is_taken_over_without_waiting() {
        let (client, _fake) = fake_api().await;
        let mut first = elector(&client, "replica-1");
        let mut second = elector(&client, "replica-2");
        first.acquire().await.unwrap();
        assert!(matches!(
            second.try_acquire_or_renew().await.unwrap(),
            Round::Following { .. }
        ));
        first.release().await.unwrap();
        assert_eq!(second.try_acquire_or_renew().await.unwrap(), Round::Leading);
    }
}
