//! Read-modify-write of one key by compare-and-swap, the way every record
//! update of the services is done: correct across instances, no
//! process-local lock.

use bytes::Bytes;
use tonic::Status;

use super::curator::store_status;
use crate::ports::KvStore;
use crate::store::{CmpOp, Compare, CompareTarget, KeyRange, KeyValue, Op, OpResult, Txn};

/// How often an update retries after losing a compare-and-swap race before
/// giving up with Aborted.
pub(crate) const MAX_CAS_ATTEMPTS: usize = 256;

/// Reads `key`, computes its new value with `change`, and writes it with a
/// compare-and-swap on the key's modification revision. On a conflict the
/// failed transaction reads the current value, and `change` runs again on
/// it. `what` names the record in errors ("node X"), formatted only for an
/// error; a missing key is NotFound.
pub(crate) async fn update<T>(
    store: &dyn KvStore,
    key: Bytes,
    what: impl Fn() -> String,
    mut change: impl FnMut(&KeyValue) -> Result<(Bytes, T), Status>,
) -> Result<T, Status> {
    let mut current = store
        .read_for_update(KeyRange::Key(key.clone()))
        .await
        .map_err(store_status)?
        .pop();
    for _ in 0..MAX_CAS_ATTEMPTS {
        let Some(kv) = current else {
            return Err(Status::not_found(format!("{} not found", what())));
        };
        let (value, out) = change(&kv)?;
        let txn = Txn {
            compares: vec![Compare {
                key: key.clone(),
                op: CmpOp::Equal,
                target: CompareTarget::ModRevision(kv.mod_revision),
            }],
            success: vec![Op::Put {
                key: key.clone(),
                value,
                lease: 0,
            }],
            failure: vec![Op::Range(KeyRange::Key(key.clone()))],
        };
        let mut response = store.txn(txn).await.map_err(store_status)?;
        if response.succeeded {
            return Ok(out);
        }
        current = match response.results.pop() {
            Some(OpResult::Range(mut kvs)) => kvs.pop(),
            _ => return Err(Status::internal("store returned no range result")),
        };
    }
    Err(Status::aborted(format!(
        "{}: {MAX_CAS_ATTEMPTS} concurrent modifications in a row; request can be retried",
        what()
    )))
}
