//! Privileged test of the coexistence loop as the cluster-mode agent runs it
//! (`cluster::coexist::run_coexistence`): kube-proxy's health ports and its metrics
//! address are handed back together, before the loop reports that it acted on the spec
//! that took them away, so the
//! agent reports that spec as observed (and the operator restores kube-proxy) only
//! with the ports free. A private network namespace (see `kube_proxy_support`):
//! ports 10256 and 10249 and the `healthCheckNodePort` are the namespace's own. Run by
//! `make coexist-test`.

mod kube_proxy_support;

use std::{
    net::{Ipv4Addr, TcpListener},
    time::{Duration, Instant, SystemTime},
};

use kube_proxy_support::*;
use switchyard_agent::cluster::coexist::{run_coexistence, CoexistenceSettings};
use switchyard_agent::core::round::CoexistenceRequest;
use switchyard_agent::core::status::{CoexistenceProgress, CoexistenceReport};
use switchyard_agent::kube_proxy::{
    detection::KubeProxyHealth,
    health::{HealthzTarget, LocalServiceHealth, DEFAULT_HEALTHZ_URL},
    health_server::probe_kube_proxy,
    metrics::{KubeProxyMetrics, KUBE_PROXY_METRICS_ADDRESS},
    metrics_server::KubeProxyMetricsPort,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::watch;

const HEALTH_CHECK_NODE_PORT: u16 = 32100;

fn request(generation: i64, cleanup: bool) -> CoexistenceRequest {
    CoexistenceRequest {
        spec_generation: Some(generation),
        cleanup_generation: cleanup.then_some(generation),
        health_ports_permitted: cleanup,
        serving_from_ebpf: true,
        netfilter_chains_wanted: false,
        healthy: true,
        last_sync: SystemTime::now(),
        services: vec![LocalServiceHealth {
            health_check_node_port: HEALTH_CHECK_NODE_PORT,
            namespace: "default".into(),
            name: "local-lb".into(),
            local_endpoints: 1,
        }],
    }
}

/// Waits (up to 20 s) for a report of a round on `generation`.
async fn report_on(
    reports: &mut watch::Receiver<CoexistenceReport>,
    generation: i64,
) -> CoexistenceReport {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let report = reports.borrow_and_update().clone();
        if report.progress == CoexistenceProgress::ActedOn(Some(generation)) {
            return report;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "no round on generation {generation}: {report:?}"
        );
        let _ = tokio::time::timeout(left, reports.changed()).await;
    }
}

fn port_is_free(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).is_ok()
}

#[test]
#[ignore = "privileged netns test: run by make coexist-test"]
fn a_spec_taking_cleanup_away_is_acted_on_only_once_kube_proxys_ports_are_free() {
    run_isolated(
        "a_spec_taking_cleanup_away_is_acted_on_only_once_kube_proxys_ports_are_free",
        || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let health = switchyard_telemetry::Health::new();
                let settings = CoexistenceSettings {
                    // Long: every round here is one the test asked for.
                    round_interval: Duration::from_secs(600),
                    kube_proxy_healthz: HealthzTarget::parse(DEFAULT_HEALTHZ_URL).unwrap(),
                    masquerade_mark: 0x4000,
                    serve_replacement_healthz: true,
                    healthz_port: 10256,
                    kube_proxy_metrics: Some(KubeProxyMetricsPort::new(
                        KUBE_PROXY_METRICS_ADDRESS.parse().unwrap(),
                        &KubeProxyMetrics::new().unwrap(),
                    )),
                    absence_confirmation: Duration::from_millis(300),
                    heartbeat: health.register_loop("coexistence", Duration::from_secs(60)),
                };
                let (requests, request_receiver) = watch::channel(request(2, true));
                let (report_sender, mut reports) = watch::channel(CoexistenceReport {
                    progress: CoexistenceProgress::NoRoundYet,
                    ..CoexistenceReport::default()
                });
                let coexistence =
                    tokio::spawn(run_coexistence(settings, request_receiver, report_sender));

                // kube-proxy has left a clean node and the spec permits the ports: the
                // agent serves them (the control: the ports are really taken).
                report_on(&mut reports, 2).await;
                assert!(
                    !port_is_free(10256),
                    "the agent serves kube-proxy's healthz"
                );
                assert!(!port_is_free(HEALTH_CHECK_NODE_PORT));
                assert!(
                    !port_is_free(10249),
                    "the agent serves kube-proxy's metrics address"
                );
                let healthz = HealthzTarget::parse(DEFAULT_HEALTHZ_URL).unwrap();
                assert_eq!(
                    probe_kube_proxy(&healthz, Duration::from_secs(2)).await,
                    KubeProxyHealth::AnsweredByAgent
                );

                // Told to go back: cleanup, and with it the permission, taken away. Once the
                // loop reports a round on the new spec, both ports are free at once.
                requests.send_replace(request(3, false));
                report_on(&mut reports, 3).await;
                assert!(
                    port_is_free(10256),
                    "kube-proxy's healthz port still taken once the spec is acted on"
                );
                assert!(port_is_free(HEALTH_CHECK_NODE_PORT));
                assert!(
                    port_is_free(10249),
                    "kube-proxy's metrics address still taken once the spec is acted on"
                );

                // kube-proxy comes back, binds its port, and the agent's probe counts it.
                let kube_proxy = tokio::net::TcpListener::bind((Ipv4Addr::UNSPECIFIED, 10256))
                    .await
                    .expect("kube-proxy binds its healthz port");
                let kube_proxy_server = tokio::spawn(async move {
                    loop {
                        let Ok((mut stream, _)) = kube_proxy.accept().await else {
                            continue;
                        };
                        let mut buffer = [0_u8; 1024];
                        let _ = stream.read(&mut buffer).await;
                        let _ = stream
                            .write_all(
                                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{}",
                            )
                            .await;
                    }
                });
                assert_eq!(
                    probe_kube_proxy(&healthz, Duration::from_secs(2)).await,
                    KubeProxyHealth::Healthy
                );
                kube_proxy_server.abort();
                drop(requests);
                coexistence.await.unwrap();
            });
        },
    );
}
