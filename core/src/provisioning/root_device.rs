//! The `root_device` of a Metropolis installation request: which values
//! name a device to install to, and the path each one means. The server
//! refuses any other value when the request is submitted; the agent checks
//! again before it writes anything.
//!
//! A root device is named either by a bare device name (no `/`: `sda`,
//! `nvme0n1`), meaning that name under `/dev`, or by an absolute path
//! under `/dev/` (`/dev/vda`, `/dev/disk/by-id/…`), with no `.` or `..`
//! component. Anything else (`/etc/shadow`, `../../etc/passwd`,
//! `./disk.img`, the empty string) is refused: installing overwrites the
//! target from its first byte.

use std::fmt;

use crate::quote::quoted;

/// The directory every root device is under.
pub const DEVICE_DIR: &str = "/dev/";

/// The longest accepted `root_device`, in bytes (Linux's `PATH_MAX`).
pub const MAX_ROOT_DEVICE_BYTES: usize = 4096;

/// Why a `root_device` names no device.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RootDeviceError {
    /// The value is empty.
    Empty,
    /// The value is longer than [`MAX_ROOT_DEVICE_BYTES`].
    TooLong {
        /// Its length in bytes.
        bytes: usize,
    },
    /// The value contains a control character (NUL, newline, …).
    ControlCharacter {
        /// The value, cut for quoting.
        input: String,
    },
    /// A bare name that is `.` or `..`.
    DotName {
        /// The value.
        input: String,
    },
    /// A path that is not absolute.
    NotAbsolute {
        /// The value, cut for quoting.
        input: String,
    },
    /// An absolute path with a `.` or `..` component.
    DotComponent {
        /// The value, cut for quoting.
        input: String,
    },
    /// An absolute path outside [`DEVICE_DIR`] (or `/dev` itself).
    NotUnderDev {
        /// The value, cut for quoting.
        input: String,
    },
}

/// What a root device may be, for the messages.
const ALLOWED: &str = "a device name (e.g. sda, meaning /dev/sda) or an absolute path under \
                       /dev/ without . or .. components (e.g. /dev/nvme0n1, \
                       /dev/disk/by-id/...)";

impl fmt::Display for RootDeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RootDeviceError::Empty => write!(f, "missing; give {ALLOWED}"),
            RootDeviceError::TooLong { bytes } => write!(
                f,
                "{bytes} bytes, at most {MAX_ROOT_DEVICE_BYTES} allowed; give {ALLOWED}"
            ),
            RootDeviceError::ControlCharacter { input } => {
                write!(f, "{input} contains a control character; give {ALLOWED}")
            }
            RootDeviceError::DotName { input } => {
                write!(f, "{input} names no device; give {ALLOWED}")
            }
            RootDeviceError::NotAbsolute { input } => {
                write!(f, "{input} is not an absolute path; give {ALLOWED}")
            }
            RootDeviceError::DotComponent { input } => {
                write!(f, "{input} has a . or .. component; give {ALLOWED}")
            }
            RootDeviceError::NotUnderDev { input } => {
                write!(f, "{input} is not under {DEVICE_DIR}; give {ALLOWED}")
            }
        }
    }
}

impl std::error::Error for RootDeviceError {}

/// The path of the device `root_device` names: `/dev/<name>` for a bare
/// name, the path itself for a path under `/dev/`; an error for anything
/// else (see the [module documentation](self)).
pub fn root_device_path(root_device: &str) -> Result<String, RootDeviceError> {
    let input = || quoted(root_device).to_string();
    if root_device.is_empty() {
        return Err(RootDeviceError::Empty);
    }
    if root_device.len() > MAX_ROOT_DEVICE_BYTES {
        return Err(RootDeviceError::TooLong {
            bytes: root_device.len(),
        });
    }
    if root_device.chars().any(char::is_control) {
        return Err(RootDeviceError::ControlCharacter { input: input() });
    }
    if !root_device.contains('/') {
        if matches!(root_device, "." | "..") {
            return Err(RootDeviceError::DotName { input: input() });
        }
        return Ok(format!("{DEVICE_DIR}{root_device}"));
    }
    if !root_device.starts_with('/') {
        return Err(RootDeviceError::NotAbsolute { input: input() });
    }
    if root_device.split('/').any(|c| matches!(c, "." | "..")) {
        return Err(RootDeviceError::DotComponent { input: input() });
    }
    let under = root_device
        .strip_prefix(DEVICE_DIR)
        .is_some_and(|rest| rest.split('/').any(|c| !c.is_empty()));
    if !under {
        return Err(RootDeviceError::NotUnderDev { input: input() });
    }
    Ok(root_device.to_owned())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn device_names_and_paths_under_dev_are_accepted() {
        for (given, path) in [
            ("sda", "/dev/sda"),
            ("nvme0n1", "/dev/nvme0n1"),
            ("/dev/vda", "/dev/vda"),
            (
                "/dev/disk/by-id/nvme-Samsung_SSD_1",
                "/dev/disk/by-id/nvme-Samsung_SSD_1",
            ),
            ("/dev/mapper/root..x", "/dev/mapper/root..x"),
            ("/dev//sda", "/dev//sda"),
        ] {
            assert_eq!(root_device_path(given).unwrap(), path, "{given}");
        }
    }

    #[test]
    fn anything_else_is_refused_with_the_rule() {
        let long = format!("/dev/{}", "a".repeat(MAX_ROOT_DEVICE_BYTES));
        for (given, error) in [
            ("", "missing"),
            (long.as_str(), "at most 4096"),
            ("/etc/shadow", "is not under /dev/"),
            ("/tmp/disk.img", "is not under /dev/"),
            ("/dev", "is not under /dev/"),
            ("/dev/", "is not under /dev/"),
            ("/dev//", "is not under /dev/"),
            ("/device/sda", "is not under /dev/"),
            ("../../etc/passwd", "not an absolute path"),
            ("./disk.img", "not an absolute path"),
            ("dev/sda", "not an absolute path"),
            ("/dev/../etc/shadow", "a . or .. component"),
            ("/dev/disk/../../etc/passwd", "a . or .. component"),
            ("/dev/./sda", "a . or .. component"),
            ("..", "names no device"),
            (".", "names no device"),
            ("sda\n", "control character"),
            ("/dev/sda\0", "control character"),
        ] {
            let e = root_device_path(given).unwrap_err();
            let message = e.to_string();
            assert!(message.contains(error), "{given:?}: {message}");
            assert!(message.contains("a device name (e.g. sda"), "{message}");
            assert!(message.len() < 400, "{given:?}: {message}");
        }
    }
}
