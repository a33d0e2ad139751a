//! Helpers shared by the embedded store's integration tests.

#![allow(dead_code)]

use bytes::Bytes;
use metropolis_core::store::{KeyRange, KeyValue, Op, OpResult, Revision, Txn};
use metropolis_store::EmbeddedStore;

pub use futures::executor::block_on;

/// The bytes of `s`.
pub fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// A transaction putting `value` at `key`.
pub fn put(key: &str, value: &str) -> Txn {
    Txn {
        success: vec![Op::Put {
            key: b(key),
            value: b(value),
            lease: 0,
        }],
        ..Txn::default()
    }
}

/// The store's revision and every key in it.
pub fn dump(store: &EmbeddedStore) -> (Revision, Vec<KeyValue>) {
    let r = block_on(store.txn(Txn {
        success: vec![Op::Range(KeyRange::Prefix(Bytes::new()))],
        ..Txn::default()
    }))
    .expect("range over the whole store");
    match r.results.into_iter().next() {
        Some(OpResult::Range(kvs)) => (r.revision, kvs),
        other => panic!("expected a range result, got {other:?}"),
    }
}
