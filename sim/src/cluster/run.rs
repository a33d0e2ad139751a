//! One seeded run of the cluster: the clients started, the fault loop,
//! the heal, and the checks.

use super::faults::{DRAWS, FAULT_KINDS, Fault, Fired, Swarm, partition};
use super::*;
use crate::Outcome;

/// One seeded run: writers for 34 s; the first 20 s with faults at seeded
/// moments (crashes, each restarted after a seeded pause; partitions, each
/// healed after one; the store's watches broken, compaction, its member
/// paused or restarted; the leader's key deleted; wall-clock jumps; the
/// agents killed and restarted; machines rebooted by their agent after an
/// install).
/// Panics on a broken invariant, naming the seed.
pub fn run(seed: u64) -> Outcome {
    let mut cluster = Cluster::new(seed);
    let mut rng = Rng::new(seed ^ 0xfa17);
    let swarm = Swarm::draw(seed);
    cluster.rt.run_for(Duration::from_secs(2));
    let on = |kind: usize, p: f64| if swarm.0[kind] { p } else { 0.0 };
    cluster.network.set_faults(StoreFaults {
        fail: on(FAULT_KINDS, 0.02),
        lose_reply: on(FAULT_KINDS + 1, 0.02),
        late: on(FAULT_KINDS + 2, 0.01),
        max_delay: Duration::from_millis(20),
        lag: on(FAULT_KINDS + 3, 0.03),
        max_lag: Duration::from_millis(1500),
    });
    let writers = cluster.writers(Duration::from_secs(36));
    let watchers = cluster.watchers();
    let node_watchers = cluster.node_watchers();
    let mut provisioning = agents::Provisioning::start(
        agents::World {
            rt: cluster.rt.clone(),
            routers: cluster.routers.clone(),
            node: CLIENTS,
            agents: AGENTS,
            curators: cluster.curators,
        },
        seed,
        Duration::from_secs(30),
    );
    cluster.guest(Duration::from_secs(25));
    let mut fired = Fired::default();
    fired.clusters_of[cluster.curators - 2] += 1;
    // Every seed cuts links at least once, early.
    cluster
        .rt
        .run_for(Duration::from_millis(rng.range(500, 5000)));
    partition(&cluster, &mut rng);
    fired.partitions += 1;
    while cluster.rt.now() < Duration::from_secs(20) {
        cluster
            .rt
            .run_for(Duration::from_millis(rng.range(500, 5000)));
        let fault = DRAWS[rng.index(DRAWS.len())];
        // Swarm: a kind this seed leaves out fires nothing this round.
        if !swarm.0[fault as usize] {
            fired.left_out += 1;
            continue;
        }
        match fault {
            Fault::BrokenWatches => {
                cluster.kv.break_watches();
                fired.broken_watches += 1;
            }
            Fault::Compaction => {
                cluster.kv.compact();
                fired.compactions += 1;
            }
            Fault::Partition => {
                partition(&cluster, &mut rng);
                fired.partitions += 1;
            }
            // The store's member pauses (longer than the TTL at times).
            Fault::MemberPause => cluster
                .network
                .pause(Duration::from_millis(rng.range(200, 4000))),
            // The member crashes and restarts: its watches end, it
            // refuses calls meanwhile, and it gives every lease a fresh
            // TTL when it is back.
            Fault::MemberRestart => {
                cluster.kv.break_watches();
                cluster.network.go_down(true);
                cluster
                    .rt
                    .run_for(Duration::from_millis(rng.range(200, 3000)));
                cluster.network.go_down(false);
                model_store::extend_leases(&cluster.kv, &cluster.rt.node(STORE));
            }
            // An operator deletes the leader's election key (as with
            // `etcdctl del`): its fenced writes fail from then on, and it
            // must step down; the next candidate leads.
            Fault::LeaderKeyDeleted => {
                if cluster.delete_leader_key() {
                    fired.leader_keys_deleted += 1;
                }
            }
            // A curator's wall clock jumps by up to 10 minutes either way
            // (NTP stepping it): heartbeats' ages and timestamps come from it.
            Fault::WallClockJump => {
                let victim = rng.index(cluster.curators);
                let ms = i64::try_from(rng.range(0, 1_200_000)).unwrap_or(0) - 600_000;
                cluster.rt.jump_wall_clock(victim, ms);
                fired.wall_clock_jumps += 1;
            }
            // Every agent dies mid-whatever and starts again from the
            // generation it persisted.
            Fault::AgentRestart => {
                provisioning.restart_agents();
                fired.agent_restarts += 1;
            }
            Fault::CuratorCrash => {
                let victim = rng.index(cluster.curators);
                cluster.crash(victim);
                fired.crashes += 1;
                cluster
                    .rt
                    .run_for(Duration::from_millis(rng.range(0, 4000)));
                cluster.drivers[victim] = Some(cluster.start(victim));
            }
        }
    }
    // Every seed breaks the store's watches at least once.
    if fired.broken_watches == 0 {
        cluster.kv.break_watches();
        fired.broken_watches += 1;
    }
    cluster.network.set_faults(StoreFaults::default());
    let counts = cluster.network.counts();
    fired.store_failures = counts.failed;
    fired.lost_replies = counts.lost_replies;
    fired.late_commits = counts.late;
    fired.store_pauses = counts.pauses;
    fired.store_restarts = counts.downs;
    fired.lagged_batches = counts.lagged;
    fired.links_cut = cluster.routers.links().cuts_made();
    fired.retried_updates = cluster.retried.lock().unwrap().len() as u64;
    cluster.rt.run_until(RUN);
    provisioning.read_back();
    cluster.rt.run_for(Duration::from_secs(5));
    provisioning.check(seed, 33_000_000);
    (fired.installs, fired.installs_killed, fired.reboots) = provisioning.installs();
    let violations = cluster.check.violations();
    assert!(
        violations.is_empty(),
        "seed {seed}: {} commits broke the fence, the first: {:?}",
        violations.len(),
        &violations[..violations.len().min(3)]
    );
    let second_hops = cluster.routers.second_hops();
    assert_eq!(second_hops, 0, "seed {seed}: calls forwarded twice");
    let stored = cluster.stored_view();
    watchers::check(seed, &cluster, &watchers, &node_watchers, &stored);
    writers::check(seed, &cluster, &writers, &watchers, &node_watchers);
    let mut trace = TraceHash::default();
    for writes in &writers {
        for op in &writes.lock().unwrap().history {
            trace.bytes(format!("{op:?}").as_bytes());
        }
    }
    for watched in &watchers {
        for backlog in &watched.lock().unwrap().backlogs {
            trace.bytes(format!("{backlog:?}").as_bytes());
        }
    }
    Outcome {
        seed,
        trace: trace.value(),
        polls: cluster.rt.polls(),
        simulated: cluster.rt.now(),
        fired: fired.counts(),
    }
}
