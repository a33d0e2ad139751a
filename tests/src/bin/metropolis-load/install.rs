//! `install`: the agent's installer putting a large OS image (default
//! 1 GiB, a whole-disk image whose one payload is raw or zstd) from a
//! local registry (Debian's `docker-registry`, started here, storage on
//! the work directory's disk) onto a target on the same disk, against
//! what an operator would run instead: `curl` of the same layer blob from
//! the same registry piped into `dd oflag=direct conv=fsync` onto the same
//! target (through `zstd -d` for a zstd payload), verifying nothing (the
//! project's comparison). The same `dd` fed from a local file is timed
//! too, as the device's limit. The installer's figure includes everything
//! an install does: fetching the manifest and config, streaming the
//! payload, verifying every chunk, invalidating the target's ends,
//! writing, reading the image back and syncing. Since an install reads
//! back all it wrote, each round also times `dd ... iflag=direct` reading
//! the target back. Each round runs installer, peer, dd from the file and
//! the read, in that order, so that the machine's drift over a minute
//! reaches all sides alike. Prints MB/s per round, the per-round ratios
//! and their medians.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bmaas_agent::install::{Installer, OciInstaller, Progress, Target};
use metropolis_proto::prelude::debug::OsImageRef;
use metropolis_tests::loop_device::LoopDevice;
use metropolis_tests::registry::{DISK_ARTIFACT, Payload, Registry};

use super::install_peer::{DD_BS, dd_read, dd_write, parse_bs, peer_line, peer_write, same_bytes};
use super::rounds::{format_ratios, median};
use super::util::{Context, Result, print_table, row};

/// Arguments of `install`.
#[derive(clap::Args, Debug, Clone)]
pub struct InstallArgs {
    /// Size of the image, in MiB.
    #[arg(long, default_value_t = 1024)]
    pub size_mib: u64,
    /// Rounds; each times the installer, then the peer (curl | dd), then
    /// dd from a local file, then dd reading the target back.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// What is written: a loop device over a file on the work directory's
    /// disk (needs root), or a regular file there.
    #[arg(long, value_enum, default_value_t = TargetKind::Loop)]
    pub target: TargetKind,
    /// How the payload is stored: raw, or one zstd frame (made by the
    /// `zstd` program, level 3; the peer then runs `curl | zstd -d | dd`). The
    /// zstd image is half compressible (every other 8 KiB zeroed).
    #[arg(long, value_enum, default_value_t = Compression::None)]
    pub compression: Compression,
    /// dd's block size (`bs=`) on the peer's and the local file's side,
    /// e.g. 4M, 1M or 65536.
    #[arg(long, value_name = "BS", default_value = DD_BS, value_parser = parse_bs)]
    pub dd_bs: String,
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

/// One round's durations.
struct Round {
    installer: Timed,
    peer: Duration,
    dd: Duration,
    read: Duration,
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
        raw.clone()
    };
    // The registry's storage on the same disk as the target.
    let registry = Registry::start_in(work);
    let frame = if compressed {
        Some(std::fs::read(&source).context(|| "reading the zstd frame".into())?)
    } else {
        None
    };
    let repository = "os/metropolis";
    let digest = registry.push_payloads(
        repository,
        "bench",
        DISK_ARTIFACT,
        &[Payload {
            name: "disk",
            bytes: &data,
            zstd: frame.as_deref(),
        }],
    );
    // The layer as the registry stores it: what the peer fetches.
    let blob_url = format!(
        "http://{}/v2/{repository}/blobs/{}",
        registry.addr,
        metropolis_tests::registry::digest(frame.as_deref().unwrap_or(&data))
    );
    drop(data);
    drop(frame);
    let image = OsImageRef {
        scheme: "http".into(),
        host: registry.addr.clone(),
        repository: repository.into(),
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
        "install: {} MiB {:?} image from docker-registry at {} (open, no login) onto {} ({:?})",
        args.size_mib,
        args.compression,
        registry.addr,
        target.display(),
        args.target
    );
    println!(
        "  peer: {}",
        peer_line(&blob_url, &target, &args.dd_bs, compressed)
    );
    println!(
        "  dd from the local file: dd if={} of={} bs={} oflag=direct conv=fsync,notrunc{}",
        source.display(),
        target.display(),
        args.dd_bs,
        if compressed { " (after zstd -d)" } else { "" }
    );
    // One untimed peer run first: the target's backing file is new and
    // sparse, and whichever side writes it first pays for its blocks and
    // page cache (under memory pressure, reclaiming other pages), which
    // a real disk does not charge; the installer's first round would pay
    // it alone. It also checks that the peer writes the image.
    let warm_up = peer_write(&blob_url, &target, &args.dd_bs, compressed).await?;
    same_bytes(&target, &raw, size)?;
    println!(
        "  warm-up (untimed): the peer wrote the image onto the target in {:.2} s (checked)",
        warm_up.as_secs_f64()
    );
    let mut rounds = Vec::new();
    for n in 1..=args.rounds {
        let installer = install(image.clone(), target.clone()).await?;
        let peer = peer_write(&blob_url, &target, &args.dd_bs, compressed).await?;
        let dd = dd_write(&source, &target, &args.dd_bs, compressed).await?;
        let read = dd_read(&target, args.size_mib).await?;
        let r = Round {
            installer,
            peer,
            dd,
            read,
        };
        let (i, p, d, rd) = (
            mb_per_s(size, r.installer.total),
            mb_per_s(size, r.peer),
            mb_per_s(size, r.dd),
            mb_per_s(size, r.read),
        );
        println!(
            "  round {n}: installer {i:.0} MB/s ({:.2} s streaming, writing and reading back, \
             {:.2} s committing), peer {p:.0} MB/s, dd from file {d:.0} MB/s, dd read {rd:.0} \
             MB/s; installer/peer {:.3}, installer/dd {:.3}",
            r.installer.written.as_secs_f64(),
            (r.installer.total - r.installer.written).as_secs_f64(),
            i / p,
            i / d
        );
        rounds.push(r);
    }
    drop(registry);
    summary(&args, size, &rounds);
    drop(device);
    Ok(())
}

/// Prints the table and the `RESULT` line of `rounds`.
fn summary(args: &InstallArgs, size: u64, rounds: &[Round]) {
    let figures = |f: &dyn Fn(&Round) -> Duration| -> Vec<f64> {
        rounds.iter().map(|r| mb_per_s(size, f(r))).collect()
    };
    let installer = figures(&|r| r.installer.total);
    let peer = figures(&|r| r.peer);
    let dd = figures(&|r| r.dd);
    let read = figures(&|r| r.read);
    let both = figures(&|r| r.dd + r.read);
    let over = |a: &[f64], b: &[f64]| -> Vec<f64> { a.iter().zip(b).map(|(x, y)| x / y).collect() };
    let per_round = |v: &[f64]| -> String {
        v.iter()
            .map(|x| format!("{x:.0}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let vs_peer = over(&installer, &peer);
    let vs_dd = over(&installer, &dd);
    let peer_vs_dd = over(&peer, &dd);
    let vs_both = over(&installer, &both);
    print_table(
        &format!(
            "install: {} MiB {:?}, {} rounds, {:?} target, dd bs={}",
            args.size_mib, args.compression, args.rounds, args.target, args.dd_bs
        ),
        &[
            row("installer MB/s per round", per_round(&installer)),
            row(
                if args.compression == Compression::Zstd {
                    "peer (curl | zstd -d | dd) MB/s per round"
                } else {
                    "peer (curl | dd) MB/s per round"
                },
                per_round(&peer),
            ),
            row("dd from file MB/s per round", per_round(&dd)),
            row("dd read MB/s per round", per_round(&read)),
            row("installer/peer per round", format_ratios(&vs_peer)),
            row(
                "installer/peer, median round",
                format!("{:.3}", median(&vs_peer)),
            ),
            row("installer/dd from file per round", format_ratios(&vs_dd)),
            row(
                "installer/dd from file, median round",
                format!("{:.3}", median(&vs_dd)),
            ),
            row(
                "peer/dd from file, median round",
                format!("{:.3}", median(&peer_vs_dd)),
            ),
            row(
                "installer/(dd write + read), median round",
                format!("{:.3}", median(&vs_both)),
            ),
        ],
    );
    let kind = match args.target {
        TargetKind::Loop => "loop",
        TargetKind::File => "file",
    };
    println!(
        "RESULT install size_mib={} compression={:?} rounds={} target={kind} dd_bs={} \
         installer_mbps={:.0} peer_mbps={:.0} dd_mbps={:.0} dd_read_mbps={:.0} \
         ratio_peer_median={:.3} ratio_dd_median={:.3} ratio_write_read_median={:.3}",
        args.size_mib,
        args.compression,
        args.rounds,
        args.dd_bs,
        median(&installer),
        median(&peer),
        median(&dd),
        median(&read),
        median(&vs_peer),
        median(&vs_dd),
        median(&vs_both)
    );
}
