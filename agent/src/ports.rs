//! What the agent's driver (`metropolis_service::agent_driver`)
//! reaches on a real machine: heartbeats over mutual TLS on tokio through
//! `metropolis-client` (the endpoints in turn, retried within one
//! heartbeat's deadline), the
//! state file, the host's hardware report and the installer on a blocking
//! thread; and a timer on the process's clock.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use metropolis_client::{Backoff, CallError, Client, ClientConfig, ClientError};
use metropolis_core::ports::Timer;
use metropolis_core::time::Instant;
use metropolis_node::clock::ProcessClock;
use metropolis_proto::prelude::agent;
use metropolis_runtime_tokio::rt::TokioRuntime;
use metropolis_service::agent_driver::{
    AgentPorts, HeartbeatError, InstallError, PersistError, RebootError,
};

use crate::hardware::gather_hardware_report;
use crate::install::{Installer, Progress, install_encoded_request};
use crate::progress::ProgressLog;
use crate::reboot::{RebootMethod, reboot};
use crate::write_last_acted;

/// The default of [`MachinePorts::heartbeat_timeout`] (the reference's).
pub const DEFAULT_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(10);

/// The agent's ports on this machine.
pub struct MachinePorts {
    /// The AgentCallback endpoints, with the agent's TLS configuration
    /// (its certificate, the curator roots): heartbeats go to the one that
    /// answered last, and to the next ones when it fails.
    pub client: Client,
    /// Where the last acted generation is kept.
    pub state_dir: PathBuf,
    /// Root of the filesystem the hardware report is read from.
    pub hardware_root: PathBuf,
    /// What installs.
    pub installer: Arc<dyn Installer>,
    /// How long one heartbeat may take, connecting and retries on other
    /// endpoints included.
    pub heartbeat_timeout: Duration,
    /// How the machine reboots after an install, when the loop asks.
    pub reboot: RebootMethod,
}

impl MachinePorts {
    /// Ports reaching the AgentCallback service at `endpoints` (each
    /// `host:port`) with `tls`, on the calling tokio runtime; `seed`
    /// seeds the jitter of retries within a heartbeat. Connects at the
    /// first heartbeat.
    pub fn new(
        endpoints: Vec<String>,
        tls: Arc<rustls::ClientConfig>,
        seed: u64,
        state_dir: PathBuf,
        hardware_root: PathBuf,
        installer: Arc<dyn Installer>,
    ) -> Result<MachinePorts, ClientError> {
        let mut config = ClientConfig::new(endpoints, Some(tls));
        // Retries stay well inside one heartbeat's deadline; the loop's
        // own backoff schedules the heartbeats after a failed one.
        config.backoff = Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(1),
            seed,
        };
        let client = Client::new(TokioRuntime::shared(), config)?;
        Ok(MachinePorts {
            client,
            state_dir,
            hardware_root,
            installer,
            heartbeat_timeout: DEFAULT_HEARTBEAT_TIMEOUT,
            reboot: RebootMethod::Kernel,
        })
    }
}

/// How long the connection to the curator is given to close before a
/// reboot (the reference's agent waits as long).
const CLOSE_BEFORE_REBOOT: std::time::Duration = std::time::Duration::from_secs(1);

impl AgentPorts for MachinePorts {
    fn heartbeat(
        &self,
        request: agent::HeartbeatRequest,
    ) -> BoxFuture<'static, Result<Option<Bytes>, HeartbeatError>> {
        let client = self.client.clone();
        let deadline = self.heartbeat_timeout;
        async move {
            match client.heartbeat_encoded(request, deadline).await {
                Ok(response) => Ok(response.installation_request),
                Err(CallError::Rejected {
                    code: tonic::Code::InvalidArgument,
                    message,
                    ..
                }) => {
                    // No retry changes such a heartbeat, but the agent
                    // keeps trying (with backoff) as the contract says:
                    // a curator may be fixed, or the machine registered
                    // anew. The operator is told what to check.
                    tracing::error!(
                        "the curator refused the heartbeat as invalid: {message}; check \
                         --machine-id (the agent keeps trying)"
                    );
                    Err(HeartbeatError::Invalid { message })
                }
                Err(CallError::Rejected {
                    endpoint,
                    code,
                    message,
                }) => Err(HeartbeatError::Refused {
                    code,
                    curator: Some(endpoint),
                    message,
                }),
                Err(e @ CallError::DeadlineExceeded { .. }) => Err(HeartbeatError::Unanswered {
                    reason: format!("{e} (--heartbeat-timeout)"),
                }),
                Err(e) => Err(HeartbeatError::Unanswered {
                    reason: e.to_string(),
                }),
            }
        }
        .boxed()
    }

    fn reboot(&self, generation: i64) -> Result<(), RebootError> {
        tracing::info!(generation, method = ?self.reboot, "rebooting");
        // As the reference's agent: close the connection to the curator
        // and give it a second to go (reboot(2) ends no connection; the
        // curator would hold it until its keepalive, and QEMU's user
        // networking mishandles connections left open), then reboot. The
        // runtime's other worker closes it while this one waits.
        self.client.close();
        std::thread::sleep(CLOSE_BEFORE_REBOOT);
        reboot(&self.reboot).map_err(|reason| RebootError::Failed { reason })
    }

    fn persist_last_acted(&self, generation: i64) -> Result<(), PersistError> {
        write_last_acted(&self.state_dir, generation).map_err(|e| PersistError::Write {
            place: self.state_dir.display().to_string(),
            reason: e.to_string(),
        })
    }

    fn install(
        &self,
        generation: i64,
        request: Bytes,
    ) -> BoxFuture<'static, Result<(), InstallError>> {
        let installer = self.installer.clone();
        tokio::task::spawn_blocking(move || install(installer.as_ref(), generation, &request))
            .map(|joined| {
                joined.unwrap_or_else(|e| {
                    Err(InstallError::Crashed {
                        reason: e.to_string(),
                    })
                })
            })
            .boxed()
    }

    fn hardware_report(&self) -> agent::AgentHardwareReport {
        gather_hardware_report(&self.hardware_root)
    }
}

fn install(
    installer: &dyn Installer,
    generation: i64,
    request: &Bytes,
) -> Result<(), InstallError> {
    let mut log = ProgressLog::new();
    let mut progress = |p: &Progress| {
        if let Some(line) = log.line(p, std::time::Instant::now()) {
            tracing::info!(generation, "installing: {line}");
        }
    };
    install_encoded_request(installer, request, &mut progress).map_err(|e| InstallError::Failed {
        reason: e.to_string(),
    })
}

/// Sleeps on tokio until an instant of the process's clock.
pub struct ProcessTimer(pub ProcessClock);

impl Timer for ProcessTimer {
    fn sleep_until(&self, deadline: Instant) -> BoxFuture<'static, ()> {
        tokio::time::sleep_until(self.0.instant(deadline).into()).boxed()
    }
}
