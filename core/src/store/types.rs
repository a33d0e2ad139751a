//! Data types of the store model: keys, values, transactions, events.
//!
//! These mirror the subset of the etcd v3 API that the project relies on,
//! so that the same service code runs over the embedded store and etcd.

use bytes::Bytes;

/// A store revision. Starts at 1 for an empty store (like etcd); every
/// committed change increments it by one.
pub type Revision = i64;

/// A lease identifier. 0 means "no lease".
pub type LeaseId = i64;

/// One key with its value and metadata, as of some revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    /// The key.
    pub key: Bytes,
    /// The value.
    pub value: Bytes,
    /// Revision at which the key was last created (0 if it does not exist).
    pub create_revision: Revision,
    /// Revision of the last modification of the key.
    pub mod_revision: Revision,
    /// Number of modifications since the key was created (1 after creation).
    pub version: i64,
    /// The lease the key is attached to, 0 for none.
    pub lease: LeaseId,
}

/// A set of keys: one key, or every key starting with a prefix.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeyRange {
    /// Exactly this key.
    Key(Bytes),
    /// Every key that starts with these bytes (an empty prefix is every key).
    Prefix(Bytes),
}

impl KeyRange {
    /// Whether `key` is in this range.
    pub fn contains(&self, key: &[u8]) -> bool {
        match self {
            KeyRange::Key(k) => k.as_ref() == key,
            KeyRange::Prefix(p) => key.starts_with(p),
        }
    }
}

/// Comparison operator of a transaction compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmpOp {
    /// `==`
    Equal,
    /// `!=`
    NotEqual,
    /// `<`
    Less,
    /// `>`
    Greater,
}

impl CmpOp {
    /// Applies the operator to `lhs op rhs`.
    pub fn holds<T: Ord + ?Sized>(self, lhs: &T, rhs: &T) -> bool {
        match self {
            CmpOp::Equal => lhs == rhs,
            CmpOp::NotEqual => lhs != rhs,
            CmpOp::Less => lhs < rhs,
            CmpOp::Greater => lhs > rhs,
        }
    }
}

/// What a compare looks at. For a key that does not exist, revisions and
/// version are 0 and a value compare is false (etcd semantics).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum CompareTarget {
    /// The value.
    Value(Bytes),
    /// The create revision.
    CreateRevision(Revision),
    /// The last modification revision.
    ModRevision(Revision),
    /// The version.
    Version(i64),
}

/// One condition of a transaction.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Compare {
    /// The key compared.
    pub key: Bytes,
    /// The operator.
    pub op: CmpOp,
    /// The field and the value it is compared with.
    pub target: CompareTarget,
}

/// One operation of a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Read the keys of a range as of the transaction's revision.
    Range(KeyRange),
    /// Write a value, optionally attached to a lease.
    Put {
        /// The key.
        key: Bytes,
        /// The value.
        value: Bytes,
        /// Lease to attach the key to, 0 for none.
        lease: LeaseId,
    },
    /// Delete every key of a range.
    Delete(KeyRange),
}

/// A transaction: if every compare holds, `success` runs, else `failure`.
/// All operations of one transaction commit at one revision (if any of them
/// writes), atomically.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Txn {
    /// Conditions, all of which must hold.
    pub compares: Vec<Compare>,
    /// Operations run when every compare holds.
    pub success: Vec<Op>,
    /// Operations run otherwise.
    pub failure: Vec<Op>,
}

impl Txn {
    /// Puts `value` at `key` only if `key` does not exist (its create
    /// revision is 0); otherwise runs `failure` (e.g. a read of `key`).
    pub fn create(key: bytes::Bytes, value: bytes::Bytes, failure: Vec<Op>) -> Txn {
        Txn {
            compares: vec![Compare {
                key: key.clone(),
                op: CmpOp::Equal,
                target: CompareTarget::CreateRevision(0),
            }],
            success: vec![Op::Put {
                key,
                value,
                lease: 0,
            }],
            failure,
        }
    }
}

/// Result of one operation of a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpResult {
    /// Keys read, in key order.
    Range(Vec<KeyValue>),
    /// The previous value, if the key existed.
    Put(Option<KeyValue>),
    /// The keys deleted, in key order.
    Delete(Vec<KeyValue>),
}

/// Result of a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnResponse {
    /// Whether the compares held (and `success` ran).
    pub succeeded: bool,
    /// The store revision after the transaction.
    pub revision: Revision,
    /// One result per operation that ran.
    pub results: Vec<OpResult>,
}

/// Kind of a watch event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// The key was created or modified.
    Put,
    /// The key was deleted.
    Delete,
}

/// One change of one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Put or delete.
    pub kind: EventKind,
    /// For a put: the new key-value. For a delete: the key, an empty value,
    /// and `mod_revision` set to the deletion's revision (other fields 0).
    pub kv: KeyValue,
    /// The key-value before this change, if it existed.
    pub prev_kv: Option<KeyValue>,
}

/// Errors of the store model.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreError {
    /// The requested revision has been compacted away. A watch must not be
    /// retried at the same revision: re-read a snapshot instead.
    Compacted {
        /// The oldest revision still available is `compact_revision + 1`.
        compact_revision: Revision,
    },
    /// A revision in the future was requested.
    FutureRevision {
        /// The requested revision.
        requested: Revision,
        /// The store's current revision.
        current: Revision,
    },
    /// The lease does not exist (never granted, revoked or expired).
    LeaseNotFound(LeaseId),
    /// A lease with this ID already exists.
    LeaseExists(LeaseId),
    /// The store cannot be reached or failed (runtime stores only).
    Unavailable(String),
    /// The store refused the request as invalid without applying any of
    /// it (etcd, e.g., refuses more operations in one transaction than its
    /// `--max-txn-ops`); sent again unchanged it fails again.
    Refused(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Compacted { compact_revision } => {
                write!(
                    f,
                    "required revision has been compacted (compacted up to {compact_revision})"
                )
            }
            StoreError::FutureRevision { requested, current } => {
                write!(
                    f,
                    "revision {requested} is in the future (current revision is {current})"
                )
            }
            StoreError::LeaseNotFound(id) => write!(f, "lease {id:x} not found"),
            StoreError::LeaseExists(id) => write!(f, "lease {id:x} already exists"),
            StoreError::Unavailable(why) => write!(f, "store unavailable: {why}"),
            StoreError::Refused(why) => write!(f, "store refused the request: {why}"),
        }
    }
}

impl std::error::Error for StoreError {}
