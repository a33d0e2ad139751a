//! The address of a call's peer, as a listener knows it.

use std::sync::Arc;

/// The address of the peer a call came from (`host:port` as the listener
/// prints its socket address), in the request extensions where the
/// listener puts it (the debug listener does, for its audit log). Text,
/// not a socket type: core only reports it. Absent for calls over the
/// local UNIX socket and wherever a listener does not attach it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RemoteAddr(pub Arc<str>);
