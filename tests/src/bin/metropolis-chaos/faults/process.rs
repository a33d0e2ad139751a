//! Process faults: SIGKILL and a later start, SIGSTOP and a later SIGCONT,
//! of a curator or an etcd member.

use crate::cluster::Cluster;

/// Which process.
#[derive(Clone, Copy, Debug)]
pub enum Target {
    /// Curator `i`.
    Curator(usize),
    /// etcd member `i`.
    Etcd(usize),
}

/// SIGKILLs the process; it stays down until [`restart`].
pub fn kill(cluster: &mut Cluster, target: Target) {
    match target {
        Target::Curator(i) => cluster.kill_curator(i),
        Target::Etcd(i) => cluster.kill_etcd(i),
    }
}

/// Starts the killed process again and waits until it serves.
pub async fn restart(cluster: &mut Cluster, target: Target, token: &str) -> Result<(), String> {
    match target {
        Target::Curator(i) => cluster.restart_curator(i).await,
        Target::Etcd(i) => cluster.restart_etcd(i, token).await,
    }
}

/// SIGSTOPs (`stop`) or SIGCONTs the process.
pub fn pause(cluster: &mut Cluster, target: Target, stop: bool) {
    match target {
        Target::Curator(i) => cluster.pause(true, i, stop),
        Target::Etcd(i) => cluster.pause(false, i, stop),
    }
}
