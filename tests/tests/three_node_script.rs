//! `scripts/three-node-cluster.sh --smoke`: the README's local trial of
//! the scale-out mode starts, forwards and fails over, with the binaries
//! under test.

#![allow(clippy::unwrap_used)]

use std::process::Command;

use metropolis_tests::daemon_bin;

#[test]
fn the_three_node_trial_script_runs() {
    let dir = tempfile::tempdir().unwrap();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap();
    let ctl = daemon_bin().with_file_name("metroctl-under-test");
    let out = Command::new(root.join("scripts/three-node-cluster.sh"))
        .arg("--dir")
        .arg(dir.path().join("trial"))
        .arg("--daemon")
        .arg(daemon_bin())
        .arg("--metroctl")
        .arg(&ctl)
        .args(["--lease-ttl", "2", "--base-port", "17900", "--smoke"])
        .current_dir(root)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);
    assert!(
        stdout.contains("smoke: calls through followers reach the leader"),
        "{stdout}"
    );
    assert!(stdout.contains("served again after"), "{stdout}");
}
