//! The EFI boot entry of a Metropolis install, written through efivarfs
//! (docs: the installation spec, section 4).
//!
//! efivarfs (`/sys/firmware/efi/efivars`) shows each variable as a file
//! `Name-VendorGUID` whose contents are the variable's 4-byte attributes
//! (little-endian) followed by its data. A variable is set by one
//! `write` of attributes and data together, and the kernel replaces the
//! whole variable with it; so every variable here is written with a
//! single `write` call and never truncated first.
//!
//! # Immutable files
//!
//! The kernel creates the files of variables that are not well-known
//! standard ones immutable (`FS_IMMUTABLE_FL`, what `chattr +i` sets), so
//! that removing one by accident cannot brick firmware that fails without
//! it (Documentation/filesystems/efivarfs.rst). An immutable file cannot
//! be opened for writing (`EPERM`), even by root. `Boot####` and
//! `BootOrder` are standard variables and normally not immutable, but a
//! kernel whose list of standard variables lacks one, or a previous tool
//! that set the flag, would make overwriting `BootOrder` fail. So before
//! an existing variable is overwritten, it is opened read-only, its flags
//! read with `FS_IOC_GETFLAGS` and, if `FS_IMMUTABLE_FL` is set, written
//! back without it with `FS_IOC_SETFLAGS` (which needs root or
//! `CAP_LINUX_IMMUTABLE`, not a writable descriptor); after the write the
//! flag is set again (best effort). A filesystem without inode flags (a
//! test directory on some filesystems) answers `ENOTTY` or `EOPNOTSUPP`,
//! which means "not immutable" and is ignored.
//!
//! A new variable (`Boot####`) is created with `O_CREAT | O_EXCL`, which
//! also picks the lowest free number safely against a concurrent writer.

mod load_option;

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::Path;

pub use load_option::{
    BOOT_LOADER_PATH, DecodeError, END_NODE, LOAD_OPTION_ACTIVE, LoadOption, MAX_DEVICE_PATH,
    decode_load_option, encode_load_option, esp_boot_path, file_path_node, hard_drive_device_path,
};

use crate::disk::Layout;

/// `EFI_GLOBAL_VARIABLE`, the vendor GUID of `Boot####` and `BootOrder`.
pub const GLOBAL_VARIABLE_GUID: &str = "8be4df61-93ca-11d2-aa0d-00e098032b8c";

/// The attributes of the boot variables: non-volatile, boot service
/// access, runtime access.
pub const BOOT_VARIABLE_ATTRIBUTES: u32 = 0x7;

/// The description of the Metropolis boot entry.
pub const DESCRIPTION: &str = "Metropolis";

/// `FS_IMMUTABLE_FL` from linux/fs.h.
const FS_IMMUTABLE_FL: libc::c_int = 0x10;

/// Why the boot entry could not be added.
#[derive(Debug)]
#[non_exhaustive]
pub enum EfiVarError {
    /// `Boot0000` to `BootFFFE` all exist.
    NoFreeEntry,
    /// The variables directory (efivarfs) could not be listed.
    List {
        /// The directory.
        dir: std::path::PathBuf,
        /// The error.
        source: io::Error,
    },
    /// Opening, writing or clearing the immutable flag of a variable
    /// failed.
    Write {
        /// The variable's name (`Boot0003`, `BootOrder`).
        variable: String,
        /// The error of efivarfs (from the firmware, for writes).
        source: io::Error,
    },
    /// The write of a variable was cut short.
    ShortWrite {
        /// The variable's name.
        variable: String,
        /// Bytes written.
        written: usize,
        /// Bytes of attributes and data.
        expected: usize,
    },
}

impl fmt::Display for EfiVarError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EfiVarError::NoFreeEntry => write!(f, "no free Boot#### variable (0000 to FFFE)"),
            EfiVarError::List { dir, source } => {
                write!(
                    f,
                    "listing the EFI variables in {}: {source}",
                    dir.display()
                )
            }
            EfiVarError::Write { variable, source } => {
                write!(f, "writing EFI variable {variable}: {source}")
            }
            EfiVarError::ShortWrite {
                variable,
                written,
                expected,
            } => write!(
                f,
                "writing EFI variable {variable}: {written} of {expected} bytes written"
            ),
        }
    }
}

impl std::error::Error for EfiVarError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            EfiVarError::Write { source, .. } | EfiVarError::List { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Whether the machine was booted through EFI: `firmware_dir`
/// (`/sys/firmware/efi`) exists only then.
pub fn efi_booted(firmware_dir: &Path) -> bool {
    firmware_dir.is_dir()
}

/// Adds the Metropolis boot entry for `layout`'s ESP in `efivars_dir`
/// (`/sys/firmware/efi/efivars`): a new `Boot####` with the lowest free
/// number (existing entries kept), then `BootOrder` replaced by just that
/// entry. Returns the entry's number.
///
/// When `BootOrder` cannot be written, the new `Boot####` is deleted again
/// (best effort: removing an efivarfs file deletes its variable), so that
/// installs retried under new generations do not fill the firmware's
/// variable store with entries nothing boots.
pub fn add_boot_entry(efivars_dir: &Path, layout: &Layout) -> Result<u16, EfiVarError> {
    let option = encode_load_option(DESCRIPTION, &esp_boot_path(layout));
    let number = create_boot_variable(efivars_dir, &option)?;
    let variable = "BootOrder";
    let order = write_existing_or_new(
        &efivars_dir.join(format!("{variable}-{GLOBAL_VARIABLE_GUID}")),
        variable,
        &with_attributes(&number.to_le_bytes()),
    );
    if let Err(e) = order {
        let _ = std::fs::remove_file(boot_variable_path(efivars_dir, number));
        return Err(e);
    }
    Ok(number)
}

/// The file of variable `Boot####` for `number` in `dir`.
fn boot_variable_path(dir: &Path, number: u16) -> std::path::PathBuf {
    dir.join(format!("Boot{number:04X}-{GLOBAL_VARIABLE_GUID}"))
}

/// `BOOT_VARIABLE_ATTRIBUTES` followed by `data`: a variable file's
/// contents.
fn with_attributes(data: &[u8]) -> Vec<u8> {
    let mut contents = BOOT_VARIABLE_ATTRIBUTES.to_le_bytes().to_vec();
    contents.extend_from_slice(data);
    contents
}

/// The numbers of the `Boot####` variables in `dir`, their hex digits in
/// either case: this agent and firmware write uppercase, but a
/// `Boot000a` another tool wrote is an entry too (the reference matches
/// both).
fn existing_boot_numbers(dir: &Path) -> io::Result<std::collections::HashSet<u16>> {
    let mut numbers = std::collections::HashSet::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("Boot")) else {
            continue;
        };
        let Some((hex, guid)) = rest.split_at_checked(4) else {
            continue;
        };
        let ours = guid
            .strip_prefix('-')
            .is_some_and(|g| g.eq_ignore_ascii_case(GLOBAL_VARIABLE_GUID));
        if ours
            && hex.bytes().all(|b| b.is_ascii_hexdigit())
            && let Ok(number) = u16::from_str_radix(hex, 16)
        {
            numbers.insert(number);
        }
    }
    Ok(numbers)
}

/// Creates the lowest free `Boot####` holding `option`.
fn create_boot_variable(dir: &Path, option: &[u8]) -> Result<u16, EfiVarError> {
    let contents = with_attributes(option);
    let taken = existing_boot_numbers(dir).map_err(|source| EfiVarError::List {
        dir: dir.to_path_buf(),
        source,
    })?;
    for number in (0..=0xFFFEu16).filter(|n| !taken.contains(n)) {
        let variable = format!("Boot{number:04X}");
        let path = boot_variable_path(dir, number);
        let file = match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(source) => return Err(EfiVarError::Write { variable, source }),
        };
        if let Err(e) = write_once(file, &variable, &contents) {
            // Leave no empty variable file behind.
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        return Ok(number);
    }
    Err(EfiVarError::NoFreeEntry)
}

/// Replaces (or creates) the variable at `path` with `contents`, clearing
/// its immutable flag for the write if it has one.
fn write_existing_or_new(path: &Path, variable: &str, contents: &[u8]) -> Result<(), EfiVarError> {
    let failed = |source| EfiVarError::Write {
        variable: variable.to_string(),
        source,
    };
    let immutable = match File::open(path) {
        Ok(existing) => clear_immutable(&existing).map_err(failed)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(failed(e)),
    };
    let written = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(failed)
        .and_then(|file| write_once(file, variable, contents));
    if let Some((file, flags)) = immutable {
        let _ = set_flags(&file, flags);
    }
    written
}

/// Writes `contents` with a single `write` (efivarfs sets the variable
/// from exactly one), then cuts off whatever was beyond it (nothing on
/// efivarfs, where the file is the variable; old bytes in a plain file).
fn write_once(mut file: File, variable: &str, contents: &[u8]) -> Result<(), EfiVarError> {
    let failed = |source| EfiVarError::Write {
        variable: variable.to_string(),
        source,
    };
    let written = file.write(contents).map_err(failed)?;
    if written != contents.len() {
        return Err(EfiVarError::ShortWrite {
            variable: variable.to_string(),
            written,
            expected: contents.len(),
        });
    }
    let len = contents.len() as u64;
    if file.metadata().map_err(failed)?.len() > len {
        file.set_len(len).map_err(failed)?;
    }
    Ok(())
}

/// Clears `FS_IMMUTABLE_FL` on `file` if set; returns the file and its
/// original flags to restore them. No inode flags at all is not an error.
fn clear_immutable(file: &File) -> io::Result<Option<(File, libc::c_int)>> {
    let mut flags: libc::c_int = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one int (the kernel's handler uses an
    // int despite the ioctl number's `long`) to the pointer, which points
    // to `flags`; the descriptor is open while `file` is borrowed.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::FS_IOC_GETFLAGS, &raw mut flags) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOTTY | libc::EOPNOTSUPP | libc::EINVAL) => Ok(None),
            _ => Err(e),
        };
    }
    if flags & FS_IMMUTABLE_FL == 0 {
        return Ok(None);
    }
    set_flags(file, flags & !FS_IMMUTABLE_FL)?;
    Ok(Some((file.try_clone()?, flags)))
}

fn set_flags(file: &File, flags: libc::c_int) -> io::Result<()> {
    // SAFETY: FS_IOC_SETFLAGS reads one int from the pointer, which
    // points to `flags`; the descriptor is open while `file` is borrowed.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::FS_IOC_SETFLAGS, &raw const flags) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests;
