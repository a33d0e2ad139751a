//! The data directory: where its parts go ([`Layout`]: store, PKI,
//! owner credential) and how it and the private directories in it are
//! created (mode 0700); a `--data-dir` that cannot be a directory is
//! refused, naming the flag.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use super::{Config, DaemonError};

/// Paths inside the data directory.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The embedded store.
    pub store: PathBuf,
    /// Cluster CA and this node's credentials.
    pub pki: PathBuf,
    /// The owner credential bundle.
    pub owner: PathBuf,
}

impl Layout {
    /// The layout under `data_dir`.
    pub fn new(data_dir: &Path) -> Self {
        Layout {
            store: data_dir.join("store"),
            pki: data_dir.join("pki"),
            owner: data_dir.join("owner"),
        }
    }
}

/// Creates `dir` (and its parents) with mode 0700 if missing; `what`
/// names it in the error.
pub(super) fn create_private_dir(dir: &Path, what: &str) -> Result<(), DaemonError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("{}: cannot create the {what}: {e}", dir.display()).into())
}

/// Creates the data directory (mode 0700) if missing; a path that is a
/// file, or under one, is a usage error naming `--data-dir`.
pub(super) fn create_data_dir(config: &Config) -> Result<(), DaemonError> {
    let dir = &config.data_dir;
    if let Ok(meta) = std::fs::metadata(dir)
        && !meta.is_dir()
    {
        return Err(crate::exit::usage(format!(
            "--data-dir {}: is a file, not a directory; give a directory (created if \
             missing), or move the file away",
            dir.display()
        )));
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| {
            let exit = match e.kind() {
                std::io::ErrorKind::NotADirectory => crate::exit::Exit::Usage,
                _ => crate::exit::io_status(&e),
            };
            let hint = match e.kind() {
                std::io::ErrorKind::NotADirectory => {
                    "; a parent of it is a file: give a path under a directory"
                }
                std::io::ErrorKind::PermissionDenied => {
                    "; run as a user that may create it, or give another --data-dir"
                }
                _ => "",
            };
            crate::exit::error(
                exit,
                format!(
                    "--data-dir {}: cannot create the data directory: {e}{hint}",
                    dir.display()
                ),
            )
        })
}
