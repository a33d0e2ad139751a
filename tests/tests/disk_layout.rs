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
//!
//! And a whole-disk image's backup GPT moved to the end of a larger
//! sparse file, checked with util-linux's `sfdisk --verify` (fdisk).

use std::path::{Path, PathBuf};
use std::process::Command;

use bmaas_agent::disk::Layout;
use bmaas_agent::disk::backup_gpt::{BackupGpt, move_backup_to_end};
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

/// `sfdisk --verify FILE`: whether it found nothing wrong, and what it
/// said on stderr.
fn sfdisk_verify(path: &Path) -> (bool, String) {
    let out = Command::new("sfdisk")
        .arg("--verify")
        .arg(path)
        .output()
        .expect("sfdisk (fdisk) is not installed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (
        out.status.success() && stdout.contains("No errors detected") && stderr.is_empty(),
        stderr,
    )
}

/// `bmaas_agent::disk::backup_gpt` on a sparse file, checked by
/// util-linux: an 8 MiB GPT image made by `sfdisk` (partitions at 1 MiB
/// and 3 MiB) written into a 64 MiB sparse file, which `sfdisk --verify`
/// finds wrong (the backup is not at the end, the protective MBR covers
/// 8 MiB); the backup moved, it finds nothing wrong, and the file is
/// still sparse past the image (only the new backup's blocks written).
#[test]
fn a_moved_backup_gpt_passes_sfdisk_verify_on_a_sparse_file() {
    use std::os::unix::fs::MetadataExt;
    const MIB: u64 = 1 << 20;
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = dir.path().join("disk.img");
    std::fs::File::create(&disk)
        .and_then(|f| f.set_len(8 * MIB))
        .expect("image file");
    let mut sfdisk = Command::new("sfdisk")
        .args(["--quiet", "--no-reread", "--no-tell-kernel"])
        .arg(&disk)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("sfdisk (fdisk) is not installed");
    std::io::Write::write_all(
        sfdisk.stdin.as_mut().expect("stdin"),
        b"label: gpt\nstart=2048, size=4096\nstart=6144\n",
    )
    .expect("sfdisk script");
    drop(sfdisk.stdin.take());
    assert!(sfdisk.wait().expect("sfdisk").success());
    let (clean, _) = sfdisk_verify(&disk);
    assert!(clean, "the image as made");

    let file = std::fs::File::options()
        .read(true)
        .write(true)
        .open(&disk)
        .expect("open");
    file.set_len(64 * MIB).expect("grow");
    let (clean, said) = sfdisk_verify(&disk);
    assert!(!clean, "a backup in the middle is found wrong");
    assert!(
        said.contains("The backup GPT table is not on the end of the device"),
        "{said}"
    );
    let blocks_before = file.metadata().expect("stat").blocks();

    let moved = move_backup_to_end(&file, 512, 64 * MIB).expect("moved");
    assert_eq!(
        moved,
        BackupGpt::Moved {
            from_lba: 16_383,
            to_lba: 131_071,
            last_usable_lba: 131_038,
        }
    );
    let (clean, said) = sfdisk_verify(&disk);
    assert!(clean, "sfdisk --verify: {said}");
    let allocated = file.metadata().expect("stat").blocks() - blocks_before;
    assert!(
        allocated <= 64,
        "{allocated} more 512-byte blocks allocated: the file is no longer sparse"
    );
    assert_eq!(
        move_backup_to_end(&file, 512, 64 * MIB).expect("again"),
        BackupGpt::AtEnd
    );
}
