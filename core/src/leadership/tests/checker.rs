//! Test-only: watches one [`Leadership`] through its outputs and checks
//! them against the contract after every input. Used by the single-machine
//! property tests and by the cluster simulation.
//!
//! What it checks:
//! - roles: epochs rise by one per change, the machine's role and epoch
//!   match what its events announced, a leader's lease is alive (by the
//!   grants the harness delivered) whenever it leads or hands out a fence;
//! - one role at a time: every request routed under a role is cancelled
//!   before the next role is announced, and a request is never served
//!   while another one is forwarded (or the reverse);
//! - every request gets exactly one outcome (finished by the service,
//!   rejected, cancelled), and none is left once the machine shut down;
//! - holds: a follower told its forwarded request found no connection
//!   holds (makes new requests wait) for a lease TTL or until its role
//!   changes, then forwards the waiting ones to the same leader;
//! - routes: a wait only while campaigning (or holding) and until the earlier of the
//!   deadline and arrival plus the maximum wait; serve only while leading,
//!   forward only to the followed leader; a wait never outlives its end
//!   and never ends early with "no curator leader";
//! - fences: handed out exactly to requests served in the current epoch,
//!   carrying that epoch's won revision; "lost leadership" exactly for the
//!   request whose fence failed;
//! - actions: one campaign at a time, each abandoned (with its lease)
//!   before the next starts, none after shutdown;
//! - a transcript of every output, for determinism checks.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use crate::leadership::*;
use crate::store::LeaseId;
use crate::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Req {
    Waiting { until: Instant },
    Served { epoch: Epoch },
    Forwarded { epoch: Epoch },
}

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Finished,
    Rejected(LeadershipError),
    Cancelled(LeadershipError),
}

#[derive(Debug)]
pub(super) struct Checker {
    max_wait: Duration,
    now: Instant,
    epoch: Epoch,
    role: Role,
    /// Requests not yet ended.
    live: BTreeMap<RequestId, Req>,
    outcomes: BTreeMap<RequestId, Outcome>,
    /// A request that just arrived, with its deadline: routed by the
    /// current input.
    arriving: Option<(RequestId, Option<Instant>)>,
    /// The request whose fence failed under the current leadership.
    lost: Option<RequestId>,
    /// A follower's hold (its leader found unreachable) ends then.
    hold: Option<Instant>,
    lease_ttl: Duration,
    shutting_down: bool,
    /// The campaign started and not abandoned.
    campaign: Option<CampaignId>,
    last_campaign: Option<CampaignId>,
    /// The first lease granted to each campaign and its alive-until.
    leases: BTreeMap<CampaignId, (LeaseId, Instant)>,
    /// Every output, in order.
    pub(super) transcript: Vec<String>,
    /// The actions drained, for the harness to carry out.
    actions: Vec<Action>,
}

impl Checker {
    /// Watches `m`, just constructed at `now`.
    pub(super) fn new(m: &mut Leadership, max_wait: Duration, now: Instant) -> Checker {
        let mut c = Checker {
            max_wait,
            now,
            epoch: m.epoch(),
            role: m.role().clone(),
            live: BTreeMap::new(),
            outcomes: BTreeMap::new(),
            arriving: None,
            lost: None,
            hold: None,
            lease_ttl: Duration::ZERO,
            shutting_down: false,
            campaign: None,
            last_campaign: None,
            leases: BTreeMap::new(),
            transcript: Vec::new(),
            actions: Vec::new(),
        };
        c.drain(m, now);
        c
    }

    /// Takes the actions drained so far, to carry them out.
    /// The machine's lease TTL (how long a hold lasts).
    pub(super) fn set_lease_ttl(&mut self, ttl: Duration) {
        self.lease_ttl = ttl;
    }

    fn holding(&self) -> bool {
        matches!(self.role, Role::Follower(_)) && self.hold.is_some_and(|h| h > self.now)
    }

    /// After `handle_forward_failed(id)`: the machine's timers first, then
    /// a hold if `id` was forwarded under the current role and none is on.
    pub(super) fn forward_failed(&mut self, m: &mut Leadership, now: Instant, id: RequestId) {
        self.drain_then(m, now, |c| {
            if !c.holding()
                && matches!(c.role, Role::Follower(_))
                && c.live.get(&id) == Some(&Req::Forwarded { epoch: c.epoch })
            {
                c.hold = Some(c.now + c.lease_ttl);
            }
        });
    }

    pub(super) fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }

    /// The campaign the machine runs, as far as its actions tell.
    pub(super) fn campaign(&self) -> Option<CampaignId> {
        self.campaign
    }

    /// Whether `id` is served under the current role.
    pub(super) fn is_served(&self, id: RequestId) -> bool {
        self.live.get(&id) == Some(&Req::Served { epoch: self.epoch })
    }

    /// Before `handle_lease_granted(grant)`: mirrors which lease the
    /// machine holds for the campaign, to check leaders against it.
    pub(super) fn granting(&mut self, grant: &LeaseGrant) {
        if self.campaign != Some(grant.campaign) {
            return;
        }
        let until = grant.sent_at + grant.ttl;
        let entry = self
            .leases
            .entry(grant.campaign)
            .or_insert((grant.lease, until));
        if entry.0 == grant.lease {
            entry.1 = entry.1.max(until);
        }
    }

    /// After `handle_request` returned `id`.
    pub(super) fn arrived(
        &mut self,
        m: &mut Leadership,
        now: Instant,
        id: RequestId,
        deadline: Option<Instant>,
    ) {
        assert!(
            !self.outcomes.contains_key(&id) && !self.live.contains_key(&id),
            "{id} reused"
        );
        self.arriving = Some((id, deadline));
        self.drain(m, now);
    }

    /// After `handle_request_finished(id)`.
    pub(super) fn finished(&mut self, m: &mut Leadership, now: Instant, id: RequestId) {
        // The events come first (a due timer may have ended it already).
        self.drain_then(m, now, |c| {
            if c.live.remove(&id).is_some() {
                c.outcome(id, Outcome::Finished);
            }
        });
    }

    /// Before `handle_fence_failed(id)`.
    pub(super) fn fence_failing(&mut self, id: RequestId) {
        if matches!(self.role, Role::Leader(_)) && self.is_served(id) {
            self.lost = Some(id);
        }
    }

    /// After `write_fence(now, id)` answered `result`.
    pub(super) fn fenced(
        &mut self,
        m: &mut Leadership,
        now: Instant,
        id: RequestId,
        result: &Result<Fence, LeadershipError>,
    ) {
        self.drain(m, now);
        self.transcript.push(format!("fence {id}: {result:?}"));
        match result {
            Ok(fence) => {
                assert!(
                    self.is_served(id),
                    "fence for {id} in {:?}",
                    self.live.get(&id)
                );
                match &self.role {
                    Role::Leader(l) => {
                        assert_eq!(fence.key(), Some(&l.key), "fence of another epoch");
                        self.assert_lease_alive(l.lease);
                    }
                    Role::Sole => assert_eq!(fence.key(), None),
                    other => panic!("fence while {other:?}"),
                }
            }
            Err(e) => {
                assert_eq!(*e, LeadershipError::BackendSwitched);
                assert!(!self.is_served(id), "served {id} refused a fence");
            }
        }
    }

    /// Marks the start of `handle_shutdown`.
    pub(super) fn shutting_down(&mut self) {
        self.shutting_down = true;
    }

    /// After any other input at `now`: drains and checks the outputs.
    pub(super) fn drain(&mut self, m: &mut Leadership, now: Instant) {
        self.drain_then(m, now, |_| {});
    }

    /// [`Checker::drain`], running `between` after the events and before
    /// the checks of the machine's state.
    fn drain_then(&mut self, m: &mut Leadership, now: Instant, between: impl FnOnce(&mut Self)) {
        self.now = self.now.max(now);
        let mut cancels: Vec<LeadershipError> = Vec::new();
        while let Some(event) = m.poll_event() {
            self.transcript.push(format!("{event:?}"));
            match event {
                Event::Cancelled { request, error } => {
                    let req = self.live.remove(&request);
                    assert!(
                        matches!(req, Some(Req::Served { epoch } | Req::Forwarded { epoch }) if epoch == self.epoch),
                        "cancelled {request} was {req:?}"
                    );
                    assert_eq!(
                        error == LeadershipError::LostLeadership,
                        self.lost == Some(request),
                        "{request} cancelled with {error:?}, lost fence: {:?}",
                        self.lost
                    );
                    cancels.push(error);
                    self.outcome(request, Outcome::Cancelled(error));
                }
                Event::RoleChanged { epoch, role } => {
                    assert_eq!(epoch.get(), self.epoch.get() + 1, "epochs rise by one");
                    assert_ne!(role, self.role, "a role change changes the role");
                    let outliving: Vec<_> = self
                        .live
                        .iter()
                        .filter(|(_, r)| !matches!(r, Req::Waiting { .. }))
                        .collect();
                    assert!(
                        outliving.is_empty(),
                        "{outliving:?} outlive epoch {:?}",
                        self.epoch
                    );
                    let expected = if role == Role::Stopped {
                        LeadershipError::ShuttingDown
                    } else {
                        LeadershipError::BackendSwitched
                    };
                    assert!(
                        cancels
                            .iter()
                            .all(|e| *e == expected || *e == LeadershipError::LostLeadership),
                        "cancelled with {cancels:?} before {role:?}"
                    );
                    if self.lost.take().is_some() {
                        assert_eq!(
                            role,
                            Role::Campaigning,
                            "a failed fence ends in campaigning"
                        );
                    }
                    cancels.clear();
                    if let Role::Leader(l) = &role {
                        self.assert_lease_alive(l.lease);
                    }
                    self.epoch = epoch;
                    self.role = role;
                    self.hold = None;
                }
                Event::Routed { request, route } => self.routed(request, route),
            }
        }
        assert!(
            cancels.is_empty(),
            "cancellations {cancels:?} without a role change"
        );
        assert_eq!(self.lost, None, "the failed fence ended nothing");
        assert_eq!(self.arriving, None, "an arrival got no route");
        between(self);
        while let Some(action) = m.poll_action() {
            self.transcript.push(format!("{action:?}"));
            self.action(action.clone());
            self.actions.push(action);
        }
        self.after_drain(m);
    }

    fn routed(&mut self, request: RequestId, route: Route) {
        let (new, until) = match self.arriving {
            Some((id, deadline)) if id == request => {
                self.arriving = None;
                let cap = self.now + self.max_wait;
                (true, deadline.map_or(cap, |d| d.min(cap)))
            }
            _ => match self.live.get(&request) {
                Some(Req::Waiting { until }) => (false, *until),
                other => panic!("{request} routed again ({route:?}) while {other:?}"),
            },
        };
        match route {
            Route::Wait { until: u } => {
                assert!(new, "{request} waits twice");
                assert!(
                    self.role == Role::Campaigning || self.holding(),
                    "wait while {:?}",
                    self.role
                );
                assert_eq!(u, until, "wait bound of {request}");
                assert!(u > self.now, "{request} waits until the past");
                self.live.insert(request, Req::Waiting { until });
            }
            Route::Serve => {
                assert!(self.role.is_leader(), "served while {:?}", self.role);
                assert!(
                    new || self.now < until,
                    "{request} served after its wait ended"
                );
                assert!(
                    !self
                        .live
                        .values()
                        .any(|r| matches!(r, Req::Forwarded { .. })),
                    "served while requests are forwarded"
                );
                self.live.insert(request, Req::Served { epoch: self.epoch });
            }
            Route::Forward { node_id, address } => {
                let Role::Follower(f) = &self.role else {
                    panic!("forwarded while {:?}", self.role);
                };
                assert_eq!(
                    (&node_id, &address),
                    (&f.leader.node_id, &f.leader.curator_address)
                );
                assert!(
                    new || self.now < until,
                    "{request} forwarded after its wait ended"
                );
                assert!(!self.holding(), "{request} forwarded during a hold");
                assert!(
                    !self.live.values().any(|r| matches!(r, Req::Served { .. })),
                    "forwarded while requests are served"
                );
                self.live
                    .insert(request, Req::Forwarded { epoch: self.epoch });
            }
            Route::Reject(error) => {
                match error {
                    LeadershipError::NoLeader => {
                        assert!(until <= self.now, "{request} rejected before {until:?}");
                        assert!(
                            self.role == Role::Campaigning
                                || (matches!(self.role, Role::Follower(_)) && self.hold.is_some()),
                            "no leader while {:?}",
                            self.role
                        );
                    }
                    LeadershipError::ShuttingDown => {
                        assert!(self.shutting_down, "{request} rejected as shutting down");
                    }
                    other => panic!("{request} rejected with {other:?}"),
                }
                self.live.remove(&request);
                self.outcome(request, Outcome::Rejected(error));
            }
        }
    }

    fn action(&mut self, action: Action) {
        match action {
            Action::Campaign { campaign, .. } => {
                assert!(!self.shutting_down, "campaign after shutdown");
                assert_eq!(self.campaign, None, "two campaigns at once");
                assert!(self.last_campaign < Some(campaign), "campaign IDs rise");
                self.campaign = Some(campaign);
                self.last_campaign = Some(campaign);
            }
            Action::Abandon { campaign, lease } => {
                assert_eq!(
                    self.campaign,
                    Some(campaign),
                    "abandoned a campaign not running"
                );
                assert_eq!(
                    lease,
                    self.leases.get(&campaign).map(|l| l.0),
                    "abandoned lease"
                );
                self.campaign = None;
            }
        }
    }

    fn after_drain(&mut self, m: &mut Leadership) {
        m.assert_invariants();
        assert_eq!(m.role(), &self.role);
        assert_eq!(m.epoch(), self.epoch);
        assert_eq!(
            m.leader_unreachable(),
            self.holding(),
            "holding at {:?}",
            self.now
        );
        let waiting = self
            .live
            .values()
            .filter(|r| matches!(r, Req::Waiting { .. }));
        let first_end = waiting.clone().map(|r| match r {
            Req::Waiting { until } => *until,
            _ => unreachable!(),
        });
        let first_end = first_end.min();
        assert_eq!(m.waiting(), waiting.count());
        assert_eq!(m.in_flight(), self.live.len() - m.waiting());
        if let Some(end) = first_end {
            assert!(
                end > self.now,
                "a wait ended at {end:?} is pending at {:?}",
                self.now
            );
            assert!(
                m.poll_timeout().is_some_and(|t| t <= end),
                "no wake-up for a wait"
            );
        }
        if let Some(t) = m.poll_timeout() {
            assert!(t > self.now, "timer {t:?} due at {:?} not run", self.now);
        }
        if let Role::Leader(l) = &self.role {
            self.assert_lease_alive(l.lease);
        }
    }

    fn assert_lease_alive(&self, lease: LeaseId) {
        let campaign = self.campaign.expect("a leader runs a campaign");
        let (held, until) = self.leases.get(&campaign).expect("a leader holds a lease");
        assert_eq!(*held, lease, "leader's lease is its campaign's");
        assert!(
            self.now < *until,
            "leading at {:?}, lease alive until {until:?}",
            self.now
        );
    }

    fn outcome(&mut self, id: RequestId, outcome: Outcome) {
        if let Some(first) = self.outcomes.insert(id, outcome) {
            panic!("{id} ended twice: {first:?}, then {outcome:?}");
        }
    }

    /// Shuts the machine down and checks that every request it was given
    /// (`requests` of them) has ended exactly once.
    pub(super) fn finish(&mut self, m: &mut Leadership, now: Instant, requests: usize) {
        self.shutting_down();
        m.handle_shutdown(now);
        self.drain(m, now);
        assert_eq!(self.role, Role::Stopped);
        assert!(
            self.live.is_empty(),
            "left without an outcome: {:?}",
            self.live
        );
        assert_eq!(
            self.outcomes.len(),
            requests,
            "every request has one outcome"
        );
        assert_eq!(m.poll_timeout(), None);
    }
}
