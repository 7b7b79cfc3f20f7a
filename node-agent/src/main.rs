//! `switchyard-agent`: see `switchyard_agent::cli`.

use clap::Parser;
use switchyard_agent::cli::{Cli, Command};
use switchyard_agent::datapath::KernelDatapath;
use switchyard_agent::standalone;

/// Installs the SIGTERM and SIGINT handlers now and returns a future that
/// completes on either.
///
/// Installed before the agent loads or attaches anything: a handler installed
/// lazily (when the future is first polled, after start-up work) leaves the
/// default action in place meanwhile, and a SIGTERM during start-up (a rollout
/// that changes its mind) then kills the agent between attaching a program and
/// pinning its link, which detaches that program again.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let handlers = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    if handlers.0.is_ok() && handlers.1.is_ok() {
        tracing::info!("signal handlers installed");
    }
    async move {
        let (Ok(mut terminate), Ok(mut interrupt)) = handlers else {
            tracing::error!("cannot install signal handlers; running until killed");
            return std::future::pending().await;
        };
        tokio::select! {
            _ = terminate.recv() => tracing::info!("SIGTERM"),
            _ = interrupt.recv() => tracing::info!("SIGINT"),
        }
    }
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(%error, "failed to start the runtime");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Standalone(arguments) => {
                let shutdown = shutdown_signal();
                let options = arguments.options();
                let datapath = KernelDatapath::load(&options.datapath)?;
                standalone::run(options, datapath, shutdown).await
            }
            Command::Run(arguments) => {
                let shutdown = shutdown_signal();
                switchyard_agent::cluster::run(arguments.options(), shutdown).await
            }
            Command::Detach(arguments) => {
                switchyard_agent::loader::detach_everything(&arguments.bpf_pin_dir)?;
                switchyard_agent::masquerade::remove()
            }
            Command::MountBpfFs(arguments) => {
                use switchyard_agent::loader::pins;
                match pins::ensure_bpf_filesystem(&arguments.bpf_pin_dir)
                    .map_err(switchyard_agent::loader::Error::from)?
                {
                    pins::BpfFilesystem::Found { at } => {
                        tracing::info!(at = %at.display(), "a BPF filesystem is mounted already")
                    }
                    // Logged by ensure_bpf_filesystem.
                    pins::BpfFilesystem::Mounted { .. } => {}
                }
                Ok(())
            }
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(error = %switchyard_model::error::chain(&error));
            std::process::ExitCode::FAILURE
        }
    }
}
