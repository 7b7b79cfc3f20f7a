use std::net::{Ipv4Addr, TcpListener};
use std::time::{Duration, SystemTime};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::*;
use crate::kube_proxy::metrics::tests::{expected_types, exposition_types};
use crate::kube_proxy::metrics::KubeProxyMetrics;

/// A loopback port nothing listens on now.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free loopback port")
}

fn bindable(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

async fn get(address: SocketAddr, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connects");
    let request = format!("GET {path} HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("sends");
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut answer))
        .await
        .expect("answers within 10 s")
        .expect("reads");
    answer
}

fn node() -> NodeHealth {
    NodeHealth {
        healthy: true,
        last_updated: SystemTime::now(),
    }
}

struct Ports {
    ports: KubeProxyPorts,
    metrics: SocketAddr,
    healthz: u16,
}

fn ports_on_loopback() -> Ports {
    let metrics = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
    let healthz = free_port();
    let ports = KubeProxyPorts::new(
        HealthServerSettings {
            bind_address: Ipv4Addr::LOCALHOST.into(),
            healthz_port: healthz,
        },
        true,
        Some(KubeProxyMetricsPort::new(
            metrics,
            &KubeProxyMetrics::new().expect("registers"),
        )),
    );
    Ports {
        ports,
        metrics,
        healthz,
    }
}

#[tokio::test]
async fn kube_proxys_metrics_address_serves_its_metrics_by_name_and_type_and_its_healthz() {
    let Ports {
        mut ports, metrics, ..
    } = ports_on_loopback();
    assert!(ports.reconcile(true, node(), &[]).await.is_empty());
    assert_eq!(ports.serving_metrics_address(), Some(metrics));
    let scrape = get(metrics, "/metrics").await;
    assert!(scrape.starts_with("HTTP/1.1 200"), "{scrape}");
    assert_eq!(exposition_types(&scrape), expected_types());
    let healthz = get(metrics, "/healthz").await;
    assert!(healthz.starts_with("HTTP/1.1 200"), "{healthz}");
    assert!(healthz.ends_with("ok\n"), "{healthz}");
    // kube-proxy's mode is no answer the agent can give.
    let mode = get(metrics, "/proxyMode").await;
    assert!(mode.starts_with("HTTP/1.1 404"), "{mode}");
    ports.stop().await;
}

/// The value of the series `series` (name and labels) in a scrape.
fn series_value(scrape: &str, series: &str) -> Option<f64> {
    scrape.lines().find_map(|line| {
        line.strip_prefix(series)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|value| value.trim().parse().ok())
    })
}

#[tokio::test]
async fn each_answer_of_the_replacement_healthz_is_counted_by_code_on_the_metrics_address() {
    let Ports {
        mut ports,
        metrics,
        healthz,
    } = ports_on_loopback();
    assert!(ports.reconcile(true, node(), &[]).await.is_empty());
    let health_port = SocketAddr::from((Ipv4Addr::LOCALHOST, healthz));
    let count = |scrape: &str, name: &str, code: &str| {
        series_value(scrape, &format!("{name}{{code=\"{code}\"}}"))
    };
    let before = get(metrics, "/metrics").await;
    assert_eq!(
        count(&before, "kubeproxy_proxy_healthz_total", "200"),
        Some(0.0)
    );

    assert!(get(health_port, "/healthz")
        .await
        .starts_with("HTTP/1.1 200"));
    assert!(get(health_port, "/livez").await.starts_with("HTTP/1.1 200"));
    assert!(get(health_port, "/livez").await.starts_with("HTTP/1.1 200"));
    // The control: a path kube-proxy's healthz server does not serve counts nowhere.
    assert!(get(health_port, "/readyz")
        .await
        .starts_with("HTTP/1.1 404"));
    let scrape = get(metrics, "/metrics").await;
    assert_eq!(
        count(&scrape, "kubeproxy_proxy_healthz_total", "200"),
        Some(1.0)
    );
    assert_eq!(
        count(&scrape, "kubeproxy_proxy_livez_total", "200"),
        Some(2.0)
    );
    assert_eq!(
        count(&scrape, "kubeproxy_proxy_healthz_total", "503"),
        Some(0.0)
    );
    assert!(!scrape.contains("code=\"404\""), "{scrape}");

    // The maps out of sync: answered 503, and counted so.
    let unhealthy = NodeHealth {
        healthy: false,
        ..node()
    };
    assert!(ports.reconcile(true, unhealthy, &[]).await.is_empty());
    assert!(get(health_port, "/healthz")
        .await
        .starts_with("HTTP/1.1 503"));
    let scrape = get(metrics, "/metrics").await;
    assert_eq!(
        count(&scrape, "kubeproxy_proxy_healthz_total", "503"),
        Some(1.0)
    );
    assert_eq!(
        count(&scrape, "kubeproxy_proxy_healthz_total", "200"),
        Some(1.0)
    );
    ports.stop().await;
}

#[tokio::test]
async fn the_metrics_address_is_handed_back_with_the_health_port_by_the_same_decision() {
    let Ports {
        mut ports,
        metrics,
        healthz,
    } = ports_on_loopback();
    assert!(ports.reconcile(true, node(), &[]).await.is_empty());
    // The control: while served, nobody else can bind either port.
    assert!(!bindable(metrics.port()));
    assert!(!bindable(healthz));
    // kube-proxy is back (or the spec withdrew the permission): one decision, both free.
    assert!(ports.reconcile(false, node(), &[]).await.is_empty());
    assert_eq!(ports.serving_metrics_address(), None);
    assert!(ports.serving_health_ports().is_empty());
    assert!(
        bindable(metrics.port()),
        "the metrics address is still held"
    );
    assert!(bindable(healthz), "the health port is still held");
    // Served again when allowed again, and `stop` frees both as well.
    assert!(ports.reconcile(true, node(), &[]).await.is_empty());
    assert!(!bindable(metrics.port()));
    ports.stop().await;
    assert!(bindable(metrics.port()));
    assert!(bindable(healthz));
}

#[tokio::test]
async fn without_the_health_ports_taken_over_the_metrics_address_still_follows_the_decision() {
    let metrics = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
    let healthz = free_port();
    let mut ports = KubeProxyPorts::new(
        HealthServerSettings {
            bind_address: Ipv4Addr::LOCALHOST.into(),
            healthz_port: healthz,
        },
        false,
        Some(KubeProxyMetricsPort::new(
            metrics,
            &KubeProxyMetrics::new().expect("registers"),
        )),
    );
    assert!(ports.reconcile(true, node(), &[]).await.is_empty());
    assert!(bindable(healthz), "the health port is not taken over");
    assert!(!bindable(metrics.port()));
    assert!(ports.reconcile(false, node(), &[]).await.is_empty());
    assert!(bindable(metrics.port()));
}

#[tokio::test]
async fn a_metrics_address_someone_else_holds_is_reported_and_taken_once_free() {
    let holder = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("binds");
    let metrics = holder.local_addr().expect("an address");
    let mut ports = KubeProxyPorts::new(
        HealthServerSettings {
            bind_address: Ipv4Addr::LOCALHOST.into(),
            healthz_port: free_port(),
        },
        false,
        Some(KubeProxyMetricsPort::new(
            metrics,
            &KubeProxyMetrics::new().expect("registers"),
        )),
    );
    let errors = ports.reconcile(true, node(), &[]).await;
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(ports.serving_metrics_address(), None);
    drop(holder);
    assert!(ports.reconcile(true, node(), &[]).await.is_empty());
    assert_eq!(ports.serving_metrics_address(), Some(metrics));
    ports.stop().await;
}
