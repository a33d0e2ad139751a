//! containerd as the image store, through its `ctr` client.
//!
//! # Why `ctr` and not containerd's gRPC API
//!
//! containerd has no "import" RPC: importing is client-side logic in its
//! Go client (which `ctr images import` runs): writing each blob through
//! the content service's write protocol under a lease, parsing the
//! archive's index, creating or updating image records, releasing the
//! lease. Doing it over gRPC from here would mean vendoring the content,
//! images and leases protos and re-implementing that client logic, for no
//! gain over running the client containerd ships with.
//!
//! # What is imported
//!
//! The import stages the archive's members like the embedded store does.
//! At commit, under a store-wide lock:
//!
//! 1. every image must have a name (InvalidArgument otherwise, see
//!    [`super`]);
//! 2. `ctr images ls -q` lists the namespace; its names, normalised as
//!    Docker and containerd do, are compared with the plan's names: a
//!    match is AlreadyExists unless the store replaces tags;
//! 3. an OCI image layout archive is written from the staged blobs to
//!    `ctr images import --all-platforms --no-unpack -` through a pipe,
//!    with an `index.json` naming each image by its normalised name in
//!    `io.containerd.image.name`.
//!
//! Feeding `ctr` a layout built from the plan, rather than the client's
//! tarball, means containerd gets exactly the names this store checked
//! and reports (`ctr` keeps an OCI archive's names verbatim, so
//! `busybox:latest` would not be `docker.io/library/busybox:latest`,
//! which is what the kubelet looks up), bare-tag OCI names need no
//! `--base-name`, and only blobs the validator checked reach containerd.
//! Layers are not unpacked (the CRI plugin unpacks an image when a
//! container first needs it).
//!
//! So an import takes the upload and then a whole `ctr images import`:
//! about 0.8 of the rate of `ctr images import` of the same tarball
//! (`metropolis-load load-image --against containerd`). Overlapping the
//! two would need each member fed to containerd as it arrives, which a
//! layout cannot carry (a blob's name is its digest, known at its end).
//! The staged files are not written back (containerd syncs its own copy).
//!
//! `ctr` failures (containerd down, a bad socket) are Unavailable, with
//! `ctr`'s stderr in the message. The staging directory is removed in
//! every case. Another client creating the same name between the check
//! and the import is not detected (`ctr` then replaces it).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use metropolis_core::archive::{Descriptor, ImportPlan};
use metropolis_core::images::{ImageImport, ImageStore, ImageStoreError};
use serde_json::json;

use super::oci::ANNOTATION_CONTAINERD_NAME;
use super::staging::{self, Committer, Staged};
use metropolis_core::archive::normalize_reference;

/// Most bytes of `ctr`'s stdout or stderr kept for messages and logs.
const MAX_CAPTURE: usize = 16 * 1024;

/// Where and how to reach containerd.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ContainerdConfig {
    /// containerd's gRPC socket (`ctr --address`).
    pub socket: PathBuf,
    /// The namespace images go to (`ctr --namespace`); `k8s.io`, the CRI
    /// plugin's, by default.
    pub namespace: String,
    /// The `ctr` binary (looked up in `PATH` when it has no `/`); `ctr`
    /// by default.
    pub ctr: PathBuf,
    /// Whether importing a name that exists replaces the old image (else
    /// AlreadyExists).
    pub replace_tags: bool,
    /// A directory of the store's own for staging imports (created if
    /// missing; its leftovers are removed at open).
    pub staging_dir: PathBuf,
    /// How long `ctr` waits to connect to containerd (`--connect-timeout`);
    /// 10 s by default.
    pub connect_timeout: Duration,
}

impl ContainerdConfig {
    /// containerd at `socket`, staging in `staging_dir`, with the defaults
    /// above.
    pub fn new(socket: impl Into<PathBuf>, staging_dir: impl Into<PathBuf>) -> ContainerdConfig {
        ContainerdConfig {
            socket: socket.into(),
            namespace: "k8s.io".to_owned(),
            ctr: PathBuf::from("ctr"),
            replace_tags: false,
            staging_dir: staging_dir.into(),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// The containerd image store. See the module docs (`images::containerd`).
#[derive(Clone, Debug)]
pub struct ContainerdStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: ContainerdConfig,
    /// Serialises the check-then-import of commits.
    commit_lock: Mutex<()>,
    /// Holds the exclusive lock on the staging directory's `LOCK` file.
    _lock: File,
}

impl ContainerdStore {
    /// A store importing into containerd as `config` says. Creates the
    /// staging directory, locks it and removes what a crash left in it;
    /// does not contact containerd (a containerd that is down fails
    /// imports, not the node). Blocking: call it at startup.
    pub fn open(config: ContainerdConfig) -> io::Result<ContainerdStore> {
        let dir = &config.staging_dir;
        fs::create_dir_all(dir)
            .map_err(|e| io::Error::new(e.kind(), format!("create {}: {e}", dir.display())))?;
        let lock_path = dir.join("LOCK");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| io::Error::new(e.kind(), format!("open {}: {e}", lock_path.display())))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                return Err(io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    format!(
                        "staging directory {} is in use by another store",
                        dir.display()
                    ),
                ));
            }
            Err(fs::TryLockError::Error(e)) => return Err(e),
        }
        let removed = staging::remove_leftovers(dir)?;
        if removed > 0 {
            tracing::info!(dir = %dir.display(), "containerd store: removed {removed} leftover staging entries");
        }
        Ok(ContainerdStore {
            inner: Arc::new(Inner {
                config,
                commit_lock: Mutex::new(()),
                _lock: lock,
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ContainerdConfig {
        &self.inner.config
    }

    /// The image names in the namespace, as `ctr images ls -q` prints them.
    /// Blocking (runs `ctr`).
    pub fn list(&self) -> Result<Vec<String>, ImageStoreError> {
        self.inner.list()
    }
}

impl ImageStore for ContainerdStore {
    fn begin(&self) -> Result<Box<dyn ImageImport>, ImageStoreError> {
        staging::start(
            &self.inner.config.staging_dir,
            "containerd-import",
            Box::new(ContainerdCommit {
                store: self.inner.clone(),
            }),
        )
    }
}

impl Inner {
    /// `ctr` with the global flags.
    fn ctr(&self) -> Command {
        let c = &self.config;
        let mut command = Command::new(&c.ctr);
        command
            .arg("--address")
            .arg(&c.socket)
            .arg("--namespace")
            .arg(&c.namespace)
            .arg("--connect-timeout")
            .arg(format!("{}ms", c.connect_timeout.as_millis()));
        command
    }

    fn list(&self) -> Result<Vec<String>, ImageStoreError> {
        let mut command = self.ctr();
        command.args(["images", "ls", "-q"]);
        let output = command
            .stdin(Stdio::null())
            .output()
            .map_err(|e| self.spawn_error(&e))?;
        if !output.status.success() {
            return Err(ImageStoreError::Unavailable(format!(
                "ctr images ls failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect())
    }

    fn spawn_error(&self, e: &io::Error) -> ImageStoreError {
        ImageStoreError::Unavailable(format!("cannot run {}: {e}", self.config.ctr.display()))
    }

    /// Runs `ctr images import` with the layout archive on its stdin.
    fn import(
        &self,
        staged: &Staged,
        plan: &ImportPlan,
        images: &[(String, &Descriptor)],
    ) -> Result<(), ImageStoreError> {
        let mut command = self.ctr();
        command.args(["images", "import", "--all-platforms", "--no-unpack", "-"]);
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| self.spawn_error(&e))?;
        let (stdin, stdout, stderr) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take());
        let (written, out, err) = std::thread::scope(|scope| {
            let out = scope.spawn(move || stdout.map(read_capped).unwrap_or_default());
            let err = scope.spawn(move || stderr.map(read_capped).unwrap_or_default());
            // Closing stdin (dropping it) ends the archive for ctr.
            let written = match stdin {
                Some(stdin) => write_layout(stdin, staged, plan, images),
                None => Err(ImageStoreError::Unavailable("ctr has no stdin".to_owned())),
            };
            if written.is_err() {
                // Whatever ctr read is incomplete: it must not import it.
                let _ = child.kill();
            }
            let out = out.join().unwrap_or_default();
            let err = err.join().unwrap_or_default();
            (written, out, err)
        });
        let status = child
            .wait()
            .map_err(|e| ImageStoreError::Unavailable(format!("waiting for ctr: {e}")))?;
        let stderr = String::from_utf8_lossy(&err);
        written?;
        if !status.success() {
            return Err(ImageStoreError::Unavailable(format!(
                "ctr images import failed ({status}): {}",
                stderr.trim()
            )));
        }
        let stdout = String::from_utf8_lossy(&out);
        tracing::debug!(stdout = %stdout.trim(), stderr = %stderr.trim(), "ctr images import");
        Ok(())
    }
}

struct ContainerdCommit {
    store: Arc<Inner>,
}

impl Committer for ContainerdCommit {
    fn commit(
        self: Box<Self>,
        staged: &Staged,
        plan: &ImportPlan,
    ) -> Result<Vec<String>, ImageStoreError> {
        let images = super::named_images(plan)?;
        let store = &self.store;
        let _guard = store
            .commit_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let existing: Vec<String> = store
            .list()?
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
        store.import(staged, plan, &images)?;
        Ok(images.into_iter().map(|(name, _)| name).collect())
    }

    /// containerd writes (and syncs) its own copy; the staged files are
    /// removed right after, mostly before the kernel wrote them.
    fn writes_back(&self) -> bool {
        false
    }
}

/// Writes an OCI image layout archive of the plan to `out`: `oci-layout`,
/// the blobs, then `index.json`.
fn write_layout(
    out: impl Write,
    staged: &Staged,
    plan: &ImportPlan,
    images: &[(String, &Descriptor)],
) -> Result<(), ImageStoreError> {
    let pipe =
        |e: io::Error| ImageStoreError::Unavailable(format!("writing the archive to ctr: {e}"));
    let mut builder = tar::Builder::new(io::BufWriter::with_capacity(256 * 1024, out));
    append(
        &mut builder,
        "oci-layout",
        br#"{"imageLayoutVersion":"1.0.0"}"#.as_slice(),
        30,
    )
    .map_err(pipe)?;
    for blob in &plan.blobs {
        let path = staged.blob_file(blob)?;
        let file = File::open(path).map_err(|e| staging::unavailable(path, "open", &e))?;
        append(
            &mut builder,
            &blob_path(&blob.digest.hex()),
            file,
            blob.size,
        )
        .map_err(pipe)?;
    }
    for blob in &plan.synthesized {
        if plan.blob(&blob.digest).is_none() {
            let path = blob_path(&blob.digest.hex());
            append(&mut builder, &path, &blob.data[..], blob.data.len() as u64).map_err(pipe)?;
        }
    }
    let manifests: Vec<_> = images
        .iter()
        .map(|(name, manifest)| {
            json!({
                "mediaType": manifest.media_type,
                "digest": manifest.digest.to_string(),
                "size": manifest.size,
                "annotations": {ANNOTATION_CONTAINERD_NAME: name},
            })
        })
        .collect();
    let index = json!({"schemaVersion": 2, "mediaType": metropolis_core::archive::MEDIA_TYPE_OCI_INDEX, "manifests": manifests});
    let index = serde_json::to_vec(&index).expect("a serde_json::Value always serialises");
    append(&mut builder, "index.json", &index[..], index.len() as u64).map_err(pipe)?;
    let mut out = builder.into_inner().map_err(pipe)?;
    out.flush().map_err(pipe)
}

fn blob_path(hex: &str) -> String {
    format!("blobs/sha256/{hex}")
}

fn append<W: Write>(
    builder: &mut tar::Builder<W>,
    path: &str,
    data: impl Read,
    size: u64,
) -> io::Result<()> {
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(size);
    header.set_mode(0o644);
    header.set_mtime(0);
    builder.append_data(&mut header, path, data)
}

/// Reads `r` to its end, keeping the first [`MAX_CAPTURE`] bytes.
fn read_capped(mut r: impl Read) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match r.read(&mut buf) {
            Ok(0) => return kept,
            Ok(n) => {
                let room = MAX_CAPTURE.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return kept,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_ctr_is_unavailable_naming_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = ContainerdConfig::new("/nonexistent.sock", dir.path().join("staging"));
        config.ctr = dir.path().join("no-such-ctr");
        let store = ContainerdStore::open(config).expect("open");
        match store.list() {
            Err(ImageStoreError::Unavailable(m)) => assert!(m.contains("no-such-ctr"), "{m}"),
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }
}
