//! Protobuf messages, gRPC clients and servers of the Curator,
//! AgentCallback and NodeDebugService APIs, compiled from the .proto files
//! in this crate with `protox` (no `protoc` needed).
//!
//! - Messages live in modules named after their proto package, e.g.
//!   [`metropolis::node::core::curator::proto::api`].
//! - [`FILE_DESCRIPTOR_SET`] is the encoded descriptor set of every file.
//! - [`authorization`] is the per-method policy read from the
//!   `metropolis.proto.ext.authorization` option at build time.
//! - [`wire`] holds the pre-encoded Watch event.
//! - `json` (feature `json`) parses messages from their protobuf JSON
//!   mapping.
//! - [`containerd`]: clients of the part of containerd's API the
//!   containerd image store calls (`containerd/README.md`); not in
//!   [`FILE_DESCRIPTOR_SET`].
//!
//! Features: `grpc` adds the tonic clients and servers (without it the
//! crate is the messages only, what `metropolis-core` builds against);
//! `json` adds the JSON parser. Generated code carries no transport:
//! clients and servers are generic over the HTTP/2 service, so the crate
//! works on any async runtime.

#![allow(missing_docs, clippy::all, clippy::unwrap_used)]

include!(concat!(env!("OUT_DIR"), "/mod.rs"));
// containerd's API (`containerd::services::{content, images, leases}::v1`,
// `containerd::types`): clients only, for the containerd image store.
include!(concat!(env!("OUT_DIR"), "/containerd.rs"));

/// The encoded `FileDescriptorSet` of every compiled file and its imports.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptor.bin"));

pub mod authorization;
#[cfg(feature = "json")]
pub mod json;
pub mod wire;

/// Short aliases for the packages most code uses.
pub mod prelude {
    pub use crate::cloud::agent::api as hwreport;
    pub use crate::cloud::bmaas::server::api as agent;
    pub use crate::metropolis::node::core::curator::proto::api as curator;
    pub use crate::metropolis::node::core::curator::proto::private as storage;
    pub use crate::metropolis::proto::api as debug;
    pub use crate::metropolis::proto::common;
}
