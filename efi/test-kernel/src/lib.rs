//! A stand-in for the node's `kernel.efi` in tests: prints
//!
//! ```text
//! METROPOLIS-TEST-KERNEL started as <its file path> parameters-sha256 <hex or "missing"> boot-current <hex or "missing">
//! ```
//!
//! (the path as its LoadedImage's FilePath names it, e.g.
//! `\EFI\metropolis\boot-a.efi`; the SHA-256 of `\metropolis\parameters.pb`
//! on its device; the `BootCurrent` variable: which `Boot####` the
//! firmware started), then powers the machine off.
//!
//! When its device holds `\test-vars\BootOrder` (a variable file as
//! efivarfs shows it: 4 bytes of attributes, then the data), it first
//! sets the `Boot####` its first entry names from `\test-vars\Boot####`
//! and then `BootOrder` itself, and says so: how a test puts the boot
//! entry the agent wrote (into a directory standing in for efivarfs)
//! into the firmware's variable store, for the next boot to follow.

#![no_std]

use efi_fw::vars::GLOBAL_VARIABLE;
use efi_fw::{Efi, Error, Handle, Line, Mode, Status, SystemTable};
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
    line.str(" boot-current ");
    let mut current = [0u8; 2];
    match efi.get_variable("BootCurrent", &GLOBAL_VARIABLE, &mut current) {
        Ok((_, 2)) => line.hex(&[current[1], current[0]]),
        _ => line.str("missing"),
    };
    efi.print(&mut line);
    match install_test_vars(&efi) {
        Ok(Some(number)) => {
            line.str("test-kernel: set Boot").hex(&number.to_be_bytes());
            efi.print(line.str(" and BootOrder"));
        }
        Ok(None) => {}
        Err(e) => {
            line.str("test-kernel: test variables not set: ");
            efi.print(e.describe(&mut line));
        }
    }
    efi.shutdown()
}

/// The largest variable file read from `\test-vars`.
const MAX_VARIABLE: usize = 1024;

/// Sets the variables staged in `\test-vars` (see the crate's
/// documentation): the `Boot####` number set, or `None` when there is no
/// `\test-vars\BootOrder`.
fn install_test_vars(efi: &Efi) -> Result<Option<u16>, Error> {
    let volume = efi.boot_volume()?;
    let mut order = [0u8; MAX_VARIABLE];
    let order_len = match read_variable_file(&volume, "\\test-vars\\BootOrder", &mut order) {
        Err(e) if e.status == Status::NOT_FOUND => return Ok(None),
        other => other?,
    };
    if order_len < 6 {
        return Err(Error {
            step: "\\test-vars\\BootOrder",
            status: Status::BAD_BUFFER_SIZE,
        });
    }
    let number = u16::from_le_bytes([order[4], order[5]]);
    let mut name = *b"Boot0000";
    const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
    for (i, shift) in [12u16, 8, 4, 0].into_iter().enumerate() {
        name[4 + i] = DIGITS[usize::from((number >> shift) & 15)];
    }
    let mut path = *b"\\test-vars\\Boot0000";
    path[11..].copy_from_slice(&name);
    // ASCII digits and letters only.
    let name = core::str::from_utf8(&name).unwrap_or("Boot0000");
    let path = core::str::from_utf8(&path).unwrap_or("\\test-vars\\Boot0000");
    let mut entry = [0u8; MAX_VARIABLE];
    let entry_len = read_variable_file(&volume, path, &mut entry)?;
    if entry_len < 4 {
        return Err(Error {
            step: "\\test-vars\\Boot####",
            status: Status::BAD_BUFFER_SIZE,
        });
    }
    let attributes = |v: &[u8]| u32::from_le_bytes([v[0], v[1], v[2], v[3]]);
    efi.set_variable(
        name,
        &GLOBAL_VARIABLE,
        attributes(&entry),
        &entry[4..entry_len],
    )?;
    efi.set_variable(
        "BootOrder",
        &GLOBAL_VARIABLE,
        attributes(&order),
        &order[4..order_len],
    )?;
    Ok(Some(number))
}

/// Reads the variable file `path` of `volume` into `buf`: its length.
fn read_variable_file(
    volume: &efi_fw::Volume<'_>,
    path: &str,
    buf: &mut [u8],
) -> Result<usize, Error> {
    let mut file = volume.open(path, Mode::Read)?;
    file.read_all(buf)?.ok_or(Error {
        step: "test variable file",
        status: Status::BUFFER_TOO_SMALL,
    })
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
