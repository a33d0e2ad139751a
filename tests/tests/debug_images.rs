//! LoadImage over gRPC against a real daemon: Docker and OCI archives
//! import into the default image store (an OCI layout under the data
//! directory), hostile archives leave it unchanged, a client disconnect
//! leaves nothing, tag collisions, and a real containerd as the store.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use metropolis_proto::prelude::debug::{self, node_debug_service_client::NodeDebugServiceClient};
use metropolis_testkit::archives::{
    Limit, check_layout, docker_archive, hostile_cases, oci_archive, snapshot,
};
use metropolis_tests::containerd::Containerd;
use metropolis_tests::{Daemon, RuntimeKind, against_both_runtimes};
use metropolis_transport::grpc::Channel;

/// Streams `archive` in `chunk`-byte parts.
async fn load(
    client: &mut NodeDebugServiceClient<Channel>,
    archive: &[u8],
    chunk: usize,
) -> Result<(), tonic::Status> {
    let parts: Vec<debug::ImagePart> = archive
        .chunks(chunk)
        .map(|c| debug::ImagePart {
            data_part: c.to_vec().into(),
        })
        .collect();
    client
        .load_image(futures::stream::iter(parts))
        .await
        .map(|_| ())
}

/// The names in the layout's index.json.
fn names(images: &Path) -> Vec<String> {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(images.join("index.json")).unwrap()).unwrap();
    let mut names: Vec<String> = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["annotations"]["org.opencontainers.image.ref.name"].as_str())
        .map(str::to_owned)
        .collect();
    names.sort();
    names
}

async fn archives_import_into_the_oci_layout(runtime: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let d = Daemon::start_debug(&data, runtime, &[]);
    let images = data.join("images");
    let mut client = d.debug_client().await;
    load(
        &mut client,
        &docker_archive("busybox:1.36", "docker layer"),
        64 * 1024,
    )
    .await
    .unwrap();
    load(
        &mut client,
        &oci_archive(Some("registry.example:5000/tools/oci:v1"), "oci layer").bytes,
        1000,
    )
    .await
    .unwrap();
    assert_eq!(
        names(&images),
        [
            "docker.io/library/busybox:1.36",
            "registry.example:5000/tools/oci:v1"
        ]
    );
    assert!(check_layout(&images) > 0);

    // Same name again: AlreadyExists, the store untouched.
    let before = snapshot(&images);
    let e = load(
        &mut client,
        &docker_archive("busybox:1.36", "other layer"),
        4096,
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e:?}");
    assert!(e.message().contains("busybox"), "{}", e.message());
    assert_eq!(snapshot(&images), before);

    // Every hostile archive (that runs under the default limits): its
    // code, and the store unchanged.
    for case in hostile_cases() {
        if !matches!(case.limit, Limit::Default) {
            continue;
        }
        let e = load(&mut client, &case.bytes, 3000).await.unwrap_err();
        assert_eq!(e.code(), case.code, "{}: {e:?}", case.name);
        assert!(
            e.message().contains(case.why),
            "{}: {} lacks {:?}",
            case.name,
            e.message(),
            case.why
        );
        assert_eq!(snapshot(&images), before, "{} changed the store", case.name);
    }
}

async fn too_large_and_replace(runtime: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let d = Daemon::start_debug(
        &data,
        runtime,
        &["--image-max-bytes", "20000", "--image-replace-tags"],
    );
    let images = data.join("images");
    let mut client = d.debug_client().await;
    load(&mut client, &docker_archive("app:1", "first"), 4096)
        .await
        .unwrap();
    // Replacing is allowed on this node.
    load(&mut client, &docker_archive("app:1", "second"), 4096)
        .await
        .unwrap();
    assert_eq!(names(&images), ["docker.io/library/app:1"]);
    // Over the size limit: ResourceExhausted, nothing changes.
    let before = snapshot(&images);
    let big = docker_archive("big:1", &"x".repeat(64 * 1024));
    let e = load(&mut client, &big, 4096).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert_eq!(snapshot(&images), before);
}

async fn client_disconnect_leaves_nothing(runtime: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let d = Daemon::start_debug(&data, runtime, &[]);
    let images = data.join("images");
    let mut client = d.debug_client().await;
    load(&mut client, &docker_archive("keep:1", "kept"), 4096)
        .await
        .unwrap();
    let before = snapshot(&images);

    // Send half of a large archive, then go away mid-stream.
    let archive = docker_archive("gone:1", &"y".repeat(4 * 1024 * 1024));
    let half = archive[..archive.len() / 2].to_vec();
    let (mut tx, rx) = futures::channel::mpsc::channel::<debug::ImagePart>(4);
    let mut client2 = d.debug_client().await;
    let call = tokio::spawn(async move { client2.load_image(rx).await });
    use futures::SinkExt;
    for c in half.chunks(64 * 1024) {
        tx.send(debug::ImagePart {
            data_part: c.to_vec().into(),
        })
        .await
        .unwrap();
    }
    // Wait until the server has staged something, then disconnect.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_dir(&images).unwrap().any(|e| {
        e.unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with(".staging-")
    }) {
        assert!(Instant::now() < deadline, "no staging directory appeared");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    call.abort();
    drop(tx);
    // Wait for the daemon to drop its staging directory (listing names
    // only: its files vanish while it is removed), then compare.
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_dir(&images).unwrap().any(|e| {
        e.unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with(".staging-")
    }) {
        assert!(Instant::now() < deadline, "the staging directory stayed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        snapshot(&images),
        before,
        "the aborted import left something"
    );
}

async fn containerd_store(runtime: RuntimeKind) {
    let containerd = Containerd::start();
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_debug(
        &dir.path().join("data"),
        runtime,
        &["--containerd-socket", containerd.socket.to_str().unwrap()],
    );
    let mut client = d.debug_client().await;
    load(
        &mut client,
        &docker_archive("hello:1", "in containerd"),
        8192,
    )
    .await
    .unwrap();
    load(
        &mut client,
        &oci_archive(Some("example.org/oci:2"), "oci in containerd").bytes,
        8192,
    )
    .await
    .unwrap();
    let listed: Vec<String> = containerd.images().into_iter().map(|(n, _)| n).collect();
    assert!(
        listed.contains(&"docker.io/library/hello:1".to_string()),
        "{listed:?}"
    );
    assert!(
        listed.contains(&"example.org/oci:2".to_string()),
        "{listed:?}"
    );
    let e = load(&mut client, &docker_archive("hello:1", "again"), 8192)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e:?}");
    // The daemon's staging directory is empty again.
    let staging = dir.path().join("data").join("containerd-staging");
    let left: Vec<_> = std::fs::read_dir(&staging)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "LOCK")
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

against_both_runtimes!(
    archives_import_into_the_oci_layout,
    too_large_and_replace,
    client_disconnect_leaves_nothing,
    containerd_store,
);
