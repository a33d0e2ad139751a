//! The local UNIX socket's file: stale-socket replacement and mode 0600.

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;

/// Makes `path` ready for a UNIX listener to bind: creates its directory
/// and removes a stale socket left by a previous run. Anything else at
/// that path is left alone and reported.
pub fn prepare_socket_path(path: &Path) -> io::Result<()> {
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path),
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{}: exists and is not a socket; refusing to replace it",
                path.display()
            ),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Restricts the bound socket to its owner (mode 0600): callers of the
/// local socket act as this node.
pub fn restrict_socket(path: &Path) -> io::Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}
