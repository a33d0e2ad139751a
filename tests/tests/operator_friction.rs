//! What a new operator still tripped on with `metroctl` (issue 52: the
//! safety of credentials and the views), as a user runs it against a real
//! daemon: the exit status, the words read, the files left as they were.
//! Needs nothing but the processes and a temporary directory.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use metropolis_proto::prelude::agent;
use metropolis_proto::prelude::agent::agent_callback_client::AgentCallbackClient;
use metropolis_tests::outcome::{exits, path, stdout};
use metropolis_tests::{AgentKey, Daemon, RuntimeKind, daemon_bin};
use metropolis_transport::grpc::Channel;

/// A machine whose agent never connects.
const QUIET: &str = "5d0c7a43-0a5b-4c51-9d1e-2f0a4a1c9e11";
/// A machine whose agent heartbeats, then stops.
const GONE: &str = "6e1d8b54-1b6c-4d62-8e2f-3a1b5b2d0f22";

/// `metroctl` with `args` and the extra environment `env` (and `COLUMNS`
/// unset unless given there).
fn metroctl_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(daemon_bin().with_file_name("metroctl-under-test"))
        .env_remove("COLUMNS")
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// `metroctl` as the owner of `d` over TLS, with `env`.
fn owner_env(d: &Daemon, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut all = vec![
        "--data-dir",
        d.data_dir.to_str().unwrap(),
        "--endpoints",
        &d.addr,
    ];
    all.extend_from_slice(args);
    metroctl_env(&all, env)
}

fn owner(d: &Daemon, args: &[&str]) -> Output {
    owner_env(d, args, &[])
}

/// How many nodes `node list` counts.
fn node_count(d: &Daemon) -> usize {
    let out = owner(d, &["node", "list", "--json"]);
    exits(&out, 0, "node list");
    stdout(&out).lines().count()
}

/// Every file of `dir` with its bytes, sorted.
fn contents(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let bytes = std::fs::read(e.path()).unwrap_or_default();
            (e.file_name().to_string_lossy().into_owned(), bytes)
        })
        .collect();
    files.sort();
    files
}

/// Item 1: `node add --out DIR` into a directory holding a node's key
/// exits 2 naming --out, registers no node and leaves every file
/// byte-identical; the join bundle (`--curator`), `snapshot save FILE`
/// and `man DIR` refuse an existing target the same way.
#[test]
fn nothing_overwrites_a_credential() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), RuntimeKind::Tokio);
    let out_dir = dir.path().join("n1");
    let out = owner(&d, &["node", "add", "--out", path(&out_dir)]);
    exits(&out, 0, "the first node add");
    let before = contents(&out_dir);
    assert_eq!(before.len(), 3, "{before:?}");
    let nodes = node_count(&d);

    // Again into the same directory: refused before the call.
    let out = owner(&d, &["node", "add", "--out", path(&out_dir)]);
    let err = exits(&out, 2, "node add into a directory holding a key");
    assert!(
        err.contains("--out") && err.contains("node-key.pem"),
        "{err}"
    );
    assert!(err.contains("nothing was sent"), "{err}");
    assert_eq!(contents(&out_dir), before, "a credential changed");
    assert_eq!(node_count(&d), nodes, "a node was registered anyway");

    // Only the key there (the certificate was moved away): still refused.
    let lone = dir.path().join("lone");
    std::fs::create_dir(&lone).unwrap();
    std::fs::write(lone.join("node-key.pem"), "the old node's key").unwrap();
    let out = owner(&d, &["node", "add", "--out", path(&lone)]);
    exits(&out, 2, "node add into a directory holding only a key");
    assert_eq!(
        std::fs::read_to_string(lone.join("node-key.pem")).unwrap(),
        "the old node's key"
    );
    assert_eq!(contents(&lone).len(), 1, "{:?}", contents(&lone));

    // The join bundle: ca.pem is there.
    let out = metroctl_env(
        &[
            "--data-dir",
            path(&d.data_dir),
            "node",
            "add",
            "--curator",
            "--out",
            path(&out_dir),
        ],
        &[],
    );
    let err = exits(&out, 2, "a join bundle into a credential directory");
    assert!(err.contains("--out") && err.contains("ca.pem"), "{err}");
    assert_eq!(contents(&out_dir), before, "a credential changed");

    // snapshot save FILE: an existing FILE is refused and kept.
    let backup = dir.path().join("backup.db");
    std::fs::write(&backup, "yesterday's backup").unwrap();
    let out = owner(&d, &["snapshot", "save", path(&backup)]);
    let err = exits(&out, 2, "snapshot save over a file");
    assert!(err.contains("FILE") && err.contains("exists"), "{err}");
    assert_eq!(
        std::fs::read_to_string(&backup).unwrap(),
        "yesterday's backup"
    );
    let fresh = dir.path().join("fresh.db");
    let out = owner(&d, &["snapshot", "save", path(&fresh)]);
    exits(&out, 0, "snapshot save to a new file");
    assert!(std::fs::metadata(&fresh).unwrap().len() > 0);
    assert!(!dir.path().join("fresh.db.part").exists());

    // man DIR: the pages are there already; --replace replaces them.
    let man = dir.path().join("man1");
    exits(&metroctl_env(&["man", path(&man)], &[]), 0, "man");
    let page = man.join("metroctl-node-add.1");
    std::fs::write(&page, "an edited page").unwrap();
    let err = exits(&metroctl_env(&["man", path(&man)], &[]), 2, "man again");
    assert!(err.contains("--replace") && err.contains("DIR"), "{err}");
    assert_eq!(std::fs::read_to_string(&page).unwrap(), "an edited page");
    exits(
        &metroctl_env(&["man", "--replace", path(&man)], &[]),
        0,
        "man --replace",
    );
    assert!(std::fs::read_to_string(&page).unwrap().contains(".TH"));
}

/// Item 8: `node show ID` (and `-o json`), exit 5 for an absent node, 2
/// for a malformed ID; `node list` has an AGE column.
#[test]
fn node_show_and_the_age_column() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), RuntimeKind::Tokio);
    let id = d.node_id().to_string();
    let out = metroctl_env(
        &[
            "--data-dir",
            path(&d.data_dir),
            "status",
            "set",
            "--external-address",
            "10.0.0.9",
        ],
        &[],
    );
    exits(&out, 0, "status set");

    let out = owner(&d, &["node", "list"]);
    exits(&out, 0, "node list");
    let list = stdout(&out);
    let mut lines = list.lines();
    let header = lines.next().unwrap();
    assert!(header.contains("  AGE"), "{list}");
    let row = lines.find(|l| l.starts_with(&id)).unwrap();
    let age = row.split_whitespace().nth(3).unwrap();
    assert!(
        age.ends_with('s') && age[..age.len() - 1].parse::<u64>().is_ok(),
        "AGE {age:?} in {list}"
    );

    let out = owner(&d, &["node", "show", &id]);
    exits(&out, 0, "node show");
    let text = stdout(&out);
    assert!(text.contains(&format!("node           {id}")), "{text}");
    assert!(text.contains("address        10.0.0.9"), "{text}");
    assert!(
        text.contains("last status    ") && text.contains("s ago ("),
        "{text}"
    );

    for args in [
        &["-o", "json", "node", "show", &id][..],
        &["node", "show", &id, "--json"],
    ] {
        let out = owner(&d, args);
        exits(&out, 0, "node show as JSON");
        let value: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
        assert_eq!(value["id"], id.as_str());
        assert_eq!(value["status"]["external_address"], "10.0.0.9");
    }

    let absent = "metropolis-0123456789abcdef0123456789abcdef";
    let err = exits(&owner(&d, &["node", "show", absent]), 5, "an absent node");
    assert!(err.contains(absent) && err.contains("node list"), "{err}");
    let err = exits(&owner(&d, &["node", "show", "nope"]), 2, "a malformed ID");
    assert!(err.contains("ID"), "{err}");
}

/// Sends one heartbeat of `machine` with `key`, carrying `report`.
fn heartbeat(
    d: &Daemon,
    key: &AgentKey,
    machine: &str,
    report: Option<agent::OsInstallationReport>,
) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let channel = d.agent_channel(Some(&key.creds), &key.creds.ca_pem).await;
        let mut client = AgentCallbackClient::with_origin(channel, Channel::origin());
        client
            .heartbeat(agent::HeartbeatRequest {
                machine_id: machine.into(),
                installation_report: report,
                ..Default::default()
            })
            .await
            .unwrap();
    });
}

/// An error report of generation 1, long and on two lines.
fn long_error() -> (String, agent::OsInstallationReport) {
    use agent::os_installation_report::{Error, Result as R};
    let error = format!(
        "writing /dev/sda failed at block 4096:\n{} END",
        "the disk answered with an I/O error again ".repeat(6)
    );
    let report = agent::OsInstallationReport {
        generation: 1,
        result: Some(R::Error(Error {
            error: error.clone(),
        })),
    };
    (error, report)
}

/// Item 8: a machine whose agent never connected is "never seen", one
/// that stopped heartbeating LOST; `machine list` cuts the latest report
/// to COLUMNS, or to the terminal's width (a pseudo-terminal made by
/// script(1), from util-linux), not when piped without COLUMNS, not with
/// `-o wide`; `machine show` has it whole.
#[test]
fn machine_list_never_seen_lost_and_the_cut_report() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(
        &dir.path().join("d"),
        RuntimeKind::Tokio,
        &["--agent-lost-after", "1"],
    );
    let quiet_key = dir.path().join("quiet.key");
    let out = owner(
        &d,
        &["machine", "add", QUIET, "--generate-key", path(&quiet_key)],
    );
    exits(&out, 0, "machine add");
    let key = AgentKey::new(&d);
    let hex = metropolis_core::hex::encode(&key.public);
    exits(
        &owner(&d, &["machine", "add", GONE, "--agent-pubkey", &hex]),
        0,
        "machine add --agent-pubkey",
    );
    let digest = "a".repeat(64);
    let image = format!("http://127.0.0.1:5000/os@sha256:{digest}");
    let out = owner(
        &d,
        &[
            "install",
            "request",
            GONE,
            "--image",
            &image,
            "--root-device",
            "sda",
        ],
    );
    exits(&out, 0, "install request");
    let (error, report) = long_error();
    heartbeat(&d, &key, GONE, None);
    heartbeat(&d, &key, GONE, Some(report));
    // More than --agent-lost-after without a heartbeat.
    std::thread::sleep(Duration::from_millis(2500));

    let out = owner(&d, &["machine", "list"]);
    exits(&out, 0, "machine list");
    let list = stdout(&out);
    let row = |id: &str| {
        list.lines()
            .find(|l| l.starts_with(id))
            .unwrap()
            .to_string()
    };
    assert!(row(QUIET).contains("never seen"), "{list}");
    assert!(!row(QUIET).contains("LOST"), "{list}");
    assert!(row(GONE).contains("LOST"), "{list}");
    // Piped without COLUMNS: not cut, on one line.
    let one_line = error.replace('\n', " ");
    assert!(
        row(GONE).ends_with(&format!("gen 1: error: {one_line}")),
        "{list}"
    );

    let out = owner(&d, &["machine", "list", "--json"]);
    let agents: Vec<(String, String)> = stdout(&out)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["machine_id"].as_str().unwrap().into(),
                v["agent"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert!(
        agents.contains(&(QUIET.into(), "never_seen".into())),
        "{agents:?}"
    );
    assert!(agents.contains(&(GONE.into(), "lost".into())), "{agents:?}");

    // COLUMNS=120: every line fits, the report is cut with an ellipsis.
    let out = owner_env(&d, &["machine", "list"], &[("COLUMNS", "120")]);
    let cut = stdout(&out);
    for line in cut.lines() {
        assert!(
            line.chars().count() <= 120,
            "{} chars: {line}",
            line.chars().count()
        );
    }
    let gone = cut.lines().find(|l| l.starts_with(GONE)).unwrap();
    assert!(
        gone.ends_with('…') && gone.contains("gen 1: error: writing"),
        "{cut}"
    );
    // On a terminal without COLUMNS: the terminal's width (a pty of 110
    // columns, through script(1)).
    let command = format!(
        "stty cols 110; exec {} --data-dir {} --endpoints {} machine list",
        daemon_bin().with_file_name("metroctl-under-test").display(),
        d.data_dir.display(),
        d.addr
    );
    let out = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env_remove("COLUMNS")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let on_tty = stdout(&out).replace('\r', "");
    let gone = on_tty
        .lines()
        .find(|l| l.starts_with(GONE))
        .unwrap_or_else(|| panic!("{on_tty}"));
    assert_eq!(gone.chars().count(), 110, "{on_tty}");
    assert!(gone.ends_with('…'), "{on_tty}");
    // -o wide is never cut.
    let out = owner_env(
        &d,
        &["-o", "wide", "machine", "list"],
        &[("COLUMNS", "120")],
    );
    assert!(stdout(&out).contains(" END"), "{}", stdout(&out));
    // machine show has it whole, and says the quiet agent never connected.
    let out = owner_env(&d, &["machine", "show", GONE], &[("COLUMNS", "120")]);
    assert!(stdout(&out).contains(&error), "{}", stdout(&out));
    let out = owner(&d, &["machine", "show", QUIET]);
    let text = stdout(&out);
    assert!(
        text.contains("never connected") && !text.contains("LOST"),
        "{text}"
    );
    let out = owner(
        &d,
        &[
            "install",
            "request",
            QUIET,
            "--image",
            &image,
            "--root-device",
            "sda",
        ],
    );
    exits(&out, 0, "install request of the quiet machine");
    let out = owner(&d, &["install", "status", QUIET]);
    let text = stdout(&out);
    assert!(
        text.contains("agent never seen") && !text.contains("LOST"),
        "{text}"
    );
}

/// Item 8: `metroctl watch` over an outage of its curator says
/// "reconnecting" once, however many attempts fail, and "reconnected"
/// with their number once the curator is back.
#[test]
fn watch_says_a_reconnect_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let mut d = Daemon::start(&data, RuntimeKind::Tokio);
    let addr = d.addr.clone();
    let mut child = Command::new(daemon_bin().with_file_name("metroctl-under-test"))
        .args([
            "--data-dir",
            path(&data),
            "--endpoints",
            &addr,
            "watch",
            "nodes",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let synced = lines.any(|l| l.unwrap().contains("end of current state"));
    assert!(synced, "watch never printed the current state");
    std::thread::spawn(move || lines.for_each(drop));
    // Standard error as it comes, for the test to look at while it runs.
    let said = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let err = BufReader::new(child.stderr.take().unwrap());
    let sink = said.clone();
    std::thread::spawn(move || {
        for line in err.lines().map_while(Result::ok) {
            let mut text = sink.lock().unwrap();
            text.push_str(&line);
            text.push('\n');
        }
    });

    // An outage long enough for several attempts (100 ms doubling).
    d.kill();
    std::thread::sleep(Duration::from_secs(4));
    let _d = Daemon::start_at(&data, addr, RuntimeKind::Tokio);
    // The next attempt is at most 5 s away.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !said.lock().unwrap().contains("reconnected after ") && Instant::now() < deadline {
        assert!(child.try_wait().unwrap().is_none(), "watch exited");
        std::thread::sleep(Duration::from_millis(100));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let text = said.lock().unwrap().clone();
    assert_eq!(text.matches("reconnecting:").count(), 1, "{text}");
    let back = text
        .lines()
        .find(|l| l.starts_with("reconnected after "))
        .unwrap_or_else(|| panic!("no reconnected line: {text}"));
    let attempts: u32 = back
        .trim_start_matches("reconnected after ")
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(attempts >= 2, "only {attempts} attempt(s) failed: {text}");
}

/// Item 8: `-h` of a subcommand lists its own options first, then the
/// global ones under one heading, one line each; `--help` says each
/// global option's environment variable and default.
#[test]
fn a_subcommands_short_help_lists_its_own_options_first() {
    for args in [
        &["node", "add", "-h"][..],
        &["machine", "list", "-h"],
        &["-h"],
    ] {
        let out = metroctl_env(args, &[]);
        exits(&out, 0, &format!("{args:?}"));
        let help = stdout(&out);
        assert_eq!(help.matches("Global options:").count(), 1, "{help}");
        let (own, global) = help.split_once("Global options:").unwrap();
        assert!(own.contains("-h, --help"), "{help}");
        // The own options: none of the global ones among them.
        assert!(
            !own.contains("--data-dir <") && !own.contains("--endpoints <"),
            "{help}"
        );
        let lines: Vec<&str> = global
            .lines()
            .skip(1)
            .take_while(|l| !l.trim().is_empty())
            .collect();
        assert_eq!(lines.len(), 7, "one line per global option:\n{help}");
        for (flag, words) in [
            ("--data-dir", "data directory"),
            ("--endpoints", "TLS listeners"),
            ("--timeout", "Seconds"),
            ("--output", "table, wide, json or yaml"),
        ] {
            let line = lines.iter().find(|l| l.contains(flag)).unwrap();
            assert!(line.contains(words), "{flag}: {line}\n{help}");
        }
    }
    let own = stdout(&metroctl_env(&["node", "add", "-h"], &[]));
    let out_flag = own.find("--out").unwrap();
    assert!(out_flag < own.find("Global options:").unwrap(), "{own}");
    let long = stdout(&metroctl_env(&["node", "add", "--help"], &[]));
    for text in [
        "Environment: METROCTL_DATA_DIR. Default: /var/lib/metropolis.",
        "Environment: METROCTL_DEBUG_ENDPOINT. Default: 127.0.0.1:7837.",
        "Environment: METROCTL_TIMEOUT. Default: 30.",
    ] {
        assert!(long.contains(text), "{text}:\n{long}");
    }
}
