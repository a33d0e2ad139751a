//! What `bmaas-agent` and `metroctl` say when their connection can never
//! work, as a user reads it: a `--ca` that does not sign the curator's
//! certificate is logged at once with the flag to check and tried again
//! only after `--interval` (not retried like a network blip), a client at
//! the wrong port of `metropolisd` is told which port that is and where
//! the service it wants is, and an agent stopped by SIGTERM says so.
//!
//! Needs nothing but the programs under test and loopback sockets.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use metropolis_pki::{ClientAuth, ClusterCa, server_config};
use metropolis_proto::prelude::agent::{
    HeartbeatRequest, HeartbeatResponse,
    agent_callback_server::{AgentCallback, AgentCallbackServer},
};
use metropolis_runtime_tokio::rt::TokioRuntime;
use metropolis_service::Router;
use metropolis_tests::proxy::{Proxy, copy_in_background};
use metropolis_tests::{AgentProcess, Daemon, RuntimeKind, daemon_bin};
use metropolis_transport::edge::EdgeLimits;
use metropolis_transport::listen;
use metropolis_transport::peer::AgentClassifier;
use metropolis_transport::shutdown::{ShutdownTrigger, shutdown_pair};

const MACHINE: &str = "6fa459ea-ee8a-4ca4-894e-db77e160355e";

/// Answers every heartbeat with nothing to install.
struct Idle;

#[tonic::async_trait]
impl AgentCallback for Idle {
    async fn heartbeat(
        &self,
        _: tonic::Request<HeartbeatRequest>,
    ) -> Result<tonic::Response<HeartbeatResponse>, tonic::Status> {
        Ok(tonic::Response::new(HeartbeatResponse::default()))
    }
}

/// An AgentCallback server on a loopback port presenting a curator
/// certificate of `ca`; its address, and what keeps it serving.
fn serve_curator_of(ca: &ClusterCa) -> (String, ShutdownTrigger) {
    let (creds, _) = ca.issue_curator_node(&[]).unwrap();
    let router = Router::new().with_service(AgentCallbackServer::new(Idle));
    let runtime = TokioRuntime::shared();
    let (listener, addr) = listen::bind_tcp(&runtime, "127.0.0.1:0".parse().unwrap()).unwrap();
    let (trigger, shutdown) = shutdown_pair();
    tokio::spawn(listen::serve_tls(
        runtime,
        listener,
        server_config(&creds, ClientAuth::Deferred).unwrap(),
        Arc::new(AgentClassifier),
        router,
        EdgeLimits::default(),
        shutdown,
    ));
    (addr.to_string(), trigger)
}

/// A `bmaas-agent` run by hand (its own `--ca`), killed when dropped.
struct Agent {
    child: Child,
    log: PathBuf,
}

impl Agent {
    /// An agent heartbeating to `endpoint` every `interval` seconds,
    /// trusting the CA certificate in `ca`, with a fresh key.
    fn start(dir: &Path, endpoint: &str, ca: &Path, interval: &str) -> Agent {
        let key = dir.join("agent.key");
        std::fs::write(&key, metropolis_pki::generate_agent_key().unwrap()).unwrap();
        let log = dir.join("agent.log");
        let child = Command::new(daemon_bin().with_file_name("bmaas-agent-under-test"))
            .args(["--endpoint", endpoint, "--machine-id", MACHINE])
            .arg("--key")
            .arg(&key)
            .arg("--ca")
            .arg(ca)
            .arg("--state-dir")
            .arg(dir.join("state"))
            .args(["--interval", interval, "--reboot", "never", "--log", "info"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Agent { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log once it holds `text`, waiting up to `within`.
    fn log_holding(&self, text: &str, within: Duration) -> String {
        let log = metropolis_tests::log_once_holding(&self.log, text, within);
        assert!(log.contains(text), "no {text:?} within {within:?}:\n{log}");
        log
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A CA certificate file of a cluster nobody serves.
fn foreign_ca(dir: &Path) -> PathBuf {
    let path = dir.join("foreign-ca.pem");
    std::fs::write(&path, ClusterCa::generate().unwrap().cert_pem()).unwrap();
    path
}

/// With a `--ca` that does not sign the curator's certificate, the first
/// heartbeat's failure is logged at once (not after the 10 s heartbeat
/// deadline) with what to check, and the agent tries again only after
/// `--interval` and its backoff: a handful of connections in 8 s, not a
/// retry every few hundred milliseconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_is_told_at_once_and_not_retried_like_a_blip() {
    let dir = tempfile::tempdir().unwrap();
    let (upstream, _serving) = serve_curator_of(&ClusterCa::generate().unwrap());
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    let proxy = Proxy::start(&upstream, move |client, server| {
        counted.fetch_add(1, Ordering::SeqCst);
        copy_in_background(client.try_clone().unwrap(), server.try_clone().unwrap());
        copy_in_background(server, client);
    });
    let started = Instant::now();
    let agent = Agent::start(dir.path(), &proxy.addr, &foreign_ca(dir.path()), "2");
    let log = agent.log_holding("cannot heartbeat", Duration::from_secs(5));
    let told = started.elapsed();
    assert!(told < Duration::from_secs(2), "told after {told:?}:\n{log}");
    assert!(
        log.contains("not signed by the CA") && log.contains("check --ca"),
        "{log}"
    );
    assert!(
        !log.contains("attempt(s)"),
        "retried within the heartbeat:\n{log}"
    );
    std::thread::sleep(Duration::from_secs(8).saturating_sub(started.elapsed()));
    let made = connections.load(Ordering::SeqCst);
    assert!(
        (2..=4).contains(&made),
        "{made} connections in 8 s (one per --interval of 2 s plus backoff expected):\n{}",
        agent.log()
    );
    // Logged once with its advice; the later tries are one line each.
    let log = agent.log();
    assert_eq!(log.matches("cannot heartbeat").count(), 1, "{log}");
}

/// An agent at the Curator port (or the debug port), metroctl at the
/// AgentCallback port, and metroctl's debug commands at either TLS port
/// are told which port that is and where to go, instead of a bare
/// `Unimplemented: no service at ...` or a broken frame.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_ports_say_which_port_they_are() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_debug(&dir.path().join("d"), RuntimeKind::Tokio, &[]);
    let key = dir.path().join("agent.key");
    std::fs::write(&key, metropolis_pki::generate_agent_key().unwrap()).unwrap();
    let at_curator = AgentProcess::start_at(&d.addr, &d, MACHINE, &key, &dir.path().join("a"), &[]);
    let debug_addr = d.debug_addr.clone().unwrap();
    let at_debug =
        AgentProcess::start_at(&debug_addr, &d, MACHINE, &key, &dir.path().join("b"), &[]);

    let out = Command::new(daemon_bin().with_file_name("metroctl-under-test"))
        .arg("--data-dir")
        .arg(&d.data_dir)
        .args(["--endpoints", &d.agent_addr, "node", "list"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains(
            "this is the AgentCallback port (metropolisd --agent-listen); the Curator and \
             management services are on --listen (default port 7835)"
        ),
        "{said}"
    );
    assert!(!said.contains("no service at"), "{said}");

    let wanted = [
        (
            &at_curator,
            "this is the Curator port (metropolisd --listen); the AgentCallback service is on \
             --agent-listen (default port 7836); check --endpoint",
        ),
        (&at_debug, "does not speak TLS"),
    ];
    for (agent, text) in wanted {
        let log = agent.log_once_it_holds(text, Duration::from_secs(5));
        assert!(log.contains(text), "no {text:?} within 5 s:\n{log}");
    }
    assert!(
        at_debug.log().contains("check --endpoint"),
        "{}",
        at_debug.log()
    );

    // metroctl's debug commands at either TLS port: told that it is a
    // curator port and where the debug service is, exit 3.
    for port in [&d.addr, &d.agent_addr] {
        let out = Command::new(daemon_bin().with_file_name("metroctl-under-test"))
            .args(["--debug-endpoint", port.as_str(), "logs", "--tail", "1"])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{said}");
        assert!(
            said.contains(&format!(
                "{port} speaks TLS: it is a curator port (metropolisd --listen or \
                 --agent-listen), not the debug service; give --debug-endpoint the daemon's \
                 --debug-listen address"
            )),
            "{said}"
        );
    }
}

/// An agent stopped by SIGTERM logs its stop and exits 0, as a service
/// manager expects; its log never shows `Some(...)` or `None`.
#[test]
fn a_stopped_agent_says_so() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens there: the agent retries until stopped.
    let mut agent = Agent::start(dir.path(), "127.0.0.1:1", &foreign_ca(dir.path()), "0.2");
    agent.log_holding("agent starting", Duration::from_secs(10));
    let ok = Command::new("kill")
        .arg("-TERM")
        .arg(agent.child.id().to_string())
        .status()
        .unwrap();
    assert!(ok.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = agent.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "still running:\n{}", agent.log());
        std::thread::sleep(Duration::from_millis(20));
    };
    let log = agent.log();
    assert_eq!(status.code(), Some(0), "{status}:\n{log}");
    assert!(log.contains("agent stopping on SIGTERM"), "{log}");
    assert!(log.contains("last_acted=none"), "{log}");
    assert!(!log.contains("Some(") && !log.contains("=None"), "{log}");
}
