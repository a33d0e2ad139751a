//! The OS image's config blob (`application/vnd.monogon.os.image.config.v1+json`,
//! docs/spec/metropolis-install.md section 1): which payloads the image
//! has, their uncompressed sizes and the SHA-256 of every chunk of each.
//!
//! [`ImageConfig::parse`] checks everything the reader relies on before a
//! byte of a payload is fetched: the format version, each payload's name,
//! its chunk size (at most [`MAX_HASH_CHUNK_BYTES`], which bounds what the
//! reader holds per chunk) and that the chunk hash count is exactly
//! `ceil(size / hash_chunk_size)`.

use base64::Engine as _;
use serde::Deserialize;

use metropolis_registry::bounded;

/// The manifest `artifactType` of a Metropolis OS image.
pub const METROPOLIS_ARTIFACT: &str = "application/vnd.monogon.os.image.v1";
/// The manifest `artifactType` of a plain whole-disk image (this
/// project's, for other operating systems): one payload, `disk`.
pub const DISK_ARTIFACT: &str = "application/vnd.metropolis-rs.os.disk-image.v1";
/// The config descriptor's media type (both artifact types).
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.monogon.os.image.config.v1+json";
/// A raw payload layer.
pub const PAYLOAD_RAW: &str = "application/octet-stream";
/// A payload layer compressed as one zstd frame.
pub const PAYLOAD_ZSTD: &str = "application/zstd";

/// The largest `hash_chunk_size` accepted: 16 MiB.
pub const MAX_HASH_CHUNK_BYTES: u64 = 16 * 1024 * 1024;

/// The longest payload name.
const MAX_NAME_CHARS: usize = 80;

/// One payload of the image, as its config describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PayloadSpec {
    /// Its name, e.g. `kernel.efi`.
    pub name: String,
    /// Its uncompressed size in bytes.
    pub size: u64,
    /// The size of each hashed chunk (the last may be shorter).
    pub chunk_size: u64,
    /// The SHA-256 of each chunk, in order.
    pub chunk_hashes: Vec<[u8; 32]>,
}

/// A checked image config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageConfig {
    /// The payloads, in manifest layer order.
    pub payloads: Vec<PayloadSpec>,
}

#[derive(Deserialize)]
struct ConfigDocument {
    format_version: Option<String>,
    payloads: Option<Vec<PayloadDocument>>,
}

#[derive(Deserialize)]
struct PayloadDocument {
    name: String,
    size: u64,
    hash_chunk_size: u64,
    chunk_hashes_sha256: Vec<String>,
}

impl ImageConfig {
    /// Parses and checks a config blob (already verified by digest); the
    /// error names the field and what is wrong with it.
    pub fn parse(body: &[u8]) -> Result<ImageConfig, String> {
        let document: ConfigDocument = serde_json::from_slice(body)
            .map_err(|e| format!("not an OS image config: {}", bounded(&e.to_string())))?;
        match document.format_version.as_deref() {
            Some("1") => {}
            Some(other) => {
                return Err(format!(
                    "format_version is {:?}; this agent reads version \"1\"",
                    bounded(other)
                ));
            }
            None => return Err("format_version: missing".to_string()),
        }
        let documents = document
            .payloads
            .ok_or_else(|| "payloads: missing".to_string())?;
        let mut payloads: Vec<PayloadSpec> = Vec::with_capacity(documents.len());
        for (i, payload) in documents.into_iter().enumerate() {
            let spec = check_payload(payload).map_err(|e| format!("payloads[{i}].{e}"))?;
            if payloads.iter().any(|p| p.name == spec.name) {
                return Err(format!(
                    "payloads[{i}].name: {:?} is given twice",
                    spec.name
                ));
            }
            payloads.push(spec);
        }
        Ok(ImageConfig { payloads })
    }

    /// The payload called `name`, with its index (= its manifest layer).
    pub fn payload(&self, name: &str) -> Option<(usize, &PayloadSpec)> {
        self.payloads
            .iter()
            .enumerate()
            .find(|(_, p)| p.name == name)
    }
}

fn check_payload(payload: PayloadDocument) -> Result<PayloadSpec, String> {
    check_name(&payload.name).map_err(|e| format!("name: {e}"))?;
    let chunk_size = payload.hash_chunk_size;
    if chunk_size == 0 || chunk_size > MAX_HASH_CHUNK_BYTES {
        return Err(format!(
            "hash_chunk_size: {chunk_size} is not between 1 and {MAX_HASH_CHUNK_BYTES} bytes"
        ));
    }
    let expected = payload.size.div_ceil(chunk_size);
    if payload.chunk_hashes_sha256.len() as u64 != expected {
        return Err(format!(
            "chunk_hashes_sha256: {} hashes for {} bytes in chunks of {chunk_size}; \
             expected {expected}",
            payload.chunk_hashes_sha256.len(),
            payload.size
        ));
    }
    let chunk_hashes = payload
        .chunk_hashes_sha256
        .iter()
        .enumerate()
        .map(|(i, text)| decode_hash(text).map_err(|e| format!("chunk_hashes_sha256[{i}]: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(PayloadSpec {
        name: payload.name,
        size: payload.size,
        chunk_size,
        chunk_hashes,
    })
}

/// A payload name: 1–80 characters of `[0-9A-Za-z._-]`, not starting with
/// `.` or `_`, not ending with `.`.
pub fn check_name(name: &str) -> Result<(), String> {
    let quoted = bounded(name);
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS {
        return Err(format!(
            "{quoted:?} is not 1 to {MAX_NAME_CHARS} characters long"
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(format!(
            "{quoted:?} has characters other than letters, digits, '.', '_' and '-'"
        ));
    }
    if name.starts_with(['.', '_']) || name.ends_with('.') {
        return Err(format!(
            "{quoted:?} starts with '.' or '_' or ends with '.'"
        ));
    }
    Ok(())
}

/// A SHA-256 in standard base64 without padding (43 characters).
fn decode_hash(text: &str) -> Result<[u8; 32], String> {
    let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(text)
        .map_err(|_| format!("{:?} is not standard base64 without padding", bounded(text)))?;
    bytes
        .try_into()
        .map_err(|bytes: Vec<u8>| format!("{} bytes, not the 32 of a SHA-256", bytes.len()))
}

/// `hash` as the config writes it.
pub fn encode_hash(hash: &[u8; 32]) -> String {
    base64::engine::general_purpose::STANDARD_NO_PAD.encode(hash)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use sha2::{Digest as _, Sha256};

    fn config(payloads: &str) -> Vec<u8> {
        format!(r#"{{"format_version":"1","payloads":[{payloads}]}}"#).into_bytes()
    }

    fn payload(name: &str, data: &[u8], chunk: usize) -> String {
        let hashes: Vec<String> = data
            .chunks(chunk)
            .map(|c| format!("\"{}\"", encode_hash(&Sha256::digest(c).into())))
            .collect();
        format!(
            r#"{{"name":"{name}","size":{},"hash_chunk_size":{chunk},"chunk_hashes_sha256":[{}]}}"#,
            data.len(),
            hashes.join(",")
        )
    }

    #[test]
    fn a_config_is_read_as_written() {
        let data = vec![7u8; 10];
        let body = config(&format!(
            "{},{}",
            payload("kernel.efi", &data, 4),
            payload("system", &[], 4)
        ));
        let config = ImageConfig::parse(&body).unwrap();
        assert_eq!(config.payloads.len(), 2);
        let (index, kernel) = config.payload("kernel.efi").unwrap();
        assert_eq!((index, kernel.size, kernel.chunk_size), (0, 10, 4));
        assert_eq!(kernel.chunk_hashes.len(), 3);
        assert_eq!(
            kernel.chunk_hashes[2],
            <[u8; 32]>::from(Sha256::digest([7u8, 7]))
        );
        assert!(config.payload("system").unwrap().1.chunk_hashes.is_empty());
    }

    #[test]
    fn bad_configs_name_the_field() {
        let good = payload("system", b"abc", 2);
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"[]".to_vec(), "not an OS image config"),
            (br#"{"payloads":[]}"#.to_vec(), "format_version: missing"),
            (
                br#"{"format_version":"2","payloads":[]}"#.to_vec(),
                "format_version is \"2\"",
            ),
            (br#"{"format_version":"1"}"#.to_vec(), "payloads: missing"),
            (
                config(&format!("{good},{good}")),
                "payloads[1].name: \"system\" is given twice",
            ),
            (
                config(&good.replace(":2,", ":0,")),
                "payloads[0].hash_chunk_size: 0",
            ),
            (
                config(&good.replace(":2,", ":16777217,")),
                "hash_chunk_size: 16777217",
            ),
            (
                config(&good.replace(":3,", ":5,")),
                "2 hashes for 5 bytes in chunks of 2; expected 3",
            ),
            (
                config(&good.replace("\"system\"", "\".hidden\"")),
                "payloads[0].name",
            ),
            (config(&good.replace("\"system\"", "\"a.\"")), "ends with"),
            (config(&good.replace("\"system\"", "\"a/b\"")), "characters"),
            (config(&good.replace("\"system\"", "\"\"")), "1 to 80"),
            (
                config(r#"{"name":"s","size":1,"hash_chunk_size":1,"chunk_hashes_sha256":["!!"]}"#),
                "payloads[0].chunk_hashes_sha256[0]",
            ),
        ];
        for (body, expected) in cases {
            let problem = ImageConfig::parse(&body)
                .err()
                .unwrap_or_else(|| panic!("accepted {}", String::from_utf8_lossy(&body)));
            assert!(problem.contains(expected), "{problem:?} lacks {expected:?}");
        }
    }

    #[test]
    fn hashes_are_unpadded_base64_of_32_bytes() {
        let hash = [0xabu8; 32];
        let text = encode_hash(&hash);
        assert_eq!(text.len(), 43);
        assert_eq!(decode_hash(&text).unwrap(), hash);
        assert!(decode_hash(&format!("{text}=")).is_err());
        assert!(decode_hash("AAAA").unwrap_err().contains("3 bytes"));
        assert!(check_name(&"a".repeat(80)).is_ok());
        assert!(check_name(&"a".repeat(81)).is_err());
        assert!(check_name("_x").is_err());
    }
}
