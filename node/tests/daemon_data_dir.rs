//! The data directory at start: created owner-only when missing (with its
//! parents), and refused, naming `--data-dir` and with the exit status of
//! the cause, when it is a file, lies under one, or may not be created.
//! Nothing in it is written then.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use metropolis_node::daemon::{Config, DaemonError, Layout, NodePki};
use metropolis_node::exit::{Exit, status_of};

fn config(data_dir: &Path) -> Config {
    Config::new(data_dir, SocketAddr::from(([127, 0, 0, 1], 0)))
}

fn refused(data_dir: &Path) -> DaemonError {
    match NodePki::load_or_create(&config(data_dir)) {
        Ok(_) => panic!("{}: accepted", data_dir.display()),
        Err(e) => e,
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn a_missing_data_directory_is_created_owner_only_with_its_parents() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("a").join("b").join("data");
    NodePki::load_or_create(&config(&data)).unwrap();
    assert!(data.is_dir());
    assert_eq!(mode(&data), 0o700);
    assert_eq!(mode(&dir.path().join("a")), 0o700);
    let layout = Layout::new(&data);
    assert_eq!(layout.pki, data.join("pki"));
    assert_eq!(layout.owner, data.join("owner"));
    assert_eq!(layout.store, data.join("store"));
}

#[test]
fn an_existing_data_directory_keeps_its_mode() {
    // An operator's choice (e.g. 0750 for a group that reads the owner
    // credential) is not tightened behind their back.
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o750)).unwrap();
    NodePki::load_or_create(&config(&data)).unwrap();
    assert_eq!(mode(&data), 0o750);
}

#[test]
fn a_data_directory_that_is_a_file_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("data");
    std::fs::write(&file, "not a directory").unwrap();
    let e = refused(&file);
    assert_eq!(status_of(e.as_ref()), Exit::Usage, "{e}");
    let e = e.to_string();
    assert!(
        e.starts_with(&format!("--data-dir {}: is a file", file.display())),
        "{e}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "not a directory");
}

#[test]
fn a_data_directory_under_a_file_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, "").unwrap();
    let data = file.join("data");
    let e = refused(&data);
    assert_eq!(status_of(e.as_ref()), Exit::Usage, "{e}");
    let e = names_the_data_dir(e.as_ref(), &data);
    assert!(e.contains("a parent of it is a file"), "{e}");
}

#[test]
fn a_data_directory_that_may_not_be_created_is_permission_denied() {
    let dir = tempfile::tempdir().unwrap();
    let locked = dir.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o500)).unwrap();
    // Root (CAP_DAC_OVERRIDE) may create it all the same; sysfs refuses
    // every mkdir with EPERM, root's included.
    let probe = locked.join("probe");
    let data = if std::fs::create_dir(&probe).is_ok() {
        std::fs::remove_dir(&probe).unwrap();
        Path::new("/sys/metropolis-test-data-dir").to_path_buf()
    } else {
        locked.join("data")
    };
    let e = refused(&data);
    assert_eq!(status_of(e.as_ref()), Exit::PermissionDenied, "{e}");
    let e = names_the_data_dir(e.as_ref(), &data);
    assert!(e.contains("or give another --data-dir"), "{e}");
    assert!(!data.exists());
}

/// `e`'s message, after checking it starts by naming `--data-dir` and
/// the directory it could not create.
fn names_the_data_dir(e: &(dyn std::error::Error + Send + Sync), data: &Path) -> String {
    let e = e.to_string();
    assert!(
        e.starts_with(&format!(
            "--data-dir {}: cannot create the data directory: ",
            data.display()
        )),
        "{e}"
    );
    e
}
