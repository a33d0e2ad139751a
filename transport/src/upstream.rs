//! A follower's connection to the leader: dialled on first use, shared by
//! every forwarded call, dialled again after it failed.

use std::sync::Arc;

use futures::future::BoxFuture;
use http::{Request, Response};
use metropolis_service::forward::{Connector, ForwardError, Upstream};
use tonic::body::Body;

use crate::connect::ConnectError;
use crate::grpc::Channel;

/// Opens a connection to the leader (node ID, address `host:port`): the
/// runtime's mutual-TLS client with this node's credentials, checking the
/// leader's certificate.
pub type Dial =
    Arc<dyn Fn(String, String) -> BoxFuture<'static, Result<Channel, ConnectError>> + Send + Sync>;

/// The [`Connector`] of a daemon: upstreams that dial with `dial`.
#[derive(Clone)]
pub struct LeaderConnector {
    dial: Dial,
}

impl LeaderConnector {
    /// Upstreams dialled with `dial`.
    pub fn new(dial: Dial) -> LeaderConnector {
        LeaderConnector { dial }
    }
}

impl Connector for LeaderConnector {
    fn connect(&self, node_id: &str, address: &str) -> Arc<dyn Upstream> {
        tracing::info!(
            leader = node_id,
            address,
            "forwarding calls to the curator leader"
        );
        Arc::new(LazyUpstream {
            node_id: node_id.to_owned(),
            address: address.to_owned(),
            dial: self.dial.clone(),
            channel: Arc::new(futures::lock::Mutex::new(None)),
        })
    }
}

/// One HTTP/2 connection to the leader, opened by the first call.
struct LazyUpstream {
    node_id: String,
    address: String,
    dial: Dial,
    channel: Arc<futures::lock::Mutex<Option<Channel>>>,
}

impl Upstream for LazyUpstream {
    fn send(
        &self,
        request: Request<Body>,
    ) -> BoxFuture<'static, Result<Response<Body>, ForwardError>> {
        let slot = self.channel.clone();
        let dial = self.dial.clone();
        let address = self.address.clone();
        let node_id = self.node_id.clone();
        Box::pin(async move {
            let channel = {
                // Held while dialling: concurrent first calls share one
                // connection.
                let mut slot = slot.lock().await;
                match &*slot {
                    Some(channel) => channel.clone(),
                    None => {
                        let channel =
                            dial(node_id.clone(), address.clone()).await.map_err(|e| {
                                ForwardError::Connect {
                                    reason: e.to_string(),
                                }
                            })?;
                        *slot = Some(channel.clone());
                        channel
                    }
                }
            };
            let sent = channel.send(request).await;
            if sent.is_err() {
                // The connection broke: the next call dials again.
                *slot.lock().await = None;
            }
            sent
        })
    }
}
