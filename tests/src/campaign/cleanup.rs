//! What the campaign changed on the machine, so it can be undone however
//! the program ends: normally, on an error, on a panic (a hook), and on
//! SIGINT, SIGTERM or SIGHUP (a task that undoes, then exits 130).
//!
//! Registered here: the processes it started (by process ID; each is sent
//! SIGCONT then SIGKILL), the tmpfs mounts it made, its nftables table and
//! its work directory. Nothing else is touched.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

/// Everything to undo.
#[derive(Default)]
struct Registry {
    pids: Vec<u32>,
    mounts: Vec<PathBuf>,
    table: Option<String>,
    work_dir: Option<PathBuf>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    pids: Vec::new(),
    mounts: Vec::new(),
    table: None,
    work_dir: None,
});

fn with<T>(f: impl FnOnce(&mut Registry) -> T) -> T {
    let mut guard = match REGISTRY.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    };
    f(&mut guard)
}

/// A process this program started.
pub fn add_pid(pid: u32) {
    with(|r| r.pids.push(pid));
}

/// A process that ended (and was reaped): its ID may be reused.
pub fn remove_pid(pid: u32) {
    with(|r| r.pids.retain(|&p| p != pid));
}

/// A tmpfs this program mounted.
pub fn add_mount(path: &Path) {
    with(|r| r.mounts.push(path.to_path_buf()));
}

/// A mount this program removed itself.
pub fn remove_mount(path: &Path) {
    with(|r| r.mounts.retain(|p| p != path));
}

/// The nftables table (`inet NAME`) this program created.
pub fn set_table(name: Option<&str>) {
    with(|r| r.table = name.map(str::to_string));
}

/// The work directory to remove at the end (`None`: keep it).
pub fn set_work_dir(path: Option<&Path>) {
    with(|r| r.work_dir = path.map(Path::to_path_buf));
}

/// Undoes everything still registered; returns one line per thing undone
/// or failed to undo. Safe to call more than once.
pub fn undo_all() -> Vec<String> {
    let registry = with(std::mem::take);
    let mut done = Vec::new();
    for pid in &registry.pids {
        let _ = signal(*pid, "CONT");
        if signal(*pid, "KILL") {
            done.push(format!("killed process {pid}"));
        }
    }
    // Let the kernel release the killed processes' files before unmounting.
    if !registry.pids.is_empty() && !registry.mounts.is_empty() {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    for mount in &registry.mounts {
        done.push(match quiet("umount", &[&mount.display().to_string()]) {
            Ok(()) => format!("unmounted {}", mount.display()),
            Err(e) => match quiet("umount", &["-l", &mount.display().to_string()]) {
                Ok(()) => format!("unmounted {} (lazily)", mount.display()),
                Err(_) => format!("could not unmount {}: {e}", mount.display()),
            },
        });
    }
    if let Some(table) = &registry.table {
        done.push(match quiet("nft", &["delete", "table", "inet", table]) {
            Ok(()) => format!("deleted nftables table inet {table}"),
            Err(e) => format!("could not delete nftables table inet {table}: {e}"),
        });
    }
    if let Some(dir) = &registry.work_dir {
        done.push(match std::fs::remove_dir_all(dir) {
            Ok(()) => format!("removed {}", dir.display()),
            Err(e) => format!("could not remove {}: {e}", dir.display()),
        });
    }
    done
}

/// Sends `SIG<name>` to `pid`; whether it was delivered.
pub fn signal(pid: u32, name: &str) -> bool {
    Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The running program's name, for its messages.
fn program() -> String {
    std::env::args_os()
        .next()
        .map(std::path::PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "metropolis-tests".into())
}

/// Runs `program args`, its standard error as the error.
pub fn quiet(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        Err(format!(
            "`{program} {}` failed: {}",
            args.join(" "),
            err.trim()
        ))
    }
}

/// Undoes everything on a panic, before the usual panic message.
pub fn install_panic_hook() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        for line in undo_all() {
            eprintln!("{}: cleanup: {line}", program());
        }
        previous(info);
    }));
}

/// On SIGINT, SIGTERM or SIGHUP: undo everything, say what was undone,
/// exit 130. Spawned on the campaign's runtime.
pub async fn on_signals() {
    use tokio::signal::unix::{SignalKind, signal as listen};
    let mut streams = Vec::new();
    for kind in [
        SignalKind::interrupt(),
        SignalKind::terminate(),
        SignalKind::hangup(),
    ] {
        match listen(kind) {
            Ok(s) => streams.push(s),
            Err(e) => eprintln!("{}: cannot listen for a signal: {e}", program()),
        }
    }
    if streams.is_empty() {
        return std::future::pending().await;
    }
    futures::future::select_all(streams.iter_mut().map(|s| Box::pin(s.recv()))).await;
    eprintln!("{}: interrupted; removing what this run set up", program());
    for line in undo_all() {
        eprintln!("{}: cleanup: {line}", program());
    }
    std::process::exit(130);
}
