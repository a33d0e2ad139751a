//! The election driver the daemon ships
//! (`metropolis_service::elected::driver`) run by the deterministic
//! runtime over the store model: three curator instances with clocks of
//! their own (offsets, drift), leaders crashed at seeded times and
//! restarted. Checked after every step: never two instances leading with
//! a key the store still holds; after each crash a new leader within the
//! lease TTL (plus the store's expiry check and one retry), whom the
//! others follow; the same seed gives the same history.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use metropolis_core::leadership::{Leadership, LeadershipConfig, Role};
use metropolis_core::ports::MonotonicClock;
use metropolis_service::elected::SharedLeadership;
use metropolis_service::elected::driver::{ElectionDriver, ElectionPorts};
use metropolis_sim::model_store;
use metropolis_sim::rng::Rng;
use metropolis_sim::runtime::{NodeClock, Runtime};
use metropolis_testkit::forward::Unreachable;
use metropolis_testkit::store::MemKv;

const CURATORS: usize = 3;
const STORE: usize = CURATORS;
const TTL: Duration = Duration::from_secs(3);
const PREFIX: &str = "/election/curator/";

struct Cluster {
    rt: Runtime,
    kv: MemKv,
    instances: Vec<SharedLeadership>,
    /// The drivers' handles (dropping one would stop its driver).
    drivers: Vec<ElectionDriver>,
    /// (global time µs, instance, role) at every role change.
    history: Arc<Mutex<Vec<(u128, usize, String)>>>,
}

fn address(i: usize) -> String {
    format!("curator-{i}:7835")
}

/// A run's tasks hold its runtime: ending the cluster ends them, or a
/// campaign of runs in one process never frees one.
impl Drop for Cluster {
    fn drop(&mut self) {
        self.rt.shutdown();
    }
}

impl Cluster {
    fn new(seed: u64) -> Cluster {
        let mut rng = Rng::new(seed);
        let mut clocks: Vec<NodeClock> = (0..CURATORS)
            .map(|_| NodeClock::seeded(&mut rng, 1000))
            .collect();
        clocks.push(NodeClock::default());
        let rt = Runtime::new(seed, clocks);
        let kv = model_store::start(&rt, STORE);
        let mut cluster = Cluster {
            rt,
            kv,
            instances: Vec::new(),
            drivers: Vec::new(),
            history: Arc::new(Mutex::new(Vec::new())),
        };
        for i in 0..CURATORS {
            let (instance, driver) = cluster.start(i);
            cluster.instances.push(instance);
            cluster.drivers.push(driver);
        }
        cluster
    }

    /// Starts instance `i` on a fresh incarnation of its node.
    fn start(&self, i: usize) -> (SharedLeadership, ElectionDriver) {
        let node = self.rt.node(i);
        let config = LeadershipConfig {
            lease_ttl: TTL,
            ..LeadershipConfig::new(format!("metropolis-{i:02}"), address(i))
        };
        let machine = Leadership::new(config, node.now()).unwrap();
        let shared = SharedLeadership::new(machine, Arc::new(node.clone()), Arc::new(Unreachable));
        let (history, rt) = (self.history.clone(), self.rt.clone());
        shared.on_role_change(move |_, role| {
            let role = match role {
                Role::Leader(_) => "leader".to_owned(),
                Role::Follower(f) => format!("follows {}", f.leader.curator_address),
                other => format!("{other:?}"),
            };
            history
                .lock()
                .unwrap()
                .push((rt.now().as_micros(), i, role));
        });
        let ports = ElectionPorts {
            store: Arc::new(self.kv.clone()),
            leases: Arc::new(model_store::leases(
                self.kv.clone(),
                self.rt.node(STORE),
                node.clone(),
            )),
            timer: Arc::new(node.clone()),
            spawner: Arc::new(node),
        };
        // The driver's task lives on the node; a crash drops it.
        let driver = ElectionDriver::spawn(ports, PREFIX, shared.clone());
        (shared, driver)
    }

    /// The instances that lead with a key the store still holds.
    fn valid_leaders(&self) -> Vec<usize> {
        (0..CURATORS)
            .filter(|&i| match self.instances[i].role() {
                Role::Leader(l) => {
                    self.kv
                        .with(|m| m.get(&l.key.key).map(|kv| kv.create_revision))
                        == Some(l.key.create_revision)
                }
                _ => false,
            })
            .collect()
    }

    /// Runs for `d`, checking after every step; the leaders at the end.
    fn run_for(&self, d: Duration) -> Vec<usize> {
        let until = self.rt.now() + d;
        while self.rt.now() < until {
            let before = self.rt.now();
            self.rt
                .run_until((before + Duration::from_millis(10)).min(until));
            let leaders = self.valid_leaders();
            assert!(
                leaders.len() <= 1,
                "two leaders at {:?}: {leaders:?}",
                self.rt.now()
            );
        }
        self.valid_leaders()
    }

    fn settled(&self) -> Option<usize> {
        let leaders = self.valid_leaders();
        let [leader] = leaders[..] else {
            return None;
        };
        let followed = (0..CURATORS).filter(|&i| i != leader).all(|i| {
            matches!(self.instances[i].role(),
                Role::Follower(f) if f.leader.curator_address == address(leader))
        });
        followed.then_some(leader)
    }
}

/// One seeded run: settle, then crash the leader three times at seeded
/// moments, restarting it after a seeded pause. The role history.
fn run(seed: u64) -> Vec<(u128, usize, String)> {
    let mut cluster = Cluster::new(seed);
    let mut rng = Rng::new(seed ^ 0x5eed);
    cluster.run_for(Duration::from_secs(2));
    let mut leader = cluster
        .settled()
        .unwrap_or_else(|| panic!("seed {seed}: nobody settled"));
    for _ in 0..3 {
        cluster.run_for(Duration::from_millis(rng.range(0, 5000)));
        cluster.rt.crash(leader);
        // A new leader once the old lease expired: TTL, the store's
        // expiry check, and the observation's delivery.
        cluster.run_for(TTL + Duration::from_millis(500));
        let next = cluster.valid_leaders();
        assert_eq!(next.len(), 1, "seed {seed}: no leader after a crash");
        assert_ne!(next[0], leader, "seed {seed}: the crashed instance leads");
        cluster.run_for(Duration::from_millis(rng.range(0, 3000)));
        (cluster.instances[leader], cluster.drivers[leader]) = cluster.start(leader);
        cluster.run_for(Duration::from_secs(1));
        leader = cluster
            .settled()
            .unwrap_or_else(|| panic!("seed {seed}: the restarted instance does not follow"));
    }
    cluster.history.lock().unwrap().clone()
}

#[test]
fn the_shipped_driver_elects_one_leader_through_crashes() {
    for seed in 0..40 {
        run(seed);
    }
}

#[test]
fn the_same_seed_gives_the_same_history() {
    assert_eq!(run(11), run(11));
    assert_ne!(run(11), run(12));
}
