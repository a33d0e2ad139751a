//! `metropolis-client`: a client library for programs that talk to
//! Metropolis curators.
//!
//! Given several endpoints and a credential, a [`Client`] finds a curator
//! that answers (rotating through the endpoints), retries unary calls that
//! the spec marks retryable (Unavailable "curator backend switched,
//! request can be retried", no leader yet, a connection refused or broken)
//! within the caller's deadline, and offers [`NodeView`]s: watches of the
//! cluster's nodes, or of one node, that re-open after any failure, apply
//! each new backlog as a difference against what they hold, and hand the
//! program only real changes ([`NodeEvent`]): no duplicate state, no state
//! going back, a removal for each node that vanished while they were away.
//!
//! It runs on any runtime behind `metropolis_transport`'s
//! [`Runtime`](metropolis_transport::runtime::Runtime) seam (tokio and
//! smol through `metropolis-runtime-tokio` and `metropolis-runtime-smol`):
//! connections are dialled through `metropolis_transport::connect`, waits
//! run on the runtime's timer.
//!
//! - `client`: [`Client`], [`ClientConfig`]: the calls.
//! - `endpoints`, `connection`: the curators, one HTTP/2 connection each
//!   (with keepalive pings), which to try first.
//! - `retry`: what is retried, and the waits ([`Backoff`]).
//! - `misconfiguration`: what no retry fixes ([`Misconfiguration`]: a
//!   server certificate that never verifies, a port that does not speak
//!   TLS), which ends a call at once with what to change.
//! - `view`: [`NodeView`]; `diff`: what it holds and hands out, and why no
//!   state goes back.
//! - `error`: [`ClientError`], [`CallError`], [`ViewError`],
//!   [`AttemptError`].
//!
//! `examples/watch_nodes.rs` watches a cluster's nodes from the command
//! line.

#![forbid(unsafe_code)]

mod client;
mod connection;
mod diff;
mod endpoints;
mod error;
mod misconfiguration;
mod retry;
mod unary;
mod view;

pub use client::{Client, ClientConfig};
pub use error::{AttemptError, CallError, ClientError, ViewError, code_name};
pub use misconfiguration::Misconfiguration;
pub use retry::Backoff;
pub use view::{NodeEvent, NodeView};
