//! What the worlds send a curator, shared by the cluster and the embedded
//! world: the Curator methods' paths, the encoded requests, and the
//! numbers (an update's sequence, a guest's incarnation) they carry in a
//! node status's external address, `<prefix>high.low`, so that a checker
//! reads them back from whatever the curator stored or streamed.

use metropolis_core::identity::NodeId;
use metropolis_proto::prelude::{common, curator};
use prost::Message;

/// The path of `Curator.UpdateNodeStatus`.
pub const UPDATE: &str = "/metropolis.node.core.curator.proto.api.Curator/UpdateNodeStatus";
/// The path of `Curator.Watch`.
pub const WATCH: &str = "/metropolis.node.core.curator.proto.api.Curator/Watch";

/// An encoded `WatchRequest` for all nodes.
pub fn watch_all() -> Vec<u8> {
    curator::WatchRequest {
        kind: Some(curator::watch_request::Kind::NodesInCluster(
            curator::watch_request::NodesInCluster {},
        )),
    }
    .encode_to_vec()
}

/// An encoded `UpdateNodeStatusRequest` setting `id`'s external address.
pub fn update(id: &NodeId, external_address: String) -> Vec<u8> {
    curator::UpdateNodeStatusRequest {
        node_id: id.to_string(),
        status: Some(common::NodeStatus {
            external_address,
            ..Default::default()
        }),
    }
    .encode_to_vec()
}

/// The address `<prefix>high.low` carrying `n` (`high * 256 + low`);
/// `prefix` is two octets and a dot, e.g. `"10.0."`.
pub fn numbered(prefix: &str, n: u64) -> String {
    format!("{prefix}{}.{}", n / 256, n % 256)
}

/// The number an address made by [`numbered`] with `prefix` carries.
pub fn number(address: &str, prefix: &str) -> Option<u64> {
    let mut parts = address.strip_prefix(prefix)?.split('.');
    let high: u64 = parts.next()?.parse().ok()?;
    let low: u64 = parts.next()?.parse().ok()?;
    Some(high * 256 + low)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_round_trip_through_addresses() {
        for n in [0, 1, 255, 256, 65_535] {
            assert_eq!(number(&numbered("10.1.", n), "10.1."), Some(n));
        }
        assert_eq!(number("10.0.1.2", "10.1."), None);
        assert_eq!(number("10.1.x.2", "10.1."), None);
    }
}
