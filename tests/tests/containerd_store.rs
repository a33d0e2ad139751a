//! The containerd image store against a real containerd (the Debian
//! `containerd` package: `containerd` and `ctr` in `PATH`; `.ci/run`
//! installs it). Each test starts its own containerd with its root, state
//! and socket in a temporary directory, and kills it at the end (a drop
//! guard, so also when the test panics).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use metropolis_core::archive::ArchiveLimits;
use metropolis_core::images::load_image;
use metropolis_node::images::{ContainerdConfig, ContainerdStore};
use metropolis_testkit::archives::*;
use metropolis_tests::containerd::Containerd;
use tonic::Code;

fn import(store: &ContainerdStore, archive: &[u8]) -> Result<Vec<String>, tonic::Status> {
    import_with(store, archive, ArchiveLimits::default())
}

fn import_with(
    store: &ContainerdStore,
    archive: &[u8],
    limits: ArchiveLimits,
) -> Result<Vec<String>, tonic::Status> {
    futures::executor::block_on(load_image(
        futures::stream::iter(chunks(archive, 4000)),
        store,
        limits,
    ))
}

/// Everything in the staging directory but its lock file.
fn staged(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("read staging dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n != "LOCK")
        .collect()
}

#[test]
fn docker_and_oci_archives_import_under_normalised_names() {
    let containerd = Containerd::start();
    let store = containerd.store(false);
    let names = import(&store, &docker_archive("busybox:1.36", "hello")).expect("docker import");
    assert_eq!(names, ["docker.io/library/busybox:1.36"]);
    // An OCI layout whose containerd name is not normalised: containerd
    // gets the normalised name (what the kubelet asks for).
    let oci = oci_archive(Some("tools/hello:1.0"), "oci");
    let names = import(&store, &oci.bytes).expect("oci import");
    assert_eq!(names, ["docker.io/tools/hello:1.0"]);
    let images = containerd.images();
    let listed: Vec<&str> = images.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        listed,
        [
            "docker.io/library/busybox:1.36",
            "docker.io/tools/hello:1.0"
        ]
    );
    assert!(
        images.contains(&(
            "docker.io/tools/hello:1.0".to_owned(),
            oci.manifest.to_string()
        )),
        "{images:?}"
    );
    assert_eq!(store.list().expect("list").len(), 2);
    assert!(staged(&containerd.staging()).is_empty());
}

#[test]
fn an_existing_name_is_already_exists_unless_replacing() {
    let containerd = Containerd::start();
    let store = containerd.store(false);
    import(&store, &oci_archive(Some("example.com/app:1"), "one").bytes).expect("first");
    let before = containerd.images();
    // Written differently, the same name.
    let second = oci_archive(Some("example.com/app:1"), "two");
    let err = import(&store, &second.bytes).expect_err("second");
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    assert!(
        err.message().contains("example.com/app:1"),
        "{}",
        err.message()
    );
    assert_eq!(containerd.images(), before, "existing image untouched");
    assert!(staged(&containerd.staging()).is_empty());
    drop(store);
    let store = containerd.store(true);
    import(&store, &second.bytes).expect("replace");
    assert_eq!(
        containerd.images(),
        [("example.com/app:1".to_owned(), second.manifest.to_string())]
    );
}

#[test]
fn names_created_outside_are_compared_normalised() {
    let containerd = Containerd::start();
    // ctr itself keeps an OCI archive's name verbatim: `app:2`.
    let raw = oci_archive(Some("app:2"), "raw");
    let mut ctr = Command::new("ctr")
        .arg("-a")
        .arg(&containerd.socket)
        .args(["-n", "k8s.io", "images", "import", "--no-unpack", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("run ctr images import");
    let mut stdin = ctr.stdin.take().expect("piped stdin");
    std::io::Write::write_all(&mut stdin, &raw.bytes).expect("write archive to ctr");
    drop(stdin);
    assert!(ctr.wait().expect("wait for ctr").success());
    assert_eq!(containerd.images()[0].0, "app:2");
    let store = containerd.store(false);
    let err = import(&store, &oci_archive(Some("app:2"), "ours").bytes).expect_err("collides");
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    assert!(
        err.message().contains("docker.io/library/app:2"),
        "{}",
        err.message()
    );
}

#[test]
fn rejected_archives_never_reach_containerd() {
    let containerd = Containerd::start();
    let store = containerd.store(false);
    import(&store, &docker_archive("busybox", "hello")).expect("seed");
    let before = containerd.images();
    let default = ArchiveLimits::default();
    for case in hostile_cases() {
        let limits = match case.limit {
            Limit::Default => default.clone(),
            Limit::SmallJson => ArchiveLimits {
                max_json_size: 100,
                ..default.clone()
            },
            Limit::SmallTotal => ArchiveLimits {
                max_total_size: 8 * 1024,
                ..default.clone()
            },
        };
        let err = import_with(&store, &case.bytes, limits).expect_err(case.name);
        assert_eq!(err.code(), case.code, "{}: {err:?}", case.name);
        assert!(staged(&containerd.staging()).is_empty(), "{}", case.name);
    }
    let err = import(&store, &oci_archive(None, "unnamed").bytes).expect_err("unnamed");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(containerd.images(), before);
}

#[test]
fn containerd_down_is_unavailable_with_ctrs_reason() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = ContainerdConfig::new(dir.path().join("no.sock"), dir.path().join("staging"));
    config.connect_timeout = Duration::from_millis(300);
    let store = ContainerdStore::open(config).expect("open");
    let err = import(&store, &docker_archive("busybox", "hello")).expect_err("no containerd");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.message().contains("no.sock"), "{}", err.message());
    assert!(staged(&dir.path().join("staging")).is_empty());
}
