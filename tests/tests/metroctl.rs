//! `metroctl` as a user runs it, against a real daemon: the tour of the
//! README, and errors that name the field.

#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

use metropolis_tests::{Daemon, RuntimeKind, daemon_bin};

struct Ctl<'a> {
    d: &'a Daemon,
}

impl Ctl<'_> {
    fn run(&self, tls: bool, args: &[&str]) -> Output {
        let mut cmd = Command::new(daemon_bin().with_file_name("metroctl-under-test"));
        cmd.arg("--data-dir").arg(&self.d.data_dir);
        if tls {
            cmd.arg("--endpoint").arg(&self.d.addr);
        }
        cmd.args(args).output().unwrap()
    }

    /// Runs and expects success; returns stdout.
    fn ok(&self, tls: bool, args: &[&str]) -> String {
        let out = self.run(tls, args);
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "metroctl {args:?} failed: {}{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// Runs and expects failure; returns stderr.
    fn fails(&self, tls: bool, args: &[&str]) -> String {
        let out = self.run(tls, args);
        assert!(!out.status.success(), "metroctl {args:?} should fail");
        String::from_utf8_lossy(&out.stderr).to_string()
    }
}

#[test]
fn the_tour_works_and_errors_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), RuntimeKind::Tokio);
    let ctl = Ctl { d: &d };
    let me = d.node_id().to_string();

    // Nodes, as this node over the socket and as the owner over TLS.
    assert!(ctl.ok(false, &["node", "list"]).contains(&me));
    assert!(
        ctl.ok(
            false,
            &["status", "set", "--external-address", "192.0.2.10"]
        )
        .contains("updated")
    );
    let bundle = dir.path().join("n1");
    let added = ctl.ok(true, &["node", "add", "--out", bundle.to_str().unwrap()]);
    let new_id = added.split_whitespace().nth(1).unwrap().to_string();
    assert!(bundle.join("node-key.pem").exists());
    let json = ctl.ok(true, &["node", "list", "--json"]);
    assert_eq!(json.lines().count(), 2, "{json}");
    assert!(
        json.lines()
            .any(|l| l.contains("\"external_address\":\"192.0.2.10\"")),
        "{json}"
    );
    let out = ctl.run(
        true,
        &[
            "--credentials",
            bundle.to_str().unwrap(),
            "status",
            "set",
            "--external-address",
            "fd00::1",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(ctl.ok(true, &["node", "rm", &new_id]).contains("removed"));

    // Machines and installation requests.
    let machine = "3b241101-e2bb-4255-8caf-4136c566a962";
    let key = dir.path().join("agent.key");
    ctl.ok(
        true,
        &[
            "machine",
            "add",
            machine,
            "--generate-key",
            key.to_str().unwrap(),
        ],
    );
    assert!(
        std::fs::read_to_string(&key)
            .unwrap()
            .contains("PRIVATE KEY")
    );
    let list = ctl.ok(true, &["machine", "list"]);
    assert!(
        list.contains(machine) && list.contains("never") && list.contains("LOST"),
        "{list}"
    );
    let digest = "a".repeat(64);
    let image = format!("http://127.0.0.1:5000/os@sha256:{digest}");
    assert!(
        ctl.ok(
            true,
            &[
                "install",
                "request",
                machine,
                "--image",
                &image,
                "--root-device",
                "/dev/vda"
            ]
        )
        .contains("generation 1")
    );
    let status = ctl.ok(true, &["install", "status", machine]);
    assert!(
        status.contains("generation 1") && status.contains("pending"),
        "{status}"
    );

    // Errors name the field and the rule.
    let e = ctl.fails(false, &["status", "set", "--external-address", "nope"]);
    assert!(
        e.contains("--external-address") && e.contains("IPv4 or IPv6"),
        "{e}"
    );
    let e = ctl.fails(false, &["watch", "node", "metropolis-zz"]);
    assert!(e.contains("32 lowercase hex"), "{e}");
    let e = ctl.fails(
        true,
        &[
            "install",
            "request",
            machine,
            "--image",
            "ftp://x/y@sha256:1",
            "--root-device",
            "/dev/vda",
        ],
    );
    assert!(e.contains("--image") && e.contains("http or https"), "{e}");
    let e = ctl.fails(
        true,
        &[
            "machine",
            "add",
            "not-a-uuid",
            "--agent-pubkey",
            &"ab".repeat(32),
        ],
    );
    assert!(e.contains("machine_id") && e.contains("UUID"), "{e}");
    let e = ctl.fails(false, &["machine", "list"]);
    assert!(
        e.contains("PermissionDenied"),
        "a node may not manage machines: {e}"
    );
}
