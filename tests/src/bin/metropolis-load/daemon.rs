//! A `metropolisd-under-test` process started by the load tool.
//!
//! The test helper `metropolis_tests::Daemon` finds its binary from a test
//! executable in `target/<profile>/deps/` and panics on failure; the load
//! binary lives in `target/<profile>/` itself and reports errors instead,
//! so it has this small equivalent.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use metropolis_pki::Credentials;
use metropolis_tests::RuntimeKind;

use super::util::{Context, Result, rss_kib};

/// The name of the daemon binary built by this package.
pub const DAEMON_BIN: &str = "metropolisd-under-test";

/// The daemon binary: `explicit` if given, else `metropolisd-under-test` in
/// the directory of the running executable.
pub fn locate(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(path) = explicit {
        if !path.is_file() {
            return Err(format!("--daemon-bin {}: no such file", path.display()).into());
        }
        return Ok(path.to_path_buf());
    }
    let exe = std::env::current_exe().context(|| "locating the running executable".into())?;
    let dir = exe
        .parent()
        .ok_or_else(|| format!("{}: executable has no parent directory", exe.display()))?;
    let bin = dir.join(DAEMON_BIN);
    if !bin.is_file() {
        return Err(format!(
            "{}: not found. It is built next to metropolis-load by \
             `cargo build --release -p metropolis-tests --bins`; or pass --daemon-bin PATH",
            bin.display()
        )
        .into());
    }
    Ok(bin)
}

/// Which daemon to run: its binary and the runtime it serves on.
#[derive(Clone, Debug)]
pub struct Target {
    /// The `metropolisd-under-test` (or compatible) binary.
    pub bin: PathBuf,
    /// Its `--runtime`.
    pub runtime: RuntimeKind,
    /// Extra flags for every daemon started (`--daemon-arg`).
    pub extra: Vec<String>,
}

/// A free loopback address (`127.0.0.1:port`, bound then released).
pub fn free_addr() -> Result<String> {
    let listener =
        TcpListener::bind("127.0.0.1:0").context(|| "finding a free loopback port".into())?;
    let port = listener
        .local_addr()
        .context(|| "finding a free loopback port".into())?
        .port();
    Ok(format!("127.0.0.1:{port}"))
}

/// The last `lines` lines of the file at `path` (empty if unreadable).
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A running daemon; killed when dropped.
pub struct DaemonProcess {
    child: Option<Child>,
    /// Its data directory.
    pub data_dir: PathBuf,
    /// Its local UNIX socket.
    pub socket: PathBuf,
    /// Its TLS listener, `127.0.0.1:port`.
    pub addr: String,
    /// Its AgentCallback listener, `127.0.0.1:port`.
    pub agent_addr: String,
    /// Its stderr log.
    pub log: PathBuf,
}

impl DaemonProcess {
    /// Starts `target` on `data_dir` (created by the daemon) and
    /// waits up to 30 s until both its socket and its TLS port accept
    /// connections.
    pub fn start(target: &Target, data_dir: &Path, log_level: &str) -> Result<DaemonProcess> {
        Self::start_with(
            &target.bin,
            data_dir,
            target.runtime,
            log_level,
            &target.extra,
        )
    }

    /// [`DaemonProcess::start`] with `extra` flags.
    pub fn start_with(
        bin: &Path,
        data_dir: &Path,
        runtime: RuntimeKind,
        log_level: &str,
        extra: &[String],
    ) -> Result<DaemonProcess> {
        let addr = free_addr()?;
        let agent_addr = free_addr()?;
        let socket = data_dir.join("curator.sock");
        let log = data_dir.with_extension("log");
        let log_file =
            std::fs::File::create(&log).context(|| format!("creating {}", log.display()))?;
        let child = Command::new(bin)
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--listen")
            .arg(&addr)
            .arg("--agent-listen")
            .arg(&agent_addr)
            .arg("--runtime")
            .arg(runtime.to_string())
            .arg("--log")
            .arg(log_level)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .context(|| format!("starting {}", bin.display()))?;
        let mut daemon = DaemonProcess {
            child: Some(child),
            data_dir: data_dir.to_path_buf(),
            socket,
            addr,
            agent_addr,
            log,
        };
        daemon.wait_ready(Duration::from_secs(30))?;
        Ok(daemon)
    }

    fn wait_ready(&mut self, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            self.check_alive()?;
            let sock_ok = std::os::unix::net::UnixStream::connect(&self.socket).is_ok();
            let tcp_ok = std::net::TcpStream::connect(&self.addr).is_ok();
            if sock_ok && tcp_ok {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "the daemon did not start serving within {limit:?}; its log ({}):\n{}",
                    self.log.display(),
                    tail(&self.log, 20)
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// An error (with the end of the daemon's log) if the daemon exited.
    pub fn check_alive(&mut self) -> Result<()> {
        let Some(child) = self.child.as_mut() else {
            return Err("the daemon was stopped".into());
        };
        match child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!(
                "the daemon exited with {status}; its log ({}):\n{}",
                self.log.display(),
                tail(&self.log, 20)
            )
            .into()),
            Err(e) => Err(format!("checking the daemon process: {e}").into()),
        }
    }

    /// The daemon's process ID.
    pub fn pid(&self) -> Result<u32> {
        self.child
            .as_ref()
            .map(Child::id)
            .ok_or_else(|| "the daemon was stopped".into())
    }

    /// The daemon's resident set size, KiB.
    pub fn rss_kib(&self) -> Result<u64> {
        rss_kib(self.pid()?)
    }

    /// The owner credential the daemon created on first start.
    pub fn owner(&self) -> Result<Credentials> {
        let dir = self.data_dir.join("owner");
        Credentials::read_from_dir(&dir, "owner")
            .context(|| format!("reading the owner credential in {}", dir.display()))
    }

    /// The directory of the daemon's own node credential (`node.pem`,
    /// `node-key.pem`, `ca.pem`).
    pub fn pki_dir(&self) -> PathBuf {
        self.data_dir.join("pki")
    }

    /// Kills the daemon (SIGKILL) and reaps it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        self.stop();
    }
}
