//! Provisioning in the shipped-code cluster: an operator registering
//! machines and submitting installation requests (`MachineManagement`),
//! agents running core's `AgentLoop` under core's agent driver (the one
//! `bmaas-agent` runs) against the real `AgentCallback`
//! service (heartbeats as framed gRPC through random instances,
//! installs that take time), and an impostor heartbeating for a
//! registered machine with a key that is not its.
//!
//! The agents run on a node of their own, which the run crashes at
//! seeded moments ([`Provisioning::restart_agents`]): every agent and
//! its install in progress die, and each starts again from the
//! generation it last persisted, as `bmaas-agent` does from its state
//! file (persisted before each install starts).
//!
//! Agent 0 has its machine reboot after each successful install
//! ([`RebootAfter::Success`], as `bmaas-agent` runs by default); the
//! machine is back, taken over by a fresh agent, 0.5-2 s later. Agent 1
//! never reboots.
//!
//! Checked by the caller at the end ([`Provisioning::check`]): the
//! impostor was never answered OK; no agent installed a generation twice
//! (across its restarts) or one it was not handed; each machine's current
//! generation was reported installed, or failed only because its agent
//! restarted after acting on it; no machine rebooted before a heartbeat
//! carrying its install's success was answered; and each agent
//! heartbeats successfully again.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::call::{CallResult, unary};
use crate::rng::Rng;
use crate::runtime::{NodeId, Runtime};
use crate::upstream::Routers;
use bytes::Bytes;
use futures::future::BoxFuture;
use metropolis_core::identity::Identity;
use metropolis_core::ports::{MonotonicClock, Timer};
use metropolis_core::provisioning::{AgentConfig, AgentLoop, RebootAfter, offered_request};
use metropolis_proto::prelude::{agent, storage as machines};
use metropolis_service::agent_driver::{
    AgentPorts, AgentStopped, HeartbeatError, InstallError, PersistError, RebootError, drive_agent,
};
use prost::Message;

const HEARTBEAT: &str = "/cloud.bmaas.server.api.AgentCallback/Heartbeat";
const ADD_MACHINE: &str =
    "/metropolis.node.core.curator.proto.private.MachineManagement/AddMachine";
const SUBMIT: &str =
    "/metropolis.node.core.curator.proto.private.MachineManagement/SubmitInstallationRequest";
const GET_MACHINE: &str =
    "/metropolis.node.core.curator.proto.private.MachineManagement/GetMachine";

/// Machines, each with its agent.
pub const MACHINES: usize = 2;

fn machine_id(m: usize) -> String {
    format!("00000000-0000-4000-8000-{m:012x}")
}

fn agent_key(m: usize) -> [u8; 32] {
    [0xa0 + m as u8; 32]
}

/// What one agent did.
#[derive(Clone, Debug, Default)]
pub struct AgentRecord {
    /// Generations installed, in order.
    pub installed: Vec<i64>,
    /// Heartbeats answered OK.
    pub ok: u64,
    /// Global time of the last OK, µs.
    pub last_ok_us: u128,
    /// Codes of failed heartbeats.
    pub failures: Vec<tonic::Code>,
    /// The install in progress, if any.
    pub installing: Option<i64>,
    /// The generation it had persisted at each restart.
    pub restarted_with: Vec<Option<i64>>,
    /// Restarts that killed an install in progress.
    pub interrupted: u64,
    /// Generations whose success report a heartbeat carried and a curator
    /// answered OK.
    pub acknowledged: Vec<i64>,
    /// The generations after whose install the machine rebooted, in order.
    pub rebooted_after: Vec<i64>,
}

/// The provisioning clients of one run.
pub struct Provisioning {
    world: Arc<World>,
    agents: Vec<Arc<Mutex<AgentRecord>>>,
    /// Each machine as read back at the end.
    read: Arc<Mutex<Vec<Option<machines::Machine>>>>,
    /// Heartbeats of the impostor answered OK (0 expected), and its codes.
    impostor: Arc<Mutex<(u64, Vec<tonic::Code>)>>,
    /// Generations the operator was told it submitted, per machine.
    submitted: Arc<Mutex<Vec<Vec<i64>>>>,
    /// Each agent's persisted last-acted generation (its state file).
    disks: Vec<Arc<Mutex<Option<i64>>>>,
    seed: u64,
    restarts: u64,
}

/// The runtime, the network and the node the clients run on.
pub struct World {
    /// The runtime.
    pub rt: Runtime,
    /// The curators' routers and links.
    pub routers: Routers,
    /// The clients' node (the operator, the impostor).
    pub node: NodeId,
    /// The agents' node.
    pub agents: NodeId,
    /// How many curator instances to pick from.
    pub curators: usize,
}

impl World {
    /// Calls `path` as `identity` on a random instance, from the clients'
    /// node.
    async fn call(
        &self,
        rng: &mut Rng,
        path: &str,
        identity: Identity,
        message: Vec<u8>,
    ) -> CallResult {
        self.call_from(self.node, rng, path, identity, message)
            .await
    }

    /// The same from `node`.
    async fn call_from(
        &self,
        node: NodeId,
        rng: &mut Rng,
        path: &str,
        identity: Identity,
        message: Vec<u8>,
    ) -> CallResult {
        let target = rng.index(self.curators);
        unary(
            &self.rt,
            &self.routers,
            node,
            target,
            path,
            identity,
            message,
        )
        .await
    }
}

impl Provisioning {
    /// Starts the operator (registering every machine, then submitting a
    /// request to a random machine every 1-3 s until `stop`), the agents
    /// and the impostor, on the clients' node.
    pub fn start(world: World, seed: u64, stop: Duration) -> Provisioning {
        let world = Arc::new(world);
        let this = Provisioning {
            world: world.clone(),
            agents: (0..MACHINES).map(|_| Arc::default()).collect(),
            read: Arc::new(Mutex::new(vec![None; MACHINES])),
            impostor: Arc::default(),
            submitted: Arc::new(Mutex::new(vec![Vec::new(); MACHINES])),
            disks: (0..MACHINES).map(|_| Arc::default()).collect(),
            seed,
            restarts: 0,
        };
        world.rt.node(world.node).spawn(operator(
            world.clone(),
            Rng::new(seed ^ 0x09e4),
            stop,
            this.submitted.clone(),
        ));
        this.start_agents();
        world.rt.node(world.node).spawn(impostor(
            world.clone(),
            Rng::new(seed ^ 0x1370),
            stop,
            this.impostor.clone(),
        ));
        this
    }

    /// Starts every agent on a fresh incarnation of the agents' node, from
    /// its persisted generation.
    fn start_agents(&self) {
        let world = &self.world;
        for (m, (record, disk)) in self.agents.iter().zip(&self.disks).enumerate() {
            let rng = Rng::new(self.seed ^ (0xa9e7 + m as u64) ^ (self.restarts << 32));
            world.rt.node(world.agents).spawn(run_agent(
                world.clone(),
                m,
                rng,
                record.clone(),
                disk.clone(),
            ));
        }
    }

    /// Kills every agent (their node crashes: installs in progress die
    /// with them) and starts them again from what they persisted.
    pub fn restart_agents(&mut self) {
        self.world.rt.crash(self.world.agents);
        self.restarts += 1;
        for (record, disk) in self.agents.iter().zip(&self.disks) {
            let persisted = *disk.lock().unwrap();
            let mut record = record.lock().unwrap();
            record.restarted_with.push(persisted);
            // What was killed never completes.
            if record.installing.take().is_some() {
                record.interrupted += 1;
            }
        }
        self.start_agents();
    }

    /// Installs started, installs a restart killed, and reboots, over all
    /// agents.
    pub fn installs(&self) -> (u64, u64, u64) {
        self.agents
            .iter()
            .fold((0, 0, 0), |(started, killed, reboots), record| {
                let record = record.lock().unwrap();
                (
                    started + record.installed.len() as u64,
                    killed + record.interrupted,
                    reboots + record.rebooted_after.len() as u64,
                )
            })
    }

    /// Reads every machine back through the cluster (a task; run the
    /// runtime a few seconds for it).
    pub fn read_back(&self) {
        let (world, read) = (self.world.clone(), self.read.clone());
        self.world.rt.node(self.world.node).spawn(async move {
            for m in 0..MACHINES {
                let machine = get_machine(&world, m).await;
                read.lock().unwrap()[m] = machine;
            }
        });
    }

    /// Asserts what provisioning must have done by the end of the run
    /// (`healed_us`: when the faults were over, plus the TTL), on what
    /// [`Provisioning::read_back`] read.
    pub fn check(&self, seed: u64, healed_us: u128) {
        let (accepted, _) = self.impostor.lock().unwrap().clone();
        assert_eq!(
            accepted, 0,
            "seed {seed}: the impostor's heartbeats were answered OK"
        );
        for (m, record) in self.agents.iter().enumerate() {
            let record = record.lock().unwrap().clone();
            let mut unique = record.installed.clone();
            unique.sort_unstable();
            unique.dedup();
            assert_eq!(
                unique.len(),
                record.installed.len(),
                "seed {seed}: agent {m} installed a generation twice: {record:?}"
            );
            assert!(
                record.last_ok_us > healed_us,
                "seed {seed}: agent {m} was not answered after the faults: {record:?}"
            );
            let machine = self.read.lock().unwrap()[m].clone();
            let Some(machine) = machine else {
                panic!("seed {seed}: machine {m} could not be read back");
            };
            let current = machine.current_generation;
            let submitted = self.submitted.lock().unwrap()[m].clone();
            assert!(
                submitted.iter().all(|g| *g <= current),
                "seed {seed}: machine {m} at generation {current}, submitted {submitted:?}"
            );
            if current > 0 {
                // A failure report comes only from an agent that restarted
                // after acting on the generation (its outcome unknown) or on
                // a newer one.
                let reported = machine.reports.iter().any(|r| {
                    r.generation == current
                        && (r.success || record.restarted_with.iter().any(|g| *g >= Some(current)))
                });
                assert!(
                    reported,
                    "seed {seed}: machine {m}'s generation {current} has no report its agent \
                     explains: {:?}, agent {record:?}",
                    machine.reports
                );
                assert!(
                    record.installed.iter().all(|g| *g <= current),
                    "seed {seed}: agent {m} installed {:?} beyond {current}",
                    record.installed
                );
            }
        }
    }
}

/// Calls `path` on a random instance until it answers OK or `tries` run
/// out; the answer.
async fn call_until_ok(
    world: &World,
    rng: &mut Rng,
    path: &str,
    identity: Identity,
    message: Vec<u8>,
    tries: u32,
) -> Option<Bytes> {
    let client = world.rt.node(world.node);
    for _ in 0..tries {
        let result = world
            .call(rng, path, identity.clone(), message.clone())
            .await;
        if let Ok(answer) = result {
            return Some(answer);
        }
        client
            .sleep_until(client.now() + Duration::from_millis(200))
            .await;
    }
    None
}

/// Machine `m` as the cluster reads it back.
async fn get_machine(world: &World, m: usize) -> Option<machines::Machine> {
    let mut rng = Rng::new(m as u64);
    let request = machines::GetMachineRequest {
        machine_id: machine_id(m),
    }
    .encode_to_vec();
    let answer = call_until_ok(world, &mut rng, GET_MACHINE, Identity::Owner, request, 50).await?;
    machines::Machine::decode(answer).ok()
}

/// Registers every machine, then submits requests until `stop`.
async fn operator(
    world: Arc<World>,
    mut rng: Rng,
    stop: Duration,
    submitted: Arc<Mutex<Vec<Vec<i64>>>>,
) {
    let client = world.rt.node(world.node);
    for m in 0..MACHINES {
        let request = machines::AddMachineRequest {
            machine_id: machine_id(m),
            agent_public_key: Bytes::copy_from_slice(&agent_key(m)),
        }
        .encode_to_vec();
        // An AddMachine whose answer was lost may have registered it.
        while call_until_ok(
            &world,
            &mut rng,
            ADD_MACHINE,
            Identity::Owner,
            request.clone(),
            1,
        )
        .await
        .is_none()
        {
            let read = machines::GetMachineRequest {
                machine_id: machine_id(m),
            };
            let again = world
                .call(&mut rng, GET_MACHINE, Identity::Owner, read.encode_to_vec())
                .await;
            if again.is_ok() {
                break;
            }
        }
    }
    while world.rt.now() < stop {
        client
            .sleep_until(client.now() + Duration::from_millis(rng.range(1000, 3000)))
            .await;
        let m = rng.index(MACHINES);
        // A valid request, different each time (the server refuses one
        // that names no root device).
        let request = agent::OsInstallationRequest {
            generation: 0,
            r#type: Some(agent::os_installation_request::Type::Metropolis(
                agent::MetropolisInstallationRequest {
                    root_device: format!("/dev/disk/by-id/sim-{}", rng.below(1 << 20)),
                    ..Default::default()
                },
            )),
        }
        .encode_to_vec();
        let message = machines::SubmitInstallationRequestRequest {
            machine_id: machine_id(m),
            request: request.into(),
        }
        .encode_to_vec();
        if let Some(answer) =
            call_until_ok(&world, &mut rng, SUBMIT, Identity::Owner, message, 1).await
            && let Ok(response) = machines::SubmitInstallationRequestResponse::decode(answer)
        {
            submitted.lock().unwrap()[m].push(response.generation);
        }
    }
}

/// Agent `m`: core's `AgentLoop` run by core's agent driver on the
/// agents' node, over [`SimAgent`]. When the driver has the machine
/// reboot, the machine is down 0.5-2 s (booting what was installed, then
/// taken over again) and a fresh agent starts from what was persisted.
async fn run_agent(
    world: Arc<World>,
    m: usize,
    rng: Rng,
    out: Arc<Mutex<AgentRecord>>,
    disk: Arc<Mutex<Option<i64>>>,
) {
    let node = world.rt.node(world.agents);
    let config = AgentConfig {
        interval: Duration::from_millis(500),
        backoff_base: Duration::from_millis(100),
        backoff_cap: Duration::from_secs(2),
        reboot_after: if m == 0 {
            RebootAfter::Success
        } else {
            RebootAfter::Never
        },
        ..AgentConfig::default()
    };
    let ports = Arc::new(SimAgent {
        world,
        m,
        rng: Mutex::new(rng),
        out,
        disk: disk.clone(),
    });
    loop {
        let persisted = *disk.lock().unwrap();
        let seed = ports.rng.lock().unwrap().below(u64::MAX);
        let Ok(machine) = AgentLoop::new(config.clone(), persisted, seed, node.now()) else {
            panic!("the agent's configuration is valid");
        };
        let clock = Arc::new(node.clone());
        let stopped = drive_agent(
            machine,
            machine_id(m),
            ports.clone(),
            clock,
            Arc::new(node.clone()),
        )
        .await;
        let AgentStopped::Rebooting { .. } = stopped else {
            panic!("agent {m} stopped: {stopped}");
        };
        let down = Duration::from_millis(ports.rng.lock().unwrap().range(500, 2000));
        node.sleep_until(node.now() + down).await;
    }
}

/// What agent `m`'s driver reaches: heartbeats as framed gRPC through
/// random instances, a state file that survives the agents' node, and
/// installs of 100-600 ms; each recorded for the checks.
struct SimAgent {
    world: Arc<World>,
    m: usize,
    rng: Mutex<Rng>,
    out: Arc<Mutex<AgentRecord>>,
    disk: Arc<Mutex<Option<i64>>>,
}

impl AgentPorts for SimAgent {
    fn heartbeat(
        &self,
        request: agent::HeartbeatRequest,
    ) -> BoxFuture<'static, Result<Option<Bytes>, HeartbeatError>> {
        let target = self.rng.lock().unwrap().index(self.world.curators);
        let (world, out) = (self.world.clone(), self.out.clone());
        let identity = Identity::Agent(agent_key(self.m));
        let success = request.installation_report.as_ref().and_then(|report| {
            matches!(
                report.result,
                Some(agent::os_installation_report::Result::Success(_))
            )
            .then_some(report.generation)
        });
        Box::pin(async move {
            let result = unary(
                &world.rt,
                &world.routers,
                world.agents,
                target,
                HEARTBEAT,
                identity,
                request.encode_to_vec(),
            )
            .await;
            let answer = result.and_then(|bytes| {
                agent::HeartbeatResponse::decode(bytes).map_err(|_| tonic::Code::Internal)
            });
            let mut o = out.lock().unwrap();
            match answer {
                Ok(response) => {
                    o.ok += 1;
                    o.last_ok_us = world.rt.now().as_micros();
                    o.acknowledged.extend(success);
                    Ok(response
                        .installation_request
                        .map(|r| Bytes::from(r.encode_to_vec())))
                }
                Err(code) => {
                    o.failures.push(code);
                    Err(heartbeat_error(code))
                }
            }
        })
    }

    // Durable at once: the next incarnation starts from it.
    fn persist_last_acted(&self, generation: i64) -> Result<(), PersistError> {
        let mut persisted = self.disk.lock().unwrap();
        assert!(
            *persisted < Some(generation),
            "agent {} persists {generation} after {persisted:?}",
            self.m
        );
        *persisted = Some(generation);
        Ok(())
    }

    fn install(
        &self,
        generation: i64,
        request: Bytes,
    ) -> BoxFuture<'static, Result<(), InstallError>> {
        let offered = offered_request(request).map(|(g, _)| g);
        assert_eq!(
            offered.ok(),
            Some(generation),
            "install of what was offered"
        );
        let mut o = self.out.lock().unwrap();
        o.installed.push(generation);
        o.installing = Some(generation);
        drop(o);
        let took = Duration::from_millis(self.rng.lock().unwrap().range(100, 600));
        let (node, out) = (self.world.rt.node(self.world.agents), self.out.clone());
        Box::pin(async move {
            node.sleep_until(node.now() + took).await;
            out.lock().unwrap().installing = None;
            Ok(())
        })
    }

    fn hardware_report(&self) -> agent::AgentHardwareReport {
        agent::AgentHardwareReport::default()
    }

    // Checked here, where it would happen: a machine reboots only once
    // the curator has its install's success (a report not delivered would
    // be lost with the agent).
    fn reboot(&self, generation: i64) -> Result<(), RebootError> {
        let mut o = self.out.lock().unwrap();
        assert!(
            o.acknowledged.contains(&generation),
            "agent {} rebooted after generation {generation} before a heartbeat carrying its \
             success was answered: {o:?}",
            self.m
        );
        o.rebooted_after.push(generation);
        Ok(())
    }
}

/// A simulated heartbeat's failure, from the code it ended with (the
/// simulated calls keep no message): Unavailable, which the simulated
/// network reports for a call that reached no curator (a node down, a
/// cut link, a broken connection) as gRPC clients do, and which a curator
/// answers when it cannot serve now, went unanswered; any other code is
/// a curator's refusal.
fn heartbeat_error(code: tonic::Code) -> HeartbeatError {
    match code {
        tonic::Code::Unavailable => HeartbeatError::Unanswered {
            reason: format!("{code:?}"),
        },
        code => HeartbeatError::Refused {
            code,
            curator: None,
            message: String::new(),
        },
    }
}

/// Heartbeats for machine 0 with a key that was never registered.
async fn impostor(
    world: Arc<World>,
    mut rng: Rng,
    stop: Duration,
    out: Arc<Mutex<(u64, Vec<tonic::Code>)>>,
) {
    let node = world.rt.node(world.node);
    let request = agent::HeartbeatRequest {
        machine_id: machine_id(0),
        ..Default::default()
    }
    .encode_to_vec();
    while world.rt.now() < stop {
        node.sleep_until(node.now() + Duration::from_millis(rng.range(100, 1000)))
            .await;
        let identity = Identity::Agent([0xee; 32]);
        let result = world
            .call(&mut rng, HEARTBEAT, identity, request.clone())
            .await;
        let mut o = out.lock().unwrap();
        match result {
            Ok(_) => o.0 += 1,
            Err(code) => o.1.push(code),
        }
    }
}
