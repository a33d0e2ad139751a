//! The EFI boot entry over immutable variable files. efivarfs creates the
//! files of variables that are not well-known standard ones immutable
//! (`FS_IMMUTABLE_FL`), and an immutable file cannot be opened for
//! writing; `bmaas_agent::efivars::add_boot_entry` clears the flag of an
//! existing `BootOrder` for its write and sets it again after. A test
//! directory stands in for efivarfs here, its `BootOrder` made immutable
//! with `chattr +i`.
//!
//! Needs root (`CAP_LINUX_IMMUTABLE`), a temporary directory on a
//! filesystem with inode flags (ext4, tmpfs since Linux 6.0, ...) and
//! e2fsprogs' `chattr` and `lsattr`; without them it fails, naming what is
//! missing.

use std::path::{Path, PathBuf};
use std::process::Command;

use bmaas_agent::disk::Layout;
use bmaas_agent::efivars::{GLOBAL_VARIABLE_GUID, add_boot_entry};

fn chattr(flag: &str, path: &Path) -> Result<(), String> {
    let output = Command::new("chattr")
        .arg(flag)
        .arg(path)
        .output()
        .map_err(|e| format!("chattr could not start (e2fsprogs): {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "chattr {flag} {}: {}",
            path.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

fn immutable(path: &Path) -> bool {
    let output = Command::new("lsattr")
        .arg(path)
        .output()
        .expect("lsattr runs (e2fsprogs)");
    assert!(output.status.success(), "lsattr {}", path.display());
    let text = String::from_utf8_lossy(&output.stdout);
    let flags = text.split_whitespace().next().unwrap_or_default();
    flags.contains('i')
}

/// Clears the flag again, so the temporary directory can be removed.
struct Mutable(PathBuf);

impl Drop for Mutable {
    fn drop(&mut self) {
        let _ = chattr("-i", &self.0);
    }
}

#[test]
fn an_immutable_boot_order_is_replaced_and_stays_immutable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let boot_order = dir.path().join(format!("BootOrder-{GLOBAL_VARIABLE_GUID}"));
    std::fs::write(&boot_order, [7, 0, 0, 0, 3, 0, 1, 0]).expect("BootOrder");
    if let Err(e) = chattr("+i", &boot_order) {
        panic!("cannot make a test variable immutable (root and inode flags needed): {e}");
    }
    let _guard = Mutable(boot_order.clone());
    let refused = std::fs::OpenOptions::new().write(true).open(&boot_order);
    assert_eq!(
        refused.map_err(|e| e.kind()).err(),
        Some(std::io::ErrorKind::PermissionDenied),
        "an immutable file refuses writers, root included"
    );

    let layout = Layout::plan(16 << 30, 512).expect("fits");
    assert_eq!(add_boot_entry(dir.path(), &layout).expect("entry added"), 0);
    assert_eq!(
        std::fs::read(&boot_order).expect("BootOrder"),
        [7, 0, 0, 0, 0, 0],
        "BootOrder replaced by just the new entry"
    );
    assert!(immutable(&boot_order), "the flag is set again");
    let entry = dir.path().join(format!("Boot0000-{GLOBAL_VARIABLE_GUID}"));
    assert!(!immutable(&entry), "a new entry is created as it comes");
}
