//! Credential and CA files of `metropolis_pki`: modes, round trips,
//! errors that name the file at fault, and the writes that must not
//! replace anything (`Credentials::write_new_to_dir`, `write_new_file`
//! refuse a target that exists and leave every file as it was).

#![allow(clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use metropolis_core::identity::{Identity, NodeId};
use metropolis_pki::{ClusterCa, Credentials, PkiError, write_new_file};

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn credentials_round_trip_with_private_key_mode_0600() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ClusterCa::generate().unwrap();
    let (creds, id) = ca.issue_node(&[]).unwrap();
    // A key file left world-readable by someone else is replaced by one of mode 0600.
    fs::write(dir.path().join("node-key.pem"), "old").unwrap();
    fs::set_permissions(
        dir.path().join("node-key.pem"),
        fs::Permissions::from_mode(0o644),
    )
    .unwrap();

    creds.write_to_dir(dir.path(), "node").unwrap();
    assert_eq!(
        names(dir.path()),
        ["ca.pem", "node-key.pem", "node.pem"],
        "no temporary files left"
    );
    assert_eq!(mode(&dir.path().join("node-key.pem")), 0o600);
    assert_eq!(mode(&dir.path().join("node.pem")), 0o644);
    assert_eq!(mode(&dir.path().join("ca.pem")), 0o644);

    let read = Credentials::read_from_dir(dir.path(), "node").unwrap();
    assert_eq!(read, creds);
    assert_eq!(
        NodeId::from_public_key(&read.ed25519_public_key().unwrap()),
        id
    );
    assert_eq!(read.identity().unwrap(), Identity::Node(id));
    assert_eq!(read.ca_der().unwrap(), ca.cert_der());

    let owner = ca.issue_owner().unwrap();
    owner.write_to_dir(dir.path(), "owner").unwrap();
    assert_eq!(mode(&dir.path().join("owner-key.pem")), 0o600);
    assert_eq!(
        Credentials::read_from_dir(dir.path(), "owner")
            .unwrap()
            .identity()
            .unwrap(),
        Identity::Owner
    );
    assert!(
        !format!("{owner:?}").contains(&owner.key_pem),
        "Debug shows no key"
    );
}

#[test]
fn ca_round_trip_with_private_key_mode_0600() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ClusterCa::generate().unwrap();
    ca.write_to_dir(dir.path()).unwrap();
    assert_eq!(names(dir.path()), ["ca-key.pem", "ca.pem"]);
    assert_eq!(mode(&dir.path().join("ca-key.pem")), 0o600);
    assert_eq!(mode(&dir.path().join("ca.pem")), 0o644);
    let read = ClusterCa::read_from_dir(dir.path()).unwrap();
    assert_eq!(read.cert_pem(), ca.cert_pem());
    assert_eq!(read.key_pem(), ca.key_pem());
    assert!(
        !format!("{read:?}").contains(&ca.key_pem()),
        "Debug shows no key"
    );

    // Credentials issued by the reloaded CA are valid under the original.
    let (creds, _) = read.issue_node(&[]).unwrap();
    Credentials::from_parts(creds.cert_pem, creds.key_pem, ca.cert_pem())
        .validate()
        .unwrap();
}

#[test]
fn missing_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let err = Credentials::read_from_dir(dir.path(), "node").unwrap_err();
    let path = dir.path().join("node.pem");
    assert!(
        matches!(&err, PkiError::Io { path: p, .. } if *p == path),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .starts_with(&format!("{}: cannot read: ", path.display())),
        "{err}"
    );
    assert!(std::error::Error::source(&err).is_some());

    let err = ClusterCa::read_from_dir(dir.path()).unwrap_err();
    assert!(
        err.to_string().starts_with(&format!(
            "{}: cannot read: ",
            dir.path().join("ca.pem").display()
        )),
        "{err}"
    );
}

/// Writes good credentials to `dir` under `node`, then replaces `file` with
/// `contents` and returns the error reading them gives.
fn read_with(file: &str, contents: &[u8]) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let ca = ClusterCa::generate().unwrap();
    ca.issue_node(&[])
        .unwrap()
        .0
        .write_to_dir(dir.path(), "node")
        .unwrap();
    fs::write(dir.path().join(file), contents).unwrap();
    let err = Credentials::read_from_dir(dir.path(), "node").unwrap_err();
    (dir, err.to_string())
}

#[test]
fn garbled_files_are_named() {
    let (dir, msg) = read_with("node-key.pem", b"garbage");
    assert_eq!(
        msg,
        format!(
            "{}: no PEM private key found",
            dir.path().join("node-key.pem").display()
        )
    );

    let (dir, msg) = read_with("node.pem", b"garbage");
    assert_eq!(
        msg,
        format!(
            "{}: no PEM certificate found",
            dir.path().join("node.pem").display()
        )
    );

    let (dir, msg) = read_with("ca.pem", b"-----BEGIN CERTIFICATE-----\nAAAA\n");
    assert!(
        msg.starts_with(&format!(
            "{}: garbled PEM: ",
            dir.path().join("ca.pem").display()
        )),
        "{msg}"
    );

    let (dir, msg) = read_with(
        "node.pem",
        b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    );
    assert!(
        msg.starts_with(&format!("{}: ", dir.path().join("node.pem").display())),
        "{msg}"
    );

    let (dir, msg) = read_with("node-key.pem", &[0xff, 0xfe, 0x00]);
    assert_eq!(
        msg,
        format!(
            "{}: not a PEM file (not UTF-8 text)",
            dir.path().join("node-key.pem").display()
        )
    );

    // Other files in the directory do not matter.
    let dir = tempfile::tempdir().unwrap();
    let ca = ClusterCa::generate().unwrap();
    ca.issue_node(&[])
        .unwrap()
        .0
        .write_to_dir(dir.path(), "node")
        .unwrap();
    fs::write(dir.path().join("ca-key.pem"), "unrelated").unwrap();
    Credentials::read_from_dir(dir.path(), "node").unwrap();
}

#[test]
fn mismatched_files_are_named() {
    let ca = ClusterCa::generate().unwrap();
    let (other_node, _) = ca.issue_node(&[]).unwrap();
    let (dir, msg) = read_with("node-key.pem", other_node.key_pem.as_bytes());
    let key = dir.path().join("node-key.pem");
    let cert = dir.path().join("node.pem");
    assert_eq!(
        msg,
        format!(
            "{}: the private key does not belong to the certificate in {}",
            key.display(),
            cert.display()
        )
    );

    let (dir, msg) = read_with("ca.pem", ca.cert_pem().as_bytes());
    let cert = dir.path().join("node.pem");
    let ca_path = dir.path().join("ca.pem");
    assert!(
        msg.starts_with(&format!(
            "{}: not a client certificate issued by the CA certificate in {}: ",
            cert.display(),
            ca_path.display()
        )),
        "{msg}"
    );
}

#[test]
fn inconsistent_credentials_are_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ClusterCa::generate().unwrap();
    let (a, _) = ca.issue_node(&[]).unwrap();
    let (b, _) = ca.issue_node(&[]).unwrap();
    let mixed = Credentials::from_parts(a.cert_pem, b.key_pem, a.ca_pem);
    let err = mixed.write_to_dir(dir.path(), "node").unwrap_err();
    assert_eq!(
        err.to_string(),
        "private key PEM: the private key does not belong to the certificate in certificate PEM"
    );
    assert!(names(dir.path()).is_empty());
}

#[test]
fn prefixes_that_escape_the_directory_or_clobber_the_ca_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ClusterCa::generate().unwrap();
    let (creds, _) = ca.issue_node(&[]).unwrap();
    for prefix in ["", "ca", "ca-key", "../node", "a/b", ".."] {
        let err = creds.write_to_dir(dir.path(), prefix).unwrap_err();
        assert!(
            err.to_string()
                .starts_with(&format!("credential file prefix {prefix:?}: must")),
            "{err}"
        );
        assert!(Credentials::read_from_dir(dir.path(), prefix).is_err());
    }
    assert!(names(dir.path()).is_empty());
}

#[test]
fn writing_into_a_missing_directory_creates_it_owner_only() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing/deeper");
    let ca = ClusterCa::generate().unwrap();
    ca.write_to_dir(&missing).unwrap();
    let mode = std::fs::metadata(&missing).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    ClusterCa::read_from_dir(&missing).unwrap();
}

#[test]
fn writing_under_a_file_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let ca = ClusterCa::generate().unwrap();
    let err = ca.write_to_dir(&file.join("sub")).unwrap_err();
    assert!(
        err.to_string().contains(&file.display().to_string()),
        "{err}"
    );
}

#[test]
fn types_can_be_shared_across_threads() {
    fn check<T: Send + Sync + 'static>() {}
    check::<ClusterCa>();
    check::<Credentials>();
    check::<PkiError>();
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
