//! Runtime-neutral host plumbing of a Metropolis node, shared by the tokio
//! and smol runtimes: the durable embedded store, PKI and credentials, and
//! TLS configuration. Nothing here names an async runtime; blocking work
//! (fsync) runs on a dedicated thread.

pub mod agent;
pub mod clock;
pub mod cluster;
pub mod connect;
pub mod daemon;
pub mod edge;
pub mod etcd_access;
pub mod grpc;
pub mod h2_authority;
pub mod images;
pub mod join;
pub mod logs;
pub mod peer;
pub mod pki;
pub mod shutdown;
pub mod socket;
pub mod store;
pub mod tracefs;
pub mod upstream;
mod wake_flag;
