//! The agent's driver, written once over ports: runs an [`AgentLoop`]
//! against a heartbeat transport, a durable record of the last acted
//! generation, an installer, a clock and a timer ([`drive_agent`]).
//! `bmaas-agent` runs it on tokio over mutual TLS; the simulator runs it on
//! its deterministic runtime over simulated gRPC.
//!
//! A heartbeat, an install and the loop's timer are in flight at once:
//! whichever finishes first is fed to the loop, and the loop's next
//! actions are carried out before waiting again.
//!
//! The ports fail with typed errors that say what happened
//! ([`HeartbeatError`], [`PersistError`], [`InstallError`],
//! [`RebootError`]); their `Display` is what the agent's log shows, and a
//! failed install's is the installation report the operator reads.

use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use metropolis_proto::prelude::agent;

use metropolis_core::ports::{MonotonicClock, Timer};
use metropolis_core::provisioning::{Action, AgentLoop, offered_request};

/// Why a heartbeat brought no answer the agent can act on.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeartbeatError {
    /// A curator refused the heartbeat as invalid (a machine ID it does
    /// not take): it will refuse the same heartbeat again, but the loop
    /// keeps trying with backoff, with no give-up (the agent's contract);
    /// the agent tells its operator what to check.
    Invalid {
        /// The curator's message.
        message: String,
    },
    /// A curator refused the heartbeat for another reason (its view of
    /// the agent's credentials, its own state); a later heartbeat may
    /// pass.
    Refused {
        /// The code the curator answered with.
        code: tonic::Code,
        /// The curator that answered, when the transport knows it.
        curator: Option<String>,
        /// The curator's message (may be empty).
        message: String,
    },
    /// No curator answered: none could be reached, the connection broke,
    /// or the heartbeat's deadline passed first.
    Unanswered {
        /// What happened, for the log.
        reason: String,
    },
}

impl std::fmt::Display for HeartbeatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeartbeatError::Invalid { message } => write!(f, "InvalidArgument: {message}"),
            HeartbeatError::Refused {
                code,
                curator,
                message,
            } => {
                if let Some(curator) = curator {
                    write!(f, "{curator}: ")?;
                }
                // tonic's `Debug` of a code is its name (`Unavailable`).
                write!(f, "{code:?}")?;
                if message.is_empty() {
                    Ok(())
                } else {
                    write!(f, ": {message}")
                }
            }
            HeartbeatError::Unanswered { reason } => f.write_str(reason),
        }
    }
}

impl std::error::Error for HeartbeatError {}

/// Why the last acted generation could not be made durable.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PersistError {
    /// Writing the record failed.
    Write {
        /// Where the record is kept (the agent's state directory).
        place: String,
        /// The system's error.
        reason: String,
    },
}

impl std::fmt::Display for PersistError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PersistError::Write { place, reason } => write!(f, "{place}: {reason}"),
        }
    }
}

impl std::error::Error for PersistError {}

/// Why an install did not complete. Its `Display` is the installation
/// report's error, which the operator reads (`GetMachine`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InstallError {
    /// The installer ran and failed.
    Failed {
        /// The installer's reason, for the operator.
        reason: String,
    },
    /// The installer stopped without a result (its thread panicked or
    /// was cancelled).
    Crashed {
        /// What the runtime said of it.
        reason: String,
    },
}

impl std::fmt::Display for InstallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InstallError::Failed { reason } => f.write_str(reason),
            InstallError::Crashed { reason } => write!(f, "installer crashed: {reason}"),
        }
    }
}

impl std::error::Error for InstallError {}

/// Why the machine could not be made to reboot.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RebootError {
    /// The reboot could not be started, or what was to start it failed
    /// (the system call refused, the reboot command exited unsuccessfully).
    Failed {
        /// Why, for the operator.
        reason: String,
    },
    /// This agent has no machine it may reboot (an embedder's agent run
    /// where rebooting is not its to do).
    Unsupported {
        /// Why, for the operator.
        reason: String,
    },
}

impl std::fmt::Display for RebootError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RebootError::Failed { reason } | RebootError::Unsupported { reason } => {
                f.write_str(reason)
            }
        }
    }
}

impl std::error::Error for RebootError {}

/// What the agent's driver reaches the world through.
pub trait AgentPorts: Send + Sync + 'static {
    /// Sends one heartbeat; the installation request the server offered,
    /// as its encoded bytes, or why the heartbeat failed.
    fn heartbeat(
        &self,
        request: agent::HeartbeatRequest,
    ) -> BoxFuture<'static, Result<Option<Bytes>, HeartbeatError>>;

    /// Makes `generation` durable as the last generation acted on, before
    /// its install starts (a restarted agent must not act on it again).
    fn persist_last_acted(&self, generation: i64) -> Result<(), PersistError>;

    /// Installs as the encoded `OSInstallationRequest` asks; resolves when
    /// the install is done. Dropping the future abandons the install's
    /// result, not necessarily the install.
    fn install(
        &self,
        generation: i64,
        request: Bytes,
    ) -> BoxFuture<'static, Result<(), InstallError>>;

    /// The hardware report, for a heartbeat that carries one.
    fn hardware_report(&self) -> agent::AgentHardwareReport;

    /// Has the machine reboot (the report of `generation`'s install was
    /// delivered); returns once the reboot is under way, or why it cannot
    /// be.
    fn reboot(&self, generation: i64) -> Result<(), RebootError>;
}

/// Why [`drive_agent`] stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AgentStopped {
    /// The generation it was about to install could not be persisted, so
    /// it refused to install it.
    NotPersisted {
        /// The generation not persisted (and not installed).
        generation: i64,
        /// The port's error.
        error: PersistError,
    },
    /// The machine is rebooting after the install of `generation`.
    Rebooting {
        /// The install whose report was delivered.
        generation: i64,
    },
    /// The reboot after the install of `generation` failed.
    RebootFailed {
        /// The install whose report was delivered.
        generation: i64,
        /// The port's error.
        error: RebootError,
    },
}

impl std::fmt::Display for AgentStopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AgentStopped::NotPersisted { generation, error } => write!(
                f,
                "cannot persist generation {generation}, so not installing it: {error}"
            ),
            AgentStopped::Rebooting { generation } => {
                write!(f, "rebooting into what generation {generation} installed")
            }
            AgentStopped::RebootFailed { generation, error } => write!(
                f,
                "generation {generation} is installed and reported, but rebooting failed: {error}"
            ),
        }
    }
}

impl std::error::Error for AgentStopped {}

/// How far ahead to sleep when the loop wants no timer (it always wants
/// one while it runs; this only bounds the wait).
const NO_TIMER: Duration = Duration::from_secs(3600);

/// What ended one wait.
enum Woke {
    Heartbeat(Result<Option<Bytes>, HeartbeatError>),
    Installed(i64, Result<(), InstallError>),
    Timer,
}

/// Runs `machine` for the machine `machine_id` until a generation cannot
/// be persisted or the machine reboots; never returns otherwise.
pub async fn drive_agent(
    mut machine: AgentLoop,
    machine_id: String,
    ports: Arc<dyn AgentPorts>,
    clock: Arc<dyn MonotonicClock>,
    timer: Arc<dyn Timer>,
) -> AgentStopped {
    let mut heartbeat: Option<BoxFuture<'static, Result<Option<Bytes>, HeartbeatError>>> = None;
    let mut install: Option<(i64, BoxFuture<'static, Result<(), InstallError>>)> = None;
    loop {
        while let Some(action) = machine.poll_action() {
            match action {
                Action::SendHeartbeat(plan) => {
                    let request = plan.to_request(&machine_id, || ports.hardware_report());
                    heartbeat = Some(ports.heartbeat(request));
                }
                Action::PersistLastActed(generation) => {
                    if let Err(error) = ports.persist_last_acted(generation) {
                        tracing::error!(generation, %error, "cannot persist the generation; not installing");
                        return AgentStopped::NotPersisted { generation, error };
                    }
                }
                Action::Install {
                    generation,
                    request,
                } => {
                    tracing::info!(generation, "installing");
                    install = Some((generation, ports.install(generation, request)));
                }
                Action::Reboot { generation } => {
                    tracing::info!(generation, "installation reported; rebooting");
                    return match ports.reboot(generation) {
                        Ok(()) => AgentStopped::Rebooting { generation },
                        Err(error) => AgentStopped::RebootFailed { generation, error },
                    };
                }
            }
        }
        let deadline = machine
            .poll_timeout()
            .unwrap_or_else(|| clock.now() + NO_TIMER);
        let mut sleep = timer.sleep_until(deadline);
        let woke = futures::future::poll_fn(|cx| {
            if let Some(sent) = heartbeat.as_mut()
                && let Poll::Ready(result) = sent.as_mut().poll(cx)
            {
                return Poll::Ready(Woke::Heartbeat(result));
            }
            if let Some((generation, running)) = install.as_mut()
                && let Poll::Ready(result) = running.as_mut().poll(cx)
            {
                return Poll::Ready(Woke::Installed(*generation, result));
            }
            sleep.as_mut().poll(cx).map(|()| Woke::Timer)
        })
        .await;
        match woke {
            Woke::Heartbeat(Ok(offered)) => {
                heartbeat = None;
                let offered = match offered.map(offered_request).transpose() {
                    Ok(offered) => offered,
                    Err(error) => {
                        tracing::warn!(%error, "server offered an unreadable installation request");
                        None
                    }
                };
                machine.handle_heartbeat_ok(clock.now(), offered);
            }
            Woke::Heartbeat(Err(error)) => {
                heartbeat = None;
                tracing::warn!(%error, "heartbeat failed");
                machine.handle_heartbeat_failed(clock.now());
            }
            Woke::Installed(generation, result) => {
                install = None;
                match &result {
                    Ok(()) => tracing::info!(generation, "installation succeeded"),
                    Err(error) => tracing::error!(generation, %error, "installation failed"),
                }
                // The loop reports the error's text: what the operator reads.
                let result = result.map_err(|e| e.to_string());
                machine.handle_install_done(clock.now(), generation, result);
            }
            Woke::Timer => machine.handle_timeout(clock.now()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ports' errors read as the strings the ports returned before
    /// they were typed: the agent's log and the operator's installation
    /// report show them.
    #[test]
    fn port_errors_display_as_before() {
        let invalid = HeartbeatError::Invalid {
            message: "machine_id: not a UUID".into(),
        };
        assert_eq!(
            invalid.to_string(),
            "InvalidArgument: machine_id: not a UUID"
        );
        let refused = HeartbeatError::Refused {
            code: tonic::Code::Unauthenticated,
            curator: Some("10.0.0.1:7836".into()),
            message: "machine id or public key unknown".into(),
        };
        assert_eq!(
            refused.to_string(),
            "10.0.0.1:7836: Unauthenticated: machine id or public key unknown"
        );
        let bare = HeartbeatError::Refused {
            code: tonic::Code::Internal,
            curator: None,
            message: String::new(),
        };
        assert_eq!(bare.to_string(), "Internal");
        let persist = PersistError::Write {
            place: "/var/lib/agent".into(),
            reason: "No space left on device (os error 28)".into(),
        };
        assert_eq!(
            persist.to_string(),
            "/var/lib/agent: No space left on device (os error 28)"
        );
        let crashed = InstallError::Crashed {
            reason: "task 7 panicked".into(),
        };
        assert_eq!(crashed.to_string(), "installer crashed: task 7 panicked");
        let failed = InstallError::Failed {
            reason: "payload disk: chunk 2 is short".into(),
        };
        assert_eq!(failed.to_string(), "payload disk: chunk 2 is short");
        let reboot = RebootError::Failed {
            reason: "--reboot-command /bin/false exited with exit status: 1".into(),
        };
        assert_eq!(
            reboot.to_string(),
            "--reboot-command /bin/false exited with exit status: 1"
        );
    }
}
