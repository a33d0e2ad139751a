//! The in-memory tracefs of the harnesses: the test kit's
//! (`metropolis_testkit::tracefs`), with failures injected from a schedule.

pub use metropolis_testkit::tracefs::{FakeBuffer, FakePort, FakeTracefs, KINDS, Op};
