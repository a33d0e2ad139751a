//! A loop block device over a temporary file (`losetup`, as root), for
//! installing onto a real block device; detached when dropped.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A loop device attached to a file of its own.
pub struct LoopDevice {
    /// The device, e.g. `/dev/loop3`.
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

impl LoopDevice {
    /// Attaches a loop device to a new file of `size` bytes holding
    /// `fill` in every byte. Panics with what to do when that is not
    /// possible (not root, no loop support).
    pub fn attach(size: u64, fill: u8) -> LoopDevice {
        let dir = tempfile::tempdir().unwrap();
        let backing = dir.path().join("backing.img");
        std::fs::write(&backing, vec![fill; size as usize]).unwrap();
        Self::attach_file(&backing, dir)
    }

    /// Attaches a loop device to a sparse file of `size` bytes in a new
    /// directory under `parent` (e.g. on the disk a benchmark measures).
    pub fn attach_sparse_in(parent: &Path, size: u64) -> LoopDevice {
        Self::attach_sparse_with(parent, size, &[])
    }

    /// [`attach_sparse_in`](Self::attach_sparse_in), with partitions of
    /// its own (`losetup --partscan`): the kernel reads its partition
    /// table, shows `/dev/loopNpM`, and re-reads it when asked
    /// (`BLKRRPART`); without, the kernel refuses that (EINVAL).
    pub fn attach_sparse_partitioned_in(parent: &Path, size: u64) -> LoopDevice {
        Self::attach_sparse_with(parent, size, &["--partscan"])
    }

    /// A sparse backing file of `size` bytes in a new directory under
    /// `parent`, attached with `losetup` `flags`.
    fn attach_sparse_with(parent: &Path, size: u64, flags: &[&str]) -> LoopDevice {
        let dir = tempfile::tempdir_in(parent).unwrap();
        let backing = dir.path().join("backing.img");
        std::fs::File::create(&backing)
            .unwrap()
            .set_len(size)
            .unwrap();
        Self::attach_with(&backing, dir, flags)
    }

    fn attach_file(backing: &Path, dir: tempfile::TempDir) -> LoopDevice {
        Self::attach_with(backing, dir, &[])
    }

    fn attach_with(backing: &Path, dir: tempfile::TempDir, flags: &[&str]) -> LoopDevice {
        let out = Command::new("losetup")
            .arg("--find")
            .arg("--show")
            .args(flags)
            .arg(backing)
            .output()
            .expect("losetup (util-linux) is not installed");
        assert!(
            out.status.success(),
            "losetup --find --show failed (these tests need root and loop devices): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        LoopDevice { path, _dir: dir }
    }

    /// The device's whole content.
    pub fn read(&self) -> Vec<u8> {
        std::fs::read(&self.path).unwrap()
    }

    /// The device's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of its partition `n` (`/dev/loop3p1`), which exists only
    /// while the kernel knows the partition.
    pub fn partition(&self, n: u32) -> PathBuf {
        let mut name = self.path.as_os_str().to_owned();
        name.push(format!("p{n}"));
        PathBuf::from(name)
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.path).status();
    }
}
