//! The driver against an in-memory fake store: what reaches the store,
//! when it commits, and that every failure aborts the import.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use serde_json::json;

use super::{ImageImport, ImageStore, ImageStoreError, load_image};
use crate::status::debug::{archive as archive_status, archive_code, image_store};
use metropolis_archive::{ArchiveError, ArchiveLimits, Digest, ImportPlan, Output};

// ---------------------------------------------------------------------------
// The fake store: imports stage members in shared state; commit moves the
// plan's images into `images`; drop or abort removes what was staged.

#[derive(Default)]
struct State {
    /// Staged bytes per live import id, per member index.
    staged: BTreeMap<u64, BTreeMap<usize, Vec<u8>>>,
    /// Raw archive bytes seen per live import id.
    raw: BTreeMap<u64, usize>,
    next_id: u64,
    commits: usize,
    aborts: usize,
    drops_without_commit: usize,
    /// Raw archive bytes the last committed import saw.
    committed_raw: usize,
    /// Committed images: name -> manifest digest.
    images: BTreeMap<String, Digest>,
}

#[derive(Clone, Default)]
struct FakeStore {
    state: Arc<Mutex<State>>,
    /// Fail `member` calls after this many.
    fail_member_after: Option<usize>,
}

impl FakeStore {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("fake store lock")
    }
}

struct FakeImport {
    id: u64,
    state: Arc<Mutex<State>>,
    members: usize,
    fail_member_after: Option<usize>,
    done: bool,
}

impl ImageStore for FakeStore {
    fn begin(&self) -> Result<Box<dyn ImageImport>, ImageStoreError> {
        let mut state = self.state();
        let id = state.next_id;
        state.next_id += 1;
        state.staged.insert(id, BTreeMap::new());
        state.raw.insert(id, 0);
        Ok(Box::new(FakeImport {
            id,
            state: self.state.clone(),
            members: 0,
            fail_member_after: self.fail_member_after,
            done: false,
        }))
    }
}

impl FakeImport {
    fn discard(&mut self) {
        let mut state = self.state.lock().expect("fake store lock");
        state.staged.remove(&self.id);
        state.raw.remove(&self.id);
    }
}

impl ImageImport for FakeImport {
    fn archive_data(&mut self, chunk: Bytes) -> BoxFuture<'_, Result<(), ImageStoreError>> {
        let mut state = self.state.lock().expect("fake store lock");
        *state.raw.entry(self.id).or_default() += chunk.len();
        futures::future::ready(Ok(())).boxed()
    }

    fn member(&mut self, output: Output) -> BoxFuture<'_, Result<(), ImageStoreError>> {
        self.members += 1;
        if self.fail_member_after.is_some_and(|n| self.members > n) {
            let e = ImageStoreError::Unavailable("disk full".to_owned());
            return futures::future::ready(Err(e)).boxed();
        }
        let mut state = self.state.lock().expect("fake store lock");
        let staged = state.staged.entry(self.id).or_default();
        match output {
            Output::MemberStart { index, .. } => {
                staged.insert(index, Vec::new());
            }
            Output::MemberData { index, data } => {
                staged.entry(index).or_default().extend_from_slice(&data);
            }
            Output::MemberEnd { .. } => {}
        }
        futures::future::ready(Ok(())).boxed()
    }

    fn commit(
        mut self: Box<Self>,
        plan: ImportPlan,
    ) -> BoxFuture<'static, Result<Vec<String>, ImageStoreError>> {
        self.done = true;
        let mut state = self.state.lock().expect("fake store lock");
        let staged = state.staged.remove(&self.id).unwrap_or_default();
        state.committed_raw = state.raw.remove(&self.id).unwrap_or_default();
        let result = commit(&mut state, &staged, &plan);
        futures::future::ready(result).boxed()
    }

    fn abort(mut self: Box<Self>) -> BoxFuture<'static, ()> {
        self.done = true;
        self.discard();
        self.state.lock().expect("fake store lock").aborts += 1;
        futures::future::ready(()).boxed()
    }
}

fn commit(
    state: &mut State,
    staged: &BTreeMap<usize, Vec<u8>>,
    plan: &ImportPlan,
) -> Result<Vec<String>, ImageStoreError> {
    for blob in &plan.blobs {
        let data = staged
            .get(&blob.member)
            .expect("plan names a staged member");
        assert_eq!(Digest::of(data), blob.digest, "staged bytes are the blob");
    }
    let mut names = Vec::new();
    for image in &plan.images {
        let Some(name) = &image.name else {
            return Err(ImageStoreError::Invalid("unnamed image".to_owned()));
        };
        if state.images.contains_key(name) {
            return Err(ImageStoreError::AlreadyExists(name.clone()));
        }
        names.push(name.clone());
    }
    for image in &plan.images {
        if let Some(name) = &image.name {
            state.images.insert(name.clone(), image.manifest.digest);
        }
    }
    state.commits += 1;
    Ok(names)
}

impl Drop for FakeImport {
    fn drop(&mut self) {
        if !self.done {
            self.discard();
            self.state
                .lock()
                .expect("fake store lock")
                .drops_without_commit += 1;
        }
    }
}

fn assert_nothing_staged(store: &FakeStore) {
    let state = store.state();
    assert!(state.staged.is_empty(), "staged members left behind");
    assert!(state.raw.is_empty(), "raw bytes left behind");
}

// ---------------------------------------------------------------------------
// Archives.

fn tar(entries: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut b = ::tar::Builder::new(Vec::new());
    for (path, data) in entries {
        let mut h = ::tar::Header::new_gnu();
        h.set_entry_type(::tar::EntryType::Regular);
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, path, &data[..])
            .expect("append test member");
    }
    b.into_inner().expect("finish test archive")
}

/// A Docker v1.2 archive with one image named `tag`.
fn docker_archive(tag: &str) -> Vec<u8> {
    let layer = tar(&[("hello.txt", b"hello".to_vec())]);
    let diff_id = Digest::of(&layer);
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Healthcheck": {"Test": ["CMD", "true"]}},
        "rootfs": {"type": "layers", "diff_ids": [diff_id.to_string()]},
    }))
    .expect("config JSON");
    let config_name = format!("{}.json", Digest::of(&config).hex());
    let manifest = serde_json::to_vec(&json!([{
        "Config": config_name,
        "RepoTags": [tag],
        "Layers": ["abc/layer.tar"],
    }]))
    .expect("manifest JSON");
    tar(&[
        ("abc/layer.tar", layer),
        (&config_name, config),
        ("manifest.json", manifest),
    ])
}

fn chunks(archive: &[u8], size: usize) -> Vec<Result<Bytes, tonic::Status>> {
    archive
        .chunks(size)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect()
}

fn run(
    store: &FakeStore,
    parts: Vec<Result<Bytes, tonic::Status>>,
) -> Result<Vec<String>, tonic::Status> {
    futures::executor::block_on(load_image(
        futures::stream::iter(parts),
        store,
        ArchiveLimits::default(),
    ))
}

// ---------------------------------------------------------------------------
// Tests.

#[test]
fn success_commits_once_with_every_byte_seen() {
    let store = FakeStore::default();
    let archive = docker_archive("busybox:1.36");
    let names = run(&store, chunks(&archive, 700)).expect("import");
    assert_eq!(names, ["docker.io/library/busybox:1.36"]);
    let state = store.state();
    assert_eq!(state.commits, 1);
    assert_eq!(
        state.committed_raw,
        archive.len(),
        "every raw byte reached the store"
    );
    assert_eq!(state.aborts + state.drops_without_commit, 0);
    assert!(state.images.contains_key("docker.io/library/busybox:1.36"));
    assert!(state.staged.is_empty());
}

#[test]
fn archive_error_aborts_and_maps_its_code() {
    let store = FakeStore::default();
    let mut archive = docker_archive("busybox:latest");
    // Cut inside the last member: truncated.
    archive.truncate(archive.len() - 1500);
    let err = run(&store, chunks(&archive, 512)).expect_err("truncated");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("truncated"), "{}", err.message());
    assert_nothing_staged(&store);
    let state = store.state();
    assert_eq!((state.commits, state.aborts), (0, 1));
    assert!(state.images.is_empty());
}

#[test]
fn over_the_limit_is_resource_exhausted() {
    let store = FakeStore::default();
    let archive = docker_archive("busybox:latest");
    let limits = ArchiveLimits {
        max_total_size: 2048,
        ..ArchiveLimits::default()
    };
    let err = futures::executor::block_on(load_image(
        futures::stream::iter(chunks(&archive, 1024)),
        &store,
        limits,
    ))
    .expect_err("too large");
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert_nothing_staged(&store);
    assert_eq!(store.state().commits, 0);
}

#[test]
fn client_error_aborts_with_the_clients_status() {
    let store = FakeStore::default();
    let archive = docker_archive("busybox:latest");
    let mut parts = chunks(&archive, 1000);
    parts.truncate(2);
    parts.push(Err(tonic::Status::cancelled("client went away")));
    let err = run(&store, parts).expect_err("client error");
    assert_eq!(err.code(), tonic::Code::Cancelled);
    assert_nothing_staged(&store);
    let state = store.state();
    assert_eq!((state.commits, state.aborts), (0, 1));
}

#[test]
fn store_error_while_staging_aborts_as_unavailable() {
    let store = FakeStore {
        fail_member_after: Some(3),
        ..FakeStore::default()
    };
    let err = run(&store, chunks(&docker_archive("a:1"), 100)).expect_err("store error");
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert!(err.message().contains("disk full"), "{}", err.message());
    assert_nothing_staged(&store);
    assert_eq!(store.state().aborts, 1);
}

#[test]
fn existing_name_is_already_exists_and_untouched() {
    let store = FakeStore::default();
    run(&store, chunks(&docker_archive("busybox:latest"), 4096)).expect("first import");
    let before = store.state().images.clone();
    let err = run(&store, chunks(&docker_archive("busybox:latest"), 4096)).expect_err("again");
    assert_eq!(err.code(), tonic::Code::AlreadyExists);
    assert!(err.message().contains("docker.io/library/busybox:latest"));
    assert_eq!(store.state().images, before);
    assert_eq!(store.state().commits, 1);
    assert_nothing_staged(&store);
}

#[test]
fn dropping_the_driver_drops_the_import() {
    let store = FakeStore::default();
    let archive = docker_archive("busybox:latest");
    let first = Bytes::copy_from_slice(&archive[..1024]);
    // A stream that yields one chunk and then never ends.
    let parts = futures::stream::iter([Ok(first)]).chain(futures::stream::pending());
    let mut fut = Box::pin(load_image(parts, &store, ArchiveLimits::default()));
    let waker = futures::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    assert!(fut.as_mut().poll(&mut cx).is_pending());
    assert!(!store.state().staged.is_empty(), "the import is staging");
    drop(fut);
    assert_nothing_staged(&store);
    let state = store.state();
    assert_eq!((state.commits, state.drops_without_commit), (0, 1));
}

#[test]
fn store_errors_map_to_codes() {
    use tonic::Code;
    let cases = [
        (
            ImageStoreError::AlreadyExists("x".into()),
            Code::AlreadyExists,
        ),
        (ImageStoreError::Unavailable("y".into()), Code::Unavailable),
        (ImageStoreError::Invalid("z".into()), Code::InvalidArgument),
    ];
    for (e, code) in cases {
        assert_eq!(image_store(&e).code(), code, "{e}");
    }
}

#[test]
fn archive_errors_map_to_codes() {
    use tonic::Code;
    let cases = [
        (
            ArchiveError::ArchiveTooLarge { limit: 1 },
            Code::ResourceExhausted,
        ),
        (
            ArchiveError::TooManyMembers { limit: 2 },
            Code::ResourceExhausted,
        ),
        (
            ArchiveError::JsonTooLarge {
                member: "manifest.json".into(),
                size: 10,
                limit: 5,
            },
            Code::ResourceExhausted,
        ),
        (
            ArchiveError::MetadataTooLarge {
                member: "index.json".into(),
                limit: 5,
            },
            Code::ResourceExhausted,
        ),
        (
            ArchiveError::DuplicateMember { path: "a".into() },
            Code::InvalidArgument,
        ),
        (
            ArchiveError::TrailingData { offset: 1024 },
            Code::InvalidArgument,
        ),
        (
            ArchiveError::UnknownLayout { reason: "empty" },
            Code::InvalidArgument,
        ),
    ];
    for (e, code) in cases {
        assert_eq!(archive_code(&e), code, "{e}");
        let status = archive_status(&e);
        assert_eq!(status.code(), code, "{e}");
        assert_eq!(status.message(), e.to_string());
    }
}
