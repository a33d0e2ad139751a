//! The fuzz harnesses: one `run(&[u8])` per target, panicking when a
//! property fails, over the test kit's doubles ([`MemKv`](crate::store::MemKv),
//! [`Tasks`](crate::exec::Tasks), [`FakePort`](crate::tracefs::FakePort)).
//!
//! Two crates run them: the cargo-fuzz crate (`fuzz/`, a workspace of its
//! own, built with libFuzzer on `RUSTC_BOOTSTRAP=1`), whose targets are
//! one line each (`fuzz_target!(|data| metropolis_testkit::fuzz::rpc::run(data))`),
//! and the stable replay test `service/tests/fuzz_corpus.rs`, which runs
//! every file of `fuzz/corpus/<target>/`, `fuzz/seeds/<target>/` and
//! `fuzz/regressions/<target>/` through the same code ([`TARGETS`]).
//! They therefore use only what the test kit depends on: no `arbitrary`,
//! no libFuzzer. Structured inputs are read with [`input::Input`], whose
//! format [`seeds`] writes.

pub mod agent;
pub mod archive;
pub mod certificate;
pub mod election_value;
pub mod input;
pub mod lines;
pub mod loader_state;
pub mod logs;
pub mod records;
pub mod replay;
pub mod rpc;
pub mod seeds;
pub mod store_open;
pub mod trace;
pub mod watch;

/// A harness: runs one input, panics if a property fails.
pub type Harness = fn(&[u8]);

/// Every target: its name (the cargo-fuzz binary and corpus directory)
/// and its harness.
pub const TARGETS: [(&str, Harness); 12] = [
    ("rpc", rpc::run),
    ("watch_machine", watch::run),
    ("trace_session", trace::run),
    ("archive_validator", archive::run),
    ("log_queries", logs::run),
    ("agent_loop", agent::run),
    ("store_open", store_open::run),
    ("leader_election_value", election_value::run),
    ("peer_certificate", certificate::run),
    ("stored_records", records::run),
    ("trace_pipe_lines", lines::run),
    ("loader_state", loader_state::run),
];
