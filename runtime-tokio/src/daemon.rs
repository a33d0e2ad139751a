//! `metropolisd` on tokio: listeners, signals and the executor around
//! [`metropolis_host::daemon`].

use std::sync::Arc;

use metropolis_host::daemon::{Config, DaemonError, NodeServices, RuntimeKind, init_logging};

use crate::listen;
use crate::rt::TokioSpawner;

/// Runs the daemon on the current tokio runtime until SIGINT/SIGTERM.
pub async fn run(config: Config) -> Result<(), DaemonError> {
    let node = NodeServices::prepare(&config, Arc::new(TokioSpawner::current())).await?;
    let (trigger, shutdown) = listen::shutdown_pair();
    let unix = listen::bind_unix(&node.socket).map_err(|e| {
        format!(
            "{}: cannot bind the local socket: {e}",
            node.socket.display()
        )
    })?;
    let tcp = listen::bind_tcp(node.listen)
        .await
        .map_err(|e| format!("{}: cannot listen: {e}", node.listen))?;
    tracing::info!(
        runtime = "tokio",
        node = %node.node_id,
        socket = %node.socket.display(),
        listen = %tcp.local_addr().map(|a| a.to_string()).unwrap_or_default(),
        owner_credential = %node.owner_dir.display(),
        "curator serving"
    );
    let unix_task = tokio::spawn(listen::serve_unix(
        unix,
        node.socket.clone(),
        node.node_id.clone(),
        node.router.clone(),
        shutdown.clone(),
    ));
    let tls_task = tokio::spawn(listen::serve_tls(
        tcp,
        node.tls.clone(),
        node.classifier.clone(),
        node.router.clone(),
        shutdown.clone(),
    ));

    wait_for_signal().await?;
    tracing::info!("shutting down");
    node.end_streams();
    trigger.trigger();
    let _ = tokio::time::timeout(node.shutdown_grace, async {
        let _ = unix_task.await;
        let _ = tls_task.await;
    })
    .await;
    node.close();
    tracing::info!("stopped");
    Ok(())
}

async fn wait_for_signal() -> Result<(), DaemonError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

/// Entry point of the `metropolisd` binary: parses flags, sets up logging,
/// runs the daemon on the chosen runtime, and exits non-zero with the error
/// on failure.
pub fn main() -> std::process::ExitCode {
    use clap::Parser;
    let config = Config::parse();
    init_logging(&config.log);
    let result = match config.runtime {
        RuntimeKind::Tokio => match tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt.block_on(run(config)),
            Err(e) => Err(format!("cannot start the tokio runtime: {e}").into()),
        },
        RuntimeKind::Smol => metropolis_runtime_smol::daemon::block_on_run(config),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("metropolisd: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
