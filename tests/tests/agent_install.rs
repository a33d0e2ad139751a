//! The whole provisioning flow with real processes and a real OCI registry
//! (Debian's `docker-registry`): register a machine, the agent heartbeats
//! and reports its hardware, installs generation 1 into a file (under
//! /dev/shm: root devices are under /dev) and reports success, installs
//! generation 2, does not reinstall after a restart, and reports the cause
//! of every failure while it keeps heartbeating.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use metropolis_proto::metropolis::node::core::curator::proto::private::{
    AddMachineRequest, GetMachineRequest, Machine, SubmitInstallationRequestRequest,
    machine_management_client::MachineManagementClient,
};
use metropolis_proto::prelude::{agent, debug as api};
use metropolis_tests::registry::Registry;
use metropolis_tests::{AgentProcess, Daemon, RuntimeKind, against_both_runtimes};
use metropolis_transport::grpc::Channel;
use prost::Message;

const MACHINE: &str = "3b241101-e2bb-4255-8caf-4136c566a962";
const LAYER: &str = "application/vnd.oci.image.layer.v1.tar";

fn request(registry: &str, repo: &str, tag: &str, digest: &str, root: &std::path::Path) -> Vec<u8> {
    agent::OsInstallationRequest {
        generation: 0,
        r#type: Some(agent::os_installation_request::Type::Metropolis(
            agent::MetropolisInstallationRequest {
                os_image: Some(api::OsImageRef {
                    scheme: "http".into(),
                    host: registry.into(),
                    repository: repo.into(),
                    tag: tag.into(),
                    digest: digest.into(),
                }),
                node_parameters: None,
                root_device: root.display().to_string(),
            },
        )),
    }
    .encode_to_vec()
}

async fn machine(op: &mut MachineManagementClient<Channel>) -> Machine {
    op.get_machine(GetMachineRequest {
        machine_id: MACHINE.into(),
    })
    .await
    .unwrap()
    .into_inner()
}

/// Waits until `done` holds for the machine, up to 30 s.
async fn until(
    op: &mut MachineManagementClient<Channel>,
    what: &str,
    done: impl Fn(&Machine) -> bool,
) -> Machine {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let m = machine(op).await;
        if done(&m) {
            return m;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {m:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn submit(op: &mut MachineManagementClient<Channel>, bytes: Vec<u8>) -> i64 {
    op.submit_installation_request(SubmitInstallationRequestRequest {
        machine_id: MACHINE.into(),
        request: bytes.into(),
    })
    .await
    .unwrap()
    .into_inner()
    .generation
}

fn report_of(
    m: &Machine,
    generation: i64,
) -> Option<&metropolis_proto::metropolis::node::core::curator::proto::private::machine::Report> {
    m.reports.iter().find(|r| r.generation == generation)
}

async fn install_flow(rt: RuntimeKind) {
    assert!(
        Registry::available(),
        "docker-registry is not installed (apt-get install docker-registry; .ci/run does it)"
    );
    let registry = Registry::start();
    let image: Vec<u8> = (0..(3 << 20))
        .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let digest = registry.push_image("os/metropolis", "v1", &image, LAYER);

    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), rt);
    let key_file = dir.path().join("agent.key");
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

    let state = dir.path().join("state");
    let mut agent = AgentProcess::start(&d, MACHINE, &key_file, &state);
    let m = until(&mut op, "the hardware report", |m| {
        m.hardware_report.is_some()
    })
    .await;
    let hw = m.hardware_report.unwrap();
    assert!(
        hw.report.unwrap().memory_installed_bytes > 0,
        "a real hardware report"
    );

    // Generation 1 into a file; root devices are under /dev, so the files
    // are on /dev/shm, and made beforehand (under /dev the agent creates
    // nothing).
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let disk1 = shm.path().join("disk1.img");
    std::fs::write(&disk1, b"").unwrap();
    assert_eq!(
        submit(
            &mut op,
            request(&registry.addr, "os/metropolis", "", &digest, &disk1)
        )
        .await,
        1
    );
    let m = until(&mut op, "report of generation 1", |m| {
        report_of(m, 1).is_some()
    })
    .await;
    let r = report_of(&m, 1).unwrap();
    assert!(
        r.success,
        "generation 1 failed: {}\n{}",
        r.error,
        agent.log()
    );
    assert_eq!(std::fs::read(&disk1).unwrap(), image);

    // Generation 2 installs again.
    let disk2 = shm.path().join("disk2.img");
    std::fs::write(&disk2, b"").unwrap();
    assert_eq!(
        submit(
            &mut op,
            request(&registry.addr, "os/metropolis", "", &digest, &disk2)
        )
        .await,
        2
    );
    let m = until(&mut op, "report of generation 2", |m| {
        report_of(m, 2).is_some()
    })
    .await;
    assert!(report_of(&m, 2).unwrap().success, "{}", agent.log());
    assert_eq!(std::fs::read(&disk2).unwrap(), image);

    // A restarted agent does not install generation 2 again.
    agent.kill();
    std::fs::write(&disk2, b"").unwrap();
    let before = machine(&mut op).await.last_heartbeat_unix_ms;
    let agent = AgentProcess::start(&d, MACHINE, &key_file, &state);
    until(&mut op, "a heartbeat of the restarted agent", |m| {
        m.last_heartbeat_unix_ms > before + 500
    })
    .await;
    assert!(
        std::fs::read(&disk2).unwrap().is_empty(),
        "generation 2 was installed twice:\n{}",
        agent.log()
    );

    // Failures are reported with their cause; the agent keeps heartbeating.
    let wrong = format!("sha256:{}", "0".repeat(64));
    let cases = [
        // Fetched by tag, the manifest does not have the requested digest.
        (
            request(
                &registry.addr,
                "os/metropolis",
                "v1",
                &wrong,
                &shm.path().join("x.img"),
            ),
            "digest",
        ),
        (
            request(
                &registry.addr,
                "os/missing",
                "",
                &digest,
                &shm.path().join("y.img"),
            ),
            "not found",
        ),
        (
            request(
                "127.0.0.1:1",
                "os/metropolis",
                "",
                &digest,
                &shm.path().join("z.img"),
            ),
            "127.0.0.1:1",
        ),
    ];
    for (bytes, cause) in cases {
        let generation = submit(&mut op, bytes).await;
        let m = until(&mut op, "an error report", |m| {
            report_of(m, generation).is_some()
        })
        .await;
        let r = report_of(&m, generation).unwrap();
        assert!(!r.success);
        assert!(
            r.error.to_lowercase().contains(cause),
            "generation {generation}: {:?} should name {cause:?}",
            r.error
        );
        let hb = m.last_heartbeat_unix_ms;
        until(&mut op, "heartbeats after a failure", |m| {
            m.last_heartbeat_unix_ms > hb
        })
        .await;
    }
    drop(agent);
}

against_both_runtimes!(install_flow);
