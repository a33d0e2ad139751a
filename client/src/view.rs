//! [`NodeView`]: a `Watch(NodesInCluster)` that re-opens after any
//! failure and hands out only real changes.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use futures::future::{Either, select};
use metropolis_proto::prelude::curator;
use tonic::client::Grpc;

use crate::client::Inner;
use crate::connection::origin;
use crate::diff::{Applied, ViewState};
use crate::error::{AttemptError, ViewError};
use crate::retry::{Schedule, ends_view};
use crate::unary::{from_status, transport_failure};

const WATCH: &str = "/metropolis.node.core.curator.proto.api.Curator/Watch";

/// What a [`NodeView`] hands out.
// `Changed` holds the node itself, not a box: events are handed out one
// at a time, and the node is what the program takes from them.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum NodeEvent {
    /// The first complete view: every node that existed when the first
    /// stream started was handed out (as [`Changed`](Self::Changed))
    /// before this. Once per view.
    Synced,
    /// A node was created or its state changed: its new state, never one
    /// equal to the state handed out before it, never an older one.
    Changed(curator::Node),
    /// A node was deleted (a tombstone, or absent from the backlog of a
    /// stream opened after a reconnect): its ID. Only for a node handed
    /// out before and not removed since.
    Removed(String),
    /// The stream broke or could not be opened; the view reconnects (after
    /// a wait, to the next endpoint if this one failed). Nothing is handed
    /// out until the new stream's backlog is complete.
    Reconnecting {
        /// What failed, for people: the endpoint and the error.
        reason: String,
    },
    /// After a reconnect, a new stream's backlog was applied: the changes
    /// and removals of the time away were handed out before this.
    Resynced,
}

/// A view of the cluster's nodes, or of one node, that rides through
/// curator failover: a `futures::Stream` of [`NodeEvent`]s.
///
/// It opens `Watch(NodesInCluster)` on the client's current endpoint;
/// after any failure (Unavailable such as "curator backend switched", a
/// broken or lost connection, a stream that ends, no complete backlog
/// within the client's `call_timeout`) it hands out
/// [`NodeEvent::Reconnecting`] and opens a new stream, on the next
/// endpoint if this one failed, after a wait from the client's
/// [`Backoff`](crate::Backoff) (jittered), for as long as the view is
/// polled. Only refusals no reconnect can change (PermissionDenied,
/// Unauthenticated, InvalidArgument, Unimplemented, ...) end it, with
/// one `Err` and then the end of the stream.
///
/// It keeps the last state it handed out of each node. A new stream's
/// backlog is buffered until its `PROGRESS_LAST_BACKLOGGED` marker and
/// applied as a difference: [`NodeEvent::Changed`] for nodes whose state
/// differs from the one held, [`NodeEvent::Removed`] for held nodes
/// absent from it (deleted while the view was away), nothing for the
/// others; then [`NodeEvent::Synced`] the first time, [`NodeEvent::Resynced`]
/// after. Updates pass on in the order the server sent them, a state
/// equal to the one held left out. Why no state older than one handed
/// out is handed out after it: `diff` module documentation ("older" is
/// the store's revision order; the guard is the backlog's snapshot being
/// taken after the reconnect).
///
/// A view of one node ([`Client::watch_node`](crate::Client::watch_node))
/// watches `NodesInCluster` too, keeping that node's states only:
/// `NodeInCluster` streams carry no backlog marker and send nothing for a
/// node absent when they open (nor for one re-created after its
/// tombstone), so after a reconnect they cannot tell "deleted while away"
/// from "not sent yet". The cost is that every node's changes cross the
/// connection.
///
/// Nothing runs while the view is not polled (no task is spawned); a
/// slow reader's changes are coalesced by the server. Dropping the view
/// closes its stream.
pub struct NodeView {
    inner: Pin<Box<dyn Stream<Item = Result<NodeEvent, ViewError>> + Send>>,
}

impl NodeView {
    pub(crate) fn new(client: Arc<Inner>, only: Option<String>) -> NodeView {
        let driver = Driver {
            schedule: client.schedule(),
            client,
            state: ViewState::new(only),
            queue: VecDeque::new(),
            stream: None,
            wait: Duration::ZERO,
            finished: false,
        };
        let stream = futures::stream::unfold(driver, |mut driver| async move {
            let item = driver.next().await?;
            Some((item, driver))
        });
        NodeView {
            inner: Box::pin(stream),
        }
    }
}

impl Stream for NodeView {
    type Item = Result<NodeEvent, ViewError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl std::fmt::Debug for NodeView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeView").finish_non_exhaustive()
    }
}

/// The open stream: where it goes, and until when its backlog may take.
struct Open {
    index: usize,
    generation: u64,
    events: tonic::Streaming<curator::WatchEvent>,
    /// Set until the backlog is complete.
    backlog_deadline: Option<Pin<Box<dyn hyper::rt::Sleep>>>,
}

struct Driver {
    client: Arc<Inner>,
    schedule: Schedule,
    state: ViewState,
    queue: VecDeque<Result<NodeEvent, ViewError>>,
    stream: Option<Open>,
    /// The wait before the next opening.
    wait: Duration,
    finished: bool,
}

impl Driver {
    /// The next event to hand out; `None` once the view ended.
    async fn next(&mut self) -> Option<Result<NodeEvent, ViewError>> {
        loop {
            if let Some(item) = self.queue.pop_front() {
                return Some(item);
            }
            if self.finished {
                return None;
            }
            match self.stream.as_mut() {
                None => self.open().await,
                Some(open) => {
                    let received = match open.backlog_deadline.as_mut() {
                        None => Some(open.events.message().await),
                        Some(deadline) => {
                            match select(Box::pin(open.events.message()), deadline).await {
                                Either::Left((received, _)) => Some(received),
                                Either::Right(((), _)) => None,
                            }
                        }
                    };
                    let endpoint = self.client.endpoints.name(open.index).to_string();
                    match received {
                        Some(Ok(Some(event))) => self.take(event),
                        Some(Ok(None)) => self.fail(AttemptError::Broken {
                            endpoint,
                            reason: "the stream ended without a status".into(),
                            sent: true,
                        }),
                        Some(Err(status)) => self.fail(from_status(&endpoint, status)),
                        None => self.fail(AttemptError::TimedOut {
                            endpoint,
                            after: self.client.call_timeout,
                        }),
                    }
                }
            }
        }
    }

    /// Opens a stream on the current endpoint (after the wait due).
    async fn open(&mut self) {
        let timer = self.client.runtime.timer();
        if !self.wait.is_zero() {
            timer.sleep(std::mem::take(&mut self.wait)).await;
        }
        let index = self.client.endpoints.current();
        let budget = self.client.call_timeout;
        let mut generation = None;
        let opening = Box::pin(open_stream(&self.client, index, &mut generation));
        let opened = match select(opening, timer.sleep(budget)).await {
            Either::Left((opened, _)) => opened,
            Either::Right(((), _)) => Err(AttemptError::TimedOut {
                endpoint: self.client.endpoints.name(index).to_string(),
                after: budget,
            }),
        };
        match opened {
            Ok((generation, events)) => {
                self.state.opened();
                // The backlog gets a `call_timeout` of its own.
                self.stream = Some(Open {
                    index,
                    generation,
                    events,
                    backlog_deadline: Some(timer.sleep(budget)),
                });
            }
            Err(failure) => {
                self.client.endpoints.failed(index, generation, &failure);
                self.reconnect(failure);
            }
        }
    }

    /// Takes one event of the open stream.
    fn take(&mut self, event: curator::WatchEvent) {
        let mut out = Vec::new();
        let applied = self.state.handle(event, &mut out);
        if applied == Applied::BacklogDone
            && let Some(open) = self.stream.as_mut()
        {
            open.backlog_deadline = None;
            self.client.endpoints.answered(open.index);
            self.schedule.reset();
        }
        self.queue.extend(out.into_iter().map(Ok));
    }

    /// The open stream failed with `failure`.
    fn fail(&mut self, failure: AttemptError) {
        if let Some(open) = self.stream.take() {
            self.client
                .endpoints
                .failed(open.index, Some(open.generation), &failure);
        }
        self.reconnect(failure);
    }

    /// Ends the view for a refusal, or reconnects after a wait.
    fn reconnect(&mut self, failure: AttemptError) {
        self.stream = None;
        self.state.closed();
        if ends_view(&failure) {
            self.finished = true;
            if let AttemptError::Status {
                endpoint,
                code,
                message,
            } = failure
            {
                self.queue.push_back(Err(ViewError::Rejected {
                    endpoint,
                    code,
                    message,
                }));
            }
            return;
        }
        self.wait = self.schedule.after(&failure);
        self.queue.push_back(Ok(NodeEvent::Reconnecting {
            reason: failure.to_string(),
        }));
    }
}

/// Opens `Watch(NodesInCluster)` on endpoint `index`: the connection's
/// generation and the stream.
async fn open_stream(
    client: &Inner,
    index: usize,
    generation: &mut Option<u64>,
) -> Result<(u64, tonic::Streaming<curator::WatchEvent>), AttemptError> {
    let endpoint = client.endpoints.name(index).to_string();
    let leased = client.endpoints.connect(index).await?;
    *generation = Some(leased.generation);
    let mut grpc = Grpc::with_origin(leased.connection, origin());
    grpc.ready()
        .await
        .map_err(|e| transport_failure(&endpoint, &e))?;
    let request = curator::WatchRequest {
        kind: Some(curator::watch_request::Kind::NodesInCluster(
            curator::watch_request::NodesInCluster::default(),
        )),
    };
    let codec = tonic_prost::ProstCodec::<curator::WatchRequest, curator::WatchEvent>::default();
    let path = http::uri::PathAndQuery::from_static(WATCH);
    match grpc
        .server_streaming(tonic::Request::new(request), path, codec)
        .await
    {
        Ok(response) => Ok((leased.generation, response.into_inner())),
        Err(status) => Err(from_status(&endpoint, status)),
    }
}
