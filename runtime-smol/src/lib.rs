//! The Metropolis control plane on smol: async-io for sockets and timers,
//! async-executor for tasks, futures-rustls for TLS, hyper's HTTP/2 through
//! small adapters. No tokio reactor runs: tokio appears in the dependency
//! tree only with `sync`, `io-util` and `bytes`, pulled by h2 and tonic.
//!
//! All protocol logic comes from `metropolis-core`; the durable store, PKI,
//! HTTP/2 glue and daemon setup from `metropolis-host`.

pub mod connect;
pub mod daemon;
pub mod listen;
pub mod rt;
pub mod stream;
