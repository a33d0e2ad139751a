//! The daemon's configuration: [`Config`], every flag of `metropolisd`
//! ([`crate::settings`] reads them from the command line, the environment
//! and a file), what the flags refuse ([`Config::check_debug_listen`],
//! [`parse_listen`]), the runtime they choose ([`RuntimeKind`]) and the
//! default ports.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use metropolis_core::logtree::LogTreeConfig;
use metropolis_core::quote::quoted;
use metropolis_service::debug::LogHub;

use super::{DaemonError, LogFormat};
use crate::cluster::ClusterFlags;

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

/// Default TCP port of the AgentCallback listener.
pub const DEFAULT_AGENT_PORT: u16 = 7836;

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
    /// point (see [`init_logging`](super::init_logging)). None: a tree of
    /// its own that only receives what the embedder appends.
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
    if port.parse::<u16>().is_err() {
        return Err(format!(
            "{} is not a port (0-65535): {expected}",
            quoted(port)
        ));
    }
    if host.is_empty() {
        // Go's `:PORT` (every address) is not taken: the operator says
        // which addresses.
        return Err(format!(
            "no host before the port: write 0.0.0.0:{port} (every IPv4 address), \
             [::]:{port} (every address) or 127.0.0.1:{port} (this machine only)"
        ));
    }
    if host.contains(':') && !host.starts_with('[') {
        return Err(format!(
            "an IPv6 address needs brackets before its port, as in [::1]:{port}: {expected}"
        ));
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
pub(super) fn is_loopback(addr: SocketAddr) -> bool {
    addr.ip().to_canonical().is_loopback()
}
