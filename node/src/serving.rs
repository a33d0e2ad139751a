//! A node serving on a runtime: its listeners bound and served
//! ([`start`]), and the daemon's run loop around them ([`run`]): serve
//! until SIGTERM/SIGINT or a fatal store error, then resign, end the
//! streams, drain the connections and close the store.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, Either};

use crate::cluster::StartElection;
use crate::daemon::{Config, DaemonError, NodeServices, RuntimeKind, fatal_error};
use metropolis_transport::connect::RuntimeDialer;
use metropolis_transport::edge::with_timeout;
use metropolis_transport::listen;
use metropolis_transport::peer::AgentClassifier;
use metropolis_transport::runtime::{SharedRuntime, spawn_joinable};
use metropolis_transport::shutdown::{Shutdown, shutdown_pair};

/// The listeners of a node, serving until their [`Shutdown`] fires.
pub struct Serving {
    /// The TLS listener's bound address (useful with port 0).
    pub tls_addr: SocketAddr,
    /// The AgentCallback listener's bound address.
    pub agent_addr: SocketAddr,
    /// The debug listener's bound address, when enabled.
    pub debug_addr: Option<SocketAddr>,
    /// The metrics listener's bound address, when enabled.
    pub metrics_addr: Option<SocketAddr>,
    runtime: SharedRuntime,
    /// Resolves once every listener stopped and its connections ended.
    stopped: Vec<BoxFuture<'static, ()>>,
}

/// Binds the node's UNIX socket, TLS, AgentCallback and (when enabled)
/// debug and metrics listeners and serves its routers on `runtime` until `shutdown`
/// fires. This is what an embedder calls.
pub fn start(
    runtime: &SharedRuntime,
    node: &NodeServices,
    shutdown: Shutdown,
) -> Result<Serving, DaemonError> {
    let unix = listen::bind_unix(runtime, &node.socket).map_err(|e| {
        format!(
            "{}: cannot bind the local socket: {e}",
            node.socket.display()
        )
    })?;
    let (tcp, tls_addr) = listen::bind_tcp(runtime, node.listen)
        .map_err(|e| format!("{}: cannot listen: {e}", node.listen))?;
    let (agent_tcp, agent_addr) = listen::bind_tcp(runtime, node.agent_listen)
        .map_err(|e| format!("{}: cannot listen for agents: {e}", node.agent_listen))?;
    let mut stopped: Vec<BoxFuture<'static, ()>> = Vec::new();
    let mut debug_addr = None;
    if let (Some(addr), Some(router)) = (node.debug_listen, &node.debug_router) {
        let (tcp, bound) = listen::bind_tcp(runtime, addr)
            .map_err(|e| format!("{addr}: cannot listen for the debug service: {e}"))?;
        node.log_debug_serving(bound);
        debug_addr = Some(bound);
        let serve = listen::serve_plain(
            runtime.clone(),
            tcp,
            router.clone(),
            node.edge.clone(),
            shutdown.clone(),
        );
        stopped.push(Box::pin(spawn_joinable(&**runtime, serve)));
    }
    let mut metrics_addr = None;
    if let (Some(addr), Some(metrics)) = (node.metrics_listen, &node.metrics) {
        let (tcp, bound) = listen::bind_tcp(runtime, addr)
            .map_err(|e| format!("{addr}: cannot listen for metrics scrapes: {e}"))?;
        tracing::info!(metrics_listen = %bound, "serving Prometheus metrics at http://{bound}/metrics");
        metrics_addr = Some(bound);
        let serve = listen::serve_scrapes(
            runtime.clone(),
            tcp,
            metrics.render(),
            node.edge.clone(),
            shutdown.clone(),
        );
        stopped.push(Box::pin(spawn_joinable(&**runtime, serve)));
    }
    let agent = listen::serve_tls(
        runtime.clone(),
        agent_tcp,
        node.tls.clone(),
        Arc::new(AgentClassifier),
        node.agent_router.clone(),
        node.edge.clone(),
        shutdown.clone(),
    );
    stopped.push(Box::pin(spawn_joinable(&**runtime, agent)));
    let local = listen::serve_unix(
        runtime.clone(),
        unix,
        node.socket.clone(),
        node.node_id.clone(),
        node.router.clone(),
        node.edge.clone(),
        shutdown.clone(),
    );
    stopped.push(Box::pin(spawn_joinable(&**runtime, local)));
    let tls = listen::serve_tls(
        runtime.clone(),
        tcp,
        node.tls.clone(),
        node.classifier.clone(),
        node.router.clone(),
        node.edge.clone(),
        shutdown,
    );
    stopped.push(Box::pin(spawn_joinable(&**runtime, tls)));
    Ok(Serving {
        tls_addr,
        agent_addr,
        debug_addr,
        metrics_addr,
        runtime: runtime.clone(),
        stopped,
    })
}

impl Serving {
    /// Waits for the listeners to stop (after the shutdown fired) and
    /// their connections to end, at most `grace`.
    pub async fn drain(self, grace: Duration) {
        let timer = self.runtime.timer();
        let _ = with_timeout(&timer, grace, futures::future::join_all(self.stopped)).await;
    }
}

/// Runs the daemon on `runtime` until SIGINT/SIGTERM or a fatal store
/// error: over the embedded store, or with `--etcd` as an elected instance
/// whose election `election` begins. `kind` names the runtime in the log.
pub async fn run(
    runtime: SharedRuntime,
    kind: RuntimeKind,
    config: Config,
    election: Option<StartElection>,
) -> Result<(), DaemonError> {
    let dialer = Arc::new(RuntimeDialer(runtime.clone()));
    let node = NodeServices::prepare_node(&config, runtime.clone(), dialer, election).await?;
    let (trigger, shutdown) = shutdown_pair();
    let signals = runtime.termination()?;
    let serving = start(&runtime, &node, shutdown)?;
    node.log_serving(kind, serving.tls_addr, serving.agent_addr);
    let notifier = crate::notify::notify_ready(&runtime, "serving");
    let fatal = match futures::future::select(signals, Box::pin(node.fatal())).await {
        Either::Left(_) => None,
        Either::Right((why, _)) => Some(why),
    };
    tracing::info!("shutting down");
    if let Some(n) = &notifier
        && let Err(e) = n.notify("STOPPING=1")
    {
        tracing::warn!(error = %e, "cannot notify the service manager (NOTIFY_SOCKET)");
    }
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
