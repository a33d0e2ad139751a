//! The OCI image layout store through `load_image`, on real files: valid
//! Docker and OCI archives are imported and the layout stays valid;
//! hostile archives, failed commits and dropped imports leave the store
//! byte-for-byte as it was; tags collide or are replaced as configured.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use futures::StreamExt;
use metropolis_archive::{ArchiveLimits, Digest};
use metropolis_node::images::{OciLayoutOptions, OciLayoutStore};
use metropolis_service::images::load_image;
use metropolis_testkit::archives::*;
use tonic::Code;

fn open(dir: &Path, replace_tags: bool) -> OciLayoutStore {
    OciLayoutStore::open(dir, OciLayoutOptions::replace_tags(replace_tags)).expect("open store")
}

fn import(store: &OciLayoutStore, archive: &[u8]) -> Result<Vec<String>, tonic::Status> {
    import_with(store, archive, ArchiveLimits::default())
}

fn import_with(
    store: &OciLayoutStore,
    archive: &[u8],
    limits: ArchiveLimits,
) -> Result<Vec<String>, tonic::Status> {
    futures::executor::block_on(load_image(
        futures::stream::iter(chunks(archive, 3000)),
        store,
        limits,
    ))
}

fn names(store: &OciLayoutStore) -> Vec<(String, Digest)> {
    store
        .list()
        .expect("list")
        .into_iter()
        .map(|i| (i.name.expect("named"), i.manifest.digest))
        .collect()
}

fn staging_dirs(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("read store dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".staging"))
        .collect()
}

#[test]
fn docker_archive_imports_into_a_valid_layout() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("images");
    let store = open(&dir, false);
    let imported = import(&store, &docker_archive("busybox", "hello")).expect("import");
    assert_eq!(imported, ["docker.io/library/busybox:latest"]);
    let listed = names(&store);
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].0, "docker.io/library/busybox:latest");
    let blobs = check_layout(&dir);
    // Synthesized manifest, config, one layer; legacy files not stored.
    assert_eq!(blobs, 3, "blobs in the layout");
    assert!(staging_dirs(&dir).is_empty());
}

#[test]
fn oci_layout_imports_and_keeps_its_descriptors() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("images");
    let store = open(&dir, false);
    let archive = oci_archive(Some("example.com/tools/hello:1.0"), "hi");
    let imported = import(&store, &archive.bytes).expect("import");
    assert_eq!(imported, ["example.com/tools/hello:1.0"]);
    assert_eq!(
        names(&store),
        [("example.com/tools/hello:1.0".to_owned(), archive.manifest)]
    );
    assert_eq!(check_layout(&dir), 3);
    // A second image sharing the layer: only new blobs are added.
    let other = oci_archive(Some("example.com/tools/hello:2.0"), "hi");
    import(&store, &other.bytes).expect("second import");
    assert_eq!(names(&store).len(), 2);
    assert_eq!(check_layout(&dir), 3, "identical content is stored once");
}

#[test]
fn hostile_archives_leave_the_store_unchanged() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("images");
    let store = open(&dir, false);
    import(&store, &docker_archive("busybox", "hello")).expect("seed image");
    let before = snapshot(&dir);
    let small_json = ArchiveLimits {
        max_json_size: 100,
        ..ArchiveLimits::default()
    };
    let small_total = ArchiveLimits {
        max_total_size: 8 * 1024,
        ..ArchiveLimits::default()
    };
    let default = ArchiveLimits::default();
    for case in hostile_cases() {
        let limits = match case.limit {
            Limit::Default => default.clone(),
            Limit::SmallJson => small_json.clone(),
            Limit::SmallTotal => small_total.clone(),
        };
        let err = import_with(&store, &case.bytes, limits).expect_err(case.name);
        assert_eq!(err.code(), case.code, "{}: {err:?}", case.name);
        assert!(
            err.message().contains(case.why),
            "{}: {}",
            case.name,
            err.message()
        );
        assert_eq!(snapshot(&dir), before, "{}: store changed", case.name);
    }
    assert_eq!(names(&store).len(), 1);
}

#[test]
fn an_unnamed_image_is_refused_and_nothing_stays() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("images");
    let store = open(&dir, false);
    let before = snapshot(&dir);
    let err = import(&store, &oci_archive(None, "x").bytes).expect_err("unnamed");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("has no name"), "{}", err.message());
    assert_eq!(snapshot(&dir), before);
}

#[test]
fn a_commit_failing_after_moving_blobs_removes_them() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("images");
    let store = open(&dir, false);
    import(&store, &docker_archive("busybox", "hello")).expect("seed image");
    // White box: a directory where the new index.json is written makes
    // the commit fail after the blobs are in place.
    std::fs::create_dir(dir.join(".staging-index.json")).expect("block the index");
    let before = snapshot(&dir);
    // New blobs only, then blobs the existing image has (which must stay).
    for content in ["other content", "hello"] {
        let err = import(&store, &docker_archive("other", content)).expect_err("blocked");
        assert_eq!(err.code(), Code::Unavailable, "{err:?}");
        assert_eq!(snapshot(&dir), before, "{content}");
    }
    assert_eq!(names(&store).len(), 1);
}

#[test]
fn a_client_error_mid_stream_leaves_nothing() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("images");
    let store = open(&dir, false);
    let before = snapshot(&dir);
    let archive = docker_archive("busybox", "hello");
    let mut parts = chunks(&archive, 1000);
    parts.truncate(parts.len() / 2);
    parts.push(Err(tonic::Status::cancelled("client disconnected")));
    let err = futures::executor::block_on(load_image(
        futures::stream::iter(parts),
        &store,
        ArchiveLimits::default(),
    ))
    .expect_err("client error");
    assert_eq!(err.code(), Code::Cancelled);
    assert_eq!(snapshot(&dir), before);
}

#[test]
fn a_dropped_import_leaves_nothing() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("images");
    let store = open(&dir, false);
    let before = snapshot(&dir);
    let archive = docker_archive("busybox", "hello");
    let mut parts = chunks(&archive, 1000);
    parts.truncate(parts.len() / 2);
    let reached = Arc::new(AtomicBool::new(false));
    let flag = reached.clone();
    let stalled = futures::stream::poll_fn(move |_| {
        flag.store(true, Ordering::SeqCst);
        Poll::Pending
    });
    let stream = futures::stream::iter(parts).chain(stalled);
    let mut fut = Box::pin(load_image(stream, &store, ArchiveLimits::default()));
    let waker = futures::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !reached.load(Ordering::SeqCst) {
        assert!(
            fut.as_mut().poll(&mut cx).is_pending(),
            "import ended early"
        );
        assert!(Instant::now() < deadline, "import never caught up");
        std::thread::sleep(Duration::from_millis(1));
    }
    // The import's thread creates its staging directory as it takes the
    // first chunks, which the future may have handed over before.
    while staging_dirs(&dir).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the import never started staging"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(staging_dirs(&dir).len(), 1, "the import is staging");
    drop(fut);
    // The import's thread removes its staging directory once it sees the
    // drop.
    while !staging_dirs(&dir).is_empty() {
        assert!(Instant::now() < deadline, "staging left behind");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(snapshot(&dir), before);
}

#[test]
fn an_existing_tag_is_kept_unless_replacing() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("images");
    {
        let store = open(&dir, false);
        import(&store, &docker_archive("busybox:1.36", "one")).expect("first");
        let before = snapshot(&dir);
        let err = import(&store, &docker_archive("busybox:1.36", "two")).expect_err("second");
        assert_eq!(err.code(), Code::AlreadyExists);
        assert!(err.message().contains("docker.io/library/busybox:1.36"));
        assert_eq!(snapshot(&dir), before, "existing image untouched");
        // The same name written differently collides too.
        let err = import(
            &store,
            &docker_archive("docker.io/library/busybox:1.36", "three"),
        )
        .expect_err("third");
        assert_eq!(err.code(), Code::AlreadyExists);
    }
    let store = open(&dir, true);
    let old = names(&store);
    import(&store, &docker_archive("busybox:1.36", "two")).expect("replace");
    let new = names(&store);
    assert_eq!(new.len(), 1);
    assert_eq!(new[0].0, "docker.io/library/busybox:1.36");
    assert_ne!(new[0].1, old[0].1, "the tag points at the new image");
    check_layout(&dir);
}

#[test]
fn concurrent_imports_both_land() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("images");
    let store = open(&dir, false);
    let (a, b) = (docker_archive("a", "a"), docker_archive("b", "b"));
    let both = futures::future::join(
        load_image(
            futures::stream::iter(chunks(&a, 700)),
            &store,
            ArchiveLimits::default(),
        ),
        load_image(
            futures::stream::iter(chunks(&b, 900)),
            &store,
            ArchiveLimits::default(),
        ),
    );
    let (ra, rb) = futures::executor::block_on(both);
    ra.expect("a");
    rb.expect("b");
    assert_eq!(names(&store).len(), 2);
    check_layout(&dir);
}

#[test]
fn open_removes_crash_leftovers_and_locks() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("images");
    let store = open(&dir, false);
    import(&store, &docker_archive("busybox", "hello")).expect("import");
    let clean = snapshot(&dir);
    let second = OciLayoutStore::open(&dir, OciLayoutOptions::default());
    assert!(second.is_err(), "a second store on the same directory");
    drop(store);
    std::fs::create_dir(dir.join(".staging-1-0")).expect("leftover dir");
    std::fs::write(dir.join(".staging-1-0").join("m0"), b"partial").expect("leftover file");
    std::fs::write(dir.join(".staging-index.json"), b"{").expect("leftover index");
    let store = open(&dir, false);
    assert_eq!(snapshot(&dir), clean);
    assert_eq!(names(&store).len(), 1);
}
