//! The processes of one schedule: three etcd members and three curators
//! (`metropolisd` elected over etcd), each on a loopback address of its
//! own and with a group ID of its own (so the firewall can tell their
//! connections apart, `faults::nft`), under a work directory of the
//! schedule. Each curator's data directory is a small tmpfs (so its disk
//! can be filled, `faults::disk`) and its wall clock is set through
//! libfaketime's timestamp file (`faults::clock`).
//!
//! Every process is registered with [`super::cleanup`] as it starts. An
//! exit the schedule did not ask for is recorded, with the end of the
//! process's log, for the checks.

use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use metropolis_etcd::{EtcdConfig, EtcdStore};
use metropolis_node::cluster::DEFAULT_ELECTION_PREFIX;
use metropolis_proto::prelude::storage::LeaderElectionValue;
use prost::Message;

use super::cleanup;
use super::nft::Initiator;

/// etcd member `i`'s address.
pub fn etcd_ip(i: usize) -> String {
    format!("127.0.10.{}", i + 1)
}

/// Curator `i`'s address.
pub fn curator_ip(i: usize) -> String {
    format!("127.0.20.{}", i + 1)
}

/// Every etcd member's address, as a prefix.
pub const ETCD_NET: &str = "127.0.10.0/24";
/// Every curator's address, as a prefix.
pub const CURATOR_NET: &str = "127.0.20.0/24";
/// etcd's client and peer ports, the curators' gRPC and agent ports.
pub const PORTS: [u16; 4] = [2379, 2380, 7835, 7836];

/// How many members and curators.
pub const N: usize = 3;

/// etcd member `i`'s socket group and connection mark.
pub fn etcd_initiator(i: usize) -> Initiator {
    Initiator {
        gid: 64010 + i as u32,
        mark: 0x10 + i as u32,
        only_to: None,
    }
}

/// Curator `i`'s socket group and connection mark.
pub fn curator_initiator(i: usize) -> Initiator {
    Initiator {
        gid: 64020 + i as u32,
        mark: 0x20 + i as u32,
        only_to: None,
    }
}

/// The campaign's own clients (this process, with its own group),
/// connecting to curators.
pub fn client_initiator(own_gid: u32) -> Initiator {
    Initiator {
        gid: own_gid,
        mark: 0x30,
        only_to: Some(CURATOR_NET),
    }
}

/// What the processes are started from.
#[derive(Clone, Debug)]
pub struct Programs {
    /// `metropolisd` built with the etcd feature.
    pub daemon: PathBuf,
    /// Extra environment for the daemon (e.g. `METROPOLIS_CANARY`).
    pub daemon_env: Vec<(String, String)>,
    /// etcd.
    pub etcd: PathBuf,
    /// libfaketime's multi-threaded library.
    pub faketime: PathBuf,
    /// The curators' lease TTL.
    pub ttl: Duration,
}

/// One process of the cluster.
struct Proc {
    name: String,
    child: Option<Child>,
    log: PathBuf,
    /// Stopped with SIGSTOP (and not yet continued).
    stopped: bool,
}

impl Proc {
    fn new(name: String, log: PathBuf) -> Proc {
        Proc {
            name,
            child: None,
            log,
            stopped: false,
        }
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            cleanup::remove_pid(child.id());
        }
        self.stopped = false;
    }

    /// Sends SIGTERM and waits up to `limit` for the exit (then SIGKILL);
    /// how long it took to exit, or `None` when it had to be killed.
    async fn terminate(&mut self, limit: Duration) -> Option<Duration> {
        let mut child = self.child.take()?;
        let start = Instant::now();
        cleanup::signal(child.id(), "TERM");
        let exited = loop {
            match child.try_wait() {
                Ok(Some(_)) | Err(_) => break Some(start.elapsed()),
                Ok(None) if start.elapsed() > limit => break None,
                Ok(None) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        };
        if exited.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        cleanup::remove_pid(child.id());
        self.stopped = false;
        exited
    }
}

/// The cluster of one schedule.
pub struct Cluster {
    work: PathBuf,
    programs: Programs,
    etcd: Vec<Proc>,
    curators: Vec<Proc>,
    /// Exits nobody asked for: what exited, and the end of its log.
    pub unexpected_exits: Vec<String>,
    store: Option<EtcdStore>,
}

impl Cluster {
    /// Starts the members, then the curators (the first creates the
    /// cluster CA, the others get a copy), and waits until every curator
    /// campaigns.
    pub async fn start(work: &Path, programs: Programs, token: &str) -> Result<Cluster, String> {
        let mut c = Cluster {
            work: work.to_path_buf(),
            programs,
            etcd: (0..N)
                .map(|i| Proc::new(format!("etcd-{i}"), work.join(format!("etcd-{i}.log"))))
                .collect(),
            curators: (0..N)
                .map(|i| {
                    Proc::new(
                        format!("curator-{i}"),
                        work.join(format!("curator-{i}.log")),
                    )
                })
                .collect(),
            unexpected_exits: Vec::new(),
            store: None,
        };
        for i in 0..N {
            c.spawn_etcd(i, token)?;
        }
        for i in 0..N {
            let addr = format!("{}:2379", etcd_ip(i));
            c.wait_listening(&addr, Duration::from_secs(20), |c| c.etcd_exited(i))
                .await?;
        }
        for i in 0..N {
            super::disk::mount(&c.data_dir(i))?;
            super::clock::set(&c.clock_file(i), 0)?;
        }
        c.spawn_curator(0)?;
        c.wait_curator(0).await?;
        for i in 1..N {
            share_ca(&c.data_dir(0), &c.data_dir(i))?;
            c.spawn_curator(i)?;
        }
        for i in 1..N {
            c.wait_curator(i).await?;
        }
        let mut config = EtcdConfig::new(c.etcd_urls().split(',').map(str::to_string));
        config.request_timeout = Duration::from_secs(1);
        let store = EtcdStore::connect(config)
            .await
            .map_err(|e| format!("connecting to etcd to follow the election: {e}"))?;
        c.store = Some(store);
        Ok(c)
    }

    /// Every member's client URL, comma-separated.
    pub fn etcd_urls(&self) -> String {
        (0..N)
            .map(|i| format!("http://{}:2379", etcd_ip(i)))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Curator `i`'s data directory (a tmpfs).
    pub fn data_dir(&self, i: usize) -> PathBuf {
        self.work.join(format!("curator-{i}"))
    }

    /// Curator `i`'s libfaketime timestamp file.
    pub fn clock_file(&self, i: usize) -> PathBuf {
        self.work.join(format!("clock-{i}"))
    }

    /// Curator `i`'s gRPC address.
    pub fn curator_addr(i: usize) -> String {
        format!("{}:7835", curator_ip(i))
    }

    /// Curator `i`'s AgentCallback address.
    pub fn agent_addr(i: usize) -> String {
        format!("{}:7836", curator_ip(i))
    }

    /// Every curator's gRPC address (`agent_port`: AgentCallback
    /// address), curator `first`'s first: a client's endpoints.
    pub fn endpoints(first: usize, agent_port: bool) -> Vec<String> {
        (0..N)
            .map(|k| {
                let i = (first + k) % N;
                if agent_port {
                    Self::agent_addr(i)
                } else {
                    Self::curator_addr(i)
                }
            })
            .collect()
    }

    /// The owner credential's directory (curator-0's).
    pub fn owner_dir(&self) -> PathBuf {
        self.data_dir(0).join("owner")
    }

    fn spawn_etcd(&mut self, i: usize, token: &str) -> Result<(), String> {
        let ip = etcd_ip(i);
        let cluster = (0..N)
            .map(|j| format!("e{j}=http://{}:2380", etcd_ip(j)))
            .collect::<Vec<_>>()
            .join(",");
        let log = open_log(&self.etcd[i].log)?;
        let mut cmd = Command::new(&self.programs.etcd);
        cmd.arg(format!("--name=e{i}"))
            .arg(format!(
                "--data-dir={}",
                self.work.join(format!("etcd-{i}")).display()
            ))
            .arg(format!("--listen-client-urls=http://{ip}:2379"))
            .arg(format!("--advertise-client-urls=http://{ip}:2379"))
            .arg(format!("--listen-peer-urls=http://{ip}:2380"))
            .arg(format!("--initial-advertise-peer-urls=http://{ip}:2380"))
            .arg(format!("--initial-cluster={cluster}"))
            .arg(format!("--initial-cluster-token={token}"))
            .arg("--heartbeat-interval=50")
            .arg("--election-timeout=500")
            .arg("--logger=zap")
            .arg("--log-level=warn");
        let child = spawn(cmd, etcd_initiator(i).gid, log)
            .map_err(|e| format!("cannot start etcd ({}): {e}", self.programs.etcd.display()))?;
        self.etcd[i].child = Some(child);
        Ok(())
    }

    fn spawn_curator(&mut self, i: usize) -> Result<(), String> {
        let log = open_log(&self.curators[i].log)?;
        let mut cmd = Command::new(&self.programs.daemon);
        cmd.arg("--data-dir")
            .arg(self.data_dir(i))
            .arg("--listen")
            .arg(Self::curator_addr(i))
            .arg("--agent-listen")
            .arg(Self::agent_addr(i))
            .arg("--etcd")
            .arg(self.etcd_urls())
            .arg("--lease-ttl")
            .arg(self.programs.ttl.as_secs().max(1).to_string())
            .arg("--etcd-request-timeout")
            .arg("2")
            .arg("--runtime")
            .arg(if i.is_multiple_of(2) { "tokio" } else { "smol" })
            .arg("--log")
            .arg("info")
            .env("LD_PRELOAD", &self.programs.faketime)
            .env("FAKETIME_TIMESTAMP_FILE", self.clock_file(i))
            .env("FAKETIME_CACHE_DURATION", "1")
            .env("DONT_FAKE_MONOTONIC", "1");
        for (k, v) in &self.programs.daemon_env {
            cmd.env(k, v);
        }
        let child = spawn(cmd, curator_initiator(i).gid, log).map_err(|e| {
            format!(
                "cannot start the daemon ({}): {e}",
                self.programs.daemon.display()
            )
        })?;
        self.curators[i].child = Some(child);
        Ok(())
    }

    /// Waits until curator `i` listens on both ports and campaigns.
    async fn wait_curator(&mut self, i: usize) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        self.wait_listening(&Self::curator_addr(i), Duration::from_secs(30), |c| {
            c.curator_exited(i)
        })
        .await?;
        loop {
            let log = std::fs::read_to_string(&self.curators[i].log).unwrap_or_default();
            if log.contains("campaigning for curator leadership") {
                return Ok(());
            }
            if let Some(e) = self.curator_exited(i) {
                return Err(e);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "curator-{i} did not campaign within 30 s; its log ends:\n{}",
                    tail(&self.curators[i].log, 20)
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn wait_listening(
        &mut self,
        addr: &str,
        limit: Duration,
        exited: impl Fn(&mut Cluster) -> Option<String>,
    ) -> Result<(), String> {
        let sock: SocketAddr = addr
            .parse()
            .map_err(|e| format!("bad address {addr}: {e}"))?;
        let deadline = Instant::now() + limit;
        loop {
            if TcpStream::connect_timeout(&sock, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if let Some(e) = exited(self) {
                return Err(e);
            }
            if Instant::now() > deadline {
                return Err(format!("nothing listens on {addr} after {limit:?}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn etcd_exited(&mut self, i: usize) -> Option<String> {
        exited(&mut self.etcd[i])
    }

    fn curator_exited(&mut self, i: usize) -> Option<String> {
        exited(&mut self.curators[i])
    }

    /// Records every process that exited since the last call (none should
    /// have: the schedule's kills take the process out of the list first).
    pub fn poll_exits(&mut self) {
        for p in self.etcd.iter_mut().chain(self.curators.iter_mut()) {
            if let Some(e) = exited(p) {
                self.unexpected_exits.push(e);
            }
        }
    }

    /// SIGKILLs curator `i`.
    pub fn kill_curator(&mut self, i: usize) {
        self.curators[i].kill();
    }

    /// SIGTERMs curator `i` (a graceful stop) and waits up to `limit` for
    /// it to exit; how long it took, or `None` when it had to be killed.
    pub async fn terminate_curator(&mut self, i: usize, limit: Duration) -> Option<Duration> {
        self.curators[i].terminate(limit).await
    }

    /// Starts curator `i` again (if it is not running) and waits for it.
    pub async fn restart_curator(&mut self, i: usize) -> Result<(), String> {
        if self.curators[i].child.is_none() {
            self.spawn_curator(i)?;
            self.wait_curator(i).await?;
        }
        Ok(())
    }

    /// SIGKILLs etcd member `i`.
    pub fn kill_etcd(&mut self, i: usize) {
        self.etcd[i].kill();
    }

    /// Starts etcd member `i` again (if it is not running).
    pub async fn restart_etcd(&mut self, i: usize, token: &str) -> Result<(), String> {
        if self.etcd[i].child.is_none() {
            self.spawn_etcd(i, token)?;
            let addr = format!("{}:2379", etcd_ip(i));
            self.wait_listening(&addr, Duration::from_secs(20), |c| c.etcd_exited(i))
                .await?;
        }
        Ok(())
    }

    /// SIGSTOPs (`stop`) or SIGCONTs a curator (`curator`) or member.
    pub fn pause(&mut self, curator: bool, i: usize, stop: bool) {
        let p = if curator {
            &mut self.curators[i]
        } else {
            &mut self.etcd[i]
        };
        if let Some(pid) = p.pid()
            && cleanup::signal(pid, if stop { "STOP" } else { "CONT" })
        {
            p.stopped = stop;
        }
    }

    /// Continues every stopped process.
    pub fn continue_all(&mut self) {
        for i in 0..N {
            if self.curators[i].stopped {
                self.pause(true, i, false);
            }
            if self.etcd[i].stopped {
                self.pause(false, i, false);
            }
        }
    }

    /// The curator the election names (within `limit`), if any.
    pub async fn leader(&self, limit: Duration) -> Option<usize> {
        let store = self.store.as_ref()?;
        let election = store.election(DEFAULT_ELECTION_PREFIX);
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Ok((Some(kv), _))) =
                tokio::time::timeout(Duration::from_secs(1), election.leader()).await
                && let Ok(value) = LeaderElectionValue::decode(kv.value.clone())
                && let Some(i) = (0..N).find(|&i| Self::curator_addr(i) == value.curator_address)
            {
                return Some(i);
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops every process and unmounts the data directories.
    pub fn stop(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        self.store = None;
        for p in self.curators.iter_mut().chain(self.etcd.iter_mut()) {
            if p.stopped
                && let Some(pid) = p.pid()
            {
                cleanup::signal(pid, "CONT");
            }
            p.kill();
        }
        for i in 0..N {
            if let Err(e) = super::disk::unmount(&self.data_dir(i)) {
                problems.push(e);
            }
        }
        problems
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Whether `p` exited (reaping it): what exited, with its log's end.
fn exited(p: &mut Proc) -> Option<String> {
    let child = p.child.as_mut()?;
    match child.try_wait() {
        Ok(Some(status)) => {
            cleanup::remove_pid(child.id());
            p.child = None;
            Some(format!(
                "{} exited ({status}); its log ends:\n{}",
                p.name,
                tail(&p.log, 15)
            ))
        }
        _ => None,
    }
}

fn open_log(path: &Path) -> Result<std::fs::File, String> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("opening {}: {e}", path.display()))
}

/// Spawns `cmd` with group `gid`, its output to `log`; registers it.
fn spawn(mut cmd: Command, gid: u32, log: std::fs::File) -> std::io::Result<Child> {
    let err = log.try_clone()?;
    let child = cmd
        .gid(gid)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .spawn()?;
    cleanup::add_pid(child.id());
    Ok(child)
}

/// Copies the cluster CA of data directory `from` into `to`.
fn share_ca(from: &Path, to: &Path) -> Result<(), String> {
    let pki = to.join("pki");
    std::fs::create_dir_all(&pki).map_err(|e| format!("creating {}: {e}", pki.display()))?;
    for file in ["ca.pem", "ca-key.pem"] {
        std::fs::copy(from.join("pki").join(file), pki.join(file))
            .map_err(|e| format!("copying the cluster CA's {file}: {e}"))?;
    }
    Ok(())
}

/// The last `lines` lines of the file at `path`.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
