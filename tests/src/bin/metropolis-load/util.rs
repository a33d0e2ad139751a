//! Shared pieces of the load scenarios: errors, process statistics from
//! `/proc`, percentiles, output, node creation and TLS channels.

use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use metropolis_pki::{Credentials, client_config};
use metropolis_proto::metropolis::node::core::curator::proto::private::{
    AddNodeRequest, node_management_client::NodeManagementClient,
};
use metropolis_proto::prelude::common;
use metropolis_runtime_tokio::rt::TokioRuntime;
use metropolis_transport::connect;
use metropolis_transport::grpc::Channel;

/// Any failure of a load run, as a message for the operator.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// The result type of the load tool.
pub type Result<T> = std::result::Result<T, Error>;

/// Adds what was being done to an error.
pub trait Context<T> {
    /// Prefixes the error with `what()`.
    fn context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: std::fmt::Display> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| format!("{}: {e}", what()).into())
    }
}

/// How long one connection attempt or one RPC may take before the run is
/// declared broken.
pub const RPC_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `fut` with a deadline of `limit`, naming `what` on timeout.
pub async fn bounded<T>(
    limit: Duration,
    what: impl FnOnce() -> String,
    fut: impl Future<Output = T>,
) -> Result<T> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| format!("{}: no answer within {limit:?}", what()).into())
}

// ---------------------------------------------------------------- /proc

/// Resident set size of process `pid`, in KiB (`VmRSS` of
/// `/proc/<pid>/status`).
pub fn rss_kib(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).context(|| format!("reading {path}"))?;
    let line = text
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .ok_or_else(|| format!("{path}: no VmRSS line (process gone or a kernel thread?)"))?;
    let value = line
        .trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim();
    value
        .parse()
        .context(|| format!("{path}: unreadable VmRSS line {line:?}"))
}

/// Clock ticks per second of `/proc/<pid>/stat` times.
fn clock_ticks() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|t| *t > 0.0)
            .unwrap_or(100.0)
    })
}

/// CPU time (user + system, all threads) used so far by process `pid`, in
/// seconds.
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).context(|| format!("reading {path}"))?;
    // The command name may contain spaces and parentheses: fields are
    // counted from the last ')'. Field 3 (state) is then the first.
    let rest = text
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| format!("{path}: unexpected format"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> Result<f64> {
        fields
            .get(n - 3)
            .and_then(|f| f.parse::<f64>().ok())
            .ok_or_else(|| format!("{path}: field {n} missing or not a number").into())
    };
    Ok((field(14)? + field(15)?) / clock_ticks())
}

/// CPU usage of a process over a time window.
#[derive(Clone, Copy, Debug)]
pub struct CpuMeter {
    pid: u32,
    cpu: f64,
    at: Instant,
}

impl CpuMeter {
    /// Starts measuring process `pid`.
    pub fn start(pid: u32) -> Result<CpuMeter> {
        Ok(CpuMeter {
            pid,
            cpu: cpu_seconds(pid)?,
            at: Instant::now(),
        })
    }

    /// Average number of cores busy since [`CpuMeter::start`] (1.0 = one
    /// core fully busy).
    pub fn cores(&self) -> Result<f64> {
        let cpu = cpu_seconds(self.pid)? - self.cpu;
        let wall = self.at.elapsed().as_secs_f64();
        Ok(if wall > 0.0 { cpu / wall } else { 0.0 })
    }
}

/// Number of CPUs of the machine.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Busy and total jiffies of the whole machine (first line of
/// `/proc/stat`; idle and iowait count as not busy).
fn host_jiffies() -> Result<(f64, f64)> {
    let text = std::fs::read_to_string("/proc/stat").context(|| "reading /proc/stat".into())?;
    let line = text
        .lines()
        .next()
        .filter(|l| l.starts_with("cpu "))
        .ok_or("/proc/stat: no cpu line")?;
    let values: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse::<f64>())
        .collect::<std::result::Result<_, _>>()
        .context(|| format!("/proc/stat: unreadable line {line:?}"))?;
    // user nice system idle iowait irq softirq steal (guest is in user).
    let total: f64 = values.iter().take(8).sum();
    let idle = values.get(3).copied().unwrap_or(0.0) + values.get(4).copied().unwrap_or(0.0);
    Ok((total - idle, total))
}

/// CPU usage of the whole machine (every process, also those of others)
/// over a time window, to tell whether something else competed.
#[derive(Clone, Copy, Debug)]
pub struct HostCpuMeter {
    busy: f64,
    total: f64,
}

impl HostCpuMeter {
    /// Starts measuring.
    pub fn start() -> Result<HostCpuMeter> {
        let (busy, total) = host_jiffies()?;
        Ok(HostCpuMeter { busy, total })
    }

    /// Average number of busy cores since [`HostCpuMeter::start`].
    pub fn cores(&self) -> Result<f64> {
        let (busy, total) = host_jiffies()?;
        let cpus = cpus() as f64;
        let dt = total - self.total;
        Ok(if dt > 0.0 {
            (busy - self.busy) / dt * cpus
        } else {
            0.0
        })
    }
}

// ---------------------------------------------------------------- numbers

/// The `p`-th percentile (0..=100, nearest rank) of sorted `values`; 0 when
/// empty.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Microseconds as milliseconds with three decimals.
pub fn ms(us: u64) -> String {
    format!("{:.3}", us as f64 / 1000.0)
}

/// Microseconds since `t0` (0 if `at` is earlier).
pub fn micros_since(t0: Instant, at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(t0).as_micros()).unwrap_or(u64::MAX)
}

/// Prints `rows` as an aligned two-column table under `title`.
pub fn print_table(title: &str, rows: &[(String, String)]) {
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let vwidth = rows.iter().map(|(_, v)| v.len()).max().unwrap_or(0);
    println!();
    println!("{title}");
    println!("{}", "-".repeat(width + vwidth + 3));
    for (k, v) in rows {
        println!("{k:<width$}   {v:>vwidth$}");
    }
    println!("{}", "-".repeat(width + vwidth + 3));
}

/// A row of [`print_table`].
pub fn row(name: &str, value: impl std::fmt::Display) -> (String, String) {
    (name.to_string(), value.to_string())
}

// ---------------------------------------------------------------- gRPC

/// A channel over mutual TLS to `addr` presenting `creds`.
pub async fn tls_channel(addr: &str, creds: &Credentials) -> Result<Channel> {
    let config = client_config(Some(creds), &creds.ca_pem)
        .context(|| "building the TLS client configuration".to_string())?;
    bounded(
        RPC_TIMEOUT,
        || format!("connecting to {addr} over TLS"),
        connect::tls(&TokioRuntime::shared(), addr, config),
    )
    .await?
    .context(|| "TLS channel".to_string())
}

/// A channel over the local UNIX socket at `path`.
pub async fn unix_channel(path: &Path) -> Result<Channel> {
    bounded(
        RPC_TIMEOUT,
        || format!("connecting to {}", path.display()),
        connect::unix(&TokioRuntime::shared(), path),
    )
    .await?
    .context(|| "UNIX channel".to_string())
}

/// A node created through `AddNode`, with its credential in memory.
#[derive(Clone, Debug)]
pub struct NodeCred {
    /// The node's ID.
    pub id: String,
    /// Its certificate, key and the cluster CA.
    pub creds: Credentials,
}

/// Creates `count` nodes as the owner over TLS to `addr`, `concurrency` at
/// a time, printing progress every 1000; returns the credentials of the
/// first `keep` nodes (in creation-index order).
pub async fn add_nodes(
    addr: &str,
    owner: &Credentials,
    count: usize,
    concurrency: usize,
    keep: usize,
) -> Result<Vec<NodeCred>> {
    let channel = tls_channel(addr, owner).await?;
    let mgmt = NodeManagementClient::with_origin(channel, Channel::origin());
    let done = AtomicUsize::new(0);
    let started = Instant::now();
    let add_one = |index: usize| {
        let mut mgmt = mgmt.clone();
        let done = &done;
        async move {
            let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519)
                .context(|| "generating an Ed25519 key".to_string())?;
            let request = AddNodeRequest {
                public_key: key.public_key_raw().to_vec().into(),
            };
            let resp = bounded(
                RPC_TIMEOUT,
                || format!("AddNode #{index}"),
                mgmt.add_node(request),
            )
            .await?
            .context(|| format!("AddNode #{index}"))?
            .into_inner();
            let n = done.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_multiple_of(1000) || n == count {
                let secs = started.elapsed().as_secs_f64();
                println!(
                    "  added {n}/{count} nodes in {secs:.1} s ({:.0}/s)",
                    n as f64 / secs.max(1e-9)
                );
            }
            if index >= keep {
                return Ok::<_, Error>(None);
            }
            let utf8 = |what: &str, b: &[u8]| {
                String::from_utf8(b.to_vec())
                    .map_err(|e| format!("AddNode #{index}: {what} is not UTF-8: {e}"))
            };
            let creds = Credentials::from_parts(
                utf8("certificate", &resp.certificate)?,
                key.serialize_pem(),
                utf8("ca_certificate", &resp.ca_certificate)?,
            );
            creds
                .validate()
                .context(|| format!("AddNode #{index}: the returned credential"))?;
            Ok(Some((index, resp.node_id, creds)))
        }
    };
    let mut results = futures::stream::iter(0..count)
        .map(add_one)
        .buffer_unordered(concurrency.max(1));
    let mut kept = Vec::with_capacity(keep.min(count));
    while let Some(result) = results.next().await {
        if let Some((index, id, creds)) = result? {
            kept.push((index, NodeCred { id, creds }));
        }
    }
    kept.sort_by_key(|(index, _)| *index);
    Ok(kept.into_iter().map(|(_, n)| n).collect())
}

/// A status carrying a marker in its version's release: `writer` as the
/// minor and `seq` as the patch number (major 0), so that a watcher can
/// tell which update it sees (`fanout::Marker`). Not in the timestamp: the
/// curator overwrites that with its own time of acceptance.
pub fn status(writer: u32, seq: u32) -> common::NodeStatus {
    use metropolis_proto::version::spec::{Version, version::Release};
    common::NodeStatus {
        external_address: format!(
            "10.{}.{}.{}",
            (writer >> 16) & 255,
            (writer >> 8) & 255,
            writer & 255
        ),
        version: Some(Version {
            release: Some(Release {
                major: 0,
                minor: i64::from(writer),
                patch: i64::from(seq),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}
