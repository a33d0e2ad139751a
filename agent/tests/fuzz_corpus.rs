//! Replays the checked-in inputs of the agent's fuzz targets on stable,
//! without libFuzzer: each file of `fuzz/corpus/<target>/`,
//! `fuzz/seeds/<target>/` and `fuzz/regressions/<target>/` of
//! `bmaas_agent::fuzz::TARGETS` goes through the harness the cargo-fuzz
//! target runs. A panic in any of them fails the test, naming the target
//! and the file. (The core's targets: `core/tests/fuzz_corpus.rs`.)
//!
//! `generate_seeds` (ignored) writes `bmaas_agent::fuzz::seeds()` into
//! `fuzz/seeds/<target>/`.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use bmaas_agent::fuzz as harness;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// The files of `dir`, sorted by name; none if it does not exist.
fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn corpora_replay() {
    let started = std::time::Instant::now();
    let mut failures = Vec::new();
    let mut total = 0;
    for (target, run) in harness::TARGETS {
        let corpus = files(&fuzz_dir().join("corpus").join(target));
        assert!(
            !corpus.is_empty(),
            "fuzz/corpus/{target} is empty or missing"
        );
        let seeds = files(&fuzz_dir().join("seeds").join(target));
        assert!(!seeds.is_empty(), "fuzz/seeds/{target} is empty or missing");
        let regressions = files(&fuzz_dir().join("regressions").join(target));
        for path in corpus.iter().chain(&seeds).chain(&regressions) {
            let data =
                std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            total += 1;
            if catch_unwind(AssertUnwindSafe(|| run(&data))).is_err() {
                failures.push(format!("{target}: {}", path.display()));
            }
        }
    }
    eprintln!(
        "replayed {total} fuzz inputs of {} targets in {:?}",
        harness::TARGETS.len(),
        started.elapsed()
    );
    assert!(
        failures.is_empty(),
        "fuzz inputs failing (reproduce with fuzz/run.sh --replay TARGET FILE):\n{}",
        failures.join("\n")
    );
}

#[test]
#[ignore = "writes the seed inputs into fuzz/seeds; run by hand"]
fn generate_seeds() {
    for (target, seeds) in harness::seeds() {
        let dir = fuzz_dir().join("seeds").join(target);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for (name, data) in seeds {
            let path = dir.join(name);
            std::fs::write(&path, data).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
    }
}
