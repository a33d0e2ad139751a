//! Where the machines' errors become gRPC statuses.
//!
//! The machines in `metropolis-core` say what happened ([`AuthzError`],
//! [`LeadershipError`], [`StoreError`], a trace or log query refused, …);
//! which status code a client sees for it is decided here, once per
//! service:
//!
//! - this module: what every service answers alike, because the router
//!   and the store answer for all of them (authorization, leadership and
//!   forwarding, the store);
//! - [`curator`]: Curator and NodeManagement (node IDs, status updates,
//!   stored node records, node certificates);
//! - [`agent_callback`]: AgentCallback and MachineManagement (machine
//!   IDs, heartbeats, installation requests, stored machine records,
//!   callers that are no registered agent);
//! - [`debug`]: `NodeDebugService` (trace sessions, log queries, image
//!   imports, kubeconfigs).
//!
//! What a handler checks of the request itself (a key of the wrong
//! length, a node updating another's status, a record not found) it
//! answers where it checks; an error a machine or a port returns is
//! mapped here.
//!
//! The codes are part of the contract (docs/spec/semantics.md); the
//! messages are the errors' own `Display`, with the request field they
//! concern where the error does not name it.

pub mod agent_callback;
pub mod curator;
pub mod debug;

use metropolis_core::identity::AuthzError;
use metropolis_core::leadership::LeadershipError;
use metropolis_core::store::StoreError;
use tonic::{Code, Status};

use crate::forward::{DecodeIdentityError, ForwardError, ON_BEHALF_OF};

/// A call refused by its method's authorization rule: Unauthenticated
/// without a client certificate, PermissionDenied for a caller missing a
/// permission.
pub fn authz(e: &AuthzError) -> Status {
    let code = match e {
        AuthzError::Unauthenticated => Code::Unauthenticated,
        AuthzError::PermissionDenied { .. } => Code::PermissionDenied,
        // A refusal added later names a caller that may not call.
        _ => Code::PermissionDenied,
    };
    Status::new(code, e.to_string())
}

/// The code of a call ended by leadership: Unavailable for every reason
/// (the role ended, no leader, the fence refused a write, shutting down),
/// so a client retries, here or at another instance.
pub fn leadership_code(e: &LeadershipError) -> Code {
    match e {
        LeadershipError::BackendSwitched
        | LeadershipError::NoLeader
        | LeadershipError::LostLeadership
        | LeadershipError::ShuttingDown => Code::Unavailable,
        // A reason added later is, like these, a retry elsewhere.
        _ => Code::Unavailable,
    }
}

/// A call ended by leadership, with [`leadership_code`] and the message
/// the contract names.
pub fn leadership(e: &LeadershipError) -> Status {
    Status::new(leadership_code(e), e.to_string())
}

/// A call this instance forwarded that the leader did not answer in
/// full: Unavailable, retryable like every change of leader ("curator
/// backend switched, request can be retried"), naming what happened: the
/// leader unreachable (its response never began) or its stream broken
/// (the response cut short).
pub fn forward(e: &ForwardError) -> Status {
    let switched = LeadershipError::BackendSwitched;
    match e {
        ForwardError::StreamBroken { reason } => {
            Status::unavailable(format!("{switched} (the leader's stream broke: {reason})"))
        }
        e => Status::unavailable(format!("{switched} (leader unreachable: {e})")),
    }
}

/// A forwarded call whose [`ON_BEHALF_OF`] names no identity:
/// InvalidArgument (the forwarding instance sent what no build writes).
pub fn on_behalf_of(e: &DecodeIdentityError) -> Status {
    Status::invalid_argument(format!("{ON_BEHALF_OF}: {e}"))
}

/// A store failure: Internal for a transaction the store refused (sent
/// again it would fail again: the store's limits and this instance's
/// disagree, docs/operations.md "Transactions to etcd"), Unavailable for
/// anything else (compacted, unreachable, shutting down), which a retry
/// may overcome.
pub fn store(e: StoreError) -> Status {
    match e {
        StoreError::Refused(_) => Status::internal(e.to_string()),
        e => Status::unavailable(format!("{e}; request can be retried")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_leadership_error_is_unavailable_with_its_message() {
        for e in [
            LeadershipError::BackendSwitched,
            LeadershipError::NoLeader,
            LeadershipError::LostLeadership,
            LeadershipError::ShuttingDown,
        ] {
            let status = leadership(&e);
            assert_eq!(status.code(), Code::Unavailable);
            assert_eq!(status.message(), e.to_string());
        }
    }

    #[test]
    fn a_cause_is_described_through_the_status_carrying_it() {
        #[derive(Debug)]
        struct Wrapper(std::io::Error);
        impl std::fmt::Display for Wrapper {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "transport error: {:?}", self.0)
            }
        }
        impl std::error::Error for Wrapper {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let io = std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "peer closed connection without sending TLS close_notify",
        );
        let status = Status::from_error(Box::new(Wrapper(io)));
        assert_eq!(
            metropolis_core::cause::describe(&status),
            "peer closed connection without sending TLS close_notify"
        );
    }

    #[test]
    fn a_leader_out_of_reach_is_a_retryable_switch_naming_why() {
        let e = ForwardError::Connect {
            reason: "connection refused".into(),
        };
        let status = forward(&e);
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(
            status.message(),
            "curator backend switched, request can be retried (leader unreachable: connection refused)"
        );
        let e = ForwardError::StreamBroken {
            reason: "stream error received: unexpected internal error encountered".into(),
        };
        assert_eq!(
            forward(&e).message(),
            "curator backend switched, request can be retried (the leader's stream broke: \
             stream error received: unexpected internal error encountered)"
        );
        let e = ForwardError::NotForwarding {
            leader: "10.0.0.2:7835".into(),
        };
        assert_eq!(
            forward(&e).message(),
            "curator backend switched, request can be retried (leader unreachable: \
             10.0.0.2:7835: this instance does not forward calls)"
        );
    }

    #[test]
    fn an_undecodable_on_behalf_of_is_invalid_argument() {
        let status = on_behalf_of(&DecodeIdentityError::NotUtf8);
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "x-metropolis-on-behalf-of: not UTF-8");
    }

    #[test]
    fn authorization_refusals_keep_their_two_codes() {
        let status = authz(&AuthzError::Unauthenticated);
        assert_eq!(status.code(), Code::Unauthenticated);
        assert_eq!(status.message(), AuthzError::Unauthenticated.to_string());
        let denied = AuthzError::PermissionDenied {
            identity: metropolis_core::identity::Identity::Owner,
            missing: vec![metropolis_proto::metropolis::proto::ext::Permission::DeleteNode],
        };
        assert_eq!(authz(&denied).code(), Code::PermissionDenied);
    }
}
