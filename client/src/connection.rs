//! One HTTP/2 connection to a curator, as the tonic client's transport:
//! dialled through `metropolis_transport` (its TLS and UNIX connectors on
//! the caller's runtime), with HTTP/2 keepalive pings on the runtime's
//! timer (so a stopped or cut-off curator is noticed even on an idle
//! watch), and every failure of its own tagged as a [`TransportError`] that
//! says whether the request was sent.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use metropolis_transport::connect;
use metropolis_transport::edge::TimerHandle;
use metropolis_transport::runtime::{Executor, Io, SharedRuntime};
use tonic::body::Body;

use crate::endpoints::Target;
use crate::error::chain;
use crate::misconfiguration::{Misconfiguration, of_connect_error};

/// A failure of the connection itself (not a gRPC status): the HTTP/2
/// layer's error, rendered for people, whether the request may have
/// reached the server, and what it shows to be misconfigured (a TLS 1.3
/// server refuses a client's certificate only after the handshake, on
/// the first read). Tonic hands it back as the source of an Unknown
/// status, where [`crate::unary`] and [`crate::view`] find it again.
#[derive(Debug, Clone)]
pub(crate) struct TransportError {
    pub(crate) reason: String,
    pub(crate) sent: bool,
    pub(crate) problem: Option<Misconfiguration>,
}

/// What a failure of an established connection shows to be
/// misconfigured: only a refusal of the client's certificate (a TLS 1.3
/// server sends it after the handshake). Anything else, a record that
/// does not parse included, may be a blip on the way.
fn refused(error: &(dyn std::error::Error + 'static)) -> Option<Misconfiguration> {
    of_connect_error(error).filter(|p| *p == Misconfiguration::CredentialRefused)
}

/// Why a connection could not be made: the connector's error, rendered
/// for people, and what it shows to be misconfigured.
#[derive(Debug, Clone)]
pub(crate) struct DialError {
    pub(crate) reason: String,
    pub(crate) problem: Option<Misconfiguration>,
}

impl DialError {
    fn of(error: &(dyn std::error::Error + 'static), reason: String) -> DialError {
        DialError {
            reason,
            problem: of_connect_error(error),
        }
    }
}

impl From<String> for DialError {
    fn from(reason: String) -> DialError {
        DialError {
            reason,
            problem: None,
        }
    }
}

impl std::fmt::Display for TransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

// No `source()`: tonic would look through it for a hyper error and make
// a status of its own.
impl std::error::Error for TransportError {}

/// The body of a response, its read errors tagged as [`TransportError`].
pub(crate) type ResponseBody =
    http_body_util::combinators::MapErr<Incoming, fn(hyper::Error) -> TransportError>;

fn body_error(error: hyper::Error) -> TransportError {
    TransportError {
        reason: chain(&error),
        sent: true,
        problem: refused(&error),
    }
}

/// An HTTP/2 connection to one endpoint.
#[derive(Clone, Debug)]
pub(crate) struct Connection {
    sender: SendRequest<Body>,
}

/// Dials `target` on `runtime` (TLS with `tls` for TCP), pinging every
/// `keepalive` (and closing when a ping is not answered within it).
pub(crate) async fn dial(
    runtime: &SharedRuntime,
    target: &Target,
    tls: Option<Arc<rustls::ClientConfig>>,
    keepalive: Option<Duration>,
) -> Result<Connection, DialError> {
    let io: Io = match (target, tls) {
        (Target::Tcp(addr), Some(tls)) => {
            connect::tls_stream(runtime, addr, tls)
                .await
                .map_err(|e| DialError::of(&e, chain(&e)))?
                .io
        }
        (Target::Tcp(addr), None) => {
            return Err(format!("{addr}: no TLS configuration to reach it with").into());
        }
        (Target::Unix(path), _) => runtime
            .connect_unix(path.clone())
            .await
            .map_err(|e| format!("cannot connect to {}: {}", path.display(), chain(&e)))?
            .into_io(),
    };
    let mut builder = hyper::client::conn::http2::Builder::new(Executor(runtime.clone()));
    builder
        .timer(TimerHandle(runtime.timer()))
        .max_header_list_size(64 * 1024);
    if let Some(every) = keepalive {
        builder
            .keep_alive_interval(every)
            .keep_alive_timeout(every)
            .keep_alive_while_idle(true);
    }
    let (sender, connection) = builder
        .handshake(io)
        .await
        .map_err(|e| DialError::of(&e, format!("HTTP/2 handshake failed: {}", chain(&e))))?;
    runtime.spawn(Box::pin(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %chain(&e), "curator connection ended");
        }
    }));
    Ok(Connection { sender })
}

impl tonic::codegen::Service<Request<Body>> for Connection {
    type Response = Response<ResponseBody>;
    type Error = TransportError;
    type Future = BoxFuture<'static, Result<Self::Response, TransportError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), TransportError>> {
        self.sender.poll_ready(cx).map_err(|e| TransportError {
            reason: chain(&e),
            sent: false,
            problem: refused(&e),
        })
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let sent = self.sender.try_send_request(request);
        Box::pin(async move {
            match sent.await {
                Ok(response) => Ok(response.map(|b| b.map_err(body_error as fn(_) -> _))),
                Err(e) => Err(TransportError {
                    // The request comes back when it never left.
                    sent: e.message().is_none(),
                    reason: chain(e.error()),
                    problem: refused(e.error()),
                }),
            }
        })
    }
}

/// The origin requests carry (`:scheme`, `:authority`).
pub(crate) fn origin() -> http::Uri {
    http::Uri::from_static("http://metropolis")
}
