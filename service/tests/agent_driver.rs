//! The agent's driver (`service::agent_driver`), the one `bmaas-agent`
//! and the simulator run, over scripted ports and a clock moved by hand:
//! the generation is persisted before its install starts, heartbeats go on
//! while an install runs, its result is reported, and a generation that
//! cannot be persisted stops the agent without installing it.

#![allow(clippy::unwrap_used)]

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use metropolis_core::ports::MonotonicClock;
use metropolis_core::provisioning::{AgentConfig, AgentLoop, RebootAfter};
use metropolis_proto::prelude::agent;
use metropolis_service::agent_driver::{
    AgentPorts, AgentStopped, HeartbeatError, InstallError, PersistError, RebootError, drive_agent,
};
use metropolis_testkit::clock::ManualClock;
use metropolis_testkit::exec::poll_once;
use metropolis_testkit::leases::ManualTimer;
use prost::Message;

const INTERVAL: Duration = Duration::from_secs(10);

/// Scripted ports: heartbeats answered from a queue (an empty queue
/// answers with no offer), installs that finish when told, every call
/// recorded in order.
#[derive(Default)]
struct Script {
    answers: Mutex<VecDeque<Result<Option<Bytes>, HeartbeatError>>>,
    events: Mutex<Vec<String>>,
    install_done: Arc<AtomicBool>,
    persist_fails: bool,
    reboot_fails: bool,
}

impl Script {
    fn events(&self) -> Vec<String> {
        self.events.lock().unwrap().clone()
    }

    fn note(&self, event: String) {
        self.events.lock().unwrap().push(event);
    }
}

impl AgentPorts for Script {
    fn heartbeat(
        &self,
        request: agent::HeartbeatRequest,
    ) -> BoxFuture<'static, Result<Option<Bytes>, HeartbeatError>> {
        let report = request.installation_report.map(|r| r.generation);
        self.note(format!(
            "heartbeat report={report:?} hardware={}",
            request.hardware_report.is_some()
        ));
        let answer = self.answers.lock().unwrap().pop_front().unwrap_or(Ok(None));
        Box::pin(async move { answer })
    }

    fn persist_last_acted(&self, generation: i64) -> Result<(), PersistError> {
        self.note(format!("persist {generation}"));
        if self.persist_fails {
            Err(PersistError::Write {
                place: "/var/lib/agent".to_string(),
                reason: "disk full".to_string(),
            })
        } else {
            Ok(())
        }
    }

    fn install(
        &self,
        generation: i64,
        _request: Bytes,
    ) -> BoxFuture<'static, Result<(), InstallError>> {
        self.note(format!("install {generation}"));
        let done = self.install_done.clone();
        Box::pin(futures::future::poll_fn(move |_| {
            if done.load(Ordering::Relaxed) {
                Poll::Ready(Ok(()))
            } else {
                Poll::Pending
            }
        }))
    }

    fn hardware_report(&self) -> agent::AgentHardwareReport {
        agent::AgentHardwareReport::default()
    }

    fn reboot(&self, generation: i64) -> Result<(), RebootError> {
        self.note(format!("reboot {generation}"));
        if self.reboot_fails {
            Err(RebootError::Failed {
                reason: "not permitted".to_string(),
            })
        } else {
            Ok(())
        }
    }
}

fn offer(generation: i64) -> Bytes {
    agent::OsInstallationRequest {
        generation,
        ..Default::default()
    }
    .encode_to_vec()
    .into()
}

struct Run {
    clock: ManualClock,
    script: Arc<Script>,
    driver: Pin<Box<dyn Future<Output = AgentStopped> + Send>>,
}

impl Run {
    fn new(script: Script) -> Run {
        Run::rebooting(script, RebootAfter::Never)
    }

    fn rebooting(script: Script, reboot_after: RebootAfter) -> Run {
        let clock = ManualClock::new();
        let script = Arc::new(script);
        let config = AgentConfig {
            interval: INTERVAL,
            reboot_after,
            ..AgentConfig::default()
        };
        let machine = AgentLoop::new(config, None, 7, clock.now()).unwrap();
        let driver = Box::pin(drive_agent(
            machine,
            "m-1".to_string(),
            script.clone(),
            Arc::new(clock.clone()),
            Arc::new(ManualTimer(clock.clone())),
        ));
        Run {
            clock,
            script,
            driver,
        }
    }

    /// Polls the driver a few times (its port futures are ready at once or
    /// polled, not woken); its result if it stopped.
    fn poll(&mut self) -> Option<AgentStopped> {
        for _ in 0..8 {
            if let Poll::Ready(stopped) = poll_once(&mut self.driver) {
                return Some(stopped);
            }
        }
        None
    }

    /// Moves the clock by more than a jittered interval, then polls.
    fn next_interval(&mut self) -> Option<AgentStopped> {
        self.clock.advance(INTERVAL * 2);
        self.poll()
    }
}

#[test]
fn persists_before_installing_heartbeats_meanwhile_and_reports_the_result() {
    let script = Script::default();
    script.answers.lock().unwrap().push_back(Ok(Some(offer(3))));
    let mut run = Run::new(script);
    assert!(run.poll().is_none());
    // The hardware report follows the first answered heartbeat at once,
    // while the install runs.
    assert_eq!(
        run.script.events(),
        [
            "heartbeat report=None hardware=false",
            "persist 3",
            "install 3",
            "heartbeat report=None hardware=true"
        ]
    );
    // Heartbeats go on, without a report yet.
    assert!(run.next_interval().is_none());
    assert_eq!(
        run.script.events()[4..],
        ["heartbeat report=None hardware=false"]
    );
    run.script.install_done.store(true, Ordering::Relaxed);
    // Its result goes out at once.
    assert!(run.poll().is_none());
    let events = run.script.events();
    assert_eq!(
        events.last().unwrap(),
        "heartbeat report=Some(3) hardware=false"
    );
    // Acknowledged: later heartbeats carry no report, nothing is installed
    // again.
    assert!(run.next_interval().is_none());
    let events = run.script.events();
    assert_eq!(
        events.last().unwrap(),
        "heartbeat report=None hardware=false"
    );
    assert_eq!(
        events.iter().filter(|e| e.starts_with("install")).count(),
        1
    );
}

#[test]
fn a_failed_heartbeat_is_sent_again() {
    let script = Script::default();
    script
        .answers
        .lock()
        .unwrap()
        .push_back(Err(HeartbeatError::Unanswered {
            reason: "Unavailable: cut".to_string(),
        }));
    let mut run = Run::new(script);
    assert!(run.poll().is_none());
    assert!(run.next_interval().is_none());
    // The same heartbeat again after the backoff; once one is answered,
    // the hardware report goes out at once.
    assert_eq!(
        run.script.events(),
        [
            "heartbeat report=None hardware=false",
            "heartbeat report=None hardware=false",
            "heartbeat report=None hardware=true"
        ]
    );
}

#[test]
fn a_heartbeat_refused_as_invalid_is_sent_again_with_no_give_up() {
    let script = Script::default();
    for _ in 0..3 {
        script
            .answers
            .lock()
            .unwrap()
            .push_back(Err(HeartbeatError::Invalid {
                message: "machine_id: not a UUID".to_string(),
            }));
    }
    let mut run = Run::new(script);
    assert!(run.poll().is_none(), "the loop stopped");
    // Three refusals, each tried again after its backoff; then answered,
    // and the hardware report follows.
    for _ in 0..10 {
        if run.script.events().len() >= 5 {
            break;
        }
        assert!(run.next_interval().is_none(), "the loop stopped");
    }
    let events = run.script.events();
    assert_eq!(events.len(), 5, "{events:?}");
    assert!(
        events[..4]
            .iter()
            .all(|e| e == "heartbeat report=None hardware=false"),
        "{events:?}"
    );
    assert_eq!(events[4], "heartbeat report=None hardware=true");
}

#[test]
fn a_generation_that_cannot_be_persisted_stops_the_agent_uninstalled() {
    let script = Script {
        persist_fails: true,
        ..Script::default()
    };
    script.answers.lock().unwrap().push_back(Ok(Some(offer(4))));
    let mut run = Run::new(script);
    let stopped = run.poll().unwrap();
    assert!(
        matches!(&stopped, AgentStopped::NotPersisted { generation: 4, error: PersistError::Write { reason, .. } } if reason == "disk full"),
        "{stopped}"
    );
    assert_eq!(
        stopped.to_string(),
        "cannot persist generation 4, so not installing it: /var/lib/agent: disk full"
    );
    assert_eq!(
        run.script.events(),
        ["heartbeat report=None hardware=false", "persist 4"]
    );
}

#[test]
fn the_driver_reboots_once_the_success_was_reported() {
    for fails in [false, true] {
        let script = Script {
            reboot_fails: fails,
            ..Script::default()
        };
        script.answers.lock().unwrap().push_back(Ok(Some(offer(5))));
        let mut run = Run::rebooting(script, RebootAfter::Success);
        assert!(run.poll().is_none());
        run.script.install_done.store(true, Ordering::Relaxed);
        let stopped = run.poll().expect("stopped to reboot");
        let events = run.script.events();
        // The reboot comes right after the heartbeat carrying the report.
        assert_eq!(
            events[events.len() - 2..],
            ["heartbeat report=Some(5) hardware=false", "reboot 5"]
        );
        if fails {
            assert!(
                matches!(&stopped, AgentStopped::RebootFailed { generation: 5, error } if error.to_string() == "not permitted"),
                "{stopped}"
            );
        } else {
            assert_eq!(stopped, AgentStopped::Rebooting { generation: 5 });
        }
    }
}
