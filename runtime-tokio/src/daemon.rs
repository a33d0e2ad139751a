//! `metropolisd` on tokio: listeners, signals and the executor around
//! [`metropolis_host::daemon`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use metropolis_host::cluster::StartElection;
use metropolis_host::daemon::{
    Config, DaemonError, NodeServices, RuntimeKind, fatal_error, init_logging,
};

use crate::connect::TokioDialer;
use metropolis_host::peer::AgentClassifier;
use metropolis_runtime_smol::daemon::Housekeeping;

use crate::listen::{self, Shutdown, shutdown_pair};
use crate::rt::TokioSpawner;

/// The listeners of a node, serving until their [`Shutdown`] fires.
pub struct Serving {
    /// The TLS listener's bound address (useful with port 0).
    pub tls_addr: SocketAddr,
    /// The AgentCallback listener's bound address.
    pub agent_addr: SocketAddr,
    /// The debug listener's bound address, when enabled.
    pub debug_addr: Option<SocketAddr>,
    unix_task: tokio::task::JoinHandle<()>,
    tls_task: tokio::task::JoinHandle<()>,
    agent_task: tokio::task::JoinHandle<()>,
    debug_task: Option<tokio::task::JoinHandle<()>>,
}

/// Binds the node's UNIX socket and TLS listener and serves its router on
/// the current tokio runtime until `shutdown` fires. This is what an
/// embedder calls.
pub async fn start(node: &NodeServices, shutdown: Shutdown) -> Result<Serving, DaemonError> {
    let unix = listen::bind_unix(&node.socket).map_err(|e| {
        format!(
            "{}: cannot bind the local socket: {e}",
            node.socket.display()
        )
    })?;
    let tcp = listen::bind_tcp(node.listen)
        .await
        .map_err(|e| format!("{}: cannot listen: {e}", node.listen))?;
    let tls_addr = tcp.local_addr()?;
    let agent_tcp = listen::bind_tcp(node.agent_listen)
        .await
        .map_err(|e| format!("{}: cannot listen for agents: {e}", node.agent_listen))?;
    let agent_addr = agent_tcp.local_addr()?;
    let (debug_addr, debug_task) = match (node.debug_listen, &node.debug_router) {
        (Some(addr), Some(router)) => {
            let tcp = listen::bind_tcp(addr)
                .await
                .map_err(|e| format!("{addr}: cannot listen for the debug service: {e}"))?;
            let bound = tcp.local_addr()?;
            node.log_debug_serving(bound);
            let task = tokio::spawn(listen::serve_plain(
                tcp,
                router.clone(),
                node.edge.clone(),
                shutdown.clone(),
            ));
            (Some(bound), Some(task))
        }
        _ => (None, None),
    };
    let agent_task = tokio::spawn(listen::serve_tls(
        agent_tcp,
        node.tls.clone(),
        Arc::new(AgentClassifier),
        node.agent_router.clone(),
        node.edge.clone(),
        shutdown.clone(),
    ));
    let unix_task = tokio::spawn(listen::serve_unix(
        unix,
        node.socket.clone(),
        node.node_id.clone(),
        node.router.clone(),
        node.edge.clone(),
        shutdown.clone(),
    ));
    let tls_task = tokio::spawn(listen::serve_tls(
        tcp,
        node.tls.clone(),
        node.classifier.clone(),
        node.router.clone(),
        node.edge.clone(),
        shutdown,
    ));
    Ok(Serving {
        tls_addr,
        agent_addr,
        debug_addr,
        unix_task,
        tls_task,
        agent_task,
        debug_task,
    })
}

impl Serving {
    /// Waits for the listeners to stop (after the shutdown fired), at most
    /// `grace`.
    pub async fn drain(self, grace: Duration) {
        let _ = tokio::time::timeout(grace, async {
            let _ = self.unix_task.await;
            let _ = self.tls_task.await;
            let _ = self.agent_task.await;
            if let Some(task) = self.debug_task {
                let _ = task.await;
            }
        })
        .await;
    }
}

/// The election starter of this build: etcd with the `etcd` feature,
/// none without.
pub fn election() -> Option<StartElection> {
    #[cfg(feature = "etcd")]
    {
        Some(crate::etcd::etcd_election())
    }
    #[cfg(not(feature = "etcd"))]
    {
        None
    }
}

/// Runs the daemon on the current tokio runtime until SIGINT/SIGTERM:
/// over the embedded store, or with `--etcd` as an elected instance.
pub async fn run(config: Config) -> Result<(), DaemonError> {
    let node = NodeServices::prepare_node(
        &config,
        Arc::new(TokioSpawner::current()),
        Arc::new(TokioDialer),
        election(),
    )
    .await?;
    let (trigger, shutdown) = shutdown_pair();
    let signals = signals()?;
    let serving = start(&node, shutdown).await?;
    node.log_serving(RuntimeKind::Tokio, serving.tls_addr, serving.agent_addr);
    let fatal = tokio::select! {
        () = signals => None,
        why = node.fatal() => Some(why),
    };
    tracing::info!("shutting down");
    node.resign().await;
    node.end_streams();
    trigger.trigger();
    serving.drain(node.shutdown_grace).await;
    node.close();
    tracing::info!("stopped");
    match fatal {
        Some(why) => Err(fatal_error(&why)),
        None => Ok(()),
    }
}

/// Installs the SIGTERM/SIGINT handlers; the future resolves on either.
fn signals() -> Result<impl std::future::Future<Output = ()>, DaemonError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

/// What idle threads run to return freed memory, and how often: set when
/// the binary allocates with mimalloc (it called
/// [`allocator::configure`](crate::allocator::configure)). Tokio workers
/// run it when they park (rate-limited) and are nudged that often; smol's
/// executor threads run it that often.
fn idle_release() -> Option<Housekeeping> {
    #[cfg(feature = "mimalloc")]
    if crate::allocator::is_configured() {
        return Some(Housekeeping {
            every: crate::allocator::RELEASE_INTERVAL,
            run: crate::allocator::release_idle_memory,
        });
    }
    None
}

/// Entry point of the `metropolisd` binary: parses flags, sets up logging,
/// runs the daemon on the chosen runtime, and exits non-zero with the error
/// on failure.
pub fn main() -> std::process::ExitCode {
    use clap::Parser;
    let mut config = Config::parse();
    config.logs = Some(init_logging(&config.log, config.log_tree_config()));
    let result = match config.runtime {
        RuntimeKind::Tokio => {
            let idle = idle_release();
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.enable_all();
            if let Some(h) = idle {
                builder.on_thread_park(h.run);
            }
            match builder.build() {
                Ok(rt) => rt.block_on(async {
                    if let Some(h) = idle {
                        tokio::spawn(crate::rt::nudge_workers(h.every));
                    }
                    run(config).await
                }),
                Err(e) => Err(format!("cannot start the tokio runtime: {e}").into()),
            }
        }
        RuntimeKind::Smol => {
            metropolis_runtime_smol::daemon::block_on_run_with(config, election(), idle_release())
        }
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
