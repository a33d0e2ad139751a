//! A real etcd for tests: `etcd` (Debian package `etcd-server`) started on
//! free loopback ports with temporary data directories, killed on drop;
//! one member or a cluster of several.
//!
//! Also compiled into `metropolis-runtime-tokio`'s etcd tests (through
//! `#[path]`), so it uses nothing of this crate.

#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use metropolis_runtime_tokio::etcd::EtcdConfig;

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

/// An etcd cluster of one or more members on loopback.
pub struct Etcd {
    dir: tempfile::TempDir,
    /// This start attempt's directory under `dir`.
    base: PathBuf,
    members: Vec<Member>,
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
        let mut etcd = Etcd {
            dir: tempfile::tempdir().expect("temporary directory"),
            base: PathBuf::new(),
            members: Vec::new(),
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
        let client = format!("http://127.0.0.1:{}", m.client_port);
        let child = Command::new(etcd_bin())
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

    /// The client URL of member `i`.
    pub fn member_url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[i].client_port)
    }

    /// Every member's client URL, comma-separated (as `--etcd` takes them).
    pub fn urls(&self) -> String {
        (0..self.members.len())
            .map(|i| self.member_url(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A client configuration for every member, with a 2 s request
    /// timeout and watches resumed for up to 3 s.
    pub fn config(&self) -> EtcdConfig {
        let mut config = EtcdConfig::new((0..self.members.len()).map(|i| self.member_url(i)));
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
