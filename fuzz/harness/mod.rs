//! The fuzz harnesses: one `run(&[u8])` per target, panicking when a
//! property fails.
//!
//! This directory is shared by two crates: the cargo-fuzz crate
//! (`fuzz/src/lib.rs`, built with libFuzzer on `RUSTC_BOOTSTRAP=1`) and
//! the stable replay test `core/tests/fuzz_corpus.rs`, which includes it
//! with `#[path]` and runs every file of `fuzz/corpus/<target>/`,
//! `fuzz/seeds/<target>/` and `fuzz/regressions/<target>/` through the
//! same code. It may therefore
//! use only what `metropolis-core` depends on (including its
//! dev-dependencies): no `arbitrary`, no libFuzzer. Structured inputs are
//! read with [`input::Input`], whose format [`seeds`] writes.

pub mod agent;
pub mod archive;
pub mod exec;
pub mod input;
pub mod kv;
pub mod logs;
pub mod rpc;
pub mod seeds;
pub mod trace;
pub mod tracefs;
pub mod watch;

/// A harness: runs one input, panics if a property fails.
pub type Harness = fn(&[u8]);

/// Every target: its name (the cargo-fuzz binary and corpus directory)
/// and its harness.
pub const TARGETS: [(&str, Harness); 6] = [
    ("rpc", rpc::run),
    ("watch_machine", watch::run),
    ("trace_session", trace::run),
    ("archive_validator", archive::run),
    ("log_queries", logs::run),
    ("agent_loop", agent::run),
];
