//! The in-test registry of the installer's tests: a small HTTP/1.1
//! server on 127.0.0.1 (optionally over TLS) serving manifests and blobs
//! the way the OCI distribution API does, asking for logins like a
//! registry with token or Basic authentication, and misbehaving on
//! purpose (wrong bytes, short bodies, redirects, dripping bodies).
//!
//! Shared by the installer's test files; each uses only part of it.

#![allow(dead_code, clippy::unwrap_used)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use bmaas_agent::install::{InstallError, Installer, OciInstaller, Progress};
use metropolis_proto::prelude::debug::OsImageRef;
use sha2::{Digest as _, Sha256};

pub const RAW: &str = "application/vnd.oci.image.layer.v1.tar";
pub const ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const REPO: &str = "os/metropolis";

pub fn sha256(data: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(data))
}

/// Deterministic, poorly compressible test data.
pub fn image(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// A zstd frame built by hand from raw (stored) blocks: frame header with
/// the single-segment flag and an 8-byte content size, then blocks of at
/// most 128 KiB, each with a 3-byte header (last flag, type 0 = raw,
/// size), no checksum.
pub fn raw_zstd_frame(data: &[u8]) -> Vec<u8> {
    let mut frame = 0xFD2F_B528u32.to_le_bytes().to_vec();
    frame.push(0b1110_0000); // FCS field 8 bytes, single segment.
    frame.extend_from_slice(&(data.len() as u64).to_le_bytes());
    let blocks: Vec<&[u8]> = data.chunks(128 * 1024).collect();
    for (i, block) in blocks.iter().enumerate() {
        let last = u32::from(i + 1 == blocks.len());
        let header = last | ((block.len() as u32) << 3);
        frame.extend_from_slice(&header.to_le_bytes()[..3]);
        frame.extend_from_slice(block);
    }
    frame
}

#[derive(Clone, Copy, PartialEq)]
pub enum Framing {
    Length,
    Chunked,
    /// No length: the body ends when the connection closes.
    Close,
    /// Declares the full length, sends this many bytes, closes.
    Truncated(usize),
    /// Declares the full length, sends the first `fast` bytes at once,
    /// then `chunk` bytes every `pause`.
    Drip {
        fast: usize,
        chunk: usize,
        pause: Duration,
    },
}

#[derive(Clone)]
pub enum Route {
    Reply {
        status: u16,
        content_type: Option<String>,
        body: Vec<u8>,
        framing: Framing,
    },
    Redirect {
        status: u16,
        location: String,
    },
    /// A token server: `{"token": token}` to a request whose
    /// Authorization is `expect` (`None`: any, anonymous included), `401`
    /// to others.
    Token {
        expect: Option<String>,
        token: String,
    },
}

impl Route {
    pub fn ok(content_type: &str, body: Vec<u8>) -> Route {
        Route::Reply {
            status: 200,
            content_type: Some(content_type.to_string()),
            body,
            framing: Framing::Length,
        }
    }
}

/// What the server saw of one request.
#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    pub accept: Option<String>,
    pub authorization: Option<String>,
}

/// A registry's login requirement: `/v2/` requests without this exact
/// Authorization are answered `401` with this challenge.
#[derive(Clone)]
pub struct Gate {
    pub authorization: String,
    pub challenge: String,
}

/// The in-test registry.
pub struct Registry {
    pub addr: SocketAddr,
    pub routes: Arc<Mutex<HashMap<String, Route>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    gate: Arc<Mutex<Option<Gate>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Registry {
    pub fn start() -> Registry {
        Registry::start_with(None)
    }

    pub fn start_with(tls: Option<Arc<rustls::ServerConfig>>) -> Registry {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let routes = Arc::new(Mutex::new(HashMap::new()));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let gate = Arc::new(Mutex::new(None));
        let thread = {
            let (routes, seen, stop) = (routes.clone(), seen.clone(), stop.clone());
            let gate = gate.clone();
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(stream) = stream else { continue };
                    stream
                        .set_read_timeout(Some(Duration::from_secs(10)))
                        .unwrap();
                    match &tls {
                        None => serve(stream, &routes, &seen, &gate),
                        Some(config) => {
                            let connection = rustls::ServerConnection::new(config.clone()).unwrap();
                            let mut tls = rustls::StreamOwned::new(connection, stream);
                            serve(&mut tls, &routes, &seen, &gate);
                            tls.conn.send_close_notify();
                            let _ = tls.flush();
                        }
                    }
                }
            })
        };
        Registry {
            addr,
            routes,
            seen,
            gate,
            stop,
            thread: Some(thread),
        }
    }

    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// Asks for a login from now on (`None`: no longer).
    pub fn require(&self, gate: Option<Gate>) {
        *self.gate.lock().unwrap() = gate;
    }

    pub fn route(&self, path: &str, route: Route) {
        self.routes.lock().unwrap().insert(path.to_string(), route);
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Serves `layer` as the only layer of a manifest; the manifest's
    /// digest and the layer's digest.
    pub fn push(&self, media_type: &str, layer: &[u8]) -> (String, String) {
        let layer_digest = sha256(layer);
        let manifest = manifest(media_type, &layer_digest, layer.len() as u64);
        let digest = sha256(&manifest);
        self.route(
            &format!("/v2/{REPO}/manifests/{digest}"),
            Route::ok(OCI_MANIFEST, manifest),
        );
        self.route(
            &format!("/v2/{REPO}/blobs/{layer_digest}"),
            Route::ok("application/octet-stream", layer.to_vec()),
        );
        (digest, layer_digest)
    }

    pub fn image_ref(&self, digest: &str) -> OsImageRef {
        OsImageRef {
            scheme: "http".into(),
            host: self.host(),
            repository: REPO.into(),
            tag: String::new(),
            digest: digest.into(),
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

pub fn manifest(media_type: &str, layer_digest: &str, size: u64) -> Vec<u8> {
    format!(
        r#"{{
  "schemaVersion": 2,
  "mediaType": "{OCI_MANIFEST}",
  "config": {{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": "{}", "size": 2}},
  "layers": [{{"mediaType": "{media_type}", "digest": "{layer_digest}", "size": {size}}}]
}}"#,
        sha256(b"{}")
    )
    .into_bytes()
}

/// Answers one request on `stream`.
pub fn serve(
    mut stream: impl Read + Write,
    routes: &Mutex<HashMap<String, Route>>,
    seen: &Mutex<Vec<Seen>>,
    gate: &Mutex<Option<Gate>>,
) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut lines = head.lines();
    let path = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .unwrap_or("")
        .to_string();
    let fields: Vec<(&str, &str)> = lines.filter_map(|l| l.split_once(':')).collect();
    let field = |wanted: &str| {
        fields
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(wanted))
            .map(|(_, value)| value.trim().to_string())
    };
    let authorization = field("authorization");
    seen.lock().unwrap().push(Seen {
        path: path.clone(),
        accept: field("accept"),
        authorization: authorization.clone(),
    });
    let gate = gate.lock().unwrap().clone();
    let route = match gate {
        Some(gate)
            if path.starts_with("/v2/")
                && authorization.as_deref() != Some(gate.authorization.as_str()) =>
        {
            Some(Route::Reply {
                status: 401,
                content_type: Some("application/json".into()),
                body:
                    br#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#
                        .to_vec(),
                framing: Framing::Length,
            })
            .map(|route| (route, Some(gate.challenge)))
        }
        _ => {
            let routes = routes.lock().unwrap();
            let without_query = path.split('?').next().unwrap_or("");
            routes
                .get(&path)
                .or_else(|| routes.get(without_query))
                .cloned()
                .map(|route| (route, None))
        }
    };
    let (route, challenge) = match route {
        Some((route, challenge)) => (Some(route), challenge),
        None => (None, None),
    };
    let route = match route {
        Some(Route::Token { expect, token }) => {
            Some(if expect.is_none() || expect == authorization {
                Route::ok(
                    "application/json",
                    format!(r#"{{"token":"{token}","expires_in":300}}"#).into_bytes(),
                )
            } else {
                Route::Reply {
                    status: 401,
                    content_type: None,
                    body: Vec::new(),
                    framing: Framing::Length,
                }
            })
        }
        other => other,
    };
    let route = route.unwrap_or_else(|| Route::Reply {
        status: 404,
        content_type: Some("application/json".into()),
        body: br#"{"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown to registry"}]}"#
            .to_vec(),
        framing: Framing::Length,
    });
    let response = match route {
        Route::Redirect { status, location } => format!(
            "HTTP/1.1 {status} Redirect\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n"
        )
        .into_bytes(),
        Route::Token { .. } => return,
        Route::Reply {
            status,
            content_type,
            body,
            framing,
        } => {
            let mut out = format!("HTTP/1.1 {status} Whatever\r\n");
            if let Some(challenge) = &challenge {
                out.push_str(&format!("WWW-Authenticate: {challenge}\r\n"));
            }
            if let Some(content_type) = content_type {
                out.push_str(&format!("Content-Type: {content_type}\r\n"));
            }
            match framing {
                Framing::Length | Framing::Truncated(_) | Framing::Drip { .. } => {
                    out.push_str(&format!("Content-Length: {}\r\n", body.len()));
                }
                Framing::Chunked => out.push_str("Transfer-Encoding: chunked\r\n"),
                Framing::Close => {}
            }
            out.push_str("Connection: close\r\n\r\n");
            let mut out = out.into_bytes();
            match framing {
                Framing::Length | Framing::Close => out.extend_from_slice(&body),
                Framing::Truncated(n) => out.extend_from_slice(&body[..n]),
                Framing::Drip { fast, chunk, pause } => {
                    out.extend_from_slice(&body[..fast.min(body.len())]);
                    if stream.write_all(&out).is_err() {
                        return;
                    }
                    let _ = stream.flush();
                    for piece in body[fast.min(body.len())..].chunks(chunk.max(1)) {
                        std::thread::sleep(pause);
                        if stream
                            .write_all(piece)
                            .and_then(|()| stream.flush())
                            .is_err()
                        {
                            return;
                        }
                    }
                    return;
                }
                Framing::Chunked => {
                    for chunk in body.chunks(100_003) {
                        out.extend_from_slice(format!("{:x};ext\r\n", chunk.len()).as_bytes());
                        out.extend_from_slice(chunk);
                        out.extend_from_slice(b"\r\n");
                    }
                    out.extend_from_slice(b"0\r\nX-Trailer: y\r\n\r\n");
                }
            }
            out
        }
    };
    let _ = stream.write_all(&response);
    let _ = stream.flush();
}

/// An installer with short timeouts, writing image files (the tests'
/// root devices are files).
pub fn installer() -> OciInstaller {
    OciInstaller::new()
        .with_timeouts(Duration::from_secs(5), Duration::from_secs(10))
        .allow_image_files(true)
}

/// Installs, collecting the progress reports.
pub fn install(
    installer: &OciInstaller,
    image: &OsImageRef,
    device: &Path,
) -> (Result<(), InstallError>, Vec<Progress>) {
    let mut reports = Vec::new();
    let result = installer.install(image, device, &mut |p: &Progress| reports.push(p.clone()));
    (result, reports)
}

pub fn must_fail(result: (Result<(), InstallError>, Vec<Progress>)) -> InstallError {
    match result.0 {
        Ok(()) => panic!("the installation succeeded"),
        Err(e) => e,
    }
}

pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub fn client_trusting(cert: &rcgen::Certificate) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// A TLS server configuration for 127.0.0.1 with a fresh self-signed
/// certificate, and that certificate (for the client to trust).
pub fn tls_server() -> (Arc<rustls::ServerConfig>, rcgen::Certificate) {
    let key = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![key.cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.signing_key.serialize_der().into()),
        )
        .unwrap();
    (Arc::new(config), key.cert)
}
