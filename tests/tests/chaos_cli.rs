//! `metropolis-chaos` on bad input and when interrupted: a campaign that
//! cannot set up names what is missing and changes nothing; one
//! interrupted with SIGINT removes its nftables table, its tmpfs mounts,
//! its processes and its work directory. Needs root, etcd (etcd-server),
//! nft (nftables) and libfaketime (faketime), as the campaign does
//! (docs/chaos.md).

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The campaign uses fixed addresses: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn chaos() -> Command {
    Command::new(env!("CARGO_BIN_EXE_metropolis-chaos"))
}

fn table_exists() -> bool {
    Command::new("nft")
        .args(["list", "table", "inet", "metropolis_chaos"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

fn chaos_mounts() -> Vec<String> {
    std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("metropolis-chaos "))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_missing_tool_is_named_and_nothing_is_changed() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let work = tempfile::tempdir().unwrap();
    let out = chaos()
        .args(["--etcd-bin", "/nonexistent/etcd", "--work-dir"])
        .arg(work.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("/nonexistent/etcd"), "{err}");
    assert!(err.contains("etcd-server"), "{err}");
    assert!(err.contains("nothing was changed"), "{err}");
    assert!(!table_exists());
    assert!(chaos_mounts().is_empty());
    assert_eq!(std::fs::read_dir(work.path()).unwrap().count(), 0);
}

#[test]
fn a_missing_daemon_is_named() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let out = chaos()
        .args(["--daemon-bin", "/nonexistent/metropolisd"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--daemon-bin /nonexistent/metropolisd"),
        "{err}"
    );
}

#[test]
fn an_interrupted_campaign_removes_what_it_set_up() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let work = tempfile::tempdir().unwrap();
    let mut child = chaos()
        .args(["--seed", "7", "--seconds", "60", "--work-dir"])
        .arg(work.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the first fault: every process is up by then.
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen = Vec::new();
    for line in stdout.lines() {
        let line = line.unwrap();
        seen.push(line.clone());
        if line.trim_start().starts_with(|c: char| c.is_ascii_digit()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no fault began:\n{}",
            seen.join("\n")
        );
    }
    assert!(table_exists(), "the campaign's table while it runs");
    assert!(!chaos_mounts().is_empty(), "its tmpfs mounts while it runs");
    let pids = children_of(child.id());
    // Its etcd members and curators, less one the first fault may have killed.
    assert!(pids.len() >= 5, "its etcd members and curators: {pids:?}");
    let ok = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(
        err.contains("deleted nftables table inet metropolis_chaos"),
        "{err}"
    );
    assert!(!table_exists());
    assert!(chaos_mounts().is_empty(), "{:?}", chaos_mounts());
    for pid in pids {
        assert!(!alive(pid), "process {pid} survived the interruption");
    }
    assert_eq!(
        std::fs::read_dir(work.path()).unwrap().count(),
        0,
        "the work directory is removed"
    );
}

/// The processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(Path::new("/proc").join(child.to_string()).join("stat"))
            .unwrap_or_default();
        // pid (comm) state ppid ...
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(child);
        }
    }
    out
}

/// Whether `pid` is a live process (not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|state| state != "Z")
        })
        .unwrap_or(false)
}
