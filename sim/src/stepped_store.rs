//! The embedded store with its writer stepped by the caller
//! (`EmbeddedStore::open_stepped`), for what a world does outside its
//! runtime's tasks: a change committed by stepping the writer until it has
//! nothing to do, and a read of everything under a prefix.

// What this module unwraps is the simulation's own.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::task::Waker;

use bytes::Bytes;
use futures::FutureExt;
use metropolis_core::store::{KeyRange, Op, OpResult, StoreError, Txn, TxnResponse};
use metropolis_store::{EmbeddedStore, StoreWriter, WriterStep};

/// Steps `writer` until it waits (or stops): everything queued is written.
pub fn settle(writer: &mut StoreWriter) {
    while writer.step(Waker::noop()) == WriterStep::Wrote {}
}

/// Runs `txn`, stepping `writer` until it is durable (or failed). Time
/// does not move meanwhile, so the writer must not hold the batch open
/// for more (a zero `commit_delay`, or the store's first batch).
pub fn commit(
    store: &EmbeddedStore,
    writer: &mut StoreWriter,
    txn: Txn,
) -> Result<TxnResponse, StoreError> {
    let mut answer = store.txn(txn);
    settle(writer);
    answer
        .as_mut()
        .now_or_never()
        .expect("a change is answered once the writer has nothing left to write")
}

/// Every key under `prefix` and its value, read with nothing in flight.
pub fn range(store: &EmbeddedStore, prefix: &'static [u8]) -> BTreeMap<Bytes, Bytes> {
    let read = Txn {
        compares: Vec::new(),
        success: vec![Op::Range(KeyRange::Prefix(Bytes::from_static(prefix)))],
        failure: Vec::new(),
    };
    let response = store
        .txn(read)
        .now_or_never()
        .expect("a read with nothing in flight is answered at once")
        .unwrap();
    match response.results.into_iter().next() {
        Some(OpResult::Range(kvs)) => kvs.into_iter().map(|kv| (kv.key, kv.value)).collect(),
        other => panic!("a range read answered {other:?}"),
    }
}

/// A clock that never moves: a world without a runtime (no lease, no
/// commit delay) gives it to the store so that nothing reads the host's.
#[derive(Debug, Default)]
pub struct FrozenClock;

impl metropolis_core::ports::MonotonicClock for FrozenClock {
    fn now(&self) -> metropolis_core::time::Instant {
        metropolis_core::time::Instant::ZERO
    }
}
