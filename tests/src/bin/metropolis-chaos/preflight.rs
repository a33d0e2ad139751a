//! What the campaign needs, checked before it changes anything: root,
//! the tools it runs, the daemon, and every address and port it will
//! listen on free. Every missing piece is named at once, with what to do.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::Cli;
use crate::cluster::{self, N, PORTS, Programs};
use crate::faults::clock;

/// What the campaign runs with, once checked.
pub struct Ready {
    /// The programs.
    pub programs: Programs,
    /// This process's group ID (its clients' connections are told apart
    /// by it).
    pub own_gid: u32,
}

/// A field of `/proc/self/status` (`Uid:`, `Gid:`): its effective value.
fn proc_id(field: &str) -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Whether `program --version` (or `args`) runs.
fn runs(program: &Path, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The daemon: `explicit`, else `metropolisd-under-test` next to this
/// program.
fn daemon(explicit: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = explicit {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err(format!("--daemon-bin {}: no such file", p.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("locating this program: {e}"))?;
    let bin = exe
        .parent()
        .map(|d| d.join("metropolisd-under-test"))
        .unwrap_or_default();
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!(
            "the daemon {} is missing: build it with \
             `cargo build -p metropolis-tests --features system --bins`, or pass --daemon-bin",
            bin.display()
        ))
    }
}

/// Checks everything; the list of what is missing if anything is.
pub fn check(cli: &Cli) -> Result<Ready, String> {
    let mut missing = Vec::new();
    if cli.schedules == 0 || cli.seconds < 5 || cli.nodes == 0 || cli.lease_ttl == 0 {
        missing.push(
            "--schedules, --nodes and --lease-ttl must be at least 1, --seconds at least 5"
                .to_string(),
        );
    }
    if proc_id("Uid:") != Some(0) {
        missing.push(
            "root: the campaign adds nftables rules, mounts tmpfs and starts processes \
             under their own group IDs (run it with sudo)"
                .into(),
        );
    }
    if !runs(Path::new("nft"), &["--version"]) {
        missing.push("nft: install nftables (apt-get install nftables)".into());
    }
    if !runs(&cli.etcd_bin, &["--version"]) {
        missing.push(format!(
            "etcd ({}): install etcd-server (apt-get install etcd-server) or pass --etcd-bin",
            cli.etcd_bin.display()
        ));
    }
    let faketime = clock::find_library();
    if faketime.is_none() {
        missing.push("libfaketime: install faketime (apt-get install faketime)".into());
    }
    for tool in ["mount", "umount", "mountpoint", "kill"] {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
            .unwrap_or(false);
        if !found {
            missing.push(format!("{tool}: not on the PATH (util-linux, procps)"));
        }
    }
    let daemon = match daemon(cli.daemon_bin.as_deref()) {
        Ok(d) => Some(d),
        Err(e) => {
            missing.push(e);
            None
        }
    };
    for i in 0..N {
        for (ip, ports) in [
            (cluster::etcd_ip(i), &PORTS[..2]),
            (cluster::curator_ip(i), &PORTS[2..]),
        ] {
            for port in ports {
                let addr = format!("{ip}:{port}");
                if let Err(e) = TcpListener::bind(&addr) {
                    missing.push(format!(
                        "{addr} is not free ({e}): stop what listens there (`ss -ltnp | grep {ip}`)"
                    ));
                }
            }
        }
    }
    let own_gid = proc_id("Gid:").unwrap_or(0);
    match (missing.is_empty(), daemon, faketime) {
        (true, Some(daemon), Some(faketime)) => Ok(Ready {
            programs: Programs {
                daemon,
                daemon_env: cli
                    .canary
                    .iter()
                    .map(|c| ("METROPOLIS_CANARY".to_string(), c.clone()))
                    .collect(),
                etcd: cli.etcd_bin.clone(),
                faketime,
                ttl: Duration::from_secs(cli.lease_ttl),
            },
            own_gid,
        }),
        _ => Err(format!(
            "cannot set up; nothing was changed on this machine. Missing:\n  - {}",
            missing.join("\n  - ")
        )),
    }
}
