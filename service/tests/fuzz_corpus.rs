//! Replays every checked-in fuzz input on stable, without libFuzzer: each
//! file of `fuzz/corpus/<target>/` (the minimised corpus),
//! `fuzz/seeds/<target>/` (the hand-written seeds) and
//! `fuzz/regressions/<target>/` (inputs that once failed) goes through the
//! same harness the cargo-fuzz target runs (`metropolis_testkit::fuzz`).
//! A panic in any of them fails the test, naming the target and the file.
//!
//! `generate_seeds` (ignored) writes the seed inputs of
//! `metropolis_testkit::fuzz::seeds` into `fuzz/seeds/<target>/`.

use std::path::{Path, PathBuf};

use metropolis_testkit::fuzz as harness;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

#[test]
fn corpora_replay() {
    harness::replay::corpora(&fuzz_dir(), &harness::TARGETS);
}

#[test]
#[ignore = "writes the seed inputs into fuzz/seeds; run by hand"]
fn generate_seeds() {
    harness::replay::write_seeds(&fuzz_dir(), harness::seeds::all());
}
