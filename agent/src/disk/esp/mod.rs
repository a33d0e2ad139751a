//! The EFI system partition: FAT32 over the whole partition, and the files
//! the firmware and the loader read from it.
//!
//! Formatted and filled by the `fatfs` crate through a [`Window`] over the
//! partition, so nothing outside the ESP's bytes is touched. Its
//! parameters are the spec's: sector size = the logical block size, 1
//! sector per cluster, 8 reserved sectors with the FSInfo sector at 1 and
//! the backup boot sector at 6 (the values `fatfs` always uses for
//! FAT32, and the reference's), 2 FATs, media 0xF8, label `MNGN_BOOT`
//! (in the boot sector and as the root directory's volume entry), long
//! file names. The volume ID is taken from the ESP's unique GUID, so a
//! layout always gives the same bytes but two installs differ.
//!
//! `fatfs` is built without `chrono`; file times come from [`UtcClock`],
//! the system clock in UTC (firmware has no time zone either).

use std::fmt;
use std::fs::File;
use std::io::{self, Read, Write};
use std::time::{SystemTime, UNIX_EPOCH};

use fatfs::{Date, DateTime, FatType, FileSystem, FormatVolumeOptions, FsOptions, Time};

use super::layout::Layout;
use super::window::Window;

mod dot_entries;

/// The ESP's volume label, in the boot sector and the root directory.
pub const LABEL: [u8; 11] = *b"MNGN_BOOT  ";

/// Why the ESP could not be made.
#[derive(Debug)]
#[non_exhaustive]
pub enum EspError {
    /// Formatting the partition failed.
    Format(io::Error),
    /// A file's path is not a relative path of non-empty names without
    /// `.` or `..`.
    BadPath(String),
    /// Creating a directory or writing a file failed.
    Write {
        /// The file's path as given.
        path: String,
        /// The filesystem's or device's error.
        source: io::Error,
    },
    /// Writing the filesystem's last state (FSInfo, clean flag) or
    /// syncing the device failed.
    Finish(io::Error),
}

impl fmt::Display for EspError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EspError::Format(e) => write!(f, "formatting the ESP as FAT32: {e}"),
            EspError::BadPath(path) => write!(
                f,
                "ESP file path {path:?} is not a relative path of plain names"
            ),
            EspError::Write { path, source } => write!(f, "writing {path} onto the ESP: {source}"),
            EspError::Finish(e) => write!(f, "finishing the ESP's filesystem: {e}"),
        }
    }
}

impl std::error::Error for EspError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            EspError::Format(e) | EspError::Finish(e) => Some(e),
            EspError::Write { source, .. } => Some(source),
            EspError::BadPath(_) => None,
        }
    }
}

/// [`format()`] with each file's contents given whole.
pub fn format_bytes(
    device: &File,
    layout: &Layout,
    files: &[(&str, &[u8])],
) -> Result<(), EspError> {
    let mut readers: Vec<(&str, &[u8])> = files.to_vec();
    let mut files: Vec<(&str, &mut dyn Read)> = readers
        .iter_mut()
        .map(|(path, bytes)| (*path, bytes as &mut dyn Read))
        .collect();
    format(device, layout, &mut files)
}

/// Formats `layout`'s ESP on `device` (the whole disk) as FAT32 and
/// writes `files` into it: `(path, contents)`, paths relative to the root
/// with `/` between names (`"EFI/BOOT/BOOTx64.EFI"`), directories created
/// as needed, a file given twice written with its last contents. Each
/// file's contents are read to their end and streamed onto the device
/// (a payload is never held whole). Ends with `sync_data` on the device.
/// Every path is checked before anything is written.
pub fn format(
    device: &File,
    layout: &Layout,
    files: &mut [(&str, &mut dyn Read)],
) -> Result<(), EspError> {
    for (path, _) in files.iter() {
        check_path(path)?;
    }
    let esp = layout.esp();
    let block = layout.block_size();
    let sectors = u32::try_from(esp.length / u64::from(block))
        .map_err(|_| EspError::Format(io::Error::other("the ESP has over 2^32 sectors")))?;
    let block16 = u16::try_from(block)
        .map_err(|_| EspError::Format(io::Error::other("sector size over 64 KiB")))?;
    let guid = esp.unique_guid.as_bytes();
    let options = FormatVolumeOptions::new()
        .fat_type(FatType::Fat32)
        .bytes_per_sector(block16)
        .bytes_per_cluster(block)
        .total_sectors(sectors)
        .fats(2)
        .media(0xF8)
        .volume_id(u32::from_le_bytes([guid[0], guid[1], guid[2], guid[3]]))
        .volume_label(LABEL);
    let mut window = Window::partition(device, esp);
    fatfs::format_volume(&mut window, options).map_err(EspError::Format)?;
    let fs = FileSystem::new(window, FsOptions::new().time_provider(&UtcClock))
        .map_err(EspError::Format)?;
    if fs.fat_type() != FatType::Fat32 {
        return Err(EspError::Format(io::Error::other(
            "the partition did not come out FAT32",
        )));
    }
    // Counts the free clusters, so that the FSInfo sector written at
    // unmount holds their number rather than "unknown".
    fs.stats().map_err(EspError::Format)?;
    for (path, contents) in files.iter_mut() {
        write_file(&fs, path, *contents).map_err(|source| EspError::Write {
            path: path.to_string(),
            source,
        })?;
    }
    fs.unmount().map_err(EspError::Finish)?;
    dot_entries::repair(device, esp).map_err(EspError::Finish)?;
    device.sync_data().map_err(EspError::Finish)
}

fn check_path(path: &str) -> Result<(), EspError> {
    let plain = |name: &str| !name.is_empty() && name != "." && name != "..";
    if path.split('/').all(plain) && !path.contains('\\') {
        Ok(())
    } else {
        Err(EspError::BadPath(path.to_string()))
    }
}

fn write_file(fs: &FileSystem<Window<'_>>, path: &str, contents: &mut dyn Read) -> io::Result<()> {
    let mut dir = fs.root_dir();
    let (dirs, name) = path.rsplit_once('/').unwrap_or(("", path));
    for component in dirs.split('/').filter(|c| !c.is_empty()) {
        dir = dir.create_dir(component)?;
    }
    let mut file = dir.create_file(name)?;
    file.truncate()?;
    // Cluster-sized writes are what fatfs does best; 64 KiB is many.
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match contents.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        file.write_all(&buf[..n])?;
    }
    file.flush()
}

/// File times for `fatfs`: the system clock in UTC, clamped to what a
/// FAT date can hold (1980 to 2107).
#[derive(Debug)]
pub struct UtcClock;

impl fatfs::TimeProvider for UtcClock {
    fn get_current_date(&self) -> Date {
        self.get_current_date_time().date
    }

    fn get_current_date_time(&self) -> DateTime {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        dos_time(secs)
    }
}

/// The FAT date and time of `secs` seconds after the Unix epoch (UTC).
pub(crate) fn dos_time(secs: u64) -> DateTime {
    const EARLIEST: u64 = 315_532_800; // 1980-01-01T00:00:00Z
    const LATEST: u64 = 4_354_819_199; // 2107-12-31T23:59:59Z
    let secs = secs.clamp(EARLIEST, LATEST);
    let (year, month, day) = civil_date(secs / 86_400);
    let of_day = secs % 86_400;
    DateTime {
        date: Date { year, month, day },
        time: Time {
            hour: (of_day / 3600) as u16,
            min: (of_day / 60 % 60) as u16,
            sec: (of_day % 60) as u16,
            millis: 0,
        },
    }
}

/// The proleptic Gregorian (year, month, day) of a day count since
/// 1970-01-01, counted in 400-year eras of 146097 days, each year
/// starting on March 1st so that the leap day is the last of its year.
fn civil_date(days: u64) -> (u16, u16, u16) {
    let shifted = days + 719_468; // days from 0000-03-01
    let era = shifted / 146_097;
    let day_of_era = shifted % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = era * 400 + year_of_era + u64::from(month <= 2);
    (year as u16, month as u16, day as u16)
}
