//! Persistence support for [`MemStore`]: the records a durable owner logs,
//! snapshots, and their binary encoding.
//!
//! A durable owner logs one [`Record`] after each call that changed the
//! store, and rebuilds the store by replaying them with
//! [`MemStore::apply`], optionally starting from a [`Snapshot`]. Replay is
//! deterministic: it always gives the same keys, revisions, leases (with
//! their attached keys) and next lease ID. Lease deadlines are not
//! recorded: replayed and restored leases run their full TTL from the
//! instant passed in, like etcd's after a restart.
//!
//! The encoding is protobuf (prost messages declared here, no `.proto`
//! file), each message carrying a schema version so that a future format
//! can be told apart from a corrupt one.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use prost::Message;

use super::model::{Lease, MemStore};
use super::types::{
    CmpOp, Compare, CompareTarget, KeyRange, KeyValue, LeaseId, Op, Revision, StoreError, Txn,
};
use crate::time::Instant;

/// One change of a [`MemStore`], as logged by a durable owner.
///
/// Which call logs what:
///
/// | call | record |
/// | --- | --- |
/// | [`MemStore::txn`] that changed the revision | `Txn(txn)` |
/// | [`MemStore::lease_grant`] that succeeded | `LeaseGrant { id, ttl }`, with the granted ID |
/// | [`MemStore::lease_revoke`] that succeeded | `LeaseRevoke(id)` |
/// | [`MemStore::handle_timeout`] | one `LeaseRevoke(id)` per returned ID, in order |
/// | [`MemStore::compact`] that succeeded | `Compact(revision)` |
///
/// Keep-alives, watches and read-only transactions change nothing that
/// replay needs, and are not logged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// A transaction that wrote something.
    Txn(Txn),
    /// A lease granted, with the ID it got.
    LeaseGrant {
        /// The lease ID (never 0).
        id: LeaseId,
        /// Its TTL.
        ttl: Duration,
    },
    /// A lease revoked or expired.
    LeaseRevoke(LeaseId),
    /// History compacted up to this revision.
    Compact(Revision),
}

/// The whole state of a [`MemStore`] but its watch history, watches and
/// lease deadlines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// The store's revision.
    pub revision: Revision,
    /// The store's compact revision when the snapshot was taken. A store
    /// restored from the snapshot has no history, so its compact revision
    /// is `revision`.
    pub compact_revision: Revision,
    /// Every key with its metadata, in key order. A key's `lease` attaches
    /// it to that lease.
    pub kvs: Vec<KeyValue>,
    /// Every lease, in ID order.
    pub leases: Vec<SnapshotLease>,
    /// The ID the next lease grant with ID 0 gets.
    pub next_lease_id: LeaseId,
}

/// A lease in a [`Snapshot`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotLease {
    /// The lease ID.
    pub id: LeaseId,
    /// Its TTL.
    pub ttl: Duration,
}

impl Snapshot {
    /// Checks that the snapshot describes a state a store can be in: keys
    /// unique and in order, metadata within the revision, every key's lease
    /// present, leases unique and in order.
    pub fn validate(&self) -> Result<(), RecordError> {
        let bad =
            |field: &'static str, reason: String| Err(RecordError::BadField { field, reason });
        if self.revision < 1 {
            return bad("snapshot.revision", format!("{} is below 1", self.revision));
        }
        if self.compact_revision < 0 || self.compact_revision > self.revision {
            return bad(
                "snapshot.compact_revision",
                format!("{} is outside 0..={}", self.compact_revision, self.revision),
            );
        }
        let lease_ids: BTreeSet<LeaseId> = self.leases.iter().map(|l| l.id).collect();
        if lease_ids.len() != self.leases.len()
            || !self.leases.windows(2).all(|w| w[0].id < w[1].id)
        {
            return bad(
                "snapshot.leases",
                "lease IDs are not unique and in order".into(),
            );
        }
        if lease_ids.contains(&0) {
            return bad("snapshot.leases", "lease ID 0".into());
        }
        let max_id = self.leases.iter().map(|l| l.id).max().unwrap_or(0);
        if self.next_lease_id < 1 || self.next_lease_id < max_id.saturating_add(1) {
            return bad(
                "snapshot.next_lease_id",
                format!(
                    "{} is not above every lease ID (highest {max_id})",
                    self.next_lease_id
                ),
            );
        }
        if !self.kvs.windows(2).all(|w| w[0].key < w[1].key) {
            return bad("snapshot.kvs", "keys are not unique and in order".into());
        }
        for kv in &self.kvs {
            if kv.create_revision < 1
                || kv.create_revision > kv.mod_revision
                || kv.mod_revision > self.revision
                || kv.version < 1
            {
                return bad(
                    "snapshot.kvs",
                    format!(
                        "key {:?} has inconsistent metadata (create {}, mod {}, version {}) at revision {}",
                        kv.key, kv.create_revision, kv.mod_revision, kv.version, self.revision
                    ),
                );
            }
            if kv.lease != 0 && !lease_ids.contains(&kv.lease) {
                return bad(
                    "snapshot.kvs",
                    format!("key {:?} is attached to missing lease {}", kv.key, kv.lease),
                );
            }
        }
        Ok(())
    }
}

impl MemStore {
    /// Replays one logged record. With the records logged after each
    /// state-changing call, in order, replay gives the same state.
    ///
    /// A `Compact` at or below the current compact revision is accepted and
    /// does nothing: it happens when replaying a log over a store restored
    /// from a snapshot, whose history starts at the snapshot.
    pub fn apply(&mut self, record: &Record, now: Instant) -> Result<(), StoreError> {
        match record {
            Record::Txn(txn) => self.txn(txn).map(drop),
            Record::LeaseGrant { id, ttl } => self.lease_grant(*id, *ttl, now).map(drop),
            Record::LeaseRevoke(id) => self.lease_revoke(*id).map(drop),
            Record::Compact(revision) => {
                if *revision <= self.compact_revision {
                    Ok(())
                } else {
                    self.compact(*revision)
                }
            }
        }
    }

    /// The store's state as a [`Snapshot`].
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            revision: self.revision,
            compact_revision: self.compact_revision,
            kvs: self.kvs.values().cloned().collect(),
            leases: self
                .leases
                .iter()
                .map(|(id, l)| SnapshotLease {
                    id: *id,
                    ttl: l.ttl,
                })
                .collect(),
            next_lease_id: self.next_lease_id,
        }
    }

    /// Restores a store from a snapshot. Leases restart with their full TTL
    /// from `now` (like etcd on restart). The history is empty and the
    /// compact revision is the snapshot's revision, so watches from older
    /// revisions fail with [`StoreError::Compacted`].
    ///
    /// The snapshot should be valid ([`Snapshot::validate`]; decoding
    /// validates): a key attached to a missing lease keeps its lease ID but
    /// is attached to nothing.
    pub fn from_snapshot(snapshot: Snapshot, now: Instant) -> MemStore {
        let mut leases: BTreeMap<LeaseId, Lease> = snapshot
            .leases
            .iter()
            .map(|l| {
                (
                    l.id,
                    Lease {
                        ttl: l.ttl,
                        deadline: now + l.ttl,
                        keys: BTreeSet::new(),
                    },
                )
            })
            .collect();
        let mut kvs = BTreeMap::new();
        for kv in snapshot.kvs {
            if let Some(lease) = leases.get_mut(&kv.lease) {
                lease.keys.insert(kv.key.clone());
            }
            kvs.insert(kv.key.clone(), kv);
        }
        MemStore::from_parts(kvs, snapshot.revision, leases, snapshot.next_lease_id)
    }
}

/// The schema version this code writes and reads.
pub const SCHEMA_VERSION: u32 = 1;

/// Why bytes could not be decoded into a [`Record`] or [`Snapshot`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordError {
    /// The bytes are not a valid protobuf message.
    Malformed {
        /// What was being decoded ("record" or "snapshot").
        what: &'static str,
        /// The decoder's explanation.
        detail: String,
    },
    /// The message was written with a schema version this code does not
    /// know.
    UnknownVersion {
        /// What was being decoded ("record" or "snapshot").
        what: &'static str,
        /// The version found.
        found: u32,
        /// The version this code supports.
        supported: u32,
    },
    /// A required field is missing.
    MissingField {
        /// The field, as `message.field`.
        field: &'static str,
    },
    /// A field has a value that is not allowed.
    BadField {
        /// The field, as `message.field`.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordError::Malformed { what, detail } => write!(f, "malformed {what}: {detail}"),
            RecordError::UnknownVersion {
                what,
                found,
                supported,
            } => write!(
                f,
                "{what} has unknown schema version {found} (this build supports version {supported})"
            ),
            RecordError::MissingField { field } => write!(f, "missing field {field}"),
            RecordError::BadField { field, reason } => write!(f, "bad field {field}: {reason}"),
        }
    }
}

impl std::error::Error for RecordError {}

/// Protobuf messages of the encoding. Tags are part of the on-disk format:
/// never reuse one.
mod pb {
    use bytes::Bytes;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Record {
        #[prost(uint32, tag = "1")]
        pub version: u32,
        #[prost(oneof = "RecordKind", tags = "2, 3, 4, 5")]
        pub kind: Option<RecordKind>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum RecordKind {
        #[prost(message, tag = "2")]
        Txn(Txn),
        #[prost(message, tag = "3")]
        LeaseGrant(Lease),
        #[prost(int64, tag = "4")]
        LeaseRevoke(i64),
        #[prost(int64, tag = "5")]
        Compact(i64),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Txn {
        #[prost(message, repeated, tag = "1")]
        pub compares: Vec<Compare>,
        #[prost(message, repeated, tag = "2")]
        pub success: Vec<Op>,
        #[prost(message, repeated, tag = "3")]
        pub failure: Vec<Op>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Compare {
        #[prost(bytes = "bytes", tag = "1")]
        pub key: Bytes,
        /// 1 equal, 2 not equal, 3 less, 4 greater.
        #[prost(uint32, tag = "2")]
        pub op: u32,
        #[prost(oneof = "CompareTarget", tags = "3, 4, 5, 6")]
        pub target: Option<CompareTarget>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum CompareTarget {
        #[prost(bytes = "bytes", tag = "3")]
        Value(Bytes),
        #[prost(int64, tag = "4")]
        CreateRevision(i64),
        #[prost(int64, tag = "5")]
        ModRevision(i64),
        #[prost(int64, tag = "6")]
        Version(i64),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Op {
        #[prost(oneof = "OpKind", tags = "1, 2, 3")]
        pub kind: Option<OpKind>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum OpKind {
        #[prost(message, tag = "1")]
        Range(KeyRange),
        #[prost(message, tag = "2")]
        Put(Put),
        #[prost(message, tag = "3")]
        Delete(KeyRange),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct KeyRange {
        #[prost(oneof = "RangeKind", tags = "1, 2")]
        pub kind: Option<RangeKind>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum RangeKind {
        #[prost(bytes = "bytes", tag = "1")]
        Key(Bytes),
        #[prost(bytes = "bytes", tag = "2")]
        Prefix(Bytes),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Put {
        #[prost(bytes = "bytes", tag = "1")]
        pub key: Bytes,
        #[prost(bytes = "bytes", tag = "2")]
        pub value: Bytes,
        #[prost(int64, tag = "3")]
        pub lease: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Lease {
        #[prost(int64, tag = "1")]
        pub id: i64,
        #[prost(uint64, tag = "2")]
        pub ttl_secs: u64,
        #[prost(uint32, tag = "3")]
        pub ttl_nanos: u32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct KeyValue {
        #[prost(bytes = "bytes", tag = "1")]
        pub key: Bytes,
        #[prost(bytes = "bytes", tag = "2")]
        pub value: Bytes,
        #[prost(int64, tag = "3")]
        pub create_revision: i64,
        #[prost(int64, tag = "4")]
        pub mod_revision: i64,
        #[prost(int64, tag = "5")]
        pub version: i64,
        #[prost(int64, tag = "6")]
        pub lease: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Snapshot {
        #[prost(uint32, tag = "1")]
        pub version: u32,
        #[prost(int64, tag = "2")]
        pub revision: i64,
        #[prost(int64, tag = "3")]
        pub compact_revision: i64,
        #[prost(message, repeated, tag = "4")]
        pub kvs: Vec<KeyValue>,
        #[prost(message, repeated, tag = "5")]
        pub leases: Vec<Lease>,
        #[prost(int64, tag = "6")]
        pub next_lease_id: i64,
    }
}

fn range_to_pb(range: &KeyRange) -> pb::KeyRange {
    pb::KeyRange {
        kind: Some(match range {
            KeyRange::Key(k) => pb::RangeKind::Key(k.clone()),
            KeyRange::Prefix(p) => pb::RangeKind::Prefix(p.clone()),
        }),
    }
}

fn range_from_pb(range: pb::KeyRange) -> Result<KeyRange, RecordError> {
    match range.kind {
        Some(pb::RangeKind::Key(k)) => Ok(KeyRange::Key(k)),
        Some(pb::RangeKind::Prefix(p)) => Ok(KeyRange::Prefix(p)),
        None => Err(RecordError::MissingField {
            field: "key_range.kind",
        }),
    }
}

fn op_to_pb(op: &Op) -> pb::Op {
    pb::Op {
        kind: Some(match op {
            Op::Range(r) => pb::OpKind::Range(range_to_pb(r)),
            Op::Put { key, value, lease } => pb::OpKind::Put(pb::Put {
                key: key.clone(),
                value: value.clone(),
                lease: *lease,
            }),
            Op::Delete(r) => pb::OpKind::Delete(range_to_pb(r)),
        }),
    }
}

fn op_from_pb(op: pb::Op) -> Result<Op, RecordError> {
    match op.kind {
        Some(pb::OpKind::Range(r)) => Ok(Op::Range(range_from_pb(r)?)),
        Some(pb::OpKind::Put(p)) => Ok(Op::Put {
            key: p.key,
            value: p.value,
            lease: p.lease,
        }),
        Some(pb::OpKind::Delete(r)) => Ok(Op::Delete(range_from_pb(r)?)),
        None => Err(RecordError::MissingField { field: "op.kind" }),
    }
}

fn compare_to_pb(c: &Compare) -> pb::Compare {
    pb::Compare {
        key: c.key.clone(),
        op: match c.op {
            CmpOp::Equal => 1,
            CmpOp::NotEqual => 2,
            CmpOp::Less => 3,
            CmpOp::Greater => 4,
        },
        target: Some(match &c.target {
            CompareTarget::Value(v) => pb::CompareTarget::Value(v.clone()),
            CompareTarget::CreateRevision(r) => pb::CompareTarget::CreateRevision(*r),
            CompareTarget::ModRevision(r) => pb::CompareTarget::ModRevision(*r),
            CompareTarget::Version(v) => pb::CompareTarget::Version(*v),
        }),
    }
}

fn compare_from_pb(c: pb::Compare) -> Result<Compare, RecordError> {
    let op = match c.op {
        1 => CmpOp::Equal,
        2 => CmpOp::NotEqual,
        3 => CmpOp::Less,
        4 => CmpOp::Greater,
        other => {
            return Err(RecordError::BadField {
                field: "compare.op",
                reason: format!("unknown operator {other} (known: 1 to 4)"),
            });
        }
    };
    let target = match c.target {
        Some(pb::CompareTarget::Value(v)) => CompareTarget::Value(v),
        Some(pb::CompareTarget::CreateRevision(r)) => CompareTarget::CreateRevision(r),
        Some(pb::CompareTarget::ModRevision(r)) => CompareTarget::ModRevision(r),
        Some(pb::CompareTarget::Version(v)) => CompareTarget::Version(v),
        None => {
            return Err(RecordError::MissingField {
                field: "compare.target",
            });
        }
    };
    Ok(Compare {
        key: c.key,
        op,
        target,
    })
}

fn lease_to_pb(id: LeaseId, ttl: Duration) -> pb::Lease {
    pb::Lease {
        id,
        ttl_secs: ttl.as_secs(),
        ttl_nanos: ttl.subsec_nanos(),
    }
}

fn ttl_from_pb(lease: &pb::Lease) -> Result<Duration, RecordError> {
    if lease.ttl_nanos >= 1_000_000_000 {
        return Err(RecordError::BadField {
            field: "lease.ttl_nanos",
            reason: format!("{} is not below one second", lease.ttl_nanos),
        });
    }
    Ok(Duration::new(lease.ttl_secs, lease.ttl_nanos))
}

fn check_version(what: &'static str, found: u32) -> Result<(), RecordError> {
    if found == SCHEMA_VERSION {
        Ok(())
    } else {
        Err(RecordError::UnknownVersion {
            what,
            found,
            supported: SCHEMA_VERSION,
        })
    }
}

/// Encodes a record (protobuf, with the schema version).
pub fn encode_record(record: &Record) -> Vec<u8> {
    let kind = match record {
        Record::Txn(txn) => pb::RecordKind::Txn(pb::Txn {
            compares: txn.compares.iter().map(compare_to_pb).collect(),
            success: txn.success.iter().map(op_to_pb).collect(),
            failure: txn.failure.iter().map(op_to_pb).collect(),
        }),
        Record::LeaseGrant { id, ttl } => pb::RecordKind::LeaseGrant(lease_to_pb(*id, *ttl)),
        Record::LeaseRevoke(id) => pb::RecordKind::LeaseRevoke(*id),
        Record::Compact(rev) => pb::RecordKind::Compact(*rev),
    };
    pb::Record {
        version: SCHEMA_VERSION,
        kind: Some(kind),
    }
    .encode_to_vec()
}

/// Decodes a record written by [`encode_record`].
pub fn decode_record(bytes: &[u8]) -> Result<Record, RecordError> {
    let msg = pb::Record::decode(bytes).map_err(|e| RecordError::Malformed {
        what: "record",
        detail: e.to_string(),
    })?;
    check_version("record", msg.version)?;
    match msg.kind {
        Some(pb::RecordKind::Txn(t)) => Ok(Record::Txn(Txn {
            compares: t
                .compares
                .into_iter()
                .map(compare_from_pb)
                .collect::<Result<_, _>>()?,
            success: t
                .success
                .into_iter()
                .map(op_from_pb)
                .collect::<Result<_, _>>()?,
            failure: t
                .failure
                .into_iter()
                .map(op_from_pb)
                .collect::<Result<_, _>>()?,
        })),
        Some(pb::RecordKind::LeaseGrant(l)) => {
            if l.id == 0 {
                return Err(RecordError::BadField {
                    field: "lease.id",
                    reason: "a granted lease cannot have ID 0".into(),
                });
            }
            Ok(Record::LeaseGrant {
                id: l.id,
                ttl: ttl_from_pb(&l)?,
            })
        }
        Some(pb::RecordKind::LeaseRevoke(id)) => Ok(Record::LeaseRevoke(id)),
        Some(pb::RecordKind::Compact(rev)) => Ok(Record::Compact(rev)),
        None => Err(RecordError::MissingField {
            field: "record.kind",
        }),
    }
}

/// Encodes a snapshot (protobuf, with the schema version).
pub fn encode_snapshot(snapshot: &Snapshot) -> Vec<u8> {
    pb::Snapshot {
        version: SCHEMA_VERSION,
        revision: snapshot.revision,
        compact_revision: snapshot.compact_revision,
        kvs: snapshot
            .kvs
            .iter()
            .map(|kv| pb::KeyValue {
                key: kv.key.clone(),
                value: kv.value.clone(),
                create_revision: kv.create_revision,
                mod_revision: kv.mod_revision,
                version: kv.version,
                lease: kv.lease,
            })
            .collect(),
        leases: snapshot
            .leases
            .iter()
            .map(|l| lease_to_pb(l.id, l.ttl))
            .collect(),
        next_lease_id: snapshot.next_lease_id,
    }
    .encode_to_vec()
}

/// Decodes a snapshot written by [`encode_snapshot`], and
/// [validates](Snapshot::validate) it.
pub fn decode_snapshot(bytes: &[u8]) -> Result<Snapshot, RecordError> {
    let msg = pb::Snapshot::decode(bytes).map_err(|e| RecordError::Malformed {
        what: "snapshot",
        detail: e.to_string(),
    })?;
    check_version("snapshot", msg.version)?;
    let snapshot = Snapshot {
        revision: msg.revision,
        compact_revision: msg.compact_revision,
        kvs: msg
            .kvs
            .into_iter()
            .map(|kv| KeyValue {
                key: kv.key,
                value: kv.value,
                create_revision: kv.create_revision,
                mod_revision: kv.mod_revision,
                version: kv.version,
                lease: kv.lease,
            })
            .collect(),
        leases: msg
            .leases
            .iter()
            .map(|l| {
                Ok(SnapshotLease {
                    id: l.id,
                    ttl: ttl_from_pb(l)?,
                })
            })
            .collect::<Result<_, RecordError>>()?,
        next_lease_id: msg.next_lease_id,
    };
    snapshot.validate()?;
    Ok(snapshot)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use bytes::Bytes;

    use super::*;

    #[test]
    fn record_round_trip_and_errors() {
        let txn = Txn {
            compares: vec![Compare {
                key: Bytes::from_static(b"k"),
                op: CmpOp::Less,
                target: CompareTarget::Value(Bytes::new()),
            }],
            success: vec![
                Op::Put {
                    key: Bytes::from_static(b"k"),
                    value: Bytes::new(),
                    lease: 7,
                },
                Op::Delete(KeyRange::Prefix(Bytes::new())),
            ],
            failure: vec![Op::Range(KeyRange::Key(Bytes::from_static(b"x")))],
        };
        for record in [
            Record::Txn(txn),
            Record::Txn(Txn::default()),
            Record::LeaseGrant {
                id: -3,
                ttl: Duration::new(5, 7),
            },
            Record::LeaseRevoke(9),
            Record::Compact(0),
        ] {
            assert_eq!(decode_record(&encode_record(&record)), Ok(record));
        }
        let future = pb::Record {
            version: 2,
            kind: Some(pb::RecordKind::Compact(1)),
        };
        assert_eq!(
            decode_record(&future.encode_to_vec()),
            Err(RecordError::UnknownVersion {
                what: "record",
                found: 2,
                supported: 1
            })
        );
        assert!(matches!(
            decode_record(&[0xff, 0xff]),
            Err(RecordError::Malformed { .. })
        ));
        let empty = pb::Record {
            version: 1,
            kind: None,
        };
        assert_eq!(
            decode_record(&empty.encode_to_vec()),
            Err(RecordError::MissingField {
                field: "record.kind"
            })
        );
        let bad_op = pb::Record {
            version: 1,
            kind: Some(pb::RecordKind::Txn(pb::Txn {
                compares: vec![pb::Compare {
                    key: Bytes::new(),
                    op: 9,
                    target: Some(pb::CompareTarget::Version(1)),
                }],
                ..Default::default()
            })),
        };
        let err = decode_record(&bad_op.encode_to_vec()).unwrap_err();
        assert!(err.to_string().contains("compare.op"), "{err}");
    }

    #[test]
    fn snapshot_validation() {
        let mut store = MemStore::new();
        let lease = store
            .lease_grant(0, Duration::from_secs(3), Instant::ZERO)
            .unwrap();
        store
            .txn(&Txn {
                success: vec![Op::Put {
                    key: Bytes::from_static(b"a"),
                    value: Bytes::from_static(b"1"),
                    lease,
                }],
                ..Default::default()
            })
            .unwrap();
        let snap = store.snapshot();
        assert_eq!(decode_snapshot(&encode_snapshot(&snap)), Ok(snap.clone()));
        let mut dangling = snap.clone();
        dangling.leases.clear();
        assert!(matches!(
            decode_snapshot(&encode_snapshot(&dangling)),
            Err(RecordError::BadField {
                field: "snapshot.kvs",
                ..
            })
        ));
        let mut future = snap;
        future.kvs[0].mod_revision = 99;
        assert!(decode_snapshot(&encode_snapshot(&future)).is_err());
    }
}
