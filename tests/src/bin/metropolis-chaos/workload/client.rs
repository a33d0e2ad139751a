//! The campaign's client: a thin adapter with the API of the
//! `metropolis-client` library (issue 43, Deliver 1), written over the raw
//! tonic clients until that library lands, so the workload can switch to
//! it by changing this file alone.
//!
//! Given several endpoints, a unary call goes to the next endpoint in
//! turn; a call ending Unavailable, DeadlineExceeded or with a broken
//! connection is tried again on the next endpoint (after `backoff`) while
//! the caller's deadline allows, the connection dropped. A node view
//! ([`Client::watch_nodes`], [`Client::watch_node`]) re-opens its Watch
//! after any failure, on the next endpoint, applies each new backlog as a
//! difference against what it holds and hands on only changes, then
//! `Synced` (first backlog) or `Resynced`.

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use metropolis_proto::prelude::agent::agent_callback_client::AgentCallbackClient;
use metropolis_proto::prelude::agent::{HeartbeatRequest, HeartbeatResponse};
use metropolis_proto::prelude::curator::{
    self, Node, UpdateNodeStatusRequest, WatchEvent, WatchRequest, curator_client::CuratorClient,
    watch_request::Kind,
};
use metropolis_runtime_tokio::rt::TokioRuntime;
use metropolis_transport::connect;
use metropolis_transport::grpc::Channel;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::{Code, Status};

/// How a client reaches the curators.
#[derive(Clone)]
pub struct ClientConfig {
    /// The curators' addresses (`host:port`), tried in turn.
    pub endpoints: Vec<String>,
    /// The client's TLS (its credential and the cluster CA).
    pub tls: Arc<rustls::ClientConfig>,
    /// The longest one attempt of a call may take.
    pub call_timeout: Duration,
    /// The pause before trying another endpoint.
    pub backoff: Duration,
}

/// A client of every curator instance.
#[derive(Clone)]
pub struct Client {
    config: Arc<ClientConfig>,
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    next: Arc<AtomicUsize>,
}

/// What a node view hands the program.
#[derive(Clone, Debug)]
#[allow(clippy::large_enum_variant)] // as metropolis-client's
pub enum NodeEvent {
    /// The first backlog is complete: the view is the cluster's.
    Synced,
    /// A node is new or changed.
    Changed(Node),
    /// A node is gone.
    Removed(String),
    /// The stream broke; the view re-opens it.
    Reconnecting {
        /// Why it broke.
        reason: String,
    },
    /// A backlog after a reconnect is complete and applied.
    Resynced,
}

/// A live view of nodes: a stream of [`NodeEvent`]s, ended when dropped.
pub struct NodeView {
    rx: mpsc::UnboundedReceiver<NodeEvent>,
    task: tokio::task::JoinHandle<()>,
}

impl Stream for NodeView {
    type Item = NodeEvent;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<NodeEvent>> {
        self.rx.poll_recv(cx)
    }
}

impl Drop for NodeView {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Whether a failed attempt is worth another (the call may or may not
/// have been carried out).
fn retryable(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::DeadlineExceeded | Code::Unknown | Code::Cancelled
    )
}

impl Client {
    /// A client of `config.endpoints`, starting at endpoint `first`.
    pub fn new(config: ClientConfig, first: usize) -> Client {
        Client {
            config: Arc::new(config),
            channels: Arc::default(),
            next: Arc::new(AtomicUsize::new(first)),
        }
    }

    fn pick(&self) -> String {
        let n = self.config.endpoints.len().max(1);
        let i = self.next.fetch_add(1, Ordering::Relaxed) % n;
        self.config.endpoints.get(i).cloned().unwrap_or_default()
    }

    async fn channel(&self, endpoint: &str, deadline: Instant) -> Result<Channel, Status> {
        if let Some(c) = lock(&self.channels).get(endpoint) {
            return Ok(c.clone());
        }
        let limit = deadline.min(Instant::now() + self.config.call_timeout);
        let runtime = TokioRuntime::shared();
        let connecting = connect::tls(&runtime, endpoint, self.config.tls.clone());
        match tokio::time::timeout_at(limit, connecting).await {
            Ok(Ok(c)) => {
                lock(&self.channels).insert(endpoint.to_string(), c.clone());
                Ok(c)
            }
            Ok(Err(e)) => Err(Status::unavailable(format!(
                "connecting to {endpoint}: {e}"
            ))),
            Err(_) => Err(Status::unavailable(format!(
                "connecting to {endpoint}: no answer in time"
            ))),
        }
    }

    fn forget(&self, endpoint: &str) {
        lock(&self.channels).remove(endpoint);
    }

    /// Runs `attempt` on endpoint after endpoint until it succeeds, fails
    /// for good, or `deadline` passes (then the last failure).
    async fn call<T, F, Fut>(&self, deadline: Instant, attempt: F) -> Result<T, Status>
    where
        F: Fn(Channel, Duration) -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        let mut last = Status::deadline_exceeded("no attempt fitted in the deadline");
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Err(last);
            }
            let endpoint = self.pick();
            let limit = (deadline - now).min(self.config.call_timeout);
            let result = match self.channel(&endpoint, now + limit).await {
                Ok(channel) => match tokio::time::timeout(limit, attempt(channel, limit)).await {
                    Ok(r) => r,
                    Err(_) => Err(Status::deadline_exceeded(format!(
                        "{endpoint} did not answer within {limit:?}"
                    ))),
                },
                Err(e) => Err(e),
            };
            match result {
                Ok(v) => return Ok(v),
                Err(s) if retryable(&s) => {
                    self.forget(&endpoint);
                    last = Status::new(s.code(), format!("{endpoint}: {}", s.message()));
                    tokio::time::sleep_until(deadline.min(Instant::now() + self.config.backoff))
                        .await;
                }
                Err(s) => return Err(s),
            }
        }
    }

    /// `Curator.UpdateNodeStatus`, retried within `deadline`.
    pub async fn update_node_status(
        &self,
        req: UpdateNodeStatusRequest,
        deadline: Instant,
    ) -> Result<(), Status> {
        self.call(deadline, |channel, limit| {
            let req = req.clone();
            async move {
                let mut request = tonic::Request::new(req);
                request.set_timeout(limit);
                CuratorClient::with_origin(channel, Channel::origin())
                    .update_node_status(request)
                    .await
                    .map(|_| ())
            }
        })
        .await
    }

    /// `AgentCallback.Heartbeat`, retried within `deadline`.
    pub async fn heartbeat(
        &self,
        req: HeartbeatRequest,
        deadline: Instant,
    ) -> Result<HeartbeatResponse, Status> {
        self.call(deadline, |channel, limit| {
            let req = req.clone();
            async move {
                let mut request = tonic::Request::new(req);
                request.set_timeout(limit);
                AgentCallbackClient::with_origin(channel, Channel::origin())
                    .heartbeat(request)
                    .await
                    .map(tonic::Response::into_inner)
            }
        })
        .await
    }

    /// A view of every node (`Watch(NodesInCluster)`).
    pub fn watch_nodes(&self) -> NodeView {
        self.view(Kind::NodesInCluster(Default::default()))
    }

    /// A view of node `id` (`Watch(NodeInCluster)`).
    pub fn watch_node(&self, id: &str) -> NodeView {
        self.view(Kind::NodeInCluster(curator::watch_request::NodeInCluster {
            node_id: id.to_string(),
        }))
    }

    fn view(&self, kind: Kind) -> NodeView {
        let (tx, rx) = mpsc::unbounded_channel();
        let client = self.clone();
        let task = tokio::spawn(async move { client.follow(kind, tx).await });
        NodeView { rx, task }
    }

    /// Opens a raw Watch on `endpoint` (for the checks' probes: one
    /// stream, no retry).
    pub async fn open_raw(
        &self,
        endpoint: &str,
        kind: Kind,
        deadline: Instant,
    ) -> Result<tonic::Streaming<WatchEvent>, Status> {
        let channel = self.channel(endpoint, deadline).await?;
        let mut curator = CuratorClient::with_origin(channel, Channel::origin());
        let opening = curator.watch(WatchRequest { kind: Some(kind) });
        match tokio::time::timeout_at(deadline, opening).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(s)) => {
                self.forget(endpoint);
                Err(s)
            }
            Err(_) => {
                self.forget(endpoint);
                Err(Status::deadline_exceeded(format!("{endpoint}: no answer")))
            }
        }
    }

    /// The view's loop: (re)open, apply backlogs as differences, pass on
    /// changes.
    async fn follow(self, kind: Kind, tx: mpsc::UnboundedSender<NodeEvent>) {
        let single = matches!(kind, Kind::NodeInCluster(_));
        let mut held: BTreeMap<String, Node> = BTreeMap::new();
        let mut synced = false;
        loop {
            let endpoint = self.pick();
            let deadline = Instant::now() + self.config.call_timeout;
            let reason = match self.open_raw(&endpoint, kind.clone(), deadline).await {
                Err(s) => format!("{endpoint}: {}", s.message()),
                Ok(mut stream) => {
                    let mut backlog: Option<BTreeMap<String, Node>> = Some(BTreeMap::new());
                    // A silent stream while the nodes keep changing: its
                    // curator is paused or cut off.
                    let idle = self.config.call_timeout;
                    loop {
                        let event = match tokio::time::timeout(idle, stream.next()).await {
                            Err(_) => break format!("{endpoint}: silent for {idle:?}"),
                            Ok(None) => break format!("{endpoint}: the stream ended"),
                            Ok(Some(Err(s))) => {
                                break format!("{endpoint}: {:?}: {}", s.code(), s.message());
                            }
                            Ok(Some(Ok(e))) => e,
                        };
                        let last_backlog = single || event.progress != 0;
                        if let Some(b) = backlog.as_mut() {
                            for n in event.nodes {
                                b.insert(n.id.clone(), n);
                            }
                            for t in event.node_tombstones {
                                b.remove(&t.node_id);
                            }
                            if last_backlog {
                                let fresh = backlog.take().unwrap_or_default();
                                for (id, n) in &fresh {
                                    if held.get(id) != Some(n) {
                                        let _ = tx.send(NodeEvent::Changed(n.clone()));
                                    }
                                }
                                for id in held.keys() {
                                    if !fresh.contains_key(id) {
                                        let _ = tx.send(NodeEvent::Removed(id.clone()));
                                    }
                                }
                                held = fresh;
                                let _ = tx.send(if synced {
                                    NodeEvent::Resynced
                                } else {
                                    NodeEvent::Synced
                                });
                                synced = true;
                            }
                            continue;
                        }
                        for n in event.nodes {
                            if held.get(&n.id) != Some(&n) {
                                held.insert(n.id.clone(), n.clone());
                                let _ = tx.send(NodeEvent::Changed(n));
                            }
                        }
                        for t in event.node_tombstones {
                            if held.remove(&t.node_id).is_some() {
                                let _ = tx.send(NodeEvent::Removed(t.node_id));
                            }
                        }
                    }
                }
            };
            self.forget(&endpoint);
            if tx
                .send(NodeEvent::Reconnecting {
                    reason: reason.clone(),
                })
                .is_err()
            {
                return;
            }
            tokio::time::sleep(self.config.backoff).await;
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}
