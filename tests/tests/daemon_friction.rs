//! An operator's first hour with `metropolisd` and `bmaas-agent` (issue
//! 44), over the real binaries: a taken port stops the start before the
//! data directory exists and names its flag; a fatal error is printed
//! once, as JSON with `--log-format json`; the exit statuses of
//! docs/operations.md; host names and files where addresses and
//! directories go; the agent refusing a bad `--machine-id` at start; one
//! environment scheme per program; the flags the debug service's refusals
//! point to; the man pages. Needs nothing but the process and a
//! temporary directory.

#![allow(clippy::unwrap_used)]

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use metropolis_proto::metropolis::node::core::curator::proto::private::GetMachineRequest;
use metropolis_proto::prelude::debug;
use metropolis_tests::{AgentProcess, Daemon, RuntimeKind, daemon_bin, free_port};

/// The agent binary beside the daemon's.
fn agent_bin() -> std::path::PathBuf {
    daemon_bin().with_file_name("bmaas-agent-under-test")
}

/// Runs `command` to its end (killed after 30 s: a start that should
/// have failed but serves); its exit code and stderr.
fn run(command: &mut Command) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let err = dir.path().join("stderr");
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!(
                "still running after 30 s:\n{}",
                std::fs::read_to_string(&err).unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status.code(), std::fs::read_to_string(&err).unwrap())
}

/// [`daemon`] started with its JSON log in `log`, stdin and stdout closed.
fn serving(data: &Path, extra: &[&str], log: &Path) -> std::process::Child {
    daemon(data, extra)
        .args(["--log-format", "json"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// The daemon on `data` with free loopback ports and `extra` flags (which
/// may name the listeners again: they replace the free ones).
fn daemon(data: &Path, extra: &[&str]) -> Command {
    let mut flags: Vec<String> = vec![
        "--data-dir".into(),
        data.display().to_string(),
        "--log".into(),
        "info".into(),
    ];
    for flag in ["--listen", "--agent-listen"] {
        if !extra.contains(&flag) {
            flags.push(flag.into());
            flags.push(format!("127.0.0.1:{}", free_port()));
        }
    }
    let mut command = Command::new(daemon_bin());
    command
        .args(flags)
        .args(extra)
        .env_remove("METROPOLIS_LOG_FORMAT");
    command
}

/// Item 3: every listener is bound before the data directory is created;
/// the error names the flag and says to choose another address; status 3.
#[test]
fn a_taken_port_stops_the_start_before_the_data_directory_is_created() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    for flag in [
        "--listen",
        "--agent-listen",
        "--debug-listen",
        "--metrics-listen",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let (code, stderr) = run(daemon(&data, &[flag, &addr]).env_remove("NOTIFY_SOCKET"));
        assert_eq!(
            code,
            Some(3),
            "{flag}: unavailable, per the table:\n{stderr}"
        );
        assert!(
            stderr.contains(&format!(
                "{flag} {addr}: cannot listen: address already in use"
            )) && stderr.contains(&format!("choose another address with {flag}")),
            "{flag} named:\n{stderr}"
        );
        assert!(
            !data.exists(),
            "{flag}: the data directory was created before the failed bind"
        );
    }
    drop(taken);
}

/// Item 4: a fatal error is one line, `metropolisd: ...` as text, and one
/// JSON object (the last line, like every other) as json.
#[test]
fn a_fatal_error_is_printed_once_in_the_log_format() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "not a directory").unwrap();
    let (code, text) = run(&mut daemon(&file, &[]));
    assert_eq!(code, Some(2), "{text}");
    let mentions: Vec<&str> = text.lines().filter(|l| l.contains("is a file")).collect();
    assert_eq!(mentions.len(), 1, "printed once:\n{text}");
    assert!(
        mentions[0].starts_with("metropolisd: --data-dir "),
        "{text}"
    );

    let (code, json) = run(&mut daemon(&file, &["--log-format", "json"]));
    assert_eq!(code, Some(2), "{json}");
    let lines: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let last = lines.last().unwrap();
    assert_eq!(last["level"], "ERROR", "{json}");
    let message = last["fields"]["message"].as_str().unwrap();
    assert!(
        message.contains("--data-dir") && message.contains("is a file"),
        "{json}"
    );
    assert_eq!(
        json.matches("is a file").count(),
        1,
        "printed once:\n{json}"
    );

    // A usage error clap finds is JSON too, and so is the agent's.
    let (code, json) = run(&mut daemon(&file, &["--log-format=json", "--lisen", "x"]));
    assert_eq!(code, Some(2), "{json}");
    let line: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert!(
        line["fields"]["message"]
            .as_str()
            .unwrap()
            .contains("--lisen"),
        "{json}"
    );
    let (code, json) = run(Command::new(agent_bin())
        .args(["--endpoint", "127.0.0.1:1", "--machine-id"])
        .arg("3b241101-e2bb-4255-8caf-4136c566a962")
        .args([
            "--key",
            "/nonexistent/agent.key",
            "--ca",
            "/nonexistent/ca.pem",
        ])
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .env("BMAAS_AGENT_LOG_FORMAT", "json"));
    assert_eq!(code, Some(2), "a missing --key is a usage error:\n{json}");
    let last: serde_json::Value = serde_json::from_str(json.lines().last().unwrap()).unwrap();
    let message = last["fields"]["message"].as_str().unwrap();
    assert!(message.contains("--key /nonexistent/agent.key"), "{json}");
}

/// Item 5: the statuses of docs/operations.md's table for the usage
/// errors, a data directory another daemon holds, and help.
#[test]
fn startup_errors_exit_with_the_documented_status() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let loopback_only = format!("0.0.0.0:{}", free_port());
    for (extra, status, named) in [
        (vec!["--no-such-flag"], 2, "--no-such-flag"),
        (vec!["--listen", "127.0.0.1"], 2, "--listen"),
        (vec!["--shutdown-grace", "soon"], 2, "--shutdown-grace"),
        (
            vec!["--debug-listen", &loopback_only],
            2,
            "--debug-listen-non-loopback",
        ),
        (
            vec!["--kubernetes-ca-cert", "/nonexistent.pem"],
            2,
            "--kubernetes-ca-key",
        ),
    ] {
        let (code, stderr) = run(&mut daemon(&data, &extra));
        assert_eq!(code, Some(status), "{extra:?}:\n{stderr}");
        assert!(stderr.contains(named), "{extra:?} names {named}:\n{stderr}");
        assert!(!data.exists(), "{extra:?}: nothing created");
    }
    let help = Command::new(daemon_bin()).arg("--help").output().unwrap();
    assert_eq!(help.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&help.stdout).contains("Exit status: 0"));

    // A second daemon over a data directory the first holds: unavailable.
    let mut first = Daemon::start(&data, RuntimeKind::Tokio);
    let socket = dir.path().join("second.sock");
    let (code, stderr) = run(&mut daemon(&data, &["--socket", socket.to_str().unwrap()]));
    assert_eq!(code, Some(3), "{stderr}");
    assert!(stderr.contains("in use by another process"), "{stderr}");
    assert!(first.terminate().success());
}

/// Item 6: a host name where an address goes is resolved; what is not
/// IP:PORT says so; a data directory that is a file is named as such.
#[test]
fn listen_takes_host_names_and_a_file_is_not_a_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let port = free_port();
    let log = dir.path().join("daemon.log");
    let mut child = serving(&data, &["--listen", &format!("localhost:{port}")], &log);
    let serving = metropolis_tests::serving_line(&mut child, &log);
    child.kill().unwrap();
    child.wait().unwrap();
    let listen = serving["fields"]["listen"].as_str().unwrap();
    assert!(
        [format!("127.0.0.1:{port}"), format!("[::1]:{port}")].contains(&listen.to_string()),
        "localhost resolved: {serving}"
    );

    let other = dir.path().join("other");
    for bad in ["localhost", "localhost:http", "127.0.0.1:99999"] {
        let (code, stderr) = run(&mut daemon(&other, &["--listen", bad]));
        assert_eq!(code, Some(2), "{bad}:\n{stderr}");
        assert!(
            stderr.contains("--listen") && stderr.contains("expected IP:PORT"),
            "{bad}:\n{stderr}"
        );
        assert!(
            !stderr.contains("invalid socket address syntax"),
            "{stderr}"
        );
    }

    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let (code, stderr) = run(&mut daemon(&file, &[]));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("--data-dir {}: is a file", file.display())),
        "{stderr}"
    );
    let (code, stderr) = run(&mut daemon(&file.join("sub"), &[]));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--data-dir") && stderr.contains("a parent of it is a file"),
        "{stderr}"
    );
}

/// Item 7: a machine ID that is not a UUID stops the agent at once, naming
/// the flag, instead of heartbeats refused forever; any form Go's
/// uuid.Parse takes is accepted and sent canonical.
#[tokio::test(flavor = "multi_thread")]
async fn the_agent_checks_its_machine_id_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("data"), RuntimeKind::Tokio);
    let id = "3b241101-e2bb-4255-8caf-4136c566a962";
    let machine = d.enroll_machine(id, dir.path()).await;

    let mut bad = AgentProcess::start(&d, "xyz", &machine.key_file, &dir.path().join("s1"));
    let status = bad.wait_exit(Duration::from_secs(10));
    let log = bad.log();
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{log}");
    assert!(
        log.contains("--machine-id") && log.contains("not a UUID"),
        "{log}"
    );

    let braces = "{3B241101-E2BB-4255-8CAF-4136C566A962}";
    let mut good = AgentProcess::start(&d, braces, &machine.key_file, &dir.path().join("s2"));
    let mut operator = machine.operator;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let m = operator
            .get_machine(GetMachineRequest {
                machine_id: id.into(),
            })
            .await
            .unwrap()
            .into_inner();
        if m.last_heartbeat_unix_ms > 0 {
            break;
        }
        assert!(good.wait_exit(Duration::ZERO).is_none(), "{}", good.log());
        assert!(
            Instant::now() < deadline,
            "no heartbeat in 20 s:\n{}",
            good.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!good.log().contains("InvalidArgument"), "{}", good.log());
}

/// Item 8: every agent flag's variable is `BMAAS_AGENT_<FLAG>` (the log
/// flags too), every daemon flag's `METROPOLIS_<FLAG>`.
#[test]
fn one_variable_scheme_per_program() {
    let help = Command::new(agent_bin()).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    for variable in [
        "BMAAS_AGENT_LOG",
        "BMAAS_AGENT_LOG_FORMAT",
        "BMAAS_AGENT_MACHINE_ID",
    ] {
        assert!(
            text.contains(&format!("[env: {variable}=")),
            "{variable}:\n{text}"
        );
    }
    let variables = |text: &str| -> Vec<String> {
        text.split("[env: ")
            .skip(1)
            .filter_map(|rest| rest.split('=').next().map(str::to_owned))
            .collect()
    };
    for name in variables(&text) {
        assert!(
            name.starts_with("BMAAS_AGENT_"),
            "{name} in the agent's help"
        );
    }
    let help = Command::new(daemon_bin()).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    let names = variables(&text);
    assert!(names.len() > 30, "{names:?}");
    for name in names {
        assert!(
            name.starts_with("METROPOLIS_"),
            "{name} in the daemon's help"
        );
    }
    // The agent's log format from its own variable, not the daemon's.
    let run_agent = |var: &str| {
        run(Command::new(agent_bin())
            .args(["--endpoint", "127.0.0.1:1", "--machine-id"])
            .arg("3b241101-e2bb-4255-8caf-4136c566a962")
            .args(["--key", "/nonexistent/k", "--ca", "/nonexistent/c"])
            .args(["--state-dir", "/nonexistent/s"])
            .env_remove("BMAAS_AGENT_LOG_FORMAT")
            .env_remove("METROPOLIS_LOG_FORMAT")
            .env(var, "json"))
        .1
    };
    let json = run_agent("BMAAS_AGENT_LOG_FORMAT");
    assert!(json.lines().all(|l| l.starts_with('{')), "{json}");
    let text = run_agent("METROPOLIS_LOG_FORMAT");
    let last = text.lines().last().unwrap_or_default();
    assert!(last.starts_with("bmaas-agent: --key"), "{text}");
}

/// Item 8, server side: a second LoadImage of a name points to the flag
/// that lets it replace the image.
#[tokio::test(flavor = "multi_thread")]
async fn a_second_load_of_a_name_points_to_image_replace_tags() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_debug(&dir.path().join("data"), RuntimeKind::Tokio, &[]);
    let archive = metropolis_testkit::archives::docker_archive("example.test/x:1", "hello");
    let load = || async {
        let parts = vec![debug::ImagePart {
            data_part: archive.clone().into(),
        }];
        d.debug_client()
            .await
            .load_image(futures::stream::iter(parts))
            .await
            .map(|_| ())
    };
    load().await.unwrap();
    let e = load().await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::AlreadyExists, "{}", e.message());
    assert!(
        e.message()
            .contains("start the node with --image-replace-tags to replace it"),
        "{}",
        e.message()
    );
}

/// Item 9: `metropolisd man DIR` and `bmaas-agent man DIR` write man pages
/// of every flag, as `metroctl man DIR` does.
#[test]
fn both_programs_write_their_man_pages() {
    let dir = tempfile::tempdir().unwrap();
    for (bin, page, flag) in [
        (daemon_bin(), "metropolisd.1", "agent\\-listen"),
        (agent_bin(), "bmaas-agent.1", "machine\\-id"),
    ] {
        let out = Command::new(bin)
            .arg("man")
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = std::fs::read_to_string(dir.path().join(page)).unwrap();
        assert!(
            text.starts_with(".ie") || text.contains(".TH"),
            "{page}:\n{text}"
        );
        assert!(text.contains(flag), "{page} documents {flag}");
    }
}

/// A `--socket` inside a data directory that does not exist yet: the
/// daemon creates the data directory (and the socket's directory in it)
/// and serves on that socket, as it does on the default path; a socket
/// directory missing outside the data directory is still refused, naming
/// `--socket`, with nothing created.
#[test]
fn a_socket_inside_a_new_data_directory_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let socket = data.join("run").join("curator.sock");
    let log = dir.path().join("daemon.log");
    let mut child = serving(&data, &["--socket", socket.to_str().unwrap()], &log);
    metropolis_tests::serving_line(&mut child, &log);
    let listed = Command::new(daemon_bin().with_file_name("metroctl-under-test"))
        .args(["--socket", socket.to_str().unwrap(), "node", "list"])
        .output()
        .unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        listed.status.success(),
        "node list over {}: {}",
        socket.display(),
        String::from_utf8_lossy(&listed.stderr)
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(socket.parent().unwrap())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700, "the socket's directory is private");

    let other = dir.path().join("other");
    let outside = dir.path().join("missing").join("x.sock");
    let (code, stderr) = run(&mut daemon(
        &other,
        &["--socket", outside.to_str().unwrap()],
    ));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--socket"), "{stderr}");
    assert!(!other.exists() && !outside.parent().unwrap().exists());
}
