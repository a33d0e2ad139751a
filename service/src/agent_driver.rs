//! The agent's driver, written once over ports: runs an [`AgentLoop`]
//! against a heartbeat transport, a durable record of the last acted
//! generation, an installer, a clock and a timer ([`drive_agent`]).
//! `bmaas-agent` runs it on tokio over mutual TLS; the simulator runs it on
//! its deterministic runtime over simulated gRPC.
//!
//! A heartbeat, an install and the loop's timer are in flight at once:
//! whichever finishes first is fed to the loop, and the loop's next
//! actions are carried out before waiting again.

use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use metropolis_proto::prelude::agent;

use metropolis_core::ports::{MonotonicClock, Timer};
use metropolis_core::provisioning::{Action, AgentLoop, offered_request};

/// What the agent's driver reaches the world through.
pub trait AgentPorts: Send + Sync + 'static {
    /// Sends one heartbeat; the installation request the server offered,
    /// as its encoded bytes, or why the heartbeat failed.
    fn heartbeat(
        &self,
        request: agent::HeartbeatRequest,
    ) -> BoxFuture<'static, Result<Option<Bytes>, String>>;

    /// Makes `generation` durable as the last generation acted on, before
    /// its install starts (a restarted agent must not act on it again).
    fn persist_last_acted(&self, generation: i64) -> Result<(), String>;

    /// Installs as the encoded `OSInstallationRequest` asks; resolves when
    /// the install is done. Dropping the future abandons the install's
    /// result, not necessarily the install.
    fn install(&self, generation: i64, request: Bytes) -> BoxFuture<'static, Result<(), String>>;

    /// The hardware report, for a heartbeat that carries one.
    fn hardware_report(&self) -> agent::AgentHardwareReport;

    /// Has the machine reboot (the report of `generation`'s install was
    /// delivered); returns once the reboot is under way, or why it cannot
    /// be.
    fn reboot(&self, generation: i64) -> Result<(), String>;
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
        error: String,
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
        error: String,
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
    Heartbeat(Result<Option<Bytes>, String>),
    Installed(i64, Result<(), String>),
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
    let mut heartbeat: Option<BoxFuture<'static, Result<Option<Bytes>, String>>> = None;
    let mut install: Option<(i64, BoxFuture<'static, Result<(), String>>)> = None;
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
                machine.handle_install_done(clock.now(), generation, result);
            }
            Woke::Timer => machine.handle_timeout(clock.now()),
        }
    }
}
