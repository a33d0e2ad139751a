//! Server reflection through a [`Router`]: listing, files with their
//! dependencies, symbols of every kind, extensions, errors, and v1alpha.

#![allow(clippy::unwrap_used)]

use futures::executor::block_on;
use prost::Message;
use prost_types::FileDescriptorProto;
use tonic::Code;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::{
    ExtensionRequest, ServerReflectionRequest, ServerReflectionResponse,
};
use tonic_reflection::pb::v1alpha;

use super::grpc::{Reply, call};
use crate::debug::{DebugService, LogHub};
use crate::reflection::descriptors;
use crate::{HealthMonitor, Router};
use metropolis_core::logtree::LogTreeConfig;

const V1: &str = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo";
const V1ALPHA: &str = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
const API: &str = "metropolis/node/core/curator/proto/api/api.proto";

fn router() -> Router {
    let debug = DebugService::new(LogHub::new(LogTreeConfig::default()), None);
    Router::new()
        .with_service(debug.server())
        .with_health_and_reflection(&HealthMonitor::new())
}

fn question(request: MessageRequest) -> ServerReflectionRequest {
    ServerReflectionRequest {
        host: "node.example".into(),
        message_request: Some(request),
    }
}

/// The answers to `questions`, asked on one stream.
fn ask(questions: Vec<MessageRequest>) -> Vec<MessageResponse> {
    let questions: Vec<_> = questions.into_iter().map(question).collect();
    let mut reply = Reply::new(block_on(router().call(call(V1, &questions))));
    let mut answers = Vec::new();
    while let Some(answer) = block_on(reply.message::<ServerReflectionResponse>()).unwrap() {
        assert_eq!(answer.valid_host, "node.example");
        assert_eq!(
            answer.original_request.as_ref(),
            Some(&questions[answers.len()])
        );
        answers.push(answer.message_response.unwrap());
    }
    assert_eq!(answers.len(), questions.len(), "one answer per question");
    answers
}

fn symbol(name: &str) -> MessageRequest {
    MessageRequest::FileContainingSymbol(name.into())
}

/// The names of the files of a file answer, in order.
fn file_names(answer: &MessageResponse) -> Vec<String> {
    let MessageResponse::FileDescriptorResponse(files) = answer else {
        panic!("not a file answer: {answer:?}");
    };
    (files.file_descriptor_proto.iter())
        .map(|bytes| {
            FileDescriptorProto::decode(bytes.as_slice())
                .unwrap()
                .name()
                .to_owned()
        })
        .collect()
}

fn error_of(answer: &MessageResponse) -> (Code, String) {
    let MessageResponse::ErrorResponse(e) = answer else {
        panic!("not an error: {answer:?}");
    };
    (Code::from(e.error_code), e.error_message.clone())
}

#[test]
fn list_services_names_what_the_listener_serves() {
    let answers = ask(vec![MessageRequest::ListServices(String::new())]);
    let MessageResponse::ListServicesResponse(list) = &answers[0] else {
        panic!("{answers:?}");
    };
    let names: Vec<&str> = list.service.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection",
            "metropolis.proto.api.NodeDebugService",
        ]
    );
}

#[test]
fn a_curator_message_resolves_to_its_file_and_every_dependency_once_per_stream() {
    let answers = ask(vec![
        symbol("metropolis.node.core.curator.proto.api.Node"),
        symbol("metropolis.node.core.curator.proto.api.WatchEvent"),
    ]);
    let first = file_names(&answers[0]);
    assert_eq!(first[0], API, "the file itself comes first");
    for dependency in [
        "metropolis/proto/common/common.proto",
        "metropolis/proto/ext/authorization.proto",
        "google/protobuf/descriptor.proto",
        "google/protobuf/timestamp.proto",
        "version/spec/spec.proto",
    ] {
        assert!(
            first.iter().any(|f| f == dependency),
            "{dependency} in {first:?}"
        );
    }
    let mut unique = first.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), first.len(), "no file twice: {first:?}");
    // Every dependency of every file sent is sent too.
    let pool = descriptors();
    for name in &first {
        for dependency in pool.get_file_by_name(name).unwrap().dependencies() {
            assert!(
                first.iter().any(|f| f == dependency.name()),
                "{}",
                dependency.name()
            );
        }
    }
    // Asked again on the same stream: the file, without what was sent.
    assert_eq!(file_names(&answers[1]), [API]);
    // The descriptors carry the .proto comments (grpcurl describe shows them).
    let MessageResponse::FileDescriptorResponse(files) = &answers[0] else {
        unreachable!()
    };
    let api = FileDescriptorProto::decode(files.file_descriptor_proto[0].as_slice()).unwrap();
    assert!(api.source_code_info.is_some());
}

#[test]
fn every_kind_of_symbol_resolves() {
    let cases = [
        ("metropolis.node.core.curator.proto.api.Curator", API),
        (".metropolis.node.core.curator.proto.api.Curator", API),
        ("metropolis.node.core.curator.proto.api.Curator.Watch", API),
        ("metropolis.node.core.curator.proto.api.Node.id", API),
        (
            "metropolis.node.core.curator.proto.api.WatchRequest.kind",
            API,
        ),
        (
            "metropolis.node.core.curator.proto.api.WatchRequest.NodeInCluster",
            API,
        ),
        (
            "metropolis.node.core.curator.proto.api.WatchEvent.Progress",
            API,
        ),
        (
            "metropolis.node.core.curator.proto.api.WatchEvent.PROGRESS_LAST_BACKLOGGED",
            API,
        ),
        (
            "metropolis.proto.common.NodeState",
            "metropolis/proto/common/common.proto",
        ),
        (
            "metropolis.proto.common.NODE_STATE_UP",
            "metropolis/proto/common/common.proto",
        ),
        (
            "metropolis.proto.common.NodeState.NODE_STATE_UP",
            "metropolis/proto/common/common.proto",
        ),
        (
            "metropolis.proto.ext.authorization",
            "metropolis/proto/ext/authorization.proto",
        ),
        (
            "metropolis.proto.api.NodeDebugService.GetLogs",
            "metropolis/proto/api/debug.proto",
        ),
        ("grpc.health.v1.Health.Watch", "health.proto"),
        (
            "grpc.reflection.v1alpha.ServerReflection",
            "reflection_v1alpha.proto",
        ),
    ];
    let answers = ask(cases.iter().map(|(name, _)| symbol(name)).collect());
    for ((name, file), answer) in cases.iter().zip(&answers) {
        assert_eq!(
            file_names(answer).first().map(String::as_str),
            Some(*file),
            "{name}"
        );
    }
}

#[test]
fn unknown_names_are_not_found_and_the_stream_goes_on() {
    let long = format!("metropolis.{}", "x".repeat(10_000));
    let answers = ask(vec![
        symbol("metropolis.node.core.curator.proto.api.NoSuchThing"),
        symbol("metropolis.node.core.curator.proto.api.Curator.NoSuchMethod"),
        symbol("metropolis.proto.common.NO_SUCH_VALUE"),
        symbol(&long),
        MessageRequest::FileByFilename("no/such.proto".into()),
        MessageRequest::FileContainingExtension(ExtensionRequest {
            containing_type: "google.protobuf.MethodOptions".into(),
            extension_number: 999,
        }),
        MessageRequest::AllExtensionNumbersOfType("no.such.Message".into()),
        MessageRequest::ListServices(String::new()),
    ]);
    for answer in &answers[..7] {
        let (code, message) = error_of(answer);
        assert_eq!(code, Code::NotFound, "{message}");
        assert!(message.len() < 300, "bounded: {} bytes", message.len());
    }
    assert!(error_of(&answers[0]).1.contains("NoSuchThing"));
    assert!(matches!(
        answers[7],
        MessageResponse::ListServicesResponse(_)
    ));
}

#[test]
fn files_by_name_and_extensions_resolve() {
    let answers = ask(vec![
        MessageRequest::FileByFilename("metropolis/proto/ext/authorization.proto".into()),
        MessageRequest::FileContainingExtension(ExtensionRequest {
            containing_type: "google.protobuf.MethodOptions".into(),
            extension_number: 1000,
        }),
        MessageRequest::AllExtensionNumbersOfType("google.protobuf.MethodOptions".into()),
        MessageRequest::AllExtensionNumbersOfType(
            "metropolis.node.core.curator.proto.api.Node".into(),
        ),
    ]);
    assert_eq!(
        file_names(&answers[0]),
        [
            "metropolis/proto/ext/authorization.proto",
            "google/protobuf/descriptor.proto",
        ]
    );
    assert_eq!(
        file_names(&answers[1]),
        ["metropolis/proto/ext/authorization.proto"]
    );
    let MessageResponse::AllExtensionNumbersResponse(numbers) = &answers[2] else {
        panic!("{:?}", answers[2]);
    };
    assert_eq!(numbers.base_type_name, "google.protobuf.MethodOptions");
    assert_eq!(numbers.extension_number, [1000]);
    let MessageResponse::AllExtensionNumbersResponse(none) = &answers[3] else {
        panic!("{:?}", answers[3]);
    };
    assert!(none.extension_number.is_empty());
}

#[test]
fn a_request_asking_nothing_is_invalid_argument() {
    let empty = ServerReflectionRequest::default();
    let mut reply = Reply::new(block_on(router().call(call(V1, &[empty]))));
    let answer = block_on(reply.message::<ServerReflectionResponse>())
        .unwrap()
        .unwrap();
    assert_eq!(
        error_of(&answer.message_response.unwrap()).0,
        Code::InvalidArgument
    );
}

#[test]
fn v1alpha_answers_the_same_questions() {
    use v1alpha::server_reflection_request::MessageRequest as Alpha;
    use v1alpha::server_reflection_response::MessageResponse as AlphaAnswer;
    let questions = [
        Alpha::ListServices(String::new()),
        Alpha::FileContainingSymbol("metropolis.node.core.curator.proto.api.Node".into()),
    ]
    .map(|q| v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(q),
    });
    let mut reply = Reply::new(block_on(router().call(call(V1ALPHA, &questions))));
    let list = block_on(reply.message::<v1alpha::ServerReflectionResponse>())
        .unwrap()
        .unwrap();
    let Some(AlphaAnswer::ListServicesResponse(list)) = list.message_response else {
        panic!("{list:?}");
    };
    assert_eq!(list.service.len(), 4);
    let files = block_on(reply.message::<v1alpha::ServerReflectionResponse>())
        .unwrap()
        .unwrap();
    assert_eq!(files.original_request.as_ref(), Some(&questions[1]));
    let Some(AlphaAnswer::FileDescriptorResponse(files)) = files.message_response else {
        panic!("{files:?}");
    };
    let first = FileDescriptorProto::decode(files.file_descriptor_proto[0].as_slice()).unwrap();
    assert_eq!(first.name(), API);
    assert!(
        block_on(reply.message::<v1alpha::ServerReflectionResponse>())
            .unwrap()
            .is_none()
    );
}
