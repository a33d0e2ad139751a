//! [`NodeServices`]: the services of one node built from the
//! configuration and the data directory, over the embedded store or
//! elected over etcd, with their host ports, routers, TLS and listen
//! addresses: everything a runtime needs to serve the node.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use metropolis_archive::ArchiveLimits;
use metropolis_core::identity::NodeId;
use metropolis_core::ports::{KvStore, WallClock};
use metropolis_core::trace::Tracefs;
use metropolis_pki::{ClientAuth, node_server_config};
use metropolis_service::debug::{DebugPorts, DebugService, LogHub, TraceWait};
use metropolis_service::metrics::{MeteredKv, Metrics};
use metropolis_service::node::{NodeOptions, NodePorts, NodeServiceSet};
use metropolis_service::{HealthMonitor, Readiness, Router, WatchCache, WatchCacheOptions};
use metropolis_store::{EmbeddedStore, StoreMetrics, StoreOptions};
use metropolis_transport::connect::Dialer;
use metropolis_transport::peer::PeerClassifier;
use metropolis_transport::runtime::{RuntimeTime, SharedRuntime};
use metropolis_transport::upstream::Dial;

use super::debug_ports::{image_store, kubeconfig_issuer};
use super::layout::create_data_dir;
use super::pki::{Issuer, load_or_create_pki};
use super::{Config, DaemonError, Layout, NodePki};
use crate::cluster::{Elected, StartElection};
use crate::metrics::NodeMetrics;

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl WallClock for SystemClock {
    fn now_unix_ms(&self) -> i64 {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
    }
}

/// Everything a runtime needs to serve this node, built from the data
/// directory.
pub struct NodeServices {
    /// This node's ID.
    pub node_id: NodeId,
    /// All services, behind the authorizing router.
    pub router: Router,
    /// TLS configuration of the curator listener.
    pub tls: Arc<rustls::ServerConfig>,
    /// Classifies TLS peers into identities.
    pub classifier: Arc<PeerClassifier>,
    /// Where the local socket goes.
    pub socket: PathBuf,
    /// Where the TLS listener goes.
    pub listen: SocketAddr,
    /// The AgentCallback service, behind its own router.
    pub agent_router: Router,
    /// Where the AgentCallback listener goes (same TLS configuration: the
    /// server certificate is this node's; client certificates are checked
    /// by `peer::AgentClassifier`).
    pub agent_listen: SocketAddr,
    /// The owner credential directory (for the startup message).
    pub owner_dir: PathBuf,
    /// NodeDebugService behind its own router, when `--debug-listen` was
    /// given.
    pub debug_router: Option<Router>,
    /// Where the debug listener goes (plain HTTP/2, unauthenticated).
    pub debug_listen: Option<SocketAddr>,
    /// The log tree behind GetLogs.
    pub logs: LogHub,
    /// What `--metrics-listen` serves, when given.
    pub metrics: Option<Arc<NodeMetrics>>,
    /// Where the metrics listener goes (plain HTTP/1.1).
    pub metrics_listen: Option<SocketAddr>,
    pub(super) debug: Option<DebugService>,
    /// How long connections may drain on shutdown.
    pub shutdown_grace: std::time::Duration,
    /// The limits of each listener and its connections.
    pub edge: metropolis_transport::edge::EdgeLimits,
    pub(super) cache: WatchCache,
    /// Health of every listener; shut down with the streams.
    pub(super) health: HealthMonitor,
    /// The embedded store, closed with the services; `None` when elected.
    pub(super) store: Option<Arc<EmbeddedStore>>,
    /// Stops the election of an elected instance.
    pub(super) election: std::sync::Mutex<Option<futures::future::BoxFuture<'static, ()>>>,
}

/// Where a node's state lives.
enum Backend {
    /// The embedded store, and the families it records in.
    Embedded(Arc<EmbeddedStore>, StoreMetrics),
    Elected(Elected),
}

impl NodeServices {
    /// Opens the data directory (creating the PKI on first start), builds
    /// the services with background tasks (and the containerd image store's
    /// calls) on `runtime`, and registers this
    /// node if it is not registered yet.
    pub async fn prepare(
        config: &Config,
        runtime: SharedRuntime,
    ) -> Result<NodeServices, DaemonError> {
        if config.cluster.enabled() {
            return Err("--etcd: this entry point serves the embedded store only; \
                        an elected instance needs NodeServices::prepare_elected \
                        (metropolisd built with the `etcd` feature does that)"
                .into());
        }
        config.check_debug_listen()?;
        create_data_dir(config)?;
        let layout = Layout::new(&config.data_dir);
        let metrics = StoreMetrics::default();
        let options = StoreOptions::default().with_metrics(metrics.clone());
        let store = Arc::new(EmbeddedStore::open(&layout.store, options)?);
        let pki = load_or_create_pki(&layout, &config.extra_sans)?;
        let core = Self::metrics(config, &runtime);
        Self::build(
            config,
            runtime,
            pki,
            Backend::Embedded(store, metrics),
            core,
        )
        .await
    }

    /// Builds the services the configuration asks for: over the embedded
    /// store ([`prepare`](Self::prepare)) without `--etcd`; with it, starts
    /// the election with `start` (the etcd port; `None` when this build
    /// has none: an error naming the missing feature) and builds an
    /// elected instance ([`prepare_elected`](Self::prepare_elected)) that
    /// reaches the leader through `dialer`. [`resign`](Self::resign) stops
    /// the election.
    pub async fn prepare_node(
        config: &Config,
        runtime: SharedRuntime,
        dialer: Arc<dyn Dialer>,
        start: Option<StartElection>,
    ) -> Result<NodeServices, DaemonError> {
        if !config.cluster.enabled() {
            return Self::prepare(config, runtime).await;
        }
        config.check_debug_listen()?;
        let Some(start) = start else {
            return Err(crate::exit::usage(
                "--etcd: this metropolisd was built without etcd support; \
                 rebuild it with `--features etcd` (its build needs protoc)",
            ));
        };
        let pki = NodePki::load_or_create(config)?;
        let client = pki.client_config()?;
        let dial: Dial =
            Arc::new(move |node_id, address| dialer.dial(node_id, address, client.clone()));
        // Before the election starts, so that it records its leases there.
        let metrics = Self::metrics(config, &runtime);
        let handle = start(config, &pki, dial, metrics.clone()).await?;
        if let Err(e) = crate::join::check_cluster_ca(handle.elected.store.as_ref(), &pki.ca).await
        {
            handle.stop.await;
            return Err(e);
        }
        let elected = Backend::Elected(handle.elected);
        let mut node = Self::build(config, runtime, pki, elected, metrics).await?;
        node.election = std::sync::Mutex::new(Some(handle.stop));
        Ok(node)
    }

    /// Builds the services of one curator instance of several: state in
    /// `elected.store` (etcd), every call routed by `elected.leadership`
    /// (served while leading, forwarded to the leader while following,
    /// held while no leader is known), every write fenced by it. `pki`
    /// comes from [`NodePki::load_or_create`]. The runtime drives the
    /// election and stops it on shutdown.
    pub async fn prepare_elected(
        config: &Config,
        runtime: SharedRuntime,
        pki: NodePki,
        elected: Elected,
    ) -> Result<NodeServices, DaemonError> {
        config.check_debug_listen()?;
        let metrics = Self::metrics(config, &runtime);
        Self::build(config, runtime, pki, Backend::Elected(elected), metrics).await
    }

    /// The service layer's metrics with `--metrics-listen`, timed on
    /// `runtime`'s clock; `None` without it.
    fn metrics(config: &Config, runtime: &SharedRuntime) -> Option<Metrics> {
        let clock = Arc::new(RuntimeTime::new(runtime.as_ref()));
        config.metrics_listen.map(|_| Metrics::new(clock))
    }

    async fn build(
        config: &Config,
        runtime: SharedRuntime,
        pki: NodePki,
        backend: Backend,
        metrics: Option<Metrics>,
    ) -> Result<NodeServices, DaemonError> {
        let layout = Layout::new(&config.data_dir);
        // Before this node registers itself or anything is served: a
        // Kubernetes CA that is the cluster CA refuses the start.
        let kubeconfig = match config.debug_listen {
            Some(_) => kubeconfig_issuer(config, &layout, &pki.ca)?,
            None => None,
        };
        // What serving needs, for health checks: the embedded store not
        // failed; an elected instance a known leader (the etcd store has
        // no failed state of its own: a lost etcd loses the lease).
        let (store, leadership, embedded, readiness): (Arc<dyn KvStore>, _, _, Arc<dyn Readiness>) =
            match &backend {
                Backend::Embedded(store, _) => {
                    let ready = Arc::new(store.health());
                    (store.clone(), None, Some(store.clone()), ready)
                }
                Backend::Elected(Elected { store, leadership }) => {
                    let ready = Arc::new(leadership.clone());
                    (store.clone(), Some(leadership.clone()), None, ready)
                }
            };
        let store: Arc<dyn KvStore> = match &metrics {
            Some(metrics) => {
                let backend = if embedded.is_some() {
                    "embedded"
                } else {
                    "etcd"
                };
                Arc::new(MeteredKv::new(store, backend, metrics.clone()))
            }
            None => store,
        };
        let assembled = metropolis_service::node::assemble(
            NodePorts {
                store,
                leadership,
                spawner: runtime.clone(),
                issuer: Some(Arc::new(Issuer(pki.ca.clone()))),
                wall_clock: Arc::new(SystemClock),
                readiness,
                backup: embedded
                    .clone()
                    .map(|s| s as Arc<dyn metropolis_core::ports::StoreBackup>),
                metrics: metrics.clone(),
            },
            NodeOptions {
                group_commit: config.cluster.group_commit(),
                watch_cache: WatchCacheOptions::default(),
                agent_lost_after: std::time::Duration::from_secs(config.agent_lost_after),
                curator_limits: config.edge.request_limits(),
                agent_limits: config.edge.request_limits(),
            },
            &pki.node_id,
            &pki.node_key,
        )
        .await?;
        if assembled.registered {
            tracing::info!(node = %pki.node_id, "registered this node in the cluster");
        }
        let NodeServiceSet {
            router,
            agent_router,
            cache,
            health,
            provisioning,
            ..
        } = assembled;
        let store_metrics = match &backend {
            Backend::Embedded(_, metrics) => Some(metrics),
            Backend::Elected(_) => None,
        };
        let node_metrics = metrics.as_ref().map(|core| {
            Arc::new(NodeMetrics::new(
                core.clone(),
                store_metrics,
                Arc::new(RuntimeTime::new(runtime.as_ref())),
                provisioning,
            ))
        });
        // Health and reflection on every listener, answered by this
        // instance for anyone; the debug listener needs neither store nor
        // leader.
        let logs = config
            .logs
            .clone()
            .unwrap_or_else(|| LogHub::new(config.log_tree_config()));
        let (debug_router, debug) = match config.debug_listen {
            None => (None, None),
            Some(_) => {
                let tracefs: Arc<dyn Tracefs> =
                    Arc::new(crate::tracefs::HostTracefs::new(&config.tracefs));
                let debug = DebugService::with_ports(DebugPorts {
                    kubeconfig,
                    tracefs: Some(tracefs),
                    trace_instances: config.trace_instances,
                    trace_wait: Some({
                        let time = RuntimeTime::new(runtime.as_ref());
                        TraceWait::new(Arc::new(time.clone()), Arc::new(time))
                    }),
                    images: Some(image_store(config, &runtime)?),
                    archive_limits: ArchiveLimits {
                        max_total_size: config.image_max_bytes,
                        ..ArchiveLimits::default()
                    },
                    ..DebugPorts::new(logs.clone())
                });
                let mut router = Router::new()
                    .with_limits(config.edge.request_limits())
                    .with_service(debug.server())
                    .with_service(debug.images().server())
                    .with_health_and_reflection(&health);
                if let Some(metrics) = &metrics {
                    router = router.with_metrics(metrics.clone());
                }
                (Some(router), Some(debug))
            }
        };
        let tls = node_server_config(&pki.node, &pki.node_p256, ClientAuth::Deferred)?;
        let classifier = Arc::new(PeerClassifier::new(pki.ca.cert_der())?);
        Ok(NodeServices {
            node_id: pki.node_id,
            router,
            tls,
            classifier,
            socket: config.socket_path(),
            listen: config.listen,
            agent_router,
            agent_listen: config.agent_listen,
            owner_dir: layout.owner,
            debug_router,
            debug_listen: config.debug_listen,
            logs,
            metrics: node_metrics,
            metrics_listen: config.metrics_listen,
            debug,
            shutdown_grace: std::time::Duration::from_secs(config.shutdown_grace),
            edge: config.edge.limits(),
            cache,
            health,
            store: embedded,
            election: std::sync::Mutex::new(None),
        })
    }
}
