//! The Curator service on HTTP/2, routed by hand.
//!
//! `UpdateNodeStatus` is served by the lean [unary](super::unary) path.
//! `Watch` does not go through tonic's streaming encoder: that encoder keeps one growing
//! buffer per stream, so every idle stream would hold an allocation as
//! large as the largest event it ever sent (its backlog). [`WatchBody`]
//! instead sends each encoded event as it comes from the watch cache,
//! behind its own 5-byte gRPC message prefix: the bytes of a backlog are
//! the cache's, shared by every stream that opened at that revision, and
//! nothing is copied per stream; an idle stream holds nothing but its
//! watch machine.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use futures::future::BoxFuture;
use futures::{StreamExt, TryFutureExt};
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Frame;
use metropolis_proto::prelude::curator;
use tonic::Status;
use tonic::body::Body;
use tonic::codec::{Codec, Streaming};
use tonic::server::NamedService;

use super::forward::LeaderTerm;
use super::router::GrpcService;
use super::unary::{self, MAX_REQUEST_BYTES};
use metropolis_core::identity::Identity;
use tonic_prost::ProstCodec;

use super::curator::{CuratorService, WatchTarget};
use super::watch_cache::WatchStream;

const SERVICE: &str = "metropolis.node.core.curator.proto.api.Curator";

/// The Curator service as an HTTP/2 handler for the
/// [`Router`](super::Router).
#[derive(Clone)]
pub struct CuratorHttp {
    service: CuratorService,
}

impl CuratorHttp {
    /// The handler of `service`.
    pub fn new(service: CuratorService) -> Self {
        CuratorHttp { service }
    }
}

impl NamedService for CuratorHttp {
    const NAME: &'static str = SERVICE;
}

impl GrpcService for CuratorHttp {
    fn call(&self, request: Request<Body>) -> BoxFuture<'static, Response<Body>> {
        // Each method's future is boxed on its own: the box of a small
        // unary call does not take the size of the largest method's state.
        match super::router::method_name(&request) {
            "Watch" => Box::pin(watch(self.service.clone(), request)),
            "UpdateNodeStatus" => {
                let service = self.service.clone();
                Box::pin(unary::serve(
                    request,
                    move |caller, request: curator::UpdateNodeStatusRequest| {
                        service
                            .update_node_status(&caller, request)
                            .map_ok(|()| curator::UpdateNodeStatusResponse {})
                    },
                ))
            }
            other => super::router::no_such_method(SERVICE, other),
        }
    }
}

async fn watch(service: CuratorService, request: Request<Body>) -> Response<Body> {
    let caller = request
        .extensions()
        .get::<Identity>()
        .cloned()
        .unwrap_or(Identity::Unauthenticated);
    let term = request
        .extensions()
        .get::<LeaderTerm>()
        .copied()
        .unwrap_or(LeaderTerm::FIXED);
    let body = request.into_body();
    let mut codec = ProstCodec::<curator::WatchEvent, curator::WatchRequest>::default();
    let mut messages = Streaming::new_request(codec.decoder(), body, None, Some(MAX_REQUEST_BYTES));
    let request = match messages.message().await {
        Ok(Some(request)) => request,
        Ok(None) => return Status::invalid_argument("no WatchRequest in the call").into_http(),
        Err(status) => return status.into_http(),
    };
    let target = match WatchTarget::from_request(request) {
        Ok(target) => target,
        Err(status) => return status.into_http(),
    };
    // Under an elected leader, the read is confirmed first (see
    // `confirm_leadership`).
    if term != LeaderTerm::FIXED
        && let Err(status) = service.confirm_leadership().await
    {
        return status.into_http();
    }
    let stream = service.open_watch(&caller, term, target);
    let mut response = Response::new(Body::new(WatchBody {
        stream: Some(stream),
        message: None,
        finished: false,
    }));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    response
}

/// The response body of one `Watch` call: one length-prefixed gRPC message
/// per event, then the status trailers.
pub struct WatchBody {
    stream: Option<WatchStream>,
    /// The message whose prefix went out last, to follow it.
    message: Option<Bytes>,
    finished: bool,
}

/// The largest message copied behind its prefix into one buffer; a larger
/// one (a backlog chunk, shared with other streams) follows its prefix as
/// a body chunk of its own.
const COPY_BELOW: usize = 16 * 1024;

/// A gRPC message prefix (uncompressed flag, length) for `message`, and
/// the message itself when small enough to share the prefix's buffer.
fn prefix(message: &Bytes) -> (Bytes, Option<Bytes>) {
    let small = message.len() < COPY_BELOW;
    let mut buf = BytesMut::with_capacity(5 + if small { message.len() } else { 0 });
    buf.put_u8(0);
    // Events are bounded by MAX_EVENT_BYTES (2 MiB), far below u32::MAX.
    buf.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    if small {
        buf.put_slice(message);
        (buf.freeze(), None)
    } else {
        (buf.freeze(), Some(message.clone()))
    }
}

fn trailers(status: &Status) -> HeaderMap {
    let mut map = HeaderMap::new();
    if status.add_header(&mut map).is_err() {
        map.clear();
        map.insert("grpc-status", HeaderValue::from(status.code() as i32));
    }
    map
}

impl http_body::Body for WatchBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if let Some(message) = this.message.take() {
            return Poll::Ready(Some(Ok(Frame::data(message))));
        }
        let Some(stream) = this.stream.as_mut() else {
            return Poll::Ready(None);
        };
        let end = match stream.poll_next_unpin(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Some(Ok(event))) => {
                let (head, rest) = prefix(&event);
                this.message = rest;
                return Poll::Ready(Some(Ok(Frame::data(head))));
            }
            Poll::Ready(Some(Err(status))) => status,
            Poll::Ready(None) => Status::ok(""),
        };
        this.stream = None;
        this.finished = true;
        Poll::Ready(Some(Ok(Frame::trailers(trailers(&end)))))
    }

    fn is_end_stream(&self) -> bool {
        self.finished && self.stream.is_none() && self.message.is_none()
    }
}
