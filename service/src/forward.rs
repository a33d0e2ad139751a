//! Forwarding calls to the leader on the caller's behalf (issue 6).
//!
//! A follower authenticates and authorizes the caller itself, then passes
//! the call, unchanged at the HTTP/2 level (so unary and streaming calls,
//! `Watch` included, alike), to the leader over the cluster's mutual TLS,
//! with the caller's identity in the [`ON_BEHALF_OF`] header. The leader's
//! [`Router`](super::Router) takes that identity only from a connection the
//! runtime marked with [`CuratorPeer`] (its certificate is a curator
//! instance's); from anyone else, a client calling a follower included,
//! the header is refused with PermissionDenied.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use http::{HeaderValue, Request, Response};
use tonic::body::Body;

use metropolis_core::identity::{Identity, NodeId, NodeIdError};
use metropolis_core::leadership::LeadershipError;
use metropolis_core::quote::cut;

/// The header carrying the identity a call is forwarded on behalf of.
pub const ON_BEHALF_OF: &str = "x-metropolis-on-behalf-of";

/// Request extension a runtime inserts on connections whose peer presented
/// the certificate of a curator instance: only their calls may carry
/// [`ON_BEHALF_OF`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CuratorPeer(pub NodeId);

/// Encodes an identity for [`ON_BEHALF_OF`]: `node:<node id>`, `owner`,
/// `agent:<64 hex digits>` or `unauthenticated`.
pub fn encode_identity(identity: &Identity) -> HeaderValue {
    let text = match identity {
        Identity::Node(id) => format!("node:{id}"),
        Identity::Owner => "owner".to_owned(),
        Identity::Agent(key) => format!("agent:{}", metropolis_core::hex::Hex(key)),
        Identity::Unauthenticated => "unauthenticated".to_owned(),
    };
    HeaderValue::from_str(&text).expect("identity encodings are visible ASCII")
}

/// Why an [`ON_BEHALF_OF`] value names no identity. Caller input is kept
/// cut to its first [`QUOTE_CHARS`](metropolis_core::quote::QUOTE_CHARS)
/// characters (with `…` appended when it was longer).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeIdentityError {
    /// The value is not UTF-8.
    NotUtf8,
    /// `node:` is followed by something that is not a node ID.
    Node(NodeIdError),
    /// `agent:` is followed by 64 characters that are not all hexadecimal
    /// digits.
    AgentKey {
        /// The characters after `agent:`.
        hex: String,
    },
    /// The value has none of the forms [`encode_identity`] writes.
    Unknown {
        /// The value.
        value: String,
    },
}

impl std::fmt::Display for DecodeIdentityError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeIdentityError::NotUtf8 => f.write_str("not UTF-8"),
            DecodeIdentityError::Node(e) => write!(f, "node: {e}"),
            DecodeIdentityError::AgentKey { hex } => write!(f, "agent: {hex:?} is not hexadecimal"),
            DecodeIdentityError::Unknown { value } => write!(f, "{value:?} is not an identity"),
        }
    }
}

impl std::error::Error for DecodeIdentityError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DecodeIdentityError::Node(e) => Some(e),
            _ => None,
        }
    }
}

/// Decodes an [`ON_BEHALF_OF`] value; the error says what is wrong.
pub fn decode_identity(value: &[u8]) -> Result<Identity, DecodeIdentityError> {
    let text = std::str::from_utf8(value).map_err(|_| DecodeIdentityError::NotUtf8)?;
    match text.split_once(':') {
        None if text == "owner" => Ok(Identity::Owner),
        None if text == "unauthenticated" => Ok(Identity::Unauthenticated),
        Some(("node", id)) => NodeId::parse(id)
            .map(Identity::Node)
            .map_err(DecodeIdentityError::Node),
        Some(("agent", hex)) if hex.len() == 64 => {
            let not_hex = || DecodeIdentityError::AgentKey { hex: cut(hex) };
            let digits = hex.as_bytes();
            if !digits.iter().all(u8::is_ascii_hexdigit) {
                return Err(not_hex());
            }
            let mut key = [0u8; 32];
            for (byte, pair) in key.iter_mut().zip(digits.chunks_exact(2)) {
                let pair = std::str::from_utf8(pair).map_err(|_| not_hex())?;
                *byte = u8::from_str_radix(pair, 16).map_err(|_| not_hex())?;
            }
            Ok(Identity::Agent(key))
        }
        _ => Err(DecodeIdentityError::Unknown { value: cut(text) }),
    }
}

/// Why a forwarded call got no response from the leader. Its `Display`
/// is the transport's account, which the caller's status quotes.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ForwardError {
    /// No connection to the leader could be made (refused, unreachable,
    /// timed out, its certificate refused, no such instance): the call
    /// was not sent.
    Connect {
        /// Why, as the connector said.
        reason: String,
    },
    /// The connection to the leader broke (or was found broken) before
    /// the leader's response began: the call may have reached it.
    Broken {
        /// Why, as the HTTP/2 layer said.
        reason: String,
    },
    /// The leader's response had begun and its stream broke before it
    /// ended (found by the relay of the response's body, after
    /// [`Upstream::send`] resolved): the call may have been served in
    /// part.
    StreamBroken {
        /// Why, as the HTTP/2 layer said.
        reason: String,
    },
    /// This instance forwards no calls (it only takes part in the
    /// election).
    NotForwarding {
        /// The leader's address (`host:port`).
        leader: String,
    },
}

impl std::fmt::Display for ForwardError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ForwardError::Connect { reason }
            | ForwardError::Broken { reason }
            | ForwardError::StreamBroken { reason } => f.write_str(reason),
            ForwardError::NotForwarding { leader } => {
                write!(f, "{leader}: this instance does not forward calls")
            }
        }
    }
}

impl std::error::Error for ForwardError {}

/// Where a follower sends the calls it forwards: a connection to the
/// leader (the runtime's HTTP/2 client channel over mutual TLS).
pub trait Upstream: Send + Sync + 'static {
    /// Sends one call and resolves with the leader's response (whose body
    /// streams); an error says why the leader's response never began.
    fn send(
        &self,
        request: Request<Body>,
    ) -> BoxFuture<'static, Result<Response<Body>, ForwardError>>;
}

/// Makes [`Upstream`]s to a leader from its election value (node ID and
/// curator address): the runtime's mutual-TLS client, connecting lazily.
pub trait Connector: Send + Sync + 'static {
    /// An upstream to the curator instance `node_id` at `address`
    /// (`host:port`). Connection errors surface on its first send.
    fn connect(&self, node_id: &str, address: &str) -> Arc<dyn Upstream>;
}

/// The leadership term a call served here was routed in: the epoch of
/// the instance's leader role. The router puts it in the request's
/// extensions before the service sees the call, so that what the service
/// reads can be made at least as fresh as the store was when the term
/// began (a new leader's watch cache may still be behind writes the
/// leaders before it acknowledged).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaderTerm(pub u64);

impl LeaderTerm {
    /// The term of a call no election routed (a sole instance, or a
    /// routing that never changes): earlier than every elected term.
    pub const FIXED: LeaderTerm = LeaderTerm(0);
}

/// Where a routed call goes.
#[derive(Clone)]
pub enum Destination {
    /// Serve it here: this instance leads, in this term.
    Serve(LeaderTerm),
    /// Forward it to the leader through this upstream.
    Forward(Arc<dyn Upstream>),
}

impl std::fmt::Debug for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Destination::Serve(term) => write!(f, "Serve({})", term.0),
            Destination::Forward(_) => f.write_str("Forward"),
        }
    }
}

/// A call's route, from [`Routing::route`]: where it goes, and when it
/// must end early.
pub struct Routed {
    /// Where the call goes.
    pub destination: Destination,
    /// Resolves when the role the call was routed under ends: the call
    /// must then end with this error (its unary future dropped, its
    /// response stream closed with the status). Never resolving is fine.
    pub cancelled: BoxFuture<'static, LeadershipError>,
    /// Held until the call is over (its response body ended or was
    /// dropped); dropping it tells the routing the call finished.
    pub finished: Box<dyn Send + Sync>,
    /// Called when forwarding the call found no connection to the
    /// leader (the call was not sent), so that the routing can hold later
    /// calls for the next leader instead of sending them to one that is
    /// gone.
    pub unreachable: Box<dyn FnOnce() + Send>,
}

impl std::fmt::Debug for Routed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routed")
            .field("destination", &self.destination)
            .finish_non_exhaustive()
    }
}

/// Decides, per call, whether this instance serves it or forwards it, and
/// ends it when the role it was routed under ends.
pub trait Routing: Send + Sync + 'static {
    /// Routes one call whose caller waits at most `timeout` (its
    /// `grpc-timeout`; `None`: no deadline). Resolves once a route is
    /// known: at once while a leader is known, otherwise when one becomes
    /// known or with [`LeadershipError::NoLeader`] when the wait ends.
    fn route(
        &self,
        timeout: Option<Duration>,
    ) -> BoxFuture<'static, Result<Routed, LeadershipError>>;
}

/// A routing that never changes: every call goes to the same
/// destination and is never cancelled. For tests, and for an instance
/// pinned to one leader.
#[derive(Clone, Debug)]
pub struct FixedRouting(pub Destination);

impl Routing for FixedRouting {
    fn route(&self, _: Option<Duration>) -> BoxFuture<'static, Result<Routed, LeadershipError>> {
        let routed = Routed {
            destination: self.0.clone(),
            cancelled: Box::pin(futures::future::pending()),
            finished: Box::new(()),
            unreachable: Box::new(|| {}),
        };
        Box::pin(futures::future::ready(Ok(routed)))
    }
}

/// Parses a `grpc-timeout` header value (`<digits><unit>`, unit one of
/// `H M S m u n`, at most 8 digits); `None` when absent or malformed.
pub fn grpc_timeout(value: Option<&HeaderValue>) -> Option<Duration> {
    let text = value?.to_str().ok()?;
    if text.len() < 2 || text.len() > 9 {
        return None;
    }
    let (digits, unit) = text.split_at(text.len() - 1);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Forwards an already authorized call to `upstream` on behalf of the
/// identity in its extensions. An unreachable leader ends the call with
/// Unavailable (retryable).
pub fn forward(
    upstream: &dyn Upstream,
    request: Request<Body>,
) -> BoxFuture<'static, Response<Body>> {
    forward_reporting(upstream, request, Box::new(|| {}))
}

/// [`forward`], calling `unreachable` when no connection to the leader
/// could be made ([`ForwardError::Connect`]: the call was not sent).
pub fn forward_reporting(
    upstream: &dyn Upstream,
    request: Request<Body>,
    unreachable: Box<dyn FnOnce() + Send>,
) -> BoxFuture<'static, Response<Body>> {
    let identity = request
        .extensions()
        .get::<Identity>()
        .cloned()
        .unwrap_or(Identity::Unauthenticated);
    let (mut parts, body) = request.into_parts();
    // Extensions are this connection's; the leader learns the caller from
    // the header only. A client's own header never passes.
    parts.extensions = http::Extensions::new();
    parts.headers.remove(ON_BEHALF_OF);
    parts
        .headers
        .insert(ON_BEHALF_OF, encode_identity(&identity));
    let sent = upstream.send(Request::from_parts(parts, body));
    Box::pin(async move {
        match sent.await {
            // The relayed body can be cut short (the leader's stream
            // breaks, this instance's role ends) and end with a status
            // instead: the leader's length does not hold for it.
            Ok(mut response) => {
                response.headers_mut().remove(http::header::CONTENT_LENGTH);
                response
            }
            Err(e) => {
                if matches!(e, ForwardError::Connect { .. }) {
                    unreachable();
                }
                crate::status::forward(&e).into_http()
            }
        }
    })
}

/// What the leader's router does with an incoming [`ON_BEHALF_OF`]: the
/// identity to use, or the status refusing the call. `None` without the
/// header.
pub(crate) fn on_behalf_of(request: &mut Request<Body>) -> Option<Result<Identity, tonic::Status>> {
    let value = request.headers_mut().remove(ON_BEHALF_OF)?;
    if request.extensions().get::<CuratorPeer>().is_none() {
        return Some(Err(tonic::Status::permission_denied(format!(
            "{ON_BEHALF_OF} is accepted only from curator instances"
        ))));
    }
    Some(decode_identity(value.as_bytes()).map_err(|e| crate::status::on_behalf_of(&e)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::{GrpcService, Router};

    /// Answers every call with AlreadyExists carrying the caller's identity.
    #[derive(Clone)]
    struct WhoAmI;

    impl tonic::server::NamedService for WhoAmI {
        const NAME: &'static str = "metropolis.node.core.curator.proto.api.Curator";
    }

    impl GrpcService for WhoAmI {
        fn call(&self, request: Request<Body>) -> BoxFuture<'static, Response<Body>> {
            let identity = request
                .extensions()
                .get::<Identity>()
                .cloned()
                .unwrap_or(Identity::Unauthenticated);
            let status = tonic::Status::already_exists(identity.to_string());
            Box::pin(futures::future::ready(status.into_http()))
        }
    }

    /// The leader's router, reached in memory; `trusted` marks the
    /// connection as a curator peer's.
    struct InMemory {
        leader: Router,
        trusted: bool,
    }

    impl Upstream for InMemory {
        fn send(
            &self,
            mut request: Request<Body>,
        ) -> BoxFuture<'static, Result<Response<Body>, ForwardError>> {
            assert!(
                request.extensions().get::<Identity>().is_none(),
                "extensions cleared"
            );
            request
                .extensions_mut()
                .insert(Identity::Node(NodeId::from_public_key(&[1; 32])));
            if self.trusted {
                request
                    .extensions_mut()
                    .insert(CuratorPeer(NodeId::from_public_key(&[1; 32])));
            }
            let response = self.leader.call(request);
            Box::pin(async move { Ok(response.await) })
        }
    }

    fn follow(upstream: Option<Arc<dyn Upstream>>) -> FixedRouting {
        FixedRouting(upstream.map_or(Destination::Serve(LeaderTerm::FIXED), Destination::Forward))
    }

    fn call(
        router: &Router,
        method: &str,
        identity: Identity,
        header: Option<&str>,
    ) -> tonic::Status {
        let mut request = Request::builder()
            .uri(format!(
                "http://metropolis/{}/{method}",
                <WhoAmI as tonic::server::NamedService>::NAME
            ))
            .body(Body::empty())
            .unwrap();
        request.extensions_mut().insert(identity);
        if let Some(h) = header {
            request
                .headers_mut()
                .insert(ON_BEHALF_OF, HeaderValue::from_str(h).unwrap());
        }
        let response = futures::executor::block_on(router.call(request));
        tonic::Status::from_header_map(response.headers()).expect("a gRPC status")
    }

    fn follower(trusted: bool) -> Router {
        let leader = Router::new().with_service(WhoAmI);
        let upstream: Arc<dyn Upstream> = Arc::new(InMemory { leader, trusted });
        Router::new()
            .with_service(WhoAmI)
            .with_routing(Arc::new(follow(Some(upstream))))
    }

    #[test]
    fn the_leader_serves_the_callers_identity_not_the_followers() {
        let caller = Identity::Node(NodeId::from_public_key(&[9; 32]));
        let status = call(&follower(true), "UpdateNodeStatus", caller.clone(), None);
        assert_eq!(status.code(), tonic::Code::AlreadyExists);
        assert_eq!(status.message(), caller.to_string());
        // The owner too, on a method nodes may not call.
        let status = call(&follower(true), "UpdateNodeStatus", Identity::Owner, None);
        assert_eq!(status.message(), Identity::Owner.to_string());
    }

    /// Answers every call with AlreadyExists carrying the term it was
    /// served in.
    #[derive(Clone)]
    struct WhichTerm;

    impl tonic::server::NamedService for WhichTerm {
        const NAME: &'static str = "metropolis.node.core.curator.proto.api.Curator";
    }

    impl GrpcService for WhichTerm {
        fn call(&self, request: Request<Body>) -> BoxFuture<'static, Response<Body>> {
            let term = request.extensions().get::<LeaderTerm>().copied();
            let status = tonic::Status::already_exists(format!("{term:?}"));
            Box::pin(futures::future::ready(status.into_http()))
        }
    }

    #[test]
    fn a_served_call_carries_its_term() {
        let router = Router::new()
            .with_service(WhichTerm)
            .with_routing(Arc::new(FixedRouting(Destination::Serve(LeaderTerm(7)))));
        let status = call(&router, "Watch", Identity::Owner, None);
        assert_eq!(status.message(), format!("{:?}", Some(LeaderTerm(7))));
        // Without routing, nothing is put there.
        let sole = Router::new().with_service(WhichTerm);
        let status = call(&sole, "Watch", Identity::Owner, None);
        assert_eq!(status.message(), "None");
    }

    #[test]
    fn the_follower_authorizes_before_forwarding() {
        let status = call(&follower(true), "Watch", Identity::Unauthenticated, None);
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    }

    #[test]
    fn a_client_cannot_smuggle_an_identity() {
        // Through a follower: a client is not a curator instance.
        let caller = Identity::Node(NodeId::from_public_key(&[9; 32]));
        let status = call(
            &follower(true),
            "UpdateNodeStatus",
            caller.clone(),
            Some("owner"),
        );
        assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
        // Straight to a leader from a peer that is not a curator instance.
        let leader = Router::new().with_service(WhoAmI);
        let status = call(&leader, "UpdateNodeStatus", caller, Some("owner"));
        assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
        // Forwarded through a connection the leader does not trust.
        let status = call(&follower(false), "UpdateNodeStatus", Identity::Owner, None);
        assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    }

    #[test]
    fn a_forwarded_call_is_not_forwarded_again() {
        // An instance that takes itself for a follower refuses a call
        // forwarded to it as the leader (no forwarding loops).
        let node = Identity::Node(NodeId::from_public_key(&[1; 32]));
        let mut request = Request::builder()
            .uri(format!(
                "http://metropolis/{}/UpdateNodeStatus",
                <WhoAmI as tonic::server::NamedService>::NAME
            ))
            .body(Body::empty())
            .unwrap();
        request.extensions_mut().insert(node);
        request
            .extensions_mut()
            .insert(CuratorPeer(NodeId::from_public_key(&[1; 32])));
        request
            .headers_mut()
            .insert(ON_BEHALF_OF, HeaderValue::from_static("owner"));
        let response = futures::executor::block_on(follower(true).call(request));
        let status = tonic::Status::from_header_map(response.headers()).unwrap();
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        assert!(status.message().contains("backend switched"));
    }

    #[test]
    fn an_unreachable_leader_is_retryable() {
        struct Down;
        impl Upstream for Down {
            fn send(
                &self,
                _: Request<Body>,
            ) -> BoxFuture<'static, Result<Response<Body>, ForwardError>> {
                Box::pin(futures::future::ready(Err(ForwardError::Connect {
                    reason: "connection refused".to_owned(),
                })))
            }
        }
        let router = Router::new()
            .with_service(WhoAmI)
            .with_routing(Arc::new(follow(Some(Arc::new(Down)))));
        let status = call(&router, "UpdateNodeStatus", Identity::Owner, None);
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(
            status.message().contains("connection refused"),
            "{status:?}"
        );
        // No leader to forward to: served locally.
        let router = Router::new()
            .with_service(WhoAmI)
            .with_routing(Arc::new(follow(None)));
        let status = call(&router, "UpdateNodeStatus", Identity::Owner, None);
        assert_eq!(status.code(), tonic::Code::AlreadyExists);
    }

    #[test]
    fn the_leaders_content_length_is_not_relayed() {
        /// A leader answering one five-byte message, its length stated.
        struct Sized;
        impl Upstream for Sized {
            fn send(
                &self,
                _: Request<Body>,
            ) -> BoxFuture<'static, Result<Response<Body>, ForwardError>> {
                let response = Response::builder()
                    .header(http::header::CONTENT_TYPE, "application/grpc")
                    .header(http::header::CONTENT_LENGTH, "5")
                    .body(Body::new(http_body_util::Full::new(
                        bytes::Bytes::from_static(&[0; 5]),
                    )))
                    .unwrap();
                Box::pin(futures::future::ready(Ok(response)))
            }
        }
        let request = Request::builder()
            .uri("http://metropolis/x/y")
            .body(Body::empty())
            .unwrap();
        let response = futures::executor::block_on(forward(&Sized, request));
        assert!(
            response
                .headers()
                .get(http::header::CONTENT_LENGTH)
                .is_none(),
            "{:?}",
            response.headers()
        );
        assert_eq!(
            response.headers()[http::header::CONTENT_TYPE],
            "application/grpc"
        );
    }

    #[test]
    fn identities_round_trip_and_garbage_is_refused() {
        let node = NodeId::from_public_key(&[7; 32]);
        for identity in [
            Identity::Node(node),
            Identity::Owner,
            Identity::Agent([0xab; 32]),
            Identity::Unauthenticated,
        ] {
            let encoded = encode_identity(&identity);
            assert_eq!(decode_identity(encoded.as_bytes()).unwrap(), identity);
        }
        for bad in ["", "root", "node:x", "agent:zz", "agent:", "owner:1"] {
            assert!(decode_identity(bad.as_bytes()).is_err(), "{bad}");
        }
        // 64 bytes that are not 64 hex digits: multibyte characters and
        // signs included.
        let multibyte = format!("agent:{}", "é".repeat(32));
        let straddling = format!("agent:{}a", "€".repeat(21));
        let signed = format!("agent:{}", "+f".repeat(32));
        for bad in [multibyte, straddling, signed] {
            let e = decode_identity(bad.as_bytes()).unwrap_err();
            assert!(
                matches!(e, DecodeIdentityError::AgentKey { .. }),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn identity_errors_say_what_is_wrong_quoting_a_bounded_prefix() {
        assert_eq!(
            decode_identity(&[0xff]).unwrap_err().to_string(),
            "not UTF-8"
        );
        assert_eq!(
            decode_identity(b"root").unwrap_err().to_string(),
            "\"root\" is not an identity"
        );
        let zs = format!("agent:{}", "z".repeat(64));
        assert_eq!(
            decode_identity(zs.as_bytes()).unwrap_err().to_string(),
            format!("agent: {:?} is not hexadecimal", "z".repeat(64))
        );
        let node = decode_identity(b"node:x").unwrap_err();
        let parsed = NodeId::parse("x").unwrap_err();
        assert_eq!(node.to_string(), format!("node: {parsed}"));
        let long = "x".repeat(10_000);
        let message = decode_identity(long.as_bytes()).unwrap_err().to_string();
        assert!(message.len() < 100, "{message}");
    }
}
