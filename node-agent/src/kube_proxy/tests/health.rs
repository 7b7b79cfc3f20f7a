use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, TcpListener, TcpStream},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use crate::kube_proxy::{
    detection::{kube_proxy_healthy_condition, KubeProxyFootprint, KubeProxyHealth},
    health::{
        classify_probe_answer, healthz_answer, request_path, rfc3339, service_health_answer,
        HealthzTarget, LocalServiceHealth, NodeHealth, AGENT_HEADER,
    },
    health_server::{
        probe_kube_proxy, probe_kube_proxy_beside, HealthServerSettings, HealthServers, OwnProbes,
    },
};

/// kube-proxy's rules on the node, as `KubeProxyHealthy` needs them.
const PRESENT: KubeProxyFootprint = KubeProxyFootprint {
    chains: 10,
    rules: 40,
    nft_tables: 0,
    nft_rules: 0,
};

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(key, _)| key.eq_ignore_ascii_case(name))
        .map(|(_, value)| value.as_str())
}

#[test]
fn the_default_healthz_url_is_kube_proxys() {
    let target = HealthzTarget::parse("http://127.0.0.1:10256/healthz").unwrap();
    assert_eq!(target.authority, "127.0.0.1:10256");
    assert_eq!(target.path, "/healthz");
    assert_eq!(
        target.request(),
        "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:10256\r\nUser-Agent: switchyard-agent\r\nConnection: close\r\n\r\n"
    );
    assert_eq!(
        HealthzTarget::parse("http://node.local").unwrap(),
        HealthzTarget {
            authority: "node.local:80".into(),
            path: "/healthz".into()
        }
    );
    assert_eq!(
        HealthzTarget::parse("http://[::1]:10256/livez")
            .unwrap()
            .authority,
        "[::1]:10256"
    );
    for bad in [
        "https://127.0.0.1:10256/healthz",
        "127.0.0.1:10256",
        "http:///healthz",
    ] {
        assert!(HealthzTarget::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn kube_proxys_answers_are_classified() {
    assert_eq!(
        classify_probe_answer(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{}"),
        KubeProxyHealth::Healthy
    );
    assert_eq!(
        classify_probe_answer(b"HTTP/1.1 503 Service Unavailable\r\n\r\n"),
        KubeProxyHealth::Unhealthy { status: 503 }
    );
    assert_eq!(
        classify_probe_answer(b"HTTP/1.1 200 OK\r\nx-switchyard-agent: true\r\n\r\n"),
        KubeProxyHealth::AnsweredByAgent
    );
    // Something listens on the port: no proof that kube-proxy has left.
    let not_http = classify_probe_answer(b"SSH-2.0-OpenSSH_9.2\r\n");
    assert!(
        matches!(not_http, KubeProxyHealth::NoAnswer { .. }),
        "{not_http:?}"
    );
    assert!(not_http.kube_proxy_may_run());
}

#[test]
fn healthz_answers_200_when_synced_and_503_otherwise_with_kube_proxys_body() {
    let updated = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let now = updated + Duration::from_secs(5);
    let healthy = healthz_answer(
        "/healthz",
        &NodeHealth {
            healthy: true,
            last_updated: updated,
        },
        now,
    );
    assert_eq!(healthy.status, 200);
    assert_eq!(header(&healthy.headers, AGENT_HEADER), Some("true"));
    let body: serde_json::Value = serde_json::from_str(&healthy.body).unwrap();
    assert_eq!(body["lastUpdated"], "2023-11-14T22:13:20.000000Z");
    assert_eq!(body["currentTime"], "2023-11-14T22:13:25.000000Z");
    let unhealthy = healthz_answer(
        "/livez?verbose",
        &NodeHealth {
            healthy: false,
            last_updated: updated,
        },
        now,
    );
    assert_eq!(unhealthy.status, 503);
    let other = healthz_answer(
        "/metrics",
        &NodeHealth {
            healthy: true,
            last_updated: updated,
        },
        now,
    );
    assert_eq!(other.status, 404);
}

#[test]
fn a_health_check_node_port_answers_with_the_local_endpoint_count() {
    let mut service = LocalServiceHealth {
        health_check_node_port: 32100,
        namespace: "default".into(),
        name: "web \"quoted\"".into(),
        local_endpoints: 2,
    };
    let answer = service_health_answer(&service);
    assert_eq!(answer.status, 200);
    assert_eq!(
        header(&answer.headers, "X-Load-Balancing-Endpoint-Weight"),
        Some("2")
    );
    let body: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(body["localEndpoints"], 2);
    assert_eq!(body["service"]["name"], "web \"quoted\"");
    assert_eq!(body["service"]["namespace"], "default");
    service.local_endpoints = 0;
    let answer = service_health_answer(&service);
    assert_eq!(answer.status, 503);
    let body: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(body["localEndpoints"], 0);
}

#[test]
fn answers_serialize_as_http_with_a_length() {
    let answer = service_health_answer(&LocalServiceHealth {
        health_check_node_port: 1,
        namespace: "a".into(),
        name: "b".into(),
        local_endpoints: 1,
    });
    let text = String::from_utf8(answer.to_bytes()).unwrap();
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"));
    assert!(text.contains(&format!("Content-Length: {}\r\n", answer.body.len())));
    assert!(text.ends_with(&answer.body));
}

#[test]
fn request_paths_are_read_from_the_request_line() {
    assert_eq!(
        request_path(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").as_deref(),
        Some("/healthz")
    );
    assert_eq!(
        request_path(b"GET / HTTP/1.0\r\n\r\n").as_deref(),
        Some("/")
    );
    assert_eq!(request_path(b"garbage"), None);
    assert_eq!(request_path(&[0xff, 0xfe]), None);
}

#[test]
fn times_are_formatted_like_go_in_utc() {
    assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
    assert_eq!(
        rfc3339(UNIX_EPOCH + Duration::from_secs(1_709_164_800) + Duration::from_micros(7)),
        "2024-02-29T00:00:00.000007Z"
    );
    assert_eq!(
        rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)),
        "2000-02-29T00:00:00.000000Z"
    );
    assert_eq!(
        rfc3339(UNIX_EPOCH + Duration::from_secs(4_102_444_799)),
        "2099-12-31T23:59:59.000000Z"
    );
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn get(port: u16, path: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn the_probe_reads_a_fake_kube_proxy_and_reports_a_closed_port_unreachable() {
    runtime().block_on(async {
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            for answer in [
                "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
                "HTTP/1.1 503 Service Unavailable\r\n\r\n",
            ] {
                let (mut stream, _) = listener.accept().await.unwrap();
                let mut buffer = [0_u8; 512];
                let _ = stream.read(&mut buffer).await.unwrap();
                stream.write_all(answer.as_bytes()).await.unwrap();
            }
        });
        let target = HealthzTarget::parse(&format!("http://127.0.0.1:{port}/healthz")).unwrap();
        assert_eq!(
            probe_kube_proxy(&target, Duration::from_secs(2)).await,
            KubeProxyHealth::Healthy
        );
        assert_eq!(
            probe_kube_proxy(&target, Duration::from_secs(2)).await,
            KubeProxyHealth::Unhealthy { status: 503 }
        );
        server.await.unwrap();
        let closed =
            HealthzTarget::parse(&format!("http://127.0.0.1:{}/healthz", free_port())).unwrap();
        let refused = probe_kube_proxy(&closed, Duration::from_secs(2)).await;
        assert!(
            matches!(refused, KubeProxyHealth::Absent { .. }),
            "{refused:?}"
        );
        assert!(refused.kube_proxy_has_left());
    });
}

#[test]
fn a_server_that_closes_without_answering_may_still_be_kube_proxy() {
    runtime().block_on(async {
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            drop(stream);
        });
        let target = HealthzTarget::parse(&format!("http://127.0.0.1:{port}/healthz")).unwrap();
        let health = probe_kube_proxy(&target, Duration::from_secs(2)).await;
        server.await.unwrap();
        assert!(
            matches!(health, KubeProxyHealth::NoAnswer { .. }),
            "{health:?}"
        );
        assert!(health.kube_proxy_may_run());
    });
}

#[test]
fn a_silent_server_times_out_quickly() {
    runtime().block_on(async {
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let _hold = tokio::spawn(async move {
            let (_stream, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(10)).await;
        });
        let target = HealthzTarget::parse(&format!("http://127.0.0.1:{port}/healthz")).unwrap();
        let started = std::time::Instant::now();
        let health = probe_kube_proxy(&target, Duration::from_millis(300)).await;
        assert!(
            matches!(health, KubeProxyHealth::NoAnswer { ref reason } if reason.contains("300 ms")),
            "{health:?}"
        );
        // A busy kube-proxy answers late: that is not a kube-proxy that has left.
        assert!(health.kube_proxy_may_run());
        // The probe gave up instead of waiting for the server, which holds the
        // connection for 10 s: a bound well under that, generous for a busy
        // machine running the tests in parallel (the probe's own timeout is 300 ms).
        assert!(started.elapsed() < Duration::from_secs(5));
    });
}

#[test]
fn replacement_servers_follow_their_inputs_and_stop_when_not_allowed() {
    runtime().block_on(async {
        let healthz_port = free_port();
        let service_port = free_port();
        let mut servers = HealthServers::new(HealthServerSettings {
            bind_address: Ipv4Addr::LOCALHOST.into(),
            healthz_port,
        });
        let node = NodeHealth {
            healthy: true,
            last_updated: SystemTime::now(),
        };
        let mut service = LocalServiceHealth {
            health_check_node_port: service_port,
            namespace: "default".into(),
            name: "local-lb".into(),
            local_endpoints: 1,
        };
        // Not allowed: nothing listens.
        assert!(servers
            .reconcile(false, node, &[service.clone()])
            .await
            .is_empty());
        assert!(servers.serving_ports().is_empty());
        assert!(
            tokio::task::spawn_blocking(move || get(healthz_port, "/healthz"))
                .await
                .unwrap()
                .is_err()
        );

        assert!(servers
            .reconcile(true, node, &[service.clone()])
            .await
            .is_empty());
        assert_eq!(servers.serving_ports().len(), 2);
        let answer = tokio::task::spawn_blocking(move || get(healthz_port, "/healthz"))
            .await
            .unwrap()
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
        // The probe recognises the agent's own server.
        let target =
            HealthzTarget::parse(&format!("http://127.0.0.1:{healthz_port}/healthz")).unwrap();
        assert_eq!(
            probe_kube_proxy(&target, Duration::from_secs(2)).await,
            KubeProxyHealth::AnsweredByAgent
        );
        let answer = tokio::task::spawn_blocking(move || get(service_port, "/"))
            .await
            .unwrap()
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
        assert!(answer.contains("\"localEndpoints\": 1"), "{answer}");

        // The endpoint moved away: the same listener answers 503 at once.
        service.local_endpoints = 0;
        assert!(servers
            .reconcile(true, node, &[service.clone()])
            .await
            .is_empty());
        let answer = tokio::task::spawn_blocking(move || get(service_port, "/"))
            .await
            .unwrap()
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");

        // The Service went away: its port is closed, healthz stays.
        assert!(servers.reconcile(true, node, &[]).await.is_empty());
        assert_eq!(servers.serving_ports(), [healthz_port]);
        assert!(tokio::task::spawn_blocking(move || get(service_port, "/"))
            .await
            .unwrap()
            .is_err());

        // kube-proxy came back: every port is released.
        assert!(servers
            .reconcile(false, node, &[service.clone()])
            .await
            .is_empty());
        assert!(servers.serving_ports().is_empty());
        assert!(std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, healthz_port)).is_ok());
    });
}

/// A server of this process that answers exactly as kube-proxy does (200, no agent header):
/// the probe still knows the answer is its own, by the connection it came on.
#[test]
fn an_answer_like_kube_proxys_from_a_server_of_this_process_is_not_kube_proxys_health() {
    runtime().block_on(async {
        let own = OwnProbes::default();
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let server_own = own.clone();
        let server = tokio::spawn(async move {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            let (mut stream, peer) = listener.accept().await.unwrap();
            let mut buffer = [0_u8; 512];
            let _ = stream.read(&mut buffer).await.unwrap();
            let was_own = server_own.received_by_own_server(peer);
            stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                .await
                .unwrap();
            was_own
        });
        let target = HealthzTarget::parse(&format!("http://127.0.0.1:{port}/healthz")).unwrap();
        let health = probe_kube_proxy_beside(&target, Duration::from_secs(2), &own).await;
        assert!(server.await.unwrap(), "the server saw the probe as its own");
        assert_eq!(health, KubeProxyHealth::AnsweredByThisAgent);
        assert!(!health.kube_proxy_may_run());
        assert!(!kube_proxy_healthy_condition(&PRESENT, &health).status);
    });
}

/// The agent's replacement servers on kube-proxy's healthz port: the probe is answered by
/// this very process and knows it; the control, a real other listener (kube-proxy), is
/// counted, probed with the same registry while the agent's servers run; and another
/// agent's server (another process, here another set of servers) is known by its header.
#[test]
fn the_agents_own_healthz_server_is_never_counted_as_kube_proxy_and_another_listener_is() {
    runtime().block_on(async {
        let node = NodeHealth {
            healthy: true,
            last_updated: SystemTime::now(),
        };
        let own_port = free_port();
        let mut servers = HealthServers::new(HealthServerSettings {
            bind_address: Ipv4Addr::LOCALHOST.into(),
            healthz_port: own_port,
        });
        assert!(servers.reconcile(true, node, &[]).await.is_empty());
        let own = servers.own_probes();
        let target = HealthzTarget::parse(&format!("http://127.0.0.1:{own_port}/healthz")).unwrap();
        let health = probe_kube_proxy_beside(&target, Duration::from_secs(2), &own).await;
        assert_eq!(health, KubeProxyHealth::AnsweredByThisAgent);
        assert!(!kube_proxy_healthy_condition(&PRESENT, &health).status);

        // The control: kube-proxy itself on another port answers, and is counted.
        let kube_proxy = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap();
        let kube_proxy_port = kube_proxy.local_addr().unwrap().port();
        let kube_proxy_server = tokio::spawn(async move {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            let (mut stream, _) = kube_proxy.accept().await.unwrap();
            let mut buffer = [0_u8; 512];
            let _ = stream.read(&mut buffer).await.unwrap();
            stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{}")
                .await
                .unwrap();
        });
        let kube_proxy_target =
            HealthzTarget::parse(&format!("http://127.0.0.1:{kube_proxy_port}/healthz")).unwrap();
        let health =
            probe_kube_proxy_beside(&kube_proxy_target, Duration::from_secs(2), &own).await;
        kube_proxy_server.await.unwrap();
        assert_eq!(health, KubeProxyHealth::Healthy);
        assert!(kube_proxy_healthy_condition(&PRESENT, &health).status);

        // Another agent's server: not this process, known by its header.
        let other_port = free_port();
        let mut other_agent = HealthServers::new(HealthServerSettings {
            bind_address: Ipv4Addr::LOCALHOST.into(),
            healthz_port: other_port,
        });
        assert!(other_agent.reconcile(true, node, &[]).await.is_empty());
        let other_target =
            HealthzTarget::parse(&format!("http://127.0.0.1:{other_port}/healthz")).unwrap();
        assert_eq!(
            probe_kube_proxy_beside(&other_target, Duration::from_secs(2), &own).await,
            KubeProxyHealth::AnsweredByAgent
        );
        servers.stop().await;
        other_agent.stop().await;
    });
}

#[test]
fn a_port_someone_else_holds_is_reported_and_the_others_are_served() {
    runtime().block_on(async {
        let held = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let held_port = held.local_addr().unwrap().port();
        let service_port = free_port();
        let mut servers = HealthServers::new(HealthServerSettings {
            bind_address: Ipv4Addr::LOCALHOST.into(),
            healthz_port: held_port,
        });
        let errors = servers
            .reconcile(
                true,
                NodeHealth {
                    healthy: true,
                    last_updated: SystemTime::now(),
                },
                &[LocalServiceHealth {
                    health_check_node_port: service_port,
                    namespace: "default".into(),
                    name: "x".into(),
                    local_endpoints: 3,
                }],
            )
            .await;
        assert_eq!(errors.len(), 1);
        assert!(matches!(&errors[0], crate::Error::ServeHealth { address, .. } if address.port() == held_port));
        assert_eq!(servers.serving_ports(), [service_port]);
        servers.stop().await;
        assert!(servers.serving_ports().is_empty());
    });
}

mod from_services {
    use std::net::IpAddr;

    use k8s_openapi::api::core::v1::{Service, ServiceSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use crate::kube_proxy::health::{local_service_health, LocalServiceHealth};
    use crate::model::{AddressFamily, EndpointModel, EndpointSliceModel, ServiceName};

    fn service(name: &str, type_: &str, policy: &str, port: Option<i32>) -> Service {
        Service {
            metadata: ObjectMeta {
                namespace: Some("default".into()),
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                type_: Some(type_.into()),
                external_traffic_policy: Some(policy.into()),
                health_check_node_port: port,
                ..ServiceSpec::default()
            }),
            status: None,
        }
    }

    fn endpoint(address: &str, node: &str, ready: bool, terminating: bool) -> EndpointModel {
        EndpointModel {
            address: address.parse::<IpAddr>().unwrap(),
            ready,
            serving: ready || terminating,
            terminating,
            node_name: Some(node.into()),
            hints: Default::default(),
        }
    }

    fn slice(
        service: &str,
        name: &str,
        family: AddressFamily,
        endpoints: Vec<EndpointModel>,
    ) -> EndpointSliceModel {
        EndpointSliceModel {
            slice_name: ServiceName::new("default", name),
            service: ServiceName::new("default", service),
            family,
            ports: Vec::new(),
            endpoints,
            last_change_trigger_time: None,
        }
    }

    #[test]
    fn only_local_policy_load_balancers_get_a_health_check_server() {
        let services = [
            service("local-lb", "LoadBalancer", "Local", Some(32100)),
            service("cluster-lb", "LoadBalancer", "Cluster", Some(32101)),
            service("local-nodeport", "NodePort", "Local", None),
            service("no-port", "LoadBalancer", "Local", None),
            service("bad-port", "LoadBalancer", "Local", Some(70000)),
        ];
        let health = local_service_health(&services, &[], "node-1");
        assert_eq!(
            health,
            [LocalServiceHealth {
                health_check_node_port: 32100,
                namespace: "default".into(),
                name: "local-lb".into(),
                local_endpoints: 0,
            }]
        );
    }

    #[test]
    fn local_endpoints_are_ready_ones_on_this_node_counted_once() {
        let services = [service("local-lb", "LoadBalancer", "Local", Some(32100))];
        let slices = [
            slice(
                "local-lb",
                "local-lb-a",
                AddressFamily::Ipv4,
                vec![
                    endpoint("10.244.1.5", "node-1", true, false),
                    endpoint("10.244.1.6", "node-1", false, true),
                    endpoint("10.244.2.7", "node-2", true, false),
                ],
            ),
            // The same endpoint seen in a second slice during a slice update.
            slice(
                "local-lb",
                "local-lb-b",
                AddressFamily::Ipv4,
                vec![endpoint("10.244.1.5", "node-1", true, false)],
            ),
            slice(
                "local-lb",
                "local-lb-v6",
                AddressFamily::Ipv6,
                vec![endpoint("fd00::5", "node-1", true, false)],
            ),
            slice(
                "other",
                "other-a",
                AddressFamily::Ipv4,
                vec![endpoint("10.244.1.9", "node-1", true, false)],
            ),
        ];
        assert_eq!(
            local_service_health(&services, &slices, "node-1")[0].local_endpoints,
            1
        );
        assert_eq!(
            local_service_health(&services, &slices, "node-2")[0].local_endpoints,
            1
        );
        assert_eq!(
            local_service_health(&services, &slices, "node-3")[0].local_endpoints,
            0
        );
    }
}
