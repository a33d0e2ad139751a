//! The containerd image store against a real containerd (the Debian
//! `containerd` package: `containerd` and `ctr` in `PATH`; `.ci/run`
//! installs it). Each test starts its own containerd with its root, state
//! and socket in a temporary directory, and kills it at the end (a drop
//! guard, so also when the test panics). What the store left in
//! containerd is read back with `ctr`.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use futures::StreamExt;
use metropolis_archive::ArchiveLimits;
use metropolis_node::images::{ContainerdConfig, ContainerdStore};
use metropolis_runtime_tokio::rt::TokioRuntime;
use metropolis_service::images::load_image;
use metropolis_testkit::archives::*;
use metropolis_tests::containerd::Containerd;
use metropolis_transport::runtime::SharedRuntime;
use tonic::Code;

/// A containerd and a runtime for stores on it.
struct Fixture {
    rt: tokio::runtime::Runtime,
    shared: SharedRuntime,
    containerd: Containerd,
}

impl Fixture {
    fn start() -> Fixture {
        let (rt, shared) = runtime();
        Fixture {
            rt,
            shared,
            containerd: Containerd::start(),
        }
    }

    fn store(&self, replace_tags: bool) -> ContainerdStore {
        self.containerd.store(replace_tags, self.shared.clone())
    }

    fn import(
        &self,
        store: &ContainerdStore,
        archive: &[u8],
    ) -> Result<Vec<String>, tonic::Status> {
        self.import_with(store, archive, ArchiveLimits::default())
    }

    fn import_with(
        &self,
        store: &ContainerdStore,
        archive: &[u8],
        limits: ArchiveLimits,
    ) -> Result<Vec<String>, tonic::Status> {
        self.rt.block_on(load_image(
            futures::stream::iter(chunks(archive, 4000)),
            store,
            limits,
        ))
    }

    /// Waits (up to 10 s) until containerd holds no write and no lease.
    fn wait_released(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let held = self.containerd.held();
            if held.is_empty() {
                return;
            }
            assert!(Instant::now() < deadline, "still held: {held:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn runtime() -> (tokio::runtime::Runtime, SharedRuntime) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let shared = {
        let _entered = rt.enter();
        TokioRuntime::shared()
    };
    (rt, shared)
}

/// The blob digests of `image`'s `ctr images export` archive: fails if
/// containerd lacks any blob the image references.
fn exported_blobs(containerd: &Containerd, image: &str) -> BTreeSet<String> {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("export.tar");
    let out_arg = out.display().to_string();
    containerd.ctr(&["images", "export", &out_arg, image]);
    let mut archive = tar::Archive::new(std::fs::File::open(&out).expect("open export"));
    let mut blobs = BTreeSet::new();
    for entry in archive.entries().expect("export entries") {
        let entry = entry.expect("export entry");
        let path = entry.path().expect("entry path").display().to_string();
        if let Some(hex) = path.strip_prefix("blobs/sha256/")
            && !hex.trim_end_matches('/').is_empty()
        {
            blobs.insert(format!("sha256:{hex}"));
        }
    }
    blobs
}

#[test]
fn docker_and_oci_archives_import_under_normalised_names_and_keep_their_blobs() {
    let f = Fixture::start();
    let store = f.store(false);
    let names = f
        .import(&store, &docker_archive("busybox:1.36", "hello"))
        .expect("docker import");
    assert_eq!(names, ["docker.io/library/busybox:1.36"]);
    // An OCI layout whose containerd name is not normalised: containerd
    // gets the normalised name (what the kubelet asks for).
    let oci = oci_archive(Some("tools/hello:1.0"), "oci");
    let names = f.import(&store, &oci.bytes).expect("oci import");
    assert_eq!(names, ["docker.io/tools/hello:1.0"]);
    let images = f.containerd.images();
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
    let mut listed = f.rt.block_on(store.list()).expect("list");
    listed.sort();
    assert_eq!(
        listed,
        [
            "docker.io/library/busybox:1.36",
            "docker.io/tools/hello:1.0"
        ]
    );
    f.wait_released();
    // After a garbage collection, containerd holds exactly what the images
    // reference (their labels keep it), and all of it: the members that are
    // not blobs (manifest.json, index.json, oci-layout) went with the lease.
    f.containerd.collect_garbage();
    let mut referenced = exported_blobs(&f.containerd, "docker.io/library/busybox:1.36");
    referenced.extend(exported_blobs(&f.containerd, "docker.io/tools/hello:1.0"));
    let held: BTreeSet<String> = f.containerd.blobs().into_iter().collect();
    assert_eq!(held, referenced);
    assert_eq!(
        held.len(),
        6,
        "config, layer and manifest of each: {held:?}"
    );
}

#[test]
fn an_existing_name_is_already_exists_unless_replacing() {
    let f = Fixture::start();
    let store = f.store(false);
    f.import(&store, &oci_archive(Some("example.com/app:1"), "one").bytes)
        .expect("first");
    let before = f.containerd.images();
    // Written differently, the same name.
    let second = oci_archive(Some("example.com/app:1"), "two");
    let err = f.import(&store, &second.bytes).expect_err("second");
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    assert!(
        err.message().contains("example.com/app:1"),
        "{}",
        err.message()
    );
    assert_eq!(f.containerd.images(), before, "existing image untouched");
    f.wait_released();
    f.containerd.collect_garbage();
    assert_eq!(
        f.containerd.blobs().len(),
        3,
        "the refused import's blobs are gone"
    );
    drop(store);
    let store = f.store(true);
    f.import(&store, &second.bytes).expect("replace");
    assert_eq!(
        f.containerd.images(),
        [("example.com/app:1".to_owned(), second.manifest.to_string())]
    );
}

#[test]
fn names_created_outside_are_compared_normalised() {
    let f = Fixture::start();
    // ctr itself keeps an OCI archive's name verbatim: `app:2`.
    let raw = oci_archive(Some("app:2"), "raw");
    let mut ctr = std::process::Command::new("ctr")
        .arg("-a")
        .arg(&f.containerd.socket)
        .args(["-n", "k8s.io", "images", "import", "--no-unpack", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("run ctr images import");
    let mut stdin = ctr.stdin.take().expect("piped stdin");
    std::io::Write::write_all(&mut stdin, &raw.bytes).expect("write archive to ctr");
    drop(stdin);
    assert!(ctr.wait().expect("wait for ctr").success());
    assert_eq!(f.containerd.images()[0].0, "app:2");
    let store = f.store(false);
    let err = f
        .import(&store, &oci_archive(Some("app:2"), "ours").bytes)
        .expect_err("collides");
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    assert!(
        err.message().contains("docker.io/library/app:2"),
        "{}",
        err.message()
    );
}

#[test]
fn rejected_archives_leave_nothing_in_containerd() {
    let f = Fixture::start();
    let store = f.store(false);
    f.import(&store, &docker_archive("busybox", "hello"))
        .expect("seed");
    // What the seed's members that are not blobs left goes at the next
    // collection: let it run before taking the reference.
    f.wait_released();
    f.containerd.collect_garbage();
    let images = f.containerd.images();
    let blobs = f.containerd.blobs();
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
        let err = f
            .import_with(&store, &case.bytes, limits)
            .expect_err(case.name);
        assert_eq!(err.code(), case.code, "{}: {err:?}", case.name);
        // An aborted import resolves once containerd collected its writes.
        assert!(f.containerd.held().is_empty(), "{}", case.name);
        assert_eq!(f.containerd.blobs(), blobs, "{}", case.name);
    }
    let err = f
        .import(&store, &oci_archive(None, "unnamed").bytes)
        .expect_err("unnamed");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(f.containerd.images(), images);
    assert!(f.containerd.held().is_empty());
    assert_eq!(f.containerd.blobs(), blobs);
}

#[test]
fn a_cancelled_import_leaves_nothing_in_containerd() {
    let f = Fixture::start();
    let store = f.store(false);
    let archive = docker_archive("busybox:cancelled", &"x".repeat(200_000));
    let half: Vec<_> = chunks(&archive, 4000).into_iter().take(30).collect();
    // Half the archive, then a client that never sends the rest.
    let stalled = futures::stream::iter(half).chain(futures::stream::pending());
    let outcome = f.rt.block_on(async {
        let import = load_image(stalled, &store, ArchiveLimits::default());
        tokio::time::timeout(Duration::from_millis(500), import).await
    });
    assert!(outcome.is_err(), "the import should still be waiting");
    f.wait_released();
    f.containerd.collect_garbage();
    assert_eq!(f.containerd.blobs(), Vec::<String>::new());
    assert!(f.containerd.images().is_empty());
}

#[test]
fn leases_a_crashed_store_left_are_deleted_by_the_next() {
    let f = Fixture::start();
    let state = f.containerd.state_dir();
    std::fs::create_dir_all(&state).expect("state dir");
    let owner = std::fs::canonicalize(&state).expect("canonical state dir");
    let label = format!("io.metropolis.image-store={}", owner.display());
    f.containerd
        .ctr(&["leases", "create", "--id", "left-by-a-crash", &label]);
    f.containerd
        .ctr(&["leases", "create", "--id", "someone-elses"]);
    let store = f.store(false);
    f.import(&store, &docker_archive("busybox", "hello"))
        .expect("import");
    let leases = f.containerd.ctr(&["leases", "ls", "-q"]);
    let leases: Vec<&str> = leases.lines().map(str::trim).collect();
    assert_eq!(leases, ["someone-elses"]);
}

#[test]
fn containerd_down_is_unavailable_naming_the_socket() {
    let (rt, shared) = runtime();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = ContainerdConfig::new(dir.path().join("no.sock"), dir.path().join("state"));
    config.connect_timeout = Duration::from_millis(300);
    let store = ContainerdStore::open(config, shared).expect("open");
    let err = rt
        .block_on(load_image(
            futures::stream::iter(chunks(&docker_archive("busybox", "hello"), 4000)),
            &store,
            ArchiveLimits::default(),
        ))
        .expect_err("no containerd");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.message().contains("no.sock"), "{}", err.message());
}
