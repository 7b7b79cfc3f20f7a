//! I/O of kube-proxy's ports as a whole: its health ports ([`HealthServers`]) and its metrics
//! address, opened and handed back together. The coexistence loop decides once per round
//! whether kube-proxy's ports are the agent's to serve ([`KubeProxyPorts::reconcile`]) or
//! must be free ([`KubeProxyPorts::stop`]); both ports follow that one decision, so the
//! metrics address is handed back at the same moment as the health ports, before the node
//! reports a spec that brings kube-proxy back as observed.
//!
//! The metrics address serves what kube-proxy serves there that has a meaning for the agent:
//! `/metrics` (kube-proxy's metrics, [`super::metrics`]) and `/healthz` (kube-proxy answers
//! `ok` from its metrics port's healthz handler while the process runs). kube-proxy's
//! `/proxyMode` (the agent is none of its modes), `/configz` and `/metrics/slis` are not
//! served.

use std::net::SocketAddr;

use prometheus::Registry;
use switchyard_telemetry::{Health, TelemetryServer};

use super::health::{LocalServiceHealth, NodeHealth};
use super::health_server::{HealthServerSettings, HealthServers, OwnProbes};
use super::metrics::{HealthAnswerCounts, KubeProxyMetrics};
use crate::Error;

/// Where kube-proxy's metrics are served once it is gone, and what.
#[derive(Clone, Debug)]
pub struct KubeProxyMetricsPort {
    /// kube-proxy's `--metrics-bind-address`.
    pub address: SocketAddr,
    /// kube-proxy's metrics only ([`super::metrics::KubeProxyMetrics::registry`]).
    pub registry: Registry,
    /// The healthz and livez answer counters in `registry`, which the replacement health
    /// servers count their answers in.
    pub health_answers: HealthAnswerCounts,
}

impl KubeProxyMetricsPort {
    /// `metrics`, served on `address`.
    pub fn new(address: SocketAddr, metrics: &KubeProxyMetrics) -> Self {
        Self {
            address,
            registry: metrics.registry.clone(),
            health_answers: metrics.health_answers(),
        }
    }
}

/// kube-proxy's ports, served by the agent only while kube-proxy is gone from the node.
pub struct KubeProxyPorts {
    health: HealthServers,
    serve_health: bool,
    metrics: Option<KubeProxyMetricsPort>,
    metrics_server: Option<TelemetryServer>,
}

impl KubeProxyPorts {
    /// `serve_health`: the health ports are taken over at all; `metrics`: where and what to
    /// serve of kube-proxy's metrics (`None`: not served).
    pub fn new(
        health: HealthServerSettings,
        serve_health: bool,
        metrics: Option<KubeProxyMetricsPort>,
    ) -> Self {
        let mut health = HealthServers::new(health);
        if let Some(port) = &metrics {
            health.count_answers_in(port.health_answers.clone());
        }
        Self {
            health,
            serve_health,
            metrics,
            metrics_server: None,
        }
    }

    /// See [`HealthServers::own_probes`].
    pub fn own_probes(&self) -> OwnProbes {
        self.health.own_probes()
    }

    /// Serves kube-proxy's ports when `allowed` (kube-proxy has left the node and the spec
    /// permits it), closes every one of them otherwise. A port that cannot be bound is
    /// reported and tried again on the next call; the others are served.
    pub async fn reconcile(
        &mut self,
        allowed: bool,
        node: NodeHealth,
        services: &[LocalServiceHealth],
    ) -> Vec<Error> {
        let mut errors = self
            .health
            .reconcile(allowed && self.serve_health, node, services)
            .await;
        if !allowed {
            self.stop_metrics().await;
        } else if let (Some(port), None) = (&self.metrics, &self.metrics_server) {
            // Answers `/healthz` with `ok` like kube-proxy's metrics port: no loop is
            // registered with this `Health`, the agent's liveness is on its own port.
            let health = Health::new();
            health.set_ready(true);
            match TelemetryServer::bind(port.address, port.registry.clone(), health).await {
                Ok(server) => self.metrics_server = Some(server),
                Err(error) => errors.push(Error::ServeTelemetry {
                    source: Box::new(error),
                }),
            }
        }
        errors
    }

    /// Closes every port (the spec took the permission back, kube-proxy came back, or the
    /// agent shuts down); on return they are free for kube-proxy to bind.
    pub async fn stop(&mut self) {
        self.health.stop().await;
        self.stop_metrics().await;
    }

    async fn stop_metrics(&mut self) {
        if let Some(server) = self.metrics_server.take() {
            // Waits for the accepting task to end, so the listener is closed on return.
            server.shutdown().await;
        }
    }

    /// The metrics address, while it is served.
    pub fn serving_metrics_address(&self) -> Option<SocketAddr> {
        self.metrics_server
            .as_ref()
            .map(TelemetryServer::local_address)
    }

    /// Health ports served now.
    pub fn serving_health_ports(&self) -> Vec<u16> {
        self.health.serving_ports()
    }
}

#[cfg(test)]
mod tests;
