//! A curator's disk: its data directory is a small tmpfs mounted for the
//! schedule (so filling it touches nothing else), filled with one file
//! until the kernel answers ENOSPC, and emptied again.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::cleanup;

/// The size of each curator's tmpfs.
const SIZE: &str = "32m";

/// The file that fills it.
fn filler(dir: &Path) -> PathBuf {
    dir.join("chaos-filler")
}

/// Mounts a tmpfs on `dir` (created if missing).
pub fn mount(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let shown = dir.display().to_string();
    cleanup::quiet(
        "mount",
        &[
            "-t",
            "tmpfs",
            "-o",
            &format!("size={SIZE},mode=0700"),
            "metropolis-chaos",
            &shown,
        ],
    )
    .map_err(|e| format!("mounting a tmpfs on {shown}: {e}"))?;
    cleanup::add_mount(dir);
    Ok(())
}

/// Unmounts the tmpfs on `dir`, if this program mounted it.
pub fn unmount(dir: &Path) -> Result<(), String> {
    let shown = dir.display().to_string();
    let is_mount = cleanup::quiet("mountpoint", &["-q", &shown]).is_ok();
    if !is_mount {
        return Ok(());
    }
    let result =
        cleanup::quiet("umount", &[&shown]).or_else(|_| cleanup::quiet("umount", &["-l", &shown]));
    cleanup::remove_mount(dir);
    result.map_err(|e| format!("unmounting {shown}: {e}"))
}

/// Fills the file system of `dir` until it is full; bytes written.
pub fn fill(dir: &Path) -> Result<u64, String> {
    let path = filler(dir);
    let mut file =
        std::fs::File::create(&path).map_err(|e| format!("creating {}: {e}", path.display()))?;
    let chunk = vec![0xa5u8; 1 << 20];
    let mut written = 0u64;
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(28) => break,
            Err(e) => return Err(format!("filling {}: {e}", path.display())),
        }
    }
    let _ = file.sync_all();
    Ok(written)
}

/// Frees what [`fill`] took.
pub fn free(dir: &Path) -> Result<(), String> {
    match std::fs::remove_file(filler(dir)) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("removing {}: {e}", filler(dir).display())),
    }
}
