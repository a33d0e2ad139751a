//! gRPC over HTTP/2 on any runtime: serving a [`Router`] on one accepted
//! connection, and a client [`Channel`] for the tonic-generated clients.
//!
//! Both are generic over hyper's runtime traits (`hyper::rt::Read`/`Write`
//! for IO, `hyper::rt::Executor` for background tasks), so the tokio and
//! smol runtimes share them and only supply adapters.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::{Request, Response, Uri};
use hyper::body::Incoming;
use metropolis_core::service::forward::CuratorPeer;

use crate::peer::Peer;
use metropolis_core::service::Router;
use tonic::body::Body;

/// Limits applied to every served connection.
#[derive(Clone, Copy, Debug)]
pub struct ServeOptions {
    /// Largest HTTP/2 header list accepted.
    pub max_header_list_size: u32,
    /// Concurrent streams per connection.
    pub max_concurrent_streams: u32,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            max_header_list_size: 64 * 1024,
            max_concurrent_streams: 1024,
        }
    }
}

/// Serves `router` on one connection whose peer is `peer` (an
/// [`Identity`](metropolis_core::identity::Identity) converts into one), until the
/// peer goes away or `shutdown` resolves (then the connection drains
/// gracefully: in-flight calls finish, no new ones start).
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
    let Peer { identity, curator } = peer.into();
    let curator = curator.map(CuratorPeer);
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let mut request = request.map(Body::new);
        request.extensions_mut().insert(identity.clone());
        if let Some(curator) = &curator {
            request.extensions_mut().insert(curator.clone());
        }
        let response = router.call(request);
        Box::pin(async move { Ok::<_, Infallible>(response.await) }) as BoxFuture<'static, _>
    });
    let mut builder = hyper::server::conn::http2::Builder::new(executor);
    builder
        .max_header_list_size(options.max_header_list_size)
        .max_concurrent_streams(options.max_concurrent_streams);
    let connection = builder.serve_connection(io, service);
    let mut connection = std::pin::pin!(connection);
    let mut shutdown = std::pin::pin!(shutdown);
    drive_until_shutdown(connection.as_mut(), shutdown.as_mut()).await
}

/// Drives `connection` until it ends; when `shutdown` fires first, starts a
/// graceful shutdown and keeps driving until the connection has drained.
async fn drive_until_shutdown<C, S>(
    mut connection: Pin<&mut C>,
    mut shutdown: Pin<&mut S>,
) -> Result<(), hyper::Error>
where
    C: Future<Output = Result<(), hyper::Error>> + GracefulConnection,
    S: Future<Output = ()>,
{
    let mut shutting_down = false;
    futures::future::poll_fn(|cx| {
        if !shutting_down && shutdown.as_mut().poll(cx).is_ready() {
            shutting_down = true;
            connection.as_mut().graceful();
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
impl metropolis_core::service::forward::Upstream for Channel {
    fn send(&self, request: Request<Body>) -> BoxFuture<'static, Result<Response<Body>, String>> {
        let mut sender = self.sender.clone();
        Box::pin(async move {
            futures::future::poll_fn(|cx| sender.poll_ready(cx))
                .await
                .map_err(|e| e.to_string())?;
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| e.to_string())?;
            Ok(response.map(Body::new))
        })
    }
}
