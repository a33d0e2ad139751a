//! What the agent's driver (`metropolis_core::service::agent_driver`)
//! reaches on a real machine: heartbeats over mutual TLS on tokio, the
//! state file, the host's hardware report and the installer on a blocking
//! thread; and a timer on the process's clock.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use metropolis_core::ports::Timer;
use metropolis_core::service::agent_driver::AgentPorts;
use metropolis_core::time::Instant;
use metropolis_node::clock::ProcessClock;
use metropolis_proto::prelude::agent;
use metropolis_proto::wire::EncodedHeartbeatResponse;
use metropolis_runtime_tokio::rt::TokioRuntime;
use metropolis_transport::connect;
use metropolis_transport::grpc::Channel;

use crate::hardware::gather_hardware_report;
use crate::install::{Installer, Progress, install_encoded_request};
use crate::progress::ProgressLog;
use crate::reboot::{RebootMethod, reboot};
use crate::write_last_acted;

/// The default of [`MachinePorts::heartbeat_timeout`] (the reference's).
pub const DEFAULT_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(10);

/// The agent's ports on this machine.
pub struct MachinePorts {
    /// host:port of the AgentCallback service.
    pub endpoint: String,
    /// The client TLS configuration (the agent's certificate, the curator
    /// roots).
    pub tls: Arc<rustls::ClientConfig>,
    /// Where the last acted generation is kept.
    pub state_dir: PathBuf,
    /// Root of the filesystem the hardware report is read from.
    pub hardware_root: PathBuf,
    /// What installs.
    pub installer: Arc<dyn Installer>,
    /// How long one heartbeat may take (connecting included).
    pub heartbeat_timeout: Duration,
    /// How the machine reboots after an install, when the loop asks.
    pub reboot: RebootMethod,
    /// The connection of the last heartbeat that did not fail.
    channel: Arc<Mutex<Option<Channel>>>,
}

impl MachinePorts {
    /// Ports reaching `endpoint` with `tls`; connects at the first
    /// heartbeat.
    pub fn new(
        endpoint: String,
        tls: Arc<rustls::ClientConfig>,
        state_dir: PathBuf,
        hardware_root: PathBuf,
        installer: Arc<dyn Installer>,
    ) -> MachinePorts {
        MachinePorts {
            endpoint,
            tls,
            state_dir,
            hardware_root,
            installer,
            heartbeat_timeout: DEFAULT_HEARTBEAT_TIMEOUT,
            reboot: RebootMethod::Kernel,
            channel: Arc::default(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl AgentPorts for MachinePorts {
    fn heartbeat(
        &self,
        request: agent::HeartbeatRequest,
    ) -> BoxFuture<'static, Result<Option<Bytes>, String>> {
        let cached = lock(&self.channel).clone();
        let (endpoint, tls, slot) = (
            self.endpoint.clone(),
            self.tls.clone(),
            self.channel.clone(),
        );
        let timeout = self.heartbeat_timeout;
        let heartbeat = async move {
            let channel = match cached {
                Some(channel) => channel,
                None => connect::tls(&TokioRuntime::shared(), &endpoint, tls)
                    .await
                    .map_err(|e| format!("cannot connect: {e}"))?,
            };
            match send_heartbeat(channel.clone(), request).await {
                Ok(offered) => {
                    *lock(&slot) = Some(channel);
                    Ok(offered)
                }
                // The next heartbeat connects again.
                Err(status) => {
                    *lock(&slot) = None;
                    Err(format!("{:?}: {}", status.code(), status.message()))
                }
            }
        };
        let slot = self.channel.clone();
        async move {
            match tokio::time::timeout(timeout, heartbeat).await {
                Ok(result) => result,
                Err(_) => {
                    // The connection may be stuck: the next heartbeat
                    // connects again.
                    *lock(&slot) = None;
                    Err(format!(
                        "no answer within {:.1} s (--heartbeat-timeout)",
                        timeout.as_secs_f64()
                    ))
                }
            }
        }
        .boxed()
    }

    fn reboot(&self, generation: i64) -> Result<(), String> {
        tracing::info!(generation, method = ?self.reboot, "rebooting");
        // The connection ends with the process; nothing more is sent.
        *lock(&self.channel) = None;
        reboot(&self.reboot)
    }

    fn persist_last_acted(&self, generation: i64) -> Result<(), String> {
        write_last_acted(&self.state_dir, generation)
            .map_err(|e| format!("{}: {e}", self.state_dir.display()))
    }

    fn install(&self, generation: i64, request: Bytes) -> BoxFuture<'static, Result<(), String>> {
        let installer = self.installer.clone();
        tokio::task::spawn_blocking(move || install(installer.as_ref(), generation, &request))
            .map(|joined| joined.unwrap_or_else(|e| Err(format!("installer crashed: {e}"))))
            .boxed()
    }

    fn hardware_report(&self) -> agent::AgentHardwareReport {
        gather_hardware_report(&self.hardware_root)
    }
}

/// One heartbeat over `channel`; the offered request kept as bytes.
async fn send_heartbeat(
    channel: Channel,
    request: agent::HeartbeatRequest,
) -> Result<Option<Bytes>, tonic::Status> {
    let mut grpc = tonic::client::Grpc::with_origin(channel, Channel::origin());
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let path =
        http::uri::PathAndQuery::from_static("/cloud.bmaas.server.api.AgentCallback/Heartbeat");
    let codec =
        tonic_prost::ProstCodec::<agent::HeartbeatRequest, EncodedHeartbeatResponse>::default();
    let response = grpc
        .unary(tonic::Request::new(request), path, codec)
        .await?;
    Ok(response.into_inner().installation_request)
}

fn install(installer: &dyn Installer, generation: i64, request: &Bytes) -> Result<(), String> {
    let mut log = ProgressLog::new();
    let mut progress = |p: &Progress| {
        if let Some(line) = log.line(p, std::time::Instant::now()) {
            tracing::info!(generation, "installing: {line}");
        }
    };
    install_encoded_request(installer, request, &mut progress).map_err(|e| e.to_string())
}

/// Sleeps on tokio until an instant of the process's clock.
pub struct ProcessTimer(pub ProcessClock);

impl Timer for ProcessTimer {
    fn sleep_until(&self, deadline: Instant) -> BoxFuture<'static, ()> {
        tokio::time::sleep_until(self.0.instant(deadline).into()).boxed()
    }
}
