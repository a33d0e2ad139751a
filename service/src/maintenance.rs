//! The Maintenance service (project-private, owner-only): `Snapshot`
//! streams a backup of the embedded store ([`StoreBackup`]) in chunks, as
//! `etcdctl snapshot save` reads one from etcd. A curator over etcd has
//! no backup of its own to give: FailedPrecondition, naming etcdctl.

use std::sync::Arc;

use bytes::Bytes;
use futures::stream::BoxStream;
use metropolis_proto::metropolis::node::core::curator::proto::private::{
    SnapshotChunk, SnapshotRequest, maintenance_server,
};
use tonic::{Request, Response, Status};

use metropolis_core::ports::StoreBackup;

/// The bytes of one [`SnapshotChunk`].
pub const CHUNK_BYTES: usize = 1 << 20;

/// The Maintenance service over the store's backups, if it has them.
#[derive(Clone)]
pub struct MaintenanceService {
    backup: Option<Arc<dyn StoreBackup>>,
}

impl MaintenanceService {
    /// The service over `backup` (None: a store without backups, etcd).
    pub fn new(backup: Option<Arc<dyn StoreBackup>>) -> MaintenanceService {
        MaintenanceService { backup }
    }

    /// The generated server of this service.
    pub fn server(&self) -> maintenance_server::MaintenanceServer<Self> {
        maintenance_server::MaintenanceServer::new(self.clone())
    }
}

/// `bytes` as chunks of [`CHUNK_BYTES`], the first carrying the total
/// length and `revision` (one empty chunk for no bytes).
pub fn chunks(bytes: Bytes, revision: i64) -> Vec<SnapshotChunk> {
    let total = bytes.len() as u64;
    let mut out: Vec<SnapshotChunk> = (0..bytes.len().div_ceil(CHUNK_BYTES).max(1))
        .map(|i| SnapshotChunk {
            data: bytes.slice(
                (i * CHUNK_BYTES).min(bytes.len())..((i + 1) * CHUNK_BYTES).min(bytes.len()),
            ),
            total_bytes: 0,
            revision: 0,
        })
        .collect();
    out[0].total_bytes = total;
    out[0].revision = revision;
    out
}

#[tonic::async_trait]
impl maintenance_server::Maintenance for MaintenanceService {
    type SnapshotStream = BoxStream<'static, Result<SnapshotChunk, Status>>;

    async fn snapshot(
        &self,
        _request: Request<SnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        let Some(backup) = &self.backup else {
            return Err(Status::failed_precondition(
                "this curator runs over etcd, whose data it does not hold: back etcd up with \
                 `etcdctl snapshot save`",
            ));
        };
        let (bytes, revision) = backup.backup().await.map_err(crate::status::store)?;
        let chunks = chunks(Bytes::from(bytes), revision);
        Ok(Response::new(Box::pin(futures::stream::iter(
            chunks.into_iter().map(Ok),
        ))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_bytes_once() {
        for len in [0, 1, CHUNK_BYTES, CHUNK_BYTES + 1, 3 * CHUNK_BYTES - 1] {
            let bytes: Bytes = (0..len).map(|i| i as u8).collect::<Vec<u8>>().into();
            let out = chunks(bytes.clone(), 7);
            assert_eq!(out[0].total_bytes, len as u64);
            assert_eq!(out[0].revision, 7);
            assert!(
                out[1..]
                    .iter()
                    .all(|c| c.total_bytes == 0 && !c.data.is_empty())
            );
            let joined: Vec<u8> = out.iter().flat_map(|c| c.data.to_vec()).collect();
            assert_eq!(joined, bytes.to_vec(), "{len}");
        }
    }
}
