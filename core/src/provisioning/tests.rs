//! Property tests: a [`MachineRecord`] server and an [`AgentLoop`] agent
//! run together under random interleavings of operator requests, lost
//! heartbeats, lost responses (the server processed the heartbeat, the
//! agent saw a failure), install results, agent restarts and time. Checked:
//! no generation is installed twice (across restarts too), the last acted
//! generation is persisted before its install, the server never offers a
//! generation that has a report and never changes a stored report, the
//! first heartbeat of a run carries no hardware report, the agent never
//! stalls, and once faults stop every result of the running agent and the
//! current request are reported within a bounded time. Separately: backoff
//! and idle delays stay within their bounds and backoff grows, and the
//! same seed and inputs give the same actions.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::Bytes;
use metropolis_proto::prelude::agent;
use metropolis_proto::prelude::agent::os_installation_request::Type;
use proptest::prelude::*;
use prost::Message;

use super::*;
use crate::time::Instant;

const ID: &str = "0f8fad5b-d9cb-469f-a165-70867728950e";
const EPOCH_MS: i64 = 1_700_000_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    /// The heartbeat reached the server and its response the agent.
    Ok,
    /// The heartbeat never reached the server.
    LostRequest,
    /// The server processed the heartbeat; the response got lost.
    LostResponse,
}

#[derive(Clone, Debug)]
enum Step {
    /// The operator submits a request, optionally with a field unknown to
    /// this build.
    Submit { unknown_field: bool },
    /// The heartbeat in flight (if any) meets its fate.
    Deliver(Fate),
    /// The running install (if any) ends.
    InstallDone { ok: bool },
    /// The agent process restarts; a heartbeat in flight was processed by
    /// the server or not.
    Restart { in_flight_processed: bool },
    /// Time passes.
    Advance { ms: u64 },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => any::<bool>().prop_map(|unknown_field| Step::Submit { unknown_field }),
        5 => Just(Step::Deliver(Fate::Ok)),
        1 => Just(Step::Deliver(Fate::LostRequest)),
        1 => Just(Step::Deliver(Fate::LostResponse)),
        2 => any::<bool>().prop_map(|ok| Step::InstallDone { ok }),
        1 => any::<bool>().prop_map(|in_flight_processed| Step::Restart { in_flight_processed }),
        3 => (0u64..120_000).prop_map(|ms| Step::Advance { ms }),
    ]
}

fn config() -> impl Strategy<Value = AgentConfig> {
    (
        1u64..60,
        0.5f64..1.0,
        0.0f64..0.5,
        100u64..2_000,
        1u32..64,
        0.0f64..1.0,
    )
        .prop_map(
            |(interval, low, spread, base, cap, backoff_jitter)| AgentConfig {
                interval: Duration::from_secs(interval),
                jitter: (low, low + spread),
                backoff_base: Duration::from_millis(base),
                backoff_cap: Duration::from_millis(base) * cap,
                backoff_jitter,
                reboot_after: RebootAfter::Never,
            },
        )
}

/// Whether `result` is the agent's refusal of a request an earlier run
/// acted on.
fn is_refusal(result: &ReportResult) -> bool {
    matches!(result, ReportResult::Error(e) if e.contains("submit a new request to retry"))
}

struct Sim {
    config: AgentConfig,
    seed: u64,
    now: Instant,
    server: MachineRecord,
    agent: AgentLoop,
    run: u32,
    /// The agent's durable last acted generation.
    disk_last_acted: Option<i64>,
    /// The generation whose persist came last, awaiting its install.
    just_persisted: Option<i64>,
    in_flight: Option<HeartbeatPlan>,
    first_of_run: bool,
    installing: Option<i64>,
    installed: BTreeSet<i64>,
    submitted: BTreeMap<i64, Bytes>,
    /// Install results handed to the agent, with the run that got them.
    results: BTreeMap<i64, (u32, ReportResult)>,
    /// Every report the server stored, as first stored.
    stored: BTreeMap<i64, InstallationReport>,
    log: Vec<(Instant, Action)>,
}

impl Sim {
    fn new(config: AgentConfig, seed: u64) -> Self {
        let agent =
            AgentLoop::new(config.clone(), None, seed, Instant::ZERO).expect("valid config");
        let mut sim = Sim {
            config,
            seed,
            now: Instant::ZERO,
            server: MachineRecord::new(ID, [1; 32]),
            agent,
            run: 0,
            disk_last_acted: None,
            just_persisted: None,
            in_flight: None,
            first_of_run: true,
            installing: None,
            installed: BTreeSet::new(),
            submitted: BTreeMap::new(),
            results: BTreeMap::new(),
            stored: BTreeMap::new(),
            log: Vec::new(),
        };
        sim.settle();
        sim
    }

    fn wall_ms(&self) -> i64 {
        EPOCH_MS + self.now.offset().as_millis() as i64
    }

    /// Carries out every action, and fires the timer if it is due.
    fn settle(&mut self) {
        loop {
            while let Some(action) = self.agent.poll_action() {
                self.log.push((self.now, action.clone()));
                self.act(action);
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
        assert_eq!(self.agent.last_acted_generation(), self.disk_last_acted);
    }

    fn act(&mut self, action: Action) {
        match action {
            Action::Reboot { generation } => {
                panic!("reboot after generation {generation} with reboot_after Never")
            }
            Action::PersistLastActed(generation) => {
                assert!(
                    self.disk_last_acted < Some(generation),
                    "persisting {generation} after {:?}",
                    self.disk_last_acted
                );
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
                    Some(&request),
                    self.submitted.get(&generation),
                    "request bytes changed"
                );
                self.installing = Some(generation);
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
                self.in_flight = Some(plan);
            }
        }
    }

    /// The server processes `plan`; returns its response.
    fn serve(&mut self, plan: &HeartbeatPlan) -> Option<Bytes> {
        let request = plan.to_request(ID, || agent::AgentHardwareReport {
            report: None,
            warning: vec!["simulated".to_string()],
        });
        let outcome = self.server.handle_heartbeat(&request, self.wall_ms());
        for (generation, report) in &self.server.reports {
            match self.stored.get(generation) {
                Some(first) => assert_eq!(first, report, "report of {generation} changed"),
                None => {
                    match self.results.get(generation) {
                        Some((run, result)) => assert!(
                            *result == report.result
                                || (*run != self.run && is_refusal(&report.result)),
                            "stored {report:?}, agent got {result:?} in run {run}"
                        ),
                        None => assert!(
                            is_refusal(&report.result),
                            "stored {report:?} for no result"
                        ),
                    }
                    self.stored.insert(*generation, report.clone());
                }
            }
        }
        if let Some(bytes) = &outcome.response_request {
            let generation = agent::OsInstallationRequest::decode(bytes.as_ref())
                .expect("stored request decodes")
                .generation;
            assert!(
                !self.server.reports.contains_key(&generation),
                "offered {generation}, which has a report"
            );
            assert_eq!(self.server.current_generation(), Some(generation));
            assert_eq!(self.submitted.get(&generation), Some(bytes));
        }
        outcome.response_request
    }

    fn apply(&mut self, step: &Step) {
        match *step {
            Step::Submit { unknown_field } => {
                let mut bytes = agent::OsInstallationRequest {
                    generation: 0,
                    r#type: Some(Type::Metropolis(agent::MetropolisInstallationRequest {
                        root_device: format!("/dev/disk{}", self.submitted.len()),
                        ..Default::default()
                    })),
                }
                .encode_to_vec();
                if unknown_field {
                    bytes.extend_from_slice(&[0x98, 0x06, 0x07]);
                }
                let request = self
                    .server
                    .submit_request(&bytes, 0)
                    .expect("valid request");
                assert_eq!(&request.encoded[..bytes.len()], &bytes[..]);
                self.submitted.insert(request.generation, request.encoded);
            }
            Step::Deliver(fate) => {
                let Some(plan) = self.in_flight.take() else {
                    return;
                };
                match fate {
                    Fate::LostRequest => self.agent.handle_heartbeat_failed(self.now),
                    Fate::LostResponse => {
                        self.serve(&plan);
                        self.agent.handle_heartbeat_failed(self.now);
                    }
                    Fate::Ok => {
                        let response = self.serve(&plan);
                        let offered =
                            response.map(|b| offered_request(b).expect("offered request decodes"));
                        self.agent.handle_heartbeat_ok(self.now, offered);
                    }
                }
            }
            Step::InstallDone { ok } => {
                let Some(generation) = self.installing.take() else {
                    return;
                };
                let result = if ok {
                    Ok(())
                } else {
                    Err(format!("install of {generation} failed"))
                };
                self.results
                    .insert(generation, (self.run, result.clone().into()));
                self.agent.handle_install_done(self.now, generation, result);
            }
            Step::Restart {
                in_flight_processed,
            } => {
                if let Some(plan) = self.in_flight.take()
                    && in_flight_processed
                {
                    self.serve(&plan);
                }
                self.run += 1;
                self.installing = None;
                self.just_persisted = None;
                self.first_of_run = true;
                self.agent = AgentLoop::new(
                    self.config.clone(),
                    self.disk_last_acted,
                    self.seed.wrapping_add(u64::from(self.run)),
                    self.now,
                )
                .expect("valid config");
            }
            Step::Advance { ms } => self.now = self.now + Duration::from_millis(ms),
        }
        self.settle();
    }

    /// No more faults: heartbeats succeed, installs succeed, time runs to
    /// each timer. Returns how long until everything was delivered.
    fn calm(&mut self) -> Duration {
        let start = self.now;
        for _ in 0..64 {
            let done = self.server.pending_request().is_none()
                && self.agent.pending_report().is_none()
                && self.agent.installing().is_none()
                && self.agent.hardware_report_acknowledged();
            if done {
                return self.now - start;
            }
            if self.installing.is_some() {
                self.apply(&Step::InstallDone { ok: true });
            } else if self.in_flight.is_some() {
                self.apply(&Step::Deliver(Fate::Ok));
            } else {
                let at = self.agent.poll_timeout().expect("a timer while idle");
                self.now = self.now.max(at);
                self.settle();
            }
        }
        panic!("not quiescent after 64 calm steps");
    }
}

fn run(config: &AgentConfig, seed: u64, steps: &[Step]) -> Sim {
    let mut sim = Sim::new(config.clone(), seed);
    for step in steps {
        sim.apply(step);
    }
    sim
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn agent_and_server_agree(
        config in config(),
        seed in any::<u64>(),
        steps in prop::collection::vec(step(), 1..80),
    ) {
        let mut sim = run(&config, seed, &steps);
        let took = sim.calm();
        // One wait (a backoff or an idle interval), then every delivery
        // follows at once.
        let bound = (config.backoff_cap.mul_f64(1.0 + config.backoff_jitter))
            .max(config.interval.mul_f64(config.jitter.1))
            + Duration::from_millis(1);
        prop_assert!(took <= bound, "took {took:?}, bound {bound:?}");

        // The current request is answered.
        if let Some(current) = sim.server.current_generation() {
            prop_assert!(sim.server.reports.contains_key(&current));
        }
        prop_assert!(sim.server.hardware_report.is_some());
        // Every result the running agent got is stored as it was.
        let oldest_kept = if sim.server.reports.len() < MAX_REPORTS {
            i64::MIN
        } else {
            sim.server.reports.keys().next().copied().unwrap_or(i64::MIN)
        };
        for (generation, (run, result)) in &sim.results {
            if *run == sim.run && *generation >= oldest_kept {
                let stored = sim.server.reports.get(generation).map(|r| &r.result);
                prop_assert_eq!(stored, Some(result), "generation {}", generation);
            }
        }
        // The record survives storage.
        prop_assert_eq!(MachineRecord::decode(&sim.server.encode()), Ok(sim.server.clone()));
    }

    #[test]
    fn same_seed_same_actions(
        config in config(),
        seed in any::<u64>(),
        steps in prop::collection::vec(step(), 1..60),
    ) {
        let a = run(&config, seed, &steps);
        let b = run(&config, seed, &steps);
        prop_assert_eq!(&a.log, &b.log);
        prop_assert_eq!(a.server.encode(), b.server.encode());
    }

    #[test]
    fn delays_stay_in_bounds_and_backoff_grows(
        config in config(),
        seed in any::<u64>(),
        outcomes in prop::collection::vec(prop::bool::weighted(0.7), 1..60),
    ) {
        let slack = Duration::from_micros(1);
        let mut agent = AgentLoop::new(config.clone(), None, seed, Instant::ZERO).expect("valid");
        let mut now = Instant::ZERO;
        let mut previous: Option<Duration> = None;
        for fails in outcomes {
            let Some(Action::SendHeartbeat(_)) = agent.poll_action() else {
                panic!("expected a heartbeat");
            };
            if fails {
                agent.handle_heartbeat_failed(now);
                let failures = agent.consecutive_failures();
                let delay = agent.poll_timeout().expect("retry") - now;
                let nominal = config.nominal_backoff(failures);
                prop_assert!(delay >= config.backoff_base && delay >= nominal);
                prop_assert!(delay <= nominal.mul_f64(1.0 + config.backoff_jitter) + slack);
                prop_assert!(delay <= config.backoff_cap.mul_f64(1.0 + config.backoff_jitter) + slack);
                if let Some(previous) = previous
                    && nominal < config.backoff_cap
                {
                    prop_assert!(delay + slack >= previous, "{delay:?} after {previous:?}");
                }
                previous = Some(delay);
            } else {
                agent.handle_heartbeat_ok(now, None);
                previous = None;
                if agent.poll_action().is_some() {
                    // The hardware report goes out at once; answer it below.
                    agent.handle_heartbeat_ok(now, None);
                }
                let delay = agent.poll_timeout().expect("idle wait") - now;
                prop_assert!(delay + slack >= config.interval.mul_f64(config.jitter.0));
                prop_assert!(delay <= config.interval.mul_f64(config.jitter.1) + slack);
            }
            now = agent.poll_timeout().expect("timer");
            agent.handle_timeout(now);
        }
    }
}
