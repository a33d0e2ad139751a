//! The `registry_responses` harness (see [`crate::fuzz`]): what the
//! installer decodes of a registry's answers, with the installer's own
//! code: manifests and indexes ([`parse_manifest`]), response heads and
//! bodies ([`read_response`], chunked and `Content-Length` framing,
//! [`Response::read_body`]), error documents ([`RegistryError::status`]) and zstd
//! layers ([`ZstdReader`]).
//!
//! Input: a selector byte, `% 6`:
//! - 0: a manifest as sent: a content type choice, a platform choice,
//!   the body (the rest);
//! - 1: a manifest or index built from the input (media types, schema
//!   version, layers or entries with digests, sizes and platforms, each
//!   string a known value or an input string repeated up to 4096 times);
//! - 2: a response as sent: a read buffer size, a body limit (`u16`),
//!   the bytes of the connection (the rest);
//! - 3: a payload (`u16`-length-prefixed) sent back framed by the input:
//!   chunked (chunk sizes, upper-case or zero-padded sizes, extensions,
//!   trailers) or with a `Content-Length`, after interim `100`s, followed
//!   by junk, or cut short;
//! - 4: zstd frames as sent: a read buffer size, the blob (the rest);
//! - 5: a payload compressed into one to three frames by libzstd (with
//!   or without their content checksums), with skippable frames between
//!   them.
//!
//! Checked: nothing panics; every failure is the typed one (a
//! [`ManifestProblem`], an [`HttpError`] that is a protocol error or an
//! I/O error of kind `InvalidData` or `UnexpectedEof`, an `InvalidData`
//! zstd error) and its message is at most [`MAX_MESSAGE`] bytes, however
//! long what the registry sent. An accepted manifest is what the JSON
//! says (its one layer's digest, size and compression; the first entry
//! for the platform); a response's status is final; a body read within a
//! limit is at most the limit and exactly the declared length; a framed
//! payload reads back exactly (and a cut one fails); a compressed one
//! decompresses exactly.

use std::io::{self, BufReader, Cursor, Read, Write};

use metropolis_registry::{HttpError, Method, RegistryError, Response, Stream, Url, read_response};
use serde_json::{Value, json};

use super::image_config::{
    CONFIG_MEDIA_TYPE, DISK_ARTIFACT, METROPOLIS_ARTIFACT, PAYLOAD_RAW, PAYLOAD_ZSTD,
};
use super::manifest::{
    INDEX_TYPES, Manifest, ManifestProblem, OCI_MANIFEST, Platform, parse_manifest,
};
use super::zstd::ZstdReader;
use crate::fuzz::Input;

pub(crate) use super::fuzz_seeds::seeds;

/// The longest failure message accepted, in bytes.
pub const MAX_MESSAGE: usize = 2048;

/// The most decompressed bytes a zstd input is read for.
const MAX_OUTPUT: usize = 1 << 20;

const URL: &str = "http://registry.test:5000/v2/os/image/manifests/latest";

fn bounded(what: &str, message: &str) {
    assert!(
        message.len() <= MAX_MESSAGE,
        "a {}-byte {what} message: {}…",
        message.len(),
        message.chars().take(300).collect::<String>()
    );
}

/// A connection whose peer sent `bytes`.
struct Connection(Cursor<Vec<u8>>);

impl Read for Connection {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Connection {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn connection(bytes: Vec<u8>, capacity: usize) -> BufReader<Box<dyn Stream>> {
    BufReader::with_capacity(capacity.max(1), Box::new(Connection(Cursor::new(bytes))))
}

fn url() -> Url {
    match Url::parse(URL) {
        Ok(url) => url,
        Err(e) => panic!("{URL}: {e}"),
    }
}

/// A known string, or an input string repeated.
fn text(input: &mut Input<'_>, known: &[&str]) -> String {
    let choice = usize::from(input.u8());
    match known.get(choice % (known.len() + 1)) {
        Some(known) => (*known).to_string(),
        None => {
            let s = input.short_string();
            s.repeat(1 + usize::from(input.u8()) * 16)
        }
    }
}

fn digest_text(input: &mut Input<'_>) -> Value {
    match input.u8() % 3 {
        0 => {
            let bytes = input.bytes(32);
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            json!(format!("sha256:{hex:0<64}"))
        }
        1 => json!(text(input, &["sha512:00", "sha256:ABCDEF", "sha256"])),
        _ => json!(input.u64()),
    }
}

fn platform(choice: u8) -> Platform {
    let (architecture, variant) = match choice % 3 {
        0 => ("amd64", None),
        1 => ("arm64", Some("v8".to_string())),
        _ => ("arm", Some("v7".to_string())),
    };
    Platform {
        os: "linux".into(),
        architecture: architecture.into(),
        variant,
    }
}

const MANIFEST_TYPES: [&str; 5] = [
    OCI_MANIFEST,
    METROPOLIS_ARTIFACT,
    INDEX_TYPES[0],
    INDEX_TYPES[1],
    "text/plain",
];

fn built_manifest(input: &mut Input<'_>) -> Vec<u8> {
    let mut doc = serde_json::Map::new();
    let flags = input.u8();
    if flags & 1 != 0 {
        doc.insert("schemaVersion".into(), json!(input.u8() % 4));
    }
    if flags & 2 != 0 {
        doc.insert("mediaType".into(), json!(text(input, &MANIFEST_TYPES)));
    }
    if flags & 16 != 0 {
        doc.insert(
            "artifactType".into(),
            json!(text(
                input,
                &[METROPOLIS_ARTIFACT, DISK_ARTIFACT, OCI_MANIFEST]
            )),
        );
    }
    if flags & 32 != 0 {
        let mut config = json!({
            "mediaType": text(input, &[CONFIG_MEDIA_TYPE, "application/json"]),
            "digest": digest_text(input),
            "size": input.u64() % 64,
        });
        if flags & 64 != 0 {
            config["data"] = json!(text(input, &["e30=", "not base64"]));
        }
        doc.insert("config".into(), config);
    }
    let entries = usize::from(input.u8() % 4);
    if flags & 4 == 0 {
        let layers: Vec<Value> = (0..entries)
            .map(|_| {
                json!({
                    "mediaType": text(input, &[PAYLOAD_RAW, PAYLOAD_ZSTD, "application/gzip"]),
                    "digest": digest_text(input),
                    "size": input.u64(),
                })
            })
            .collect();
        doc.insert("layers".into(), Value::Array(layers));
    }
    if flags & 8 != 0 {
        let manifests: Vec<Value> = (0..entries)
            .map(|_| {
                let mut entry = json!({"digest": digest_text(input), "size": input.u64()});
                let f = input.u8();
                if f & 1 != 0 {
                    entry["mediaType"] = json!(text(input, &MANIFEST_TYPES));
                }
                if f & 2 != 0 {
                    let mut p = json!({
                        "os": text(input, &["linux", "windows"]),
                        "architecture": text(input, &["amd64", "arm64", "arm"]),
                    });
                    if f & 4 != 0 {
                        p["variant"] = json!(text(input, &["v8", "v7"]));
                    }
                    entry["platform"] = p;
                }
                entry
            })
            .collect();
        doc.insert("manifests".into(), Value::Array(manifests));
    }
    serde_json::to_vec(&Value::Object(doc)).unwrap_or_default()
}

fn check_manifest(body: &[u8], content_type: Option<&str>, platform: &Platform) {
    let parsed = parse_manifest(body, content_type, platform);
    // serde skips ignored fields without checking their UTF-8, so the
    // installer accepts such a body: read it the same way here.
    let json =
        || serde_json::from_str::<Value>(&String::from_utf8_lossy(body)).unwrap_or(Value::Null);
    match parsed {
        Err(ManifestProblem::Invalid(p) | ManifestProblem::Unsupported(p)) => {
            bounded("manifest", &p)
        }
        Ok(Manifest::Image(image)) => {
            let doc = json();
            let artifact = doc["artifactType"].as_str();
            assert!(
                artifact == Some(METROPOLIS_ARTIFACT) || artifact == Some(DISK_ARTIFACT),
                "an image of artifactType {artifact:?} accepted"
            );
            assert_eq!(doc["config"]["mediaType"].as_str(), Some(CONFIG_MEDIA_TYPE));
            let layers = doc["layers"].as_array().map_or(0, Vec::len);
            assert_eq!(layers, image.layers.len());
            for (l, layer) in doc["layers"]
                .as_array()
                .into_iter()
                .flatten()
                .zip(&image.layers)
            {
                assert_eq!(
                    l["digest"].as_str(),
                    Some(layer.digest.to_string().as_str())
                );
                assert_eq!(l["size"].as_u64(), Some(layer.size));
                assert_eq!(
                    l["mediaType"].as_str() == Some(PAYLOAD_ZSTD),
                    layer.compressed
                );
            }
        }
        Ok(Manifest::Index(Ok(entry))) => {
            let doc = json();
            let first = doc["manifests"].as_array().and_then(|entries| {
                entries.iter().find(|e| {
                    let p = &e["platform"];
                    // A variant, when both name one, must be the same.
                    let variant = match (&platform.variant, p["variant"].as_str()) {
                        (Some(wanted), Some(offered)) => wanted == offered,
                        _ => true,
                    };
                    p["os"].as_str() == Some(platform.os.as_str())
                        && p["architecture"].as_str() == Some(platform.architecture.as_str())
                        && variant
                        && e["mediaType"].as_str().is_none_or(|t| t == OCI_MANIFEST)
                })
            });
            let Some(first) = first else {
                panic!("an entry picked for {platform} that the index lacks");
            };
            assert_eq!(
                first["digest"].as_str(),
                Some(entry.digest.to_string().as_str())
            );
            assert_eq!(first["size"].as_u64(), Some(entry.size));
        }
        Ok(Manifest::Index(Err(offered))) => bounded("platform list", &offered),
    }
}

fn check_http_error(e: HttpError) {
    if let HttpError::Io { source, .. } = &e {
        assert!(
            matches!(
                source.kind(),
                io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof
            ),
            "{source:?}"
        );
    }
    assert!(
        matches!(e, HttpError::Io { .. } | HttpError::Protocol { .. }),
        "{e:?}"
    );
    bounded("HTTP", &RegistryError::from(e).to_string());
}

fn check_body_error(e: &io::Error) {
    assert!(
        matches!(
            e.kind(),
            io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof
        ),
        "{e:?}"
    );
    bounded("body", &e.to_string());
}

fn response(bytes: Vec<u8>, capacity: usize) -> Option<Response> {
    match read_response(&url(), Method::Get, connection(bytes, capacity)) {
        Ok(response) => {
            let s = response.status;
            assert!(
                !(100..200).contains(&s) || s == 101,
                "interim status {s} returned"
            );
            Some(response)
        }
        Err(e) => {
            check_http_error(e);
            None
        }
    }
}

fn raw_response(input: &mut Input<'_>) {
    let capacity = usize::from(input.u8());
    let limit = u64::from(input.u16());
    let bytes = input.rest().to_vec();
    let Some(mut r) = response(bytes.clone(), capacity) else {
        return;
    };
    let declared = r.content_length();
    match r.read_body(limit) {
        Ok(Some(body)) => {
            assert!(
                body.len() as u64 <= limit,
                "{} bytes past a limit of {limit}",
                body.len()
            );
            if let Some(n) = declared {
                assert_eq!(body.len() as u64, n, "a body not of its declared length");
            }
        }
        Ok(None) => {}
        Err(e) => check_body_error(&e),
    }
    if let Some(r) = response(bytes, capacity) {
        bounded("status", &RegistryError::status(r).to_string());
    }
}

fn framed(input: &mut Input<'_>) {
    let payload = input.lp().to_vec();
    let flags = input.u8();
    let sizes: Vec<usize> = (0..=input.u8() % 4)
        .map(|_| usize::from(input.u8()).max(1))
        .collect();
    let mut out = Vec::new();
    if flags & 1 != 0 {
        out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
    }
    out.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n");
    if flags & 2 != 0 {
        out.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
        for (i, chunk) in chunks(&payload, &sizes).enumerate() {
            let mut size = format!("{:x}", chunk.len());
            if flags & 4 != 0 {
                size = size.to_uppercase();
            }
            if flags & 8 != 0 {
                size.insert_str(0, "00");
            }
            out.extend_from_slice(size.as_bytes());
            if flags & 16 != 0 && i % 2 == 0 {
                out.extend_from_slice(b";name=\"v\"");
            }
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(chunk);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"0\r\n");
        if flags & 32 != 0 {
            out.extend_from_slice(b"Digest: x\r\nExpires: 0\r\n");
        }
        out.extend_from_slice(b"\r\n");
    } else {
        out.extend_from_slice(format!("Content-Length: {}\r\n\r\n", payload.len()).as_bytes());
        out.extend_from_slice(&payload);
    }
    let complete = out.len();
    if flags & 64 != 0 {
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\n\r\njunk");
    }
    if flags & 128 != 0 {
        out.truncate(usize::from(input.u16()) % complete);
    }
    let capacity = usize::from(input.u8());
    let cut = out.len() < complete;
    let Some(mut r) = response(out, capacity) else {
        assert!(cut, "a well-framed response was refused");
        return;
    };
    match r.read_body(payload.len() as u64) {
        Ok(Some(body)) => {
            assert!(!cut, "a cut response read as complete");
            assert!(body == payload, "the payload read back otherwise");
        }
        Ok(None) => panic!("a {}-byte payload exceeded its own length", payload.len()),
        Err(e) => {
            assert!(cut, "a well-framed body failed: {e}");
            check_body_error(&e);
        }
    }
}

/// `data` in chunks of the cycling `sizes`.
fn chunks<'a>(data: &'a [u8], sizes: &'a [usize]) -> impl Iterator<Item = &'a [u8]> + 'a {
    let mut rest = data;
    sizes.iter().cycle().map_while(move |&n| {
        if rest.is_empty() {
            return None;
        }
        let (chunk, tail) = rest.split_at(n.min(rest.len()));
        rest = tail;
        Some(chunk)
    })
}

/// One zstd frame of `data` (libzstd, level 1), with its content checksum
/// when `checksum`.
pub(super) fn frame(data: &[u8], checksum: bool) -> Vec<u8> {
    let compress = || -> io::Result<Vec<u8>> {
        let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 1)?;
        encoder.include_checksum(checksum)?;
        io::Write::write_all(&mut encoder, data)?;
        encoder.finish()
    };
    compress().unwrap_or_else(|e| panic!("libzstd failed to compress in memory: {e}"))
}

fn decompress(blob: &[u8], capacity: usize) -> io::Result<Vec<u8>> {
    let mut reader = ZstdReader::new(BufReader::with_capacity(capacity.max(1), blob))?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 1 + capacity * 64];
    while out.len() < MAX_OUTPUT {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    Ok(out)
}

fn compressed(input: &mut Input<'_>) {
    let payload = input.lp().to_vec();
    let flags = input.u8();
    let checksum = flags & 1 == 1;
    let sizes = [
        usize::from(input.u16()).max(1),
        usize::from(input.u16()).max(1),
    ];
    let mut blob = Vec::new();
    let mut frames = 0;
    for (i, chunk) in chunks(&payload, &sizes).take(3).enumerate() {
        if flags & 2 != 0 && i > 0 {
            blob.extend_from_slice(&(0x184D_2A50u32 + u32::from(flags >> 4)).to_le_bytes());
            blob.extend_from_slice(&3u32.to_le_bytes());
            blob.extend_from_slice(b"xyz");
        }
        blob.extend(frame(chunk, checksum));
        frames += chunk.len();
    }
    if blob.is_empty() {
        blob = frame(&[], checksum);
    }
    match decompress(&blob, usize::from(input.u8())) {
        Ok(out) => assert!(out == payload[..frames], "decompressed otherwise"),
        Err(e) => panic!("a compressed payload failed: {e}"),
    }
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    match input.u8() % 6 {
        0 => {
            let types = [
                None,
                Some(OCI_MANIFEST),
                Some(INDEX_TYPES[1]),
                Some("text/plain; x=y"),
            ];
            let content_type = types[usize::from(input.u8() % 4)];
            let platform = platform(input.u8());
            check_manifest(input.rest(), content_type, &platform);
        }
        1 => {
            let platform = platform(input.u8());
            let content_type = text(&mut input, &MANIFEST_TYPES);
            let body = built_manifest(&mut input);
            let content_type = (input.u8() & 1 == 1).then_some(content_type.as_str());
            check_manifest(&body, content_type, &platform);
        }
        2 => raw_response(&mut input),
        3 => framed(&mut input),
        4 => {
            let capacity = usize::from(input.u8());
            if let Err(e) = decompress(input.rest(), capacity) {
                assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e:?}");
                bounded("zstd", &e.to_string());
            }
        }
        _ => compressed(&mut input),
    }
}
