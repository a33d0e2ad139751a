//! Leases: grant, keep-alive (a task renewing every third of the TTL),
//! revoke, time-to-live.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::Stream;
use futures::StreamExt;
use futures::stream::BoxStream;
use metropolis_core::store::{LeaseId, LeaseInfo, StoreError};
use tokio::sync::watch;

use super::Inner;
use super::convert::describe;

/// A lease etcd granted ([`EtcdStore::lease_grant`](super::EtcdStore::lease_grant)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrantedLease {
    /// The lease.
    pub id: LeaseId,
    /// The TTL etcd granted: what was asked, or etcd's minimum if that is
    /// longer (etcd raises short TTLs to 1.5 election timeouts, rounded up
    /// to whole seconds: 2 s with its default timing).
    pub ttl: Duration,
    /// When the grant request was sent (on the host's monotonic clock).
    /// The lease lives at most until `sent_at + ttl` unless renewed.
    pub sent_at: Instant,
}

/// One renewal of a lease by [`LeaseKeepAlive`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseRenewal {
    /// The lease.
    pub id: LeaseId,
    /// The TTL etcd renewed it for.
    pub ttl: Duration,
    /// When the keep-alive request was sent: the lease counts as alive
    /// until `sent_at + ttl`, never longer than etcd keeps it.
    pub sent_at: Instant,
}

/// What the keep-alive task last reported.
#[derive(Clone, Debug)]
enum KeepAliveState {
    Starting,
    Renewed(LeaseRenewal),
    Ended(StoreError),
}

/// Keeps a lease alive: a task on the client's runtime sends a keep-alive
/// every third of the lease's TTL, over one gRPC stream, reopened when it
/// breaks.
///
/// As a [`Stream`], it yields each renewal (only the latest one, if the
/// reader is slower than the renewals: renewing never waits for the
/// reader), then at most one error, then ends:
/// - [`StoreError::LeaseNotFound`]: etcd no longer has the lease (it
///   expired, or was revoked);
/// - [`StoreError::Unavailable`]: etcd could not be reached before the
///   lease's last known deadline passed, so it must be taken as expired.
///
/// Dropping it stops the renewals (the lease then expires after its TTL;
/// revoke it to end it at once).
pub struct LeaseKeepAlive {
    id: LeaseId,
    stream: BoxStream<'static, Result<LeaseRenewal, StoreError>>,
    task: tokio::task::AbortHandle,
    /// Keeps a dedicated runtime running while the lease is kept alive.
    _runtime: super::exec::Exec,
}

impl LeaseKeepAlive {
    /// The lease kept alive.
    pub fn id(&self) -> LeaseId {
        self.id
    }
}

impl std::fmt::Debug for LeaseKeepAlive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseKeepAlive")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Stream for LeaseKeepAlive {
    type Item = Result<LeaseRenewal, StoreError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().stream.poll_next_unpin(cx)
    }
}

impl Drop for LeaseKeepAlive {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A TTL in whole seconds as etcd takes it: at least 1, rounded up.
pub(super) fn ttl_secs(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

/// A TTL etcd reported, in seconds (negative: none).
fn ttl_duration(secs: i64) -> Duration {
    Duration::from_secs(u64::try_from(secs).unwrap_or(0))
}

pub(super) async fn grant(inner: Arc<Inner>, ttl: Duration) -> Result<GrantedLease, StoreError> {
    let what = format!("grant a lease of {ttl:?}");
    let mut client = inner.lease.clone();
    let sent_at = Instant::now();
    let resp = inner
        .timed(&what, None, client.grant(ttl_secs(ttl), None))
        .await?
        .0;
    if !resp.error.is_empty() {
        return Err(inner.endpoints.unavailable(&what, resp.error));
    }
    if resp.ttl <= 0 {
        return Err(inner
            .endpoints
            .unavailable(&what, format_args!("etcd granted a TTL of {}", resp.ttl)));
    }
    Ok(GrantedLease {
        id: resp.id,
        ttl: ttl_duration(resp.ttl),
        sent_at,
    })
}

pub(super) async fn revoke(inner: Arc<Inner>, id: LeaseId) -> Result<i64, StoreError> {
    let what = format!("revoke lease {id:x}");
    let mut client = inner.lease.clone();
    let resp = inner.timed(&what, Some(id), client.revoke(id)).await?.0;
    super::convert::header_revision(resp.header.as_ref())
        .map_err(|e| inner.endpoints.unavailable(&what, e))
}

pub(super) async fn time_to_live(inner: Arc<Inner>, id: LeaseId) -> Result<LeaseInfo, StoreError> {
    let what = format!("read the time to live of lease {id:x}");
    let mut client = inner.lease.clone();
    let options = etcd_client::LeaseTimeToLiveOptions::new().with_keys();
    let resp = inner
        .timed(&what, Some(id), client.time_to_live(id, Some(options)))
        .await?
        .0;
    // etcd answers -1 for a lease it does not have.
    if resp.ttl < 0 {
        return Err(StoreError::LeaseNotFound(id));
    }
    let mut keys: Vec<bytes::Bytes> = resp.keys.into_iter().map(bytes::Bytes::from).collect();
    keys.sort();
    Ok(LeaseInfo {
        id,
        ttl: ttl_duration(resp.granted_ttl),
        remaining: ttl_duration(resp.ttl),
        keys,
    })
}

/// Starts keeping `lease` alive.
pub(super) fn keep_alive(
    inner: Arc<Inner>,
    exec: &super::exec::Exec,
    lease: &GrantedLease,
) -> LeaseKeepAlive {
    let id = lease.id;
    let deadline = lease.sent_at + lease.ttl;
    let (tx, rx) = watch::channel(KeepAliveState::Starting);
    let task = exec.spawn(async move {
        let renew = renew(inner, id, deadline, &tx);
        tokio::select! {
            () = renew => {}
            () = tx.closed() => {}
        }
    });
    let stream = futures::stream::unfold((rx, false), |(mut rx, ended)| async move {
        if ended {
            return None;
        }
        loop {
            rx.changed().await.ok()?;
            let state = rx.borrow_and_update().clone();
            match state {
                KeepAliveState::Starting => continue,
                KeepAliveState::Renewed(r) => return Some((Ok(r), (rx, false))),
                KeepAliveState::Ended(e) => return Some((Err(e), (rx, true))),
            }
        }
    })
    .boxed();
    LeaseKeepAlive {
        id,
        stream,
        task,
        _runtime: exec.clone(),
    }
}

/// Pause between attempts to reopen a broken keep-alive stream.
const RETRY_PAUSE: Duration = Duration::from_millis(250);

/// The keep-alive loop: renews every third of the TTL; reopens the stream
/// after errors until the lease's last known deadline has passed.
async fn renew(
    inner: Arc<Inner>,
    id: LeaseId,
    mut deadline: Instant,
    tx: &watch::Sender<KeepAliveState>,
) {
    let what = format!("keep lease {id:x} alive");
    loop {
        let why = match renew_stream(&inner, id, tx, &mut deadline).await {
            Ok(()) => return,
            Err(RenewError::Ended(e)) => {
                tx.send_replace(KeepAliveState::Ended(e));
                return;
            }
            Err(RenewError::Retry(why)) => why,
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            tx.send_replace(KeepAliveState::Ended(inner.endpoints.unavailable(
                &what,
                format_args!("the lease's TTL ran out before etcd answered: {why}"),
            )));
            return;
        }
        tracing::warn!(
            "etcd at {}: {what}: {why}; retrying for another {left:?}",
            inner.endpoints.0
        );
        tokio::time::sleep(left.min(RETRY_PAUSE)).await;
    }
}

enum RenewError {
    /// The lease is gone: report and stop.
    Ended(StoreError),
    /// The stream broke: reopen it if the lease may still be alive.
    Retry(String),
}

/// Renews over one keep-alive stream until it breaks. Every renewal moves
/// `deadline`; no wait for etcd lasts past it (nor past the request
/// timeout).
async fn renew_stream(
    inner: &Inner,
    id: LeaseId,
    tx: &watch::Sender<KeepAliveState>,
    deadline: &mut Instant,
) -> Result<(), RenewError> {
    let limit = |deadline: Instant| {
        deadline
            .saturating_duration_since(Instant::now())
            .min(inner.config.request_timeout)
    };
    let no_answer = |wait: Duration| RenewError::Retry(format!("no answer within {wait:?}"));
    let mut client = inner.lease.clone();
    // Opening sends the first keep-alive and reads its answer, but the
    // client keeps the TTL to itself: the loop sends another one at once.
    let wait = limit(*deadline);
    let (mut keeper, mut stream) = match tokio::time::timeout(wait, client.keep_alive(id)).await {
        Err(_) => return Err(no_answer(wait)),
        Ok(Err(etcd_client::Error::LeaseKeepAliveError(why))) if why.contains("not found") => {
            return Err(RenewError::Ended(StoreError::LeaseNotFound(id)));
        }
        Ok(Err(e)) => return Err(RenewError::Retry(describe(&e))),
        Ok(Ok(pair)) => pair,
    };
    loop {
        let sent_at = Instant::now();
        if let Err(e) = keeper.keep_alive().await {
            return Err(RenewError::Retry(describe(&e)));
        }
        let wait = limit(*deadline);
        let resp = match tokio::time::timeout(wait, stream.message()).await {
            Err(_) => return Err(no_answer(wait)),
            Ok(Err(e)) => return Err(RenewError::Retry(describe(&e))),
            Ok(Ok(None)) => {
                return Err(RenewError::Retry(
                    "etcd closed the keep-alive stream".into(),
                ));
            }
            Ok(Ok(Some(resp))) => resp.0,
        };
        if resp.ttl <= 0 {
            return Err(RenewError::Ended(StoreError::LeaseNotFound(id)));
        }
        let ttl = ttl_duration(resp.ttl);
        *deadline = sent_at + ttl;
        if tx
            .send(KeepAliveState::Renewed(LeaseRenewal { id, ttl, sent_at }))
            .is_err()
        {
            return Ok(());
        }
        tokio::time::sleep(ttl / 3).await;
    }
}
