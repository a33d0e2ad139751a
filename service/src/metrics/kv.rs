//! Requests to the key-value store, timed at the [`KvStore`] port: the
//! same families over etcd and over the embedded store, labelled with the
//! backend (`metropolis_kv_request_duration_seconds{backend,op}`,
//! `metropolis_kv_request_errors_total{backend,op,error}`). Over etcd
//! that is the latency of one etcd round trip as this process sees it;
//! over the embedded store, of a durable commit (or an in-memory read).

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::{Metrics, latency_buckets};
use metropolis_core::ports::{KvStore, WatchBatch};
use metropolis_core::store::{KeyRange, KeyValue, Op, Revision, StoreError, Txn, TxnResponse};

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    backend: &'static str,
    op: &'static str,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    backend: &'static str,
    op: &'static str,
    error: &'static str,
}

/// The store request families.
#[derive(Clone, Debug)]
pub(crate) struct KvMetrics {
    duration: Family<OpLabels, Histogram>,
    errors: Family<ErrorLabels, Counter>,
}

impl Default for KvMetrics {
    fn default() -> Self {
        KvMetrics {
            duration: Family::new_with_constructor(|| Histogram::new(latency_buckets())),
            errors: Family::default(),
        }
    }
}

impl KvMetrics {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "metropolis_kv_request_duration_seconds",
            "Store requests by backend (etcd, embedded) and op: read (ranges only), write (a transaction that writes), read_for_update; until the answer (a write: once durable)",
            self.duration.clone(),
        );
        registry.register(
            "metropolis_kv_request_errors",
            "Store requests that failed, by backend, op and error: unavailable, refused, compacted, future_revision, lease_not_found, lease_exists",
            self.errors.clone(),
        );
    }
}

/// The `error` label of a store error.
pub(super) fn error_name(e: &StoreError) -> &'static str {
    match e {
        StoreError::Compacted { .. } => "compacted",
        StoreError::FutureRevision { .. } => "future_revision",
        StoreError::LeaseNotFound(_) => "lease_not_found",
        StoreError::LeaseExists(_) => "lease_exists",
        StoreError::Unavailable(_) => "unavailable",
        StoreError::Refused(_) => "refused",
        // A kind added to the store later, until it gets its own label.
        _ => "other",
    }
}

/// The `op` label of a transaction.
fn txn_op(txn: &Txn) -> &'static str {
    let reads_only = txn
        .success
        .iter()
        .chain(&txn.failure)
        .all(|op| matches!(op, Op::Range(_)));
    if reads_only { "read" } else { "write" }
}

/// A [`KvStore`] that times every request it passes to the one inside.
pub struct MeteredKv {
    inner: Arc<dyn KvStore>,
    backend: &'static str,
    metrics: Metrics,
}

impl MeteredKv {
    /// Passes every request to `inner`, timing it under the `backend`
    /// label (`"etcd"`, `"embedded"`).
    pub fn new(inner: Arc<dyn KvStore>, backend: &'static str, metrics: Metrics) -> MeteredKv {
        MeteredKv {
            inner,
            backend,
            metrics,
        }
    }

    /// Times `request` as `op`.
    fn timed<T: Send + 'static>(
        &self,
        op: &'static str,
        request: BoxFuture<'static, Result<T, StoreError>>,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        let (metrics, backend) = (self.metrics.clone(), self.backend);
        let started = metrics.now();
        request
            .map(move |result| {
                let took = metrics.now().saturating_duration_since(started);
                let kv = &metrics.kv;
                kv.duration
                    .get_or_create(&OpLabels { backend, op })
                    .observe(took.as_secs_f64());
                if let Err(e) = &result {
                    let error = error_name(e);
                    kv.errors
                        .get_or_create(&ErrorLabels { backend, op, error })
                        .inc();
                }
                result
            })
            .boxed()
    }
}

impl KvStore for MeteredKv {
    fn txn(&self, txn: Txn) -> BoxFuture<'static, Result<TxnResponse, StoreError>> {
        let op = txn_op(&txn);
        self.timed(op, self.inner.txn(txn))
    }

    fn read_for_update(
        &self,
        range: KeyRange,
    ) -> BoxFuture<'static, Result<Vec<KeyValue>, StoreError>> {
        self.timed("read_for_update", self.inner.read_for_update(range))
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
