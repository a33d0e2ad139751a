//! Conversions between the core store types and etcd's, and etcd errors
//! to [`StoreError`].
//!
//! Responses are read from etcd-client's raw protobuf messages (its
//! `pub-response-field` feature) rather than through its accessors, some
//! of which panic on unexpected input: a malformed response is an error
//! here, never a panic.

use std::time::Duration;

use bytes::Bytes;
use etcd_client as ec;
use etcd_client::proto::{PbKeyValue, PbResponseHeader, PbTxnOpResponse};
use metropolis_core::store::{
    CmpOp, Compare, CompareTarget, KeyRange, KeyValue, Op, OpResult, Revision, StoreError, Txn,
    TxnResponse,
};

/// The etcd cluster a client talks to, for error messages: every error
/// names the endpoints it came from.
#[derive(Clone, Debug)]
pub(super) struct Endpoints(pub(super) std::sync::Arc<str>);

impl Endpoints {
    /// `Unavailable` naming the endpoints, the operation and the cause.
    pub(super) fn unavailable(&self, what: &str, cause: impl std::fmt::Display) -> StoreError {
        StoreError::Unavailable(format!("etcd at {}: {what}: {cause}", self.0))
    }

    /// Maps an etcd-client error of operation `what`. `lease` is the lease
    /// a "lease not found" refers to, when the operation names one.
    pub(super) fn error(&self, what: &str, lease: Option<i64>, err: &ec::Error) -> StoreError {
        if let ec::Error::GRpcStatus(status) = err
            && let Some(lease) = lease
            && status.message().contains("requested lease not found")
        {
            return StoreError::LeaseNotFound(lease);
        }
        // etcd checks a request before proposing it: InvalidArgument
        // means nothing of it was applied (too many operations, a request
        // too large, a key given twice). Refusals of the client's
        // credentials are InvalidArgument too, and stay Unavailable.
        if let ec::Error::GRpcStatus(status) = err
            && status.code() == tonic::Code::InvalidArgument
            && refusal(err).is_none()
        {
            return StoreError::Refused(format!("etcd at {}: {what}: {}", self.0, describe(err)));
        }
        self.unavailable(what, describe(err))
    }

    /// `Unavailable` for an operation that got no answer within `timeout`.
    pub(super) fn timed_out(&self, what: &str, timeout: Duration) -> StoreError {
        self.unavailable(what, format_args!("no answer within {timeout:?}"))
    }
}

/// Whether `err` says the request never reached etcd: the connection to
/// the member was refused or could not be made (it is down), so making
/// the call again cannot apply it twice.
pub(super) fn never_sent(err: &ec::Error) -> bool {
    matches!(err, ec::Error::GRpcStatus(status) if status.code() == tonic::Code::Unavailable)
        && describe(err).contains("tcp connect error")
}

/// Why etcd refused this client: failures that waiting does not cure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// The TLS handshake failed: etcd's certificate is not trusted (or not
    /// for the endpoint's host), etcd refused this client's certificate or
    /// its absence, or one side does not speak TLS.
    Tls,
    /// etcd refused the user name or password.
    Credentials,
    /// etcd's authentication is on, and this client named no user.
    NoUser,
    /// The user lacks a permission.
    Permission,
}

/// Why etcd refused the client, if `err` says it did.
pub(super) fn refusal(err: &ec::Error) -> Option<Refusal> {
    if let ec::Error::GRpcStatus(status) = err {
        let message = status.message();
        match status.code() {
            tonic::Code::PermissionDenied => return Some(Refusal::Permission),
            tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition
                if message.contains("authentication failed")
                    || message.contains("user name not found") =>
            {
                return Some(Refusal::Credentials);
            }
            tonic::Code::InvalidArgument if message.contains("user name is empty") => {
                return Some(Refusal::NoUser);
            }
            _ => {}
        }
    }
    // A TLS alert etcd sent after the handshake (TLS 1.3 checks the
    // client's certificate then) reaches here inside h2's error, which
    // hides it from the source chain: only its text tells.
    if describe(err).contains("received fatal alert") {
        return Some(Refusal::Tls);
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = match err {
        ec::Error::GRpcStatus(status) => std::error::Error::source(status),
        other => std::error::Error::source(other),
    };
    while let Some(cause) = source {
        // rustls' errors reach here inside an io::Error, whose `source`
        // skips the error it wraps.
        let tls = cause.is::<rustls::Error>()
            || cause
                .downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::get_ref)
                .is_some_and(|inner| inner.is::<rustls::Error>());
        if tls {
            return Some(Refusal::Tls);
        }
        source = cause.source();
    }
    None
}

/// Whether `err` says the connection was made and then closed or reset
/// by etcd: with TLS 1.3, how etcd refusing a client certificate (or its
/// absence) looks when its alert is lost in the race with the client's
/// first write.
pub(super) fn closed_by_peer(err: &ec::Error) -> bool {
    let text = describe(err);
    ["broken pipe", "connection closed", "connection reset"]
        .iter()
        .any(|sign| text.contains(sign))
}

/// Whether `err` is etcd (or the connection to it) answering Unavailable.
pub(super) fn unavailable(err: &ec::Error) -> bool {
    matches!(err, ec::Error::GRpcStatus(status) if status.code() == tonic::Code::Unavailable)
}

/// An etcd-client error as one line: the gRPC code and message, or the
/// error, then its sources (leaving out any that a later, more detailed
/// one repeats: tonic's sources often do).
pub(super) fn describe(err: &ec::Error) -> String {
    let mut parts = vec![match err {
        ec::Error::GRpcStatus(status) => format!("{:?}: {}", status.code(), status.message()),
        other => other.to_string(),
    }];
    let mut source = match err {
        ec::Error::GRpcStatus(status) => std::error::Error::source(status),
        other => std::error::Error::source(other),
    };
    while let Some(cause) = source {
        parts.push(cause.to_string());
        source = cause.source();
    }
    let mut out = String::new();
    for (i, part) in parts.iter().enumerate() {
        let repeated = parts[i + 1..]
            .iter()
            .any(|later| later.contains(part.as_str()));
        if i > 0 && repeated {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(part);
    }
    out
}

/// A key range as text for messages: `key "a/b"` or `prefix "a/"`.
pub(super) fn describe_range(range: &KeyRange) -> String {
    match range {
        KeyRange::Key(k) => format!("key \"{}\"", k.escape_ascii()),
        KeyRange::Prefix(p) => format!("prefix \"{}\"", p.escape_ascii()),
    }
}

/// The etcd compare operator of a core one.
fn cmp_op(op: CmpOp) -> ec::CompareOp {
    match op {
        CmpOp::Equal => ec::CompareOp::Equal,
        CmpOp::NotEqual => ec::CompareOp::NotEqual,
        CmpOp::Less => ec::CompareOp::Less,
        CmpOp::Greater => ec::CompareOp::Greater,
    }
}

/// The etcd compare of a core one. Same semantics: a missing key has
/// revisions and version 0, and a value compare on it fails.
fn compare(c: &Compare) -> ec::Compare {
    let key = c.key.to_vec();
    let op = cmp_op(c.op);
    match &c.target {
        CompareTarget::Value(v) => ec::Compare::value(key, op, v.to_vec()),
        CompareTarget::CreateRevision(r) => ec::Compare::create_revision(key, op, *r),
        CompareTarget::ModRevision(r) => ec::Compare::mod_revision(key, op, *r),
        CompareTarget::Version(v) => ec::Compare::version(key, op, *v),
    }
}

/// Get options reading `range` (every key of a prefix, in key order).
pub(super) fn get_options(range: &KeyRange) -> (Vec<u8>, Option<ec::GetOptions>) {
    match range {
        KeyRange::Key(k) => (k.to_vec(), None),
        KeyRange::Prefix(p) => (p.to_vec(), Some(ec::GetOptions::new().with_prefix())),
    }
}

/// The etcd operation of a core one. Puts and deletes ask for the previous
/// values, which the core results carry.
fn op(o: &Op) -> ec::TxnOp {
    match o {
        Op::Range(range) => {
            let (key, options) = get_options(range);
            ec::TxnOp::get(key, options)
        }
        Op::Put { key, value, lease } => ec::TxnOp::put(
            key.to_vec(),
            value.to_vec(),
            Some(ec::PutOptions::new().with_lease(*lease).with_prev_key()),
        ),
        Op::Delete(KeyRange::Key(k)) => {
            ec::TxnOp::delete(k.to_vec(), Some(ec::DeleteOptions::new().with_prev_key()))
        }
        Op::Delete(KeyRange::Prefix(p)) => ec::TxnOp::delete(
            p.to_vec(),
            Some(ec::DeleteOptions::new().with_prefix().with_prev_key()),
        ),
    }
}

/// The etcd transaction of a core one.
pub(super) fn txn(t: &Txn) -> ec::Txn {
    ec::Txn::new()
        .when(t.compares.iter().map(compare).collect::<Vec<_>>())
        .and_then(t.success.iter().map(op).collect::<Vec<_>>())
        .or_else(t.failure.iter().map(op).collect::<Vec<_>>())
}

/// The first lease a put of `t` attaches to (what an etcd "lease not
/// found" refers to; etcd does not say which lease it was).
pub(super) fn txn_lease(t: &Txn) -> Option<i64> {
    t.success.iter().chain(&t.failure).find_map(|o| match o {
        Op::Put { lease, .. } if *lease != 0 => Some(*lease),
        _ => None,
    })
}

/// A core key-value of an etcd one.
pub(super) fn kv(kv: PbKeyValue) -> KeyValue {
    KeyValue {
        key: Bytes::from(kv.key),
        value: Bytes::from(kv.value),
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        lease: kv.lease,
    }
}

/// The revision of a response header; etcd always sends one.
pub(super) fn header_revision(header: Option<&PbResponseHeader>) -> Result<Revision, String> {
    header
        .map(|h| h.revision)
        .ok_or_else(|| "response without a header".to_string())
}

/// The core response of an etcd transaction response to `t`. Checks that
/// there is one result per operation of the branch that ran, each of the
/// operation's kind, and that no range was cut short.
pub(super) fn txn_response(t: &Txn, resp: ec::TxnResponse) -> Result<TxnResponse, String> {
    let raw = resp.0;
    let revision = header_revision(raw.header.as_ref())?;
    let ops = if raw.succeeded {
        &t.success
    } else {
        &t.failure
    };
    if raw.responses.len() != ops.len() {
        return Err(format!(
            "transaction response with {} results for {} operations",
            raw.responses.len(),
            ops.len()
        ));
    }
    let mut results = Vec::with_capacity(ops.len());
    for (i, (o, r)) in ops.iter().zip(raw.responses).enumerate() {
        let result = match (o, r.response) {
            (Op::Range(_), Some(PbTxnOpResponse::ResponseRange(range))) => {
                if range.more {
                    return Err(format!("range result {i} was cut short"));
                }
                OpResult::Range(range.kvs.into_iter().map(kv).collect())
            }
            (Op::Put { .. }, Some(PbTxnOpResponse::ResponsePut(put))) => {
                OpResult::Put(put.prev_kv.map(kv))
            }
            (Op::Delete(_), Some(PbTxnOpResponse::ResponseDeleteRange(delete))) => {
                OpResult::Delete(delete.prev_kvs.into_iter().map(kv).collect())
            }
            (_, other) => {
                return Err(format!(
                    "transaction result {i} does not match its operation ({})",
                    match other {
                        None => "missing",
                        Some(PbTxnOpResponse::ResponseRange(_)) => "a range",
                        Some(PbTxnOpResponse::ResponsePut(_)) => "a put",
                        Some(PbTxnOpResponse::ResponseDeleteRange(_)) => "a delete",
                        Some(PbTxnOpResponse::ResponseTxn(_)) => "a nested transaction",
                    }
                ));
            }
        };
        results.push(result);
    }
    Ok(TxnResponse {
        succeeded: raw.succeeded,
        revision,
        results,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn txn_lease_finds_the_first_leased_put() {
        let t = Txn {
            success: vec![
                Op::Range(KeyRange::Key(Bytes::from_static(b"a"))),
                Op::Put {
                    key: Bytes::from_static(b"a"),
                    value: Bytes::new(),
                    lease: 0,
                },
            ],
            failure: vec![Op::Put {
                key: Bytes::from_static(b"b"),
                value: Bytes::new(),
                lease: 7,
            }],
            ..Txn::default()
        };
        assert_eq!(txn_lease(&t), Some(7));
        assert_eq!(txn_lease(&Txn::default()), None);
    }

    #[test]
    fn ranges_are_described_escaped() {
        assert_eq!(
            describe_range(&KeyRange::Prefix(Bytes::from_static(b"a/\n"))),
            "prefix \"a/\\n\""
        );
        assert_eq!(
            describe_range(&KeyRange::Key(Bytes::from_static(b"k"))),
            "key \"k\""
        );
    }

    #[test]
    fn mismatched_results_are_errors_not_panics() {
        use etcd_client::proto::{PbResponseOp, PbTxnResponse};
        let t = Txn {
            success: vec![Op::Delete(KeyRange::Key(Bytes::from_static(b"a")))],
            ..Txn::default()
        };
        let header = Some(PbResponseHeader {
            revision: 5,
            ..PbResponseHeader::default()
        });
        let missing = ec::TxnResponse(PbTxnResponse {
            header,
            succeeded: true,
            responses: vec![PbResponseOp { response: None }],
        });
        let err = txn_response(&t, missing).err();
        assert!(err.is_some_and(|e| e.contains("missing")));
        let short = ec::TxnResponse(PbTxnResponse {
            header,
            succeeded: true,
            responses: vec![],
        });
        assert!(txn_response(&t, short).is_err());
        let headless = ec::TxnResponse(PbTxnResponse {
            header: None,
            succeeded: false,
            responses: vec![],
        });
        assert!(txn_response(&t, headless).is_err());
    }
}
