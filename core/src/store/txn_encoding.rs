//! Encoding of a `Record::Txn` straight from a borrowed [`Txn`].
//!
//! [`encode_record`](super::encode_record) goes through owned prost
//! messages: logging a transaction that way means cloning it into a
//! [`Record`](super::Record) and converting it into messages (a vector per
//! list at each step) before encoding. This module writes the very same
//! bytes with `prost::encoding`'s field primitives from the borrowed
//! transaction, into a buffer the caller sized with
//! [`txn_record_len`], so a durable owner logs a write with a single
//! allocation. The tests check the bytes against `encode_record`.
//!
//! Field numbers and presence rules mirror the messages in `record.rs`
//! (proto3: a singular scalar or bytes field equal to its default is
//! omitted; a oneof member is always written).

use bytes::Bytes;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};

use super::record::SCHEMA_VERSION;
use super::types::{CmpOp, Compare, CompareTarget, KeyRange, Op, Txn};

/// Length of a field holding `len` bytes (key, length prefix, contents).
fn delimited_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

/// Length of an `int64`/`uint32` field holding `value`.
fn varint_len(tag: u32, value: u64) -> usize {
    key_len(tag) + encoded_len_varint(value)
}

fn put_delimited_header(tag: u32, len: usize, buf: &mut Vec<u8>) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(len as u64, buf);
}

fn put_bytes(tag: u32, value: &[u8], buf: &mut Vec<u8>) {
    put_delimited_header(tag, value.len(), buf);
    buf.extend_from_slice(value);
}

fn put_varint(tag: u32, value: u64, buf: &mut Vec<u8>) {
    encode_key(tag, WireType::Varint, buf);
    encode_varint(value, buf);
}

/// A proto3 `bytes` field: omitted when empty.
fn bytes_field_len(tag: u32, value: &Bytes) -> usize {
    if value.is_empty() {
        0
    } else {
        delimited_len(tag, value.len())
    }
}

fn put_bytes_field(tag: u32, value: &Bytes, buf: &mut Vec<u8>) {
    if !value.is_empty() {
        put_bytes(tag, value, buf);
    }
}

/// A proto3 `int64` field: omitted when 0. Negative values take ten bytes,
/// as in prost.
fn int64_field_len(tag: u32, value: i64) -> usize {
    if value == 0 {
        0
    } else {
        varint_len(tag, value as u64)
    }
}

fn put_int64_field(tag: u32, value: i64, buf: &mut Vec<u8>) {
    if value != 0 {
        put_varint(tag, value as u64, buf);
    }
}

/// `KeyRange` message body: oneof `key` (1) / `prefix` (2).
fn range_body_len(range: &KeyRange) -> usize {
    match range {
        KeyRange::Key(k) => delimited_len(1, k.len()),
        KeyRange::Prefix(p) => delimited_len(2, p.len()),
    }
}

fn put_range_body(range: &KeyRange, buf: &mut Vec<u8>) {
    match range {
        KeyRange::Key(k) => put_bytes(1, k, buf),
        KeyRange::Prefix(p) => put_bytes(2, p, buf),
    }
}

/// `Put` message body: `key` (1), `value` (2), `lease` (3).
fn put_body_len(key: &Bytes, value: &Bytes, lease: i64) -> usize {
    bytes_field_len(1, key) + bytes_field_len(2, value) + int64_field_len(3, lease)
}

/// `Op` message body: oneof `range` (1) / `put` (2) / `delete` (3).
fn op_body_len(op: &Op) -> usize {
    match op {
        Op::Range(r) => delimited_len(1, range_body_len(r)),
        Op::Put { key, value, lease } => delimited_len(2, put_body_len(key, value, *lease)),
        Op::Delete(r) => delimited_len(3, range_body_len(r)),
    }
}

fn put_op_body(op: &Op, buf: &mut Vec<u8>) {
    match op {
        Op::Range(r) => {
            put_delimited_header(1, range_body_len(r), buf);
            put_range_body(r, buf);
        }
        Op::Put { key, value, lease } => {
            put_delimited_header(2, put_body_len(key, value, *lease), buf);
            put_bytes_field(1, key, buf);
            put_bytes_field(2, value, buf);
            put_int64_field(3, *lease, buf);
        }
        Op::Delete(r) => {
            put_delimited_header(3, range_body_len(r), buf);
            put_range_body(r, buf);
        }
    }
}

/// The wire number of a comparison operator (never 0, so always written).
fn cmp_op_number(op: CmpOp) -> u64 {
    match op {
        CmpOp::Equal => 1,
        CmpOp::NotEqual => 2,
        CmpOp::Less => 3,
        CmpOp::Greater => 4,
    }
}

/// `Compare` message body: `key` (1), `op` (2), oneof target `value` (3) /
/// `create_revision` (4) / `mod_revision` (5) / `version` (6).
fn compare_body_len(c: &Compare) -> usize {
    let target = match &c.target {
        CompareTarget::Value(v) => delimited_len(3, v.len()),
        CompareTarget::CreateRevision(r) => varint_len(4, *r as u64),
        CompareTarget::ModRevision(r) => varint_len(5, *r as u64),
        CompareTarget::Version(v) => varint_len(6, *v as u64),
    };
    bytes_field_len(1, &c.key) + varint_len(2, cmp_op_number(c.op)) + target
}

fn put_compare_body(c: &Compare, buf: &mut Vec<u8>) {
    put_bytes_field(1, &c.key, buf);
    put_varint(2, cmp_op_number(c.op), buf);
    match &c.target {
        CompareTarget::Value(v) => put_bytes(3, v, buf),
        CompareTarget::CreateRevision(r) => put_varint(4, *r as u64, buf),
        CompareTarget::ModRevision(r) => put_varint(5, *r as u64, buf),
        CompareTarget::Version(v) => put_varint(6, *v as u64, buf),
    }
}

/// `Txn` message body: repeated `compares` (1), `success` (2), `failure` (3).
fn txn_body_len(txn: &Txn) -> usize {
    let compares: usize = txn
        .compares
        .iter()
        .map(|c| delimited_len(1, compare_body_len(c)))
        .sum();
    let ops = |tag: u32, ops: &[Op]| -> usize {
        ops.iter()
            .map(|op| delimited_len(tag, op_body_len(op)))
            .sum()
    };
    compares + ops(2, &txn.success) + ops(3, &txn.failure)
}

/// Length of the encoding of `Record::Txn(txn)`.
pub fn txn_record_len(txn: &Txn) -> usize {
    varint_len(1, u64::from(SCHEMA_VERSION)) + delimited_len(2, txn_body_len(txn))
}

/// Appends the encoding of `Record::Txn(txn)` to `buf`: the same bytes as
/// [`encode_record`](super::encode_record) of that record, without cloning
/// the transaction. Reserve [`txn_record_len`] bytes first to write it
/// without reallocating.
pub fn encode_txn_record(txn: &Txn, buf: &mut Vec<u8>) {
    put_varint(1, u64::from(SCHEMA_VERSION), buf);
    put_delimited_header(2, txn_body_len(txn), buf);
    for c in &txn.compares {
        put_delimited_header(1, compare_body_len(c), buf);
        put_compare_body(c, buf);
    }
    for (tag, ops) in [(2, &txn.success), (3, &txn.failure)] {
        for op in ops {
            put_delimited_header(tag, op_body_len(op), buf);
            put_op_body(op, buf);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use proptest::prelude::*;

    use super::*;
    use crate::store::{Record, decode_record, encode_record};

    fn any_bytes() -> impl Strategy<Value = Bytes> {
        prop_oneof![
            Just(Bytes::new()),
            prop::collection::vec(any::<u8>(), 1..200).prop_map(Bytes::from),
        ]
    }

    fn any_i64() -> impl Strategy<Value = i64> {
        prop_oneof![Just(0i64), Just(-1i64), Just(i64::MIN), any::<i64>()]
    }

    fn any_range() -> impl Strategy<Value = KeyRange> {
        prop_oneof![
            any_bytes().prop_map(KeyRange::Key),
            any_bytes().prop_map(KeyRange::Prefix),
        ]
    }

    fn any_op() -> impl Strategy<Value = Op> {
        prop_oneof![
            any_range().prop_map(Op::Range),
            (any_bytes(), any_bytes(), any_i64()).prop_map(|(key, value, lease)| Op::Put {
                key,
                value,
                lease
            }),
            any_range().prop_map(Op::Delete),
        ]
    }

    fn any_compare() -> impl Strategy<Value = Compare> {
        let op =
            prop::sample::select(&[CmpOp::Equal, CmpOp::NotEqual, CmpOp::Less, CmpOp::Greater][..]);
        let target = prop_oneof![
            any_bytes().prop_map(CompareTarget::Value),
            any_i64().prop_map(CompareTarget::CreateRevision),
            any_i64().prop_map(CompareTarget::ModRevision),
            any_i64().prop_map(CompareTarget::Version),
        ];
        (any_bytes(), op, target).prop_map(|(key, op, target)| Compare { key, op, target })
    }

    fn any_txn() -> impl Strategy<Value = Txn> {
        (
            prop::collection::vec(any_compare(), 0..4),
            prop::collection::vec(any_op(), 0..5),
            prop::collection::vec(any_op(), 0..4),
        )
            .prop_map(|(compares, success, failure)| Txn {
                compares,
                success,
                failure,
            })
    }

    fn check(txn: &Txn) {
        let expected = encode_record(&Record::Txn(txn.clone()));
        let mut buf = Vec::with_capacity(txn_record_len(txn));
        encode_txn_record(txn, &mut buf);
        assert_eq!(buf, expected);
        assert_eq!(buf.len(), txn_record_len(txn));
        assert_eq!(decode_record(&buf).unwrap(), Record::Txn(txn.clone()));
    }

    #[test]
    fn empty_and_compare_and_swap() {
        check(&Txn::default());
        let key = Bytes::from_static(b"/nodes/x");
        check(&Txn {
            compares: vec![Compare {
                key: key.clone(),
                op: CmpOp::Equal,
                target: CompareTarget::ModRevision(42),
            }],
            success: vec![Op::Put {
                key: key.clone(),
                value: Bytes::from(vec![7u8; 300]),
                lease: 0,
            }],
            failure: vec![Op::Range(KeyRange::Key(key))],
        });
    }

    proptest! {
        #[test]
        fn same_bytes_as_encode_record(txn in any_txn()) {
            check(&txn);
        }
    }
}
