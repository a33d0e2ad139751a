//! Replays the checked-in inputs of the agent's fuzz targets on stable,
//! without libFuzzer: each file of `fuzz/corpus/<target>/`,
//! `fuzz/seeds/<target>/` and `fuzz/regressions/<target>/` of
//! `bmaas_agent::fuzz::TARGETS` goes through the harness the cargo-fuzz
//! target runs (the replay is the test kit's, shared with the core's
//! targets: `service/tests/fuzz_corpus.rs`). A panic in any of them fails the
//! test, naming the target and the file.
//!
//! `generate_seeds` (ignored) writes `bmaas_agent::fuzz::seeds()` into
//! `fuzz/seeds/<target>/`.

use std::path::{Path, PathBuf};

use metropolis_testkit::fuzz::replay;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

#[test]
fn corpora_replay() {
    replay::corpora(&fuzz_dir(), &bmaas_agent::fuzz::TARGETS);
}

#[test]
#[ignore = "writes the seed inputs into fuzz/seeds; run by hand"]
fn generate_seeds() {
    replay::write_seeds(&fuzz_dir(), bmaas_agent::fuzz::seeds());
}
