use super::*;
use futures::FutureExt;
use http_body_util::BodyExt;

fn message(len: usize) -> Vec<u8> {
    let mut m = vec![0u8];
    m.extend_from_slice(&u32::try_from(len).unwrap().to_be_bytes());
    m.extend(std::iter::repeat_n(7u8, len));
    m
}

/// A body yielding `frames` one by one.
fn body(frames: Vec<Vec<u8>>) -> Body {
    let stream = futures::stream::iter(
        frames
            .into_iter()
            .map(|f| Ok::<_, Status>(Frame::data(Bytes::from(f)))),
    );
    Body::new(http_body_util::StreamBody::new(stream))
}

fn collect(body: Body) -> Result<Vec<u8>, Status> {
    body.collect()
        .now_or_never()
        .expect("the test body is ready")
        .map(|c| c.to_bytes().to_vec())
}

const METHOD: &str = "/metropolis.node.core.curator.proto.api.Curator/UpdateNodeStatus";

#[test]
fn messages_within_the_limit_pass_unchanged() {
    let limits = RequestLimits::default();
    let mut bytes = message(100);
    bytes.extend(message(0));
    bytes.extend(message(64 * 1024));
    // Split at awkward places: inside a prefix, at a prefix's end.
    let frames = vec![
        bytes[..3].to_vec(),
        bytes[3..5].to_vec(),
        bytes[5..200].to_vec(),
        bytes[200..].to_vec(),
    ];
    assert_eq!(collect(limits.admit(METHOD, body(frames))).unwrap(), bytes);
    assert_eq!(limits.in_flight(), 0);
}

#[test]
fn a_message_over_the_method_limit_is_refused_at_its_prefix() {
    let limits = RequestLimits::default();
    // Only the prefix is sent: the refusal must not wait for the bytes.
    let prefix = message(64 * 1024 + 1)[..5].to_vec();
    let status = collect(limits.admit(METHOD, body(vec![prefix]))).unwrap_err();
    assert_eq!(status.code(), tonic::Code::OutOfRange);
    assert!(
        status.message().contains("65537 bytes"),
        "{}",
        status.message()
    );
    // Another method falls back to the default limit.
    let prefix = message(64 * 1024 + 1)[..5].to_vec();
    let other = "/metropolis.proto.api.NodeDebugService/GetLogs";
    let mut admitted = limits.admit(other, body(vec![prefix]));
    let frame = std::pin::Pin::new(&mut admitted)
        .frame()
        .now_or_never()
        .unwrap();
    assert!(frame.unwrap().is_ok());
}

#[test]
fn configured_limits_override_the_defaults() {
    let limits = RequestLimits::default()
        .with_default_max(10)
        .with_method_max(METHOD, 1000);
    assert_eq!(limits.max_message(METHOD), 1000);
    assert_eq!(limits.max_message("/x.Y/Z"), 10);
    let status = collect(limits.admit("/x.Y/Z", body(vec![message(11)]))).unwrap_err();
    assert_eq!(status.code(), tonic::Code::OutOfRange);
}

#[test]
fn the_budget_bounds_messages_held_at_once_and_is_returned() {
    let limits = RequestLimits::default().with_in_flight_bytes(1000);
    let big = message(600);
    // First body: prefix and part of the message arrive, the rest not yet.
    let mut first = limits.admit(METHOD, body(vec![big[..100].to_vec()]));
    let f = std::pin::Pin::new(&mut first)
        .frame()
        .now_or_never()
        .unwrap();
    assert!(f.unwrap().is_ok());
    assert_eq!(limits.in_flight(), 600);
    // A second 600-byte message does not fit beside it.
    let status = collect(limits.admit(METHOD, body(vec![big.clone()]))).unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert_eq!(limits.in_flight(), 600);
    // Dropping the first (the caller went away) returns its reservation.
    drop(first);
    assert_eq!(limits.in_flight(), 0);
    assert_eq!(
        collect(limits.admit(METHOD, body(vec![big.clone()]))).unwrap(),
        big
    );
    assert_eq!(limits.in_flight(), 0);
}

#[test]
fn a_complete_message_holds_its_reservation_until_the_next_begins() {
    let limits = RequestLimits::default().with_in_flight_bytes(1000);
    let m = message(600);
    let next = message(300)[..5].to_vec();
    let mut admitted = limits.admit(METHOD, body(vec![m.clone(), next]));
    let mut poll = || {
        std::pin::Pin::new(&mut admitted)
            .frame()
            .now_or_never()
            .unwrap()
            .map(|f| f.is_ok())
    };
    assert_eq!(poll(), Some(true));
    assert_eq!(
        limits.in_flight(),
        600,
        "a unary call holds its message until the body ends"
    );
    assert_eq!(poll(), Some(true));
    assert_eq!(limits.in_flight(), 300, "the next message took over");
    assert_eq!(poll(), None);
    assert_eq!(limits.in_flight(), 0, "the body ended");
}

#[test]
fn framer_reports_begin_and_end_per_message() {
    let mut framer = Framer::new(100);
    let mut steps = Vec::new();
    let mut bytes = message(3);
    bytes.extend(message(0));
    for b in &bytes {
        framer
            .feed(std::slice::from_ref(b), |s| {
                steps.push(s);
                Ok(())
            })
            .unwrap();
    }
    assert_eq!(
        steps,
        vec![Step::Began(3), Step::Ended, Step::Began(0), Step::Ended]
    );
}
