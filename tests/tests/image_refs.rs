//! Images by tag and name, run as `metroctl-under-test` against a real
//! `metropolisd` and Debian's `docker-registry`: `install request --image
//! …/REPO:TAG` looks the tag up (in the clear, and over TLS with a login),
//! prints and records the digest, and the request the agent gets is by
//! digest; an unknown tag is refused naming --image with nothing
//! submitted; `osimage push` and `install request` to a plain-HTTP
//! registry written without http:// say to write http://; `load-image
//! --name` names an OCI layout whose ref.name is a bare tag, and
//! `metroctl images` lists what was loaded, from the embedded store and
//! from a real containerd. Needs docker-registry, apache2-utils and
//! containerd (`.ci/run` installs them).

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

use base64::Engine as _;
use metropolis_proto::metropolis::node::core::curator::proto::private::GetMachineRequest;
use metropolis_proto::metropolis::node::core::curator::proto::private::machine_management_client::MachineManagementClient;
use metropolis_proto::prelude::agent;
use metropolis_testkit::archives::{E, build, oci_entries, oci_parts};
use metropolis_tests::containerd::Containerd;
use metropolis_tests::outcome::{stderr, stdout};
use metropolis_tests::registry::Registry;
use metropolis_tests::{Daemon, RuntimeKind, daemon_bin};
use metropolis_transport::grpc::Channel;
use prost::Message;
use serde_json::Value;

const MACHINE: &str = "0b6b8a7c-1f0e-4d2a-9c3b-5e6f7a8b9c0d";

/// `metroctl-under-test` with `args`, no daemon.
fn metroctl(args: &[&str]) -> Output {
    Command::new(daemon_bin().with_file_name("metroctl-under-test"))
        .args(args)
        .output()
        .unwrap()
}

/// The OS image request the curator holds for the machine.
async fn current_image(
    operator: &mut MachineManagementClient<Channel>,
) -> (i64, Option<metropolis_proto::prelude::debug::OsImageRef>) {
    let m = operator
        .get_machine(GetMachineRequest {
            machine_id: MACHINE.into(),
        })
        .await
        .unwrap()
        .into_inner();
    if m.current_generation == 0 {
        return (0, None);
    }
    let request = agent::OsInstallationRequest::decode(m.current_request.as_ref()).unwrap();
    let Some(agent::os_installation_request::Type::Metropolis(r)) = request.r#type else {
        panic!("not a Metropolis request");
    };
    (m.current_generation, r.os_image)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tag_is_resolved_to_its_digest_and_requested_by_it() {
    assert!(Registry::available(), "docker-registry is not installed");
    let registry = Registry::start();
    let v2 = registry.push_image("os/trial", "v2", b"the disk of v2");
    let v3 = registry.push_image("os/trial", "v3", b"the disk of v3");
    assert_ne!(v2, v3);
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), RuntimeKind::Tokio);
    let mut operator = d.enroll_machine(MACHINE, dir.path()).await.operator;

    let image = format!("http://{}/os/trial:v2", registry.addr);
    let args = [
        "install",
        "request",
        MACHINE,
        "--image",
        &image,
        "--root-device",
        "sda",
    ];
    let run = d.metroctl(&args);
    assert!(run.status.success(), "{}", stderr(&run));
    let text = stdout(&run);
    assert!(
        text.contains(&format!("resolved os/trial:v2 to {v2}")),
        "{text}"
    );
    assert!(
        text.contains(&format!("http://{}/os/trial@{v2}", registry.addr)),
        "{text}"
    );
    // The agent's request is by digest: no tag to fetch by.
    let (generation, os_image) = current_image(&mut operator).await;
    let os_image = os_image.unwrap();
    assert_eq!(generation, 1);
    assert_eq!(os_image.digest, v2);
    assert_eq!(os_image.tag, "");
    assert_eq!(os_image.repository, "os/trial");
    let status = d.metroctl(&["install", "status", MACHINE, "-o", "json"]);
    let status: Value = serde_json::from_str(&stdout(&status)).unwrap();
    let shown = status.to_string();
    assert!(shown.contains(&format!("os/trial@{v2}")), "{shown}");

    // -o json has both the tag and the digest.
    let image = format!("http://{}/os/trial:v3", registry.addr);
    let mut json_args = vec!["-o", "json"];
    json_args.extend_from_slice(&args);
    json_args[6] = &image;
    let run = d.metroctl(&json_args);
    assert!(run.status.success(), "{}", stderr(&run));
    let out: Value = serde_json::from_str(&stdout(&run)).unwrap();
    assert_eq!(out["tag"], "v3");
    assert_eq!(out["digest"], v3.as_str());
    assert_eq!(out["resolved"], true);
    assert_eq!(out["generation"], 2);
    assert_eq!(current_image(&mut operator).await.1.unwrap().digest, v3);

    // An unknown tag: refused naming --image, exit 5, nothing submitted.
    let image = format!("http://{}/os/trial:v9", registry.addr);
    let mut missing = args;
    missing[4] = &image;
    let run = d.metroctl(&missing);
    let e = stderr(&run);
    assert_eq!(run.status.code(), Some(5), "{e}");
    assert!(
        e.contains("--image") && e.contains("no tag \"v9\"") && e.contains("nothing was submitted"),
        "{e}"
    );
    assert_eq!(current_image(&mut operator).await.0, 2);

    // https:// to this plain-HTTP registry: said so, nothing submitted.
    let image = format!("https://{}/os/trial:v2", registry.addr);
    missing[4] = &image;
    let run = d.metroctl(&missing);
    let e = stderr(&run);
    assert_eq!(run.status.code(), Some(1), "{e}");
    assert!(
        e.contains(&format!(
            "this registry speaks plain HTTP: write http://{}/os/trial:v2 ",
            registry.addr
        )),
        "{e}"
    );
    assert_eq!(current_image(&mut operator).await.0, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tag_is_resolved_over_tls_with_the_agents_login_flags() {
    assert!(Registry::available(), "docker-registry is not installed");
    let registry = Registry::start_secure("reader", "s3cret");
    let v1 = registry.push_image("os/secure", "v1", b"a secure disk");
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, registry.ca_pem.clone().unwrap()).unwrap();
    let auth = dir.path().join("auth.json");
    let login = base64::engine::general_purpose::STANDARD.encode("reader:s3cret");
    let json = format!(
        r#"{{"auths": {{"{}": {{"auth": "{login}"}}}}}}"#,
        registry.addr
    );
    std::fs::write(&auth, json).unwrap();
    let d = Daemon::start(&dir.path().join("d"), RuntimeKind::Tokio);
    let mut operator = d.enroll_machine(MACHINE, dir.path()).await.operator;
    let (ca, auth) = (ca.display().to_string(), auth.display().to_string());
    let image = format!("https://{}/os/secure:v1", registry.addr);
    let base = [
        "install",
        "request",
        MACHINE,
        "--image",
        &image,
        "--root-device",
        "sda",
    ];

    // Without --registry-ca: the self-signed certificate, named.
    let run = d.metroctl(&base);
    let e = stderr(&run);
    assert!(!run.status.success());
    assert!(e.contains("--image") && e.contains("--registry-ca"), "{e}");
    // Without a login: denied (4), naming --registry-auth.
    let run = d.metroctl(&[&base[..], &["--registry-ca", &ca]].concat());
    let e = stderr(&run);
    assert_eq!(run.status.code(), Some(4), "{e}");
    assert!(e.contains("--registry-auth"), "{e}");
    assert_eq!(current_image(&mut operator).await.0, 0);

    let run = d.metroctl(&[&base[..], &["--registry-ca", &ca, "--registry-auth", &auth]].concat());
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(
        stdout(&run).contains(&format!("resolved os/secure:v1 to {v1}")),
        "{}",
        stdout(&run)
    );
    let (_, os_image) = current_image(&mut operator).await;
    let os_image = os_image.unwrap();
    assert_eq!(
        (os_image.digest.as_str(), os_image.tag.as_str()),
        (v1.as_str(), "")
    );
    assert_eq!(os_image.scheme, "https");
}

#[test]
fn a_push_to_a_plain_http_registry_without_a_scheme_says_to_write_http() {
    assert!(Registry::available(), "docker-registry is not installed");
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    std::fs::write(&disk, vec![7u8; 4096]).unwrap();
    let out = dir.path().join("layout");
    let payload = format!("disk={}", disk.display());
    let run = metroctl(&[
        "osimage",
        "build",
        "--out",
        out.to_str().unwrap(),
        "--kind",
        "disk",
        "--payload",
        &payload,
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
    let reference = format!("{}/os/plain:v1", registry.addr);
    let run = metroctl(&["osimage", "push", out.to_str().unwrap(), &reference]);
    let e = stderr(&run);
    assert_eq!(run.status.code(), Some(1), "{e}");
    assert!(
        e.contains(&format!(
            "this registry speaks plain HTTP: write http://{}/os/plain:v1 ",
            registry.addr
        )),
        "{e}"
    );
    assert!(!e.contains("InvalidContentType"), "{e}");
    // Written with http://, the same push goes through.
    let reference = format!("http://{reference}");
    let run = metroctl(&["osimage", "push", out.to_str().unwrap(), &reference]);
    assert!(run.status.success(), "{}", stderr(&run));
}

/// An OCI layout tarball whose index.json names its one image only by
/// the bare tag `tag`.
fn bare_tag_layout(dir: &Path, tag: &str, content: &str) -> String {
    let parts = oci_parts(content);
    let mut entries = oci_entries(&parts, None);
    let Some(E::File(_, index)) = entries.pop() else {
        panic!("index.json comes last");
    };
    let mut index: Value = serde_json::from_slice(&index).unwrap();
    index["manifests"][0]["annotations"] =
        serde_json::json!({ "org.opencontainers.image.ref.name": tag });
    entries.push(E::File(
        "index.json".into(),
        serde_json::to_vec(&index).unwrap(),
    ));
    let path = dir.join(format!("{tag}.tar"));
    std::fs::write(&path, build(&entries)).unwrap();
    path.display().to_string()
}

/// Loads a bare-tag layout with --name into `d`'s image store and checks
/// that `metroctl images` lists it under that name, in `store`.
fn bare_tag_loads_and_lists(d: &Daemon, dir: &Path, store: &str) {
    let archive = bare_tag_layout(dir, "v2", "bare tag");
    // Without --name the node refuses the unnamed image.
    let run = d.metroctl(&["load-image", &archive]);
    let e = stderr(&run);
    assert!(!run.status.success(), "{}", stdout(&run));
    assert!(e.contains("has no name"), "{e}");
    let run = d.metroctl(&["images"]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(stdout(&run).contains("0 image(s) in"), "{}", stdout(&run));

    let run = d.metroctl(&[
        "load-image",
        &archive,
        "--name",
        "registry.example/os/trial",
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(
        stdout(&run).contains("loaded registry.example/os/trial:v2"),
        "{}",
        stdout(&run)
    );
    let run = d.metroctl(&["images"]);
    assert!(run.status.success(), "{}", stderr(&run));
    let text = stdout(&run);
    assert!(text.contains("registry.example/os/trial:v2"), "{text}");
    assert!(text.contains(&format!("1 image(s) in {store}")), "{text}");
    let run = d.metroctl(&["-o", "json", "images"]);
    let listing: Value = serde_json::from_str(&stdout(&run)).unwrap();
    assert_eq!(listing["images"][0]["name"], "registry.example/os/trial:v2");
    let digest = listing["images"][0]["digest"].as_str().unwrap();
    assert!(
        digest.starts_with("sha256:") && digest.len() == 71,
        "{listing}"
    );
    // --name on a Docker archive: refused, and the node, which never
    // gets the end marker, imports nothing.
    let docker = dir.join("docker.tar");
    std::fs::write(
        &docker,
        metropolis_testkit::archives::docker_archive("busybox:1", "docker"),
    )
    .unwrap();
    let run = d.metroctl(&["load-image", docker.to_str().unwrap(), "--name", "other"]);
    assert_eq!(run.status.code(), Some(2), "{}", stderr(&run));
    assert!(
        stderr(&run).contains("--name: the archive has no index.json"),
        "{}",
        stderr(&run)
    );
    let run = d.metroctl(&["images"]);
    assert!(stdout(&run).contains("1 image(s) in"), "{}", stdout(&run));
    // A wrong --name is refused before anything is sent.
    let run = d.metroctl(&["load-image", &archive, "--name", "x@sha256:00"]);
    assert_eq!(run.status.code(), Some(2), "{}", stderr(&run));
    assert!(stderr(&run).contains("--name"), "{}", stderr(&run));
}

#[test]
fn load_image_names_a_bare_tag_and_images_lists_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let d = Daemon::start_debug(&data, RuntimeKind::Tokio, &[]);
    let store = format!("OCI image layout {}", data.join("images").display());
    bare_tag_loads_and_lists(&d, dir.path(), &store);
}

#[test]
fn images_lists_containerd() {
    let containerd = Containerd::start();
    let dir = tempfile::tempdir().unwrap();
    let socket = containerd.socket.to_str().unwrap().to_owned();
    let d = Daemon::start_debug(
        &dir.path().join("data"),
        RuntimeKind::Tokio,
        &["--containerd-socket", &socket],
    );
    let store = format!("containerd {socket}, namespace k8s.io");
    bare_tag_loads_and_lists(&d, dir.path(), &store);
    let names: Vec<String> = containerd.images().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["registry.example/os/trial:v2"]);
}
