//! `bmaas-agent`, the provisioning agent, on tokio: drives the sans-IO
//! [`metropolis_core::provisioning::AgentLoop`] with real
//! heartbeats over mutual TLS, a persisted last-acted generation, the host's
//! hardware report and an [`Installer`].
//!
//! What it needs from the machine it runs on (docs/spec/semantics.md, "The
//! agent (client side)"):
//!
//! - [`hardware`] gathers the hardware report from `/proc`, `/sys` and
//!   DMI, with a warning for each part it could not read.
//! - [`install`] installs an OS image from an OCI registry onto the root
//!   device, behind the [`install::Installer`] trait; [`installer_from_args`]
//!   sets it up from the `--registry-*` flags (trusted roots, logins, time
//!   limits).
//!
//! Both are plain blocking `std` code: reading sysfs and writing a disk
//! image are blocking file I/O on every runtime anyway, and an
//! installation is one long sequential transfer, so it gains nothing from
//! an event loop. The agent calls them on a blocking thread
//! (`spawn_blocking`).
//!
//! The agent authenticates with a self-signed certificate made at start
//! from its Ed25519 key (`--key`), and accepts only a server whose
//! certificate chains to the cluster CA (`--ca`) and marks a curator
//! instance (`metropolis_pki::curator_client_config`): a node that is not
//! a curator holds a certificate of the same CA, but cannot pose as the
//! AgentCallback server.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use metropolis_core::ports::MonotonicClock;
use metropolis_core::provisioning::{AgentConfig, AgentLoop, MachineId, RebootAfter};
use metropolis_node::clock::ProcessClock;
use metropolis_node::daemon::LogFormat;
use metropolis_node::exit::{self, Exit};
use metropolis_service::agent_driver::{AgentStopped, drive_agent};
pub mod disk;
pub mod efivars;
#[doc(hidden)]
pub mod fuzz;
pub mod hardware;
pub mod install;
pub mod loader;
pub mod ports;
pub mod progress;
pub mod reboot;

use crate::install::{
    Installer, MetropolisOptions, OciInstaller, RegistryCredentials, RetryPolicy, registry_tls,
};
use crate::ports::{MachinePorts, ProcessTimer};
use crate::reboot::RebootMethod;
use metropolis_pki::{Credentials, curator_client_config, self_signed_agent_certificate};
use metropolis_proto::osbase::net::proto::Net;

/// Command-line configuration of `bmaas-agent`.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "bmaas-agent",
    version,
    about = "Provisioning agent: heartbeats to the AgentCallback service, reports hardware, installs the OS it is asked to, once per generation",
    long_about = "Provisioning agent: heartbeats to the AgentCallback service, reports hardware, \
        installs the OS it is asked to, once per generation.\n\n\
        Its flags are checked at start; failed heartbeats are retried with backoff, with \
        no give-up (one the curator refuses as invalid, InvalidArgument, is logged as an \
        error naming --machine-id; one no retry fixes, a --ca that does not sign the curator's \
        certificate or an --endpoint that is not an AgentCallback port, is logged at once \
        naming the flag, and tried again after --interval). A fatal error is printed once on \
        stderr, as a JSON line with --log-format json. Exit status: 0 the machine reboots \
        after an install or the agent was stopped by SIGTERM/SIGINT, 1 any other failure, 2 a usage error (the flag named), 4 permission denied \
        (docs/operations.md, \"Exit status\").\n\n\
        `bmaas-agent man DIR` writes this page as the man page DIR/bmaas-agent.1."
)]
pub struct AgentArgs {
    /// A TOML file of settings: keys are flag names without the dashes
    /// (`endpoint = "curator.example:7836"`, `registry-ca = ["a.pem"]`,
    /// `allow-image-files = true`). A flag beats its environment
    /// variable (`BMAAS_AGENT_<FLAG>`), which beats the file.
    #[arg(long, env = "BMAAS_AGENT_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// host:port of the AgentCallback service; several curators'
    /// comma-separated or with the flag repeated (in a --config file, a
    /// list): a heartbeat goes to the one that answered last, and to the
    /// next ones when it fails, within --heartbeat-timeout.
    #[arg(long, required = true, value_delimiter = ',', value_name = "HOST:PORT")]
    pub endpoint: Vec<String>,
    /// This machine's ID, as registered by the operator (`metroctl machine
    /// add`): a UUID, xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx in hexadecimal,
    /// also accepted without dashes, in braces or after urn:uuid:. Sent in
    /// its canonical form (lowercase, with dashes).
    #[arg(long, value_name = "UUID", value_parser = parse_machine_id)]
    pub machine_id: String,
    /// The agent's Ed25519 key (PKCS#8 PEM), e.g. from `metroctl machine add --generate-key`.
    #[arg(long)]
    pub key: PathBuf,
    /// The cluster CA certificate (PEM). The server must present a
    /// certificate it issued to a curator instance (marked
    /// urn:metropolis:role:curator); any other is refused.
    #[arg(long)]
    pub ca: PathBuf,
    /// Directory where the agent keeps the last generation it acted on
    /// (so a restart never installs the same generation twice).
    #[arg(long)]
    pub state_dir: PathBuf,
    /// Seconds between heartbeats when idle (jittered ±20 %).
    #[arg(long, default_value = "30")]
    pub interval: f64,
    /// Let the root device of an installation request be a regular file
    /// (an image file under /dev, e.g. /dev/shm/disk.img), for trials.
    /// Without it only block devices are written, and a request naming a
    /// file fails with the reason.
    #[arg(long)]
    pub allow_image_files: bool,
    /// Logins for registries that ask for one: a file in the format of
    /// Docker's config.json, `{"auths": {"HOST:PORT": {"auth":
    /// "BASE64(USER:PASSWORD)"}}}` or `{"username": ..., "password": ...}`
    /// per registry (what `docker login` or `podman login --authfile`
    /// write). Read at start; keep it mode 600 (the agent warns
    /// otherwise). Answers Basic and Docker token (Bearer) challenges;
    /// logins are sent over https only. Without it, registries are used
    /// anonymously (token servers included).
    #[arg(long, value_name = "FILE")]
    pub registry_auth: Option<PathBuf>,
    /// A PEM file of CA certificates to trust for https registries (and
    /// their token servers and blob storage), besides the system's roots
    /// (SSL_CERT_FILE / SSL_CERT_DIR, else the distribution's bundle,
    /// e.g. /etc/ssl/certs/ca-certificates.crt). May be repeated.
    #[arg(long, value_name = "FILE")]
    pub registry_ca: Vec<PathBuf>,
    /// Seconds one registry request may take in all, the image layer's
    /// download included: a registry sending slower than that fails the
    /// installation (reported as the request deadline), instead of
    /// holding it forever. Allow for the largest image at the slowest
    /// link (10 GiB at 10 MiB/s: about 1000 s).
    #[arg(long, value_name = "SECONDS", default_value = "3600")]
    pub registry_deadline: f64,
    /// Seconds without progress after which a registry connect, read or
    /// write fails.
    #[arg(long, value_name = "SECONDS", default_value = "60")]
    pub registry_io_timeout: f64,
    /// How many times a registry request that failed for a passing reason
    /// (a connection, 5xx, 408, 425, 429, 499) is tried again, waiting
    /// 0.5 s, 1 s, 2 s, ... (at most 30 s) or longer when its Retry-After
    /// asks (at most 120 s). Without it, until --install-timeout runs
    /// out, as the reference's agent does: a registry that is down for a
    /// while delays the install instead of failing it. A broken layer
    /// transfer resumes where it stopped (Range) up to 5 times without
    /// progress, besides.
    #[arg(long, value_name = "N")]
    pub registry_retries: Option<u32>,
    /// The network configuration this agent runs with, given to a
    /// Metropolis node whose request's node_parameters has no
    /// network_config: a file holding an osbase.net.proto.Net in its
    /// protobuf JSON mapping (`{"interface": [...], "nameserver":
    /// [{"ip": "192.0.2.53"}]}`). Without it such a node gets none (it
    /// configures its network by DHCP).
    #[arg(long, value_name = "FILE")]
    pub network_config: Option<PathBuf>,
    /// Where the firmware shows itself: a Metropolis install is refused
    /// on a machine without it (not booted with EFI).
    #[arg(long, value_name = "DIR", default_value = "/sys/firmware/efi")]
    pub firmware_dir: PathBuf,
    /// Where EFI variables are written (efivarfs): a Metropolis install
    /// adds its boot entry here and makes it the only one in BootOrder.
    #[arg(long, value_name = "DIR", default_value = "/sys/firmware/efi/efivars")]
    pub efivars_dir: PathBuf,
    /// When to reboot the machine after an install, once its report was
    /// delivered: `success` (the machine boots what was installed; after a
    /// failure the agent keeps heartbeating so a new generation can
    /// retry), `always` (also after a failure, as the reference agent
    /// does) or `never` (trials and tests). The reboot is `reboot(2)`
    /// after `sync(2)` unless --reboot-command says otherwise. Default:
    /// `success`, or `never` with --allow-image-files (a trial installing
    /// into an image file has nothing to boot, and must not reboot its
    /// host).
    #[arg(long, value_enum)]
    pub reboot: Option<RebootWhen>,
    /// Reboot by running this program (no arguments; it must exit 0)
    /// instead of calling reboot(2), e.g. a script running `systemctl
    /// reboot`. The agent exits 0 once it did.
    #[arg(long, value_name = "PROGRAM")]
    pub reboot_command: Option<PathBuf>,
    /// Seconds one heartbeat may take, connecting included and tries of
    /// the other --endpoint curators when one fails: a stalled connection
    /// counts as a failed heartbeat, retried with backoff.
    #[arg(long, value_name = "SECONDS", default_value = "10")]
    pub heartbeat_timeout: f64,
    /// Seconds one installation may take in all, from its first registry
    /// request to the last byte written; past it the installation fails
    /// saying so.
    #[arg(long, value_name = "SECONDS", default_value = "900")]
    pub install_timeout: f64,
    /// Root of the filesystem the hardware report is read from.
    #[arg(long, default_value = "/", hide = true)]
    pub hardware_root: PathBuf,
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long, default_value = "info")]
    pub log: String,
    /// Log format on stderr: `text` (plain unless stderr is a terminal)
    /// or `json` (one object per line, with tracing's fields; a fatal
    /// error is one such line too).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// An agent failure that stops it (bad flags, unreadable key or state).
/// Its exit status is [`metropolis_node::exit::status_of`] it.
pub type AgentError = Box<dyn std::error::Error + Send + Sync>;

/// `--machine-id`: a UUID in any form the reference's `uuid.Parse`
/// accepts, as its canonical form.
fn parse_machine_id(value: &str) -> Result<String, String> {
    MachineId::parse(value)
        .map(|id| id.as_str().to_owned())
        .map_err(|_| {
            "not a UUID: give the machine's ID as registered with `metroctl machine add` \
             (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, hexadecimal; also accepted without dashes, \
             in braces, or after urn:uuid:)"
                .to_owned()
        })
}

/// A file named by `flag` that cannot be read: a usage error (status 2),
/// or permission denied (4).
fn file_error(flag: &str, path: &Path, e: std::io::Error) -> AgentError {
    let exit = match exit::io_status(&e) {
        Exit::PermissionDenied => Exit::PermissionDenied,
        _ => Exit::Usage,
    };
    exit::error(exit, format!("{flag} {}: {e}", path.display()))
}

const STATE_FILE: &str = "last-acted-generation";

/// The last generation acted on, as persisted in `dir`.
pub fn read_last_acted(dir: &Path) -> Result<Option<i64>, AgentError> {
    let path = dir.join(STATE_FILE);
    match std::fs::read_to_string(&path) {
        Ok(s) => s
            .trim()
            .parse::<i64>()
            .map(Some)
            .map_err(|e| format!("{}: not a generation number: {e}", path.display()).into()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display()).into()),
    }
}

/// Durably records `generation` in `dir` (temporary file, fsync, rename,
/// fsync of the directory).
pub fn write_last_acted(dir: &Path, generation: i64) -> std::io::Result<()> {
    use std::io::Write;
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{STATE_FILE}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(format!("{generation}\n").as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(STATE_FILE))?;
    std::fs::File::open(dir)?.sync_all()
}

fn seed() -> u64 {
    let mut bytes = [0u8; 8];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .is_ok()
    {
        return u64::from_le_bytes(bytes);
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    nanos.as_nanos() as u64 ^ u64::from(std::process::id())
}

/// Runs the agent until the process is stopped.
pub async fn run(args: AgentArgs, installer: Arc<dyn Installer>) -> Result<(), AgentError> {
    let key_pem =
        std::fs::read_to_string(&args.key).map_err(|e| file_error("--key", &args.key, e))?;
    let ca_pem = std::fs::read_to_string(&args.ca).map_err(|e| file_error("--ca", &args.ca, e))?;
    let (cert_pem, public) = self_signed_agent_certificate(&key_pem)
        .map_err(|e| exit::usage(format!("--key {}: {e}", args.key.display())))?;
    let creds = Credentials::from_parts(cert_pem, key_pem, ca_pem.clone());
    // Only a curator instance may hand out installation requests: any
    // node's certificate chains to the cluster CA too.
    let tls = curator_client_config(Some(&creds), &ca_pem)
        .map_err(|e| exit::usage(format!("--ca {}: {e}", args.ca.display())))?;
    let last_acted = read_last_acted(&args.state_dir)?;
    if !args.interval.is_finite() || args.interval <= 0.0 {
        return Err(exit::usage(format!(
            "--interval: {} is not a positive number of seconds",
            args.interval
        )));
    }
    let heartbeat_timeout = seconds("--heartbeat-timeout", args.heartbeat_timeout)?;
    let config = AgentConfig {
        interval: Duration::from_secs_f64(args.interval),
        reboot_after: reboot_after(&args),
        ..AgentConfig::default()
    };
    let clock = ProcessClock::new();
    let machine =
        AgentLoop::new(config, last_acted, seed(), clock.now()).map_err(|e| e.to_string())?;
    tracing::info!(
        machine = %args.machine_id,
        endpoint = %args.endpoint.join(","),
        key = %metropolis_core::hex::Hex(&public),
        last_acted = %shown_generation(last_acted),
        "agent starting"
    );
    // Installed before the agent says it is ready: a SIGTERM from then
    // on is logged as the agent's own stop.
    let runtime = metropolis_runtime_tokio::rt::TokioRuntime::shared();
    let signals = metropolis_transport::runtime::Runtime::termination(runtime.as_ref())
        .map_err(|e| format!("cannot handle SIGTERM and SIGINT: {e}"))?;
    // Ready once the key, CA and state are read (the agent has no
    // listener, and retries its heartbeats from now on).
    let _ = metropolis_node::notify::notify_ready(&runtime, "heartbeating");
    let mut ports = MachinePorts::new(
        args.endpoint.clone(),
        tls,
        seed(),
        args.state_dir.clone(),
        args.hardware_root.clone(),
        installer,
    )
    .map_err(|e| exit::usage(format!("--endpoint: {e}")))?;
    ports.heartbeat_timeout = heartbeat_timeout;
    ports.interval = Duration::from_secs_f64(args.interval);
    ports.reboot = match &args.reboot_command {
        Some(program) => RebootMethod::Command(program.clone()),
        None => RebootMethod::Kernel,
    };
    let driven = drive_agent(
        machine,
        args.machine_id.clone(),
        Arc::new(ports),
        Arc::new(clock),
        Arc::new(ProcessTimer(clock)),
    );
    let stopped = match futures::future::select(Box::pin(driven), signals).await {
        futures::future::Either::Left((stopped, _)) => stopped,
        futures::future::Either::Right(((), _)) => {
            tracing::info!(
                last_acted = %shown_generation(read_last_acted(&args.state_dir).ok().flatten()),
                "agent stopping on SIGTERM or SIGINT"
            );
            return Ok(());
        }
    };
    match stopped {
        AgentStopped::Rebooting { generation } => {
            tracing::info!(generation, "the machine is rebooting; the agent exits");
            Ok(())
        }
        other => Err(other.to_string().into()),
    }
}

/// A generation for the log: its number, or `none`.
fn shown_generation(generation: Option<i64>) -> String {
    generation.map_or_else(|| "none".to_string(), |g| g.to_string())
}

/// When the loop reboots: `--reboot`, by default `success`, or `never`
/// for trials on image files.
pub fn reboot_after(args: &AgentArgs) -> RebootAfter {
    let default = if args.allow_image_files {
        RebootWhen::Never
    } else {
        RebootWhen::Success
    };
    match args.reboot.unwrap_or(default) {
        RebootWhen::Never => RebootAfter::Never,
        RebootWhen::Success => RebootAfter::Success,
        RebootWhen::Always => RebootAfter::Always,
    }
}

/// When the agent reboots the machine after an install (`--reboot`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RebootWhen {
    /// Never.
    Never,
    /// After a successful install.
    Success,
    /// After every install.
    Always,
}

/// A positive, finite number of seconds given as `flag`.
fn seconds(flag: &str, value: f64) -> Result<Duration, AgentError> {
    if !value.is_finite() || value <= 0.0 || value > 1e9 {
        return Err(exit::usage(format!(
            "{flag}: {value} is not a positive number of seconds"
        )));
    }
    Ok(Duration::from_secs_f64(value))
}

/// The installer the flags ask for: TLS trusting the system's roots and
/// `--registry-ca`, the logins of `--registry-auth`, the time limits.
pub fn installer_from_args(args: &AgentArgs) -> Result<OciInstaller, AgentError> {
    let deadline = seconds("--registry-deadline", args.registry_deadline)?;
    let io = seconds("--registry-io-timeout", args.registry_io_timeout)?;
    let ca_files: Vec<&Path> = args.registry_ca.iter().map(PathBuf::as_path).collect();
    let network_config = match &args.network_config {
        None => None,
        Some(path) => {
            let json = std::fs::read(path).map_err(|e| file_error("--network-config", path, e))?;
            Some(
                metropolis_proto::json::message_from_json::<Net>("osbase.net.proto.Net", &json)
                    .map_err(|e| {
                        exit::usage(format!("--network-config {}: {e}", path.display()))
                    })?,
            )
        }
    };
    let mut installer = OciInstaller::new()
        .allow_image_files(args.allow_image_files)
        .with_timeouts(io.min(Duration::from_secs(30)), io)
        .with_deadline(deadline)
        .with_install_limit(seconds("--install-timeout", args.install_timeout)?)
        .with_retries(RetryPolicy {
            retries: args.registry_retries.unwrap_or(u32::MAX),
            ..RetryPolicy::until_deadline()
        })
        .with_metropolis(MetropolisOptions {
            firmware_dir: args.firmware_dir.clone(),
            efivars_dir: args.efivars_dir.clone(),
            network_config,
        });
    match registry_tls(true, &ca_files) {
        Ok(tls) => {
            for warning in &tls.warnings {
                tracing::warn!("system root certificates: {warning}");
            }
            tracing::info!(
                system_roots = tls.system_roots,
                registry_ca_roots = tls.extra_roots,
                "https registries: trusting {} root certificates",
                tls.system_roots + tls.extra_roots
            );
            installer = installer.with_tls(tls.config);
        }
        // A CA file that was given must be usable; no roots at all only
        // rules out https.
        Err(e) if !ca_files.is_empty() => return Err(exit::usage(format!("--registry-ca: {e}"))),
        Err(e) => tracing::warn!("https registries unusable: {e}"),
    }
    if let Some(path) = &args.registry_auth {
        let credentials = RegistryCredentials::read(path)
            .map_err(|e| exit::usage(format!("--registry-auth {e}")))?;
        tracing::info!(
            registries = %credentials.registries().collect::<Vec<_>>().join(", "),
            "registry logins read from {}",
            path.display()
        );
        installer = installer.with_credentials(credentials);
    }
    Ok(installer)
}

/// Where the agent's settings come from besides its flags: variables
/// `BMAAS_AGENT_<FLAG>` and the `--config` file (see
/// [`metropolis_node::settings`]).
pub const SETTINGS: metropolis_node::settings::Program = metropolis_node::settings::Program {
    name: "bmaas-agent",
    env_prefix: "BMAAS_AGENT_",
};

/// Entry point of the `bmaas-agent` binary: on failure reports the error
/// once, in the log format asked for, and exits with its status (2 a
/// usage error naming the flag, 4 permission denied, 1 any other; see
/// docs/operations.md). `bmaas-agent man DIR` writes its man page.
pub fn main() -> std::process::ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let name = SETTINGS.name;
    if let Some(written) = metropolis_node::settings::man::<AgentArgs>(&argv, SETTINGS) {
        return match written {
            Ok(page) => {
                println!("man page written to {}", page.display());
                Exit::Done.code()
            }
            Err(e) => {
                exit::report(name, LogFormat::Text, &e);
                Exit::Failure.code()
            }
        };
    }
    let args: AgentArgs = match metropolis_node::settings::parse_settings(argv.clone(), SETTINGS) {
        Ok(args) => args,
        Err(e) => {
            let env = format!("{}LOG_FORMAT", SETTINGS.env_prefix);
            return exit::settings_error(name, e, &argv, &env);
        }
    };
    let format = args.log_format;
    let fail = |e: AgentError| {
        exit::report(name, format, &e.to_string());
        exit::status_of(e.as_ref()).code()
    };
    // The agent serves no logs; its tree only needs to exist.
    let tree = metropolis_core::logtree::LogTreeConfig {
        max_bytes: 1024 * 1024,
        ..Default::default()
    };
    let _ = metropolis_node::daemon::init_logging(&args.log, args.log_format, tree);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(format!("cannot start the tokio runtime: {e}").into()),
    };
    let installer = match installer_from_args(&args) {
        Ok(installer) => installer,
        Err(e) => return fail(e),
    };
    let result = runtime.block_on(run(args, Arc::new(installer)));
    // An install still writing on a blocking thread (the agent was
    // stopped by SIGTERM) ends with the process, not before it.
    runtime.shutdown_background();
    match result {
        Ok(()) => Exit::Done.code(),
        Err(e) => fail(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_acted_round_trips() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(read_last_acted(dir.path()).expect("read"), None);
        write_last_acted(dir.path(), 7).expect("write");
        assert_eq!(read_last_acted(dir.path()).expect("read"), Some(7));
        std::fs::write(dir.path().join(STATE_FILE), "x").expect("write");
        assert!(read_last_acted(dir.path()).is_err());
    }

    fn args(extra: &[&str]) -> AgentArgs {
        let base = [
            "bmaas-agent",
            "--endpoint=127.0.0.1:1",
            "--machine-id=3b241101-e2bb-4255-8caf-4136c566a962",
            "--key=k",
            "--ca=c",
            "--state-dir=s",
        ];
        AgentArgs::parse_from(base.iter().chain(extra))
    }

    #[test]
    fn registry_flags_are_checked_at_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let not_pem = dir.path().join("ca.pem");
        std::fs::write(&not_pem, "no certificate here").expect("write");
        let auth = dir.path().join("auth.json");
        std::fs::write(&auth, r#"{"auths": {"r:1": {"auth": "!!"}}}"#).expect("write");
        let flag = |name: &str, path: &Path| format!("--{name}={}", path.display());
        for (extra, expected) in [
            (
                vec![flag("registry-ca", &not_pem)],
                "holds no PEM certificate",
            ),
            (
                vec![flag("registry-ca", &dir.path().join("missing"))],
                "--registry-ca",
            ),
            (vec![flag("registry-auth", &auth)], "not base64"),
            (
                vec!["--registry-deadline=0".to_string()],
                "--registry-deadline",
            ),
            (
                vec!["--registry-io-timeout=nan".to_string()],
                "--registry-io-timeout",
            ),
        ] {
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            let Err(e) = installer_from_args(&args(&extra)) else {
                panic!("{extra:?} accepted");
            };
            assert!(e.to_string().contains(expected), "{e} lacks {expected:?}");
        }
        std::fs::write(
            &auth,
            r#"{"auths": {"r:1": {"username": "u", "password": "p"}}}"#,
        )
        .expect("write");
        installer_from_args(&args(&[&flag("registry-auth", &auth)])).expect("a good auth file");
    }

    #[test]
    fn trials_on_image_files_do_not_reboot_unless_asked() {
        assert_eq!(reboot_after(&args(&[])), RebootAfter::Success);
        assert_eq!(
            reboot_after(&args(&["--allow-image-files"])),
            RebootAfter::Never
        );
        assert_eq!(
            reboot_after(&args(&["--allow-image-files", "--reboot=success"])),
            RebootAfter::Success
        );
        assert_eq!(
            reboot_after(&args(&["--reboot=always"])),
            RebootAfter::Always
        );
        assert_eq!(reboot_after(&args(&["--reboot=never"])), RebootAfter::Never);
    }

    #[test]
    fn bad_network_configs_and_limits_name_their_flag() {
        let dir = tempfile::tempdir().expect("tempdir");
        let net = dir.path().join("net.json");
        std::fs::write(&net, r#"{"nameserver": [{"ipp": "x"}]}"#).expect("write");
        for (extra, expected) in [
            (
                format!("--network-config={}", net.display()),
                "--network-config",
            ),
            ("--install-timeout=-1".to_string(), "--install-timeout"),
        ] {
            let Err(e) = installer_from_args(&args(&[&extra])) else {
                panic!("{extra} accepted");
            };
            assert!(e.to_string().contains(expected), "{e} lacks {expected:?}");
        }
        std::fs::write(&net, r#"{"nameserver": [{"ip": "192.0.2.53"}]}"#).expect("write");
        let flag = format!("--network-config={}", net.display());
        installer_from_args(&args(&[&flag])).expect("a good network config");
    }
}
