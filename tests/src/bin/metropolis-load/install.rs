//! `install`: the agent's installer putting a large OS image (default
//! 1 GiB, a whole-disk image whose one payload is raw or zstd) from a
//! local registry (Debian's `docker-registry`, started here, storage on
//! the work directory's disk) onto a target on the same disk, against
//! `dd ... oflag=direct conv=fsync` writing the same bytes to the same
//! target (after `zstd -d` for a zstd payload), in alternating windows.
//! The installer's figure includes everything an install does: fetching
//! the manifest and config, streaming the payload, verifying every chunk,
//! invalidating the target's ends, writing, reading the image back and
//! syncing. Since an install reads
//! back all it wrote, each round also times `dd ... iflag=direct` reading
//! the target back: the installer is compared with dd's write alone (the
//! project's target) and with dd's write followed by that read (the same
//! device work). Prints MB/s, the per-round ratios and their medians.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bmaas_agent::install::{Installer, OciInstaller, Progress, Target};
use metropolis_proto::prelude::debug::OsImageRef;
use metropolis_tests::loop_device::LoopDevice;
use metropolis_tests::registry::{DISK_ARTIFACT, Payload, Registry};

use super::util::{Context, Result, print_table, row};

/// Arguments of `install`.
#[derive(clap::Args, Debug, Clone)]
pub struct InstallArgs {
    /// Size of the image, in MiB.
    #[arg(long, default_value_t = 1024)]
    pub size_mib: u64,
    /// Windows per side, alternating (installer, dd, installer, ...).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// What is written: a loop device over a file on the work directory's
    /// disk (needs root), or a regular file there.
    #[arg(long, value_enum, default_value_t = TargetKind::Loop)]
    pub target: TargetKind,
    /// How the payload is stored: raw, or one zstd frame (made by the
    /// `zstd` program, level 3; dd's side then runs `zstd -d | dd`). The
    /// zstd image is half compressible (every other 8 KiB zeroed).
    #[arg(long, value_enum, default_value_t = Compression::None)]
    pub compression: Compression,
}

/// How the benchmark's payload is stored.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// Raw (`application/octet-stream`).
    None,
    /// One zstd frame (`application/zstd`).
    Zstd,
}

/// The kind of target written.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetKind {
    /// A loop block device.
    Loop,
    /// A regular file.
    File,
}

/// Deterministic incompressible bytes, as `load-image` makes them.
fn image(len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    super::load_image::fill(&mut out, &mut 0x9e37_79b9_7f4a_7c15u64);
    out
}

fn mb_per_s(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / 1e6 / elapsed.as_secs_f64().max(1e-9)
}

/// How long one install took, and its part until the whole layer was
/// received, written and read back (the rest: syncing and writing the
/// head).
struct Timed {
    total: Duration,
    written: Duration,
}

/// One install of `image` onto `target`.
async fn install(image: OsImageRef, target: PathBuf) -> Result<Timed> {
    let started = Instant::now();
    let written = tokio::task::spawn_blocking(move || {
        let mut written = None;
        let target = Target {
            root_device: target,
            node_parameters: None,
            node_parameters_encoded: None,
        };
        OciInstaller::new()
            .allow_image_files(true)
            .install(&image, &target, &mut |p: &Progress| {
                if let Progress::Writing {
                    written: w, total, ..
                } = p
                    && w == total
                {
                    written = Some(started.elapsed());
                }
            })
            .map(|()| written)
    })
    .await
    .map_err(|e| format!("the install thread failed: {e}"))?
    .map_err(|e| format!("install: {e}"))?;
    let total = started.elapsed();
    Ok(Timed {
        total,
        written: written.unwrap_or(total),
    })
}

/// `dd` of `source` onto `target`, direct and synced (through `zstd -d`
/// when `compressed`); its duration.
async fn dd_write(source: &Path, target: &Path, compressed: bool) -> Result<Duration> {
    if compressed {
        let mut command = Command::new("sh");
        command.arg("-c").arg(format!(
            "zstd -q -d -c '{}' | dd of='{}' bs=1M iflag=fullblock oflag=direct \
             conv=fsync,notrunc status=none",
            source.display(),
            target.display()
        ));
        return dd(command).await;
    }
    let mut command = Command::new("dd");
    command
        .arg(format!("if={}", source.display()))
        .arg(format!("of={}", target.display()))
        .args(["bs=1M", "oflag=direct", "conv=fsync,notrunc", "status=none"]);
    dd(command).await
}

/// `dd` reading the first `mib` MiB of `target` back, direct; its
/// duration.
async fn dd_read(target: &Path, mib: u64) -> Result<Duration> {
    let mut command = Command::new("dd");
    command
        .arg(format!("if={}", target.display()))
        .args(["of=/dev/null", "bs=1M", "iflag=direct", "status=none"])
        .arg(format!("count={mib}"));
    dd(command).await
}

/// Runs `command` (a dd); its duration.
async fn dd(mut command: Command) -> Result<Duration> {
    let started = Instant::now();
    let status = tokio::task::spawn_blocking(move || command.status())
        .await
        .map_err(|e| format!("the dd thread failed: {e}"))?
        .context(|| "running dd".into())?;
    if !status.success() {
        return Err(format!("dd failed: {status}").into());
    }
    Ok(started.elapsed())
}

/// Runs the scenario.
pub async fn run(args: InstallArgs, work: &Path) -> Result<()> {
    if args.size_mib == 0 || args.rounds == 0 {
        return Err("--size-mib and --rounds must be at least 1".into());
    }
    if !Registry::available() {
        return Err("docker-registry is not installed (apt-get install docker-registry)".into());
    }
    let size = args.size_mib << 20;
    let mut data = image(usize::try_from(size).map_err(|_| "--size-mib is too large")?);
    let compressed = args.compression == Compression::Zstd;
    if compressed {
        for block in data.chunks_mut(8192).skip(1).step_by(2) {
            block.fill(0);
        }
    }
    let raw = work.join("image.raw");
    std::fs::write(&raw, &data).context(|| "writing the image for dd".into())?;
    let source = if compressed {
        let zst = work.join("image.raw.zst");
        let status = Command::new("zstd")
            .args(["-q", "-f", "-3", "-T0"])
            .arg(&raw)
            .arg("-o")
            .arg(&zst)
            .status()
            .context(|| "zstd (Debian package zstd) is needed for --compression zstd".into())?;
        if !status.success() {
            return Err(format!("zstd failed: {status}").into());
        }
        zst
    } else {
        raw
    };
    // The registry's storage on the same disk as the target.
    let registry = Registry::start_in(work);
    let frame = if compressed {
        Some(std::fs::read(&source).context(|| "reading the zstd frame".into())?)
    } else {
        None
    };
    let digest = registry.push_payloads(
        "os/metropolis",
        "bench",
        DISK_ARTIFACT,
        &[Payload {
            name: "disk",
            bytes: &data,
            zstd: frame.as_deref(),
        }],
    );
    drop(data);
    drop(frame);
    let image = OsImageRef {
        scheme: "http".into(),
        host: registry.addr.clone(),
        repository: "os/metropolis".into(),
        tag: String::new(),
        digest,
    };
    // The target: 2 MiB larger than the image (its ends are invalidated).
    let (device, target) = match args.target {
        TargetKind::Loop => {
            let device = LoopDevice::attach_sparse_in(work, size + (2 << 20));
            let path = device.path().to_path_buf();
            (Some(device), path)
        }
        TargetKind::File => (None, work.join("target.img")),
    };
    println!(
        "install: {} MiB {:?} image from docker-registry at {} onto {} ({:?}), against dd \
         oflag=direct conv=fsync",
        args.size_mib,
        args.compression,
        registry.addr,
        target.display(),
        args.target
    );
    // One untimed dd write first: the target's backing file is new and
    // sparse, and whichever side writes it first pays for its blocks and
    // page cache (under memory pressure, reclaiming other pages), which
    // a real disk does not charge. The installer's first round would pay
    // it alone.
    let warm_up = dd_write(&source, &target, compressed).await?;
    println!(
        "  warm-up (untimed): dd wrote the target once in {:.2} s",
        warm_up.as_secs_f64()
    );
    let (mut installer, mut direct, mut read, mut both) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..args.rounds {
        let timed = install(image.clone(), target.clone()).await?;
        let w = dd_write(&source, &target, compressed).await?;
        let r = dd_read(&target, args.size_mib).await?;
        let i = mb_per_s(size, timed.total);
        let (d, rd, wr) = (mb_per_s(size, w), mb_per_s(size, r), mb_per_s(size, w + r));
        println!(
            "  round {}: installer {i:.0} MB/s ({:.2} s streaming, writing and reading back, \
             {:.2} s committing), dd write {d:.0} MB/s, dd read {rd:.0} MB/s; installer/dd \
             write {:.3}, installer/(dd write + read) {:.3}",
            round + 1,
            timed.written.as_secs_f64(),
            (timed.total - timed.written).as_secs_f64(),
            i / d,
            i / wr
        );
        installer.push(i);
        direct.push(d);
        read.push(rd);
        both.push(wr);
    }
    let ratios = |baseline: &[f64]| -> (String, f64) {
        let mut ratios: Vec<f64> = installer.iter().zip(baseline).map(|(i, d)| i / d).collect();
        let per_round = ratios
            .iter()
            .map(|r| format!("{r:.3}"))
            .collect::<Vec<_>>()
            .join(" ");
        ratios.sort_by(f64::total_cmp);
        (per_round, ratios[ratios.len() / 2])
    };
    let (per_round, median) = ratios(&direct);
    let (per_round_both, median_both) = ratios(&both);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    print_table(
        &format!(
            "install: {} MiB {:?}, {} rounds, {:?} target",
            args.size_mib, args.compression, args.rounds, args.target
        ),
        &[
            row("installer MB/s (mean)", format!("{:.0}", mean(&installer))),
            row("dd write MB/s (mean)", format!("{:.0}", mean(&direct))),
            row("dd read MB/s (mean)", format!("{:.0}", mean(&read))),
            row("installer/dd write per round", per_round),
            row("installer/dd write, median round", format!("{median:.3}")),
            row("installer/(dd write + read) per round", per_round_both),
            row(
                "installer/(dd write + read), median round",
                format!("{median_both:.3}"),
            ),
        ],
    );
    let kind = match args.target {
        TargetKind::Loop => "loop",
        TargetKind::File => "file",
    };
    println!(
        "RESULT install size_mib={} compression={:?} rounds={} target={kind} installer_mbps={:.0} \
         dd_mbps={:.0} dd_read_mbps={:.0} ratio_median={median:.3} \
         ratio_write_read_median={median_both:.3}",
        args.size_mib,
        args.compression,
        args.rounds,
        mean(&installer),
        mean(&direct),
        mean(&read)
    );
    drop(device);
    Ok(())
}
