//! `NodeDebugService`: the node's logs, kernel tracing, image loading and
//! debug kubeconfigs, over [ports](crate::ports).
//!
//! The service is unauthenticated by contract (the proto carries no
//! `authorization` option): runtimes serve it only when explicitly enabled,
//! on its own listener, loopback by default.

mod kubeconfig;
mod logs;

use std::sync::Arc;

use metropolis_proto::prelude::debug;
use metropolis_proto::prelude::debug::node_debug_service_server::{
    NodeDebugService, NodeDebugServiceServer,
};
use tonic::{Request, Response, Status, Streaming};

use crate::ports::KubeconfigIssuer;

pub use kubeconfig::{MAX_GROUPS, MAX_NAME_LEN, SYSTEM_MASTERS};
pub use logs::{LogHub, LogStream, MAX_ENTRIES_PER_RESPONSE, MAX_RESPONSE_BYTES};

/// The `NodeDebugService` implementation. Cheap to clone.
#[derive(Clone)]
pub struct DebugService {
    inner: Arc<Inner>,
}

struct Inner {
    logs: LogHub,
    kubeconfig: Option<Arc<dyn KubeconfigIssuer>>,
}

impl std::fmt::Debug for DebugService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DebugService")
            .field("logs", &self.inner.logs)
            .field("kubeconfig", &self.inner.kubeconfig.is_some())
            .finish()
    }
}

impl DebugService {
    /// A service serving `logs`, issuing kubeconfigs through `kubeconfig`
    /// (None: GetDebugKubeconfig fails with FailedPrecondition naming the
    /// flags that configure a CA).
    pub fn new(logs: LogHub, kubeconfig: Option<Arc<dyn KubeconfigIssuer>>) -> DebugService {
        DebugService {
            inner: Arc::new(Inner { logs, kubeconfig }),
        }
    }

    /// The log hub this service reads.
    pub fn logs(&self) -> &LogHub {
        &self.inner.logs
    }

    /// The tonic server, for [`Router::with_service`](super::Router::with_service).
    pub fn server(&self) -> NodeDebugServiceServer<DebugService> {
        NodeDebugServiceServer::new(self.clone())
    }
}

#[tonic::async_trait]
impl NodeDebugService for DebugService {
    async fn get_debug_kubeconfig(
        &self,
        request: Request<debug::GetDebugKubeconfigRequest>,
    ) -> Result<Response<debug::GetDebugKubeconfigResponse>, Status> {
        kubeconfig::issue(self.inner.kubeconfig.as_deref(), request.get_ref()).map(Response::new)
    }

    type GetLogsStream = LogStream;

    async fn get_logs(
        &self,
        request: Request<debug::GetLogsRequest>,
    ) -> Result<Response<LogStream>, Status> {
        self.inner.logs.get_logs(request.get_ref()).map(Response::new)
    }

    type TraceStream = futures::stream::BoxStream<'static, Result<debug::TraceEvent, Status>>;

    async fn trace(
        &self,
        _request: Request<debug::TraceRequest>,
    ) -> Result<Response<Self::TraceStream>, Status> {
        Err(Status::unimplemented("Trace is not wired yet"))
    }

    async fn load_image(
        &self,
        _request: Request<Streaming<debug::ImagePart>>,
    ) -> Result<Response<debug::LoadImageResponse>, Status> {
        Err(Status::unimplemented("LoadImage is not wired yet"))
    }
}
