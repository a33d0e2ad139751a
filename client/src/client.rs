//! The client: its configuration, and the calls and views it offers.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use metropolis_core::identity::NodeId;
use metropolis_proto::prelude::{agent, curator};
use metropolis_proto::wire::EncodedHeartbeatResponse;
use metropolis_transport::runtime::SharedRuntime;

use crate::endpoints::Endpoints;
use crate::error::{CallError, ClientError};
use crate::retry::{Backoff, Resend, Schedule};
use crate::unary::call;
use crate::view::NodeView;

const UPDATE_NODE_STATUS: &str = "/metropolis.node.core.curator.proto.api.Curator/UpdateNodeStatus";
const HEARTBEAT: &str = "/cloud.bmaas.server.api.AgentCallback/Heartbeat";

/// How a [`Client`] reaches curators.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The curators: `host:port` of their TLS listeners (the Curator port,
    /// or the AgentCallback port for [`Client::heartbeat`]), or
    /// `unix:PATH` of a daemon's local socket. Tried in order after a
    /// failure; at least one.
    pub endpoints: Vec<String>,
    /// The TLS client configuration, with the credential the calls are
    /// made with (`metropolis_pki::client_config` for an owner or a node,
    /// `metropolis_pki::curator_client_config` for an agent). Needed for
    /// `host:port` endpoints; a local socket needs none.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// The longest one attempt may take (connecting included); a call's
    /// own deadline bounds it further. Also bounds opening a watch and
    /// receiving its backlog, and is the HTTP/2 keepalive: a connection
    /// is pinged this often and closed when a ping is not answered within
    /// as long again, so an open watch notices a curator that stopped or
    /// was cut off within twice this.
    pub call_timeout: Duration,
    /// The waits between attempts.
    pub backoff: Backoff,
}

impl ClientConfig {
    /// `endpoints` reached with `tls`; a 10 s `call_timeout` and the
    /// default [`Backoff`] (100 ms doubling to 5 s).
    pub fn new(endpoints: Vec<String>, tls: Option<Arc<rustls::ClientConfig>>) -> ClientConfig {
        ClientConfig {
            endpoints,
            tls,
            call_timeout: Duration::from_secs(10),
            backoff: Backoff::default(),
        }
    }
}

/// A client of curators. Cheap to clone: clones share the endpoints,
/// their connections (one HTTP/2 connection per endpoint, made when first
/// needed and again after it failed) and which endpoint answered last.
///
/// Runtime-agnostic: it runs on the [`SharedRuntime`] it is given
/// (`metropolis_runtime_tokio::rt::TokioRuntime::shared()`,
/// `metropolis_runtime_smol::rt::SmolRuntime::global().shared()`), which
/// dials, runs the connections and times the waits.
///
/// ```no_run
/// # async fn example(runtime: metropolis_transport::runtime::SharedRuntime,
/// #     tls: std::sync::Arc<rustls::ClientConfig>) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use futures::StreamExt;
/// use metropolis_client::{Client, ClientConfig, NodeEvent};
/// use metropolis_proto::prelude::{common, curator};
///
/// let endpoints = vec!["10.0.0.1:7835".to_string(), "10.0.0.2:7835".to_string()];
/// let client = Client::new(runtime, ClientConfig::new(endpoints, Some(tls)))?;
///
/// // A write that rides through a leader failover (within 10 s).
/// let request = curator::UpdateNodeStatusRequest {
///     node_id: "metropolis-00112233445566778899aabbccddeeff".into(),
///     status: Some(common::NodeStatus {
///         external_address: "10.0.0.9".into(),
///         ..Default::default()
///     }),
/// };
/// client.update_node_status(request, Duration::from_secs(10)).await?;
///
/// // Every node, then every real change, across reconnects.
/// let mut view = client.watch_nodes();
/// while let Some(event) = view.next().await {
///     match event? {
///         NodeEvent::Changed(node) => println!("node {}", node.id),
///         NodeEvent::Removed(id) => println!("removed {id}"),
///         NodeEvent::Synced => println!("-- that was everything; changes follow"),
///         NodeEvent::Reconnecting { reason } => eprintln!("reconnecting: {reason}"),
///         NodeEvent::Resynced => eprintln!("reconnected"),
///         _ => {}
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

/// What the clones of a client share.
pub(crate) struct Inner {
    pub(crate) runtime: SharedRuntime,
    pub(crate) endpoints: Endpoints,
    pub(crate) call_timeout: Duration,
    backoff: Backoff,
    /// The next jitter stream to hand out.
    streams: AtomicU64,
}

impl Inner {
    /// A fresh wait schedule, with a jitter stream of its own.
    pub(crate) fn schedule(&self) -> Schedule {
        let stream = self.streams.fetch_add(1, Ordering::Relaxed);
        Schedule::new(self.backoff, self.endpoints.len(), stream)
    }
}

impl Client {
    /// A client of the curators `config` names, on `runtime`. Checks the
    /// endpoints; connects only when a call or view needs it.
    pub fn new(runtime: SharedRuntime, config: ClientConfig) -> Result<Client, ClientError> {
        let call_timeout = config.call_timeout.max(Duration::from_millis(10));
        let endpoints = Endpoints::new(
            &config.endpoints,
            runtime.clone(),
            config.tls,
            Some(call_timeout),
        )?;
        Ok(Client {
            inner: Arc::new(Inner {
                runtime,
                endpoints,
                call_timeout,
                backoff: config.backoff,
                streams: AtomicU64::new(0),
            }),
        })
    }

    /// `Curator.UpdateNodeStatus`: finds a curator that answers, rotating
    /// through the endpoints, and retries within `deadline` what the
    /// curators answered without applying it: Unavailable (the spec's
    /// "curator backend switched, request can be retried", no leader yet,
    /// lost leadership, shutting down), Aborted (too many concurrent
    /// modifications), and a connection that could not be made or broke
    /// before the request was sent. Any other status is returned at once
    /// ([`CallError::Rejected`]); past the deadline, the last failure
    /// ([`CallError::DeadlineExceeded`]).
    ///
    /// **Never sent twice once it may have arrived.** An attempt that
    /// timed out, or whose connection broke after the request was sent,
    /// ends the call with [`CallError::OutcomeUnknown`]: the status may
    /// have been written, or may be later, and the caller decides what to
    /// do (typically: send its next status). Resending it would be unsafe
    /// even though the call overwrites every field: a curator that was
    /// paused (SIGSTOP, a stalled VM) with the first copy in its socket
    /// buffer forwards it when it runs again, and that copy would then
    /// land after the node's later statuses, undoing them. The fault
    /// campaign (docs/chaos.md) found exactly this.
    pub async fn update_node_status(
        &self,
        request: curator::UpdateNodeStatusRequest,
        deadline: Duration,
    ) -> Result<(), CallError> {
        call::<_, curator::UpdateNodeStatusResponse>(
            &self.inner,
            UPDATE_NODE_STATUS,
            request,
            deadline,
            Resend::Unsent,
        )
        .await
        .map(|_| ())
    }

    /// `AgentCallback.Heartbeat`, for a client whose endpoints are
    /// AgentCallback listeners: the same rotation and retries as
    /// [`update_node_status`](Self::update_node_status), within
    /// `deadline`. A heartbeat is safe to repeat (it records liveness and
    /// stores reports, last one wins).
    pub async fn heartbeat(
        &self,
        request: agent::HeartbeatRequest,
        deadline: Duration,
    ) -> Result<agent::HeartbeatResponse, CallError> {
        call(&self.inner, HEARTBEAT, request, deadline, Resend::Always).await
    }

    /// [`heartbeat`](Self::heartbeat), the offered installation request
    /// kept as the bytes the server sent (what an agent acts on: the
    /// request is stored and returned byte-for-byte, fields this build
    /// does not know included).
    pub async fn heartbeat_encoded(
        &self,
        request: agent::HeartbeatRequest,
        deadline: Duration,
    ) -> Result<EncodedHeartbeatResponse, CallError> {
        call(&self.inner, HEARTBEAT, request, deadline, Resend::Always).await
    }

    /// A view of every node (`Watch` with `NodesInCluster`): see
    /// [`NodeView`].
    pub fn watch_nodes(&self) -> NodeView {
        NodeView::new(self.inner.clone(), None)
    }

    /// A view of node `id` alone: its states, [`Removed`] when it is
    /// deleted, its state again if it is re-created. See [`NodeView`] for
    /// how it is watched.
    ///
    /// [`Removed`]: crate::NodeEvent::Removed
    pub fn watch_node(&self, id: NodeId) -> NodeView {
        NodeView::new(self.inner.clone(), Some(id.to_string()))
    }

    /// The endpoints, as given.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.inner.endpoints.len())
            .map(|i| self.inner.endpoints.name(i).to_string())
            .collect()
    }

    /// Lets go of the cached connections (of this client and its
    /// clones): each closes on the runtime once no call or watch uses it
    /// any more. A later call dials again. For a program about to end
    /// without exiting, such as an agent about to reboot the machine, so
    /// that its curators see the connections end instead of waiting for
    /// their keepalive.
    pub fn close(&self) {
        self.inner.endpoints.forget_all();
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("endpoints", &self.endpoints())
            .finish_non_exhaustive()
    }
}
