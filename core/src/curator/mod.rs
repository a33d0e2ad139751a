//! The curator's domain: where nodes are stored, how a stored record
//! becomes an API node, and the validation of `UpdateNodeStatus`.

mod validate;

use std::sync::Arc;

use bytes::Bytes;
use metropolis_proto::prelude::{curator, storage};
use prost::Message;

pub use validate::{MAX_STATUS_BYTES, StatusError, validate_status};

use crate::identity::NodeId;
use crate::store::KeyValue;
use crate::watch::CachedNode;

/// Key prefix of node records: `/nodes/<node id>`.
pub const NODES_PREFIX: &[u8] = b"/nodes/";

/// The prefix of cluster-wide records (not nodes, not machines) in a store
/// shared by several curator instances.
pub const CLUSTER_PREFIX: &[u8] = b"/cluster/";

/// The key of the cluster CA certificate (PEM), under [`CLUSTER_PREFIX`]:
/// written by the first instance, compared by every later one before it
/// serves.
pub const CLUSTER_CA_KEY: &[u8] = b"/cluster/ca";

/// Schema version of the node records this build writes.
pub const NODE_RECORD_SCHEMA: u32 = 1;

/// The store key of a node's record.
pub fn node_key(id: &NodeId) -> Bytes {
    let mut key = Vec::with_capacity(NODES_PREFIX.len() + id.as_str().len());
    key.extend_from_slice(NODES_PREFIX);
    key.extend_from_slice(id.as_str().as_bytes());
    Bytes::from(key)
}

/// Why a stored node record could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordError {
    /// The value is not a `NodeRecord`.
    Decode {
        /// The key holding the value.
        key: String,
        /// The decoder's complaint.
        reason: String,
    },
    /// The record was written by a newer schema this build does not know.
    UnknownSchema {
        /// The key holding the value.
        key: String,
        /// The record's schema version.
        version: u32,
    },
}

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordError::Decode { key, reason } => {
                write!(f, "node record at {key} is not a NodeRecord: {reason}")
            }
            RecordError::UnknownSchema { key, version } => write!(
                f,
                "node record at {key} has schema version {version}; this build reads up to {NODE_RECORD_SCHEMA}"
            ),
        }
    }
}

impl std::error::Error for RecordError {}

/// Decodes the node record stored in `kv`.
pub fn decode_record(kv: &KeyValue) -> Result<storage::NodeRecord, RecordError> {
    let key = || String::from_utf8_lossy(&kv.key).into_owned();
    let record =
        storage::NodeRecord::decode(kv.value.as_ref()).map_err(|e| RecordError::Decode {
            key: key(),
            reason: e.to_string(),
        })?;
    if record.schema_version > NODE_RECORD_SCHEMA {
        return Err(RecordError::UnknownSchema {
            key: key(),
            version: record.schema_version,
        });
    }
    Ok(record)
}

/// The API view of a stored node.
pub fn api_node(record: &storage::NodeRecord) -> curator::Node {
    curator::Node {
        id: record.id.clone(),
        roles: record.roles.clone(),
        status: record.status.clone(),
    }
}

/// The cache entry of the node stored in `kv`: its API view, encoded once.
pub fn cached_node(kv: &KeyValue) -> Result<CachedNode, RecordError> {
    let record = decode_record(kv)?;
    Ok(CachedNode {
        id: Arc::from(record.id.as_str()),
        revision: kv.mod_revision,
        encoded: Bytes::from(api_node(&record).encode_to_vec()),
    })
}

/// The node ID of a key under [`NODES_PREFIX`].
pub fn id_from_key(key: &[u8]) -> Option<&str> {
    key.strip_prefix(NODES_PREFIX)
        .and_then(|id| std::str::from_utf8(id).ok())
}
