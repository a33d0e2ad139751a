//! `bmaas_agent::hardware`: the report of a fake `/proc` and
//! `/sys` tree built in a temporary directory, of broken and empty trees,
//! and of the machine the test runs on.

#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::Path;

use bmaas_agent::hardware::gather_hardware_report;
use bytes::Bytes;
use metropolis_proto::prelude::hwreport::{
    BlockDevice, Cpu, EfiSupport, NetworkInterface, Node, block_device::Protocol, cpu,
};

/// Writes `content` to `root/relative`, creating directories.
fn put(root: &Path, relative: &str, content: &str) {
    let path = root.join(relative);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, content).unwrap();
}

fn mkdir(root: &Path, relative: &str) {
    fs::create_dir_all(root.join(relative)).unwrap();
}

fn processor(n: u32, package: u32, core: u32) -> String {
    format!(
        "processor\t: {n}\n\
         vendor_id\t: GenuineIntel\n\
         cpu family\t: 6\n\
         model\t\t: 79\n\
         model name\t: Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz\n\
         stepping\t: 1\n\
         microcode\t: 0xb000040\n\
         physical id\t: {package}\n\
         siblings\t: 2\n\
         core id\t\t: {core}\n\
         cpu cores\t: 1\n\
         flags\t\t: fpu vme de pse tsc msr\n\n"
    )
}

/// A machine with two packages of one core and two threads each, 16 GiB
/// in 128 memory blocks, a SATA disk, an NVMe disk and a loop device, a
/// physical NIC, a bridge and the loopback interface, EFI, and DMI whose
/// serial cannot be read.
fn build_machine(root: &Path) {
    let cpuinfo = [
        processor(0, 0, 0),
        processor(1, 1, 0),
        processor(2, 0, 0),
        processor(3, 1, 0),
    ]
    .concat();
    put(root, "proc/cpuinfo", &cpuinfo);
    put(
        root,
        "proc/meminfo",
        "MemTotal:       16316412 kB\nMemFree:        12000000 kB\nMemAvailable:   14000000 kB\n",
    );
    put(
        root,
        "sys/devices/system/memory/block_size_bytes",
        "8000000\n",
    );
    put(
        root,
        "sys/devices/system/memory/auto_online_blocks",
        "online\n",
    );
    for n in 0..128 {
        put(
            root,
            &format!("sys/devices/system/memory/memory{n}/state"),
            "online\n",
        );
    }

    put(root, "sys/class/dmi/id/sys_vendor", "Supermicro\n");
    put(root, "sys/class/dmi/id/product_name", "X10DRi  \n");
    // Unreadable: a directory where the serial should be.
    mkdir(root, "sys/class/dmi/id/product_serial");
    mkdir(root, "sys/firmware/efi/efivars");

    put(root, "sys/block/sda/size", "1953525168\n");
    put(root, "sys/block/sda/queue/rotational", "1\n");
    put(root, "sys/block/sda/queue/logical_block_size", "512\n");
    put(root, "sys/block/sda/queue/physical_block_size", "4096\n");
    put(root, "sys/block/sda/device/vendor", "ATA     \n");
    put(root, "sys/block/sda/device/model", "ST1000DM003-1ER162\n");
    put(root, "sys/block/sda/device/wwid", "naa.5000c500a1b2c3d4\n");

    put(root, "sys/block/nvme0n1/size", "976773168\n");
    put(root, "sys/block/nvme0n1/queue/rotational", "0\n");
    put(root, "sys/block/nvme0n1/queue/logical_block_size", "512\n");
    // physical_block_size is missing.
    put(
        root,
        "sys/block/nvme0n1/device/model",
        "Samsung SSD 970 EVO Plus 500GB          \n",
    );
    put(root, "sys/block/nvme0n1/device/serial", "S4EVNX0N123456\n");
    put(root, "sys/block/nvme0n1/wwid", "eui.0025388b71b2c3d4\n");

    put(root, "sys/block/loop0/size", "0\n");
    put(root, "sys/block/loop0/queue/rotational", "0\n");

    put(root, "sys/class/net/lo/address", "00:00:00:00:00:00\n");
    put(root, "sys/class/net/lo/operstate", "unknown\n");
    put(root, "sys/class/net/br0/address", "02:42:ac:11:00:01\n");
    put(root, "sys/class/net/br0/operstate", "up\n");
    put(root, "sys/class/net/eth0/address", "52:54:00:12:34:56\n");
    put(root, "sys/class/net/eth0/operstate", "up\n");
    put(root, "sys/class/net/eth0/carrier", "1\n");
    put(root, "sys/class/net/eth0/speed", "10000\n");
    mkdir(root, "sys/class/net/eth0/device");
    std::os::unix::fs::symlink(
        "../../../../bus/pci/drivers/ixgbe",
        root.join("sys/class/net/eth0/device/driver"),
    )
    .unwrap();
    put(root, "sys/class/net/eth1/address", "52:54:00:12:34:57\n");
    put(root, "sys/class/net/eth1/operstate", "down\n");
    put(root, "sys/class/net/eth1/speed", "-1\n");
    mkdir(root, "sys/class/net/eth1/device");
}

#[test]
fn a_fake_machine_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    build_machine(root);

    let report = gather_hardware_report(root);
    let node = report.report.clone().unwrap();

    let xeon = Cpu {
        hardware_threads: 2,
        cores: 1,
        vendor: "GenuineIntel".into(),
        model: "Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz".into(),
        architecture: Some(cpu::Architecture::X8664(cpu::X8664 {
            family: 6,
            model: 79,
            stepping: 1,
        })),
    };
    let installed = 128 * 0x800_0000i64;
    let expected = Node {
        manufacturer: "Supermicro".into(),
        product: "X10DRi".into(),
        serial_number: String::new(),
        efi_support: EfiSupport::Enabled as i32,
        memory_installed_bytes: installed,
        memory_usable_ratio: (16316412.0 * 1024.0 / installed as f64) as f32,
        cpu: vec![xeon.clone(), xeon],
        block_device: vec![
            BlockDevice {
                device_model: "Samsung SSD 970 EVO Plus 500GB".into(),
                serial_number: "S4EVNX0N123456".into(),
                wwn: Bytes::from_static(&[0x00, 0x25, 0x38, 0x8b, 0x71, 0xb2, 0xc3, 0xd4]),
                rotational: false,
                capacity_bytes: 976773168 * 512,
                logical_block_size_bytes: 512,
                physical_block_size_bytes: 0,
                protocol: Protocol::Nvme as i32,
                ..Default::default()
            },
            BlockDevice {
                vendor: "ATA".into(),
                device_model: "ST1000DM003-1ER162".into(),
                wwn: Bytes::from_static(&[0x50, 0x00, 0xc5, 0x00, 0xa1, 0xb2, 0xc3, 0xd4]),
                rotational: true,
                capacity_bytes: 1953525168 * 512,
                logical_block_size_bytes: 512,
                physical_block_size_bytes: 4096,
                protocol: Protocol::Ata as i32,
                ..Default::default()
            },
        ],
        network_interface: vec![
            NetworkInterface {
                mac: Bytes::from_static(&[0x52, 0x54, 0x00, 0x12, 0x34, 0x56]),
                driver: "ixgbe".into(),
                supported_speed_bytes: vec![],
                link_up: true,
                current_speed_bytes: 10_000 * 125_000,
            },
            NetworkInterface {
                mac: Bytes::from_static(&[0x52, 0x54, 0x00, 0x12, 0x34, 0x57]),
                driver: String::new(),
                supported_speed_bytes: vec![],
                link_up: false,
                current_speed_bytes: 0,
            },
        ],
    };
    assert_eq!(node, expected);

    let root = root.display();
    assert_eq!(
        report.warning,
        vec![
            format!("DMI: {root}/sys/class/dmi/id/product_serial: Is a directory (os error 21)"),
            format!(
                "block device nvme0n1: {root}/sys/block/nvme0n1/queue/physical_block_size: \
                 No such file or directory (os error 2)"
            ),
        ]
    );
}

#[test]
fn an_empty_tree_gives_an_empty_report_and_a_warning_per_part() {
    let dir = tempfile::tempdir().unwrap();
    let report = gather_hardware_report(dir.path());
    let node = report.report.unwrap();
    assert_eq!(
        node,
        Node {
            efi_support: EfiSupport::Unknown as i32,
            ..Node::default()
        }
    );
    let root = dir.path().display();
    let missing = "No such file or directory (os error 2)";
    assert_eq!(
        report.warning,
        vec![
            format!("DMI: {root}/sys/class/dmi/id: {missing}"),
            format!(
                "EFI: {root}/sys/firmware/efi: absent: the machine did not boot with EFI; \
                 whether its firmware supports EFI is unknown \
                 ({root}/sys/firmware/dmi/tables/DMI: {missing})"
            ),
            format!("CPU: {root}/proc/cpuinfo: {missing}"),
            format!("memory: {root}/proc/meminfo: {missing}"),
            format!("block devices: {root}/sys/block: {missing}"),
            format!("network interfaces: {root}/sys/class/net: {missing}"),
        ]
    );
}

#[test]
fn odd_values_are_warnings_and_fallbacks() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // No physical id (as on ARM): one package; an unparsable stepping.
    put(
        root,
        "proc/cpuinfo",
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n\
         stepping\t: unknown\n\nprocessor\t: 1\nvendor_id\t: AuthenticAMD\n\n",
    );
    // No memory block directory: MemTotal is what is installed.
    put(root, "proc/meminfo", "MemTotal:       1024 kB\n");
    put(root, "sys/block/vda/size", "lots\n");
    put(root, "sys/block/vda/queue/rotational", "0\n");
    put(root, "sys/block/vda/queue/logical_block_size", "512\n");
    put(root, "sys/block/vda/queue/physical_block_size", "512\n");
    put(root, "sys/block/vda/serial", "virtio-serial\n");
    put(root, "sys/class/net/eth0/address", "not-a-mac\n");
    put(root, "sys/class/net/eth0/operstate", "unknown\n");
    put(root, "sys/class/net/eth0/carrier", "1\n");
    mkdir(root, "sys/class/net/eth0/device");

    let report = gather_hardware_report(root);
    let node = report.report.unwrap();
    assert_eq!(
        node.cpu,
        vec![Cpu {
            hardware_threads: 2,
            cores: 2,
            vendor: "AuthenticAMD".into(),
            model: String::new(),
            architecture: None,
        }]
    );
    assert_eq!(node.memory_installed_bytes, 1024 * 1024);
    assert_eq!(node.memory_usable_ratio, 1.0);
    assert_eq!(
        node.block_device,
        vec![BlockDevice {
            serial_number: "virtio-serial".into(),
            logical_block_size_bytes: 512,
            physical_block_size_bytes: 512,
            protocol: Protocol::Unknown as i32,
            ..Default::default()
        }]
    );
    assert_eq!(
        node.network_interface,
        vec![NetworkInterface {
            link_up: true,
            ..Default::default()
        }]
    );
    let root = root.display();
    let expected = [
        format!("CPU: {root}/proc/cpuinfo: stepping: cannot parse \"unknown\""),
        format!("block device vda: {root}/sys/block/vda/size: cannot parse \"lots\""),
        format!(
            "network interface eth0: {root}/sys/class/net/eth0/address: \
             cannot parse \"not-a-mac\" as a hardware address"
        ),
    ];
    for warning in expected {
        assert!(
            report.warning.contains(&warning),
            "{warning:?} not in {:#?}",
            report.warning
        );
    }
}

/// An SMBIOS structure table: BIOS Information (SMBIOS 2.4, 0x18
/// bytes) with Characteristics Extension Byte 2 `ext2`, its strings, and
/// the end-of-table structure.
fn smbios_table(ext2: u8) -> Vec<u8> {
    let mut table = vec![0u8; 0x18];
    table[1] = 0x18;
    table[0x13] = ext2;
    table.extend_from_slice(b"Firmware Inc.\0v1\0\0");
    table.extend_from_slice(&[127, 4, 0xff, 0xff, 0, 0]);
    table
}

/// The EFI field of a tree with `efi` (whether `sys/firmware/efi`
/// exists) and an SMBIOS table of `table`, and the EFI warnings.
fn efi_of(efi: bool, table: Option<Vec<u8>>) -> (EfiSupport, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    if efi {
        mkdir(dir.path(), "sys/firmware/efi/efivars");
    }
    if let Some(table) = table {
        mkdir(dir.path(), "sys/firmware/dmi/tables");
        fs::write(dir.path().join("sys/firmware/dmi/tables/DMI"), table).unwrap();
    }
    let report = gather_hardware_report(dir.path());
    let root = dir.path().display().to_string();
    let warnings = report
        .warning
        .iter()
        .filter(|w| w.starts_with("EFI:"))
        .map(|w| w.replace(&root, "ROOT"))
        .collect();
    (report.report.unwrap().efi_support(), warnings)
}

#[test]
fn the_report_says_whether_the_machine_booted_with_efi() {
    // Booted with EFI: whatever SMBIOS says.
    assert_eq!(efi_of(true, None), (EfiSupport::Enabled, vec![]));
    assert_eq!(
        efi_of(true, Some(smbios_table(0))),
        (EfiSupport::Enabled, vec![])
    );
    // Not: the firmware has EFI (a legacy boot through CSM), or not.
    assert_eq!(
        efi_of(false, Some(smbios_table(0x08 | 0x04))),
        (EfiSupport::Supported, vec![])
    );
    assert_eq!(
        efi_of(false, Some(smbios_table(0x04))),
        (EfiSupport::Unsupported, vec![])
    );
    // Not, and nothing says what the firmware could: the warning says
    // the machine did not boot with EFI.
    let absent = "EFI: ROOT/sys/firmware/efi: absent: the machine did not boot with EFI; \
                  whether its firmware supports EFI is unknown";
    assert_eq!(
        efi_of(false, None),
        (
            EfiSupport::Unknown,
            vec![format!(
                "{absent} (ROOT/sys/firmware/dmi/tables/DMI: No such file or directory \
                 (os error 2))"
            )]
        )
    );
    let mut old = smbios_table(0x08);
    old[1] = 0x12;
    old.drain(0x12..0x18);
    assert_eq!(
        efi_of(false, Some(old)),
        (
            EfiSupport::Unknown,
            vec![format!(
                "{absent} (ROOT/sys/firmware/dmi/tables/DMI has no BIOS information saying so)"
            )]
        )
    );
}

#[test]
fn the_real_machine_is_reported() {
    let report = gather_hardware_report(Path::new("/"));
    for warning in &report.warning {
        println!("warning: {warning}");
    }
    let node = report.report.unwrap();
    println!("{node:#?}");
    assert!(node.memory_installed_bytes > 0);
    assert!(node.memory_usable_ratio > 0.0 && node.memory_usable_ratio <= 1.0);
    assert!(!node.cpu.is_empty());
    assert!(
        node.cpu
            .iter()
            .all(|c| c.hardware_threads > 0 && c.cores > 0)
    );
}
