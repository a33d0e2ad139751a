//! `agent_loop`: the provisioning agent's [`AgentLoop`] against a
//! [`MachineRecord`] server and forged responses, under arbitrary
//! configurations, operator requests (valid or not), lost requests and
//! responses, install results (also for generations not installing),
//! restarts and time, including huge durations.
//!
//! Input: the configuration (interval, jitter, backoff, when to reboot;
//! see [`config`]),
//! the seed, the persisted last acted generation, then operations
//! (`op % 8`): 0 the operator submits a request (a valid one, or bytes
//! from the input); 1-2 the heartbeat in flight reaches the server and
//! its response the agent; 3 it is answered with a forged response (an
//! offer of any generation and bytes, or bytes decoded by
//! [`offered_request`]); 4 it fails (the server processed it or not);
//! 5 an install ends (for the running generation or any other); 6 the
//! agent restarts; 7 time passes.
//!
//! Checked: an invalid configuration is refused, naming a field; the last
//! acted generation is persisted before its install and only ever grows
//! (across restarts); no generation is installed twice (across restarts),
//! with the bytes of the offer that triggered it, never two at once; at
//! most one heartbeat in flight; the first heartbeat of a run carries no
//! hardware report; every report sent answers a generation this run
//! installed (with the result it got) or refuses one an earlier run acted
//! on; the loop never stalls (a heartbeat in flight or a timer set); the
//! next timer is never in the past after it fired; a reboot is asked for
//! only as configured (never; after a success; after any install), only
//! once that generation's report was acknowledged, never during an
//! install, and the machine restarting then never installs it again.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::Bytes;
use metropolis_core::provisioning::{
    Action, AgentConfig, AgentLoop, HeartbeatPlan, MachineRecord, RebootAfter, ReportResult,
    offered_request,
};
use metropolis_core::time::Instant;
use metropolis_proto::prelude::agent;
use metropolis_proto::prelude::agent::os_installation_request::Type;
use prost::Message;

use super::input::Input;

const ID: &str = "0f8fad5b-d9cb-469f-a165-70867728950e";

/// A duration in milliseconds: a `u16` scaled by `2^(shift % 48)`,
/// saturating, so that tiny, ordinary and absurd values all occur.
fn duration(input: &mut Input) -> Duration {
    let ms = u64::from(input.u16());
    let shift = u32::from(input.u8() % 48);
    Duration::from_millis(ms.saturating_mul(1u64 << shift))
}

/// A float from one byte, in steps of 1/64 (0 to ~4).
fn fraction(input: &mut Input) -> f64 {
    f64::from(input.u8()) / 64.0
}

/// Reads a configuration: interval, jitter low and spread, backoff base,
/// cap as a multiple of the base, backoff jitter. Zero values occur, so
/// invalid configurations do too.
pub fn config(input: &mut Input) -> AgentConfig {
    let interval = duration(input);
    let low = fraction(input);
    let spread = fraction(input);
    let backoff_base = duration(input);
    let cap = u32::from(input.u8());
    let backoff_jitter = fraction(input);
    let reboot_after = match input.u8() % 3 {
        0 => RebootAfter::Never,
        1 => RebootAfter::Success,
        _ => RebootAfter::Always,
    };
    AgentConfig {
        interval,
        jitter: (low, low + spread),
        backoff_base,
        backoff_cap: backoff_base.saturating_mul(cap),
        backoff_jitter,
        reboot_after,
    }
}

struct Sim {
    config: AgentConfig,
    seed: u64,
    now: Instant,
    server: MachineRecord,
    agent: AgentLoop,
    run: u32,
    disk_last_acted: Option<i64>,
    /// The last acted generation at the start of this run.
    acted_before: Option<i64>,
    just_persisted: Option<i64>,
    /// The offer the latest response carried, for the install it triggers.
    offered: Option<(i64, Bytes)>,
    in_flight: Option<HeartbeatPlan>,
    first_of_run: bool,
    installing: Option<i64>,
    installed: BTreeSet<i64>,
    /// Install results handed to the agent in this run.
    results: BTreeMap<i64, ReportResult>,
    /// The report the heartbeat in flight carries.
    carried: Option<(i64, ReportResult)>,
    /// Reports a heartbeat carried and was answered, in this run.
    acknowledged: BTreeMap<i64, ReportResult>,
    /// The loop asked for a reboot: the run ends (the machine restarts).
    rebooting: bool,
}

impl Sim {
    fn wall_ms(&self) -> i64 {
        1_700_000_000_000i64
            .saturating_add(i64::try_from(self.now.offset().as_millis()).unwrap_or(i64::MAX))
    }

    fn settle(&mut self) {
        for _ in 0..64 {
            while let Some(action) = self.agent.poll_action() {
                self.act(action);
                if self.rebooting {
                    // The machine restarts: nothing more of this run.
                    self.rebooting = false;
                    self.restart(false);
                }
            }
            match self.agent.poll_timeout() {
                Some(at) if at <= self.now => self.agent.handle_timeout(self.now),
                Some(_) => break,
                None => {
                    assert!(
                        self.in_flight.is_some(),
                        "no timer and no heartbeat in flight"
                    );
                    break;
                }
            }
        }
        assert!(
            self.agent.poll_timeout().is_none_or(|at| at > self.now),
            "a due timer was not fired"
        );
        assert_eq!(self.agent.last_acted_generation(), self.disk_last_acted);
        self.offered = None;
    }

    fn act(&mut self, action: Action) {
        match action {
            Action::PersistLastActed(generation) => {
                assert!(
                    self.disk_last_acted < Some(generation),
                    "persisting {generation} after {:?}",
                    self.disk_last_acted
                );
                assert!(generation >= 1, "persisting generation {generation}");
                self.disk_last_acted = Some(generation);
                self.just_persisted = Some(generation);
            }
            Action::Install {
                generation,
                request,
            } => {
                assert_eq!(
                    self.just_persisted.take(),
                    Some(generation),
                    "install of {generation} not right after its persist"
                );
                assert!(
                    self.installed.insert(generation),
                    "generation {generation} installed twice"
                );
                assert_eq!(self.installing, None, "two installs at once");
                assert_eq!(
                    self.offered.as_ref(),
                    Some(&(generation, request)),
                    "install of something not offered"
                );
                self.installing = Some(generation);
            }
            Action::Reboot { generation } => {
                // Only after that generation's report was acknowledged,
                // and as configured: after a success, or after any.
                let acknowledged = self.acknowledged.get(&generation);
                match self.config.reboot_after {
                    RebootAfter::Never => panic!("reboot after {generation} configured never"),
                    RebootAfter::Success => assert_eq!(
                        acknowledged,
                        Some(&ReportResult::Success),
                        "reboot after {generation} without its success acknowledged"
                    ),
                    RebootAfter::Always => assert!(
                        acknowledged.is_some(),
                        "reboot after {generation} without its report acknowledged"
                    ),
                }
                assert_eq!(self.installing, None, "reboot during an install");
                self.rebooting = true;
            }
            Action::SendHeartbeat(plan) => {
                assert!(self.in_flight.is_none(), "two heartbeats in flight");
                if self.first_of_run {
                    assert!(
                        !plan.include_hardware_report,
                        "first heartbeat carries hardware"
                    );
                    self.first_of_run = false;
                }
                self.carried = plan
                    .installation_report
                    .as_ref()
                    .map(|r| (r.generation, r.result.clone()));
                if let Some(report) = &plan.installation_report {
                    match self.results.get(&report.generation) {
                        Some(result) => assert_eq!(&report.result, result, "report changed"),
                        None => assert!(
                            matches!(&report.result, ReportResult::Error(e) if e.contains("submit a new request"))
                                && self.acted_before.is_some_and(|b| report.generation <= b),
                            "report {report:?} for nothing this run got"
                        ),
                    }
                }
                self.in_flight = Some(plan);
            }
        }
    }

    fn serve(&mut self, plan: &HeartbeatPlan) -> Option<Bytes> {
        let request = plan.to_request(ID, agent::AgentHardwareReport::default);
        let outcome = self.server.handle_heartbeat(&request, self.wall_ms());
        if let Some(bytes) = &outcome.response_request {
            let (generation, _) = offered_request(bytes.clone()).expect("stored request decodes");
            assert!(
                !self.server.reports.contains_key(&generation),
                "offered {generation}, which has a report"
            );
        }
        outcome.response_request
    }

    fn respond(&mut self, offer: Option<(i64, Bytes)>) {
        if let Some((generation, result)) = self.carried.take() {
            self.acknowledged.insert(generation, result);
        }
        self.offered = offer.clone();
        self.agent.handle_heartbeat_ok(self.now, offer);
    }

    fn restart(&mut self, processed: bool) {
        if let Some(plan) = self.in_flight.take()
            && processed
        {
            self.serve(&plan);
        }
        self.run += 1;
        self.installing = None;
        self.just_persisted = None;
        self.first_of_run = true;
        self.results.clear();
        self.carried = None;
        self.acknowledged.clear();
        self.acted_before = self.disk_last_acted;
        self.agent = AgentLoop::new(
            self.config.clone(),
            self.disk_last_acted,
            self.seed.wrapping_add(u64::from(self.run)),
            self.now,
        )
        .expect("the configuration was valid");
    }

    fn step(&mut self, input: &mut Input) {
        match input.u8() % 8 {
            0 => {
                let bytes = if input.bool() {
                    agent::OsInstallationRequest {
                        generation: 0,
                        r#type: Some(Type::Metropolis(agent::MetropolisInstallationRequest {
                            root_device: format!("/dev/disk{}", input.u8()),
                            ..Default::default()
                        })),
                    }
                    .encode_to_vec()
                } else {
                    input.lp().to_vec()
                };
                let before = self.server.next_generation();
                match self.server.submit_request(&bytes, 0) {
                    Ok(r) => assert_eq!(r.generation, before, "generation of a request"),
                    Err(e) => assert!(!e.to_string().is_empty()),
                }
            }
            1 | 2 => {
                if let Some(plan) = self.in_flight.take() {
                    let response = self.serve(&plan);
                    let offer =
                        response.map(|b| offered_request(b).expect("stored request decodes"));
                    self.respond(offer);
                }
            }
            3 => {
                if self.in_flight.take().is_some() {
                    let offer = if input.bool() {
                        let generation = i64::from(input.u8() as i8) + i64::from(input.u8()) * 256;
                        Some((generation, Bytes::copy_from_slice(input.lp())))
                    } else {
                        offered_request(Bytes::copy_from_slice(input.lp())).ok()
                    };
                    self.respond(offer);
                }
            }
            4 => {
                let processed = input.bool();
                if let Some(plan) = self.in_flight.take() {
                    if processed {
                        self.serve(&plan);
                    }
                    self.carried = None;
                    self.agent.handle_heartbeat_failed(self.now);
                }
            }
            5 => {
                let ok = input.bool();
                let other = input.u8();
                let result = if ok {
                    Ok(())
                } else {
                    Err(format!("install failed ({other})"))
                };
                let generation = match self.installing {
                    Some(g) if other < 200 => g,
                    _ => i64::from(other) - 100,
                };
                if self.installing == Some(generation) {
                    self.installing = None;
                    self.results.insert(generation, result.clone().into());
                    self.agent.handle_install_done(self.now, generation, result);
                } else {
                    // Not the running install: ignored.
                    let before = self.agent.pending_report().cloned();
                    self.agent.handle_install_done(self.now, generation, result);
                    assert_eq!(self.agent.pending_report().cloned(), before, "stray result");
                    assert_eq!(self.agent.installing(), self.installing, "stray result");
                }
            }
            6 => {
                let processed = input.bool();
                self.restart(processed);
            }
            _ => {
                let d = duration(input);
                self.now = self.now + d;
            }
        }
        self.settle();
    }
}

/// Runs one input; panics if a property fails.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let config = config(&mut input);
    let seed = input.u64();
    let last_acted = input.bool().then(|| i64::from(input.u8() as i8));
    let agent = match AgentLoop::new(config.clone(), last_acted, seed, Instant::ZERO) {
        Ok(agent) => agent,
        Err(e) => {
            assert!(config.validate().is_err());
            let field = e.to_string();
            assert!(
                [
                    "interval",
                    "jitter",
                    "backoff_base",
                    "backoff_cap",
                    "backoff_jitter"
                ]
                .iter()
                .any(|f| field.starts_with(f)),
                "{field}"
            );
            return;
        }
    };
    let mut sim = Sim {
        config,
        seed,
        now: Instant::ZERO,
        server: MachineRecord::new(ID, [1; 32]),
        agent,
        run: 0,
        disk_last_acted: last_acted,
        acted_before: last_acted,
        just_persisted: None,
        offered: None,
        in_flight: None,
        first_of_run: true,
        installing: None,
        installed: BTreeSet::new(),
        results: BTreeMap::new(),
        carried: None,
        acknowledged: BTreeMap::new(),
        rebooting: false,
    };
    sim.settle();
    let mut steps = 0;
    while !input.is_empty() && steps < 1000 {
        steps += 1;
        sim.step(&mut input);
    }
}
