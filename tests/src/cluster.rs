//! Several elected `metropolisd` instances over one etcd, sharing the
//! cluster CA, for the scale-out tests and the trial script.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use metropolis_etcd::EtcdStore;
use metropolis_node::cluster::DEFAULT_ELECTION_PREFIX;
use metropolis_proto::prelude::storage::LeaderElectionValue;
use prost::Message;

use crate::etcd::Etcd;
use crate::{Daemon, RuntimeKind, free_port};

/// The lease TTL the instances run with, in seconds.
pub const LEASE_TTL_S: u64 = 2;

/// Curator instances over one etcd.
pub struct Curators {
    /// The instances, in start order.
    pub daemons: Vec<Daemon>,
    /// Their runtimes.
    pub runtimes: Vec<RuntimeKind>,
    dir: PathBuf,
    etcd_urls: String,
    extra: Vec<String>,
}

/// Starts an elected daemon on `data_dir` over `etcd_urls` with `extra`
/// flags (and a lease of [`LEASE_TTL_S`] unless they set one), retrying on
/// port collisions, and waits until it serves.
pub fn start_elected(
    data_dir: &Path,
    runtime: RuntimeKind,
    etcd_urls: &str,
    extra: &[String],
) -> Daemon {
    Daemon::start_retrying(|| {
        let addr = format!("127.0.0.1:{}", free_port());
        let mut args = vec!["--etcd".to_string(), etcd_urls.to_string()];
        if !extra.iter().any(|a| a == "--lease-ttl") {
            args.extend(["--lease-ttl".into(), LEASE_TTL_S.to_string()]);
        }
        args.extend(extra.iter().cloned());
        Daemon::spawn_with(data_dir, addr, runtime, &args)
    })
}

/// Copies the cluster CA of `from` (a data directory) into `to`, so that
/// a daemon started on `to` joins the same cluster.
pub fn share_ca(from: &Path, to: &Path) {
    let pki = to.join("pki");
    std::fs::create_dir_all(&pki).unwrap();
    for file in ["ca.pem", "ca-key.pem"] {
        std::fs::copy(from.join("pki").join(file), pki.join(file)).unwrap();
    }
}

impl Curators {
    /// Two instances under `dir` over `etcd`, the first on tokio, the
    /// second on smol: the smallest cluster with a leader and a follower.
    pub fn pair(dir: &Path, etcd: &str) -> Curators {
        Self::start(dir, etcd, &[RuntimeKind::Tokio, RuntimeKind::Smol], &[])
    }

    /// Starts one instance per entry of `runtimes` under `dir` over
    /// `etcd`, each with `extra` flags; the first creates the cluster CA.
    pub fn start(dir: &Path, etcd: &str, runtimes: &[RuntimeKind], extra: &[&str]) -> Curators {
        let mut c = Curators {
            daemons: Vec::new(),
            runtimes: runtimes.to_vec(),
            dir: dir.to_path_buf(),
            etcd_urls: etcd.to_string(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        for (i, &runtime) in runtimes.iter().enumerate() {
            let data = c.data_dir(i);
            if i > 0 {
                share_ca(&c.data_dir(0), &data);
            }
            let d = start_elected(&data, runtime, &c.etcd_urls, &c.extra);
            c.daemons.push(d);
        }
        c
    }

    /// Instance `i`'s data directory.
    pub fn data_dir(&self, i: usize) -> PathBuf {
        self.dir.join(format!("curator-{i}"))
    }

    /// Starts instance `i` again (after it was killed), on its data
    /// directory and runtime.
    pub fn restart(&mut self, i: usize) {
        self.daemons[i].kill();
        let d = start_elected(
            &self.data_dir(i),
            self.runtimes[i],
            &self.etcd_urls,
            &self.extra,
        );
        self.daemons[i] = d;
    }

    /// The index of the instance whose address the election names, once
    /// one does (within `limit`).
    pub async fn leader(&self, etcd: &Etcd, limit: Duration) -> usize {
        let store = EtcdStore::connect(etcd.config()).await.unwrap();
        let election = store.election(DEFAULT_ELECTION_PREFIX);
        let deadline = Instant::now() + limit;
        loop {
            if let Ok((Some(leader), _)) = election.leader().await
                && let Ok(value) = LeaderElectionValue::decode(leader.value.clone())
                && let Some(i) = self
                    .daemons
                    .iter()
                    .position(|d| d.addr == value.curator_address)
            {
                return i;
            }
            assert!(
                Instant::now() < deadline,
                "no curator leader within {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The indices of the instances other than `leader`.
    pub fn followers(&self, leader: usize) -> Vec<usize> {
        (0..self.daemons.len()).filter(|&i| i != leader).collect()
    }
}
