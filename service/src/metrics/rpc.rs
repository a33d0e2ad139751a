//! Metrics of the calls a [`Router`](crate::Router) serves, with
//! the names and labels of the gRPC ecosystem's Prometheus middleware
//! (`grpc_server_started_total`, `grpc_server_handled_total`,
//! `grpc_server_handling_seconds`; labels `grpc_service`, `grpc_method`,
//! `grpc_type`, `grpc_code` with Go's code names): dashboards written for
//! grpc-go servers work unchanged.
//!
//! A call is counted when it reaches the router and handled when its
//! status is known: at once for a trailers-only answer, else when the
//! response body yields its trailers (or fails, or is dropped before its
//! end: `Canceled`, the caller went away). Its handling time runs until
//! then, so for a stream it is the stream's lifetime.
//!
//! Label values come from the descriptors of the methods the daemon
//! serves; any other path is counted under `unknown`, so a caller cannot
//! grow the label sets.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body as HttpBody, Frame, SizeHint};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tonic::body::Body;

use super::{Clock, latency_buckets};
use metropolis_core::time::Instant;

/// The labels of a method: `grpc_service`, `grpc_method`, `grpc_type`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct MethodLabels {
    grpc_service: &'static str,
    grpc_method: &'static str,
    grpc_type: &'static str,
}

/// A method's labels and a status code.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandledLabels {
    grpc_service: &'static str,
    grpc_method: &'static str,
    grpc_type: &'static str,
    grpc_code: &'static str,
}

/// Labels of a path no descriptor names.
const UNKNOWN: MethodLabels = MethodLabels {
    grpc_service: "unknown",
    grpc_method: "unknown",
    grpc_type: "unknown",
};

/// The labels of every method the descriptors know, by HTTP/2 path.
fn methods() -> &'static HashMap<String, MethodLabels> {
    static METHODS: OnceLock<HashMap<String, MethodLabels>> = OnceLock::new();
    METHODS.get_or_init(|| {
        let pool = crate::reflection::descriptors();
        let mut methods = HashMap::new();
        for service in pool.services() {
            // Leaked once per method of the descriptors (a few dozen
            // strings for the process's lifetime): label values are
            // `&'static str`, so recording a call allocates nothing.
            let service_name: &'static str = Box::leak(service.full_name().into());
            for method in service.methods() {
                let grpc_type = match (method.is_client_streaming(), method.is_server_streaming()) {
                    (false, false) => "unary",
                    (true, false) => "client_stream",
                    (false, true) => "server_stream",
                    (true, true) => "bidi_stream",
                };
                let labels = MethodLabels {
                    grpc_service: service_name,
                    grpc_method: Box::leak(method.name().into()),
                    grpc_type,
                };
                methods.insert(format!("/{}/{}", service_name, method.name()), labels);
            }
        }
        methods
    })
}

/// The labels of the method at `path` ([`UNKNOWN`] for any other).
pub(crate) fn method_labels(path: &str) -> MethodLabels {
    methods().get(path).copied().unwrap_or(UNKNOWN)
}

/// Go's name of a gRPC status code, as grpc-go's middleware labels it.
fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "Canceled",
        Unknown => "Unknown",
        InvalidArgument => "InvalidArgument",
        DeadlineExceeded => "DeadlineExceeded",
        NotFound => "NotFound",
        AlreadyExists => "AlreadyExists",
        PermissionDenied => "PermissionDenied",
        ResourceExhausted => "ResourceExhausted",
        FailedPrecondition => "FailedPrecondition",
        Aborted => "Aborted",
        OutOfRange => "OutOfRange",
        Unimplemented => "Unimplemented",
        Internal => "Internal",
        Unavailable => "Unavailable",
        DataLoss => "DataLoss",
        Unauthenticated => "Unauthenticated",
    }
}

/// The code of a `grpc-status` header, if `headers` have one.
fn status_code(headers: &HeaderMap) -> Option<tonic::Code> {
    headers
        .get("grpc-status")
        .map(|v| tonic::Code::from_bytes(v.as_bytes()))
}

/// The call families.
#[derive(Clone)]
pub(crate) struct RpcMetrics {
    started: Family<MethodLabels, Counter>,
    handled: Family<HandledLabels, Counter>,
    handling: Family<MethodLabels, Histogram>,
    in_flight: Family<MethodLabels, Gauge>,
    forwarded: Family<MethodLabels, Counter>,
}

impl Default for RpcMetrics {
    fn default() -> Self {
        RpcMetrics {
            started: Family::default(),
            handled: Family::default(),
            handling: Family::new_with_constructor(|| Histogram::new(latency_buckets())),
            in_flight: Family::default(),
            forwarded: Family::default(),
        }
    }
}

impl RpcMetrics {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "grpc_server_started",
            "Calls started on the server, by method",
            self.started.clone(),
        );
        registry.register(
            "grpc_server_handled",
            "Calls completed on the server, by method and status code",
            self.handled.clone(),
        );
        registry.register(
            "grpc_server_handling_seconds",
            "Time from a call's start until its status (a stream's lifetime)",
            self.handling.clone(),
        );
        registry.register(
            "grpc_server_in_flight",
            "Calls started and not yet completed (open Watch streams, running Trace, GetLogs and LoadImage sessions)",
            self.in_flight.clone(),
        );
        registry.register(
            "metropolis_curator_forwarded_calls",
            "Calls this instance passed to the leader, by method",
            self.forwarded.clone(),
        );
    }

    /// Counts a call of `path` starting at `now`.
    pub(crate) fn start(&self, path: &str, clock: Clock, now: Instant) -> CallMeter {
        let labels = method_labels(path);
        self.started.get_or_create(&labels).inc();
        self.in_flight.get_or_create(&labels).inc();
        CallMeter {
            metrics: self.clone(),
            labels,
            clock,
            started: now,
            done: false,
        }
    }

    /// Counts a call of `path` passed to the leader.
    pub(crate) fn forwarded(&self, path: &str) {
        self.forwarded.get_or_create(&method_labels(path)).inc();
    }
}

/// One call being measured: records its status once, on
/// [`finish`](Self::finish) or at the end of its response body, or
/// `Canceled` when dropped before either.
pub(crate) struct CallMeter {
    metrics: RpcMetrics,
    labels: MethodLabels,
    clock: Clock,
    started: Instant,
    done: bool,
}

impl CallMeter {
    /// Records `code` as the call's status, once.
    fn record(&mut self, code: tonic::Code) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let MethodLabels {
            grpc_service,
            grpc_method,
            grpc_type,
        } = self.labels;
        let handled = HandledLabels {
            grpc_service,
            grpc_method,
            grpc_type,
            grpc_code: code_name(code),
        };
        self.metrics.handled.get_or_create(&handled).inc();
        let took = self.clock.now().saturating_duration_since(self.started);
        self.metrics
            .handling
            .get_or_create(&self.labels)
            .observe(took.as_secs_f64());
        self.metrics.in_flight.get_or_create(&self.labels).dec();
    }

    /// The response of the call: recorded now when it is trailers-only,
    /// else its body carries the meter to its trailers.
    pub(crate) fn finish(mut self, response: http::Response<Body>) -> http::Response<Body> {
        if let Some(code) = status_code(response.headers()) {
            self.record(code);
            return response;
        }
        response.map(|inner| Body::new(MeteredBody { inner, meter: self }))
    }
}

impl Drop for CallMeter {
    fn drop(&mut self) {
        self.record(tonic::Code::Cancelled);
    }
}

/// A response body that records its call's status from its trailers.
struct MeteredBody {
    inner: Body,
    meter: CallMeter,
}

impl HttpBody for MeteredBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(trailers) = frame.trailers_ref() {
                    this.meter
                        .record(status_code(trailers).unwrap_or(tonic::Code::Unknown));
                }
            }
            Poll::Ready(Some(Err(status))) => this.meter.record(status.code()),
            // A body that ends without trailers ended without a status:
            // the client sees the stream end with none, which gRPC clients
            // report as Unknown (or Internal).
            Poll::Ready(None) => this.meter.record(tonic::Code::Unknown),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use metropolis_core::ports::MonotonicClock;

    /// A clock the test moves by hand, in milliseconds.
    #[derive(Default)]
    struct Millis(AtomicU64);
    impl MonotonicClock for Millis {
        fn now(&self) -> Instant {
            Instant::from_offset(Duration::from_millis(self.0.load(Ordering::Relaxed)))
        }
    }

    const UPDATE: &str = "/metropolis.node.core.curator.proto.api.Curator/UpdateNodeStatus";
    const WATCH: &str = "/metropolis.node.core.curator.proto.api.Curator/Watch";

    fn exposition(metrics: &RpcMetrics) -> String {
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        text
    }

    fn series(text: &str, name: &str, method: &str, kind: &str, extra: &str) -> Option<String> {
        let prefix = format!(
            "{name}{{grpc_service=\"metropolis.node.core.curator.proto.api.Curator\",grpc_method=\"{method}\",grpc_type=\"{kind}\"{extra}}} "
        );
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()).map(str::to_string))
    }

    #[test]
    fn a_trailers_only_answer_counts_at_once_with_its_code() {
        let (metrics, clock) = (RpcMetrics::default(), Arc::new(Millis::default()));
        let meter = metrics.start(UPDATE, clock.clone(), clock.now());
        clock.0.store(250, Ordering::Relaxed);
        let _ = meter.finish(tonic::Status::not_found("no such node").into_http());
        let text = exposition(&metrics);
        let handled = series(
            &text,
            "grpc_server_handled_total",
            "UpdateNodeStatus",
            "unary",
            ",grpc_code=\"NotFound\"",
        );
        assert_eq!(handled.as_deref(), Some("1"), "{text}");
        let sum = series(
            &text,
            "grpc_server_handling_seconds_sum",
            "UpdateNodeStatus",
            "unary",
            "",
        );
        assert_eq!(sum.as_deref(), Some("0.25"), "{text}");
        let open = series(
            &text,
            "grpc_server_in_flight",
            "UpdateNodeStatus",
            "unary",
            "",
        );
        assert_eq!(open.as_deref(), Some("0"), "{text}");
    }

    #[test]
    fn a_stream_counts_at_its_trailers_or_as_canceled_when_dropped() {
        use futures::executor::block_on;
        use http_body_util::BodyExt;

        let (metrics, clock) = (RpcMetrics::default(), Arc::new(Millis::default()));
        let ok = || {
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
            let frames: Vec<Result<Frame<Bytes>, tonic::Status>> = vec![
                Ok(Frame::data(Bytes::from_static(b"event"))),
                Ok(Frame::trailers(trailers)),
            ];
            http::Response::new(Body::new(http_body_util::StreamBody::new(
                futures::stream::iter(frames),
            )))
        };
        // Read to its end: OK, once.
        let response = metrics
            .start(WATCH, clock.clone(), clock.now())
            .finish(ok());
        let text = exposition(&metrics);
        let open = series(&text, "grpc_server_in_flight", "Watch", "server_stream", "");
        assert_eq!(open.as_deref(), Some("1"), "{text}");
        block_on(response.into_body().collect()).expect("the body ends");
        // Dropped after its first event: Canceled.
        let mut body = metrics
            .start(WATCH, clock.clone(), clock.now())
            .finish(ok())
            .into_body();
        block_on(body.frame()).expect("a frame").expect("data");
        drop(body);
        let text = exposition(&metrics);
        let code = |c: &str| {
            series(
                &text,
                "grpc_server_handled_total",
                "Watch",
                "server_stream",
                &format!(",grpc_code=\"{c}\""),
            )
        };
        assert_eq!(code("OK").as_deref(), Some("1"), "{text}");
        assert_eq!(code("Canceled").as_deref(), Some("1"), "{text}");
        let open = series(&text, "grpc_server_in_flight", "Watch", "server_stream", "");
        assert_eq!(open.as_deref(), Some("0"), "{text}");
    }

    #[test]
    fn descriptor_methods_have_their_streaming_type() {
        let watch = method_labels("/metropolis.node.core.curator.proto.api.Curator/Watch");
        assert_eq!(
            watch.grpc_service,
            "metropolis.node.core.curator.proto.api.Curator"
        );
        assert_eq!(watch.grpc_method, "Watch");
        assert_eq!(watch.grpc_type, "server_stream");
        let heartbeat = method_labels("/cloud.bmaas.server.api.AgentCallback/Heartbeat");
        assert_eq!(heartbeat.grpc_type, "unary");
        let load = method_labels("/metropolis.proto.api.NodeDebugService/LoadImage");
        assert_eq!(load.grpc_type, "client_stream");
        let health = method_labels("/grpc.health.v1.Health/Watch");
        assert_eq!(health.grpc_type, "server_stream");
        assert_eq!(method_labels("/x.Y/Z"), UNKNOWN);
        assert_eq!(
            method_labels("/metropolis.node.core.curator.proto.api.Curator/Nope"),
            UNKNOWN
        );
    }
}
