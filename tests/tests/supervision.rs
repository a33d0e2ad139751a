//! The daemon under a service manager, as systemd runs it: `READY=1` on
//! the `NOTIFY_SOCKET` only once every listener accepts, `WATCHDOG=1`
//! pings at half of `WATCHDOG_USEC`, `STOPPING=1` at SIGTERM; and its
//! logs as `--log-format json`, one JSON object per line.

#![allow(clippy::unwrap_used)]

use std::os::unix::net::{UnixDatagram, UnixStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use metropolis_tests::{RuntimeKind, against_both_runtimes, daemon_bin, free_port};

/// The next datagram on `socket`, as text.
fn next(socket: &UnixDatagram) -> String {
    let mut buf = [0u8; 512];
    let len = socket.recv(&mut buf).expect("a notification within 30 s");
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

async fn notifies_ready_watchdog_and_stopping(runtime: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let notify_path = dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let (listen, agent) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let log = dir.path().join("daemon.log");
    let mut child = Command::new(daemon_bin())
        .arg("--data-dir")
        .arg(&data)
        .args(["--listen", &listen, "--agent-listen", &agent])
        .args(["--runtime", &runtime.to_string(), "--log-format", "json"])
        .env("NOTIFY_SOCKET", &notify_path)
        .env("WATCHDOG_USEC", "200000")
        .env_remove("WATCHDOG_PID")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();

    // READY=1 first, and only once every listener accepts.
    assert_eq!(next(&notify), "READY=1\nSTATUS=serving");
    std::net::TcpStream::connect(&listen).expect("the TLS listener accepts at READY=1");
    std::net::TcpStream::connect(&agent).expect("the agent listener accepts at READY=1");
    UnixStream::connect(data.join("curator.sock")).expect("the local socket accepts at READY=1");

    // Keep-alives at half the watchdog interval.
    let started = Instant::now();
    for _ in 0..3 {
        assert_eq!(next(&notify), "WATCHDOG=1");
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "3 keep-alives took {took:?}");

    // SIGTERM: STOPPING=1, then a clean exit.
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    loop {
        match next(&notify).as_str() {
            "WATCHDOG=1" => continue,
            other => {
                assert_eq!(other, "STOPPING=1");
                break;
            }
        }
    }
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "{status}");

    // Every line of the log is one JSON object with tracing's fields.
    let text = std::fs::read_to_string(&log).unwrap();
    let mut messages = Vec::new();
    for line in text.lines() {
        let value: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        for key in ["timestamp", "level", "target"] {
            assert!(value[key].is_string(), "no {key} in {line}");
        }
        let message = value["fields"]["message"].as_str().unwrap_or_default();
        messages.push(message.to_owned());
    }
    for expected in ["curator serving", "shutting down", "stopped"] {
        assert!(
            messages.iter().any(|m| m == expected),
            "no {expected:?} in {messages:?}"
        );
    }
    let serving = text
        .lines()
        .find(|l| l.contains("curator serving"))
        .unwrap();
    let serving: serde_json::Value = serde_json::from_str(serving).unwrap();
    assert_eq!(serving["fields"]["listen"], listen.as_str(), "{serving}");
    assert_eq!(serving["level"], "INFO");
}

/// Without `NOTIFY_SOCKET` the daemon notifies nothing and logs text.
#[tokio::test]
async fn text_logs_without_colours_when_not_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = metropolis_tests::Daemon::start(&dir.path().join("data"), RuntimeKind::Tokio);
    let log = d.log_once_it_holds("curator serving");
    assert!(log.contains("curator serving"), "{log}");
    assert!(
        !log.contains('\u{1b}'),
        "escape codes in a log file:\n{log}"
    );
    assert!(serde_json::from_str::<serde_json::Value>(log.lines().next().unwrap()).is_err());
    d.terminate();
}

against_both_runtimes!(notifies_ready_watchdog_and_stopping);

/// The `ExecStart=` of a unit file of `deploy/systemd/`, split into words
/// (the units quote nothing), and the unit's text.
fn exec_start(unit: &str) -> (Vec<String>, String) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/systemd")
        .join(unit);
    let text = std::fs::read_to_string(&path).unwrap();
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .unwrap_or_else(|| panic!("{unit} has no ExecStart="));
    (line.split_whitespace().map(String::from).collect(), text)
}

/// The shipped unit files start the binaries with flags they accept, and
/// the daemon's unit waits for its READY=1.
#[test]
fn the_unit_files_start_the_binaries_with_flags_they_accept() {
    use clap::Parser;
    let (args, text) = exec_start("metropolisd.service");
    assert!(args[0].ends_with("/metropolisd"), "{args:?}");
    let config = metropolis_node::daemon::Config::try_parse_from(&args)
        .unwrap_or_else(|e| panic!("metropolisd.service: {e}"));
    assert_eq!(
        config.data_dir,
        std::path::Path::new("/var/lib/metropolis"),
        "the data directory is the unit's StateDirectory"
    );
    assert!(text.contains("StateDirectory=metropolis\n"));
    for line in ["Type=notify", "WatchdogSec="] {
        assert!(text.contains(line), "metropolisd.service lacks {line}");
    }
    let (args, text) = exec_start("bmaas-agent.service");
    assert!(args[0].ends_with("/bmaas-agent"), "{args:?}");
    let agent = bmaas_agent::AgentArgs::try_parse_from(&args)
        .unwrap_or_else(|e| panic!("bmaas-agent.service: {e}"));
    assert_eq!(
        agent.state_dir,
        std::path::Path::new("/var/lib/bmaas-agent")
    );
    assert!(text.contains("StateDirectory=bmaas-agent\n"));
    for line in ["Type=notify", "WatchdogSec="] {
        assert!(text.contains(line), "bmaas-agent.service lacks {line}");
    }
}

/// `bmaas-agent` under a service manager: `READY=1` once it has read its
/// key, CA and state (it needs no curator for that), then `WATCHDOG=1`
/// pings at half `WATCHDOG_USEC`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_notifies_ready_and_pings_the_watchdog() {
    let dir = tempfile::tempdir().unwrap();
    let d = metropolis_tests::Daemon::start(&dir.path().join("d"), RuntimeKind::Tokio);
    let machine = "3b241101-e2bb-4255-8caf-4136c566a962";
    let enrolled = d.enroll_machine(machine, dir.path()).await;
    let notify_path = dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut agent = Command::new(daemon_bin().with_file_name("bmaas-agent-under-test"))
        .args(["--endpoint", &d.agent_addr, "--machine-id", machine])
        .arg("--key")
        .arg(&enrolled.key_file)
        .arg("--ca")
        .arg(d.data_dir.join("pki/ca.pem"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .env("NOTIFY_SOCKET", &notify_path)
        .env("WATCHDOG_USEC", "200000")
        .env_remove("WATCHDOG_PID")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert_eq!(next(&notify), "READY=1\nSTATUS=heartbeating");
    let started = Instant::now();
    for _ in 0..3 {
        assert_eq!(next(&notify), "WATCHDOG=1");
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "3 keep-alives took {took:?}");
    agent.kill().unwrap();
    agent.wait().unwrap();
}
