//! A real etcd for tests: `etcd` (Debian package `etcd-server`) started on
//! free loopback ports with a temporary data directory, killed on drop.

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

/// One etcd member, alone in its cluster.
pub struct Etcd {
    child: Option<Child>,
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
}

impl Etcd {
    /// Starts etcd and waits until it accepts connections. Panics (with
    /// its log) if it does not come up within 20 s.
    pub fn start() -> Etcd {
        let mut etcd = Etcd {
            child: None,
            dir: tempfile::tempdir().expect("temporary directory"),
            client_port: free_port(),
            peer_port: free_port(),
        };
        for _attempt in 0..3 {
            if etcd.spawn() {
                return etcd;
            }
            // Lost a race for a port: start afresh on others.
            let _ = std::fs::remove_dir_all(etcd.data_dir());
            etcd.client_port = free_port();
            etcd.peer_port = free_port();
        }
        panic!("etcd did not start in 3 attempts");
    }

    /// Starts the process on this member's ports and data directory;
    /// whether it came up.
    fn spawn(&mut self) -> bool {
        let log_path = self.dir.path().join("etcd.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("etcd log file");
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let client = self.url();
        let child = Command::new(etcd_bin())
            .arg("--name=test")
            .arg(format!("--data-dir={}", self.data_dir().display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=test={peer}"))
            // Short election timing: leases can be as short as 1 s.
            .arg("--heartbeat-interval=10")
            .arg("--election-timeout=100")
            .arg("--logger=zap")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(e) => panic!(
                "cannot run {}: {e} (install the Debian package etcd-server, or set ETCD_BIN)",
                etcd_bin()
            ),
        };
        self.child = Some(child);
        let addr: SocketAddr = ([127, 0, 0, 1], self.client_port).into();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                self.child = None;
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

    /// The client URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// A client configuration for this member, with a 2 s request timeout.
    pub fn config(&self) -> EtcdConfig {
        let mut config = EtcdConfig::new([self.url()]);
        config.request_timeout = Duration::from_secs(2);
        config.keep_alive_interval = Duration::from_secs(5);
        config.keep_alive_timeout = Duration::from_secs(2);
        config
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Kills the process (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the process again on the same ports and data.
    pub fn restart(&mut self) {
        self.kill();
        assert!(self.spawn(), "etcd could not take its ports back");
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}
