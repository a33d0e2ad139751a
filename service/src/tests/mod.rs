//! Tests of the services every listener carries, through a
//! [`Router`](super::Router): `grpc.health.v1.Health` ([`health`]) and
//! server reflection ([`reflection`]), with [`grpc`] to drive the router
//! with encoded gRPC requests.

mod grpc;
mod health;
mod reflection;
