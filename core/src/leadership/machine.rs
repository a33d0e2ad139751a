//! The [`Leadership`] machine.

use std::collections::VecDeque;

use metropolis_proto::prelude::storage::LeaderElectionValue;
use prost::Message;

use super::requests::{Handling, Requests};
use super::{
    Action, CampaignId, ConfigError, ElectionKey, Epoch, Event, Fence, FollowerRole, LeaderRole,
    LeadershipConfig, LeadershipError, LeaseGrant, RequestId, Role, Route,
};
use crate::store::LeaseId;
use crate::time::Instant;

/// Where the current campaign stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Candidacy {
    /// No campaign: the embedded store, or stopped.
    Off,
    /// [`Action::Campaign`] was emitted; no lease reported yet.
    AwaitingLease(CampaignId),
    /// The campaign holds a lease, alive until `expires`.
    Holding {
        campaign: CampaignId,
        lease: LeaseId,
        expires: Instant,
    },
}

impl Candidacy {
    fn campaign(self) -> Option<CampaignId> {
        match self {
            Candidacy::Off => None,
            Candidacy::AwaitingLease(c) | Candidacy::Holding { campaign: c, .. } => Some(c),
        }
    }
}

/// The newest leader key this instance knows of. Reports about older keys
/// are stale: the leader is the oldest live key, so once a key is known to
/// lead, every older one is gone.
#[derive(Clone, Debug)]
struct Newest {
    key: ElectionKey,
    /// Known to be gone (deleted, or its fence failed).
    gone: bool,
}

/// The leadership machine and request router of one curator instance:
/// its role (campaigning, leader, follower), the route of every request,
/// the cancellation of requests bound to a role that ended, and the fence
/// of every leader write. Sans-IO: no clock, no store, no sockets.
///
/// # Driving contract
///
/// Getters: [`role`](Self::role), [`epoch`](Self::epoch),
/// [`waiting`](Self::waiting), [`in_flight`](Self::in_flight).
///
/// Inputs, each with the current [`Instant`] (monotonic: an instant
/// earlier than one already given counts as the latest given). Every input
/// first processes the timers due at its instant, so a lease that ran out
/// ends the leadership before anything else is decided.
/// - from the election port (driven by [`Action`]s):
///   [`handle_lease_granted`](Self::handle_lease_granted),
///   [`handle_lease_lost`](Self::handle_lease_lost),
///   [`handle_campaign_won`](Self::handle_campaign_won),
///   [`handle_leader_observed`](Self::handle_leader_observed),
///   [`handle_leader_deleted`](Self::handle_leader_deleted);
/// - from the service layer:
///   [`handle_request`](Self::handle_request) (returns the request's ID),
///   [`handle_request_finished`](Self::handle_request_finished),
///   [`write_fence`](Self::write_fence) before each write of a served
///   request, [`handle_fence_failed`](Self::handle_fence_failed) when the
///   store refused one;
/// - [`handle_timeout`](Self::handle_timeout) once the instant of
///   [`poll_timeout`](Self::poll_timeout) is reached;
/// - [`handle_shutdown`](Self::handle_shutdown).
///
/// Outputs, drained after every input (and after construction):
/// [`poll_action`](Self::poll_action) until `None` (for the election
/// port), [`poll_event`](Self::poll_event) until `None` (for the service
/// layer), then wait until [`poll_timeout`](Self::poll_timeout) (`None`:
/// until the next input). Queues grow until drained.
///
/// # Behaviour (semantics.md, "Leadership and forwarding")
///
/// - Every request gets routes through [`Event::Routed`]: served here
///   while leading, forwarded to the leader's curator address while
///   following; while no leader is known it waits until a leader becomes
///   known or until the earlier of its deadline and arrival plus
///   [`LeadershipConfig::max_wait`] (then "no curator leader").
/// - A served or forwarded request is bound to the role (the [`Epoch`]) it
///   was routed in. On any role change all of them are cancelled
///   ([`Event::Cancelled`], "curator backend switched, request can be
///   retried") before the [`Event::RoleChanged`], and waiting requests are
///   routed under the new role after it. Every request thus ends exactly
///   once: finished by the service, rejected, or cancelled.
/// - A leader's writes carry the [`Fence`] of its epoch; a request of an
///   ended epoch gets none. A failed fence ends the leadership: that
///   request is cancelled with "lost leadership", the others as above, and
///   the instance campaigns again with a fresh lease.
/// - Reports are ordered by the election keys' create revisions: a report
///   about a key older than the newest known leader is stale and ignored,
///   as are reports about a campaign other than the current one.
/// - The leader is the instance whose campaign won while its lease is
///   alive (`sent_at + ttl` of its latest renewal): at expiry, loss, a
///   newer leader observed or its key deleted, it steps down.
/// - An observed leader that is this node (an older key of its own) or
///   whose value is undecodable or has no address cannot be forwarded to:
///   the instance counts as campaigning until its own win or a newer leader.
#[derive(Debug)]
pub struct Leadership {
    /// `None` with the embedded store.
    config: Option<LeadershipConfig>,
    now: Instant,
    epoch: Epoch,
    role: Role,
    candidacy: Candidacy,
    last_campaign: u64,
    newest: Option<Newest>,
    requests: Requests,
    events: VecDeque<Event>,
    actions: VecDeque<Action>,
}

impl Leadership {
    /// A machine for an instance over an elected store (etcd), starting at
    /// `now` as [`Role::Campaigning`] with an [`Action::Campaign`] queued.
    pub fn new(config: LeadershipConfig, now: Instant) -> Result<Leadership, ConfigError> {
        config.validate()?;
        let mut machine = Leadership {
            config: Some(config),
            now,
            epoch: Epoch(1),
            role: Role::Campaigning,
            candidacy: Candidacy::Off,
            last_campaign: 0,
            newest: None,
            requests: Requests::default(),
            events: VecDeque::new(),
            actions: VecDeque::new(),
        };
        machine.start_campaign();
        Ok(machine)
    }

    /// A machine for the only instance over the embedded store: always
    /// [`Role::Sole`], every request served, writes unfenced. Election
    /// inputs are ignored; it only ever changes role on shutdown.
    pub fn embedded(now: Instant) -> Leadership {
        Leadership {
            config: None,
            now,
            epoch: Epoch(1),
            role: Role::Sole,
            candidacy: Candidacy::Off,
            last_campaign: 0,
            newest: None,
            requests: Requests::default(),
            events: VecDeque::new(),
            actions: VecDeque::new(),
        }
    }

    /// The current role.
    pub fn role(&self) -> &Role {
        &self.role
    }

    /// The current role's epoch.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// How many requests wait for a leader.
    pub fn waiting(&self) -> usize {
        self.requests.waiting_len()
    }

    /// How many requests are served or forwarded under the current role.
    pub fn in_flight(&self) -> usize {
        self.requests.routed_len()
    }

    /// Input: a request arrived, with its deadline (`None`: none). Returns
    /// its ID; its route follows in [`poll_event`](Self::poll_event).
    pub fn handle_request(&mut self, now: Instant, deadline: Option<Instant>) -> RequestId {
        self.advance(now);
        let id = self.requests.next_id();
        let route = match &self.role {
            Role::Leader(_) | Role::Sole => {
                self.requests.route(id, self.epoch, Handling::Served);
                Route::Serve
            }
            Role::Follower(f) => {
                self.requests.route(id, self.epoch, Handling::Forwarded);
                forward_route(f)
            }
            Role::Campaigning => {
                let max_wait = self.config.as_ref().map(|c| c.max_wait).unwrap_or_default();
                let cap = self.now + max_wait;
                let until = deadline.map_or(cap, |d| d.min(cap));
                if until <= self.now {
                    Route::Reject(LeadershipError::NoLeader)
                } else {
                    self.requests.wait(id, until);
                    Route::Wait { until }
                }
            }
            Role::Stopped => Route::Reject(LeadershipError::ShuttingDown),
        };
        self.events.push_back(Event::Routed { request: id, route });
        id
    }

    /// Input: the service is done with a request (it completed, or its
    /// caller went away while it waited). Unknown or already ended
    /// requests are ignored.
    pub fn handle_request_finished(&mut self, now: Instant, request: RequestId) {
        self.advance(now);
        self.requests.remove(request);
    }

    /// The fence a write of `request` must carry ([`Fence::guard`]), asked
    /// right before each write. Refused with
    /// [`LeadershipError::BackendSwitched`] unless `request` is served
    /// under the current role and that role leads (after processing the
    /// timers due at `now`): a request of an ended epoch never writes. A
    /// refused request's cancellation is (or already was) in
    /// [`poll_event`](Self::poll_event).
    pub fn write_fence(
        &mut self,
        now: Instant,
        request: RequestId,
    ) -> Result<Fence, LeadershipError> {
        self.advance(now);
        match (self.requests.routed(request), &self.role) {
            (Some((epoch, Handling::Served)), Role::Leader(l)) if epoch == self.epoch => {
                Ok(Fence::election(l.key.clone()))
            }
            (Some((epoch, Handling::Served)), Role::Sole) if epoch == self.epoch => {
                Ok(Fence::unfenced())
            }
            _ => Err(LeadershipError::BackendSwitched),
        }
    }

    /// Input: the store refused a write of `request` because its fence
    /// failed ([`FenceCheck::Lost`](super::FenceCheck::Lost)). If the
    /// request is served under the current leadership, the instance steps
    /// down: `request` is cancelled with "lost leadership", the other
    /// requests as on any role change, and a new campaign starts. Otherwise
    /// (the leadership already ended) it is ignored.
    pub fn handle_fence_failed(&mut self, now: Instant, request: RequestId) {
        self.advance(now);
        let Role::Leader(leader) = &self.role else {
            return;
        };
        if self.requests.routed(request) != Some((self.epoch, Handling::Served)) {
            return;
        }
        if let Some(newest) = &mut self.newest
            && newest.key == leader.key
        {
            newest.gone = true;
        }
        self.restart_campaign();
        self.change_role(Role::Campaigning, Some(request));
    }

    /// Input: the lease of `grant.campaign` was granted or renewed. Stale
    /// campaigns and leases other than the campaign's first are ignored. A
    /// grant already expired at `now` counts as lost.
    pub fn handle_lease_granted(&mut self, now: Instant, grant: LeaseGrant) {
        self.advance(now);
        let expires = grant.sent_at + grant.ttl;
        match self.candidacy {
            Candidacy::AwaitingLease(campaign) if campaign == grant.campaign => {
                self.candidacy = Candidacy::Holding {
                    campaign,
                    lease: grant.lease,
                    expires,
                };
                // An already expired grant ends right here.
                self.advance(self.now);
            }
            Candidacy::Holding {
                campaign,
                lease,
                expires: old,
            } if campaign == grant.campaign && lease == grant.lease => {
                self.candidacy = Candidacy::Holding {
                    campaign,
                    lease,
                    expires: old.max(expires),
                };
            }
            _ => {}
        }
    }

    /// Input: the lease of `campaign` is gone (a keep-alive found it
    /// revoked or expired, or the port gave up on it). A leader steps
    /// down; a new campaign starts.
    pub fn handle_lease_lost(&mut self, now: Instant, campaign: CampaignId) {
        self.advance(now);
        if self.candidacy.campaign() == Some(campaign) {
            self.lease_ended();
        }
    }

    /// Input: `campaign` won: its election key `key` is the oldest under
    /// the election prefix. This instance leads, unless the campaign is
    /// stale (ignored), its lease was never reported or a newer leader is
    /// already known (the campaign is abandoned for a new one).
    pub fn handle_campaign_won(&mut self, now: Instant, campaign: CampaignId, key: ElectionKey) {
        self.advance(now);
        if self.candidacy.campaign() != Some(campaign) {
            return;
        }
        if let Role::Leader(l) = &self.role
            && l.key == key
        {
            return;
        }
        let Candidacy::Holding { lease, .. } = self.candidacy else {
            self.restart_campaign();
            return;
        };
        // The observation may have reported this key (as this node's,
        // hence not forwardable) before the win arrived.
        if !self.is_news(&key) && !self.is_newest(&key) {
            self.restart_campaign();
            return;
        }
        self.newest = Some(Newest {
            key: key.clone(),
            gone: false,
        });
        self.change_role(Role::Leader(LeaderRole { key, lease }), None);
    }

    /// Input: the election's observation reports `key` as the leader, with
    /// its value (an encoded [`LeaderElectionValue`], as stored).
    pub fn handle_leader_observed(&mut self, now: Instant, key: ElectionKey, value: &[u8]) {
        self.advance(now);
        if self.candidacy == Candidacy::Off {
            return;
        }
        if !self.is_news(&key) && !self.is_newest(&key) {
            return;
        }
        if let Role::Leader(l) = &self.role {
            if l.key == key {
                return;
            }
            // A newer key leads: this instance's key is gone.
            self.restart_campaign();
        }
        self.newest = Some(Newest {
            key: key.clone(),
            gone: false,
        });
        let role = match self.forwardable(value) {
            Some(leader) => Role::Follower(FollowerRole { key, leader }),
            None => Role::Campaigning,
        };
        self.change_role(role, None);
    }

    /// Input: the election's observation reports that the leader's key
    /// `key` (as reported before) was deleted. The instance campaigns
    /// (and if it was its own key, starts a new campaign).
    pub fn handle_leader_deleted(&mut self, now: Instant, key: &ElectionKey) {
        self.advance(now);
        match &mut self.newest {
            Some(n) if n.key == *key && !n.gone => n.gone = true,
            _ => return,
        }
        match &self.role {
            Role::Leader(l) if l.key == *key => {
                self.restart_campaign();
                self.change_role(Role::Campaigning, None);
            }
            Role::Follower(f) if f.key == *key => self.change_role(Role::Campaigning, None),
            _ => {}
        }
    }

    /// Input: time reached `now` (see [`poll_timeout`](Self::poll_timeout)).
    pub fn handle_timeout(&mut self, now: Instant) {
        self.advance(now);
    }

    /// Input: the instance shuts down. Waiting requests are rejected and
    /// routed ones cancelled with "curator shutting down", the campaign is
    /// abandoned (its lease revoked so a successor takes over at once),
    /// and the role becomes [`Role::Stopped`]: later requests are rejected.
    pub fn handle_shutdown(&mut self, now: Instant) {
        self.advance(now);
        if self.role == Role::Stopped {
            return;
        }
        self.abandon_campaign();
        for request in self.requests.take_waiting() {
            self.events.push_back(Event::Routed {
                request,
                route: Route::Reject(LeadershipError::ShuttingDown),
            });
        }
        self.change_role(Role::Stopped, None);
    }

    /// Output: the next thing the election port must do.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Output: the next role change, route or cancellation for the service
    /// layer, in the order they happened.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Output: when [`handle_timeout`](Self::handle_timeout) is next due
    /// (the earliest wait end or lease expiry); `None`: no timer.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let lease = match self.candidacy {
            Candidacy::Holding { expires, .. } => Some(expires),
            _ => None,
        };
        match (lease, self.requests.next_wait_end()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Moves time to `now` (never back) and runs the timers due: an
    /// expired lease first (it may end the leadership), then wait ends.
    fn advance(&mut self, now: Instant) {
        self.now = self.now.max(now);
        if let Candidacy::Holding { expires, .. } = self.candidacy
            && expires <= self.now
        {
            self.lease_ended();
        }
        for request in self.requests.take_expired(self.now) {
            self.events.push_back(Event::Routed {
                request,
                route: Route::Reject(LeadershipError::NoLeader),
            });
        }
    }

    /// The current campaign's lease is gone: a leader steps down, and a
    /// new campaign starts.
    fn lease_ended(&mut self) {
        self.restart_campaign();
        if let Role::Leader(l) = &self.role {
            if let Some(newest) = &mut self.newest
                && newest.key == l.key
            {
                newest.gone = true;
            }
            self.change_role(Role::Campaigning, None);
        }
    }

    /// Whether `key` is newer than every leader key known: the revision
    /// orders keys, and a known key that is gone never comes back.
    fn is_news(&self, key: &ElectionKey) -> bool {
        self.newest
            .as_ref()
            .is_none_or(|n| key.create_revision > n.key.create_revision)
    }

    /// Whether `key` is the newest leader key known, and not gone.
    fn is_newest(&self, key: &ElectionKey) -> bool {
        self.newest
            .as_ref()
            .is_some_and(|n| n.key == *key && !n.gone)
    }

    /// The observed value, if requests can be forwarded to it: decodable,
    /// with an address, and another node's.
    fn forwardable(&self, value: &[u8]) -> Option<LeaderElectionValue> {
        let value = LeaderElectionValue::decode(value).ok()?;
        let own = self.config.as_ref().map(|c| c.node_id.as_str());
        (!value.curator_address.is_empty() && Some(value.node_id.as_str()) != own).then_some(value)
    }

    fn start_campaign(&mut self) {
        let Some(config) = &self.config else {
            return;
        };
        self.last_campaign += 1;
        let campaign = CampaignId(self.last_campaign);
        self.candidacy = Candidacy::AwaitingLease(campaign);
        self.actions.push_back(Action::Campaign {
            campaign,
            ttl: config.lease_ttl,
            value: config.election_value().encode_to_vec().into(),
        });
    }

    fn abandon_campaign(&mut self) {
        let lease = match self.candidacy {
            Candidacy::Off => return,
            Candidacy::AwaitingLease(_) => None,
            Candidacy::Holding { lease, .. } => Some(lease),
        };
        if let Some(campaign) = self.candidacy.campaign() {
            self.actions.push_back(Action::Abandon { campaign, lease });
        }
        self.candidacy = Candidacy::Off;
    }

    fn restart_campaign(&mut self) {
        self.abandon_campaign();
        self.start_campaign();
    }

    /// Ends the current role for `role` (if different): cancels every
    /// request routed under it (`lost` with "lost leadership"), announces
    /// the new epoch, and routes the waiting requests if the new role can.
    fn change_role(&mut self, role: Role, lost: Option<RequestId>) {
        if role == self.role {
            return;
        }
        let switched = if role == Role::Stopped {
            LeadershipError::ShuttingDown
        } else {
            LeadershipError::BackendSwitched
        };
        for request in self.requests.take_routed() {
            let error = if Some(request) == lost {
                LeadershipError::LostLeadership
            } else {
                switched
            };
            self.events.push_back(Event::Cancelled { request, error });
        }
        self.epoch = Epoch(self.epoch.0 + 1);
        self.role = role;
        self.events.push_back(Event::RoleChanged {
            epoch: self.epoch,
            role: self.role.clone(),
        });
        let (handling, route) = match &self.role {
            Role::Leader(_) | Role::Sole => (Handling::Served, Route::Serve),
            Role::Follower(f) => (Handling::Forwarded, forward_route(f)),
            Role::Campaigning | Role::Stopped => return,
        };
        for request in self.requests.take_waiting() {
            self.requests.route(request, self.epoch, handling);
            self.events.push_back(Event::Routed {
                request,
                route: route.clone(),
            });
        }
    }

    /// Checks the machine's internal invariants (tests only).
    #[cfg(test)]
    pub(super) fn assert_invariants(&self) {
        if self.requests.routed_len() > 0 {
            assert!(
                !matches!(self.role, Role::Campaigning | Role::Stopped),
                "requests routed while {:?}",
                self.role
            );
        }
        if self.requests.waiting_len() > 0 {
            assert_eq!(
                self.role,
                Role::Campaigning,
                "requests wait while not campaigning"
            );
        }
        if let Some(t) = self.requests.next_wait_end() {
            assert!(
                t > self.now,
                "a wait ended at {t:?} is still pending at {:?}",
                self.now
            );
        }
        if let Role::Leader(l) = &self.role {
            match self.candidacy {
                Candidacy::Holding { lease, expires, .. } => {
                    assert_eq!(lease, l.lease, "leader without its lease");
                    assert!(expires > self.now, "leader past its lease");
                }
                other => panic!("leader while {other:?}"),
            }
        }
    }
}

fn forward_route(f: &FollowerRole) -> Route {
    Route::Forward {
        node_id: f.leader.node_id.clone(),
        address: f.leader.curator_address.clone(),
    }
}
