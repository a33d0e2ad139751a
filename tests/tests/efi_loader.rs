//! The A/B loader booting in a VM: efi/build.sh builds it and the test
//! kernel, which go on the ESP of a GPT disk image as
//! `\EFI\BOOT\BOOTx64.EFI` and `\EFI\metropolis\boot-{a,b}.efi`; QEMU
//! (TCG) on OVMF boots it by the removable-media rule, and the test
//! kernel's line on the serial console says which file was started and
//! the SHA-256 of `\metropolis\parameters.pb` it read.
//!
//! Needs (Debian): gnu-efi and binutils (efi/build.sh), qemu-system-x86,
//! ovmf, fdisk (sfdisk), mtools.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use metropolis_core::hex;
use metropolis_tests::qemu::{EspImage, Qemu, QemuConfig, build_efi_programs, vars_copy};
use sha2::{Digest, Sha256};

const MARKER: &str = "METROPOLIS-TEST-KERNEL started as ";
const STATE: &str = "EFI/metropolis/loader_state.pb";
const PARAMETERS: &str = "metropolis/parameters.pb";
const BOOT_A: &str = "\\EFI\\metropolis\\boot-a.efi";
const BOOT_B: &str = "\\EFI\\metropolis\\boot-b.efi";
/// OVMF under TCG on a loaded two-core machine: generous.
const BOOT_TIMEOUT: Duration = Duration::from_secs(180);

/// The built programs (once per test binary, into the test target's
/// temporary directory so that reruns are incremental).
fn programs() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("efi-loader");
        build_efi_programs(&out);
        out
    })
}

fn program(name: &str) -> Vec<u8> {
    std::fs::read(programs().join(name)).unwrap()
}

/// A disk whose ESP holds the loader, the test kernel in the slots asked
/// for, and `parameters`.
struct Machine {
    dir: tempfile::TempDir,
    esp: EspImage,
    vars: PathBuf,
    boots: usize,
}

impl Machine {
    fn new(slots: &[&str], parameters: Option<&[u8]>) -> Machine {
        let dir = tempfile::tempdir().unwrap();
        let esp = EspImage::create(&dir.path().join("disk.img"), 64, "MNGN_BOOT");
        esp.put("EFI/BOOT/BOOTx64.EFI", &program("BOOTx64.EFI"));
        let kernel = program("test-kernel.efi");
        for slot in slots {
            esp.put(&format!("EFI/metropolis/boot-{slot}.efi"), &kernel);
        }
        if let Some(parameters) = parameters {
            esp.put(PARAMETERS, parameters);
        }
        let vars = dir.path().join("vars.fd");
        vars_copy(&vars);
        Machine {
            dir,
            esp,
            vars,
            boots: 0,
        }
    }

    /// Boots until the test kernel powers off: its path and digest, and
    /// the whole console.
    fn boot(&mut self) -> (String, String, String) {
        self.boots += 1;
        let config = QemuConfig::new(&self.esp.path, &self.vars);
        let mut vm = Qemu::start(&config, self.dir.path(), &format!("boot{}", self.boots));
        let line = vm
            .wait_for(MARKER, BOOT_TIMEOUT)
            .unwrap_or_else(|e| panic!("{e}"));
        vm.wait_exit(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{e}"));
        let console = vm.serial();
        let rest = &line[MARKER.len()..];
        let (path, rest) = rest
            .split_once(" parameters-sha256 ")
            .unwrap_or_else(|| panic!("malformed line {line:?}"));
        let digest = rest.split(" boot-current ").next().unwrap_or(rest);
        (path.to_string(), digest.trim().to_string(), console)
    }
}

#[test]
fn without_a_state_file_slot_a_boots_with_the_parameters() {
    let parameters = b"\x0a\x03abc not really NodeParameters".repeat(300);
    let mut machine = Machine::new(&["a", "b"], Some(&parameters));
    let (path, digest, console) = machine.boot();
    assert_eq!(path, BOOT_A, "{console}");
    assert_eq!(
        digest,
        hex::encode(&Sha256::digest(&parameters)),
        "{console}"
    );
    assert!(
        console.contains("ab-loader: booting slot A (no loader_state.pb)"),
        "{console}"
    );
    assert_eq!(machine.esp.get(STATE), None);
}

#[test]
fn next_slot_b_boots_b_once_then_a_again() {
    let mut machine = Machine::new(&["a", "b"], None);
    // active_slot A, next_slot B.
    machine.esp.put(STATE, &[0x08, 0x01, 0x10, 0x02]);
    let (path, digest, console) = machine.boot();
    assert_eq!(path, BOOT_B, "{console}");
    assert_eq!(digest, "missing", "{console}");
    assert!(
        console.contains("ab-loader: booting slot B (next_slot, once)"),
        "{console}"
    );
    // next_slot cleared, active_slot kept.
    assert_eq!(machine.esp.get(STATE).as_deref(), Some(&[0x08, 0x01][..]));
    let (path, _, console) = machine.boot();
    assert_eq!(path, BOOT_A, "{console}");
    assert!(
        console.contains("ab-loader: booting slot A (active_slot)"),
        "{console}"
    );
    assert_eq!(machine.esp.get(STATE).as_deref(), Some(&[0x08, 0x01][..]));

    // active_slot B sticks.
    machine.esp.put(STATE, &[0x08, 0x02]);
    let (path, _, console) = machine.boot();
    assert_eq!(path, BOOT_B, "{console}");
    assert_eq!(machine.esp.get(STATE).as_deref(), Some(&[0x08, 0x02][..]));
}

#[test]
fn a_missing_slot_b_falls_back_to_a() {
    let parameters = b"p";
    let mut machine = Machine::new(&["a"], Some(parameters));
    // next_slot B, active_slot unset.
    machine.esp.put(STATE, &[0x10, 0x02]);
    let (path, digest, console) = machine.boot();
    assert_eq!(path, BOOT_A, "{console}");
    assert_eq!(
        digest,
        hex::encode(&Sha256::digest(parameters)),
        "{console}"
    );
    assert!(
        console.contains("ab-loader: slot B failed: LoadImage: Not Found"),
        "{console}"
    );
    assert!(console.contains("ab-loader: trying slot A"), "{console}");
    // Cleared before the attempt: an empty message.
    assert_eq!(machine.esp.get(STATE).as_deref(), Some(&[][..]));
}

#[test]
fn an_undecodable_state_file_means_slot_a() {
    let mut machine = Machine::new(&["a", "b"], None);
    // active_slot as a length-delimited field: malformed.
    machine.esp.put(STATE, &[0x0a, 0x01, 0x02]);
    let (path, _, console) = machine.boot();
    assert_eq!(path, BOOT_A, "{console}");
    assert!(
        console.contains("ab-loader: booting slot A (loader_state.pb undecodable)"),
        "{console}"
    );
    // Left as it was.
    assert_eq!(
        machine.esp.get(STATE).as_deref(),
        Some(&[0x0a, 0x01, 0x02][..])
    );
}
