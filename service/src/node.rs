//! The services of one node, assembled from ports: what `metropolisd`
//! serves on its curator and agent listeners, built once here so that the
//! daemon and the simulator run the same wiring.
//!
//! [`assemble`] takes the store as it is (the embedded store, etcd, or a
//! simulated one) and, for an instance of several, the
//! [`SharedLeadership`] its election driver feeds. It builds:
//!
//! - the writes path: over an elected store, concurrent updates of
//!   different records grouped ([`GroupCommit`]) below the leader's fence
//!   ([`FencedStore`]); then the watch cache's read-your-writes tracking;
//! - the watch cache over the store as is (reads need no fence);
//! - the Curator, MachineManagement and Maintenance services and this node's
//!   create-only registration (it needs no leadership: every instance
//!   registers itself once);
//! - AgentCallback on its own router; an elected instance also serves it
//!   on the curator router, where a follower's forwarded heartbeats
//!   arrive, and routes both routers through the leadership;
//! - health and reflection on both routers, health following `readiness`.
//!
//! What stays with the host: the listeners, TLS, the debug service (its
//! ports are the host's tracefs, image store and kubeconfig issuer).

use std::sync::Arc;
use std::time::Duration;

use metropolis_proto::prelude::common;

use super::elected::{FencedStore, SharedLeadership};
use super::forward::Routing;
use super::metrics::Metrics;
use super::{
    CuratorService, GroupCommit, GroupCommitOptions, HealthMonitor, ProvisioningService, Readiness,
    RequestLimits, Router, WatchCache, WatchCacheOptions,
};
use metropolis_core::identity::NodeId;
use metropolis_core::ports::{CertIssuer, KvStore, Spawner, StoreBackup, WallClock};

/// What a node's services reach the world through.
#[derive(Clone)]
pub struct NodePorts {
    /// The store, as it is: reads, watches and the registration go here.
    pub store: Arc<dyn KvStore>,
    /// The leadership of an instance of several (`None` over the embedded
    /// store, where the one instance always leads and nothing is fenced).
    pub leadership: Option<SharedLeadership>,
    /// Background tasks (the watch cache, group commit).
    pub spawner: Arc<dyn Spawner>,
    /// Issues node certificates (Curator's node registration path).
    pub issuer: Option<Arc<dyn CertIssuer>>,
    /// The wall clock of machine records (heartbeats, requests).
    pub wall_clock: Arc<dyn WallClock>,
    /// Whether the node can serve, for health checks.
    pub readiness: Arc<dyn Readiness>,
    /// Backups of the store for the Maintenance service (the embedded
    /// store's; None over etcd).
    pub backup: Option<Arc<dyn StoreBackup>>,
    /// Where the routers, the watch cache, the heartbeats and the
    /// leadership record what they do (None: nowhere).
    pub metrics: Option<Metrics>,
}

/// How a node's services are tuned.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// Grouping of fenced writes (elected instances only).
    pub group_commit: GroupCommitOptions,
    /// The watch cache.
    pub watch_cache: WatchCacheOptions,
    /// How long after its last heartbeat an agent counts as lost.
    pub agent_lost_after: Duration,
    /// The request limits of the curator router.
    pub curator_limits: RequestLimits,
    /// The request limits of the agent router.
    pub agent_limits: RequestLimits,
}

impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions {
            group_commit: GroupCommitOptions::default(),
            watch_cache: WatchCacheOptions::default(),
            agent_lost_after: Duration::from_secs(60),
            curator_limits: RequestLimits::default(),
            agent_limits: RequestLimits::default(),
        }
    }
}

/// A node's services, assembled ([`assemble`]).
pub struct NodeServiceSet {
    /// Curator, MachineManagement (and, elected, AgentCallback), health
    /// and reflection, behind the authorizing router.
    pub router: Router,
    /// AgentCallback, health and reflection.
    pub agent_router: Router,
    /// The shared watch cache (its streams end with it).
    pub cache: WatchCache,
    /// Health of every listener.
    pub health: HealthMonitor,
    /// Whether this start registered the node (it was not registered).
    pub registered: bool,
    /// The machines' service (for [`ProvisioningService::census`]).
    pub provisioning: ProvisioningService,
}

/// Assembles the services of node `node_id` (whose Ed25519 public key is
/// `node_key`) over `ports`, and registers the node if it is not yet.
/// Fails only if the registration does.
pub async fn assemble(
    ports: NodePorts,
    options: NodeOptions,
    node_id: &NodeId,
    node_key: &[u8; 32],
) -> Result<NodeServiceSet, tonic::Status> {
    let raw = ports.store;
    let metrics = ports.metrics;
    if let Some(metrics) = &metrics {
        match &ports.leadership {
            Some(leadership) => {
                let observer = metrics.clone();
                leadership.on_role_change(move |_, role| observer.record_role(role));
                metrics.record_role(&leadership.role());
            }
            None => metrics.record_role(&metropolis_core::leadership::Role::Sole),
        }
    }
    // The services' writes carry the leader's fence; reads do not.
    let (kv, routing): (Arc<dyn KvStore>, Option<Arc<dyn Routing>>) = match ports.leadership {
        None => (raw.clone(), None),
        Some(leadership) => {
            let grouped: Arc<dyn KvStore> = Arc::new(GroupCommit::new(
                raw.clone(),
                ports.spawner.as_ref(),
                options.group_commit,
            ));
            let fenced = Arc::new(FencedStore::new(grouped, leadership.clone()));
            (fenced, Some(Arc::new(leadership)))
        }
    };
    let mut cache = WatchCache::new(raw.clone(), ports.spawner, options.watch_cache);
    if let Some(metrics) = &metrics {
        cache = cache.with_metrics(metrics);
    }
    // Watches opened after a write see it (read your writes), even
    // though the cache follows the store asynchronously.
    let curator = CuratorService::new(
        cache.track_writes(kv.clone()),
        cache.clone(),
        ports.issuer,
        ports.wall_clock.clone(),
    );
    let roles = common::NodeRoles {
        consensus_member: Some(Default::default()),
        kubernetes_controller: Some(Default::default()),
        ..Default::default()
    };
    let registrar = CuratorService::new(raw, cache.clone(), None, ports.wall_clock.clone());
    let registered = registrar
        .register_node(node_id, node_key, roles, common::NodeState::Up)
        .await?;
    let mut provisioning = ProvisioningService::new(kv, ports.wall_clock, options.agent_lost_after);
    if let Some(metrics) = &metrics {
        provisioning = provisioning.with_metrics(metrics);
    }
    let mut router = Router::new()
        .with_limits(options.curator_limits)
        .with_service(curator.curator_server())
        .with_service(curator.management_server())
        .with_service(provisioning.machine_management_server())
        .with_service(super::maintenance::MaintenanceService::new(ports.backup).server());
    let mut agent_router = Router::new()
        .with_limits(options.agent_limits)
        .with_service(provisioning.agent_callback_server());
    if let Some(routing) = routing {
        // A follower forwards agents' heartbeats to the leader's curator
        // port, where only a forwarded call can carry an agent identity.
        router = router
            .with_service(provisioning.agent_callback_server())
            .with_routing(routing.clone());
        agent_router = agent_router.with_routing(routing);
    }
    if let Some(metrics) = metrics {
        router = router.with_metrics(metrics.clone());
        agent_router = agent_router.with_metrics(metrics);
    }
    let health = HealthMonitor::new();
    let curator_health = health.clone().with_condition(ports.readiness);
    Ok(NodeServiceSet {
        router: router.with_health_and_reflection(&curator_health),
        agent_router: agent_router.with_health_and_reflection(&curator_health),
        cache,
        health,
        registered,
        provisioning,
    })
}
