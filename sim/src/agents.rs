//! Provisioning agents: an [`AgentLoop`] per machine, heartbeating
//! through the curators (served by the leader against the machine record
//! in the store), installing what it is offered (with simulated failures),
//! and persisting the last acted generation across restarts.

use std::time::Duration;

use bytes::Bytes;
use metropolis_core::provisioning::{Action, AgentConfig, AgentLoop, offered_request};
use metropolis_proto::prelude::agent as agent_api;

use crate::canary::Canary;
use crate::ctx::Ctx;
use crate::msg::{Addr, Call, CallId, CallOk, Msg};
use crate::net::Time;
use crate::rng::splitmix64;

/// The machine ID of agent `i`.
pub fn machine_id(i: usize) -> String {
    format!("00000000-0000-4000-8000-{i:012x}")
}

/// The agents' timing: short, so that runs cover many heartbeats.
pub fn config() -> AgentConfig {
    AgentConfig {
        interval: Duration::from_secs(2),
        jitter: (0.8, 1.2),
        backoff_base: Duration::from_millis(200),
        backoff_cap: Duration::from_secs(2),
        backoff_jitter: 0.5,
    }
}

/// What survives an agent's restart.
#[derive(Clone, Debug, Default)]
pub struct Disk {
    /// The persisted last acted generation.
    pub last_acted: Option<i64>,
}

/// One agent process (one incarnation).
#[derive(Debug)]
pub struct Agent {
    /// The machine.
    pub machine: String,
    curators: Vec<Addr>,
    /// The loop.
    pub agent: AgentLoop,
    in_flight: Option<(CallId, Time)>,
    install: Option<(i64, Time, bool)>,
    /// Installs started (for the report).
    pub installs: u64,
}

impl Agent {
    /// Starts an agent (a fresh process) from what `disk` holds.
    pub fn new(ctx: &mut Ctx<'_>, machine: String, curators: Vec<Addr>, disk: &Disk) -> Agent {
        let mut seed = ctx.rng.next_u64();
        let seed = splitmix64(&mut seed);
        let agent = AgentLoop::new(config(), disk.last_acted, seed, ctx.local())
            .expect("the simulator's agent config is valid");
        Agent {
            machine,
            curators,
            agent,
            in_flight: None,
            install: None,
            installs: 0,
        }
    }

    fn drain(&mut self, ctx: &mut Ctx<'_>, disk: &mut Disk, install_fail: f64) {
        while let Some(action) = self.agent.poll_action() {
            match action {
                Action::SendHeartbeat(plan) => {
                    if let Some(report) = &plan.installation_report {
                        let result = match &report.result {
                            metropolis_core::provisioning::ReportResult::Success => Ok(()),
                            metropolis_core::provisioning::ReportResult::Error(e) => Err(e.clone()),
                        };
                        ctx.checks
                            .report_sent(&self.machine, report.generation, result);
                    }
                    let request =
                        plan.to_request(&self.machine, agent_api::AgentHardwareReport::default);
                    let call = ctx.fresh_id();
                    let to = self.curators[ctx.rng.index(self.curators.len())];
                    let timeout = Duration::from_secs(1);
                    self.in_flight = Some((call, ctx.now + timeout.as_micros() as u64));
                    ctx.wake_in(timeout);
                    ctx.send(
                        to,
                        Msg::Call {
                            call,
                            origin: call,
                            body: Call::Heartbeat { request },
                            timeout,
                            hops: 0,
                        },
                    );
                }
                Action::PersistLastActed(generation) => {
                    if ctx.canary != Canary::ForgetGeneration {
                        disk.last_acted = Some(generation);
                    }
                }
                Action::Install {
                    generation,
                    request,
                } => {
                    if ctx.canary != Canary::ForgetGeneration && disk.last_acted != Some(generation)
                    {
                        ctx.checks.fail(format!(
                            "machine {}: install of generation {generation} before it was persisted",
                            self.machine
                        ));
                    }
                    ctx.checks.installing(&self.machine, generation, &request);
                    self.installs += 1;
                    let done = ctx.now + ctx.rng.range(200_000, 3_000_000);
                    let ok = !ctx.rng.chance(install_fail);
                    self.install = Some((generation, done, ok));
                    ctx.wakes.push((ctx.me, done));
                }
            }
        }
        if let Some(at) = self.agent.poll_timeout() {
            ctx.wake_at_local(at);
        }
    }

    /// Timer: heartbeat deadlines, install completion, the loop's timer.
    pub fn tick(&mut self, ctx: &mut Ctx<'_>, disk: &mut Disk, install_fail: f64) {
        let now = ctx.local();
        if let Some((_, deadline)) = self.in_flight
            && ctx.now >= deadline
        {
            self.in_flight = None;
            self.agent.handle_heartbeat_failed(now);
        }
        if let Some((generation, done, ok)) = self.install
            && ctx.now >= done
        {
            self.install = None;
            let result = if ok {
                Ok(())
            } else {
                Err(format!(
                    "simulated install failure of generation {generation}"
                ))
            };
            self.agent.handle_install_done(now, generation, result);
        }
        self.agent.handle_timeout(now);
        self.drain(ctx, disk, install_fail);
        // One timer per process: ask again for every wake-up still needed.
        for at in [self.in_flight.map(|f| f.1), self.install.map(|i| i.1)]
            .into_iter()
            .flatten()
        {
            ctx.wakes.push((ctx.me, at));
        }
    }

    /// Handles one message.
    pub fn handle(&mut self, ctx: &mut Ctx<'_>, msg: Msg, disk: &mut Disk, install_fail: f64) {
        let now = ctx.local();
        if let Msg::CallReply { call, result } = msg
            && self.in_flight.is_some_and(|(c, _)| c == call)
        {
            self.in_flight = None;
            match result {
                Ok(CallOk::Heartbeat(offered)) => {
                    let offered: Option<(i64, Bytes)> = match offered.map(offered_request) {
                        Some(Ok(o)) => Some(o),
                        Some(Err(e)) => {
                            ctx.checks
                                .fail(format!("machine {}: undecodable offer: {e}", self.machine));
                            None
                        }
                        None => None,
                    };
                    self.agent.handle_heartbeat_ok(now, offered);
                }
                _ => self.agent.handle_heartbeat_failed(now),
            }
            self.drain(ctx, disk, install_fail);
        }
    }
}
