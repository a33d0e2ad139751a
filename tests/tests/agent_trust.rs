//! Whom `bmaas-agent` takes installation requests from: a rogue
//! AgentCallback server presenting an ordinary node certificate of the
//! cluster (which any node holds) is refused at the handshake, and the
//! agent never acts on what it would hand out; the real curator is
//! accepted.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use metropolis_pki::{ClientAuth, ClusterCa, Credentials, server_config};
use metropolis_proto::metropolis::node::core::curator::proto::private::GetMachineRequest;
use metropolis_proto::prelude::agent::{
    self, HeartbeatRequest, HeartbeatResponse,
    agent_callback_server::{AgentCallback, AgentCallbackServer},
};
use metropolis_proto::prelude::debug as api;
use metropolis_runtime_tokio::rt::TokioRuntime;
use metropolis_service::Router;
use metropolis_tests::{AgentProcess, Daemon, EnrolledMachine, RuntimeKind};
use metropolis_transport::edge::EdgeLimits;
use metropolis_transport::listen;
use metropolis_transport::peer::AgentClassifier;
use metropolis_transport::shutdown::{ShutdownTrigger, shutdown_pair};

const MACHINE: &str = "6fa459ea-ee8a-4ca4-894e-db77e160355e";

/// Answers every heartbeat with an installation request (generation 1,
/// onto `root_device`), counting the heartbeats it answered.
struct Rogue {
    answered: Arc<AtomicUsize>,
    root_device: String,
}

#[tonic::async_trait]
impl AgentCallback for Rogue {
    async fn heartbeat(
        &self,
        _: tonic::Request<HeartbeatRequest>,
    ) -> Result<tonic::Response<HeartbeatResponse>, tonic::Status> {
        self.answered.fetch_add(1, Ordering::SeqCst);
        Ok(tonic::Response::new(HeartbeatResponse {
            installation_request: Some(agent::OsInstallationRequest {
                generation: 1,
                r#type: Some(agent::os_installation_request::Type::Metropolis(
                    agent::MetropolisInstallationRequest {
                        os_image: Some(api::OsImageRef {
                            scheme: "http".into(),
                            host: "127.0.0.1:1".into(),
                            repository: "evil/os".into(),
                            tag: String::new(),
                            digest: format!("sha256:{}", "1".repeat(64)),
                        }),
                        node_parameters: None,
                        root_device: self.root_device.clone(),
                    },
                )),
            }),
        }))
    }
}

/// Serves `service` as AgentCallback over TLS with `creds` on a loopback
/// port, as the daemon's agent listener does; its address, and what
/// keeps it serving.
fn serve(
    creds: &Credentials,
    service: impl AgentCallback,
) -> (std::net::SocketAddr, ShutdownTrigger) {
    let router = Router::new().with_service(AgentCallbackServer::new(service));
    let runtime = TokioRuntime::shared();
    let (listener, addr) = listen::bind_tcp(&runtime, "127.0.0.1:0".parse().unwrap()).unwrap();
    let (trigger, shutdown) = shutdown_pair();
    tokio::spawn(listen::serve_tls(
        runtime,
        listener,
        server_config(creds, ClientAuth::Deferred).unwrap(),
        Arc::new(AgentClassifier),
        router,
        EdgeLimits::default(),
        shutdown,
    ));
    (addr, trigger)
}

fn ca_of(d: &Daemon) -> ClusterCa {
    let pki = d.data_dir.join("pki");
    ClusterCa::from_pem(
        &std::fs::read_to_string(pki.join("ca.pem")).unwrap(),
        &std::fs::read_to_string(pki.join("ca-key.pem")).unwrap(),
    )
    .unwrap()
}

fn last_acted(state: &Path) -> Option<String> {
    std::fs::read_to_string(state.join("last-acted-generation")).ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rogue_server_with_a_node_certificate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), RuntimeKind::Tokio);
    // An ordinary node's credential from the same CA, as a node joining
    // the cluster is issued: valid for TLS servers, not a curator's.
    let (rogue_creds, _) = ca_of(&d).issue_node(&[]).unwrap();
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let target = shm.path().join("disk.img");
    std::fs::write(&target, b"old").unwrap();
    let answered = Arc::new(AtomicUsize::new(0));
    let (addr, _trigger) = serve(
        &rogue_creds,
        Rogue {
            answered: answered.clone(),
            root_device: target.display().to_string(),
        },
    );

    // The agent, its key registered with the real curator, pointed at
    // the rogue (as a DNS or routing attack would).
    let EnrolledMachine {
        key_file,
        operator: mut op,
    } = d.enroll_machine(MACHINE, dir.path()).await;
    let state = dir.path().join("rogue-state");
    let allow = ["--allow-image-files"];
    let rogue_agent =
        AgentProcess::start_at(&addr.to_string(), &d, MACHINE, &key_file, &state, &allow);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !rogue_agent.log().contains("curator instance") {
        assert!(
            Instant::now() < deadline,
            "the agent did not say why it refused the server:\n{}",
            rogue_agent.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Several heartbeat intervals (0.2 s) later, still nothing reached it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(answered.load(Ordering::SeqCst), 0, "no call got through");
    assert_eq!(last_acted(&state), None, "no request was acted on");
    assert_eq!(std::fs::read(&target).unwrap(), b"old");
    drop(rogue_agent);

    // The same agent, key and CA, against the real curator: accepted.
    let agent = AgentProcess::start_with(&d, MACHINE, &key_file, &dir.path().join("state"), &allow);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let m = op
            .get_machine(GetMachineRequest {
                machine_id: MACHINE.into(),
            })
            .await
            .unwrap()
            .into_inner();
        if m.last_heartbeat_unix_ms > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "no heartbeat:\n{}", agent.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Refuses the first `refusals` heartbeats as InvalidArgument, then
/// answers without a request; counts the heartbeats.
struct Refusing {
    seen: Arc<AtomicUsize>,
    refusals: usize,
}

#[tonic::async_trait]
impl AgentCallback for Refusing {
    async fn heartbeat(
        &self,
        _: tonic::Request<HeartbeatRequest>,
    ) -> Result<tonic::Response<HeartbeatResponse>, tonic::Status> {
        if self.seen.fetch_add(1, Ordering::SeqCst) < self.refusals {
            return Err(tonic::Status::invalid_argument(
                "machine_id: not taken here",
            ));
        }
        Ok(tonic::Response::new(HeartbeatResponse::default()))
    }
}

/// A curator refusing heartbeats as invalid does not stop the agent: it
/// says what to check and keeps trying with backoff (no give-up), and
/// heartbeats on once the curator takes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_refused_as_invalid_are_tried_again() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), RuntimeKind::Tokio);
    // A curator's credential from the cluster's CA: the agent talks to it.
    let (creds, _) = ca_of(&d).issue_curator_node(&[]).unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let (addr, _trigger) = serve(
        &creds,
        Refusing {
            seen: seen.clone(),
            refusals: 3,
        },
    );
    let EnrolledMachine { key_file, .. } = d.enroll_machine(MACHINE, dir.path()).await;
    let state = dir.path().join("state");
    let mut agent = AgentProcess::start_at(&addr.to_string(), &d, MACHINE, &key_file, &state, &[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.load(Ordering::SeqCst) < 6 {
        assert!(
            Instant::now() < deadline,
            "{} heartbeats:\n{}",
            seen.load(Ordering::SeqCst),
            agent.log()
        );
        assert!(
            agent.wait_exit(Duration::from_millis(100)).is_none(),
            "the agent stopped:\n{}",
            agent.log()
        );
    }
    assert!(
        agent.log().contains("refused the heartbeat as invalid")
            && agent.log().contains("--machine-id"),
        "{}",
        agent.log()
    );
}

/// Holds the first heartbeat for a minute without answering, then
/// answers the others at once; counts them.
struct Stalling {
    seen: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl AgentCallback for Stalling {
    async fn heartbeat(
        &self,
        _: tonic::Request<HeartbeatRequest>,
    ) -> Result<tonic::Response<HeartbeatResponse>, tonic::Status> {
        if self.seen.fetch_add(1, Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        Ok(tonic::Response::new(HeartbeatResponse::default()))
    }
}

/// Each heartbeat has its own deadline: a curator that accepts a
/// heartbeat and never answers it holds the agent for --heartbeat-timeout
/// (1 s here), not for ever; the next heartbeat goes out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_heartbeat_ends_at_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), RuntimeKind::Tokio);
    let (creds, _) = ca_of(&d).issue_curator_node(&[]).unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let (addr, _trigger) = serve(&creds, Stalling { seen: seen.clone() });
    let EnrolledMachine { key_file, .. } = d.enroll_machine(MACHINE, dir.path()).await;
    let state = dir.path().join("state");
    let flags = ["--heartbeat-timeout", "1"];
    let agent = AgentProcess::start_at(&addr.to_string(), &d, MACHINE, &key_file, &state, &flags);
    // The first heartbeat reaches the server; from then on the next one
    // comes within its 1 s deadline and a backoff (the client's own
    // per-attempt limit, several seconds, would come later).
    while seen.load(Ordering::SeqCst) < 1 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stalled = Instant::now();
    while seen.load(Ordering::SeqCst) < 2 {
        assert!(
            stalled.elapsed() < Duration::from_secs(3),
            "the stalled heartbeat held the agent:\n{}",
            agent.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        agent.log().contains("--heartbeat-timeout"),
        "the log does not say which deadline passed:\n{}",
        agent.log()
    );
}
