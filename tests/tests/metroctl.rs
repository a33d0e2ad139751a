//! `metroctl` as a user runs it, against a real daemon: the tour of the
//! README, and errors that name the field; installation requests name a
//! device under /dev, on both runtimes.

#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

use metropolis_tests::{Daemon, RuntimeKind, against_both_runtimes, daemon_bin};

struct Ctl<'a> {
    d: &'a Daemon,
}

impl Ctl<'_> {
    fn run(&self, tls: bool, args: &[&str]) -> Output {
        let mut cmd = Command::new(daemon_bin().with_file_name("metroctl-under-test"));
        cmd.arg("--data-dir").arg(&self.d.data_dir);
        if tls {
            cmd.arg("--endpoint").arg(&self.d.addr);
        }
        cmd.args(args).output().unwrap()
    }

    /// Runs and expects success; returns stdout.
    fn ok(&self, tls: bool, args: &[&str]) -> String {
        let out = self.run(tls, args);
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "metroctl {args:?} failed: {}{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// Runs and expects failure; returns stderr.
    fn fails(&self, tls: bool, args: &[&str]) -> String {
        let out = self.run(tls, args);
        assert!(!out.status.success(), "metroctl {args:?} should fail");
        String::from_utf8_lossy(&out.stderr).to_string()
    }
}

#[test]
fn the_tour_works_and_errors_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), RuntimeKind::Tokio);
    let ctl = Ctl { d: &d };
    let me = d.node_id().to_string();

    // Nodes, as this node over the socket and as the owner over TLS.
    assert!(ctl.ok(false, &["node", "list"]).contains(&me));
    assert!(
        ctl.ok(
            false,
            &["status", "set", "--external-address", "192.0.2.10"]
        )
        .contains("updated")
    );
    let bundle = dir.path().join("n1");
    let added = ctl.ok(true, &["node", "add", "--out", bundle.to_str().unwrap()]);
    let new_id = added.split_whitespace().nth(1).unwrap().to_string();
    assert!(bundle.join("node-key.pem").exists());
    let json = ctl.ok(true, &["node", "list", "--json"]);
    assert_eq!(json.lines().count(), 2, "{json}");
    assert!(
        json.lines()
            .any(|l| l.contains("\"external_address\":\"192.0.2.10\"")),
        "{json}"
    );
    let out = ctl.run(
        true,
        &[
            "--credentials",
            bundle.to_str().unwrap(),
            "status",
            "set",
            "--external-address",
            "fd00::1",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(ctl.ok(true, &["node", "rm", &new_id]).contains("removed"));

    // Machines and installation requests.
    let machine = "3b241101-e2bb-4255-8caf-4136c566a962";
    let key = dir.path().join("agent.key");
    ctl.ok(
        true,
        &[
            "machine",
            "add",
            machine,
            "--generate-key",
            key.to_str().unwrap(),
        ],
    );
    assert!(
        std::fs::read_to_string(&key)
            .unwrap()
            .contains("PRIVATE KEY")
    );
    let list = ctl.ok(true, &["machine", "list"]);
    assert!(
        list.contains(machine) && list.contains("never seen") && !list.contains("LOST"),
        "{list}"
    );
    let digest = "a".repeat(64);
    let image = format!("http://127.0.0.1:5000/os@sha256:{digest}");
    assert!(
        ctl.ok(
            true,
            &[
                "install",
                "request",
                machine,
                "--image",
                &image,
                "--root-device",
                "/dev/vda"
            ]
        )
        .contains("generation 1")
    );
    let status = ctl.ok(true, &["install", "status", machine]);
    assert!(
        status.contains("generation 1") && status.contains("pending"),
        "{status}"
    );
    // Where it stands: no agent has fetched it, none is heard from.
    assert!(
        status.contains(
            "submitted 0s ago, not handed to the agent yet; agent never seen (no heartbeat yet)"
        ),
        "{status}"
    );

    // Errors name the field and the rule.
    let e = ctl.fails(false, &["status", "set", "--external-address", "nope"]);
    assert!(
        e.contains("--external-address") && e.contains("IPv4 or IPv6"),
        "{e}"
    );
    let e = ctl.fails(false, &["watch", "node", "metropolis-zz"]);
    assert!(e.contains("32 lowercase hex"), "{e}");
    let e = ctl.fails(
        true,
        &[
            "install",
            "request",
            machine,
            "--image",
            "ftp://x/y@sha256:1",
            "--root-device",
            "/dev/vda",
        ],
    );
    assert!(e.contains("--image") && e.contains("http or https"), "{e}");
    let e = ctl.fails(
        true,
        &[
            "machine",
            "add",
            "not-a-uuid",
            "--agent-pubkey",
            &"ab".repeat(32),
        ],
    );
    assert!(e.contains("machine_id") && e.contains("UUID"), "{e}");
    let e = ctl.fails(false, &["machine", "list"]);
    assert!(
        e.contains("PermissionDenied"),
        "a node may not manage machines: {e}"
    );
}

/// metroctl with `args` and `env`, not bound to a daemon.
fn metroctl(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(daemon_bin().with_file_name("metroctl-under-test"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn code_and_stderr(out: &Output) -> (Option<i32>, String) {
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Exit statuses tell the kinds of failure apart; several endpoints are
/// tried in order, from the flag or METROCTL_ENDPOINTS; --timeout bounds a
/// curator that never answers; completions for three shells.
#[test]
fn exit_statuses_endpoints_timeout_and_completions() {
    let dir = tempfile::tempdir().unwrap();
    let nothing = dir.path().join("nothing");
    let (code, e) = code_and_stderr(&metroctl(
        &["--data-dir", nothing.to_str().unwrap(), "node", "list"],
        &[],
    ));
    assert_eq!(code, Some(3), "nothing listening: {e}");
    assert!(e.contains("is metropolisd running?"), "{e}");
    let (code, e) = code_and_stderr(&metroctl(&["node", "frob"], &[]));
    assert_eq!(code, Some(2), "an unknown command: {e}");

    let d = Daemon::start(&dir.path().join("d"), RuntimeKind::Tokio);
    let data = d.data_dir.to_str().unwrap();
    let ctl = Ctl { d: &d };
    let me = d.node_id().to_string();
    // A bad argument: 2; not found: 5; permission denied: 4.
    assert_eq!(
        ctl.run(false, &["node", "rm", "metropolis-zz"])
            .status
            .code(),
        Some(2)
    );
    let unknown = "3b241101-e2bb-4255-8caf-4136c566a962";
    let out = ctl.run(true, &["machine", "show", unknown]);
    assert_eq!(out.status.code(), Some(5), "{:?}", code_and_stderr(&out));
    let out = ctl.run(false, &["machine", "list"]);
    assert_eq!(out.status.code(), Some(4), "{:?}", code_and_stderr(&out));

    // The first endpoint refuses, the second answers.
    let dead = format!("127.0.0.1:{}", metropolis_tests::free_port());
    let both = format!("{dead},{}", d.addr);
    let out = metroctl(
        &["--data-dir", data, "--endpoints", &both, "node", "list"],
        &[],
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&me),
        "{:?}",
        code_and_stderr(&out)
    );
    let out = metroctl(
        &["--data-dir", data, "node", "list"],
        &[("METROCTL_ENDPOINTS", &both)],
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&me),
        "{:?}",
        code_and_stderr(&out)
    );
    let out = metroctl(
        &["--data-dir", data, "--endpoints", &dead, "node", "list"],
        &[],
    );
    let (code, e) = code_and_stderr(&out);
    assert_eq!(code, Some(3), "{e}");
    assert!(
        e.contains("no curator answered") && e.contains(&dead),
        "{e}"
    );

    // A listener that accepts and never answers: --timeout.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap().to_string();
    let started = std::time::Instant::now();
    let out = metroctl(
        &[
            "--data-dir",
            data,
            "--endpoints",
            &silent_addr,
            "--timeout",
            "1",
            "node",
            "list",
        ],
        &[],
    );
    let (code, e) = code_and_stderr(&out);
    assert_eq!(code, Some(3), "{e}");
    assert!(e.contains("--timeout"), "{e}");
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    drop(silent);

    for shell in ["bash", "zsh", "fish"] {
        let out = metroctl(&["completion", shell], &[]);
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && script.contains("metroctl"),
            "{shell}"
        );
        assert!(
            script.contains("machine") && script.contains("--endpoints"),
            "{shell}"
        );
    }
    let man = dir.path().join("man1");
    let out = metroctl(&["man", man.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{:?}", code_and_stderr(&out));
    let page = std::fs::read_to_string(man.join("metroctl-snapshot-save.1")).unwrap();
    assert!(page.contains(".TH") && page.contains("FILE.part"), "{page}");
    assert!(man.join("metroctl.1").exists() && man.join("metroctl-machine-show.1").exists());
}

/// Each JSON line of `text`, parsed.
fn json_lines(args: &[&str], text: &str) -> Vec<serde_json::Value> {
    assert!(!text.trim().is_empty(), "metroctl {args:?} printed nothing");
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("metroctl {args:?}: {e}: {l}")))
        .collect()
}

/// The documents of a YAML stream (each `---`-separated), as JSON values.
fn yaml_docs(text: &str) -> Vec<serde_json::Value> {
    assert!(text.starts_with("---\n"), "not a YAML stream: {text}");
    text.split("---\n")
        .filter(|d| !d.trim().is_empty())
        .map(|d| serde_yaml_ng::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect()
}

fn is_rfc3339(value: &serde_json::Value) -> bool {
    let t = value.as_str().unwrap_or_default();
    t.len() >= 20 && t.as_bytes()[4] == b'-' && t.as_bytes()[10] == b'T' && t.ends_with('Z')
}

/// `--json` of every command that prints data parses, line by line, with
/// RFC 3339 times; `machine show` for people lists the hardware report.
#[test]
fn every_json_output_parses() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), RuntimeKind::Tokio);
    let ctl = Ctl { d: &d };
    let machine = "3b241101-e2bb-4255-8caf-4136c566a962";
    let key = dir.path().join("agent.key");
    ctl.ok(
        true,
        &[
            "machine",
            "add",
            machine,
            "--generate-key",
            key.to_str().unwrap(),
        ],
    );
    ctl.ok(false, &["status", "set", "--external-address", "192.0.2.7"]);
    let out = dir.path().join("n1");
    let cases: [&[&str]; 5] = [
        &["node", "list", "--json"],
        &["machine", "list", "--json"],
        &["machine", "show", machine, "--json"],
        &["install", "status", machine, "--json"],
        &["node", "add", "--out", out.to_str().unwrap(), "--json"],
    ];
    for args in cases {
        let values = json_lines(args, &ctl.ok(true, args));
        // The same as `-o json`, and as YAML documents with `-o yaml`
        // (`node add` writes a new node each time: left out).
        if args[1] != "add" {
            let plain: Vec<&str> = args.iter().copied().filter(|a| *a != "--json").collect();
            let as_json = [&["-o", "json"][..], &plain].concat();
            assert_eq!(json_lines(&as_json, &ctl.ok(true, &as_json)), values);
            let as_yaml = [&["-o", "yaml"][..], &plain].concat();
            assert_eq!(yaml_docs(&ctl.ok(true, &as_yaml)), values, "{as_yaml:?}");
        }
        match (args[0], args[1]) {
            ("node", "list") => {
                let me = values.iter().find(|v| v["id"] == d.node_id().to_string());
                let me = me.unwrap_or_else(|| panic!("{values:?}"));
                assert_eq!(me["status"]["external_address"], "192.0.2.7");
                assert!(is_rfc3339(&me["status"]["timestamp"]), "{me}");
            }
            ("machine", _) => {
                assert_eq!(values[0]["machine_id"], machine);
                assert_eq!(values[0]["agent_public_key"].as_str().unwrap().len(), 64);
                assert!(values[0]["last_heartbeat"].is_null(), "never heartbeated");
            }
            ("install", _) => assert_eq!(values[0]["state"], "none"),
            _ => assert!(
                values[0]["node_id"]
                    .as_str()
                    .unwrap()
                    .starts_with("metropolis-")
            ),
        }
    }
    // wide: more columns in the lists, each table under a header row.
    let wide = ctl.ok(true, &["-o", "wide", "machine", "list"]);
    let header = wide.lines().next().unwrap_or_default();
    assert!(
        header.starts_with("MACHINE ")
            && header.contains("  LAST HEARTBEAT  ")
            && header.ends_with("LATEST REPORT"),
        "{wide}"
    );
    assert!(wide.lines().nth(1).unwrap().ends_with("  -"), "{wide}");
    let wide = ctl.ok(true, &["node", "list", "-o", "wide"]);
    let header = wide.lines().next().unwrap_or_default();
    assert!(
        header.starts_with("ID ") && header.ends_with("STATUS TIME"),
        "{wide}"
    );
    assert!(wide.contains("  20"), "{wide}");
    let show = ctl.ok(true, &["machine", "show", machine]);
    assert!(show.contains("hardware report  none yet"), "{show}");
    assert!(
        !show.contains("AgentHardwareReport {"),
        "Debug output: {show}"
    );
}

fn debug_ctl(d: &Daemon, args: &[&str]) -> Output {
    Command::new(daemon_bin().with_file_name("metroctl-under-test"))
        .arg("--debug-endpoint")
        .arg(d.debug_addr.as_ref().unwrap())
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn debug_commands_logs_and_kubeconfig() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_debug(&dir.path().join("d"), RuntimeKind::Tokio, &[]);
    let text = |o: &Output| String::from_utf8_lossy(&o.stdout).to_string();

    // logs: text lines with time, severity letter, DN and location.
    let out = debug_ctl(&d, &["logs", "root", "-r"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = text(&out)
        .lines()
        .find(|l| l.contains("curator serving"))
        .unwrap_or_else(|| panic!("{}", text(&out)))
        .to_string();
    assert!(line.contains(" I root.daemon "), "{line}");
    // --tail, --min-severity and --json.
    let out = debug_ctl(&d, &["logs", "root", "-r", "--tail", "1", "--json"]);
    assert_eq!(text(&out).lines().count(), 1, "{}", text(&out));
    assert!(text(&out).starts_with("{\"dn\":"), "{}", text(&out));
    let out = debug_ctl(&d, &["logs", "root", "-r", "--min-severity", "warning"]);
    assert!(
        text(&out)
            .lines()
            .all(|l| l.contains(" W ") || l.contains(" E ")),
        "{}",
        text(&out)
    );
    assert!(text(&out).contains("UNAUTHENTICATED"), "{}", text(&out));
    // A DN never logged to is empty; errors name the field.
    let out = debug_ctl(&d, &["logs", "root.nope"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(text(&out), "");
    let out = debug_ctl(&d, &["logs", "Root..x"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("dn: "),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // --list: the DNs holding entries, sorted; without a DN: the whole
    // tree, the entries of every listed DN (read after the list, so a
    // DN may have gained entries, never lost them all).
    let out = debug_ctl(&d, &["logs", "--list"]);
    // A header row, then one row per DN (its name, then its count).
    assert!(text(&out).starts_with("DN "), "{}", text(&out));
    let listed: Vec<String> = text(&out)
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    assert!(
        listed.iter().any(|dn| dn == "root.daemon"),
        "{}",
        text(&out)
    );
    assert!(listed.windows(2).all(|w| w[0] < w[1]), "{listed:?}");
    let out = debug_ctl(&d, &["logs", "--json"]);
    let logged: std::collections::BTreeSet<String> = text(&out)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["dn"].as_str().unwrap().to_string()
        })
        .collect();
    for dn in &listed {
        assert!(
            logged.contains(dn),
            "{dn} listed, but not in the whole tree"
        );
    }

    // kubeconfig to a file, mode 0600.
    let file = dir.path().join("kc.yaml");
    let out = debug_ctl(
        &d,
        &[
            "kubeconfig",
            "--id",
            "alice",
            "--group",
            "dev",
            "-f",
            file.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(&file).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let yaml = std::fs::read_to_string(&file).unwrap();
    assert!(yaml.contains("client-key-data"), "{yaml}");
    let out = debug_ctl(&d, &["kubeconfig", "--id", ""]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("id:"));
    // -o json: the same kubeconfig as one JSON object.
    let out = debug_ctl(&d, &["-o", "json", "kubeconfig", "--id", "bob"]);
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(value["kind"], "Config", "{value}");
    assert_eq!(value["users"][0]["name"], "bob", "{value}");
    // logs -o yaml: one document per entry.
    let out = debug_ctl(&d, &["logs", "root", "-r", "--tail", "2", "-o", "yaml"]);
    let docs = yaml_docs(&text(&out));
    assert_eq!(docs.len(), 2, "{}", text(&out));
    assert!(docs.iter().all(|v| v["dn"].is_string()), "{docs:?}");

    // No debug service there: the error says how to enable it.
    let out = Command::new(daemon_bin().with_file_name("metroctl-under-test"))
        .args([
            "--debug-endpoint",
            &d.addr.replace("127.0.0.1", "127.0.0.2"),
            "logs",
            "root",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--debug-listen"));
}

/// `install request --root-device` names a device: a device name or a
/// path under /dev/ without `..`. The curator refuses anything else
/// (InvalidArgument naming the field) and the generation stays.
async fn install_requests_name_a_device(runtime: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), runtime);
    let ctl = Ctl { d: &d };
    let machine = "3b241101-e2bb-4255-8caf-4136c566a962";
    ctl.ok(
        true,
        &[
            "machine",
            "add",
            machine,
            "--agent-pubkey",
            &"ab".repeat(32),
        ],
    );
    let image = format!("http://127.0.0.1:5000/os@sha256:{}", "a".repeat(64));
    let request = |root: &str| {
        vec![
            "install".to_string(),
            "request".into(),
            machine.into(),
            "--image".into(),
            image.clone(),
            "--root-device".into(),
            root.into(),
        ]
    };
    let regular = dir.path().join("disk.img");
    std::fs::write(&regular, b"").unwrap();
    let regular = regular.to_str().unwrap().to_string();
    for (root, problem) in [
        ("/etc/shadow", "is not under /dev/"),
        ("../../etc/passwd", "is not an absolute path"),
        ("", "missing"),
        (regular.as_str(), "is not under /dev/"),
        ("/dev/../etc/shadow", "a . or .. component"),
    ] {
        let args = request(root);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let e = ctl.fails(true, &args);
        assert!(e.contains("InvalidArgument"), "{root:?}: {e}");
        assert!(
            e.contains("request.metropolis.root_device: "),
            "{root:?}: {e}"
        );
        assert!(e.contains(problem), "{root:?}: {e}");
    }
    assert!(
        ctl.ok(true, &["install", "status", machine])
            .contains("no installation request")
    );
    for (root, generation) in [("sda", 1), ("/dev/disk/by-id/nvme-x", 2)] {
        let args = request(root);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = ctl.ok(true, &args);
        assert!(out.contains(&format!("generation {generation}")), "{out}");
    }
    let status = ctl.ok(true, &["install", "status", machine]);
    assert!(status.contains("-> /dev/disk/by-id/nvme-x"), "{status}");
}

against_both_runtimes!(install_requests_name_a_device);

/// The cases that need etcd (the `system` feature).
#[cfg(feature = "system")]
mod over_etcd {
    use super::*;
    use metropolis_testkit::archives;

    #[test]
    fn debug_commands_load_image_and_trace() {
        use std::io::{BufRead, Write};
        let dir = tempfile::tempdir().unwrap();
        let d = Daemon::start_debug(&dir.path().join("d"), RuntimeKind::Tokio, &[]);

        // load-image from a file: names in the store; no progress drawn
        // on a stderr that is not a terminal.
        let archive = dir.path().join("image.tar");
        std::fs::write(&archive, archives::docker_archive("tool:1", "from a file")).unwrap();
        let out = debug_ctl(
            &d,
            &[
                "load-image",
                archive.to_str().unwrap(),
                "--chunk-size",
                "1000",
            ],
        );
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{stderr}");
        assert!(
            !stderr.contains('\u{1b}') && !stderr.contains('%'),
            "progress: {stderr}"
        );
        // The names the archive gave, as the node stores them.
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            stdout.contains("loaded docker.io/library/tool:1"),
            "{stdout}"
        );
        // From standard input.
        let mut child = Command::new(daemon_bin().with_file_name("metroctl-under-test"))
            .args([
                "--debug-endpoint",
                d.debug_addr.as_ref().unwrap(),
                "load-image",
                "-",
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(&archives::docker_archive("tool:2", "from stdin"))
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let index = std::fs::read_to_string(d.data_dir.join("images/index.json")).unwrap();
        assert!(index.contains("docker.io/library/tool:1"), "{index}");
        assert!(index.contains("docker.io/library/tool:2"), "{index}");
        // A hostile archive: the reason, non-zero exit.
        let evil = archives::build(&[archives::E::RawFile(b"../evil".to_vec(), b"x".to_vec())]);
        std::fs::write(&archive, evil).unwrap();
        let out = debug_ctl(&d, &["load-image", archive.to_str().unwrap()]);
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("InvalidArgument"));
        let out = debug_ctl(
            &d,
            &["load-image", archive.to_str().unwrap(), "--chunk-size", "0"],
        );
        assert!(String::from_utf8_lossy(&out.stderr).contains("--chunk-size"));

        // trace: prints marker lines until SIGINT, then the node restores
        // tracefs.
        let tracefs = std::path::Path::new("/sys/kernel/tracing");
        let mut child = Command::new(daemon_bin().with_file_name("metroctl-under-test"))
            .args([
                "--debug-endpoint",
                d.debug_addr.as_ref().unwrap(),
                "trace",
                "--tracer",
                "nop",
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::fs::read_to_string(tracefs.join("tracing_on"))
            .unwrap()
            .trim()
            != "1"
        {
            assert!(std::time::Instant::now() < deadline, "trace did not start");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        std::fs::write(tracefs.join("trace_marker"), "metroctl-trace-marker").unwrap();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        while !line.contains("metroctl-trace-marker") {
            line.clear();
            assert!(
                stdout.read_line(&mut line).unwrap() > 0,
                "trace output ended"
            );
        }
        let kill = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        let status = child.wait().unwrap();
        assert!(status.success(), "{status}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let on = std::fs::read_to_string(tracefs.join("tracing_on")).unwrap();
            let tracer = std::fs::read_to_string(tracefs.join("current_tracer")).unwrap();
            if on.trim() == "0" && tracer.trim() == "nop" {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "tracefs not restored");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}
