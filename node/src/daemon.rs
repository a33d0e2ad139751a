//! What `metropolisd` decides before it serves, on any runtime: its
//! configuration ([`Config`], the flags; [`crate::settings`] reads them
//! from the command line, the environment and a file), the data directory
//! ([`Layout`]: store, PKI, owner credential), and [`NodeServices`], the
//! services built on them with their host ports, plus the daemon's
//! logging ([`init_logging`]). [`crate::serving`] starts the listeners and
//! runs the daemon on a [`Runtime`](metropolis_transport::runtime::Runtime);
//! the runtime crates only implement that trait.
//!
//! On first start with an empty data directory it creates the cluster CA,
//! this node's Ed25519 identity and certificate (and an ECDSA P-256 server
//! certificate of the same identity, for TLS clients without Ed25519), and
//! an owner credential, and registers this node as the first node of the
//! cluster.

use std::net::SocketAddr;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Parser, ValueEnum};
use metropolis_archive::ArchiveLimits;
use metropolis_core::identity::{NodeId, is_curator_certificate};
use metropolis_core::logtree::LogTreeConfig;
use metropolis_core::ports::KubeconfigIssuer;
use metropolis_core::ports::{CertIssuer, KvStore, WallClock};
use metropolis_core::trace::Tracefs;
use metropolis_service::debug::{DebugPorts, DebugService, LogHub, TraceWait};
use metropolis_service::images::ImageStore;
use metropolis_service::node::{NodeOptions, NodePorts, NodeServiceSet};
use metropolis_service::{HealthMonitor, Readiness, Router, WatchCache, WatchCacheOptions};

use crate::cluster::{ClusterFlags, Elected, StartElection};
use crate::images::{ContainerdConfig, ContainerdStore, OciLayoutOptions, OciLayoutStore};
use crate::metrics::NodeMetrics;
use metropolis_pki::{
    CA_KEY_FILE, ClientAuth, ClusterCa, Credentials, DebugKubeconfigs, KubernetesCa, P256Status,
    load_or_issue_p256, node_server_config, upgrade_key_file,
};
use metropolis_service::metrics::{MeteredKv, Metrics};
use metropolis_store::{EmbeddedStore, StoreMetrics, StoreOptions};
use metropolis_transport::connect::Dialer;
use metropolis_transport::peer::PeerClassifier;
use metropolis_transport::runtime::{RuntimeTime, SharedRuntime};
use metropolis_transport::upstream::Dial;

/// How logs are written to stderr ([`init_logging`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines; colours only when stderr is a terminal (so
    /// journald and files get plain text).
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`,
    /// `fields` (the message and the event's fields), `span` and `spans`.
    Json,
}

/// The async runtime the daemon runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RuntimeKind {
    /// tokio, multi-threaded.
    Tokio,
    /// smol (async-io reactor, async-executor), no tokio reactor.
    Smol,
}

impl std::fmt::Display for RuntimeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RuntimeKind::Tokio => "tokio",
            RuntimeKind::Smol => "smol",
        })
    }
}

/// Default TCP port of the curator's TLS listener.
pub const DEFAULT_PORT: u16 = 7835;

/// Default TCP port of the debug service.
pub const DEFAULT_DEBUG_PORT: u16 = 7837;

/// Where `--debug-listen` without a value listens.
pub const DEFAULT_DEBUG_LISTEN: &str = "127.0.0.1:7837";

/// Where `--metrics-listen` without a value listens.
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:7838";

/// Command-line configuration of `metropolisd`.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "metropolisd",
    version,
    about = "Metropolis node daemon: the Curator (local UNIX socket and mutual TLS), AgentCallback (TLS, port 7836) and, with --debug-listen, NodeDebugService",
    long_about = "Metropolis node daemon.\n\n\
        On first start with an empty data directory it creates the cluster CA (pki/ca.pem, \
        pki/ca-key.pem), this node's Ed25519 identity and certificate (pki/node.pem, \
        pki/node-key.pem), a P-256 server certificate for clients without Ed25519 \
        (pki/node-p256.pem, pki/node-p256-key.pem), and an owner credential (owner/), with \
        private keys (PKCS#8 v1) in mode 0600, and registers this node. Later starts reuse \
        them (the P-256 certificate is re-issued when it no longer matches).\n\n\
        Every listener answers gRPC health checks and server reflection.\n\n\
        The embedded store (store/) is a write-ahead log with snapshots: an update is \
        acknowledged only once it is on disk. A corrupt store refuses to start, naming the file.\n\n\
        Every listener is bound before the data directory is created or read. A fatal error \
        is printed once on stderr, as a JSON line with --log-format json. Exit status: 0 \
        stopped by SIGTERM/SIGINT, 1 any other failure, 2 a usage error (the flag named), 3 \
        unavailable (a listen address in use, the data directory in use by another daemon), 4 \
        permission denied (docs/operations.md, \"Exit status\").\n\n\
        `metropolisd man DIR` writes this page as the man page DIR/metropolisd.1."
)]
pub struct Config {
    /// A TOML file of settings: keys are flag names without the dashes
    /// (`listen = "0.0.0.0:7835"`, `san = ["a", "b"]`, `trace-instances =
    /// true`). A flag beats its environment variable, which beats the file.
    #[arg(long, env = "METROPOLIS_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Directory holding the store, the PKI and the owner credential.
    #[arg(
        long,
        env = "METROPOLIS_DATA_DIR",
        default_value = "/var/lib/metropolis"
    )]
    pub data_dir: PathBuf,
    /// Address of the mutual-TLS listener: IP:PORT, or HOST:PORT resolved
    /// at start (its first address). The default listens on every
    /// interface; 127.0.0.1:7835 keeps it on this host.
    #[arg(
        long,
        value_name = "ADDR",
        value_parser = parse_listen,
        default_value_t = SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT))
    )]
    pub listen: SocketAddr,
    /// Address of the AgentCallback listener (TLS; agents authenticate with
    /// self-signed Ed25519 certificates), as --listen takes it. The
    /// default listens on every interface; 127.0.0.1:7836 keeps it on
    /// this host.
    #[arg(
        long,
        value_name = "ADDR",
        value_parser = parse_listen,
        default_value_t = SocketAddr::from(([0, 0, 0, 0], DEFAULT_AGENT_PORT))
    )]
    pub agent_listen: SocketAddr,
    /// A machine whose agent has not sent a heartbeat for this long is
    /// shown as lost by `metroctl machine list`.
    #[arg(long, default_value = "120", value_name = "SECONDS")]
    pub agent_lost_after: u64,
    /// Path of the local UNIX socket (mode 0600; callers are this node).
    /// Default: `<data-dir>/curator.sock`.
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Extra names or IP addresses put in this node's certificate on first
    /// start (repeatable).
    #[arg(long = "san")]
    pub extra_sans: Vec<String>,
    /// How long open connections may take to finish after SIGINT/SIGTERM.
    #[arg(long, default_value = "5", value_name = "SECONDS")]
    pub shutdown_grace: u64,
    /// Async runtime to serve on (same behaviour, same data directory format).
    #[arg(long, value_enum, default_value_t = RuntimeKind::Tokio)]
    pub runtime: RuntimeKind,
    /// Log filter (tracing EnvFilter syntax), e.g. "info" or "metropolis=debug".
    #[arg(long, env = "METROPOLIS_LOG", default_value = "info")]
    pub log: String,
    /// Log format on stderr: `text` (plain unless stderr is a terminal)
    /// or `json` (one object per line, with tracing's fields).
    #[arg(long, env = "METROPOLIS_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Memory cap of the retained logs served by GetLogs, in bytes (the
    /// oldest entries are evicted first).
    #[arg(long, default_value_t = 16 * 1024 * 1024, value_name = "BYTES")]
    pub log_buffer_bytes: usize,
    /// Entries retained per log DN (e.g. root.curator) for GetLogs.
    #[arg(long, default_value_t = 1024, value_name = "N")]
    pub log_entries_per_dn: usize,
    /// Enables NodeDebugService (logs, kernel tracing, image loading, debug
    /// kubeconfigs) on ADDR, plain HTTP/2 without TLS. It is
    /// UNAUTHENTICATED: anyone who can connect can read the logs, trace the
    /// kernel, load images and mint kubeconfigs. Off unless given; the flag
    /// alone listens on 127.0.0.1:7837. An address that is not loopback
    /// also needs --debug-listen-non-loopback.
    #[arg(
        long,
        value_name = "ADDR",
        num_args = 0..=1,
        value_parser = parse_listen,
        default_missing_value = DEFAULT_DEBUG_LISTEN,
    )]
    pub debug_listen: Option<SocketAddr>,
    /// Lets --debug-listen take an address that is not loopback (e.g.
    /// 0.0.0.0:7837), reachable from the network: anyone who reaches it
    /// gets the unauthenticated debug service. Without it such an address
    /// is refused at start.
    #[arg(long, requires = "debug_listen")]
    pub debug_listen_non_loopback: bool,
    /// Serves Prometheus metrics on ADDR (plain HTTP, `GET /metrics`):
    /// calls by method and status code with latency, Watch streams, store
    /// commits and sync latency, WAL and snapshot sizes, leadership,
    /// heartbeats and machines (names in docs/operations.md). Off unless
    /// given; the flag alone listens on 127.0.0.1:7838. The metrics hold
    /// no secrets, but any address other than loopback shows them to
    /// whoever reaches it.
    #[arg(
        long,
        value_name = "ADDR",
        num_args = 0..=1,
        value_parser = parse_listen,
        default_missing_value = DEFAULT_METRICS_LISTEN,
    )]
    pub metrics_listen: Option<SocketAddr>,
    /// The Kubernetes CA certificate (PEM) that signs debug kubeconfigs;
    /// needs --kubernetes-ca-key. It must be a CA of its own: the cluster
    /// CA (pki/ca.pem), its key, or a CA it signed is refused at start.
    #[arg(long, value_name = "FILE", requires = "kubernetes_ca_key")]
    pub kubernetes_ca_cert: Option<PathBuf>,
    /// The Kubernetes CA private key (PEM, PKCS#8); needs
    /// --kubernetes-ca-cert.
    #[arg(long, value_name = "FILE", requires = "kubernetes_ca_cert")]
    pub kubernetes_ca_key: Option<PathBuf>,
    /// Without --kubernetes-ca-cert: sign debug kubeconfigs with a CA the
    /// daemon generates (pki/kubernetes-ca-GENERATED.pem, labelled as
    /// generated; no real cluster trusts it unless told to). With false,
    /// GetDebugKubeconfig fails until a CA is configured.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub kubernetes_ca_generate: bool,
    /// The Kubernetes API server URL written into debug kubeconfigs.
    #[arg(long, value_name = "URL", default_value = "https://127.0.0.1:6443")]
    pub kubernetes_api_server: String,
    /// Validity of a debug kubeconfig's client certificate (Kubernetes
    /// cannot revoke client certificates: keep it short).
    #[arg(long, value_name = "SECONDS", default_value_t = 24 * 3600)]
    pub kubeconfig_validity: u64,
    /// Where the kernel's tracefs is mounted (for Trace).
    #[arg(long, value_name = "PATH", default_value = crate::tracefs::DEFAULT_ROOT)]
    pub tracefs: PathBuf,
    /// Run each Trace session in a tracefs instance of its own
    /// (instances/metropolis-trace-N, removed afterwards), so several run at
    /// once. Without it, sessions share the global buffer, one at a time.
    #[arg(long)]
    pub trace_instances: bool,
    /// Import LoadImage archives into containerd at this socket (its gRPC
    /// API, streamed as they arrive) instead of the default store, an OCI
    /// image layout under `<data-dir>/images`.
    #[arg(long, value_name = "PATH")]
    pub containerd_socket: Option<PathBuf>,
    /// The containerd namespace images go to.
    #[arg(long, value_name = "NS", default_value = "k8s.io")]
    pub containerd_namespace: String,
    /// Let LoadImage replace an image whose name exists already (otherwise
    /// AlreadyExists, and the existing image is untouched).
    #[arg(long)]
    pub image_replace_tags: bool,
    /// Largest archive LoadImage accepts, in bytes (ResourceExhausted
    /// beyond it).
    #[arg(long, value_name = "BYTES", default_value_t = 8 * 1024 * 1024 * 1024)]
    pub image_max_bytes: u64,
    /// Running as one of several curator instances over etcd.
    #[command(flatten)]
    pub cluster: ClusterFlags,
    /// Limits on connections and requests at every listener.
    #[command(flatten)]
    pub edge: metropolis_transport::edge::flags::EdgeFlags,
    /// The log tree the debug service serves; set by the daemon's entry
    /// point (see [`init_logging`]). None: a tree of its own that only
    /// receives what the embedder appends.
    #[arg(skip)]
    pub logs: Option<LogHub>,
}

impl Config {
    /// The daemon's defaults for `data_dir`, listening for TLS on `listen`
    /// (port 0 picks a free port): the configuration an embedder starts
    /// from.
    pub fn new(data_dir: impl Into<PathBuf>, listen: SocketAddr) -> Self {
        let mut config = Config::parse_from(["metropolisd"]);
        config.data_dir = data_dir.into();
        config.listen = listen;
        config.agent_listen = SocketAddr::new(listen.ip(), 0);
        config
    }

    /// The log tree limits from the flags.
    pub fn log_tree_config(&self) -> LogTreeConfig {
        LogTreeConfig {
            max_bytes: self.log_buffer_bytes,
            max_entries_per_dn: self.log_entries_per_dn,
            ..LogTreeConfig::default()
        }
    }

    /// Refuses flags that would expose the unauthenticated debug service
    /// to the network unasked: a non-loopback `--debug-listen` without
    /// `--debug-listen-non-loopback`.
    pub fn check_debug_listen(&self) -> Result<(), DaemonError> {
        match self.debug_listen {
            Some(addr) if !is_loopback(addr) && !self.debug_listen_non_loopback => {
                Err(crate::exit::usage(format!(
                    "--debug-listen {addr}: not a loopback address, so the unauthenticated debug \
                 service would be reachable from the network; listen on loopback (e.g. \
                 127.0.0.1:{DEFAULT_DEBUG_PORT}), or add --debug-listen-non-loopback if every \
                 host that can reach {addr} is trusted"
                )))
            }
            _ => Ok(()),
        }
    }

    /// The socket path, defaulted from the data directory.
    pub fn socket_path(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(|| self.data_dir.join("curator.sock"))
    }
}

/// A listen address: IP:PORT (`127.0.0.1:7835`, `[::1]:7835`), or
/// HOST:PORT resolved now to its first address (`localhost:7835`).
pub fn parse_listen(value: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = value.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let expected = "expected IP:PORT (e.g. 127.0.0.1:7835, [::1]:7835, 0.0.0.0:7835) or HOST:PORT";
    let Some((host, port)) = value.rsplit_once(':') else {
        return Err(format!("no port: {expected}"));
    };
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(format!("{port:?} is not a port (0-65535): {expected}"));
    }
    use std::net::ToSocketAddrs;
    match value.to_socket_addrs() {
        Ok(mut addrs) => addrs
            .next()
            .ok_or_else(|| format!("{host:?} resolves to no address: {expected}")),
        Err(e) => Err(format!("cannot resolve {host:?} ({e}): {expected}")),
    }
}

/// Whether `addr` is a loopback address (an IPv4-mapped IPv6 one too).
fn is_loopback(addr: SocketAddr) -> bool {
    addr.ip().to_canonical().is_loopback()
}

/// Paths inside the data directory.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The embedded store.
    pub store: PathBuf,
    /// Cluster CA and this node's credentials.
    pub pki: PathBuf,
    /// The owner credential bundle.
    pub owner: PathBuf,
}

impl Layout {
    /// The layout under `data_dir`.
    pub fn new(data_dir: &Path) -> Self {
        Layout {
            store: data_dir.join("store"),
            pki: data_dir.join("pki"),
            owner: data_dir.join("owner"),
        }
    }
}

/// A daemon failure, with what to do about it.
pub type DaemonError = Box<dyn std::error::Error + Send + Sync>;

struct Issuer(ClusterCa);

impl CertIssuer for Issuer {
    fn issue_node_certificate(
        &self,
        public_key: &[u8; 32],
    ) -> Result<metropolis_core::ports::IssuedCertificate, metropolis_core::ports::CertIssueError>
    {
        let cert = self
            .0
            .issue_node_for_key(public_key, &[])
            .map_err(|e| metropolis_core::ports::CertIssueError::Signing(e.to_string()))?;
        Ok(metropolis_core::ports::IssuedCertificate {
            certificate_pem: cert,
            ca_pem: self.0.cert_pem(),
        })
    }
}

/// This node's PKI (cluster CA, this node's identity and credentials),
/// created on first start.
pub struct NodePki {
    ca: ClusterCa,
    node: Credentials,
    /// The ECDSA P-256 twin of `node`'s certificate, for TLS clients
    /// without Ed25519.
    node_p256: Credentials,
    node_id: NodeId,
    node_key: [u8; 32],
}

impl NodePki {
    /// Creates the data directory and the PKI in it if missing, and loads
    /// them: a runtime calls this before
    /// [`NodeServices::prepare_elected`] to learn this node's ID and
    /// credentials (for its election value and its connections to the
    /// leader).
    pub fn load_or_create(config: &Config) -> Result<NodePki, DaemonError> {
        create_data_dir(config)?;
        let layout = Layout::new(&config.data_dir);
        if let Some(bundle) = &config.cluster.join {
            create_private_dir(&layout.pki, "PKI directory")?;
            crate::join::install_bundle(bundle, &layout.pki)?;
        }
        load_or_create_pki(&layout, &config.extra_sans)
    }

    /// This node's ID.
    pub fn node_id(&self) -> &NodeId {
        &self.node_id
    }

    /// A TLS client configuration presenting this node's certificate and
    /// trusting the cluster CA: how this instance connects to the leader.
    pub fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, DaemonError> {
        Ok(metropolis_pki::client_config(
            Some(&self.node),
            &self.node.ca_pem,
        )?)
    }
}

/// Creates `dir` (and its parents) with mode 0700 if missing; `what`
/// names it in the error.
fn create_private_dir(dir: &Path, what: &str) -> Result<(), DaemonError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("{}: cannot create the {what}: {e}", dir.display()).into())
}

/// Creates the data directory (mode 0700) if missing; a path that is a
/// file, or under one, is a usage error naming `--data-dir`.
fn create_data_dir(config: &Config) -> Result<(), DaemonError> {
    let dir = &config.data_dir;
    if let Ok(meta) = std::fs::metadata(dir)
        && !meta.is_dir()
    {
        return Err(crate::exit::usage(format!(
            "--data-dir {}: is a file, not a directory; give a directory (created if \
             missing), or move the file away",
            dir.display()
        )));
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| {
            let exit = match e.kind() {
                std::io::ErrorKind::NotADirectory => crate::exit::Exit::Usage,
                _ => crate::exit::io_status(&e),
            };
            let hint = match e.kind() {
                std::io::ErrorKind::NotADirectory => {
                    "; a parent of it is a file: give a path under a directory"
                }
                std::io::ErrorKind::PermissionDenied => {
                    "; run as a user that may create it, or give another --data-dir"
                }
                _ => "",
            };
            crate::exit::error(
                exit,
                format!(
                    "--data-dir {}: cannot create the data directory: {e}{hint}",
                    dir.display()
                ),
            )
        })
}

fn load_or_create_pki(layout: &Layout, extra_sans: &[String]) -> Result<NodePki, DaemonError> {
    // Earlier versions wrote Ed25519 keys as PKCS#8 v2, which OpenSSL and
    // BoringSSL refuse: the same keys, rewritten as v1.
    for key in [
        layout.pki.join(CA_KEY_FILE),
        Credentials::key_path(&layout.pki, "node"),
        Credentials::key_path(&layout.owner, "owner"),
    ] {
        if upgrade_key_file(&key)? {
            tracing::info!(file = %key.display(), "rewrote the Ed25519 key as PKCS#8 v1");
        }
    }
    let ca_cert = layout.pki.join("ca.pem");
    let ca = if ca_cert.exists() {
        ClusterCa::read_from_dir(&layout.pki)?
    } else {
        tracing::info!(dir = %layout.pki.display(), "first start: creating the cluster CA");
        let ca = ClusterCa::generate()?;
        ca.write_to_dir(&layout.pki)?;
        ca
    };
    let node = if layout.pki.join("node.pem").exists() {
        let creds = Credentials::read_from_dir(&layout.pki, "node")?;
        if is_curator_certificate(&creds.cert_der()?) {
            creds
        } else {
            // Written before node certificates marked curator instances:
            // the same key and name, with the mark.
            let key = creds.ed25519_public_key()?;
            let cert_pem = ca.issue_node_cert(&key, extra_sans, true)?;
            let creds = Credentials::from_parts(cert_pem, creds.key_pem, creds.ca_pem);
            creds.write_to_dir(&layout.pki, "node")?;
            tracing::info!("reissued this node's certificate to mark it as a curator instance's");
            creds
        }
    } else {
        let (creds, id) = ca.issue_curator_node(extra_sans)?;
        creds.write_to_dir(&layout.pki, "node")?;
        tracing::info!(node = %id, "created this node's identity");
        creds
    };
    if !layout.owner.join("owner.pem").exists() {
        let owner = ca.issue_owner()?;
        owner.write_to_dir(&layout.owner, "owner")?;
        tracing::info!(dir = %layout.owner.display(), "created the owner credential");
    }
    let (node_p256, status) = load_or_issue_p256(&layout.pki, &ca, &node)?;
    match status {
        P256Status::Kept => {}
        P256Status::Created => {
            tracing::info!(
                "created this node's P-256 server certificate (for TLS clients without Ed25519)"
            );
        }
        P256Status::Reissued { reason } => {
            tracing::info!(%reason, "reissued this node's P-256 server certificate");
        }
        other => tracing::info!(?other, "this node's P-256 server certificate"),
    }
    let node_key = node.ed25519_public_key()?;
    let node_id = NodeId::from_public_key(&node_key);
    Ok(NodePki {
        ca,
        node,
        node_p256,
        node_id,
        node_key,
    })
}

/// Default TCP port of the AgentCallback listener.
pub const DEFAULT_AGENT_PORT: u16 = 7836;

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
    debug: Option<DebugService>,
    /// How long connections may drain on shutdown.
    pub shutdown_grace: std::time::Duration,
    /// The limits of each listener and its connections.
    pub edge: metropolis_transport::edge::EdgeLimits,
    cache: WatchCache,
    /// Health of every listener; shut down with the streams.
    health: HealthMonitor,
    /// The embedded store, closed with the services; `None` when elected.
    store: Option<Arc<EmbeddedStore>>,
    /// Stops the election of an elected instance.
    election: std::sync::Mutex<Option<futures::future::BoxFuture<'static, ()>>>,
}

/// The error a daemon stops with after [`NodeServices::fatal`] resolved
/// with `why`.
pub fn fatal_error(why: &str) -> DaemonError {
    format!(
        "stopped serving: the embedded store failed: {why}. Every acknowledged \
         write is on disk; fix the cause (free space on the data directory's \
         file system, or check the disk) and start metropolisd again"
    )
    .into()
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

    /// Stops this instance's election, if it is elected: a leader resigns
    /// (its successor takes over at once) and calls in flight end with
    /// "curator shutting down". Call first on shutdown.
    pub async fn resign(&self) {
        let stop = self
            .election
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(stop) = stop {
            stop.await;
        }
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

    /// Logs the loud warning that goes with an enabled debug service,
    /// louder when `debug_addr` is not loopback.
    pub fn log_debug_serving(&self, debug_addr: SocketAddr) {
        if is_loopback(debug_addr) {
            tracing::warn!(
                debug_listen = %debug_addr,
                "NodeDebugService is ENABLED and UNAUTHENTICATED: anyone who can connect to \
                 {debug_addr} can read this node's logs, trace its kernel, load container \
                 images and mint Kubernetes credentials; never expose it beyond a trusted \
                 network"
            );
        } else {
            tracing::warn!(
                debug_listen = %debug_addr,
                "NodeDebugService is ENABLED, UNAUTHENTICATED and REACHABLE FROM THE NETWORK \
                 (--debug-listen-non-loopback): anyone who can reach {debug_addr} over the \
                 network can read this node's logs, trace its kernel, load container images \
                 and mint Kubernetes credentials; firewall it to trusted hosts"
            );
        }
    }

    /// Logs where the node serves, once its listeners are bound.
    pub fn log_serving(&self, runtime: RuntimeKind, tls_addr: SocketAddr, agent_addr: SocketAddr) {
        tracing::info!(
            %runtime,
            agent_listen = %agent_addr,
            node = %self.node_id,
            socket = %self.socket.display(),
            listen = %tls_addr,
            owner_credential = %self.owner_dir.display(),
            "curator serving"
        );
    }

    /// Resolves with the cause once this instance can no longer serve at
    /// all: its embedded store failed (a write or sync of the WAL failed,
    /// e.g. ENOSPC or EIO), after which it would refuse every change for
    /// good. The runtimes then stop serving and exit non-zero, so that a
    /// supervisor restarts the daemon: the restart recovers every
    /// acknowledged write from the WAL, which a failed store in a running
    /// process never retries (after a failed sync the page cache is not to
    /// be trusted). Never resolves for an elected instance: a lost etcd
    /// loses the lease and the instance campaigns again.
    pub fn fatal(&self) -> futures::future::BoxFuture<'static, String> {
        let Some(store) = &self.store else {
            return Box::pin(futures::future::pending());
        };
        let health = store.health();
        let mut subscribed = false;
        Box::pin(futures::future::poll_fn(move |cx| {
            if !subscribed {
                // Woken at every failure or close from now on.
                health.subscribe(cx.waker().clone());
                subscribed = true;
            }
            match health.failure() {
                Some(why) => std::task::Poll::Ready(why),
                None => std::task::Poll::Pending,
            }
        }))
    }

    /// Ends every open Watch stream with Unavailable ("curator backend
    /// switched, request can be retried"), the debug service's running
    /// traces and followed logs, and the health Watch and reflection
    /// streams (health says NOT_SERVING from then on); call first on
    /// shutdown.
    pub fn end_streams(&self) {
        self.health.shut_down();
        self.cache.close_all(tonic::Status::unavailable(
            "curator backend switched, request can be retried",
        ));
        if let Some(debug) = &self.debug {
            // Running traces restore tracefs now, on every runtime.
            debug.close_streams();
        }
    }

    /// Closes the store once no task holds it any more. Acknowledged writes
    /// are already on disk; this only stops the writer thread early.
    pub fn close(self) {
        let NodeServices {
            store,
            cache,
            router,
            ..
        } = self;
        drop((cache, router));
        if let Some(store) = store
            && let Ok(store) = Arc::try_unwrap(store)
            && let Err(e) = store.close()
        {
            tracing::error!(error = %e, "closing the store failed");
        }
    }
}

/// The image store the flags ask for: containerd, or the OCI image layout
/// under the data directory.
fn image_store(
    config: &Config,
    runtime: &SharedRuntime,
) -> Result<Arc<dyn ImageStore>, DaemonError> {
    match &config.containerd_socket {
        Some(socket) => {
            let mut c = ContainerdConfig::new(socket, config.data_dir.join("containerd-staging"));
            c.namespace = config.containerd_namespace.clone();
            c.replace_tags = config.image_replace_tags;
            let store = ContainerdStore::open(c, runtime.clone())
                .map_err(|e| format!("{}: containerd image store: {e}", socket.display()))?;
            Ok(Arc::new(store))
        }
        None => {
            let dir = config.data_dir.join("images");
            let store = OciLayoutStore::open(
                &dir,
                OciLayoutOptions::replace_tags(config.image_replace_tags),
            )
            .map_err(|e| format!("{}: image store: {e}", dir.display()))?;
            Ok(Arc::new(store))
        }
    }
}

/// The kubeconfig issuer the flags ask for: the configured Kubernetes CA,
/// else a generated one (unless `--kubernetes-ca-generate=false`), else
/// none. A Kubernetes CA that is the cluster CA `cluster` in any form is
/// refused: the kubeconfigs it signed would be cluster credentials, the
/// owner's among them, for anyone reaching the debug service.
fn kubeconfig_issuer(
    config: &Config,
    layout: &Layout,
    cluster: &ClusterCa,
) -> Result<Option<Arc<dyn KubeconfigIssuer>>, DaemonError> {
    let ca = match (&config.kubernetes_ca_cert, &config.kubernetes_ca_key) {
        (Some(cert), Some(key)) => {
            let ca = KubernetesCa::from_files(cert, key)?;
            ca.check_separate_from(cluster).map_err(|overlap| {
                format!(
                    "--kubernetes-ca-cert {} / --kubernetes-ca-key {}: {overlap}, so the debug \
                     kubeconfigs it signs would be Metropolis cluster credentials (the owner's \
                     among them) for anyone reaching the debug service; give the CA of your \
                     Kubernetes cluster, one that is not the cluster CA (pki/ca.pem) and was \
                     not signed by it, or leave both flags out to sign with a generated debug \
                     CA",
                    cert.display(),
                    key.display()
                )
            })?;
            ca
        }
        (None, None) if config.kubernetes_ca_generate => {
            let ca = KubernetesCa::load_or_generate(&layout.pki)?;
            ca.check_separate_from(cluster).map_err(|overlap| {
                format!(
                    "{}: the generated Kubernetes CA: {overlap}; remove {} and {} (a new one \
                     is generated)",
                    layout.pki.display(),
                    metropolis_pki::GENERATED_KUBERNETES_CA_CERT,
                    metropolis_pki::GENERATED_KUBERNETES_CA_KEY
                )
            })?;
            tracing::warn!(
                dir = %layout.pki.display(),
                "debug kubeconfigs are signed by a GENERATED Kubernetes CA, not a cluster's \
                 (configure --kubernetes-ca-cert and --kubernetes-ca-key)"
            );
            ca
        }
        (None, None) => return Ok(None),
        _ => {
            return Err(crate::exit::usage(
                "--kubernetes-ca-cert and --kubernetes-ca-key go together: give both, or neither",
            ));
        }
    };
    Ok(Some(Arc::new(DebugKubeconfigs::new(
        ca,
        config.kubernetes_api_server.clone(),
        std::time::Duration::from_secs(config.kubeconfig_validity),
    ))))
}

/// Sets up logging with `filter` (falling back to "info") to stderr in
/// `format` and into a log tree with `tree` limits, which it returns for
/// the debug service's GetLogs (put it in [`Config::logs`]); the tree is
/// the same whatever the format.
pub fn init_logging(filter: &str, format: LogFormat, tree: LogTreeConfig) -> LogHub {
    use std::io::IsTerminal;
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let env_filter = tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|e| {
        eprintln!("--log {filter:?}: {e}; using \"info\"");
        tracing_subscriber::EnvFilter::new("info")
    });
    let hub = LogHub::new(tree);
    let stderr = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let stderr = match format {
        LogFormat::Text => stderr.with_ansi(std::io::stderr().is_terminal()).boxed(),
        LogFormat::Json => stderr.json().with_current_span(true).boxed(),
    };
    let _ = tracing_subscriber::registry()
        .with(env_filter)
        .with(stderr)
        .with(crate::logs::LogTreeLayer::new(hub.clone()))
        .try_init();
    hub
}
