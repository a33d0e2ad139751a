//! `metroctl`: the command-line client of the curator.

/// `println!` that ends the program quietly when stdout is closed (e.g.
/// `metroctl watch nodes | head`), instead of panicking on EPIPE.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if writeln!(std::io::stdout(), $($arg)*).is_err() {
            std::process::exit(0);
        }
    }};
}

mod debug;
mod exit;
mod files;
mod machine_view;
mod machines;
mod nodes;
mod osimage;
mod output;
mod snapshot;
mod watch;

pub(crate) use exit::status_error;
use exit::{EXIT_HELP, Exit, failed, usage};
use output::Format;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, CommandFactory, Parser, Subcommand};
use metropolis_core::identity::NodeId;
use metropolis_pki::{Credentials, client_config};
use metropolis_proto::metropolis::node::core::curator::proto::private::{
    RemoveNodeRequest, node_management_client::NodeManagementClient,
};
use metropolis_proto::prelude::curator::curator_client::CuratorClient;
use metropolis_proto::prelude::{common, curator};
use metropolis_transport::grpc::Channel;

use metropolis_runtime_tokio::rt::TokioRuntime;
use metropolis_transport::connect as dial;

/// Command-line interface of `metroctl`.
#[derive(Parser, Debug)]
#[command(
    name = "metroctl",
    version,
    about = "Talk to a Metropolis curator",
    long_about = "Talk to a Metropolis curator.\n\n\
        By default metroctl connects to the local UNIX socket of the daemon (as this node). \
        With --endpoints it connects over mutual TLS, to the first of them that answers, with a \
        credential directory (default: the owner credential <data-dir>/owner, or a node bundle \
        written by `metroctl node add`).",
    after_help = EXIT_HELP
)]
pub struct Cli {
    #[command(flatten)]
    conn: ConnectionArgs,
    /// Output format: table, wide, json or yaml.
    ///
    /// How commands print what they got: table (lines for people), wide
    /// (more columns in node and machine lists), json (one object per
    /// line: per item, per event), yaml (one document per item or event).
    /// `--json` on a command is `-o json`.
    ///
    /// Environment: METROCTL_OUTPUT. Default: table.
    #[arg(
        short = 'o',
        long = "output",
        global = true,
        env = "METROCTL_OUTPUT",
        hide_env = true,
        value_enum,
        default_value_t = Format::Table,
        hide_default_value = true,
        hide_possible_values = true,
        value_name = "FORMAT",
        help_heading = GLOBAL_OPTIONS
    )]
    output: Format,
    #[command(subcommand)]
    command: Command,
}

/// The heading of the options every command takes, shown after a
/// command's own in its help: one line each in `-h` (the first sentence
/// of their documentation), everything (the environment variable, the
/// default) in `--help`.
const GLOBAL_OPTIONS: &str = "Global options";

/// Environment variables metroctl read before every one of its flags had
/// a `METROCTL_` name: each is still read, below the new name, so a shell
/// that sets the old one keeps working (not shown in `--help`).
const OLD_ENV_NAMES: [(&str, &str, &str); 2] = [
    ("data_dir", "METROCTL_DATA_DIR", "METROPOLIS_DATA_DIR"),
    (
        "debug_endpoint",
        "METROCTL_DEBUG_ENDPOINT",
        "METROPOLIS_DEBUG_ENDPOINT",
    ),
];

// Each global option's first paragraph is its line in `-h`, so it is
// short; the environment variable and the default are said in the text of
// `--help` (clap's own annotations would make every `-h` line wrap).
#[derive(Args, Debug)]
#[command(next_help_heading = GLOBAL_OPTIONS)]
struct ConnectionArgs {
    /// The daemon's data directory.
    ///
    /// The daemon's data directory: the default socket is
    /// <data-dir>/curator.sock, the default credential <data-dir>/owner.
    ///
    /// Environment: METROCTL_DATA_DIR. Default: /var/lib/metropolis.
    #[arg(
        long,
        global = true,
        env = "METROCTL_DATA_DIR",
        hide_env = true,
        default_value = "/var/lib/metropolis",
        hide_default_value = true,
        value_name = "DIR"
    )]
    data_dir: PathBuf,
    /// The curator's local UNIX socket.
    ///
    /// The curator's local UNIX socket (callers act as this node).
    ///
    /// Environment: METROCTL_SOCKET. Default: <data-dir>/curator.sock.
    #[arg(
        long,
        global = true,
        env = "METROCTL_SOCKET",
        hide_env = true,
        conflicts_with = "endpoints",
        value_name = "PATH"
    )]
    socket: Option<PathBuf>,
    /// Curators' TLS listeners, instead of the socket.
    ///
    /// HOST:PORT of curators' TLS listeners (metropolisd --listen; HOST an
    /// IP address or a name), comma-separated or repeated (`--endpoint`
    /// too): tried in order, the first that answers is used. `watch` keeps
    /// them all and moves on to the next when one fails (a leader failover
    /// does not end it). Uses --credentials. Needed by the owner-only
    /// commands (node add|rm, machine, install, snapshot save): the local
    /// socket acts as this node.
    ///
    /// Environment: METROCTL_ENDPOINTS.
    #[arg(
        long,
        visible_alias = "endpoint",
        global = true,
        env = "METROCTL_ENDPOINTS",
        hide_env = true,
        value_delimiter = ',',
        value_name = "HOST:PORT"
    )]
    endpoints: Vec<String>,
    /// Credential directory for --endpoints.
    ///
    /// Credential directory for --endpoints (holding owner.pem or node.pem,
    /// its -key.pem, and ca.pem).
    ///
    /// Environment: METROCTL_CREDENTIALS. Default: <data-dir>/owner.
    #[arg(
        long,
        global = true,
        env = "METROCTL_CREDENTIALS",
        hide_env = true,
        value_name = "DIR"
    )]
    credentials: Option<PathBuf>,
    /// Seconds a command may take (then exit 3).
    ///
    /// Seconds a command may take: connecting, and the whole of a command
    /// that is not a stream (watch, logs -f, trace, load-image and
    /// snapshot save are bounded only while connecting). Then it fails
    /// with exit status 3.
    ///
    /// Environment: METROCTL_TIMEOUT. Default: 30.
    #[arg(
        long,
        global = true,
        env = "METROCTL_TIMEOUT",
        hide_env = true,
        default_value_t = 30,
        hide_default_value = true,
        value_name = "SECONDS"
    )]
    timeout: u64,
    /// A node's debug service (logs, trace, load-image, images, kubeconfig).
    ///
    /// HOST:PORT of a node's debug service (metropolisd --debug-listen),
    /// used by logs, trace, load-image, images and kubeconfig. Plain HTTP/2, no
    /// credentials: the debug service is unauthenticated.
    ///
    /// Environment: METROCTL_DEBUG_ENDPOINT. Default: 127.0.0.1:7837.
    #[arg(
        long,
        global = true,
        env = "METROCTL_DEBUG_ENDPOINT",
        hide_env = true,
        default_value = "127.0.0.1:7837",
        hide_default_value = true,
        value_name = "HOST:PORT"
    )]
    debug_endpoint: String,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Stream changes of the cluster's nodes until interrupted.
    #[command(subcommand)]
    Watch(watch::WatchCommand),
    /// Report a node's status.
    #[command(subcommand)]
    Status(StatusCommand),
    /// Manage nodes (add and rm need the owner over TLS: --endpoints).
    #[command(subcommand)]
    Node(NodeCommand),
    /// Manage provisioned machines (the owner over TLS: --endpoints).
    #[command(subcommand)]
    Machine(machines::MachineCommand),
    /// OS installation requests of provisioned machines (the owner over
    /// TLS: --endpoints).
    #[command(subcommand)]
    Install(machines::InstallCommand),
    /// Read a node's logs (debug service): the backlog, and with -f new
    /// entries until interrupted.
    Logs(debug::LogsArgs),
    /// Trace the node's kernel through tracefs (debug service) until
    /// Ctrl-C; the node restores tracefs afterwards.
    Trace(debug::TraceArgs),
    /// Load a container image tarball into the node's image store (debug
    /// service), with progress on standard error.
    LoadImage(debug::LoadImageArgs),
    /// Get a kubeconfig for any Kubernetes identity (debug service).
    Kubeconfig(debug::KubeconfigArgs),
    /// List the images in the node's image store (debug service).
    Images(debug::ImagesArgs),
    /// Back up the embedded store of a running curator, or restore a
    /// backup into an empty data directory (as `etcdctl snapshot`).
    #[command(subcommand)]
    Snapshot(snapshot::SnapshotCommand),
    /// Build OS images (the agent's format: an OCI artifact with chunk
    /// hashes) and push them to a registry.
    #[command(subcommand)]
    Osimage(osimage::OsimageCommand),
    /// Print a completion script for a shell: `source <(metroctl
    /// completion bash)`, or write it where the shell looks (e.g.
    /// /usr/share/bash-completion/completions/metroctl,
    /// ~/.zfunc/_metroctl, ~/.config/fish/completions/metroctl.fish).
    Completion {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Write man pages (metroctl.1 and one per subcommand, e.g.
    /// metroctl-machine-show.1) into DIR, e.g. /usr/local/share/man/man1.
    Man {
        /// The directory (created if missing).
        dir: PathBuf,
        /// Replace metroctl's pages already in DIR (e.g. after an
        /// upgrade); without it, a page there is refused and nothing is
        /// written.
        #[arg(long)]
        replace: bool,
    },
}

#[derive(Subcommand, Debug)]
enum StatusCommand {
    /// Set this node's status (over the socket: the daemon's node; over
    /// TLS: the node of the credential).
    Set {
        /// The address at which other nodes reach this node (IPv4 or IPv6).
        #[arg(long)]
        external_address: String,
        /// The node to update. Default: the node the connection speaks for.
        #[arg(long)]
        node_id: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
enum NodeCommand {
    /// Create a node: generate its key here, have the curator register it
    /// and issue its certificate, and write the credential bundle (into
    /// --out, which must hold none of its files: nothing is overwritten,
    /// and an existing file is refused before the call). Needs
    /// the owner over TLS: --endpoints HOST:PORT (with the owner
    /// credential <data-dir>/owner; the local socket acts as this node).
    /// With --curator: write the join bundle of a new curator instance
    /// instead (no connection).
    Add {
        /// Directory for the bundle (node.pem, node-key.pem mode 0600,
        /// ca.pem; with --curator: ca.pem and ca-key.pem mode 0600).
        #[arg(long)]
        out: PathBuf,
        /// Write a join bundle for a new curator instance (`metropolisd
        /// --join DIR --etcd ...`): the cluster CA of the instance whose
        /// --data-dir this is, read from its pki/ directory, so run it on
        /// that instance's host with access to the data directory. Needs
        /// no connection: the CA key never crosses the network. The bundle
        /// holds the CA key: carry it safely, delete it once joined.
        #[arg(long)]
        curator: bool,
        /// Print one JSON object: the node ID and where its credentials
        /// (or the join bundle) are.
        #[arg(long)]
        json: bool,
    },
    /// List the nodes of the cluster: ID, address, roles and AGE (the
    /// time since the node last reported its status).
    List {
        /// One JSON object per node and line.
        #[arg(long)]
        json: bool,
    },
    /// Show one node: roles, address, its last status report (when, and
    /// how long ago), the curator it runs, its version. Exit status 5 if
    /// there is no such node.
    Show {
        /// The node ID (metropolis-<32 hex>).
        id: String,
        /// One JSON object (as `node list --json` prints a node).
        #[arg(long)]
        json: bool,
    },
    /// Remove a node from the cluster. Needs the owner over TLS:
    /// --endpoints HOST:PORT (with the owner credential <data-dir>/owner;
    /// the local socket acts as this node).
    Rm {
        /// The node ID.
        id: String,
    },
}

/// A CLI failure: printed as `metroctl: <message>`.
type CliError = Box<dyn std::error::Error + Send + Sync>;

struct Connection {
    channel: Channel,
    /// The node this connection speaks for, if any.
    node_id: Option<NodeId>,
}

fn credential_prefix(dir: &Path) -> &'static str {
    if dir.join("owner.pem").exists() {
        "owner"
    } else {
        "node"
    }
}

/// The TLS configuration of `--credentials` (default: the owner's), and
/// the node it speaks for if it is a node's.
fn credential(
    args: &ConnectionArgs,
) -> Result<(std::sync::Arc<rustls::ClientConfig>, Option<NodeId>), CliError> {
    let (dir, flag) = match &args.credentials {
        Some(dir) => (dir.clone(), "--credentials"),
        None => (args.data_dir.join("owner"), "--data-dir"),
    };
    let what = "give --credentials DIR: the owner credential <data-dir>/owner (metropolisd \
        writes it on first start), or a node bundle written by `metroctl node add --out DIR`";
    if !dir.is_dir() {
        return Err(usage(format!(
            "{flag}: the credential directory {} does not exist; {what}",
            dir.display()
        )));
    }
    if !dir.join("owner.pem").exists() && !dir.join("node.pem").exists() {
        return Err(usage(format!(
            "{flag}: the credential directory {} holds neither owner.pem nor node.pem; {what}",
            dir.display()
        )));
    }
    let creds = Credentials::read_from_dir(&dir, credential_prefix(&dir))
        .map_err(|e| usage(format!("{flag}: {e}")))?;
    let node_id = creds
        .ed25519_public_key()
        .ok()
        .map(|k| NodeId::from_public_key(&k));
    let node_id = if credential_prefix(&dir) == "node" {
        node_id
    } else {
        None
    };
    Ok((client_config(Some(&creds), &creds.ca_pem)?, node_id))
}

/// The local socket: `--socket`, else `<data-dir>/curator.sock`.
fn socket_path(args: &ConnectionArgs) -> PathBuf {
    args.socket
        .clone()
        .unwrap_or_else(|| args.data_dir.join("curator.sock"))
}

/// Checks that `value` of `flag` is HOST:PORT (HOST an IP address, `[v6]`
/// or a name, resolved when connecting).
fn check_endpoint(flag: &str, value: &str) -> Result<(), CliError> {
    let bad = |why: &str| {
        usage(format!(
            "{flag}: {value:?} {why}: give HOST:PORT with HOST an IP address or a name, \
             e.g. 127.0.0.1:7835, [::1]:7835 or localhost:7835"
        ))
    };
    let Some((host, port)) = value.rsplit_once(':') else {
        return Err(bad("has no port"));
    };
    if host.is_empty() || host == "[]" {
        return Err(bad("has no host"));
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return Err(bad("is an IPv6 address without brackets"));
    }
    if port.parse::<u16>().is_err() {
        return Err(bad("has no port number after the last colon"));
    }
    Ok(())
}

/// Checks the connection flags that are values: every --endpoints and
/// --debug-endpoint.
fn check_connection_args(args: &ConnectionArgs) -> Result<(), CliError> {
    for endpoint in &args.endpoints {
        check_endpoint("--endpoints", endpoint)?;
    }
    check_endpoint("--debug-endpoint", &args.debug_endpoint)
}

/// The failure of a connection to every endpoint: denied when one of them
/// refused the credential (or was of another cluster), else unavailable.
fn none_answered(problems: Vec<(Exit, String)>) -> CliError {
    let exit = if problems.iter().any(|(exit, _)| *exit == Exit::Denied) {
        Exit::Denied
    } else {
        Exit::Unavailable
    };
    let list: Vec<String> = problems.into_iter().map(|(_, why)| why).collect();
    failed(exit, format!("no curator answered: {}", list.join("; ")))
}

async fn connect(args: &ConnectionArgs) -> Result<Connection, CliError> {
    if !args.endpoints.is_empty() {
        let (config, node_id) = credential(args)?;
        let mut problems = Vec::new();
        for endpoint in &args.endpoints {
            match dial::tls(&TokioRuntime::shared(), endpoint, config.clone()).await {
                Ok(channel) => return Ok(Connection { channel, node_id }),
                Err(e) => {
                    let text = metropolis_core::cause::describe(&e);
                    problems.push(exit::connect_problem(endpoint, Some(&e), &text));
                }
            }
        }
        return Err(none_answered(problems));
    }
    let socket = socket_path(args);
    let channel = dial::unix(&TokioRuntime::shared(), &socket)
        .await
        .map_err(|e| {
            failed(
                Exit::Unavailable,
                format!("{}: {e} (is metropolisd running?)", socket.display()),
            )
        })?;
    let node_id = Credentials::read_from_dir(&args.data_dir.join("pki"), "node")
        .ok()
        .and_then(|c| c.ed25519_public_key().ok())
        .map(|k| NodeId::from_public_key(&k));
    Ok(Connection { channel, node_id })
}

/// Runs `cli`'s command, bounded by `--timeout` unless it is a stream.
async fn run(cli: Cli) -> Result<(), CliError> {
    let limit = Duration::from_secs(cli.conn.timeout);
    let streaming = matches!(
        &cli.command,
        Command::Watch(_)
            | Command::Trace(_)
            | Command::LoadImage(_)
            | Command::Snapshot(_)
            | Command::Osimage(_)
    ) || matches!(&cli.command, Command::Logs(l) if l.follows());
    if streaming {
        return run_command(cli, Some(limit)).await;
    }
    tokio::time::timeout(limit, run_command(cli, None))
        .await
        .unwrap_or_else(|_| {
            let why = format!("timed out after {limit:?} (--timeout)");
            Err(failed(Exit::Unavailable, why))
        })
}

/// Runs `cli`'s command; `connect_limit` bounds connecting to the curator
/// (the whole command is bounded by the caller otherwise).
async fn run_command(cli: Cli, connect_limit: Option<Duration>) -> Result<(), CliError> {
    if !matches!(
        cli.command,
        Command::Completion { .. } | Command::Man { .. }
    ) {
        check_connection_args(&cli.conn)?;
    }
    let endpoint = cli.conn.debug_endpoint.as_str();
    let format = cli.output;
    let command = match cli.command {
        Command::Logs(args) => {
            return debug::on_a_tls_port(endpoint, debug::logs(endpoint, args, format).await).await;
        }
        Command::Trace(args) => {
            return debug::on_a_tls_port(endpoint, debug::trace(endpoint, args).await).await;
        }
        Command::LoadImage(args) => {
            let loaded = debug::load_image(endpoint, args, format).await;
            return debug::on_a_tls_port(endpoint, loaded).await;
        }
        Command::Kubeconfig(args) => {
            let made = debug::kubeconfig(endpoint, args, format).await;
            return debug::on_a_tls_port(endpoint, made).await;
        }
        Command::Images(args) => {
            return debug::on_a_tls_port(endpoint, debug::images(endpoint, args, format).await)
                .await;
        }
        Command::Osimage(command) => {
            let limit = connect_limit.unwrap_or(Duration::from_secs(cli.conn.timeout));
            return osimage::run(command, format, limit).await;
        }
        Command::Snapshot(snapshot::SnapshotCommand::Restore { file, json }) => {
            return snapshot::restore_into(&cli.conn.data_dir, &file, format.or_json(json));
        }
        Command::Man { dir, replace } => {
            let pages = files::write_man_pages(Cli::command(), &dir, replace)?;
            outln!("{pages} man pages written to {}", dir.display());
            return Ok(());
        }
        Command::Completion { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "metroctl", &mut out);
            use std::io::Write as _;
            if std::io::stdout().write_all(&out).is_err() {
                std::process::exit(0);
            }
            return Ok(());
        }
        Command::Node(NodeCommand::Add {
            out,
            curator: true,
            json,
        }) => {
            return nodes::add_curator(&cli.conn.data_dir, &out, format.or_json(json));
        }
        Command::Watch(w) => {
            let limit = connect_limit.unwrap_or(Duration::from_secs(cli.conn.timeout));
            return watch::watch(&cli.conn, w, format, limit).await;
        }
        other => other,
    };
    // Flag values are checked before connecting: a bad one is a usage
    // error whether or not a curator answers, and nothing is sent.
    check_values(&command)?;
    let owner_only = owner_only(&command);
    let over_socket = cli.conn.endpoints.is_empty();
    let result = curator_command(&cli.conn, command, format, connect_limit).await;
    match (result, owner_only) {
        (Err(e), Some(name)) if over_socket && exit::exit_of(e.as_ref()) == Exit::Denied => {
            Err(failed(
                Exit::Denied,
                format!(
                    "`metroctl {name}` needs the owner credential over mutual TLS, and the \
                     local socket acts as this node: rerun with --endpoints HOST:PORT, the \
                     daemon's --listen address (e.g. `metroctl --endpoints 127.0.0.1:7835 \
                     {name} ...`); the owner credential {} is used by default \
                     (--credentials) (the curator said: {e})",
                    cli.conn.data_dir.join("owner").display()
                ),
            ))
        }
        (result, _) => result,
    }
}

/// The name of an owner-only command (the owner's credential over TLS;
/// the local socket acts as this node), for the error that says so.
fn owner_only(command: &Command) -> Option<&'static str> {
    use machines::{InstallCommand as I, MachineCommand as M};
    Some(match command {
        Command::Node(NodeCommand::Add { .. }) => "node add",
        Command::Node(NodeCommand::Rm { .. }) => "node rm",
        Command::Machine(M::Add { .. }) => "machine add",
        Command::Machine(M::List { .. }) => "machine list",
        Command::Machine(M::Show { .. }) => "machine show",
        Command::Machine(M::Rm { .. }) => "machine rm",
        Command::Install(I::Request { .. }) => "install request",
        Command::Install(I::Status { .. }) => "install status",
        Command::Snapshot(snapshot::SnapshotCommand::Save { .. }) => "snapshot save",
        _ => return None,
    })
}

/// Checks the flag values and arguments of a command that talks to the
/// curator, before connecting: each failure is a usage error naming the
/// flag.
fn check_values(command: &Command) -> Result<(), CliError> {
    match command {
        Command::Machine(m) => machines::check_machine(m),
        Command::Install(i) => machines::check_install(i),
        Command::Node(NodeCommand::Rm { id } | NodeCommand::Show { id, .. }) => NodeId::parse(id)
            .map(drop)
            .map_err(|e| usage(format!("ID: {e}"))),
        Command::Node(NodeCommand::Add { out, curator, .. }) => nodes::check_add(out, *curator),
        Command::Snapshot(snapshot::SnapshotCommand::Save { file, .. }) => {
            snapshot::check_save(file)
        }
        Command::Status(StatusCommand::Set {
            external_address, ..
        }) => external_address.parse::<IpAddr>().map(drop).map_err(|_| {
            usage(format!(
                "--external-address: {external_address:?} is not an IPv4 or IPv6 address"
            ))
        }),
        _ => Ok(()),
    }
}

/// Runs a command that talks to the curator: connects (bounded by
/// `connect_limit` when given), then calls.
async fn curator_command(
    args: &ConnectionArgs,
    command: Command,
    format: Format,
    connect_limit: Option<Duration>,
) -> Result<(), CliError> {
    let conn = match connect_limit {
        Some(limit) => tokio::time::timeout(limit, connect(args))
            .await
            .unwrap_or_else(|_| {
                Err(failed(
                    Exit::Unavailable,
                    format!("no curator answered within {limit:?} (--timeout)"),
                ))
            })?,
        None => connect(args).await?,
    };
    let mut curator = CuratorClient::with_origin(conn.channel.clone(), Channel::origin());
    match command {
        Command::Machine(m) => machines::machine(conn.channel, m, format).await,
        Command::Snapshot(snapshot::SnapshotCommand::Save { file, json }) => {
            snapshot::save(conn.channel, &file, format.or_json(json)).await
        }
        Command::Install(i) => machines::install(conn.channel, i, format).await,
        Command::Status(StatusCommand::Set {
            external_address,
            node_id,
        }) => {
            external_address.parse::<IpAddr>().map_err(|_| {
                usage(format!(
                    "--external-address: {external_address:?} is not an IPv4 or IPv6 address"
                ))
            })?;
            let node_id = match node_id {
                Some(id) => id,
                None => conn
                    .node_id
                    .ok_or_else(|| {
                        usage("--node-id: needed, as this connection does not speak for a node")
                    })?
                    .to_string(),
            };
            let status = common::NodeStatus {
                external_address,
                timestamp: Some(prost_types::Timestamp::from(std::time::SystemTime::now())),
                ..Default::default()
            };
            curator
                .update_node_status(curator::UpdateNodeStatusRequest {
                    node_id: node_id.clone(),
                    status: Some(status),
                })
                .await
                .map_err(status_error)?;
            outln!("status of {node_id} updated");
            Ok(())
        }
        Command::Node(NodeCommand::List { json }) => {
            nodes::list(conn.channel, format.or_json(json)).await
        }
        Command::Node(NodeCommand::Show { id, json }) => {
            nodes::show(conn.channel, &id, format.or_json(json)).await
        }
        Command::Node(NodeCommand::Add { out, json, .. }) => {
            nodes::add(conn.channel, &out, format.or_json(json)).await
        }
        Command::Node(NodeCommand::Rm { id }) => {
            let id = NodeId::parse(&id).map_err(|e| usage(format!("ID: {e}")))?;
            let mut mgmt = NodeManagementClient::with_origin(conn.channel, Channel::origin());
            mgmt.remove_node(RemoveNodeRequest {
                node_id: id.to_string(),
            })
            .await
            .map_err(status_error)?;
            outln!("node {id} removed");
            Ok(())
        }
        Command::Logs(_)
        | Command::Watch(_)
        | Command::Trace(_)
        | Command::LoadImage(_)
        | Command::Kubeconfig(_)
        | Command::Images(_)
        | Command::Osimage(_)
        | Command::Snapshot(snapshot::SnapshotCommand::Restore { .. })
        | Command::Completion { .. }
        | Command::Man { .. } => {
            unreachable!("commands without a curator connection returned above")
        }
    }
}

/// Entry point of the `metroctl` binary.
pub fn main() -> std::process::ExitCode {
    use clap::FromArgMatches as _;
    let mut command = Cli::command();
    for (id, new, old) in OLD_ENV_NAMES {
        if std::env::var_os(new).is_none()
            && let Ok(value) = std::env::var(old)
        {
            command = command.mut_arg(id, |arg| arg.default_value(value));
        }
    }
    let cli = match Cli::from_arg_matches(&command.get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("metroctl: cannot start the tokio runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("metroctl: {e}");
            std::process::ExitCode::from(exit::exit_of(e.as_ref()) as u8)
        }
    }
}
