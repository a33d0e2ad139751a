//! The store model: the etcd semantics the project relies on, as a pure
//! machine.
//!
//! - [`types`](self): keys, values, transactions, events, errors.
//! - [`MemStore`]: the MVCC store itself (revisions, transactions, leases
//!   on injected time, watches, compaction).
//! - [`Record`], [`Snapshot`] and their encoding: what a durable owner logs
//!   and stores to rebuild a `MemStore` by deterministic replay;
//!   [`encode_txn_record`] writes a transaction's record without copying it.

mod model;
mod record;
mod txn_encoding;
mod types;

#[cfg(test)]
mod tests;

pub use model::{CompactedHistory, LeaseInfo, MemStore, WatchId};
pub use record::{
    Record, RecordError, SCHEMA_VERSION, Snapshot, SnapshotLease, decode_record, decode_snapshot,
    encode_record, encode_snapshot,
};
pub use txn_encoding::{encode_txn_record, txn_record_len};
pub use types::*;
