//! One import into containerd: each regular member streamed into the
//! content store as it arrives, under a lease of the import's own; at
//! commit, the references labelled and the image records created; the
//! lease deleted whatever the outcome.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use futures::future::BoxFuture;
use metropolis_archive::{Digest, ImportPlan, Output, SynthesizedBlob};
use metropolis_proto::containerd::types;
use metropolis_service::images::{ImageImport, ImageStoreError};

use super::Inner;
use super::api::Api;
use super::labels::gc_labels;
use super::write::{BlobWrite, Written};
use metropolis_archive::normalize_reference;

/// Committed writes whose answer is awaited, at most, before the next
/// member's bytes are taken (containerd syncs each blob at its commit;
/// the upload goes on meanwhile).
const COMMITS_IN_FLIGHT: usize = 4;

/// A member as containerd holds it.
#[derive(Clone, Copy, Debug)]
struct Stored {
    digest: Digest,
    size: u64,
    written: Written,
}

/// An import in progress (see the module docs).
pub(super) struct ContainerdImport {
    store: Arc<Inner>,
    /// The lease's id, also the prefix of the import's write refs.
    id: String,
    /// The connection under the lease, once the first member started.
    api: Option<Api>,
    /// The member being written.
    current: Option<(usize, BlobWrite)>,
    /// Members whose commit was sent, in order, with what the validator
    /// computed.
    committing: VecDeque<(usize, Digest, u64, BlobWrite)>,
    /// Members containerd has stored.
    stored: HashMap<usize, Stored>,
    /// Committed or aborted: nothing left for the drop to clean up.
    finished: bool,
}

impl ContainerdImport {
    pub(super) fn new(store: Arc<Inner>, id: String) -> ContainerdImport {
        ContainerdImport {
            store,
            id,
            api: None,
            current: None,
            committing: VecDeque::new(),
            stored: HashMap::new(),
            finished: false,
        }
    }

    /// The connection under the import's lease, creating both at the
    /// first call.
    async fn api(&mut self) -> Result<Api, ImageStoreError> {
        if let Some(api) = &self.api {
            return Ok(api.clone());
        }
        let api = self.store.connect().await?;
        self.store.remove_leftover_leases(&api).await?;
        api.create_lease(&self.id, &self.store.owner).await?;
        let api = api.under_lease(&self.id)?;
        self.api = Some(api.clone());
        Ok(api)
    }

    async fn on_output(&mut self, output: Output) -> Result<(), ImageStoreError> {
        match output {
            Output::MemberStart { index, .. } => {
                let api = self.api().await?;
                if self.current.is_some() {
                    return Err(internal(format!("member {index} started inside another")));
                }
                let reference = format!("{}-m{index}", self.id);
                self.current = Some((
                    index,
                    BlobWrite::start(&self.store.runtime, &api, reference),
                ));
            }
            Output::MemberData { index, data } => match &mut self.current {
                Some((current, write)) if *current == index => write.write(data).await?,
                _ => return Err(internal(format!("data of member {index}, not started"))),
            },
            Output::MemberEnd {
                index,
                sha256,
                size,
            } => {
                let Some((current, write)) = self.current.take() else {
                    return Err(internal(format!("end of member {index}, not started")));
                };
                if current != index {
                    return Err(internal(format!("end of member {index} inside {current}")));
                }
                let digest = Digest::from_sha256(sha256);
                let write = write.commit(size, digest, HashMap::new()).await?;
                self.committing.push_back((index, digest, size, write));
                while self.committing.len() > COMMITS_IN_FLIGHT {
                    self.settle_one().await?;
                }
            }
        }
        Ok(())
    }

    /// Waits for the oldest commit's answer.
    async fn settle_one(&mut self) -> Result<(), ImageStoreError> {
        if let Some((index, digest, size, write)) = self.committing.pop_front() {
            let written = write.outcome().await?;
            self.stored.insert(
                index,
                Stored {
                    digest,
                    size,
                    written,
                },
            );
        }
        Ok(())
    }

    /// The commit proper: every write settled, the names checked, the
    /// synthesized blobs written, the references labelled, the images
    /// created.
    async fn finish(&mut self, plan: &ImportPlan) -> Result<Vec<String>, ImageStoreError> {
        let images = crate::images::named_images(plan)?;
        if self.current.is_some() {
            return Err(internal("commit with a member still open".to_owned()));
        }
        while !self.committing.is_empty() {
            self.settle_one().await?;
        }
        let api = self.api().await?;
        let store = self.store.clone();
        let _guard = store.commit_lock.lock().await;
        let existing: Vec<String> = api
            .image_names()
            .await?
            .iter()
            .map(|n| normalize_reference(n).unwrap_or_else(|_| n.clone()))
            .collect();
        for (name, _) in &images {
            if existing.contains(name) {
                if !store.config.replace_tags {
                    return Err(ImageStoreError::AlreadyExists(name.clone()));
                }
                tracing::info!(name, "containerd store: replacing the existing image");
            }
        }
        for blob in &plan.blobs {
            let stored = self.stored.get(&blob.member).copied();
            let Some(stored) = stored.filter(|s| s.digest == blob.digest && s.size == blob.size)
            else {
                return Err(internal(format!(
                    "blob {} names member {}, which containerd does not hold",
                    blob.digest, blob.member
                )));
            };
            if stored.written == Written::Existed {
                api.lease_blob(&self.id, &blob.digest.to_string()).await?;
            }
            if let Some(children) = plan.children.get(&blob.digest) {
                api.set_labels(&blob.digest.to_string(), gc_labels(children))
                    .await?;
            }
        }
        for blob in &plan.synthesized {
            if plan.blob(&blob.digest).is_none() {
                self.put_synthesized(&api, plan, blob).await?;
            }
        }
        for (name, manifest) in &images {
            let target = types::Descriptor {
                media_type: manifest.media_type.clone(),
                digest: manifest.digest.to_string(),
                size: i64::try_from(manifest.size).unwrap_or(i64::MAX),
                annotations: HashMap::new(),
            };
            api.put_image(name, target).await?;
        }
        Ok(images.into_iter().map(|(name, _)| name).collect())
    }

    /// Writes a blob the validator made (a Docker archive's manifest),
    /// labelled with its references.
    async fn put_synthesized(
        &self,
        api: &Api,
        plan: &ImportPlan,
        blob: &SynthesizedBlob,
    ) -> Result<(), ImageStoreError> {
        let labels = plan
            .children
            .get(&blob.digest)
            .map(|c| gc_labels(c))
            .unwrap_or_default();
        let reference = format!("{}-{}", self.id, blob.digest.hex());
        let write = BlobWrite::start(&self.store.runtime, api, reference);
        let digest = blob.digest.to_string();
        if write
            .put(blob.data.clone(), blob.digest, labels.clone())
            .await?
            == Written::Existed
        {
            api.lease_blob(&self.id, &digest).await?;
            if !labels.is_empty() {
                api.set_labels(&digest, labels).await?;
            }
        }
        Ok(())
    }

    /// Ends every write and deletes the lease: what only the import held
    /// is collected (at once with `sync`).
    async fn release(mut self: Box<Self>, sync: bool) {
        self.finished = true;
        // Every stream ended first (an open one ends when its requests
        // do): containerd collects no write still in progress.
        if let Some((_, write)) = self.current.take() {
            let _ = write.outcome().await;
        }
        for (_, _, _, write) in self.committing.drain(..) {
            let _ = write.outcome().await;
        }
        if let Some(api) = self.api.take()
            && let Err(e) = api.delete_lease(&self.id, sync).await
        {
            tracing::warn!(lease = %self.id, error = %e, "containerd store: the import's lease stays until it expires");
        }
    }
}

impl ImageImport for ContainerdImport {
    fn member(&mut self, output: Output) -> BoxFuture<'_, Result<(), ImageStoreError>> {
        Box::pin(self.on_output(output))
    }

    fn commit(
        mut self: Box<Self>,
        plan: ImportPlan,
    ) -> BoxFuture<'static, Result<Vec<String>, ImageStoreError>> {
        // On a task of its own: a commit runs to its end even if the
        // caller goes away.
        let (done, outcome) = futures::channel::oneshot::channel();
        let runtime = self.store.runtime.clone();
        runtime.spawn(Box::pin(async move {
            let result = self.finish(&plan).await;
            // On success the images hold the blobs; on failure nothing
            // may stay behind.
            self.release(result.is_err()).await;
            let _ = done.send(result);
        }));
        Box::pin(async move {
            outcome.await.unwrap_or_else(|_| {
                Err(ImageStoreError::Unavailable(
                    "the containerd commit task ended without an outcome".to_owned(),
                ))
            })
        })
    }

    fn abort(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(self.release(true))
    }
}

impl Drop for ContainerdImport {
    fn drop(&mut self) {
        if self.finished || self.api.is_none() {
            return;
        }
        // Dropped mid-import (the call was cancelled): clean up on a task.
        let orphan = Box::new(ContainerdImport {
            store: self.store.clone(),
            id: std::mem::take(&mut self.id),
            api: self.api.take(),
            current: self.current.take(),
            committing: std::mem::take(&mut self.committing),
            stored: HashMap::new(),
            finished: false,
        });
        self.store.runtime.spawn(Box::pin(orphan.release(true)));
    }
}

fn internal(message: String) -> ImageStoreError {
    ImageStoreError::Unavailable(format!("containerd store: {message}"))
}
