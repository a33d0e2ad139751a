//! A real etcd for tests: `etcd` (Debian package `etcd-server`) started on
//! free loopback ports with temporary data directories, killed on drop;
//! one member or a cluster of several, in the clear or serving its clients
//! over TLS ([`EtcdOptions`]), and `etcdctl` (Debian package
//! `etcd-client`) against it.

#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use metropolis_etcd::{EtcdAccess, EtcdConfig};

/// The etcd binary: `$ETCD_BIN`, else `etcd` on the PATH.
fn etcd_bin() -> String {
    std::env::var("ETCD_BIN").unwrap_or_else(|_| "etcd".into())
}

/// A free loopback port (free when asked; etcd binds it right after).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("local address").port()
}

/// One member's process and ports.
struct Member {
    name: String,
    child: Option<Child>,
    client_port: u16,
    peer_port: u16,
}

/// The etcdctl binary: `$ETCDCTL_BIN`, else `etcdctl` on the PATH.
fn etcdctl_bin() -> String {
    std::env::var("ETCDCTL_BIN").unwrap_or_else(|_| "etcdctl".into())
}

/// TLS on the members' client URLs (the peer URLs stay plain: the members
/// are on loopback).
#[derive(Clone, Debug)]
pub struct ServerTls {
    /// The CA certificate clients are given, and (with
    /// `client_cert_auth`) that client certificates must chain to
    /// (`--trusted-ca-file`).
    pub ca: PathBuf,
    /// The server certificate (`--cert-file`), for 127.0.0.1.
    pub cert: PathBuf,
    /// Its key (`--key-file`).
    pub key: PathBuf,
    /// `--client-cert-auth`: clients must present a certificate.
    pub client_cert_auth: bool,
    /// The client certificate and key `etcdctl` presents.
    pub etcdctl_cert: Option<(PathBuf, PathBuf)>,
}

/// How the members are started.
#[derive(Clone, Debug, Default)]
pub struct EtcdOptions {
    /// TLS on the client URLs (then `https://`).
    pub tls: Option<ServerTls>,
    /// More flags for every member, e.g. `--auth-token-ttl=1`.
    pub args: Vec<String>,
}

/// An etcd cluster of one or more members on loopback.
pub struct Etcd {
    dir: tempfile::TempDir,
    /// This start attempt's directory under `dir`.
    base: PathBuf,
    members: Vec<Member>,
    options: EtcdOptions,
    /// The TLS and user of [`Etcd::config`].
    access: EtcdAccess,
}

impl Etcd {
    /// Starts a one-member etcd and waits until it accepts connections.
    /// Panics (with its log) if it does not come up within 20 s.
    pub fn start() -> Etcd {
        Etcd::start_cluster(1)
    }

    /// Starts a cluster of `n` members and waits until each accepts
    /// connections.
    pub fn start_cluster(n: usize) -> Etcd {
        Etcd::start_with(n, EtcdOptions::default())
    }

    /// Starts a cluster of `n` members as `options` say, and waits until
    /// each accepts connections.
    pub fn start_with(n: usize, options: EtcdOptions) -> Etcd {
        let mut etcd = Etcd {
            dir: tempfile::tempdir().expect("temporary directory"),
            base: PathBuf::new(),
            members: Vec::new(),
            options,
            access: EtcdAccess::default(),
        };
        for attempt in 0..3 {
            etcd.base = etcd.dir.path().join(format!("attempt-{attempt}"));
            etcd.members = (0..n)
                .map(|i| Member {
                    name: format!("m{i}"),
                    child: None,
                    client_port: free_port(),
                    peer_port: free_port(),
                })
                .collect();
            std::fs::create_dir_all(&etcd.base).expect("etcd directory");
            for i in 0..n {
                etcd.spawn(i);
            }
            if (0..n).all(|i| etcd.wait_listening(i)) {
                return etcd;
            }
            // Lost a race for a port: start afresh on others.
            etcd.kill();
        }
        panic!("etcd did not start in 3 attempts");
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn data_dir(&self, i: usize) -> PathBuf {
        self.base.join(&self.members[i].name)
    }

    /// Member `i`'s log file.
    pub fn log_path(&self, i: usize) -> PathBuf {
        self.base.join(format!("{}.log", self.members[i].name))
    }

    /// Starts member `i`'s process (without waiting).
    fn spawn(&mut self, i: usize) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(i))
            .expect("etcd log file");
        let cluster = self.initial_cluster();
        let data_dir = self.data_dir(i);
        let m = &self.members[i];
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let client = format!("{}://127.0.0.1:{}", self.scheme(), m.client_port);
        let mut command = Command::new(etcd_bin());
        if let Some(tls) = &self.options.tls {
            command
                .arg(format!("--cert-file={}", tls.cert.display()))
                .arg(format!("--key-file={}", tls.key.display()));
            if tls.client_cert_auth {
                command
                    .arg("--client-cert-auth")
                    .arg(format!("--trusted-ca-file={}", tls.ca.display()));
            }
        }
        let child = command
            .arg(format!("--name={}", m.name))
            .arg(format!("--data-dir={}", data_dir.display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster={cluster}"))
            .arg("--initial-cluster-token=metropolis-test")
            // Short election timing: leases can be as short as 1 s.
            .arg("--heartbeat-interval=10")
            .arg("--election-timeout=100")
            .arg("--logger=zap")
            .args(&self.options.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn();
        match child {
            Ok(child) => self.members[i].child = Some(child),
            Err(e) => panic!(
                "cannot run {}: {e} (install the Debian package etcd-server, or set ETCD_BIN)",
                etcd_bin()
            ),
        }
    }

    /// Waits until member `i` listens; false if it lost a port race.
    fn wait_listening(&mut self, i: usize) -> bool {
        let log_path = self.log_path(i);
        let addr: SocketAddr = ([127, 0, 0, 1], self.members[i].client_port).into();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Some(child) = self.members[i].child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                self.members[i].child = None;
                if log.contains("address already in use") {
                    return false;
                }
                panic!("etcd exited with {status} at start; its log:\n{log}");
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        panic!("etcd did not listen on {addr} within 20 s; its log:\n{log}");
    }

    /// The client URL of the first member.
    pub fn url(&self) -> String {
        self.member_url(0)
    }

    /// The scheme of the client URLs: `https` with TLS.
    fn scheme(&self) -> &'static str {
        if self.options.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// The client URL of member `i`.
    pub fn member_url(&self, i: usize) -> String {
        format!(
            "{}://127.0.0.1:{}",
            self.scheme(),
            self.members[i].client_port
        )
    }

    /// Sets the TLS and user that [`config`](Self::config) connects with.
    pub fn set_access(&mut self, access: EtcdAccess) {
        self.access = access;
    }

    /// Runs `etcdctl` (v3 API) against every member with `args`, over TLS
    /// with the CA and `etcdctl` certificate of [`ServerTls`]; its output.
    pub fn etcdctl(&self, args: &[&str]) -> std::process::Output {
        let mut command = Command::new(etcdctl_bin());
        command
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.urls()))
            .arg("--dial-timeout=5s")
            .arg("--command-timeout=5s");
        if let Some(tls) = &self.options.tls {
            command.arg(format!("--cacert={}", tls.ca.display()));
            if let Some((cert, key)) = &tls.etcdctl_cert {
                command
                    .arg(format!("--cert={}", cert.display()))
                    .arg(format!("--key={}", key.display()));
            }
        }
        match command.args(args).stdin(Stdio::null()).output() {
            Ok(output) => output,
            Err(e) => panic!(
                "cannot run {}: {e} (install the Debian package etcd-client, or set ETCDCTL_BIN)",
                etcdctl_bin()
            ),
        }
    }

    /// [`etcdctl`](Self::etcdctl), which must succeed; its standard output.
    pub fn etcdctl_ok(&self, args: &[&str]) -> String {
        let output = self.etcdctl(args);
        assert!(
            output.status.success(),
            "etcdctl {args:?} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Every member's client URL, comma-separated (as `--etcd` takes them).
    pub fn urls(&self) -> String {
        (0..self.members.len())
            .map(|i| self.member_url(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A client configuration for every member, with a 2 s request
    /// timeout, watches resumed for up to 3 s, and the TLS and user of
    /// [`set_access`](Self::set_access).
    pub fn config(&self) -> EtcdConfig {
        let mut config = EtcdConfig::new((0..self.members.len()).map(|i| self.member_url(i)))
            .with_access(self.access.clone());
        config.request_timeout = Duration::from_secs(2);
        config.watch_resume = Duration::from_secs(3);
        config.keep_alive_interval = Duration::from_secs(5);
        config.keep_alive_timeout = Duration::from_secs(2);
        config
    }

    /// The process ID of member `i`, while it runs (to read its CPU time).
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].child.as_ref().map(Child::id)
    }

    /// Kills every member (SIGKILL) and waits for them.
    pub fn kill(&mut self) {
        for i in 0..self.members.len() {
            self.kill_member(i);
        }
    }

    /// Kills member `i` (SIGKILL) and waits for it.
    pub fn kill_member(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts every member again on the same ports and data.
    pub fn restart(&mut self) {
        self.kill();
        for i in 0..self.members.len() {
            self.spawn(i);
        }
        for i in 0..self.members.len() {
            assert!(self.wait_listening(i), "etcd could not take its ports back");
        }
    }

    /// Starts member `i` again (after [`kill_member`](Self::kill_member))
    /// on its ports and data.
    pub fn restart_member(&mut self, i: usize) {
        self.kill_member(i);
        self.spawn(i);
        assert!(self.wait_listening(i), "etcd could not take its ports back");
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}
