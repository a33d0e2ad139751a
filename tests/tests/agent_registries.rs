//! The agent process against a real registry as operators run one:
//! Debian's `docker-registry` over TLS (its certificate given to the agent
//! with `--registry-ca`) asking for an htpasswd login (given with
//! `--registry-auth`, a Docker config.json of mode 600; `htpasswd` from
//! apache2-utils makes the bcrypt entry). The agent installs a
//! single-platform image and, from a two-platform index, its own
//! platform's image; through a proxy that drips the layer slower than
//! `--registry-deadline`, the install fails naming the deadline and leaves
//! the target's head zeroed; with the proxy fixed the next generation
//! installs. Needs docker-registry and apache2-utils (`.ci/run`).
//!
//! A download cut short twice by a proxy resumes with `Range` requests
//! the registry answers; a registry that comes up only after the install
//! started is waited for.
//!
//! And the Docker token flow: the registry with `auth: token` trusting
//! the tokens of an in-test token server (`metropolis_tests::token_server`,
//! over TLS, asking for a Basic login), whose CA is a second
//! `--registry-ca`; a wrong password is reported as the token server's
//! refusal.

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use base64::Engine as _;
use bmaas_agent::install::Platform;
use metropolis_proto::metropolis::node::core::curator::proto::private::{
    AddMachineRequest, machine_management_client::MachineManagementClient,
};
use metropolis_proto::prelude::{agent, debug as api};
use metropolis_tests::drip_proxy::DripProxy;
use metropolis_tests::provisioning::{report, submit};
use metropolis_tests::registry::{Access, Registry};
use metropolis_tests::token_server::{TokenIssuer, TokenServer};
use metropolis_tests::{AgentProcess, Daemon, RuntimeKind};
use metropolis_transport::grpc::Channel;
use prost::Message;

const MACHINE: &str = "6f1c0c3e-5a8b-4f0e-9a57-0f3a1c2b7d44";
const REPO: &str = "os/metropolis";
/// The artifact types of a whole-disk and a Metropolis OS image.
const DISK: &str = "application/vnd.metropolis-rs.os.disk-image.v1";
const METROPOLIS: &str = "application/vnd.monogon.os.image.v1";

fn request(host: &str, digest: &str, root: &Path) -> Vec<u8> {
    agent::OsInstallationRequest {
        generation: 0,
        r#type: Some(agent::os_installation_request::Type::Metropolis(
            agent::MetropolisInstallationRequest {
                os_image: Some(api::OsImageRef {
                    scheme: "https".into(),
                    host: host.into(),
                    repository: REPO.into(),
                    tag: String::new(),
                    digest: digest.into(),
                }),
                node_parameters: None,
                root_device: root.display().to_string(),
            },
        )),
    }
    .encode_to_vec()
}

/// Test data of `len` bytes, different for each `seed`.
fn image(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

/// A daemon with the machine registered, and its agent started with
/// `extra` flags.
async fn start_agent(
    dir: &Path,
    extra: &[&str],
) -> (Daemon, MachineManagementClient<Channel>, AgentProcess) {
    let d = Daemon::start(&dir.join("d"), RuntimeKind::Tokio);
    let key_file = dir.join("agent.key");
    let key = metropolis_pki::generate_agent_key().unwrap();
    std::fs::write(&key_file, &key).unwrap();
    let (_, public) = metropolis_pki::self_signed_agent_certificate(&key).unwrap();
    let mut op = MachineManagementClient::with_origin(d.owner().await, Channel::origin());
    op.add_machine(AddMachineRequest {
        machine_id: MACHINE.into(),
        agent_public_key: public.to_vec().into(),
    })
    .await
    .unwrap();
    let agent = AgentProcess::start_with(&d, MACHINE, &key_file, &dir.join("state"), extra);
    (d, op, agent)
}

/// Writes a config.json with `user`/`password` for `registries`, mode 600.
fn auth_file(path: &Path, registries: &[&str], user: &str, password: &str) {
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let entries: Vec<String> = registries
        .iter()
        .map(|r| format!(r#""{r}": {{"auth": "{encoded}"}}"#))
        .collect();
    std::fs::write(path, format!(r#"{{"auths": {{{}}}}}"#, entries.join(", "))).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// Installs `image` onto the file `target` with the installer in this
/// process (its defaults, image files allowed), as the agent would;
/// panics with the error and `registry`'s log if it fails.
fn install_in_process(image: &api::OsImageRef, target: &Path, registry: &Registry) {
    use bmaas_agent::install::{Installer, OciInstaller, Target};
    let target = Target {
        root_device: target.to_path_buf(),
        ..Target::default()
    };
    OciInstaller::new()
        .allow_image_files(true)
        .install(image, &target, &mut |_| {})
        .unwrap_or_else(|e| panic!("{e}\n{}", registry.log()));
}

/// The installer in this process against Debian's registry through a
/// link that drops twice in the middle of the layer: each break is
/// resumed with a `Range` from where it stopped (the registry answers
/// 206), and the target holds the image exactly.
#[test]
fn downloads_cut_short_resume_from_the_registry() {
    use metropolis_tests::cut_proxy::{CutProxy, Way};
    assert!(Registry::available(), "docker-registry is not installed");
    let registry = Registry::start();
    let data = image(12 << 20, 7);
    let digest = registry.push_image(REPO, "cut", &data);
    let proxy = CutProxy::start(&registry.addr, Way::Download, 5 << 20, 2);
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("disk.img");
    let image = api::OsImageRef {
        scheme: "http".into(),
        host: proxy.addr.clone(),
        repository: REPO.into(),
        tag: String::new(),
        digest,
    };
    install_in_process(&image, &target, &registry);
    assert_eq!(proxy.cut.load(Ordering::SeqCst), 2);
    assert!(std::fs::read(&target).unwrap() == data);
    let log = registry.log();
    // The access log: two ranged GETs of the layer answered 206.
    let ranged = log
        .lines()
        .filter(|l| l.contains("/blobs/") && l.contains("HTTP/1.1\" 206 "))
        .count();
    assert_eq!(ranged, 2, "{log}");
}

/// A registry that is down when the install starts and comes up 9 s
/// later: the installer (with its default policy, as the agent runs it)
/// keeps trying, as the reference's does, and installs. (Four retries,
/// 7.5 s of waits, the policy before, gave up first.)
#[test]
fn an_install_waits_for_a_registry_that_comes_up() {
    use metropolis_tests::proxy::{Proxy, copy_in_background};
    assert!(Registry::available(), "docker-registry is not installed");
    let registry = Registry::start();
    let data = image(3 << 20, 9);
    let digest = registry.push_image(REPO, "late", &data);
    // The address the install uses: nothing listens there yet.
    let late = format!("127.0.0.1:{}", metropolis_tests::free_port());
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("disk.img");
    let image = api::OsImageRef {
        scheme: "http".into(),
        host: late.clone(),
        repository: REPO.into(),
        tag: String::new(),
        digest,
    };
    let upstream = registry.addr.clone();
    let opener = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(9));
        Proxy::start_at(&late, &upstream, |client, server| {
            copy_in_background(client.try_clone().unwrap(), server.try_clone().unwrap());
            copy_in_background(server, client);
        })
    });
    let started = Instant::now();
    install_in_process(&image, &target, &registry);
    let took = started.elapsed();
    let _proxy = opener.join().unwrap();
    assert!(took >= Duration::from_secs(9), "took {took:?}");
    assert!(std::fs::read(&target).unwrap() == data);
}

/// Images that do not describe what they hold, served by Debian's
/// registry: a config of another `format_version`, a payload whose chunk
/// hashes are fewer than its size needs, a layer of an unknown media
/// type, a Metropolis image without `system`. Each is refused with an
/// error saying what is wrong, before the disk is touched.
#[test]
fn images_that_do_not_describe_themselves_are_refused_untouched() {
    use bmaas_agent::install::{Installer, MetropolisOptions, OciInstaller, Target};
    use metropolis_tests::registry::payload_config;
    assert!(Registry::available(), "docker-registry is not installed");
    let registry = Registry::start();
    let payload = image(3 << 20, 11);
    let raw = registry.push_blob(REPO, &payload);
    let layer = |media_type: &str| {
        format!(
            r#"{{"mediaType":"{media_type}","digest":"{raw}","size":{}}}"#,
            payload.len()
        )
    };
    let raw_layer = layer("application/octet-stream");
    // (artifact type, config, layers, what the error must say)
    let good = payload_config("disk", &payload, 1 << 20);
    // Two chunk hashes for a payload of three chunks.
    let short = payload_config("disk", &payload[..2 << 20], 1 << 20).replace(
        &format!("\"size\":{}", 2 << 20),
        &format!("\"size\":{}", payload.len()),
    );
    let cases = [
        (
            DISK,
            format!(r#"{{"format_version":"2","payloads":[{good}]}}"#),
            raw_layer.clone(),
            "format_version",
        ),
        (
            DISK,
            format!(r#"{{"format_version":"1","payloads":[{short}]}}"#),
            raw_layer.clone(),
            "chunk",
        ),
        (
            DISK,
            format!(r#"{{"format_version":"1","payloads":[{good}]}}"#),
            layer("application/gzip"),
            "application/gzip",
        ),
        (
            METROPOLIS,
            format!(
                r#"{{"format_version":"1","payloads":[{}]}}"#,
                payload_config("kernel.efi", &payload, 1 << 20)
            ),
            raw_layer.clone(),
            "no system payload",
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    let firmware = dir.path().join("efi");
    std::fs::create_dir_all(firmware.join("efivars")).unwrap();
    let installer =
        OciInstaller::new()
            .allow_image_files(true)
            .with_metropolis(MetropolisOptions {
                firmware_dir: firmware.clone(),
                efivars_dir: firmware.join("efivars"),
                network_config: None,
            });
    let disk = dir.path().join("disk.img");
    std::fs::write(&disk, vec![0xaa; 1 << 20]).unwrap();
    for (i, (artifact, config, layers, expected)) in cases.into_iter().enumerate() {
        let config_digest = registry.push_blob(REPO, config.as_bytes());
        let manifest = format!(
            r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","artifactType":"{artifact}","config":{{"mediaType":"application/vnd.monogon.os.image.config.v1+json","digest":"{config_digest}","size":{}}},"layers":[{layers}]}}"#,
            config.len()
        );
        let digest = registry.push_manifest(
            REPO,
            &format!("bad{i}"),
            "application/vnd.oci.image.manifest.v1+json",
            manifest.as_bytes(),
        );
        let image = api::OsImageRef {
            scheme: "http".into(),
            host: registry.addr.clone(),
            repository: REPO.into(),
            tag: String::new(),
            digest,
        };
        let target = Target {
            root_device: disk.clone(),
            ..Target::default()
        };
        let err = match installer.install(&image, &target, &mut |_| {}) {
            Ok(()) => panic!("case {i} ({expected}) installed"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(expected), "case {i}: {err}");
        let after = std::fs::read(&disk).unwrap();
        assert!(
            after.len() == 1 << 20 && after.iter().all(|b| *b == 0xaa),
            "case {i}: the disk was touched"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn installs_from_a_registry_with_tls_and_logins() {
    assert!(
        Registry::available(),
        "docker-registry is not installed (apt-get install docker-registry; .ci/run does it)"
    );
    let registry = Registry::start_secure("operator", "pa ss:word");
    let single = image(3 << 20, 1);
    let single_digest = registry.push_image(REPO, "v1", &single);
    // A two-platform index: the agent's own platform and another.
    let own = Platform::host();
    let other_arch = if own.architecture == "arm64" {
        "amd64"
    } else {
        "arm64"
    };
    let mine = image(2 << 20, 2);
    let theirs = image(2 << 20, 3);
    let mine_digest = registry.push_image(REPO, "mine", &mine);
    let theirs_digest = registry.push_image(REPO, "theirs", &theirs);
    let own_platform = format!("{}/{}", own.os, own.architecture);
    let other_platform = format!("linux/{other_arch}");
    let index_digest = registry.push_index(
        REPO,
        "multi",
        &[
            (other_platform.as_str(), theirs_digest.as_str()),
            (own_platform.as_str(), mine_digest.as_str()),
        ],
    );

    let dir = tempfile::tempdir().unwrap();
    // What an operator hands the agent: the registry's CA, and a
    // config.json only its owner can read.
    let ca = dir.path().join("registry-ca.pem");
    std::fs::write(&ca, registry.ca_pem.clone().unwrap()).unwrap();
    let auth = dir.path().join("registry-auth.json");
    let encoded = base64::engine::general_purpose::STANDARD.encode("operator:pa ss:word");
    // The proxy passes the first 2 MiB of each connection, then 200 bytes
    // every 50 ms: each read gets bytes within the socket timeout, the
    // layer would take over an hour.
    let proxy = DripProxy::start(&registry.addr, 2 << 20, 200, Duration::from_millis(50));
    // The proxy's address is another registry host to the agent: the
    // same login for it, in the other form config.json allows.
    std::fs::write(
        &auth,
        format!(
            r#"{{"auths": {{"{}": {{"auth": "{encoded}"}}, "{}": {{"username": "operator", "password": "pa ss:word"}}}}}}"#,
            registry.addr, proxy.addr
        ),
    )
    .unwrap();
    std::fs::set_permissions(&auth, std::fs::Permissions::from_mode(0o600)).unwrap();

    let (ca_arg, auth_arg) = (ca.display().to_string(), auth.display().to_string());
    let (_d, mut op, agent) = start_agent(
        dir.path(),
        &[
            "--allow-image-files",
            "--registry-ca",
            &ca_arg,
            "--registry-auth",
            &auth_arg,
            "--registry-deadline",
            "4",
        ],
    )
    .await;

    // Root devices are under /dev: image files on /dev/shm, made
    // beforehand (under /dev the agent creates nothing).
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let disk = shm.path().join("disk.img");
    std::fs::write(&disk, b"").unwrap();

    // A single-platform image over TLS with the login.
    assert_eq!(
        submit(
            &mut op,
            MACHINE,
            request(&registry.addr, &single_digest, &disk)
        )
        .await,
        1
    );
    let r = report(&mut op, MACHINE, 1).await;
    assert!(
        r.success,
        "{}\n{}\n{}",
        r.error,
        agent.log(),
        registry.log()
    );
    assert!(std::fs::read(&disk).unwrap() == single);

    // The index: the agent's own platform's image.
    submit(
        &mut op,
        MACHINE,
        request(&registry.addr, &index_digest, &disk),
    )
    .await;
    let r = report(&mut op, MACHINE, 2).await;
    assert!(r.success, "{}\n{}", r.error, agent.log());
    assert!(
        std::fs::read(&disk).unwrap() == mine,
        "not the {own_platform} image"
    );

    // Dripping: fails at the deadline, naming it; the head is zeroed.
    std::fs::write(&disk, vec![0xaa; single.len()]).unwrap();
    let started = Instant::now();
    submit(
        &mut op,
        MACHINE,
        request(&proxy.addr, &single_digest, &disk),
    )
    .await;
    let r = report(&mut op, MACHINE, 3).await;
    assert!(!r.success);
    assert!(
        r.error.contains("request deadline of 4 s"),
        "{}\n{}",
        r.error,
        agent.log()
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    let after = std::fs::read(&disk).unwrap();
    assert!(after[..1 << 20].iter().all(|b| *b == 0), "the head is zero");

    // Fixed, a new generation installs.
    proxy.set_dripping(false);
    submit(
        &mut op,
        MACHINE,
        request(&proxy.addr, &single_digest, &disk),
    )
    .await;
    let r = report(&mut op, MACHINE, 4).await;
    assert!(r.success, "{}\n{}", r.error, agent.log());
    assert!(std::fs::read(&disk).unwrap() == single);
    drop(agent);
}

#[tokio::test(flavor = "multi_thread")]
async fn installs_through_the_docker_token_flow() {
    assert!(
        Registry::available(),
        "docker-registry is not installed (apt-get install docker-registry; .ci/run does it)"
    );
    // The token server asks for the robot's login; the registry trusts
    // the issuer's tokens and sends the agent to the token server.
    let issuer = Arc::new(TokenIssuer::new());
    let robot = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("robot:t0ken-pw")
    );
    let tokens = TokenServer::start(issuer.clone(), robot);
    let realm = format!("https://{}/token", tokens.addr);
    let registry = Registry::start_as(Access::Token {
        issuer,
        realm: &realm,
    });
    let data = image(2 << 20, 4);
    let digest = registry.push_image(REPO, "v1", &data);

    let dir = tempfile::tempdir().unwrap();
    let (registry_ca, token_ca) = (
        dir.path().join("registry.pem"),
        dir.path().join("tokens.pem"),
    );
    std::fs::write(&registry_ca, registry.ca_pem.clone().unwrap()).unwrap();
    std::fs::write(&token_ca, &tokens.ca_pem).unwrap();
    let auth = dir.path().join("auth.json");
    auth_file(&auth, &[&registry.addr], "robot", "t0ken-pw");
    let args: Vec<String> = [&registry_ca, &token_ca, &auth]
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let (_d, mut op, agent) = start_agent(
        dir.path(),
        &[
            "--allow-image-files",
            "--registry-ca",
            &args[0],
            "--registry-ca",
            &args[1],
            "--registry-auth",
            &args[2],
        ],
    )
    .await;
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let disk = shm.path().join("disk.img");
    std::fs::write(&disk, b"").unwrap();
    submit(&mut op, MACHINE, request(&registry.addr, &digest, &disk)).await;
    let r = report(&mut op, MACHINE, 1).await;
    assert!(
        r.success,
        "{}\n{}\n{}",
        r.error,
        agent.log(),
        registry.log()
    );
    assert!(std::fs::read(&disk).unwrap() == data);
    assert!(tokens.requests.load(Ordering::SeqCst) >= 1);

    // A wrong password: the token server refuses, and the report says so.
    auth_file(&auth, &[&registry.addr], "robot", "wrong");
    drop(agent);
    let agent = AgentProcess::start_with(
        &_d,
        MACHINE,
        &dir.path().join("agent.key"),
        &dir.path().join("state"),
        &[
            "--allow-image-files",
            "--registry-ca",
            &args[0],
            "--registry-ca",
            &args[1],
            "--registry-auth",
            &args[2],
        ],
    );
    submit(&mut op, MACHINE, request(&registry.addr, &digest, &disk)).await;
    let r = report(&mut op, MACHINE, 2).await;
    assert!(!r.success);
    assert!(
        r.error.contains("token server") && r.error.contains("\"robot\""),
        "{}\n{}",
        r.error,
        agent.log()
    );
}
