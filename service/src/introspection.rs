//! Health checking and reflection on a [`Router`]: the services every
//! listener answers about itself, locally and for any caller.

use tonic::server::NamedService;
use tonic_health::pb::health_server::HealthServer;
use tonic_reflection::pb::v1::server_reflection_server::ServerReflectionServer;
use tonic_reflection::pb::v1alpha::server_reflection_server::ServerReflectionServer as V1alphaServer;

use super::Router;
use super::health::{HealthMonitor, HealthService};
use super::reflection::ReflectionService;

/// The proto names of the services [`Router::with_health_and_reflection`]
/// adds.
pub const INTROSPECTION_SERVICES: [&str; 3] = [
    <HealthServer<HealthService> as NamedService>::NAME,
    <ServerReflectionServer<ReflectionService> as NamedService>::NAME,
    <V1alphaServer<ReflectionService> as NamedService>::NAME,
];

impl Router {
    /// Adds `grpc.health.v1.Health` and server reflection (v1 and
    /// v1alpha) as [local services](Self::with_local_service). Health
    /// answers for `""` and every service added so far from `monitor`;
    /// reflection lists those services and the three added here. Call it
    /// last, once the router has all its services.
    pub fn with_health_and_reflection(self, monitor: &HealthMonitor) -> Router {
        let served: Vec<&'static str> = self.service_names().collect();
        let health = HealthService::new(monitor.clone(), served.clone(), INTROSPECTION_SERVICES);
        let listed = served.into_iter().chain(INTROSPECTION_SERVICES);
        let reflection = ReflectionService::new(listed, monitor.closer().clone());
        self.with_local_service(health.server())
            .with_local_service(reflection.v1_server())
            .with_local_service(reflection.v1alpha_server())
    }
}
