//! The daemon's settings from a file, the environment and flags, over the
//! real binary: a flag beats its variable, which beats the `--config`
//! file, which beats the default; `--help` names every variable.

#![allow(clippy::unwrap_used)]

use std::process::{Command, Stdio};

use metropolis_tests::{daemon_bin, free_port};

#[test]
fn a_flag_beats_the_environment_which_beats_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let port = |_| format!("127.0.0.1:{}", free_port());
    let [from_file, agent_from_file, agent_from_env, from_flag] = [0, 1, 2, 3].map(port);
    let config = dir.path().join("metropolisd.toml");
    std::fs::write(
        &config,
        format!(
            "data-dir = {:?}\nlisten = {from_file:?}\nagent-listen = {agent_from_file:?}\n\
             log-format = \"json\"\n",
            dir.path().join("data")
        ),
    )
    .unwrap();
    let log = dir.path().join("daemon.log");
    let mut child = Command::new(daemon_bin())
        .args(["--listen", &from_flag])
        .env("METROPOLIS_CONFIG", &config)
        .env("METROPOLIS_AGENT_LISTEN", &agent_from_env)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let serving = metropolis_tests::serving_line(&mut child, &log);
    child.kill().unwrap();
    child.wait().unwrap();
    let fields = &serving["fields"];
    assert_eq!(fields["listen"], from_flag.as_str(), "{serving}");
    assert_eq!(fields["agent_listen"], agent_from_env.as_str(), "{serving}");
    assert!(
        dir.path().join("data/pki/ca.pem").exists(),
        "data-dir from the file"
    );
}

#[test]
fn help_names_every_variable_and_a_bad_file_is_a_usage_error() {
    let help = Command::new(daemon_bin()).arg("--help").output().unwrap();
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    for variable in [
        "METROPOLIS_CONFIG",
        "METROPOLIS_LISTEN",
        "METROPOLIS_AGENT_LISTEN",
        "METROPOLIS_ETCD",
        "METROPOLIS_DEBUG_LISTEN",
    ] {
        assert!(
            text.contains(&format!("[env: {variable}=")),
            "{variable} in:\n{text}"
        );
    }
    assert!(text.contains("A flag beats its variable"), "{text}");

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "lisen = \"127.0.0.1:1\"\n").unwrap();
    let out = Command::new(daemon_bin())
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a usage error");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unknown key \"lisen\""), "{stderr}");
}

/// `bmaas-agent` reads its settings the same way, with its own prefix
/// (`BMAAS_AGENT_<FLAG>`): the file can give the flags the agent needs,
/// a variable beats the file, a flag beats both. Which key file won shows
/// in the error about it (none of them exists).
#[test]
fn the_agent_takes_its_settings_from_file_environment_and_flags() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bmaas-agent.toml");
    std::fs::write(
        &config,
        format!(
            "endpoint = \"127.0.0.1:1\"\nmachine-id = \"3b241101-e2bb-4255-8caf-4136c566a962\"\n\
             key = \"/nonexistent/from-file.pem\"\nca = \"/nonexistent/ca.pem\"\n\
             state-dir = {:?}\nregistry-ca = []\n",
            dir.path().join("state")
        ),
    )
    .unwrap();
    let agent = || {
        let mut c = Command::new(daemon_bin().with_file_name("bmaas-agent-under-test"));
        c.env_remove("BMAAS_AGENT_KEY")
            .env_remove("BMAAS_AGENT_CONFIG");
        c
    };
    let stderr = |c: &mut Command| {
        let out = c.output().unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let from_file = stderr(agent().arg("--config").arg(&config));
    assert!(
        from_file.contains("--key /nonexistent/from-file.pem"),
        "{from_file}"
    );
    let from_env = stderr(
        agent()
            .env("BMAAS_AGENT_CONFIG", &config)
            .env("BMAAS_AGENT_KEY", "/nonexistent/from-env.pem"),
    );
    assert!(
        from_env.contains("--key /nonexistent/from-env.pem"),
        "{from_env}"
    );
    let from_flag = stderr(
        agent()
            .arg("--config")
            .arg(&config)
            .env("BMAAS_AGENT_KEY", "/nonexistent/from-env.pem")
            .args(["--key", "/nonexistent/from-flag.pem"]),
    );
    assert!(
        from_flag.contains("--key /nonexistent/from-flag.pem"),
        "{from_flag}"
    );
    // An unknown key is a usage error naming it.
    std::fs::write(&config, "no-such-flag = 1\n").unwrap();
    let out = agent().arg("--config").arg(&config).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("unknown key \"no-such-flag\" (not a flag of bmaas-agent)"),
        "{text}"
    );
    let help = agent().arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("BMAAS_AGENT_ENDPOINT"), "{help}");
}
