//! `GetDebugKubeconfig`: request validation and the issuance log.
//!
//! A debug kubeconfig is for Kubernetes, never for Metropolis: its common
//! name and organizations may not be ones the cluster's certificate
//! classifier ([`identity_from_certificate`](metropolis_core::identity::identity_from_certificate))
//! reads as the owner or a node, whatever CA signs it. The daemon also
//! refuses to start with a Kubernetes CA that is the cluster CA; this check
//! is the second, independent layer.

use metropolis_proto::prelude::debug;
use tonic::Status;

use metropolis_core::identity::{ReservedName, reserved_common_name, reserved_organization};
use metropolis_core::ports::{IssuedKubeconfig, KubeconfigIssuer};

/// Longest accepted identity or group name, in bytes.
pub const MAX_NAME_LEN: usize = 256;

/// Most groups in one request.
pub const MAX_GROUPS: usize = 64;

/// The group whose members bypass Kubernetes authorization entirely.
pub const SYSTEM_MASTERS: &str = "system:masters";

fn check_name(field: &str, value: &str) -> Result<(), Status> {
    if value.is_empty() {
        return Err(Status::invalid_argument(format!(
            "{field}: must not be empty"
        )));
    }
    if value.len() > MAX_NAME_LEN {
        return Err(Status::invalid_argument(format!(
            "{field}: {} bytes, at most {MAX_NAME_LEN} allowed",
            value.len()
        )));
    }
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        return Err(Status::invalid_argument(format!(
            "{field}: {} contains the control character {c:?}",
            metropolis_core::quote::quoted(value)
        )));
    }
    Ok(())
}

/// InvalidArgument for `value` of `field`, a Metropolis identity's name.
fn reserved(field: &str, value: &str, why: ReservedName) -> Status {
    Status::invalid_argument(format!(
        "{field}: {} is reserved: {why}; debug kubeconfigs are Kubernetes credentials and never \
         carry a Metropolis identity (common name \"owner\" or \"metropolis-...\", organization \
         \"metropolis\", in any letter case)",
        metropolis_core::quote::quoted(value)
    ))
}

/// Validates a request: InvalidArgument naming the field, for a name that
/// is empty, too long, has control characters or is a Metropolis
/// identity's ([`ReservedName`]).
pub fn validate(request: &debug::GetDebugKubeconfigRequest) -> Result<(), Status> {
    check_name("id", &request.id)?;
    if let Some(why) = reserved_common_name(&request.id) {
        return Err(reserved("id", &request.id, why));
    }
    if request.groups.len() > MAX_GROUPS {
        return Err(Status::invalid_argument(format!(
            "groups: {} given, at most {MAX_GROUPS} allowed",
            request.groups.len()
        )));
    }
    for (i, group) in request.groups.iter().enumerate() {
        let field = format!("groups[{i}]");
        check_name(&field, group)?;
        if let Some(why) = reserved_organization(group) {
            return Err(reserved(&field, group, why));
        }
    }
    Ok(())
}

/// Validates, issues through `issuer`, and logs the issuance (id, groups,
/// expiry, and the caller's address `peer` when the listener knows it; a
/// warning for `system:masters`).
pub fn issue(
    issuer: Option<&dyn KubeconfigIssuer>,
    request: &debug::GetDebugKubeconfigRequest,
    peer: Option<&str>,
) -> Result<debug::GetDebugKubeconfigResponse, Status> {
    validate(request)?;
    let Some(issuer) = issuer else {
        return Err(Status::failed_precondition(
            "no Kubernetes CA configured: start metropolisd with --kubernetes-ca-cert FILE \
             --kubernetes-ca-key FILE, or let it generate a debug CA \
             (--kubernetes-ca-generate=true)",
        ));
    };
    let IssuedKubeconfig {
        kubeconfig,
        not_after_unix,
        generated_ca,
    } = issuer
        .issue_kubeconfig(&request.id, &request.groups)
        .map_err(crate::status::debug::kubeconfig)?;
    let peer = peer.unwrap_or("unknown");
    if request.groups.iter().any(|g| g == SYSTEM_MASTERS) {
        tracing::warn!(
            %peer,
            id = %request.id,
            groups = ?request.groups,
            not_after_unix,
            generated_ca,
            "issued a debug kubeconfig in system:masters (unrestricted cluster admin; \
             Kubernetes cannot revoke it before it expires)"
        );
    } else {
        tracing::info!(
            %peer,
            id = %request.id,
            groups = ?request.groups,
            not_after_unix,
            generated_ca,
            "issued a debug kubeconfig"
        );
    }
    Ok(debug::GetDebugKubeconfigResponse {
        debug_kubeconfig: kubeconfig,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn req(id: &str, groups: &[&str]) -> debug::GetDebugKubeconfigRequest {
        debug::GetDebugKubeconfigRequest {
            id: id.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }

    #[test]
    fn names_the_bad_field() {
        let e = validate(&req("", &[])).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().starts_with("id:"), "{}", e.message());
        let e = validate(&req("alice", &["ok", ""])).unwrap_err();
        assert!(e.message().starts_with("groups[1]:"), "{}", e.message());
        let e = validate(&req("al\nice", &[])).unwrap_err();
        assert!(e.message().contains("control"), "{}", e.message());
        let long = "x".repeat(MAX_NAME_LEN + 1);
        assert!(validate(&req(&long, &[])).is_err());
        let many: Vec<&str> = std::iter::repeat_n("g", MAX_GROUPS + 1).collect();
        assert!(validate(&req("alice", &many)).is_err());
        validate(&req("alice", &["system:masters", "dev"])).unwrap();
    }

    #[test]
    fn metropolis_identities_are_refused() {
        let node = "metropolis-000102030405060708090a0b0c0d0e0f";
        for (id, groups, field) in [
            ("owner", &["metropolis"][..], "id:"),
            ("Owner", &[][..], "id:"),
            (node, &[][..], "id:"),
            ("METROPOLIS-anything", &[][..], "id:"),
            ("alice", &["dev", "metropolis"][..], "groups[1]:"),
            ("alice", &["MetroPolis"][..], "groups[0]:"),
        ] {
            let e = validate(&req(id, groups)).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{id} {groups:?}");
            assert!(e.message().starts_with(field), "{}", e.message());
            assert!(e.message().contains("is reserved"), "{}", e.message());
        }
        // Near misses are Kubernetes names like any other.
        validate(&req("owner-alice", &["metropolis-admins", "dev"])).unwrap();
        validate(&req("system:node:metropolis-1", &[])).unwrap();
        // Refused before any issuer is consulted.
        let e = issue(None, &req("owner", &[]), None).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn without_issuer_fails_naming_the_flags() {
        let e = issue(None, &req("alice", &[]), None).unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(
            e.message().contains("--kubernetes-ca-cert"),
            "{}",
            e.message()
        );
        // Validation comes first.
        let e = issue(None, &req("", &[]), None).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }
}
