//! Planted bugs in the production code, for the simulator to prove that
//! its checks catch them (`sim/tests/shipped_canaries.rs`). Compiled only
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
    /// forwarded to it, instead of ending it Unavailable.
    ForwardForwarded,
    /// AgentCallback answers a heartbeat whose key is not the one
    /// registered for its machine.
    AcceptUnregisteredAgentKey,
}

impl Canary {
    /// Every canary, planted ones only.
    pub const ALL: [Canary; 6] = [
        Canary::DropFence,
        Canary::SkipCacheFailure,
        Canary::DropTombstones,
        Canary::SkipReadYourWrites,
        Canary::ForwardForwarded,
        Canary::AcceptUnregisteredAgentKey,
    ];
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
