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
