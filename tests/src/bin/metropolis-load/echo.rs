//! The echo server: the daemon's TLS and gRPC stack (deferred-client-auth
//! TLS 1.3 with a node credential, peer classification, `serve_connection`
//! per connection via `listen::serve_tls`, the authorizing `Router`) in
//! front of a Curator that answers `UpdateNodeStatus` at once and does not
//! implement `Watch`. Run as a separate process (`metropolis-load
//! serve-echo`), so its CPU is accounted apart from the client's.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::Stream;
use metropolis_pki::{ClientAuth, Credentials, server_config};
use metropolis_proto::prelude::curator;
use metropolis_proto::prelude::curator::curator_server::{Curator, CuratorServer};
use metropolis_runtime_tokio::rt::TokioRuntime;
use metropolis_service::Router;
use metropolis_transport::listen;
use metropolis_transport::peer::PeerClassifier;
use metropolis_transport::shutdown::shutdown_pair;
use tonic::{Request, Response, Status};

use super::daemon::tail;
use super::util::{Context, Result};

/// Arguments of the hidden `serve-echo` subcommand.
#[derive(clap::Args, Debug, Clone)]
pub struct EchoArgs {
    /// Address to listen on with TLS.
    #[arg(long, value_name = "ADDR")]
    pub listen: SocketAddr,
    /// Directory with the node credential to present (`node.pem`,
    /// `node-key.pem`, `ca.pem`); its CA also decides who is a node.
    #[arg(long, value_name = "DIR")]
    pub pki: PathBuf,
    /// Exit after this many seconds at the latest (the server also exits
    /// when its standard input closes, i.e. when the load tool goes away).
    #[arg(long, default_value_t = 900, value_name = "SECONDS")]
    pub max_seconds: u64,
}

/// A Curator that acknowledges every status update without doing anything.
struct EchoCurator;

type NoStream =
    Pin<Box<dyn Stream<Item = std::result::Result<curator::WatchEvent, Status>> + Send>>;

#[tonic::async_trait]
impl Curator for EchoCurator {
    type WatchStream = NoStream;

    async fn watch(
        &self,
        _request: Request<curator::WatchRequest>,
    ) -> std::result::Result<Response<NoStream>, Status> {
        Err(Status::unimplemented("the echo server has no Watch"))
    }

    async fn update_node_status(
        &self,
        _request: Request<curator::UpdateNodeStatusRequest>,
    ) -> std::result::Result<Response<curator::UpdateNodeStatusResponse>, Status> {
        Ok(Response::new(curator::UpdateNodeStatusResponse {}))
    }
}

/// An AgentCallback that answers every heartbeat with nothing to do.
struct EchoAgent;

#[tonic::async_trait]
impl metropolis_proto::prelude::agent::agent_callback_server::AgentCallback for EchoAgent {
    async fn heartbeat(
        &self,
        _request: Request<metropolis_proto::prelude::agent::HeartbeatRequest>,
    ) -> std::result::Result<Response<metropolis_proto::prelude::agent::HeartbeatResponse>, Status>
    {
        Ok(Response::new(Default::default()))
    }
}

/// Body of `serve-echo`: serves until stdin closes or `max_seconds` pass.
pub async fn serve(args: EchoArgs) -> Result<()> {
    let creds = Credentials::read_from_dir(&args.pki, "node")
        .context(|| format!("reading the node credential in {}", args.pki.display()))?;
    let tls = server_config(&creds, ClientAuth::Deferred)
        .context(|| "building the TLS server configuration".into())?;
    let classifier = Arc::new(
        PeerClassifier::new(creds.ca_der()?).context(|| "building the peer classifier".into())?,
    );
    let router = Router::new()
        .with_service(CuratorServer::new(EchoCurator))
        .with_service(
            metropolis_proto::prelude::agent::agent_callback_server::AgentCallbackServer::new(
                EchoAgent,
            ),
        );
    let runtime = TokioRuntime::shared();
    let (listener, _) = listen::bind_tcp(&runtime, args.listen)
        .context(|| format!("{}: cannot listen", args.listen))?;
    eprintln!("serve-echo: listening on {}", args.listen);

    let (trigger, shutdown) = shutdown_pair();
    // Standard input closing means the load tool is gone (or done).
    let (stdin_tx, stdin_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        let _ = stdin_tx.send(());
    });
    let server = tokio::spawn(listen::serve_tls(
        runtime,
        listener,
        tls,
        classifier,
        router,
        metropolis_transport::edge::EdgeLimits::default(),
        shutdown,
    ));
    tokio::select! {
        _ = stdin_rx => eprintln!("serve-echo: standard input closed, stopping"),
        _ = tokio::time::sleep(Duration::from_secs(args.max_seconds)) => {
            eprintln!("serve-echo: --max-seconds reached, stopping");
        }
    }
    trigger.trigger();
    let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
    Ok(())
}

/// A `serve-echo` child process; stopped when dropped.
pub struct EchoProcess {
    child: Option<Child>,
    log: PathBuf,
}

impl EchoProcess {
    /// Re-executes this binary as `serve-echo --listen addr --pki pki`,
    /// logging to `log`, and waits up to 10 s until it accepts connections.
    pub fn start(addr: &str, pki: &Path, log: &Path) -> Result<EchoProcess> {
        let exe = std::env::current_exe().context(|| "locating the running executable".into())?;
        let log_file =
            std::fs::File::create(log).context(|| format!("creating {}", log.display()))?;
        let child = Command::new(&exe)
            .arg("serve-echo")
            .arg("--listen")
            .arg(addr)
            .arg("--pki")
            .arg(pki)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .context(|| format!("starting {} serve-echo", exe.display()))?;
        let mut echo = EchoProcess {
            child: Some(child),
            log: log.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            echo.check_alive()?;
            if std::net::TcpStream::connect(addr).is_ok() {
                return Ok(echo);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "the echo server did not listen on {addr} within 10 s; its log:\n{}",
                    tail(&echo.log, 20)
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// An error (with its log) if the echo server exited.
    pub fn check_alive(&mut self) -> Result<()> {
        let Some(child) = self.child.as_mut() else {
            return Err("the echo server was stopped".into());
        };
        match child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!(
                "the echo server exited with {status}; its log ({}):\n{}",
                self.log.display(),
                tail(&self.log, 20)
            )
            .into()),
            Err(e) => Err(format!("checking the echo process: {e}").into()),
        }
    }

    /// Its process ID.
    pub fn pid(&self) -> Result<u32> {
        self.child
            .as_ref()
            .map(Child::id)
            .ok_or_else(|| "the echo server was stopped".into())
    }

    /// Closes its standard input (it then exits by itself), waits up to
    /// 3 s, then kills it.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        drop(child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for EchoProcess {
    fn drop(&mut self) {
        self.stop();
    }
}
