//! gRPC over HTTP/2 on any runtime: serving a [`Router`] on one accepted
//! connection, and a client [`Channel`] for the tonic-generated clients.
//!
//! Both are generic over hyper's runtime traits (`hyper::rt::Read`/`Write`
//! for IO, `hyper::rt::Executor` for background tasks), so the tokio and
//! smol runtimes share them and only supply adapters.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::{Request, Response, Uri};
use hyper::body::Incoming;
use metropolis_service::RemoteAddr;
use metropolis_service::forward::CuratorPeer;

use crate::edge::{EdgeLimits, SharedTimer, TimerHandle};
use crate::peer::Peer;
use crate::wake_flag::WakeFlag;
use metropolis_service::Router;
use tonic::body::Body;

/// Limits applied to every served connection.
#[derive(Clone, Default)]
pub struct ServeOptions {
    /// The connection limits (streams, header list, idle timeout,
    /// keepalive).
    pub limits: EdgeLimits,
    /// The runtime's timer; without one, no idle timeout and no keepalive.
    pub timer: Option<SharedTimer>,
}

impl ServeOptions {
    /// `limits`, timed by `timer`.
    pub fn new(limits: EdgeLimits, timer: SharedTimer) -> Self {
        ServeOptions {
            limits,
            timer: Some(timer),
        }
    }
}

/// How long a connection closed for idleness may take to drain (its peer
/// answering the GOAWAY's PING) before it is dropped: this, or the idle
/// timeout when shorter.
pub const IDLE_CLOSE_GRACE: Duration = Duration::from_secs(10);

/// `response`, or, when it refuses the call for want of an identity
/// (trailers-only Unauthenticated) and the peer's certificates were
/// refused for a reason of their own, the same refusal saying why.
fn with_refusal(response: Response<Body>, refusal: Option<&str>) -> Response<Body> {
    let unauthenticated = response
        .headers()
        .get("grpc-status")
        .is_some_and(|code| code.as_bytes() == b"16");
    match refusal {
        Some(reason) if unauthenticated => tonic::Status::unauthenticated(reason).into_http(),
        _ => response,
    }
}

/// Serves `router` on one connection whose peer is `peer` (an
/// [`Identity`](metropolis_core::identity::Identity) converts into one), until the
/// peer goes away or `shutdown` resolves (then the connection drains
/// gracefully: in-flight calls finish, no new ones start). A peer with a
/// [`refusal`](Peer::refusal) gets it as the message of every call refused
/// for want of an identity.
///
/// With a timer in `options`: HTTP/2 keepalive PINGs as the limits say,
/// and a connection with no open call is closed once a whole idle timeout
/// passed without one starting (one to two timeouts after its last call
/// ended; one timeout after its start when it never made a call, so also
/// when it never sends the HTTP/2 preface): it is sent GOAWAY and dropped
/// if it has not closed [`IDLE_CLOSE_GRACE`] (or the idle timeout, when
/// shorter) later.
pub async fn serve_connection<IO, E>(
    io: IO,
    peer: impl Into<Peer>,
    router: Router,
    executor: E,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), hyper::Error>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    E: hyper::rt::Executor<BoxFuture<'static, ()>> + Clone + Send + Sync + 'static,
    E: hyper::rt::bounds::Http2ServerConnExec<
            BoxFuture<'static, Result<Response<Body>, Infallible>>,
            Body,
        >,
{
    let Peer {
        identity,
        curator,
        addr,
        refusal,
    } = peer.into();
    let curator = curator.map(CuratorPeer);
    // Formatted once per connection; each call's extensions share it.
    let addr = addr.map(|a| RemoteAddr(Arc::from(a.to_string())));
    let limits = &options.limits;
    let idle = options.timer.clone().zip(limits.idle_timeout);
    let calls = idle.as_ref().map(|_| Arc::new(Calls::default()));
    let counted = calls.clone();
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let mut request = request.map(Body::new);
        request.extensions_mut().insert(identity.clone());
        if let Some(curator) = &curator {
            request.extensions_mut().insert(curator.clone());
        }
        if let Some(addr) = &addr {
            request.extensions_mut().insert(addr.clone());
        }
        let open = counted.as_ref().map(|calls| calls.open());
        let response = router.call(request);
        let refusal = refusal.clone();
        Box::pin(async move {
            let response = with_refusal(response.await, refusal.as_deref());
            Ok::<_, Infallible>(match open {
                Some(open) => response.map(|body| {
                    Body::new(CountedBody {
                        inner: body,
                        _open: open,
                    })
                }),
                None => response,
            })
        }) as BoxFuture<'static, _>
    });
    let mut builder = hyper::server::conn::http2::Builder::new(executor);
    builder
        .max_header_list_size(limits.max_header_list_size)
        .max_concurrent_streams(limits.max_concurrent_streams);
    if let (Some(timer), Some(interval)) = (&options.timer, limits.keepalive_interval) {
        builder
            .timer(TimerHandle(timer.clone()))
            .keep_alive_interval(interval)
            .keep_alive_timeout(limits.keepalive_timeout);
    }
    let connection = builder.serve_connection(io, service);
    let mut connection = std::pin::pin!(connection);
    let mut shutdown = std::pin::pin!(shutdown);
    let idle = idle
        .zip(calls)
        .map(|((timer, timeout), calls)| IdleWatch::new(timer, timeout, calls));
    drive_until_shutdown(connection.as_mut(), shutdown.as_mut(), idle).await
}

/// The calls of one connection, for its idle timeout. Counting is all a
/// call pays: nothing wakes the connection when a call ends, the idle
/// watch looks at the counts only when its timer fires.
#[derive(Default)]
struct Calls {
    /// Calls whose response has not ended.
    open: AtomicUsize,
    /// Calls ever started.
    started: AtomicU64,
}

impl Calls {
    fn open(self: &Arc<Self>) -> OpenCall {
        self.started.fetch_add(1, Ordering::Relaxed);
        self.open.fetch_add(1, Ordering::Relaxed);
        OpenCall(self.clone())
    }
}

/// Held by a call's response body until it ends.
struct OpenCall(Arc<Calls>);

impl Drop for OpenCall {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response body counted as an open call while it lives.
struct CountedBody {
    inner: Body,
    _open: OpenCall,
}

impl http_body::Body for CountedBody {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The idle timeout of one connection: a timer that fires every `timeout`
/// and, each time, compares the call counts with the last time. Idle means
/// no call open now and none started since the timer was armed, so a
/// connection is closed between one and two timeouts after its last call
/// ended (one timeout after accept when it never made a call).
struct IdleWatch {
    timer: SharedTimer,
    timeout: Duration,
    sleep: Pin<Box<dyn hyper::rt::Sleep>>,
    /// `sleep` is polled only once it woke, not on every wake-up of the
    /// connection (one per frame).
    woke: WakeFlag,
    calls: Arc<Calls>,
    /// `calls.started` when the sleep was armed.
    seen: u64,
    /// GOAWAY sent; the sleep is the drain deadline.
    closing: bool,
}

/// What the idle watch says when its sleep ends.
enum IdleVerdict {
    /// Still in use: keep serving.
    Busy,
    /// Idle for the whole timeout: start closing.
    Idle,
    /// Closing took too long: drop the connection.
    Drop,
}

impl IdleWatch {
    fn new(timer: SharedTimer, timeout: Duration, calls: Arc<Calls>) -> Self {
        IdleWatch {
            sleep: timer.sleep(timeout),
            woke: WakeFlag::new(),
            timer,
            timeout,
            calls,
            seen: 0,
            closing: false,
        }
    }

    fn arm(&mut self, after: Duration) {
        self.sleep = self.timer.sleep(after);
        self.woke.rearm();
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<IdleVerdict> {
        if self.woke.poll(self.sleep.as_mut(), cx).is_pending() {
            return Poll::Pending;
        }
        if self.closing {
            return Poll::Ready(IdleVerdict::Drop);
        }
        let started = self.calls.started.load(Ordering::Relaxed);
        let open = self.calls.open.load(Ordering::Relaxed);
        if open == 0 && started == self.seen {
            self.closing = true;
            self.arm(IDLE_CLOSE_GRACE.min(self.timeout));
            return Poll::Ready(IdleVerdict::Idle);
        }
        self.seen = started;
        self.arm(self.timeout);
        Poll::Ready(IdleVerdict::Busy)
    }
}

/// Drives `connection` until it ends; when `shutdown` fires first, starts a
/// graceful shutdown and keeps driving until the connection has drained.
/// With an idle watch, an idle connection is shut down gracefully too, and
/// dropped when it does not drain in time.
async fn drive_until_shutdown<C, S>(
    mut connection: Pin<&mut C>,
    mut shutdown: Pin<&mut S>,
    mut idle: Option<IdleWatch>,
) -> Result<(), hyper::Error>
where
    C: Future<Output = Result<(), hyper::Error>> + GracefulConnection,
    S: Future<Output = ()>,
{
    let mut shutting_down = false;
    // The shutdown signal is polled only once it fired.
    let mut signalled = WakeFlag::new();
    futures::future::poll_fn(|cx| {
        if !shutting_down && signalled.poll(shutdown.as_mut(), cx).is_ready() {
            shutting_down = true;
            connection.as_mut().graceful();
        }
        if let Some(watch) = &mut idle {
            loop {
                match watch.poll(cx) {
                    Poll::Pending => break,
                    Poll::Ready(IdleVerdict::Busy) => {}
                    Poll::Ready(IdleVerdict::Idle) => {
                        tracing::debug!("closing an idle connection");
                        connection.as_mut().graceful();
                    }
                    Poll::Ready(IdleVerdict::Drop) => {
                        tracing::debug!("dropping an idle connection that did not close");
                        return Poll::Ready(Ok(()));
                    }
                }
            }
        }
        connection.as_mut().poll(cx)
    })
    .await
}

/// A connection that can be asked to shut down gracefully.
trait GracefulConnection {
    fn graceful(self: Pin<&mut Self>);
}

impl<I, S, E> GracefulConnection for hyper::server::conn::http2::Connection<I, S, E>
where
    S: hyper::service::HttpService<Incoming>,
    S::ResBody: http_body::Body + Send + 'static,
    <S::ResBody as http_body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, S::ResBody>,
{
    fn graceful(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

/// A gRPC client channel over one HTTP/2 connection, for the
/// tonic-generated clients (`XClient::with_origin(channel, Channel::origin())`).
#[derive(Clone, Debug)]
pub struct Channel {
    sender: hyper::client::conn::http2::SendRequest<Body>,
}

impl Channel {
    /// Performs the HTTP/2 handshake on `io`, spawning the connection's
    /// driver on `executor`.
    pub async fn handshake<IO, E>(io: IO, executor: E) -> Result<Channel, hyper::Error>
    where
        IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
        E: hyper::rt::Executor<BoxFuture<'static, ()>> + Clone + Send + Sync + Unpin + 'static,
        E: hyper::rt::bounds::Http2ClientConnExec<Body, IO>,
    {
        let (sender, connection) = hyper::client::conn::http2::Builder::new(executor.clone())
            .max_header_list_size(64 * 1024)
            .handshake(io)
            .await?;
        executor.execute(Box::pin(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "client connection ended");
            }
        }));
        Ok(Channel { sender })
    }

    /// The origin to give generated clients: requests carry it as their
    /// `:scheme` and `:authority`.
    pub fn origin() -> Uri {
        Uri::from_static("http://metropolis")
    }
}

impl tonic::codegen::Service<Request<Body>> for Channel {
    type Response = Response<Incoming>;
    type Error = hyper::Error;
    type Future = BoxFuture<'static, Result<Response<Incoming>, hyper::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), hyper::Error>> {
        self.sender.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        Box::pin(self.sender.send_request(request))
    }
}

/// A channel to the leader is where a follower forwards calls.
impl metropolis_service::forward::Upstream for Channel {
    fn send(
        &self,
        request: Request<Body>,
    ) -> BoxFuture<'static, Result<Response<Body>, metropolis_service::forward::ForwardError>> {
        let mut sender = self.sender.clone();
        Box::pin(async move {
            // The innermost cause: hyper's own message ("connection
            // error") says less than the I/O or TLS error under it.
            let broken = |e: hyper::Error| metropolis_service::forward::ForwardError::Broken {
                reason: metropolis_core::cause::describe(&e),
            };
            futures::future::poll_fn(|cx| sender.poll_ready(cx))
                .await
                .map_err(broken)?;
            let response = sender.send_request(request).await.map_err(broken)?;
            Ok(response.map(Body::new))
        })
    }
}
