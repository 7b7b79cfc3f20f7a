//! Privileged tests of the coexistence loop on real netfilter and real ports: the
//! cleanup waits while kube-proxy answers, cleans once it is gone, stops for good
//! when kube-proxy's rules come back, and the agent serves kube-proxy's health
//! ports only after kube-proxy has left. A private network namespace per test (see
//! `kube_proxy_support`); port 10256 is the namespace's own. Run by
//! `make coexist-test`.

mod kube_proxy_support;

use std::{
    net::Ipv4Addr,
    time::{Duration, SystemTime},
};

use kube_proxy_support::*;
use switchyard_agent::kube_proxy::{
    detection::{CleanupDecision, CleanupStateMachine, KubeProxyHealth},
    health::{HealthzTarget, LocalServiceHealth, NodeHealth, DEFAULT_HEALTHZ_URL},
    health_server::{probe_kube_proxy, HealthServerSettings, HealthServers},
    round::{coexistence_round, RoundOutcome, RoundSettings},
    ruleset::SavedRuleset,
    system::Tools,
    Backend, Family,
};
use switchyard_crds::reasons;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Short, so the tests run quickly; the agent's default is 6 s.
const ABSENCE_CONFIRMATION: Duration = Duration::from_millis(300);

fn settings() -> RoundSettings {
    RoundSettings {
        families: vec![Family::Ipv4],
        healthz: HealthzTarget::parse(DEFAULT_HEALTHZ_URL).unwrap(),
        probe_timeout: Duration::from_millis(500),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A stand-in for kube-proxy's healthz on 0.0.0.0:10256: answers 200.
async fn fake_kube_proxy_healthz() -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::UNSPECIFIED, 10256))
        .await
        .unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            let mut buffer = [0_u8; 1024];
            let _ = stream.read(&mut buffer).await;
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
                .await;
        }
    })
}

async fn round(
    tools: &Tools,
    machine: &mut CleanupStateMachine,
    request: Option<i64>,
) -> RoundOutcome {
    let outcome = coexistence_round(tools, machine, request, &settings())
        .await
        .unwrap();
    println!(
        "round: {:?} {} {:?} ({}); rules {}; cleanup {:?}",
        outcome.verdict.decision,
        outcome.verdict.rules_present.status,
        outcome.verdict.rules_present.reason,
        outcome.verdict.rules_present.message,
        outcome.footprint.total_rules(),
        outcome.cleanup
    );
    outcome
}

#[test]
#[ignore = "privileged netns test: run by make coexist-test"]
fn rules_that_come_back_after_the_cleanup_are_a_conflict_and_the_count_stays_stable() {
    run_isolated(
        "rules_that_come_back_after_the_cleanup_are_a_conflict_and_the_count_stays_stable",
        || {
            let kube_proxy = without_nfacct(NFT_1_33_IPV4);
            load(Backend::Nft, Family::Ipv4, &kube_proxy);
            runtime().block_on(async {
                let tools = Tools::new();
                let mut machine = CleanupStateMachine::new(ABSENCE_CONFIRMATION);
                // kube-proxy has left (nothing on 10256): one refused probe is no
                // proof yet; once it has stayed away, clean once.
                let waiting = round(&tools, &mut machine, Some(1)).await;
                assert_eq!(waiting.verdict.decision, CleanupDecision::Wait);
                assert!(matches!(waiting.health, KubeProxyHealth::Absent { .. }));
                assert!(waiting.cleanup.is_none());
                tokio::time::sleep(ABSENCE_CONFIRMATION).await;
                let first = round(&tools, &mut machine, Some(1)).await;
                assert_eq!(first.verdict.decision, CleanupDecision::Clean);
                assert_eq!(first.cleanup, Some(Ok(57)));
                let second = round(&tools, &mut machine, Some(1)).await;
                assert!(!second.verdict.rules_present.status);
                assert_eq!(second.verdict.rules_present.reason, reasons::RULES_ABSENT);
                assert!(second.verdict.replacement_health_allowed);

                // kube-proxy runs again and writes its rules back.
                load(Backend::Nft, Family::Ipv4, &kube_proxy);
                let restored = save_text(Backend::Nft, Family::Ipv4);
                let mut counts = Vec::new();
                for _ in 0..10 {
                    let outcome = round(&tools, &mut machine, Some(1)).await;
                    assert_eq!(outcome.verdict.decision, CleanupDecision::Wait);
                    assert!(outcome.verdict.rules_present.status);
                    assert_eq!(
                        outcome.verdict.rules_present.reason,
                        reasons::KUBE_PROXY_CONFLICT
                    );
                    assert!(outcome.cleanup.is_none());
                    assert!(!outcome.verdict.replacement_health_allowed);
                    counts.push(outcome.footprint.total_rules());
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                println!("rule counts while in conflict: {counts:?}");
                assert!(counts.iter().all(|count| *count == counts[0] && *count > 0));
                let unchanged = save_text(Backend::Nft, Family::Ipv4);
                assert_eq!(
                    SavedRuleset::parse(&unchanged).unwrap(),
                    SavedRuleset::parse(&restored).unwrap(),
                    "nothing was touched"
                );
            });
        },
    );
}

#[test]
#[ignore = "privileged netns test: run by make coexist-test"]
fn the_cleanup_waits_while_kube_proxy_answers_and_the_agent_takes_its_ports_only_after() {
    run_isolated(
        "the_cleanup_waits_while_kube_proxy_answers_and_the_agent_takes_its_ports_only_after",
        || {
            load(Backend::Legacy, Family::Ipv4, LEGACY_1_20_IPV4);
            let before = save_text(Backend::Legacy, Family::Ipv4);
            runtime().block_on(async {
                let tools = Tools::new();
                let mut machine = CleanupStateMachine::new(ABSENCE_CONFIRMATION);
                let mut servers = HealthServers::new(HealthServerSettings::default());
                let node = NodeHealth {
                    healthy: true,
                    last_updated: SystemTime::now(),
                };
                let services = [
                    LocalServiceHealth {
                        health_check_node_port: 32100,
                        namespace: "default".into(),
                        name: "local-lb".into(),
                        local_endpoints: 2,
                    },
                    LocalServiceHealth {
                        health_check_node_port: 32101,
                        namespace: "default".into(),
                        name: "elsewhere".into(),
                        local_endpoints: 0,
                    },
                ];

                let kube_proxy = fake_kube_proxy_healthz().await;
                for _ in 0..3 {
                    let outcome = round(&tools, &mut machine, Some(1)).await;
                    assert_eq!(outcome.health, KubeProxyHealth::Healthy);
                    assert_eq!(outcome.verdict.decision, CleanupDecision::Wait);
                    assert_eq!(
                        outcome.verdict.rules_present.reason,
                        reasons::KUBE_PROXY_CONFLICT
                    );
                    assert!(outcome.kube_proxy_healthy.status);
                    assert_eq!(
                        outcome.kube_proxy_healthy.reason,
                        reasons::KUBE_PROXY_HEALTHZ_OK
                    );
                    let allowed = outcome.verdict.replacement_health_allowed;
                    assert!(!allowed);
                    assert!(servers.reconcile(allowed, node, &services).await.is_empty());
                    assert!(servers.serving_ports().is_empty(), "kube-proxy's ports");
                }
                assert_eq!(
                    save_text(Backend::Legacy, Family::Ipv4)
                        .lines()
                        .filter(|l| !l.starts_with('#'))
                        .count(),
                    before.lines().filter(|l| !l.starts_with('#')).count()
                );

                // kube-proxy leaves the node: its rules stay until it has stayed away.
                kube_proxy.abort();
                let _ = kube_proxy.await;
                let outcome = round(&tools, &mut machine, Some(1)).await;
                assert_eq!(outcome.verdict.decision, CleanupDecision::Wait);
                assert!(outcome.cleanup.is_none());
                tokio::time::sleep(ABSENCE_CONFIRMATION).await;
                let outcome = round(&tools, &mut machine, Some(1)).await;
                assert_eq!(outcome.verdict.decision, CleanupDecision::Clean);
                assert!(matches!(outcome.cleanup, Some(Ok(removed)) if removed == 53));
                assert!(!outcome.kube_proxy_healthy.status);
                assert!(outcome.verdict.replacement_health_allowed);
                assert!(servers.reconcile(true, node, &services).await.is_empty());
                assert_eq!(servers.serving_ports(), [10256, 32100, 32101]);

                // The agent's server now answers on 10256, and the probe knows it.
                let target = HealthzTarget::parse(DEFAULT_HEALTHZ_URL).unwrap();
                assert_eq!(
                    probe_kube_proxy(&target, Duration::from_secs(1)).await,
                    KubeProxyHealth::AnsweredByAgent
                );
                for (port, status) in [(32100, "200"), (32101, "503")] {
                    let answer = http_get(port).await;
                    assert!(
                        answer.starts_with(&format!("HTTP/1.1 {status}")),
                        "{port}: {answer}"
                    );
                }
                let outcome = round(&tools, &mut machine, Some(1)).await;
                assert_eq!(outcome.health, KubeProxyHealth::AnsweredByAgent);
                assert_eq!(outcome.verdict.rules_present.reason, reasons::RULES_ABSENT);
                assert!(outcome.verdict.replacement_health_allowed);

                // kube-proxy comes back: the agent gives its ports back.
                load(Backend::Legacy, Family::Ipv4, LEGACY_1_20_IPV4);
                let outcome = round(&tools, &mut machine, Some(1)).await;
                assert_eq!(
                    outcome.verdict.rules_present.reason,
                    reasons::KUBE_PROXY_CONFLICT
                );
                assert!(!outcome.verdict.replacement_health_allowed);
                assert!(servers.reconcile(false, node, &services).await.is_empty());
                assert!(servers.serving_ports().is_empty());
                let kube_proxy = fake_kube_proxy_healthz().await;
                assert_eq!(
                    probe_kube_proxy(&target, Duration::from_secs(1)).await,
                    KubeProxyHealth::Healthy
                );
                kube_proxy.abort();
            });
        },
    );
}

async fn http_get(port: u16) -> String {
    let mut stream = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port))
        .await
        .unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    answer
}

#[test]
#[ignore = "privileged netns test: run by make coexist-test"]
fn ipvs_mode_is_reported_and_nothing_is_cleaned() {
    run_isolated("ipvs_mode_is_reported_and_nothing_is_cleaned", || {
        load(Backend::Nft, Family::Ipv4, &without_nfacct(NFT_1_33_IPV4));
        // IPVS mode's interface (a dummy device in real life; a veth here, the
        // name is what counts).
        sh("ip link add kube-ipvs0 type veth peer name kube-ipvs0-peer");
        let before = SavedRuleset::parse(&save_text(Backend::Nft, Family::Ipv4)).unwrap();
        runtime().block_on(async {
            let tools = Tools::new();
            let mut machine = CleanupStateMachine::new(ABSENCE_CONFIRMATION);
            for _ in 0..3 {
                tokio::time::sleep(ABSENCE_CONFIRMATION).await;
                let outcome = round(&tools, &mut machine, Some(1)).await;
                assert_eq!(outcome.verdict.decision, CleanupDecision::Wait);
                assert_eq!(
                    outcome.verdict.rules_present.reason,
                    reasons::UNSUPPORTED_KUBE_PROXY_MODE
                );
            }
        });
        assert_eq!(
            SavedRuleset::parse(&save_text(Backend::Nft, Family::Ipv4)).unwrap(),
            before
        );
    });
}
