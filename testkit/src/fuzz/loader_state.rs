//! `loader_state`: the A/B loader's `loader_state.pb` codec and slot
//! choice (`efi_fw::state`), which the loader runs in firmware on a file
//! the node's OS writes: a panic there is a machine that does not boot.
//!
//! Input: the file's bytes.
//!
//! Checked: nothing panics; what decodes is what protobuf (prost, over
//! the same two `int32` fields) reads from the same bytes; it encodes
//! to bytes that decode to it again and that prost reads alike; the plan
//! for it boots slot A or B, and a rewrite it asks for clears
//! `next_slot` and keeps `active_slot`.

use efi_fw::state::{ENCODED_MAX, Found, LoaderData, Plan, Slot};
use prost::Message;

/// `ABLoaderData` as prost reads it.
#[derive(Clone, PartialEq, prost::Message)]
struct AbLoaderData {
    #[prost(int32, tag = "1")]
    active_slot: i32,
    #[prost(int32, tag = "2")]
    next_slot: i32,
}

/// Runs one input; panics if a property fails.
pub fn run(data: &[u8]) {
    let plan = Plan::choose(Found::from_bytes(Some(data)));
    assert!(matches!(plan.slot, Slot::A | Slot::B));
    let Some(decoded) = LoaderData::decode(data) else {
        assert_eq!(plan.slot, Slot::A, "an undecodable file boots A");
        return;
    };
    let theirs = AbLoaderData::decode(data).expect("prost reads what the loader reads");
    assert_eq!(
        (decoded.active_slot, decoded.next_slot),
        (theirs.active_slot, theirs.next_slot),
        "the loader and prost read other values"
    );
    let mut buf = [0u8; ENCODED_MAX];
    let encoded = decoded.encode(&mut buf).to_vec();
    assert_eq!(LoaderData::decode(&encoded), Some(decoded), "round trip");
    assert_eq!(
        AbLoaderData::decode(encoded.as_slice()).ok(),
        Some(theirs),
        "prost reads the encoding alike"
    );
    if let Some(rewrite) = plan.rewrite {
        assert_eq!(rewrite.next_slot, 0, "the rewrite clears next_slot");
        assert_eq!(
            rewrite.active_slot, decoded.active_slot,
            "and keeps the active slot"
        );
    }
}
