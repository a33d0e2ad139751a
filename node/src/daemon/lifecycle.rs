//! A built node while it serves and as it stops: the messages that say
//! where it serves, the store failure that ends it
//! ([`NodeServices::fatal`], [`fatal_error`]), and the steps of a
//! shutdown (resign, end the streams, close the store).

use std::net::SocketAddr;
use std::sync::Arc;

use metropolis_service::Readiness;

use super::config::is_loopback;
use super::{DaemonError, NodeServices, RuntimeKind};

/// The error a daemon stops with after [`NodeServices::fatal`] resolved
/// with `why`.
pub fn fatal_error(why: &str) -> DaemonError {
    format!(
        "stopped serving: the embedded store failed: {why}. Every acknowledged \
         write is on disk; fix the cause (free space on the data directory's \
         file system, or check the disk) and start metropolisd again"
    )
    .into()
}

impl NodeServices {
    /// Stops this instance's election, if it is elected: a leader resigns
    /// (its successor takes over at once) and calls in flight end with
    /// "curator shutting down". Call first on shutdown.
    pub async fn resign(&self) {
        let stop = self
            .election
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(stop) = stop {
            stop.await;
        }
    }
    /// Logs the loud warning that goes with an enabled debug service,
    /// louder when `debug_addr` is not loopback.
    pub fn log_debug_serving(&self, debug_addr: SocketAddr) {
        if is_loopback(debug_addr) {
            tracing::warn!(
                debug_listen = %debug_addr,
                "NodeDebugService is ENABLED and UNAUTHENTICATED: anyone who can connect to \
                 {debug_addr} can read this node's logs, trace its kernel, load container \
                 images and mint Kubernetes credentials; never expose it beyond a trusted \
                 network"
            );
        } else {
            tracing::warn!(
                debug_listen = %debug_addr,
                "NodeDebugService is ENABLED, UNAUTHENTICATED and REACHABLE FROM THE NETWORK \
                 (--debug-listen-non-loopback): anyone who can reach {debug_addr} over the \
                 network can read this node's logs, trace its kernel, load container images \
                 and mint Kubernetes credentials; firewall it to trusted hosts"
            );
        }
    }

    /// Logs where the node serves, once its listeners are bound.
    pub fn log_serving(&self, runtime: RuntimeKind, tls_addr: SocketAddr, agent_addr: SocketAddr) {
        tracing::info!(
            %runtime,
            agent_listen = %agent_addr,
            node = %self.node_id,
            socket = %self.socket.display(),
            listen = %tls_addr,
            owner_credential = %self.owner_dir.display(),
            "curator serving"
        );
    }

    /// Resolves with the cause once this instance can no longer serve at
    /// all: its embedded store failed (a write or sync of the WAL failed,
    /// e.g. ENOSPC or EIO), after which it would refuse every change for
    /// good. The runtimes then stop serving and exit non-zero, so that a
    /// supervisor restarts the daemon: the restart recovers every
    /// acknowledged write from the WAL, which a failed store in a running
    /// process never retries (after a failed sync the page cache is not to
    /// be trusted). Never resolves for an elected instance: a lost etcd
    /// loses the lease and the instance campaigns again.
    pub fn fatal(&self) -> futures::future::BoxFuture<'static, String> {
        let Some(store) = &self.store else {
            return Box::pin(futures::future::pending());
        };
        let health = store.health();
        let mut subscribed = false;
        Box::pin(futures::future::poll_fn(move |cx| {
            if !subscribed {
                // Woken at every failure or close from now on.
                health.subscribe(cx.waker().clone());
                subscribed = true;
            }
            match health.failure() {
                Some(why) => std::task::Poll::Ready(why),
                None => std::task::Poll::Pending,
            }
        }))
    }

    /// Ends every open Watch stream with Unavailable ("curator backend
    /// switched, request can be retried"), the debug service's running
    /// traces and followed logs, and the health Watch and reflection
    /// streams (health says NOT_SERVING from then on); call first on
    /// shutdown.
    pub fn end_streams(&self) {
        self.health.shut_down();
        self.cache.close_all(tonic::Status::unavailable(
            "curator backend switched, request can be retried",
        ));
        if let Some(debug) = &self.debug {
            // Running traces restore tracefs now, on every runtime.
            debug.close_streams();
        }
    }

    /// Closes the store once no task holds it any more. Acknowledged writes
    /// are already on disk; this only stops the writer thread early.
    pub fn close(self) {
        let NodeServices {
            store,
            cache,
            router,
            ..
        } = self;
        drop((cache, router));
        if let Some(store) = store
            && let Ok(store) = Arc::try_unwrap(store)
            && let Err(e) = store.close()
        {
            tracing::error!(error = %e, "closing the store failed");
        }
    }
}
