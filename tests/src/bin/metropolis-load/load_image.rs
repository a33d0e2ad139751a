//! `load-image`: LoadImage of a large Docker archive (default 1 GiB) over
//! loopback into a real daemon's default image store, against writing the
//! same bytes to a file on the same disk in the same run (both fsynced).
//! Prints MB/s of both and their ratio.

use std::io::{Read, Write};
use std::path::Path;
use std::time::Instant;

use futures::SinkExt;
use metropolis_proto::prelude::debug::{self, node_debug_service_client::NodeDebugServiceClient};
use metropolis_transport::grpc::Channel;
use serde_json::json;
use sha2::Digest as _;

use super::daemon::{DaemonProcess, Target, free_addr};
use super::util::{Context, Result, print_table, row};

/// Arguments of `load-image`.
#[derive(clap::Args, Debug, Clone)]
pub struct LoadImageArgs {
    /// Size of the image's layer, in MiB.
    #[arg(long, default_value_t = 1024)]
    pub size_mib: u64,
    /// Bytes per streamed message (metroctl's default).
    #[arg(long, default_value_t = 1024 * 1024)]
    pub chunk_size: usize,
}

/// Deterministic incompressible bytes (xorshift64*).
fn fill(buf: &mut [u8], state: &mut u64) {
    for chunk in buf.chunks_mut(8) {
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        let v = state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
}

/// Writes a `docker save` style archive with one layer holding a file of
/// `size` bytes to `path`; returns the archive's size.
fn write_archive(dir: &Path, path: &Path, size: u64) -> Result<u64> {
    // The layer tar first (its sha256 is the config's diff_id).
    let layer_path = dir.join("layer.tar");
    {
        let file = std::fs::File::create(&layer_path).context(|| "layer.tar".into())?;
        let mut layer = tar::Builder::new(std::io::BufWriter::new(file));
        let mut header = tar::Header::new_gnu();
        header.set_size(size);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        struct Gen {
            left: u64,
            state: u64,
        }
        impl Read for Gen {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let n = buf
                    .len()
                    .min(usize::try_from(self.left).unwrap_or(usize::MAX));
                fill(&mut buf[..n], &mut self.state);
                self.left -= n as u64;
                Ok(n)
            }
        }
        let data = Gen {
            left: size,
            state: 0x9e37_79b9_7f4a_7c15,
        };
        layer
            .append_data(&mut header, "payload.bin", data)
            .context(|| "writing layer.tar".into())?;
        layer
            .into_inner()
            .and_then(|w| w.into_inner().map_err(|e| e.into_error()))
            .context(|| "finishing layer.tar".into())?;
    }
    let mut hasher = sha2::Sha256::new();
    let mut file = std::fs::File::open(&layer_path).context(|| "layer.tar".into())?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).context(|| "reading layer.tar".into())?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let diff_id: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff_id}")]},
    }))
    .context(|| "config".into())?;
    let config_name = format!(
        "{}.json",
        sha2::Sha256::digest(&config)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    let manifest = serde_json::to_vec(&json!([{
        "Config": config_name,
        "RepoTags": ["bench/load-image:latest"],
        "Layers": ["layer/layer.tar"],
    }]))
    .context(|| "manifest".into())?;
    let out = std::fs::File::create(path).context(|| format!("{}", path.display()))?;
    let mut archive = tar::Builder::new(std::io::BufWriter::new(out));
    let mut add = |name: &str, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        archive.append_data(&mut h, name, data)
    };
    add(&config_name, &config).context(|| "archive".into())?;
    add("manifest.json", &manifest).context(|| "archive".into())?;
    archive
        .append_path_with_name(&layer_path, "layer/layer.tar")
        .context(|| "archive".into())?;
    archive
        .into_inner()
        .and_then(|w| w.into_inner().map_err(|e| e.into_error()))
        .context(|| "finishing the archive".into())?;
    std::fs::remove_file(&layer_path).context(|| "removing layer.tar".into())?;
    Ok(std::fs::metadata(path)
        .context(|| "archive size".into())?
        .len())
}

/// Copies `archive` to `dest` in `chunk`-byte writes and fsyncs: the disk
/// baseline. Returns seconds.
fn disk_baseline(archive: &Path, dest: &Path, chunk: usize) -> Result<f64> {
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

/// Runs the scenario.
pub async fn run(args: LoadImageArgs, target: &Target, work: &Path) -> Result<()> {
    let archive = work.join("image.tar");
    println!("writing a {} MiB test archive ...", args.size_mib);
    let size = write_archive(work, &archive, args.size_mib * 1024 * 1024)?;
    // Drop the archive from the page cache's dirty state before timing.
    std::fs::File::open(&archive)
        .and_then(|f| f.sync_all())
        .context(|| "fsync archive".into())?;

    let baseline = disk_baseline(&archive, &work.join("baseline.bin"), args.chunk_size)?;

    let debug_addr = free_addr()?;
    let mut daemon = DaemonProcess::start_with(
        &target.bin,
        &work.join("data"),
        target.runtime,
        "warn",
        &[
            &["--debug-listen".to_string(), debug_addr.clone()][..],
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
    let mut client = NodeDebugServiceClient::with_origin(channel, Channel::origin());
    let (mut tx, rx) = futures::channel::mpsc::channel::<debug::ImagePart>(4);
    let path = archive.clone();
    let chunk = args.chunk_size;
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
    client.load_image(rx).await.context(|| "LoadImage".into())?;
    let secs = start.elapsed().as_secs_f64();
    reader.await.context(|| "reader task".into())??;
    daemon.check_alive()?;
    daemon.stop();

    let mb = size as f64 / 1e6;
    let (disk_mbps, load_mbps) = (mb / baseline, mb / secs);
    let ratio = load_mbps / disk_mbps;
    print_table(
        &format!(
            "LoadImage of a {} MiB archive ({} daemon)",
            args.size_mib, target.runtime
        ),
        &[
            row("archive bytes", size),
            row(
                "disk baseline (write + fsync)",
                format!("{disk_mbps:.0} MB/s"),
            ),
            row("LoadImage over loopback", format!("{load_mbps:.0} MB/s")),
            row("ratio", format!("{ratio:.2}")),
        ],
    );
    println!(
        "RESULT load-image runtime={} bytes={size} disk_mb_per_s={disk_mbps:.0} load_mb_per_s={load_mbps:.0} ratio={ratio:.3}",
        target.runtime
    );
    Ok(())
}
