//! `load-image --against containerd`: one containerd of the run's own
//! (root, state and socket under the work directory), one daemon importing
//! into it (`--containerd-socket`), and `ctr images import` of the same
//! tarball into it, in alternating rounds. After each import every image
//! is removed with `ctr images rm --sync` (containerd's garbage collection
//! then deletes their content before it returns), so no import finds a
//! blob already there.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use metropolis_tests::containerd::Containerd;

use super::{Imports, LoadImageArgs, Round, mbps};
use crate::daemon::Target;
use crate::util::{Context, Result};

/// The namespace both sides import into (the daemon's default).
const NAMESPACE: &str = "k8s.io";

/// `ctr images import` flags: what the daemon's containerd store does too
/// (every platform's blobs, layers not unpacked).
const IMPORT_FLAGS: [&str; 2] = ["--all-platforms", "--no-unpack"];

/// Rounds of LoadImage through the containerd store against `ctr images
/// import`, both into one containerd.
pub async fn against_ctr(
    args: &LoadImageArgs,
    target: &Target,
    work: &Path,
    archive: &Path,
    size: u64,
) -> Result<Vec<Round>> {
    let containerd = Containerd::start_in(work).map_err(|e| format!("containerd: {e}"))?;
    let socket = containerd.socket.display().to_string();
    let mut daemon = Imports::start(
        target,
        &work.join("data"),
        &["--containerd-socket".to_owned(), socket.clone()],
    )
    .await?;
    let mut rounds = Vec::with_capacity(args.rounds);
    for i in 0..args.rounds {
        let (load_secs, daemon_cpu) = daemon.load(archive, args.chunk_size).await?;
        clear(&socket)?;
        let start = Instant::now();
        ctr(
            &socket,
            &[
                &["images", "import"][..],
                &IMPORT_FLAGS,
                &[archive_arg(archive)?],
            ]
            .concat(),
        )?;
        let peer_secs = start.elapsed().as_secs_f64();
        clear(&socket)?;
        println!(
            "round {}: LoadImage {:.0} MB/s, ctr images import {:.0} MB/s",
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
    daemon.process.stop();
    Ok(rounds)
}

fn archive_arg(archive: &Path) -> Result<&str> {
    archive
        .to_str()
        .ok_or_else(|| format!("{}: not UTF-8", archive.display()).into())
}

/// Runs `ctr -a socket -n k8s.io args...`; its stdout, or an error with
/// its stderr.
fn ctr(socket: &str, args: &[&str]) -> Result<String> {
    let output = Command::new("ctr")
        .args(["-a", socket, "-n", NAMESPACE])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context(|| "running ctr".into())?;
    if !output.status.success() {
        return Err(format!(
            "ctr {}: {}: {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Removes every image of the namespace and checks that their content is
/// gone.
fn clear(socket: &str) -> Result<()> {
    let listed = ctr(socket, &["images", "ls", "-q"])?;
    let names: Vec<&str> = listed
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    if names.is_empty() {
        return Err("no image after an import".into());
    }
    ctr(socket, &[&["images", "rm", "--sync"][..], &names].concat())?;
    let content = ctr(socket, &["content", "ls", "-q"])?;
    if content.lines().any(|l| !l.trim().is_empty()) {
        return Err(format!("content left after removing the images:\n{content}").into());
    }
    Ok(())
}
