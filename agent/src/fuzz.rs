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
pub const TARGETS: [(&str, Harness); 1] = [("registry_responses", registry_responses)];

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
    vec![("registry_responses", crate::install::fuzz::seeds())]
}
