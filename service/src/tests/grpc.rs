//! Driving a [`Router`](crate::Router) with encoded gRPC requests and
//! reading its answers message by message, for the tests of the services
//! that every listener carries.

#![allow(clippy::unwrap_used)]

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use prost::Message;
use tonic::Status;
use tonic::body::Body;

/// The gRPC frame of `m` (uncompressed).
pub fn framed(m: &impl Message) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(&u32::try_from(m.encoded_len()).unwrap().to_be_bytes());
    out.extend_from_slice(&m.encode_to_vec());
    out
}

/// A call of `path` whose body is `messages`, then ends.
pub fn call<M: Message>(path: &str, messages: &[M]) -> Request<Body> {
    let frames: Vec<Result<Frame<Bytes>, Status>> = messages
        .iter()
        .map(|m| Ok(Frame::data(Bytes::from(framed(m)))))
        .collect();
    Request::post(path)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Body::new(StreamBody::new(futures::stream::iter(frames))))
        .unwrap()
}

/// An answer, read message by message.
pub struct Reply {
    body: Body,
    buffer: BytesMut,
    /// A trailers-only answer's status, or the trailers once read.
    end: Option<HeaderMap>,
}

impl Reply {
    /// Reads `response`.
    pub fn new(response: Response<Body>) -> Reply {
        let (parts, body) = response.into_parts();
        let end = parts
            .headers
            .contains_key("grpc-status")
            .then_some(parts.headers);
        Reply {
            body,
            buffer: BytesMut::new(),
            end,
        }
    }

    /// The next message; `Ok(None)` once the answer ended with OK, its
    /// status if it ended otherwise.
    pub async fn message<M: Message + Default>(&mut self) -> Result<Option<M>, Status> {
        loop {
            if self.buffer.len() >= 5 {
                let len = u32::from_be_bytes(self.buffer[1..5].try_into().unwrap()) as usize;
                if self.buffer.len() >= 5 + len {
                    assert_eq!(self.buffer[0], 0, "uncompressed");
                    self.buffer.advance(5);
                    let message = self.buffer.split_to(len);
                    return Ok(Some(M::decode(message.freeze()).unwrap()));
                }
            }
            if let Some(end) = &self.end {
                let status = Status::from_header_map(end).unwrap();
                return match status.code() {
                    tonic::Code::Ok => Ok(None),
                    _ => Err(status),
                };
            }
            match self.body.frame().await {
                None => panic!("the answer ended without trailers"),
                Some(frame) => match frame.unwrap().into_data() {
                    Ok(data) => self.buffer.extend_from_slice(&data),
                    Err(frame) => self.end = frame.into_trailers().ok(),
                },
            }
        }
    }
}
