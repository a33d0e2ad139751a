//! The Metropolis control plane on tokio.
//!
//! This crate is a set of port implementations and listeners on tokio,
//! plus the two binaries: `metropolisd` (the node daemon) and `metroctl`
//! (the CLI). All protocol logic lives in `metropolis-core`; the durable
//! store, PKI and HTTP/2 plumbing in `metropolis-host`.

pub mod connect;
pub mod ctl;
pub mod daemon;
pub mod listen;
pub mod rt;
