//! Planted bugs: a test-only switch that makes the simulator's own glue
//! (never core's code) misbehave in a known way, so that tests can assert
//! the checks catch it.

use std::fmt;
use std::str::FromStr;

/// A bug planted in the simulator's glue around core's machines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Canary {
    /// No bug.
    #[default]
    None,
    /// The curator's store-write path sends leader writes without
    /// `Fence::guard`.
    SkipFence,
    /// The curator's cache feed drops the first node deletion it sees.
    DropTombstone,
    /// The agent's persistence forgets the last acted generation.
    ForgetGeneration,
    /// The trace driver skips the teardown actions (reports them done).
    SkipTeardown,
}

impl Canary {
    /// Every planted bug.
    pub const ALL: [Canary; 4] = [
        Canary::SkipFence,
        Canary::DropTombstone,
        Canary::ForgetGeneration,
        Canary::SkipTeardown,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Canary::None => "none",
            Canary::SkipFence => "skip-fence",
            Canary::DropTombstone => "drop-tombstone",
            Canary::ForgetGeneration => "forget-generation",
            Canary::SkipTeardown => "skip-teardown",
        }
    }
}

impl fmt::Display for Canary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Canary {
    type Err = String;
    fn from_str(s: &str) -> Result<Canary, String> {
        [Canary::None]
            .into_iter()
            .chain(Canary::ALL)
            .find(|c| c.name() == s)
            .ok_or_else(|| {
                format!("unknown canary {s:?}: none, skip-fence, drop-tombstone, forget-generation, skip-teardown")
            })
    }
}
