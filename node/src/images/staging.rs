//! Staging an import on its own thread: every regular member of the
//! archive goes to a file of a staging directory; at commit, the store's
//! [`Committer`] runs on the same thread, and the staging directory is
//! removed whatever happens.
//!
//! The async side ([`StagedImport`]) talks to the thread through a bounded
//! `futures` channel, so a disk slower than the client holds the client
//! back and no blocking call runs on the caller's executor.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures::channel::{mpsc, oneshot};
use futures::future::BoxFuture;
use futures::{FutureExt, SinkExt, StreamExt};
use metropolis_archive::{BlobSource, Digest, ImportPlan, Output};
use metropolis_service::images::{ImageImport, ImageStoreError};

use super::writeback::Writeback;

/// Prefix of staging directory names (what [`remove_leftovers`] removes).
pub(crate) const STAGING_PREFIX: &str = ".staging-";

/// Messages in flight to the thread, at most.
const CHANNEL_CAPACITY: usize = 16;

/// What a store does at commit, on the import's thread (blocking IO is
/// fine there). Staged files not moved away are removed afterwards.
pub(crate) trait Committer: Send + 'static {
    /// Makes the plan's images visible, all or none; returns their names.
    fn commit(
        self: Box<Self>,
        staged: &Staged,
        plan: &ImportPlan,
    ) -> Result<Vec<String>, ImageStoreError>;

    /// Whether staged members are written back to disk as they arrive
    /// ([`Writeback`]): for a store that keeps the staged files as its
    /// blobs. A store that copies them elsewhere at commit and then drops
    /// them says no, so their bytes need not reach the disk at all.
    fn writes_back(&self) -> bool {
        true
    }
}

/// A staged regular member.
struct Member {
    file: PathBuf,
    /// sha256 and size as the validator reported them at the member's end;
    /// `None` until then.
    end: Option<([u8; 32], u64)>,
}

/// The members staged so far, by the validator's member index.
pub(crate) struct Staged {
    dir: PathBuf,
    members: HashMap<usize, Member>,
    /// The member being written: its index, file, bytes written and
    /// writeback.
    current: Option<(usize, File, u64, Writeback)>,
    /// Whether members are written back as they arrive.
    writes_back: bool,
}

impl Staged {
    /// The staging directory (same filesystem as the store for the OCI
    /// layout store, so blobs can be renamed into place).
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The staged file holding `blob`'s bytes, checked against the digest
    /// and size the validator computed for the member.
    pub(crate) fn blob_file(&self, blob: &BlobSource) -> Result<&Path, ImageStoreError> {
        let member = self.members.get(&blob.member).ok_or_else(|| {
            internal(format!(
                "blob {} names member {}, not staged",
                blob.digest, blob.member
            ))
        })?;
        match member.end {
            Some((sha256, size))
                if Digest::from_sha256(sha256) == blob.digest && size == blob.size => {}
            _ => {
                return Err(internal(format!(
                    "staged member {} does not hold blob {} ({} bytes)",
                    blob.member, blob.digest, blob.size
                )));
            }
        }
        Ok(&member.file)
    }

    fn on_output(&mut self, output: Output) -> Result<(), ImageStoreError> {
        match output {
            Output::MemberStart { index, .. } => {
                if self.current.is_some() || self.members.contains_key(&index) {
                    return Err(internal(format!("member {index} started out of order")));
                }
                let path = self.dir.join(format!("m{index}"));
                let file = File::create_new(&path)
                    .map_err(|e| unavailable(&path, "create staging file", &e))?;
                self.members.insert(
                    index,
                    Member {
                        file: path,
                        end: None,
                    },
                );
                self.current = Some((index, file, 0, Writeback::default()));
            }
            Output::MemberData { index, data } => match &mut self.current {
                Some((current, file, written, writeback)) if *current == index => {
                    file.write_all(&data).map_err(|e| {
                        unavailable(
                            &self.dir.join(format!("m{index}")),
                            "write staging file",
                            &e,
                        )
                    })?;
                    *written += data.len() as u64;
                    // Write back as we go, so the commit's fsync of a
                    // large blob does not start the whole writeback only
                    // then (receiving overlaps with the disk instead).
                    if self.writes_back {
                        writeback.after_write(file, *written).map_err(|e| {
                            unavailable(
                                &self.dir.join(format!("m{index}")),
                                "start writeback of staging file",
                                &e,
                            )
                        })?;
                    }
                }
                _ => return Err(internal(format!("data for member {index} out of order"))),
            },
            Output::MemberEnd {
                index,
                sha256,
                size,
            } => match self.current.take() {
                Some((current, _file, written, _)) if current == index && written == size => {
                    if let Some(member) = self.members.get_mut(&index) {
                        member.end = Some((sha256, size));
                    }
                }
                _ => return Err(internal(format!("end of member {index} out of order"))),
            },
        }
        Ok(())
    }
}

/// An [`ImageStoreError::Unavailable`] naming the path and the operation.
pub(crate) fn unavailable(path: &Path, what: &str, e: &io::Error) -> ImageStoreError {
    ImageStoreError::Unavailable(format!("{what} {}: {e}", path.display()))
}

fn internal(what: String) -> ImageStoreError {
    ImageStoreError::Unavailable(format!("internal error while staging: {what}"))
}

enum Msg {
    Output(Output),
    Commit(
        ImportPlan,
        oneshot::Sender<Result<Vec<String>, ImageStoreError>>,
    ),
    Abort(oneshot::Sender<()>),
}

/// Why the thread stopped early, for the async side to report.
type Failure = Arc<Mutex<Option<ImageStoreError>>>;

/// Starts an import staging into a new directory under `parent`, with its
/// own thread named `name`.
pub(crate) fn start(
    parent: &Path,
    name: &str,
    committer: Box<dyn Committer>,
) -> Result<Box<dyn ImageImport>, ImageStoreError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let unique = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = parent.join(format!("{STAGING_PREFIX}{}-{unique}", std::process::id()));
    let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
    let failure = Failure::default();
    let thread_failure = failure.clone();
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || run(dir, committer, rx, &thread_failure))
        .map_err(|e| {
            ImageStoreError::Unavailable(format!("cannot start the import thread: {e}"))
        })?;
    Ok(Box::new(StagedImport { tx, failure }))
}

/// The thread: stage, then commit or abort, then remove the staging
/// directory; only then drop the receiver, so a sender that sees the
/// channel closed knows the cleanup is done.
fn run(
    dir: PathBuf,
    committer: Box<dyn Committer>,
    mut rx: mpsc::Receiver<Msg>,
    failure: &Failure,
) {
    // Also on a panic (a bug): dropped before `rx`, so before the senders
    // see the channel closed.
    let _cleanup = RemoveOnDrop(dir.clone());
    let mut staged = Staged {
        dir,
        members: HashMap::new(),
        current: None,
        writes_back: committer.writes_back(),
    };
    let outcome = match std::fs::create_dir(&staged.dir) {
        Ok(()) => stage(&mut staged, committer, &mut rx),
        Err(e) => Outcome::Failed(unavailable(&staged.dir, "create staging directory", &e)),
    };
    staged.current = None;
    remove_dir(&staged.dir);
    match outcome {
        Outcome::Committed(result, reply) => {
            let _ = reply.send(result);
        }
        Outcome::Aborted(reply) => {
            let _ = reply.send(());
        }
        Outcome::Failed(e) => {
            *failure.lock().unwrap_or_else(PoisonError::into_inner) = Some(e);
        }
        Outcome::Dropped => {
            tracing::debug!("image import dropped before its commit; staging removed")
        }
    }
    drop(rx);
}

enum Outcome {
    Committed(
        Result<Vec<String>, ImageStoreError>,
        oneshot::Sender<Result<Vec<String>, ImageStoreError>>,
    ),
    Aborted(oneshot::Sender<()>),
    Failed(ImageStoreError),
    Dropped,
}

fn stage(
    staged: &mut Staged,
    committer: Box<dyn Committer>,
    rx: &mut mpsc::Receiver<Msg>,
) -> Outcome {
    while let Some(msg) = futures::executor::block_on(rx.next()) {
        match msg {
            Msg::Output(output) => {
                if let Err(e) = staged.on_output(output) {
                    return Outcome::Failed(e);
                }
            }
            Msg::Commit(plan, reply) => {
                staged.current = None;
                let result = committer.commit(staged, &plan);
                return Outcome::Committed(result, reply);
            }
            Msg::Abort(reply) => return Outcome::Aborted(reply),
        }
    }
    Outcome::Dropped
}

/// Removes a staging directory when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        remove_dir(&self.0);
    }
}

/// Removes a staging directory and everything in it; failures are logged
/// (the next open of the store removes leftovers).
pub(crate) fn remove_dir(dir: &Path) {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!("cannot remove staging directory {}: {e}", dir.display()),
    }
}

/// Removes `.staging-*` directories left in `dir` by a crash; returns how
/// many. Only for a directory no live import of this or another process
/// uses (the stores hold a lock while open).
pub(crate) fn remove_leftovers(dir: &Path) -> io::Result<usize> {
    let mut removed = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with(STAGING_PREFIX)
        {
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                std::fs::remove_dir_all(&path)?;
            } else {
                std::fs::remove_file(&path)?;
            }
            removed += 1;
        }
    }
    Ok(removed)
}

/// The async half: sends outputs and the commit to the thread.
struct StagedImport {
    tx: mpsc::Sender<Msg>,
    failure: Failure,
}

fn failure_of(failure: &Failure) -> ImageStoreError {
    failure
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
        .unwrap_or_else(|| ImageStoreError::Unavailable("the import thread stopped".to_owned()))
}

impl ImageImport for StagedImport {
    fn member(&mut self, output: Output) -> BoxFuture<'_, Result<(), ImageStoreError>> {
        async move {
            self.tx
                .send(Msg::Output(output))
                .await
                .map_err(|_| failure_of(&self.failure))
        }
        .boxed()
    }

    fn commit(
        self: Box<Self>,
        plan: ImportPlan,
    ) -> BoxFuture<'static, Result<Vec<String>, ImageStoreError>> {
        let StagedImport { mut tx, failure } = *self;
        async move {
            let (reply, result) = oneshot::channel();
            if tx.send(Msg::Commit(plan, reply)).await.is_err() {
                return Err(failure_of(&failure));
            }
            result.await.unwrap_or_else(|_| Err(failure_of(&failure)))
        }
        .boxed()
    }

    fn abort(self: Box<Self>) -> BoxFuture<'static, ()> {
        let StagedImport { mut tx, .. } = *self;
        async move {
            let (reply, done) = oneshot::channel();
            if tx.send(Msg::Abort(reply)).await.is_ok() {
                // Resolves once the thread removed the staging directory
                // (or died, after removing it).
                let _ = done.await;
            }
        }
        .boxed()
    }
}
