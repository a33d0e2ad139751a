//! Clients of other gRPC stacks for the interoperability suite
//! (`tests/tests/interop.rs`): Python `grpcio` and Node `@grpc/grpc-js`,
//! from `tests/interop/`, run as processes against a real daemon.
//!
//! A client reads a JSON configuration (endpoints, files, the scenarios to
//! run), runs each scenario with its stack's default settings and prints
//! one JSON line per scenario: `{"scenario", "endpoint", "ok", "skipped",
//! "detail"}`, after a first line `{"stack": "<name> <version>"}`.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The longest a client process may run before it is killed.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(90);
/// How much of a client's standard error a failure quotes (its tail).
const STDERR_TAIL: usize = 1500;

/// A gRPC stack this project did not write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stack {
    /// Python `grpcio` (gRPC C-core with BoringSSL).
    Python,
    /// Node `@grpc/grpc-js` (Node's OpenSSL).
    Node,
}

/// Which listener of the daemon a scenario talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listener {
    /// The local UNIX socket (callers are this node).
    Unix,
    /// The curator's TLS port (`--listen`).
    CuratorTls,
    /// The AgentCallback TLS port (`--agent-listen`).
    AgentTls,
    /// The debug service, plain HTTP/2 (`--debug-listen`).
    Debug,
}

/// Every scenario each client runs, with the listener it talks to. The
/// names are the clients' method names and the test cases' names.
pub const SCENARIOS: &[(&str, Listener)] = &[
    ("unix_watch_and_status", Listener::Unix),
    ("owner_watch_over_tls", Listener::CuratorTls),
    ("agent_registered_heartbeat", Listener::AgentTls),
    ("agent_unregistered_key", Listener::AgentTls),
    ("agent_bad_machine_id", Listener::AgentTls),
    ("debug_kubeconfig", Listener::Debug),
    ("debug_logs", Listener::Debug),
    ("debug_load_image", Listener::Debug),
    ("debug_trace", Listener::Debug),
    ("health_unix", Listener::Unix),
    ("health_curator_tls", Listener::CuratorTls),
    ("health_agent_tls", Listener::AgentTls),
    ("health_debug", Listener::Debug),
    ("reflection_v1_debug", Listener::Debug),
    ("reflection_v1alpha_debug", Listener::Debug),
    ("reflection_v1_curator_tls", Listener::CuratorTls),
    ("reflection_v1alpha_curator_tls", Listener::CuratorTls),
];

/// The repository's root (the parent of this package).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".."))
}

/// The directory of the clients, `tests/interop/`.
pub fn clients_dir() -> PathBuf {
    repo_root().join("tests").join("interop")
}

impl Stack {
    /// Both stacks.
    pub const ALL: [Stack; 2] = [Stack::Python, Stack::Node];

    /// Its name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Stack::Python => "Python grpcio",
            Stack::Node => "Node @grpc/grpc-js",
        }
    }

    /// The command that installs its packages, run from the repository root.
    pub fn install_command(self) -> &'static str {
        match self {
            Stack::Python => "python3 -m pip install -r tests/interop/requirements.txt",
            Stack::Node => "(cd tests/interop && npm ci)",
        }
    }

    /// The interpreter and the client script.
    fn command(self) -> Command {
        match self {
            Stack::Python => {
                let mut c = Command::new("python3");
                c.arg(clients_dir().join("python_client.py"));
                c
            }
            Stack::Node => {
                let mut c = Command::new("node");
                c.arg(clients_dir().join("node_client.js"));
                c
            }
        }
    }

    /// Checks the interpreter and the stack's packages are installed; the
    /// error says what is missing and the install command.
    pub fn prerequisites(self) -> Result<(), String> {
        let mut check = match self {
            Stack::Python => {
                let mut c = Command::new("python3");
                c.arg("-c").arg(
                    "import grpc, grpc_tools.protoc, grpc_health.v1.health_pb2_grpc, \
                     grpc_reflection.v1alpha.reflection_pb2, cryptography.x509",
                );
                c
            }
            Stack::Node => {
                let mut c = Command::new("node");
                c.arg("-e").arg(
                    "for (const m of ['@grpc/grpc-js', '@grpc/proto-loader', \
                     '@grpc/reflection/package.json', 'grpc-health-check', \
                     'protobufjs/ext/descriptor']) require(m)",
                );
                c
            }
        };
        let out = check
            .current_dir(clients_dir())
            .stdin(Stdio::null())
            .output();
        let why = match out {
            Ok(out) if out.status.success() => return Ok(()),
            Ok(out) => {
                // The line that names what is missing (Python's last,
                // Node's first), else the tail.
                let stderr = String::from_utf8_lossy(&out.stderr);
                stderr
                    .lines()
                    .find(|l| l.contains("Error"))
                    .map(|l| tail(l, 600))
                    .unwrap_or_else(|| tail(&stderr, 600))
            }
            Err(e) => format!("cannot run it: {e}"),
        };
        Err(format!(
            "{} is not installed: {why}\ninstall it with: {}",
            self.name(),
            self.install_command()
        ))
    }
}

/// What a client reported for one scenario.
#[derive(Clone, Debug)]
pub struct Report {
    /// The endpoint it talked to, as the configuration described it.
    pub endpoint: String,
    /// Whether the scenario passed (or was skipped).
    pub ok: bool,
    /// Skipped: this machine cannot run it (the detail says why).
    pub skipped: bool,
    /// What happened: a success note, or the gRPC status or exception.
    pub detail: String,
}

/// One run of a client process.
#[derive(Clone, Debug)]
pub struct ClientRun {
    /// The stack and version the client named, e.g. `grpcio 1.85.1`.
    pub stack: String,
    /// The reports by scenario name.
    pub reports: HashMap<String, Report>,
    /// The tail of its standard error.
    pub stderr: String,
    /// What it wrote to standard error during each scenario (the tail of
    /// the section after its `== scenario NAME` line), by scenario name.
    pub stderr_of: HashMap<String, String>,
    /// How it ended (`exit status: 0`, killed after the timeout, ...).
    pub ended: String,
}

/// The last `max` bytes of `s` (at a character boundary).
fn tail(s: &str, max: usize) -> String {
    let s = s.trim_end();
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s[start..].to_string()
}

/// Runs `stack`'s client on the configuration file `config`, killing it
/// after [`CLIENT_TIMEOUT`].
pub fn run_client(stack: Stack, config: &Path) -> ClientRun {
    let spawned = stack
        .command()
        .arg(config)
        .current_dir(clients_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            return ClientRun {
                stack: stack.name().into(),
                reports: HashMap::new(),
                stderr: String::new(),
                stderr_of: HashMap::new(),
                ended: format!("could not start: {e}"),
            };
        }
    };
    // Read both pipes on threads, so that a chatty client cannot block.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut buf);
            }
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    let ended = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status.to_string(),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                break format!("killed after {} s", CLIENT_TIMEOUT.as_secs());
            }
            Err(e) => break format!("cannot wait for it: {e}"),
        }
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    parse(stack, &stdout, &stderr, ended)
}

/// Splits standard error into the sections the client starts with
/// `== scenario NAME` lines.
fn sections(stderr: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut current: Option<(&str, String)> = None;
    for line in stderr.lines() {
        if let Some(name) = line.strip_prefix("== scenario ") {
            if let Some((name, text)) = current.take() {
                out.insert(name.to_string(), tail(&text, STDERR_TAIL));
            }
            current = Some((name.trim(), String::new()));
        } else if let Some((_, text)) = current.as_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    if let Some((name, text)) = current {
        out.insert(name.to_string(), tail(&text, STDERR_TAIL));
    }
    out
}

/// Parses a client's output; stdout lines that are not reports are kept
/// with its standard error.
fn parse(stack: Stack, stdout: &str, full_stderr: &str, ended: String) -> ClientRun {
    let mut stderr = tail(full_stderr, STDERR_TAIL);
    let mut run = ClientRun {
        stack: stack.name().into(),
        reports: HashMap::new(),
        stderr: String::new(),
        stderr_of: sections(full_stderr),
        ended,
    };
    for line in stdout.lines() {
        let value: serde_json::Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(_) => {
                stderr.push_str(&format!("\n[stdout] {}", tail(line, 300)));
                continue;
            }
        };
        let text = |key: &str| value[key].as_str().unwrap_or_default().to_string();
        if let Some(name) = value["stack"].as_str() {
            run.stack = name.to_string();
            continue;
        }
        run.reports.insert(
            text("scenario"),
            Report {
                endpoint: text("endpoint"),
                ok: value["ok"].as_bool() == Some(true),
                skipped: value["skipped"].as_bool() == Some(true),
                detail: text("detail"),
            },
        );
    }
    run.stderr = stderr;
    run
}

/// Whether the kernel's tracefs is mounted at `root` and its marker file
/// writable (the Trace scenario needs both).
pub fn tracefs_writable(root: &Path) -> bool {
    let mounted = std::fs::read_to_string("/proc/mounts").is_ok_and(|mounts| {
        mounts.lines().any(|l| {
            let mut fields = l.split_whitespace();
            let mount_point = fields.nth(1);
            mount_point.is_some_and(|m| Path::new(m) == root) && fields.next() == Some("tracefs")
        })
    });
    mounted
        && std::fs::OpenOptions::new()
            .write(true)
            .open(root.join("trace_marker"))
            .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_parse_and_stray_lines_go_to_stderr() {
        let out = "{\"stack\": \"grpcio 1.0\"}\n\
                   {\"scenario\": \"a\", \"endpoint\": \"unix:/s\", \"ok\": true, \"skipped\": false, \"detail\": \"fine\"}\n\
                   noise\n\
                   {\"scenario\": \"b\", \"endpoint\": \"x\", \"ok\": false, \"detail\": \"gRPC INTERNAL\"}\n";
        let err = "early\n== scenario a\nfrom a\n== scenario b\nfrom b\nmore b\n";
        let run = parse(Stack::Python, out, err, "exit status: 0".into());
        assert_eq!(run.stderr_of["a"], "from a");
        assert_eq!(run.stderr_of["b"], "from b\nmore b");
        assert_eq!(run.stack, "grpcio 1.0");
        assert!(run.reports["a"].ok && !run.reports["a"].skipped);
        assert_eq!(run.reports["a"].endpoint, "unix:/s");
        assert!(!run.reports["b"].ok);
        assert_eq!(run.reports["b"].detail, "gRPC INTERNAL");
        assert!(run.stderr.contains("[stdout] noise"), "{}", run.stderr);
    }

    #[test]
    fn tail_keeps_the_end_at_a_char_boundary() {
        assert_eq!(tail("abcdef\n", 3), "def");
        assert_eq!(tail("ééé", 3), "é");
        assert_eq!(tail("ab", 10), "ab");
    }
}
