//! The in-test registry of the installer's tests: a small HTTP/1.1
//! server on 127.0.0.1 (optionally over TLS) serving manifests and blobs
//! the way the OCI distribution API does, asking for logins like a
//! registry with token or Basic authentication, and misbehaving on
//! purpose (wrong bytes, short bodies, redirects, dripping bodies,
//! answers that change from one request to the next).
//!
//! Images are OS images as docs/spec/metropolis-install.md section 1 has
//! them: an OCI manifest with an `artifactType`, the OS image config
//! (each payload's size and the SHA-256 of each of its chunks) and one
//! layer per payload. They are built here from the spec, independently of
//! the agent's reader ([`os_manifest`], [`os_config`], [`payload_config`]),
//! and pushed with [`Registry::push_disk`], [`Registry::push_metropolis`]
//! or, for forged images, [`Registry::push_image`].
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

use base64::Engine as _;
use bmaas_agent::install::{InstallError, Installer, OciInstaller, Progress, RetryPolicy, Target};
use metropolis_proto::prelude::debug::OsImageRef;
use sha2::{Digest as _, Sha256};

/// A raw payload layer.
pub const RAW: &str = "application/octet-stream";
/// A zstd-compressed payload layer.
pub const ZSTD: &str = "application/zstd";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// The OS image config's media type.
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.monogon.os.image.config.v1+json";
/// A whole-disk image's `artifactType` (one payload, `disk`).
pub const DISK_ARTIFACT: &str = "application/vnd.metropolis-rs.os.disk-image.v1";
/// A Metropolis image's `artifactType` (`kernel.efi` and `system`).
pub const METROPOLIS_ARTIFACT: &str = "application/vnd.monogon.os.image.v1";
pub const REPO: &str = "os/metropolis";

pub fn sha256(data: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(data))
}

/// How a payload's layer is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// `application/octet-stream`: the payload as it is.
    Raw,
    /// `application/zstd`: one zstd frame (libzstd, level 1).
    Zstd,
}

impl Compression {
    /// The layer's media type and bytes for `payload`.
    pub fn layer(self, payload: &[u8]) -> (&'static str, Vec<u8>) {
        match self {
            Compression::Raw => (RAW, payload.to_vec()),
            Compression::Zstd => (
                ZSTD,
                zstd::bulk::compress(payload, 1).expect("libzstd compresses in memory"),
            ),
        }
    }
}

/// The SHA-256 of each `chunk`-byte chunk of `payload` (the last may be
/// shorter), in standard base64 without padding.
pub fn chunk_hashes(payload: &[u8], chunk: usize) -> Vec<String> {
    payload
        .chunks(chunk)
        .map(|c| base64::engine::general_purpose::STANDARD_NO_PAD.encode(Sha256::digest(c)))
        .collect()
}

/// One payload's entry of an OS image config, hashing `payload`
/// (uncompressed) in chunks of `chunk` bytes.
pub fn payload_config(name: &str, payload: &[u8], chunk: usize) -> String {
    payload_entry(
        name,
        payload.len() as u64,
        chunk as u64,
        &chunk_hashes(payload, chunk),
    )
}

/// A payload entry as given, for configs that lie.
pub fn payload_entry(name: &str, size: u64, chunk: u64, hashes: &[String]) -> String {
    let hashes: Vec<String> = hashes.iter().map(|h| format!("\"{h}\"")).collect();
    format!(
        r#"{{"name":"{name}","size":{size},"hash_chunk_size":{chunk},"chunk_hashes_sha256":[{}]}}"#,
        hashes.join(",")
    )
}

/// An OS image config of `format_version` with `payloads` (entries from
/// [`payload_config`] or [`payload_entry`]).
pub fn os_config(format_version: &str, payloads: &[String]) -> Vec<u8> {
    format!(
        r#"{{"format_version":"{format_version}","payloads":[{}]}}"#,
        payloads.join(",")
    )
    .into_bytes()
}

/// A layer descriptor.
pub fn descriptor(media_type: &str, blob: &[u8]) -> String {
    format!(
        r#"{{"mediaType":"{media_type}","digest":"{}","size":{}}}"#,
        sha256(blob),
        blob.len()
    )
}

/// An OS image manifest of `artifact_type` naming `config` (embedded in
/// its descriptor's `data` when `embed`) and `layers` (descriptors, from
/// [`descriptor`]).
pub fn os_manifest(artifact_type: &str, config: &[u8], embed: bool, layers: &[String]) -> Vec<u8> {
    let data = if embed {
        format!(
            r#","data":"{}""#,
            base64::engine::general_purpose::STANDARD.encode(config)
        )
    } else {
        String::new()
    };
    format!(
        r#"{{
  "schemaVersion": 2,
  "mediaType": "{OCI_MANIFEST}",
  "artifactType": "{artifact_type}",
  "config": {{"mediaType": "{CONFIG_MEDIA_TYPE}", "digest": "{}", "size": {}{data}}},
  "layers": [{}]
}}"#,
        sha256(config),
        config.len(),
        layers.join(", ")
    )
    .into_bytes()
}

/// What a push served.
#[derive(Clone, Debug)]
pub struct Pushed {
    /// The manifest's digest: what an `OsImageRef` names.
    pub manifest_digest: String,
    /// The manifest.
    pub manifest: Vec<u8>,
    /// The config's digest.
    pub config_digest: String,
    /// The config.
    pub config: Vec<u8>,
    /// Each layer's digest, in payload order.
    pub layer_digests: Vec<String>,
    /// Each layer's bytes (compressed ones compressed).
    pub layers: Vec<Vec<u8>>,
}

impl Pushed {
    /// The first layer's digest (a whole-disk image's only one).
    pub fn layer_digest(&self) -> &str {
        &self.layer_digests[0]
    }

    /// The path of layer `i`'s blob.
    pub fn blob_path(&self, i: usize) -> String {
        format!("/v2/{REPO}/blobs/{}", self.layer_digests[i])
    }

    /// The path of the config's blob.
    pub fn config_path(&self) -> String {
        format!("/v2/{REPO}/blobs/{}", self.config_digest)
    }

    /// The path of the manifest, by digest.
    pub fn manifest_path(&self) -> String {
        format!("/v2/{REPO}/manifests/{}", self.manifest_digest)
    }
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

#[derive(Clone, Copy, Debug, PartialEq)]
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

#[derive(Clone, Debug)]
pub enum Route {
    /// The same answer to every request, whatever its `Range`.
    Reply {
        status: u16,
        content_type: Option<String>,
        /// More header fields.
        headers: Vec<(String, String)>,
        body: Vec<u8>,
        framing: Framing,
    },
    /// A blob served the way a registry that supports ranges does: a
    /// request without `Range` gets `200` with the whole length declared,
    /// cut after `cut` bytes (the connection closed) when set; one with
    /// `Range: bytes=<n>-` gets `206` with `Content-Range` and the rest
    /// from byte `n`, whole.
    Ranged {
        body: Vec<u8>,
        cut: Option<usize>,
    },
    /// [`Route::Ranged`] with every response (`200` or `206`) cut after
    /// `per_response` bytes: each resume makes progress, none gets far.
    Trickle {
        body: Vec<u8>,
        per_response: usize,
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
    /// Each request takes the first of these; the last one stays.
    Sequence(Vec<Route>),
}

impl Route {
    pub fn ok(content_type: &str, body: Vec<u8>) -> Route {
        Route::Reply {
            status: 200,
            content_type: Some(content_type.to_string()),
            headers: Vec::new(),
            body,
            framing: Framing::Length,
        }
    }

    /// `body` with `status` and `framing`, no media type.
    pub fn framed(status: u16, body: Vec<u8>, framing: Framing) -> Route {
        Route::Reply {
            status,
            content_type: None,
            headers: Vec::new(),
            body,
            framing,
        }
    }

    /// A bodiless answer of `status` with the header fields `headers`.
    pub fn status(status: u16, headers: &[(&str, &str)]) -> Route {
        Route::Reply {
            status,
            content_type: None,
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            body: Vec::new(),
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
    /// The `Range` header.
    pub range: Option<String>,
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

    /// Serves an OS image: `manifest` under its digest, `config` at its
    /// digest unless `config_served` is false (an embedded config needs
    /// no blob), and `layers` (media type, bytes) at theirs.
    pub fn push_manifest(
        &self,
        manifest: Vec<u8>,
        config: Vec<u8>,
        config_served: bool,
        layers: Vec<Vec<u8>>,
    ) -> Pushed {
        let pushed = Pushed {
            manifest_digest: sha256(&manifest),
            config_digest: sha256(&config),
            layer_digests: layers.iter().map(|l| sha256(l)).collect(),
            manifest,
            config,
            layers,
        };
        self.route(
            &pushed.manifest_path(),
            Route::ok(OCI_MANIFEST, pushed.manifest.clone()),
        );
        if config_served {
            self.route(
                &pushed.config_path(),
                Route::ok("application/octet-stream", pushed.config.clone()),
            );
        }
        for (i, layer) in pushed.layers.iter().enumerate() {
            self.route(
                &pushed.blob_path(i),
                Route::ok("application/octet-stream", layer.clone()),
            );
        }
        pushed
    }

    /// Serves an image of `artifact_type` whose config is `config` (served
    /// as a blob) and whose layers are `layers` (media type, bytes).
    pub fn push_image(
        &self,
        artifact_type: &str,
        config: Vec<u8>,
        layers: &[(&str, Vec<u8>)],
    ) -> Pushed {
        let descriptors: Vec<String> = layers
            .iter()
            .map(|(media_type, bytes)| descriptor(media_type, bytes))
            .collect();
        let manifest = os_manifest(artifact_type, &config, false, &descriptors);
        let layers = layers.iter().map(|(_, bytes)| bytes.clone()).collect();
        self.push_manifest(manifest, config, true, layers)
    }

    /// Serves an image of `artifact_type` with `payloads` (name, bytes),
    /// each layer stored as `compression` says and hashed in chunks of
    /// `chunk` bytes; the config is a blob of its own.
    pub fn push_payloads(
        &self,
        artifact_type: &str,
        payloads: &[(&str, &[u8])],
        compression: Compression,
        chunk: usize,
    ) -> Pushed {
        let entries: Vec<String> = payloads
            .iter()
            .map(|(name, bytes)| payload_config(name, bytes, chunk))
            .collect();
        let layers: Vec<(&str, Vec<u8>)> = payloads
            .iter()
            .map(|(_, bytes)| compression.layer(bytes))
            .collect();
        self.push_image(artifact_type, os_config("1", &entries), &layers)
    }

    /// Serves a whole-disk image whose one payload, `disk`, is `payload`.
    pub fn push_disk(&self, payload: &[u8], compression: Compression, chunk: usize) -> Pushed {
        self.push_payloads(DISK_ARTIFACT, &[("disk", payload)], compression, chunk)
    }

    /// Serves a Metropolis image of `kernel` (`kernel.efi`) and `system`.
    pub fn push_metropolis(
        &self,
        kernel: &[u8],
        system: &[u8],
        compression: Compression,
        chunk: usize,
    ) -> Pushed {
        self.push_payloads(
            METROPOLIS_ARTIFACT,
            &[("kernel.efi", kernel), ("system", system)],
            compression,
            chunk,
        )
    }

    /// [`push_disk`](Self::push_disk), raw, in chunks of [`CHUNK`] bytes:
    /// the manifest's digest and the layer's.
    pub fn push(&self, payload: &[u8]) -> (String, String) {
        let pushed = self.push_disk(payload, Compression::Raw, CHUNK);
        (
            pushed.manifest_digest.clone(),
            pushed.layer_digest().to_string(),
        )
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

/// The chunk size of [`Registry::push`]'s images.
pub const CHUNK: usize = 64 * 1024;

/// The first byte a `Range: bytes=<n>-` asks for.
fn range_from(range: &str) -> Option<usize> {
    range
        .strip_prefix("bytes=")?
        .strip_suffix('-')?
        .parse()
        .ok()
}

/// The route for `path`, a [`Route::Sequence`] advanced by one.
fn take_route(routes: &Mutex<HashMap<String, Route>>, path: &str) -> Option<Route> {
    let mut routes = routes.lock().unwrap();
    let without_query = path.split('?').next().unwrap_or("");
    let key = if routes.contains_key(path) {
        path
    } else {
        without_query
    };
    let route = routes.get_mut(key)?;
    match route {
        Route::Sequence(steps) if steps.len() > 1 => Some(steps.remove(0)),
        Route::Sequence(steps) => steps.first().cloned(),
        other => Some(other.clone()),
    }
}

/// The answer of a registry supporting ranges to a request for `body`
/// with `range`: `200`, or `206` from the byte asked for; the first
/// response cut after `cut_first` bytes, each cut after `cut_each`.
fn ranged(
    body: Vec<u8>,
    range: Option<&str>,
    cut_first: Option<usize>,
    cut_each: Option<usize>,
) -> Route {
    let len = body.len();
    let framing = |sent: usize| match cut_each {
        Some(n) if n < sent => Framing::Truncated(n),
        _ => Framing::Length,
    };
    match range.and_then(range_from) {
        Some(from) if from < len => Route::Reply {
            status: 206,
            content_type: Some("application/octet-stream".into()),
            headers: vec![(
                "Content-Range".into(),
                format!("bytes {from}-{}/{len}", len - 1),
            )],
            framing: framing(len - from),
            body: body[from..].to_vec(),
        },
        Some(_) => Route::status(416, &[("Content-Range", &format!("bytes */{len}"))]),
        None => Route::Reply {
            status: 200,
            content_type: Some("application/octet-stream".into()),
            headers: Vec::new(),
            framing: match cut_first {
                Some(n) if n < len => Framing::Truncated(n),
                _ => framing(len),
            },
            body,
        },
    }
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
    let range = field("range");
    seen.lock().unwrap().push(Seen {
        path: path.clone(),
        accept: field("accept"),
        authorization: authorization.clone(),
        range: range.clone(),
    });
    let gate = gate.lock().unwrap().clone();
    let (route, challenge) = match gate {
        Some(gate)
            if path.starts_with("/v2/")
                && authorization.as_deref() != Some(gate.authorization.as_str()) =>
        {
            (
                Some(Route::Reply {
                    status: 401,
                    content_type: Some("application/json".into()),
                    headers: Vec::new(),
                    body:
                        br#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#
                            .to_vec(),
                    framing: Framing::Length,
                }),
                Some(gate.challenge),
            )
        }
        _ => (take_route(routes, &path), None),
    };
    let route = match route {
        Some(Route::Token { expect, token }) => {
            Some(if expect.is_none() || expect == authorization {
                Route::ok(
                    "application/json",
                    format!(r#"{{"token":"{token}","expires_in":300}}"#).into_bytes(),
                )
            } else {
                Route::framed(401, Vec::new(), Framing::Length)
            })
        }
        Some(Route::Ranged { body, cut }) => Some(ranged(body, range.as_deref(), cut, None)),
        Some(Route::Trickle { body, per_response }) => {
            Some(ranged(body, range.as_deref(), None, Some(per_response)))
        }
        other => other,
    };
    let route = route.unwrap_or_else(|| Route::Reply {
        status: 404,
        content_type: Some("application/json".into()),
        headers: Vec::new(),
        body: br#"{"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown to registry"}]}"#
            .to_vec(),
        framing: Framing::Length,
    });
    let response = match route {
        Route::Redirect { status, location } => format!(
            "HTTP/1.1 {status} Redirect\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n"
        )
        .into_bytes(),
        Route::Token { .. } | Route::Ranged { .. } | Route::Trickle { .. } | Route::Sequence(_) => {
            return;
        }
        Route::Reply {
            status,
            content_type,
            headers,
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
            for (name, value) in headers {
                out.push_str(&format!("{name}: {value}\r\n"));
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

/// Retries as fast as they go: three, 1 ms apart, so that a test of a
/// failing registry does not wait out the default backoff.
pub fn fast_retries() -> RetryPolicy {
    RetryPolicy {
        retries: 3,
        first_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(2),
    }
}

/// An installer with short timeouts and [`fast_retries`], writing image
/// files (the tests' root devices are files).
pub fn installer() -> OciInstaller {
    OciInstaller::new()
        .with_timeouts(Duration::from_secs(5), Duration::from_secs(10))
        .with_retries(fast_retries())
        .allow_image_files(true)
}

/// Installs onto `device` (no node parameters), collecting the progress
/// reports.
pub fn install(
    installer: &OciInstaller,
    image: &OsImageRef,
    device: &Path,
) -> (Result<(), InstallError>, Vec<Progress>) {
    let target = Target {
        root_device: device.to_path_buf(),
        node_parameters: None,
        node_parameters_encoded: None,
    };
    let mut reports = Vec::new();
    let result = installer.install(image, &target, &mut |p: &Progress| reports.push(p.clone()));
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
