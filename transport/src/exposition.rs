//! A plain HTTP/1.1 endpoint for Prometheus scrapes: `GET /metrics`
//! answers with the document a [`Render`] makes, in the format the
//! scraper's `Accept` header asks for (OpenMetrics when it names
//! `application/openmetrics-text`, as Prometheus does; otherwise the
//! Prometheus text format 0.0.4, which every other scraper reads).
//! Anything else is 404, a method other than GET or HEAD 405.
//!
//! The endpoint reads no request body and holds nothing per connection
//! but hyper's buffers: a request head must arrive within the timeout
//! [`serve_connection`] is given (the daemon's `--handshake-timeout`),
//! each connection serves one request (no keep-alive: an idle scraper
//! connection never holds a slot), and the accept loop's limits bound the
//! connections.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, Either};
use http::{Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;

use crate::edge::{SharedTimer, TimerHandle};
use crate::runtime::Io;

/// The formats of an exposition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Format {
    /// OpenMetrics 1.0 text (`application/openmetrics-text`).
    OpenMetrics,
    /// The Prometheus text format, version 0.0.4 (`text/plain`).
    Prometheus,
}

impl Format {
    /// The format an `Accept` header value asks for.
    pub fn negotiate(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Prometheus,
        }
    }

    /// The `Content-Type` of a document in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// Makes the exposition document of every scrape, in the format asked.
pub type Render = Arc<dyn Fn(Format) -> BoxFuture<'static, String> + Send + Sync>;

/// The answer to one request.
async fn answer(request: Request<Incoming>, render: Render) -> Response<String> {
    let plain = |status: StatusCode, text: &str| {
        let mut response = Response::new(format!("{text}\n"));
        *response.status_mut() = status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        response
    };
    if request.uri().path() != "/metrics" {
        return plain(StatusCode::NOT_FOUND, "not found: metrics are at /metrics");
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD");
        response
            .headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    let accept = request
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok());
    let format = Format::negotiate(accept);
    let mut response = Response::new(render(format).await);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(format.content_type()),
    );
    response
}

/// Serves one scrape on a connection, whose request head must arrive
/// within `head_timeout`, then closes it; or closes it once `shutdown`
/// resolves (after answering a request in progress).
pub async fn serve_connection(
    io: Io,
    render: Render,
    timer: SharedTimer,
    head_timeout: Duration,
    shutdown: impl Future<Output = ()>,
) {
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let render = render.clone();
        async move { Ok::<_, Infallible>(answer(request, render).await) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TimerHandle(timer))
        .header_read_timeout(head_timeout)
        .keep_alive(false);
    let connection = builder.serve_connection(io, service);
    let mut connection = std::pin::pin!(connection);
    let shutdown = std::pin::pin!(shutdown);
    let result = match futures::future::select(connection.as_mut(), shutdown).await {
        Either::Left((result, _)) => result,
        Either::Right(((), _)) => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "metrics connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_asks_for_openmetrics_others_get_text() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(prometheus)), Format::OpenMetrics);
        assert_eq!(Format::negotiate(Some("*/*")), Format::Prometheus);
        assert_eq!(Format::negotiate(None), Format::Prometheus);
    }
}
