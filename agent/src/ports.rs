//! What the agent's driver (`metropolis_service::agent_driver`)
//! reaches on a real machine: heartbeats over mutual TLS on tokio through
//! `metropolis-client` (the endpoints in turn, retried within one
//! heartbeat's deadline), the
//! state file, the host's hardware report and the installer on a blocking
//! thread; and a timer on the process's clock.
//!
//! A heartbeat that failed for a reason no retry fixes (a `--ca` that
//! does not sign the curator's certificate, an `--endpoint` that is not an
//! AgentCallback port) is logged at once, as an error saying which flag to
//! check, and is tried again only after [`MachinePorts::interval`] (the
//! heartbeat interval): not retried like a network blip.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use metropolis_client::{Backoff, CallError, Client, ClientConfig, ClientError, Misconfiguration};
use metropolis_core::ports::Timer;
use metropolis_core::time::Instant;
use metropolis_node::clock::ProcessClock;
use metropolis_proto::prelude::agent;
use metropolis_proto::wire::EncodedHeartbeatResponse;
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

/// The default of [`MachinePorts::interval`] (`--interval`'s).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);

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
    /// How long a heartbeat that failed for a reason no retry fixes is
    /// held before it is reported failed (and the loop's backoff
    /// follows): the agent's `--interval`.
    pub interval: Duration,
    /// The last such failure logged, so that it is logged once (again
    /// after a heartbeat went through).
    logged: Arc<Mutex<Option<String>>>,
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
        // One attempt on one curator gets a third of the heartbeat's
        // deadline: a curator that stopped answering (paused, cut off)
        // costs that much, and the heartbeat goes on to the next one
        // within its deadline instead of ending with it. It is also the
        // HTTP/2 keepalive of the agent's connection.
        config.call_timeout = DEFAULT_HEARTBEAT_TIMEOUT / 3;
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
            interval: DEFAULT_INTERVAL,
            logged: Arc::new(Mutex::new(None)),
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
        let (interval, logged) = (self.interval, self.logged.clone());
        async move {
            let result = client.heartbeat_encoded(request, deadline).await;
            let Some(reason) = result.as_ref().err().and_then(permanent) else {
                if result.is_ok() {
                    *logged.lock().unwrap_or_else(|p| p.into_inner()) = None;
                }
                return heartbeat_result(result);
            };
            let first = {
                let mut logged = logged.lock().unwrap_or_else(|p| p.into_inner());
                let first = logged.as_deref() != Some(reason.as_str());
                *logged = Some(reason.clone());
                first
            };
            if first {
                tracing::error!(
                    "cannot heartbeat: {reason}; tried again after --interval ({} s)",
                    interval.as_secs_f64()
                );
            }
            tokio::time::sleep(interval).await;
            Err(HeartbeatError::Unanswered { reason })
        }
        .boxed()
    }

    fn reboot(&self, generation: i64) -> Result<(), RebootError> {
        let method = match &self.reboot {
            RebootMethod::Command(program) => format!("--reboot-command {}", program.display()),
            _ => "reboot(2)".to_string(),
        };
        tracing::info!(generation, %method, "rebooting");
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

/// What the agent makes of a heartbeat's outcome (a failure no retry
/// fixes excepted: see [`permanent`]).
fn heartbeat_result(
    result: Result<EncodedHeartbeatResponse, CallError>,
) -> Result<Option<Bytes>, HeartbeatError> {
    match result {
        Ok(response) => Ok(response.installation_request),
        Err(CallError::Rejected {
            code: tonic::Code::InvalidArgument,
            message,
            ..
        }) => {
            // No retry changes such a heartbeat, but the agent keeps
            // trying (with backoff) as the contract says: a curator may be
            // fixed, or the machine registered anew. The operator is told
            // what to check.
            tracing::error!(
                "the curator refused the heartbeat as invalid: {message}; check --machine-id \
                 (the agent keeps trying)"
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

/// What the operator reads for a heartbeat that failed for a reason no
/// retry fixes, naming the flag to check; `None` for any other failure.
fn permanent(error: &CallError) -> Option<String> {
    let check = match error {
        CallError::Misconfigured { problem, .. } => match problem {
            Misconfiguration::UntrustedServer | Misconfiguration::CertificateTime => "check --ca",
            Misconfiguration::CredentialRefused => "check --key and --ca",
            _ => "check --endpoint",
        },
        // The port serves other services (it says which port it is), or
        // the curator is of a version without AgentCallback.
        CallError::Rejected {
            code: tonic::Code::Unimplemented,
            ..
        } => "check --endpoint",
        _ => return None,
    };
    Some(format!("{error}; {check}"))
}

/// Sleeps on tokio until an instant of the process's clock.
pub struct ProcessTimer(pub ProcessClock);

impl Timer for ProcessTimer {
    fn sleep_until(&self, deadline: Instant) -> BoxFuture<'static, ()> {
        tokio::time::sleep_until(self.0.instant(deadline).into()).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_no_retry_fixes_name_the_flag_to_check() {
        let wrong_ca = CallError::Misconfigured {
            endpoint: "10.0.0.1:7836".into(),
            problem: Misconfiguration::UntrustedServer,
            reason: "invalid peer certificate: BadSignature".into(),
        };
        let said = permanent(&wrong_ca).unwrap_or_default();
        assert!(
            said.starts_with("10.0.0.1:7836: the server's certificate is not signed")
                && said.contains("(invalid peer certificate: BadSignature)")
                && said.ends_with("; check --ca"),
            "{said}"
        );
        let debug_port = CallError::Misconfigured {
            endpoint: "10.0.0.1:7837".into(),
            problem: Misconfiguration::NotTls,
            reason: "received corrupt message of type InvalidContentType".into(),
        };
        let said = permanent(&debug_port).unwrap_or_default();
        assert!(said.ends_with("; check --endpoint"), "{said}");
        let curator_port = CallError::Rejected {
            endpoint: "10.0.0.1:7835".into(),
            code: tonic::Code::Unimplemented,
            message: "this is the Curator port (metropolisd --listen); the AgentCallback \
                      service is on --agent-listen (default port 7836)"
                .into(),
        };
        let said = permanent(&curator_port).unwrap_or_default();
        assert!(
            said.starts_with("10.0.0.1:7835: Unimplemented: this is the Curator port")
                && said.contains("check --endpoint"),
            "{said}"
        );
        // What may pass is retried as before.
        for passing in [
            CallError::DeadlineExceeded {
                deadline: Duration::from_secs(10),
                attempts: 3,
                last: None,
            },
            CallError::Rejected {
                endpoint: "e".into(),
                code: tonic::Code::InvalidArgument,
                message: "machine_id".into(),
            },
        ] {
            assert_eq!(permanent(&passing), None, "{passing}");
        }
    }
}
