//! The `metropolis-sim` binary: a campaign prints its figures and exits 0;
//! a planted bug is reported caught with the command that replays it, and
//! that command replays the same failure; usage errors exit 2.

#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

fn sim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_metropolis-sim"))
        .args(args)
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn a_campaign_prints_its_figures() {
    let o = sim(&["--seeds", "3", "--from", "10", "--jobs", "2", "--verbose"]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("seeds run:             3"), "{out}");
    assert!(out.contains("failures:              0"), "{out}");
    assert!(out.contains("simulated/wall:"), "{out}");
    for seed in 10..13 {
        assert!(out.contains(&format!("seed {seed} ok: trace ")), "{out}");
    }
}

#[test]
fn a_caught_canary_names_its_replay_and_the_replay_fails_alike() {
    let o = sim(&["--seeds", "20", "--canary", "drop-fence"]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("drop-fence caught at seed "), "{out}");
    let replay = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("replay: "))
        .unwrap();
    let args: Vec<&str> = replay.split(" -- ").nth(1).unwrap().split(' ').collect();
    assert!(args.contains(&"--log"), "{replay}");
    // Without the log (it goes to stderr, and is long).
    let args: Vec<&str> = args.into_iter().filter(|a| *a != "--log").collect();
    let again = sim(&args);
    let again_out = stdout(&again);
    let seed = args[args.iter().position(|a| *a == "--seed").unwrap() + 1];
    assert!(
        again_out.contains(&format!("drop-fence caught at seed {seed}")),
        "{again_out}"
    );
}

#[test]
fn usage_errors_exit_2() {
    let o = sim(&["--canary", "no-such-bug"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("drop-fence"));
    // A canary the world never exercises.
    let o = sim(&[
        "--world",
        "traces",
        "--canary",
        "drop-fence",
        "--seeds",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("skip-teardown"));
}
