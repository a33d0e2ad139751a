//! The values going in and out of a [`Leadership`](super::Leadership):
//! configuration, identifiers, roles, routes, events and actions.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use metropolis_proto::prelude::storage::LeaderElectionValue;

use super::{ConfigError, ElectionKey, LeadershipError};
use crate::store::LeaseId;
use crate::time::Instant;

/// Schema version of the [`LeaderElectionValue`] this build writes.
pub const ELECTION_VALUE_SCHEMA_VERSION: u32 = 1;

/// Default lease TTL (docs/spec/semantics.md): 5 s, as the reference
/// node runs its curator.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(5);

/// Default cap on how long a request waits for a leader.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(10);

/// Configuration of an elected [`Leadership`](super::Leadership).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeadershipConfig {
    /// This instance's node ID: written into the election value, and how
    /// the machine recognises its own key when it observes it.
    pub node_id: String,
    /// `host:port` at which this instance's curator serves its peers;
    /// followers forward to it while this instance leads.
    pub curator_address: String,
    /// TTL of the campaign lease, a whole number of seconds, at least 1
    /// (default [`DEFAULT_LEASE_TTL`]). A leader whose lease is not
    /// renewed within it steps down.
    pub lease_ttl: Duration,
    /// Longest a request waits for a leader (default
    /// [`DEFAULT_MAX_WAIT`]); its own deadline may end the wait sooner.
    /// Zero: requests never wait.
    pub max_wait: Duration,
}

impl LeadershipConfig {
    /// A configuration with the default lease TTL and maximum wait.
    pub fn new(node_id: impl Into<String>, curator_address: impl Into<String>) -> Self {
        LeadershipConfig {
            node_id: node_id.into(),
            curator_address: curator_address.into(),
            lease_ttl: DEFAULT_LEASE_TTL,
            max_wait: DEFAULT_MAX_WAIT,
        }
    }

    /// Checks that the node ID and address are not empty and the TTL is a
    /// whole number of seconds, at least one (what the store's leases and
    /// [`LeaderElectionValue::ttl`] can express).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field, problem: &str| {
            Err(ConfigError::Field {
                field,
                problem: problem.to_string(),
            })
        };
        if self.node_id.is_empty() {
            return invalid("node_id", "must not be empty");
        }
        if self.curator_address.is_empty() {
            return invalid("curator_address", "must not be empty");
        }
        if self.lease_ttl < Duration::from_secs(1) || self.lease_ttl.subsec_nanos() != 0 {
            return Err(ConfigError::Field {
                field: "lease_ttl",
                problem: format!(
                    "must be a whole number of seconds, at least 1, is {:?}",
                    self.lease_ttl
                ),
            });
        }
        Ok(())
    }

    /// The election value this instance campaigns with.
    pub fn election_value(&self) -> LeaderElectionValue {
        LeaderElectionValue {
            node_id: self.node_id.clone(),
            ttl: self.lease_ttl.as_secs(),
            curator_address: self.curator_address.clone(),
            schema_version: ELECTION_VALUE_SCHEMA_VERSION,
        }
    }
}

/// Numbers the roles of one machine: every role change starts a new,
/// higher epoch. A request is bound to the epoch it was routed in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Epoch(pub(super) u64);

impl Epoch {
    /// The epoch's number (the first role is epoch 1).
    pub fn get(self) -> u64 {
        self.0
    }
}

/// Identifies a request of one machine (assigned in arrival order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(pub(super) u64);

impl RequestId {
    /// The request's number (the first request is 1).
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "request {}", self.0)
    }
}

/// Identifies one campaign ([`Action::Campaign`]): a lease and a
/// candidacy with it. Inputs naming a campaign other than the current one
/// are stale and ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CampaignId(pub(super) u64);

impl CampaignId {
    /// The campaign's number (the first campaign is 1).
    pub fn get(self) -> u64 {
        self.0
    }
}

/// The role of this instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// No usable leader is known: requests wait. The instance campaigns
    /// meanwhile (as it does in every elected role).
    Campaigning,
    /// This instance won the election and serves every request, fencing
    /// its writes.
    Leader(LeaderRole),
    /// Another instance leads; requests are forwarded to it.
    Follower(FollowerRole),
    /// The only instance, over the embedded store: always leader, its
    /// writes unfenced.
    Sole,
    /// Shut down: requests are refused.
    Stopped,
}

/// One line for people: the role, the leader and the term (the revision
/// the leader's election key was created at), e.g. `follower of
/// metropolis-… at 127.0.0.1:7835 (term 42)`.
impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Role::Campaigning => f.write_str("campaigning (no leader known)"),
            Role::Leader(r) => write!(
                f,
                "leader (term {}, lease {:x})",
                r.key.create_revision, r.lease
            ),
            Role::Follower(r) => write!(
                f,
                "follower of {} at {} (term {})",
                r.leader.node_id, r.leader.curator_address, r.key.create_revision
            ),
            Role::Sole => f.write_str("sole instance (embedded store, always leader)"),
            Role::Stopped => f.write_str("stopped"),
        }
    }
}

impl Role {
    /// Whether requests are served locally in this role.
    pub fn is_leader(&self) -> bool {
        matches!(self, Role::Leader(_) | Role::Sole)
    }
}

/// What a leader holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderRole {
    /// The election key; its `create_revision` is the revision won at,
    /// which every write's fence compares.
    pub key: ElectionKey,
    /// The lease the key is attached to.
    pub lease: LeaseId,
}

/// What a follower knows of the leader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FollowerRole {
    /// The leader's election key and its create revision.
    pub key: ElectionKey,
    /// The leader's election value (node ID and curator address).
    pub leader: LeaderElectionValue,
}

/// Where a request goes ([`Event::Routed`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// Serve it here, as leader. Every write asks
    /// [`Leadership::write_fence`](super::Leadership::write_fence) first.
    Serve,
    /// Forward it to the leader.
    Forward {
        /// The leader's node ID (the identity its certificate must carry).
        node_id: String,
        /// The leader's curator address, `host:port`.
        address: String,
    },
    /// No leader is known: hold it until its next route (served or
    /// forwarded when a leader becomes known, rejected at `until`).
    Wait {
        /// When the wait ends with [`LeadershipError::NoLeader`]: the
        /// earlier of the request's deadline and arrival plus the maximum
        /// wait.
        until: Instant,
    },
    /// End it with this error; it was never served or forwarded.
    Reject(LeadershipError),
}

/// What the service layer learns from [`Leadership::poll_event`](super::Leadership::poll_event).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The role changed; `epoch` numbers the new role. Requests routed
    /// under the old role were cancelled right before this event.
    RoleChanged {
        /// The new role's epoch.
        epoch: Epoch,
        /// The new role.
        role: Role,
    },
    /// A route for a request. Each request gets either one final route
    /// (serve, forward, reject), or a [`Route::Wait`] followed by one.
    Routed {
        /// The request.
        request: RequestId,
        /// Where it goes.
        route: Route,
    },
    /// A request that was served or forwarded must end now with `error`:
    /// the role it was routed under ended. Stop serving it (its writes are
    /// refused from now on), close a forwarded call.
    Cancelled {
        /// The request.
        request: RequestId,
        /// [`LeadershipError::BackendSwitched`], [`LeadershipError::ShuttingDown`],
        /// or [`LeadershipError::LostLeadership`] for the request whose
        /// write hit the failed fence.
        error: LeadershipError,
    },
}

/// What the election port must do, from
/// [`Leadership::poll_action`](super::Leadership::poll_action).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Start a campaign: grant a lease of `ttl` (retrying with backoff
    /// while the store fails) and report it with
    /// [`Leadership::handle_lease_granted`](super::Leadership::handle_lease_granted);
    /// keep it alive, reporting each renewal the same way (or its loss
    /// with [`Leadership::handle_lease_lost`](super::Leadership::handle_lease_lost));
    /// campaign with it under the election prefix with `value`, and report
    /// the win with [`Leadership::handle_campaign_won`](super::Leadership::handle_campaign_won).
    Campaign {
        /// Names this campaign in every report about it.
        campaign: CampaignId,
        /// The lease TTL to ask for.
        ttl: Duration,
        /// The election value, encoded [`LeaderElectionValue`].
        value: Bytes,
    },
    /// Stop a campaign: stop renewing its lease, cancel its campaign call,
    /// and revoke the lease (best effort: it expires anyway), which deletes
    /// its election key so that a successor need not wait for the TTL.
    Abandon {
        /// The campaign.
        campaign: CampaignId,
        /// Its lease, if one was reported granted.
        lease: Option<LeaseId>,
    },
}

/// A lease granted or renewed, as the election port reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseGrant {
    /// The campaign the lease belongs to.
    pub campaign: CampaignId,
    /// The lease.
    pub lease: LeaseId,
    /// The TTL the store answered with (remaining time to live).
    pub ttl: Duration,
    /// When the grant or keep-alive request was sent: the lease counts as
    /// alive until `sent_at + ttl`, never longer than the store keeps it.
    pub sent_at: Instant,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_read_as_one_line_with_leader_and_term() {
        let key = ElectionKey {
            key: Bytes::from_static(b"/metropolis/election/abc"),
            create_revision: 42,
        };
        let follower = Role::Follower(FollowerRole {
            key: key.clone(),
            leader: LeaderElectionValue {
                node_id: "metropolis-0123".into(),
                curator_address: "127.0.0.1:7835".into(),
                ..Default::default()
            },
        });
        assert_eq!(
            follower.to_string(),
            "follower of metropolis-0123 at 127.0.0.1:7835 (term 42)"
        );
        let leader = Role::Leader(LeaderRole { key, lease: 0x1f });
        assert_eq!(leader.to_string(), "leader (term 42, lease 1f)");
        assert!(!Role::Campaigning.to_string().contains('{'));
    }
}
