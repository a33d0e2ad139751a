//! One blob streamed into containerd's content store: a `Content.Write`
//! stream under the import's lease, fed as the member's bytes arrive and
//! committed with the digest the validator computed at its end.
//!
//! The stream runs in a task of its own (containerd answers each request
//! in order, and its first answer, which carries the response headers,
//! comes only after the first request). The import talks to it through a
//! bounded channel, so a containerd slower than the client holds the
//! client back; the task's outcome comes back once the commit is answered.

use std::collections::HashMap;

use bytes::Bytes;
use futures::channel::{mpsc, oneshot};
use futures::{SinkExt, StreamExt};
use metropolis_archive::Digest;
use metropolis_proto::containerd::services::content::v1::{WriteAction, WriteContentRequest};
use metropolis_service::images::ImageStoreError;
use metropolis_transport::runtime::SharedRuntime;

use super::api::{Api, failed};

/// Requests queued for a write's stream, at most (each up to
/// [`MAX_DATA`]).
const QUEUED: usize = 4;
/// Most bytes of data in one request (containerd accepts 16 MiB messages
/// by default).
const MAX_DATA: usize = 1024 * 1024;

/// How a committed write ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Written {
    /// containerd stored the bytes under their digest.
    Committed,
    /// containerd already had a blob of that digest (it keeps the old
    /// one, which the import must lease).
    Existed,
}

/// A write in progress.
pub(super) struct BlobWrite {
    requests: mpsc::Sender<WriteContentRequest>,
    outcome: oneshot::Receiver<Result<Written, ImageStoreError>>,
    offset: u64,
    /// The first request carries the ref.
    reference: Option<String>,
}

impl BlobWrite {
    /// Starts a write under `reference` (unique in the namespace) on
    /// `api`'s connection and lease.
    pub(super) fn start(runtime: &SharedRuntime, api: &Api, reference: String) -> BlobWrite {
        let (requests, queued) = mpsc::channel(QUEUED);
        let (done, outcome) = oneshot::channel();
        let api = api.clone();
        runtime.spawn(Box::pin(async move {
            let _ = done.send(run(api, queued).await);
        }));
        BlobWrite {
            requests,
            outcome,
            offset: 0,
            reference: Some(reference),
        }
    }

    /// Sends the next bytes.
    pub(super) async fn write(&mut self, data: Bytes) -> Result<(), ImageStoreError> {
        let mut data = data;
        while !data.is_empty() {
            let piece = data.split_to(data.len().min(MAX_DATA));
            let len = piece.len() as u64;
            let request = self.next(WriteAction::Write, piece);
            self.send(request).await?;
            self.offset += len;
        }
        Ok(())
    }

    /// Sends the commit: containerd checks the size and digest and stores
    /// the blob. Returns the write, whose [`outcome`](Self::outcome) says
    /// how it ended.
    pub(super) async fn commit(
        self,
        size: u64,
        digest: Digest,
        labels: HashMap<String, String>,
    ) -> Result<BlobWrite, ImageStoreError> {
        self.send_commit(Bytes::new(), size, digest, labels).await
    }

    /// Writes `data` whole and commits it in one request.
    pub(super) async fn put(
        self,
        data: Bytes,
        digest: Digest,
        labels: HashMap<String, String>,
    ) -> Result<Written, ImageStoreError> {
        let size = self.offset + data.len() as u64;
        self.send_commit(data, size, digest, labels)
            .await?
            .outcome()
            .await
    }

    /// The commit request, with the last `data`.
    async fn send_commit(
        mut self,
        data: Bytes,
        size: u64,
        digest: Digest,
        labels: HashMap<String, String>,
    ) -> Result<BlobWrite, ImageStoreError> {
        let mut request = self.next(WriteAction::Commit, data);
        request.total = i64::try_from(size).unwrap_or(i64::MAX);
        request.expected = digest.to_string();
        request.labels = labels;
        self.send(request).await?;
        Ok(self)
    }

    /// How the write ended (after [`commit`](Self::commit)).
    pub(super) async fn outcome(self) -> Result<Written, ImageStoreError> {
        drop(self.requests);
        self.outcome.await.unwrap_or_else(|_| {
            Err(ImageStoreError::Unavailable(
                "containerd write task ended without an outcome".to_owned(),
            ))
        })
    }

    fn next(&mut self, action: WriteAction, data: Bytes) -> WriteContentRequest {
        WriteContentRequest {
            action: action as i32,
            r#ref: self.reference.take().unwrap_or_default(),
            offset: i64::try_from(self.offset).unwrap_or(i64::MAX),
            data,
            ..Default::default()
        }
    }

    async fn send(&mut self, request: WriteContentRequest) -> Result<(), ImageStoreError> {
        if self.requests.send(request).await.is_ok() {
            return Ok(());
        }
        // The stream ended early: its task says why.
        match (&mut self.outcome).await {
            Ok(Err(e)) => Err(e),
            _ => Err(ImageStoreError::Unavailable(
                "containerd ended a content write early".to_owned(),
            )),
        }
    }
}

/// The stream: sends what is queued, reads one answer per request, and
/// ends with the commit's answer.
async fn run(
    api: Api,
    queued: mpsc::Receiver<WriteContentRequest>,
) -> Result<Written, ImageStoreError> {
    let response = match api.content().write(api.request(queued)).await {
        Ok(response) => response,
        Err(s) if s.code() == tonic::Code::AlreadyExists => return Ok(Written::Existed),
        Err(s) => return Err(failed("writing a blob", &s)),
    };
    let mut answers = response.into_inner();
    loop {
        match answers.next().await {
            Some(Ok(answer)) if answer.action == WriteAction::Commit as i32 => {
                return Ok(Written::Committed);
            }
            Some(Ok(_)) => {}
            Some(Err(s)) if s.code() == tonic::Code::AlreadyExists => return Ok(Written::Existed),
            Some(Err(s)) => return Err(failed("writing a blob", &s)),
            None => {
                return Err(ImageStoreError::Unavailable(
                    "containerd ended a content write before its commit".to_owned(),
                ));
            }
        }
    }
}
