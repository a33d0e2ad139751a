//! The runtime-agnostic gRPC service layer of the Metropolis control
//! plane: tonic service implementations over `metropolis-core`'s machines,
//! written against its [`ports`](metropolis_core::ports), a router that authorizes
//! every call from the descriptors' `authorization` options, the shared
//! watch cache, and the provisioning agent's driver ([`agent_driver`]).
//! It uses `futures`-level async only; a runtime crate serves
//! [`Router`] over its sockets and inserts each connection's
//! [`Identity`](metropolis_core::identity::Identity) into the request extensions.

/// Whether the simulator planted the canary `$name` on this thread:
/// always `false` without the `canary` feature, so production code asks
/// the same way whether or not it is compiled.
macro_rules! canary_planted {
    ($name:ident) => {{
        #[cfg(feature = "canary")]
        let planted = metropolis_core::canary::planted(metropolis_core::canary::Canary::$name);
        #[cfg(not(feature = "canary"))]
        let planted = false;
        planted
    }};
}
pub(crate) use canary_planted;

pub mod admission;
mod agent_callback;
pub mod agent_driver;
mod cas;
mod curator;
mod curator_http;
pub mod debug;
pub mod elected;
pub mod forward;
pub mod group_commit;
mod health;
pub mod images;
mod introspection;
pub mod maintenance;
pub mod metrics;
pub mod node;
mod reflection;
mod remote_addr;
mod routed_body;
mod router;
pub mod status;
mod unary;
mod watch_cache;

pub use admission::RequestLimits;
pub use agent_callback::{AgentCallbackHttp, MACHINES_PREFIX, ProvisioningService, machine_key};
pub use curator::{CuratorService, WatchTarget};
pub use curator_http::{CuratorHttp, WatchBody};
pub use group_commit::{GroupCommit, GroupCommitOptions};
pub use health::{HealthMonitor, HealthService, HealthWatch, Readiness};
pub use introspection::INTROSPECTION_SERVICES;
pub use reflection::ReflectionService;
pub use remote_addr::RemoteAddr;
pub use router::{GrpcService, Router};
pub use watch_cache::{WatchCache, WatchCacheOptions, WatchStream};

#[cfg(test)]
mod tests;
