//! The README's tour, run as written against a fresh data directory with
//! the built binaries, so the README cannot drift from what works.
//!
//! What is run: the trial command at the top of the README (the first
//! indented `cargo run ... -p metropolisd` line), then every ` ```sh `
//! block of the "A short tour" section in order, line by line (a line
//! ending in `\` continues on the next), each through `bash` in the
//! temporary directory, each expected to exit 0. The rewriting is only
//! what a test must do on a shared machine:
//!
//! - `cargo run [-q] --release -p metropolisd|metroctl|bmaas-agent --` is
//!   the `*-under-test` binary next to [`daemon_bin`];
//! - the alias line (`alias metroctl='...'`) is applied to the lines that
//!   start with `metroctl `;
//! - the well-known ports 7835-7838 are free loopback ports (in the text,
//!   and for a daemon line that leaves one to its default, through
//!   `METROPOLIS_LISTEN`/`METROPOLIS_AGENT_LISTEN`, a value after a bare
//!   `--debug-listen`/`--metrics-listen`, and `METROCTL_DEBUG_ENDPOINT`);
//! - a daemon line runs in the background until the socket answers; a
//!   later daemon line stops the running daemon first (the README says
//!   to: one daemon per data directory);
//! - a line that says "Ctrl-C" runs for 3 s and must still be running
//!   (and have printed something);
//! - `./busybox.tar` is written first (a `docker save` archive of one tiny
//!   image), as the reader would bring one.
//!
//! Skipped: the README's test command (`sudo .ci/run`: root, the whole
//! suite), and the blocks the README marks with an HTML comment
//! `<!-- tour-test: skip: WHY -->` on the line before the fence: the
//! provisioning walk (a registry on 127.0.0.1:5000) and the 3-node
//! cluster (etcd, protoc; `tests/tests/three_node_script.rs` runs that
//! script). The test fails if the README has no tour or no trial command.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use metropolis_tests::{daemon_bin, free_port};

/// A ` ```sh ` block of the tour: its lines, or why it is skipped.
struct Block {
    lines: Vec<String>,
    skip: Option<String>,
}

/// The README's trial command and the blocks of its tour section.
fn parse_readme(text: &str) -> (String, Vec<Block>) {
    let trial = text
        .lines()
        .take_while(|l| !l.starts_with("## "))
        .find(|l| l.starts_with("    cargo run") && l.contains("-p metropolisd"))
        .expect("the README starts with the trial command, indented")
        .trim()
        .to_string();
    let start = text.find("## A short tour").expect("the README has a tour");
    let rest = &text[start + 3..];
    let section = &rest[..rest.find("\n## ").unwrap_or(rest.len())];
    let mut blocks = Vec::new();
    let mut previous = "";
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        if line.trim() == "```sh" {
            let skip = previous
                .trim()
                .strip_prefix("<!-- tour-test: skip:")
                .map(|why| why.trim_end_matches("-->").trim().to_string());
            let mut body = Vec::new();
            let mut pending = String::new();
            for l in lines.by_ref() {
                if l.trim() == "```" {
                    break;
                }
                match l.strip_suffix('\\') {
                    Some(head) => {
                        pending.push_str(head);
                        pending.push(' ');
                    }
                    None => {
                        pending.push_str(l);
                        let full = std::mem::take(&mut pending);
                        if !full.trim().is_empty() {
                            body.push(full.trim().to_string());
                        }
                    }
                }
            }
            blocks.push(Block { lines: body, skip });
        }
        if !line.trim().is_empty() {
            previous = line;
        }
    }
    (trial, blocks)
}

/// The tour's ports, each a free loopback port.
struct Ports([(u16, u16); 4]);

impl Ports {
    fn new() -> Ports {
        Ports([7835, 7836, 7837, 7838].map(|p| (p, free_port())))
    }

    fn get(&self, wellknown: u16) -> u16 {
        self.0.iter().find(|(w, _)| *w == wellknown).unwrap().1
    }

    fn rewrite(&self, line: &str) -> String {
        let mut out = line.to_string();
        for (wellknown, free) in self.0 {
            out = out.replace(&format!(":{wellknown}"), &format!(":{free}"));
        }
        out
    }
}

/// The binaries under test in place of `cargo run ... -p NAME --`.
fn with_binaries(line: &str) -> String {
    let mut out = line.to_string();
    for (package, binary) in [
        ("metropolisd", "metropolisd-under-test"),
        ("metroctl", "metroctl-under-test"),
        ("bmaas-agent", "bmaas-agent-under-test"),
    ] {
        let path = daemon_bin().with_file_name(binary).display().to_string();
        for form in [
            format!("cargo run -q --release -p {package} --"),
            format!("cargo run --release -p {package} --"),
            format!("cargo run -q -p {package} --"),
            format!("cargo run -p {package} --"),
        ] {
            out = out.replace(&form, &path);
        }
    }
    out
}

/// A daemon line with a value after each bare listen switch.
fn with_listen_values(line: &str, ports: &Ports) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut out: Vec<String> = Vec::new();
    for (i, word) in words.iter().enumerate() {
        out.push(word.to_string());
        let bare = words.get(i + 1).is_none_or(|next| next.starts_with('-'));
        match *word {
            "--debug-listen" if bare => out.push(format!("127.0.0.1:{}", ports.get(7837))),
            "--metrics-listen" if bare => out.push(format!("127.0.0.1:{}", ports.get(7838))),
            _ => {}
        }
    }
    out.join(" ")
}

/// A daemon started by a line of the tour; killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Tour {
    dir: PathBuf,
    ports: Ports,
    alias: Option<String>,
    daemon: Option<Running>,
    ran: Vec<String>,
}

impl Tour {
    fn bash(&self, line: &str) -> Command {
        let mut cmd = Command::new("bash");
        cmd.arg("-c")
            .arg(line)
            .current_dir(&self.dir)
            .env(
                "METROCTL_DEBUG_ENDPOINT",
                format!("127.0.0.1:{}", self.ports.get(7837)),
            )
            .env(
                "METROPOLIS_LISTEN",
                format!("127.0.0.1:{}", self.ports.get(7835)),
            )
            .env(
                "METROPOLIS_AGENT_LISTEN",
                format!("127.0.0.1:{}", self.ports.get(7836)),
            )
            .stdin(Stdio::null());
        cmd
    }

    fn start_daemon(&mut self, line: &str) {
        if let Some(old) = self.daemon.take() {
            drop(old);
        }
        let log = std::fs::File::create(self.dir.join("daemon.log")).unwrap();
        let child = self
            .bash(&format!("exec {}", with_listen_values(line, &self.ports)))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.daemon = Some(Running(child));
        let socket = self.dir.join("metropolis-data/curator.sock");
        let ctl = daemon_bin().with_file_name("metroctl-under-test");
        let started = Instant::now();
        loop {
            let ok = Command::new(&ctl)
                .args(["--socket", socket.to_str().unwrap(), "node", "list"])
                .output()
                .is_ok_and(|o| o.status.success());
            if ok {
                break;
            }
            let log = std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default();
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the tour's daemon `{line}` did not answer within 30 s:\n{log}"
            );
            if let Some(Running(child)) = self.daemon.as_mut() {
                assert!(
                    child.try_wait().unwrap().is_none(),
                    "the tour's daemon `{line}` exited:\n{log}"
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.ran.push(line.to_string());
    }

    fn run(&mut self, readme_line: &str) {
        if let Some(value) = readme_line
            .strip_prefix("alias metroctl='")
            .and_then(|v| v.strip_suffix('\''))
        {
            self.alias = Some(with_binaries(value));
            return;
        }
        let mut line = with_binaries(&self.ports.rewrite(readme_line));
        if let (Some(alias), Some(rest)) = (&self.alias, line.strip_prefix("metroctl ")) {
            line = format!("{alias} {rest}");
        }
        let daemon = daemon_bin().display().to_string();
        if line.starts_with(&daemon) {
            return self.start_daemon(&line);
        }
        if readme_line.contains("Ctrl-C") {
            let out = self.bash(&format!("timeout 3 {line}")).output().unwrap();
            assert_eq!(
                out.status.code(),
                Some(124),
                "`{readme_line}` should run until interrupted: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(!out.stdout.is_empty(), "`{readme_line}` printed nothing");
        } else {
            let out = self.bash(&line).output().unwrap();
            assert!(
                out.status.success(),
                "README tour line `{readme_line}` (run as `{line}`) failed with {}:\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        self.ran.push(readme_line.to_string());
    }
}

#[test]
fn the_readme_tour_works_as_written() {
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let text = std::fs::read_to_string(&readme).unwrap();
    let (trial, blocks) = parse_readme(&text);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("busybox.tar"),
        metropolis_testkit::archives::docker_archive("busybox:latest", "tour"),
    )
    .unwrap();
    let mut tour = Tour {
        dir: dir.path().to_path_buf(),
        ports: Ports::new(),
        alias: None,
        daemon: None,
        ran: Vec::new(),
    };
    tour.run(&trial);
    let mut skipped = Vec::new();
    for block in &blocks {
        if let Some(why) = &block.skip {
            skipped.push(why.clone());
            continue;
        }
        for line in &block.lines {
            tour.run(line);
        }
    }
    assert!(
        tour.ran.len() >= 8,
        "the tour ran only {:?} (skipped: {skipped:?})",
        tour.ran
    );
    assert!(
        tour.ran.iter().any(|l| l.contains("node add")),
        "{:?}",
        tour.ran
    );
    // What the tour writes lands in the reader's checkout when run from
    // there: every file it left, and every `./NAME` its blocks (skipped
    // ones too) write, is ignored by the checkout's .gitignore.
    let mut written: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    for block in &blocks {
        for line in &block.lines {
            written.extend(dot_slash_names(line));
        }
    }
    // The reader brings busybox.tar; daemon.log is this test's own.
    written.retain(|name| name != "busybox.tar" && name != "daemon.log");
    written.sort();
    written.dedup();
    assert!(
        written.iter().any(|n| n == "metropolis-data"),
        "{written:?}"
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let not_ignored: Vec<&String> = written
        .iter()
        .filter(|name| {
            !Command::new("git")
                .current_dir(&root)
                .args(["check-ignore", "--no-index", "-q", name.as_str()])
                .status()
                .unwrap()
                .success()
        })
        .collect();
    assert!(
        not_ignored.is_empty(),
        "the tour writes {not_ignored:?} into the checkout, which .gitignore does not cover"
    );
}

/// The `NAME` of each `./NAME` in `line` (a path the tour writes or reads
/// relative to where it runs).
fn dot_slash_names(line: &str) -> Vec<String> {
    line.split(|c: char| c.is_whitespace() || matches!(c, '=' | '\'' | '"'))
        .filter_map(|word| word.strip_prefix("./"))
        .map(|rest| rest.split('/').next().unwrap_or_default().to_string())
        .filter(|name| !name.is_empty())
        .collect()
}

#[test]
fn blocks_marked_to_skip_are_skipped_and_lines_joined() {
    let text = "# x\n\n    cargo run --release -p metropolisd -- --data-dir d\n\n\
        ## A short tour\n\n```sh\nmetroctl a \\\n    b\n```\n\n\
        <!-- tour-test: skip: needs a registry -->\n```sh\nmetroctl c\n```\n\n## Next\n\n\
        ```sh\nnot in the tour\n```\n";
    let (trial, blocks) = parse_readme(text);
    assert_eq!(trial, "cargo run --release -p metropolisd -- --data-dir d");
    assert_eq!(blocks.len(), 2);
    assert_eq!(blocks[0].lines, vec!["metroctl a      b"]);
    assert_eq!(blocks[0].skip, None);
    assert_eq!(blocks[1].skip.as_deref(), Some("needs a registry"));
    let ports = Ports::new();
    let line = with_listen_values("d --debug-listen --metrics-listen", &ports);
    assert_eq!(
        line,
        format!(
            "d --debug-listen 127.0.0.1:{} --metrics-listen 127.0.0.1:{}",
            ports.get(7837),
            ports.get(7838)
        )
    );
}
