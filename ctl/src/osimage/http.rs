//! The registry client's HTTP: hyper's HTTP/1.1 client connection over
//! tokio's TCP, with tokio-rustls for `https`. One connection per request
//! (a push makes a few dozen requests); no redirects, no retries.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, Uri};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Empty, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};

use super::format::quoted;
use crate::CliError;
use crate::exit::{Exit, failed, usage};

/// A request body: bytes, or a file streamed from disk.
pub type Body = BoxBody<Bytes, io::Error>;

/// No body.
pub fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed()
}

/// `bytes` as the body.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// The largest CA file read.
const MAX_CA_FILE_BYTES: u64 = 1 << 20;

/// Sends requests to registries (and their token servers).
pub struct Client {
    tls: Arc<rustls::ClientConfig>,
    connect_limit: Duration,
}

fn read_ca_file(path: &Path) -> io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_CA_FILE_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_CA_FILE_BYTES {
        return Err(io::Error::other(format!(
            "larger than {MAX_CA_FILE_BYTES} bytes"
        )));
    }
    Ok(bytes)
}

impl Client {
    /// A client trusting the system's root certificates and those of the
    /// PEM file `ca_file` (`--registry-ca`); connecting is bounded by
    /// `connect_limit`.
    pub fn new(ca_file: Option<&Path>, connect_limit: Duration) -> Result<Client, CliError> {
        let mut roots = rustls::RootCertStore::empty();
        let _ = roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        if let Some(path) = ca_file {
            let flag = format!("--registry-ca {}", path.display());
            let pem = read_ca_file(path).map_err(|e| usage(format!("{flag}: {e}")))?;
            let mut found = 0;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| usage(format!("{flag}: not PEM certificates: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| usage(format!("{flag}: certificate {}: {e}", found + 1)))?;
                found += 1;
            }
            if found == 0 {
                return Err(usage(format!("{flag}: holds no PEM certificate")));
            }
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| failed(Exit::Failure, format!("TLS configuration: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        Ok(Client {
            tls: Arc::new(config),
            connect_limit,
        })
    }

    /// Sends `method url` with `headers` and `body`; the response's body
    /// is still to be read.
    pub async fn send(
        &self,
        method: Method,
        url: &str,
        headers: HeaderMap,
        body: Body,
    ) -> Result<Response<Incoming>, CliError> {
        let uri: Uri = url
            .parse()
            .map_err(|_| failed(Exit::Failure, format!("not a URL: {}", quoted(url))))?;
        let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
            return Err(failed(Exit::Failure, format!("not a URL: {}", quoted(url))));
        };
        let https = match scheme {
            "https" => true,
            "http" => false,
            _ => {
                return Err(failed(
                    Exit::Failure,
                    format!("not http(s): {}", quoted(url)),
                ));
            }
        };
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        let unavailable = |e: &dyn std::fmt::Display| {
            failed(
                Exit::Unavailable,
                format!("cannot connect to {authority}: {e}"),
            )
        };
        let tcp = tokio::time::timeout(
            self.connect_limit,
            tokio::net::TcpStream::connect((host, port)),
        )
        .await
        .map_err(|_| {
            unavailable(&format!(
                "no answer within {:?} (--timeout)",
                self.connect_limit
            ))
        })?
        .map_err(|e| unavailable(&e))?;
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, authority.as_str())
            .header(
                http::header::USER_AGENT,
                concat!("metroctl/", env!("CARGO_PKG_VERSION")),
            )
            .body(body)
            .map_err(|e| failed(Exit::Failure, format!("request to {authority}: {e}")))?;
        request.headers_mut().extend(headers);
        if !https {
            return exchange(TokioIo::new(tcp), request, authority.as_str()).await;
        }
        let name = ServerName::try_from(host.to_string())
            .map_err(|_| failed(Exit::Failure, format!("{authority}: not a TLS server name")))?;
        let tls = tokio::time::timeout(
            self.connect_limit,
            tokio_rustls::TlsConnector::from(self.tls.clone()).connect(name, tcp),
        )
        .await
        .map_err(|_| unavailable(&"no TLS handshake within --timeout"))?
        .map_err(|e| {
            failed(
                Exit::Failure,
                format!(
                    "TLS with {authority}: {e} (a registry with a private CA needs \
                     --registry-ca FILE)"
                ),
            )
        })?;
        exchange(TokioIo::new(tls), request, authority.as_str()).await
    }
}

/// Sends `request` over a new HTTP/1.1 connection on `io`.
async fn exchange<T>(
    io: TokioIo<T>,
    request: Request<Body>,
    authority: &str,
) -> Result<Response<Incoming>, CliError>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let broken = |e: hyper::Error| failed(Exit::Failure, format!("HTTP with {authority}: {e}"));
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(broken)?;
    tokio::spawn(async move {
        // Its errors surface as the request's.
        let _ = connection.await;
    });
    sender.send_request(request).await.map_err(broken)
}

/// Reads a response body of at most `max` bytes.
pub async fn read_body(response: Response<Incoming>, max: usize) -> Result<Bytes, CliError> {
    Limited::new(response.into_body(), max)
        .collect()
        .await
        .map(|collected| collected.to_bytes())
        .map_err(|e| failed(Exit::Failure, format!("reading a response: {e}")))
}

/// What an error response says, for messages: the registry's error
/// codes and messages (`{"errors": [{"code", "message"}]}`) or a bounded
/// prefix of its body; empty when it says nothing.
pub async fn error_text(response: Response<Incoming>) -> String {
    let Ok(body) = read_body(response, 64 * 1024).await else {
        return String::new();
    };
    let said = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("errors").and_then(|e| e.as_array()).cloned())
        .map(|errors| {
            let each = errors.iter().take(3).map(|e| {
                let code = e.get("code").and_then(|c| c.as_str()).unwrap_or("");
                let message = e.get("message").and_then(|m| m.as_str()).unwrap_or("");
                format!("{code} {message}")
            });
            each.collect::<Vec<_>>().join("; ")
        })
        .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
    let said = said.trim();
    if said.is_empty() {
        String::new()
    } else {
        format!(": {}", quoted(said))
    }
}
