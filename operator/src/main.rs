//! `switchyard-operator`: flags, then the pieces from the library (telemetry, CRDs, leader
//! election, the controller). Everything that decides anything lives in the library.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::{ArgAction, Parser};
use switchyard_crds::{DataplaneConfig, DEFAULT_CONFIG_NAME};
use switchyard_operator::client::ApiServerRoute;
use switchyard_operator::controller::{self, Context, ControllerSettings};
use switchyard_operator::events::{reference_to, Occurrence, Recorder};
use switchyard_operator::leader::{LeaderElector, LeaseTiming};
use switchyard_operator::metrics::Metrics;
use switchyard_operator::{client, crd_apply, Error};
use switchyard_telemetry::{Health, TelemetryServer};

/// Moves a cluster's Service dataplane between kube-proxy and Switchyard's eBPF datapath.
#[derive(Debug, Parser)]
#[command(name = "switchyard-operator", version)]
struct Arguments {
    /// Where /metrics, /healthz and /readyz are served.
    #[arg(long, default_value = "0.0.0.0:8080")]
    metrics_address: SocketAddr,

    /// Apply the operator's CustomResourceDefinitions at start (Server-Side Apply). Turn off
    /// where GitOps owns the CRDs.
    #[arg(long, default_value_t = true, action = ArgAction::Set)]
    apply_crds: bool,

    /// Namespace of the agent DaemonSet.
    #[arg(long, env = "POD_NAMESPACE", default_value = "switchyard-system")]
    agent_namespace: String,

    /// Name of the agent DaemonSet.
    #[arg(long = "agent-daemonset", default_value = "switchyard-agent")]
    agent_daemon_set: String,

    /// The API server's real address (host:port) given to the agents. A transition does not
    /// start without it.
    #[arg(long)]
    api_server_address: Option<String>,

    /// Namespace of the leader Lease (the operator's own namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "switchyard-system")]
    lease_namespace: String,

    /// Name of the leader Lease.
    #[arg(long, default_value = "switchyard-operator")]
    lease_name: String,

    /// This replica's identity in the Lease and in Events (the pod's name).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
}

/// How long a graceful shutdown waits for writes left in the background before it releases the
/// leader Lease (they are bounded by the API client's own timeouts; this bounds the exit).
const BACKGROUND_WRITES_AT_SHUTDOWN: Duration = Duration::from_secs(5);

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let arguments = Arguments::parse();
    match run(arguments).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{}", switchyard_operator::error::describe(&error));
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(arguments: Arguments) -> Result<(), Error> {
    let metrics = Metrics::new().map_err(|error| Error::StartTelemetry {
        reason: error.to_string(),
    })?;
    let health = Health::new();
    let _telemetry = TelemetryServer::bind(
        arguments.metrics_address,
        metrics.registry(),
        health.clone(),
    )
    .await
    .map_err(|error| Error::StartTelemetry {
        reason: error.to_string(),
    })?;

    let wanted_route = ApiServerRoute::for_address(arguments.api_server_address.as_deref());
    let (client, route) = client::client(&wanted_route).await?;
    match &route {
        ApiServerRoute::Address(address) => {
            tracing::info!(user_agent = %client::user_agent(), %address, "Kubernetes client configured for the API server's address");
        }
        ApiServerRoute::Inferred => {
            tracing::warn!(user_agent = %client::user_agent(), "{IN_CLUSTER_WARNING}");
        }
    }
    if arguments.apply_crds {
        crd_apply::apply_crds(
            client.clone(),
            &switchyard_crds::crds(),
            Duration::from_secs(30),
        )
        .await?;
    }
    health.set_ready(true);

    let identity = arguments
        .identity
        .clone()
        .unwrap_or_else(|| format!("switchyard-operator-{}", std::process::id()));
    let mut elector = LeaderElector::new(
        client.clone(),
        &arguments.lease_namespace,
        &arguments.lease_name,
        &identity,
        LeaseTiming::default(),
    );
    tokio::select! {
        acquired = elector.acquire() => acquired?,
        () = shutdown_signal() => return Ok(()),
    }
    metrics.leader.set(1);
    let recorder = Recorder::new(client.clone(), identity);
    if route == ApiServerRoute::Inferred {
        warn_on_the_dataplane_config(&client, &recorder).await;
    }

    let context = Arc::new(Context::new(
        client.clone(),
        recorder,
        metrics.clone(),
        ControllerSettings {
            agent_namespace: arguments.agent_namespace,
            agent_daemon_set: arguments.agent_daemon_set,
            // The same address as the client's (an empty flag counts as none for both).
            api_server_address: match wanted_route {
                ApiServerRoute::Address(address) => Some(address),
                ApiServerRoute::Inferred => None,
            },
        },
        &health,
    ));
    let background_writes = Arc::clone(&context.background_writes);
    // Whichever ends first ends the others: dropping the controller's future stops it at its
    // next await, so a replica that lost the Lease makes no further write (writes it left to
    // finish in the background end with the process).
    let outcome = tokio::select! {
        () = controller::run(context) => Err(Error::LeadershipLost { reason: "the controller's watches ended".into() }),
        lost = elector.keep_renewing() => Err(lost),
        () = shutdown_signal() => Ok(()),
    };
    metrics.leader.set(0);
    health.set_ready(false);
    if outcome.is_ok() {
        // The next leader must not meet a write of this one landing after it took over.
        if !background_writes
            .wait_until_idle(BACKGROUND_WRITES_AT_SHUTDOWN)
            .await
        {
            tracing::warn!("writes still in flight at shutdown; releasing the Lease anyway");
        }
        if let Err(error) = elector.release().await {
            tracing::warn!(error = %switchyard_operator::error::describe(&error), "failed to release the leader Lease");
        }
    }
    outcome
}

/// Said at start and in the `InClusterApiServer` Event when no API server address is given.
const IN_CLUSTER_WARNING: &str = "no --api-server-address (chart: apiServer.host/apiServer.port): the operator reaches the API server through in-cluster configuration, i.e. the kubernetes Service that a transition moves between dataplanes; transitions are refused until it is set";

/// A warning Event on the DataplaneConfig, where `kubectl describe` shows it next to the
/// preflight's refusal. Written once, by the leader; without a DataplaneConfig yet, the log
/// line at start is all there is.
async fn warn_on_the_dataplane_config(client: &kube::Client, recorder: &Recorder) {
    let configs: kube::Api<DataplaneConfig> = kube::Api::all(client.clone());
    match configs.get_opt(DEFAULT_CONFIG_NAME).await {
        Ok(Some(config)) => {
            let occurrence =
                Occurrence::warning("InClusterApiServer", "Configure", IN_CLUSTER_WARNING);
            recorder
                .publish_or_log(&reference_to(&config), &occurrence)
                .await;
        }
        Ok(None) => {
            tracing::info!("no DataplaneConfig {DEFAULT_CONFIG_NAME:?} yet to record the InClusterApiServer warning on");
        }
        Err(error) => {
            tracing::warn!(%error, "failed to read the DataplaneConfig to record the InClusterApiServer warning on");
        }
    }
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(terminate) => terminate,
                Err(error) => {
                    tracing::warn!(%error, "failed to listen for SIGTERM");
                    let _ = interrupt.await;
                    return;
                }
            };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}
