//! A QEMU x86_64 virtual machine on UEFI firmware (Debian's `ovmf`),
//! emulated (TCG, never KVM), booting raw disk images, its serial console
//! captured to a file; and an ESP disk image made and read with `sfdisk`
//! and mtools, for putting programs on it and reading back what they
//! wrote.
//!
//! OVMF with an empty variable store boots `\EFI\BOOT\BOOTx64.EFI` of the
//! first disk (the removable-media rule); give the VM the variable store a
//! previous boot or an installer wrote to boot its entries instead. Under
//! TCG, OVMF takes about 5–40 s to reach a boot loader: allow minutes.
//!
//! Needs `qemu-system-x86` and `ovmf` (and `fdisk`, `mtools` for
//! [`EspImage`]); missing tools are a panic naming the Debian package.
//! The VM is killed and reaped by its own handle when dropped.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// OVMF's firmware code, read-only.
pub const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
/// OVMF's empty variable store, copied for each VM (see [`vars_copy`]).
pub const OVMF_VARS: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";

/// Copies OVMF's empty variable store to `dest` (writable): a VM's
/// non-volatile variables (boot entries) live there, and a later VM given
/// the same file sees them.
pub fn vars_copy(dest: &Path) {
    assert!(
        Path::new(OVMF_CODE).exists() && Path::new(OVMF_VARS).exists(),
        "{OVMF_CODE} or {OVMF_VARS} missing: install Debian's ovmf"
    );
    std::fs::copy(OVMF_VARS, dest)
        .unwrap_or_else(|e| panic!("copy {OVMF_VARS} to {}: {e}", dest.display()));
    let mut perms = std::fs::metadata(dest).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perms.set_readonly(false);
    std::fs::set_permissions(dest, perms).unwrap();
}

/// Builds the A/B loader and the test kernel with `efi/build.sh` into
/// `out` (`BOOTx64.EFI`, `test-kernel.efi`); panics with the script's
/// output when it fails (gnu-efi or binutils missing). Incremental: a
/// test passes the same `out` every run.
pub fn build_efi_programs(out: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../efi/build.sh");
    let output = Command::new("bash").arg(&script).arg(out).output().unwrap();
    assert!(
        output.status.success(),
        "{} failed ({}):\n{}",
        script.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

/// How to start a [`Qemu`].
#[derive(Clone, Debug)]
pub struct QemuConfig {
    /// Raw disk images, attached as virtio disks in this order (the first
    /// is the one the removable-media rule boots).
    pub disks: Vec<PathBuf>,
    /// The VM's writable variable store ([`vars_copy`]).
    pub vars: PathBuf,
    /// Memory, MiB.
    pub memory_mib: u32,
    /// Whether a reset reboots the VM (`false`: `-no-reboot`, a reset or
    /// a shutdown ends QEMU).
    pub reboot: bool,
    /// More QEMU arguments (a network, more devices).
    pub extra_args: Vec<String>,
}

impl QemuConfig {
    /// One disk, the variable store `vars`, 256 MiB, no reboot.
    pub fn new(disk: &Path, vars: &Path) -> QemuConfig {
        QemuConfig {
            disks: vec![disk.to_path_buf()],
            vars: vars.to_path_buf(),
            memory_mib: 256,
            reboot: false,
            extra_args: Vec::new(),
        }
    }
}

/// A running `qemu-system-x86_64`, killed when dropped.
pub struct Qemu {
    child: Option<Child>,
    serial: PathBuf,
    stderr: PathBuf,
    exited: Option<ExitStatus>,
}

impl Qemu {
    /// Starts the VM; its serial console goes to `log_dir/<name>.serial`
    /// and QEMU's own messages to `log_dir/<name>.stderr`.
    pub fn start(config: &QemuConfig, log_dir: &Path, name: &str) -> Qemu {
        let serial = log_dir.join(format!("{name}.serial"));
        let stderr = log_dir.join(format!("{name}.stderr"));
        std::fs::write(&serial, b"").unwrap();
        let mut cmd = Command::new("qemu-system-x86_64");
        cmd.args(["-accel", "tcg", "-machine", "q35", "-m"])
            .arg(config.memory_mib.to_string())
            .args(["-display", "none", "-vga", "none", "-monitor", "none"])
            .args(["-nic", "none"])
            .arg("-drive")
            .arg(format!(
                "if=pflash,format=raw,unit=0,readonly=on,file={OVMF_CODE}"
            ))
            .arg("-drive")
            .arg(format!(
                "if=pflash,format=raw,unit=1,file={}",
                config.vars.display()
            ))
            .arg("-serial")
            .arg(format!("file:{}", serial.display()));
        if !config.reboot {
            cmd.arg("-no-reboot");
        }
        for disk in &config.disks {
            cmd.arg("-drive")
                .arg(format!("if=virtio,format=raw,file={}", disk.display()));
        }
        cmd.args(&config.extra_args);
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("qemu-system-x86_64: {e} (install Debian's qemu-system-x86)")
            });
        Qemu {
            child: Some(child),
            serial,
            stderr,
            exited: None,
        }
    }

    /// The serial console so far, carriage returns removed.
    pub fn serial(&self) -> String {
        let mut bytes = Vec::new();
        if let Ok(mut f) = std::fs::File::open(&self.serial) {
            let _ = f.read_to_end(&mut bytes);
        }
        String::from_utf8_lossy(&bytes).replace('\r', "")
    }

    /// The serial log's path.
    pub fn serial_path(&self) -> &Path {
        &self.serial
    }

    fn poll_exit(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none()
            && let Some(child) = self.child.as_mut()
            && let Ok(Some(status)) = child.try_wait()
        {
            self.exited = Some(status);
            self.child = None;
        }
        self.exited
    }

    /// What went wrong, with the serial console and QEMU's messages.
    fn report(&self, what: &str) -> String {
        let stderr = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        format!(
            "{what}\n--- serial console ({}) ---\n{}\n--- qemu stderr ---\n{stderr}",
            self.serial.display(),
            self.serial()
        )
    }

    /// Waits until a line of the serial console contains `marker`, and
    /// returns that line from the marker on. An error (with the console
    /// and QEMU's messages) when QEMU ends first or `timeout` passes.
    pub fn wait_for(&mut self, marker: &str, timeout: Duration) -> Result<String, String> {
        let deadline = Instant::now() + timeout;
        loop {
            // Read before polling the exit: what was written before QEMU
            // ended is then certainly seen.
            let exited = self.poll_exit();
            let serial = self.serial();
            if let Some(line) = serial
                .lines()
                .find_map(|l| l.find(marker).map(|at| &l[at..]))
            {
                // A line still being written has no newline yet.
                let complete = serial
                    .find(line)
                    .is_some_and(|at| serial[at..].contains('\n'));
                if complete || exited.is_some() {
                    return Ok(line.to_string());
                }
            }
            if let Some(status) = exited {
                return Err(self.report(&format!("QEMU ended ({status}) before {marker:?}")));
            }
            if Instant::now() >= deadline {
                return Err(self.report(&format!("no {marker:?} within {timeout:?}")));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits for QEMU to end by itself (a shutdown, or a reset with
    /// `reboot` off); an error when `timeout` passes first.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus, String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.poll_exit() {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                return Err(self.report(&format!("QEMU still running after {timeout:?}")));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A raw disk image with a GPT and one ESP (FAT32), read and written with
/// mtools at the partition's offset.
pub struct EspImage {
    /// The image file.
    pub path: PathBuf,
    /// The ESP's byte offset in it.
    pub offset: u64,
}

impl EspImage {
    /// The ESP starts here (1 MiB, as installers align it).
    const START_SECTOR: u64 = 2048;

    /// Makes `path`: `size_mib` MiB (at least 40: FAT32 with one sector
    /// per cluster needs 65525 clusters), a GPT whose only partition,
    /// `ESP`, starts at 1 MiB and fills the disk, formatted FAT32 with the
    /// label `label`.
    pub fn create(path: &Path, size_mib: u64, label: &str) -> EspImage {
        assert!(
            size_mib >= 40,
            "an ESP image of {size_mib} MiB is too small for FAT32"
        );
        let f = std::fs::File::create(path).unwrap();
        f.set_len(size_mib << 20).unwrap();
        drop(f);
        // Leave room for the backup GPT (33 sectors) at the end.
        let sectors = (size_mib << 11) - Self::START_SECTOR - 64;
        let table = format!(
            "label: gpt\nstart={}, size={sectors}, type=C12A7328-F81F-11D2-BA4B-00A0C93EC93B, name=ESP\n",
            Self::START_SECTOR
        );
        run_with_input(
            Command::new("sfdisk")
                .args(["--quiet", "--no-reread", "--no-tell-kernel"])
                .arg(path),
            table.as_bytes(),
            "fdisk",
        );
        let esp = EspImage {
            path: path.to_path_buf(),
            offset: Self::START_SECTOR * 512,
        };
        run(
            Command::new("mformat")
                .arg("-i")
                .arg(esp.spec())
                .args(["-F", "-c", "1", "-T"])
                .arg(sectors.to_string())
                .args(["-v", label, "::"]),
            "mtools",
        );
        esp
    }

    /// mtools' image argument: `path@@offset`.
    fn spec(&self) -> String {
        format!("{}@@{}", self.path.display(), self.offset)
    }

    /// Writes `bytes` to `path` on the ESP (`/EFI/BOOT/BOOTx64.EFI`),
    /// making its directories, replacing a file there.
    pub fn put(&self, path: &str, bytes: &[u8]) {
        let path = path.trim_start_matches('/');
        let mut dir = String::new();
        let parts: Vec<&str> = path.split('/').collect();
        for part in &parts[..parts.len() - 1] {
            dir.push('/');
            dir.push_str(part);
            let exists = Command::new("mdir")
                .args(["-b", "-i"])
                .arg(self.spec())
                .arg(format!("::{dir}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if !exists {
                run(
                    Command::new("mmd")
                        .arg("-i")
                        .arg(self.spec())
                        .arg(format!("::{dir}")),
                    "mtools",
                );
            }
        }
        let tmp = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(tmp.path(), bytes).unwrap();
        run(
            Command::new("mcopy")
                .args(["-o", "-i"])
                .arg(self.spec())
                .arg(tmp.path())
                .arg(format!("::/{path}")),
            "mtools",
        );
    }

    /// Deletes `path` on the ESP, if it is there.
    pub fn remove(&self, path: &str) {
        let path = path.trim_start_matches('/');
        let _ = Command::new("mdel")
            .arg("-i")
            .arg(self.spec())
            .arg(format!("::/{path}"))
            .stderr(Stdio::null())
            .status();
    }

    /// The content of `path` on the ESP; `None` when there is no such
    /// file.
    pub fn get(&self, path: &str) -> Option<Vec<u8>> {
        let path = path.trim_start_matches('/');
        let tmp = tempfile::tempdir().unwrap();
        let dest = tmp.path().join("file");
        let out = Command::new("mcopy")
            .arg("-i")
            .arg(self.spec())
            .arg(format!("::/{path}"))
            .arg(&dest)
            .output()
            .unwrap_or_else(|e| panic!("mcopy: {e} (install Debian's mtools)"));
        if !out.status.success() {
            return None;
        }
        Some(std::fs::read(&dest).unwrap())
    }
}

fn run(cmd: &mut Command, package: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (install Debian's {package})"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

fn run_with_input(cmd: &mut Command, input: &[u8], package: &str) {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (install Debian's {package})"));
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
