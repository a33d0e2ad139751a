//! docs/provisioning.md, "A trial on a host without EFI", run as written:
//! the section's ` ```sh ` block, each line in order in one `bash` (so its
//! alias, its `image=` variable and its background processes carry from
//! line to line), so the recipe cannot drift from what works. The
//! rewriting is only what a test on a shared machine must do:
//!
//! - `metropolisd`, `metroctl` and `bmaas-agent` are the `*-under-test`
//!   binaries (the agent built with the A/B loader: the `system`
//!   feature), first on `PATH` under those names;
//! - the ports 7835 and 7836 are free loopback ports, the registry's
//!   127.0.0.1:5000 is a `docker-registry` this test starts on a free
//!   one, `/dev/shm/trial` a directory of this test's own under
//!   `/dev/shm`;
//! - `./kernel.efi` and `./system.img` are written first (stand-ins: a
//!   trial of the install boots nothing), as the reader brings them;
//! - the background processes are killed when the block ends.
//!
//! The block must exit 0 within 5 minutes; then what it wrote is checked
//! with tools that are not ours: the partitions `sfdisk --json` reads,
//! `sfdisk --verify`'s verdict, and the boot entry naming the ESP.
//!
//! Needs root, docker-registry, jq, fdisk, gnu-efi and binutils (the
//! loader).

#![cfg(feature = "system")]
#![allow(clippy::unwrap_used)]

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use metropolis_tests::registry::Registry;
use metropolis_tests::{daemon_bin, free_port};

const SECTION: &str = "## A trial on a host without EFI";
const MIB: u64 = 1 << 20;
/// The EFI global variable GUID, as efivarfs names files.
const GLOBAL: &str = "8be4df61-93ca-11d2-aa0d-00e098032b8c";

/// The lines of the section's first ` ```sh ` block, a line ending in `\`
/// joined with the next.
fn recipe(doc: &str) -> Vec<String> {
    let start = doc
        .find(SECTION)
        .expect("docs/provisioning.md has the trial");
    let section = &doc[start..];
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("the trial section has a ```sh block");
    let mut lines = Vec::new();
    let mut pending = String::new();
    for line in block.lines() {
        match line.strip_suffix('\\') {
            Some(head) => pending.push_str(head),
            None => {
                pending.push_str(line);
                let full = std::mem::take(&mut pending);
                if !full.trim().is_empty() {
                    lines.push(full.trim().to_string());
                }
            }
        }
    }
    lines
}

/// Kills the block's process group when dropped (a test that fails
/// midway leaves no daemon or agent behind).
struct Group(std::process::Child);

impl Drop for Group {
    fn drop(&mut self) {
        let pid = self.0.id().to_string();
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{pid}")])
            .status();
        let _ = self.0.wait();
    }
}

#[test]
fn the_documented_trial_installs_metropolis_into_a_sparse_file() {
    assert!(Registry::available(), "docker-registry is not installed");
    let doc_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/provisioning.md");
    let doc = std::fs::read_to_string(&doc_path).unwrap();
    let lines = recipe(&doc);
    assert!(
        lines.iter().any(|l| l.contains("truncate -s 8579M")),
        "the recipe's disk is the layout's minimum: {lines:#?}"
    );

    let dir = tempfile::tempdir().unwrap();
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    for (name, binary) in [
        ("metropolisd", "metropolisd-under-test"),
        ("metroctl", "metroctl-under-test"),
        ("bmaas-agent", "bmaas-agent-under-test"),
    ] {
        std::os::unix::fs::symlink(daemon_bin().with_file_name(binary), bin.join(name)).unwrap();
    }
    let kernel: Vec<u8> = (0..64 * 1024u32).map(|i| (i * 7 + 3) as u8).collect();
    let system: Vec<u8> = (0..4 * MIB as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    std::fs::write(dir.path().join("kernel.efi"), &kernel).unwrap();
    std::fs::write(dir.path().join("system.img"), &system).unwrap();

    let registry = Registry::start();
    let trial = shm.path().join("trial");
    let (listen, agent_listen) = (free_port(), free_port());
    let rewrite = |line: &str| {
        line.replace(":7835", &format!(":{listen}"))
            .replace(":7836", &format!(":{agent_listen}"))
            .replace("127.0.0.1:5000", &registry.addr)
            .replace("/dev/shm/trial", trial.to_str().unwrap())
    };
    let mut script =
        String::from("set -e\nshopt -s expand_aliases\ntrap 'kill $(jobs -p) 2>/dev/null' EXIT\n");
    script.push_str(&format!("export PATH={}:$PATH\n", bin.display()));
    for line in &lines {
        script.push_str(&rewrite(line));
        script.push('\n');
    }
    std::fs::write(dir.path().join("trial.sh"), &script).unwrap();

    let child = Command::new("setsid")
        .arg("bash")
        .arg(dir.path().join("trial.sh"))
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.path().join("trial.err")).unwrap())
        .spawn()
        .unwrap();
    let mut group = Group(child);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = group.0.try_wait().unwrap() {
            break status;
        }
        let err = std::fs::read_to_string(dir.path().join("trial.err")).unwrap_or_default();
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the trial did not end within 5 minutes:\n{script}\n{err}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut out = String::new();
    group
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let err = std::fs::read_to_string(dir.path().join("trial.err")).unwrap_or_default();
    assert!(
        status.success(),
        "the trial failed:\n{script}\n{out}\n{err}"
    );
    drop(group);

    // What the block printed: the report, sfdisk's verdict, the entry.
    assert!(out.contains("success"), "{out}");
    assert!(out.contains("No errors detected"), "{out}");
    assert!(out.contains(&format!("Boot0000-{GLOBAL}")), "{out}");
    assert!(out.contains(&format!("BootOrder-{GLOBAL}")), "{out}");

    // The file: the layout's minimum, the four partitions.
    let disk = trial.join("disk.img");
    assert_eq!(std::fs::metadata(&disk).unwrap().len(), 8579 * MIB);
    let json = Command::new("sfdisk")
        .arg("--json")
        .arg(&disk)
        .output()
        .unwrap();
    let table: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let partitions: Vec<(String, u64, u64)> = table["partitiontable"]["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["start"].as_u64().unwrap(),
                p["size"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        partitions,
        [
            ("ESP".to_string(), 2048, 786_432),
            ("METROPOLIS-SYSTEM-A".to_string(), 788_480, 8_388_608),
            ("METROPOLIS-SYSTEM-B".to_string(), 9_177_088, 8_388_608),
            ("METROPOLIS-NODE-DATA".to_string(), 17_565_696, 2048),
        ]
    );
    // Slot A holds the system image.
    let mut slot_a = vec![0u8; system.len()];
    std::os::unix::fs::FileExt::read_exact_at(
        &std::fs::File::open(&disk).unwrap(),
        &mut slot_a,
        788_480 * 512,
    )
    .unwrap();
    assert!(slot_a == system, "slot A is not system.img");
    // The boot entry: BootOrder is it alone, and it names the ESP by its
    // start and size (the hard-drive node of its device path).
    let efivars = dir.path().join("trial-efi/efivars");
    assert_eq!(
        std::fs::read(efivars.join(format!("BootOrder-{GLOBAL}"))).unwrap(),
        [7, 0, 0, 0, 0, 0]
    );
    let entry = std::fs::read(efivars.join(format!("Boot0000-{GLOBAL}"))).unwrap();
    let esp_span = [2048u64.to_le_bytes(), 786_432u64.to_le_bytes()].concat();
    assert!(
        entry.windows(esp_span.len()).any(|w| w == esp_span),
        "the boot entry does not name the ESP"
    );
}
