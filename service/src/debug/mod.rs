//! `NodeDebugService`: the node's logs, kernel tracing, image loading and
//! debug kubeconfigs, over [ports](metropolis_core::ports).
//!
//! The service is unauthenticated by contract (the proto carries no
//! `authorization` option): runtimes serve it only when explicitly enabled,
//! on its own listener, loopback by default.

mod closer;
mod images;
mod kubeconfig;
mod logs;
mod trace_stream;

use std::sync::Arc;
use std::time::Duration;

use metropolis_proto::prelude::debug;
use metropolis_proto::prelude::debug::node_debug_service_server::{
    NodeDebugService, NodeDebugServiceServer,
};
use tonic::{Request, Response, Status, Streaming};

use crate::images::ImageStore;
use metropolis_archive::ArchiveLimits;
use metropolis_core::ports::{KubeconfigIssuer, MonotonicClock, Timer};
use metropolis_core::trace::{Target, TraceBuffers, TraceError, Tracefs};

pub use closer::{Closable, Closer};
pub use images::ImagesService;
pub use kubeconfig::{MAX_GROUPS, MAX_NAME_LEN, SYSTEM_MASTERS};
pub use logs::{LogHub, LogStream, MAX_ENTRIES_PER_RESPONSE, MAX_RESPONSE_BYTES};
pub use trace_stream::{TraceStream, run_session};

/// How many taken instance names one Trace call skips before it gives up
/// (FailedPrecondition, naming the last).
pub const INSTANCE_NAMES_TRIED: usize = 8;

/// How long a Trace call waits, by default, for the session holding its
/// buffer to end ([`TraceWait`]).
pub const TRACE_WAIT: Duration = Duration::from_secs(2);

/// How a Trace call on a buffer another session holds waits for that
/// session to end before failing with FailedPrecondition ("a trace is
/// already in progress"). A client that cancels a session and starts the
/// next at once (`metroctl trace`, Ctrl-C, again) reaches the server
/// before the server has seen the cancel and run the old session's
/// teardown; waiting for the buffer's release, up to `bound`, makes that
/// next session start rather than fail.
#[derive(Clone)]
pub struct TraceWait {
    /// The clock the bound is measured on.
    pub clock: Arc<dyn MonotonicClock>,
    /// Timers on that clock.
    pub timer: Arc<dyn Timer>,
    /// The longest wait; then the call fails.
    pub bound: Duration,
}

impl TraceWait {
    /// A wait of [`TRACE_WAIT`] on `clock` and `timer`.
    pub fn new(clock: Arc<dyn MonotonicClock>, timer: Arc<dyn Timer>) -> TraceWait {
        TraceWait {
            clock,
            timer,
            bound: TRACE_WAIT,
        }
    }
}

/// The `NodeDebugService` implementation. Cheap to clone.
#[derive(Clone)]
pub struct DebugService {
    inner: Arc<Inner>,
}

struct Inner {
    logs: LogHub,
    kubeconfig: Option<Arc<dyn KubeconfigIssuer>>,
    tracing: Option<Tracing>,
    images: Option<Arc<dyn ImageStore>>,
    archive_limits: ArchiveLimits,
    closer: Closer,
}

/// Kernel tracing: the port, the one-session-per-buffer registry,
/// whether each session gets its own tracefs instance, and how a call
/// waits for a buffer in use.
struct Tracing {
    tracefs: Arc<dyn Tracefs>,
    buffers: TraceBuffers,
    per_session_instances: bool,
    wait: Option<TraceWait>,
}

/// What a [`DebugService`] serves, beyond its logs.
pub struct DebugPorts {
    /// The log tree behind GetLogs.
    pub logs: LogHub,
    /// Issues kubeconfigs; None: GetDebugKubeconfig fails with
    /// FailedPrecondition naming the flags that configure a CA.
    pub kubeconfig: Option<Arc<dyn KubeconfigIssuer>>,
    /// The tracefs Trace drives; None: Trace fails with FailedPrecondition.
    pub tracefs: Option<Arc<dyn Tracefs>>,
    /// Run each Trace session in a tracefs instance of its own
    /// (`instances/<name>`, removed afterwards), so sessions run
    /// concurrently; otherwise sessions use the global buffer, one at a
    /// time.
    pub trace_instances: bool,
    /// How a Trace call waits for the session holding its buffer to end;
    /// None: it fails at once.
    pub trace_wait: Option<TraceWait>,
    /// The node's image store LoadImage imports into; None: LoadImage
    /// fails with FailedPrecondition.
    pub images: Option<Arc<dyn ImageStore>>,
    /// Limits on an archive streamed to LoadImage.
    pub archive_limits: ArchiveLimits,
}

impl DebugPorts {
    /// Ports with only a log tree.
    pub fn new(logs: LogHub) -> DebugPorts {
        DebugPorts {
            logs,
            kubeconfig: None,
            tracefs: None,
            trace_instances: false,
            trace_wait: None,
            images: None,
            archive_limits: ArchiveLimits::default(),
        }
    }
}

impl std::fmt::Debug for DebugService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DebugService")
            .field("logs", &self.inner.logs)
            .field("kubeconfig", &self.inner.kubeconfig.is_some())
            .field("tracing", &self.inner.tracing.is_some())
            .field("images", &self.inner.images.is_some())
            .finish()
    }
}

impl DebugService {
    /// A service serving `logs`, issuing kubeconfigs through `kubeconfig`
    /// (None: GetDebugKubeconfig fails with FailedPrecondition naming the
    /// flags that configure a CA).
    pub fn new(logs: LogHub, kubeconfig: Option<Arc<dyn KubeconfigIssuer>>) -> DebugService {
        DebugService::with_ports(DebugPorts {
            kubeconfig,
            ..DebugPorts::new(logs)
        })
    }

    /// A service over `ports`. With per-session instances, it first
    /// removes those a previous run left in tracefs
    /// ([`remove_stale_instances`](metropolis_core::trace::remove_stale_instances)).
    pub fn with_ports(ports: DebugPorts) -> DebugService {
        if ports.trace_instances
            && let Some(tracefs) = &ports.tracefs
        {
            metropolis_core::trace::remove_stale_instances(tracefs.as_ref());
        }
        let tracing = ports.tracefs.map(|tracefs| Tracing {
            tracefs,
            buffers: TraceBuffers::new(),
            per_session_instances: ports.trace_instances,
            wait: ports.trace_wait,
        });
        DebugService {
            inner: Arc::new(Inner {
                logs: ports.logs,
                kubeconfig: ports.kubeconfig,
                tracing,
                images: ports.images,
                archive_limits: ports.archive_limits,
                closer: Closer::default(),
            }),
        }
    }

    /// Ends every running Trace (tracefs restored at once) and followed
    /// GetLogs with Unavailable; new ones end at once too. Call on
    /// shutdown, before draining connections.
    pub fn close_streams(&self) {
        self.inner.closer.close_all();
    }

    /// The log hub this service reads.
    pub fn logs(&self) -> &LogHub {
        &self.inner.logs
    }

    /// The tonic server, for [`Router::with_service`](super::Router::with_service).
    pub fn server(&self) -> NodeDebugServiceServer<DebugService> {
        NodeDebugServiceServer::new(self.clone())
    }

    /// The project's `NodeImages` extension over the same image store,
    /// served beside [`server`](Self::server) on the debug listener.
    pub fn images(&self) -> ImagesService {
        ImagesService::new(self.inner.images.clone())
    }
}

#[tonic::async_trait]
impl NodeDebugService for DebugService {
    async fn get_debug_kubeconfig(
        &self,
        request: Request<debug::GetDebugKubeconfigRequest>,
    ) -> Result<Response<debug::GetDebugKubeconfigResponse>, Status> {
        let peer = request
            .extensions()
            .get::<super::RemoteAddr>()
            .map(|r| r.0.clone());
        kubeconfig::issue(
            self.inner.kubeconfig.as_deref(),
            request.get_ref(),
            peer.as_deref(),
        )
        .map(Response::new)
    }

    type GetLogsStream = Closable<LogStream>;

    async fn get_logs(
        &self,
        request: Request<debug::GetLogsRequest>,
    ) -> Result<Response<Self::GetLogsStream>, Status> {
        let stream = self.inner.logs.get_logs(request.get_ref())?;
        Ok(Response::new(self.inner.closer.wrap(stream)))
    }

    type TraceStream =
        Closable<futures::stream::BoxStream<'static, Result<debug::TraceEvent, Status>>>;

    async fn trace(
        &self,
        request: Request<debug::TraceRequest>,
    ) -> Result<Response<Self::TraceStream>, Status> {
        use futures::StreamExt;
        let Some(t) = &self.inner.tracing else {
            return Err(Status::failed_precondition(
                "kernel tracing is not configured on this node",
            ));
        };
        // The start is a handful of quick tracefs writes on this thread
        // (see trace::run_session). A fresh instance's name may still
        // exist in tracefs (one a killed run left that could not be
        // removed, or another program's): the next names are tried.
        let mut names_tried = 0;
        let deadline = t.wait.as_ref().map(|w| w.clock.now() + w.bound);
        let stream = loop {
            let target = if t.per_session_instances {
                Target::Instance(t.buffers.fresh_instance_name())
            } else {
                Target::Global
            };
            match run_session(t.tracefs.clone(), &t.buffers, target, request.get_ref()) {
                Err(TraceError::InstanceExists { .. }) if names_tried < INSTANCE_NAMES_TRIED => {
                    names_tried += 1;
                }
                Err(TraceError::AlreadyInProgress { target }) => {
                    // Wait for the session holding the buffer to end, up
                    // to the deadline, and try again.
                    let waited = match (&t.wait, deadline) {
                        (Some(wait), Some(deadline)) if wait.clock.now() < deadline => {
                            let released = t.buffers.released(target);
                            let expired = wait.timer.sleep_until(deadline);
                            futures::future::select(released, expired).await;
                            continue;
                        }
                        (wait, _) => wait.as_ref().map(|w| w.bound),
                    };
                    let e = TraceError::AlreadyInProgress { target };
                    return Err(crate::status::debug::trace_in_progress(
                        &e,
                        waited,
                        !t.per_session_instances,
                    ));
                }
                started => break started.map_err(|e| crate::status::debug::trace(&e))?,
            }
        };
        Ok(Response::new(self.inner.closer.wrap(stream.boxed())))
    }

    async fn load_image(
        &self,
        request: Request<Streaming<debug::ImagePart>>,
    ) -> Result<Response<debug::LoadImageResponse>, Status> {
        use futures::StreamExt;
        let Some(store) = &self.inner.images else {
            return Err(Status::failed_precondition(
                "no image store is configured on this node",
            ));
        };
        let parts = request.into_inner().map(|part| part.map(|p| p.data_part));
        crate::images::load_image(parts, store.as_ref(), self.inner.archive_limits.clone())
            .await
            .map_err(crate::status::debug::image_load)?;
        Ok(Response::new(debug::LoadImageResponse {}))
    }
}
