//! Test doubles shared by core's own tests and the simulator
//! (`metropolis-sim`): compiled for core's tests, and for other crates
//! only with the cargo feature `testing` (off by default).
//!
//! - [`tracefs`]: an in-memory tracefs ([`tracefs::FakeTracefs`]) with
//!   failure injection at any operation, and a [`Tracefs`](crate::trace::Tracefs)
//!   port over it ([`tracefs::FakePort`]).

pub mod tracefs;
