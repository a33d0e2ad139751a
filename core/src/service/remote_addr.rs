//! The socket address of a call's peer, as a listener knows it.

use std::net::SocketAddr;

/// The address of the peer a call came from, in the request extensions
/// where the listener puts it (the debug listener does, for its audit
/// log). Absent for calls over the local UNIX socket and wherever a
/// listener does not attach it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteAddr(pub SocketAddr);
