//! Seeded fault schedules: one `u64` seed gives the same list of faults
//! (kinds, targets, start times, durations) on every run, so a failing
//! schedule is replayed by its seed alone.
//!
//! Faults follow each other (one at a time, with a gap between them), and
//! each names its target abstractly (the leader, or instance `i`): which
//! process the leader is when the fault starts is the cluster's business.

use std::fmt;
use std::time::Duration;

/// A small seeded generator (SplitMix64): fast, and the same sequence on
/// every platform.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// A duration between `lo` and `hi` milliseconds.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi.saturating_sub(lo) + 1))
    }

    /// True with probability `percent` %.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Which curator a fault hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Curator {
    /// Whichever instance leads when the fault starts.
    Leader,
    /// Whichever instance does not lead, the first of them.
    Follower,
    /// Instance `i`.
    Index(usize),
}

impl fmt::Display for Curator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Curator::Leader => write!(f, "the leader"),
            Curator::Follower => write!(f, "a follower"),
            Curator::Index(i) => write!(f, "curator-{i}"),
        }
    }
}

pub use metropolis_tests::campaign::nft::Direction;

/// One fault and what it hits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL a curator; start it again when the fault ends.
    KillCurator(Curator),
    /// SIGSTOP a curator; SIGCONT when the fault ends.
    PauseCurator(Curator),
    /// SIGKILL etcd member `i`; start it again when the fault ends.
    KillEtcd(usize),
    /// SIGSTOP etcd member `i`; SIGCONT when the fault ends.
    PauseEtcd(usize),
    /// Cut a curator's connections to every etcd member.
    CutCuratorEtcd(Curator, Direction),
    /// Cut the connections between two curators (each way it initiates).
    CutCurators(Curator, Curator, Direction),
    /// Cut the clients' connections to a curator.
    CutClients(Curator, Direction),
    /// Move a curator's wall clock by this many seconds (negative: back).
    ClockJump(Curator, i64),
    /// Fill the disk of a curator's data directory.
    DiskFull(Curator),
}

/// The kinds of [`Fault`], for the figures.
pub const KINDS: [&str; 9] = [
    "kill-curator",
    "pause-curator",
    "kill-etcd",
    "pause-etcd",
    "cut-curator-etcd",
    "cut-curators",
    "cut-clients",
    "clock-jump",
    "disk-full",
];

impl Fault {
    /// The fault's kind, one of [`KINDS`].
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::KillCurator(_) => KINDS[0],
            Fault::PauseCurator(_) => KINDS[1],
            Fault::KillEtcd(_) => KINDS[2],
            Fault::PauseEtcd(_) => KINDS[3],
            Fault::CutCuratorEtcd(..) => KINDS[4],
            Fault::CutCurators(..) => KINDS[5],
            Fault::CutClients(..) => KINDS[6],
            Fault::ClockJump(..) => KINDS[7],
            Fault::DiskFull(_) => KINDS[8],
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::KillCurator(c) => write!(f, "SIGKILL {c}, then start it again"),
            Fault::PauseCurator(c) => write!(f, "SIGSTOP {c}, then SIGCONT"),
            Fault::KillEtcd(i) => write!(f, "SIGKILL etcd-{i}, then start it again"),
            Fault::PauseEtcd(i) => write!(f, "SIGSTOP etcd-{i}, then SIGCONT"),
            Fault::CutCuratorEtcd(c, d) => write!(f, "cut {c} from etcd ({d})"),
            Fault::CutCurators(a, b, d) => write!(f, "cut {a} from {b} ({d})"),
            Fault::CutClients(c, d) => write!(f, "cut the clients from {c} ({d})"),
            Fault::ClockJump(c, s) => write!(f, "move {c}'s wall clock by {s:+} s"),
            Fault::DiskFull(c) => write!(f, "fill {c}'s disk"),
        }
    }
}

/// A fault at a time of the schedule, for a duration.
#[derive(Clone, Debug)]
pub struct Step {
    /// When it starts, from the start of the fault phase.
    pub at: Duration,
    /// How long it lasts.
    pub lasts: Duration,
    /// What it is.
    pub fault: Fault,
}

/// One schedule: the faults of one seed, in time order.
#[derive(Clone, Debug)]
pub struct Schedule {
    /// Its faults.
    pub steps: Vec<Step>,
    /// How long the fault phase lasts.
    pub length: Duration,
}

impl Schedule {
    /// The schedule of `seed` for a fault phase of `length`, with curator
    /// leases of `ttl` (pauses of a curator outlast it).
    pub fn generate(seed: u64, length: Duration, ttl: Duration) -> Schedule {
        let mut rng = Rng::new(seed);
        let mut steps = Vec::new();
        let mut at = rng.millis(500, 1500);
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        loop {
            let fault = pick(&mut rng);
            let lasts = match &fault {
                Fault::PauseCurator(_) => rng.millis(ttl_ms + 500, ttl_ms * 2 + 1500),
                Fault::KillCurator(_) | Fault::KillEtcd(_) => rng.millis(300, 3000),
                Fault::PauseEtcd(_) => rng.millis(500, 4000),
                Fault::ClockJump(..) | Fault::DiskFull(_) => rng.millis(1500, 4000),
                _ => rng.millis(500, ttl_ms * 2 + 2000),
            };
            if at + lasts > length {
                break;
            }
            steps.push(Step { at, lasts, fault });
            at += lasts + rng.millis(500, 2000);
        }
        Schedule { steps, length }
    }
}

/// A fault drawn with the leader as the most frequent target.
fn pick(rng: &mut Rng) -> Fault {
    let curator = |rng: &mut Rng| match rng.below(6) {
        0..=2 => Curator::Leader,
        3 => Curator::Follower,
        i => Curator::Index(usize::try_from(i - 3).unwrap_or(0)),
    };
    let direction = |rng: &mut Rng| match rng.below(3) {
        0 => Direction::Both,
        1 => Direction::RequestsLost,
        _ => Direction::AnswersLost,
    };
    let member = |rng: &mut Rng| usize::try_from(rng.below(3)).unwrap_or(0);
    match rng.below(100) {
        0..=17 => Fault::KillCurator(curator(rng)),
        18..=31 => Fault::PauseCurator(curator(rng)),
        32..=39 => Fault::KillEtcd(member(rng)),
        40..=47 => Fault::PauseEtcd(member(rng)),
        48..=61 => Fault::CutCuratorEtcd(curator(rng), direction(rng)),
        62..=71 => {
            let a = curator(rng);
            let b = if a == Curator::Leader {
                Curator::Follower
            } else {
                Curator::Leader
            };
            Fault::CutCurators(a, b, direction(rng))
        }
        72..=81 => Fault::CutClients(curator(rng), direction(rng)),
        82..=91 => {
            let secs = i64::try_from(5 + rng.below(56)).unwrap_or(30);
            let secs = if rng.chance(50) { secs } else { -secs };
            Fault::ClockJump(curator(rng), secs)
        }
        _ => Fault::DiskFull(curator(rng)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_one_schedule() {
        let a = Schedule::generate(7, Duration::from_secs(30), Duration::from_secs(2));
        let b = Schedule::generate(7, Duration::from_secs(30), Duration::from_secs(2));
        assert_eq!(format!("{:?}", a.steps), format!("{:?}", b.steps));
        assert!(!a.steps.is_empty());
        let c = Schedule::generate(8, Duration::from_secs(30), Duration::from_secs(2));
        assert_ne!(format!("{:?}", a.steps), format!("{:?}", c.steps));
    }

    #[test]
    fn faults_follow_each_other_within_the_phase() {
        for seed in 0..200 {
            let s = Schedule::generate(seed, Duration::from_secs(20), Duration::from_secs(2));
            let mut end = Duration::ZERO;
            for step in &s.steps {
                assert!(step.at >= end, "seed {seed}: overlapping faults");
                end = step.at + step.lasts;
                assert!(end <= s.length);
                if let Fault::PauseCurator(_) = step.fault {
                    assert!(
                        step.lasts > Duration::from_secs(2),
                        "a pause outlasts the lease"
                    );
                }
            }
        }
    }
}
