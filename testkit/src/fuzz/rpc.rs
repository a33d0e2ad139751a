//! `rpc`: every RPC the daemon serves, as bytes on the wire, through the
//! service layer's [`Router`]s over in-memory ports: the store model
//! behind [`MemKv`] (with injected failures, lost compare-and-swap races,
//! broken watches and compaction), the log hub, a fake tracefs, a fake
//! image store, fake certificate and kubeconfig issuers, the background
//! watch-cache task run by [`Tasks`].
//!
//! Input: a flags byte (bit 0: a tracefs instance per trace session),
//! then operations (`op % 8`): 0-4 a call; 5 a store fault; 6 a log entry
//! appended; 7 the open `Watch` streams are read. A call is: the method
//! (an index into [`METHODS`]), the caller (`% 8`: none, owner, node 1,
//! node 2, unregistered node 3, the agent of machine A, another agent, an
//! explicit unauthenticated identity), a framing byte (`% 8`: 0-2 proper
//! gRPC frames; 3 proper frames split into data frames of
//! `framing / 8 + 1` bytes; 4 the message without framing; 5 the
//! compression flag set; 6 a declared length `framing / 8 - 16` off; 7 a
//! second, garbage message), then the message(s) (u16-length-prefixed;
//! `LoadImage` takes `1 + n % 4` of them, after a count byte).
//!
//! Checked, per call: a response always comes (unary calls never hang);
//! its status is a valid gRPC code carried once (headers or trailers),
//! never Unknown; never Internal or DataLoss for a well-formed request;
//! for well-formed requests the code equals the one derived independently
//! from the request, the caller and the store (authorization, then the
//! service's validation and state), give or take Unavailable and Aborted
//! while a store fault is armed and the call gets as far as the store
//! (and Unavailable for a `Watch` once the store failed: the watch cache
//! may notice only then); successful responses decode as the
//! method's response type (and say what the store says: the status
//! written, the installation request offered, the hardware report stored
//! unless it encodes to zero bytes, the node added, the backlog of logs); a dropped `GetLogs` follower unsubscribes; a `Trace`
//! that touched tracefs leaves it restored (tracing off, `nop`, filters
//! empty, pipe closed, instance removed); `LoadImage` is accepted exactly
//! when the validator accepts the archive, and the plan committed is
//! consistent with the members staged. At the end, every open `Watch`
//! stream that did not end with Unavailable shows exactly the store's
//! nodes, and a `NodesInCluster` stream marked its backlog exactly once.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes, BytesMut};
use futures::future::BoxFuture;
use http_body::Frame;
use metropolis_archive::{ArchiveLimits, ArchiveValidator, ImportPlan, Output};
use metropolis_core::curator::{NODES_PREFIX, api_node, decode_record};
use metropolis_core::identity::{Identity, NodeId};
use metropolis_core::logtree::{Entry, EntryKind, LogTreeConfig, Query, Severity};
use metropolis_core::ports::{
    CertIssuer, IssuedCertificate, IssuedKubeconfig, KubeconfigError, KubeconfigIssuer,
};
use metropolis_core::provisioning::MachineRecord;
use metropolis_core::store::{KeyRange, Op, Txn};
use metropolis_core::trace::TraceSpec;
use metropolis_proto::prelude::{agent, common, curator, debug};
use metropolis_service::debug::{DebugPorts, DebugService, LogHub};
use metropolis_service::images::{ImageImport, ImageStore, ImageStoreError};
use metropolis_service::status::debug::archive_code;
use metropolis_service::{
    CuratorService, MACHINES_PREFIX, ProvisioningService, Router, WatchCache, WatchCacheOptions,
};
use prost::Message;
use tonic::Code;

use super::archive::{OutputChecker, check_plan};
use super::input::Input;
use crate::clock::ManualClock;
use crate::exec::{Tasks, block_on};
use crate::store::MemKv;
use crate::tracefs::{FakePort, FakeTracefs};

/// The public keys of nodes 1, 2 (registered at the start) and 3 (not).
pub const NODE_KEYS: [[u8; 32]; 3] = [[1; 32], [2; 32], [3; 32]];

/// Machine A, registered at the start with [`AGENT_KEY`].
pub const MACHINE_A: &str = "3b241101-e2bb-4255-8caf-4136c566a962";

/// Machine B, not registered at the start.
pub const MACHINE_B: &str = "0f8fad5b-d9cb-469f-a165-70867728950e";

/// The agent key of machine A.
pub const AGENT_KEY: [u8; 32] = [7; 32];

/// DNs logged to at the start.
pub const LOGGED: [&str; 3] = ["root", "root.curator", "root.debug.x"];

/// Which router serves a method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Svc {
    /// Curator, NodeManagement, MachineManagement (authorized).
    Main,
    /// AgentCallback.
    Agent,
    /// NodeDebugService.
    Debug,
}

/// The methods, by index in the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// `Curator.Watch`.
    Watch,
    /// `Curator.UpdateNodeStatus`.
    UpdateNodeStatus,
    /// `NodeManagement.AddNode`.
    AddNode,
    /// `NodeManagement.RemoveNode`.
    RemoveNode,
    /// `MachineManagement.AddMachine`.
    AddMachine,
    /// `MachineManagement.ListMachines`.
    ListMachines,
    /// `MachineManagement.GetMachine`.
    GetMachine,
    /// `MachineManagement.SubmitInstallationRequest`.
    SubmitInstallationRequest,
    /// `AgentCallback.Heartbeat`.
    Heartbeat,
    /// `NodeDebugService.GetDebugKubeconfig`.
    GetDebugKubeconfig,
    /// `NodeDebugService.GetLogs`.
    GetLogs,
    /// `NodeDebugService.Trace`.
    Trace,
    /// `NodeDebugService.LoadImage`.
    LoadImage,
    /// A method the Curator does not have.
    Missing,
    /// A service nobody serves.
    NoService,
}

/// Every method, in input order.
pub const METHODS: [Method; 15] = [
    Method::Watch,
    Method::UpdateNodeStatus,
    Method::AddNode,
    Method::RemoveNode,
    Method::AddMachine,
    Method::ListMachines,
    Method::GetMachine,
    Method::SubmitInstallationRequest,
    Method::Heartbeat,
    Method::GetDebugKubeconfig,
    Method::GetLogs,
    Method::Trace,
    Method::LoadImage,
    Method::Missing,
    Method::NoService,
];

const CURATOR: &str = "/metropolis.node.core.curator.proto.api.Curator/";
const PRIVATE: &str = "/metropolis.node.core.curator.proto.private.";
const DEBUG: &str = "/metropolis.proto.api.NodeDebugService/";

fn decodes<M: Message + Default>(b: &[u8]) -> bool {
    M::decode(b).is_ok()
}

impl Method {
    fn path(self) -> String {
        match self {
            Method::Watch => format!("{CURATOR}Watch"),
            Method::UpdateNodeStatus => format!("{CURATOR}UpdateNodeStatus"),
            Method::AddNode => format!("{PRIVATE}NodeManagement/AddNode"),
            Method::RemoveNode => format!("{PRIVATE}NodeManagement/RemoveNode"),
            Method::AddMachine => format!("{PRIVATE}MachineManagement/AddMachine"),
            Method::ListMachines => format!("{PRIVATE}MachineManagement/ListMachines"),
            Method::GetMachine => format!("{PRIVATE}MachineManagement/GetMachine"),
            Method::SubmitInstallationRequest => {
                format!("{PRIVATE}MachineManagement/SubmitInstallationRequest")
            }
            Method::Heartbeat => "/cloud.bmaas.server.api.AgentCallback/Heartbeat".into(),
            Method::GetDebugKubeconfig => format!("{DEBUG}GetDebugKubeconfig"),
            Method::GetLogs => format!("{DEBUG}GetLogs"),
            Method::Trace => format!("{DEBUG}Trace"),
            Method::LoadImage => format!("{DEBUG}LoadImage"),
            Method::Missing => format!("{CURATOR}Nope"),
            Method::NoService => "/nope.Nope/Call".into(),
        }
    }

    fn svc(self) -> Svc {
        match self {
            Method::Heartbeat => Svc::Agent,
            Method::GetDebugKubeconfig | Method::GetLogs | Method::Trace | Method::LoadImage => {
                Svc::Debug
            }
            _ => Svc::Main,
        }
    }

    /// Whether `b` decodes as the method's request message.
    fn request_decodes(self, b: &[u8]) -> bool {
        use metropolis_proto::metropolis::node::core::curator::proto::private as p;
        match self {
            Method::Watch => decodes::<curator::WatchRequest>(b),
            Method::UpdateNodeStatus => decodes::<curator::UpdateNodeStatusRequest>(b),
            Method::AddNode => decodes::<p::AddNodeRequest>(b),
            Method::RemoveNode => decodes::<p::RemoveNodeRequest>(b),
            Method::AddMachine => decodes::<p::AddMachineRequest>(b),
            Method::ListMachines => decodes::<p::ListMachinesRequest>(b),
            Method::GetMachine => decodes::<p::GetMachineRequest>(b),
            Method::SubmitInstallationRequest => decodes::<p::SubmitInstallationRequestRequest>(b),
            Method::Heartbeat => decodes::<agent::HeartbeatRequest>(b),
            Method::GetDebugKubeconfig => decodes::<debug::GetDebugKubeconfigRequest>(b),
            Method::GetLogs => decodes::<debug::GetLogsRequest>(b),
            Method::Trace => decodes::<debug::TraceRequest>(b),
            Method::LoadImage => decodes::<debug::ImagePart>(b),
            Method::Missing | Method::NoService => true,
        }
    }

    /// Whether `b` decodes as the method's response message.
    fn response_decodes(self, b: &[u8]) -> bool {
        use metropolis_proto::metropolis::node::core::curator::proto::private as p;
        match self {
            Method::Watch => decodes::<curator::WatchEvent>(b),
            Method::UpdateNodeStatus => decodes::<curator::UpdateNodeStatusResponse>(b),
            Method::AddNode => decodes::<p::AddNodeResponse>(b),
            Method::RemoveNode => decodes::<p::RemoveNodeResponse>(b),
            Method::AddMachine => decodes::<p::AddMachineResponse>(b),
            Method::ListMachines => decodes::<p::ListMachinesResponse>(b),
            Method::GetMachine => decodes::<p::Machine>(b),
            Method::SubmitInstallationRequest => decodes::<p::SubmitInstallationRequestResponse>(b),
            Method::Heartbeat => decodes::<agent::HeartbeatResponse>(b),
            Method::GetDebugKubeconfig => decodes::<debug::GetDebugKubeconfigResponse>(b),
            Method::GetLogs => decodes::<debug::GetLogsResponse>(b),
            Method::Trace => decodes::<debug::TraceEvent>(b),
            Method::LoadImage => decodes::<debug::LoadImageResponse>(b),
            Method::Missing | Method::NoService => false,
        }
    }

    fn server_streams(self) -> bool {
        matches!(self, Method::Watch | Method::GetLogs | Method::Trace)
    }
}

/// The request body: data frames handed out one by one.
struct Frames(VecDeque<Bytes>);

impl http_body::Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.get_mut().0.pop_front().map(|b| Ok(Frame::data(b))))
    }
}

/// Frames `messages` as the framing byte says; returns the frames and
/// whether the framing is proper gRPC.
fn frame(messages: &[&[u8]], framing: u8) -> (VecDeque<Bytes>, bool) {
    let arg = usize::from(framing / 8);
    let mut stream = Vec::new();
    let put = |stream: &mut Vec<u8>, flag: u8, len: usize, msg: &[u8]| {
        stream.push(flag);
        stream.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
        stream.extend_from_slice(msg);
    };
    let mode = framing % 8;
    for m in messages {
        match mode {
            4 => stream.extend_from_slice(m),
            5 => put(&mut stream, 1, m.len(), m),
            6 => put(&mut stream, 0, (m.len() + arg).saturating_sub(16), m),
            _ => put(&mut stream, 0, m.len(), m),
        }
    }
    if mode == 7 {
        put(&mut stream, 0, 3, &[0xff, 0xff, 0xff]);
    }
    let stream = Bytes::from(stream);
    let frames = if mode == 3 {
        stream.chunks(arg + 1).map(Bytes::copy_from_slice).collect()
    } else {
        VecDeque::from([stream])
    };
    (frames, mode <= 3)
}

/// Splits complete gRPC messages off `buf`.
fn messages(buf: &mut BytesMut, out: &mut Vec<Bytes>) {
    while buf.len() >= 5 {
        assert_eq!(buf[0], 0, "a compressed response message");
        let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
        if buf.len() < 5 + len {
            break;
        }
        buf.advance(5);
        out.push(buf.split_to(len).freeze());
    }
}

/// The grpc-status of a header map, checked to be a valid code.
fn status_code(headers: &http::HeaderMap) -> Option<i32> {
    let value = headers.get("grpc-status")?;
    let code: i32 = value
        .to_str()
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("grpc-status {value:?} is not a number"));
    assert!(
        (0..=16).contains(&code),
        "grpc-status {code} is not a gRPC code"
    );
    Some(code)
}

/// How a call's response turned out.
enum Response {
    /// It ended with this status code and these messages.
    Done { code: i32, messages: Vec<Bytes> },
    /// It is a stream still open after these messages.
    Open {
        body: tonic::body::Body,
        buf: BytesMut,
        messages: Vec<Bytes>,
    },
}

fn poll_frame(body: &mut tonic::body::Body) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
    let mut cx = Context::from_waker(Waker::noop());
    http_body::Body::poll_frame(Pin::new(body), &mut cx)
}

/// Reads a response body until it ends or waits.
fn read(response: http::Response<tonic::body::Body>, tasks: &Tasks) -> Response {
    let (parts, mut body) = response.into_parts();
    if let Some(code) = status_code(&parts.headers) {
        // Trailers-only: no message may follow.
        match poll_frame(&mut body) {
            Poll::Ready(None) => {}
            Poll::Ready(Some(Ok(f))) => {
                assert!(
                    f.data_ref().is_none_or(|d| d.is_empty()),
                    "data after a trailers-only status"
                )
            }
            other => panic!("trailers-only response body: {other:?}"),
        }
        return Response::Done {
            code,
            messages: Vec::new(),
        };
    }
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut idle = 0;
    loop {
        match poll_frame(&mut body) {
            Poll::Ready(Some(Ok(frame))) => {
                idle = 0;
                match frame.into_data() {
                    Ok(data) => {
                        buf.extend_from_slice(&data);
                        messages(&mut buf, &mut out);
                    }
                    Err(frame) => {
                        let trailers = frame.into_trailers().unwrap_or_else(|_| {
                            panic!("a response frame neither data nor trailers")
                        });
                        let code = status_code(&trailers).expect("trailers without grpc-status");
                        assert!(buf.is_empty(), "a partial message before the trailers");
                        return Response::Done {
                            code,
                            messages: out,
                        };
                    }
                }
            }
            Poll::Ready(Some(Err(status))) => panic!("response body failed: {status}"),
            Poll::Ready(None) => panic!("response ended without a status"),
            Poll::Pending if idle < 3 => {
                idle += 1;
                tasks.run(2);
            }
            Poll::Pending => {
                return Response::Open {
                    body,
                    buf,
                    messages: out,
                };
            }
        }
    }
}

/// What a `Watch` stream asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
enum WatchKind {
    Nodes,
    Node(String),
}

/// An open `Watch` stream and what its client has seen.
struct OpenWatch {
    kind: WatchKind,
    body: tonic::body::Body,
    buf: BytesMut,
    view: BTreeMap<String, curator::Node>,
    markers: usize,
    tombstoned: bool,
    ended: bool,
    /// The node that opened the stream, if a node did: the stream ends
    /// with Unauthenticated once that node is not a member.
    owner: Option<String>,
}

impl OpenWatch {
    fn apply(&mut self, message: &Bytes) {
        let event = curator::WatchEvent::decode(message.as_ref()).expect("a WatchEvent");
        if event.progress == curator::watch_event::Progress::LastBacklogged as i32 {
            self.markers += 1;
            assert_eq!(self.markers, 1, "PROGRESS_LAST_BACKLOGGED twice");
        }
        match &self.kind {
            WatchKind::Nodes => {
                for n in event.nodes {
                    self.view.insert(n.id.clone(), n);
                }
                for t in event.node_tombstones {
                    self.view.remove(&t.node_id);
                }
            }
            WatchKind::Node(id) => {
                assert!(!self.tombstoned, "node {id}: event after its tombstone");
                match (&event.nodes[..], &event.node_tombstones[..]) {
                    ([n], []) => {
                        assert_eq!(&n.id, id, "a NodeInCluster stream sent another node");
                        self.view.insert(n.id.clone(), n.clone());
                    }
                    ([], [t]) => {
                        assert_eq!(&t.node_id, id, "tombstone of another node");
                        self.view.clear();
                        self.tombstoned = true;
                    }
                    _ => panic!("node {id}: malformed event {event:?}"),
                }
            }
        }
    }

    /// Reads what the stream has now.
    fn poll(&mut self) {
        while !self.ended {
            match poll_frame(&mut self.body) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        self.buf.extend_from_slice(&data);
                        let mut out = Vec::new();
                        messages(&mut self.buf, &mut out);
                        for m in &out {
                            self.apply(m);
                        }
                    }
                    Err(frame) => {
                        let trailers = frame.into_trailers().unwrap_or_default();
                        let code = status_code(&trailers).expect("trailers without grpc-status");
                        let revoked = code == Code::Unauthenticated as i32 && self.owner.is_some();
                        assert!(
                            code == Code::Unavailable as i32 || revoked,
                            "a Watch of {:?} ended with {code}",
                            self.owner
                        );
                        self.ended = true;
                    }
                },
                Poll::Ready(Some(Err(status))) => panic!("Watch body failed: {status}"),
                Poll::Ready(None) => panic!("a Watch ended without a status"),
                Poll::Pending => break,
            }
        }
    }
}

/// The wall-clock time of every call (the clock never moves).
const NOW_UNIX_MS: i64 = 1_700_000_000_000;

struct FakeIssuer;

impl CertIssuer for FakeIssuer {
    fn issue_node_certificate(
        &self,
        public_key: &[u8; 32],
    ) -> Result<IssuedCertificate, metropolis_core::ports::CertIssueError> {
        Ok(IssuedCertificate {
            certificate_pem: format!("CERT {}", NodeId::from_public_key(public_key)),
            ca_pem: "CA".into(),
        })
    }
}

impl KubeconfigIssuer for FakeIssuer {
    fn issue_kubeconfig(
        &self,
        id: &str,
        groups: &[String],
    ) -> Result<IssuedKubeconfig, KubeconfigError> {
        Ok(IssuedKubeconfig {
            kubeconfig: format!("user: {id} groups: {groups:?}"),
            not_after_unix: 0,
            generated_ca: true,
        })
    }
}

/// An image store that stages outputs in memory and checks the plan it
/// is asked to commit.
struct FakeImages {
    commits: Arc<Mutex<usize>>,
}

struct FakeImport {
    checker: OutputChecker,
    commits: Arc<Mutex<usize>>,
}

impl ImageStore for FakeImages {
    fn begin(&self) -> Result<Box<dyn ImageImport>, ImageStoreError> {
        Ok(Box::new(FakeImport {
            checker: OutputChecker::default(),
            commits: self.commits.clone(),
        }))
    }
}

impl ImageImport for FakeImport {
    fn member(&mut self, output: Output) -> BoxFuture<'_, Result<(), ImageStoreError>> {
        self.checker.handle(&output);
        Box::pin(futures::future::ready(Ok(())))
    }

    fn commit(
        self: Box<Self>,
        plan: ImportPlan,
    ) -> BoxFuture<'static, Result<Vec<String>, ImageStoreError>> {
        assert!(!self.checker.in_member(), "commit with a member open");
        check_plan(&plan, &self.checker.members);
        *self.commits.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        let names = plan
            .images
            .iter()
            .map(|i| i.name.clone().unwrap_or_else(|| "unnamed".into()))
            .collect();
        Box::pin(futures::future::ready(Ok(names)))
    }
}

/// Archive limits of the debug service here (small, so that the limits
/// are reachable).
pub fn archive_limits() -> ArchiveLimits {
    ArchiveLimits {
        max_total_size: 256 * 1024,
        max_json_size: 16 * 1024,
        max_json_total: 64 * 1024,
        max_members: 64,
    }
}

/// A node ID, checked by the rules of the format rather than the parser.
fn valid_node_id(s: &str) -> bool {
    s.strip_prefix("metropolis-").is_some_and(|hex| {
        hex.len() == 32
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// A UUID in canonical form, by the rules.
/// `s` as the lowercase canonical UUID, if it is one in a form Go's
/// `uuid.Parse` takes: canonical, 32 digits, `urn:uuid:` (any case) in
/// front, or one enclosing character on each side.
fn canonical_uuid(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let dashed = match b.len() {
        32 => {
            let hex = std::str::from_utf8(b).ok()?;
            return hex.bytes().all(|c| c.is_ascii_hexdigit()).then(|| {
                let h = hex.to_ascii_lowercase();
                format!(
                    "{}-{}-{}-{}-{}",
                    &h[..8],
                    &h[8..12],
                    &h[12..16],
                    &h[16..20],
                    &h[20..]
                )
            });
        }
        36 => b,
        38 => &b[1..37],
        45 if b[..9].eq_ignore_ascii_case(b"urn:uuid:") => &b[9..],
        _ => return None,
    };
    let ok = dashed.iter().enumerate().all(|(i, c)| match i {
        8 | 13 | 18 | 23 => *c == b'-',
        _ => c.is_ascii_hexdigit(),
    });
    ok.then(|| String::from_utf8_lossy(dashed).to_ascii_lowercase())
}

/// The store key of the record of machine `canonical`.
fn machine_record_key(canonical: &str) -> Bytes {
    let mut key = MACHINES_PREFIX.to_vec();
    key.extend_from_slice(canonical.as_bytes());
    Bytes::from(key)
}

/// A kubeconfig identity or group name, by the rules.
fn valid_kube_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 256 && !s.chars().any(char::is_control)
}

/// A node status `UpdateNodeStatus` accepts, by the rules.
fn valid_status(s: &Option<common::NodeStatus>) -> bool {
    s.as_ref().is_some_and(|s| {
        s.external_address.parse::<std::net::IpAddr>().is_ok() && s.encoded_len() <= 16 * 1024
    })
}

/// The world of one input.
struct World {
    kv: MemKv,
    tasks: Tasks,
    main: Router,
    agent: Router,
    debug: Router,
    hub: LogHub,
    port: FakePort,
    instances: bool,
    /// Whether the store failed or broke its watches at some point: the
    /// watch cache may notice it during any later call, ending every
    /// stream (also one just opened) with Unavailable.
    store_faulted: bool,
    watches: Vec<OpenWatch>,
    commits: Arc<Mutex<usize>>,
}

impl World {
    fn new(flags: u8) -> World {
        let kv = MemKv::new();
        let tasks = Tasks::new();
        let store: Arc<dyn metropolis_core::ports::KvStore> = Arc::new(kv.clone());
        let cache = WatchCache::new(
            store.clone(),
            Arc::new(tasks.clone()),
            WatchCacheOptions {
                max_event_bytes: 2048,
            },
        );
        let curator = CuratorService::new(
            store.clone(),
            cache,
            Some(Arc::new(FakeIssuer)),
            Arc::new(ManualClock::at_unix_ms(NOW_UNIX_MS)),
        );
        for key in &NODE_KEYS[..2] {
            let id = NodeId::from_public_key(key);
            let registered = block_on(
                curator.register_node(
                    &id,
                    key,
                    common::NodeRoles::default(),
                    common::NodeState::Up,
                ),
                &tasks,
                4,
            );
            assert!(matches!(registered, Result::Ok(true)), "registering a node");
        }
        let record = MachineRecord::new(MACHINE_A, AGENT_KEY);
        kv.with(|m| {
            m.txn(&Txn {
                success: vec![Op::Put {
                    key: machine_record_key(MACHINE_A),
                    value: record.encode().into(),
                    lease: 0,
                }],
                ..Default::default()
            })
        })
        .expect("registering machine A");
        let provisioning = ProvisioningService::new(
            store,
            Arc::new(ManualClock::at_unix_ms(NOW_UNIX_MS)),
            std::time::Duration::from_secs(60),
        );
        let hub = LogHub::new(LogTreeConfig {
            max_bytes: 64 * 1024,
            max_entries_per_dn: 64,
            max_queued_per_subscription: 16,
        });
        for (i, dn) in LOGGED.iter().enumerate() {
            let dn = metropolis_core::logtree::Dn::parse(dn).expect("a valid DN");
            hub.append(Entry {
                dn,
                kind: EntryKind::Leveled {
                    lines: vec![format!("hello {i}")],
                    timestamp_unix_nanos: 1_700_000_000_000_000_000,
                    severity: Severity::Warning,
                    location: "rpc.rs:1".into(),
                },
            });
        }
        let port = FakePort::new(FakeTracefs::new());
        let commits = Arc::new(Mutex::new(0));
        let debug = DebugService::with_ports(DebugPorts {
            kubeconfig: Some(Arc::new(FakeIssuer)),
            tracefs: Some(Arc::new(port.clone())),
            trace_instances: flags & 1 != 0,
            images: Some(Arc::new(FakeImages {
                commits: commits.clone(),
            })),
            archive_limits: archive_limits(),
            ..DebugPorts::new(hub.clone())
        });
        World {
            kv,
            tasks,
            main: Router::new()
                .with_service(curator.curator_server())
                .with_service(curator.management_server())
                .with_service(provisioning.machine_management_server()),
            agent: Router::new().with_service(provisioning.agent_callback_server()),
            debug: Router::new().with_service(debug.server()),
            hub,
            port,
            instances: flags & 1 != 0,
            store_faulted: false,
            watches: Vec::new(),
            commits,
        }
    }

    fn get(&self, key: Bytes) -> Option<Bytes> {
        self.kv.with(|m| m.get(&key).map(|kv| kv.value.clone()))
    }

    fn node_registered(&self, id: &str) -> bool {
        let mut key = NODES_PREFIX.to_vec();
        key.extend_from_slice(id.as_bytes());
        self.get(Bytes::from(key)).is_some()
    }

    /// The record of machine `id`, in any form [`canonical_uuid`] takes.
    fn machine(&self, id: &str) -> Option<MachineRecord> {
        self.get(machine_record_key(&canonical_uuid(id)?))
            .map(|v| MachineRecord::decode(&v).expect("stored machine records decode"))
    }

    /// Every node in the store, as the API shows it.
    fn nodes(&self) -> BTreeMap<String, curator::Node> {
        let kvs = self
            .kv
            .with(|m| m.range(&KeyRange::Prefix(Bytes::from_static(NODES_PREFIX))));
        kvs.iter()
            .map(|kv| {
                let record = decode_record(kv).expect("stored node records decode");
                (record.id.clone(), api_node(&record))
            })
            .collect()
    }

    /// The codes a well-formed call must end with, derived from the
    /// request, the caller and the state, and whether the call gets as far
    /// as the store (so that an armed store fault may turn it into
    /// Unavailable or Aborted); `None` when anything valid may come (a
    /// malformed request after authorization).
    fn expected(
        &self,
        m: Method,
        who: &Option<Identity>,
        msgs: &[&[u8]],
        well_formed: bool,
    ) -> Option<(Vec<Code>, bool)> {
        use Code::*;
        use metropolis_proto::metropolis::node::core::curator::proto::private as p;
        // Decided before the store is used, or by what the store holds.
        let pre = |c: Code| Some((vec![c], false));
        let store = |c: Code| Some((vec![c], true));
        if matches!(m, Method::Missing | Method::NoService) {
            return pre(Unimplemented);
        }
        if m.svc() == Svc::Main {
            match who {
                None | Some(Identity::Unauthenticated) => return pre(Unauthenticated),
                Some(Identity::Agent(_)) => return pre(PermissionDenied),
                Some(Identity::Node(_))
                    if !matches!(m, Method::Watch | Method::UpdateNodeStatus) =>
                {
                    return pre(PermissionDenied);
                }
                _ => {}
            }
        }
        if !well_formed {
            return None;
        }
        let msg = msgs.first().copied().unwrap_or_default();
        match m {
            Method::Watch => {
                use curator::watch_request::Kind;
                match curator::WatchRequest::decode(msg).ok()?.kind {
                    // A kind this curator cannot read: as the reference.
                    None => pre(Unimplemented),
                    Some(Kind::NodeInCluster(n)) if !valid_node_id(&n.node_id) => {
                        pre(InvalidArgument)
                    }
                    // A node that is not a member: its stream ends with
                    // Unauthenticated, perhaps before the call returns.
                    Some(_) => match who {
                        Some(Identity::Node(me)) if !self.node_registered(me.as_str()) => {
                            Some((vec![Ok, Unauthenticated], true))
                        }
                        // The stream's first read of the store may fail.
                        _ => store(Ok),
                    },
                }
            }
            Method::UpdateNodeStatus => {
                let req = curator::UpdateNodeStatusRequest::decode(msg).ok()?;
                // Only the caller itself: any other `node_id`, well-formed
                // or not, is PermissionDenied (as the reference).
                match who {
                    Some(Identity::Node(me)) if me.as_str() == req.node_id => {}
                    _ => return pre(PermissionDenied),
                }
                if !valid_status(&req.status) {
                    return pre(InvalidArgument);
                }
                // The caller is that node: without its record it is not a
                // member (docs/spec/semantics.md, Identities).
                store(if self.node_registered(&req.node_id) {
                    Ok
                } else {
                    Unauthenticated
                })
            }
            Method::AddNode => {
                let req = p::AddNodeRequest::decode(msg).ok()?;
                let Result::Ok(key) = <[u8; 32]>::try_from(req.public_key.as_ref()) else {
                    return pre(InvalidArgument);
                };
                let id = NodeId::from_public_key(&key);
                store(if self.node_registered(id.as_str()) {
                    AlreadyExists
                } else {
                    Ok
                })
            }
            Method::RemoveNode => {
                let req = p::RemoveNodeRequest::decode(msg).ok()?;
                if !valid_node_id(&req.node_id) {
                    return pre(InvalidArgument);
                }
                store(if self.node_registered(&req.node_id) {
                    Ok
                } else {
                    NotFound
                })
            }
            Method::AddMachine => {
                let req = p::AddMachineRequest::decode(msg).ok()?;
                if canonical_uuid(&req.machine_id).is_none() || req.agent_public_key.len() != 32 {
                    return pre(InvalidArgument);
                }
                store(if self.machine(&req.machine_id).is_some() {
                    AlreadyExists
                } else {
                    Ok
                })
            }
            Method::ListMachines => store(Ok),
            Method::GetMachine => {
                let req = p::GetMachineRequest::decode(msg).ok()?;
                if canonical_uuid(&req.machine_id).is_none() {
                    return pre(InvalidArgument);
                }
                store(if self.machine(&req.machine_id).is_some() {
                    Ok
                } else {
                    NotFound
                })
            }
            Method::SubmitInstallationRequest => {
                let req = p::SubmitInstallationRequestRequest::decode(msg).ok()?;
                if canonical_uuid(&req.machine_id).is_none() {
                    return pre(InvalidArgument);
                }
                if self.machine(&req.machine_id).is_none() {
                    return store(NotFound);
                }
                // The request is checked against the record read first: a
                // type, and a root device under /dev.
                use agent::os_installation_request::Type;
                match agent::OsInstallationRequest::decode(req.request.as_ref()) {
                    Result::Ok(agent::OsInstallationRequest {
                        r#type: Some(Type::Metropolis(m)),
                        ..
                    }) if metropolis_core::provisioning::root_device_path(&m.root_device)
                        .is_ok() =>
                    {
                        store(Ok)
                    }
                    _ => store(InvalidArgument),
                }
            }
            Method::Heartbeat => {
                let req = agent::HeartbeatRequest::decode(msg).ok()?;
                let Some(Identity::Agent(key)) = who else {
                    return pre(Unauthenticated);
                };
                // A report must carry a result (as the reference refuses
                // one without): nothing of such a heartbeat is recorded.
                // One of zero bytes (generation 0, no result) is no report
                // and is skipped, as the reference skips it.
                let no_result = req
                    .installation_report
                    .as_ref()
                    .is_some_and(|r| r.result.is_none() && r.encoded_len() > 0);
                if canonical_uuid(&req.machine_id).is_none() || no_result {
                    return pre(InvalidArgument);
                }
                match self.machine(&req.machine_id) {
                    Some(r) if r.agent_public_key == *key => store(Ok),
                    _ => store(Unauthenticated),
                }
            }
            Method::GetDebugKubeconfig => {
                let req = debug::GetDebugKubeconfigRequest::decode(msg).ok()?;
                // No Metropolis identity: CN owner or metropolis-…, O
                // metropolis (any case).
                let lower = req.id.to_ascii_lowercase();
                let valid = valid_kube_name(&req.id)
                    && lower != "owner"
                    && !lower.starts_with("metropolis-")
                    && req.groups.len() <= 64
                    && req
                        .groups
                        .iter()
                        .all(|g| valid_kube_name(g) && !g.eq_ignore_ascii_case("metropolis"));
                pre(if valid { Ok } else { InvalidArgument })
            }
            Method::GetLogs => {
                let req = debug::GetLogsRequest::decode(msg).ok()?;
                match Query::from_request(&req) {
                    Err(_) => pre(InvalidArgument),
                    Result::Ok(_) => pre(Ok),
                }
            }
            Method::Trace => {
                let req = debug::TraceRequest::decode(msg).ok()?;
                match TraceSpec::from_request(&req) {
                    Err(_) => pre(InvalidArgument),
                    Result::Ok(_) => Some((vec![Ok, InvalidArgument], false)),
                }
            }
            Method::LoadImage => {
                let mut v = ArchiveValidator::new(archive_limits());
                let mut result = Result::Ok(());
                for part in msgs {
                    let part = debug::ImagePart::decode(*part).ok()?;
                    result = v.handle_data(part.data_part);
                    if result.is_err() {
                        break;
                    }
                    while v.poll_output().is_some() {}
                }
                let result = result.and_then(|()| v.handle_eof().map(|_| ()));
                pre(match result {
                    Result::Ok(()) => Ok,
                    Err(e) => archive_code(&e),
                })
            }
            Method::Missing | Method::NoService => pre(Unimplemented),
        }
    }

    fn call(&mut self, input: &mut Input) {
        let m = METHODS[input.below(METHODS.len())];
        let who = match input.u8() % 8 {
            0 => None,
            1 => Some(Identity::Owner),
            i @ 2..=4 => Some(Identity::Node(NodeId::from_public_key(
                &NODE_KEYS[usize::from(i - 2)],
            ))),
            5 => Some(Identity::Agent(AGENT_KEY)),
            6 => Some(Identity::Agent([9; 32])),
            _ => Some(Identity::Unauthenticated),
        };
        let framing = input.u8();
        let count = if m == Method::LoadImage {
            1 + input.below(4)
        } else {
            1
        };
        let msgs: Vec<&[u8]> = (0..count).map(|_| input.lp()).collect();
        let (frames, proper) = frame(&msgs, framing);
        let well_formed = proper && msgs.iter().all(|b| m.request_decodes(b));
        let armed = self.kv.faults_armed() || (m == Method::Watch && self.store_faulted);
        let expected = self.expected(m, &who, &msgs, well_formed);

        let mut request = http::Request::builder()
            .method("POST")
            .uri(m.path())
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(tonic::body::Body::new(Frames(frames)))
            .expect("a valid request");
        if let Some(who) = who.clone() {
            request.extensions_mut().insert(who);
        }
        let router = match m.svc() {
            Svc::Main => &self.main,
            Svc::Agent => &self.agent,
            Svc::Debug => &self.debug,
        };
        let trace_ops = self.port.fs().log.len();
        let machine_before = self.get(machine_record_key(MACHINE_A));
        let followers = self.hub.followers();
        let commits = *self.commits.lock().unwrap_or_else(|p| p.into_inner());
        let response = block_on(router.call(request), &self.tasks, 64);
        self.tasks.run(2);

        let (code, messages) = match read(response, &self.tasks) {
            Response::Done { code, messages } => (code, messages),
            Response::Open {
                body,
                buf,
                messages,
            } => {
                assert!(m.server_streams(), "{m:?}: a unary call did not complete");
                for msg in &messages {
                    assert!(m.response_decodes(msg), "{m:?}: undecodable message");
                }
                if m == Method::Watch && self.watches.len() < 4 {
                    let req =
                        curator::WatchRequest::decode(msgs[0]).expect("an open Watch decoded");
                    let kind = match req.kind {
                        Some(curator::watch_request::Kind::NodeInCluster(n)) => {
                            WatchKind::Node(n.node_id)
                        }
                        _ => WatchKind::Nodes,
                    };
                    let mut w = OpenWatch {
                        kind,
                        body,
                        buf,
                        view: BTreeMap::new(),
                        markers: 0,
                        tombstoned: false,
                        ended: false,
                        owner: match &who {
                            Some(Identity::Node(me)) => Some(me.to_string()),
                            _ => None,
                        },
                    };
                    for msg in &messages {
                        w.apply(msg);
                    }
                    self.watches.push(w);
                }
                // Any other open stream is dropped here: the client went
                // away.
                (Code::Ok as i32, Vec::new())
            }
        };

        let code_enum = Code::from(code);
        assert_ne!(code_enum, Code::Unknown, "{m:?}: Unknown status");
        if well_formed {
            assert!(
                !matches!(code_enum, Code::Internal | Code::DataLoss),
                "{m:?}: {code_enum:?} for a well-formed request"
            );
        }
        if let Some((mut allowed, touches_store)) = expected {
            if armed && touches_store {
                allowed.extend([Code::Unavailable, Code::Aborted]);
            }
            assert!(
                allowed.contains(&code_enum),
                "{m:?} by {who:?}: {code_enum:?}, expected one of {allowed:?}"
            );
        }
        if code_enum == Code::Ok {
            if !m.server_streams() {
                assert_eq!(
                    messages.len(),
                    1,
                    "{m:?}: a unary response of {} messages",
                    messages.len()
                );
            }
            for msg in &messages {
                assert!(m.response_decodes(msg), "{m:?}: undecodable response");
            }
            self.check_success(m, &who, &msgs, &messages, machine_before.as_ref());
        }
        if m == Method::Heartbeat
            && matches!(code_enum, Code::InvalidArgument | Code::Unauthenticated)
        {
            assert_eq!(
                self.get(machine_record_key(MACHINE_A)),
                machine_before,
                "a refused heartbeat changed the machine's record"
            );
        }
        if m == Method::GetLogs {
            assert_eq!(
                self.hub.followers(),
                followers,
                "a dropped GetLogs still follows"
            );
        }
        if m == Method::Trace && self.port.fs().log.len() > trace_ops {
            self.check_tracefs_restored();
        }
        if m == Method::LoadImage {
            let now = *self.commits.lock().unwrap_or_else(|p| p.into_inner());
            assert_eq!(
                now > commits,
                code_enum == Code::Ok,
                "LoadImage committed iff Ok"
            );
        }
        self.poll_watches();
    }

    /// What a successful call must have done; `machine_before` is the
    /// stored record of [`MACHINE_A`] before the call.
    fn check_success(
        &self,
        m: Method,
        who: &Option<Identity>,
        msgs: &[&[u8]],
        responses: &[Bytes],
        machine_before: Option<&Bytes>,
    ) {
        use metropolis_proto::metropolis::node::core::curator::proto::private as p;
        let Some(msg) = msgs.first() else { return };
        match m {
            Method::UpdateNodeStatus => {
                let Result::Ok(req) = curator::UpdateNodeStatusRequest::decode(*msg) else {
                    return;
                };
                let nodes = self.nodes();
                let node = nodes.get(&req.node_id).expect("an updated node exists");
                // As sent, but stamped with the curator's time.
                let mut want = req.status.clone();
                if let Some(status) = &mut want {
                    status.timestamp = Some(prost_types::Timestamp {
                        seconds: NOW_UNIX_MS / 1000,
                        nanos: 0,
                    });
                }
                assert_eq!(node.status, want, "the status written");
            }
            Method::AddNode => {
                let (Result::Ok(req), Some(resp)) =
                    (p::AddNodeRequest::decode(*msg), responses.first())
                else {
                    return;
                };
                let resp = p::AddNodeResponse::decode(resp.as_ref()).expect("decoded above");
                let key: [u8; 32] = req.public_key.as_ref().try_into().expect("accepted key");
                assert_eq!(resp.node_id, NodeId::from_public_key(&key).as_str());
                assert!(self.node_registered(&resp.node_id), "added node not stored");
            }
            Method::RemoveNode => {
                if let Result::Ok(req) = p::RemoveNodeRequest::decode(*msg) {
                    assert!(
                        !self.node_registered(&req.node_id),
                        "removed node still stored"
                    );
                }
            }
            Method::Heartbeat => {
                let (Result::Ok(req), Some(resp)) =
                    (agent::HeartbeatRequest::decode(*msg), responses.first())
                else {
                    return;
                };
                assert!(matches!(who, Some(Identity::Agent(_))));
                let resp = agent::HeartbeatResponse::decode(resp.as_ref()).expect("decoded above");
                let record = self
                    .machine(&req.machine_id)
                    .expect("a machine heartbeated");
                assert_eq!(
                    resp.installation_request.map(|r| r.generation),
                    record.pending_request().map(|r| r.generation),
                    "the offered request"
                );
                assert_eq!(record.last_heartbeat_unix_ms, Some(NOW_UNIX_MS));
                // A hardware report is stored re-encoded; one of zero bytes,
                // like none, leaves the stored one (the reference skips it).
                let sent = req.hardware_report.as_ref().filter(|h| h.encoded_len() > 0);
                if let Some(hardware) = sent {
                    let stored = record.hardware_report.as_deref();
                    assert_eq!(
                        stored,
                        Some(&hardware.encode_to_vec()[..]),
                        "hardware report"
                    );
                } else if canonical_uuid(&req.machine_id).as_deref() == Some(MACHINE_A) {
                    let before = machine_before
                        .map(|v| MachineRecord::decode(v).expect("stored machine records decode"));
                    assert_eq!(
                        record.hardware_report,
                        before.and_then(|r| r.hardware_report),
                        "a hardware report of zero bytes replaced the stored one"
                    );
                }
            }
            Method::GetLogs => {
                let Result::Ok(req) = debug::GetLogsRequest::decode(*msg) else {
                    return;
                };
                let q = Query::from_request(&req).expect("an accepted query");
                for r in responses {
                    let r = debug::GetLogsResponse::decode(r.as_ref()).expect("decoded above");
                    for e in r.backlog_entries.iter().chain(&r.stream_entries) {
                        let dn = metropolis_core::logtree::Dn::parse(&e.dn).expect("a valid DN");
                        assert!(q.selects_dn(&dn), "an entry of {} for {}", e.dn, q.dn);
                    }
                }
            }
            _ => {}
        }
    }

    fn check_tracefs_restored(&self) {
        let fs = self.port.fs();
        assert!(
            fs.instances.is_empty(),
            "instances left: {:?}",
            fs.instances
        );
        let g = &fs.global;
        assert!(!g.pipe_open, "trace_pipe left open");
        if self.instances {
            assert_eq!(
                g,
                &crate::tracefs::FakeBuffer::fresh(),
                "global buffer touched"
            );
        } else {
            assert!(!g.tracing_on, "tracing left on");
            assert_eq!(g.tracer, "nop", "tracer left");
            assert!(g.filter.is_empty() && g.graph.is_empty(), "filters left");
        }
    }

    fn fault(&mut self, input: &mut Input) {
        let b = input.u8();
        self.store_faulted |= matches!(b % 4, 0 | 2);
        match b % 4 {
            0 => self.kv.fail_next(1 + u32::from(b / 4 % 3)),
            1 => self.kv.conflict_next(if b >= 128 {
                300
            } else {
                1 + u32::from(b / 4 % 4)
            }),
            2 => self.kv.break_watches(),
            _ => self.kv.compact(),
        }
    }

    fn log(&mut self, input: &mut Input) {
        if let Result::Ok(entry) = super::logs::entry(input) {
            self.hub.append(entry);
        }
    }

    fn poll_watches(&mut self) {
        self.tasks.run(2);
        for w in &mut self.watches {
            w.poll();
        }
    }

    fn finish(&mut self) {
        self.kv.fail_next(0);
        self.kv.conflict_next(0);
        self.tasks.run(4);
        self.poll_watches();
        let nodes = self.nodes();
        for w in &self.watches {
            if w.ended {
                continue;
            }
            if let Some(owner) = &w.owner {
                assert!(
                    self.node_registered(owner),
                    "the Watch of node {owner}, no longer a member, is still open"
                );
            }
            match &w.kind {
                WatchKind::Nodes => {
                    assert_eq!(w.markers, 1, "PROGRESS_LAST_BACKLOGGED not sent");
                    assert_eq!(
                        w.view, nodes,
                        "a NodesInCluster view differs from the store"
                    );
                }
                WatchKind::Node(id) if !w.tombstoned => {
                    let want: BTreeMap<String, curator::Node> = nodes
                        .get(id)
                        .map(|n| (id.clone(), n.clone()))
                        .into_iter()
                        .collect();
                    assert_eq!(w.view, want, "a NodeInCluster view differs from the store");
                }
                WatchKind::Node(_) => {}
            }
        }
    }
}

/// Runs one input; panics if a property fails.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let mut world = World::new(input.u8());
    let mut ops = 0;
    while !input.is_empty() && ops < 64 {
        ops += 1;
        match input.u8() % 8 {
            0..=4 => world.call(&mut input),
            5 => world.fault(&mut input),
            6 => world.log(&mut input),
            _ => world.poll_watches(),
        }
    }
    world.finish();
}
