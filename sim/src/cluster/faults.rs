//! The faults of the cluster's runs: the kinds the fault loop draws, the
//! swarm that leaves some out per seed, the partitions, and the counts of
//! what fired.

use super::*;

/// Cuts a seeded link for up to 4 s: all of a curator's, both ways (it is
/// partitioned from the others, the store and the clients), or one way
/// between a curator and another node; then heals every link.
pub(super) fn partition(cluster: &Cluster, rng: &mut Rng) {
    let links = cluster.routers.links();
    let curator = rng.index(cluster.curators);
    // The nodes of the run: its curators, the store's member, the clients.
    let nodes: Vec<usize> = (0..cluster.curators).chain([STORE, CLIENTS]).collect();
    if rng.chance(0.5) {
        links.isolate(curator, nodes.iter().copied().filter(|&n| n != curator));
    } else {
        let others: Vec<usize> = nodes.into_iter().filter(|&n| n != curator).collect();
        let other = others[rng.index(others.len())];
        if rng.chance(0.5) {
            links.cut(curator, other);
        } else {
            links.cut(other, curator);
        }
    }
    cluster
        .rt
        .run_for(Duration::from_millis(rng.range(0, 4000)));
    links.heal();
}

/// How often each kind of fault fired in a run.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Fired {
    pub(super) crashes: u64,
    pub(super) partitions: u64,
    pub(super) links_cut: u64,
    pub(super) store_failures: u64,
    pub(super) lost_replies: u64,
    pub(super) late_commits: u64,
    pub(super) store_pauses: u64,
    pub(super) store_restarts: u64,
    pub(super) lagged_batches: u64,
    pub(super) broken_watches: u64,
    pub(super) compactions: u64,
    pub(super) retried_updates: u64,
    pub(super) leader_keys_deleted: u64,
    pub(super) wall_clock_jumps: u64,
    pub(super) agent_restarts: u64,
    /// Rounds of the fault loop whose kind the seed's swarm left out.
    pub(super) left_out: u64,
    pub(super) installs: u64,
    pub(super) installs_killed: u64,
    /// Reboots after an install (agent 0's machine).
    pub(super) reboots: u64,
    /// Runs with 2, 3, 4 and 5 curators.
    pub(super) clusters_of: [u64; MAX_CURATORS - 1],
}

impl Fired {
    /// Every count by name, as a campaign sums them: each must be above
    /// zero over a campaign.
    pub(super) fn counts(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("crashes", self.crashes),
            ("partitions", self.partitions),
            ("links_cut", self.links_cut),
            ("store_failures", self.store_failures),
            ("lost_replies", self.lost_replies),
            ("late_commits", self.late_commits),
            ("store_pauses", self.store_pauses),
            ("store_restarts", self.store_restarts),
            ("lagged_batches", self.lagged_batches),
            ("broken_watches", self.broken_watches),
            ("compactions", self.compactions),
            ("retried_updates", self.retried_updates),
            ("leader_keys_deleted", self.leader_keys_deleted),
            ("wall_clock_jumps", self.wall_clock_jumps),
            ("agent_restarts", self.agent_restarts),
            ("left_out", self.left_out),
            ("installs", self.installs),
            ("installs_killed", self.installs_killed),
            ("reboots", self.reboots),
            ("clusters of 2 curators", self.clusters_of[0]),
            ("clusters of 3 curators", self.clusters_of[1]),
            ("clusters of 4 curators", self.clusters_of[2]),
            ("clusters of 5 curators", self.clusters_of[3]),
        ]
    }
}

/// A kind of fault the loop of [`run`] fires.
#[derive(Clone, Copy)]
pub(super) enum Fault {
    BrokenWatches,
    Compaction,
    Partition,
    MemberPause,
    MemberRestart,
    LeaderKeyDeleted,
    WallClockJump,
    AgentRestart,
    CuratorCrash,
}

/// How many kinds of [`Fault`] there are.
pub(super) const FAULT_KINDS: usize = 9;

/// What each value of the loop's draw fires: partitions and curator
/// crashes twice as often as the rest.
pub(super) const DRAWS: [Fault; 11] = [
    Fault::BrokenWatches,
    Fault::Compaction,
    Fault::Partition,
    Fault::Partition,
    Fault::MemberPause,
    Fault::MemberRestart,
    Fault::LeaderKeyDeleted,
    Fault::WallClockJump,
    Fault::AgentRestart,
    Fault::CuratorCrash,
    Fault::CuratorCrash,
];

/// Swarm testing (Groce et al., "Swarm testing", ISSTA 2012): each seed
/// leaves out some kinds of fault (each kept with probability 3/4), so the
/// kinds left in meet each other more often and no kind always masks
/// another. The loop's kinds come first (by [`Fault`]), then the store
/// network's four
/// (failed transactions, lost replies, late commits, lagged batches).
pub(super) struct Swarm(pub(super) [bool; FAULT_KINDS + 4]);

impl Swarm {
    pub(super) fn draw(seed: u64) -> Swarm {
        let mut rng = Rng::new(seed ^ 0x5a4a);
        let mut kinds = [false; FAULT_KINDS + 4];
        for kind in &mut kinds {
            *kind = rng.below(4) != 0;
        }
        Swarm(kinds)
    }
}
