//! gRPC over HTTP/2 for a Metropolis node, on any async runtime.
//!
//! - [`runtime`]: the one seam between the node and a runtime (the
//!   [`Runtime`](runtime::Runtime) trait the runtime crates implement).
//! - [`listen`]: the node's listeners (UNIX socket, mutual TLS, plain TCP
//!   for the debug service), their accept loop and limits in [`edge`].
//! - [`grpc`]: serving a `Router` on one connection, and the client
//!   [`Channel`](grpc::Channel); [`h2_authority`] rewrites the `:authority`
//!   of local-socket clients that send none.
//! - [`connect`]: client connections and the leader [`Dialer`](connect::Dialer);
//!   [`upstream`]: the channel to the leader a follower forwards over.
//! - [`exposition`]: the HTTP/1.1 endpoint Prometheus scrapes.
//! - [`peer`]: who a caller is, from its certificate chain.
//! - [`shutdown`], [`socket`]: the shutdown signal and task tracker, socket
//!   files and options.
//!
//! Nothing here names an async runtime.

pub mod connect;
pub mod edge;
pub mod exposition;
pub mod grpc;
pub mod h2_authority;
pub mod listen;
pub mod peer;
pub mod runtime;
pub mod shutdown;
pub mod socket;
pub mod upstream;
mod wake_flag;
