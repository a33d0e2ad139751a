//! A Metropolis install end to end, as an operator does it, then the disk
//! booted: `metroctl osimage build` makes an image of the test kernel
//! (efi/build.sh's `test-kernel.efi`, a UEFI program that prints the name
//! it was started under and the SHA-256 of `\metropolis\parameters.pb`)
//! and a `system` payload; `metroctl osimage push` puts it in Debian's
//! `docker-registry`; `metroctl install request` asks the real agent
//! (built with the A/B loader) to install it onto a sparse loop device of
//! 8.6 GiB. Then the layout is checked with tools that are not ours
//! (`sfdisk --json`, `fsck.fat -n`, mtools), the boot entry with this
//! test's own decoder, and QEMU (TCG) on OVMF boots the disk: slot A,
//! then B once through `loader_state.pb`, then A again; then, with the
//! agent's `Boot0001` and `BootOrder` set in the VM's variable store (by
//! the test kernel), the firmware boots through that entry (its
//! `BootCurrent` is 0001; a corrupted entry gives another).
//!
//! Needs (Debian): docker-registry, gnu-efi and binutils, qemu-system-x86,
//! ovmf, fdisk, mtools, dosfstools; root (loop devices).

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use metropolis_core::hex;
use metropolis_proto::osbase::net::proto::{Net, net::Nameserver};
use metropolis_proto::prelude::debug::{NodeParameters, node_parameters};
use metropolis_tests::loop_device::LoopDevice;
use metropolis_tests::provisioning::report;
use metropolis_tests::qemu::{EspImage, Qemu, QemuConfig, build_efi_programs, vars_copy};
use metropolis_tests::registry::Registry;
use metropolis_tests::{AgentProcess, Daemon, EnrolledMachine, RuntimeKind};
use prost::Message;
use sha2::{Digest, Sha256};

const MACHINE: &str = "3b241101-e2bb-4255-8caf-4136c566a962";
const MARKER: &str = "METROPOLIS-TEST-KERNEL started as ";
const MIB: u64 = 1 << 20;
/// OVMF under TCG on a loaded two-core machine: generous.
const BOOT_TIMEOUT: Duration = Duration::from_secs(240);
/// The EFI global variable GUID, as efivarfs names files.
const GLOBAL: &str = "8be4df61-93ca-11d2-aa0d-00e098032b8c";

/// efi/build.sh's programs (shared with the loader's boot test).
fn programs() -> PathBuf {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("efi-loader");
    build_efi_programs(&out);
    out
}

fn run(command: &mut Command) -> String {
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{command:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// The partitions `sfdisk --json` reads on `device`: (name, type GUID,
/// start sector, size in sectors).
fn partitions(device: &Path) -> Vec<(String, String, u64, u64)> {
    let json = run(Command::new("sfdisk").arg("--json").arg(device));
    let table: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(table["partitiontable"]["label"], "gpt", "{json}");
    table["partitiontable"]["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["type"].as_str().unwrap().to_uppercase(),
                p["start"].as_u64().unwrap(),
                p["size"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// A `Boot####` variable file as efivarfs holds it, decoded by this
/// test: attributes, load option attributes, description, and the device
/// path's hard-drive node (partition, start, size, GUID) and file path.
struct BootEntry {
    attributes: u32,
    option_attributes: u32,
    description: String,
    partition: u32,
    start: u64,
    blocks: u64,
    /// The partition's unique GUID, as `sfdisk` writes one.
    guid: String,
    file: String,
}

fn u16s(bytes: &[u8]) -> Vec<u16> {
    bytes
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

fn decode_boot_entry(file: &[u8]) -> BootEntry {
    let le32 = |at: usize| u32::from_le_bytes(file[at..at + 4].try_into().unwrap());
    let le64 = |at: usize| u64::from_le_bytes(file[at..at + 8].try_into().unwrap());
    let attributes = le32(0);
    let option_attributes = le32(4);
    let path_len = usize::from(u16::from_le_bytes([file[8], file[9]]));
    let text = u16s(&file[10..]);
    let nul = text.iter().position(|c| *c == 0).unwrap();
    let description = String::from_utf16(&text[..nul]).unwrap();
    let path = &file[10 + 2 * (nul + 1)..];
    assert_eq!(path.len(), path_len, "the device path's length");
    // Hard drive: type 4, subtype 1, length 42.
    assert_eq!(&path[..4], &[4, 1, 42, 0]);
    let at = file.len() - path.len();
    let partition = le32(at + 4);
    let (start, blocks) = (le64(at + 8), le64(at + 16));
    assert_eq!(&path[40..42], &[2, 2], "GPT format, GUID signature");
    // The signature: the GUID in its mixed-endian bytes.
    let g = &path[24..40];
    let guid = format!(
        "{:08X}-{:04X}-{:04X}-{:02X}{:02X}-{}",
        u32::from_le_bytes(g[..4].try_into().unwrap()),
        u16::from_le_bytes([g[4], g[5]]),
        u16::from_le_bytes([g[6], g[7]]),
        g[8],
        g[9],
        g[10..]
            .iter()
            .map(|b| format!("{b:02X}"))
            .collect::<String>()
    );
    let node = &path[42..];
    assert_eq!(&node[..2], &[4, 4], "a file path node");
    let len = usize::from(u16::from_le_bytes([node[2], node[3]]));
    let name = u16s(&node[4..len]);
    let file_name = String::from_utf16(&name[..name.len() - 1]).unwrap();
    assert_eq!(&node[len..], &[0x7f, 0xff, 4, 0], "the end node");
    BootEntry {
        attributes,
        option_attributes,
        description,
        partition,
        start,
        blocks,
        guid,
        file: file_name,
    }
}

/// A `BootOrder` variable file decoded: its attributes and entries.
fn decode_boot_order(file: &[u8]) -> (u32, Vec<u16>) {
    let attributes = u32::from_le_bytes(file[..4].try_into().unwrap());
    (attributes, u16s(&file[4..]))
}

/// The unique GUID `sfdisk --json` reads for `device`'s first partition.
fn first_partition_uuid(device: &Path) -> String {
    let json = run(Command::new("sfdisk").arg("--json").arg(device));
    let table: serde_json::Value = serde_json::from_str(&json).unwrap();
    table["partitiontable"]["partitions"][0]["uuid"]
        .as_str()
        .unwrap()
        .to_uppercase()
}

/// `metroctl install request` of `image` onto `root_device` for
/// [`MACHINE`], with `extra` flags; panics with its error if it fails.
fn install_request(d: &Daemon, image: &str, root_device: &Path, extra: &[&str]) {
    let mut args = vec![
        "install",
        "request",
        MACHINE,
        "--image",
        image,
        "--root-device",
        root_device.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = d.metroctl(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Boots `disk` once; the test kernel's line.
fn boot(disk: &Path, vars: &Path, log_dir: &Path, name: &str) -> String {
    let mut vm = Qemu::start(&QemuConfig::new(disk, vars), log_dir, name);
    let line = vm
        .wait_for(MARKER, BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let _ = vm.wait_exit(Duration::from_secs(30));
    line
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_installs_metropolis_and_the_disk_boots_its_slots() {
    assert!(Registry::available(), "docker-registry is not installed");
    let dir = tempfile::tempdir().unwrap();
    let programs = programs();
    let kernel = std::fs::read(programs.join("test-kernel.efi")).unwrap();
    let system: Vec<u8> = (0..(48 * MIB as u32))
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    std::fs::write(dir.path().join("system.img"), &system).unwrap();

    // The operator's commands: build, push, request.
    let d = Daemon::start(&dir.path().join("d"), RuntimeKind::Tokio);
    let layout = dir.path().join("layout");
    let built = d.metroctl(&[
        "osimage",
        "build",
        "--out",
        layout.to_str().unwrap(),
        "--payload",
        &format!("kernel.efi={}", programs.join("test-kernel.efi").display()),
        "--payload",
        &format!("system={}", dir.path().join("system.img").display()),
    ]);
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let registry = Registry::start();
    let pushed = d.metroctl(&[
        "-o",
        "json",
        "osimage",
        "push",
        layout.to_str().unwrap(),
        &format!("http://{}/os/metropolis:v1", registry.addr),
    ]);
    assert!(
        pushed.status.success(),
        "{}",
        String::from_utf8_lossy(&pushed.stderr)
    );
    let pushed: serde_json::Value = serde_json::from_slice(&pushed.stdout).unwrap();
    let image = pushed["image"].as_str().unwrap().to_string();

    let EnrolledMachine {
        key_file,
        operator: mut op,
    } = d.enroll_machine(MACHINE, dir.path()).await;
    let firmware = dir.path().join("firmware-efi");
    let efivars = firmware.join("efivars");
    std::fs::create_dir_all(&efivars).unwrap();
    // An entry the firmware already had: kept, and the new one numbered
    // after it.
    std::fs::write(efivars.join(format!("Boot0000-{GLOBAL}")), [7, 0, 0, 0, 1]).unwrap();
    let network = dir.path().join("net.json");
    std::fs::write(&network, br#"{"nameserver": [{"ip": "192.0.2.53"}]}"#).unwrap();
    let flags = [
        format!("--firmware-dir={}", firmware.display()),
        format!("--efivars-dir={}", efivars.display()),
        format!("--network-config={}", network.display()),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let state = dir.path().join("state");
    let agent = AgentProcess::start_with(&d, MACHINE, &key_file, &state, &flags);

    let device = LoopDevice::attach_sparse_in(dir.path(), 8808 * MIB);
    let owner_key = vec![7u8; 32];
    let parameters_json = dir.path().join("params.json");
    std::fs::write(
        &parameters_json,
        // 32 bytes of 7, in the JSON mapping's base64.
        r#"{"clusterBootstrap": {"ownerPublicKey": "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc="}}"#,
    )
    .unwrap();
    install_request(
        &d,
        &image,
        device.path(),
        &["--node-parameters", parameters_json.to_str().unwrap()],
    );
    let r = report(&mut op, MACHINE, 1).await;
    assert!(r.success, "{}\n{}", r.error, agent.log());
    drop(agent);

    // The layout, as sfdisk reads it.
    let esp_type = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B";
    let found = partitions(device.path());
    let expected = [
        ("ESP", esp_type, 2048, 786_432),
        (
            "METROPOLIS-SYSTEM-A",
            "EE96054B-F6D0-4267-AAAA-724B2AFEA74C",
            788_480,
            8_388_608,
        ),
        (
            "METROPOLIS-SYSTEM-B",
            "EE96054B-F6D0-4267-BBBB-724B2AFEA74C",
            9_177_088,
            8_388_608,
        ),
    ];
    for (i, (name, kind, start, size)) in expected.iter().enumerate() {
        assert_eq!(
            (
                found[i].0.as_str(),
                found[i].1.as_str(),
                found[i].2,
                found[i].3
            ),
            (*name, *kind, *start, *size)
        );
    }
    let data = &found[3];
    assert_eq!(
        (data.0.as_str(), data.1.as_str(), data.2),
        (
            "METROPOLIS-NODE-DATA",
            "9EEEC464-6885-414A-B278-4305C51F7966",
            17_565_696
        )
    );
    assert_eq!(data.3 % 2048, 0, "the data partition is whole MiB");
    run(Command::new("sfdisk").arg("--verify").arg(device.path()));

    // Slot A holds `system`.
    let mut slot_a = vec![0u8; system.len()];
    std::os::unix::fs::FileExt::read_exact_at(
        &std::fs::File::open(device.path()).unwrap(),
        &mut slot_a,
        788_480 * 512,
    )
    .unwrap();
    assert!(slot_a == system, "slot A is not the system payload");

    // The ESP: fsck.fat on a copy, the files through mtools.
    let esp_copy = dir.path().join("esp.img");
    run(Command::new("dd")
        .arg(format!("if={}", device.path().display()))
        .arg(format!("of={}", esp_copy.display()))
        .args(["bs=1M", "skip=1", "count=384", "status=none"]));
    run(Command::new("fsck.fat").arg("-n").arg(&esp_copy));
    let esp = EspImage {
        path: device.path().to_path_buf(),
        offset: MIB,
    };
    assert_eq!(
        esp.get("EFI/BOOT/BOOTx64.EFI").unwrap(),
        std::fs::read(programs.join("BOOTx64.EFI")).unwrap(),
        "the loader"
    );
    assert_eq!(esp.get("EFI/metropolis/boot-a.efi").unwrap(), kernel);
    let parameters = esp.get("metropolis/parameters.pb").unwrap();
    let expected_parameters = NodeParameters {
        cluster: Some(node_parameters::Cluster::ClusterBootstrap(
            node_parameters::ClusterBootstrap {
                owner_public_key: owner_key.into(),
                ..Default::default()
            },
        )),
        network_config: Some(Net {
            nameserver: vec![Nameserver {
                ip: "192.0.2.53".into(),
            }],
            ..Default::default()
        }),
    };
    assert_eq!(
        NodeParameters::decode(parameters.as_slice()).unwrap(),
        expected_parameters
    );

    // The boot entry, decoded here.
    let boot0001 = std::fs::read(efivars.join(format!("Boot0001-{GLOBAL}"))).unwrap();
    let entry = decode_boot_entry(&boot0001);
    assert_eq!((entry.attributes, entry.option_attributes), (7, 1));
    assert_eq!(entry.description, "Metropolis");
    assert_eq!(
        (entry.partition, entry.start, entry.blocks),
        (1, 2048, 786_432)
    );
    assert_eq!(entry.file, "\\EFI\\BOOT\\BOOTx64.EFI");
    assert_eq!(
        entry.guid,
        first_partition_uuid(device.path()),
        "the ESP's GUID"
    );
    let order = std::fs::read(efivars.join(format!("BootOrder-{GLOBAL}"))).unwrap();
    assert_eq!(
        decode_boot_order(&order),
        (7, vec![1]),
        "BootOrder is the new entry alone"
    );
    assert_eq!(
        std::fs::read(efivars.join(format!("Boot0000-{GLOBAL}"))).unwrap(),
        [7, 0, 0, 0, 1],
        "the firmware's entry is kept"
    );

    // The disk boots slot A with the parameters it was given.
    let vars = dir.path().join("vars.fd");
    vars_copy(&vars);
    let line = boot(device.path(), &vars, dir.path(), "boot-1");
    let digest = hex::encode(&Sha256::digest(&parameters));
    assert!(line.contains("\\EFI\\metropolis\\boot-a.efi"), "{line}");
    assert!(
        line.contains(&format!("parameters-sha256 {digest}")),
        "{line}"
    );

    // B once, through loader_state.pb (active A, next B), then A again.
    esp.put("EFI/metropolis/boot-b.efi", &kernel);
    esp.put("EFI/metropolis/loader_state.pb", &[0x08, 0x01, 0x10, 0x02]);
    let line = boot(device.path(), &vars, dir.path(), "boot-2");
    assert!(line.contains("\\EFI\\metropolis\\boot-b.efi"), "{line}");
    assert_eq!(
        esp.get("EFI/metropolis/loader_state.pb").unwrap(),
        [0x08, 0x01],
        "next_slot cleared before booting B"
    );
    let line = boot(device.path(), &vars, dir.path(), "boot-3");
    assert!(line.contains("\\EFI\\metropolis\\boot-a.efi"), "{line}");
    assert!(!line.contains("boot-current 0001"), "{line}");

    // The boot entry the agent wrote, in the firmware: the test kernel
    // sets Boot0001 and BootOrder as the agent wrote them into the VM's
    // variable store (OVMF's own Boot0001 is replaced); at the next boot
    // the firmware follows BootOrder to that entry (BootCurrent 0001),
    // and through its hard-drive path the loader and slot A.
    esp.put("test-vars/BootOrder", &order);
    esp.put("test-vars/Boot0001", &boot0001);
    let mut vm = Qemu::start(&QemuConfig::new(device.path(), &vars), dir.path(), "boot-4");
    vm.wait_for("test-kernel: set Boot0001 and BootOrder", BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("boot-4: {e}"));
    let _ = vm.wait_exit(Duration::from_secs(30));
    esp.remove("test-vars/BootOrder");
    esp.remove("test-vars/Boot0001");
    let line = boot(device.path(), &vars, dir.path(), "boot-5");
    assert!(line.contains("\\EFI\\metropolis\\boot-a.efi"), "{line}");
    assert!(line.contains("boot-current 0001"), "{line}");
}

/// What refuses a Metropolis install leaves the disk untouched and says
/// why: a machine that did not boot with EFI, a disk too small for the
/// layout (naming the partition, the space and the whole layout's
/// minimum). The disk: a sparse 2 GiB
/// file (the ESP fits, slot A does not) whose first and last MiB hold an
/// "old system"; untouched means those MiB and its allocated blocks are
/// as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_installs_leave_the_disk_untouched() {
    assert!(Registry::available(), "docker-registry is not installed");
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::start();
    let kernel = vec![0x4du8; 4096];
    let system = vec![0x5au8; 1 << 20];
    let digest = registry.push_os_image(
        "os/metropolis",
        "v1",
        metropolis_tests::registry::METROPOLIS_ARTIFACT,
        &[("kernel.efi", &kernel), ("system", &system)],
    );
    let image = format!("http://{}/os/metropolis@{digest}", registry.addr);
    let d = Daemon::start(&dir.path().join("d"), RuntimeKind::Tokio);
    let EnrolledMachine {
        key_file,
        operator: mut op,
    } = d.enroll_machine(MACHINE, dir.path()).await;
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let disk = shm.path().join("disk.img");
    let old = vec![0xaau8; MIB as usize];
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(&disk).unwrap();
        f.set_len(2048 * MIB).unwrap();
        f.write_all_at(&old, 0).unwrap();
        f.write_all_at(&old, 2047 * MIB).unwrap();
    }
    let untouched = {
        use std::os::unix::fs::{FileExt, MetadataExt};
        let blocks = std::fs::metadata(&disk).unwrap().blocks();
        let disk = disk.clone();
        move || {
            let f = std::fs::File::open(&disk).unwrap();
            let mut ends = vec![0u8; 2 * MIB as usize];
            f.read_exact_at(&mut ends[..MIB as usize], 0).unwrap();
            f.read_exact_at(&mut ends[MIB as usize..], 2047 * MIB)
                .unwrap();
            ends.iter().all(|b| *b == 0xaa) && f.metadata().unwrap().blocks() == blocks
        }
    };
    let state = dir.path().join("state");
    let request = |generation: i64| {
        install_request(&d, &image, &disk, &[]);
        generation
    };

    // No /sys/firmware/efi.
    let missing = dir.path().join("no-firmware");
    let flags = [
        "--allow-image-files".to_string(),
        format!("--firmware-dir={}", missing.display()),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut agent = AgentProcess::start_with(&d, MACHINE, &key_file, &state, &flags);
    let r = report(&mut op, MACHINE, request(1)).await;
    assert!(!r.success);
    assert!(
        r.error
            .contains("can only be installed on EFI-booted machines"),
        "{}",
        r.error
    );
    assert!(untouched(), "the disk was touched");
    agent.kill();

    // A 2 GiB disk.
    let firmware = dir.path().join("firmware");
    std::fs::create_dir_all(firmware.join("efivars")).unwrap();
    let flags = [
        "--allow-image-files".to_string(),
        format!("--firmware-dir={}", firmware.display()),
        format!("--efivars-dir={}", firmware.join("efivars").display()),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let agent = AgentProcess::start_with(&d, MACHINE, &key_file, &state, &flags);
    let r = report(&mut op, MACHINE, request(2)).await;
    assert!(!r.success);
    assert!(
        r.error
            .contains("disk too small: partition METROPOLIS-SYSTEM-A"),
        "{}\n{}",
        r.error,
        agent.log()
    );
    // The whole layout's minimum, not only the partition's.
    assert!(
        r.error.ends_with(
            "the whole layout (ESP, system slots A and B, data) needs a disk of at least \
             8994701824 bytes (8579 MiB)"
        ),
        "{}",
        r.error
    );
    assert!(untouched(), "the disk was touched");
    assert_eq!(
        std::fs::read_dir(firmware.join("efivars")).unwrap().count(),
        0,
        "a boot entry was written"
    );
}
