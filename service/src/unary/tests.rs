use bytes::{BufMut, Bytes, BytesMut};
use futures::executor::block_on;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use metropolis_proto::prelude::curator::UpdateNodeStatusRequest;
use prost::Message;
use tonic::body::Body;
use tonic::{Code, Status};

use super::{MAX_REQUEST_BYTES, serve};
use metropolis_core::identity::{Identity, NodeId};

const NODE: &str = "metropolis-0123456789abcdef0123456789abcdef";

fn message() -> UpdateNodeStatusRequest {
    UpdateNodeStatusRequest {
        node_id: NODE.into(),
        status: None,
    }
}

/// The gRPC frame (flag, length, bytes) of `m`.
fn framed(flag: u8, m: &impl Message) -> Vec<u8> {
    let mut out = vec![flag];
    out.extend_from_slice(&(m.encoded_len() as u32).to_be_bytes());
    out.extend_from_slice(&m.encode_to_vec());
    out
}

/// A request whose body arrives as `chunks`, then ends.
fn request(chunks: Vec<Vec<u8>>) -> Request<Body> {
    let frames = chunks
        .into_iter()
        .map(|c| Ok::<_, Status>(Frame::data(Bytes::from(c))));
    Request::new(Body::new(StreamBody::new(futures::stream::iter(frames))))
}

/// Serves `request` with a handler answering the request's node ID, with
/// the caller's display form appended.
fn call(request: Request<Body>) -> Response<Body> {
    block_on(serve(
        request,
        |caller: Identity, m: UpdateNodeStatusRequest| async move {
            Ok(UpdateNodeStatusRequest {
                node_id: format!("{} by {caller}", m.node_id),
                status: None,
            })
        },
    ))
}

/// The message and `grpc-status` of a successful answer.
fn answer(response: Response<Body>) -> (UpdateNodeStatusRequest, String) {
    assert_eq!(response.headers()["content-type"], "application/grpc");
    assert!(
        response.headers().get("grpc-status").is_none(),
        "not trailers-only"
    );
    let collected = block_on(response.into_body().collect()).expect("the body never fails");
    let trailers = collected.trailers().cloned().expect("trailers");
    let data = collected.to_bytes();
    assert_eq!(data[0], 0, "uncompressed");
    let len = u32::from_be_bytes(data[1..5].try_into().expect("4 bytes")) as usize;
    assert_eq!(data.len(), 5 + len, "exactly one message");
    let message = UpdateNodeStatusRequest::decode(&data[5..]).expect("a valid message");
    let status = trailers["grpc-status"].to_str().expect("ASCII").to_string();
    (message, status)
}

/// The status of a trailers-only error answer.
fn error(response: Response<Body>) -> Status {
    Status::from_header_map(response.headers()).expect("a trailers-only error")
}

#[test]
fn one_frame_is_decoded_and_answered_with_the_callers_identity() {
    let mut req = request(vec![framed(0, &message())]);
    let id = NodeId::parse(NODE).expect("valid");
    req.extensions_mut().insert(Identity::Node(id.clone()));
    let (m, status) = answer(call(req));
    assert_eq!(m.node_id, format!("{NODE} by {}", Identity::Node(id)));
    assert_eq!(status, "0");
}

#[test]
fn a_caller_without_identity_is_unauthenticated() {
    let (m, _) = answer(call(request(vec![framed(0, &message())])));
    assert_eq!(
        m.node_id,
        format!("{NODE} by {}", Identity::Unauthenticated)
    );
}

#[test]
fn a_message_split_anywhere_across_frames_is_joined() {
    let whole = framed(0, &message());
    for cut in 0..=whole.len() {
        for second in cut..=whole.len() {
            let chunks = vec![
                whole[..cut].to_vec(),
                whole[cut..second].to_vec(),
                whole[second..].to_vec(),
            ];
            let (m, _) = answer(call(request(chunks)));
            assert!(m.node_id.starts_with(NODE), "cut at {cut} and {second}");
        }
    }
}

#[test]
fn an_empty_or_truncated_body_is_internal() {
    let whole = framed(0, &message());
    let cases = [
        vec![],
        whole[..3].to_vec(),
        whole[..whole.len() - 1].to_vec(),
    ];
    for body in cases {
        let e = error(call(request(vec![body.clone()])));
        assert_eq!(e.code(), Code::Internal, "{body:?}: {e:?}");
    }
    let e = error(call(request(vec![])));
    assert!(e.message().contains("no request message"), "{e:?}");
}

#[test]
fn a_length_over_the_limit_is_out_of_range_before_the_payload() {
    let mut prefix = vec![0];
    prefix.extend_from_slice(&(MAX_REQUEST_BYTES as u32 + 1).to_be_bytes());
    let e = error(call(request(vec![prefix])));
    assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
    assert!(e.message().contains("too large"), "{e:?}");
    // At the limit it is a truncated message, not too large.
    let mut prefix = vec![0];
    prefix.extend_from_slice(&(MAX_REQUEST_BYTES as u32).to_be_bytes());
    assert_eq!(error(call(request(vec![prefix]))).code(), Code::Internal);
}

#[test]
fn two_messages_are_refused() {
    let mut body = framed(0, &message());
    body.extend_from_slice(&framed(0, &message()));
    let e = error(call(request(vec![body])));
    assert_eq!(e.code(), Code::Internal);
    assert!(e.message().contains("more than one"), "{e:?}");
    // Also when the second arrives in a frame of its own.
    let e = error(call(request(vec![
        framed(0, &message()),
        framed(0, &message()),
    ])));
    assert!(e.message().contains("more than one"), "{e:?}");
}

#[test]
fn compression_is_refused() {
    for flag in [1, 2] {
        let e = error(call(request(vec![framed(flag, &message())])));
        assert_eq!(e.code(), Code::Internal, "flag {flag}: {e:?}");
    }
    let mut req = request(vec![framed(0, &message())]);
    req.headers_mut()
        .insert("grpc-encoding", http::HeaderValue::from_static("gzip"));
    let e = error(call(req));
    assert_eq!(e.code(), Code::Unimplemented, "{e:?}");
    assert!(e.message().contains("gzip"), "{e:?}");
    let mut req = request(vec![framed(0, &message())]);
    req.headers_mut()
        .insert("grpc-encoding", http::HeaderValue::from_static("identity"));
    answer(call(req));
}

#[test]
fn an_undecodable_message_is_internal() {
    let mut body = vec![0, 0, 0, 0, 4];
    body.extend_from_slice(&[0x0a, 0x02, 0xc3, 0x28]); // invalid UTF-8
    let e = error(call(request(vec![body])));
    assert_eq!(e.code(), Code::Internal);
    assert!(e.message().contains("decoding"), "{e:?}");
}

#[test]
fn handler_errors_and_body_errors_become_the_answer() {
    let response = block_on(serve(
        request(vec![framed(0, &message())]),
        |_, _: UpdateNodeStatusRequest| async {
            Err::<UpdateNodeStatusRequest, _>(Status::not_found("no such node"))
        },
    ));
    let e = error(response);
    assert_eq!((e.code(), e.message()), (Code::NotFound, "no such node"));

    let frames = vec![
        Ok(Frame::data(Bytes::from_static(&[0, 0]))),
        Err(Status::cancelled("client went away")),
    ];
    let req = Request::new(Body::new(StreamBody::new(futures::stream::iter(frames))));
    let e = error(call(req));
    assert_eq!(e.code(), Code::Cancelled);
}

#[test]
fn the_answer_is_one_frame_of_exactly_its_size() {
    let response = call(request(vec![framed(0, &message())]));
    let mut body = response.into_body();
    let first = block_on(body.frame()).expect("a frame").expect("no error");
    let data = first.into_data().expect("data first");
    let mut expected = BytesMut::new();
    let m = UpdateNodeStatusRequest {
        node_id: format!("{NODE} by {}", Identity::Unauthenticated),
        status: None,
    };
    expected.put_slice(&framed(0, &m));
    assert_eq!(data, expected.freeze());
    let second = block_on(body.frame()).expect("a frame").expect("no error");
    assert!(second.is_trailers());
    assert!(block_on(body.frame()).is_none());
}
