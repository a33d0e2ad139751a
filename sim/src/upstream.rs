//! The simulated network at the HTTP/2-body boundary: a call, a client's
//! ([`crate::call`]) or a follower's forwarded one (its [`Upstream`] to
//! the leader), is handed encoded to the target node's real [`Router`], as
//! a task of that node, after a seeded delay. The target's crash drops the
//! call (the caller sees the connection reset); a node that is down
//! refuses connections; a cut [link](crate::links) carries nothing, and
//! the caller's call fails after [`LINK_TIMEOUT`]. A forwarded call
//! arrives marked as coming from a curator instance ([`CuratorPeer`]), as
//! mutual TLS would mark it, and carries a header of the simulated wire
//! ([`HOP_HEADER`]) by which the network sees a call forwarded a second
//! time ([`Routers::second_hops`]): the leader serves a forwarded call or
//! ends it, and never passes it on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::channel::{mpsc, oneshot};
use futures::future::BoxFuture;
use futures::{SinkExt, StreamExt};
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use metropolis_core::identity::NodeId as CuratorId;
use metropolis_core::ports::{MonotonicClock, Timer};
use metropolis_service::Router;
use metropolis_service::forward::{Connector, CuratorPeer, ForwardError, Upstream};
use tonic::body::Body;

use crate::links::{LINK_TIMEOUT, Links};
use crate::rng::splitmix64;
use crate::runtime::{NodeId, Runtime};

/// The router each simulated node serves, while it is up, and the links
/// between the nodes.
#[derive(Clone, Default)]
pub struct Routers {
    routers: Arc<Mutex<Vec<Option<Router>>>>,
    links: Links,
    /// Forwarded calls seen forwarded again.
    second_hops: Arc<AtomicU64>,
}

/// The header the simulated network puts on a forwarded call.
pub const HOP_HEADER: &str = "x-sim-forwarded";

impl Routers {
    /// The links calls cross.
    pub fn links(&self) -> &Links {
        &self.links
    }

    /// How many calls were forwarded by an instance that had them
    /// forwarded to it (0 expected).
    pub fn second_hops(&self) -> u64 {
        self.second_hops.load(Ordering::Relaxed)
    }

    /// `router` serves node `node` (`None`: the node is down).
    pub fn set(&self, node: NodeId, router: Option<Router>) {
        let mut routers = self.routers.lock().unwrap_or_else(|e| e.into_inner());
        if routers.len() <= node {
            routers.resize(node + 1, None);
        }
        routers[node] = router;
    }

    /// The router of `node`, if it is up.
    pub fn get(&self, node: NodeId) -> Option<Router> {
        let routers = self.routers.lock().unwrap_or_else(|e| e.into_inner());
        routers.get(node).cloned().flatten()
    }
}

/// The `host:port` a simulated curator advertises.
pub fn curator_address(node: NodeId) -> String {
    format!("curator-{node}:7835")
}

fn node_of(address: &str) -> Option<NodeId> {
    address
        .strip_prefix("curator-")?
        .strip_suffix(":7835")?
        .parse()
        .ok()
}

/// One node's way to its leaders.
pub struct SimConnector {
    runtime: Runtime,
    routers: Routers,
    /// The forwarding instance's node.
    node: NodeId,
    /// The forwarding instance's identity.
    from: CuratorId,
    seed: u64,
    max_delay: Duration,
    sent: Arc<AtomicU64>,
}

impl SimConnector {
    /// Forwards on behalf of curator `from` on node `node` to the routers
    /// in `routers`, each call delayed by up to `max_delay` (chosen by
    /// `seed` and the call's number).
    pub fn new(
        runtime: Runtime,
        routers: Routers,
        node: NodeId,
        from: CuratorId,
        seed: u64,
        max_delay: Duration,
    ) -> SimConnector {
        SimConnector {
            runtime,
            routers,
            node,
            from,
            seed,
            max_delay,
            sent: Arc::new(AtomicU64::new(0)),
        }
    }
}

impl Connector for SimConnector {
    fn connect(&self, _node_id: &str, address: &str) -> Arc<dyn Upstream> {
        Arc::new(SimUpstream {
            runtime: self.runtime.clone(),
            routers: self.routers.clone(),
            target: node_of(address),
            node: self.node,
            from: self.from.clone(),
            seed: self.seed,
            max_delay: self.max_delay,
            sent: self.sent.clone(),
        })
    }
}

struct SimUpstream {
    runtime: Runtime,
    routers: Routers,
    target: Option<NodeId>,
    node: NodeId,
    from: CuratorId,
    seed: u64,
    max_delay: Duration,
    sent: Arc<AtomicU64>,
}

impl Upstream for SimUpstream {
    fn send(
        &self,
        mut request: Request<Body>,
    ) -> BoxFuture<'static, Result<Response<Body>, ForwardError>> {
        let Some(target) = self.target else {
            return Box::pin(futures::future::ready(Err(ForwardError::Connect {
                reason: "no such curator".to_owned(),
            })));
        };
        request
            .extensions_mut()
            .insert(CuratorPeer(self.from.clone()));
        let hop = http::HeaderValue::from_static("1");
        if request.headers_mut().insert(HOP_HEADER, hop).is_some() {
            self.routers.second_hops.fetch_add(1, Ordering::Relaxed);
        }
        let mut n = self.seed ^ self.sent.fetch_add(1, Ordering::Relaxed);
        let max = u64::try_from(self.max_delay.as_micros()).unwrap_or(u64::MAX);
        let delay = Duration::from_micros(splitmix64(&mut n) % max.max(1));
        deliver(
            &self.runtime,
            &self.routers,
            self.node,
            target,
            request,
            delay,
        )
    }
}

/// Delivers `request` from node `from` to the router of node `target`
/// after `delay`, as a task of that node, which also carries the
/// response's body back frame by frame: a call is served by the process
/// it reached, so the node's crash ends the call (before the response:
/// the connection reset; in the body: the body fails, as a broken HTTP/2
/// stream does). A node that is down refuses the connection. Over a cut
/// link the request does not arrive, or its answer (or the rest of it)
/// does not come back: either way the call fails after [`LINK_TIMEOUT`],
/// and what the target did stands. A caller that drops the call (the
/// returned future, or the response's body) resets it, as HTTP/2's
/// `RST_STREAM` does: the target drops its handler or its response body
/// (a `Trace` stream's teardown runs then).
pub fn deliver(
    runtime: &Runtime,
    routers: &Routers,
    from: NodeId,
    target: NodeId,
    request: Request<Body>,
    delay: Duration,
) -> BoxFuture<'static, Result<Response<Body>, ForwardError>> {
    let links = routers.links().clone();
    if !links.up(from, target) {
        let caller = runtime.node(from);
        return Box::pin(async move {
            caller.sleep_until(caller.now() + LINK_TIMEOUT).await;
            Err(ForwardError::Connect {
                reason: "connection timed out".to_owned(),
            })
        });
    }
    let Some(router) = routers.get(target) else {
        return Box::pin(futures::future::ready(Err(ForwardError::Connect {
            reason: "connection refused".to_owned(),
        })));
    };
    let node = runtime.node(target);
    let (head_tx, head_rx) = oneshot::channel();
    let (mut frames_tx, frames_rx) = mpsc::channel::<Carried>(4);
    // Held by the caller's side; its drop is the reset.
    let (reset_tx, reset_rx) = oneshot::channel::<()>();
    let serving = node.clone();
    let serve = async move {
        // What the caller cannot receive: it gives up after the timeout
        // (dropping the channels then ends its call).
        let lost = || serving.sleep_until(serving.now() + LINK_TIMEOUT);
        serving.sleep_until(serving.now() + delay).await;
        let (parts, mut body) = router.call(request).await.into_parts();
        if !links.up(target, from) {
            return lost().await;
        }
        if head_tx.send(parts).is_err() {
            return;
        }
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else {
                // The server's body failed: the stream is reset.
                return;
            };
            if !links.up(target, from) {
                return lost().await;
            }
            if frames_tx.send(Carried::Frame(frame)).await.is_err() {
                return;
            }
        }
        let _ = frames_tx.send(Carried::End).await;
    };
    node.spawn(async move {
        // Whichever ends first: the call served, or the caller's reset
        // (which drops the handler or the body here and now).
        let _ = futures::future::select(Box::pin(serve), reset_rx).await;
    });
    Box::pin(async move {
        let parts = head_rx.await.map_err(|_| ForwardError::Broken {
            reason: "connection reset".to_owned(),
        })?;
        let state = (frames_rx, false, reset_tx);
        let frames = futures::stream::unfold(state, |(mut rx, ended, reset)| async move {
            if ended {
                return None;
            }
            match rx.next().await {
                Some(Carried::Frame(frame)) => Some((Ok(frame), (rx, false, reset))),
                Some(Carried::End) => None,
                None => Some((
                    Err(tonic::Status::unavailable(
                        "simulated: the connection broke",
                    )),
                    (rx, true, reset),
                )),
            }
        });
        Ok(Response::from_parts(
            parts,
            Body::new(StreamBody::new(frames)),
        ))
    })
}

/// What the serving node's task carries back of a response body.
enum Carried {
    Frame(Frame<Bytes>),
    /// The body ended (after its trailers).
    End,
}
