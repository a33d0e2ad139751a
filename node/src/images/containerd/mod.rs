//! containerd as the image store, over containerd's gRPC API.
//!
//! # How an import reaches containerd
//!
//! containerd has no "import" call: importing is what its clients do
//! (`ctr images import` runs its Go client's logic) over the content,
//! image and lease services. This store does the same as the archive
//! streams in, so the upload and containerd's ingestion overlap:
//!
//! 1. At the first member, the import connects to containerd's socket and
//!    creates a lease of its own (expiring after a day, labelled with the
//!    store's state directory); everything it writes joins the lease, so
//!    containerd's garbage collector leaves it alone until the commit.
//! 2. Each regular member is a `Content.Write` stream of its own, fed as
//!    the bytes arrive and committed with the digest and size the
//!    validator computed at the member's end (containerd checks both).
//!    Which members are blobs is known only at the end, so every regular
//!    member is written; the others are collected with the lease.
//! 3. At commit, under a store-wide lock: every image must have a name
//!    (InvalidArgument otherwise, see [`super`]); the namespace's names,
//!    normalised as Docker and containerd do, are compared with the
//!    plan's (a match is AlreadyExists unless the store replaces tags);
//!    the synthesized manifests are written; each manifest and index is
//!    labelled with what it references ([`labels`]); each image record is
//!    pointed at its manifest or created. Then the lease is deleted: the
//!    images now hold their blobs.
//!
//! Images get exactly the names this store checked and reports (`ctr`
//! keeps an OCI archive's names verbatim, so `busybox:latest` would not
//! be `docker.io/library/busybox:latest`, which is what the kubelet looks
//! up), and only blobs the validator checked are referenced. Layers are
//! not unpacked (the CRI plugin unpacks an image when a container first
//! needs it).
//!
//! An import refused or aborted before its commit deletes its lease
//! synchronously: containerd has collected what it wrote when the import
//! resolves. A store that crashed leaves its leases; the next store on the
//! same state directory deletes them at its first import, and containerd
//! expires them anyway.
//!
//! containerd unreachable or failing is Unavailable, naming the call and
//! quoting containerd. Another client creating the same name between the
//! check and the record is not detected (the record is then replaced).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use metropolis_service::images::{ImageImport, ImageStore, ImageStoreError, ListedImage};
use metropolis_transport::runtime::SharedRuntime;
use tonic::metadata::AsciiMetadataValue;

use super::staging;

mod api;
mod import;
mod labels;
mod write;

use api::Api;

/// Where and how to reach containerd.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ContainerdConfig {
    /// containerd's gRPC socket.
    pub socket: PathBuf,
    /// The namespace images go to; `k8s.io`, the CRI plugin's, by default.
    pub namespace: String,
    /// Whether importing a name that exists replaces the old image (else
    /// AlreadyExists).
    pub replace_tags: bool,
    /// A directory of the store's own (created if missing): it holds the
    /// lock that makes the store the only one on the directory, and its
    /// path labels the store's leases in containerd.
    pub state_dir: PathBuf,
    /// How long an import waits to connect to containerd; 10 s by default.
    pub connect_timeout: Duration,
}

impl ContainerdConfig {
    /// containerd at `socket`, the store's state in `state_dir`, with the
    /// defaults above.
    pub fn new(socket: impl Into<PathBuf>, state_dir: impl Into<PathBuf>) -> ContainerdConfig {
        ContainerdConfig {
            socket: socket.into(),
            namespace: "k8s.io".to_owned(),
            replace_tags: false,
            state_dir: state_dir.into(),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// The containerd image store. See the module docs (`images::containerd`).
#[derive(Clone)]
pub struct ContainerdStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ContainerdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContainerdStore")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

struct Inner {
    config: ContainerdConfig,
    runtime: SharedRuntime,
    namespace: AsciiMetadataValue,
    /// The value of the owner label of this store's leases.
    owner: String,
    /// Numbers the imports of this process.
    imports: AtomicU64,
    /// Serialises the check-then-create of commits.
    commit_lock: futures::lock::Mutex<()>,
    /// Whether the leases a crashed predecessor left were deleted (held
    /// while they are).
    swept: futures::lock::Mutex<bool>,
    /// Holds the exclusive lock on the state directory's `LOCK` file.
    _lock: File,
}

impl ContainerdStore {
    /// A store importing into containerd as `config` says, its calls and
    /// tasks on `runtime`. Creates the state directory, locks it and
    /// removes what a crash of an earlier version of the store staged in
    /// it; does not contact containerd (a containerd that is down fails
    /// imports, not the node). Blocking: call it at startup.
    pub fn open(config: ContainerdConfig, runtime: SharedRuntime) -> io::Result<ContainerdStore> {
        let namespace = valid_namespace(&config.namespace)?;
        let dir = &config.state_dir;
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
                        "state directory {} is in use by another store",
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
        let owner = fs::canonicalize(dir)
            .unwrap_or_else(|_| dir.clone())
            .display()
            .to_string();
        Ok(ContainerdStore {
            inner: Arc::new(Inner {
                config,
                runtime,
                namespace,
                owner,
                imports: AtomicU64::new(0),
                commit_lock: futures::lock::Mutex::new(()),
                swept: futures::lock::Mutex::new(false),
                _lock: lock,
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ContainerdConfig {
        &self.inner.config
    }

    /// The names of the images in the namespace, as containerd holds them.
    pub async fn list(&self) -> Result<Vec<String>, ImageStoreError> {
        self.inner.connect().await?.image_names().await
    }
}

impl ImageStore for ContainerdStore {
    fn begin(&self) -> Result<Box<dyn ImageImport>, ImageStoreError> {
        let n = self.inner.imports.fetch_add(1, Ordering::Relaxed);
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        // Unique across restarts of the store (the time) and within one
        // (the count); a valid lease id and write ref prefix.
        let id = format!("metropolis-import-{started}-{n}");
        Ok(Box::new(import::ContainerdImport::new(
            self.inner.clone(),
            id,
        )))
    }

    fn list(&self) -> BoxFuture<'static, Result<Vec<ListedImage>, ImageStoreError>> {
        let inner = self.inner.clone();
        Box::pin(async move { inner.connect().await?.listed_images().await })
    }

    fn describe(&self) -> String {
        let c = &self.inner.config;
        format!(
            "containerd {}, namespace {}",
            c.socket.display(),
            c.namespace
        )
    }
}

impl Inner {
    async fn connect(&self) -> Result<Api, ImageStoreError> {
        let c = &self.config;
        Api::connect(&self.runtime, &c.socket, &self.namespace, c.connect_timeout).await
    }

    /// Deletes the leases an earlier store on this state directory left
    /// (it crashed mid-import), once per store.
    async fn remove_leftover_leases(&self, api: &Api) -> Result<(), ImageStoreError> {
        let mut swept = self.swept.lock().await;
        if *swept {
            return Ok(());
        }
        let leftovers = api.leases_of(&self.owner).await?;
        for id in &leftovers {
            api.delete_lease(id, false).await?;
        }
        if !leftovers.is_empty() {
            tracing::info!(
                "containerd store: deleted {} leases an earlier store left",
                leftovers.len()
            );
        }
        *swept = true;
        Ok(())
    }
}

/// A containerd namespace: `[A-Za-z0-9]+([._-][A-Za-z0-9]+)*`, at most 76
/// characters, as containerd requires.
fn valid_namespace(namespace: &str) -> io::Result<AsciiMetadataValue> {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    let parts_ok = namespace
        .split(['.', '_', '-'])
        .all(|part| !part.is_empty() && part.chars().all(alnum));
    if namespace.is_empty() || namespace.len() > 76 || !parts_ok {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "containerd namespace {}: must be letters and digits, separated by single \
                 '.', '_' or '-', at most 76 characters",
                metropolis_core::quote::quoted(namespace)
            ),
        ));
    }
    AsciiMetadataValue::try_from(namespace).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("containerd namespace: {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_are_checked_as_containerd_does() {
        for ok in ["k8s.io", "default", "a-b_c.d9"] {
            assert!(valid_namespace(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a..b", "-a", "a/b", "a b", &"x".repeat(77)] {
            let e = valid_namespace(bad).expect_err(bad);
            assert!(e.to_string().contains("containerd namespace"), "{e}");
        }
    }
}
