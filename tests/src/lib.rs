//! Helpers of the end-to-end tests: a real `metropolisd` process on a
//! temporary data directory, and clients over its socket and over TLS.

#![allow(clippy::unwrap_used)]

#[cfg(feature = "system")]
pub mod campaign;
#[cfg(feature = "system")]
pub mod cluster;
pub mod containerd;
pub mod cut_proxy;
pub mod drip_proxy;
#[cfg(feature = "system")]
pub mod etcd;
#[cfg(feature = "system")]
pub mod etcd_pki;
pub mod interop;
pub mod loop_device;
pub mod outcome;
pub mod plain_server;
pub mod provisioning;
pub mod proxy;
pub mod qemu;
pub mod registry;
pub mod token_server;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use metropolis_core::identity::NodeId;
pub use metropolis_node::daemon::RuntimeKind;
use metropolis_pki::{Credentials, client_config};
use metropolis_proto::metropolis::node::core::curator::proto::private::{
    AddMachineRequest, AddNodeRequest, machine_management_client::MachineManagementClient,
    node_management_client::NodeManagementClient,
};
use metropolis_proto::prelude::curator;
use metropolis_proto::prelude::curator::curator_client::CuratorClient;
use metropolis_proto::prelude::debug::node_debug_service_client::NodeDebugServiceClient;
use metropolis_runtime_tokio::rt::TokioRuntime;
use metropolis_transport::connect;
use metropolis_transport::grpc::Channel;

/// Where daemons started by a test keep their state.
#[derive(Clone)]
pub enum Backend {
    /// The embedded store under the data directory.
    Embedded,
    /// This etcd (its URLs, comma-separated): each daemon runs elected,
    /// with a 2 s lease.
    Etcd(String),
}

tokio::task_local! {
    /// The backend of the daemons the current test starts (set by
    /// [`against_both_runtimes_and_etcd!`]); embedded when unset.
    pub static BACKEND: Backend;
}

/// The daemon flags of the current test's backend.
fn backend_args() -> Vec<String> {
    match BACKEND.try_with(Backend::clone) {
        Ok(Backend::Etcd(urls)) => vec!["--etcd".into(), urls, "--lease-ttl".into(), "2".into()],
        _ => Vec::new(),
    }
}

/// A `metropolisd` process.
pub struct Daemon {
    child: Option<Child>,
    /// Its data directory.
    pub data_dir: PathBuf,
    /// Its local socket.
    pub socket: PathBuf,
    /// Its TLS listener, `127.0.0.1:port`.
    pub addr: String,
    /// Its AgentCallback listener, `127.0.0.1:port`.
    pub agent_addr: String,
    /// Its debug listener, `127.0.0.1:port`, when started with one.
    pub debug_addr: Option<String>,
    /// Whether it runs elected (over etcd).
    pub elected: bool,
    log: PathBuf,
}

/// The daemon's "curator serving" log line, as JSON: `child` logs with
/// `--log-format json` to the file `log`. Waits up to 30 s; fails if the
/// daemon exits first.
pub fn serving_line(child: &mut Child, log: &Path) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.contains("curator serving")) {
            return serde_json::from_str(line).unwrap();
        }
        assert!(child.try_wait().unwrap().is_none(), "exited:\n{text}");
        assert!(Instant::now() < deadline, "not serving after 30 s:\n{text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The log file at `path` once it holds `text`, or as it is when
/// `within` has passed (the caller asserts what it needs).
pub fn log_once_holding(path: &Path, text: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let log = std::fs::read_to_string(path).unwrap_or_default();
        if log.contains(text) || Instant::now() >= deadline {
            return log;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A free loopback TCP port (bound then released; fine for tests).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The path of the daemon binary cargo built beside the running test
/// binary (`target/<profile>/metropolisd-under-test`; tests run from
/// `target/<profile>/deps/`).
pub fn daemon_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).unwrap();
    let bin = profile_dir.join("metropolisd-under-test");
    assert!(
        bin.exists(),
        "{} not built; run the tests through cargo",
        bin.display()
    );
    bin
}

impl Daemon {
    /// Starts a daemon on `data_dir` and waits until it serves.
    pub fn start(data_dir: &Path, runtime: RuntimeKind) -> Daemon {
        Self::start_retrying(|| {
            let port = free_port();
            Self::spawn(data_dir, format!("127.0.0.1:{port}"), runtime)
        })
    }

    /// Spawns with `spawn` and waits until it serves, spawning again (with
    /// the fresh ports `spawn` picks) when a port picked by [`free_port`]
    /// was taken by a concurrent test before the daemon bound it.
    fn start_retrying(mut spawn: impl FnMut() -> Daemon) -> Daemon {
        for _ in 0..4 {
            let mut d = spawn();
            match d.try_wait_ready() {
                Ok(()) => return d,
                Err(log) if log.contains("cannot listen") => continue,
                Err(log) => panic!("metropolisd exited early:\n{log}"),
            }
        }
        panic!("metropolisd could not bind free ports in 4 attempts")
    }

    /// Starts a daemon with `extra` flags and waits until it serves.
    pub fn start_with(data_dir: &Path, runtime: RuntimeKind, extra: &[&str]) -> Daemon {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        Self::start_retrying(|| {
            let addr = format!("127.0.0.1:{}", free_port());
            Self::spawn_with(data_dir, addr, runtime, &extra)
        })
    }

    /// Starts a daemon listening on `addr` and waits until it serves.
    pub fn start_at(data_dir: &Path, addr: String, runtime: RuntimeKind) -> Daemon {
        let mut d = Self::spawn(data_dir, addr, runtime);
        d.wait_ready();
        d
    }

    /// Starts a daemon with its debug service on a free loopback port and
    /// `extra` flags, and waits until it serves.
    pub fn start_debug(data_dir: &Path, runtime: RuntimeKind, extra: &[&str]) -> Daemon {
        Self::start_debug_on(data_dir, runtime, "127.0.0.1", extra)
    }

    /// Starts a daemon with its debug service on a free port of `ip` (e.g.
    /// `0.0.0.0`, reached through 127.0.0.1) and `extra` flags, and waits
    /// until it serves.
    pub fn start_debug_on(
        data_dir: &Path,
        runtime: RuntimeKind,
        ip: &str,
        extra: &[&str],
    ) -> Daemon {
        Self::start_retrying(|| {
            let addr = format!("127.0.0.1:{}", free_port());
            let port = free_port();
            let mut args = vec!["--debug-listen".to_string(), format!("{ip}:{port}")];
            args.extend(extra.iter().map(|s| s.to_string()));
            let mut d = Self::spawn_with(data_dir, addr, runtime, &args);
            d.debug_addr = Some(format!("127.0.0.1:{port}"));
            d
        })
    }

    /// Starts a daemon without waiting for it.
    pub fn spawn(data_dir: &Path, addr: String, runtime: RuntimeKind) -> Daemon {
        Self::spawn_with(data_dir, addr, runtime, &[])
    }

    /// Starts a daemon with `extra` flags without waiting for it.
    pub fn spawn_with(
        data_dir: &Path,
        addr: String,
        runtime: RuntimeKind,
        extra: &[String],
    ) -> Daemon {
        std::fs::create_dir_all(data_dir).unwrap();
        let socket = data_dir.join("curator.sock");
        let log = data_dir.with_extension("log");
        let agent_addr = format!("127.0.0.1:{}", free_port());
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let backend = backend_args();
        let elected = !backend.is_empty() || extra.iter().any(|a| a == "--etcd");
        let child = Command::new(daemon_bin())
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--listen")
            .arg(&addr)
            .arg("--agent-listen")
            .arg(&agent_addr)
            .arg("--runtime")
            .arg(runtime.to_string())
            .arg("--log")
            .arg("info")
            .args(backend)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .unwrap();
        Daemon {
            child: Some(child),
            data_dir: data_dir.to_path_buf(),
            socket,
            addr,
            agent_addr,
            debug_addr: None,
            elected,
            log,
        }
    }

    /// The daemon's process ID.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).expect("the daemon runs")
    }

    /// What the daemon logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log once it holds `text`, waiting up to 10 s: a line logged
    /// after the listeners are bound can come after the daemon already
    /// answers connections.
    pub fn log_once_it_holds(&self, text: &str) -> String {
        log_once_holding(&self.log, text, Duration::from_secs(10))
    }

    fn wait_ready(&mut self) {
        if let Err(log) = self.try_wait_ready() {
            panic!("metropolisd exited early:\n{log}");
        }
    }

    /// Waits until the daemon serves; its log if it exited first.
    fn try_wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                return Err(format!("exit status {status}\n{}", self.log()));
            }
            let sock_ok = std::os::unix::net::UnixStream::connect(&self.socket).is_ok();
            let tcp_ok = std::net::TcpStream::connect(&self.addr).is_ok()
                && std::net::TcpStream::connect(&self.agent_addr).is_ok()
                && self
                    .debug_addr
                    .as_ref()
                    .is_none_or(|a| std::net::TcpStream::connect(a).is_ok());
            // An elected daemon must have joined the election, too.
            let joined = !self.elected || self.log().contains("campaigning for curator leadership");
            if sock_ok && tcp_ok && joined {
                return Ok(());
            }
            assert!(
                Instant::now() < deadline,
                "metropolisd not ready after 30 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the process to exit by itself (e.g. a refused start).
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "metropolisd still running:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `signal` (e.g. `STOP`, `CONT`) to the process.
    pub fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("daemon running");
        let ok = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(child.id().to_string())
            .status()
            .unwrap();
        assert!(ok.success(), "kill -{signal} failed");
    }

    /// Kills the process with SIGKILL.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// Stops the process with SIGTERM and returns its exit status.
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("daemon running");
        let ok = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status()
            .unwrap();
        assert!(ok.success());
        child.wait().unwrap()
    }

    /// Runs `metroctl` against this daemon as the owner over TLS (its
    /// data directory's owner credential), with its debug endpoint when it
    /// has one; returns the finished process's output.
    pub fn metroctl(&self, args: &[&str]) -> std::process::Output {
        let mut cmd = Command::new(daemon_bin().with_file_name("metroctl-under-test"));
        cmd.arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--endpoint")
            .arg(&self.addr);
        if let Some(debug) = &self.debug_addr {
            cmd.arg("--debug-endpoint").arg(debug);
        }
        cmd.args(args).output().unwrap()
    }

    /// A channel over the local socket (as this node).
    pub async fn unix(&self) -> Channel {
        connect::unix(&TokioRuntime::shared(), &self.socket)
            .await
            .unwrap()
    }

    /// A channel over TLS with the credential in `dir` (prefix `owner` or
    /// `node`).
    pub async fn tls(&self, dir: &Path, prefix: &str) -> Channel {
        let creds = Credentials::read_from_dir(dir, prefix).unwrap();
        let config = client_config(Some(&creds), &creds.ca_pem).unwrap();
        connect::tls(&TokioRuntime::shared(), &self.addr, config)
            .await
            .unwrap()
    }

    /// A channel to the debug service (plain HTTP/2).
    pub async fn debug(&self) -> Channel {
        let addr = self
            .debug_addr
            .as_ref()
            .expect("daemon started with start_debug");
        connect::plain(&TokioRuntime::shared(), addr).await.unwrap()
    }

    /// A NodeDebugService client.
    pub async fn debug_client(&self) -> NodeDebugServiceClient<Channel> {
        NodeDebugServiceClient::with_origin(self.debug().await, Channel::origin())
    }

    /// A channel over TLS as the owner.
    pub async fn owner(&self) -> Channel {
        self.tls(&self.data_dir.join("owner"), "owner").await
    }

    /// The ID of the daemon's own node.
    pub fn node_id(&self) -> NodeId {
        let creds = Credentials::read_from_dir(&self.data_dir.join("pki"), "node").unwrap();
        NodeId::from_public_key(&creds.ed25519_public_key().unwrap())
    }

    /// Adds a node as the owner; returns its ID and credential directory.
    pub async fn add_node(&self, dir: &Path) -> NodeId {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        self.add_node_with_key(&key, dir).await
    }

    /// Adds the node of the Ed25519 `key` as the owner (over TLS) and
    /// writes its credentials (prefix `node`) to `dir`; returns its ID.
    pub async fn add_node_with_key(&self, key: &rcgen::KeyPair, dir: &Path) -> NodeId {
        let mut mgmt = NodeManagementClient::with_origin(self.owner().await, Channel::origin());
        let resp = mgmt
            .add_node(AddNodeRequest {
                public_key: key.public_key_raw().to_vec().into(),
            })
            .await
            .unwrap()
            .into_inner();
        let creds = Credentials::from_parts(
            String::from_utf8(resp.certificate.to_vec()).unwrap(),
            key.serialize_pem(),
            String::from_utf8(resp.ca_certificate.to_vec()).unwrap(),
        );
        creds.write_to_dir(dir, "node").unwrap();
        NodeId::parse(&resp.node_id).unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A Curator client over `channel`.
pub fn curator(channel: Channel) -> CuratorClient<Channel> {
    CuratorClient::with_origin(channel, Channel::origin())
}

/// The status the status writers send: a fixed address, `seq` as the
/// patch number of its version's release (read back by [`status_seq`]).
/// Not in its timestamp: the curator overwrites that with its own time of
/// acceptance.
pub fn status_with(seq: i64) -> Option<metropolis_proto::prelude::common::NodeStatus> {
    use metropolis_proto::version::spec::{Version, version::Release};
    Some(metropolis_proto::prelude::common::NodeStatus {
        external_address: "10.1.1.1".into(),
        version: Some(Version {
            release: Some(Release {
                patch: seq,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The sequence number [`status_with`] put in `status`: its version's
/// release patch number; `None` without a status, version or release.
pub fn status_seq(status: Option<&metropolis_proto::prelude::common::NodeStatus>) -> Option<i64> {
    status
        .and_then(|s| s.version.as_ref())
        .and_then(|v| v.release.as_ref())
        .map(|r| r.patch)
}

/// Nodes added to a daemon, each updating its own status over TLS as fast
/// as the daemon acknowledges ([`status_with`] 1, 2, ...), until a call
/// fails (the daemon is gone); each remembers the last acknowledged.
pub struct StatusWriters {
    /// Each node's ID and its last acknowledged sequence number.
    acked: Vec<(String, std::sync::Arc<std::sync::atomic::AtomicI64>)>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl StatusWriters {
    /// Adds `n` nodes to `d` (their credentials in `dir/n<i>`) and starts
    /// their writers.
    pub async fn start(d: &Daemon, dir: &Path, n: usize) -> StatusWriters {
        use std::sync::atomic::{AtomicI64, Ordering};
        let mut writers = StatusWriters {
            acked: Vec::new(),
            tasks: Vec::new(),
        };
        for i in 0..n {
            let cdir = dir.join(format!("n{i}"));
            let id = d.add_node(&cdir).await;
            let mut c = curator(d.tls(&cdir, "node").await);
            let last = std::sync::Arc::new(AtomicI64::new(0));
            writers.acked.push((id.to_string(), last.clone()));
            writers.tasks.push(tokio::spawn(async move {
                for seq in 1.. {
                    let req = curator::UpdateNodeStatusRequest {
                        node_id: id.to_string(),
                        status: status_with(seq),
                    };
                    if c.update_node_status(req).await.is_err() {
                        return;
                    }
                    last.store(seq, Ordering::SeqCst);
                }
            }));
        }
        writers
    }

    /// Each node's ID and its last acknowledged sequence number, now.
    pub fn acked(&self) -> Vec<(String, i64)> {
        self.acked
            .iter()
            .map(|(id, last)| (id.clone(), last.load(std::sync::atomic::Ordering::SeqCst)))
            .collect()
    }

    /// Waits for the writers to end (after the daemon is gone); each
    /// node's last acknowledged sequence number.
    pub async fn join(mut self) -> Vec<(String, i64)> {
        for task in std::mem::take(&mut self.tasks) {
            task.await.unwrap();
        }
        self.acked()
    }
}

/// Every node's update sequence number ([`status_seq`]; 0 without one),
/// by node ID, read through a fresh Watch over `d`'s local socket.
pub async fn status_seqs(d: &Daemon) -> std::collections::BTreeMap<String, i64> {
    use futures::StreamExt;
    let kind = curator::watch_request::Kind::NodesInCluster(Default::default());
    let mut s = curator(d.unix().await)
        .watch(curator::WatchRequest { kind: Some(kind) })
        .await
        .unwrap()
        .into_inner();
    let mut out = std::collections::BTreeMap::new();
    loop {
        let ev = s.next().await.unwrap().unwrap();
        for n in ev.nodes {
            let seq = status_seq(n.status.as_ref()).unwrap_or(0);
            out.insert(n.id, seq);
        }
        if ev.progress != 0 {
            return out;
        }
    }
}

/// Defines each listed `async fn name(runtime: RuntimeKind)` as two tests,
/// `tokio_server::name` and `smol_server::name`: one test definition, run
/// against a daemon on each runtime.
#[macro_export]
macro_rules! against_both_runtimes {
    ($($name:ident),* $(,)?) => {
        mod tokio_server {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::RuntimeKind::Tokio).await
                }
            )*
        }
        mod smol_server {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::RuntimeKind::Smol).await
                }
            )*
        }
    };
}

/// [`against_both_runtimes!`], and the same tests again with each daemon
/// elected over a fresh one-member etcd (`tokio_etcd::name`,
/// `smol_etcd::name`), which need etcd and so exist only with the `system`
/// feature.
#[macro_export]
macro_rules! against_both_runtimes_and_etcd {
    ($($name:ident),* $(,)?) => {
        $crate::against_both_runtimes!($($name),*);
        #[cfg(feature = "system")]
        mod tokio_etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    $crate::on_etcd($crate::RuntimeKind::Tokio, super::$name).await
                }
            )*
        }
        #[cfg(feature = "system")]
        mod smol_etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    $crate::on_etcd($crate::RuntimeKind::Smol, super::$name).await
                }
            )*
        }
    };
}

/// Runs `test` against `runtime` with every daemon it starts elected over
/// a fresh one-member etcd (see [`against_both_runtimes_and_etcd!`]).
#[cfg(feature = "system")]
pub async fn on_etcd<F: std::future::Future<Output = ()>>(
    runtime: RuntimeKind,
    test: impl FnOnce(RuntimeKind) -> F,
) {
    let etcd = etcd::Etcd::start();
    BACKEND
        .scope(Backend::Etcd(etcd.urls()), test(runtime))
        .await
}

/// Opens a `Watch(NodesInCluster)` stream over `channel`.
pub async fn watch_nodes(channel: Channel) -> tonic::Streaming<curator::WatchEvent> {
    let kind = curator::watch_request::Kind::NodesInCluster(Default::default());
    curator(channel)
        .watch(curator::WatchRequest { kind: Some(kind) })
        .await
        .unwrap()
        .into_inner()
}

/// A provisioning agent's credentials: its Ed25519 key, the self-signed
/// certificate it presents, and the cluster CA it trusts for the server.
pub struct AgentKey {
    /// The client credentials (self-signed certificate, key, cluster CA).
    pub creds: Credentials,
    /// The agent's public key.
    pub public: [u8; 32],
}

/// A machine registered with a daemon for an agent process.
pub struct EnrolledMachine {
    /// The agent's key file (PKCS#8 PEM), for `bmaas-agent --key`.
    pub key_file: PathBuf,
    /// The owner's MachineManagement client.
    pub operator: MachineManagementClient<Channel>,
}

impl Daemon {
    /// Registers `machine_id` with a new agent key written to
    /// `dir/agent.key`, as `metroctl machine add --generate-key` does.
    pub async fn enroll_machine(&self, machine_id: &str, dir: &Path) -> EnrolledMachine {
        let key_file = dir.join("agent.key");
        let key = metropolis_pki::generate_agent_key().unwrap();
        std::fs::write(&key_file, &key).unwrap();
        let (_, public) = metropolis_pki::self_signed_agent_certificate(&key).unwrap();
        let mut operator =
            MachineManagementClient::with_origin(self.owner().await, Channel::origin());
        operator
            .add_machine(AddMachineRequest {
                machine_id: machine_id.into(),
                agent_public_key: public.to_vec().into(),
            })
            .await
            .unwrap();
        EnrolledMachine { key_file, operator }
    }
}

impl AgentKey {
    /// A new agent key trusting the daemon's cluster CA.
    pub fn new(d: &Daemon) -> AgentKey {
        let key = metropolis_pki::generate_agent_key().unwrap();
        let (cert, public) = metropolis_pki::self_signed_agent_certificate(&key).unwrap();
        let ca = std::fs::read_to_string(d.data_dir.join("pki/ca.pem")).unwrap();
        AgentKey {
            creds: Credentials::from_parts(cert, key, ca),
            public,
        }
    }
}

impl Daemon {
    /// A channel to the AgentCallback port presenting `creds` (or no
    /// certificate), trusting the cluster CA in `ca_pem`.
    pub async fn agent_channel(&self, creds: Option<&Credentials>, ca_pem: &str) -> Channel {
        let config = client_config(creds, ca_pem).unwrap();
        connect::tls(&TokioRuntime::shared(), &self.agent_addr, config)
            .await
            .unwrap()
    }
}

/// A `bmaas-agent` process.
pub struct AgentProcess {
    child: Option<Child>,
    log: PathBuf,
}

impl AgentProcess {
    /// Starts an agent for `machine_id` with the key in `key_file`, talking
    /// to `d`'s AgentCallback port, heartbeating every 0.2 s.
    pub fn start(d: &Daemon, machine_id: &str, key_file: &Path, state_dir: &Path) -> AgentProcess {
        Self::start_with(d, machine_id, key_file, state_dir, &[])
    }

    /// [`start`](Self::start) with `extra` flags (e.g.
    /// `--allow-image-files`).
    pub fn start_with(
        d: &Daemon,
        machine_id: &str,
        key_file: &Path,
        state_dir: &Path,
        extra: &[&str],
    ) -> AgentProcess {
        Self::start_at(&d.agent_addr, d, machine_id, key_file, state_dir, extra)
    }

    /// [`start_with`](Self::start_with) talking to `endpoint` instead of
    /// `d`'s AgentCallback port (still trusting `d`'s cluster CA).
    pub fn start_at(
        endpoint: &str,
        d: &Daemon,
        machine_id: &str,
        key_file: &Path,
        state_dir: &Path,
        extra: &[&str],
    ) -> AgentProcess {
        let bin = daemon_bin().with_file_name("bmaas-agent-under-test");
        let log = state_dir.with_extension("agent.log");
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let child = Command::new(bin)
            .arg("--endpoint")
            .arg(endpoint)
            .arg("--machine-id")
            .arg(machine_id)
            .arg("--key")
            .arg(key_file)
            .arg("--ca")
            .arg(d.data_dir.join("pki/ca.pem"))
            .arg("--state-dir")
            .arg(state_dir)
            .arg("--interval")
            .arg("0.2")
            .arg("--log")
            .arg("info")
            // Never the test machine's reboot(2): a test that wants to see
            // the reboot gives --reboot and --reboot-command itself.
            .args(
                (!extra.contains(&"--reboot"))
                    .then_some(["--reboot", "never"])
                    .into_iter()
                    .flatten(),
            )
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .unwrap();
        AgentProcess {
            child: Some(child),
            log,
        }
    }

    /// What the agent logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log once it holds `text`, or as it is after `within`.
    pub fn log_once_it_holds(&self, text: &str, within: Duration) -> String {
        log_once_holding(&self.log, text, within)
    }

    /// Waits up to `timeout` for the agent to exit by itself; its status,
    /// or `None` while it still runs.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + timeout;
        let child = self.child.as_mut()?;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills the agent with SIGKILL.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
