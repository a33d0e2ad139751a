//! Messages from their protobuf JSON mapping
//! (<https://protobuf.dev/programming-guides/json/>), over the descriptors
//! of [`FILE_DESCRIPTOR_SET`](crate::FILE_DESCRIPTOR_SET): what an operator
//! writes by hand, e.g. a `metropolis.proto.api.NodeParameters` for
//! `metroctl install request --node-parameters`.
//!
//! Field names are accepted as in the .proto file or in lowerCamelCase;
//! `bytes` fields are base64 (standard or URL-safe, padded or not), enums
//! their value names or numbers, 64-bit integers numbers or strings.
//! Unknown fields are refused. An error names the JSON path of the value
//! it is about (`network_config.interface[0].mtu`) and quotes at most a
//! bounded prefix of the input.

use std::fmt;
use std::sync::OnceLock;

use prost_reflect::{DescriptorPool, DynamicMessage};

/// The longest message of the deserializer kept in a [`JsonError`]
/// (it may quote the input).
const MAX_MESSAGE_CHARS: usize = 200;

/// Why a JSON document is not the message it should be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JsonError {
    /// The JSON path of the offending value (`cluster_bootstrap.owner_public_key`),
    /// when the error is about one.
    pub path: Option<String>,
    /// What is wrong, at most a few hundred characters.
    pub message: String,
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(path) => write!(f, "{path}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for JsonError {}

impl JsonError {
    fn new(path: Option<String>, message: impl fmt::Display) -> Self {
        JsonError {
            path: path.map(|p| bounded(&p)),
            message: bounded(&message.to_string()),
        }
    }
}

/// At most [`MAX_MESSAGE_CHARS`] characters of `text`, with `…` when cut.
fn bounded(text: &str) -> String {
    match text.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_string(),
    }
}

/// Every descriptor of [`FILE_DESCRIPTOR_SET`](crate::FILE_DESCRIPTOR_SET),
/// decoded once; `None` if they do not decode (they are built with the
/// crate, so they do).
fn pool() -> Option<&'static DescriptorPool> {
    static POOL: OnceLock<Option<DescriptorPool>> = OnceLock::new();
    POOL.get_or_init(|| DescriptorPool::decode(crate::FILE_DESCRIPTOR_SET).ok())
        .as_ref()
}

/// Parses `json`, the protobuf JSON mapping of the message `full_name`
/// (e.g. `metropolis.proto.api.NodeParameters`), into `M`, the generated
/// type of that message.
///
/// Fails if `full_name` is not among the crate's descriptors, if `json`
/// is not one JSON object of that message (syntax, unknown fields, values
/// of the wrong type, bad base64), or if `M` is not the type of
/// `full_name` (what the descriptors decode does not decode as `M`).
pub fn message_from_json<M: prost::Message + Default>(
    full_name: &str,
    json: &[u8],
) -> Result<M, JsonError> {
    let descriptor = pool()
        .and_then(|pool| pool.get_message_by_name(full_name))
        .ok_or_else(|| JsonError::new(None, format!("no message {full_name} is known")))?;
    let mut deserializer = serde_json::Deserializer::from_slice(json);
    let mut track = serde_path_to_error::Track::new();
    let tracked = serde_path_to_error::Deserializer::new(&mut deserializer, &mut track);
    let message = DynamicMessage::deserialize(descriptor, tracked).map_err(|e| {
        let path = track.path().to_string();
        // The root (".") names nothing: the message says where it is.
        let path = (path != ".").then_some(path);
        JsonError::new(path, e)
    })?;
    deserializer
        .end()
        .map_err(|e| JsonError::new(None, format!("after the object: {e}")))?;
    message.transcode_to::<M>().map_err(|e| {
        JsonError::new(
            None,
            format!("the message is not the type of {full_name}: {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prelude::debug::NodeParameters;
    use crate::prelude::debug::node_parameters::Cluster;

    const NAME: &str = "metropolis.proto.api.NodeParameters";

    #[test]
    fn node_parameters_in_both_spellings() {
        let json = br#"{
            "cluster_bootstrap": {"owner_public_key": "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"},
            "networkConfig": {"interface": [{"name": "eth0", "ipv4_autoconfig": {},
                "address": ["10.0.0.5/24"], "mtu": 1500}],
                "nameserver": [{"ip": "10.0.0.1"}]}
        }"#;
        let p: NodeParameters = message_from_json(NAME, json).expect("valid");
        let Some(Cluster::ClusterBootstrap(b)) = p.cluster else {
            panic!("no bootstrap: {p:?}");
        };
        assert_eq!(b.owner_public_key.as_ref(), (0u8..32).collect::<Vec<_>>());
        let net = p.network_config.expect("network_config");
        assert_eq!(net.interface[0].name, "eth0");
        assert_eq!(net.interface[0].mtu, 1500);
        assert!(net.interface[0].ipv4_autoconfig.is_some());
        assert_eq!(net.nameserver[0].ip, "10.0.0.1");
    }

    #[test]
    fn errors_name_the_path_and_stay_bounded() {
        let cases: [(&[u8], &str); 4] = [
            (
                br#"{"network_config": {"interface": [{"mtu": "big"}]}}"#,
                "network_config.interface[0].mtu",
            ),
            (
                br#"{"cluster_bootstrap": {"owner_public_key": "!!"}}"#,
                "cluster_bootstrap.owner_public_key",
            ),
            (
                br#"{"cluster_bootstrap": {"colour": 1}}"#,
                "cluster_bootstrap",
            ),
            (br#"{"network_config": [}"#, "network_config"),
        ];
        for (json, path) in cases {
            let e = message_from_json::<NodeParameters>(NAME, json).expect_err("refused");
            assert!(e.to_string().starts_with(path), "{e} ({path})");
        }
        let long = format!(r#"{{"x{}": 1}}"#, "y".repeat(10_000));
        let e = message_from_json::<NodeParameters>(NAME, long.as_bytes()).expect_err("refused");
        assert!(e.to_string().len() < 1000, "{e}");
        assert!(message_from_json::<NodeParameters>(NAME, b"{} {}").is_err());
        assert!(message_from_json::<NodeParameters>("no.Such", b"{}").is_err());
        assert!(message_from_json::<NodeParameters>(NAME, b"{}").is_ok());
    }
}
