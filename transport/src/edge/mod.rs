//! The daemon's network edge: what any peer can make a listener hold, and
//! for how long. Written once for both runtimes: the accept loop
//! ([`accept_until`]), its failure policy ([`accept::AcceptErrors`]), the
//! connection limit ([`slots::Slots`]), and the limits each listener is
//! given ([`EdgeLimits`], set by the daemon's flags in [`flags`]). The
//! per-connection limits (streams, header list, idle timeout, HTTP/2
//! keepalive) are applied by [`serve_connection`](crate::grpc::serve_connection).
//!
//! Time comes from a [`SharedTimer`] (hyper's timer trait, which every
//! runtime crate implements), so nothing here names a runtime.

pub mod accept;
pub mod flags;
pub mod slots;

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, Either};

use crate::shutdown::{Shutdown, TaskTracker};
use accept::AcceptErrors;
use slots::Slots;

/// A runtime's timer, shared (hyper's trait: the HTTP/2 keepalive uses it
/// as well).
pub type SharedTimer = Arc<dyn hyper::rt::Timer + Send + Sync>;

/// [`SharedTimer`] as a value hyper's builders take.
#[derive(Clone)]
pub struct TimerHandle(pub SharedTimer);

impl hyper::rt::Timer for TimerHandle {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.0.sleep(duration)
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.0.sleep_until(deadline)
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>, new_deadline: Instant) {
        self.0.reset(sleep, new_deadline)
    }

    fn now(&self) -> Instant {
        self.0.now()
    }
}

/// Limits of one listener and of each connection on it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct EdgeLimits {
    /// Connections open at once; the listener stops accepting at the limit.
    pub max_connections: usize,
    /// HTTP/2 streams (calls) open at once on one connection.
    pub max_concurrent_streams: u32,
    /// Largest HTTP/2 header list accepted.
    pub max_header_list_size: u32,
    /// Time a TLS handshake may take.
    pub handshake_timeout: Duration,
    /// A connection with no open call for this long is closed (GOAWAY).
    /// Also bounds a connection that never sends the HTTP/2 preface.
    pub idle_timeout: Option<Duration>,
    /// Idle time after which the kernel probes a TCP peer (TCP keepalive,
    /// [`set_tcp_keepalive`](crate::socket::set_tcp_keepalive)); None: off.
    pub tcp_keepalive: Option<Duration>,
    /// Interval of HTTP/2 PINGs on a connection that received nothing
    /// meanwhile; None: no HTTP/2 keepalive.
    pub keepalive_interval: Option<Duration>,
    /// A PING not answered within this time closes the connection.
    pub keepalive_timeout: Duration,
}

impl Default for EdgeLimits {
    fn default() -> Self {
        EdgeLimits {
            max_connections: flags::DEFAULT_MAX_CONNECTIONS,
            max_concurrent_streams: flags::DEFAULT_MAX_CONCURRENT_STREAMS,
            max_header_list_size: 64 * 1024,
            handshake_timeout: Duration::from_secs(flags::DEFAULT_HANDSHAKE_TIMEOUT_SECS),
            idle_timeout: Some(Duration::from_secs(flags::DEFAULT_IDLE_TIMEOUT_SECS)),
            tcp_keepalive: Some(Duration::from_secs(flags::DEFAULT_TCP_KEEPALIVE_SECS)),
            keepalive_interval: flags::seconds(flags::DEFAULT_KEEPALIVE_INTERVAL_SECS),
            keepalive_timeout: Duration::from_secs(flags::DEFAULT_KEEPALIVE_TIMEOUT_SECS),
        }
    }
}

/// A connection's task, as [`accept_until`] runs it.
pub type ConnectionTask = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Accepts connections with `accept` until `shutdown` fires, at most
/// `limits.max_connections` open at once, running `handle` for each on a
/// task of its own (`spawn`). A failed accept pauses the loop as
/// [`AcceptErrors`] says (open connections are served meanwhile) and is
/// logged at a bounded rate. Returns the tracker of the connections' tasks
/// (wait on it to let them finish their calls). `what` names the listener
/// in logs.
pub async fn accept_until<S, P, F>(
    what: &str,
    mut accept: impl FnMut() -> F,
    limits: &EdgeLimits,
    timer: &SharedTimer,
    spawn: impl Fn(BoxFuture<'static, ()>),
    shutdown: &Shutdown,
    handle: impl Fn(S, P) -> ConnectionTask,
) -> TaskTracker
where
    F: Future<Output = io::Result<(S, P)>>,
{
    let connections = TaskTracker::new();
    let slots = Slots::new(limits.max_connections);
    let mut errors = AcceptErrors::new();
    let accept_loop = async {
        loop {
            let slot = slots.acquire().await;
            match accept().await {
                Ok((stream, peer)) => {
                    errors.succeeded();
                    let token = connections.token();
                    let connection = handle(stream, peer);
                    spawn(Box::pin(async move {
                        let _held = (slot, token);
                        connection.await;
                    }));
                }
                Err(e) => {
                    drop(slot);
                    let after = errors.failed(&e, Instant::now());
                    match after.warn {
                        Some(0) => tracing::warn!(error = %e, "accept on {what} failed"),
                        Some(n) => tracing::warn!(
                            error = %e,
                            "accept on {what} failed ({n} more failures since the last warning)"
                        ),
                        None => {}
                    }
                    if !after.pause.is_zero() {
                        timer.sleep(after.pause).await;
                    }
                }
            }
        }
    };
    {
        let accept_loop = std::pin::pin!(accept_loop);
        let stop = std::pin::pin!(shutdown.clone().wait());
        let _ = futures::future::select(accept_loop, stop).await;
    }
    connections
}

/// `future`, or None when `timeout` passes first.
pub async fn with_timeout<T>(
    timer: &SharedTimer,
    timeout: Duration,
    future: impl Future<Output = T>,
) -> Option<T> {
    let future = std::pin::pin!(future);
    match futures::future::select(future, timer.sleep(timeout)).await {
        Either::Left((out, _)) => Some(out),
        Either::Right(((), _)) => None,
    }
}
