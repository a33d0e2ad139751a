//! The `LoadImage` driver: client chunks -> validator -> image store.

use bytes::Bytes;
use futures::{Stream, StreamExt};
use tonic::Status;

use super::{ImageImport, ImageStore, ImageStoreError};
use crate::status::debug as status;
use metropolis_archive::{ArchiveError, ArchiveLimits, ArchiveValidator};

/// Why an import did not complete, before it becomes a status.
enum Failure {
    /// The client's stream failed (cancelled, disconnected, bad message).
    Client(Status),
    /// The archive is invalid or over a limit.
    Archive(ArchiveError),
    /// The store refused or failed.
    Store(ImageStoreError),
}

impl Failure {
    fn into_status(self) -> Status {
        match self {
            Failure::Client(status) => status,
            Failure::Archive(e) => status::archive(&e),
            Failure::Store(e) => status::image_store(&e),
        }
    }
}

/// Imports the image archive streamed in `parts` (the raw bytes of an
/// uncompressed tarball, in chunks of any size) into `store`, validating
/// it on the way (see [`ArchiveValidator`] for what is checked and
/// `limits` for how much is accepted). Returns the names of the images
/// imported.
///
/// Errors, with nothing of the import left in the store:
/// - a bad archive: InvalidArgument, a limit passed: ResourceExhausted,
///   with the validator's reason
///   ([`archive_code`](crate::status::debug::archive_code));
/// - the store's errors as
///   [`image_store_code`](crate::status::debug::image_store_code) maps
///   them;
/// - an error item from `parts` (client gone, cancelled): that status.
///
/// Dropping the returned future drops the import, which aborts it.
///
/// The service maps `tonic::Streaming<ImagePart>` to the bytes of each
/// part. Logs the start, the outcome and the bytes received (the log
/// lines' own timestamps give the time taken: core reads no clock).
pub async fn load_image<S>(
    mut parts: S,
    store: &dyn ImageStore,
    limits: ArchiveLimits,
) -> Result<Vec<String>, Status>
where
    S: Stream<Item = Result<Bytes, Status>> + Unpin,
{
    tracing::info!("LoadImage: import started");
    let mut received = 0u64;
    let result = run(&mut parts, store, limits, &mut received).await;
    match result {
        Ok(names) => {
            tracing::info!(
                names = ?names,
                bytes = received,
                "LoadImage: imported {} image(s)",
                names.len()
            );
            Ok(names)
        }
        Err(failure) => {
            let what = match &failure {
                Failure::Client(_) => "client stream failed",
                Failure::Archive(_) => "archive rejected",
                Failure::Store(_) => "image store failed",
            };
            let status = failure.into_status();
            tracing::warn!(
                code = ?status.code(),
                bytes = received,
                "LoadImage: {what}, nothing imported: {}",
                status.message()
            );
            Err(status)
        }
    }
}

async fn run<S>(
    parts: &mut S,
    store: &dyn ImageStore,
    limits: ArchiveLimits,
    received: &mut u64,
) -> Result<Vec<String>, Failure>
where
    S: Stream<Item = Result<Bytes, Status>> + Unpin,
{
    let mut import = store.begin().map_err(Failure::Store)?;
    let mut validator = ArchiveValidator::new(limits);
    while let Some(part) = parts.next().await {
        let fed = match part {
            Ok(chunk) => {
                *received += chunk.len() as u64;
                feed(&mut validator, import.as_mut(), chunk).await
            }
            Err(status) => Err(Failure::Client(status)),
        };
        if let Err(failure) = fed {
            import.abort().await;
            return Err(failure);
        }
    }
    let plan = match validator.handle_eof() {
        Ok(plan) => plan,
        Err(e) => {
            import.abort().await;
            return Err(Failure::Archive(e));
        }
    };
    import.commit(plan).await.map_err(Failure::Store)
}

/// One chunk: to the validator, to the import as raw bytes, then the
/// validator's outputs to the import.
async fn feed(
    validator: &mut ArchiveValidator,
    import: &mut dyn ImageImport,
    chunk: Bytes,
) -> Result<(), Failure> {
    validator
        .handle_data(chunk.clone())
        .map_err(Failure::Archive)?;
    import.archive_data(chunk).await.map_err(Failure::Store)?;
    while let Some(output) = validator.poll_output() {
        import.member(output).await.map_err(Failure::Store)?;
    }
    Ok(())
}
