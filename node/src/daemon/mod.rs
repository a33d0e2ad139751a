//! What `metropolisd` decides before it serves, on any runtime, one
//! concern a module:
//!
//! - its configuration ([`Config`], the flags; [`crate::settings`] reads
//!   them from the command line, the environment and a file), with the
//!   listen addresses it accepts ([`parse_listen`]) and the runtime it
//!   names ([`RuntimeKind`]);
//! - the data directory ([`Layout`]: store, PKI, owner credential),
//!   created with private permissions;
//! - this node's PKI ([`NodePki`]), created on first start and upgraded
//!   in place when an earlier version wrote it;
//! - [`NodeServices`], the services built on them with their host ports
//!   (the debug service's image store and Kubernetes CA among them), and
//!   what a running node does with them until it stops ([`fatal_error`]);
//! - the daemon's logging ([`init_logging`], [`LogFormat`]).
//!
//! [`crate::serving`] starts the listeners and runs the daemon on a
//! [`Runtime`](metropolis_transport::runtime::Runtime); the runtime crates
//! only implement that trait.
//!
//! On first start with an empty data directory it creates the cluster CA,
//! this node's Ed25519 identity and certificate (and an ECDSA P-256 server
//! certificate of the same identity, for TLS clients without Ed25519), and
//! an owner credential, and registers this node as the first node of the
//! cluster.

mod config;
mod debug_ports;
mod layout;
mod lifecycle;
mod logging;
mod pki;
mod services;

pub use config::{
    Config, DEFAULT_AGENT_PORT, DEFAULT_DEBUG_LISTEN, DEFAULT_DEBUG_PORT, DEFAULT_METRICS_LISTEN,
    DEFAULT_PORT, RuntimeKind, parse_listen,
};
pub use layout::Layout;
pub use lifecycle::fatal_error;
pub use logging::{LogFormat, init_logging};
pub use pki::NodePki;
pub use services::{NodeServices, SystemClock};

/// A daemon failure, with what to do about it.
pub type DaemonError = Box<dyn std::error::Error + Send + Sync>;

#[cfg(test)]
mod tests;
