//! The bytes of one embedded-message field of an encoded protobuf
//! message, as they were sent: so that `parameters.pb` is the request's
//! `node_parameters` exactly, fields this agent does not know included
//! (decoding and encoding again with prost would drop them).

use prost::bytes::Buf;
use prost::encoding::{WireType, decode_key, decode_varint};

/// The bytes of field `number` (length-delimited) of `message`: every
/// occurrence concatenated, which is what a parser merging them reads
/// (an embedded message sent in parts is the merge of the parts).
/// `None` when the field is absent or `message` is not well formed.
pub(super) fn field_bytes(mut message: &[u8], number: u32) -> Option<Vec<u8>> {
    let mut found: Option<Vec<u8>> = None;
    while message.has_remaining() {
        let (tag, wire_type) = decode_key(&mut message).ok()?;
        match wire_type {
            WireType::Varint => {
                decode_varint(&mut message).ok()?;
            }
            WireType::SixtyFourBit => skip(&mut message, 8)?,
            WireType::ThirtyTwoBit => skip(&mut message, 4)?,
            WireType::LengthDelimited => {
                let len = usize::try_from(decode_varint(&mut message).ok()?).ok()?;
                if len > message.len() {
                    return None;
                }
                let (bytes, rest) = message.split_at(len);
                if tag == number {
                    found.get_or_insert_with(Vec::new).extend_from_slice(bytes);
                }
                message = rest;
            }
            WireType::StartGroup | WireType::EndGroup => return None,
        }
    }
    found
}

fn skip(message: &mut &[u8], n: usize) -> Option<()> {
    if message.len() < n {
        return None;
    }
    message.advance(n);
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn fields_are_found_whole_and_merged_when_sent_in_parts() {
        // generation = 7 (varint), field 2 = "ab", a fixed64, field 2 = "c".
        let mut message = vec![0x08, 0x07, 0x12, 0x02, b'a', b'b'];
        message.extend_from_slice(&[0x19, 1, 2, 3, 4, 5, 6, 7, 8]);
        message.extend_from_slice(&[0x12, 0x01, b'c']);
        assert_eq!(field_bytes(&message, 2), Some(b"abc".to_vec()));
        assert_eq!(field_bytes(&message, 3), None);
        // Cut inside a field, or a group: not well formed.
        assert_eq!(field_bytes(&message[..4], 2), None);
        assert_eq!(field_bytes(&[0x13], 2), None);
    }

    #[test]
    fn unknown_fields_survive_where_prost_drops_them() {
        use metropolis_proto::prelude::debug::NodeParameters;
        // field 99 (unknown to NodeParameters): length-delimited "x".
        let unknown = [0x9a, 0x06, 0x01, b'x'];
        let mut wrapper = vec![0x12, unknown.len() as u8];
        wrapper.extend_from_slice(&unknown);
        let exact = field_bytes(&wrapper, 2).unwrap_or_default();
        assert_eq!(exact, unknown);
        let reencoded = NodeParameters::decode(exact.as_slice())
            .unwrap_or_default()
            .encode_to_vec();
        assert!(reencoded.is_empty(), "prost keeps unknown fields now");
    }
}
