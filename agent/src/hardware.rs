//! The hardware report of the running Linux machine, gathered from
//! `/proc`, `/sys` and DMI ([`gather_hardware_report`]).
//!
//! Gathering never fails: each part that cannot be read (a missing or
//! unreadable file, a value that does not parse) leaves its field at the
//! default and adds one human-readable warning to the report, of the form
//! `"<part>: <path>: <problem>"`, e.g.
//! `"DMI: /sys/class/dmi/id/product_serial: Permission denied (os error 13)"`.
//!
//! What is read, and how it maps to `cloud.agent.api.Node`:
//!
//! - **DMI**: `sys/class/dmi/id/{sys_vendor,product_name,product_serial}`
//!   → `manufacturer`, `product`, `serial_number`, trimmed. When the
//!   whole `sys/class/dmi/id` directory is missing (no SMBIOS, e.g. some
//!   virtual or ARM machines) there is one warning for it rather than one
//!   per file. `product_serial` is readable by root only, so an agent not
//!   running as root gets a warning for it.
//! - **EFI**: whether the machine booted with EFI, and if not whether its
//!   firmware could have. `sys/firmware/efi` present (the kernel creates
//!   it only when started through EFI; the same directory decides whether
//!   a Metropolis install goes ahead, `--firmware-dir`) →
//!   `EFI_SUPPORT_ENABLED`. Absent, the machine did not boot with EFI,
//!   and the firmware's SMBIOS table (`sys/firmware/dmi/tables/DMI`,
//!   readable by root only) tells the rest, as in the reference agent:
//!   its BIOS Information's "UEFI is supported" bit set →
//!   `EFI_SUPPORT_SUPPORTED` (a legacy boot, CSM, of a firmware that has
//!   EFI), clear → `EFI_SUPPORT_UNSUPPORTED`. Without a table that says
//!   (none, or before SMBIOS 2.2) → `EFI_SUPPORT_UNKNOWN` and a warning
//!   saying the machine did not boot with EFI, so the report says it in
//!   words where the enum cannot.
//! - **CPUs**: `proc/cpuinfo`, one `CPU` per processor package (grouped by
//!   `physical id`; processors without one, as on most ARM machines, form
//!   a single package). `vendor` ← `vendor_id`, `model` ← `model name`,
//!   `hardware_threads` ← the number of processors in the package,
//!   `cores` ← `cpu cores` (else the number of distinct `core id`s, else
//!   the thread count). The `x86_64` architecture message (`cpu family`,
//!   `model`, `stepping`) is set when the package has a `cpu family`.
//! - **Memory**: `memory_installed_bytes` is the memory present in the
//!   machine: the number of memory blocks in `sys/devices/system/memory`
//!   times its `block_size_bytes`, and `memory_usable_ratio` is the share
//!   of it the kernel can use, `MemTotal` (from `proc/meminfo`) divided by
//!   that. Kernels without that directory (no memory hotplug support) give
//!   `MemTotal` as installed and a ratio of 1.0. `MemAvailable` is not
//!   used: it is a momentary figure of free memory, not a property of the
//!   hardware.
//! - **Block devices**: every `sys/block/*` except virtual ones, recognised
//!   by name (`loop*`, `ram*`, `zram*`, `dm-*`, `md*`, `nbd*`), sorted by
//!   name. `capacity_bytes` ← `size` × 512, `rotational`,
//!   `logical_block_size_bytes`, `physical_block_size_bytes` ← `queue/*`;
//!   `vendor`, `device_model` ← `device/{vendor,model}`; `serial_number` ←
//!   `device/serial`, else `serial`; `wwn` ← the hexadecimal identifier of
//!   a `naa.`, `eui.` or `0x` `wwid` (else `device/wwid`); other `wwid`
//!   forms (`t10.`, `nvme.`) are not WWNs and leave it empty. `protocol`
//!   from the name: `nvme*` → NVMe, `mmcblk*` → MMC, `sd*` → ATA when the
//!   SCSI vendor is `ATA` (libata), else SCSI, `hd*` → ATA, anything else
//!   (`vd*`, `xvd*`) → unknown. Identification files are optional (a
//!   missing one is not a warning; any other error is); the size and queue
//!   files are required. SMART data (`critical_warning`, `media_errors`,
//!   spare and usage ratios) needs device ioctls and is not gathered.
//! - **Network interfaces**: every `sys/class/net/*` with a `device` link,
//!   sorted by name: `lo` and virtual interfaces (bridges, bonds, VLANs,
//!   veth, tunnels, `ifb`) have none and are skipped; their physical
//!   members are reported. `mac` ← `address`, `driver` ← the name the
//!   `device/driver` link points to, `link_up` ← `operstate` is `up`
//!   (or, where the driver reports `unknown`, `carrier` is 1),
//!   `current_speed_bytes` ← `speed` (Mb/s) × 125 000 (0 when the link is
//!   down or the speed unknown). `supported_speed_bytes` needs ethtool
//!   ioctls and is left empty.

mod smbios;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use bytes::Bytes;
use metropolis_proto::prelude::agent::AgentHardwareReport;
use metropolis_proto::prelude::hwreport::{
    BlockDevice, Cpu, EfiSupport, NetworkInterface, Node, block_device::Protocol, cpu,
};

/// Gathers the hardware report of the machine whose `/proc` and `/sys` are
/// under `root` (normally `/`). See the [module documentation](self) for
/// what is read; each part that cannot be read adds a warning instead of
/// failing.
pub fn gather_hardware_report(root: &Path) -> AgentHardwareReport {
    let mut gatherer = Gatherer {
        root,
        warnings: Vec::new(),
    };
    let mut node = Node::default();
    gatherer.dmi(&mut node);
    node.efi_support = gatherer.efi() as i32;
    node.cpu = gatherer.cpus();
    let (installed, ratio) = gatherer.memory();
    node.memory_installed_bytes = installed;
    node.memory_usable_ratio = ratio;
    node.block_device = gatherer.block_devices();
    node.network_interface = gatherer.network_interfaces();
    AgentHardwareReport {
        report: Some(node),
        warning: gatherer.warnings,
    }
}

/// Block devices skipped as virtual, by name prefix.
const VIRTUAL_BLOCK_PREFIXES: &[&str] = &["loop", "ram", "zram", "dm-", "md", "nbd"];

/// Bytes per second in one Mb/s.
const BYTES_PER_MBIT: i64 = 1_000_000 / 8;

/// The kernel's block size unit of `sys/block/*/size`.
const SECTOR_BYTES: u64 = 512;

struct Gatherer<'a> {
    root: &'a Path,
    warnings: Vec<String>,
}

impl Gatherer<'_> {
    fn path(&self, relative: &str) -> PathBuf {
        self.root.join(relative)
    }

    fn warn(&mut self, part: &str, path: &Path, problem: impl std::fmt::Display) {
        self.warnings
            .push(format!("{part}: {}: {problem}", path.display()));
    }

    /// The trimmed content of a required file; a warning if unreadable.
    fn read(&mut self, part: &str, path: &Path) -> Option<String> {
        match read_attribute(path) {
            Ok(text) => Some(text),
            Err(e) => {
                self.warn(part, path, e);
                None
            }
        }
    }

    /// The trimmed content of an optional file: missing is `None` without
    /// a warning, any other error is a warning.
    fn read_optional(&mut self, part: &str, path: &Path) -> Option<String> {
        match read_attribute(path) {
            Ok(text) => Some(text),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => {
                self.warn(part, path, e);
                None
            }
        }
    }

    /// `text` parsed as a `T`; a warning naming `path` (and `what` in it,
    /// unless empty) if it does not parse.
    fn parse<T: FromStr>(&mut self, part: &str, path: &Path, what: &str, text: &str) -> Option<T> {
        match text.trim().parse() {
            Ok(value) => Some(value),
            Err(_) if what.is_empty() => {
                self.warn(part, path, format!("cannot parse {text:?}"));
                None
            }
            Err(_) => {
                self.warn(part, path, format!("{what}: cannot parse {text:?}"));
                None
            }
        }
    }

    /// The required file at `path` parsed as a `T`.
    fn read_parsed<T: FromStr>(&mut self, part: &str, path: &Path) -> Option<T> {
        let text = self.read(part, path)?;
        self.parse(part, path, "", &text)
    }

    /// The names in a directory, sorted; a warning if it cannot be listed.
    fn list(&mut self, part: &str, path: &Path) -> Vec<String> {
        let entries = match fs::read_dir(path) {
            Ok(entries) => entries,
            Err(e) => {
                self.warn(part, path, e);
                return Vec::new();
            }
        };
        let mut names = Vec::new();
        for entry in entries {
            match entry {
                Ok(entry) => names.push(entry.file_name().to_string_lossy().into_owned()),
                Err(e) => {
                    self.warn(part, path, e);
                    break;
                }
            }
        }
        names.sort();
        names
    }

    fn dmi(&mut self, node: &mut Node) {
        const PART: &str = "DMI";
        let dir = self.path("sys/class/dmi/id");
        if let Err(e) = fs::metadata(&dir) {
            self.warn(PART, &dir, e);
            return;
        }
        for (file, field) in [
            ("sys_vendor", &mut node.manufacturer),
            ("product_name", &mut node.product),
            ("product_serial", &mut node.serial_number),
        ] {
            if let Some(value) = self.read(PART, &dir.join(file)) {
                *field = value;
            }
        }
    }

    fn efi(&mut self) -> EfiSupport {
        const PART: &str = "EFI";
        let path = self.path("sys/firmware/efi");
        match fs::metadata(&path) {
            Ok(meta) if meta.is_dir() => return EfiSupport::Enabled,
            Ok(_) => {
                self.warn(PART, &path, "not a directory");
                return EfiSupport::Unknown;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                self.warn(PART, &path, e);
                return EfiSupport::Unknown;
            }
        }
        // Not booted with EFI: could the firmware have?
        let table = self.path("sys/firmware/dmi/tables/DMI");
        let why = match fs::read(&table) {
            Ok(bytes) => match smbios::uefi_supported(&bytes) {
                Some(true) => return EfiSupport::Supported,
                Some(false) => return EfiSupport::Unsupported,
                None => format!("{} has no BIOS information saying so", table.display()),
            },
            Err(e) => format!("{}: {e}", table.display()),
        };
        self.warn(
            PART,
            &path,
            format!(
                "absent: the machine did not boot with EFI; whether its firmware supports \
                 EFI is unknown ({why})"
            ),
        );
        EfiSupport::Unknown
    }

    fn cpus(&mut self) -> Vec<Cpu> {
        const PART: &str = "CPU";
        let path = self.path("proc/cpuinfo");
        let Some(text) = self.read(PART, &path) else {
            return Vec::new();
        };
        let processors = parse_cpuinfo(&text);
        if processors.is_empty() {
            self.warn(PART, &path, "no processor entries");
            return Vec::new();
        }
        // Packages by `physical id`; processors without one share `None`.
        let mut packages: BTreeMap<Option<u32>, Vec<&Fields>> = BTreeMap::new();
        for processor in &processors {
            let id = match processor.get("physical id") {
                Some(id) => self.parse(PART, &path, "physical id", id),
                None => None,
            };
            packages.entry(id).or_default().push(processor);
        }
        let mut cpus = Vec::new();
        for processors in packages.values() {
            let first = processors[0];
            let threads = i32::try_from(processors.len()).unwrap_or(i32::MAX);
            let cores = match first.get("cpu cores") {
                Some(cores) => self.parse(PART, &path, "cpu cores", cores),
                None => None,
            };
            let core_ids: BTreeSet<&str> =
                processors.iter().filter_map(|p| p.get("core id")).collect();
            let cores = cores.unwrap_or(if core_ids.is_empty() {
                threads
            } else {
                i32::try_from(core_ids.len()).unwrap_or(i32::MAX)
            });
            let architecture = match first.get("cpu family") {
                Some(family) => {
                    let family = self.parse(PART, &path, "cpu family", family);
                    let model = self.field(PART, &path, first, "model");
                    let stepping = self.field(PART, &path, first, "stepping");
                    match (family, model, stepping) {
                        (Some(family), Some(model), Some(stepping)) => {
                            Some(cpu::Architecture::X8664(cpu::X8664 {
                                family,
                                model,
                                stepping,
                            }))
                        }
                        _ => None,
                    }
                }
                None => None,
            };
            cpus.push(Cpu {
                hardware_threads: threads,
                cores,
                vendor: first.get("vendor_id").unwrap_or_default().to_string(),
                model: first.get("model name").unwrap_or_default().to_string(),
                architecture,
            });
        }
        cpus
    }

    /// A required numeric field of a cpuinfo entry.
    fn field(&mut self, part: &str, path: &Path, fields: &Fields, key: &str) -> Option<i32> {
        match fields.get(key) {
            Some(value) => self.parse(part, path, key, value),
            None => {
                self.warn(part, path, format!("{key}: missing"));
                None
            }
        }
    }

    /// `(memory_installed_bytes, memory_usable_ratio)`.
    fn memory(&mut self) -> (i64, f32) {
        const PART: &str = "memory";
        let path = self.path("proc/meminfo");
        let total = match self.read(PART, &path) {
            Some(text) => match meminfo_bytes(&text, "MemTotal") {
                Some(bytes) => Some(bytes),
                None => {
                    self.warn(PART, &path, "MemTotal: missing or malformed");
                    None
                }
            },
            None => None,
        };
        let installed = self.memory_blocks();
        match (total, installed) {
            (Some(total), Some(installed)) if installed >= total && installed > 0 => {
                (to_i64(installed), (total as f64 / installed as f64) as f32)
            }
            (Some(total), _) => (to_i64(total), 1.0),
            (None, Some(installed)) => (to_i64(installed), 0.0),
            (None, None) => (0, 0.0),
        }
    }

    /// The bytes of memory present, from the memory block devices; `None`
    /// without a warning when the kernel has no such directory.
    fn memory_blocks(&mut self) -> Option<u64> {
        const PART: &str = "memory";
        let dir = self.path("sys/devices/system/memory");
        match fs::metadata(&dir) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
            Err(e) => {
                self.warn(PART, &dir, e);
                return None;
            }
        }
        let size_path = dir.join("block_size_bytes");
        let text = self.read(PART, &size_path)?;
        let Ok(block_size) = u64::from_str_radix(text.trim_start_matches("0x"), 16) else {
            self.warn(
                PART,
                &size_path,
                format!("cannot parse {text:?} as hexadecimal"),
            );
            return None;
        };
        let blocks = self
            .list(PART, &dir)
            .iter()
            .filter(|name| {
                name.strip_prefix("memory")
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            })
            .count() as u64;
        (blocks > 0).then(|| blocks.saturating_mul(block_size))
    }

    fn block_devices(&mut self) -> Vec<BlockDevice> {
        let dir = self.path("sys/block");
        let names = self.list("block devices", &dir);
        names
            .iter()
            .filter(|name| !VIRTUAL_BLOCK_PREFIXES.iter().any(|p| name.starts_with(p)))
            .map(|name| self.block_device(name, &dir.join(name)))
            .collect()
    }

    fn block_device(&mut self, name: &str, dir: &Path) -> BlockDevice {
        let part = format!("block device {name}");
        let mut device = BlockDevice::default();
        if let Some(sectors) = self.read_parsed::<u64>(&part, &dir.join("size")) {
            device.capacity_bytes = to_i64(sectors.saturating_mul(SECTOR_BYTES));
        }
        if let Some(rotational) = self.read_parsed::<u8>(&part, &dir.join("queue/rotational")) {
            device.rotational = rotational != 0;
        }
        if let Some(size) = self.read_parsed(&part, &dir.join("queue/logical_block_size")) {
            device.logical_block_size_bytes = size;
        }
        if let Some(size) = self.read_parsed(&part, &dir.join("queue/physical_block_size")) {
            device.physical_block_size_bytes = size;
        }
        device.vendor = self
            .read_optional(&part, &dir.join("device/vendor"))
            .unwrap_or_default();
        device.device_model = self
            .read_optional(&part, &dir.join("device/model"))
            .unwrap_or_default();
        device.serial_number = self
            .read_optional(&part, &dir.join("device/serial"))
            .or_else(|| self.read_optional(&part, &dir.join("serial")))
            .unwrap_or_default();
        let wwid = self
            .read_optional(&part, &dir.join("wwid"))
            .or_else(|| self.read_optional(&part, &dir.join("device/wwid")));
        device.wwn = wwid.as_deref().and_then(wwn_bytes).unwrap_or_default();
        device.protocol = protocol(name, &device.vendor) as i32;
        device
    }

    fn network_interfaces(&mut self) -> Vec<NetworkInterface> {
        let dir = self.path("sys/class/net");
        let names = self.list("network interfaces", &dir);
        let mut interfaces = Vec::new();
        for name in names.iter().filter(|name| *name != "lo") {
            let part = format!("network interface {name}");
            let path = dir.join(name);
            match fs::symlink_metadata(path.join("device")) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => {
                    self.warn(&part, &path.join("device"), e);
                    continue;
                }
            }
            interfaces.push(self.network_interface(&part, &path));
        }
        interfaces
    }

    fn network_interface(&mut self, part: &str, dir: &Path) -> NetworkInterface {
        let mut interface = NetworkInterface::default();
        let address_path = dir.join("address");
        if let Some(address) = self.read(part, &address_path) {
            match mac_bytes(&address) {
                Some(mac) => interface.mac = mac,
                None => self.warn(
                    part,
                    &address_path,
                    format!("cannot parse {address:?} as a hardware address"),
                ),
            }
        }
        let driver_path = dir.join("device/driver");
        match fs::read_link(&driver_path) {
            Ok(target) => {
                interface.driver = target
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => self.warn(part, &driver_path, e),
        }
        let operstate = self.read_optional(part, &dir.join("operstate"));
        interface.link_up = match operstate.as_deref() {
            Some("up") => true,
            Some("unknown") | None => self.link_attribute(part, &dir.join("carrier")) == Some(1),
            Some(_) => false,
        };
        if interface.link_up
            && let Some(speed) = self.link_attribute(part, &dir.join("speed"))
            && speed > 0
        {
            interface.current_speed_bytes = speed.saturating_mul(BYTES_PER_MBIT);
        }
        interface
    }

    /// A link attribute (`carrier`, `speed`): the kernel answers EINVAL
    /// while the link is down, which is `None` without a warning.
    fn link_attribute(&mut self, part: &str, path: &Path) -> Option<i64> {
        match read_attribute(path) {
            Ok(text) => self.parse(part, path, "", &text),
            Err(e)
                if e.kind() == io::ErrorKind::InvalidInput
                    || e.kind() == io::ErrorKind::NotFound =>
            {
                None
            }
            Err(e) => {
                self.warn(part, path, e);
                None
            }
        }
    }
}

/// A sysfs or procfs file, as text (not UTF-8: lossily), trimmed.
fn read_attribute(path: &Path) -> io::Result<String> {
    let bytes = fs::read(path)?;
    Ok(String::from_utf8_lossy(&bytes).trim().to_string())
}

fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The `key: value` fields of one `proc/cpuinfo` entry.
struct Fields(Vec<(String, String)>);

impl Fields {
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// The processor entries of `proc/cpuinfo` (blank-line separated blocks
/// with a `processor` field; other blocks, such as the trailing hardware
/// block of 32-bit ARM, are dropped).
fn parse_cpuinfo(text: &str) -> Vec<Fields> {
    let mut processors = Vec::new();
    let mut current = Vec::new();
    for line in text.lines().chain(std::iter::once("")) {
        if line.trim().is_empty() {
            let fields = Fields(std::mem::take(&mut current));
            if fields.get("processor").is_some() {
                processors.push(fields);
            }
            continue;
        }
        if let Some((key, value)) = line.split_once(':') {
            current.push((key.trim().to_string(), value.trim().to_string()));
        }
    }
    processors
}

/// A `proc/meminfo` field in bytes (the file gives kB).
fn meminfo_bytes(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, rest) = line.split_once(':')?;
        if k.trim() != key {
            return None;
        }
        let mut words = rest.split_whitespace();
        let value: u64 = words.next()?.parse().ok()?;
        match words.next() {
            Some("kB") => value.checked_mul(1024),
            None => Some(value),
            Some(_) => None,
        }
    })
}

/// A colon-separated hexadecimal hardware address as bytes.
fn mac_bytes(text: &str) -> Option<Bytes> {
    let bytes = text
        .split(':')
        .map(|octet| {
            (octet.len() == 2)
                .then(|| u8::from_str_radix(octet, 16).ok())
                .flatten()
        })
        .collect::<Option<Vec<u8>>>()?;
    Some(Bytes::from(bytes))
}

/// The bytes of a `naa.`, `eui.` or `0x` world wide identifier.
fn wwn_bytes(wwid: &str) -> Option<Bytes> {
    let hex = ["naa.", "eui.", "0x"]
        .iter()
        .find_map(|prefix| wwid.strip_prefix(prefix))?;
    if hex.is_empty() || hex.len() % 2 != 0 {
        return None;
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    Some(Bytes::from(bytes))
}

/// The protocol of a block device, from its kernel name and SCSI vendor.
fn protocol(name: &str, vendor: &str) -> Protocol {
    if name.starts_with("nvme") {
        Protocol::Nvme
    } else if name.starts_with("mmcblk") {
        Protocol::Mmc
    } else if name.starts_with("sd") {
        if vendor == "ATA" {
            Protocol::Ata
        } else {
            Protocol::Scsi
        }
    } else if name.starts_with("hd") {
        Protocol::Ata
    } else {
        Protocol::Unknown
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_fields() {
        let text = "MemTotal:       16316412 kB\nMemFree:  1 kB\nHugePages_Total:       0\n";
        assert_eq!(meminfo_bytes(text, "MemTotal"), Some(16316412 * 1024));
        assert_eq!(meminfo_bytes(text, "HugePages_Total"), Some(0));
        assert_eq!(meminfo_bytes(text, "MemAvailable"), None);
        assert_eq!(meminfo_bytes("MemTotal: x kB", "MemTotal"), None);
        assert_eq!(meminfo_bytes("MemTotal: 1 MB", "MemTotal"), None);
    }

    #[test]
    fn hardware_addresses() {
        assert_eq!(
            mac_bytes("52:54:00:ab:cd:EF").as_deref(),
            Some(&[0x52, 0x54, 0, 0xab, 0xcd, 0xef][..])
        );
        assert_eq!(
            mac_bytes("52:54:00:ab:cd"),
            Some(Bytes::from_static(&[0x52, 0x54, 0, 0xab, 0xcd]))
        );
        assert_eq!(mac_bytes("52:54:0:ab:cd:ef"), None);
        assert_eq!(mac_bytes(""), None);
        assert_eq!(mac_bytes("zz:00"), None);
    }

    #[test]
    fn world_wide_names() {
        assert_eq!(
            wwn_bytes("naa.5000c500a1b2c3d4").as_deref(),
            Some(&[0x50, 0x00, 0xc5, 0x00, 0xa1, 0xb2, 0xc3, 0xd4][..])
        );
        assert_eq!(wwn_bytes("eui.0025").as_deref(), Some(&[0x00, 0x25][..]));
        assert_eq!(wwn_bytes("t10.ATA     disk"), None);
        assert_eq!(wwn_bytes("nvme.8086-1234"), None);
        assert_eq!(wwn_bytes("naa.123"), None);
        assert_eq!(wwn_bytes("naa.é1"), None);
    }

    #[test]
    fn protocols() {
        assert_eq!(protocol("nvme0n1", ""), Protocol::Nvme);
        assert_eq!(protocol("mmcblk0", ""), Protocol::Mmc);
        assert_eq!(protocol("sda", "ATA"), Protocol::Ata);
        assert_eq!(protocol("sdb", "SEAGATE"), Protocol::Scsi);
        assert_eq!(protocol("vda", ""), Protocol::Unknown);
    }

    #[test]
    fn cpuinfo_blocks() {
        let text = "processor\t: 0\nvendor_id\t: X\n\nprocessor : 1\n\nHardware : BCM\n";
        let processors = parse_cpuinfo(text);
        assert_eq!(processors.len(), 2);
        assert_eq!(processors[0].get("vendor_id"), Some("X"));
        assert_eq!(processors[1].get("processor"), Some("1"));
    }
}
