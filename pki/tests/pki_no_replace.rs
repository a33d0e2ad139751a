//! Writing credentials that must not replace anything:
//! `Credentials::write_new_to_dir` and `write_new_file` refuse a target
//! that exists and leave it, and every other file, as it was.

#![allow(clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use metropolis_pki::{ClusterCa, PkiError, write_new_file};

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn new_credentials_go_into_a_new_directory_with_their_modes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("n1");
    let ca = ClusterCa::generate().unwrap();
    let (creds, _) = ca.issue_node(&[]).unwrap();
    creds.write_new_to_dir(&out, "node").unwrap();
    assert_eq!(names(&out), ["ca.pem", "node-key.pem", "node.pem"]);
    let mode = |name: &str| fs::metadata(out.join(name)).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode("node-key.pem"), 0o600);
    assert_eq!(mode("node.pem"), 0o644);
    assert_eq!(
        fs::metadata(&out).unwrap().permissions().mode() & 0o777,
        0o700
    );
}

#[test]
fn an_existing_key_is_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("node-key.pem"), "the old node's key").unwrap();
    let ca = ClusterCa::generate().unwrap();
    let (creds, _) = ca.issue_node(&[]).unwrap();
    let err = creds.write_new_to_dir(dir.path(), "node").unwrap_err();
    assert!(
        matches!(&err, PkiError::Io { path, .. } if path.ends_with("node-key.pem")),
        "{err}"
    );
    assert_eq!(names(dir.path()), ["node-key.pem"], "nothing else written");
    assert_eq!(
        fs::read_to_string(dir.path().join("node-key.pem")).unwrap(),
        "the old node's key"
    );
    // Only ca.pem there: refused too, the CA certificate kept.
    let other = tempfile::tempdir().unwrap();
    fs::write(other.path().join("ca.pem"), "another CA").unwrap();
    assert!(creds.write_new_to_dir(other.path(), "node").is_err());
    assert_eq!(names(other.path()), ["ca.pem"]);
    assert_eq!(
        fs::read_to_string(other.path().join("ca.pem")).unwrap(),
        "another CA"
    );
}

#[test]
fn write_new_file_never_replaces_and_leaves_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.key");
    write_new_file(&path, b"first", 0o600).unwrap();
    let err = write_new_file(&path, b"second", 0o600).unwrap_err();
    assert!(err.to_string().contains("agent.key"), "{err}");
    assert_eq!(fs::read(&path).unwrap(), b"first");
    assert_eq!(names(dir.path()), ["agent.key"], "no temporary file left");
    // A dangling symbolic link counts as taken: nothing is written through it.
    let link = dir.path().join("link.key");
    std::os::unix::fs::symlink(dir.path().join("nowhere"), &link).unwrap();
    assert!(write_new_file(&link, b"x", 0o600).is_err());
    assert!(!dir.path().join("nowhere").exists());
}
