//! The daemon commands the README and the docs show bind what they mean
//! to: each `metropolisd` (or `cargo run -p metropolisd`) command in a
//! code block that starts a daemon names `--listen` and `--agent-listen`
//! with an address, never every interface (`0.0.0.0`, `[::]`, which are
//! the flags' defaults), and no listener is put on every interface. A
//! reader who copies a command gets loopback on one machine, or the
//! machine's own address in a multi-host example. Needs nothing but the
//! checkout.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

/// README.md, docs/**/*.md and each crate's README.md.
fn documents() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    for entry in std::fs::read_dir(&root).unwrap() {
        let readme = entry.unwrap().path().join("README.md");
        if readme.is_file() {
            out.push(readme);
        }
    }
    out
}

/// The commands in `text`'s fenced code blocks and indented lines, with
/// lines ending in `\` joined to the next.
fn commands(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_block = false;
    let mut pending = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if !in_block && !line.starts_with("    ") {
            continue;
        }
        let line = line.trim();
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(line);
        out.push(std::mem::take(&mut pending));
    }
    out
}

/// Whether `command` starts the daemon (not `--help`, `--version` or a
/// subcommand such as `man`).
fn starts_daemon(command: &str) -> bool {
    let words: Vec<&str> = command.split_whitespace().collect();
    let at = words
        .iter()
        .position(|w| *w == "metropolisd")
        .and_then(|i| {
            let cargo = i >= 1 && words[i - 1] == "-p";
            // `metropolisd` as the program (first word, after sudo), or the
            // package of `cargo run`, whose arguments follow `--`.
            if cargo {
                words.iter().position(|w| *w == "--").map(|d| d + 1)
            } else if i == 0 || (i == 1 && words[0] == "sudo") {
                Some(i + 1)
            } else {
                None
            }
        });
    let Some(at) = at else { return false };
    let args = &words[at.min(words.len())..];
    !args
        .iter()
        .any(|w| matches!(*w, "--help" | "-h" | "--version" | "-V" | "man"))
}

/// The value of `flag` in `command` (`--flag VALUE` or `--flag=VALUE`).
fn value<'a>(command: &'a str, flag: &str) -> Option<&'a str> {
    let words: Vec<&str> = command.split_whitespace().collect();
    words.iter().enumerate().find_map(|(i, w)| {
        if *w == flag {
            words.get(i + 1).copied().filter(|v| !v.starts_with('-'))
        } else {
            w.strip_prefix(flag).and_then(|v| v.strip_prefix('='))
        }
    })
}

/// Why `command` (a daemon start) binds more than it should, if it does.
fn fault(command: &str) -> Option<String> {
    for flag in ["--listen", "--agent-listen"] {
        match value(command, flag) {
            None => return Some(format!("no {flag} (its default is every interface)")),
            Some(v) if v.starts_with("0.0.0.0") || v.starts_with("[::]") => {
                return Some(format!("{flag} {v} is every interface"));
            }
            Some(_) => {}
        }
    }
    for flag in ["--debug-listen", "--metrics-listen"] {
        if let Some(v) = value(command, flag)
            && (v.starts_with("0.0.0.0") || v.starts_with("[::]"))
        {
            return Some(format!("{flag} {v} is every interface"));
        }
    }
    None
}

#[test]
fn every_daemon_command_in_the_docs_binds_an_address() {
    let mut starts = 0;
    let mut faults = Vec::new();
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        for command in commands(&text).into_iter().filter(|c| starts_daemon(c)) {
            starts += 1;
            if let Some(why) = fault(&command) {
                faults.push(format!("{}: {why}: {command}", doc.display()));
            }
        }
    }
    assert!(starts >= 5, "found only {starts} daemon commands");
    assert!(faults.is_empty(), "{}", faults.join("\n"));
}

#[test]
fn the_check_tells_a_wildcard_and_a_missing_flag() {
    let text = "```sh\nmetropolisd --data-dir d \\\n    --listen 0.0.0.0:7835 --agent-listen 127.0.0.1:1\n\
                cargo run --release -p metropolisd -- --data-dir d --listen 127.0.0.1:1\n\
                sudo metropolisd man /tmp\nmetroctl node list\n```\n";
    let found: Vec<String> = commands(text)
        .into_iter()
        .filter(|c| starts_daemon(c))
        .collect();
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(
        fault(&found[0]).unwrap(),
        "--listen 0.0.0.0:7835 is every interface"
    );
    assert_eq!(
        fault(&found[1]).unwrap(),
        "no --agent-listen (its default is every interface)"
    );
    assert_eq!(
        fault("metropolisd --listen 127.0.0.1:1 --agent-listen=127.0.0.1:2"),
        None
    );
}
