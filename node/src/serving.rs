//! A node serving on a runtime: its listeners bound ([`Listeners::bind`],
//! before the data directory is touched) and served ([`serve`];
//! [`start`] does both), and the daemon's run loop around them ([`run`]): serve
//! until SIGTERM/SIGINT or a fatal store error, then resign, end the
//! streams, drain the connections and close the store.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, Either};

use crate::cluster::StartElection;
use crate::daemon::{Config, DaemonError, NodeServices, RuntimeKind, fatal_error};
use crate::exit;
use metropolis_transport::connect::RuntimeDialer;
use metropolis_transport::edge::with_timeout;
use metropolis_transport::listen;
use metropolis_transport::peer::AgentClassifier;
use metropolis_transport::runtime::{Listener, SharedRuntime, spawn_joinable};
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

/// The node's TCP listeners, bound before anything is written to the data
/// directory ([`Listeners::bind`]), so that a taken port stops the start
/// before a CA or credential is created.
pub struct Listeners {
    tls: (Box<dyn Listener>, SocketAddr),
    agent: (Box<dyn Listener>, SocketAddr),
    debug: Option<(Box<dyn Listener>, SocketAddr)>,
    metrics: Option<(Box<dyn Listener>, SocketAddr)>,
}

impl Listeners {
    /// Binds every TCP listener `config` asks for (`--listen`,
    /// `--agent-listen`, `--debug-listen`, `--metrics-listen`) and checks
    /// that the directory of `--socket` exists (one inside `--data-dir` is
    /// created, mode 0700, as the data directory itself would be); each
    /// failure names its flag and says what to do.
    pub fn bind(runtime: &SharedRuntime, config: &Config) -> Result<Listeners, DaemonError> {
        if let Some(socket) = &config.socket {
            check_socket_dir(socket, &config.data_dir)?;
        }
        Self::bind_addrs(
            runtime,
            config.listen,
            config.agent_listen,
            config.debug_listen,
            config.metrics_listen,
        )
    }

    fn bind_addrs(
        runtime: &SharedRuntime,
        listen: SocketAddr,
        agent_listen: SocketAddr,
        debug_listen: Option<SocketAddr>,
        metrics_listen: Option<SocketAddr>,
    ) -> Result<Listeners, DaemonError> {
        let tls = bind(runtime, "--listen", listen)?;
        let agent = bind(runtime, "--agent-listen", agent_listen)?;
        let debug = debug_listen
            .map(|addr| bind(runtime, "--debug-listen", addr))
            .transpose()?;
        let metrics = metrics_listen
            .map(|addr| bind(runtime, "--metrics-listen", addr))
            .transpose()?;
        Ok(Listeners {
            tls,
            agent,
            debug,
            metrics,
        })
    }
}

/// Binds `addr`, given as `flag`; the error names the flag.
fn bind(
    runtime: &SharedRuntime,
    flag: &str,
    addr: SocketAddr,
) -> Result<(Box<dyn Listener>, SocketAddr), DaemonError> {
    listen::bind_tcp(runtime, addr).map_err(|e| {
        use std::io::ErrorKind;
        let why = match e.kind() {
            ErrorKind::AddrInUse => "address already in use (another program listens there)".into(),
            ErrorKind::AddrNotAvailable => "the address is not one of this host's".into(),
            ErrorKind::PermissionDenied => "permission denied (a port below 1024 needs root or \
                 CAP_NET_BIND_SERVICE)"
                .into(),
            _ => e.to_string(),
        };
        exit::error(
            exit::io_status(&e),
            format!("{flag} {addr}: cannot listen: {why}; choose another address with {flag}"),
        )
    })
}

/// Refuses a `--socket` whose directory is not a directory, or is missing
/// outside `data_dir`; a missing directory at or under `data_dir` is
/// created (mode 0700), as the daemon creates the data directory.
fn check_socket_dir(socket: &Path, data_dir: &Path) -> Result<(), DaemonError> {
    let dir = match socket.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    if !dir.exists() && dir.starts_with(data_dir) {
        use std::os::unix::fs::DirBuilderExt;
        if let Err(e) = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
        {
            return Err(exit::error(
                exit::io_status(&e),
                format!(
                    "--socket {}: cannot create its directory {} (inside --data-dir): {e}",
                    socket.display(),
                    dir.display()
                ),
            ));
        }
    }
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(exit::usage(format!(
            "--socket {}: {} is not a directory; give a path in an existing directory",
            socket.display(),
            dir.display()
        ))),
        Err(e) => Err(exit::error(
            match exit::io_status(&e) {
                exit::Exit::Failure => exit::Exit::Usage,
                other => other,
            },
            format!(
                "--socket {}: its directory {}: {e}; create it first, or give a path in an \
                 existing directory",
                socket.display(),
                dir.display()
            ),
        )),
    }
}

/// Binds the node's UNIX socket, TLS, AgentCallback and (when enabled)
/// debug and metrics listeners and serves its routers on `runtime` until `shutdown`
/// fires. This is what an embedder calls.
pub fn start(
    runtime: &SharedRuntime,
    node: &NodeServices,
    shutdown: Shutdown,
) -> Result<Serving, DaemonError> {
    let listeners = Listeners::bind_addrs(
        runtime,
        node.listen,
        node.agent_listen,
        node.debug_router.as_ref().and(node.debug_listen),
        node.metrics.as_ref().and(node.metrics_listen),
    )?;
    serve(runtime, node, listeners, shutdown)
}

/// Serves `node`'s routers on `listeners` (bound by [`Listeners::bind`])
/// and its UNIX socket, bound now, until `shutdown` fires.
pub fn serve(
    runtime: &SharedRuntime,
    node: &NodeServices,
    listeners: Listeners,
    shutdown: Shutdown,
) -> Result<Serving, DaemonError> {
    let unix = listen::bind_unix(runtime, &node.socket).map_err(|e| {
        exit::error(
            exit::io_status(&e),
            format!(
                "--socket {}: cannot bind the local socket: {e}",
                node.socket.display()
            ),
        )
    })?;
    let Listeners {
        tls: (tcp, tls_addr),
        agent: (agent_tcp, agent_addr),
        debug,
        metrics,
    } = listeners;
    let mut stopped: Vec<BoxFuture<'static, ()>> = Vec::new();
    let mut debug_addr = None;
    if let (Some((tcp, bound)), Some(router)) = (debug, &node.debug_router) {
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
    if let (Some((tcp, bound)), Some(metrics)) = (metrics, &node.metrics) {
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
    // Every listener is bound before the data directory is touched: a
    // taken port leaves no CA, identity or owner credential behind.
    config.check_debug_listen()?;
    let listeners = Listeners::bind(&runtime, &config)?;
    let dialer = Arc::new(RuntimeDialer(runtime.clone()));
    let node = NodeServices::prepare_node(&config, runtime.clone(), dialer, election).await?;
    let (trigger, shutdown) = shutdown_pair();
    let signals = runtime.termination()?;
    let serving = serve(&runtime, &node, listeners, shutdown)?;
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
