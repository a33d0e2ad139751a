//! Faults applied to the running cluster and undone: [`process`] (kills
//! and pauses), [`nft`] (cuts between processes), [`clock`] (wall clock
//! jumps), [`disk`] (a full disk). [`Injector::apply`] resolves a
//! schedule's abstract target (the leader, a follower) to a process when
//! the fault starts; [`Injector::revert`] undoes one fault, and
//! [`Injector::heal`] everything (the healing phase).

pub use metropolis_tests::campaign::{clock, disk, nft};
pub mod process;

use std::time::Duration;

use crate::cluster::{self, Cluster, N};
use crate::schedule::{Curator, Fault};
use nft::{Firewall, Initiator};
use process::Target;

/// A fault in place: what it hit, and how to undo it.
#[derive(Debug)]
pub struct Applied {
    /// What it hit, for the report (`curator-1 (the leader)`).
    pub hit: String,
    undo: Undo,
}

#[derive(Debug)]
enum Undo {
    Restart(Target),
    Continue(Target),
    Heal,
    Clock(usize),
    Disk(usize),
}

/// Applies and undoes faults on one cluster.
pub struct Injector<'a> {
    /// The cluster.
    pub cluster: &'a mut Cluster,
    /// The campaign's firewall table.
    pub firewall: &'a Firewall,
    /// The campaign's own clients, as the firewall knows them.
    pub clients: Initiator,
    /// etcd's cluster token (for restarts).
    pub token: String,
}

impl Injector<'_> {
    /// The instance `c` names now.
    async fn resolve(&self, c: Curator) -> (usize, String) {
        let leader = self.cluster.leader(Duration::from_secs(2)).await;
        match c {
            Curator::Index(i) => {
                let i = i.min(N - 1);
                let role = if Some(i) == leader {
                    " (the leader)"
                } else {
                    ""
                };
                (i, format!("curator-{i}{role}"))
            }
            Curator::Leader => match leader {
                Some(i) => (i, format!("curator-{i} (the leader)")),
                None => (0, "curator-0 (no leader known)".into()),
            },
            Curator::Follower => {
                let i = (0..N).find(|&i| Some(i) != leader).unwrap_or(0);
                (i, format!("curator-{i} (a follower)"))
            }
        }
    }

    /// Puts `fault` in place.
    pub async fn apply(&mut self, fault: &Fault) -> Result<Applied, String> {
        let (hit, undo) = match fault {
            Fault::KillCurator(c) => {
                let (i, hit) = self.resolve(*c).await;
                process::kill(self.cluster, Target::Curator(i));
                (hit, Undo::Restart(Target::Curator(i)))
            }
            Fault::PauseCurator(c) => {
                let (i, hit) = self.resolve(*c).await;
                process::pause(self.cluster, Target::Curator(i), true);
                (hit, Undo::Continue(Target::Curator(i)))
            }
            Fault::KillEtcd(i) => {
                process::kill(self.cluster, Target::Etcd(*i));
                (format!("etcd-{i}"), Undo::Restart(Target::Etcd(*i)))
            }
            Fault::PauseEtcd(i) => {
                process::pause(self.cluster, Target::Etcd(*i), true);
                (format!("etcd-{i}"), Undo::Continue(Target::Etcd(*i)))
            }
            Fault::CutCuratorEtcd(c, d) => {
                let (i, hit) = self.resolve(*c).await;
                self.firewall
                    .cut(cluster::curator_initiator(i), cluster::ETCD_NET, *d)?;
                (hit, Undo::Heal)
            }
            Fault::CutCurators(a, b, d) => {
                let (i, hit_a) = self.resolve(*a).await;
                let (mut j, mut hit_b) = self.resolve(*b).await;
                if j == i {
                    j = (i + 1) % N;
                    hit_b = format!("curator-{j}");
                }
                let (ai, aj) = (cluster::curator_ip(i), cluster::curator_ip(j));
                self.firewall.cut(cluster::curator_initiator(i), &aj, *d)?;
                self.firewall.cut(cluster::curator_initiator(j), &ai, *d)?;
                (format!("{hit_a} and {hit_b}"), Undo::Heal)
            }
            Fault::CutClients(c, d) => {
                let (i, hit) = self.resolve(*c).await;
                self.firewall
                    .cut(self.clients, &cluster::curator_ip(i), *d)?;
                (hit, Undo::Heal)
            }
            Fault::ClockJump(c, secs) => {
                let (i, hit) = self.resolve(*c).await;
                clock::set(&self.cluster.clock_file(i), *secs)?;
                (hit, Undo::Clock(i))
            }
            Fault::DiskFull(c) => {
                let (i, hit) = self.resolve(*c).await;
                disk::fill(&self.cluster.data_dir(i))?;
                (hit, Undo::Disk(i))
            }
        };
        Ok(Applied { hit, undo })
    }

    /// Undoes `applied`.
    pub async fn revert(&mut self, applied: &Applied) -> Result<(), String> {
        match &applied.undo {
            Undo::Restart(t) => process::restart(self.cluster, *t, &self.token).await,
            Undo::Continue(t) => {
                process::pause(self.cluster, *t, false);
                Ok(())
            }
            Undo::Heal => self.firewall.heal(),
            Undo::Clock(i) => clock::set(&self.cluster.clock_file(*i), 0),
            Undo::Disk(i) => disk::free(&self.cluster.data_dir(*i)),
        }
    }

    /// The healing phase: no cut, every process running, clocks and
    /// disks as they were.
    pub async fn heal(&mut self) -> Result<(), String> {
        self.firewall.heal()?;
        self.cluster.continue_all();
        for i in 0..N {
            clock::set(&self.cluster.clock_file(i), 0)?;
            disk::free(&self.cluster.data_dir(i))?;
            process::restart(self.cluster, Target::Etcd(i), &self.token).await?;
        }
        for i in 0..N {
            process::restart(self.cluster, Target::Curator(i), &self.token).await?;
        }
        Ok(())
    }
}
