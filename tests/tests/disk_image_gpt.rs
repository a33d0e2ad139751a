//! A whole-disk image smaller than its device, installed by the real
//! agent from a real registry (Debian's `docker-registry`) onto loop
//! devices (root, `losetup`): the image's backup GPT ends up in the
//! device's last blocks, so `sfdisk --verify` (util-linux, not ours)
//! finds nothing wrong where it found "The backup GPT table is not on
//! the end of the device" in the image as written; the partitions and
//! their contents are the image's. The agent asks the kernel to re-read
//! the table (`BLKRRPART`): a loop device with partitions of its own
//! (`losetup --partscan`) does, and the log says so; one without
//! refuses (EINVAL), and the log says that and what it means.
//!
//! The image is made by `sfdisk` (a GPT for 8 MiB: two partitions, each
//! filled with its own pattern); the devices are 24 MiB.

#![cfg(feature = "system")]
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use metropolis_tests::loop_device::LoopDevice;
use metropolis_tests::provisioning::{metropolis_request, report, submit};
use metropolis_tests::registry::Registry;
use metropolis_tests::{AgentProcess, Daemon, EnrolledMachine, RuntimeKind};

const MACHINE: &str = "3b241101-e2bb-4255-8caf-4136c566a962";
const MIB: u64 = 1 << 20;

/// `sfdisk ARGS DEVICE`: its exit status, stdout and stderr.
fn sfdisk(args: &[&str], device: &Path) -> (bool, String, String) {
    let out = Command::new("sfdisk")
        .args(args)
        .arg(device)
        .output()
        .expect("sfdisk (fdisk) is not installed");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// An 8 MiB image with a GPT made by `sfdisk`: partition 1 of 2 MiB at
/// 1 MiB holding 0x11s, partition 2 of 4 MiB (the rest, to the last whole
/// MiB) holding 0x22s.
fn gpt_image(dir: &Path) -> Vec<u8> {
    let path = dir.join("image.raw");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(8 * MIB)
        .unwrap();
    let mut child = Command::new("sfdisk")
        .args(["--quiet", "--no-reread", "--no-tell-kernel"])
        .arg(&path)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("sfdisk (fdisk) is not installed");
    std::io::Write::write_all(
        child.stdin.as_mut().unwrap(),
        b"label: gpt\nstart=2048, size=4096\nstart=6144\n",
    )
    .unwrap();
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success(), "sfdisk made no image");
    let mut image = std::fs::read(&path).unwrap();
    image[MIB as usize..3 * MIB as usize].fill(0x11);
    // sfdisk ends partition 2 on a whole MiB, at 7 MiB.
    image[3 * MIB as usize..7 * MIB as usize].fill(0x22);
    image
}

/// The `last-lba:` line of `sfdisk --dump`.
fn last_lba(dump: &str) -> u64 {
    dump.lines()
        .find_map(|l| l.strip_prefix("last-lba: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// The image's GPT, checked on `device` after the install: where
/// `sfdisk` said the backup was not at the end of a device of the
/// image's size written into a larger one, it now finds no error, the
/// last usable LBA grew to the device's end, and the partitions hold
/// what the image had.
fn check_relocated(device: &Path, image: &[u8]) {
    let (ok, out, err) = sfdisk(&["--verify"], device);
    assert!(ok && out.contains("No errors detected"), "{out}\n{err}");
    assert!(err.is_empty(), "sfdisk --verify warns: {err}");
    let (ok, dump, err) = sfdisk(&["--dump"], device);
    assert!(ok, "{err}");
    // 24 MiB = 49152 blocks: the backup header in 49151, its entries in
    // the 32 before, the last usable LBA before them.
    assert_eq!(last_lba(&dump), 49152 - 34, "{dump}");
    assert!(
        dump.contains("start=        2048, size=        4096"),
        "{dump}"
    );
    assert!(
        dump.contains("start=        6144, size=        8192"),
        "{dump}"
    );
    let written = std::fs::read(device).unwrap();
    assert!(
        written[MIB as usize..7 * MIB as usize] == image[MIB as usize..7 * MIB as usize],
        "the partitions hold the image's bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_smaller_gpt_image_gets_its_backup_at_the_device_s_end() {
    assert!(Registry::available(), "docker-registry is not installed");
    let dir = tempfile::tempdir().unwrap();
    let image = gpt_image(dir.path());

    // The image as written raw into a larger device: what sfdisk said
    // before the agent moved the backup.
    let raw = dir.path().join("raw.img");
    std::fs::write(&raw, &image).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&raw)
        .unwrap()
        .set_len(24 * MIB)
        .unwrap();
    let (_, _, err) = sfdisk(&["--verify"], &raw);
    assert!(
        err.contains("The backup GPT table is not on the end of the device"),
        "{err}"
    );

    let registry = Registry::start();
    let digest = registry.push_image("os/disk", "v1", &image);
    let d = Daemon::start(&dir.path().join("d"), RuntimeKind::Tokio);
    let EnrolledMachine {
        key_file,
        operator: mut op,
    } = d.enroll_machine(MACHINE, dir.path()).await;
    let agent = AgentProcess::start(&d, MACHINE, &key_file, &dir.path().join("state"));
    let install = |device: &Path| {
        let root = device.display().to_string();
        metropolis_request(&registry.addr, "os/disk", "", &digest, &root)
    };

    // A loop device with partitions of its own: the kernel re-reads.
    let partitioned = LoopDevice::attach_sparse_partitioned_in(dir.path(), 24 * MIB);
    assert_eq!(
        submit(&mut op, MACHINE, install(partitioned.path())).await,
        1
    );
    let r = report(&mut op, MACHINE, 1).await;
    assert!(r.success, "{}\n{}", r.error, agent.log());
    check_relocated(partitioned.path(), &image);
    let log = agent.log();
    assert!(
        log.contains(
            "backup GPT moved from LBA 16383 to the device's last LBA 49151; partitions may \
             now grow up to LBA 49118"
        ),
        "{log}"
    );
    let reread = format!(
        "the kernel re-read the partition table of {}",
        partitioned.path().display()
    );
    assert!(log.contains(&reread), "{log}");
    // Where the kernel reads GPTs (CONFIG_EFI_PARTITION), the partitions
    // are its devices now.
    if kernel_reads_gpt() {
        assert!(partitioned.partition(2).exists(), "no partition 2");
    }

    // One without: the kernel refuses, and the log says so.
    let plain = LoopDevice::attach_sparse_in(dir.path(), 24 * MIB);
    assert_eq!(submit(&mut op, MACHINE, install(plain.path())).await, 2);
    let r = report(&mut op, MACHINE, 2).await;
    assert!(r.success, "a refused re-read does not fail the install");
    check_relocated(plain.path(), &image);
    let refused = format!(
        "the kernel refused to re-read the partition table of {} (Invalid argument (os error \
         22)); the table is on the disk and is read at the next boot",
        plain.path().display()
    );
    assert!(agent.log().contains(&refused), "{}", agent.log());
}

/// Whether the running kernel has a GPT parser (it has none in some
/// minimal VM kernels: then no partition devices ever show).
fn kernel_reads_gpt() -> bool {
    let out = Command::new("sh")
        .args([
            "-c",
            "zcat /proc/config.gz 2>/dev/null || cat /boot/config-$(uname -r)",
        ])
        .output();
    out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("CONFIG_EFI_PARTITION=y"))
}
