//! Leadership and request routing of a curator instance, as a sans-IO
//! machine (docs/spec/semantics.md, "Leadership and forwarding").
//!
//! - [`Leadership`]: the machine. Its role ([`Role`]: campaigning, leader
//!   with its election key and won revision, follower with the observed
//!   [`LeaderElectionValue`](metropolis_proto::prelude::storage::LeaderElectionValue),
//!   the embedded store's sole instance, stopped), the [`Route`] of every
//!   request, the cancellation of requests bound to a role that ended,
//!   the [`Action`]s the election port carries out, and the [`Fence`] of
//!   every leader write. Its driving contract is documented on the type.
//! - [`Fence`]: the compare "election key's create revision == won
//!   revision" as a value the service layer attaches to its store
//!   transactions ([`Fence::guard`]) and reads back ([`Fence::check`]).
//! - [`LeadershipError`]: why a request ends without being served or
//!   forwarded; all Unavailable.
//!
//! For the election port (etcd: a lease, a campaign and an observation
//! under the election prefix):
//!
//! ```ignore
//! while let Some(action) = machine.poll_action() {
//!     match action {
//!         Action::Campaign { campaign, ttl, value } => port.campaign(campaign, ttl, value),
//!         Action::Abandon { campaign, lease } => port.abandon(campaign, lease),
//!     }
//! }
//! // port tasks report back, with the current Instant:
//! machine.handle_lease_granted(now, LeaseGrant { campaign, lease, ttl, sent_at });
//! machine.handle_campaign_won(now, campaign, ElectionKey { key, create_revision });
//! machine.handle_leader_observed(now, ElectionKey { key, create_revision }, &value);
//! machine.handle_leader_deleted(now, &previously_observed_key);
//! ```
//!
//! For the service layer, per RPC:
//!
//! ```ignore
//! let id = machine.handle_request(now, deadline);
//! // the dispatcher hands each Event::Routed / Event::Cancelled to its request
//! match route {
//!     Route::Serve => { /* per write: */
//!         let fence = machine.write_fence(now, id)?;          // Err -> Status::from
//!         let response = store.txn(fence.guard(txn)).await?;
//!         if fence.check(&response) == FenceCheck::Lost {
//!             machine.handle_fence_failed(now, id);           // Cancelled(LostLeadership) follows
//!         }
//!     }
//!     Route::Forward { node_id, address } => { /* call the leader on the caller's behalf */ }
//!     Route::Wait { .. } => { /* wait for the next route */ }
//!     Route::Reject(e) => return Err(e.into()),
//! }
//! machine.handle_request_finished(now, id);
//! ```

mod error;
mod fence;
mod machine;
mod requests;
mod types;

pub use error::{ConfigError, LeadershipError};
pub use fence::{ElectionKey, Fence, FenceCheck};
pub use machine::Leadership;
pub use types::{
    Action, CampaignId, DEFAULT_LEASE_TTL, DEFAULT_MAX_WAIT, ELECTION_VALUE_SCHEMA_VERSION, Epoch,
    Event, FollowerRole, LeaderRole, LeadershipConfig, LeaseGrant, RequestId, Role, Route,
};

#[cfg(test)]
mod checker;
#[cfg(test)]
mod cluster;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
