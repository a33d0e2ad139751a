//! smol as the Metropolis node's runtime: async-io for sockets and
//! timers, async-executor for tasks, futures-rustls for TLS, hyper's HTTP/2
//! through `smol-hyper`'s IO adapter. No tokio reactor runs: tokio appears
//! in the dependency tree only with `sync`, `io-util` and `bytes`, pulled
//! by h2 and tonic.
//!
//! [`rt::SmolRuntime`] implements the node's one runtime seam,
//! `metropolis_transport::runtime::Runtime`; [`threads::block_on`] runs a
//! program on a multi-threaded executor. Accepted sockets are read through
//! [`stream::DrainAware`]. The listeners, connectors and everything above
//! them are written once, in `metropolis-transport` and `metropolis-node`.

pub mod rt;
pub mod stream;
pub mod threads;
