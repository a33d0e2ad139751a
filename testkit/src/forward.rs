//! [`Unreachable`]: a leader connector whose every call fails to connect,
//! for instances whose tests never forward (or check what happens when
//! the leader cannot be reached).

use std::sync::Arc;

use futures::future::BoxFuture;
use http::{Request, Response};
use metropolis_service::forward::{Connector, ForwardError, Upstream};
use tonic::body::Body;

/// Connects to no leader: every forwarded call fails with "unreachable".
#[derive(Clone, Copy, Debug, Default)]
pub struct Unreachable;

impl Connector for Unreachable {
    fn connect(&self, _node_id: &str, _address: &str) -> Arc<dyn Upstream> {
        Arc::new(Unreachable)
    }
}

impl Upstream for Unreachable {
    fn send(&self, _: Request<Body>) -> BoxFuture<'static, Result<Response<Body>, ForwardError>> {
        Box::pin(futures::future::ready(Err(ForwardError::Connect {
            reason: "unreachable".to_owned(),
        })))
    }
}
