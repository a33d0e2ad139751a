//! The election driver (`service::elected::driver`) over the store model,
//! its leases and a clock moved by hand, on the test kit's executor: the
//! same driver the daemon runs over etcd, with every step deterministic.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use metropolis_core::leadership::{Leadership, LeadershipConfig, Role};
use metropolis_core::ports::MonotonicClock;
use metropolis_service::elected::SharedLeadership;
use metropolis_service::elected::driver::{ElectionDriver, ElectionPorts};
use metropolis_service::elected::election::Election;
use metropolis_testkit::clock::ManualClock;
use metropolis_testkit::exec::{Tasks, block_on};
use metropolis_testkit::forward::Unreachable;
use metropolis_testkit::leases::{ManualTimer, ModelLeases};
use metropolis_testkit::store::MemKv;

const TTL: Duration = Duration::from_secs(6);
const PREFIX: &str = "/election/curator/";

/// One store, one clock, one executor, and the instances on them.
struct World {
    kv: MemKv,
    clock: ManualClock,
    tasks: Tasks,
    leases: ModelLeases,
}

struct Instance {
    shared: SharedLeadership,
    driver: ElectionDriver,
}

impl World {
    fn new() -> World {
        let kv = MemKv::new();
        let clock = ManualClock::new();
        World {
            leases: ModelLeases::manual(kv.clone(), clock.clone()),
            kv,
            clock,
            tasks: Tasks::new(),
        }
    }

    fn start(&self, node: &str, address: &str) -> Instance {
        let config = LeadershipConfig {
            lease_ttl: TTL,
            ..LeadershipConfig::new(node, address)
        };
        let machine = Leadership::new(config, self.clock.now()).unwrap();
        let shared =
            SharedLeadership::new(machine, Arc::new(self.clock.clone()), Arc::new(Unreachable));
        let ports = ElectionPorts {
            store: Arc::new(self.kv.clone()),
            leases: Arc::new(self.leases.clone()),
            timer: Arc::new(ManualTimer(self.clock.clone())),
            spawner: Arc::new(self.tasks.clone()),
        };
        let driver = ElectionDriver::spawn(ports, PREFIX, shared.clone());
        Instance { shared, driver }
    }

    /// Moves time on in steps of 100 ms for `total`, expiring leases and
    /// running every task after each step.
    fn pass(&self, total: Duration) {
        let step = Duration::from_millis(100);
        let mut passed = Duration::ZERO;
        while passed < total {
            self.clock.advance(step);
            passed += step;
            self.leases.expire();
            self.tasks.run(20);
        }
    }
}

fn leads(i: &Instance) -> bool {
    matches!(i.shared.role(), Role::Leader(_))
}

fn follows(i: &Instance, address: &str) -> bool {
    matches!(i.shared.role(), Role::Follower(f) if f.leader.curator_address == address)
}

#[test]
fn the_first_leads_the_second_follows_and_takes_over_once_the_lease_expires() {
    let world = World::new();
    let a = world.start("metropolis-aa", "10.0.0.1:7835");
    world.pass(Duration::from_millis(500));
    assert!(leads(&a), "{:?}", a.shared.role());
    let b = world.start("metropolis-bb", "10.0.0.2:7835");
    world.pass(Duration::from_millis(500));
    assert!(follows(&b, "10.0.0.1:7835"), "{:?}", b.shared.role());

    // Kept alive: a still leads long past its TTL, with the same key and
    // lease, and b still follows it.
    let (led, followed) = (a.shared.role(), b.shared.role());
    world.pass(3 * TTL);
    assert_eq!(a.shared.role(), led);
    assert_eq!(b.shared.role(), followed);

    // a crashes: nothing revoked. b leads once a's lease expired, not
    // before.
    a.driver.abort();
    world.pass(TTL - Duration::from_secs(1));
    assert!(follows(&b, "10.0.0.1:7835"), "{:?}", b.shared.role());
    world.pass(Duration::from_secs(2));
    assert!(leads(&b), "{:?}", b.shared.role());
    // The crashed instance's key is gone with its lease; b's is the leader.
    let election = Election::new(Arc::new(world.kv.clone()), PREFIX);
    let (leader, _) = block_on(election.leader(), &world.tasks, 10).unwrap();
    let Role::Leader(role) = b.shared.role() else {
        unreachable!("b leads")
    };
    assert_eq!(leader.unwrap().key, role.key);
}

#[test]
fn a_leader_that_stops_hands_over_at_once() {
    let world = World::new();
    let a = world.start("metropolis-aa", "10.0.0.1:7835");
    world.pass(Duration::from_millis(500));
    let b = world.start("metropolis-bb", "10.0.0.2:7835");
    world.pass(Duration::from_millis(500));
    assert!(leads(&a) && follows(&b, "10.0.0.1:7835"));
    block_on(a.driver.stop(), &world.tasks, 100);
    assert_eq!(a.shared.role(), Role::Stopped);
    // Its lease was revoked: b leads well within the TTL.
    world.pass(Duration::from_millis(500));
    assert!(leads(&b), "{:?}", b.shared.role());
    assert_eq!(world.kv.with(|m| m.leases().len()), 1);
}

#[test]
fn a_broken_observation_is_resumed_and_a_lost_lease_campaigns_again() {
    let world = World::new();
    let a = world.start("metropolis-aa", "10.0.0.1:7835");
    let b = world.start("metropolis-bb", "10.0.0.2:7835");
    world.pass(Duration::from_millis(500));
    assert!(leads(&a) && follows(&b, "10.0.0.1:7835"));
    // Every watch breaks: the observation is opened again after a pause,
    // and nothing changes meanwhile.
    world.kv.break_watches();
    world.pass(Duration::from_secs(2));
    assert!(leads(&a) && follows(&b, "10.0.0.1:7835"));
    // a's lease is revoked behind its back: it steps down, b leads, and a
    // campaigns again with a new lease and follows b.
    let lease = world.kv.with(|m| m.leases()[0]);
    world.kv.with(|m| m.lease_revoke(lease)).unwrap();
    world.pass(Duration::from_secs(2));
    assert!(leads(&b), "{:?}", b.shared.role());
    assert!(follows(&a, "10.0.0.2:7835"), "{:?}", a.shared.role());
}
