use super::*;
use std::io::{Error, ErrorKind};

#[test]
fn failure_times_are_shown_as_utc_time_of_day() {
    // 2026-11-22T05:05:47.512Z
    let at = std::time::UNIX_EPOCH + Duration::from_millis(1_795_323_947_512);
    assert_eq!(time_of_day(at), "05:05:47.512");
}

#[test]
fn io_errors_map_to_their_causes() {
    for (error, cause) in [
        (
            Error::from(ErrorKind::ConnectionRefused),
            FailureCause::ConnectionRefused,
        ),
        (
            Error::from(ErrorKind::ConnectionReset),
            FailureCause::ConnectionReset,
        ),
        (
            Error::from(ErrorKind::BrokenPipe),
            FailureCause::ConnectionReset,
        ),
        (
            Error::from(ErrorKind::UnexpectedEof),
            FailureCause::ClosedByPeer,
        ),
        (
            Error::from_raw_os_error(libc::EHOSTUNREACH),
            FailureCause::HostUnreachable,
        ),
    ] {
        assert_eq!(classify_io_error(&error), cause, "{error}");
    }
    assert!(matches!(
        classify_io_error(&Error::other("odd")),
        FailureCause::Other(_)
    ));
}

#[test]
fn an_answer_must_echo_the_message_and_name_a_backend() {
    assert_eq!(
        parse_answer("backend-2 probe-7", "probe-7"),
        Ok("backend-2".to_string())
    );
    assert_eq!(
        parse_answer("backend-2 probe-6", "probe-7"),
        Err(FailureCause::WrongReply("backend-2 probe-6".into()))
    );
    assert!(parse_answer("garbage", "probe-7").is_err());
}

/// A generator of one flow `name` of short connections from `source` to `destination`.
fn short_connections(
    name: &str,
    source: NamespaceThread,
    destination: SocketAddr,
    interval: Duration,
    workers: usize,
) -> TrafficGenerator {
    TrafficGenerator::start(
        vec![Flow {
            name: name.into(),
            source,
            destination,
            mode: FlowMode::ShortConnections { interval, workers },
        }],
        Timeouts::default(),
    )
}

async fn loopback_server(name: &str) -> (NamespaceThread, EchoServer) {
    let thread = NamespaceThread::start(None).unwrap();
    let server = EchoServer::start(&thread, "127.0.0.1:0".parse().unwrap(), name)
        .await
        .unwrap();
    (thread, server)
}

#[tokio::test]
async fn short_connections_to_a_live_server_all_succeed() {
    let (thread, server) = loopback_server("backend-a").await;
    let generator = short_connections(
        "loopback",
        thread,
        server.address,
        Duration::from_millis(10),
        2,
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let report = generator.stop().await;
    server.stop().await;
    let flow = &report.flows["loopback"];
    assert!(flow.attempts >= 10, "{report}");
    assert_eq!(report.failure_count(), 0, "{report}");
    assert_eq!(flow.backends.keys().collect::<Vec<_>>(), vec!["backend-a"]);
}

#[tokio::test]
async fn a_worker_that_panicked_is_counted_as_a_failure_of_its_flow() {
    let (thread, server) = loopback_server("backend-a").await;
    let mut generator = short_connections(
        "loopback",
        thread,
        server.address,
        Duration::from_millis(10),
        1,
    );
    generator.spawn_worker("loopback", async { panic!("the worker broke") });
    // Control: the healthy worker of the same flow keeps answering.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while generator.snapshot().flows["loopback"].successes < 3 {
        assert!(tokio::time::Instant::now() < deadline, "no answers in 10 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let report = generator.stop().await;
    server.stop().await;
    let flow = &report.flows["loopback"];
    assert!(flow.successes >= 3, "{report}");
    assert_eq!(report.failure_count(), 1, "{report}");
    assert_eq!(
        flow.failures[0].cause,
        FailureCause::WorkerDied("panicked: the worker broke".into()),
        "{report}"
    );
}

#[tokio::test]
async fn every_refused_connection_is_counted_with_its_time_and_cause() {
    let (thread, server) = loopback_server("backend-a").await;
    let destination = server.address;
    server.stop().await;
    let generator = short_connections("dead", thread, destination, Duration::from_millis(20), 1);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let report = generator.stop().await;
    let flow = &report.flows["dead"];
    assert!(flow.attempts >= 3, "{report}");
    assert_eq!(flow.successes, 0);
    assert_eq!(report.failure_count() as u64, flow.attempts);
    assert_eq!(
        report.failures_by_cause().keys().collect::<Vec<_>>(),
        vec![&FailureCause::ConnectionRefused]
    );
    let times: Vec<Duration> = flow.failures.iter().map(|failure| failure.after).collect();
    assert!(times.windows(2).all(|pair| pair[0] <= pair[1]), "{times:?}");
}

#[tokio::test]
async fn a_long_lived_connection_that_breaks_is_counted_and_reopened() {
    let (thread, server) = loopback_server("backend-a").await;
    let address = server.address;
    let generator = TrafficGenerator::start(
        vec![Flow {
            name: "long".into(),
            source: thread.clone(),
            destination: address,
            mode: FlowMode::LongLived {
                connections: 1,
                message_interval: Duration::from_millis(20),
            },
        }],
        Timeouts::default(),
    );
    tokio::time::sleep(Duration::from_millis(150)).await;
    let before = generator.snapshot();
    assert!(before.flows["long"].successes >= 3, "{before}");
    assert_eq!(before.flows["long"].connections_opened, 1, "{before}");
    // Closing the server breaks the open connection; a new server on the
    // same port takes the reconnect.
    server.stop().await;
    tokio::time::sleep(Duration::from_millis(60)).await;
    let replacement = EchoServer::start(&thread, address, "backend-b")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let report = generator.stop().await;
    replacement.stop().await;
    let flow = &report.flows["long"];
    assert!(!flow.failures.is_empty(), "{report}");
    assert!(flow.connections_opened >= 2, "{report}");
    assert!(flow.backends.contains_key("backend-b"), "{report}");
}

#[test]
fn a_datagram_message_has_the_size_asked_and_starts_with_its_sequence() {
    let message = datagram_message(7, 4_000);
    assert_eq!(message.len(), 4_000);
    assert!(message.starts_with("datagram-7-."), "{}", &message[..20]);
    assert_eq!(
        datagram_message(12, 3),
        "datagram-12-",
        "never shorter than its prefix"
    );
}

#[tokio::test]
async fn a_server_naming_the_peer_answers_with_the_clients_address() {
    let thread = NamespaceThread::start(None).unwrap();
    let server = EchoServer::start_naming_peer(&thread, "127.0.0.1:0".parse().unwrap(), "b")
        .await
        .unwrap();
    let answer = exchange_once(&thread, server.address, Timeouts::default()).await;
    server.stop().await;
    assert_eq!(answer, Ok("b@127.0.0.1".to_string()));
}

#[tokio::test]
async fn datagrams_of_four_thousand_bytes_are_echoed_whole_by_a_udp_server() {
    let thread = NamespaceThread::start(None).unwrap();
    let server = UdpEchoServer::start(&thread, "127.0.0.1:0".parse().unwrap(), "udp-a")
        .await
        .unwrap();
    let generator = TrafficGenerator::start(
        vec![Flow {
            name: "datagrams".into(),
            source: thread,
            destination: server.address,
            mode: FlowMode::Datagrams {
                interval: Duration::from_millis(10),
                workers: 2,
                size: 4_000,
            },
        }],
        Timeouts::default(),
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while generator.snapshot().flows["datagrams"].successes < 10 {
        assert!(tokio::time::Instant::now() < deadline, "no answers in 10 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let report = generator.stop().await;
    server.stop().await;
    assert_eq!(report.failure_count(), 0, "{report}");
    assert_eq!(
        report.flows["datagrams"]
            .backends
            .keys()
            .collect::<Vec<_>>(),
        vec!["udp-a"]
    );
}

#[tokio::test]
async fn a_datagram_to_a_closed_port_is_refused_and_one_never_answered_times_out() {
    let thread = NamespaceThread::start(None).unwrap();
    // A port nothing listens on: the kernel answers with port unreachable, which the
    // connected socket reports.
    let closed = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let closed_address = closed.local_addr().unwrap();
    drop(closed);
    let message = datagram_message(1, 4_000);
    assert_eq!(
        datagram_exchange(&thread, closed_address, &message, Timeouts::default()).await,
        Err(FailureCause::ConnectionRefused)
    );
    // A socket that reads nothing: no ICMP error, no answer.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let timeouts = Timeouts {
        connect: Duration::from_millis(100),
        reply: Duration::from_millis(100),
    };
    assert_eq!(
        datagram_exchange(&thread, silent.local_addr().unwrap(), &message, timeouts).await,
        Err(FailureCause::ReplyTimeout)
    );
    // Control: the same datagram to an echo server is answered.
    let server = UdpEchoServer::start(&thread, "127.0.0.1:0".parse().unwrap(), "udp-b")
        .await
        .unwrap();
    assert_eq!(
        datagram_exchange(&thread, server.address, &message, Timeouts::default()).await,
        Ok("udp-b".to_string())
    );
    server.stop().await;
}
