//! The in-memory tracefs of the harnesses: the core's test double
//! (`metropolis_core::testing::tracefs`, feature `testing`), with failures
//! injected from a schedule.

pub use metropolis_core::testing::tracefs::{FakeBuffer, FakePort, FakeTracefs, KINDS, Op};
