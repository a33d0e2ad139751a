//! The Curator and NodeManagement services over a [`KvStore`].

use std::sync::Arc;

use futures::future::Either;

use metropolis_proto::metropolis::node::core::curator::proto::private::{
    AddNodeRequest, AddNodeResponse, RemoveNodeRequest, RemoveNodeResponse, node_management_server,
};
use metropolis_proto::prelude::{common, curator, storage};
use prost::Message;
use tonic::{Request, Response, Status};

use super::cas::UpdateQueues;
use super::forward::LeaderTerm;
use super::watch_cache::{WatchCache, WatchStream};
use metropolis_core::curator::{NODE_RECORD_SCHEMA, decode_record, node_key, validate_status};
use metropolis_core::identity::{Identity, NodeId};
use metropolis_core::ports::{CertIssuer, KvStore, WallClock};
use metropolis_core::store::{KeyRange, Op, OpResult, Txn};

/// The Curator (`Watch`, `UpdateNodeStatus`) and the private
/// NodeManagement (`AddNode`, `RemoveNode`) services.
///
/// Authorization by permission is done by the [`Router`](super::Router);
/// this service checks what depends on the request (a node may update only
/// itself). Writes are compare-and-swap transactions on the node record's
/// revision, retried on conflict, so they stay correct across instances.
#[derive(Clone)]
pub struct CuratorService {
    store: Arc<dyn KvStore>,
    cache: WatchCache,
    issuer: Option<Arc<dyn CertIssuer>>,
    /// Status updates of one node queue behind each other.
    queues: UpdateQueues,
    /// Stamps `status.timestamp` of every accepted status update.
    clock: Arc<dyn WallClock>,
}

impl CuratorService {
    /// A curator over `store`, feeding `Watch` from `cache`. `issuer` is
    /// needed for `AddNode` (FailedPrecondition without it); `clock` gives
    /// the time stamped on each accepted status update.
    pub fn new(
        store: Arc<dyn KvStore>,
        cache: WatchCache,
        issuer: Option<Arc<dyn CertIssuer>>,
        clock: Arc<dyn WallClock>,
    ) -> Self {
        CuratorService {
            store,
            cache,
            issuer,
            queues: UpdateQueues::default(),
            clock,
        }
    }

    /// The watch cache feeding this service's streams.
    pub fn watch_cache(&self) -> &WatchCache {
        &self.cache
    }

    /// The Curator service, ready for the [`Router`](super::Router).
    pub fn curator_server(&self) -> super::curator_http::CuratorHttp {
        super::curator_http::CuratorHttp::new(self.clone())
    }

    /// The generated NodeManagement server for this service.
    pub fn management_server(&self) -> node_management_server::NodeManagementServer<Self> {
        node_management_server::NodeManagementServer::new(self.clone())
    }

    /// Creates the record of a node if it does not exist yet. Returns
    /// whether it was created.
    pub async fn register_node(
        &self,
        id: &NodeId,
        public_key: &[u8; 32],
        roles: common::NodeRoles,
        state: common::NodeState,
    ) -> Result<bool, Status> {
        let key = node_key(id);
        let record = storage::NodeRecord {
            schema_version: NODE_RECORD_SCHEMA,
            id: id.to_string(),
            public_key: bytes::Bytes::copy_from_slice(public_key),
            roles: Some(roles),
            status: None,
            state: state as i32,
        };
        let txn = Txn::create(key, record.encode_to_vec().into(), vec![]);
        Ok(self
            .store
            .txn(txn)
            .await
            .map_err(crate::status::store)?
            .succeeded)
    }
}

/// What a `Curator.Watch` follows, from a validated `WatchRequest`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchTarget {
    /// One node (`NodeInCluster`).
    Node(NodeId),
    /// Every node (`NodesInCluster`).
    AllNodes,
}

impl WatchTarget {
    /// Validates `request`: Unimplemented when `kind` is unset (as the
    /// reference answers: to an older server, a newer client's kind looks
    /// unset), InvalidArgument naming a node ID that is not one. Checked
    /// before anything is read for it.
    pub fn from_request(request: curator::WatchRequest) -> Result<WatchTarget, Status> {
        use curator::watch_request::Kind;
        match request.kind {
            None => Err(Status::unimplemented(
                "kind: unset or unknown to this curator; it serves node_in_cluster and nodes_in_cluster",
            )),
            Some(Kind::NodeInCluster(n)) => NodeId::parse(&n.node_id)
                .map(WatchTarget::Node)
                .map_err(|e| crate::status::curator::node_id("node_in_cluster.node_id", &e)),
            Some(Kind::NodesInCluster(_)) => Ok(WatchTarget::AllNodes),
        }
    }
}

impl CuratorService {
    /// Confirms that this instance still leads before it serves a read in
    /// an elected term: an empty transaction through the services' store,
    /// whose leader's fence is then the whole of it. A deposed leader that
    /// has not noticed yet (an operator deleted its election key; its
    /// observation of the election lags) learns it here and steps down,
    /// and the read ends Unavailable instead of serving what its cache
    /// holds. Passing it, the instance led when the store answered: every
    /// write acknowledged before the read began was made by this term's
    /// leader (the read-your-writes gate) or before the term (its fresh
    /// snapshot).
    pub async fn confirm_leadership(&self) -> Result<(), Status> {
        self.store
            .txn(Txn::default())
            .await
            .map(|_| ())
            .map_err(crate::status::store)
    }

    /// `Curator.Watch` for `caller`, routed in leadership term `term`:
    /// opens a stream of `target` on the shared watch cache (whose backlog
    /// then holds every write acknowledged before the term began). A
    /// node's stream lasts only while the node is a member of the cluster.
    pub fn open_watch(
        &self,
        caller: &Identity,
        term: LeaderTerm,
        target: WatchTarget,
    ) -> WatchStream {
        match target {
            WatchTarget::Node(id) => self.cache.watch_node_as(id.as_str(), caller, term),
            WatchTarget::AllNodes => self.cache.watch_nodes_as(caller, term),
        }
    }

    /// `Curator.UpdateNodeStatus` on behalf of `caller`: a node may update
    /// only itself, and only while it is a member (a node without a record
    /// was removed: Unauthenticated, as its certificate no longer counts).
    /// `status.timestamp` is set to the curator's time of acceptance (as
    /// the reference's later versions do), so every watcher compares
    /// times from one clock. The write is a compare-and-swap on the
    /// record's revision; on conflict the failed transaction returns the
    /// current record and the update is retried on it.
    ///
    /// The request is checked when called; the returned future owns only
    /// what the write needs (not the request, the caller or `self`). It is
    /// part of the boxed future of every call, whose size decides glibc's
    /// allocation path: above 1 KiB the box takes the large-chunk path,
    /// which consolidates the fast bins (`malloc_consolidate` was 1.5 to
    /// 3.5 % of the daemon's CPU under `metropolis-load update-tls`).
    /// `service/tests/call_size.rs` keeps the box below that.
    pub fn update_node_status(
        &self,
        caller: &Identity,
        request: curator::UpdateNodeStatusRequest,
    ) -> impl Future<Output = Result<(), Status>> + Send + use<> {
        match check_status_update(caller, request) {
            Ok((id, mut status)) => {
                status.timestamp = Some(timestamp(self.clock.now_unix_ms()));
                Either::Left(write_status(
                    self.store.clone(),
                    self.queues.clone(),
                    id,
                    status,
                ))
            }
            Err(status) => Either::Right(futures::future::ready(Err(status))),
        }
    }
}

/// `unix_ms` (milliseconds since the Unix epoch) as a protobuf timestamp.
fn timestamp(unix_ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: unix_ms.div_euclid(1000),
        // In 0..1_000_000_000: fits.
        nanos: i32::try_from(unix_ms.rem_euclid(1000) * 1_000_000).unwrap_or(0),
    }
}

/// Writes `status` into the record of node `id`.
async fn write_status(
    store: Arc<dyn KvStore>,
    queues: UpdateQueues,
    id: NodeId,
    status: common::NodeStatus,
) -> Result<(), Status> {
    let key = node_key(&id);
    let mut status = Some(status);
    let what = || format!("node {id}");
    let written = super::cas::update(store.as_ref(), &queues, key, what, |kv| {
        let mut record = decode_record(kv).map_err(|e| crate::status::curator::node_record(&e))?;
        // Moved into the record for encoding and back out for a retry
        // after a lost compare-and-swap, instead of cloned per attempt.
        record.status = status.take();
        let value = record.encode_to_vec().into();
        status = record.status.take();
        Ok((value, ()))
    })
    .await;
    // The caller is node `id` (checked before): no record, no member.
    written.map_err(|e| match e.code() {
        tonic::Code::NotFound => super::watch_cache::not_a_member(id.as_str()),
        _ => e,
    })
}

/// Checks an `UpdateNodeStatus` request from `caller`: the node it names
/// (which must be the caller) and the validated status.
fn check_status_update(
    caller: &Identity,
    request: curator::UpdateNodeStatusRequest,
) -> Result<(NodeId, common::NodeStatus), Status> {
    // As the reference: whatever `node_id` holds, a caller may update
    // only itself, so any other value (a malformed one too) is
    // PermissionDenied.
    let named = metropolis_core::quote::quoted(&request.node_id);
    let id = match caller {
        Identity::Node(me) if me.as_str() == request.node_id => me.clone(),
        Identity::Node(me) => {
            return Err(Status::permission_denied(format!(
                "node {me} cannot update the status of node {named}"
            )));
        }
        other => {
            return Err(Status::permission_denied(format!(
                "{other} is not a node; only node {named} may update its own status"
            )));
        }
    };
    let status =
        validate_status(request.status).map_err(|e| crate::status::curator::status_update(&e))?;
    Ok((id, status))
}

#[tonic::async_trait]
impl node_management_server::NodeManagement for CuratorService {
    async fn add_node(
        &self,
        request: Request<AddNodeRequest>,
    ) -> Result<Response<AddNodeResponse>, Status> {
        let req = request.into_inner();
        let key: [u8; 32] = req.public_key.as_ref().try_into().map_err(|_| {
            Status::invalid_argument(format!(
                "public_key: must be a 32-byte Ed25519 public key, got {} bytes",
                req.public_key.len()
            ))
        })?;
        let issuer = self.issuer.as_ref().ok_or_else(|| {
            Status::failed_precondition("this curator has no cluster CA key to issue certificates")
        })?;
        let id = NodeId::from_public_key(&key);
        let cert = issuer
            .issue_node_certificate(&key)
            .map_err(|e| crate::status::curator::cert_issue(&e))?;
        if !self
            .register_node(
                &id,
                &key,
                common::NodeRoles::default(),
                common::NodeState::Up,
            )
            .await?
        {
            return Err(Status::already_exists(format!("node {id} already exists")));
        }
        tracing::info!(node = %id, "node added");
        Ok(Response::new(AddNodeResponse {
            node_id: id.to_string(),
            certificate: cert.certificate_pem.into_bytes().into(),
            ca_certificate: cert.ca_pem.into_bytes().into(),
        }))
    }

    async fn remove_node(
        &self,
        request: Request<RemoveNodeRequest>,
    ) -> Result<Response<RemoveNodeResponse>, Status> {
        let req = request.into_inner();
        let id = NodeId::parse(&req.node_id)
            .map_err(|e| crate::status::curator::node_id("node_id", &e))?;
        let key = node_key(&id);
        let txn = Txn {
            success: vec![Op::Delete(KeyRange::Key(key))],
            ..Default::default()
        };
        let resp = self.store.txn(txn).await.map_err(crate::status::store)?;
        match resp.results.first() {
            Some(OpResult::Delete(deleted)) if !deleted.is_empty() => {
                tracing::info!(node = %id, "node removed");
                Ok(Response::new(RemoveNodeResponse {}))
            }
            _ => Err(Status::not_found(format!("node {id} not found"))),
        }
    }
}
