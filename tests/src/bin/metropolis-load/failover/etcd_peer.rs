//! etcd as the failover scenario's peer and instrument: which member
//! leads, puts straight to etcd (whose recovery from losing its leader is
//! what the curators' is compared with), and etcd's own request counters.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use metropolis_tests::campaign::cluster::{N, etcd_ip};

use super::traffic::{Op, Record, Stream};
use crate::util::Result;

/// The index of the member etcd's members name as their leader.
pub async fn leader() -> Result<usize> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        for i in 0..N {
            let url = format!("http://{}:2379", etcd_ip(i));
            let status = async {
                let mut client = etcd_client::Client::connect([url], None).await.ok()?;
                client.status().await.ok()
            };
            if let Ok(Some(s)) = tokio::time::timeout(Duration::from_secs(1), status).await
                && s.header().is_some_and(|h| h.member_id() == s.leader())
            {
                return Ok(i);
            }
        }
        if Instant::now() > deadline {
            return Err("no etcd member said it leads within 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Puts to etcd, one at a time, recorded as [`Stream::Etcd`].
pub struct Puts {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

/// One put's limit: past it, the put counts as failed and the next is sent.
const PUT_TIMEOUT: Duration = Duration::from_secs(1);

impl Puts {
    /// Starts putting to the members at `urls` (comma-separated).
    pub async fn start(urls: &str, record: Record) -> Result<Puts> {
        let endpoints: Vec<String> = urls.split(',').map(str::to_string).collect();
        let options = etcd_client::ConnectOptions::new().with_timeout(PUT_TIMEOUT);
        let mut client = etcd_client::Client::connect(endpoints, Some(options))
            .await
            .map_err(|e| format!("connecting to etcd for the direct puts: {e}"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let task = tokio::spawn(async move {
            let mut seq = 0u64;
            while !stopping.load(Ordering::Relaxed) {
                seq += 1;
                let start = Instant::now();
                let put = client.put("/metropolis-load/failover", seq.to_string(), None);
                let ok = matches!(tokio::time::timeout(PUT_TIMEOUT, put).await, Ok(Ok(_)));
                record.push(Op {
                    stream: Stream::Etcd,
                    start,
                    end: Instant::now(),
                    ok,
                });
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        Ok(Puts { stop, task })
    }

    /// Stops putting.
    pub async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
    }
}

/// etcd's gRPC requests per second, every member together, over `window`
/// while nothing but the curators talks to it: the messages its servers
/// received (a unary call is one; a lease keep-alive stream counts each
/// renewal).
pub async fn idle_requests_per_second(window: Duration) -> Result<f64> {
    let before = received_total().await?;
    let start = Instant::now();
    tokio::time::sleep(window).await;
    let after = received_total().await?;
    Ok((after - before) / start.elapsed().as_secs_f64())
}

/// `grpc_server_msg_received_total` summed over every method and member.
async fn received_total() -> Result<f64> {
    let mut total = 0.0;
    for i in 0..N {
        let addr = format!("{}:2379", etcd_ip(i));
        let text = tokio::time::timeout(Duration::from_secs(5), metrics(&addr))
            .await
            .map_err(|_| format!("etcd {addr}: no /metrics answer within 5 s"))??;
        total += text
            .lines()
            .filter(|l| l.starts_with("grpc_server_msg_received_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
    }
    Ok(total)
}

/// The body of `GET /metrics` from the etcd member at `addr`.
async fn metrics(addr: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("etcd {addr}: {e}"))?;
    stream
        .write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .map_err(|e| format!("etcd {addr}: {e}"))?;
    let mut body = Vec::new();
    stream
        .take(64 << 20)
        .read_to_end(&mut body)
        .await
        .map_err(|e| format!("etcd {addr}: {e}"))?;
    Ok(String::from_utf8_lossy(&body).into_owned())
}
