//! [`FencedStore`]: the store as an elected instance's services see it.

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::BoxStream;

use super::{Finished, SharedLeadership};
use metropolis_core::leadership::{FenceCheck, LeadershipError};
use metropolis_core::ports::{KvStore, WatchBatch};
use metropolis_core::store::{KeyRange, KeyValue, Revision, StoreError, Txn, TxnResponse};

/// A [`KvStore`] whose every transaction carries the fence of the current
/// leadership ([`Fence::guard`](metropolis_core::leadership::Fence::guard)): it
/// commits only while this instance's election key still exists with the
/// revision it won at, so a deposed leader (paused past its lease, cut off
/// from the store) writes nothing.
///
/// Each transaction is a request of the [`Leadership`](metropolis_core::leadership::Leadership)
/// machine of its own: refused at once unless the instance leads
/// (Unavailable, "curator backend switched"), and when the store reports
/// the fence failed the machine steps down (the transaction ends with
/// "lost leadership", every call in flight is cancelled). Transactions the
/// fence let through answer exactly as the inner store's, the fence's own
/// read removed.
///
/// Reads for an update and watches pass through unfenced: they change
/// nothing, and the update they prepare is fenced itself.
#[derive(Clone)]
pub struct FencedStore {
    inner: Arc<dyn KvStore>,
    leadership: SharedLeadership,
}

impl FencedStore {
    /// Fences every write to `inner` with `leadership`.
    pub fn new(inner: Arc<dyn KvStore>, leadership: SharedLeadership) -> FencedStore {
        FencedStore { inner, leadership }
    }
}

fn refused(e: LeadershipError) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

impl KvStore for FencedStore {
    fn txn(&self, txn: Txn) -> BoxFuture<'static, Result<TxnResponse, StoreError>> {
        let shared = self.leadership.inner.clone();
        let (id, fence) = shared.apply(|state, now| {
            // A deadline of now: a write never waits for a leader.
            let id = state.machine.handle_request(now, Some(now));
            let fence = state.machine.write_fence(now, id);
            (id, fence)
        });
        let finished = Finished { inner: shared, id };
        let fence = match fence {
            Ok(fence) => fence,
            Err(e) => {
                drop(finished);
                return Box::pin(futures::future::ready(Err(refused(e))));
            }
        };
        let guarded = if crate::canary_planted!(DropFence) {
            txn
        } else {
            fence.guard(txn)
        };
        let sent = self.inner.txn(guarded);
        Box::pin(async move {
            let mut response = sent.await?;
            match fence.check(&response) {
                FenceCheck::Held => {
                    if !response.succeeded && fence.key().is_some() {
                        // The fence's read of the election key, appended
                        // to the failure branch.
                        response.results.pop();
                    }
                    drop(finished);
                    Ok(response)
                }
                FenceCheck::Lost => {
                    tracing::warn!(
                        "a write was refused: this instance's election key is gone or newer; \
                         stepping down"
                    );
                    finished
                        .inner
                        .input(|machine, now| machine.handle_fence_failed(now, id));
                    drop(finished);
                    Err(refused(LeadershipError::LostLeadership))
                }
            }
        })
    }

    fn read_for_update(
        &self,
        range: KeyRange,
    ) -> BoxFuture<'static, Result<Vec<KeyValue>, StoreError>> {
        self.inner.read_for_update(range)
    }

    fn applies_in_order(&self) -> bool {
        self.inner.applies_in_order()
    }

    fn watch(
        &self,
        range: KeyRange,
        start_revision: Revision,
    ) -> BoxStream<'static, Result<WatchBatch, StoreError>> {
        self.inner.watch(range, start_revision)
    }
}
