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

pub(crate) use super::body::Body;
use super::body::framing;
use super::deadline::{Deadline, DeadlineSocket};
pub(crate) use super::url::{Scheme, Url};

/// The largest response head accepted.
pub(crate) const MAX_HEAD_BYTES: u64 = 64 * 1024;
/// The most header fields accepted in a response.
pub(crate) const MAX_HEADERS: usize = 100;
/// The most redirects followed for one request.
pub(crate) const MAX_REDIRECTS: u32 = 5;

/// Why a request failed.
#[derive(Debug)]
pub(crate) enum HttpError {
    /// No connection could be made to `authority`.
    Connect {
        authority: String,
        source: io::Error,
    },
    /// The TLS handshake with `authority` failed.
    Tls {
        authority: String,
        source: io::Error,
    },
    /// An `https` URL without a TLS client configuration.
    TlsUnavailable { url: String },
    /// Sending the request or reading the response failed.
    Io { url: String, source: io::Error },
    /// The response is not HTTP/1.1 as this client understands it, or a
    /// redirect cannot be followed.
    Protocol { url: String, problem: String },
    /// More than [`MAX_REDIRECTS`] redirects.
    TooManyRedirects { url: String },
}

/// A byte stream a request runs over.
pub(super) trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

/// The client: timeouts, the overall deadline of a request and an
/// optional TLS configuration.
#[derive(Clone, Debug)]
pub(crate) struct Client {
    pub(crate) tls: Option<Arc<rustls::ClientConfig>>,
    pub(crate) connect_timeout: Duration,
    pub(crate) io_timeout: Duration,
    /// How long one request may take in all, from its first connection to
    /// the last byte of its body, redirects included.
    pub(crate) deadline: Duration,
    pub(crate) user_agent: &'static str,
    /// How failed requests are tried again (by [`Session`](super::auth::Session)).
    pub(crate) retry: super::retry::RetryPolicy,
}

/// What a `GET` sends besides the request line.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Get<'a> {
    /// The `Accept` header.
    pub(crate) accept: Option<&'a str>,
    /// The `Authorization` header: sent to the URL asked for and to
    /// redirects on the same scheme and authority, never elsewhere.
    pub(crate) authorization: Option<&'a str>,
    /// `Range: bytes=<from>-`: resuming a body from byte `from`.
    pub(crate) range_from: Option<u64>,
    /// The whole installation's deadline, when it comes before the
    /// request's own.
    pub(crate) install_deadline: Option<Deadline>,
}

/// A response whose head was read; the body is read through
/// [`Response::body`].
pub(crate) struct Response {
    /// The URL that answered (after redirects).
    pub(crate) url: Url,
    pub(crate) status: u16,
    pub(crate) reason: String,
    headers: Vec<(String, String)>,
    pub(crate) body: Body,
}

impl Response {
    /// The first value of header `name` (case-insensitive).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    /// The body's length, when the response declares one.
    pub(crate) fn content_length(&self) -> Option<u64> {
        self.body.remaining()
    }

    /// Reads the whole body if it is at most `limit` bytes; `Ok(None)` if
    /// it is longer.
    pub(crate) fn read_body(&mut self, limit: u64) -> io::Result<Option<Vec<u8>>> {
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
pub(crate) fn may_redirect(from: &Url, to: &Url) -> bool {
    to.scheme == Scheme::Https || to.same_origin(from)
}

impl Client {
    /// `GET url`, following redirects (see [`may_redirect`]), all within
    /// the client's deadline.
    pub(crate) fn get(&self, url: &Url, get: Get<'_>) -> Result<Response, HttpError> {
        let deadline = Deadline::after(self.deadline).earliest(get.install_deadline);
        let origin = url.clone();
        let mut url = url.clone();
        for _ in 0..=MAX_REDIRECTS {
            let authorization = get.authorization.filter(|_| url.same_origin(&origin));
            let response = self.get_once(&url, get, authorization, deadline)?;
            if !matches!(response.status, 301 | 302 | 303 | 307 | 308) {
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

    /// One `GET` on a new connection, without following redirects.
    fn get_once(
        &self,
        url: &Url,
        get: Get<'_>,
        authorization: Option<&str>,
        deadline: Deadline,
    ) -> Result<Response, HttpError> {
        let mut stream = self.connect(url, deadline)?;
        let io_error = |source| HttpError::Io {
            url: url.to_string(),
            source,
        };
        let mut request = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: {}\r\nConnection: close\r\n",
            url.target, url.authority, self.user_agent
        );
        if let Some(from) = get.range_from {
            request.push_str(&format!("Range: bytes={from}-\r\n"));
        }
        for (name, value) in [("Accept", get.accept), ("Authorization", authorization)] {
            if let Some(value) = value {
                if value.bytes().any(|b| b.is_ascii_control()) {
                    return Err(HttpError::Protocol {
                        url: url.to_string(),
                        problem: format!("control character in the {name} header"),
                    });
                }
                request.push_str(&format!("{name}: {value}\r\n"));
            }
        }
        request.push_str("\r\n");
        stream.write_all(request.as_bytes()).map_err(io_error)?;
        stream.flush().map_err(io_error)?;
        read_response(url, BufReader::with_capacity(64 * 1024, stream))
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
                let connection = rustls::ClientConnection::new(config.clone(), name)
                    .map_err(|e| tls_error(io::Error::other(e)))?;
                let mut stream = rustls::StreamOwned::new(connection, socket);
                while stream.conn.is_handshaking() {
                    stream
                        .conn
                        .complete_io(&mut stream.sock)
                        .map_err(tls_error)?;
                }
                Ok(Box::new(stream))
            }
        }
    }
}

/// Reads the response to a request sent on `reader`'s stream for `url`:
/// the head (interim `1xx` responses skipped), and the body's framing.
pub(crate) fn read_response(
    url: &Url,
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
        let framing = framing(status, &headers).map_err(|problem| HttpError::Protocol {
            url: url.to_string(),
            problem,
        })?;
        return Ok(Response {
            url: url.clone(),
            status,
            reason,
            headers,
            body: Body::new(reader, framing),
        });
    }
}

/// At most the first 200 characters of `text` (for messages quoting what
/// a server sent).
pub(crate) fn bounded(text: &str) -> String {
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
}
