//! The whole provisioning flow with real processes and a real OCI registry
//! (Debian's `docker-registry`): register a machine, the agent heartbeats
//! and reports its hardware, installs generation 1 onto a loop device
//! (root, `losetup`), refuses an image file without `--allow-image-files`,
//! leaves the device unbootable when the registry serves tampered layer
//! bytes and installs once it is fixed, writes an image file (under
//! /dev/shm: root devices are under /dev) with the flag, does not
//! reinstall after a restart, and reports the cause of every failure
//! while it keeps heartbeating.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use metropolis_proto::metropolis::node::core::curator::proto::private::{
    GetMachineRequest, Machine, machine_management_client::MachineManagementClient,
};
use metropolis_tests::loop_device::LoopDevice;
use metropolis_tests::provisioning::{report, submit};
use metropolis_tests::registry::Registry;
use metropolis_tests::{AgentProcess, Daemon, EnrolledMachine, RuntimeKind, against_both_runtimes};
use metropolis_transport::grpc::Channel;

const MACHINE: &str = "3b241101-e2bb-4255-8caf-4136c566a962";

fn request(registry: &str, repo: &str, tag: &str, digest: &str, root: &std::path::Path) -> Vec<u8> {
    let root = root.display().to_string();
    metropolis_tests::provisioning::metropolis_request(registry, repo, tag, digest, &root)
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
    let digest = registry.push_image("os/metropolis", "v1", &image);

    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), rt);
    let EnrolledMachine {
        key_file,
        operator: mut op,
    } = d.enroll_machine(MACHINE, dir.path()).await;

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

    // Generation 1 onto a real block device (a loop device) holding an
    // "old system" (0xaa everywhere).
    let device = LoopDevice::attach(4 << 20, 0xaa);
    let on_device =
        |digest: &str| request(&registry.addr, "os/metropolis", "", digest, device.path());
    // What a verified install leaves: the image, and the device's last MiB
    // zeroed (no backup partition table of the old system).
    let installed = [image.clone(), vec![0; 1 << 20]].concat();
    assert_eq!(submit(&mut op, MACHINE, on_device(&digest)).await, 1);
    let r = report(&mut op, MACHINE, 1).await;
    assert!(
        r.success,
        "generation 1 failed: {}\n{}",
        r.error,
        agent.log()
    );
    assert_eq!(device.read(), installed);
    // The record says when the request was submitted and first handed out,
    // and the agent logged its progress in sizes that fit (a rate and ETA
    // come only after half a second of writing: this install is faster).
    let m = machine(&mut op).await;
    assert!(m.request_submitted_unix_ms > 0, "{m:#?}");
    assert!(
        m.request_handed_out_unix_ms >= m.request_submitted_unix_ms,
        "{m:#?}"
    );
    assert!(m.request_handed_out_unix_ms <= r.received_unix_ms, "{m:#?}");
    let log = agent.log();
    assert!(
        log.contains("verified, written and read back") && log.contains(" MiB of "),
        "{log}"
    );

    // A regular file is not a root device without --allow-image-files;
    // root devices are under /dev, so the files are on /dev/shm, and made
    // beforehand (under /dev the agent creates nothing).
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let file = shm.path().join("disk.img");
    std::fs::write(&file, b"old").unwrap();
    let into_file =
        |path: &std::path::Path| request(&registry.addr, "os/metropolis", "", &digest, path);
    assert_eq!(submit(&mut op, MACHINE, into_file(&file)).await, 2);
    let r = report(&mut op, MACHINE, 2).await;
    assert!(!r.success);
    assert!(r.error.contains("--allow-image-files"), "{}", r.error);
    assert_eq!(std::fs::read(&file).unwrap(), b"old", "nothing written");

    // The registry serves other bytes of the same size for the payload:
    // the install fails naming the chunk (1 MiB chunks: the third), no
    // byte of that chunk reached the device, and the device does not boot
    // (its first and last MiB are zero), whatever it held before.
    let blob = registry.blob_path(&metropolis_tests::registry::digest(&image));
    let good = std::fs::read(&blob).unwrap();
    let mut tampered = good.clone();
    tampered[2 << 20] ^= 0xff;
    std::fs::write(&blob, &tampered).unwrap();
    assert_eq!(submit(&mut op, MACHINE, on_device(&digest)).await, 3);
    let r = report(&mut op, MACHINE, 3).await;
    assert!(!r.success);
    assert!(r.error.contains("payload disk: chunk 2 "), "{}", r.error);
    let after = device.read();
    assert_ne!(
        after[2 << 20],
        tampered[2 << 20],
        "a byte of the bad chunk was written"
    );
    assert!(after[..1 << 20].iter().all(|b| *b == 0), "the head is zero");
    assert!(after[3 << 20..].iter().all(|b| *b == 0), "the tail is zero");
    // Fixed, a new generation installs.
    std::fs::write(&blob, &good).unwrap();
    assert_eq!(submit(&mut op, MACHINE, on_device(&digest)).await, 4);
    let r = report(&mut op, MACHINE, 4).await;
    assert!(
        r.success,
        "generation 4 failed: {}\n{}",
        r.error,
        agent.log()
    );
    assert_eq!(device.read(), installed);

    // With --allow-image-files, image files are written (trials); the
    // generation refused before is not acted on again. (Registry retries
    // bounded too: the unreachable registry below then fails within
    // seconds, not when --install-timeout runs out.)
    agent.kill();
    let allow = ["--allow-image-files", "--registry-retries", "2"];
    let mut agent = AgentProcess::start_with(&d, MACHINE, &key_file, &state, &allow);
    let disk2 = shm.path().join("disk2.img");
    std::fs::write(&disk2, b"").unwrap();
    assert_eq!(submit(&mut op, MACHINE, into_file(&disk2)).await, 5);
    let r = report(&mut op, MACHINE, 5).await;
    assert!(r.success, "{}\n{}", r.error, agent.log());
    assert_eq!(std::fs::read(&disk2).unwrap(), image);
    assert_eq!(
        std::fs::read(&file).unwrap(),
        b"old",
        "generation 2 stays done"
    );

    // A restarted agent does not install generation 5 again.
    agent.kill();
    std::fs::write(&disk2, b"").unwrap();
    let before = machine(&mut op).await.last_heartbeat_unix_ms;
    let agent = AgentProcess::start_with(&d, MACHINE, &key_file, &state, &allow);
    until(&mut op, "a heartbeat of the restarted agent", |m| {
        m.last_heartbeat_unix_ms > before + 500
    })
    .await;
    assert!(
        std::fs::read(&disk2).unwrap().is_empty(),
        "generation 5 was installed twice:\n{}",
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
        let generation = submit(&mut op, MACHINE, bytes).await;
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

/// `--reboot success`: a failed install keeps the agent heartbeating (a
/// new generation can retry), a successful one reboots once its report
/// was delivered: here through `--reboot-command`, a script leaving a
/// marker, after which the agent exits 0. (The default, `reboot(2)`,
/// would reboot the test machine; the tests' agents run `--reboot never`
/// otherwise.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reboots_once_a_successful_install_was_reported() {
    assert!(Registry::available(), "docker-registry is not installed");
    let registry = Registry::start();
    let image: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
    let digest = registry.push_image("os/metropolis", "v1", &image);
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), RuntimeKind::Tokio);
    let EnrolledMachine {
        key_file,
        operator: mut op,
    } = d.enroll_machine(MACHINE, dir.path()).await;
    let marker = dir.path().join("rebooted");
    let script = dir.path().join("reboot.sh");
    // The command also records the agent's (its parent's) sockets and the
    // kernel's TCP table at the moment of the reboot.
    let (fds, tcp) = (dir.path().join("fds"), dir.path().join("tcp"));
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nls -l /proc/$PPID/fd > {}\ncat /proc/net/tcp /proc/net/tcp6 > {}\n\
             echo rebooted > {}\n",
            fds.display(),
            tcp.display(),
            marker.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let script_arg = script.display().to_string();
    let flags = [
        "--allow-image-files",
        "--reboot",
        "success",
        "--reboot-command",
        script_arg.as_str(),
    ];
    let state = dir.path().join("state");
    let mut agent = AgentProcess::start_with(&d, MACHINE, &key_file, &state, &flags);
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let disk = shm.path().join("disk.img");
    std::fs::write(&disk, b"").unwrap();

    let wrong = format!("sha256:{}", "0".repeat(64));
    let bad = request(&registry.addr, "os/metropolis", "", &wrong, &disk);
    assert_eq!(submit(&mut op, MACHINE, bad).await, 1);
    let r = report(&mut op, MACHINE, 1).await;
    assert!(!r.success);
    assert_eq!(
        agent.wait_exit(Duration::from_secs(2)),
        None,
        "exited after a failure"
    );
    assert!(!marker.exists(), "rebooted after a failure");

    let good = request(&registry.addr, "os/metropolis", "", &digest, &disk);
    assert_eq!(submit(&mut op, MACHINE, good).await, 2);
    let r = report(&mut op, MACHINE, 2).await;
    assert!(r.success, "{}\n{}", r.error, agent.log());
    let status = agent
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("the agent did not reboot:\n{}", agent.log()));
    assert!(status.success(), "{status}\n{}", agent.log());
    assert!(
        marker.exists(),
        "the reboot command did not run:\n{}",
        agent.log()
    );
    assert!(agent.log().contains("rebooting"), "{}", agent.log());
    assert!(std::fs::read(&disk).unwrap() == image);
    // As the reference's agent: its connection to the curator was closed
    // before the reboot, so the curator does not wait for a keepalive.
    let open = established_to(&fds, &tcp, &d.agent_addr);
    assert_eq!(
        open, 0,
        "connections to the curator left open at the reboot"
    );
}

/// How many of the sockets listed in `fds` (`ls -l /proc/PID/fd`) are
/// established TCP connections to `addr`'s port in `tcp` (the kernel's
/// `/proc/net/tcp` and `tcp6` tables).
fn established_to(fds: &std::path::Path, tcp: &std::path::Path, addr: &str) -> usize {
    let fds = std::fs::read_to_string(fds).unwrap();
    let inodes: std::collections::HashSet<&str> = fds
        .split("socket:[")
        .skip(1)
        .filter_map(|rest| rest.split(']').next())
        .collect();
    assert!(!inodes.is_empty(), "the agent has no socket at all:\n{fds}");
    let port: u16 = addr.rsplit_once(':').unwrap().1.parse().unwrap();
    let port = format!(":{port:04X}");
    std::fs::read_to_string(tcp)
        .unwrap()
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() > 9 && f[2].ends_with(&port) && f[3] == "01")
        .filter(|f| inodes.contains(f[9]))
        .count()
}
