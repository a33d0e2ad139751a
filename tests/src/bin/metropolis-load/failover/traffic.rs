//! The clients of the failover scenario, through `metropolis-client` with
//! its default configuration (what a program embedding it gets): status
//! writers on tokio, status writers on smol, and heartbeating agents with
//! `bmaas-agent`'s client configuration. Each call is recorded with when
//! it started and ended and whether it was acknowledged; [`recovery`]
//! reads a fault's outcome from that record.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metropolis_client::{Client, ClientConfig};
use metropolis_core::provisioning::AgentConfig;
use metropolis_proto::prelude::{agent, curator};
use metropolis_runtime_smol::rt::SmolRuntime;
use metropolis_runtime_tokio::rt::TokioRuntime;
use metropolis_tests::campaign::cluster::Cluster;
use metropolis_tests::campaign::enroll::{EnrolledAgent, EnrolledNode};

/// Which clients a call came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stream {
    /// `update_node_status` on tokio.
    Tokio,
    /// `update_node_status` on smol.
    Smol,
    /// Agents' heartbeats (tokio, as `bmaas-agent` runs them).
    Agent,
    /// Puts straight to etcd (the peer: etcd's own recovery).
    Etcd,
}

impl Stream {
    /// Every stream, in the order of the report.
    pub const ALL: [Stream; 4] = [Stream::Tokio, Stream::Smol, Stream::Agent, Stream::Etcd];

    /// The stream's name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Stream::Tokio => "writes (tokio)",
            Stream::Smol => "writes (smol)",
            Stream::Agent => "heartbeats",
            Stream::Etcd => "etcd puts (direct)",
        }
    }
}

/// One call.
#[derive(Clone, Copy, Debug)]
pub struct Op {
    /// Whose call.
    pub stream: Stream,
    /// When it was issued.
    pub start: Instant,
    /// When it ended.
    pub end: Instant,
    /// Whether it was acknowledged.
    pub ok: bool,
}

/// The calls made so far, shared by every client.
#[derive(Clone, Default)]
pub struct Record(Arc<Mutex<Vec<Op>>>);

impl Record {
    /// Records a call.
    pub fn push(&self, op: Op) {
        lock(&self.0).push(op);
    }

    /// The calls that ended at or after `since`.
    pub fn since(&self, since: Instant) -> Vec<Op> {
        lock(&self.0)
            .iter()
            .filter(|op| op.end >= since)
            .copied()
            .collect()
    }

    /// Drops the calls that ended before `before`.
    pub fn forget(&self, before: Instant) {
        lock(&self.0).retain(|op| op.end >= before);
    }
}

/// What a fault did to one stream: the time from the fault to the first
/// acknowledged call issued after it, and the calls that failed before
/// that acknowledgement.
#[derive(Clone, Copy, Debug)]
pub struct Recovery {
    /// From the fault to the first acknowledgement (`None`: none came).
    pub after: Option<Duration>,
    /// Calls that ended in an error between the fault and then.
    pub failed: u64,
}

/// The recovery of `stream` from a fault at `fault`, read from `ops`.
pub fn recovery(ops: &[Op], stream: Stream, fault: Instant) -> Recovery {
    let first = ops
        .iter()
        .filter(|op| op.stream == stream && op.ok && op.start >= fault)
        .map(|op| op.end)
        .min();
    let failed = ops
        .iter()
        .filter(|op| {
            op.stream == stream
                && !op.ok
                && op.end >= fault
                && first.is_none_or(|first| op.end <= first)
        })
        .count() as u64;
    Recovery {
        after: first.map(|t| t - fault),
        failed,
    }
}

/// The running clients; they stop when this is dropped.
pub struct Traffic {
    /// What they did.
    pub record: Record,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// The pause between one call's end and a client's next call.
const PACE: Duration = Duration::from_millis(20);
/// A status write's deadline, retries included (the library's default
/// attempt limit).
const WRITE_DEADLINE: Duration = Duration::from_secs(10);

impl Traffic {
    /// Starts a writer per entry of `tokio_nodes` (on the calling tokio
    /// runtime) and of `smol_nodes` (a thread each, on smol's global
    /// executor), and a heartbeat loop per agent.
    pub fn start(
        tokio_nodes: Vec<EnrolledNode>,
        smol_nodes: Vec<EnrolledNode>,
        agents: Vec<EnrolledAgent>,
    ) -> Result<Traffic, String> {
        let record = Record::default();
        let stop = Arc::new(AtomicBool::new(false));
        let mut traffic = Traffic {
            record: record.clone(),
            stop: stop.clone(),
            threads: Vec::new(),
            tasks: Vec::new(),
        };
        for (i, node) in tokio_nodes.into_iter().enumerate() {
            let config = ClientConfig::new(Cluster::endpoints(i, false), Some(node.tls));
            let client = Client::new(TokioRuntime::shared(), config)
                .map_err(|e| format!("a tokio client: {e}"))?;
            let (record, stop) = (record.clone(), stop.clone());
            traffic.tasks.push(tokio::spawn(async move {
                write_loop(client, node.id, Stream::Tokio, record, stop, |d| {
                    Box::pin(tokio::time::sleep(d))
                })
                .await;
            }));
        }
        for (i, node) in smol_nodes.into_iter().enumerate() {
            let config = ClientConfig::new(Cluster::endpoints(i + 1, false), Some(node.tls));
            let client = Client::new(SmolRuntime::global().shared(), config)
                .map_err(|e| format!("a smol client: {e}"))?;
            let (record, stop) = (record.clone(), stop.clone());
            traffic.threads.push(std::thread::spawn(move || {
                smol::block_on(write_loop(
                    client,
                    node.id,
                    Stream::Smol,
                    record,
                    stop,
                    |d| {
                        Box::pin(async move {
                            smol::Timer::after(d).await;
                        })
                    },
                ));
            }));
        }
        for (i, agent) in agents.into_iter().enumerate() {
            let ports = bmaas_agent::ports::MachinePorts::new(
                Cluster::endpoints(i + 2, true),
                agent.tls,
                i as u64,
                std::env::temp_dir(),
                std::path::PathBuf::from("/"),
                // Never asked to install: no request is submitted.
                Arc::new(bmaas_agent::install::OciInstaller::new()),
            )
            .map_err(|e| format!("an agent's client: {e}"))?;
            let client = ports.client.clone();
            let timeout = ports.heartbeat_timeout;
            let machine_id = agent.machine_id;
            let (record, stop) = (record.clone(), stop.clone());
            traffic.tasks.push(tokio::spawn(async move {
                let loop_config = AgentConfig::default();
                let mut failures = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    let request = agent::HeartbeatRequest {
                        machine_id: machine_id.clone(),
                        ..Default::default()
                    };
                    let start = Instant::now();
                    let ok = client.heartbeat(request, timeout).await.is_ok();
                    record.push(Op {
                        stream: Stream::Agent,
                        start,
                        end: Instant::now(),
                        ok,
                    });
                    // As the agent's loop: after a failed heartbeat, its
                    // backoff (without the jitter); after an answered one,
                    // the next at once (standing in for many agents whose
                    // idle intervals are spread over time).
                    failures = if ok { 0 } else { failures + 1 };
                    let pause = if ok {
                        PACE
                    } else {
                        loop_config.nominal_backoff(failures)
                    };
                    tokio::time::sleep(pause).await;
                }
            }));
        }
        Ok(traffic)
    }

    /// Stops every client and waits for them.
    pub async fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
        let threads = std::mem::take(&mut self.threads);
        let _ = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await;
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

type Sleep = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Sends node `id`'s status, a new one each time, until `stop`.
async fn write_loop(
    client: Client,
    id: String,
    stream: Stream,
    record: Record,
    stop: Arc<AtomicBool>,
    sleep: impl Fn(Duration) -> Sleep,
) {
    let mut seq = 0u32;
    while !stop.load(Ordering::Relaxed) {
        seq = seq.wrapping_add(1);
        let request = curator::UpdateNodeStatusRequest {
            node_id: id.clone(),
            status: Some(crate::util::status(0, seq)),
        };
        let start = Instant::now();
        let ok = client
            .update_node_status(request, WRITE_DEADLINE)
            .await
            .is_ok();
        record.push(Op {
            stream,
            start,
            end: Instant::now(),
            ok,
        });
        sleep(PACE).await;
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(stream: Stream, start: u64, end: u64, ok: bool, t0: Instant) -> Op {
        Op {
            stream,
            start: t0 + Duration::from_millis(start),
            end: t0 + Duration::from_millis(end),
            ok,
        }
    }

    #[test]
    fn recovery_is_the_first_acknowledged_call_issued_after_the_fault() {
        let t0 = Instant::now();
        let fault = t0 + Duration::from_millis(1000);
        let ops = [
            op(Stream::Tokio, 990, 1010, true, t0), // issued before: not counted
            op(Stream::Tokio, 1020, 1500, false, t0), // failed in between
            op(Stream::Tokio, 1520, 6200, true, t0), // the first after
            op(Stream::Tokio, 6300, 6310, false, t0), // after recovery
            op(Stream::Smol, 1100, 1200, true, t0), // another stream
        ];
        let r = recovery(&ops, Stream::Tokio, fault);
        assert_eq!(r.after, Some(Duration::from_millis(5200)));
        assert_eq!(r.failed, 1);
        let none = recovery(&ops, Stream::Agent, fault);
        assert_eq!(none.after, None);
        assert_eq!(none.failed, 0);
    }
}
