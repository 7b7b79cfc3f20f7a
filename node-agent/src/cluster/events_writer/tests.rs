use std::sync::{Arc, Mutex, PoisonError};

use switchyard_telemetry::Health;

use super::*;

fn request(reason: &str) -> EventRequest {
    EventRequest {
        involved: dataplane_node_reference("node-1", Some("uid-1")),
        occurrence: Occurrence::normal(reason, "Drain", "message"),
    }
}

/// The reasons of every try, in order, shared with the test.
type Tries = Arc<Mutex<Vec<String>>>;

fn tries_of(tries: &Tries) -> Vec<String> {
    tries.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

/// A writer whose API server never answers an Event of reason `Stuck`, refuses `Refused`
/// and records every other.
fn spawn_writer(health: &Health, bound: Duration) -> (mpsc::Sender<EventRequest>, Tries) {
    let tries = Tries::default();
    let seen = Arc::clone(&tries);
    let publish = move |request: EventRequest| {
        let seen = Arc::clone(&seen);
        async move {
            let reason = request.occurrence.reason;
            seen.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(reason.clone());
            match reason.as_str() {
                "Stuck" => std::future::pending().await,
                "Refused" => Err(std::io::Error::other("forbidden")),
                _ => Ok(()),
            }
        }
    };
    let (sender, requests) = mpsc::channel(QUEUE_CAPACITY);
    tokio::spawn(run_event_writer(
        publish,
        requests,
        health.register_loop("event writer", bound),
    ));
    (sender, tries)
}

/// Lets the writer task run (time stays paused) until `condition` holds; false if it
/// still does not after far more polls than the writer ever needs for one step.
async fn runs_until(condition: impl Fn() -> bool) -> bool {
    for _ in 0..10_000 {
        if condition() {
            return true;
        }
        tokio::task::yield_now().await;
    }
    condition()
}

#[tokio::test(start_paused = true)]
async fn an_event_never_answered_is_tried_three_times_then_dropped_and_the_next_is_written() {
    let (sender, tries) = spawn_writer(&Health::new(), Duration::from_secs(60));
    sender.send(request("Stuck")).await.expect("queued");
    sender.send(request("DrainStarted")).await.expect("queued");
    // Three tries of 30 s and backoffs of 1 s and 2 s.
    tokio::time::sleep(PUBLISH_TIMEOUT * 3 + Duration::from_secs(4)).await;
    runs_until(|| tries_of(&tries).len() >= 4).await;
    assert_eq!(
        tries_of(&tries),
        ["Stuck", "Stuck", "Stuck", "DrainStarted"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_refused_event_is_retried_and_a_written_one_is_not() {
    let (sender, tries) = spawn_writer(&Health::new(), Duration::from_secs(60));
    sender.send(request("Refused")).await.expect("queued");
    sender.send(request("DrainFinished")).await.expect("queued");
    tokio::time::sleep(Duration::from_secs(10)).await;
    runs_until(|| tries_of(&tries).len() >= 4).await;
    assert_eq!(
        tries_of(&tries),
        ["Refused", "Refused", "Refused", "DrainFinished"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_try_in_flight_is_a_step_of_the_heartbeat_and_the_backoff_after_it_is_not() {
    let health = Health::new();
    // A bound below the try's timeout, so that a try in flight shows as stuck.
    let (sender, tries) = spawn_writer(&health, Duration::from_secs(10));
    assert!(health.is_live(), "an idle writer is live");
    sender.send(request("Stuck")).await.expect("queued");
    assert!(
        runs_until(|| tries_of(&tries).len() == 1).await,
        "the try never started"
    );
    tokio::time::advance(Duration::from_secs(15)).await;
    assert!(!health.is_live(), "15 s into a try bounded at 10 s");
    // The try gives up at 30 s; the backoff of 1 s that follows is waiting.
    tokio::time::advance(Duration::from_millis(15_500)).await;
    assert!(
        runs_until(|| health.is_live()).await,
        "{:?}",
        health.liveness()
    );
}
