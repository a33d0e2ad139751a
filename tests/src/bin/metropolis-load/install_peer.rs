//! What `install` measures the installer against: the pipeline an
//! operator would run instead of it, `curl` of the same blob from the
//! same registry into `dd oflag=direct conv=fsync` onto the same target
//! (through `zstd -d` for a zstd payload; nothing verified), and the same
//! `dd` fed from a local file (the device's limit), plus `dd` reading the
//! target back.
//!
//! Every stage is its own process, connected by pipes as a shell would
//! connect them; a stage that fails (curl on an HTTP error or a short
//! transfer, zstd on a bad frame, dd on a write error) fails the run.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::util::{Context, Result};

/// dd's default block size on every side: what an operator would pass
/// for a large sequential write (`bs=4M`); dd always gets
/// `iflag=fullblock` so that a pipe's short reads still make whole direct
/// writes.
pub const DD_BS: &str = "4M";

/// Checks a `--dd-bs` value: a positive count of bytes, optionally with
/// dd's suffix K, M or G.
pub fn parse_bs(value: &str) -> std::result::Result<String, String> {
    let digits = value.trim_end_matches(['K', 'M', 'G']);
    let ok = value.len() - digits.len() <= 1
        && !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && digits.bytes().any(|b| b != b'0');
    if ok {
        Ok(value.to_string())
    } else {
        Err("expected a block size such as 4M, 1M or 65536 (digits, then K, M or G)".into())
    }
}

/// `dd of=TARGET bs=BS iflag=fullblock oflag=direct conv=fsync,notrunc`,
/// reading its standard input.
fn dd_onto(target: &Path, bs: &str) -> Command {
    let mut dd = Command::new("dd");
    dd.arg(format!("of={}", target.display())).args([
        format!("bs={bs}").as_str(),
        "iflag=fullblock",
        "oflag=direct",
        "conv=fsync,notrunc",
        "status=none",
    ]);
    dd
}

/// `zstd -d` from standard input to standard output.
fn zstd_d() -> Command {
    let mut zstd = Command::new("zstd");
    zstd.args(["-q", "-d", "-c"]);
    zstd
}

/// The peer's pipeline as a shell line, for the output.
pub fn peer_line(url: &str, target: &Path, bs: &str, compressed: bool) -> String {
    format!(
        "curl -sS --fail {url} |{} dd of={} bs={bs} iflag=fullblock oflag=direct \
         conv=fsync,notrunc",
        if compressed { " zstd -d |" } else { "" },
        target.display()
    )
}

/// The peer: `curl` of `url` (the layer's blob) into `dd` onto `target`,
/// through `zstd -d` when `compressed`, dd writing blocks of `bs`; its
/// duration.
pub async fn peer_write(url: &str, target: &Path, bs: &str, compressed: bool) -> Result<Duration> {
    let mut curl = Command::new("curl");
    curl.args(["-sS", "--fail", "-o", "-", url]);
    let mut stages = vec![("curl", curl)];
    if compressed {
        stages.push(("zstd -d", zstd_d()));
    }
    stages.push(("dd", dd_onto(target, bs)));
    pipeline(stages).await
}

/// `dd` of the local file `source` onto `target` with the peer's flags
/// (after `zstd -d` of it when `compressed`); its duration.
pub async fn dd_write(
    source: &Path,
    target: &Path,
    bs: &str,
    compressed: bool,
) -> Result<Duration> {
    if compressed {
        let file = std::fs::File::open(source)
            .context(|| format!("opening the zstd frame {}", source.display()))?;
        let mut zstd = zstd_d();
        zstd.stdin(file);
        return pipeline(vec![("zstd -d", zstd), ("dd", dd_onto(target, bs))]).await;
    }
    let mut dd = dd_onto(target, bs);
    dd.arg(format!("if={}", source.display()));
    pipeline(vec![("dd", dd)]).await
}

/// `dd` reading the first `mib` MiB of `target` back, direct; its
/// duration.
pub async fn dd_read(target: &Path, mib: u64) -> Result<Duration> {
    let mut dd = Command::new("dd");
    dd.arg(format!("if={}", target.display()))
        .args(["of=/dev/null", "bs=1M", "iflag=direct", "status=none"])
        .arg(format!("count={mib}"));
    pipeline(vec![("dd", dd)]).await
}

/// Runs `stages` (name, command), each one's standard output piped into
/// the next one's standard input; the time until all have exited.
async fn pipeline(stages: Vec<(&'static str, Command)>) -> Result<Duration> {
    let started = Instant::now();
    tokio::task::spawn_blocking(move || run_pipeline(stages))
        .await
        .map_err(|e| format!("the pipeline thread failed: {e}"))??;
    Ok(started.elapsed())
}

fn run_pipeline(stages: Vec<(&'static str, Command)>) -> Result<()> {
    let last = stages.len().saturating_sub(1);
    let mut children: Vec<(&'static str, Child)> = Vec::new();
    let mut input: Option<Stdio> = None;
    for (i, (name, mut command)) in stages.into_iter().enumerate() {
        if let Some(stdin) = input.take() {
            command.stdin(stdin);
        }
        if i < last {
            command.stdout(Stdio::piped());
        }
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                for (_, mut started) in children {
                    let _ = started.kill();
                    let _ = started.wait();
                }
                return Err(format!("cannot start {name} (is it installed?): {e}").into());
            }
        };
        input = child.stdout.take().map(Stdio::from);
        children.push((name, child));
    }
    drop(input);
    let mut failed = None;
    for (name, mut child) in children {
        let status = child.wait().context(|| format!("waiting for {name}"))?;
        if !status.success() && failed.is_none() {
            failed = Some(format!("{name} failed ({status}); its message is above"));
        }
    }
    match failed {
        Some(why) => Err(why.into()),
        None => Ok(()),
    }
}

/// Whether the first `len` bytes of `target` are those of the file
/// `image`: checks that a pipeline wrote the image, not something else.
pub fn same_bytes(target: &Path, image: &Path, len: u64) -> Result<()> {
    let open = |p: &Path| std::fs::File::open(p).context(|| format!("opening {}", p.display()));
    let (mut a, mut b) = (open(target)?.take(len), open(image)?);
    let (mut x, mut y) = (vec![0u8; 4 << 20], vec![0u8; 4 << 20]);
    let mut offset = 0u64;
    loop {
        let n = read_full(&mut a, &mut x).context(|| format!("reading {}", target.display()))?;
        let m =
            read_full(&mut b, &mut y[..n]).context(|| format!("reading {}", image.display()))?;
        if n != m || x[..n] != y[..n] {
            return Err(format!(
                "{} differs from the image near byte {offset}: the peer did not write it",
                target.display()
            )
            .into());
        }
        if n == 0 {
            break;
        }
        offset += n as u64;
    }
    if offset != len {
        return Err(format!(
            "{} holds {offset} bytes, less than the image's {len}",
            target.display()
        )
        .into());
    }
    Ok(())
}

/// Reads until `buf` is full or the end; the count read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A file of `len` deterministic bytes in `dir`.
    fn image_in(dir: &Path, len: usize) -> std::path::PathBuf {
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
        let path = dir.join("image.raw");
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[tokio::test]
    async fn the_peer_writes_the_fetched_bytes_raw_and_through_zstd() {
        let dir = tempfile::tempdir().unwrap();
        let len = (9 << 20) + 123;
        let image = image_in(dir.path(), len);
        let target = dir.path().join("target.img");
        let url = format!("file://{}", image.display());
        peer_write(&url, &target, "1M", false).await.unwrap();
        same_bytes(&target, &image, len as u64).unwrap();

        let zst = dir.path().join("image.raw.zst");
        let status = Command::new("zstd")
            .args(["-q", "-f"])
            .arg(&image)
            .arg("-o")
            .arg(&zst)
            .status()
            .unwrap();
        assert!(status.success());
        std::fs::remove_file(&target).unwrap();
        let url = format!("file://{}", zst.display());
        peer_write(&url, &target, DD_BS, true).await.unwrap();
        same_bytes(&target, &image, len as u64).unwrap();
        std::fs::remove_file(&target).unwrap();
        dd_write(&zst, &target, "64K", true).await.unwrap();
        same_bytes(&target, &image, len as u64).unwrap();
    }

    #[tokio::test]
    async fn a_failed_fetch_fails_the_peer() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target.img");
        let missing = format!("file://{}", dir.path().join("missing").display());
        let err = peer_write(&missing, &target, DD_BS, false)
            .await
            .unwrap_err();
        assert!(err.to_string().starts_with("curl failed"), "{err}");
        let err = peer_write(&missing, &target, DD_BS, true)
            .await
            .unwrap_err();
        assert!(err.to_string().starts_with("curl failed"), "{err}");
    }

    #[test]
    fn block_sizes_are_what_dd_takes() {
        for good in ["4M", "1M", "65536", "512K", "1G"] {
            assert_eq!(parse_bs(good).as_deref(), Ok(good));
        }
        for bad in ["", "0", "0M", "M", "4MM", "4m", "-4M", "4M x", "1e6"] {
            assert!(parse_bs(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_target_with_other_bytes_or_fewer_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        let image = image_in(dir.path(), 5 << 20);
        let mut bytes = std::fs::read(&image).unwrap();
        bytes[(4 << 20) + 1] ^= 1;
        let target = dir.path().join("target.img");
        std::fs::write(&target, &bytes).unwrap();
        let err = same_bytes(&target, &image, 5 << 20).unwrap_err();
        assert!(
            err.to_string()
                .contains("differs from the image near byte 4194304"),
            "{err}"
        );
        std::fs::write(&target, &bytes[..4 << 20]).unwrap();
        let err = same_bytes(&target, &image, 5 << 20).unwrap_err();
        assert!(err.to_string().contains("less than the image's"), "{err}");
    }
}
