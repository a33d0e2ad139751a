//! Ports: what the service layer needs from the outside world, as small
//! traits that each runtime (tokio, smol, the simulator) implements.
//!
//! Futures and streams here are plain `futures` types: the service layer
//! never names an async runtime.

use std::pin::Pin;

use futures::future::BoxFuture;
use futures::stream::BoxStream;

use crate::store::{Event, KeyRange, KeyValue, Revision, StoreError, Txn, TxnResponse};

/// A batch of watch events, in revision order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchBatch {
    /// The events; all events of one revision are in the same batch.
    pub events: Vec<Event>,
    /// The store revision when the batch was produced (at least the
    /// revision of the last event).
    pub revision: Revision,
}

/// A key-value store with etcd semantics: the embedded store or etcd.
pub trait KvStore: Send + Sync + 'static {
    /// Runs a transaction. Resolves once the result is durable.
    fn txn(&self, txn: Txn) -> BoxFuture<'static, Result<TxnResponse, StoreError>>;

    /// Reads `range` without waiting for writes still in flight to become
    /// durable. Only for preparing a compare-and-swap: the write's compares
    /// must check what this returned, and the write is acknowledged only
    /// once durable (which, in a log, makes everything before it durable).
    /// The default is a durable read.
    fn read_for_update(
        &self,
        range: KeyRange,
    ) -> BoxFuture<'static, Result<Vec<KeyValue>, StoreError>> {
        use futures::FutureExt;
        let txn = Txn {
            success: vec![crate::store::Op::Range(range)],
            ..Default::default()
        };
        self.txn(txn)
            .map(|r| match r?.results.pop() {
                Some(crate::store::OpResult::Range(kvs)) => Ok(kvs),
                _ => Err(StoreError::Unavailable(
                    "store returned no range result".into(),
                )),
            })
            .boxed()
    }

    /// Streams every change of `range` from `start_revision` (inclusive)
    /// on, in revision order. Ends with `Err(StoreError::Compacted)` when
    /// the revision has been (or gets) compacted before delivery, and with
    /// `Err(StoreError::Unavailable)` when the store fails.
    fn watch(
        &self,
        range: KeyRange,
        start_revision: Revision,
    ) -> BoxStream<'static, Result<WatchBatch, StoreError>>;
}

/// Runs background tasks of the service layer (the shared watch cache).
pub trait Spawner: Send + Sync + 'static {
    /// Runs `task` to completion in the background.
    fn spawn(&self, task: Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>>);
}

/// A certificate issued by the cluster CA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssuedCertificate {
    /// The certificate, PEM.
    pub certificate_pem: String,
    /// The cluster CA certificate, PEM.
    pub ca_pem: String,
}

/// Issues node certificates from the cluster CA.
pub trait CertIssuer: Send + Sync + 'static {
    /// Issues a node certificate for the Ed25519 `public_key`.
    fn issue_node_certificate(&self, public_key: &[u8; 32]) -> Result<IssuedCertificate, String>;
}

/// Wall-clock time, for what operators read as dates (last heartbeat).
/// Machines never read it: services pass its readings in.
pub trait WallClock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_unix_ms(&self) -> i64;
}
