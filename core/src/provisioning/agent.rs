//! The agent side: when to heartbeat, what each heartbeat carries, and
//! when to install, as a sans-IO machine.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use metropolis_proto::prelude::agent;
use prost::Message;

use super::{Report, ReportResult, RequestError};
use crate::time::Instant;

/// Timing of an [`AgentLoop`].
///
/// - Idle: after a successful heartbeat with nothing left to deliver, the
///   next one is due after `interval × U[jitter.0, jitter.1]` (uniform,
///   drawn from the loop's seed), so that a fleet started together drifts
///   apart instead of heartbeating in lockstep.
/// - Failing: after the `n`-th failure in a row the next attempt is due
///   after `d × U[1, 1 + backoff_jitter]` with
///   `d = min(backoff_base × 2^(n-1), backoff_cap)`: every delay lies in
///   `[backoff_base, backoff_cap × (1 + backoff_jitter)]`, and with
///   `backoff_jitter ≤ 1` each delay whose nominal `d` is below the cap is
///   at least the previous delay, so the delays grow until the cap. The
///   loop never gives up.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentConfig {
    /// The idle heartbeat interval (default 30 s).
    pub interval: Duration,
    /// The range the idle interval is scaled by, `(low, high)` with
    /// `0 < low ≤ high` (default `(0.8, 1.2)`).
    pub jitter: (f64, f64),
    /// The delay after the first failure (default 1 s).
    pub backoff_base: Duration,
    /// The largest nominal delay between failing attempts (default 60 s).
    pub backoff_cap: Duration,
    /// How much a failure delay is stretched at most, as a fraction of it
    /// (default 0.5: up to 50 % longer).
    pub backoff_jitter: f64,
    /// After which installs the machine reboots, once their report was
    /// delivered (default [`RebootAfter::Never`]).
    pub reboot_after: RebootAfter,
}

/// After which of its installs the agent has the machine reboot
/// ([`Action::Reboot`]), once the install's report was delivered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RebootAfter {
    /// Never: the agent keeps heartbeating (trials, tests, the simulator).
    #[default]
    Never,
    /// After a successful install: the machine boots what was installed.
    /// After a failed one the agent keeps heartbeating, so that a new
    /// generation can retry without a new takeover.
    Success,
    /// After every install, as the reference agent does.
    Always,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            interval: Duration::from_secs(30),
            jitter: (0.8, 1.2),
            backoff_base: Duration::from_secs(1),
            backoff_cap: Duration::from_secs(60),
            backoff_jitter: 0.5,
            reboot_after: RebootAfter::Never,
        }
    }
}

/// An [`AgentConfig`] the loop cannot run with.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A field has an unusable value.
    Field {
        /// The field, e.g. `jitter`.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Field { field, problem } => write!(f, "{field}: {problem}"),
        }
    }
}

impl std::error::Error for ConfigError {}

impl AgentConfig {
    /// Checks that every field is usable: positive durations, a cap not
    /// below the base, a finite jitter range with `0 < low ≤ high`, a
    /// finite non-negative `backoff_jitter`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field, problem: String| Err(ConfigError::Field { field, problem });
        if self.interval.is_zero() {
            return invalid("interval", "must be positive".into());
        }
        let (low, high) = self.jitter;
        if !(low.is_finite() && high.is_finite() && low > 0.0 && low <= high) {
            return invalid(
                "jitter",
                format!("must be finite with 0 < low ≤ high, is ({low}, {high})"),
            );
        }
        if self.backoff_base.is_zero() {
            return invalid("backoff_base", "must be positive".into());
        }
        if self.backoff_cap < self.backoff_base {
            return invalid(
                "backoff_cap",
                format!(
                    "must be at least backoff_base ({:?}), is {:?}",
                    self.backoff_base, self.backoff_cap
                ),
            );
        }
        if !(self.backoff_jitter.is_finite() && self.backoff_jitter >= 0.0) {
            return invalid(
                "backoff_jitter",
                format!("must be finite and ≥ 0, is {}", self.backoff_jitter),
            );
        }
        Ok(())
    }

    /// The nominal delay after `failures` failures in a row (at least 1):
    /// `min(backoff_base × 2^(failures-1), backoff_cap)`.
    pub fn nominal_backoff(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.backoff_base
            .saturating_mul(1u32 << doublings)
            .min(self.backoff_cap)
    }
}

/// What one heartbeat carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeartbeatPlan {
    /// Whether to gather and send the hardware report.
    pub include_hardware_report: bool,
    /// The installation report to send.
    pub installation_report: Option<Report>,
}

impl HeartbeatPlan {
    /// The `HeartbeatRequest` of this plan for `machine_id`; `hardware` is
    /// called only when the plan includes the hardware report.
    pub fn to_request(
        &self,
        machine_id: &str,
        hardware: impl FnOnce() -> agent::AgentHardwareReport,
    ) -> agent::HeartbeatRequest {
        agent::HeartbeatRequest {
            machine_id: machine_id.to_string(),
            hardware_report: self.include_hardware_report.then(hardware),
            installation_report: self.installation_report.as_ref().map(Report::to_proto),
        }
    }
}

/// Something the runtime must do for an [`AgentLoop`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send one `Heartbeat` as planned, then call
    /// [`AgentLoop::handle_heartbeat_ok`] or
    /// [`AgentLoop::handle_heartbeat_failed`].
    SendHeartbeat(HeartbeatPlan),
    /// Durably record that the agent acted on this generation; it is the
    /// `last_acted_generation` of the next [`AgentLoop::new`]. Always
    /// emitted right before the [`Action::Install`] it guards: the record
    /// must be durable before that install starts.
    PersistLastActed(i64),
    /// Install as the encoded `OSInstallationRequest` asks (bytes as
    /// received), then call [`AgentLoop::handle_install_done`].
    Install {
        /// The request's generation.
        generation: i64,
        /// The encoded `OSInstallationRequest`, as received.
        request: Bytes,
    },
    /// Reboot the machine: the report of `generation`'s install was
    /// delivered and [`AgentConfig::reboot_after`] asks for it. The loop
    /// asks for nothing after this.
    Reboot {
        /// The install whose outcome was delivered.
        generation: i64,
    },
}

/// Reads the generation of an offered encoded `OSInstallationRequest` (the
/// response's `installation_request`, kept as bytes), for
/// [`AgentLoop::handle_heartbeat_ok`].
pub fn offered_request(encoded: Bytes) -> Result<(i64, Bytes), RequestError> {
    let request =
        agent::OsInstallationRequest::decode(encoded.as_ref()).map_err(RequestError::Malformed)?;
    Ok((request.generation, encoded))
}

/// A small seeded generator (SplitMix64): the loop's only randomness.
#[derive(Clone, Debug)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `d × factor` for a finite `factor ≥ 0`, saturating.
fn scale(d: Duration, factor: f64) -> Duration {
    Duration::try_from_secs_f64(d.as_secs_f64() * factor).unwrap_or(Duration::MAX)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hardware {
    /// No heartbeat succeeded yet: heartbeats carry no hardware report.
    AwaitingFirstSuccess,
    /// Heartbeats carry the hardware report until one of them succeeds.
    Pending,
    /// A heartbeat carrying the hardware report succeeded.
    Acknowledged,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Heartbeat {
    /// The next heartbeat is due at this instant.
    Waiting(Instant),
    /// A heartbeat is due now: the next `poll_action` sends it.
    Due,
    /// One heartbeat is out, carrying this.
    InFlight(HeartbeatPlan),
}

/// The agent's heartbeat and installation loop, without I/O.
///
/// # Driving contract
///
/// Inputs, each with the current [`Instant`] (monotonic; an instant earlier
/// than one already given counts as the latest given):
/// - [`handle_timeout`](Self::handle_timeout) once the instant of
///   [`poll_timeout`](Self::poll_timeout) is reached;
/// - [`handle_heartbeat_ok`](Self::handle_heartbeat_ok) /
///   [`handle_heartbeat_failed`](Self::handle_heartbeat_failed) once per
///   [`Action::SendHeartbeat`]. The runtime bounds each heartbeat with a
///   deadline and reports running past it as a failure; a response that
///   was lost after the server processed the heartbeat is a failure too
///   (the re-send is harmless: the server keeps a report's first result);
/// - [`handle_install_done`](Self::handle_install_done) once per
///   [`Action::Install`].
///
/// Outputs: after every input (and after construction), call
/// [`poll_action`](Self::poll_action) until it returns `None` and carry
/// out the actions in order, then wait until
/// [`poll_timeout`](Self::poll_timeout) (`None`: until the next input).
///
/// # Behaviour (docs/spec/semantics.md, "The agent")
///
/// - The first heartbeat is due at construction and carries no hardware
///   report. Once a heartbeat succeeded, heartbeats carry the hardware
///   report until one carrying it succeeds.
/// - An installation report is re-sent with every heartbeat until a
///   heartbeat carrying it succeeds.
/// - At most one heartbeat is in flight. Heartbeats go on during an
///   install (they signal liveness); only offers are not acted on then.
/// - Whenever something is left to deliver after a success (the hardware
///   report, an installation report) the next heartbeat is due at once;
///   an install result makes a waiting heartbeat due at once, even during
///   a backoff. Otherwise the loop waits as [`AgentConfig`] says.
/// - An offered request is acted on only if its generation is above the
///   last acted generation (given at construction across restarts), no
///   install is running and no report is waiting for delivery (the server
///   offers it again with the next heartbeat). Acting emits
///   [`Action::PersistLastActed`], then [`Action::Install`].
/// - An offered request at or below the last acted generation *of an
///   earlier run* is not acted on, but answered once with an error report
///   saying so: its outcome was lost with the restart (or it was
///   superseded), and without a report the server would offer it forever.
///   Offers at or below a generation acted on in this run are ignored.
/// - Offers of a generation below 1 are ignored (no server issues one).
/// - Once the heartbeat carrying the report of an install of this run
///   succeeded, and [`AgentConfig::reboot_after`] asks for a reboot after
///   that outcome, the loop emits [`Action::Reboot`] and then nothing
///   more (no heartbeat, no timeout).
#[derive(Clone, Debug)]
pub struct AgentLoop {
    config: AgentConfig,
    rng: SplitMix64,
    now: Instant,
    heartbeat: Heartbeat,
    failures: u32,
    hardware: Hardware,
    report: Option<Report>,
    /// Whether `report` is the outcome of an install of this run.
    report_of_install: bool,
    /// Set once [`Action::Reboot`] was emitted.
    rebooting: bool,
    installing: Option<i64>,
    last_acted: Option<i64>,
    acted_before: Option<i64>,
    actions: VecDeque<Action>,
}

impl AgentLoop {
    /// A loop starting at `now`, whose first heartbeat is due at once.
    /// `last_acted_generation` is the latest persisted
    /// [`Action::PersistLastActed`] (`None` if never); `seed` drives the
    /// jitter, and should differ between agents and between runs.
    pub fn new(
        config: AgentConfig,
        last_acted_generation: Option<i64>,
        seed: u64,
        now: Instant,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(AgentLoop {
            config,
            rng: SplitMix64(seed),
            now,
            heartbeat: Heartbeat::Due,
            failures: 0,
            hardware: Hardware::AwaitingFirstSuccess,
            report: None,
            report_of_install: false,
            rebooting: false,
            installing: None,
            last_acted: last_acted_generation,
            acted_before: last_acted_generation,
            actions: VecDeque::new(),
        })
    }

    /// The next thing to do, or `None` until the next input.
    pub fn poll_action(&mut self) -> Option<Action> {
        if let Some(action) = self.actions.pop_front() {
            return Some(action);
        }
        if self.rebooting || self.heartbeat != Heartbeat::Due {
            return None;
        }
        let plan = HeartbeatPlan {
            include_hardware_report: self.hardware == Hardware::Pending,
            installation_report: self.report.clone(),
        };
        self.heartbeat = Heartbeat::InFlight(plan.clone());
        Some(Action::SendHeartbeat(plan))
    }

    /// When [`handle_timeout`](Self::handle_timeout) is next needed; `None`
    /// while a heartbeat is in flight.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.rebooting {
            return None;
        }
        match self.heartbeat {
            Heartbeat::Waiting(at) => Some(at),
            Heartbeat::Due => Some(self.now),
            Heartbeat::InFlight(_) => None,
        }
    }

    /// Time passed: a waiting heartbeat whose instant is reached is due.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.advance(now);
        if let Heartbeat::Waiting(at) = self.heartbeat
            && at <= self.now
        {
            self.heartbeat = Heartbeat::Due;
        }
    }

    /// The heartbeat in flight succeeded; `response_request` is the
    /// response's `installation_request` as (generation, encoded bytes),
    /// see [`offered_request`]. Ignored when no heartbeat is in flight.
    pub fn handle_heartbeat_ok(&mut self, now: Instant, response_request: Option<(i64, Bytes)>) {
        self.advance(now);
        let Heartbeat::InFlight(sent) = &self.heartbeat else {
            return;
        };
        let sent = sent.clone();
        self.failures = 0;
        self.hardware = match self.hardware {
            Hardware::AwaitingFirstSuccess => Hardware::Pending,
            Hardware::Pending if sent.include_hardware_report => Hardware::Acknowledged,
            other => other,
        };
        if sent.installation_report.is_some() && sent.installation_report == self.report {
            if let Some(delivered) = self.report.take()
                && self.report_of_install
                && match self.config.reboot_after {
                    RebootAfter::Never => false,
                    RebootAfter::Success => delivered.result.is_success(),
                    RebootAfter::Always => true,
                }
            {
                self.rebooting = true;
                self.actions.push_back(Action::Reboot {
                    generation: delivered.generation,
                });
            }
            self.report_of_install = false;
        }
        if let Some((generation, request)) = response_request {
            self.offer(generation, request);
        }
        self.heartbeat = if self.hardware == Hardware::Pending || self.report.is_some() {
            Heartbeat::Due
        } else {
            let (low, high) = self.config.jitter;
            let factor = low + (high - low) * self.rng.unit();
            Heartbeat::Waiting(self.now + scale(self.config.interval, factor))
        };
    }

    /// The heartbeat in flight failed, or its response was lost: nothing
    /// it carried counts as delivered, and the next attempt backs off.
    /// Ignored when no heartbeat is in flight.
    pub fn handle_heartbeat_failed(&mut self, now: Instant) {
        self.advance(now);
        if !matches!(self.heartbeat, Heartbeat::InFlight(_)) {
            return;
        }
        self.failures = self.failures.saturating_add(1);
        let nominal = self.config.nominal_backoff(self.failures);
        let stretch = scale(nominal, self.config.backoff_jitter * self.rng.unit());
        self.heartbeat = Heartbeat::Waiting(self.now + nominal.saturating_add(stretch));
    }

    /// The install of `generation` ended with `result`: its report goes
    /// out with the next heartbeat, which is due at once unless one is in
    /// flight. Ignored unless that install is running.
    pub fn handle_install_done(
        &mut self,
        now: Instant,
        generation: i64,
        result: Result<(), String>,
    ) {
        self.advance(now);
        if self.installing != Some(generation) {
            return;
        }
        self.installing = None;
        self.report = Some(Report {
            generation,
            result: result.into(),
        });
        self.report_of_install = true;
        if matches!(self.heartbeat, Heartbeat::Waiting(_)) {
            self.heartbeat = Heartbeat::Due;
        }
        if crate::canary_planted!(RebootBeforeDelivered)
            && self.config.reboot_after != RebootAfter::Never
            && self.report.as_ref().is_some_and(|r| r.result.is_success())
        {
            self.rebooting = true;
            self.actions.push_back(Action::Reboot { generation });
        }
    }

    /// The latest generation acted on, by this run or an earlier one.
    pub fn last_acted_generation(&self) -> Option<i64> {
        self.last_acted
    }

    /// The generation being installed.
    pub fn installing(&self) -> Option<i64> {
        self.installing
    }

    /// The installation report waiting for a heartbeat carrying it to
    /// succeed.
    pub fn pending_report(&self) -> Option<&Report> {
        self.report.as_ref()
    }

    /// Heartbeats failed in a row.
    pub fn consecutive_failures(&self) -> u32 {
        self.failures
    }

    /// Whether a heartbeat carrying the hardware report has succeeded.
    pub fn hardware_report_acknowledged(&self) -> bool {
        self.hardware == Hardware::Acknowledged
    }

    /// The loop's timing.
    pub fn config(&self) -> &AgentConfig {
        &self.config
    }

    fn advance(&mut self, now: Instant) {
        self.now = self.now.max(now);
    }

    /// The server offered `request` of `generation`.
    fn offer(&mut self, generation: i64, request: Bytes) {
        if generation < 1 || self.installing.is_some() || self.report.is_some() {
            return;
        }
        match self.last_acted {
            Some(last) if generation <= last => {
                let Some(before) = self.acted_before.filter(|&b| generation <= b) else {
                    // Acted on in this run, and its report delivered.
                    return;
                };
                let error = if generation == before {
                    format!(
                        "generation {generation}: the agent restarted after acting on this \
                         request and before reporting its outcome, which is unknown; submit \
                         a new request to retry"
                    )
                } else {
                    format!(
                        "generation {generation}: not acted on, as the agent already acted on \
                         the newer generation {before}; submit a new request to retry"
                    )
                };
                self.report = Some(Report {
                    generation,
                    result: ReportResult::Error(error),
                });
                self.report_of_install = false;
            }
            _ => {
                self.last_acted = Some(generation);
                self.installing = Some(generation);
                if !crate::canary_planted!(ForgetLastActed) {
                    self.actions.push_back(Action::PersistLastActed(generation));
                }
                self.actions.push_back(Action::Install {
                    generation,
                    request,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> Instant {
        Instant::from_offset(Duration::from_secs(secs))
    }

    fn new(last_acted: Option<i64>) -> AgentLoop {
        AgentLoop::new(AgentConfig::default(), last_acted, 1, at(0)).expect("valid config")
    }

    fn send(agent: &mut AgentLoop) -> HeartbeatPlan {
        match agent.poll_action() {
            Some(Action::SendHeartbeat(plan)) => plan,
            other => panic!("expected a heartbeat, got {other:?}"),
        }
    }

    fn drain(agent: &mut AgentLoop) -> Vec<Action> {
        std::iter::from_fn(|| agent.poll_action()).collect()
    }

    fn offer(generation: i64) -> Option<(i64, Bytes)> {
        Some((generation, Bytes::from(format!("request {generation}"))))
    }

    /// Runs an install of `generation` offered to `agent` to its end with
    /// success or failure, answering heartbeats until the one carrying its
    /// report succeeded; the actions after that.
    fn install_and_report(agent: &mut AgentLoop, generation: i64, ok: bool) -> Vec<Action> {
        send(agent);
        agent.handle_heartbeat_ok(at(1), offer(generation));
        let mut actions = drain(agent);
        assert!(
            actions
                .iter()
                .any(|a| matches!(a, Action::Install { generation: g, .. } if *g == generation)),
            "{actions:?}"
        );
        let result = if ok { Ok(()) } else { Err("bad".into()) };
        agent.handle_install_done(at(2), generation, result);
        for _ in 0..8 {
            let sent = actions.iter().rev().find_map(|a| match a {
                Action::SendHeartbeat(plan) => Some(plan.clone()),
                _ => None,
            });
            let plan = match sent {
                Some(plan) => plan,
                None => {
                    let due = agent.poll_timeout().expect("a heartbeat due");
                    agent.handle_timeout(due);
                    send(agent)
                }
            };
            agent.handle_heartbeat_ok(at(3), None);
            actions = drain(agent);
            if plan
                .installation_report
                .is_some_and(|r| r.generation == generation)
            {
                return actions;
            }
        }
        panic!("the report of generation {generation} never went out");
    }

    fn with_reboot(reboot_after: RebootAfter, last_acted: Option<i64>) -> AgentLoop {
        let config = AgentConfig {
            reboot_after,
            ..AgentConfig::default()
        };
        AgentLoop::new(config, last_acted, 1, at(0)).expect("valid config")
    }

    #[test]
    fn reboots_once_the_report_of_an_install_was_delivered_as_configured() {
        let reboot = |generation| vec![Action::Reboot { generation }];
        let mut agent = with_reboot(RebootAfter::Success, None);
        assert_eq!(install_and_report(&mut agent, 1, true), reboot(1));
        // Nothing after the reboot: no heartbeat, no timer.
        assert_eq!(agent.poll_action(), None);
        assert_eq!(agent.poll_timeout(), None);

        // A failure keeps the agent heartbeating, so a new generation can
        // retry; then its success reboots.
        let mut agent = with_reboot(RebootAfter::Success, None);
        assert_eq!(install_and_report(&mut agent, 1, false), vec![]);
        assert!(agent.poll_timeout().is_some());
        let next = agent.poll_timeout().expect("idle wait");
        agent.handle_timeout(next);
        assert_eq!(install_and_report(&mut agent, 2, true), reboot(2));

        let mut agent = with_reboot(RebootAfter::Always, None);
        assert_eq!(install_and_report(&mut agent, 1, false), reboot(1));
        let mut agent = with_reboot(RebootAfter::Never, None);
        assert_eq!(install_and_report(&mut agent, 1, true), vec![]);
        assert!(agent.poll_timeout().is_some());
    }

    #[test]
    fn a_lost_outcome_s_report_never_reboots() {
        let mut agent = with_reboot(RebootAfter::Always, Some(1));
        send(&mut agent);
        agent.handle_heartbeat_ok(at(1), offer(1));
        let plan = send(&mut agent);
        assert!(plan.installation_report.is_some());
        agent.handle_heartbeat_ok(at(1), None);
        assert_eq!(drain(&mut agent), vec![]);
        assert!(agent.poll_timeout().is_some());
    }

    #[test]
    fn hardware_report_follows_the_first_success() {
        let mut agent = new(None);
        assert!(!send(&mut agent).include_hardware_report);
        assert_eq!(agent.poll_action(), None);
        assert_eq!(agent.poll_timeout(), None);
        // A failure before any success: still no hardware report.
        agent.handle_heartbeat_failed(at(0));
        assert_eq!(agent.poll_action(), None);
        let retry = agent.poll_timeout().expect("retry scheduled");
        agent.handle_timeout(retry);
        assert!(!send(&mut agent).include_hardware_report);
        agent.handle_heartbeat_ok(at(2), None);
        // Due at once, with the hardware report, until acknowledged.
        assert!(send(&mut agent).include_hardware_report);
        agent.handle_heartbeat_failed(at(2));
        agent.handle_timeout(at(10));
        assert!(send(&mut agent).include_hardware_report);
        agent.handle_heartbeat_ok(at(10), None);
        assert!(agent.hardware_report_acknowledged());
        assert_eq!(agent.poll_action(), None);
        let next = agent.poll_timeout().expect("idle wait");
        let wait = next - at(10);
        assert!(
            wait >= Duration::from_secs(24) && wait <= Duration::from_secs(36),
            "{wait:?}"
        );
        agent.handle_timeout(next);
        assert!(!send(&mut agent).include_hardware_report);
    }

    #[test]
    fn persist_comes_before_install_and_no_generation_twice() {
        let mut agent = new(Some(1));
        send(&mut agent);
        agent.handle_heartbeat_ok(at(1), offer(1));
        // Generation 1 was acted on by an earlier run: answered, not acted on.
        let plan = send(&mut agent);
        let report = plan.installation_report.expect("error report");
        assert_eq!(report.generation, 1);
        assert!(matches!(report.result, ReportResult::Error(ref e) if e.contains("restarted")));
        agent.handle_heartbeat_ok(at(1), offer(2));
        assert_eq!(
            drain(&mut agent),
            vec![
                Action::PersistLastActed(2),
                Action::Install {
                    generation: 2,
                    request: Bytes::from("request 2")
                },
            ]
        );
        assert_eq!(agent.last_acted_generation(), Some(2));
        // Heartbeats go on during the install; re-offers are not acted on.
        let next = agent.poll_timeout().expect("idle wait");
        agent.handle_timeout(next);
        let plan = send(&mut agent);
        assert!(plan.installation_report.is_none());
        agent.handle_heartbeat_ok(next, offer(2));
        assert_eq!(drain(&mut agent), vec![]);
        let next = agent.poll_timeout().expect("idle wait");
        agent.handle_timeout(next);
        send(&mut agent);
        agent.handle_heartbeat_ok(next, offer(3));
        assert_eq!(drain(&mut agent), vec![]);
        assert_eq!(agent.installing(), Some(2));
        // The result goes out at once, and is re-sent until acknowledged.
        agent.handle_install_done(next, 2, Ok(()));
        let expected = Report {
            generation: 2,
            result: ReportResult::Success,
        };
        assert_eq!(
            send(&mut agent).installation_report.as_ref(),
            Some(&expected)
        );
        agent.handle_heartbeat_failed(next);
        agent.handle_timeout(next + Duration::from_secs(100));
        assert_eq!(
            send(&mut agent).installation_report.as_ref(),
            Some(&expected)
        );
        // The response may still carry generation 2 (sent before the
        // server processed the report): never installed twice.
        agent.handle_heartbeat_ok(next + Duration::from_secs(100), offer(2));
        assert_eq!(agent.pending_report(), None);
        assert_eq!(drain(&mut agent), vec![]);
    }

    #[test]
    fn offers_wait_for_the_pending_report() {
        let mut agent = new(None);
        send(&mut agent);
        agent.handle_heartbeat_ok(at(1), offer(1));
        assert_eq!(drain(&mut agent).len(), 3);
        agent.handle_install_done(at(2), 1, Err("no disk".into()));
        // A heartbeat is in flight (the hardware report); the result waits.
        agent.handle_heartbeat_ok(at(3), offer(2));
        assert_eq!(agent.installing(), None);
        let plan = send(&mut agent);
        assert_eq!(plan.installation_report.map(|r| r.generation), Some(1));
        agent.handle_heartbeat_ok(at(4), offer(2));
        assert_eq!(drain(&mut agent)[0], Action::PersistLastActed(2));
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let mut agent = new(None);
        let config = AgentConfig::default();
        let mut now = at(0);
        for failures in 1..=12u32 {
            send(&mut agent);
            agent.handle_heartbeat_failed(now);
            let next = agent.poll_timeout().expect("retry");
            let nominal = config.nominal_backoff(failures);
            let delay = next - now;
            assert!(
                delay >= nominal && delay <= nominal.mul_f64(1.5),
                "{delay:?}"
            );
            now = next;
            agent.handle_timeout(now);
        }
        assert_eq!(config.nominal_backoff(12), Duration::from_secs(60));
        assert_eq!(config.nominal_backoff(u32::MAX), Duration::from_secs(60));
    }

    #[test]
    fn invalid_config_names_the_field() {
        type Breaker = fn(&mut AgentConfig);
        let cases: [(&str, Breaker); 6] = [
            ("interval", |c| c.interval = Duration::ZERO),
            ("jitter", |c| c.jitter = (1.2, 0.8)),
            ("jitter", |c| c.jitter = (0.0, 1.0)),
            ("backoff_base", |c| c.backoff_base = Duration::ZERO),
            ("backoff_cap", |c| c.backoff_cap = Duration::from_millis(10)),
            ("backoff_jitter", |c| c.backoff_jitter = f64::NAN),
        ];
        for (field, break_it) in cases {
            let mut config = AgentConfig::default();
            break_it(&mut config);
            let err = AgentLoop::new(config, None, 0, at(0)).expect_err("invalid");
            assert!(err.to_string().starts_with(field), "{err}");
        }
    }

    #[test]
    fn plan_builds_the_request() {
        let plan = HeartbeatPlan {
            include_hardware_report: false,
            installation_report: Some(Report {
                generation: 3,
                result: ReportResult::Error("x".into()),
            }),
        };
        let request = plan.to_request("id", || panic!("not gathered"));
        assert_eq!(request.hardware_report, None);
        assert_eq!(request.installation_report.map(|r| r.generation), Some(3));
        let encoded = agent::OsInstallationRequest {
            generation: 9,
            r#type: None,
        }
        .encode_to_vec();
        let (generation, bytes) = offered_request(Bytes::from(encoded.clone())).expect("decodes");
        assert_eq!((generation, bytes.as_ref()), (9, encoded.as_slice()));
    }
}
