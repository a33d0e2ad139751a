//! A simulated client's unary gRPC call into a node's real router: the
//! request encoded and framed as on the wire, the caller's identity as
//! the listener would have established it, delivered as a task of that
//! node ([`deliver`]: its crash resets the call), the answer's status read
//! from the headers (trailers-only) or the trailers. A call that could not
//! reach the node, or whose connection broke, ends Unavailable, as a
//! client's transport reports it.

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::StreamExt;
use http::Request;
use http_body_util::BodyExt;
use metropolis_core::identity::Identity;
use tonic::body::Body;

use crate::runtime::{NodeId, Runtime};
use crate::upstream::{Routers, deliver};

/// The most a client's request takes to reach its target.
pub const CLIENT_LATENCY: Duration = Duration::from_millis(3);

/// How a call ended: its response message, or the status code.
pub type CallResult = Result<Bytes, tonic::Code>;

/// Calls `path` from node `from` on node `target` (its router in
/// `routers`) as `identity` with the encoded `message`.
pub async fn unary(
    runtime: &Runtime,
    routers: &Routers,
    from: NodeId,
    target: NodeId,
    path: &str,
    identity: Identity,
    message: Vec<u8>,
) -> CallResult {
    // A unary call is a stream of exactly one message.
    let mut messages =
        server_stream(runtime, routers, from, target, path, identity, message).await?;
    match (messages.next().await, messages.next().await) {
        (Some(Ok(message)), None) => Ok(message),
        (Some(Err(code)), _) | (Some(Ok(_)), Some(Err(code))) => Err(code),
        _ => Err(tonic::Code::Internal),
    }
}

fn code(headers: &http::HeaderMap) -> Option<tonic::Code> {
    let value = headers.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    Some(tonic::Code::from_i32(value))
}

/// The messages of a server-streaming call, each `Ok`, then at most one
/// `Err` with the status code it ended with (nothing after a clean end).
pub type Messages = futures::stream::BoxStream<'static, Result<Bytes, tonic::Code>>;

/// Opens the server-streaming call `path` from node `from` on node
/// `target` as `identity` with the encoded `message`: its messages, or
/// the code it was refused with at once.
pub async fn server_stream(
    runtime: &Runtime,
    routers: &Routers,
    from: NodeId,
    target: NodeId,
    path: &str,
    identity: Identity,
    message: Vec<u8>,
) -> Result<Messages, tonic::Code> {
    let request = framed(path, identity, message).ok_or(tonic::Code::Internal)?;
    // Each call is a connection of its own to the network: one sent later
    // may arrive first.
    let delay = runtime.network_delay(CLIENT_LATENCY);
    let delivered = deliver(runtime, routers, from, target, request, delay);
    let Ok(response) = delivered.await else {
        return Err(tonic::Code::Unavailable);
    };
    let (parts, body) = response.into_parts();
    if let Some(code) = code(&parts.headers) {
        // Trailers-only: refused (or, for OK, ended without a message).
        return if code == tonic::Code::Ok {
            Ok(futures::stream::empty().boxed())
        } else {
            Err(code)
        };
    }
    let state = (body, BytesMut::new(), false);
    Ok(
        futures::stream::unfold(state, |(mut body, mut buf, done)| async move {
            if done {
                return None;
            }
            loop {
                if buf.len() >= 5 {
                    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
                    if buf.len() >= 5 + len {
                        buf.advance(5);
                        let message = buf.split_to(len).freeze();
                        return Some((Ok(message), (body, buf, false)));
                    }
                }
                match body.frame().await {
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) => buf.extend_from_slice(&data),
                        Err(frame) => {
                            let status = frame.trailers_ref().and_then(code);
                            return match status {
                                Some(tonic::Code::Ok) => None,
                                Some(code) => Some((Err(code), (body, buf, true))),
                                None => Some((Err(tonic::Code::Internal), (body, buf, true))),
                            };
                        }
                    },
                    Some(Err(_)) => {
                        return Some((Err(tonic::Code::Unavailable), (body, buf, true)));
                    }
                    None => return Some((Err(tonic::Code::Internal), (body, buf, true))),
                }
            }
        })
        .boxed(),
    )
}

/// A gRPC request for `path` carrying the framed `message`, as
/// `identity`.
fn framed(path: &str, identity: Identity, message: Vec<u8>) -> Option<Request<Body>> {
    let mut frame = BytesMut::with_capacity(5 + message.len());
    frame.put_u8(0);
    frame.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    frame.put_slice(&message);
    let mut request = Request::builder()
        .uri(format!("http://curator{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Body::new(http_body_util::Full::new(frame.freeze())))
        .ok()?;
    request.extensions_mut().insert(identity);
    Some(request)
}
