//! Prometheus metrics of the service layer, in `prometheus-client`
//! families that a runtime crate registers in its
//! [`Registry`] and serves (the daemon's `--metrics-listen`).
//!
//! [`Metrics`] is one handle on every family: the routers record their
//! calls, the watch cache its streams, the provisioning service
//! its heartbeats, a [`MeteredKv`] the store requests it passes on, a
//! [`MeteredLeases`] the election's lease requests, an elected instance
//! its role changes. Durations are read from the
//! [`MonotonicClock`] port (virtual time in the simulator), never from
//! the host. Recording does not touch any machine's state; only the order
//! of label sets in an exposition depends on the process (the families
//! hash their label sets).

mod kv;
mod leases;
mod rpc;

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

pub use self::kv::MeteredKv;
pub use self::leases::MeteredLeases;
pub(crate) use self::rpc::{CallMeter, RpcMetrics};
use metropolis_core::leadership::Role;
use metropolis_core::ports::MonotonicClock;
use metropolis_core::time::Instant;

/// The clock durations are measured on.
type Clock = Arc<dyn MonotonicClock>;

pub use metropolis_core::time::latency_buckets;

/// Every family of the service layer, and the clock that times them.
/// Cloning shares the families.
#[derive(Clone)]
pub struct Metrics {
    clock: Clock,
    pub(crate) rpc: RpcMetrics,
    pub(crate) watch: WatchMetrics,
    pub(crate) agents: AgentMetrics,
    leadership: LeadershipMetrics,
    pub(crate) kv: kv::KvMetrics,
    leases: leases::LeaseMetrics,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Fresh families (all zero), timed by `clock`.
    pub fn new(clock: Arc<dyn MonotonicClock>) -> Metrics {
        Metrics {
            clock,
            rpc: RpcMetrics::default(),
            watch: WatchMetrics::default(),
            agents: AgentMetrics::default(),
            leadership: LeadershipMetrics::default(),
            kv: kv::KvMetrics::default(),
            leases: leases::LeaseMetrics::default(),
        }
    }

    /// Registers every family in `registry` (names in the module docs of
    /// each part, and in `docs/operations.md`).
    pub fn register(&self, registry: &mut Registry) {
        self.rpc.register(registry);
        self.watch.register(registry);
        self.agents.register(registry);
        self.leadership.register(registry);
        self.kv.register(registry);
        self.leases.register(registry);
    }

    fn now(&self) -> Instant {
        self.clock.now()
    }

    /// Starts measuring a call of `path`.
    pub(crate) fn start_call(&self, path: &str) -> CallMeter {
        self.rpc.start(path, self.clock.clone(), self.now())
    }

    /// Records that this instance now has `role` (an elected instance's
    /// [`SharedLeadership::on_role_change`](crate::elected::SharedLeadership::on_role_change),
    /// or [`Role::Sole`] once for an instance over the embedded store).
    pub fn record_role(&self, role: &Role) {
        self.leadership.record(role);
    }

    /// Records how many machines are registered and how many of them are
    /// lost (not heard from for the `--agent-lost-after` time): what a
    /// scrape refreshes first
    /// ([`ProvisioningService::census`](crate::ProvisioningService::census)).
    pub fn record_machines(&self, registered: u64, lost: u64) {
        let gauge = |state: &'static str| self.agents.machines.get_or_create(&StateLabel { state });
        gauge("lost").set(lost as i64);
        gauge("alive").set(registered.saturating_sub(lost) as i64);
    }
}

/// A `state` label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

/// A `result` label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ResultLabel {
    result: &'static str,
}

/// The open `Watch` streams and what they sent.
#[derive(Clone, Debug, Default)]
pub(crate) struct WatchMetrics {
    streams: Gauge,
    events: Counter,
    bytes: Counter,
    coalesced: Counter,
}

impl WatchMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "metropolis_curator_watch_streams",
            "Open Curator.Watch streams",
            self.streams.clone(),
        );
        registry.register(
            "metropolis_curator_watch_events_sent",
            "WatchEvents sent on Curator.Watch streams",
            self.events.clone(),
        );
        registry.register(
            "metropolis_curator_watch_sent_bytes",
            "Encoded bytes of the WatchEvents sent",
            self.bytes.clone(),
        );
        registry.register(
            "metropolis_curator_watch_coalesced",
            "Node changes replaced by a later change of the same node before a slow stream sent them",
            self.coalesced.clone(),
        );
    }

    /// `open` streams are registered now.
    pub(crate) fn set_streams(&self, open: usize) {
        self.streams.set(i64::try_from(open).unwrap_or(i64::MAX));
    }

    /// A stream sent an event of `len` bytes.
    pub(crate) fn sent(&self, len: usize) {
        self.events.inc();
        self.bytes.inc_by(len as u64);
    }

    /// A stream's undelivered change was replaced by a newer one.
    pub(crate) fn coalesced(&self) {
        self.coalesced.inc();
    }
}

/// Heartbeats and machines.
#[derive(Clone, Debug, Default)]
pub(crate) struct AgentMetrics {
    heartbeats: Family<ResultLabel, Counter>,
    machines: Family<StateLabel, Gauge>,
}

impl AgentMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "metropolis_agent_heartbeats",
            "AgentCallback.Heartbeat calls by result: ok, unknown_agent (key or machine not registered), invalid, error",
            self.heartbeats.clone(),
        );
        registry.register(
            "metropolis_machines",
            "Registered machines by state: alive, or lost (no heartbeat within --agent-lost-after); refreshed at each scrape",
            self.machines.clone(),
        );
    }

    /// A heartbeat ended with `result`.
    pub(crate) fn heartbeat(&self, result: &'static str) {
        self.heartbeats.get_or_create(&ResultLabel { result }).inc();
    }
}

/// The instance's role.
#[derive(Clone, Debug, Default)]
struct LeadershipMetrics {
    is_leader: Gauge,
    role: Family<StateLabel, Gauge>,
    changes: Counter,
}

/// Every role's label value.
const ROLES: [&str; 5] = ["campaigning", "leader", "follower", "sole", "stopped"];

impl LeadershipMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "metropolis_curator_is_leader",
            "1 while this instance serves the Curator itself (leader, or sole instance over the embedded store)",
            self.is_leader.clone(),
        );
        registry.register(
            "metropolis_curator_role",
            "1 for this instance's current role (state label), 0 for the others",
            self.role.clone(),
        );
        registry.register(
            "metropolis_curator_role_changes",
            "Role changes of this instance (elections won and lost, leaders seen)",
            self.changes.clone(),
        );
    }

    fn record(&self, role: &Role) {
        let now = match role {
            Role::Campaigning => "campaigning",
            Role::Leader(_) => "leader",
            Role::Follower(_) => "follower",
            Role::Sole => "sole",
            Role::Stopped => "stopped",
        };
        for state in ROLES {
            self.role
                .get_or_create(&StateLabel { state })
                .set(i64::from(state == now));
        }
        self.is_leader.set(i64::from(role.is_leader()));
        self.changes.inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Still;
    impl MonotonicClock for Still {
        fn now(&self) -> Instant {
            Instant::ZERO
        }
    }

    /// The text exposition of everything `metrics` registers; the
    /// submodules' tests read it too.
    pub(super) fn exposition(metrics: &Metrics) -> String {
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        text
    }

    #[test]
    fn latency_buckets_are_prometheus_clients_exponential_buckets_to_the_bit() {
        let ours: Vec<u64> = super::latency_buckets().map(f64::to_bits).collect();
        let theirs: Vec<u64> =
            prometheus_client::metrics::histogram::exponential_buckets(0.0001, 2.0, 21)
                .map(f64::to_bits)
                .collect();
        assert_eq!(ours, theirs);
    }

    #[test]
    fn roles_are_one_hot() {
        let metrics = Metrics::new(Arc::new(Still));
        metrics.record_role(&Role::Campaigning);
        metrics.record_role(&Role::Sole);
        let text = exposition(&metrics);
        assert!(
            text.contains("metropolis_curator_role{state=\"sole\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("metropolis_curator_role{state=\"campaigning\"} 0\n"),
            "{text}"
        );
        assert!(text.contains("metropolis_curator_is_leader 1\n"), "{text}");
        assert!(
            text.contains("metropolis_curator_role_changes_total 2\n"),
            "{text}"
        );
    }

    #[test]
    fn machines_split_into_alive_and_lost() {
        let metrics = Metrics::new(Arc::new(Still));
        metrics.record_machines(5, 2);
        let text = exposition(&metrics);
        assert!(
            text.contains("metropolis_machines{state=\"alive\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("metropolis_machines{state=\"lost\"} 2\n"),
            "{text}"
        );
    }
}
