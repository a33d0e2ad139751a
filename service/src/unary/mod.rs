//! Unary gRPC calls served directly on HTTP/2: read the one request
//! message, run the handler, answer with one message and the status
//! trailers.
//!
//! tonic's `Grpc::unary` does the same through its streaming machinery: a
//! boxed decoder with its own buffer, a `tonic::Request` rebuilt from the
//! HTTP parts, a boxed handler future, a streaming encoder with another
//! buffer, and a `Status` for the OK trailers. For the hot unary calls
//! (`UpdateNodeStatus`, `Heartbeat`, every one a few hundred bytes) that
//! machinery was a measurable share of the daemon's CPU per call
//! (`metropolis-load update-tls`; the figures are in `README.md` at
//! `8256aeb`). Here the request is decoded straight from the HTTP/2 data
//! frame it arrived in (joined only when it spans several), and the
//! response is one frame of exactly its size.
//!
//! What a client sees is what tonic answers: `content-type:
//! application/grpc`, the message, `grpc-status: 0`; errors as a
//! trailers-only response ([`Status::into_http`]); OutOfRange for a
//! message over the size limit; Unimplemented for a compressed call (this
//! server supports no compression); Internal for a body that is not
//! exactly one well-formed message.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use futures::FutureExt;
use futures::future::Either;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::{Body as _, Frame};
use tonic::Status;
use tonic::body::Body;

use metropolis_core::identity::Identity;

/// Largest request message accepted (tonic's default).
pub(crate) const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;

/// Length of the gRPC message prefix: compression flag and length.
const PREFIX_LEN: usize = 5;

/// Serves one unary call: decodes the request message of `request`, runs
/// `handle` with the caller (the [`Identity`] the listener put in the
/// request's extensions; none is [`Identity::Unauthenticated`]) and the
/// message, and answers with its response or its error status.
pub(crate) fn serve<Req, Resp, F, Fut>(
    request: Request<Body>,
    handle: F,
) -> impl Future<Output = Response<Body>>
where
    Req: prost::Message + Default,
    Resp: prost::Message,
    F: FnOnce(Identity, Req) -> Fut,
    Fut: Future<Output = Result<Resp, Status>>,
{
    // Reading, then handling, as the two states of one future: the
    // request's parts held while reading and the handler's future share
    // its space (an `async fn` would keep the request, an argument, for its
    // whole life). See `service/tests/call_size.rs`.
    read::<Req>(request).then(move |read| match read {
        Ok((caller, message)) => Either::Left(handle(caller, message).map(|result| match result {
            Ok(response) => respond(&response),
            Err(status) => status.into_http(),
        })),
        Err(status) => Either::Right(std::future::ready(status.into_http())),
    })
}

/// The caller and the request message of a unary call.
async fn read<Req: prost::Message + Default>(
    request: Request<Body>,
) -> Result<(Identity, Req), Status> {
    let (mut parts, body) = request.into_parts();
    let message = read_message::<Req>(&parts.headers, body).await?;
    let caller = parts
        .extensions
        .remove::<Identity>()
        .unwrap_or(Identity::Unauthenticated);
    Ok((caller, message))
}

/// The successful answer carrying `message`.
fn respond(message: &impl prost::Message) -> Response<Body> {
    let len = message.encoded_len();
    let mut frame = BytesMut::with_capacity(PREFIX_LEN + len);
    frame.put_u8(0);
    // A response is far below 4 GiB: the handlers answer small messages.
    frame.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    message.encode_raw(&mut frame);
    let mut response = Response::new(Body::new(OneMessage {
        data: Some(frame.freeze()),
        trailers: true,
    }));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    response
}

/// Reads the body of a unary call: exactly one uncompressed message of at
/// most [`MAX_REQUEST_BYTES`], decoded as `M`.
async fn read_message<M: prost::Message + Default>(
    headers: &HeaderMap,
    mut body: Body,
) -> Result<M, Status> {
    if let Some(encoding) = headers.get("grpc-encoding")
        && encoding.as_bytes() != b"identity"
    {
        return Err(Status::unimplemented(format!(
            "request compressed with {}: this server supports no compression",
            metropolis_core::quote::quoted_bytes(encoding.as_bytes())
        )));
    }
    let mut received = Received::default();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        // Trailers from the client carry nothing a unary call uses.
        if let Ok(data) = frame?.into_data() {
            received.push(data)?;
        }
    }
    received.decode()
}

/// The bytes of a request body received so far: the first data frame as
/// it came, joined with the next ones only when there are more.
#[derive(Default)]
struct Received {
    first: Bytes,
    joined: Option<BytesMut>,
}

impl Received {
    fn bytes(&self) -> &[u8] {
        match &self.joined {
            Some(joined) => joined,
            None => &self.first,
        }
    }

    /// Adds a data frame; refuses a message over the size limit as soon as
    /// its length prefix is known.
    fn push(&mut self, data: Bytes) -> Result<(), Status> {
        if data.is_empty() {
            return Ok(());
        }
        if let Some(joined) = &mut self.joined {
            joined.extend_from_slice(&data);
        } else if self.first.is_empty() {
            self.first = data;
        } else {
            let mut joined = BytesMut::with_capacity(self.first.len() + data.len());
            joined.extend_from_slice(&self.first);
            joined.extend_from_slice(&data);
            self.first = Bytes::new();
            self.joined = Some(joined);
        }
        let bytes = self.bytes();
        if let Some(len) = message_len(bytes) {
            if len > MAX_REQUEST_BYTES {
                return Err(Status::out_of_range(format!(
                    "request message too large: {len} bytes, the limit is {MAX_REQUEST_BYTES} bytes"
                )));
            }
            if bytes.len() > PREFIX_LEN + len {
                return Err(more_than_one());
            }
        }
        Ok(())
    }

    /// The one message of the complete body.
    fn decode<M: prost::Message + Default>(self) -> Result<M, Status> {
        let bytes = self.bytes();
        let Some(len) = message_len(bytes) else {
            return Err(if bytes.is_empty() {
                Status::internal("the call has no request message")
            } else {
                Status::internal("the request body ended inside a message prefix")
            });
        };
        match bytes[0] {
            0 => {}
            1 => {
                return Err(Status::internal(
                    "the request message is marked compressed, but the call names no grpc-encoding",
                ));
            }
            flag => {
                return Err(Status::internal(format!(
                    "the request message has compression flag {flag}; only 0 and 1 exist"
                )));
            }
        }
        let message = &bytes[PREFIX_LEN..];
        if message.len() < len {
            return Err(Status::internal(format!(
                "the request body ended after {} of the message's {len} bytes",
                message.len()
            )));
        }
        M::decode(message)
            .map_err(|e| Status::internal(format!("decoding the request message: {e}")))
    }
}

/// The length in the prefix of the message starting `bytes`, once the
/// prefix is complete.
fn message_len(bytes: &[u8]) -> Option<usize> {
    let prefix: [u8; 4] = bytes.get(1..PREFIX_LEN)?.try_into().ok()?;
    usize::try_from(u32::from_be_bytes(prefix)).ok()
}

fn more_than_one() -> Status {
    Status::internal("more than one request message in a unary call")
}

/// The body of a successful unary answer: one data frame, then
/// `grpc-status: 0`.
struct OneMessage {
    data: Option<Bytes>,
    trailers: bool,
}

impl http_body::Body for OneMessage {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if let Some(data) = this.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if std::mem::take(&mut this.trailers) {
            let mut trailers = HeaderMap::with_capacity(1);
            trailers.insert("grpc-status", HeaderValue::from_static("0"));
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && !self.trailers
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let len = self.data.as_ref().map_or(0, Bytes::len);
        http_body::SizeHint::with_exact(len as u64)
    }
}

#[cfg(test)]
mod tests;
