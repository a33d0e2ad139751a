//! The Curator's `Watch` response with pre-encoded nodes.
//!
//! A `WatchEvent` is `repeated Node nodes = 1; Progress progress = 2;
//! repeated NodeTombstone node_tombstones = 3;`. A server holding one
//! encoding of each node (shared by reference count across every stream)
//! builds each event by framing those bytes, never re-encoding a node.
//! [`EncodedWatchEvent`] is that message: the bytes it puts on the wire are
//! exactly those of the equivalent [`WatchEvent`](crate::prelude::curator::WatchEvent),
//! so clients decode it with the ordinary generated type.

use bytes::{Buf, BufMut, Bytes};
use prost::encoding::{self, DecodeContext, WireType};
use prost::{DecodeError, Message};

use crate::prelude::curator::watch_event::{NodeTombstone, Progress};

const NODES: u32 = 1;
const PROGRESS: u32 = 2;
const TOMBSTONES: u32 = 3;

/// A `WatchEvent` whose nodes are already encoded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EncodedWatchEvent {
    /// Each entry is one encoded `curator.api.Node` (without length prefix).
    pub nodes: Vec<Bytes>,
    /// IDs of deleted nodes.
    pub tombstones: Vec<String>,
    /// `WatchEvent.Progress` as its number.
    pub progress: i32,
}

impl EncodedWatchEvent {
    /// Encoded length of one node entry in an event (key, length, bytes).
    pub fn node_entry_len(encoded_node_len: usize) -> usize {
        encoding::key_len(NODES)
            + encoding::encoded_len_varint(encoded_node_len as u64)
            + encoded_node_len
    }

    /// Encoded length of one tombstone entry in an event.
    pub fn tombstone_entry_len(node_id_len: usize) -> usize {
        let inner =
            encoding::key_len(1) + encoding::encoded_len_varint(node_id_len as u64) + node_id_len;
        encoding::key_len(TOMBSTONES) + encoding::encoded_len_varint(inner as u64) + inner
    }

    /// Encoded length of the progress field when set to `progress`.
    pub fn progress_len(progress: i32) -> usize {
        if progress == 0 {
            0
        } else {
            encoding::int32::encoded_len(PROGRESS, &progress)
        }
    }

    /// Whether this event carries `PROGRESS_LAST_BACKLOGGED`.
    pub fn is_last_backlogged(&self) -> bool {
        self.progress == Progress::LastBacklogged as i32
    }
}

impl Message for EncodedWatchEvent {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        for node in &self.nodes {
            encoding::encode_key(NODES, WireType::LengthDelimited, buf);
            encoding::encode_varint(node.len() as u64, buf);
            buf.put_slice(node);
        }
        if self.progress != 0 {
            encoding::int32::encode(PROGRESS, &self.progress, buf);
        }
        for id in &self.tombstones {
            let inner =
                encoding::key_len(1) + encoding::encoded_len_varint(id.len() as u64) + id.len();
            encoding::encode_key(TOMBSTONES, WireType::LengthDelimited, buf);
            encoding::encode_varint(inner as u64, buf);
            encoding::string::encode(1, id, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            NODES => {
                let mut node = Bytes::new();
                encoding::bytes::merge(wire_type, &mut node, buf, ctx)?;
                self.nodes.push(node);
                Ok(())
            }
            PROGRESS => encoding::int32::merge(wire_type, &mut self.progress, buf, ctx),
            TOMBSTONES => {
                let mut t = NodeTombstone::default();
                encoding::message::merge(wire_type, &mut t, buf, ctx)?;
                self.tombstones.push(t.node_id);
                Ok(())
            }
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        self.nodes
            .iter()
            .map(|n| Self::node_entry_len(n.len()))
            .sum::<usize>()
            + Self::progress_len(self.progress)
            + self
                .tombstones
                .iter()
                .map(|t| Self::tombstone_entry_len(t.len()))
                .sum::<usize>()
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prelude::{common, curator};

    fn node(id: &str, addr: &str) -> curator::Node {
        curator::Node {
            id: id.into(),
            roles: Some(common::NodeRoles::default()),
            status: Some(common::NodeStatus {
                external_address: addr.into(),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn same_bytes_as_the_generated_message() {
        let nodes = vec![
            node("metropolis-aa", "10.0.0.1"),
            node("metropolis-bb", "::1"),
        ];
        let plain = curator::WatchEvent {
            nodes: nodes.clone(),
            node_tombstones: vec![NodeTombstone {
                node_id: "metropolis-cc".into(),
            }],
            progress: Progress::LastBacklogged as i32,
        };
        let encoded = EncodedWatchEvent {
            nodes: nodes
                .iter()
                .map(|n| Bytes::from(n.encode_to_vec()))
                .collect(),
            tombstones: vec!["metropolis-cc".into()],
            progress: Progress::LastBacklogged as i32,
        };
        // Field order differs (prost writes 1, 3, 2 by declaration order), so
        // compare by decoding both ways and by length.
        let wire = encoded.encode_to_vec();
        assert_eq!(wire.len(), encoded.encoded_len());
        assert_eq!(wire.len(), plain.encoded_len());
        assert_eq!(
            curator::WatchEvent::decode(wire.as_slice()).expect("decodes"),
            plain
        );
        let back = EncodedWatchEvent::decode(plain.encode_to_vec().as_slice()).expect("decodes");
        assert_eq!(back, encoded);
    }
}

/// A `HeartbeatResponse` whose `installation_request` is already encoded:
/// the server returns the stored request byte-for-byte (fields this build
/// does not know survive), as the semantics require.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EncodedHeartbeatResponse {
    /// One encoded `OSInstallationRequest`, if the agent must act on it.
    pub installation_request: Option<Bytes>,
}

impl Message for EncodedHeartbeatResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if let Some(request) = &self.installation_request {
            encoding::encode_key(1, WireType::LengthDelimited, buf);
            encoding::encode_varint(request.len() as u64, buf);
            buf.put_slice(request);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        if tag == 1 {
            let mut request = Bytes::new();
            encoding::bytes::merge(wire_type, &mut request, buf, ctx)?;
            self.installation_request = Some(request);
            Ok(())
        } else {
            encoding::skip_field(wire_type, tag, buf, ctx)
        }
    }

    fn encoded_len(&self) -> usize {
        self.installation_request
            .as_ref()
            .map_or(0, |r| Self::entry_len(r.len()))
    }

    fn clear(&mut self) {
        self.installation_request = None;
    }
}

impl EncodedHeartbeatResponse {
    fn entry_len(len: usize) -> usize {
        encoding::key_len(1) + encoding::encoded_len_varint(len as u64) + len
    }
}

#[cfg(test)]
mod heartbeat_tests {
    use super::*;
    use crate::prelude::agent;

    #[test]
    fn stored_request_bytes_go_out_unchanged() {
        let request = agent::OsInstallationRequest {
            generation: 3,
            ..Default::default()
        };
        let mut stored = request.encode_to_vec();
        // A field this build does not know (number 99, varint 7).
        stored.extend_from_slice(&[0x98, 0x06, 0x07]);
        let response = EncodedHeartbeatResponse {
            installation_request: Some(Bytes::from(stored.clone())),
        };
        let wire = response.encode_to_vec();
        assert_eq!(wire.len(), response.encoded_len());
        assert!(
            wire.ends_with(&stored),
            "the stored bytes are on the wire as they are"
        );
        let decoded = agent::HeartbeatResponse::decode(wire.as_slice()).expect("decodes");
        assert_eq!(decoded.installation_request.expect("request").generation, 3);
        assert_eq!(
            EncodedHeartbeatResponse::decode(wire.as_slice()).expect("decodes"),
            response
        );
    }
}
