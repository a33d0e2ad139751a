//! The boxed future of each hot unary call stays within glibc's per-thread
//! cache (requests up to 1,024 bytes). A larger box takes the allocator's
//! slow path, which consolidates its fast bins: `malloc_consolidate` was
//! 1.5 to 3 % of the daemon's CPU under `metropolis-load update-tls` while
//! the `UpdateNodeStatus` box was 1,424 bytes (and 2,080 for `Heartbeat`).

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use http::Request;
use tonic::body::Body;

use super::{GrpcService, ProvisioningService, WatchCache, WatchCacheOptions};
use crate::ports::{KvStore, Spawner, WallClock, WatchBatch};
use crate::service::CuratorService;
use crate::store::{KeyRange, Revision, StoreError, Txn, TxnResponse};

/// glibc's largest per-thread-cache request size on 64-bit.
const TCACHE_MAX: usize = 1024;

struct NoStore;

impl KvStore for NoStore {
    fn txn(&self, _: Txn) -> BoxFuture<'static, Result<TxnResponse, StoreError>> {
        Box::pin(futures::future::ready(Err(StoreError::Unavailable(
            "none".into(),
        ))))
    }

    fn watch(
        &self,
        _: KeyRange,
        _: Revision,
    ) -> BoxStream<'static, Result<WatchBatch, StoreError>> {
        Box::pin(futures::stream::empty())
    }
}

struct NoTasks;

impl Spawner for NoTasks {
    fn spawn(&self, _: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>>) {}
}

struct Epoch;

impl WallClock for Epoch {
    fn now_unix_ms(&self) -> i64 {
        0
    }
}

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
    let store: Arc<dyn KvStore> = Arc::new(NoStore);
    let cache = WatchCache::new(
        store.clone(),
        Arc::new(NoTasks),
        WatchCacheOptions::default(),
    );
    let curator = CuratorService::new(store, cache, None).curator_server();
    let size = boxed_size(
        &curator,
        "/metropolis.node.core.curator.proto.api.Curator/UpdateNodeStatus",
    );
    assert!(size <= TCACHE_MAX, "UpdateNodeStatus future: {size} bytes");
}

#[test]
fn heartbeat_fits_the_allocators_thread_cache() {
    let service = ProvisioningService::new(Arc::new(NoStore), Arc::new(Epoch), Duration::ZERO);
    let agent = service.agent_callback_server();
    let size = boxed_size(&agent, "/cloud.bmaas.server.api.AgentCallback/Heartbeat");
    assert!(size <= TCACHE_MAX, "Heartbeat future: {size} bytes");
}
