//! Deterministic simulation of the Metropolis control plane, running the
//! code the daemon ships.
//!
//! One `u64` seed drives a whole run of a [`World`]:
//!
//! - [`cluster`]: two to five curators assembled as the daemon assembles
//!   them (`metropolis_service::node::assemble`) with the daemon's election
//!   driver, over the store model as etcd with its network and member
//!   faults ([`store_faults`], [`model_store`]), serving real encoded gRPC
//!   ([`call`], [`upstream`]) across links that are cut ([`links`]) to
//!   node writers, watchers of both kinds, an operator and agents running
//!   core's agent loop; fencing checked at the store's commit
//!   ([`commit_check`]) and each node's record by a linearizability
//!   checker ([`linearizable`], the test kit's, shared with the fault
//!   campaign on real processes, `metropolis-chaos`).
//! - [`traces`]: trace sessions through core's `DebugService` over a
//!   tracefs that outlives killed daemons.
//! - [`storage`]: the embedded store over a simulated disk (the test kit's
//!   `SimDisk`) that tears writes in flight and loses what was not synced
//!   at a power loss, and fails writes and syncs with EIO and ENOSPC; its
//!   writer stepped by the world ([`stepped_store`]).
//! - [`embedded`]: a curator over the embedded store on that disk, as the
//!   daemon runs it without etcd, serving node writers and a watcher
//!   while the store's writer commits at the disk's pace, crashed and
//!   restarted mid-commit (power loss, power cut, kill, EIO, ENOSPC).
//!
//! All run on the deterministic runtime ([`runtime`]: one thread,
//! simulated per-node clocks, seeded scheduling, crashes). [`campaign`]
//! runs many seeds on worker threads, each with a bug planted in the
//! production code if asked (`metropolis_core::canary`), and sums what
//! they did; a failing seed carries the one command that replays it.
//!
//! Simulated code uses no threads, no wall clock, and iterates only
//! ordered collections or orders it fixed itself: the embedded store's
//! writer, a thread in the daemon, is stepped by the world on a frozen or
//! simulated clock.

#![forbid(unsafe_code)]

pub mod atlas;
pub mod call;
pub mod campaign;
pub mod cluster;
pub mod commit_check;
pub mod curator_calls;
pub mod embedded;
pub mod hash;
pub mod links;
pub mod model_store;
pub mod rng;
/// The linearizability checker, from the test kit.
pub use metropolis_testkit::linearizable;
pub mod runtime;
pub mod stepped_store;
pub mod storage;
pub mod store_faults;
pub mod traces;
pub mod upstream;

pub use campaign::{Campaign, Failure, Outcome, World};
pub use metropolis_core::canary::Canary;
