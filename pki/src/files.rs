//! Credential files: atomic, durable writes with explicit modes, and reads
//! whose errors name the file.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::PkiError;

/// Mode of files holding private keys: owner read/write only.
pub(crate) const PRIVATE_MODE: u32 = 0o600;

/// Mode of files holding certificates, which are public.
pub(crate) const PUBLIC_MODE: u32 = 0o644;

/// Writes `contents` to `path` so that a reader sees either the old file or
/// the complete new one, never a partial one, and the new one survives a
/// crash once this returns: the data goes to a temporary file in the same
/// directory (created with `mode`), which is flushed to disk, renamed over
/// `path`, and the directory is flushed too.
pub(crate) fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<(), PkiError> {
    write_through_temporary(path, contents, mode, |tmp| {
        fs::rename(tmp, path).map_err(|e| PkiError::Io {
            path: path.to_path_buf(),
            action: "replace",
            source: e,
        })
    })
}

/// Writes `contents` to `path`, which must not exist, so that a reader
/// sees no file or the complete one, and it survives a crash once this
/// returns, but never replacing a file: the data goes to a temporary file
/// beside it (created with `mode`, flushed), which is hard-linked to
/// `path` (failing if anything is there by then, a file created since a
/// caller's check included) and then unlinked; the directory is flushed
/// too. A failure leaves nothing new at `path`. The directory is created
/// (mode 0700) if missing.
pub fn write_new_file(path: &Path, contents: &[u8], mode: u32) -> Result<(), PkiError> {
    write_through_temporary(path, contents, mode, |tmp| {
        let linked = fs::hard_link(tmp, path).map_err(|e| PkiError::Io {
            path: path.to_path_buf(),
            action: "create (it must not exist yet)",
            source: e,
        });
        let _ = fs::remove_file(tmp);
        linked
    })
}

/// Whether anything (a file, a directory, a dangling symbolic link) is at
/// `path`.
pub(crate) fn occupied(path: &Path) -> bool {
    path.symlink_metadata().is_ok()
}

/// Writes `contents` into a fresh temporary file beside `path` (created
/// with `mode`, flushed), hands it to `publish` (which puts it at `path`),
/// and flushes the directory.
fn write_through_temporary(
    path: &Path,
    contents: &[u8],
    mode: u32,
    publish: impl FnOnce(&Path) -> Result<(), PkiError>,
) -> Result<(), PkiError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    // Credential directories hold private keys: create them owner-only.
    if !dir.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(PkiError::io(&dir, "create the directory"))?;
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(PkiError::io(&tmp, "remove a stale temporary file")(e)),
    }
    let result = write_new(&tmp, contents, mode).and_then(|()| publish(&tmp));
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
        return result;
    }
    File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(PkiError::io(&dir, "flush the directory"))
}

fn write_new(tmp: &Path, contents: &[u8], mode: u32) -> Result<(), PkiError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(tmp)
        .map_err(PkiError::io(tmp, "create"))?;
    // The umask may have cleared bits of `mode`; never let it matter for
    // what a key file must be, and keep public files readable.
    file.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(PkiError::io(tmp, "set the mode of"))?;
    file.write_all(contents)
        .map_err(PkiError::io(tmp, "write"))?;
    file.sync_all().map_err(PkiError::io(tmp, "flush"))
}

/// Reads a text (PEM) file.
pub(crate) fn read_text(path: &Path) -> Result<String, PkiError> {
    let bytes = fs::read(path).map_err(PkiError::io(path, "read"))?;
    String::from_utf8(bytes)
        .map_err(|_| PkiError::invalid(path.display(), "not a PEM file (not UTF-8 text)"))
}

/// Reads a private key file, warning when others than its owner may read it.
pub(crate) fn read_private(path: &Path) -> Result<String, PkiError> {
    let text = read_text(path)?;
    if let Ok(meta) = fs::metadata(path) {
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            tracing::warn!(
                path = %path.display(),
                mode = format_args!("{mode:04o}"),
                "private key file is accessible to other users; it should be mode 0600"
            );
        }
    }
    Ok(text)
}

/// Checks that `prefix` names files inside a directory, and not the CA's.
pub(crate) fn check_prefix(prefix: &str) -> Result<(), PkiError> {
    let origin = format!("credential file prefix {prefix:?}");
    if prefix.is_empty() {
        return Err(PkiError::invalid(origin, "must not be empty"));
    }
    if prefix.contains(['/', '\0']) || prefix == "." || prefix == ".." {
        return Err(PkiError::invalid(
            origin,
            "must be a plain file name, without '/'",
        ));
    }
    if prefix == "ca" || prefix == "ca-key" {
        return Err(PkiError::invalid(
            origin,
            "must not be \"ca\" or \"ca-key\": ca.pem and ca-key.pem hold the cluster CA",
        ));
    }
    Ok(())
}
