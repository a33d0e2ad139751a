//! The boxed future of each hot unary call stays within glibc's per-thread
//! cache (requests up to 1,024 bytes). A larger box takes the allocator's
//! slow path, which consolidates its fast bins: `malloc_consolidate` was
//! 1.5 to 3 % of the daemon's CPU under `metropolis-load update-tls` while
//! the `UpdateNodeStatus` box was 1,424 bytes (and 2,080 for `Heartbeat`).

use std::sync::Arc;
use std::time::Duration;

use http::Request;
use metropolis_core::ports::KvStore;
use metropolis_service::{
    CuratorService, GrpcService, ProvisioningService, WatchCache, WatchCacheOptions,
};
use metropolis_testkit::clock::ManualClock;
use metropolis_testkit::exec::Tasks;
use metropolis_testkit::store::MemKv;
use tonic::body::Body;

/// glibc's largest per-thread-cache request size on 64-bit.
const TCACHE_MAX: usize = 1024;

fn boxed_size(service: &dyn GrpcService, path: &'static str) -> usize {
    let request = Request::builder()
        .uri(path)
        .body(Body::empty())
        .expect("a valid request");
    let future = service.call(request);
    std::mem::size_of_val(&*future)
}

#[test]
fn update_node_status_fits_the_allocators_thread_cache() {
    let store: Arc<dyn KvStore> = Arc::new(MemKv::new());
    let cache = WatchCache::new(
        store.clone(),
        Arc::new(Tasks::new()),
        WatchCacheOptions::default(),
    );
    let curator =
        CuratorService::new(store, cache, None, Arc::new(ManualClock::new())).curator_server();
    let size = boxed_size(
        &curator,
        "/metropolis.node.core.curator.proto.api.Curator/UpdateNodeStatus",
    );
    assert!(size <= TCACHE_MAX, "UpdateNodeStatus future: {size} bytes");
}

#[test]
fn heartbeat_fits_the_allocators_thread_cache() {
    let service = ProvisioningService::new(
        Arc::new(MemKv::new()),
        Arc::new(ManualClock::new()),
        Duration::ZERO,
    );
    let agent = service.agent_callback_server();
    let size = boxed_size(&agent, "/cloud.bmaas.server.api.AgentCallback/Heartbeat");
    assert!(size <= TCACHE_MAX, "Heartbeat future: {size} bytes");
}
