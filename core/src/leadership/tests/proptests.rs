//! Property tests of one [`Leadership`] under random interleavings of
//! every input: lease grants, renewals and losses (current, stale and
//! unknown campaigns), wins, observations of newer, older and equal keys
//! with usable, own, address-less and undecodable values, deletions,
//! requests with random deadlines, writes asking for fences, failed
//! fences, finished requests, time passing and shutdown. The
//! [`Checker`] checks every output against the contract after each input
//! (one role at a time, one outcome per request, fences only for the
//! current leadership, wait bounds); the run ends with a shutdown after
//! which no request may be left without its outcome. Separately: the same
//! inputs give the same outputs.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bytes::Bytes;
use metropolis_proto::prelude::storage::LeaderElectionValue;
use proptest::prelude::*;
use proptest::sample::Index;
use prost::Message;

use super::checker::Checker;
use crate::leadership::*;
use crate::time::Instant;

const SELF: &str = "node-0";

/// Which campaign an election report names.
#[derive(Clone, Copy, Debug)]
enum Pick {
    Current,
    Previous,
    Unknown,
}

/// An observed election value.
#[derive(Clone, Copy, Debug)]
enum Value {
    Node(u8),
    Own,
    NoAddress,
    Garbage,
}

#[derive(Clone, Debug)]
enum Step {
    Advance(u64),
    Timeout,
    /// Time jumps to the machine's next timer, which then runs (what a
    /// driver does): exercises inputs exactly at wait ends and expiries.
    WakeUp,
    Request(Option<u64>),
    Finish(Index),
    Write(Index),
    FenceFailed(Index),
    ForwardFailed(Index),
    Granted {
        campaign: Pick,
        lease: i64,
        ttl_s: u64,
        sent_back_ms: u64,
    },
    Lost(Pick),
    Won {
        campaign: Pick,
        name: u8,
        rev_delta: i64,
    },
    Observed {
        name: u8,
        rev_delta: i64,
        value: Value,
    },
    Deleted(Index),
    Shutdown,
    /// A likely leadership: the current campaign's lease granted now,
    /// then its win (often over the newest known key).
    Elect {
        name: u8,
        rev_delta: i64,
    },
}

fn pick() -> impl Strategy<Value = Pick> {
    prop_oneof![6 => Just(Pick::Current), 1 => Just(Pick::Previous), 1 => Just(Pick::Unknown)]
}

fn step() -> impl Strategy<Value = Step> {
    let value = prop_oneof![
        6 => (1u8..4).prop_map(Value::Node),
        1 => Just(Value::Own),
        1 => Just(Value::NoAddress),
        1 => Just(Value::Garbage),
    ];
    prop_oneof![
        6 => prop_oneof![0u64..1_500, 0u64..6_000].prop_map(Step::Advance),
        2 => Just(Step::Timeout),
        3 => Just(Step::WakeUp),
        8 => prop::option::of(0u64..8_000).prop_map(Step::Request),
        4 => any::<Index>().prop_map(Step::Finish),
        6 => any::<Index>().prop_map(Step::Write),
        2 => any::<Index>().prop_map(Step::FenceFailed),
        2 => any::<Index>().prop_map(Step::ForwardFailed),
        5 => (pick(), 1i64..4, 1u64..6, 0u64..3_000).prop_map(|(campaign, lease, ttl_s, sent_back_ms)| {
            Step::Granted { campaign, lease, ttl_s, sent_back_ms }
        }),
        1 => pick().prop_map(Step::Lost),
        4 => (pick(), 0u8..4, -2i64..8).prop_map(|(campaign, name, rev_delta)| Step::Won {
            campaign,
            name,
            rev_delta
        }),
        3 => (0u8..4, -6i64..8, value).prop_map(|(name, rev_delta, value)| Step::Observed {
            name,
            rev_delta,
            value
        }),
        2 => any::<Index>().prop_map(Step::Deleted),
        1 => Just(Step::Shutdown),
        3 => (0u8..4, -1i64..6).prop_map(|(name, rev_delta)| Step::Elect { name, rev_delta }),
    ]
}

fn encode(value: Value) -> Vec<u8> {
    let v = |node: &str, address: &str| {
        LeaderElectionValue {
            node_id: node.into(),
            ttl: 3,
            curator_address: address.into(),
            schema_version: 1,
        }
        .encode_to_vec()
    };
    match value {
        Value::Node(n) => v(&format!("node-{n}"), &format!("10.0.0.{n}:7835")),
        Value::Own => v(SELF, "10.0.0.0:7835"),
        Value::NoAddress => v("node-9", ""),
        Value::Garbage => vec![0xff, 0xff, 0xff],
    }
}

/// Drives one machine through `steps` and returns the transcript of its
/// outputs; panics (failing the property) on any contract violation.
fn run(max_wait_ms: u64, embedded: bool, steps: &[Step]) -> Vec<String> {
    let max_wait = Duration::from_millis(max_wait_ms);
    let mut now = Instant::ZERO;
    let mut m = if embedded {
        Leadership::embedded(now)
    } else {
        let config = LeadershipConfig {
            lease_ttl: Duration::from_secs(3),
            max_wait,
            ..LeadershipConfig::new(SELF, "10.0.0.0:7835")
        };
        Leadership::new(config, now).unwrap()
    };
    let mut c = Checker::new(&mut m, max_wait, now);
    c.set_lease_ttl(Duration::from_secs(3));
    let mut requests: Vec<RequestId> = Vec::new();
    let mut keys: Vec<ElectionKey> = Vec::new();
    let mut max_rev = 1i64;
    let mut last_campaign = CampaignId(1);
    let mut revision = |delta: i64| {
        let rev = (max_rev + delta).max(1);
        max_rev = max_rev.max(rev);
        rev
    };

    for step in steps {
        if let Some(current) = c.campaign() {
            last_campaign = current;
        }
        let campaign = |p: Pick| match p {
            Pick::Current => last_campaign,
            Pick::Previous => CampaignId(last_campaign.0.saturating_sub(1)),
            // Not the next one: a due lease expiry in the same input may
            // start that one before the report is applied.
            Pick::Unknown => CampaignId(last_campaign.0 + 2),
        };
        // Mostly one of the latest requests (likely still running).
        let request = |i: &Index| {
            let recent = &requests[requests.len().saturating_sub(4)..];
            (!recent.is_empty()).then(|| *i.get(recent))
        };
        let any_request = |i: &Index| (!requests.is_empty()).then(|| *i.get(&requests));
        match step {
            Step::Advance(ms) => {
                now = now + Duration::from_millis(*ms);
                continue;
            }
            Step::Timeout => {
                m.handle_timeout(now);
                c.drain(&mut m, now);
            }
            Step::WakeUp => {
                if let Some(t) = m.poll_timeout() {
                    now = now.max(t);
                    m.handle_timeout(now);
                    c.drain(&mut m, now);
                }
            }
            Step::Request(deadline) => {
                let deadline = deadline.map(|ms| now + Duration::from_millis(ms));
                let id = m.handle_request(now, deadline);
                requests.push(id);
                c.arrived(&mut m, now, id, deadline);
            }
            Step::Finish(i) => {
                if let Some(id) = any_request(i) {
                    m.handle_request_finished(now, id);
                    c.finished(&mut m, now, id);
                }
            }
            Step::Write(i) => {
                if let Some(id) = request(i) {
                    let fence = m.write_fence(now, id);
                    c.fenced(&mut m, now, id, &fence);
                }
            }
            Step::FenceFailed(i) => {
                if let Some(id) = request(i) {
                    c.fence_failing(id);
                    m.handle_fence_failed(now, id);
                    c.drain(&mut m, now);
                }
            }
            Step::ForwardFailed(i) => {
                if let Some(id) = request(i) {
                    m.handle_forward_failed(now, id);
                    c.forward_failed(&mut m, now, id);
                }
            }
            Step::Granted {
                campaign: p,
                lease,
                ttl_s,
                sent_back_ms,
            } => {
                let grant = LeaseGrant {
                    campaign: campaign(*p),
                    lease: *lease,
                    ttl: Duration::from_secs(*ttl_s),
                    sent_at: Instant::from_offset(
                        now.offset()
                            .saturating_sub(Duration::from_millis(*sent_back_ms)),
                    ),
                };
                c.granting(&grant);
                m.handle_lease_granted(now, grant);
                c.drain(&mut m, now);
            }
            Step::Lost(p) => {
                m.handle_lease_lost(now, campaign(*p));
                c.drain(&mut m, now);
            }
            Step::Won {
                campaign: p,
                name,
                rev_delta,
            } => {
                let key = ElectionKey {
                    key: Bytes::from(format!("election/{name}")),
                    create_revision: revision(*rev_delta),
                };
                keys.push(key.clone());
                m.handle_campaign_won(now, campaign(*p), key);
                c.drain(&mut m, now);
            }
            Step::Observed {
                name,
                rev_delta,
                value,
            } => {
                let key = ElectionKey {
                    key: Bytes::from(format!("election/{name}")),
                    create_revision: revision(*rev_delta),
                };
                keys.push(key.clone());
                m.handle_leader_observed(now, key, &encode(*value));
                c.drain(&mut m, now);
            }
            Step::Deleted(i) => {
                if !keys.is_empty() {
                    m.handle_leader_deleted(now, i.get(&keys));
                    c.drain(&mut m, now);
                }
            }
            Step::Elect { name, rev_delta } => {
                let grant = LeaseGrant {
                    campaign: last_campaign,
                    lease: 1,
                    ttl: Duration::from_secs(3),
                    sent_at: now,
                };
                c.granting(&grant);
                m.handle_lease_granted(now, grant);
                c.drain(&mut m, now);
                let key = ElectionKey {
                    key: Bytes::from(format!("election/{name}")),
                    create_revision: revision(*rev_delta),
                };
                keys.push(key.clone());
                m.handle_campaign_won(now, last_campaign, key);
                c.drain(&mut m, now);
            }
            Step::Shutdown => {
                c.shutting_down();
                m.handle_shutdown(now);
                c.drain(&mut m, now);
            }
        }
    }
    c.finish(&mut m, now, requests.len());
    c.transcript
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// Any order of inputs: every output satisfies the contract (see
    /// `checker`), and after shutdown every request has its one outcome.
    #[test]
    fn random_event_orders_keep_the_contract(
        max_wait_ms in 0u64..6_000,
        steps in prop::collection::vec(step(), 1..150),
    ) {
        run(max_wait_ms, false, &steps);
    }

    /// The embedded store's machine: every request served, fences empty,
    /// election inputs without effect.
    #[test]
    fn embedded_keeps_the_contract(steps in prop::collection::vec(step(), 1..60)) {
        run(1_000, true, &steps);
    }

    /// Same inputs, same outputs.
    #[test]
    fn deterministic(
        max_wait_ms in 0u64..6_000,
        steps in prop::collection::vec(step(), 1..100),
    ) {
        prop_assert_eq!(run(max_wait_ms, false, &steps), run(max_wait_ms, false, &steps));
    }
}

/// The generator reaches every kind of outcome often enough for the
/// properties above to mean something (a canary against a generator that
/// stops leading anywhere).
#[test]
fn generator_reaches_every_outcome() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let runs = (0u64..6_000, prop::collection::vec(step(), 1..150));
    let patterns = [
        "route: Serve",
        "route: Forward",
        "route: Wait",
        "Reject(NoLeader)",
        ": Ok(Fence",
        ": Err(BackendSwitched)",
        "error: BackendSwitched",
        "error: LostLeadership",
        "role: Leader",
        "role: Follower",
        "Abandon",
    ];
    let mut hits = [0usize; 11];
    for _ in 0..256 {
        let (max_wait_ms, steps) = runs.new_tree(&mut runner).unwrap().current();
        let transcript = run(max_wait_ms, false, &steps);
        for (hit, pattern) in hits.iter_mut().zip(patterns) {
            if transcript.iter().any(|line| line.contains(pattern)) {
                *hit += 1;
            }
        }
    }
    for (hit, pattern) in hits.iter().zip(patterns) {
        assert!(*hit >= 13, "{pattern:?} in only {hit} of 256 runs");
    }
}
