//! The response body of a routed call: the service's (or the leader's)
//! body, ended early with an Unavailable status when the role the call was
//! routed under ends, and holding the call's "finished" guard until it is
//! over.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::future::BoxFuture;
use http::HeaderMap;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tonic::body::Body;

use crate::forward::ForwardError;
use metropolis_core::leadership::LeadershipError;

/// A response body that ends with `grpc-status` trailers carrying the
/// cancellation's error once `cancelled` resolves, and drops `finished`
/// when it ends (or is dropped). For a forwarded call, a failure of the
/// leader's body (the leader died, its connection broke) ends it the same
/// way, as "backend switched", instead of resetting the caller's stream.
pub(crate) struct RoutedBody {
    inner: Body,
    cancelled: Option<BoxFuture<'static, LeadershipError>>,
    finished: Option<Box<dyn Send + Sync>>,
    forwarded: bool,
    ended: bool,
}

impl RoutedBody {
    pub(crate) fn new(
        inner: Body,
        cancelled: BoxFuture<'static, LeadershipError>,
        finished: Box<dyn Send + Sync>,
        forwarded: bool,
    ) -> RoutedBody {
        RoutedBody {
            inner,
            cancelled: Some(cancelled),
            finished: Some(finished),
            forwarded,
            ended: false,
        }
    }

    fn end(&mut self) {
        self.ended = true;
        self.cancelled = None;
        self.finished = None;
    }
}

/// Trailers ending a call with `error`'s status.
fn trailers(error: LeadershipError) -> HeaderMap {
    let mut headers = HeaderMap::new();
    // Fails only on a message that cannot be a header value; the
    // leadership messages are plain ASCII.
    let _ = crate::status::leadership(&error).add_header(&mut headers);
    headers
}

impl HttpBody for RoutedBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(None);
        }
        if let Some(cancelled) = this.cancelled.as_mut()
            && let Poll::Ready(error) = cancelled.as_mut().poll(cx)
        {
            this.end();
            return Poll::Ready(Some(Ok(Frame::trailers(trailers(error)))));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(None) => {
                this.end();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) if this.forwarded => {
                this.end();
                let status = crate::status::forward(&ForwardError::StreamBroken {
                    reason: metropolis_core::cause::describe(&e),
                });
                let mut headers = HeaderMap::new();
                let _ = status.add_header(&mut headers);
                Poll::Ready(Some(Ok(Frame::trailers(headers))))
            }
            Poll::Ready(Some(Err(e))) => {
                this.end();
                Poll::Ready(Some(Err(e)))
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }

    /// At most what the inner body holds, and no lower bound: the role
    /// ending (or the leader's body failing) cuts the body short. An
    /// exact hint would let the server send a `content-length` the cut
    /// body then breaks, which an HTTP/2 client answers with a protocol
    /// error instead of reading the trailers' status.
    fn size_hint(&self) -> SizeHint {
        let mut hint = SizeHint::new();
        if self.ended {
            hint.set_upper(0);
        } else if let Some(upper) = self.inner.size_hint().upper() {
            hint.set_upper(upper);
        }
        hint
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use futures::FutureExt;
    use http_body_util::BodyExt;

    use super::*;

    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_cancelled_stream_ends_with_the_status_and_releases_the_call() {
        let done = Arc::new(AtomicBool::new(false));
        let (tx, rx) = futures::channel::oneshot::channel::<LeadershipError>();
        let cancelled = rx
            .map(|r| r.unwrap_or(LeadershipError::ShuttingDown))
            .boxed();
        // A body that never ends by itself.
        let (_keep, inner) =
            futures::channel::mpsc::channel::<Result<Frame<Bytes>, tonic::Status>>(1);
        let inner = Body::new(http_body_util::StreamBody::new(inner));
        let mut body = RoutedBody::new(inner, cancelled, Box::new(Flag(done.clone())), false);
        assert!(
            body.frame().now_or_never().is_none(),
            "pending while the role lasts"
        );
        tx.send(LeadershipError::BackendSwitched).unwrap();
        let frame = futures::executor::block_on(body.frame()).unwrap().unwrap();
        let status = tonic::Status::from_header_map(frame.trailers_ref().unwrap()).unwrap();
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(status.message().contains("backend switched"), "{status:?}");
        assert!(done.load(Ordering::SeqCst), "the call is finished");
        assert!(futures::executor::block_on(body.frame()).is_none());
    }

    #[test]
    fn a_broken_leader_stream_ends_a_forwarded_call_unavailable() {
        let broken = futures::stream::iter([
            Ok(Frame::data(Bytes::from_static(b"x"))),
            Err(tonic::Status::unknown("connection reset")),
        ]);
        let inner = Body::new(http_body_util::StreamBody::new(broken));
        let mut body = RoutedBody::new(
            inner,
            futures::future::pending().boxed(),
            Box::new(()),
            true,
        );
        assert!(
            futures::executor::block_on(body.frame())
                .unwrap()
                .unwrap()
                .is_data()
        );
        let frame = futures::executor::block_on(body.frame()).unwrap().unwrap();
        let status = tonic::Status::from_header_map(frame.trailers_ref().unwrap()).unwrap();
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(status.message().contains("connection reset"), "{status:?}");
        assert!(futures::executor::block_on(body.frame()).is_none());
    }

    #[test]
    fn a_body_the_role_can_cut_claims_no_length() {
        let (tx, rx) = futures::channel::oneshot::channel::<LeadershipError>();
        let cancelled = rx
            .map(|r| r.unwrap_or(LeadershipError::ShuttingDown))
            .boxed();
        // A unary answer: five bytes, its length known in advance.
        let inner = Body::new(http_body_util::Full::new(Bytes::from_static(&[0; 5])));
        assert_eq!(inner.size_hint().exact(), Some(5));
        let mut body = RoutedBody::new(inner, cancelled, Box::new(()), false);
        let hint = body.size_hint();
        assert_eq!(hint.upper(), Some(5));
        tx.send(LeadershipError::BackendSwitched).unwrap();
        let mut sent = 0;
        while let Some(frame) = futures::executor::block_on(body.frame()) {
            sent += frame.unwrap().data_ref().map_or(0, Bytes::len) as u64;
        }
        assert_eq!(sent, 0, "cut before its data");
        assert!(
            hint.lower() <= sent,
            "the hint promised {} bytes, the body sent {sent}",
            hint.lower()
        );
        assert_eq!(body.size_hint().exact(), Some(0));
    }

    #[test]
    fn a_body_that_ends_releases_the_call() {
        let done = Arc::new(AtomicBool::new(false));
        let mut body = RoutedBody::new(
            Body::new(http_body_util::Full::new(Bytes::from_static(b"x"))),
            futures::future::pending().boxed(),
            Box::new(Flag(done.clone())),
            false,
        );
        let frame = futures::executor::block_on(body.frame()).unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), Bytes::from_static(b"x"));
        assert!(futures::executor::block_on(body.frame()).is_none());
        assert!(done.load(Ordering::SeqCst));
    }
}
