//! `load-image`: LoadImage of a large Docker archive (default 1 GiB) over
//! loopback into a real daemon, against a peer doing the same job in the
//! same run, in alternating windows (one import each per round):
//!
//! - `--against disk` (the default): into the daemon's default image store
//!   (an OCI layout, fsynced), against copying the archive to a file on
//!   the same disk with the same write size and one fsync;
//! - `--against containerd`: into a containerd started here (its root on
//!   the work directory's disk), through the daemon's `--containerd-socket`
//!   store, against `ctr images import` of the same tarball into the same
//!   containerd, with the flags the store gives it.
//!
//! Prints each round's MB/s of both sides and their ratio, the median
//! ratio, and the daemon's CPU time per GiB.

mod archive;
pub(crate) use archive::fill;
mod containerd;

use std::io::{Read, Write};
use std::path::Path;
use std::time::Instant;

use futures::SinkExt;
use metropolis_proto::prelude::debug::{self, node_debug_service_client::NodeDebugServiceClient};
use metropolis_transport::grpc::Channel;

use crate::daemon::{DaemonProcess, Target, free_addr};
use crate::rounds::{format_ratios, median};
use crate::util::{Context, Result, cpu_seconds, print_table, row};

/// What LoadImage is compared with.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Against {
    /// The default store against a plain copy of the archive with fsync.
    Disk,
    /// The containerd store against `ctr images import`.
    Containerd,
}

/// Arguments of `load-image`.
#[derive(clap::Args, Debug, Clone)]
pub struct LoadImageArgs {
    /// Size of the image's layer, in MiB.
    #[arg(long, default_value_t = 1024)]
    pub size_mib: u64,
    /// Bytes per streamed message (metroctl's default).
    #[arg(long, default_value_t = 1024 * 1024)]
    pub chunk_size: usize,
    /// What LoadImage is compared with.
    #[arg(long, value_enum, default_value_t = Against::Disk)]
    pub against: Against,
    /// Rounds: one import by each side per round, alternating.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
}

/// One round's figures: seconds of each side, and the daemon's CPU
/// seconds during its import.
pub(crate) struct Round {
    pub(crate) load_secs: f64,
    pub(crate) peer_secs: f64,
    pub(crate) daemon_cpu: f64,
}

/// Runs the scenario.
pub async fn run(args: LoadImageArgs, target: &Target, work: &Path) -> Result<()> {
    let archive = work.join("image.tar");
    println!("writing a {} MiB test archive ...", args.size_mib);
    let size = archive::write_archive(work, &archive, args.size_mib * 1024 * 1024)?;
    // Write the archive back before timing (it stays in the page cache,
    // which both sides read it from).
    std::fs::File::open(&archive)
        .and_then(|f| f.sync_all())
        .context(|| "fsync archive".into())?;
    let rounds = match args.against {
        Against::Disk => against_disk(&args, target, work, &archive, size).await?,
        Against::Containerd => containerd::against_ctr(&args, target, work, &archive, size).await?,
    };
    report(&args, target, size, &rounds);
    Ok(())
}

/// Rounds against the disk: each LoadImage into a fresh daemon (a fresh
/// store, so no blob is already there), each copy into a new file.
async fn against_disk(
    args: &LoadImageArgs,
    target: &Target,
    work: &Path,
    archive: &Path,
    size: u64,
) -> Result<Vec<Round>> {
    let mut rounds = Vec::with_capacity(args.rounds);
    for i in 0..args.rounds {
        let data = work.join(format!("data-{i}"));
        let mut daemon = Imports::start(target, &data, &[]).await?;
        let peer_secs = disk_copy(archive, &work.join("baseline.bin"), args.chunk_size)?;
        let (load_secs, daemon_cpu) = daemon.load(archive, args.chunk_size).await?;
        daemon.process.stop();
        std::fs::remove_dir_all(&data).context(|| format!("removing {}", data.display()))?;
        println!(
            "round {}: LoadImage {:.0} MB/s, disk {:.0} MB/s",
            i + 1,
            mbps(size, load_secs),
            mbps(size, peer_secs)
        );
        rounds.push(Round {
            load_secs,
            peer_secs,
            daemon_cpu,
        });
    }
    Ok(rounds)
}

/// `size` bytes in `secs` seconds, in MB/s.
pub(crate) fn mbps(size: u64, secs: f64) -> f64 {
    size as f64 / 1e6 / secs
}

/// A daemon with its debug service, and a client of it.
pub(crate) struct Imports {
    pub(crate) process: DaemonProcess,
    client: NodeDebugServiceClient<Channel>,
}

impl Imports {
    /// Starts a daemon on `data` with `extra` flags, connected to.
    pub(crate) async fn start(target: &Target, data: &Path, extra: &[String]) -> Result<Imports> {
        let debug_addr = free_addr()?;
        let process = DaemonProcess::start_with(
            &target.bin,
            data,
            target.runtime,
            "warn",
            &[
                &["--debug-listen".to_string(), debug_addr.clone()][..],
                extra,
                &target.extra[..],
            ]
            .concat(),
        )?;
        let channel = metropolis_transport::connect::plain(
            &metropolis_runtime_tokio::rt::TokioRuntime::shared(),
            &debug_addr,
        )
        .await
        .context(|| format!("connecting to {debug_addr}"))?;
        let client = NodeDebugServiceClient::with_origin(channel, Channel::origin());
        Ok(Imports { process, client })
    }

    /// Streams `archive` in `chunk`-byte messages (as metroctl does);
    /// returns the seconds until the daemon acknowledged the import and
    /// the daemon's CPU seconds meanwhile.
    pub(crate) async fn load(&mut self, archive: &Path, chunk: usize) -> Result<(f64, f64)> {
        let pid = self.process.pid()?;
        let cpu_before = cpu_seconds(pid)?;
        let (mut tx, rx) = futures::channel::mpsc::channel::<debug::ImagePart>(4);
        let path = archive.to_path_buf();
        let start = Instant::now();
        let reader = tokio::task::spawn_blocking(move || -> Result<()> {
            let mut file = std::fs::File::open(&path).context(|| "archive".into())?;
            loop {
                let mut buf = vec![0u8; chunk];
                let n = file
                    .read(&mut buf)
                    .context(|| "reading the archive".into())?;
                if n == 0 {
                    return Ok(());
                }
                buf.truncate(n);
                let part = debug::ImagePart {
                    data_part: buf.into(),
                };
                if futures::executor::block_on(tx.send(part)).is_err() {
                    return Ok(());
                }
            }
        });
        self.client
            .load_image(rx)
            .await
            .context(|| "LoadImage".into())?;
        let secs = start.elapsed().as_secs_f64();
        let cpu = cpu_seconds(pid)? - cpu_before;
        reader.await.context(|| "reader task".into())??;
        self.process.check_alive()?;
        Ok((secs, cpu))
    }
}

/// Copies `archive` to `dest` in `chunk`-byte writes and fsyncs: the disk
/// baseline. Returns seconds; the copy is removed afterwards.
fn disk_copy(archive: &Path, dest: &Path, chunk: usize) -> Result<f64> {
    let start = Instant::now();
    let mut input = std::fs::File::open(archive).context(|| "archive".into())?;
    let mut output = std::fs::File::create(dest).context(|| "baseline file".into())?;
    let mut buf = vec![0u8; chunk];
    loop {
        let n = input.read(&mut buf).context(|| "reading".into())?;
        if n == 0 {
            break;
        }
        output.write_all(&buf[..n]).context(|| "writing".into())?;
    }
    output.sync_all().context(|| "fsync".into())?;
    let secs = start.elapsed().as_secs_f64();
    drop(output);
    std::fs::remove_file(dest).context(|| "removing the baseline file".into())?;
    Ok(secs)
}

fn report(args: &LoadImageArgs, target: &Target, size: u64, rounds: &[Round]) {
    let mb = size as f64 / 1e6;
    let peer = match args.against {
        Against::Disk => "disk (write + fsync)",
        Against::Containerd => "ctr images import",
    };
    let load: Vec<f64> = rounds.iter().map(|r| mb / r.load_secs).collect();
    let other: Vec<f64> = rounds.iter().map(|r| mb / r.peer_secs).collect();
    let ratios: Vec<f64> = load.iter().zip(&other).map(|(l, o)| l / o).collect();
    let gib = size as f64 / f64::from(1u32 << 30);
    let cpu: Vec<f64> = rounds.iter().map(|r| r.daemon_cpu / gib).collect();
    let list = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.0}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let median_ratio = median(&ratios);
    print_table(
        &format!(
            "LoadImage of a {} MiB archive ({} daemon) against {peer}, {} rounds",
            args.size_mib,
            target.runtime,
            rounds.len()
        ),
        &[
            row("archive bytes", size),
            row("LoadImage MB/s per round", list(&load)),
            row(&format!("{peer} MB/s per round"), list(&other)),
            row("ratio per round", format_ratios(&ratios)),
            row("median ratio", format!("{median_ratio:.3}")),
            row(
                "daemon CPU s per GiB per round",
                cpu.iter()
                    .map(|c| format!("{c:.2}"))
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
        ],
    );
    println!(
        "RESULT load-image against={:?} runtime={} bytes={size} load_mb_per_s_median={:.0} peer_mb_per_s_median={:.0} ratios={} median_ratio={median_ratio:.3}",
        args.against,
        target.runtime,
        median(&load),
        median(&other),
        format_ratios(&ratios).replace(' ', ","),
    );
}
