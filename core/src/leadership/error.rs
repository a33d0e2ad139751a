//! Why a request could not be served or forwarded, and why a
//! configuration is unusable.
//!
//! After every [`LeadershipError`] the client may retry (against this
//! instance or another) and the request may then succeed.

use std::fmt;

/// Why a request ends without being served or forwarded. Each is worth a
/// retry (the service layer answers them all alike,
/// `metropolis_service::status::leadership`); the messages are part of
/// the contract (docs/spec/semantics.md, "Leadership and forwarding").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LeadershipError {
    /// The role the request was routed under ended (leadership lost, a new
    /// leader elected): "curator backend switched, request can be retried".
    BackendSwitched,
    /// No leader became known before the request's wait bound (its
    /// deadline, capped by the configured maximum): "no curator leader".
    NoLeader,
    /// A write of this request was refused by the store because the
    /// election key's create revision no longer equals the one this
    /// instance won with: "lost leadership".
    LostLeadership,
    /// The instance is shutting down: "curator shutting down, request can
    /// be retried".
    ShuttingDown,
}

impl fmt::Display for LeadershipError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LeadershipError::BackendSwitched => "curator backend switched, request can be retried",
            LeadershipError::NoLeader => "no curator leader",
            LeadershipError::LostLeadership => "lost leadership",
            LeadershipError::ShuttingDown => "curator shutting down, request can be retried",
        })
    }
}

impl std::error::Error for LeadershipError {}

/// A [`LeadershipConfig`](super::LeadershipConfig) the machine cannot run
/// with.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A field has an unusable value.
    Field {
        /// The field, e.g. `lease_ttl`.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Field { field, problem } => write!(f, "{field}: {problem}"),
        }
    }
}

impl std::error::Error for ConfigError {}
