//! tokio as the Metropolis node's runtime.
//!
//! [`rt::TokioRuntime`] implements the node's one runtime seam,
//! `metropolis_transport::runtime::Runtime`: tasks, timer, sockets,
//! tokio-rustls, signals. [`threads::block_on`] runs a program on a
//! multi-threaded tokio runtime with per-worker housekeeping. Accepted
//! sockets write through [`coalesce::YieldBeforeWrite`]. The listeners,
//! connectors and everything above them are written once, in
//! `metropolis-transport` and `metropolis-node`.

pub mod coalesce;
pub mod rt;
pub mod threads;
