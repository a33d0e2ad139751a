//! The election inputs of a [`Leadership`]: the lease, the campaign and
//! the observed leader, and how they end or start a leadership.

use metropolis_proto::prelude::storage::LeaderElectionValue;
use prost::Message;

use super::super::{
    Action, CampaignId, ElectionKey, FollowerRole, LeaderRole, LeaseGrant, RequestId, Role,
};
use super::Leadership;
use crate::store::LeaseId;
use crate::time::Instant;

/// Where the current campaign stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Candidacy {
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
    pub(super) fn campaign(self) -> Option<CampaignId> {
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
pub(super) struct Newest {
    key: ElectionKey,
    /// Known to be gone (deleted, or its fence failed).
    gone: bool,
}

impl Leadership {
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

    /// Input: the campaign `campaign` cannot go on: its lease is gone (a
    /// keep-alive found it revoked or expired, or the port gave up on it),
    /// or its election key vanished while the lease lives (deleted by
    /// hand: the campaign can never win). A leader steps down; a new
    /// campaign starts.
    pub fn handle_lease_lost(&mut self, now: Instant, campaign: CampaignId) {
        self.advance(now);
        if self.candidacy.campaign() == Some(campaign) {
            self.restart_campaign();
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
    /// its value (an encoded [`LeaderElectionValue`], as stored). A newer
    /// key than any known makes this instance follow it (or campaign, if
    /// it cannot be forwarded to); a leader steps down for it. The known
    /// leader's key again with another value (a new address) is a new
    /// follower role too: requests forwarded to the old value are
    /// cancelled. Older keys are ignored.
    pub fn handle_leader_observed(&mut self, now: Instant, key: ElectionKey, value: &[u8]) {
        self.advance(now);
        if self.candidacy == Candidacy::Off {
            return;
        }
        if !self.is_news(&key) && !self.is_newest(&key) {
            return;
        }
        if let Role::Leader(l) = &self.role
            && l.key == key
        {
            return;
        }
        self.newest = Some(Newest {
            key: key.clone(),
            gone: false,
        });
        let role = match self.forwardable(value) {
            Some(leader) => Role::Follower(FollowerRole { key, leader }),
            None => Role::Campaigning,
        };
        if matches!(self.role, Role::Leader(_)) {
            // A newer key leads: this instance's key is gone.
            self.step_down(role, None);
        } else {
            self.change_role(role, None);
        }
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
            Role::Leader(l) if l.key == *key => self.step_down(Role::Campaigning, None),
            Role::Follower(f) if f.key == *key => self.change_role(Role::Campaigning, None),
            _ => {}
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

    pub(super) fn start_campaign(&mut self) {
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

    pub(super) fn abandon_campaign(&mut self) {
        let (campaign, lease) = match self.candidacy {
            Candidacy::Off => return,
            Candidacy::AwaitingLease(campaign) => (campaign, None),
            Candidacy::Holding {
                campaign, lease, ..
            } => (campaign, Some(lease)),
        };
        self.actions.push_back(Action::Abandon { campaign, lease });
        self.candidacy = Candidacy::Off;
    }

    /// Abandons the current campaign for a new one (its lease is gone or
    /// it cannot win); a leader steps down.
    pub(super) fn restart_campaign(&mut self) {
        if matches!(self.role, Role::Leader(_)) {
            self.step_down(Role::Campaigning, None);
        } else {
            self.abandon_campaign();
            self.start_campaign();
        }
    }

    /// Ends this instance's leadership for `next`: its key counts as gone,
    /// its campaign is abandoned for a new one, and its requests are
    /// cancelled (`lost` with "lost leadership").
    pub(super) fn step_down(&mut self, next: Role, lost: Option<RequestId>) {
        if let Role::Leader(l) = &self.role
            && let Some(newest) = &mut self.newest
            && newest.key == l.key
        {
            newest.gone = true;
        }
        self.abandon_campaign();
        self.start_campaign();
        self.change_role(next, lost);
    }
}
