//! kube-proxy's health endpoints as data: what the agent answers on `:10256/healthz`
//! and on each `externalTrafficPolicy: Local` Service's `healthCheckNodePort` once
//! kube-proxy has left the node, and how it reads kube-proxy's own answer. Cloud
//! load balancers send traffic for such Services only to nodes whose health check
//! port answers 200, so these must keep answering after the switch.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::detection::KubeProxyHealth;
use crate::Error;

/// kube-proxy's default `--healthz-bind-address` port.
pub const KUBE_PROXY_HEALTHZ_PORT: u16 = 10256;
/// The default probe target.
pub const DEFAULT_HEALTHZ_URL: &str = "http://127.0.0.1:10256/healthz";
/// Set on every answer of the agent's replacement servers, so that the probe can
/// tell them from kube-proxy (they serve the same port once kube-proxy has left).
pub const AGENT_HEADER: &str = "X-Switchyard-Agent";
/// Largest request the servers read; health checks are a request line and a few headers.
pub const MAX_REQUEST_BYTES: usize = 8 * 1024;

/// Where kube-proxy's healthz is probed: `http://HOST:PORT/PATH`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthzTarget {
    /// `HOST:PORT`, as connected to and sent in `Host:`.
    pub authority: String,
    pub path: String,
}

impl HealthzTarget {
    pub fn parse(url: &str) -> Result<Self, Error> {
        let invalid = |reason: &str| Error::ParseHealthzUrl {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| invalid("only http:// is supported (kube-proxy serves plain HTTP)"))?;
        let (authority, path) = match rest.find('/') {
            Some(index) => (&rest[..index], &rest[index..]),
            None => (rest, "/healthz"),
        };
        if authority.is_empty() {
            return Err(invalid("no host"));
        }
        let authority = if authority
            .rsplit_once(':')
            .is_some_and(|(_, port)| !port.is_empty() && port.chars().all(|c| c.is_ascii_digit()))
        {
            authority.to_string()
        } else {
            format!("{authority}:80")
        };
        Ok(Self {
            authority,
            path: path.to_string(),
        })
    }

    /// The request the probe sends.
    pub fn request(&self) -> String {
        format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: switchyard-agent\r\nConnection: close\r\n\r\n",
            self.path, self.authority
        )
    }
}

/// Reads kube-proxy's answer (status line and headers are enough).
pub fn classify_probe_answer(answer: &[u8]) -> KubeProxyHealth {
    let text = String::from_utf8_lossy(answer);
    let head = text.split("\r\n\r\n").next().unwrap_or_default();
    let mut lines = head.lines();
    let status = lines.next().and_then(|line| {
        let mut words = line.split_whitespace();
        let version = words.next()?;
        if !version.starts_with("HTTP/") {
            return None;
        }
        words.next()?.parse::<u16>().ok()
    });
    let Some(status) = status else {
        return KubeProxyHealth::NoAnswer {
            reason: "the answer is not HTTP".into(),
        };
    };
    let from_agent = lines.any(|line| {
        line.split_once(':')
            .is_some_and(|(name, _)| name.trim().eq_ignore_ascii_case(AGENT_HEADER))
    });
    if from_agent {
        KubeProxyHealth::AnsweredByAgent
    } else if status == 200 {
        KubeProxyHealth::Healthy
    } else {
        KubeProxyHealth::Unhealthy { status }
    }
}

/// One HTTP answer of the replacement servers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpAnswer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpAnswer {
    pub fn to_bytes(&self) -> Vec<u8> {
        let reason = match self.status {
            200 => "OK",
            404 => "Not Found",
            503 => "Service Unavailable",
            _ => "Unknown",
        };
        let mut text = format!("HTTP/1.1 {} {reason}\r\n", self.status);
        for (name, value) in &self.headers {
            text.push_str(&format!("{name}: {value}\r\n"));
        }
        text.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n{}",
            self.body.len(),
            self.body
        ));
        text.into_bytes()
    }
}

fn json_headers() -> Vec<(String, String)> {
    vec![
        ("Content-Type".into(), "application/json".into()),
        ("X-Content-Type-Options".into(), "nosniff".into()),
        (AGENT_HEADER.into(), "true".into()),
    ]
}

/// What `:10256/healthz` reports: the agent's datapath state, as kube-proxy
/// reports its proxier's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeHealth {
    /// The datapath is programmed and in sync.
    pub healthy: bool,
    /// When it was last programmed.
    pub last_updated: SystemTime,
}

/// `:10256/healthz` (and `/livez`): 200 when healthy, 503 otherwise, with
/// kube-proxy's JSON body. Other paths get 404, as from kube-proxy.
pub fn healthz_answer(path: &str, health: &NodeHealth, now: SystemTime) -> HttpAnswer {
    let path = path.split('?').next().unwrap_or_default();
    if path != "/healthz" && path != "/livez" {
        return HttpAnswer {
            status: 404,
            headers: vec![(AGENT_HEADER.into(), "true".into())],
            body: "404 page not found\n".into(),
        };
    }
    HttpAnswer {
        status: if health.healthy { 200 } else { 503 },
        headers: json_headers(),
        body: format!(
            "{{\"lastUpdated\": \"{}\",\"currentTime\": \"{}\"}}",
            rfc3339(health.last_updated),
            rfc3339(now)
        ),
    }
}

/// One `externalTrafficPolicy: Local` LoadBalancer Service, as the cluster-mode
/// wiring sees it: plain data.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct LocalServiceHealth {
    pub health_check_node_port: u16,
    pub namespace: String,
    pub name: String,
    /// Ready endpoints of the Service on this node.
    pub local_endpoints: usize,
}

/// A `healthCheckNodePort` answer, any path, as kube-proxy's: 200 with the local
/// endpoint count when there are local endpoints, 503 otherwise.
pub fn service_health_answer(service: &LocalServiceHealth) -> HttpAnswer {
    let mut headers = json_headers();
    headers.push((
        "X-Load-Balancing-Endpoint-Weight".into(),
        service.local_endpoints.to_string(),
    ));
    HttpAnswer {
        status: if service.local_endpoints > 0 { 200 } else { 503 },
        headers,
        body: format!(
            "{{\"service\": {{\"namespace\": {},\"name\": {}}},\"localEndpoints\": {},\"serviceProxyHealthy\": true}}",
            json_string(&service.namespace),
            json_string(&service.name),
            service.local_endpoints
        ),
    }
}

fn json_string(text: &str) -> String {
    serde_json::Value::String(text.to_string()).to_string()
}

/// The request path of an HTTP request head, if it is one.
pub fn request_path(request: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(request).ok()?;
    let line = text.lines().next()?;
    let mut words = line.split_whitespace();
    let _method = words.next()?;
    let path = words.next()?;
    words.next()?.starts_with("HTTP/").then(|| path.to_string())
}

/// `2026-11-22T01:02:03.456789Z`, as Go's time.Time marshals in UTC.
pub fn rfc3339(time: SystemTime) -> String {
    let since_epoch = time.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let seconds = since_epoch.as_secs();
    let days = (seconds / 86_400) as i64;
    let second_of_day = seconds % 86_400;
    // Howard Hinnant's days-to-civil.
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        second_of_day / 3_600,
        second_of_day % 3_600 / 60,
        second_of_day % 60,
        since_epoch.subsec_micros()
    )
}

/// The `healthCheckNodePort` servers a node must run, as kube-proxy runs them: one
/// per `type: LoadBalancer` Service with `externalTrafficPolicy: Local` and a
/// valid `healthCheckNodePort`, counting the Service's ready (not terminating)
/// endpoints on `node_name` in the family the datapath serves (IPv4), each
/// address once across slices. kube-proxy also answers 503 when only terminating
/// endpoints are left on the node, so load balancers drain it first (KEP-1669).
pub fn local_service_health(
    services: &[k8s_openapi::api::core::v1::Service],
    slices: &[crate::model::EndpointSliceModel],
    node_name: &str,
) -> Vec<LocalServiceHealth> {
    let mut health: Vec<LocalServiceHealth> = services
        .iter()
        .filter_map(|service| {
            let spec = service.spec.as_ref()?;
            if spec.type_.as_deref() != Some("LoadBalancer")
                || spec.external_traffic_policy.as_deref() != Some("Local")
            {
                return None;
            }
            let port = u16::try_from(spec.health_check_node_port?)
                .ok()
                .filter(|port| *port > 0)?;
            let namespace = service.metadata.namespace.clone()?;
            let name = service.metadata.name.clone()?;
            let mut local: Vec<std::net::IpAddr> = slices
                .iter()
                .filter(|slice| {
                    slice.service.namespace == namespace
                        && slice.service.name == name
                        && slice.family == crate::model::AddressFamily::Ipv4
                })
                .flat_map(|slice| &slice.endpoints)
                .filter(|endpoint| {
                    endpoint.ready
                        && !endpoint.terminating
                        && endpoint.node_name.as_deref() == Some(node_name)
                })
                .map(|endpoint| endpoint.address)
                .collect();
            local.sort();
            local.dedup();
            Some(LocalServiceHealth {
                health_check_node_port: port,
                namespace,
                name,
                local_endpoints: local.len(),
            })
        })
        .collect();
    health.sort();
    // Two Services cannot share a health check port (the API server allocates it);
    // keep the first if a stale view ever shows two.
    health.dedup_by_key(|service| service.health_check_node_port);
    health
}
