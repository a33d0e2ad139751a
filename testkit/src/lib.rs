//! Test doubles of the Metropolis control plane, shared by core's
//! integration tests, the fuzz harnesses and the simulator, so that each
//! exists once:
//!
//! - [`store`]: the store model ([`MemStore`](metropolis_core::store::MemStore))
//!   as a [`KvStore`](metropolis_core::ports::KvStore), with faults a test
//!   switches on and watches that lag as much as it wants
//!   ([`store::MemKv`]).
//! - [`exec`]: a deterministic executor, a queue of spawned tasks run on
//!   demand that implements the [`Spawner`](metropolis_core::ports::Spawner)
//!   port ([`exec::Tasks`]), and helpers to poll futures and streams.
//! - [`clock`]: a clock moved by hand, as both the monotonic and the wall
//!   clock port ([`clock::ManualClock`]).
//! - [`tracefs`]: an in-memory tracefs with failure injection
//!   ([`tracefs::FakeTracefs`]) and the [`Tracefs`](metropolis_core::trace::Tracefs)
//!   port over it ([`tracefs::FakePort`]).
//! - [`archives`]: image archives built in memory (Docker, OCI, hostile
//!   cases) and checks of the OCI layout a store left in a directory.
//! - [`tls`]: rustls handshakes driven in memory, both ends by hand.
//! - [`disk`]: an in-memory disk for the embedded store, behind its `Disk`
//!   port, with power losses that tear the write in flight and undo what
//!   was not synced, and injected EIO and ENOSPC ([`disk::SimDisk`]).
//! - [`linearizable`]: a linearizability checker for one register (Wing
//!   and Gong's search, memoised), for the simulator's histories and the
//!   fault campaign's on real processes (`metropolis-chaos`).
//! - [`fuzz`]: the fuzz targets' harnesses over these doubles, run by the
//!   cargo-fuzz crate (`fuzz/`) and replayed on stable by
//!   `service/tests/fuzz_corpus.rs`.
//!
//! Nothing here reads a clock, opens a socket, reads the environment or
//! spawns a thread (the layout checks read only the directory they are
//! given; the `store_open` harness opens the embedded store, whose writer
//! is a thread it waits on): a test built on these doubles gives the same
//! result on every run. The crate depends on `metropolis-core`,
//! `metropolis-store`, `metropolis-proto` and crates core already uses,
//! never on a runtime or the host crate (see `README.md`).
//!
//! The unit tests of core and service (inside their `src/`) cannot use
//! this crate: it links their non-test builds, whose types differ from
//! those of the unit-test builds. Tests that need these doubles are
//! integration tests (`service/tests/`).

#![forbid(unsafe_code)]

pub mod archives;
pub mod clock;
pub mod disk;
pub mod exec;
pub mod forward;
pub mod fuzz;
pub mod leases;
pub mod linearizable;
pub mod store;
pub mod tls;
pub mod tracefs;
