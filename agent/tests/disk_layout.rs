//! The install disk checked by other tools than the ones that wrote it:
//! an image file laid out, formatted and partitioned by `bmaas_agent::disk`
//! and read back with util-linux's `sfdisk` (the GPT), `fsck.fat` from
//! dosfstools (the ESP) and mtools' `minfo`, `mlabel` and `mtype` (the
//! ESP's parameters, label and files).
//!
//! Needs only files (sparse images in a temporary directory), no root. A
//! case whose tool is missing prints `SKIPPED` and passes; CI installs the
//! Debian packages `fdisk`, `dosfstools` and `mtools`.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use bmaas_agent::disk::{self, Layout, MIB, Window, esp};
use serde_json::Value;

/// About 8.6 GiB: a little more than the smallest disk (8578 MiB).
const IMAGE_BYTES: u64 = 8800 * MIB;

/// The tool `name`, looked for in `PATH`, `/usr/sbin` and `/sbin` (where
/// `sfdisk` and `fsck.fat` live, often outside a user's `PATH`).
fn tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// The tools, or `None` after printing which are missing.
fn tools<const N: usize>(test: &str, names: [&str; N]) -> Option<[PathBuf; N]> {
    let found = names.map(tool);
    let missing: Vec<&str> = names
        .iter()
        .zip(&found)
        .filter(|(_, path)| path.is_none())
        .map(|(name, _)| *name)
        .collect();
    if !missing.is_empty() {
        eprintln!(
            "{test}: SKIPPED: {} not installed (Debian: fdisk, dosfstools, mtools)",
            missing.join(", ")
        );
        return None;
    }
    Some(found.map(|path| path.expect("found")))
}

fn run(program: &Path, args: &[&str]) -> Output {
    let output = Command::new(program)
        .args(args)
        // mtools otherwise refuses a FAT whose geometry it finds odd.
        .env("MTOOLS_SKIP_CHECK", "1")
        .output()
        .unwrap_or_else(|e| panic!("{} could not start: {e}", program.display()));
    assert!(
        output.status.success(),
        "{} {args:?}: {}\nstdout:\n{}\nstderr:\n{}",
        program.display(),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn text(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Bytes that differ from file to file and from block to block.
fn contents(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ seed)
        .collect()
}

/// An install image: the layout, the ESP with its files, the GPT.
struct Image {
    _dir: tempfile::TempDir,
    path: PathBuf,
    layout: Layout,
    files: Vec<(&'static str, Vec<u8>)>,
}

impl Image {
    fn new(block: u32) -> Image {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("disk.img");
        let file = File::create_new(&path).expect("image");
        file.set_len(IMAGE_BYTES).expect("set_len");
        let layout = Layout::plan(IMAGE_BYTES, block).expect("the image fits");
        let files = vec![
            ("EFI/BOOT/BOOTx64.EFI", contents(1, 150_000)),
            (
                "EFI/metropolis/boot-a.efi",
                contents(2, 24 * MIB as usize + 77),
            ),
            ("metropolis/parameters.pb", contents(3, 300)),
        ];
        let given: Vec<(&str, &[u8])> = files.iter().map(|(p, c)| (*p, &c[..])).collect();
        esp::format_bytes(&file, &layout, &given).expect("ESP formatted");
        disk::gpt::write(&file, &layout).expect("GPT written");
        Image {
            _dir: dir,
            path,
            layout,
            files,
        }
    }

    fn path(&self) -> &str {
        self.path.to_str().expect("a UTF-8 temporary path")
    }

    /// mtools' name of the ESP: the image at the ESP's offset.
    fn esp(&self) -> String {
        format!("{}@@{}", self.path(), self.layout.esp().offset)
    }

    /// The ESP copied into a file of its own, for fsck.fat.
    fn esp_alone(&self) -> PathBuf {
        let path = self.path.with_extension("esp");
        let image = File::open(&self.path).expect("image");
        let mut window = Window::partition(&image, self.layout.esp());
        let mut out = File::create_new(&path).expect("ESP file");
        io::copy(&mut window, &mut out).expect("ESP copied");
        path
    }
}

#[test]
fn sfdisk_reads_the_gpt_of_the_layout() {
    let Some([sfdisk]) = tools("sfdisk_reads_the_gpt_of_the_layout", ["sfdisk"]) else {
        return;
    };
    let image = Image::new(512);
    let json: Value = serde_json::from_slice(&run(&sfdisk, &["--json", image.path()]).stdout)
        .expect("sfdisk --json prints JSON");
    let table = &json["partitiontable"];
    assert_eq!(table["label"], "gpt", "{json}");
    assert_eq!(table["sectorsize"], 512);
    assert_eq!(
        table["id"].as_str().map(str::to_lowercase),
        Some(image.layout.disk_guid().to_string())
    );
    assert_eq!(table["firstlba"], 34);
    assert_eq!(table["lastlba"], image.layout.last_usable_lba());
    let partitions = table["partitions"].as_array().expect("partitions");
    assert_eq!(partitions.len(), 4, "{json}");
    for (found, planned) in partitions.iter().zip(image.layout.partitions()) {
        assert_eq!(found["name"], planned.name, "{found}");
        assert_eq!(
            found["type"].as_str().map(str::to_lowercase),
            Some(planned.type_guid.to_string()),
            "{found}"
        );
        assert_eq!(
            found["uuid"].as_str().map(str::to_lowercase),
            Some(planned.unique_guid.to_string()),
            "{found}"
        );
        assert_eq!(found["start"], planned.first_lba, "{found}");
        assert_eq!(found["size"], planned.blocks(), "{found}");
        assert_eq!(found.get("attrs"), None, "no attributes: {found}");
    }
    let starts: Vec<u64> = partitions
        .iter()
        .filter_map(|p| p["start"].as_u64())
        .collect();
    assert_eq!(starts, [2048, 788_480, 9_177_088, 17_565_696]);

    let verify = text(&run(&sfdisk, &["--verify", image.path()]));
    assert!(verify.contains("No errors detected"), "{verify}");
}

#[test]
fn fsck_fat_finds_the_esp_clean() {
    let Some([fsck]) = tools("fsck_fat_finds_the_esp_clean", ["fsck.fat"]) else {
        return;
    };
    for block in [512, 4096] {
        let image = Image::new(block);
        let esp = image.esp_alone();
        let esp = esp.to_str().expect("UTF-8 path");
        let report = text(&run(&fsck, &["-n", "-v", esp]));
        assert!(
            report.contains(&format!("{block} bytes per logical sector")),
            "{report}"
        );
        assert!(
            report.contains(&format!("{block} bytes per cluster")),
            "{report}"
        );
        assert!(report.contains("8 reserved sectors"), "{report}");
        // Exit status 0 is "no errors"; what it would have fixed, it says.
        for complaint in [
            "Fixing",
            "Renam",
            "uninitialized",
            "differ",
            "share clusters",
        ] {
            assert!(!report.contains(complaint), "{report}");
        }
    }
}

#[test]
fn mtools_read_the_esp_label_parameters_and_files() {
    let Some([minfo, mlabel, mtype]) = tools(
        "mtools_read_the_esp_label_parameters_and_files",
        ["minfo", "mlabel", "mtype"],
    ) else {
        return;
    };
    let image = Image::new(512);
    let esp = image.esp();
    let info = text(&run(&minfo, &["-i", &esp, "::"]));
    for expected in [
        "sector size: 512 bytes",
        "cluster size: 1 sectors",
        "reserved (boot) sectors: 8",
        "fats: 2",
        "media descriptor byte: 0xf8",
        "infoSector location=1",
        "backup boot sector=6",
        "disk label=\"MNGN_BOOT  \"",
        "disk type=\"FAT32   \"",
    ] {
        assert!(info.contains(expected), "minfo lacks {expected:?}:\n{info}");
    }
    let label = text(&run(&mlabel, &["-s", "-i", &esp, "::"]));
    assert!(label.contains("Volume label is MNGN_BOOT"), "{label}");
    for (path, contents) in &image.files {
        let read = run(&mtype, &["-i", &esp, &format!("::/{path}")]).stdout;
        assert!(
            read == *contents,
            "{path}: {} bytes read back differ",
            read.len()
        );
    }
}

/// The extents of `file` that hold data (`SEEK_DATA` / `SEEK_HOLE`), or
/// `None` where the filesystem does not report holes.
fn data_extents(file: &File) -> Option<Vec<(u64, u64)>> {
    use std::os::fd::AsRawFd;
    let end = file.metadata().expect("metadata").len();
    let seek = |from: u64, whence| {
        // SAFETY: lseek on a descriptor that `file` keeps open.
        let at = unsafe { libc::lseek(file.as_raw_fd(), from as libc::off_t, whence) };
        u64::try_from(at).ok()
    };
    let mut extents = Vec::new();
    let mut at = 0;
    while let Some(start) = seek(at, libc::SEEK_DATA) {
        let stop = seek(start, libc::SEEK_HOLE).unwrap_or(end);
        extents.push((start, stop));
        at = stop;
    }
    (extents != [(0, end)]).then_some(extents)
}

#[test]
fn nothing_outside_the_esp_and_the_tables_is_written() {
    let image = Image::new(512);
    let layout = &image.layout;
    let file = File::open(&image.path).expect("image");
    let Some(extents) = data_extents(&file) else {
        eprintln!("nothing_outside_the_esp_and_the_tables_is_written: SKIPPED: no holes here");
        return;
    };
    let esp = layout.esp();
    // Extents are in the filesystem's blocks: 4 KiB is the largest usual.
    let block = |start: u64, end: u64| (start / 4096 * 4096, end.div_ceil(4096) * 4096);
    let allowed = [
        block(0, layout.first_usable_lba() * 512),
        block(esp.offset, esp.offset + esp.length),
        block((layout.last_usable_lba() + 1) * 512, IMAGE_BYTES),
    ];
    for (start, stop) in extents {
        assert!(
            allowed.iter().any(|&(a, b)| a <= start && stop <= b),
            "data at {start}..{stop}, outside {allowed:?}"
        );
    }
}
