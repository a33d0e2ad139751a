//! The Curator service on HTTP/2, routed by hand.
//!
//! `UpdateNodeStatus` goes through tonic's unary machinery. `Watch` does
//! not go through tonic's streaming encoder: that encoder keeps one growing
//! buffer per stream, so every idle stream would hold an allocation as
//! large as the largest event it ever sent (its backlog). [`WatchBody`]
//! instead frames each event into a buffer of exactly its size, which is
//! freed once HTTP/2 has sent it: an idle stream holds nothing but its
//! watch machine.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt;
use futures::future::BoxFuture;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Frame;
use metropolis_proto::prelude::curator;
use prost::Message;
use tonic::Status;
use tonic::body::Body;
use tonic::codec::{Codec, Streaming};
use tonic::server::{Grpc, NamedService, UnaryService};

use super::router::GrpcService;
use tonic_prost::ProstCodec;

use super::curator::CuratorService;
use super::watch_cache::WatchStream;
use crate::identity::Identity;

const SERVICE: &str = "metropolis.node.core.curator.proto.api.Curator";

/// Largest request message accepted (tonic's default).
const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;

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
        let service = self.service.clone();
        let method = super::router::method_name(&request);
        Box::pin(async move {
            match method.as_str() {
                "Watch" => watch(service, request).await,
                "UpdateNodeStatus" => {
                    let codec = super::unary_codec::UnaryCodec::<
                        curator::UpdateNodeStatusResponse,
                        curator::UpdateNodeStatusRequest,
                    >::default();
                    Grpc::new(codec)
                        .unary(UpdateNodeStatus(service), request)
                        .await
                }
                other => {
                    Status::unimplemented(format!("{SERVICE} has no method {other}")).into_http()
                }
            }
        })
    }
}

struct UpdateNodeStatus(CuratorService);

impl UnaryService<curator::UpdateNodeStatusRequest> for UpdateNodeStatus {
    type Response = curator::UpdateNodeStatusResponse;
    type Future = BoxFuture<'static, Result<tonic::Response<Self::Response>, Status>>;

    fn call(&mut self, request: tonic::Request<curator::UpdateNodeStatusRequest>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move {
            let caller = request
                .extensions()
                .get::<Identity>()
                .cloned()
                .unwrap_or(Identity::Unauthenticated);
            service
                .update_node_status(&caller, request.into_inner())
                .await?;
            Ok(tonic::Response::new(curator::UpdateNodeStatusResponse {}))
        })
    }
}

async fn watch(service: CuratorService, request: Request<Body>) -> Response<Body> {
    let body = request.into_body();
    let mut codec = ProstCodec::<curator::WatchEvent, curator::WatchRequest>::default();
    let mut messages = Streaming::new_request(codec.decoder(), body, None, Some(MAX_REQUEST_BYTES));
    let request = match messages.message().await {
        Ok(Some(request)) => request,
        Ok(None) => return Status::invalid_argument("no WatchRequest in the call").into_http(),
        Err(status) => return status.into_http(),
    };
    match service.open_watch(request) {
        Ok(stream) => {
            let mut response = Response::new(Body::new(WatchBody {
                stream: Some(stream),
                finished: false,
            }));
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/grpc"),
            );
            response
        }
        Err(status) => status.into_http(),
    }
}

/// The response body of one `Watch` call: one length-prefixed gRPC message
/// per event, then the status trailers.
pub struct WatchBody {
    stream: Option<WatchStream>,
    finished: bool,
}

/// One gRPC message frame (uncompressed flag, length, message) in a buffer
/// of exactly its size.
fn frame(event: &metropolis_proto::wire::EncodedWatchEvent) -> Bytes {
    let len = event.encoded_len();
    let mut buf = BytesMut::with_capacity(5 + len);
    buf.put_u8(0);
    // Events are bounded by MAX_EVENT_BYTES (2 MiB), far below u32::MAX.
    buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    event.encode_raw(&mut buf);
    buf.freeze()
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
        let Some(stream) = this.stream.as_mut() else {
            return Poll::Ready(None);
        };
        let end = match stream.poll_next_unpin(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Some(Ok(event))) => {
                return Poll::Ready(Some(Ok(Frame::data(frame(&event)))));
            }
            Poll::Ready(Some(Err(status))) => status,
            Poll::Ready(None) => Status::ok(""),
        };
        this.stream = None;
        this.finished = true;
        Poll::Ready(Some(Ok(Frame::trailers(trailers(&end)))))
    }

    fn is_end_stream(&self) -> bool {
        self.finished && self.stream.is_none()
    }
}
