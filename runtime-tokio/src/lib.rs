//! The Metropolis control plane on tokio.
//!
//! This crate is a set of port implementations and listeners on tokio,
//! plus the binaries: `metropolisd` (the node daemon), `metroctl` (the CLI)
//! and `bmaas-agent` (the provisioning agent). All protocol logic lives in `metropolis-core`; the durable
//! store, PKI and HTTP/2 plumbing in `metropolis-host`.

pub mod agent;
#[cfg(feature = "mimalloc")]
pub mod allocator;
pub mod coalesce;
pub mod connect;
pub mod ctl;
pub mod daemon;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod listen;
pub mod rt;
