//! `metroctl snapshot save FILE` and `snapshot restore FILE`, with the
//! habits of `etcdctl snapshot`: an online, consistent backup of the
//! embedded store streamed from a running curator (owner-only), and an
//! offline restore into the store directory of an empty data directory.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use clap::Subcommand;
use futures::StreamExt;
use metropolis_proto::metropolis::node::core::curator::proto::private::{
    SnapshotRequest, maintenance_client::MaintenanceClient,
};
use metropolis_store::{StoreOptions, restore};
use metropolis_transport::grpc::Channel;

use super::exit::{Exit, failed, usage};
use super::output::Format;
use super::{CliError, status_error};

/// The largest backup `save` accepts, in bytes.
const MAX_BACKUP_BYTES: u64 = 8 << 30;

/// `metroctl snapshot …`
#[derive(Subcommand, Debug)]
pub enum SnapshotCommand {
    /// Save a consistent backup of the curator's embedded store to FILE
    /// (mode 0600, written to FILE.part and moved to FILE once complete;
    /// an existing FILE is refused before the call, never replaced), taken
    /// at its latest revision once everything before it is durable. Needs
    /// the owner: give --endpoints (the owner credential of --data-dir is
    /// used). A curator over etcd refuses: use `etcdctl snapshot save`.
    Save {
        /// Where to write the backup: a file that does not exist yet.
        file: PathBuf,
        /// Print one JSON object: the file, its bytes and the revision.
        #[arg(long)]
        json: bool,
    },
    /// Restore a backup into the store of --data-dir, which must hold no
    /// store yet (offline: no daemon may run over it). The format version
    /// and checksum are checked first. Copy pki/ and owner/ of the old
    /// data directory too to keep the cluster's CA and this node's
    /// identity; without them the daemon creates new ones.
    Restore {
        /// The backup `snapshot save` wrote.
        file: PathBuf,
        /// Print one JSON object: the directory, the revision and the keys.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `snapshot restore FILE` into `data_dir` (no connection).
pub fn restore_into(data_dir: &Path, file: &Path, format: Format) -> Result<(), CliError> {
    let bytes = std::fs::read(file).map_err(|e| usage(format!("{}: {e}", file.display())))?;
    let dir = data_dir.join("store");
    let restored = restore(&dir, &bytes, &StoreOptions::default())
        .map_err(|e| failed(Exit::Failure, format!("{}: {e}", file.display())))?;
    if format.structured() {
        let value = serde_json::json!({
            "store": dir.display().to_string(),
            "revision": restored.revision,
            "keys": restored.keys,
        });
        super::output::emit(&value, format);
    } else {
        outln!(
            "restored revision {} ({} keys) into {}",
            restored.revision,
            restored.keys,
            dir.display()
        );
    }
    Ok(())
}

/// Runs `snapshot save FILE` over `channel`.
pub async fn save(channel: Channel, file: &Path, format: Format) -> Result<(), CliError> {
    let mut client = MaintenanceClient::with_origin(channel, Channel::origin())
        .max_decoding_message_size(4 << 20);
    let mut stream = client
        .snapshot(SnapshotRequest {})
        .await
        .map_err(status_error)?
        .into_inner();
    let part = part_of(file);
    let mut out = open_private(&part)?;
    let (mut total, mut revision, mut written) = (None, 0, 0u64);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|status| {
            let _ = std::fs::remove_file(&part);
            status_error(status)
        })?;
        if total.is_none() {
            if chunk.total_bytes > MAX_BACKUP_BYTES {
                let _ = std::fs::remove_file(&part);
                return Err(failed(
                    Exit::Failure,
                    format!(
                        "the curator offers {} bytes, more than any backup",
                        chunk.total_bytes
                    ),
                ));
            }
            total = Some(chunk.total_bytes);
            revision = chunk.revision;
        }
        written += chunk.data.len() as u64;
        if Some(written) > total {
            let _ = std::fs::remove_file(&part);
            return Err(failed(
                Exit::Failure,
                "the curator sent more than it announced",
            ));
        }
        out.write_all(&chunk.data)
            .map_err(|e| failed(Exit::Failure, format!("{}: {e}", part.display())))?;
    }
    if total != Some(written) {
        let _ = std::fs::remove_file(&part);
        return Err(failed(
            Exit::Unavailable,
            format!("the backup ended after {written} of {total:?} bytes"),
        ));
    }
    // Linked, not renamed: a FILE that appeared since the check before
    // the call is not replaced (the backup stays in FILE.part then).
    out.sync_all()
        .and_then(|()| std::fs::hard_link(&part, file))
        .and_then(|()| std::fs::remove_file(&part))
        .map_err(|e| {
            failed(
                Exit::Failure,
                format!(
                    "FILE {}: {e}; the backup is in {}",
                    file.display(),
                    part.display()
                ),
            )
        })?;
    if format.structured() {
        let value = serde_json::json!({
            "file": file.display().to_string(),
            "bytes": written,
            "revision": revision,
        });
        super::output::emit(&value, format);
    } else {
        outln!(
            "snapshot saved to {}: {written} bytes, revision {revision}",
            file.display()
        );
    }
    Ok(())
}

/// Where `save` writes the backup until it is complete: FILE.part.
fn part_of(file: &Path) -> PathBuf {
    file.with_extension(match file.extension() {
        Some(e) => format!("{}.part", e.to_string_lossy()),
        None => "part".into(),
    })
}

/// Checks `snapshot save FILE` before the call: neither FILE nor
/// FILE.part may exist.
pub fn check_save(file: &Path) -> Result<(), CliError> {
    super::files::check_absent("FILE", file)?;
    super::files::check_absent("FILE", &part_of(file))
}

/// Creates `path` (FILE.part), mode 0600; one already there (a save that
/// was interrupted, or anybody's file) is refused, not truncated.
fn open_private(path: &Path) -> Result<std::fs::File, CliError> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => usage(format!(
                "FILE: {} exists (left by an interrupted save?); remove it and save again",
                path.display()
            )),
            _ => usage(format!("FILE: {}: {e}", path.display())),
        })
}
