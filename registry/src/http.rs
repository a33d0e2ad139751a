//! A minimal blocking HTTP/1.1 client for GET requests: what the OCI
//! distribution API needs, over `std::net::TcpStream` (and rustls for
//! `https` when the caller supplies a client configuration).
//!
//! - One connection per request, `Connection: close`; no pooling.
//! - The response head is parsed by `httparse` (bounded to
//!   [`MAX_HEAD_BYTES`] and [`MAX_HEADERS`]); `1xx` interim responses are
//!   skipped.
//! - Bodies are framed as RFC 9112 says (`body.rs`).
//! - Redirects (`301`, `302`, `303`, `307`, `308`) are followed up to
//!   [`MAX_REDIRECTS`] times: registries redirect blob downloads to
//!   storage on other hosts. A redirect to another host or scheme is
//!   followed only to `https` (never down from `https` to `http`, never
//!   to another host in the clear); the `Authorization` header goes only
//!   to the scheme and authority it was meant for. What is fetched is
//!   verified by digest either way.
//! - Every socket read and write is bounded by the I/O timeout, connects
//!   by the connect timeout, and the whole request, redirects and body
//!   included, by its deadline (`deadline.rs`): a server that drips bytes
//!   just fast enough to beat the I/O timeout still cannot hold a request
//!   open for longer.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;

pub use crate::body::Body;
use crate::body::{Framing, framing};
use crate::deadline::{Deadline, DeadlineSocket};
pub use crate::url::{Scheme, Url};

/// The largest response head accepted.
pub const MAX_HEAD_BYTES: u64 = 64 * 1024;
/// The most header fields accepted in a response.
pub const MAX_HEADERS: usize = 100;
/// The most redirects followed for one request.
pub const MAX_REDIRECTS: u32 = 5;

/// Why a request failed.
#[derive(Debug)]
pub enum HttpError {
    /// No connection could be made to `authority`.
    Connect {
        /// `host[:port]`.
        authority: String,
        /// The last connection error.
        source: io::Error,
    },
    /// The TLS handshake with `authority` failed.
    Tls {
        /// `host[:port]`.
        authority: String,
        /// The handshake error.
        source: io::Error,
    },
    /// An `https` URL whose server answered the TLS handshake in plain
    /// HTTP: it speaks `http`, not `https`.
    PlainHttp {
        /// `host[:port]`.
        authority: String,
    },
    /// An `https` URL without a TLS client configuration.
    TlsUnavailable {
        /// The URL.
        url: String,
    },
    /// Sending the request or reading the response failed.
    Io {
        /// The URL.
        url: String,
        /// The error.
        source: io::Error,
    },
    /// The response is not HTTP/1.1 as this client understands it, or a
    /// redirect cannot be followed.
    Protocol {
        /// The URL.
        url: String,
        /// What is wrong.
        problem: String,
    },
    /// More than [`MAX_REDIRECTS`] redirects.
    TooManyRedirects {
        /// The last URL redirected to.
        url: String,
    },
}

/// A byte stream a request runs over.
pub trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

/// The client: timeouts, the overall deadline of a request and an
/// optional TLS configuration.
#[derive(Clone, Debug)]
pub struct Client {
    /// Whom `https` URLs are trusted by ([`registry_tls`](crate::registry_tls));
    /// without one, `https` URLs fail.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// How long connecting may take.
    pub connect_timeout: Duration,
    /// How long one socket read or write may take.
    pub io_timeout: Duration,
    /// How long one request may take in all, from its first connection to
    /// the last byte of its body, redirects included.
    pub deadline: Duration,
    /// The `User-Agent` header.
    pub user_agent: &'static str,
    /// How failed requests are tried again (by [`Session`](crate::Session)).
    pub retry: crate::retry::RetryPolicy,
}

/// The methods the registry API needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Method {
    /// `GET`: redirects are followed.
    #[default]
    Get,
    /// `HEAD`: redirects are followed; the response has no body.
    Head,
    /// `POST`: never redirected.
    Post,
    /// `PUT`: never redirected.
    Put,
}

impl Method {
    /// The method's name on the request line.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Post => "POST",
            Method::Put => "PUT",
        }
    }

    /// Whether a redirect answering it is followed: a body cannot be
    /// sent twice on one try.
    fn follows_redirects(self) -> bool {
        matches!(self, Method::Get | Method::Head)
    }
}

/// A request body of `len` bytes, opened afresh for every try (so a
/// retried upload sends it whole again).
#[derive(Clone, Copy)]
pub struct Upload<'a> {
    /// The body's length, sent as `Content-Length`.
    pub len: u64,
    /// The `Content-Type` header.
    pub content_type: &'a str,
    /// Opens the body at its first byte.
    pub open: &'a (dyn Fn() -> io::Result<Box<dyn Read>> + Sync + 'a),
}

impl std::fmt::Debug for Upload<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upload")
            .field("len", &self.len)
            .field("content_type", &self.content_type)
            .finish_non_exhaustive()
    }
}

/// What a request sends besides its URL.
#[derive(Clone, Copy, Debug, Default)]
pub struct Request<'a> {
    /// The method.
    pub method: Method,
    /// The `Accept` header.
    pub accept: Option<&'a str>,
    /// The `Authorization` header: sent to the URL asked for and to
    /// redirects on the same scheme and authority, never elsewhere.
    pub authorization: Option<&'a str>,
    /// `Range: bytes=<from>-`: resuming a body from byte `from`.
    pub range_from: Option<u64>,
    /// A deadline of the caller's (a whole installation's), when it comes
    /// before the request's own.
    pub install_deadline: Option<Deadline>,
    /// The body; `POST` and `PUT` without one send `Content-Length: 0`.
    pub upload: Option<Upload<'a>>,
}

/// A response whose head was read; the body is read through
/// [`Response::body`].
pub struct Response {
    /// The URL that answered (after redirects).
    pub url: Url,
    /// The status code.
    pub status: u16,
    /// The reason phrase.
    pub reason: String,
    headers: Vec<(String, String)>,
    /// The body, read through its framing.
    pub body: Body,
}

impl Response {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    /// The body's length, when the response declares one.
    pub fn content_length(&self) -> Option<u64> {
        self.body.remaining()
    }

    /// Reads the whole body if it is at most `limit` bytes; `Ok(None)` if
    /// it is longer.
    pub fn read_body(&mut self, limit: u64) -> io::Result<Option<Vec<u8>>> {
        if self.content_length().is_some_and(|len| len > limit) {
            return Ok(None);
        }
        let mut data = Vec::new();
        (&mut self.body).take(limit + 1).read_to_end(&mut data)?;
        Ok((data.len() as u64 <= limit).then_some(data))
    }
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// Whether a redirect from `from` to `to` may be followed: to `https`
/// anywhere, or to the same scheme and authority (so never from `https`
/// down to `http`, and never to another host in the clear).
pub fn may_redirect(from: &Url, to: &Url) -> bool {
    to.scheme == Scheme::Https || to.same_origin(from)
}

impl Client {
    /// Sends `request` to `url`, following redirects for `GET` and `HEAD`
    /// (see [`may_redirect`]), all within the client's deadline.
    pub fn send(&self, url: &Url, request: Request<'_>) -> Result<Response, HttpError> {
        let deadline = Deadline::after(self.deadline).earliest(request.install_deadline);
        let origin = url.clone();
        let mut url = url.clone();
        for _ in 0..=MAX_REDIRECTS {
            let authorization = request.authorization.filter(|_| url.same_origin(&origin));
            let response = self.send_once(&url, request, authorization, deadline)?;
            if !request.method.follows_redirects()
                || !matches!(response.status, 301 | 302 | 303 | 307 | 308)
            {
                return Ok(response);
            }
            let Some(location) = response.header("location") else {
                return Err(HttpError::Protocol {
                    url: url.to_string(),
                    problem: format!("redirect {} without a Location header", response.status),
                });
            };
            let next = url.join(location).map_err(|problem| HttpError::Protocol {
                url: url.to_string(),
                problem,
            })?;
            if !may_redirect(&url, &next) {
                return Err(HttpError::Protocol {
                    url: url.to_string(),
                    problem: format!(
                        "refusing the redirect to {}: only https is followed to another host or scheme",
                        bounded(&next.to_string())
                    ),
                });
            }
            url = next;
        }
        Err(HttpError::TooManyRedirects {
            url: url.to_string(),
        })
    }

    /// One request on a new connection, without following redirects.
    fn send_once(
        &self,
        url: &Url,
        request: Request<'_>,
        authorization: Option<&str>,
        deadline: Deadline,
    ) -> Result<Response, HttpError> {
        let mut stream = self.connect(url, deadline)?;
        let io_error = |source| HttpError::Io {
            url: url.to_string(),
            source,
        };
        let mut head = format!(
            "{} {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: {}\r\nConnection: close\r\n",
            request.method.as_str(),
            url.target,
            url.authority,
            self.user_agent
        );
        if let Some(from) = request.range_from {
            head.push_str(&format!("Range: bytes={from}-\r\n"));
        }
        match (request.method, request.upload) {
            (_, Some(upload)) => {
                head.push_str(&format!("Content-Length: {}\r\n", upload.len));
            }
            (Method::Post | Method::Put, None) => head.push_str("Content-Length: 0\r\n"),
            _ => {}
        }
        let content_type = request.upload.map(|u| u.content_type);
        for (name, value) in [
            ("Accept", request.accept),
            ("Authorization", authorization),
            ("Content-Type", content_type),
        ] {
            if let Some(value) = value {
                if value.bytes().any(|b| b.is_ascii_control()) {
                    return Err(HttpError::Protocol {
                        url: url.to_string(),
                        problem: format!("control character in the {name} header"),
                    });
                }
                head.push_str(&format!("{name}: {value}\r\n"));
            }
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).map_err(io_error)?;
        if let Some(upload) = request.upload {
            send_body(&mut stream, upload).map_err(io_error)?;
        }
        stream.flush().map_err(io_error)?;
        read_response(
            url,
            request.method,
            BufReader::with_capacity(64 * 1024, stream),
        )
    }

    fn connect(&self, url: &Url, deadline: Deadline) -> Result<Box<dyn Stream>, HttpError> {
        let connect_error = |source| HttpError::Connect {
            authority: url.authority.clone(),
            source,
        };
        let addresses: Vec<SocketAddr> = (url.host.as_str(), url.port)
            .to_socket_addrs()
            .map_err(connect_error)?
            .collect();
        let mut last_error = io::Error::new(
            io::ErrorKind::NotFound,
            "the host name resolves to no address",
        );
        let mut connected = None;
        for address in addresses {
            let timeout = match deadline.bound(self.connect_timeout) {
                Ok(timeout) => timeout,
                Err(e) => {
                    last_error = e;
                    break;
                }
            };
            match TcpStream::connect_timeout(&address, timeout) {
                Ok(stream) => {
                    connected = Some(stream);
                    break;
                }
                Err(e) => last_error = deadline.explain(e),
            }
        }
        let tcp = connected.ok_or_else(|| connect_error(last_error))?;
        tcp.set_nodelay(true).map_err(connect_error)?;
        let socket = DeadlineSocket::new(tcp, self.io_timeout, deadline);
        match url.scheme {
            Scheme::Http => Ok(Box::new(socket)),
            Scheme::Https => {
                let Some(config) = &self.tls else {
                    return Err(HttpError::TlsUnavailable {
                        url: url.to_string(),
                    });
                };
                let tls_error = |source| HttpError::Tls {
                    authority: url.authority.clone(),
                    source,
                };
                let name = ServerName::try_from(url.host.clone())
                    .map_err(|e| tls_error(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
                let mut connection = rustls::ClientConnection::new(config.clone(), name)
                    .map_err(|e| tls_error(io::Error::other(e)))?;
                let mut socket = FirstBytes::new(socket);
                while connection.is_handshaking() {
                    if let Err(e) = connection.complete_io(&mut socket) {
                        if socket.is_http_response() {
                            return Err(HttpError::PlainHttp {
                                authority: url.authority.clone(),
                            });
                        }
                        return Err(tls_error(e));
                    }
                }
                Ok(Box::new(rustls::StreamOwned::new(
                    connection,
                    socket.into_inner(),
                )))
            }
        }
    }
}

/// A socket that keeps the first bytes read from it: a server that
/// answers a TLS `ClientHello` with `HTTP/1.x 400 ...` speaks plain HTTP,
/// which these bytes tell from a broken TLS server.
struct FirstBytes<S> {
    inner: S,
    head: [u8; 5],
    len: usize,
}

impl<S> FirstBytes<S> {
    fn new(inner: S) -> Self {
        FirstBytes {
            inner,
            head: [0; 5],
            len: 0,
        }
    }

    /// Whether the peer's first bytes are an HTTP/1 status line's.
    fn is_http_response(&self) -> bool {
        self.len == self.head.len() && &self.head == b"HTTP/"
    }

    fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Read> Read for FirstBytes<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let take = (self.head.len() - self.len).min(n);
        self.head[self.len..self.len + take].copy_from_slice(&buf[..take]);
        self.len += take;
        Ok(n)
    }
}

impl<S: Write> Write for FirstBytes<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Reads the response to a request sent on `reader`'s stream for `url`:
/// the head (interim `1xx` responses skipped), and the body's framing.
pub fn read_response(
    url: &Url,
    method: Method,
    mut reader: BufReader<Box<dyn Stream>>,
) -> Result<Response, HttpError> {
    let io_error = |source| HttpError::Io {
        url: url.to_string(),
        source,
    };
    loop {
        let head = read_head(&mut reader).map_err(io_error)?;
        let (status, reason, headers) =
            parse_head(&head).map_err(|problem| HttpError::Protocol {
                url: url.to_string(),
                problem,
            })?;
        // Interim responses precede the real one (101 is not expected:
        // nothing asks to switch protocols).
        if (100..200).contains(&status) && status != 101 {
            continue;
        }
        let framing = if method == Method::Head {
            Framing::Done
        } else {
            framing(status, &headers).map_err(|problem| HttpError::Protocol {
                url: url.to_string(),
                problem,
            })?
        };
        return Ok(Response {
            url: url.clone(),
            status,
            reason,
            headers,
            body: Body::new(reader, framing),
        });
    }
}

/// Sends `upload`'s `len` bytes: fewer or more from its reader is an
/// error, since the head promised `len`.
fn send_body(stream: &mut dyn Stream, upload: Upload<'_>) -> io::Result<()> {
    let reader = (upload.open)()?;
    let copied = io::copy(&mut reader.take(upload.len), stream)?;
    if copied != upload.len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("the body ended after {copied} of its {} bytes", upload.len),
        ));
    }
    Ok(())
}

/// At most the first 200 characters of `text` (for messages quoting what
/// a server sent).
pub fn bounded(text: &str) -> String {
    const LIMIT: usize = 200;
    match text.char_indices().nth(LIMIT) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_string(),
    }
}

/// Reads a response head, up to and including its empty line.
fn read_head(reader: &mut impl BufRead) -> io::Result<Vec<u8>> {
    let mut head = Vec::new();
    loop {
        let remaining = MAX_HEAD_BYTES.saturating_sub(head.len() as u64);
        let start = head.len();
        let read = reader
            .by_ref()
            .take(remaining)
            .read_until(b'\n', &mut head)?;
        if read == 0 {
            return Err(if head.is_empty() {
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed without a response",
                )
            } else {
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed in the response head",
                )
            });
        }
        if !head.ends_with(b"\n") {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("response head longer than {MAX_HEAD_BYTES} bytes"),
            ));
        }
        let line = &head[start..];
        if line == b"\r\n" || line == b"\n" {
            return Ok(head);
        }
    }
}

type Head = (u16, String, Vec<(String, String)>);

/// Status, reason and headers of a complete response head.
fn parse_head(head: &[u8]) -> Result<Head, String> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut slots);
    match response.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err("incomplete response head".to_string()),
        Err(e) => return Err(format!("malformed response head: {e}")),
    }
    let status = response.code.unwrap_or(0);
    if response.version != Some(1) && response.version != Some(0) {
        return Err("not an HTTP/1.x response".to_string());
    }
    let reason = response.reason.unwrap_or("").to_string();
    let headers = response
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_string(),
                String::from_utf8_lossy(h.value).trim().to_string(),
            )
        })
        .collect();
    Ok((status, reason, headers))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::io::Cursor;

    #[test]
    fn heads() {
        let mut reader = Cursor::new(b"HTTP/1.1 200 OK\r\nA: b\r\n\r\nbody".to_vec());
        let head = read_head(&mut reader).unwrap();
        let (status, reason, headers) = parse_head(&head).unwrap();
        assert_eq!((status, reason.as_str()), (200, "OK"));
        assert_eq!(header(&headers, "a"), Some("b"));
        let mut rest = String::new();
        reader.read_to_string(&mut rest).unwrap();
        assert_eq!(rest, "body");

        assert!(read_head(&mut Cursor::new(b"HTTP/1.1 200 OK\r\n".to_vec())).is_err());
        assert!(read_head(&mut Cursor::new(Vec::new())).is_err());
        let huge = format!("HTTP/1.1 200 OK\r\nA: {}\r\n\r\n", "x".repeat(70_000));
        assert!(read_head(&mut Cursor::new(huge.into_bytes())).is_err());
        assert!(parse_head(b"HTTP/2 200 OK\r\n\r\n").is_err());
        assert!(parse_head(b"garbage\r\n\r\n").is_err());
    }

    #[test]
    fn an_http_answer_to_a_tls_handshake_is_told_apart() {
        let mut plain = FirstBytes::new(Cursor::new(b"HTTP/1.1 400 Bad Request\r\n".to_vec()));
        let mut buf = [0u8; 3];
        plain.read_exact(&mut buf).unwrap();
        assert!(!plain.is_http_response(), "only 3 bytes seen");
        plain.read_exact(&mut buf).unwrap();
        assert!(plain.is_http_response());
        let mut tls = FirstBytes::new(Cursor::new(vec![0x15, 3, 3, 0, 2, 2, 40]));
        let mut all = Vec::new();
        tls.read_to_end(&mut all).unwrap();
        assert!(!tls.is_http_response());
    }
}
