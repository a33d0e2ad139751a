//! Planted bugs in the production code, for the simulator to prove that
//! its checks catch them (`sim/tests/cluster.rs`, `sim/tests/traces.rs`,
//! `metropolis-sim --canary`). Compiled only
//! with the `canary` feature, which only `metropolis-sim` turns on; even
//! then nothing changes unless a canary is planted, and only on the thread
//! that planted it (the simulator runs each seed on one thread), so tests
//! running side by side do not see each other's.

use std::cell::Cell;

/// A bug that can be planted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Canary {
    /// Nothing planted.
    #[default]
    None,
    /// `FencedStore` sends writes without the leader's fence.
    DropFence,
    /// The watch cache leaves its streams open when it loses the store.
    SkipCacheFailure,
    /// The watch cache drops the deletions it reads from the store.
    DropTombstones,
    /// Writes are not noted for the read-your-writes gate: a `Watch`
    /// opened after a write may miss it.
    SkipReadYourWrites,
    /// An instance that is not the leader forwards a call that was
    /// forwarded to it, instead of ending it with
    /// [`LeadershipError::BackendSwitched`](crate::leadership::LeadershipError::BackendSwitched).
    ForwardForwarded,
    /// AgentCallback answers a heartbeat whose key is not the one
    /// registered for its machine.
    AcceptUnregisteredAgentKey,
    /// The agent loop installs without asking for its generation to be
    /// persisted first: a restarted agent acts on it again.
    ForgetLastActed,
    /// The agent loop has the machine reboot as soon as a successful
    /// install ends, before a heartbeat has delivered its report: the
    /// curator never learns of the install.
    RebootBeforeDelivered,
    /// A cancelled trace session leaves tracefs as it set it (no teardown).
    SkipTeardown,
    /// The embedded store tells the callers of a batch whose write failed
    /// that it is durable (`metropolis-store`, `State::fail`).
    AckFailedWrite,
    /// The embedded store's watches deliver changes applied but not yet
    /// durable (`metropolis-store`, `WatchStream`).
    WatchPastDurable,
    /// The embedded store reads a damaged WAL batch followed by a whole
    /// one as a torn final write, and opens without it (`metropolis-store`,
    /// `wal_read`).
    DamageReadAsTorn,
    /// The embedded store takes a WAL it failed to read (an I/O error) for
    /// a missing one (`metropolis-store`, `recover`).
    ReadErrorAsMissing,
    /// The embedded store zeroes a torn final WAL batch without reading
    /// the WAL again: a sector of it misread once as zeros erases an
    /// acknowledged batch (`metropolis-store`, `recover`).
    RepairOnOneRead,
}

impl Canary {
    /// Every canary, planted ones only.
    pub const ALL: [Canary; 14] = [
        Canary::DropFence,
        Canary::SkipCacheFailure,
        Canary::DropTombstones,
        Canary::SkipReadYourWrites,
        Canary::ForwardForwarded,
        Canary::AcceptUnregisteredAgentKey,
        Canary::ForgetLastActed,
        Canary::RebootBeforeDelivered,
        Canary::SkipTeardown,
        Canary::AckFailedWrite,
        Canary::WatchPastDurable,
        Canary::DamageReadAsTorn,
        Canary::ReadErrorAsMissing,
        Canary::RepairOnOneRead,
    ];

    /// The canary's name on a command line (`drop-fence`, ...; `none`).
    pub fn name(self) -> &'static str {
        match self {
            Canary::None => "none",
            Canary::DropFence => "drop-fence",
            Canary::SkipCacheFailure => "skip-cache-failure",
            Canary::DropTombstones => "drop-tombstones",
            Canary::SkipReadYourWrites => "skip-read-your-writes",
            Canary::ForwardForwarded => "forward-forwarded",
            Canary::AcceptUnregisteredAgentKey => "accept-unregistered-agent-key",
            Canary::ForgetLastActed => "forget-last-acted",
            Canary::RebootBeforeDelivered => "reboot-before-delivered",
            Canary::SkipTeardown => "skip-teardown",
            Canary::AckFailedWrite => "ack-failed-write",
            Canary::WatchPastDurable => "watch-past-durable",
            Canary::DamageReadAsTorn => "damage-read-as-torn",
            Canary::ReadErrorAsMissing => "read-error-as-missing",
            Canary::RepairOnOneRead => "repair-on-one-read",
        }
    }

    /// The canary named `name` (see [`Canary::name`]).
    pub fn from_name(name: &str) -> Option<Canary> {
        std::iter::once(Canary::None)
            .chain(Canary::ALL)
            .find(|c| c.name() == name)
    }
}

thread_local! {
    static PLANTED: Cell<Canary> = const { Cell::new(Canary::None) };
}

/// Plants `canary` on this thread (`Canary::None` removes it).
pub fn plant(canary: Canary) {
    PLANTED.with(|p| p.set(canary));
}

/// Whether `canary` is planted on this thread.
pub fn planted(canary: Canary) -> bool {
    PLANTED.with(|p| p.get() == canary)
}
