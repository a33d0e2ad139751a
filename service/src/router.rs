//! Dispatch of gRPC calls to services, with authorization.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;

use futures::future::BoxFuture;
use http::{Request, Response};
use metropolis_proto::authorization;
use tonic::body::Body;
use tonic::codegen::Service;
use tonic::server::NamedService;

use futures::future::Either;

mod wrong_port;

use super::admission::RequestLimits;
use super::forward::{Destination, Routing, forward_reporting, grpc_timeout, on_behalf_of};
use super::metrics::Metrics;
use super::routed_body::RoutedBody;
use metropolis_core::identity::{Identity, authorize};
use metropolis_core::leadership::LeadershipError;
use metropolis_core::quote::{cap_encoded_message, quoted};

/// A gRPC service the router can call: any tonic-generated server.
pub trait GrpcService: Send + Sync + 'static {
    /// Handles one call.
    fn call(&self, request: Request<Body>) -> BoxFuture<'static, Response<Body>>;

    /// Checks a call before its body is read and before it is routed
    /// (served here or forwarded to the leader): the status refusing it,
    /// for a caller the service never serves. By default every call
    /// passes.
    fn precheck(&self, request: &Request<Body>) -> Result<(), tonic::Status> {
        let _ = request;
        Ok(())
    }
}

impl<S> GrpcService for S
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    fn call(&self, request: Request<Body>) -> BoxFuture<'static, Response<Body>> {
        // Generated tonic servers are always ready, so no poll_ready first.
        let mut service = self.clone();
        Box::pin(async move {
            match Service::call(&mut service, request).await {
                Ok(response) => response,
                Err(never) => match never {},
            }
        })
    }
}

/// A call answered at once with `status` (trailers-only).
pub(crate) fn refuse(status: tonic::Status) -> BoxFuture<'static, Response<Body>> {
    Box::pin(futures::future::ready(status.into_http()))
}

/// Caps a trailers-only answer's `grpc-message` (see
/// [`quote`](metropolis_core::quote)): the last guard against a message that quotes
/// too much of what the caller sent.
fn cap_status_message(mut response: Response<Body>) -> Response<Body> {
    if let Some(value) = response.headers().get("grpc-message")
        && let Some(capped) = cap_encoded_message(value.as_bytes())
        && let Ok(capped) = http::HeaderValue::from_bytes(&capped)
    {
        response.headers_mut().insert("grpc-message", capped);
    }
    response
}

/// The answer to a call of `method`, which `service` does not have.
pub(crate) fn no_such_method(service: &str, method: &str) -> BoxFuture<'static, Response<Body>> {
    refuse(tonic::Status::unimplemented(format!(
        "{service} has no method {}",
        quoted(method)
    )))
}

/// The method name of a call (`Method` of `/package.Service/Method`).
pub(crate) fn method_name<B>(request: &Request<B>) -> &str {
    request.uri().path().rsplit('/').next().unwrap_or_default()
}

/// Routes `/package.Service/Method` calls to their service.
///
/// Before a call reaches a service, the router looks up the method's rule in
/// the `authorization` option of the descriptors and checks the caller's
/// [`Identity`] (taken from the request extensions; none means
/// unauthenticated) against it: Unauthenticated or PermissionDenied on
/// failure. Methods without the option are left to the service.
///
/// With a [`Routing`] (an elected instance), each authorized call is
/// routed first: served here while leading, passed to the leader while
/// following ([`forward`](super::forward::forward)), held while no leader
/// is known; and ended with Unavailable when the role it was routed under
/// ends (a unary call's future is dropped, a stream is closed with the
/// status). A call forwarded on
/// behalf of a caller (the `x-metropolis-on-behalf-of` header) is accepted
/// only from a connection marked [`CuratorPeer`](super::forward::CuratorPeer),
/// authorized as that caller, and never forwarded again.
///
/// Services added with [`with_local_service`](Self::with_local_service)
/// (health checking, reflection) skip all of that: every instance answers
/// them itself, at once, for any caller.
///
/// Every request body it passes on is held to the router's
/// [`RequestLimits`] (message size per method, bytes in flight).
#[derive(Clone, Default)]
pub struct Router {
    services: Arc<BTreeMap<&'static str, Arc<dyn GrpcService>>>,
    local: Arc<BTreeMap<&'static str, Arc<dyn GrpcService>>>,
    routing: Option<Arc<dyn Routing>>,
    limits: RequestLimits,
    metrics: Option<Metrics>,
}

impl Router {
    /// A router with no service.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a tonic-generated server, under its proto service name.
    pub fn with_service<S: GrpcService + NamedService>(mut self, service: S) -> Self {
        Arc::make_mut(&mut self.services).insert(S::NAME, Arc::new(service));
        self
    }

    /// Adds a tonic-generated server, under its proto service name, that
    /// this instance answers itself: without authorization (the caller
    /// may be anonymous) and never routed (not forwarded to a leader, not
    /// held while none is known, not ended when the role changes).
    pub fn with_local_service<S: GrpcService + NamedService>(mut self, service: S) -> Self {
        Arc::make_mut(&mut self.local).insert(S::NAME, Arc::new(service));
        self
    }

    /// The proto names of the services added with
    /// [`with_service`](Self::with_service), in order.
    pub fn service_names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.services.keys().copied()
    }

    /// Forwards authorized calls to the leader `routing` names, when it
    /// names one.
    pub fn with_routing(mut self, routing: Arc<dyn Routing>) -> Self {
        self.routing = Some(routing);
        self
    }

    /// Holds request bodies to `limits` instead of the defaults
    /// ([`RequestLimits::default`]). Routers that share a `RequestLimits`
    /// share its budget.
    pub fn with_limits(mut self, limits: RequestLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Records every call in `metrics` (started, handled by status code,
    /// handling time, in flight, forwarded): see
    /// [`metrics`](super::metrics).
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The limits request bodies are held to.
    pub fn limits(&self) -> &RequestLimits {
        &self.limits
    }

    /// Handles one call. The future is not boxed again: the caller (the
    /// connection's service) boxes its own, with this one inside.
    pub fn call(
        &self,
        request: Request<Body>,
    ) -> impl Future<Output = Response<Body>> + Send + 'static + use<> {
        use futures::FutureExt;
        let meter = self
            .metrics
            .as_ref()
            .map(|m| m.start_call(request.uri().path()));
        self.dispatch(request).map(move |response| {
            let response = cap_status_message(response);
            match meter {
                Some(meter) => meter.finish(response),
                None => response,
            }
        })
    }

    /// `request` with its body held to the router's limits.
    fn admit(&self, request: Request<Body>) -> Request<Body> {
        let (parts, body) = request.into_parts();
        let body = self.limits.admit(parts.uri.path(), body);
        Request::from_parts(parts, body)
    }

    fn dispatch(&self, mut request: Request<Body>) -> BoxFuture<'static, Response<Body>> {
        let forwarded = match on_behalf_of(&mut request) {
            None => false,
            Some(Ok(identity)) => {
                request.extensions_mut().insert(identity);
                true
            }
            Some(Err(status)) => return refuse(status),
        };
        let path = request.uri().path();
        let service_name = path
            .trim_start_matches('/')
            .split('/')
            .next()
            .unwrap_or_default();
        if let Some(local) = self.local.get(service_name) {
            return local.call(self.admit(request));
        }
        let Some(service) = self.services.get(service_name).cloned() else {
            let held = self.services.keys().copied();
            let status =
                tonic::Status::unimplemented(wrong_port::no_service_here(service_name, held));
            return refuse(status);
        };
        if let Some(rule) = authorization::policy(path).and_then(|p| p.rule) {
            let identity = request
                .extensions()
                .get::<Identity>()
                .cloned()
                .unwrap_or(Identity::Unauthenticated);
            if let Err(e) = authorize(&identity, &rule) {
                return refuse(crate::status::authz(&e));
            }
        }
        if let Err(status) = service.precheck(&request) {
            return refuse(status);
        }
        let request = self.admit(request);
        let Some(routing) = self.routing.clone() else {
            return service.call(request);
        };
        let timeout = grpc_timeout(request.headers().get("grpc-timeout"));
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let routed = match routing.route(timeout).await {
                Ok(routed) => routed,
                Err(e) => return crate::status::leadership(&e).into_http(),
            };
            let forwarding = matches!(routed.destination, Destination::Forward(_));
            let response = match routed.destination {
                Destination::Serve(term) => {
                    let mut request = request;
                    request.extensions_mut().insert(term);
                    service.call(request)
                }
                // The sender took us for the leader; we are not (any more).
                Destination::Forward(_)
                    if forwarded && !crate::canary_planted!(ForwardForwarded) =>
                {
                    return crate::status::leadership(&LeadershipError::BackendSwitched)
                        .into_http();
                }
                Destination::Forward(upstream) => {
                    if let Some(metrics) = &metrics {
                        metrics.rpc.forwarded(request.uri().path());
                    }
                    forward_reporting(upstream.as_ref(), request, routed.unreachable)
                }
            };
            let mut cancelled = routed.cancelled;
            match futures::future::select(response, &mut cancelled).await {
                Either::Left((response, _)) => response.map(|body| {
                    Body::new(RoutedBody::new(
                        body,
                        cancelled,
                        routed.finished,
                        forwarding,
                    ))
                }),
                // The role ended before the call answered: its future is
                // dropped here, so it writes nothing more.
                Either::Right((error, _)) => crate::status::leadership(&error).into_http(),
            }
        })
    }
}
