//! The [`Leadership`] machine: construction, requests, outputs and role
//! changes. The election inputs are in [`election`].

mod election;

use std::collections::VecDeque;

use self::election::{Candidacy, Newest};
use super::requests::{Handling, Requests};
use super::{
    Action, ConfigError, Epoch, Event, Fence, FollowerRole, LeadershipConfig, LeadershipError,
    RequestId, Role, Route,
};
use crate::time::Instant;

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
/// ends the leadership before anything else is decided; two exceptions:
/// [`handle_fence_failed`](Self::handle_fence_failed) is applied before
/// them (a refused write ends in "lost leadership" even at the lease's
/// last instant), and [`handle_shutdown`](Self::handle_shutdown) ends
/// waits but starts no campaign for an expired lease.
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
///   store refused one,
///   [`handle_forward_failed`](Self::handle_forward_failed) when a
///   forwarded request found no connection to the leader;
/// - [`handle_timeout`](Self::handle_timeout) once the instant of
///   [`poll_timeout`](Self::poll_timeout) is reached;
/// - [`handle_shutdown`](Self::handle_shutdown).
///
/// Outputs, drained after every input (and after construction):
/// [`poll_action`](Self::poll_action) until `None` (for the election
/// port), [`poll_event`](Self::poll_event) until `None` (for the service
/// layer), then wait until [`poll_timeout`](Self::poll_timeout) (`None`:
/// until the next input). Queues grow until drained. The two queues are
/// independent: draining either first is fine.
///
/// Requests that are not waiting have no timer here: a served or
/// forwarded request's own deadline is the RPC layer's business.
///
/// # Behaviour (docs/spec/semantics.md, "Leadership and forwarding")
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
/// - A follower whose forwarded request found no connection to the leader
///   (a crashed leader, whose key stays until its lease runs out) holds
///   its new requests instead of forwarding them to it: they wait as
///   without a leader, until a role change routes them (the new leader
///   observed, the old key deleted) or, at most a lease TTL later, the
///   hold ends and they are forwarded to the same leader again. A caller
///   is then answered once the new leader serves, rather than retrying
///   against a leader that is gone.
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
    /// While following: the leader could not be reached; new requests
    /// wait until then (or a role change).
    unreachable_until: Option<Instant>,
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
            unreachable_until: None,
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
            unreachable_until: None,
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
            Role::Follower(_) if self.holding() => self.wait_for_leader(id, deadline),
            Role::Follower(f) => {
                self.requests.route(id, self.epoch, Handling::Forwarded);
                forward_route(f)
            }
            Role::Campaigning => self.wait_for_leader(id, deadline),
            Role::Stopped => Route::Reject(LeadershipError::ShuttingDown),
        };
        self.events.push_back(Event::Routed { request: id, route });
        id
    }

    /// Whether new requests are held: following a leader found unreachable.
    fn holding(&self) -> bool {
        self.unreachable_until.is_some_and(|until| until > self.now)
    }

    /// Whether this follower holds its requests because the leader could
    /// not be reached ([`handle_forward_failed`](Self::handle_forward_failed)).
    pub fn leader_unreachable(&self) -> bool {
        matches!(self.role, Role::Follower(_)) && self.holding()
    }

    /// Makes request `id` wait for a leader until the earlier of
    /// `deadline` and now plus the maximum wait; its route.
    fn wait_for_leader(&mut self, id: RequestId, deadline: Option<Instant>) -> Route {
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

    /// Input: forwarding `request` found no connection to the leader (the
    /// call was not sent). If it was forwarded under the current role,
    /// the leader counts as unreachable for a lease TTL (a leader that
    /// died is replaced within its TTL): new requests wait, as without a
    /// leader, until a role change routes them or the hold ends and they
    /// are forwarded to the same leader again. `request` itself is the
    /// service's to end (it answers Unavailable, retryable). Ignored
    /// otherwise, and while a hold is on.
    pub fn handle_forward_failed(&mut self, now: Instant, request: RequestId) {
        self.advance(now);
        if matches!(self.role, Role::Follower(_))
            && !self.holding()
            && self.requests.routed(request) == Some((self.epoch, Handling::Forwarded))
        {
            let ttl = self
                .config
                .as_ref()
                .map(|c| c.lease_ttl)
                .unwrap_or_default();
            self.unreachable_until = Some(self.now + ttl);
        }
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
        // Before the timers of `now`: a lease expiring at this very
        // instant must not turn "lost leadership" into "backend switched".
        self.now = self.now.max(now);
        if matches!(self.role, Role::Leader(_))
            && self.requests.routed(request) == Some((self.epoch, Handling::Served))
        {
            self.step_down(Role::Campaigning, Some(request));
        }
        self.advance(self.now);
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
        // Not `advance`: an expired lease needs no new campaign now.
        self.now = self.now.max(now);
        self.expire_waits();
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
        [lease, self.requests.next_wait_end(), self.unreachable_until]
            .into_iter()
            .flatten()
            .min()
    }

    /// Moves time to `now` (never back) and runs the timers due: an
    /// expired lease first (it may end the leadership), then wait ends.
    fn advance(&mut self, now: Instant) {
        self.now = self.now.max(now);
        if let Candidacy::Holding { expires, .. } = self.candidacy
            && expires <= self.now
        {
            self.restart_campaign();
        }
        // Waits that end now end first, as before any role change.
        self.expire_waits();
        self.end_hold();
    }

    /// Ends a hold whose time came: the waiting requests are forwarded to
    /// the leader again.
    fn end_hold(&mut self) {
        let Some(until) = self.unreachable_until else {
            return;
        };
        if until > self.now {
            return;
        }
        self.unreachable_until = None;
        if let Role::Follower(f) = &self.role {
            let route = forward_route(f);
            for request in self.requests.take_waiting() {
                self.requests
                    .route(request, self.epoch, Handling::Forwarded);
                self.events.push_back(Event::Routed {
                    request,
                    route: route.clone(),
                });
            }
        }
    }

    /// Rejects the requests whose wait ended at or before now.
    fn expire_waits(&mut self) {
        for request in self.requests.take_expired(self.now) {
            self.events.push_back(Event::Routed {
                request,
                route: Route::Reject(LeadershipError::NoLeader),
            });
        }
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
        self.unreachable_until = None;
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
            assert!(
                self.role == Role::Campaigning || self.leader_unreachable(),
                "requests wait while {:?} and not holding",
                self.role
            );
        }
        if self.unreachable_until.is_some() {
            assert!(
                matches!(self.role, Role::Follower(_)),
                "a hold while {:?}",
                self.role
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
