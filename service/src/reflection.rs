//! gRPC server reflection (`grpc.reflection.v1.ServerReflection` and the
//! older `grpc.reflection.v1alpha.ServerReflection`), so that grpcurl,
//! grpcui, Postman or Evans can call this node without its .proto files.
//!
//! The descriptors are the ones compiled into this binary: the project's
//! own ([`metropolis_proto::FILE_DESCRIPTOR_SET`], with their comments) and
//! those of the health and reflection protocols. Each listener lists the
//! services it serves; any file or symbol of those descriptors can be
//! looked up on any of them. As grpc-go does, a file is answered with its
//! transitive dependencies, minus those already sent on the same stream.
//! A name that is not found is answered with an `ErrorResponse`
//! (NOT_FOUND) and the stream goes on.
//!
//! The response stream maps the request stream, one answer per question:
//! nothing is spawned, so it runs on any runtime.

use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, OnceLock};

use futures::StreamExt;
use futures::stream::BoxStream;
use prost::Message;
use prost_reflect::{DescriptorPool, FileDescriptor};
use tonic::{Code, Request, Response, Status, Streaming};
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::server_reflection_server::{
    ServerReflection, ServerReflectionServer,
};
use tonic_reflection::pb::v1::{
    ErrorResponse, ExtensionNumberResponse, ExtensionRequest, FileDescriptorResponse,
    ListServiceResponse, ServerReflectionRequest, ServerReflectionResponse, ServiceResponse,
};
use tonic_reflection::pb::{v1, v1alpha};

use super::debug::{Closable, Closer};
use metropolis_core::quote::quoted;

/// Every descriptor compiled into this binary, decoded once.
pub(crate) fn descriptors() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| {
        // Build outputs of this binary, not input: a failure is a bug that
        // the tests catch.
        let mut pool = DescriptorPool::decode(metropolis_proto::FILE_DESCRIPTOR_SET)
            .expect("the project's descriptor set decodes");
        for set in [
            tonic_health::pb::FILE_DESCRIPTOR_SET,
            v1::FILE_DESCRIPTOR_SET,
            v1alpha::FILE_DESCRIPTOR_SET,
        ] {
            pool.decode_file_descriptor_set(set)
                .expect("the health and reflection descriptor sets decode");
        }
        pool
    })
}

/// The reflection services of one listener. Cheap to clone.
#[derive(Clone)]
pub struct ReflectionService {
    inner: Arc<Inner>,
}

struct Inner {
    /// What ListServices answers, in order.
    services: Vec<String>,
    closer: Closer,
}

impl ReflectionService {
    /// Lists `services` (those of the listener, local ones included);
    /// `closer` ends the open streams on shutdown.
    pub fn new<S: Into<String>>(
        services: impl IntoIterator<Item = S>,
        closer: Closer,
    ) -> ReflectionService {
        let services: BTreeSet<String> = services.into_iter().map(Into::into).collect();
        ReflectionService {
            inner: Arc::new(Inner {
                services: services.into_iter().collect(),
                closer,
            }),
        }
    }

    /// The `grpc.reflection.v1` server.
    pub fn v1_server(&self) -> ServerReflectionServer<ReflectionService> {
        ServerReflectionServer::new(self.clone())
    }

    /// The `grpc.reflection.v1alpha` server.
    pub fn v1alpha_server(
        &self,
    ) -> v1alpha::server_reflection_server::ServerReflectionServer<ReflectionService> {
        v1alpha::server_reflection_server::ServerReflectionServer::new(self.clone())
    }

    fn session(&self) -> Session {
        Session {
            services: self.inner.clone(),
            sent: BTreeSet::new(),
        }
    }
}

/// One reflection stream: the files it has sent so far.
struct Session {
    services: Arc<Inner>,
    sent: BTreeSet<String>,
}

impl Session {
    /// The answer to one question.
    fn answer(&mut self, request: ServerReflectionRequest) -> ServerReflectionResponse {
        let pool = descriptors();
        let answer = match &request.message_request {
            None => Err(error(Code::InvalidArgument, "the request asks nothing")),
            Some(MessageRequest::ListServices(_)) => {
                Ok(MessageResponse::ListServicesResponse(ListServiceResponse {
                    service: (self.services.services.iter())
                        .map(|name| ServiceResponse { name: name.clone() })
                        .collect(),
                }))
            }
            Some(MessageRequest::FileByFilename(name)) => pool
                .get_file_by_name(name)
                .map(|file| self.files(file))
                .ok_or_else(|| not_found(format!("no file {}", quoted(name)))),
            Some(MessageRequest::FileContainingSymbol(symbol)) => file_of_symbol(pool, symbol)
                .map(|file| self.files(file))
                .ok_or_else(|| not_found(format!("no symbol {}", quoted(symbol)))),
            Some(MessageRequest::FileContainingExtension(ExtensionRequest {
                containing_type,
                extension_number,
            })) => pool
                .get_message_by_name(containing_type)
                .zip(u32::try_from(*extension_number).ok())
                .and_then(|(message, number)| message.get_extension(number))
                .map(|extension| self.files(extension.parent_file()))
                .ok_or_else(|| {
                    not_found(format!(
                        "no extension {extension_number} of {}",
                        quoted(containing_type)
                    ))
                }),
            Some(MessageRequest::AllExtensionNumbersOfType(name)) => pool
                .get_message_by_name(name)
                .map(|message| {
                    let mut numbers: Vec<i32> = (message.extensions())
                        .filter_map(|e| i32::try_from(e.number()).ok())
                        .collect();
                    numbers.sort_unstable();
                    MessageResponse::AllExtensionNumbersResponse(ExtensionNumberResponse {
                        base_type_name: message.full_name().to_owned(),
                        extension_number: numbers,
                    })
                })
                .ok_or_else(|| not_found(format!("no message type {}", quoted(name)))),
        };
        ServerReflectionResponse {
            valid_host: request.host.clone(),
            message_response: Some(answer.unwrap_or_else(|e| e)),
            original_request: Some(request),
        }
    }

    /// `file` and its transitive dependencies not sent on this stream yet,
    /// `file` first.
    fn files(&mut self, file: FileDescriptor) -> MessageResponse {
        let mut encoded = vec![file.encode_to_vec()];
        self.sent.insert(file.name().to_owned());
        let mut queue: VecDeque<FileDescriptor> = file.dependencies().collect();
        while let Some(dependency) = queue.pop_front() {
            // A file sent earlier went out with its own dependencies.
            if self.sent.insert(dependency.name().to_owned()) {
                encoded.push(dependency.encode_to_vec());
                queue.extend(dependency.dependencies());
            }
        }
        MessageResponse::FileDescriptorResponse(FileDescriptorResponse {
            file_descriptor_proto: encoded,
        })
    }
}

fn error(code: Code, message: impl Into<String>) -> MessageResponse {
    MessageResponse::ErrorResponse(ErrorResponse {
        error_code: code.into(),
        error_message: message.into(),
    })
}

fn not_found(message: String) -> MessageResponse {
    error(Code::NotFound, message)
}

/// The file defining `symbol`: a fully qualified service, method, message,
/// field, oneof, enum, enum value or extension name (a leading dot is
/// allowed). Enum values are named beside their enum, as in .proto scoping
/// (`package.VALUE`), or inside it (`package.Enum.VALUE`).
fn file_of_symbol(pool: &DescriptorPool, symbol: &str) -> Option<FileDescriptor> {
    let name = symbol.strip_prefix('.').unwrap_or(symbol);
    if let Some(service) = pool.get_service_by_name(name) {
        return Some(service.parent_file());
    }
    if let Some(message) = pool.get_message_by_name(name) {
        return Some(message.parent_file());
    }
    if let Some(enumeration) = pool.get_enum_by_name(name) {
        return Some(enumeration.parent_file());
    }
    if let Some(extension) = pool.get_extension_by_name(name) {
        return Some(extension.parent_file());
    }
    let (scope, leaf) = name.rsplit_once('.').unwrap_or(("", name));
    if let Some(service) = pool.get_service_by_name(scope)
        && service.methods().any(|m| m.name() == leaf)
    {
        return Some(service.parent_file());
    }
    if let Some(message) = pool.get_message_by_name(scope)
        && (message.get_field_by_name(leaf).is_some() || message.oneofs().any(|o| o.name() == leaf))
    {
        return Some(message.parent_file());
    }
    if let Some(enumeration) = pool.get_enum_by_name(scope)
        && enumeration.get_value_by_name(leaf).is_some()
    {
        return Some(enumeration.parent_file());
    }
    pool.all_enums()
        .find(|e| {
            let enum_scope = e.full_name().rsplit_once('.').map_or("", |(s, _)| s);
            enum_scope == scope && e.get_value_by_name(leaf).is_some()
        })
        .map(|e| e.parent_file())
}

/// A message re-read as its wire-identical twin (v1alpha and v1 share
/// every field number and type).
fn transcode<A: Message, B: Message + Default>(message: &A) -> Result<B, Status> {
    B::decode(message.encode_to_vec().as_slice())
        .map_err(|e| Status::internal(format!("reflection message transcoding failed: {e}")))
}

#[tonic::async_trait]
impl ServerReflection for ReflectionService {
    type ServerReflectionInfoStream =
        Closable<BoxStream<'static, Result<ServerReflectionResponse, Status>>>;

    async fn server_reflection_info(
        &self,
        request: Request<Streaming<ServerReflectionRequest>>,
    ) -> Result<Response<Self::ServerReflectionInfoStream>, Status> {
        let mut session = self.session();
        let answers = (request.into_inner())
            .map(move |question| question.map(|q| session.answer(q)))
            .boxed();
        Ok(Response::new(self.inner.closer.wrap(answers)))
    }
}

#[tonic::async_trait]
impl v1alpha::server_reflection_server::ServerReflection for ReflectionService {
    type ServerReflectionInfoStream =
        Closable<BoxStream<'static, Result<v1alpha::ServerReflectionResponse, Status>>>;

    async fn server_reflection_info(
        &self,
        request: Request<Streaming<v1alpha::ServerReflectionRequest>>,
    ) -> Result<Response<Self::ServerReflectionInfoStream>, Status> {
        let mut session = self.session();
        let answers = (request.into_inner())
            .map(move |question| {
                let question: ServerReflectionRequest = transcode(&question?)?;
                transcode(&session.answer(question))
            })
            .boxed();
        Ok(Response::new(self.inner.closer.wrap(answers)))
    }
}
