//! `metropolisd` on smol: listeners, signals and the executor around
//! [`metropolis_host::daemon`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use metropolis_host::cluster::StartElection;
use metropolis_host::daemon::{Config, DaemonError, NodeServices, RuntimeKind};

use crate::connect::SmolDialer;
use metropolis_host::peer::AgentClassifier;
use metropolis_host::shutdown::{Shutdown, shutdown_pair};

use crate::listen;
use crate::rt::SmolExecutor;

/// The listeners of a node, serving until their [`Shutdown`] fires.
pub struct Serving {
    /// The TLS listener's bound address (useful with port 0).
    pub tls_addr: SocketAddr,
    /// The AgentCallback listener's bound address.
    pub agent_addr: SocketAddr,
    /// The debug listener's bound address, when enabled.
    pub debug_addr: Option<SocketAddr>,
    unix_task: smol::Task<()>,
    tls_task: smol::Task<()>,
    agent_task: smol::Task<()>,
    debug_task: Option<smol::Task<()>>,
}

/// Binds the node's UNIX socket and TLS listener and serves its router on
/// `executor` until `shutdown` fires. This is what an embedder calls.
pub async fn start(
    node: &NodeServices,
    executor: SmolExecutor,
    shutdown: Shutdown,
) -> Result<Serving, DaemonError> {
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
            let task = executor.spawn(listen::serve_plain(
                tcp,
                router.clone(),
                node.edge.clone(),
                executor.clone(),
                shutdown.clone(),
            ));
            (Some(bound), Some(task))
        }
        _ => (None, None),
    };
    let agent_task = executor.spawn(listen::serve_tls(
        agent_tcp,
        node.tls.clone(),
        Arc::new(AgentClassifier),
        node.agent_router.clone(),
        node.edge.clone(),
        executor.clone(),
        shutdown.clone(),
    ));
    let unix_task = executor.spawn(listen::serve_unix(
        unix,
        node.socket.clone(),
        node.node_id.clone(),
        node.router.clone(),
        node.edge.clone(),
        executor.clone(),
        shutdown.clone(),
    ));
    let tls_task = executor.spawn(listen::serve_tls(
        tcp,
        node.tls.clone(),
        node.classifier.clone(),
        node.router.clone(),
        node.edge.clone(),
        executor.clone(),
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
        let Serving {
            unix_task,
            tls_task,
            agent_task,
            debug_task,
            ..
        } = self;
        let drained = async {
            unix_task.await;
            tls_task.await;
            agent_task.await;
            if let Some(task) = debug_task {
                task.await;
            }
        };
        let timeout = async {
            async_io::Timer::after(grace).await;
        };
        smol::future::or(drained, timeout).await;
    }
}

/// Runs the daemon on `executor` until SIGINT/SIGTERM, over the embedded
/// store (`--etcd` needs [`run_with`]).
pub async fn run(config: Config, executor: SmolExecutor) -> Result<(), DaemonError> {
    run_with(config, executor, None).await
}

/// Runs the daemon on `executor` until SIGINT/SIGTERM; with `--etcd`, as
/// an elected instance whose election `election` begins (the etcd port lives
/// in `metropolis-runtime-tokio`, on a dedicated tokio thread).
pub async fn run_with(
    config: Config,
    executor: SmolExecutor,
    election: Option<StartElection>,
) -> Result<(), DaemonError> {
    let dialer = Arc::new(SmolDialer(executor.clone()));
    let node =
        NodeServices::prepare_node(&config, Arc::new(executor.clone()), dialer, election).await?;
    let (trigger, shutdown) = shutdown_pair();
    let mut signals =
        async_signal::Signals::new([async_signal::Signal::Term, async_signal::Signal::Int])?;
    let serving = start(&node, executor, shutdown).await?;
    node.log_serving(RuntimeKind::Smol, serving.tls_addr, serving.agent_addr);
    let fatal = futures::future::select(signals.next(), node.fatal()).await;
    let fatal = match fatal {
        futures::future::Either::Left(_) => None,
        futures::future::Either::Right((why, _)) => Some(why),
    };
    tracing::info!("shutting down");
    node.resign().await;
    node.end_streams();
    trigger.trigger();
    serving.drain(node.shutdown_grace).await;
    node.close();
    tracing::info!("stopped");
    match fatal {
        Some(why) => Err(metropolis_host::daemon::fatal_error(&why)),
        None => Ok(()),
    }
}

/// Work each executor thread does periodically besides running tasks,
/// on that thread (e.g. returning the memory its allocator kept).
#[derive(Clone, Copy, Debug)]
pub struct Housekeeping {
    /// The period.
    pub every: Duration,
    /// What to run.
    pub run: fn(),
}

impl Housekeeping {
    /// Runs forever on the polling thread (hence any output type).
    async fn run_forever<T>(self) -> T {
        loop {
            smol::Timer::after(self.every).await;
            (self.run)();
        }
    }
}

/// Drives `future` on the current thread, with `housekeeping` alongside.
fn block_on_with<T>(
    housekeeping: Option<Housekeeping>,
    future: impl std::future::Future<Output = T>,
) -> T {
    match housekeeping {
        Some(h) => smol::block_on(smol::future::or(future, h.run_forever())),
        None => smol::block_on(future),
    }
}

/// Runs the daemon to completion on smol: a multi-threaded executor (one
/// thread per core) driving [`run`].
pub fn block_on_run(config: Config) -> Result<(), DaemonError> {
    block_on_run_with(config, None, None)
}

/// [`block_on_run`] with an election starter (see [`run_with`]) and work
/// for every executor thread to do periodically.
pub fn block_on_run_with(
    config: Config,
    election: Option<StartElection>,
    housekeeping: Option<Housekeeping>,
) -> Result<(), DaemonError> {
    let executor = Arc::new(smol::Executor::new());
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let (stop, stopped) = smol::channel::unbounded::<()>();
    let mut workers = Vec::new();
    for i in 0..threads.saturating_sub(1) {
        let (ex, stopped) = (executor.clone(), stopped.clone());
        let worker = std::thread::Builder::new()
            .name(format!("metropolis-smol-{i}"))
            .spawn(move || block_on_with(housekeeping, ex.run(stopped.recv())))?;
        workers.push(worker);
    }
    let result = block_on_with(
        housekeeping,
        executor.run(run_with(
            config,
            SmolExecutor::on(executor.clone()),
            election,
        )),
    );
    drop(stop);
    for w in workers {
        let _ = w.join();
    }
    result
}
