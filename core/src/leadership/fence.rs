//! The fence every leader write carries: the election key must still
//! exist with the create revision this instance won at.
//!
//! An election key is attached to its holder's lease, so it disappears
//! when the lease ends (revoked, or expired while the holder was paused or
//! partitioned); a new campaign creates a key at a later revision. As long
//! as the key exists with the won revision, it is the oldest key under the
//! election prefix, so its holder is the leader. A write guarded by
//! [`Fence::guard`] therefore commits only while its author leads, however
//! late it reaches the store.

use bytes::Bytes;

use crate::store::{
    CmpOp, Compare, CompareTarget, KeyRange, Op, OpResult, Revision, Txn, TxnResponse,
};

/// An election key as the store reports it: the key and the revision at
/// which it was created. For a leader, `create_revision` is the revision it
/// won at (the fence); for a follower, the observed leader's.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ElectionKey {
    /// The key (under the election prefix).
    pub key: Bytes,
    /// The revision at which the key was created.
    pub create_revision: Revision,
}

impl ElectionKey {
    /// The compare "this key exists with this create revision", which
    /// fails once the key is deleted or created again.
    pub fn unchanged(&self) -> Compare {
        Compare {
            key: self.key.clone(),
            op: CmpOp::Equal,
            target: CompareTarget::CreateRevision(self.create_revision),
        }
    }
}

/// The condition a leader's write must carry, from
/// [`Leadership::write_fence`](super::Leadership::write_fence).
///
/// Over an elected store it is the compare "the election key's create
/// revision equals the won revision"; with the embedded store (one
/// instance, always leader) there is nothing to compare and the fence is
/// empty. Only the machine makes fences.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    key: Option<ElectionKey>,
}

/// What a fenced transaction's response says about the fence
/// ([`Fence::check`]).
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceCheck {
    /// The fence held: `succeeded` reflects the transaction's own
    /// compares.
    Held,
    /// The fence failed: nothing of the success branch committed. Report
    /// it with [`Leadership::handle_fence_failed`](super::Leadership::handle_fence_failed)
    /// and end the request with "lost leadership".
    Lost,
}

impl Fence {
    /// The fence of a leader holding `key` (the machine hands these out
    /// through `write_fence`; election ports build them for their own
    /// writes, e.g. resigning).
    pub fn election(key: ElectionKey) -> Fence {
        Fence { key: Some(key) }
    }

    /// The empty fence of the only instance over the embedded store.
    pub(super) fn unfenced() -> Fence {
        Fence { key: None }
    }

    /// The election key and won revision this fence checks; `None` for
    /// the embedded store.
    pub fn key(&self) -> Option<&ElectionKey> {
        self.key.as_ref()
    }

    /// The compare to add to a write transaction; `None` for the embedded
    /// store.
    pub fn compare(&self) -> Option<Compare> {
        self.key.as_ref().map(ElectionKey::unchanged)
    }

    /// `txn` fenced: the fence's compare is added to its compares, and a
    /// read of the election key is appended to its failure branch so that
    /// [`Fence::check`] can tell a failed fence from a failed compare of
    /// the transaction's own. Results of the transaction's own operations
    /// keep their positions. The embedded store's fence returns `txn` as is.
    pub fn guard(&self, mut txn: Txn) -> Txn {
        if let Some(k) = &self.key {
            txn.compares.push(k.unchanged());
            txn.failure.push(Op::Range(KeyRange::Key(k.key.clone())));
        }
        txn
    }

    /// Whether the fence held for the response of a transaction made by
    /// [`Fence::guard`]. A response that does not end with the read of the
    /// election key (a store that did not run the failure branch as asked)
    /// counts as [`FenceCheck::Lost`]: stepping down needlessly is safe,
    /// writing on is not.
    pub fn check(&self, response: &TxnResponse) -> FenceCheck {
        let Some(k) = &self.key else {
            return FenceCheck::Held;
        };
        if response.succeeded {
            return FenceCheck::Held;
        }
        match response.results.last() {
            Some(OpResult::Range(kvs))
                if kvs
                    .iter()
                    .any(|kv| kv.key == k.key && kv.create_revision == k.create_revision) =>
            {
                FenceCheck::Held
            }
            _ => FenceCheck::Lost,
        }
    }
}
