//! Forwarding to the leader on the caller's behalf, over real sockets and
//! mutual TLS: a follower router (served on a UNIX socket, so its caller is
//! a node) forwards to a real daemon acting as leader, with a curator
//! instance's certificate; the leader serves the calls as the original
//! caller, unary and streaming alike. A node certificate without the
//! curator mark cannot forward.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use http::{Request, Response};
use metropolis_core::identity::NodeId;
use metropolis_pki::{ClusterCa, Credentials, client_config};
use metropolis_proto::prelude::{common, curator};
use metropolis_runtime_tokio::rt::TokioRuntime;
use metropolis_service::forward::{Destination, FixedRouting, Upstream};
use metropolis_service::metrics::Metrics;
use metropolis_service::{GrpcService, Router};
use metropolis_tests::{Daemon, RuntimeKind, against_both_runtimes, curator as curator_client};
use metropolis_transport::runtime::RuntimeTime;
use metropolis_transport::shutdown::shutdown_pair;
use metropolis_transport::{connect, listen};
use tonic::body::Body;

/// Stands in for the follower's own Curator: never called, since every
/// call is forwarded.
#[derive(Clone)]
struct NotHere;

impl tonic::server::NamedService for NotHere {
    const NAME: &'static str = "metropolis.node.core.curator.proto.api.Curator";
}

impl GrpcService for NotHere {
    fn call(&self, _: Request<Body>) -> BoxFuture<'static, Response<Body>> {
        panic!("a follower served a call it should have forwarded")
    }
}

/// A follower for caller `me` on a UNIX socket under `dir`, forwarding to
/// the daemon with `creds`; returns the socket path and the shutdown
/// trigger.
async fn follower(
    d: &Daemon,
    creds: &Credentials,
    me: NodeId,
    dir: &Path,
) -> (
    std::path::PathBuf,
    metropolis_transport::shutdown::ShutdownTrigger,
    Metrics,
) {
    let config = client_config(Some(creds), &creds.ca_pem).unwrap();
    let upstream: Arc<dyn Upstream> = Arc::new(
        connect::tls(&TokioRuntime::shared(), &d.addr, config)
            .await
            .unwrap(),
    );
    let runtime = TokioRuntime::shared();
    let metrics = Metrics::new(Arc::new(RuntimeTime::new(runtime.as_ref())));
    let router = Router::new()
        .with_service(NotHere)
        .with_routing(Arc::new(FixedRouting(Destination::Forward(upstream))))
        .with_metrics(metrics.clone());
    let socket = dir.join("follower.sock");
    let listener = listen::bind_unix(&runtime, &socket).unwrap();
    let (trigger, shutdown) = shutdown_pair();
    tokio::spawn(listen::serve_unix(
        runtime,
        listener,
        socket.clone(),
        me,
        router,
        metropolis_transport::edge::EdgeLimits::default(),
        shutdown,
    ));
    (socket, trigger, metrics)
}

/// The line of `metrics`' exposition that starts with `series`, and its
/// value.
fn sample(metrics: &Metrics, series: &str) -> Option<String> {
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series).map(|v| v.trim().to_string()))
}

fn status(address: &str) -> common::NodeStatus {
    common::NodeStatus {
        external_address: address.into(),
        ..Default::default()
    }
}

async fn calls_reach_the_leader_as_the_caller(runtime: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("leader"), runtime);
    let x = d.add_node(&dir.path().join("x")).await;
    let ca = ClusterCa::read_from_dir(&d.data_dir.join("pki")).unwrap();
    let (instance, _) = ca.issue_curator_node(&[]).unwrap();
    let (socket, _stop, metrics) = follower(&d, &instance, x.clone(), dir.path()).await;
    let mut via_follower = curator_client(
        connect::unix(&TokioRuntime::shared(), &socket)
            .await
            .unwrap(),
    );

    // A watch through the follower streams the leader's state.
    let kind = curator::watch_request::Kind::NodeInCluster(curator::watch_request::NodeInCluster {
        node_id: x.to_string(),
    });
    let mut watch = via_follower
        .watch(curator::WatchRequest { kind: Some(kind) })
        .await
        .unwrap()
        .into_inner();
    let first = watch.next().await.unwrap().unwrap();
    assert_eq!(first.nodes.len(), 1, "{first:?}");

    // An update through the follower is the caller's own (a node may
    // update only itself: the leader saw node x, not the follower).
    via_follower
        .update_node_status(curator::UpdateNodeStatusRequest {
            node_id: x.to_string(),
            status: Some(status("192.0.2.77")),
        })
        .await
        .unwrap();
    let e = via_follower
        .update_node_status(curator::UpdateNodeStatusRequest {
            node_id: d.node_id().to_string(),
            status: Some(status("192.0.2.78")),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");

    // The streaming call through the follower sees the update.
    let seen = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let event = watch.next().await.unwrap().unwrap();
            if event.nodes.iter().any(|n| {
                n.status
                    .as_ref()
                    .is_some_and(|s| s.external_address == "192.0.2.77")
            }) {
                return;
            }
        }
    })
    .await;
    assert!(seen.is_ok(), "the update did not reach the watch");

    // The follower counted what it forwarded, with the leader's codes.
    let method = |m: &str, kind: &str| {
        format!(
            "grpc_service=\"metropolis.node.core.curator.proto.api.Curator\",grpc_method=\"{m}\",grpc_type=\"{kind}\""
        )
    };
    let update = method("UpdateNodeStatus", "unary");
    let forwarded = |labels: &str| {
        sample(
            &metrics,
            &format!("metropolis_curator_forwarded_calls_total{{{labels}}}"),
        )
    };
    assert_eq!(forwarded(&update).as_deref(), Some("2"));
    assert_eq!(
        forwarded(&method("Watch", "server_stream")).as_deref(),
        Some("1")
    );
    let handled = |code: &str| {
        sample(
            &metrics,
            &format!("grpc_server_handled_total{{{update},grpc_code=\"{code}\"}}"),
        )
    };
    assert_eq!(handled("OK").as_deref(), Some("1"));
    assert_eq!(handled("PermissionDenied").as_deref(), Some("1"));
}

async fn only_curator_instances_forward(runtime: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("leader"), runtime);
    let x = d.add_node(&dir.path().join("x")).await;
    let ca = ClusterCa::read_from_dir(&d.data_dir.join("pki")).unwrap();
    // A node certificate without the curator mark.
    let (plain, _) = ca.issue_node(&[]).unwrap();
    let (socket, _stop, _) = follower(&d, &plain, x.clone(), dir.path()).await;
    let mut via_follower = curator_client(
        connect::unix(&TokioRuntime::shared(), &socket)
            .await
            .unwrap(),
    );
    let e = via_follower
        .update_node_status(curator::UpdateNodeStatusRequest {
            node_id: x.to_string(),
            status: Some(status("192.0.2.1")),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("curator instances"), "{}", e.message());
    // The daemon's own node certificate is a curator instance's.
    let own = Credentials::read_from_dir(&d.data_dir.join("pki"), "node").unwrap();
    assert!(metropolis_core::identity::is_curator_certificate(
        &own.cert_der().unwrap()
    ));
}

against_both_runtimes!(
    calls_reach_the_leader_as_the_caller,
    only_curator_instances_forward,
);
