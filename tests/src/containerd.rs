//! A containerd process of a test's own (the Debian `containerd` package:
//! `containerd` and `ctr` in `PATH`): root, state and socket in a
//! temporary directory; killed on drop, so also when the test panics.
//! Used by the containerd image store tests and the end-to-end LoadImage
//! tests.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use metropolis_node::images::{ContainerdConfig, ContainerdStore};
use metropolis_transport::runtime::SharedRuntime;

/// Plugins a store test does not need: the CRI plugin, snapshotters that
/// want special filesystems, and `opt` (which writes to `/opt/containerd`).
const DISABLED_PLUGINS: &[&str] = &[
    "io.containerd.grpc.v1.cri",
    "io.containerd.internal.v1.opt",
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.tracing.processor.v1.otlp",
];

/// A containerd of the test's own; killed on drop.
pub struct Containerd {
    child: Child,
    /// Its gRPC socket.
    pub socket: PathBuf,
    dir: tempfile::TempDir,
}

impl Containerd {
    /// Starts a containerd and waits until it answers.
    pub fn start() -> Containerd {
        let dir = tempfile::tempdir().expect("temp dir");
        Containerd::start_in_dir(dir)
            .unwrap_or_else(|e| panic!("{e} (the Debian package `containerd` must be installed)"))
    }

    /// Starts a containerd with its root, state and socket in a new
    /// temporary directory under `parent` (e.g. on the disk a benchmark
    /// measures), and waits until it answers; an error says why it did
    /// not start.
    pub fn start_in(parent: &Path) -> Result<Containerd, String> {
        let dir = tempfile::tempdir_in(parent)
            .map_err(|e| format!("temporary directory under {}: {e}", parent.display()))?;
        Containerd::start_in_dir(dir)
    }

    fn start_in_dir(dir: tempfile::TempDir) -> Result<Containerd, String> {
        let root = dir.path();
        let socket = root.join("containerd.sock");
        let disabled: Vec<String> = DISABLED_PLUGINS.iter().map(|p| format!("{p:?}")).collect();
        let config = format!(
            "version = 2\nroot = {:?}\nstate = {:?}\ndisabled_plugins = [{}]\n\n\
             [grpc]\n  address = {:?}\n\n[ttrpc]\n  address = {:?}\n\n\
             [debug]\n  address = \"\"\n\n[metrics]\n  address = \"\"\n",
            root.join("root"),
            root.join("state"),
            disabled.join(", "),
            socket,
            root.join("containerd.sock.ttrpc"),
        );
        let config_path = root.join("config.toml");
        std::fs::write(&config_path, config)
            .map_err(|e| format!("writing {}: {e}", config_path.display()))?;
        let log_path = root.join("containerd.log");
        let log = File::create(&log_path)
            .and_then(|log| Ok((log.try_clone()?, log)))
            .map_err(|e| format!("creating {}: {e}", log_path.display()))?;
        let child = Command::new("containerd")
            .arg("--config")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log.0)
            .stderr(log.1)
            .spawn()
            .map_err(|e| format!("starting containerd: {e}"))?;
        let mut containerd = Containerd { child, socket, dir };
        containerd.wait_ready()?;
        Ok(containerd)
    }

    /// Waits until `ctr version` reaches the daemon.
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("containerd exited ({status}):\n{}", self.log()));
            }
            let ok = Command::new("ctr")
                .arg("--address")
                .arg(&self.socket)
                .args(["--connect-timeout", "1s", "version"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("containerd not ready:\n{}", self.log()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What it logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    /// A store on this containerd, its state in the temporary directory,
    /// its calls on `runtime`.
    pub fn store(&self, replace_tags: bool, runtime: SharedRuntime) -> ContainerdStore {
        let mut config = ContainerdConfig::new(&self.socket, self.state_dir());
        config.replace_tags = replace_tags;
        ContainerdStore::open(config, runtime).expect("open containerd store")
    }

    /// A state directory for stores on it.
    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("store-state")
    }

    /// `ctr` on this containerd in `k8s.io` with `args`; its stdout.
    pub fn ctr(&self, args: &[&str]) -> String {
        let output = Command::new("ctr")
            .arg("-a")
            .arg(&self.socket)
            .args(["-n", "k8s.io"])
            .args(args)
            .output()
            .expect("run ctr");
        assert!(output.status.success(), "ctr {args:?}: {output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// The digests of the committed blobs (`ctr content ls`), sorted.
    pub fn blobs(&self) -> Vec<String> {
        let mut blobs: Vec<String> = self
            .ctr(&["content", "ls", "-q"])
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect();
        blobs.sort();
        blobs
    }

    /// The writes in progress (`ctr content active`) and the leases
    /// (`ctr leases ls`), one line each: empty when nothing is held.
    pub fn held(&self) -> Vec<String> {
        let active = self.ctr(&["content", "active"]);
        let leases = self.ctr(&["leases", "ls"]);
        active
            .lines()
            .skip(1)
            .chain(leases.lines().skip(1))
            .filter(|l| !l.trim().is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// Runs containerd's garbage collection now (a lease created and
    /// deleted synchronously), so that what nothing holds is gone.
    pub fn collect_garbage(&self) {
        let id = "test-gc";
        self.ctr(&["leases", "create", "--id", id]);
        self.ctr(&["leases", "delete", "--sync", id]);
    }

    /// `ctr images ls` in `k8s.io`: (name, digest) per image.
    pub fn images(&self) -> Vec<(String, String)> {
        let stdout = self.ctr(&["images", "ls"]);
        let mut images: Vec<(String, String)> = stdout
            .lines()
            .skip(1)
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                let name = fields.next()?.to_owned();
                let digest = fields.nth(1)?.to_owned();
                Some((name, digest))
            })
            .collect();
        images.sort();
        images
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
