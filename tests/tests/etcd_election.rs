//! The election driver against a real etcd: two curator instances, one
//! leads and the other follows it with its address; the leader crashes
//! (its lease is left to expire) and the follower takes over within the
//! TTL plus 2 s; a leader that stops cleanly hands over at once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use metropolis_core::leadership::{LeadershipConfig, Role};
use metropolis_etcd::{ElectionDriver, EtcdStore};
use metropolis_tests::etcd::Etcd;

const TTL: Duration = Duration::from_secs(2);

fn config(node: &str, address: &str) -> LeadershipConfig {
    let mut c = LeadershipConfig::new(node, address);
    c.lease_ttl = TTL;
    c
}

async fn driver(etcd: &Etcd, node: &str, address: &str) -> ElectionDriver {
    let store = EtcdStore::connect(etcd.config()).await.unwrap();
    ElectionDriver::spawn(store, "/election/curator/", config(node, address)).unwrap()
}

/// Waits until `check` holds for the drivers' roles.
async fn until(what: &str, limit: Duration, mut check: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !check() {
        assert!(
            start.elapsed() < limit,
            "{what} not reached within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

fn leads(d: &ElectionDriver) -> bool {
    matches!(d.role(), Role::Leader(_))
}

fn follows(d: &ElectionDriver, address: &str) -> bool {
    matches!(d.role(), Role::Follower(f) if f.leader.curator_address == address)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leads_the_other_follows_and_takes_over_after_a_crash() {
    let etcd = Etcd::start();
    let a = driver(&etcd, "metropolis-aa", "10.0.0.1:7835").await;
    until("a leads", Duration::from_secs(10), || leads(&a)).await;
    let b = driver(&etcd, "metropolis-bb", "10.0.0.2:7835").await;
    until("b follows a", Duration::from_secs(10), || {
        follows(&b, "10.0.0.1:7835")
    })
    .await;
    assert!(leads(&a), "never two roles: a still leads");

    // a crashes: nothing revoked, its lease expires.
    a.abort();
    let took = until("b leads", TTL + Duration::from_secs(2), || leads(&b)).await;
    eprintln!("takeover after a crash: {took:?}");

    // b stops cleanly: a new instance leads at once, without the TTL.
    let c = driver(&etcd, "metropolis-cc", "10.0.0.3:7835").await;
    until("c follows b", Duration::from_secs(10), || {
        follows(&c, "10.0.0.2:7835")
    })
    .await;
    b.stop().await;
    let took = until("c leads", Duration::from_secs(1), || leads(&c)).await;
    eprintln!("takeover after a clean stop: {took:?}");
    c.stop().await;
}
