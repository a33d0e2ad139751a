//! The embedded image store: an OCI image layout in a directory.
//!
//! ```text
//! <dir>/oci-layout          {"imageLayoutVersion":"1.0.0"}
//! <dir>/index.json          one manifest descriptor per image name
//! <dir>/blobs/sha256/<hex>  content-addressed blobs
//! <dir>/.staging-<pid>-<n>/ an import in progress (removed at its end)
//! ```
//!
//! # Commit
//!
//! An import stages every regular member of the archive in its staging
//! directory (on the import's own thread). Its commit runs on that
//! thread under a store-wide lock:
//!
//! 1. every image of the plan must have a name ([`ImageStoreError::Invalid`]
//!    otherwise: an OCI layout can hold unnamed manifests, but nothing
//!    could ever refer to them, and inventing names would hide the
//!    archive's mistake; the message says which annotation names an image);
//! 2. a name already in `index.json` is [`ImageStoreError::AlreadyExists`]
//!    unless the store replaces tags, in which case the old entry goes;
//! 3. the plan's blobs are fsynced and renamed into `blobs/sha256/` (a
//!    blob already there is kept as is; staged members the plan does not
//!    name are dropped), synthesized blobs are written the same way, and
//!    `blobs/sha256/` is fsynced;
//! 4. `index.json` is rewritten atomically (temporary file, fsync, rename,
//!    fsync of the directory): the rename is the commit point;
//! 5. the staging directory is removed.
//!
//! A failure before the rename removes the blobs this import added, so
//! the directory is as before. A crash before it leaves a staging
//! directory (removed at the next open) and possibly blobs no image
//! references (invisible and harmless; there is no garbage collection
//! yet, as there is none for blobs of replaced tags).
//!
//! Each image entry in `index.json` carries its normalised name in both
//! `org.opencontainers.image.ref.name` and `io.containerd.image.name`.
//!
//! The store holds an exclusive lock on `oci-layout` while open: one
//! store (one process) per directory.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use futures::future::BoxFuture;
use metropolis_archive::{Descriptor, Digest, ImportPlan, MEDIA_TYPE_OCI_INDEX};
use metropolis_service::images::{ImageImport, ImageStore, ImageStoreError, ListedImage};
use serde_json::{Map, Value, json};

use super::staging::{self, Committer, Staged, unavailable};

/// OCI annotation holding an image's reference name.
pub const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";
/// containerd's annotation holding an image's full name.
pub const ANNOTATION_CONTAINERD_NAME: &str = "io.containerd.image.name";

const LAYOUT_FILE: &str = "oci-layout";
const INDEX_FILE: &str = "index.json";
/// Temporary name of a new `index.json` (a leftover is removed at open).
const INDEX_TMP: &str = ".staging-index.json";

/// Options of an [`OciLayoutStore`].
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct OciLayoutOptions {
    /// Whether importing a name that exists replaces the old image (else
    /// AlreadyExists).
    pub replace_tags: bool,
}

impl OciLayoutOptions {
    /// Options replacing existing tags or not.
    pub fn replace_tags(replace_tags: bool) -> OciLayoutOptions {
        OciLayoutOptions { replace_tags }
    }
}

/// An image in the store, as `index.json` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredImage {
    /// Its name (`org.opencontainers.image.ref.name`, else
    /// `io.containerd.image.name`); `None` for an entry another tool wrote
    /// without one.
    pub name: Option<String>,
    /// Its manifest (or index) descriptor.
    pub manifest: Descriptor,
}

/// The on-disk OCI image layout store. See the module docs (`images::oci`).
#[derive(Clone, Debug)]
pub struct OciLayoutStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    replace_tags: bool,
    /// Serialises commits (and `list` against them).
    commit_lock: Mutex<()>,
    /// Holds the exclusive lock on `oci-layout`.
    _layout: File,
}

fn ctx(path: &Path, what: &str) -> impl FnOnce(io::Error) -> io::Error {
    let message = format!("{what} {}", path.display());
    move |e| io::Error::new(e.kind(), format!("{message}: {e}"))
}

impl OciLayoutStore {
    /// Opens the layout at `dir`, creating it if needed, and removes what a
    /// crash left (staging directories, a temporary `index.json`).
    /// Blocking: call it at startup, not on an executor.
    pub fn open(dir: impl Into<PathBuf>, options: OciLayoutOptions) -> io::Result<OciLayoutStore> {
        let dir = dir.into();
        let blobs = dir.join("blobs").join("sha256");
        fs::create_dir_all(&blobs).map_err(ctx(&blobs, "create"))?;
        let layout_path = dir.join(LAYOUT_FILE);
        if !layout_path.exists() {
            write_atomic(&dir, LAYOUT_FILE, br#"{"imageLayoutVersion":"1.0.0"}"#)?;
        }
        let layout = OpenOptions::new()
            .read(true)
            .open(&layout_path)
            .map_err(ctx(&layout_path, "open"))?;
        match layout.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                return Err(io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    format!("image store {} is in use by another store", dir.display()),
                ));
            }
            Err(fs::TryLockError::Error(e)) => return Err(ctx(&layout_path, "lock")(e)),
        }
        let version: Value = read_json(&layout_path)?;
        if version.get("imageLayoutVersion").and_then(Value::as_str) != Some("1.0.0") {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: imageLayoutVersion is not 1.0.0", layout_path.display()),
            ));
        }
        let removed = staging::remove_leftovers(&dir).map_err(ctx(&dir, "clean up"))?;
        if removed > 0 {
            tracing::info!(dir = %dir.display(), "image store: removed {removed} leftover staging entries");
        }
        let index_path = dir.join(INDEX_FILE);
        if index_path.exists() {
            parse_index(read_json(&index_path)?).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: {e}", index_path.display()),
                )
            })?;
        } else {
            let empty =
                json!({"schemaVersion": 2, "mediaType": MEDIA_TYPE_OCI_INDEX, "manifests": []});
            write_atomic(&dir, INDEX_FILE, &to_bytes(&empty))?;
        }
        Ok(OciLayoutStore {
            inner: Arc::new(Inner {
                dir,
                replace_tags: options.replace_tags,
                commit_lock: Mutex::new(()),
                _layout: layout,
            }),
        })
    }

    /// The layout's directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The images `index.json` lists, in its order. Blocking (reads a
    /// file).
    pub fn list(&self) -> io::Result<Vec<StoredImage>> {
        let _guard = self.inner.lock();
        let path = self.inner.dir.join(INDEX_FILE);
        let index = parse_index(read_json(&path)?).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        })?;
        Ok(index
            .iter()
            .filter_map(|entry| {
                Some(StoredImage {
                    name: entry_names(entry).next().map(str::to_owned),
                    manifest: Descriptor {
                        media_type: entry.get("mediaType")?.as_str()?.to_owned(),
                        digest: Digest::parse(entry.get("digest")?.as_str()?).ok()?,
                        size: entry.get("size")?.as_u64()?,
                    },
                })
            })
            .collect())
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.commit_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl ImageStore for OciLayoutStore {
    fn begin(&self) -> Result<Box<dyn ImageImport>, ImageStoreError> {
        staging::start(
            &self.inner.dir,
            "image-import",
            Box::new(OciCommit {
                store: self.inner.clone(),
            }),
        )
    }

    /// [`OciLayoutStore::list`] on a thread of its own (it reads a file
    /// under the commit lock).
    fn list(&self) -> BoxFuture<'static, Result<Vec<ListedImage>, ImageStoreError>> {
        let store = self.clone();
        let (tx, rx) = futures::channel::oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name("image-list".to_owned())
            .spawn(move || {
                let listed = store.list().map_err(|e| {
                    ImageStoreError::Unavailable(format!("reading the image index: {e}"))
                });
                let _ = tx.send(listed);
            });
        Box::pin(async move {
            if let Err(e) = spawned {
                return Err(ImageStoreError::Unavailable(format!(
                    "cannot start a thread to read the image index: {e}"
                )));
            }
            let listed = rx.await.map_err(|_| {
                ImageStoreError::Unavailable("reading the image index failed".to_owned())
            })??;
            Ok(listed
                .into_iter()
                .map(|image| ListedImage {
                    name: image.name.unwrap_or_default(),
                    digest: image.manifest.digest.to_string(),
                    media_type: image.manifest.media_type,
                    size: image.manifest.size,
                })
                .collect())
        })
    }

    fn describe(&self) -> String {
        format!("OCI image layout {}", self.inner.dir.display())
    }
}

struct OciCommit {
    store: Arc<Inner>,
}

impl Committer for OciCommit {
    fn commit(
        self: Box<Self>,
        staged: &Staged,
        plan: &ImportPlan,
    ) -> Result<Vec<String>, ImageStoreError> {
        let images = super::named_images(plan)?;
        let store = &self.store;
        let _guard = store.lock();
        let index_path = store.dir.join(INDEX_FILE);
        let mut index = read_json(&index_path).map_err(|e| unavailable(&index_path, "read", &e))?;
        let kept = {
            let entries = parse_index_mut(&mut index).map_err(|e| {
                ImageStoreError::Unavailable(format!("{}: {e}", index_path.display()))
            })?;
            let mut kept = Vec::with_capacity(entries.len());
            for entry in entries.drain(..) {
                if let Some(name) = entry_names(&entry).find(|n| images.iter().any(|(m, _)| m == n))
                {
                    if !store.replace_tags {
                        return Err(ImageStoreError::AlreadyExists(name.to_owned()));
                    }
                    tracing::info!(name, "image store: replacing the existing image");
                    continue;
                }
                kept.push(entry);
            }
            kept
        };
        let blobs_dir = store.dir.join("blobs").join("sha256");
        let mut added = Vec::new();
        let moved = move_blobs(staged, plan, &blobs_dir, &mut added);
        let written = moved.and_then(|()| {
            let mut entries = kept;
            for (name, manifest) in &images {
                entries.push(index_entry(manifest, name));
            }
            if let Some(list) = index.get_mut("manifests") {
                *list = Value::Array(entries);
            }
            let tmp = store.dir.join(INDEX_TMP);
            write_synced(&tmp, &to_bytes(&index)).map_err(|e| unavailable(&tmp, "write", &e))?;
            Ok(tmp)
        });
        let tmp = match written {
            Ok(tmp) => tmp,
            Err(e) => {
                rollback(&store.dir, &added);
                return Err(e);
            }
        };
        if let Err(e) = fs::rename(&tmp, &index_path) {
            rollback(&store.dir, &added);
            return Err(unavailable(&index_path, "replace", &e));
        }
        // Committed: what follows cannot undo it, only weaken durability.
        if let Err(e) = sync_dir(&store.dir) {
            tracing::warn!(
                "image store: fsync {} after commit: {e}",
                store.dir.display()
            );
        }
        Ok(images.into_iter().map(|(name, _)| name).collect())
    }
}

/// Moves the plan's blobs (and writes its synthesized ones) into
/// `blobs/sha256/`, recording each file added in `added`.
fn move_blobs(
    staged: &Staged,
    plan: &ImportPlan,
    blobs_dir: &Path,
    added: &mut Vec<PathBuf>,
) -> Result<(), ImageStoreError> {
    for blob in &plan.blobs {
        let target = blobs_dir.join(blob.digest.hex());
        if target.exists() {
            continue;
        }
        let source = staged.blob_file(blob)?;
        File::open(source)
            .and_then(|f| f.sync_all())
            .map_err(|e| unavailable(source, "fsync staged blob", &e))?;
        fs::rename(source, &target).map_err(|e| unavailable(&target, "move blob to", &e))?;
        added.push(target);
    }
    for blob in &plan.synthesized {
        let target = blobs_dir.join(blob.digest.hex());
        if target.exists() {
            continue;
        }
        let source = staged
            .dir()
            .join(format!("synthesized-{}", blob.digest.hex()));
        write_synced(&source, &blob.data).map_err(|e| unavailable(&source, "write", &e))?;
        fs::rename(&source, &target).map_err(|e| unavailable(&target, "move blob to", &e))?;
        added.push(target);
    }
    sync_dir(blobs_dir).map_err(|e| unavailable(blobs_dir, "fsync", &e))
}

/// Removes the blobs an import added (before its commit point).
fn rollback(dir: &Path, added: &[PathBuf]) {
    for path in added {
        if let Err(e) = fs::remove_file(path) {
            tracing::warn!(
                "image store: cannot remove {} after a failed import: {e}",
                path.display()
            );
        }
    }
    if !added.is_empty() {
        let _ = sync_dir(&dir.join("blobs").join("sha256"));
    }
    let _ = fs::remove_file(dir.join(INDEX_TMP));
}

fn index_entry(manifest: &Descriptor, name: &str) -> Value {
    json!({
        "mediaType": manifest.media_type,
        "digest": manifest.digest.to_string(),
        "size": manifest.size,
        "annotations": {
            ANNOTATION_REF_NAME: name,
            ANNOTATION_CONTAINERD_NAME: name,
        },
    })
}

/// An entry's names: its ref name, then its containerd name.
fn entry_names(entry: &Value) -> impl Iterator<Item = &str> {
    let annotations = entry.get("annotations").and_then(Value::as_object);
    [ANNOTATION_REF_NAME, ANNOTATION_CONTAINERD_NAME]
        .into_iter()
        .filter_map(move |key| annotations?.get(key)?.as_str())
}

fn parse_index(mut index: Value) -> Result<Vec<Value>, String> {
    parse_index_mut(&mut index).map(std::mem::take)
}

fn parse_index_mut(index: &mut Value) -> Result<&mut Vec<Value>, String> {
    let object: &mut Map<String, Value> = index.as_object_mut().ok_or("not a JSON object")?;
    match object.get_mut("manifests") {
        Some(Value::Array(entries)) => Ok(entries),
        _ => Err("no manifests array".to_owned()),
    }
}

fn read_json(path: &Path) -> io::Result<Value> {
    let bytes = fs::read(path).map_err(ctx(path, "read"))?;
    serde_json::from_slice(&bytes).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {e}", path.display()),
        )
    })
}

fn to_bytes(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).expect("a serde_json::Value always serialises")
}

fn write_synced(path: &Path, data: &[u8]) -> io::Result<()> {
    let mut file = File::create(path)?;
    file.write_all(data)?;
    file.sync_all()
}

/// Writes `dir/name` atomically (temporary file, fsync, rename, fsync of
/// the directory).
fn write_atomic(dir: &Path, name: &str, data: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!("{}{name}", staging::STAGING_PREFIX));
    write_synced(&tmp, data).map_err(ctx(&tmp, "write"))?;
    let path = dir.join(name);
    fs::rename(&tmp, &path).map_err(ctx(&path, "replace"))?;
    sync_dir(dir).map_err(ctx(dir, "fsync"))
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}
