//! Per-method authorization policies, generated at build time from the
//! `metropolis.proto.ext.authorization` method option in the descriptors, so
//! that the .proto files stay the single source of truth.

pub use crate::metropolis::proto::ext::Permission;

/// What a caller needs to call one method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// Every one of these permissions must be held.
    pub need: &'static [Permission],
    /// Callers without identity may call.
    pub allow_unauthenticated: bool,
}

/// The policy of one gRPC method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MethodPolicy {
    /// The HTTP/2 path, `/package.Service/Method`.
    pub path: &'static str,
    /// The rule from the `authorization` option, or `None` when the method
    /// has no such option (the service authenticates by itself).
    pub rule: Option<Rule>,
}

include!(concat!(env!("OUT_DIR"), "/authorization.rs"));

/// The policy of the method at `path`, if the method exists.
pub fn policy(path: &str) -> Option<&'static MethodPolicy> {
    METHODS.iter().find(|m| m.path == path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn curator_policies_come_from_descriptors() {
        let watch =
            policy("/metropolis.node.core.curator.proto.api.Curator/Watch").and_then(|p| p.rule);
        assert_eq!(
            watch,
            Some(Rule {
                need: &[Permission::ReadClusterStatus],
                allow_unauthenticated: false
            })
        );
        let update = policy("/metropolis.node.core.curator.proto.api.Curator/UpdateNodeStatus")
            .and_then(|p| p.rule);
        assert_eq!(
            update,
            Some(Rule {
                need: &[Permission::UpdateNodeSelf],
                allow_unauthenticated: false
            })
        );
    }

    #[test]
    fn methods_without_option_have_no_rule() {
        let hb = policy("/cloud.bmaas.server.api.AgentCallback/Heartbeat").map(|p| p.rule);
        assert_eq!(hb, Some(None));
        assert_eq!(
            METHODS.len(),
            2 + 2 + 5 + 1 + 1 + 4 + 1,
            "every method of the three services and the four private ones is listed"
        );
        let snapshot = policy("/metropolis.node.core.curator.proto.private.Maintenance/Snapshot")
            .and_then(|p| p.rule);
        assert_eq!(
            snapshot.map(|r| r.need),
            Some(&[Permission::ReadClusterStatus, Permission::UpdateNode][..]),
            "owner-only"
        );
    }
}
