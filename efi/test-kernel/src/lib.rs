//! A stand-in for the node's `kernel.efi` in tests: prints
//!
//! ```text
//! METROPOLIS-TEST-KERNEL started as <its file path> parameters-sha256 <hex or "missing">
//! ```
//!
//! (the path as its LoadedImage's FilePath names it, e.g.
//! `\EFI\metropolis\boot-a.efi`; the SHA-256 of `\metropolis\parameters.pb`
//! on its device), then powers the machine off.

#![no_std]

use efi_fw::{Efi, Handle, Line, Mode, Status, SystemTable};
use sha2::{Digest, Sha256};

/// The parameters file whose digest is printed.
const PARAMETERS: &str = "\\metropolis\\parameters.pb";

/// Entry point, called by gnu-efi's crt0 with the firmware's arguments.
///
/// # Safety
///
/// `image` and `system_table` are what the firmware passed to this image,
/// in boot services.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn efi_main(image: Handle, system_table: *mut SystemTable) -> Status {
    // SAFETY: the function's contract.
    let Some(efi) = (unsafe { Efi::new(image, system_table) }) else {
        return Status::INVALID_PARAMETER;
    };
    let mut line = Line::new();
    let mut path_buf = [0u8; 256];
    let path = match efi.own_file_path(&mut path_buf) {
        Ok(path) => path,
        Err(e) => {
            line.str("test-kernel: cannot tell its own path: ");
            efi.print(e.describe(&mut line));
            "unknown"
        }
    };
    let digest = parameters_digest(&efi, &mut line);
    line.str("METROPOLIS-TEST-KERNEL started as ")
        .str(path)
        .str(" parameters-sha256 ");
    match digest {
        Some(digest) => line.hex(&digest),
        None => line.str("missing"),
    };
    efi.print(&mut line);
    efi.shutdown()
}

/// The SHA-256 of the parameters file, `None` when it cannot be read
/// (said on the console unless it is just absent).
fn parameters_digest(efi: &Efi, line: &mut Line) -> Option<[u8; 32]> {
    let result = efi.boot_volume().and_then(|volume| {
        let mut file = volume.open(PARAMETERS, Mode::Read)?;
        let mut hasher = Sha256::new();
        let mut chunk = [0u8; 4096];
        loop {
            let n = file.read(&mut chunk)?;
            if n == 0 {
                break;
            }
            hasher.update(&chunk[..n]);
        }
        Ok(<[u8; 32]>::from(hasher.finalize()))
    });
    match result {
        Ok(digest) => Some(digest),
        Err(e) => {
            if e.status != Status::NOT_FOUND {
                line.str("test-kernel: cannot read ")
                    .str(PARAMETERS)
                    .str(": ");
                efi.print(e.describe(line));
            }
            None
        }
    }
}
