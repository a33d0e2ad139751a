//! The image-store half of `NodeDebugService.LoadImage`: the
//! [`ImageStore`] port that a node's image store implements, and the
//! [`load_image`] driver that streams an archive through the
//! [`ArchiveValidator`](metropolis_archive::ArchiveValidator) into a store.
//!
//! The driver owns the protocol (what is fed where, when to commit, how
//! errors map to gRPC codes: [`status::debug`](crate::status::debug)); a
//! store owns the bytes (staging on disk, committing atomically, throwing
//! staged bytes away). Stores live in the
//! host crate (an on-disk OCI image layout, containerd); this module has
//! no IO and names no runtime, only `futures`.
//!
//! # The import protocol
//!
//! 1. [`ImageStore::begin`] starts an [`ImageImport`].
//! 2. For each chunk the client sends, in order: the chunk goes to the
//!    validator, then to [`ImageImport::archive_data`], then every
//!    [`Output`] the validator produced for it goes to
//!    [`ImageImport::member`]. Each call returns a future; the driver
//!    awaits it before the next call, so a store that writes slower than
//!    the client sends holds the client back (backpressure).
//! 3. When the stream ends and the validator accepts the archive as a
//!    whole, [`ImageImport::commit`] receives the [`ImportPlan`]: which
//!    staged members are blobs, the synthesized blobs, the images.
//! 4. On any error before the commit, the driver calls
//!    [`ImageImport::abort`] and waits for it; if the driver itself is
//!    dropped (the RPC is cancelled), the import is dropped, which aborts
//!    it too.

mod driver;
#[cfg(test)]
mod tests;

use std::fmt;

use futures::future::BoxFuture;

use metropolis_archive::{ImportPlan, Output};

pub use driver::load_image;

/// Why an image store refused or failed an import.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ImageStoreError {
    /// An image with this name already exists and the store is not
    /// configured to replace tags (gRPC AlreadyExists). The existing image
    /// is untouched.
    AlreadyExists(String),
    /// The store cannot take the import now: a disk error, the store's
    /// backend (containerd) unreachable or failing (gRPC Unavailable). The
    /// reason is for the client.
    Unavailable(String),
    /// The archive is valid but this store cannot hold what it carries,
    /// e.g. an image without a name where the store needs one (gRPC
    /// InvalidArgument).
    Invalid(String),
}

impl fmt::Display for ImageStoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImageStoreError::AlreadyExists(name) => write!(
                f,
                "image {name} already exists, and this node does not replace existing tags"
            ),
            ImageStoreError::Unavailable(reason) => write!(f, "image store unavailable: {reason}"),
            ImageStoreError::Invalid(reason) => write!(f, "image store cannot import: {reason}"),
        }
    }
}

impl std::error::Error for ImageStoreError {}

/// An image a store holds, as [`ImageStore::list`] gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedImage {
    /// Its name, normalised (`docker.io/library/busybox:latest`); empty
    /// for an entry another tool wrote without one.
    pub name: String,
    /// The digest of its manifest or index, `sha256:<hex>`.
    pub digest: String,
    /// The media type of that manifest or index.
    pub media_type: String,
    /// The size of that manifest or index in bytes.
    pub size: u64,
}

/// A node's image store: where `LoadImage` puts images.
///
/// Implementations: the host crate's on-disk OCI image layout (the
/// embedded default) and containerd. See the [module docs](self) for the
/// protocol.
pub trait ImageStore: Send + Sync + 'static {
    /// Starts an import. Cheap and non-blocking (a store that needs disk
    /// or a backend for it does that work on its own thread and reports
    /// failures from the import's futures).
    fn begin(&self) -> Result<Box<dyn ImageImport>, ImageStoreError>;

    /// The images the store holds, in any order (the service sorts them).
    /// Non-blocking, as [`begin`](Self::begin). The default, for a store
    /// that cannot list, is Unavailable.
    fn list(&self) -> BoxFuture<'static, Result<Vec<ListedImage>, ImageStoreError>> {
        Box::pin(futures::future::ready(Err(ImageStoreError::Unavailable(
            "this image store cannot list its images".to_owned(),
        ))))
    }

    /// Which store this is, for people: `OCI image layout <dir>`,
    /// `containerd <socket>, namespace <ns>`.
    fn describe(&self) -> String {
        "image store".to_owned()
    }
}

/// One import in progress: staged bytes that become images only at
/// [`commit`](Self::commit).
///
/// # Abort
///
/// An import that is dropped, or [`abort`](Self::abort)ed, before its
/// commit completes must leave nothing behind in the store: no staged
/// files, no blobs, no image records. Dropping cannot wait, so a store
/// may finish that cleanup shortly after the drop (on its own thread);
/// `abort` resolves only once it is done. Whatever a crash leaves behind
/// is the store's to remove when it is next opened.
///
/// A commit, once called, runs to completion even if its future is
/// dropped (a half-done commit is what the store must never show); only
/// its result is lost then.
///
/// Every method's future is awaited before the next method is called.
pub trait ImageImport: Send {
    /// The next chunk of the raw archive, exactly as the client sent it,
    /// before the [`Output`]s the validator produced from it. For stores
    /// that need the tarball itself; the default ignores it.
    fn archive_data(&mut self, chunk: bytes::Bytes) -> BoxFuture<'_, Result<(), ImageStoreError>> {
        let _ = chunk;
        Box::pin(futures::future::ready(Ok(())))
    }

    /// The next output of the validator: members start, carry data and
    /// end in archive order. The store stages each regular member (which
    /// of them are blobs is known only at commit).
    fn member(&mut self, output: Output) -> BoxFuture<'_, Result<(), ImageStoreError>>;

    /// Makes the plan's images visible in the store, all of them or none,
    /// and returns their names. Blobs come from the staged members the
    /// plan names (`BlobSource::member`) and from
    /// `ImportPlan::synthesized`; staged members no blob names are
    /// discarded. Staged bytes are gone when the future resolves, whatever
    /// its outcome.
    fn commit(
        self: Box<Self>,
        plan: ImportPlan,
    ) -> BoxFuture<'static, Result<Vec<String>, ImageStoreError>>;

    /// Discards the import, and resolves once what it staged is gone. The
    /// default drops it (for stores whose drop cleans up synchronously).
    fn abort(self: Box<Self>) -> BoxFuture<'static, ()> {
        drop(self);
        Box::pin(futures::future::ready(()))
    }
}
