//! With the `loader` feature: builds the A/B loader, a UEFI program in
//! Rust (`efi/`, see efi/README.md), with `efi/build.sh` into `OUT_DIR/efi`,
//! where `src/loader.rs` embeds `BOOTx64.EFI`. Without it: nothing.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    println!("cargo::rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_LOADER").is_none() {
        return ExitCode::SUCCESS;
    }
    let (Some(manifest_dir), Some(out_dir)) = (
        std::env::var_os("CARGO_MANIFEST_DIR"),
        std::env::var_os("OUT_DIR"),
    ) else {
        eprintln!("bmaas-agent build script: CARGO_MANIFEST_DIR or OUT_DIR unset (run by cargo?)");
        return ExitCode::FAILURE;
    };
    let manifest_dir = PathBuf::from(manifest_dir);
    let efi = manifest_dir.parent().unwrap_or(&manifest_dir).join("efi");
    // Not the whole directory: efi/target would trigger reruns.
    for path in [
        "build.sh",
        "Cargo.toml",
        "Cargo.lock",
        "fw",
        "ab-loader",
        "test-kernel",
    ] {
        println!("cargo::rerun-if-changed={}", efi.join(path).display());
    }
    // Where efi/build.sh looks for gnu-efi.
    println!("cargo::rerun-if-env-changed=GNUEFI_LIB");
    let script = efi.join("build.sh");
    let out = PathBuf::from(out_dir).join("efi");
    let help = "the `loader` feature of bmaas-agent builds the A/B loader with efi/build.sh, \
                which needs Debian's gnu-efi and binutils (apt-get install gnu-efi binutils); \
                without the feature the agent refuses Metropolis installations";
    match Command::new("bash").arg(&script).arg(&out).status() {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        Ok(status) => {
            eprintln!("{} {}: {status}; {help}", script.display(), out.display());
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("cannot run bash {}: {e}; {help}", script.display());
            ExitCode::FAILURE
        }
    }
}
