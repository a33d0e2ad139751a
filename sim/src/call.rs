//! A simulated client's unary gRPC call into a node's real router: the
//! request encoded and framed as on the wire, the caller's identity as
//! the listener would have established it, delivered as a task of that
//! node ([`deliver`]: its crash resets the call), the answer's status read
//! from the headers (trailers-only) or the trailers. A call that could not
//! reach the node, or whose connection broke, ends Unavailable, as a
//! client's transport reports it.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::Request;
use http_body_util::BodyExt;
use metropolis_core::identity::Identity;
use tonic::body::Body;

use crate::runtime::{NodeId, Runtime};
use crate::upstream::{Routers, deliver};

/// How a call ended: its response message, or the status code.
pub type CallResult = Result<Bytes, tonic::Code>;

/// Calls `path` on node `target` (its router in `routers`) as `identity`
/// with the encoded `message`.
pub async fn unary(
    runtime: &Runtime,
    routers: &Routers,
    target: NodeId,
    path: &str,
    identity: Identity,
    message: Vec<u8>,
) -> CallResult {
    let mut frame = BytesMut::with_capacity(5 + message.len());
    frame.put_u8(0);
    frame.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    frame.put_slice(&message);
    let Ok(mut request) = Request::builder()
        .uri(format!("http://curator{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Body::new(http_body_util::Full::new(frame.freeze())))
    else {
        return Err(tonic::Code::Internal);
    };
    request.extensions_mut().insert(identity);
    let Ok(response) = deliver(runtime, routers, target, request, Duration::ZERO).await else {
        return Err(tonic::Code::Unavailable);
    };
    let (parts, body) = response.into_parts();
    if let Some(code) = code(&parts.headers)
        && code != tonic::Code::Ok
    {
        return Err(code);
    }
    let Ok(collected) = body.collect().await else {
        return Err(tonic::Code::Unavailable);
    };
    let trailers = collected.trailers().cloned();
    let data = collected.to_bytes();
    match trailers
        .as_ref()
        .and_then(code)
        .or_else(|| code(&parts.headers))
    {
        Some(tonic::Code::Ok) if data.len() >= 5 => Ok(data.slice(5..)),
        Some(tonic::Code::Ok) | None => Err(tonic::Code::Internal),
        Some(code) => Err(code),
    }
}

fn code(headers: &http::HeaderMap) -> Option<tonic::Code> {
    let value = headers.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    Some(tonic::Code::from_i32(value))
}
