//! The stable replay of checked-in fuzz inputs, shared by the crates whose
//! harnesses they are (`service/tests/fuzz_corpus.rs` for this kit's
//! [`TARGETS`](super::TARGETS), `agent/tests/fuzz_corpus.rs` for the
//! agent's): every file of `fuzz/corpus/<target>/` (the minimised corpus),
//! `fuzz/seeds/<target>/` (the seeds) and `fuzz/regressions/<target>/`
//! (inputs that once failed) through the target's harness, without
//! libFuzzer.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use super::Harness;
use super::seeds::Seeds;

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

/// Runs every checked-in input of `targets` under `fuzz_dir` (the
/// repository's `fuzz/`); panics naming each failing target and file, or
/// if a target has no corpus or no seeds. Prints how many ran.
pub fn corpora(fuzz_dir: &Path, targets: &[(&str, Harness)]) {
    let started = std::time::Instant::now();
    let mut failures = Vec::new();
    let mut total = 0;
    for (target, run) in targets {
        let corpus = files(&fuzz_dir.join("corpus").join(target));
        assert!(
            !corpus.is_empty(),
            "fuzz/corpus/{target} is empty or missing"
        );
        let seeds = files(&fuzz_dir.join("seeds").join(target));
        assert!(!seeds.is_empty(), "fuzz/seeds/{target} is empty or missing");
        let regressions = files(&fuzz_dir.join("regressions").join(target));
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
        targets.len(),
        started.elapsed()
    );
    assert!(
        failures.is_empty(),
        "fuzz inputs failing (reproduce with fuzz/run.sh --replay TARGET FILE):\n{}",
        failures.join("\n")
    );
}

/// Writes `seeds` (by target: names and inputs) into
/// `fuzz_dir/seeds/<target>/<name>`.
pub fn write_seeds(fuzz_dir: &Path, seeds: Vec<(&str, Seeds)>) {
    for (target, seeds) in seeds {
        let dir = fuzz_dir.join("seeds").join(target);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for (name, data) in seeds {
            let path = dir.join(name);
            std::fs::write(&path, data).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
    }
}
