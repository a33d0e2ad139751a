//! gRPC health checking and server reflection on every listener of a real
//! daemon (curator TLS port, local socket, AgentCallback port, debug
//! port), on both runtimes, over the embedded store and elected over etcd:
//! Check answers SERVING for anonymous callers, Watch sends the status at
//! once, and reflection lists what each listener serves and resolves a
//! Curator message to its file.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use futures::StreamExt;
use metropolis_pki::client_config;
use metropolis_runtime_tokio::rt::TokioRuntime;
use metropolis_tests::{Daemon, RuntimeKind, against_both_runtimes_and_etcd};
use metropolis_transport::connect;
use metropolis_transport::grpc::Channel;
use prost::Message;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1alpha;

const INTROSPECTION: [&str; 3] = [
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
];
const CURATOR: &str = "metropolis.node.core.curator.proto.api.Curator";
const AGENT: &str = "cloud.bmaas.server.api.AgentCallback";
const DEBUG: &str = "metropolis.proto.api.NodeDebugService";
const MACHINES: &str = "metropolis.node.core.curator.proto.private.MachineManagement";
const MANAGEMENT: &str = "metropolis.node.core.curator.proto.private.NodeManagement";
const MAINTENANCE: &str = "metropolis.node.core.curator.proto.private.Maintenance";
const IMAGES: &str = "metropolis.node.core.curator.proto.private.NodeImages";

/// Check of `service`, retried while NOT_SERVING (an elected daemon may
/// not have won its election yet) for at most 20 s.
async fn check_serving(channel: &Channel, service: &str) {
    let mut health = HealthClient::with_origin(channel.clone(), Channel::origin());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let request = HealthCheckRequest {
            service: service.into(),
        };
        let status = health.check(request).await.unwrap().into_inner().status();
        if status == ServingStatus::Serving {
            return;
        }
        assert_eq!(status, ServingStatus::NotServing);
        assert!(Instant::now() < deadline, "{service:?} still {status:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One reflection question on a fresh v1 stream.
async fn reflect(channel: &Channel, request: MessageRequest) -> MessageResponse {
    let mut client = ServerReflectionClient::with_origin(channel.clone(), Channel::origin());
    let question = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    };
    let mut answers = client
        .server_reflection_info(futures::stream::iter([question]))
        .await
        .unwrap()
        .into_inner();
    let answer = answers.next().await.unwrap().unwrap();
    answer.message_response.unwrap()
}

/// The services reflection lists on `channel`.
async fn listed(channel: &Channel) -> Vec<String> {
    match reflect(channel, MessageRequest::ListServices(String::new())).await {
        MessageResponse::ListServicesResponse(list) => {
            list.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("{other:?}"),
    }
}

/// Health and reflection on one listener serving exactly `expected`.
async fn check_listener(name: &str, channel: &Channel, expected: &[&str]) {
    check_serving(channel, "").await;
    for service in expected {
        check_serving(channel, service).await;
    }
    let mut health = HealthClient::with_origin(channel.clone(), Channel::origin());
    let unknown = HealthCheckRequest {
        service: "no.such.Service".into(),
    };
    let e = health.check(unknown).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{name}");
    let mut watch = health
        .watch(HealthCheckRequest::default())
        .await
        .unwrap()
        .into_inner();
    let first = watch.next().await.unwrap().unwrap();
    assert_eq!(first.status(), ServingStatus::Serving, "{name}");

    let mut want: Vec<&str> = expected.iter().chain(&INTROSPECTION).copied().collect();
    want.sort_unstable();
    assert_eq!(listed(channel).await, want, "{name}");
    let symbol = MessageRequest::FileContainingSymbol(format!("{CURATOR}.Watch"));
    let MessageResponse::FileDescriptorResponse(files) = reflect(channel, symbol).await else {
        panic!("{name}: no file for {CURATOR}.Watch");
    };
    let file = prost_types::FileDescriptorProto::decode(files.file_descriptor_proto[0].as_slice())
        .unwrap();
    assert_eq!(
        file.name(),
        "metropolis/node/core/curator/proto/api/api.proto"
    );
    assert!(
        files.file_descriptor_proto.len() > 1,
        "{name}: with its dependencies"
    );
}

async fn every_listener_answers_health_and_reflection(runtime: RuntimeKind) {
    let tmp = tempfile::tempdir().unwrap();
    // A long grace: open health Watch streams must not hold the shutdown.
    let mut d = Daemon::start_debug(
        &tmp.path().join("node"),
        runtime,
        &["--shutdown-grace", "60"],
    );
    let ca = std::fs::read_to_string(d.data_dir.join("pki/ca.pem")).unwrap();
    // Anonymous TLS callers: no client certificate.
    let anonymous = client_config(None, &ca).unwrap();
    // An elected instance's curator port also takes the agents' calls
    // that followers forward.
    let curator: &[&str] = match d.elected {
        false => &[CURATOR, MACHINES, MAINTENANCE, MANAGEMENT],
        true => &[CURATOR, MACHINES, MAINTENANCE, MANAGEMENT, AGENT],
    };
    let tls = connect::tls(&TokioRuntime::shared(), &d.addr, anonymous.clone())
        .await
        .unwrap();
    check_listener("curator TLS", &tls, curator).await;
    let mut open_watch = HealthClient::with_origin(tls.clone(), Channel::origin())
        .watch(HealthCheckRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(open_watch.next().await.unwrap().is_ok());
    check_listener("local socket", &d.unix().await, curator).await;
    let agent = connect::tls(&TokioRuntime::shared(), &d.agent_addr, anonymous)
        .await
        .unwrap();
    check_listener("agent", &agent, &[AGENT]).await;
    check_listener("debug", &d.debug().await, &[DEBUG, IMAGES]).await;

    // The older reflection protocol, for older tools.
    let mut alpha = v1alpha::server_reflection_client::ServerReflectionClient::with_origin(
        tls,
        Channel::origin(),
    );
    let question = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut answers = alpha
        .server_reflection_info(futures::stream::iter([question]))
        .await
        .unwrap()
        .into_inner();
    let answer = answers.next().await.unwrap().unwrap();
    let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        answer.message_response
    else {
        panic!("{answer:?}");
    };
    assert!(list.service.iter().any(|s| s.name == CURATOR), "{list:?}");

    // Shutdown ends the open Watch (after it said NOT_SERVING, if it got
    // the chance) instead of waiting out the grace.
    let started = Instant::now();
    let status = tokio::task::spawn_blocking(move || d.terminate())
        .await
        .unwrap();
    assert!(status.success(), "{status}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "shutdown took {:?}",
        started.elapsed()
    );
    let rest: Vec<_> = tokio::time::timeout(Duration::from_secs(5), open_watch.collect())
        .await
        .expect("the Watch ended");
    for status in rest.iter().flatten() {
        assert_eq!(status.status(), ServingStatus::NotServing, "{rest:?}");
    }
}

against_both_runtimes_and_etcd!(every_listener_answers_health_and_reflection);
