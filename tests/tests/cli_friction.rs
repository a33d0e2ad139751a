//! An operator's first hour with `metroctl` (issue 44, the metroctl side),
//! as a user runs it against real daemons: the exit status, the file left
//! or not, the flag named. One test per item; needs nothing but the
//! process and a temporary directory.

#![allow(clippy::unwrap_used)]

use std::io::Read as _;
use std::os::unix::fs::PermissionsExt as _;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use metropolis_tests::outcome::{exits, path, stderr, stdout};
use metropolis_tests::{Daemon, RuntimeKind, daemon_bin, free_port};

const MACHINE: &str = "3b241101-e2bb-4255-8caf-4136c566a962";

/// `metroctl` with `args` and the extra environment `env`, nothing else
/// (no --endpoint unless given).
fn metroctl_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(daemon_bin().with_file_name("metroctl-under-test"))
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn metroctl(args: &[&str]) -> Output {
    metroctl_env(args, &[])
}

/// Item 1: an owner-only command over the local socket fails with exit 4
/// and says what to run (`--endpoints HOST:PORT`, where the owner
/// credential is), and the help of every owner-only command says it
/// needs the owner over TLS.
#[test]
fn owner_only_commands_over_the_socket_say_what_to_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), RuntimeKind::Tokio);
    let data = path(&d.data_dir);
    let key = dir.path().join("agent.key");
    let out = metroctl(&[
        "--data-dir",
        data,
        "machine",
        "add",
        MACHINE,
        "--generate-key",
        path(&key),
    ]);
    let err = exits(&out, 4, "machine add over the socket");
    assert!(err.contains("--endpoints HOST:PORT"), "{err}");
    assert!(err.contains(&format!("{data}/owner")), "{err}");
    assert!(!key.exists(), "a refused call leaves no key file");
    for args in [
        &["node", "add", "--out", path(&dir.path().join("n1"))][..],
        &["snapshot", "save", path(&dir.path().join("backup"))],
        &["machine", "list"],
    ] {
        let mut all = vec!["--data-dir", data];
        all.extend_from_slice(args);
        let err = exits(&metroctl(&all), 4, &format!("{args:?}"));
        assert!(err.contains("--endpoints HOST:PORT"), "{args:?}: {err}");
    }
    // The same with --endpoints works.
    let out = d.metroctl(&["machine", "add", MACHINE, "--generate-key", path(&key)]);
    exits(&out, 0, "machine add over TLS");
    for args in [
        &["node", "add"][..],
        &["node", "rm"],
        &["machine", "add"],
        &["machine", "list"],
        &["machine", "show"],
        &["machine", "rm"],
        &["install", "request"],
        &["install", "status"],
        &["snapshot", "save"],
    ] {
        let mut all = args.to_vec();
        all.push("--help");
        let help = stdout(&metroctl(&all));
        assert!(
            help.contains("owner") && help.contains("--endpoints"),
            "{args:?} --help does not say it needs the owner over TLS:\n{help}"
        );
    }
}

/// Item 2: `machine add --generate-key FILE` writes the key only once the
/// curator registered it (a failed call leaves nothing, a retry works),
/// mode 0600; an existing FILE is refused before the call, naming
/// `--generate-key`. `kubeconfig -f FILE` the same, naming `-f/--file`,
/// and the node issues nothing for a refused FILE.
#[test]
fn key_and_kubeconfig_files_are_written_after_success() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_debug(&dir.path().join("d"), RuntimeKind::Tokio, &[]);
    let key = dir.path().join("agent.key");
    // The curator refuses the ID: no file.
    let out = d.metroctl(&["machine", "add", "not a uuid", "--generate-key", path(&key)]);
    assert!(!out.status.success(), "{}", stdout(&out));
    assert!(!key.exists(), "a failed call left {}", key.display());
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().contains("agent.key"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // The retry works.
    let out = d.metroctl(&["machine", "add", MACHINE, "--generate-key", path(&key)]);
    exits(&out, 0, "the retry");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(
        std::fs::read_to_string(&key)
            .unwrap()
            .contains("PRIVATE KEY")
    );
    // An existing file is refused before the call (the machine is not
    // added again: a second ID stays unknown).
    let other = "4c241101-e2bb-4255-8caf-4136c566a962";
    let out = d.metroctl(&["machine", "add", other, "--generate-key", path(&key)]);
    let err = exits(&out, 2, "an existing --generate-key file");
    assert!(
        err.contains("--generate-key") && err.contains("exists"),
        "{err}"
    );
    let out = d.metroctl(&["machine", "show", other]);
    exits(&out, 5, "the refused machine was never added");

    // kubeconfig -f: an existing file is refused before the call.
    let file = dir.path().join("alice.kubeconfig");
    std::fs::write(&file, "mine").unwrap();
    let issued = |d: &Daemon| d.log().matches("issued a debug kubeconfig").count();
    let before = issued(&d);
    let out = d.metroctl(&["kubeconfig", "--id", "alice", "-f", path(&file)]);
    let err = exits(&out, 2, "an existing -f file");
    assert!(err.contains("-f/--file"), "{err}");
    assert!(!err.contains("--generate-key"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "mine");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(issued(&d), before, "the node issued a credential anyway");
    std::fs::remove_file(&file).unwrap();
    let out = d.metroctl(&["kubeconfig", "--id", "alice", "-f", path(&file)]);
    exits(&out, 0, "kubeconfig -f to a new file");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(std::fs::read_to_string(&file).unwrap().contains("clusters"));
}

/// Item 5: the exit statuses of docs/cli.md: a bad flag value is 2 (also
/// with no daemon to answer: checked before connecting), credentials of
/// another cluster 4, nothing listening 3, not found 5.
#[test]
fn exit_statuses_follow_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let a = Daemon::start(&dir.path().join("a"), RuntimeKind::Tokio);
    let b = Daemon::start(&dir.path().join("b"), RuntimeKind::Tokio);
    let closed = format!("127.0.0.1:{}", free_port());
    let digest = "a".repeat(64);
    let usage: [&[&str]; 6] = [
        &[
            "install",
            "request",
            MACHINE,
            "--image",
            "ftp://x",
            "--root-device",
            "sda",
        ],
        &["machine", "add", MACHINE, "--agent-pubkey", "zz"],
        &["node", "rm", "not-an-id"],
        &["status", "set", "--external-address", "nowhere"],
        &[
            "install",
            "request",
            MACHINE,
            "--image",
            &format!("http://h/r@sha256:{digest}X"),
            "--root-device",
            "sda",
        ],
        &["load-image", "--chunk-size", "0", "x.tar"],
    ];
    for args in usage {
        // Against a live daemon and against a closed port: 2 either way.
        let out = a.metroctl(args);
        exits(&out, 2, &format!("{args:?}"));
        let mut all = vec!["--data-dir", path(&a.data_dir), "--endpoints", &closed];
        all.extend_from_slice(args);
        exits(
            &metroctl(&all),
            2,
            &format!("{args:?} with nothing listening"),
        );
    }
    let out = metroctl(&["--endpoints", "no-port", "node", "list"]);
    let err = exits(&out, 2, "--endpoints without a port");
    assert!(
        err.contains("--endpoints") && err.contains("HOST:PORT"),
        "{err}"
    );

    // B's owner credential at A: another cluster's CA.
    let out = metroctl(&[
        "--data-dir",
        path(&b.data_dir),
        "--endpoints",
        &a.addr,
        "node",
        "list",
    ]);
    let err = exits(&out, 4, "credentials of another cluster");
    assert!(err.contains("another cluster"), "{err}");
    // The same for watch (through the client library).
    let out = metroctl(&[
        "--data-dir",
        path(&b.data_dir),
        "--endpoints",
        &a.addr,
        "--timeout",
        "5",
        "watch",
        "nodes",
    ]);
    let err = exits(&out, 4, "watch with credentials of another cluster");
    assert!(err.contains("another cluster"), "{err}");

    let out = metroctl(&[
        "--data-dir",
        path(&a.data_dir),
        "--endpoints",
        &closed,
        "node",
        "list",
    ]);
    exits(&out, 3, "nothing listening");
    let out = a.metroctl(&["machine", "show", MACHINE]);
    exits(&out, 5, "an unknown machine");
    let out = metroctl(&["--help"]);
    assert!(
        stdout(&out).contains("4 permission denied"),
        "{}",
        stdout(&out)
    );
}

/// Item 6: errors at the lowest level: a host name resolves; TLS to a
/// plain port says so; a compressed tarball is refused before anything is
/// sent; a missing credential directory is named with its flag.
#[test]
fn errors_say_what_is_wrong_and_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_debug(&dir.path().join("d"), RuntimeKind::Tokio, &[]);
    let port = d.addr.rsplit_once(':').unwrap().1;
    let by_name = format!("localhost:{port}");
    let out = metroctl(&[
        "--data-dir",
        path(&d.data_dir),
        "--endpoints",
        &by_name,
        "node",
        "list",
    ]);
    exits(&out, 0, "--endpoints localhost:PORT");
    // The debug port is plain HTTP/2.
    let debug = d.debug_addr.clone().unwrap();
    let out = metroctl(&[
        "--data-dir",
        path(&d.data_dir),
        "--endpoints",
        &debug,
        "node",
        "list",
    ]);
    let err = exits(&out, 3, "TLS to the debug port");
    assert!(err.contains("does not speak TLS"), "{err}");
    assert!(
        !err.contains("InvalidContentType") || err.contains("debug port"),
        "{err}"
    );
    // Compressed tarballs: refused before connecting (nothing listens at
    // the debug endpoint given, and the status is still 2).
    let closed = format!("127.0.0.1:{}", free_port());
    for (magic, kind, tool) in [
        (&[0x1f_u8, 0x8b, 8, 0][..], "gzip", "gunzip"),
        (&[0x28, 0xb5, 0x2f, 0xfd, 0], "zstd", "unzstd"),
    ] {
        let file = dir.path().join(format!("image.tar.{kind}"));
        let mut bytes = magic.to_vec();
        bytes.resize(4096, 0);
        std::fs::write(&file, bytes).unwrap();
        let out = metroctl(&["--debug-endpoint", &closed, "load-image", path(&file)]);
        let err = exits(&out, 2, kind);
        assert!(
            err.contains(&format!("compressed ({kind})")) && err.contains(tool),
            "{err}"
        );
    }
    // A missing credential directory: named, with its flag.
    let missing = dir.path().join("no-such-credentials");
    let out = metroctl(&[
        "--endpoints",
        &d.addr,
        "--credentials",
        path(&missing),
        "node",
        "list",
    ]);
    let err = exits(&out, 2, "a missing --credentials");
    assert!(
        err.contains("--credentials") && err.contains(path(&missing)),
        "{err}"
    );
    assert!(!err.contains("node.pem:"), "{err}");
}

/// Item 7: `watch node ID` of a well-formed ID that does not exist says
/// so once on standard error, and keeps waiting.
#[test]
fn watching_an_absent_node_says_so_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), RuntimeKind::Tokio);
    let absent = "metropolis-0123456789abcdef0123456789abcdef";
    let mut child = Command::new(daemon_bin().with_file_name("metroctl-under-test"))
        .args(["--data-dir", path(&d.data_dir), "watch", "node", absent])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = err.read_to_string(&mut text);
        let _ = tx.send(text);
    });
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        child.try_wait().unwrap().is_none(),
        "watch ended instead of waiting"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let text = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(
        text.matches("does not exist").count(),
        1,
        "after {:?}: {text}",
        started.elapsed()
    );
    assert!(text.contains(absent), "{text}");
}

/// Item 8: help puts a command's own options before the global ones;
/// every environment variable is METROCTL_* (the old debug endpoint name
/// still read); tables have a header row; load-image prints the images it
/// loaded, and a second load of a taken name points at
/// --image-replace-tags.
#[test]
fn help_names_headers_and_hints() {
    let help = stdout(&metroctl(&["machine", "add", "--help"]));
    let own = help.find("--generate-key").unwrap();
    let global = help
        .find("Global options:")
        .unwrap_or_else(|| panic!("{help}"));
    let data_dir = help.find("--data-dir").unwrap();
    assert!(own < global && global < data_dir, "{help}");
    let top = stdout(&metroctl(&["--help"]));
    for text in [&help, &top] {
        assert!(text.contains("METROCTL_DEBUG_ENDPOINT"), "{text}");
        assert!(text.contains("METROCTL_DATA_DIR"), "{text}");
        assert!(!text.contains("METROPOLIS_"), "{text}");
    }

    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_debug(&dir.path().join("d"), RuntimeKind::Tokio, &[]);
    let debug = d.debug_addr.clone().unwrap();
    // The new name, and the old one as a fallback.
    for var in ["METROCTL_DEBUG_ENDPOINT", "METROPOLIS_DEBUG_ENDPOINT"] {
        let out = metroctl_env(&["logs", "--tail", "1"], &[(var, &debug)]);
        exits(&out, 0, var);
    }
    let out = metroctl_env(&["--data-dir", path(&d.data_dir), "node", "list"], &[]);
    let list = stdout(&out);
    assert!(list.starts_with("ID "), "{list}");
    let out = metroctl_env(
        &["node", "list"],
        &[("METROCTL_DATA_DIR", path(&d.data_dir))],
    );
    exits(&out, 0, "METROCTL_DATA_DIR");
    let out = metroctl_env(
        &["node", "list"],
        &[("METROPOLIS_DATA_DIR", path(&d.data_dir))],
    );
    exits(&out, 0, "METROPOLIS_DATA_DIR, the old name");
    let out = d.metroctl(&["machine", "list"]);
    assert!(stdout(&out).starts_with("MACHINE "), "{}", stdout(&out));
    let out = d.metroctl(&["logs", "--list"]);
    assert!(stdout(&out).starts_with("DN "), "{}", stdout(&out));

    let archive = dir.path().join("busybox.tar");
    std::fs::write(
        &archive,
        metropolis_testkit::archives::docker_archive("busybox:1.36", "one"),
    )
    .unwrap();
    let out = d.metroctl(&["load-image", path(&archive)]);
    exits(&out, 0, "load-image");
    assert!(
        stdout(&out).contains("docker.io/library/busybox:1.36"),
        "{}",
        stdout(&out)
    );
    // The same name, other content.
    std::fs::write(
        &archive,
        metropolis_testkit::archives::docker_archive("busybox:1.36", "two"),
    )
    .unwrap();
    let out = d.metroctl(&["load-image", path(&archive)]);
    let err = stderr(&out);
    assert!(!out.status.success(), "{}", stdout(&out));
    assert!(err.contains("--image-replace-tags"), "{err}");
}
