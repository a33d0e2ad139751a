//! The etcd port: [`KvStore`] over an etcd v3 cluster, leases, and the
//! election helpers of the leadership machine.
//!
//! Built on `etcd-client` 0.21 (tonic 0.14 and prost 0.14, the workspace's
//! own: one tonic in the tree). Its build script runs `protoc`, so
//! everything here sits behind this crate's `client` feature, off by
//! default: without it the crate is empty and a workspace build needs no
//! `protoc`. `metropolisd`'s `etcd` feature turns it on.
//!
//! # The store: [`EtcdStore`]
//!
//! | core | etcd |
//! | --- | --- |
//! | [`Txn`] `compares` / `success` / `failure` | `Txn` `compare` / `success` / `failure`, one round trip |
//! | `Compare` on value, create/mod revision, version | the same targets and operators; a missing key has revisions and version 0 and fails a value compare, in both |
//! | `Op::Range(Key/Prefix)` | a range of the key, or `[prefix, prefix+1)` (an empty prefix: every key), in key order, unlimited |
//! | `Op::Put { lease }` | a put with `lease` and `prev_kv`: the result carries the previous value |
//! | `Op::Delete(Key/Prefix)` | a delete range with `prev_kv`: the result lists the deleted keys in key order |
//! | `TxnResponse.revision` | the response header's revision (the store's revision after the transaction) |
//! | `StoreError::LeaseNotFound` | "requested lease not found" |
//! | [`KvStore::read_for_update`] | a linearizable range (a plain read: the compare-and-swap that follows checks it) |
//! | [`KvStore::watch`] | a watch with `prev_kv` and `fragment`, from the revision before `start_revision` (see below) |
//! | `StoreError::Compacted { compact_revision }` | a watch canceled with `compact_revision` |
//! | `StoreError::Unavailable` | every other failure: the message names the endpoints and the operation |
//!
//! The conformance test (`tests/tests/etcd_store.rs`) runs the same
//! transactions against the embedded store and etcd and compares every
//! response, revisions included: a fresh etcd starts at revision 1 and
//! counts writing transactions exactly as the store model does.
//!
//! ## Watches
//!
//! A watch is one etcd watch, read by a task on the client's runtime into
//! a bounded channel (16 batches: a slow reader holds etcd back through
//! gRPC flow control instead of growing a buffer). It is never restarted
//! behind the reader's back; it ends with:
//! - `Compacted { compact_revision }` when etcd cancels it for compaction
//!   (at the start, or later when the watch fell behind);
//! - `Unavailable` when the connection is lost, etcd cancels it for
//!   another reason (e.g. "no leader": the client sets `require_leader`,
//!   so a member cut off from its quorum ends its watches instead of
//!   keeping them silently), or a response breaks the guarantees below.
//!   The message names the endpoints, the range and the revision to
//!   resume from.
//!
//! What is checked before events are handed over: revisions never go
//! down, each batch starts past the previous one's last revision (a
//! revision is never split between batches, nothing is repeated), every
//! event is of `start_revision` or later and inside the watched range, and
//! the fragments of a large response are joined first. The range of a
//! watch and its continuity across revisions that did not touch it cannot
//! be checked from the client: etcd's guarantee that a watch misses
//! nothing is what is relied on, and nothing is dropped here.
//!
//! etcd 3.4.23 (Debian's) accepts a watch from exactly its compaction
//! revision `C` although compaction may have removed the tombstones of
//! revision `C` (etcd-io/etcd#18089, fixed upstream in 2024). The core
//! contract says the first revision available after a compaction at `C`
//! is `C + 1`, so a watch from `start` is opened at `start - 1` and etcd
//! refuses it exactly when `start <= C`; the events of revision
//! `start - 1` are dropped. The same etcd bug can still drop a tombstone
//! of revision `C` from a watch that was lagging exactly at `C` when the
//! compaction ran; only an etcd with the fix closes that.
//!
//! ## Leases and the election
//!
//! [`EtcdStore::lease_grant`], [`EtcdStore::lease_keep_alive`] (a task
//! renewing every third of the TTL, reporting each renewal with the time
//! it was sent), [`EtcdStore::lease_revoke`]. [`Election`] (core's, over
//! this store) is etcd's `concurrency` recipe: campaign, observe, resign,
//! and the fence ([`fence`], [`Election::fenced_txn`]) that makes a
//! leader's write commit only while its key exists with the revision it
//! won at. Core's election driver runs over [`election_ports`]. The election
//! value is the encoded `LeaderElectionValue` (node ID, TTL, curator
//! address), as `metropolis_core::leadership::LeadershipConfig::election_value`
//! makes it.
//!
//! ## Runtimes: reachable from smol
//!
//! Every operation runs as a task on a tokio runtime and hands its result
//! back through a `tokio::sync` channel, which needs no runtime to be
//! awaited. [`EtcdStore::connect`] uses the caller's tokio runtime;
//! [`EtcdStore::connect_dedicated`] starts a runtime of its own (one worker
//! thread, `etcd-client`) and can be awaited from smol or any executor:
//! that is how the smol daemon uses etcd (`metropolisd --runtime smol`
//! dispatches from this crate, so it can build the store and pass it on as
//! an `Arc<dyn KvStore>`). The cost: one thread (about 2 MiB of reserved
//! stack, idle between requests), and per request one task spawn and one
//! wake-up across threads (microseconds, against an etcd round trip of a
//! millisecond or more with its fsync). `async-compat` would spare the
//! thread but still needs a tokio runtime somewhere to drive hyper's
//! sockets and timers; it would run one lazily in the background anyway.
//!
//! ## Security: TLS and etcd's authentication
//!
//! [`EtcdConfig::tls`] turns on TLS (tonic's rustls over ring, the
//! workspace's one TLS stack): etcd's server certificate must chain to
//! the configured CA and name the endpoint's host; the client certificate,
//! if any, answers etcd's `--client-cert-auth`. Only the given CA is
//! trusted. [`EtcdConfig::user`] authenticates with etcd's
//! `Authenticate` while connecting; every request then carries the token
//! etcd gave, on one connection shared by the store, the leases, the
//! watches and the election.
//!
//! etcd's tokens expire (a simple token after `--auth-token-ttl` of
//! disuse, 300 s by default, and at every restart of the member that
//! issued it; a JWT at its expiry). A unary call refused for an invalid
//! token authenticates again and is made once more (etcd-client's
//! automatic refresh; the refused call did nothing, so repeating it is
//! safe). A watch cannot rely on that: etcd accepts the watch call and
//! cancels the watch's creation, "invalid auth token" in the reason, so a
//! watch canceled so authenticates again and is opened once more before
//! the cancellation counts. Open watches and lease keep-alive streams are
//! not checked again by etcd once open.
//!
//! A refusal (TLS handshake, wrong user or password, no user where
//! authentication is on, a missing permission) is told apart from etcd
//! being unreachable, so that the daemon fails at once instead of retrying
//! (see `start.rs`).
//!
//! ## Limits (etcd 3.4)
//!
//! - A branch of a transaction may not put the same key twice, nor put a
//!   key it also deletes ("duplicate key given in txn request"); the store
//!   model allows both. Such a transaction fails with `Unavailable`.
//! - At most 128 operations per branch (`--max-txn-ops`) and 1.5 MiB per
//!   request (`--max-request-bytes`); empty keys are refused.
//! - Lease IDs are chosen by etcd, not sequential; TTLs are whole seconds,
//!   raised to etcd's minimum; a new etcd leader extends every lease by
//!   its TTL. "Lease not found" from a transaction names the first leased
//!   put's lease (etcd does not say which).
//! - `prev_kv` of a watch event may be missing if etcd compacted it.
//! - Responses of up to [`EtcdConfig::max_response_bytes`] are accepted
//!   (tonic's 4 MiB default is too small for a range over thousands of
//!   nodes).

#![cfg(feature = "client")]

mod convert;
mod driver;
mod election;
mod exec;
mod lease;
mod start;
mod watch;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use etcd_client as ec;
use futures::FutureExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use metropolis_core::ports::{KvStore, WatchBatch};
use metropolis_core::store::{
    KeyRange, KeyValue, LeaseId, LeaseInfo, Revision, StoreError, Txn, TxnResponse,
};

pub use driver::{ElectionDriver, election_ports};
pub use election::{Election, FencedResponse, Leader, Observation, fence, fence_check};
pub use lease::{GrantedLease, LeaseKeepAlive, LeaseRenewal};
pub use metropolis_node::etcd_access::{EtcdAccess, EtcdClientCert, EtcdTls, EtcdUser};
pub use start::etcd_election;

use convert::{Endpoints, Refusal};
use exec::Exec;

/// How to reach etcd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdConfig {
    /// Client URLs of the members (`http://host:port`; a bare `host:port`
    /// is taken as `http://`). Requests are balanced over them.
    pub endpoints: Vec<String>,
    /// Longest wait for connecting and for the answer to any request
    /// (default 5 s). A watch or keep-alive waits for its first answer this
    /// long, and afterwards for as long as it runs.
    pub request_timeout: Duration,
    /// Interval of HTTP/2 pings that detect a dead connection even while
    /// every stream is idle (default 10 s; etcd refuses pings more often
    /// than every 5 s by default).
    pub keep_alive_interval: Duration,
    /// How long a ping may go unanswered before the connection is taken
    /// as lost, ending its watches with `Unavailable` (default 5 s).
    pub keep_alive_timeout: Duration,
    /// Largest response accepted, in bytes (default 256 MiB).
    pub max_response_bytes: usize,
    /// How long a watch whose connection broke (a member restarted, the
    /// network blinked) keeps trying to resume from where it was before it
    /// ends with `Unavailable` (default 10 s). Resuming delivers exactly
    /// the changes it missed, or `Compacted` if they are gone.
    pub watch_resume: Duration,
    /// TLS (every endpoint `https://`): the CA trusted for etcd's server
    /// certificates, and the client certificate for an etcd with
    /// `--client-cert-auth`. `None`: plain HTTP.
    pub tls: Option<EtcdTls>,
    /// The etcd user to authenticate as (see "Security" in the module
    /// documentation). `None`: no user (or, with a client certificate and
    /// etcd's authentication on, the certificate's common name).
    pub user: Option<EtcdUser>,
}

impl EtcdConfig {
    /// A configuration for `endpoints` with the default timeouts.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> EtcdConfig {
        EtcdConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            request_timeout: Duration::from_secs(5),
            keep_alive_interval: Duration::from_secs(10),
            keep_alive_timeout: Duration::from_secs(5),
            max_response_bytes: 256 << 20,
            watch_resume: Duration::from_secs(10),
            tls: None,
            user: None,
        }
    }

    /// This configuration with the TLS and user of `access`.
    pub fn with_access(mut self, access: EtcdAccess) -> EtcdConfig {
        self.tls = access.tls;
        self.user = access.user;
        self
    }
}

/// What the operations share: the client, its per-service clients with
/// the response size limit, the endpoints for messages, the config.
pub(crate) struct Inner {
    /// For authenticating again ([`Inner::refresh_token`]); the
    /// per-service clients share its token.
    client: ec::Client,
    kv: ec::KvClient,
    watch: ec::WatchClient,
    lease: ec::LeaseClient,
    endpoints: Endpoints,
    config: EtcdConfig,
}

impl Inner {
    /// Awaits an etcd call of operation `what` for at most the request
    /// timeout, mapping its error (`lease`: see [`Endpoints::error`]).
    async fn timed<T>(
        &self,
        what: &str,
        lease: Option<LeaseId>,
        call: impl Future<Output = Result<T, ec::Error>>,
    ) -> Result<T, StoreError> {
        let timeout = self.config.request_timeout;
        match tokio::time::timeout(timeout, call).await {
            Err(_) => Err(self.endpoints.timed_out(what, timeout)),
            Ok(Err(e)) => Err(self.endpoints.error(what, lease, &e)),
            Ok(Ok(v)) => Ok(v),
        }
    }

    /// [`timed`](Self::timed), with a call that never reached etcd (the
    /// connection to the member the client picked was refused: a member is
    /// down) made again, so that it lands on another member, while the
    /// request timeout allows. A write that may have reached etcd is never
    /// repeated; a `read` is also repeated after any Unavailable answer
    /// (e.g. "leader changed" while etcd elects a new leader).
    async fn timed_retrying<T, F, Fut>(
        &self,
        what: &str,
        lease: Option<LeaseId>,
        read: bool,
        mut call: F,
    ) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, ec::Error>>,
    {
        let timeout = self.config.request_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut pause = Duration::from_millis(10);
        loop {
            match tokio::time::timeout_at(deadline, call()).await {
                Err(_) => return Err(self.endpoints.timed_out(what, timeout)),
                Ok(Err(e))
                    if (convert::never_sent(&e) || (read && convert::unavailable(&e)))
                        && tokio::time::Instant::now() + pause < deadline =>
                {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                Ok(Err(e)) => return Err(self.endpoints.error(what, lease, &e)),
                Ok(Ok(v)) => return Ok(v),
            }
        }
    }

    /// Authenticates again (with [`EtcdConfig::user`]), replacing the
    /// token every request of this client carries. The unary calls do so
    /// themselves when etcd says the token is invalid (etcd-client's
    /// automatic refresh); a watch's creation does not fail the call (see
    /// `RawWatch::open`).
    async fn refresh_token(&self, what: &str) -> Result<(), StoreError> {
        let client = self.client.clone();
        self.timed(what, None, async move { client.refresh_token().await })
            .await
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse, StoreError> {
        let what = "transaction";
        let request = convert::txn(&txn);
        let resp = self
            .timed_retrying(what, convert::txn_lease(&txn), txn_is_read(&txn), || {
                let mut kv = self.kv.clone();
                let request = request.clone();
                async move { kv.txn(request).await }
            })
            .await?;
        convert::txn_response(&txn, resp).map_err(|e| self.endpoints.unavailable(what, e))
    }

    /// The keys of `range` and the revision they were read at.
    async fn range(&self, range: KeyRange) -> Result<(Vec<KeyValue>, Revision), StoreError> {
        let what = format!("read {}", convert::describe_range(&range));
        let (key, options) = convert::get_options(&range);
        let resp = self
            .timed_retrying(&what, None, true, || {
                let mut kv = self.kv.clone();
                let (key, options) = (key.clone(), options.clone());
                async move { kv.get(key, options).await }
            })
            .await?
            .0;
        if resp.more {
            return Err(self.endpoints.unavailable(&what, "the range was cut short"));
        }
        let revision = convert::header_revision(resp.header.as_ref())
            .map_err(|e| self.endpoints.unavailable(&what, e))?;
        Ok((resp.kvs.into_iter().map(convert::kv).collect(), revision))
    }
}

/// Whether `txn` only reads (every branch only ranges): safe to repeat.
fn txn_is_read(txn: &Txn) -> bool {
    txn.success
        .iter()
        .chain(&txn.failure)
        .all(|op| matches!(op, metropolis_core::store::Op::Range(_)))
}

/// A [`KvStore`] over etcd, with leases and elections (see the [module
/// documentation](self) for the mapping and its limits).
///
/// Cheap to clone: clones share the connection. Every future and stream it
/// returns can be awaited on any executor; dropping one cancels its
/// request or watch.
#[derive(Clone)]
pub struct EtcdStore {
    inner: Arc<Inner>,
    exec: Exec,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.inner.endpoints.0)
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// Connects on the caller's tokio runtime (fails with `Unavailable`
    /// outside one). Succeeds once the user (if any) authenticated and a
    /// member answered a status request within the request timeout, so a
    /// wrong or dead endpoint, a failed TLS handshake or wrong
    /// credentials are an error here, naming the endpoints.
    pub async fn connect(config: EtcdConfig) -> Result<EtcdStore, StoreError> {
        EtcdStore::connect_on(Exec::current()?, config)
            .await
            .map_err(|f| f.error)
    }

    /// Connects with a tokio runtime of its own (one worker thread), for
    /// programs on smol or another executor: the returned future, and
    /// everything the store returns, can be awaited anywhere. The runtime
    /// stops when the store and everything it returned are dropped.
    pub fn connect_dedicated(
        config: EtcdConfig,
    ) -> BoxFuture<'static, Result<EtcdStore, StoreError>> {
        let exec = match Exec::dedicated() {
            Ok(exec) => exec,
            Err(e) => return futures::future::ready(Err(e)).boxed(),
        };
        EtcdStore::connect_on(exec, config)
            .map(|r| r.map_err(|f| f.error))
            .boxed()
    }

    /// Connects with the client on `exec`, telling a refusal (see
    /// [`ConnectFailure`]) from other failures.
    fn connect_on(
        exec: Exec,
        config: EtcdConfig,
    ) -> BoxFuture<'static, Result<EtcdStore, ConnectFailure>> {
        // The outer result only says whether the runtime answered.
        let connecting = exec.run(async move { Ok(connect(config).await) });
        async move {
            let inner = connecting.await.map_err(ConnectFailure::other)??;
            Ok(EtcdStore {
                inner: Arc::new(inner),
                exec,
            })
        }
        .boxed()
    }

    /// Checks that this client may read and write every key under each of
    /// `prefixes` (without writing anything): one transaction per prefix
    /// whose success branch, never taken, puts the prefix, and whose
    /// failure branch counts its keys. etcd checks the permissions of both
    /// branches, so a user without readwrite on a prefix, or no user
    /// where etcd's authentication is on, is refused here.
    fn check_access(
        &self,
        prefixes: Vec<bytes::Bytes>,
    ) -> BoxFuture<'static, Result<(), ConnectFailure>> {
        let inner = self.inner.clone();
        let checking = self
            .exec
            .run(async move { Ok(check_access(&inner, prefixes).await) });
        async move { checking.await.map_err(ConnectFailure::other)? }.boxed()
    }

    /// The endpoints, comma-separated (as error messages name them).
    pub fn endpoints(&self) -> &str {
        &self.inner.endpoints.0
    }

    /// Runs a transaction (as [`KvStore::txn`]).
    pub fn run_txn(&self, txn: Txn) -> BoxFuture<'static, Result<TxnResponse, StoreError>> {
        let inner = self.inner.clone();
        self.exec.run(async move { inner.txn(txn).await })
    }

    /// Reads `range` (linearizable); resolves with the keys in key order
    /// and the revision they were read at.
    pub fn range(
        &self,
        range: KeyRange,
    ) -> BoxFuture<'static, Result<(Vec<KeyValue>, Revision), StoreError>> {
        let inner = self.inner.clone();
        self.exec.run(async move { inner.range(range).await })
    }

    /// The store's current revision.
    pub fn revision(&self) -> BoxFuture<'static, Result<Revision, StoreError>> {
        let inner = self.inner.clone();
        self.exec.run(async move {
            let what = "read the current revision";
            let mut kv = inner.kv.clone();
            // A count-only range of one key: the header is what matters.
            let options = ec::GetOptions::new().with_count_only();
            let resp = inner
                .timed(what, None, kv.get(vec![0u8], Some(options)))
                .await?
                .0;
            convert::header_revision(resp.header.as_ref())
                .map_err(|e| inner.endpoints.unavailable(what, e))
        })
    }

    /// Compacts etcd's history up to `revision` and waits until the
    /// compaction is applied (`physical`). Watches that had not received
    /// revisions up to `revision` end with `Compacted`, as do watches
    /// started at `revision` or below. Fails with `Compacted` if history
    /// was already compacted at or past it, and `FutureRevision` past the
    /// current revision.
    pub fn compact(&self, revision: Revision) -> BoxFuture<'static, Result<(), StoreError>> {
        let inner = self.inner.clone();
        self.exec.run(async move {
            let what = format!("compact up to revision {revision}");
            let mut kv = inner.kv.clone();
            let options = ec::CompactionOptions::new().with_physical();
            let timeout = inner.config.request_timeout;
            match tokio::time::timeout(timeout, kv.compact(revision, Some(options))).await {
                Err(_) => Err(inner.endpoints.timed_out(&what, timeout)),
                Ok(Ok(_)) => Ok(()),
                Ok(Err(ec::Error::GRpcStatus(s))) if s.message().contains("has been compacted") => {
                    Err(StoreError::Compacted {
                        compact_revision: revision,
                    })
                }
                Ok(Err(ec::Error::GRpcStatus(s))) if s.message().contains("future revision") => {
                    let mut kv = inner.kv.clone();
                    let options = ec::GetOptions::new().with_count_only();
                    let current = inner
                        .timed(&what, None, kv.get(vec![0u8], Some(options)))
                        .await?
                        .0;
                    Err(StoreError::FutureRevision {
                        requested: revision,
                        current: convert::header_revision(current.header.as_ref())
                            .map_err(|e| inner.endpoints.unavailable(&what, e))?,
                    })
                }
                Ok(Err(e)) => Err(inner.endpoints.error(&what, None, &e)),
            }
        })
    }

    /// Streams the changes of `range` from `start_revision` on (as
    /// [`KvStore::watch`]; see the module documentation).
    pub fn watch_range(
        &self,
        range: KeyRange,
        start_revision: Revision,
    ) -> BoxStream<'static, Result<WatchBatch, StoreError>> {
        watch::spawn(self.inner.clone(), &self.exec, range, start_revision)
    }

    /// Grants a lease of `ttl` (rounded up to whole seconds; etcd may raise
    /// it to its minimum, see [`GrantedLease::ttl`]).
    pub fn lease_grant(
        &self,
        ttl: Duration,
    ) -> BoxFuture<'static, Result<GrantedLease, StoreError>> {
        let inner = self.inner.clone();
        self.exec.run(lease::grant(inner, ttl))
    }

    /// Keeps `lease` alive until the returned handle is dropped; the
    /// handle streams the renewals (see [`LeaseKeepAlive`]).
    pub fn lease_keep_alive(&self, lease: &GrantedLease) -> LeaseKeepAlive {
        lease::keep_alive(self.inner.clone(), &self.exec, lease)
    }

    /// Revokes a lease, deleting its keys; resolves with the revision
    /// after the revocation. `LeaseNotFound` if it is gone already.
    pub fn lease_revoke(&self, id: LeaseId) -> BoxFuture<'static, Result<Revision, StoreError>> {
        let inner = self.inner.clone();
        self.exec.run(lease::revoke(inner, id))
    }

    /// What etcd knows of a lease: granted TTL, time left, attached keys
    /// (in key order). `LeaseNotFound` if it is gone.
    pub fn lease_time_to_live(
        &self,
        id: LeaseId,
    ) -> BoxFuture<'static, Result<LeaseInfo, StoreError>> {
        let inner = self.inner.clone();
        self.exec.run(lease::time_to_live(inner, id))
    }

    /// The election under `prefix` (see [`Election::new`]).
    pub fn election(&self, prefix: impl Into<bytes::Bytes>) -> Election {
        Election::new(Arc::new(self.clone()), prefix)
    }
}

/// A failed connection attempt ([`EtcdStore::connect_on`],
/// [`EtcdStore::check_access`]): the error, and whether etcd refused this
/// client, which trying again does not cure.
#[derive(Debug)]
struct ConnectFailure {
    /// What failed, naming the endpoints.
    error: StoreError,
    /// Why etcd refused this client, if it did.
    refused: Option<Refusal>,
    /// Whether etcd closed the connection after it was made (see
    /// [`convert::closed_by_peer`]).
    closed: bool,
}

impl ConnectFailure {
    /// A failure that is no refusal.
    fn other(error: StoreError) -> ConnectFailure {
        ConnectFailure {
            error,
            refused: None,
            closed: false,
        }
    }

    fn timed_out(endpoints: &Endpoints, what: &str, timeout: Duration) -> ConnectFailure {
        ConnectFailure::other(endpoints.timed_out(what, timeout))
    }

    fn of(endpoints: &Endpoints, what: &str, e: &ec::Error) -> ConnectFailure {
        ConnectFailure {
            error: endpoints.error(what, None, e),
            refused: convert::refusal(e),
            closed: convert::closed_by_peer(e),
        }
    }
}

/// The connect options of `config`: timeouts, keep-alive, leader
/// required, and its TLS and user. With a user, etcd-client
/// authenticates while connecting, and again whenever a unary call is
/// refused for an invalid or expired token (the call is then made once
/// more, with the new token).
fn connect_options(config: &EtcdConfig) -> ec::ConnectOptions {
    let mut options = ec::ConnectOptions::new()
        .with_connect_timeout(config.request_timeout)
        .with_keep_alive(config.keep_alive_interval, config.keep_alive_timeout)
        .with_keep_alive_while_idle(true)
        .with_require_leader(true);
    if let Some(tls) = &config.tls {
        let mut t = ec::TlsOptions::new().ca_certificate(ec::Certificate::from_pem(&tls.ca_pem));
        if let Some(client) = &tls.client {
            t = t.identity(ec::Identity::from_pem(&client.cert_pem, &client.key_pem));
        }
        options = options.with_tls(t);
    }
    if let Some(user) = &config.user {
        options = options
            .with_user(user.name.clone(), user.password.clone())
            .with_auto_token_refresh(true);
    }
    options
}

/// Connects to `config.endpoints` (authenticating, with a user) and checks
/// that a member answers.
async fn connect(config: EtcdConfig) -> Result<Inner, ConnectFailure> {
    let endpoints = Endpoints(Arc::from(config.endpoints.join(",")));
    if config.endpoints.is_empty() {
        return Err(ConnectFailure::other(StoreError::Unavailable(
            "no etcd endpoint given".into(),
        )));
    }
    let options = connect_options(&config);
    let timeout = config.request_timeout;
    let what = "connect";
    let client = match tokio::time::timeout(
        timeout,
        ec::Client::connect(&config.endpoints, Some(options)),
    )
    .await
    {
        Err(_) => return Err(ConnectFailure::timed_out(&endpoints, what, timeout)),
        Ok(Err(e)) => return Err(ConnectFailure::of(&endpoints, what, &e)),
        Ok(Ok(client)) => client,
    };
    // The client connects lazily: ask a member for its status so that an
    // unreachable cluster fails here, by name.
    let mut maintenance = client.maintenance_client();
    let status = match tokio::time::timeout(timeout, maintenance.status()).await {
        Err(_) => return Err(ConnectFailure::timed_out(&endpoints, what, timeout)),
        Ok(Err(e)) => return Err(ConnectFailure::of(&endpoints, what, &e)),
        Ok(Ok(status)) => status.0,
    };
    tracing::info!(
        "connected to etcd {} at {} (revision {})",
        status.version,
        endpoints.0,
        status.header.as_ref().map_or(0, |h| h.revision)
    );
    let limit = config.max_response_bytes;
    Ok(Inner {
        kv: client.kv_client().max_decoding_message_size(limit),
        watch: client.watch_client().max_decoding_message_size(limit),
        lease: client.lease_client(),
        client,
        endpoints,
        config,
    })
}

/// See [`EtcdStore::check_access`].
async fn check_access(inner: &Inner, prefixes: Vec<bytes::Bytes>) -> Result<(), ConnectFailure> {
    for prefix in prefixes {
        let what = format!(
            "check read and write access to prefix \"{}\"",
            prefix.escape_ascii()
        );
        let key = prefix.to_vec();
        let txn = ec::Txn::new()
            .when([ec::Compare::create_revision(
                key.clone(),
                ec::CompareOp::Less,
                0,
            )])
            .and_then([ec::TxnOp::put(key.clone(), Vec::new(), None)])
            .or_else([ec::TxnOp::get(
                key,
                Some(ec::GetOptions::new().with_prefix().with_count_only()),
            )]);
        let mut kv = inner.kv.clone();
        let timeout = inner.config.request_timeout;
        match tokio::time::timeout(timeout, kv.txn(txn)).await {
            Err(_) => return Err(ConnectFailure::timed_out(&inner.endpoints, &what, timeout)),
            Ok(Err(e)) => return Err(ConnectFailure::of(&inner.endpoints, &what, &e)),
            Ok(Ok(resp)) if resp.0.succeeded => {
                // A create revision below 0 cannot be: etcd broke the
                // compare, and may have written the prefix key.
                return Err(ConnectFailure::other(
                    inner
                        .endpoints
                        .unavailable(&what, "etcd took a branch that cannot be taken"),
                ));
            }
            Ok(Ok(_)) => {}
        }
    }
    Ok(())
}

impl KvStore for EtcdStore {
    fn txn(&self, txn: Txn) -> BoxFuture<'static, Result<TxnResponse, StoreError>> {
        self.run_txn(txn)
    }

    fn read_for_update(
        &self,
        range: KeyRange,
    ) -> BoxFuture<'static, Result<Vec<KeyValue>, StoreError>> {
        self.range(range).map(|r| r.map(|(kvs, _)| kvs)).boxed()
    }

    fn watch(
        &self,
        range: KeyRange,
        start_revision: Revision,
    ) -> BoxStream<'static, Result<WatchBatch, StoreError>> {
        self.watch_range(range, start_revision)
    }
}
