//! Ports: what the service layer needs from the outside world, as small
//! traits that each runtime (tokio, smol, the simulator) implements.
//!
//! Futures and streams here are plain `futures` types: the service layer
//! never names an async runtime.

use std::pin::Pin;

use futures::future::BoxFuture;
use futures::stream::BoxStream;

use std::time::Duration;

use crate::store::{Event, KeyRange, KeyValue, LeaseId, Revision, StoreError, Txn, TxnResponse};
use crate::time::Instant;

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

    /// Whether the store applies this process's writes in the order they
    /// are submitted, before they are durable, and serves
    /// [`read_for_update`](Self::read_for_update) from what it applied
    /// (the embedded store: one writer, an in-memory model, a group
    /// commit): then concurrent compare-and-swap updates of one key are
    /// best sent at once, each reading what the previous one applied, and
    /// share one durable commit. False (the default) for a remote store,
    /// where they would race each other over the network: the services
    /// queue them per key instead (`service::cas`).
    fn applies_in_order(&self) -> bool {
        false
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

/// The monotonic clock of the runtime (or the simulator's virtual time),
/// read by the service layer to feed the machines their [`Instant`]s.
///
/// [`Instant`]: crate::time::Instant
pub trait MonotonicClock: Send + Sync + 'static {
    /// Now, on the machines' timeline. Never goes back.
    fn now(&self) -> crate::time::Instant;
}

/// A store that backs itself up (the embedded store): what the
/// Maintenance service's `Snapshot` streams.
pub trait StoreBackup: Send + Sync + 'static {
    /// A backup at the latest revision, returned once every change it
    /// holds is durable: the bytes of a snapshot file the store's restore
    /// reads, and the revision.
    fn backup(&self) -> BoxFuture<'static, Result<(Vec<u8>, Revision), StoreError>>;
}

/// Timers on the [`MonotonicClock`]'s timeline (the runtime's, or the
/// simulator's virtual time).
pub trait Timer: Send + Sync + 'static {
    /// Resolves at `deadline` or later; at once if it has passed.
    fn sleep_until(&self, deadline: Instant) -> BoxFuture<'static, ()>;
}

/// A lease the store granted ([`Leases::grant`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrantedLease {
    /// The lease.
    pub id: LeaseId,
    /// The TTL the store granted.
    pub ttl: Duration,
    /// When the grant request was sent, on the [`MonotonicClock`]'s
    /// timeline: the lease lives at most until `sent_at + ttl`.
    pub sent_at: Instant,
}

/// One renewal of a lease kept alive ([`Leases::keep_alive`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseRenewal {
    /// The TTL the store answered with.
    pub ttl: Duration,
    /// When the renewal request was sent: the lease lives at most until
    /// `sent_at + ttl`.
    pub sent_at: Instant,
}

/// The store's leases (etcd's): what an election campaigns with. A key
/// attached to a lease is deleted when the lease ends.
pub trait Leases: Send + Sync + 'static {
    /// Grants a lease of `ttl`.
    fn grant(&self, ttl: Duration) -> BoxFuture<'static, Result<GrantedLease, StoreError>>;

    /// Keeps `lease` alive: renews it about every third of its TTL and
    /// streams each renewal. Ends with an error once the lease is gone
    /// (`LeaseNotFound`) or cannot be renewed in time; dropping the
    /// stream stops renewing.
    fn keep_alive(
        &self,
        lease: &GrantedLease,
    ) -> BoxStream<'static, Result<LeaseRenewal, StoreError>>;

    /// Revokes `lease`, deleting its keys at once.
    fn revoke(&self, lease: LeaseId) -> BoxFuture<'static, Result<(), StoreError>>;
}

/// A certificate issued by the cluster CA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssuedCertificate {
    /// The certificate, PEM.
    pub certificate_pem: String,
    /// The cluster CA certificate, PEM.
    pub ca_pem: String,
}

/// Why the cluster CA did not issue a node certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CertIssueError {
    /// Building, signing or encoding the certificate failed; the reason
    /// is the issuer's, for an operator.
    Signing(String),
}

impl std::fmt::Display for CertIssueError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CertIssueError::Signing(why) => write!(f, "issuing the node certificate failed: {why}"),
        }
    }
}

impl std::error::Error for CertIssueError {}

/// Issues node certificates from the cluster CA.
pub trait CertIssuer: Send + Sync + 'static {
    /// Issues a node certificate for the Ed25519 `public_key`.
    fn issue_node_certificate(
        &self,
        public_key: &[u8; 32],
    ) -> Result<IssuedCertificate, CertIssueError>;
}

/// Wall-clock time, for what operators read as dates (last heartbeat).
/// Machines never read it: services pass its readings in.
pub trait WallClock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_unix_ms(&self) -> i64;
}

/// A kubeconfig issued by [`KubeconfigIssuer`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssuedKubeconfig {
    /// The kubeconfig, YAML.
    pub kubeconfig: String,
    /// When its client certificate expires, seconds since the Unix epoch.
    pub not_after_unix: i64,
    /// Whether the signing CA was generated by this node rather than
    /// configured (the cluster's real API server will not trust it).
    pub generated_ca: bool,
}

/// Why a kubeconfig could not be issued.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KubeconfigError {
    /// No Kubernetes CA is configured; the message says how to configure
    /// one.
    NotConfigured(String),
    /// The request cannot be honoured as asked; the message says why.
    Invalid(String),
    /// Signing or encoding failed; the message says why.
    Failed(String),
}

impl std::fmt::Display for KubeconfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KubeconfigError::NotConfigured(m)
            | KubeconfigError::Invalid(m)
            | KubeconfigError::Failed(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for KubeconfigError {}

/// Issues debug kubeconfigs: a client certificate for a Kubernetes
/// identity signed by the Kubernetes CA. Requests reach it validated
/// (non-empty id and groups without control characters).
pub trait KubeconfigIssuer: Send + Sync + 'static {
    /// Issues a kubeconfig for user `id` in `groups` (CN=id, O=each group).
    fn issue_kubeconfig(
        &self,
        id: &str,
        groups: &[String],
    ) -> Result<IssuedKubeconfig, KubeconfigError>;
}

/// A condition an instance needs to serve (a store that has not failed, a
/// known leader), for the health service (`metropolis_service::health`).
pub trait Readiness: Send + Sync + 'static {
    /// `None` while the condition holds; otherwise why the instance cannot
    /// serve.
    fn unready(&self) -> Option<String>;

    /// Keeps `waker` and wakes it, every time, after
    /// [`unready`](Self::unready) may have changed. Called once per
    /// monitor the condition joins.
    fn subscribe(&self, waker: std::task::Waker);
}
