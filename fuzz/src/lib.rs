//! The fuzz targets' harnesses, shared with the stable replay test
//! (`core/tests/fuzz_corpus.rs`); see `harness/mod.rs`.

#[path = "../harness/mod.rs"]
pub mod harness;
