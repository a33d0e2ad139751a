//! Fuzz harnesses over the agent's decoders of what registries send. Not
//! an API: hidden from the documentation, for the cargo-fuzz crate
//! (`fuzz/`, whose target `registry_responses` is one line calling
//! [`registry_responses`]) and the stable replay test
//! `agent/tests/fuzz_corpus.rs`, which runs every file of
//! `fuzz/corpus/<target>/`, `fuzz/seeds/<target>/` and
//! `fuzz/regressions/<target>/` of [`TARGETS`] through the same code.
//!
//! Why here, and always compiled, rather than in the test kit or behind
//! a cargo feature: the decoders are the installer's private modules
//! (`install::manifest`, `http`, `body`, `zstd`), which the harness must
//! reach without widening their visibility; the test kit may not depend
//! on the agent; and a feature would have to be switched on for the
//! replay test, which then would not run in a plain `cargo test
//! --workspace`. The module is small and pure (no I/O, no clock).
//!
//! The input format is the test kit's (`testkit/src/fuzz/input.rs`):
//! bytes, little-endian integers, length-prefixed strings, zeros past
//! the end; [`Input`] reads it.

/// A harness: runs one input, panics if a property fails.
pub type Harness = fn(&[u8]);

/// Every target of this crate: its name (the cargo-fuzz binary and the
/// corpus directory) and its harness.
pub const TARGETS: [(&str, Harness); 3] = [
    ("registry_responses", registry_responses),
    ("image_config", image_config),
    ("efi_load_option", efi_load_option),
];

/// The `image_config` target: any bytes through the OS image config's
/// parser ([`ImageConfig::parse`](crate::install::image_config::ImageConfig::parse)).
/// It must not panic; a refusal is at most 2 KiB whatever the input;
/// what it accepts is what the reader relies on: every chunk size from
/// 1 byte to 16 MiB, exactly `ceil(size / chunk)` hashes, valid and
/// distinct names.
pub fn image_config(data: &[u8]) {
    use crate::install::image_config::{ImageConfig, MAX_HASH_CHUNK_BYTES, check_name};
    match ImageConfig::parse(data) {
        Err(problem) => assert!(problem.len() <= 2048, "a {}-byte refusal", problem.len()),
        Ok(config) => {
            for (i, payload) in config.payloads.iter().enumerate() {
                assert!((1..=MAX_HASH_CHUNK_BYTES).contains(&payload.chunk_size));
                assert_eq!(
                    payload.chunk_hashes.len() as u64,
                    payload.size.div_ceil(payload.chunk_size)
                );
                assert!(check_name(&payload.name).is_ok(), "{:?}", payload.name);
                assert!(
                    config.payloads[..i].iter().all(|p| p.name != payload.name),
                    "{:?} twice",
                    payload.name
                );
            }
        }
    }
}

/// The `efi_load_option` target: any bytes through the agent's
/// `EFI_LOAD_OPTION` decoder, which must not panic; what it accepts
/// encodes back to exactly the input.
pub fn efi_load_option(data: &[u8]) {
    if let Ok(option) = crate::efivars::decode_load_option(data) {
        assert_eq!(option.encode(), data, "decoded {option:?}");
    }
}

/// The `registry_responses` target: manifests, indexes, response heads,
/// chunked and sized bodies, error documents and zstd layers, decoded by
/// the installer's own code. The input format and the properties are in
/// the harness's documentation (`agent/src/install/fuzz.rs`).
pub fn registry_responses(data: &[u8]) {
    crate::install::fuzz::run(data);
}

/// Reads structured values from fuzz bytes; every read succeeds (numbers
/// are zero and byte strings empty past the end).
#[derive(Clone, Debug)]
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    /// A reader over `data`.
    pub fn new(data: &'a [u8]) -> Input<'a> {
        Input { data }
    }

    /// One byte (0 past the end).
    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => 0,
        }
    }

    /// A little-endian `u16`.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    /// A little-endian `u64`.
    pub fn u64(&mut self) -> u64 {
        let mut bytes = [0u8; 8];
        bytes.iter_mut().for_each(|b| *b = self.u8());
        u64::from_le_bytes(bytes)
    }

    /// Up to `n` bytes (fewer at the end).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.data.split_at(n.min(self.data.len()));
        self.data = rest;
        head
    }

    /// A byte string prefixed with its `u16` length.
    pub fn lp(&mut self) -> &'a [u8] {
        let n = usize::from(self.u16());
        self.bytes(n)
    }

    /// A string prefixed with its one-byte length (invalid UTF-8 replaced).
    pub fn short_string(&mut self) -> String {
        let n = usize::from(self.u8());
        String::from_utf8_lossy(self.bytes(n)).into_owned()
    }

    /// Everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.data)
    }
}

/// Seed inputs of one target: `(name, input)`.
pub type Seeds = Vec<(String, Vec<u8>)>;

/// The seed inputs of every target, by target name.
/// `cargo test -p bmaas-agent --test fuzz_corpus -- --ignored
/// generate_seeds` writes them to `fuzz/seeds/<target>/<name>`.
pub fn seeds() -> Vec<(&'static str, Seeds)> {
    vec![
        ("registry_responses", crate::install::fuzz::seeds()),
        ("image_config", image_config_seeds()),
        ("efi_load_option", efi_load_option_seeds()),
    ]
}

/// Seeds of `image_config`: configs as `metroctl osimage build` writes
/// them (a Metropolis image, a whole-disk image, an empty payload) and
/// the refusals next to them.
fn image_config_seeds() -> Seeds {
    use crate::install::image_config::encode_hash;
    use sha2::{Digest as _, Sha256};
    let payload = |name: &str, data: &[u8], chunk: usize| {
        let hashes: Vec<String> = data
            .chunks(chunk)
            .map(|c| encode_hash(&Sha256::digest(c).into()))
            .collect();
        serde_json::json!({
            "name": name,
            "size": data.len(),
            "hash_chunk_size": chunk,
            "chunk_hashes_sha256": hashes,
        })
    };
    let config = |version: &str, payloads: Vec<serde_json::Value>| {
        serde_json::to_vec(&serde_json::json!({
            "format_version": version,
            "payloads": payloads,
        }))
        .unwrap_or_default()
    };
    let kernel: Vec<u8> = (0..10_240u32).map(|i| i as u8).collect();
    let mut miscounted = payload("system", &[0; 5000], 1024);
    miscounted["size"] = serde_json::json!(9000);
    vec![
        (
            "metropolis",
            config(
                "1",
                vec![
                    payload("kernel.efi", &kernel, 4096),
                    payload("system", &[0; 5000], 1024),
                ],
            ),
        ),
        ("disk", config("1", vec![payload("disk", &kernel, 1)])),
        (
            "empty-payload",
            config("1", vec![payload("system", &[], 4096)]),
        ),
        ("version-2", config("2", vec![])),
        ("miscounted", config("1", vec![miscounted])),
        (
            "twice",
            config("1", vec![payload("a", b"x", 1), payload("a", b"x", 1)]),
        ),
    ]
    .into_iter()
    .map(|(name, data)| (name.to_string(), data))
    .collect()
}

/// Seeds of `efi_load_option`: the Metropolis entry as an install writes
/// it, and one without a device path.
fn efi_load_option_seeds() -> Seeds {
    use crate::efivars::{encode_load_option, file_path_node, hard_drive_device_path};
    let guid = uuid::Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
    let mut path = hard_drive_device_path(1, 2048, 786_432, guid);
    path.extend(file_path_node("\\EFI\\BOOT\\BOOTx64.EFI"));
    path.extend([0x7f, 0xff, 0x04, 0x00]);
    vec![
        ("metropolis", encode_load_option("Metropolis", &path)),
        ("no-path", encode_load_option("x", &[])),
    ]
    .into_iter()
    .map(|(name, data)| (name.to_string(), data))
    .collect()
}
