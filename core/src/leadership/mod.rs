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
//!   forwarded (every reason is one a client retries).
//!
//! For the election port (etcd: a lease, a campaign and an observation
//! under the election prefix):
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use bytes::Bytes;
//! use metropolis_core::leadership::{Action, CampaignId, ElectionKey, LeaseGrant, Leadership};
//! use metropolis_core::store::LeaseId;
//! use metropolis_core::time::Instant;
//!
//! /// What the runtime's election port does (etcd: lease, campaign, observe).
//! trait ElectionPort {
//!     fn campaign(&self, campaign: CampaignId, ttl: Duration, value: Bytes);
//!     fn abandon(&self, campaign: CampaignId, lease: Option<LeaseId>);
//! }
//!
//! /// Carries out what the machine asks for.
//! fn carry_out(machine: &mut Leadership, port: &impl ElectionPort) {
//!     while let Some(action) = machine.poll_action() {
//!         match action {
//!             Action::Campaign { campaign, ttl, value } => port.campaign(campaign, ttl, value),
//!             Action::Abandon { campaign, lease } => port.abandon(campaign, lease),
//!         }
//!     }
//! }
//!
//! /// The port's tasks report back, with the current instant (time is
//! /// passed in: the machine reads no clock).
//! fn report(
//!     machine: &mut Leadership,
//!     now: Instant,
//!     grant: LeaseGrant,
//!     won: (CampaignId, ElectionKey),
//!     observed: ElectionKey,
//!     value: &[u8],
//! ) {
//!     machine.handle_lease_granted(now, grant);
//!     machine.handle_campaign_won(now, won.0, won.1);
//!     machine.handle_leader_observed(now, observed.clone(), value);
//!     machine.handle_leader_deleted(now, &observed);
//! }
//! ```
//!
//! For the service layer, per RPC:
//!
//! ```no_run
//! use metropolis_core::leadership::{FenceCheck, Leadership, LeadershipError, RequestId, Route};
//! use metropolis_core::ports::KvStore;
//! use metropolis_core::store::{StoreError, Txn};
//! use metropolis_core::time::Instant;
//!
//! /// Why a write did not happen; the service layer answers each with its
//! /// status (`metropolis_service::status`).
//! enum WriteError {
//!     Leadership(LeadershipError),
//!     Store(StoreError),
//! }
//!
//! /// One write of a request the machine routed to be served here. The
//! /// request was registered with `machine.handle_request(now, deadline)`,
//! /// and `machine.poll_event()` said `Event::Routed { request, route }`;
//! /// `Route::Forward` calls the leader on the caller's behalf instead,
//! /// `Route::Wait` waits for the next route, `Route::Reject(e)` ends the
//! /// call with `e`. `Event::Cancelled` ends it the same way.
//! async fn serve_write(
//!     machine: &mut Leadership,
//!     now: Instant,
//!     id: RequestId,
//!     route: Route,
//!     store: &dyn KvStore,
//!     txn: Txn,
//! ) -> Result<(), WriteError> {
//!     match route {
//!         Route::Serve => {
//!             let fence = machine
//!                 .write_fence(now, id)
//!                 .map_err(WriteError::Leadership)?;
//!             let response = store
//!                 .txn(fence.guard(txn))
//!                 .await
//!                 .map_err(WriteError::Store)?;
//!             if fence.check(&response) == FenceCheck::Lost {
//!                 // An Event::Cancelled (lost leadership) follows.
//!                 machine.handle_fence_failed(now, id);
//!             }
//!         }
//!         Route::Reject(e) => return Err(WriteError::Leadership(e)),
//!         _ => {}
//!     }
//!     machine.handle_request_finished(now, id);
//!     Ok(())
//! }
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
mod tests;
