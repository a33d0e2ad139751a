// The crate's documentation is `port.md` beside this file, rendered only
// with the `client` feature: its links name items that exist only then.
#![cfg_attr(feature = "client", doc = include_str!("port.md"))]
#![cfg_attr(
    not(feature = "client"),
    doc = "The etcd port of the Metropolis control plane (a `KvStore` over etcd v3, \
           leases, elections). Built without its `client` feature, so empty: \
           `--features client` (etcd-client's build script runs protoc) builds its \
           items and their documentation."
)]
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
