//! Re-expresses the reference's (Monogon's) test cases of
//! `metropolis/node/core/curator/impl_leader_test.go` and
//! `metropolis/node/core/rpc/server_authentication_test.go` over gRPC
//! against a real `metropolisd` on the embedded store, on both runtimes,
//! with this project's decisions (docs/spec/semantics.md) where they
//! differ. Where the reference writes node records into etcd, these tests
//! use the owner's `NodeManagement` and the node's own `UpdateNodeStatus`.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use metropolis_core::identity::NodeId;
use metropolis_pki::{Credentials, client_config};
use metropolis_proto::metropolis::node::core::curator::proto::private::{
    ListMachinesRequest, RemoveNodeRequest, machine_management_client::MachineManagementClient,
    node_management_client::NodeManagementClient,
};
use metropolis_proto::prelude::{common, curator};
use metropolis_runtime_tokio::rt::TokioRuntime;
use metropolis_tests::{AgentKey, Daemon, RuntimeKind, against_both_runtimes, curator};
use metropolis_transport::connect;
use metropolis_transport::grpc::Channel;
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

/// How long any single step may take before the test fails.
const STEP: Duration = Duration::from_secs(10);

fn node_in_cluster(id: &str) -> curator::WatchRequest {
    let kind = curator::watch_request::NodeInCluster { node_id: id.into() };
    curator::WatchRequest {
        kind: Some(curator::watch_request::Kind::NodeInCluster(kind)),
    }
}

fn nodes_in_cluster() -> curator::WatchRequest {
    let kind = curator::watch_request::Kind::NodesInCluster(Default::default());
    curator::WatchRequest { kind: Some(kind) }
}

fn update(id: &str, status: common::NodeStatus) -> curator::UpdateNodeStatusRequest {
    curator::UpdateNodeStatusRequest {
        node_id: id.into(),
        status: Some(status),
    }
}

fn address(addr: &str) -> common::NodeStatus {
    common::NodeStatus {
        external_address: addr.into(),
        ..Default::default()
    }
}

/// `UpdateNodeStatus` of node `id` over `channel`, bounded.
async fn set_status(
    channel: Channel,
    id: &str,
    status: common::NodeStatus,
) -> Result<(), tonic::Status> {
    let mut client = curator(channel);
    let call = client.update_node_status(update(id, status));
    tokio::time::timeout(STEP, call)
        .await
        .expect("no answer")
        .map(|_| ())
}

/// Opens a watch over `channel`; panics if refused.
async fn watch(
    channel: Channel,
    req: curator::WatchRequest,
) -> tonic::Streaming<curator::WatchEvent> {
    let mut client = curator(channel);
    tokio::time::timeout(STEP, client.watch(req))
        .await
        .expect("the watch did not open")
        .unwrap()
        .into_inner()
}

/// The next event of `s`; panics on an error, the end, or silence.
async fn next(s: &mut tonic::Streaming<curator::WatchEvent>) -> curator::WatchEvent {
    match tokio::time::timeout(STEP, s.next()).await {
        Err(_) => panic!("no event within {STEP:?}"),
        Ok(None) => panic!("the stream ended"),
        Ok(Some(Err(e))) => panic!("the stream failed: {e:?}"),
        Ok(Some(Ok(ev))) => ev,
    }
}

/// Asserts that `s` sends nothing for a while.
async fn silent(s: &mut tonic::Streaming<curator::WatchEvent>, what: &str) {
    let got = tokio::time::timeout(Duration::from_millis(500), s.next()).await;
    assert!(got.is_err(), "{what}: expected silence, got {got:?}");
}

/// The status a refused watch ends with: the call's own, or its stream's
/// first item's.
async fn watch_refused(channel: Channel, req: curator::WatchRequest) -> tonic::Status {
    let call = async {
        match curator(channel).watch(req).await {
            Err(status) => status,
            Ok(s) => match s.into_inner().next().await {
                Some(Err(status)) => status,
                other => panic!("the watch was served: {other:?}"),
            },
        }
    };
    tokio::time::timeout(STEP, call).await.expect("no answer")
}

/// A NodesInCluster view: node ID to node, kept up to date by events.
type View = BTreeMap<String, curator::Node>;

fn apply(view: &mut View, ev: &curator::WatchEvent) {
    for n in &ev.nodes {
        view.insert(n.id.clone(), n.clone());
    }
    for t in &ev.node_tombstones {
        view.remove(&t.node_id);
    }
}

/// Reads `s` up to and including its last backlogged event; the view.
async fn backlog(s: &mut tonic::Streaming<curator::WatchEvent>) -> View {
    let mut view = View::new();
    loop {
        let ev = next(s).await;
        apply(&mut view, &ev);
        if ev.progress == curator::watch_event::Progress::LastBacklogged as i32 {
            return view;
        }
    }
}

/// Reads `s` into `view` until node `id` has the external address `want`
/// (`None`: until the node is gone).
async fn until_address(
    s: &mut tonic::Streaming<curator::WatchEvent>,
    view: &mut View,
    id: &str,
    want: Option<&str>,
) {
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        let node = view.get(id);
        let has = node
            .and_then(|n| n.status.as_ref())
            .map(|s| s.external_address.as_str());
        if want.map_or(node.is_none(), |_| has == want) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{id}: {want:?} not seen in {view:?}"
        );
        apply(view, &next(s).await);
    }
}

async fn remove_node(d: &Daemon, id: &NodeId) {
    let mut owner = NodeManagementClient::with_origin(d.owner().await, Channel::origin());
    owner
        .remove_node(RemoveNodeRequest {
            node_id: id.to_string(),
        })
        .await
        .unwrap();
}

fn ed25519_key() -> (rcgen::KeyPair, NodeId) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let raw: [u8; 32] = key.public_key_raw().try_into().unwrap();
    (key, NodeId::from_public_key(&raw))
}

/// TestWatchNodeInCluster: a NodeInCluster watch on a node that does not
/// exist yet stays silent; the node's creation, then its status update,
/// then its deletion (a tombstone) each arrive as one event.
///
/// Identities: the watch is this node over the local socket; the node is
/// added and removed by the owner over TLS; its status is sent by the new
/// node itself over TLS.
async fn test_watch_node_in_cluster_absent_then_created_then_status_then_tombstone(
    rt: RuntimeKind,
) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), rt);
    let (key, id) = ed25519_key();
    let mut w = watch(d.unix().await, node_in_cluster(id.as_str())).await;
    silent(&mut w, "the node does not exist yet").await;

    let node_dir = dir.path().join("fake");
    assert_eq!(d.add_node_with_key(&key, &node_dir).await, id);
    let ev = next(&mut w).await;
    assert_eq!(ev.nodes.len(), 1, "{ev:?}");
    assert!(ev.node_tombstones.is_empty(), "{ev:?}");
    assert_eq!(ev.nodes[0].id, id.as_str());
    assert_eq!(ev.nodes[0].status, None, "a new node has no status");

    let status = common::NodeStatus {
        running_curator: Some(common::node_status::RunningCurator { port: 1234 }),
        ..address("203.0.113.42")
    };
    let as_new = d.tls(&node_dir, "node").await;
    set_status(as_new, id.as_str(), status).await.unwrap();
    let ev = next(&mut w).await;
    assert_eq!(ev.nodes.len(), 1, "{ev:?}");
    assert_eq!(ev.nodes[0].id, id.as_str());
    let got = ev.nodes[0].status.clone().expect("the node's status");
    assert_eq!(got.external_address, "203.0.113.42");
    assert_eq!(got.running_curator.map(|c| c.port), Some(1234));

    remove_node(&d, &id).await;
    let ev = next(&mut w).await;
    assert!(ev.nodes.is_empty(), "{ev:?}");
    assert_eq!(ev.node_tombstones.len(), 1, "{ev:?}");
    assert_eq!(ev.node_tombstones[0].node_id, id.as_str());
    silent(&mut w, "after the tombstone").await;
}

/// TestWatchNodesInCluster: a NodesInCluster watch's backlog holds just
/// the local node; its own status update arrives; a new node with a status
/// arrives; a re-opened watch gets a fresh backlog of both; the new node's
/// deletion arrives as a tombstone.
///
/// Identities: the watches and the local node's update are this node over
/// the local socket; the new node is added and removed by the owner over
/// TLS, and sends its status itself over TLS.
async fn test_watch_nodes_in_cluster_backlog_then_updates_then_fresh_backlog_then_tombstone(
    rt: RuntimeKind,
) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), rt);
    let local = d.node_id().to_string();
    let mut w = watch(d.unix().await, nodes_in_cluster()).await;
    let mut view = backlog(&mut w).await;
    assert_eq!(view.keys().collect::<Vec<_>>(), [&local], "{view:?}");

    let as_local = d.unix().await;
    set_status(as_local, &local, address("203.0.113.43"))
        .await
        .unwrap();
    until_address(&mut w, &mut view, &local, Some("203.0.113.43")).await;

    let fake_dir = dir.path().join("fake");
    let fake = d.add_node(&fake_dir).await.to_string();
    let sent = common::NodeStatus {
        running_curator: Some(common::node_status::RunningCurator { port: 1337 }),
        ..address("1.2.3.4")
    };
    let as_fake = d.tls(&fake_dir, "node").await;
    set_status(as_fake, &fake, sent.clone()).await.unwrap();
    until_address(&mut w, &mut view, &fake, Some("1.2.3.4")).await;
    // As sent, but for the timestamp, which the curator sets.
    let seen = view[&fake].clone();
    let without_time = |s: &common::NodeStatus| common::NodeStatus {
        timestamp: None,
        ..s.clone()
    };
    assert_eq!(seen.status.as_ref().map(without_time), Some(sent.clone()));

    // A re-opened watch: a fresh backlog with both nodes.
    let mut w2 = watch(d.unix().await, nodes_in_cluster()).await;
    let mut fresh = backlog(&mut w2).await;
    assert_eq!(fresh.len(), 2, "{fresh:?}");
    let local_address = fresh[&local].status.as_ref().map(|s| &s.external_address);
    assert_eq!(local_address.map(String::as_str), Some("203.0.113.43"));
    assert_eq!(fresh[&fake], seen, "the backlog has the node as updated");

    // The deletion: a tombstone on both streams.
    remove_node(&d, &NodeId::parse(&fake).unwrap()).await;
    until_address(&mut w2, &mut fresh, &fake, None).await;
    until_address(&mut w, &mut view, &fake, None).await;
    assert_eq!(fresh.keys().collect::<Vec<_>>(), [&local]);
}

/// TestClusterUpdateNodeStatus: the local node starts without a status,
/// updates its own and sees it in its NodeInCluster watch; updating another
/// node's status is PermissionDenied.
///
/// Identities: the watch and the updates are this node over the local
/// socket; the other node is added by the owner over TLS and also tries
/// (over TLS, as itself) to update the local node: PermissionDenied.
async fn test_cluster_update_node_status_own_allowed_other_permission_denied(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), rt);
    let local = d.node_id().to_string();
    let mut w = watch(d.unix().await, node_in_cluster(&local)).await;
    let ev = next(&mut w).await;
    assert_eq!(ev.nodes.len(), 1, "{ev:?}");
    assert_eq!(
        ev.nodes[0].status, None,
        "no status before the first update"
    );

    let as_local = d.unix().await;
    let ok = set_status(as_local.clone(), &local, address("192.0.2.10"));
    ok.await.unwrap();
    loop {
        let ev = next(&mut w).await;
        if let Some(status) = &ev.nodes[0].status {
            assert_eq!(status.external_address, "192.0.2.10");
            break;
        }
    }

    let other_dir = dir.path().join("other");
    let other = d.add_node(&other_dir).await;
    let e = set_status(as_local, other.as_str(), address("192.0.2.10"));
    let e = e.await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let as_other = d.tls(&other_dir, "node").await;
    let e = set_status(as_other, &local, address("192.0.2.11"));
    let e = e.await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    silent(&mut w, "refused updates change nothing").await;
}

/// TestClusterUpdateNodeStatus, as the reference's later versions behave:
/// the curator sets `status.timestamp` to the time it accepted the update;
/// a node's own timestamp (here 1990) is overwritten.
///
/// Identities: the update and the watch are this node over the local
/// socket.
async fn test_cluster_update_node_status_timestamp_set_by_curator(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), rt);
    let local = d.node_id().to_string();
    let mut w = watch(d.unix().await, node_in_cluster(&local)).await;
    next(&mut w).await;
    let in_1990 = prost_types::Timestamp {
        seconds: 631_152_000,
        nanos: 0,
    };
    let status = common::NodeStatus {
        timestamp: Some(in_1990),
        ..address("192.0.2.20")
    };
    set_status(d.unix().await, &local, status).await.unwrap();
    let status = loop {
        let ev = next(&mut w).await;
        if let Some(s) = ev.nodes[0].status.clone() {
            break s;
        }
    };
    assert_eq!(status.external_address, "192.0.2.20");
    let stamped = status.timestamp.expect("a timestamp set by the curator");
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let off = (stamped.seconds - now.as_secs() as i64).abs();
    assert!(off < 60, "timestamp {stamped:?} is {off} s from now");
}

/// The reference's `Watch` answers a request without a kind (a newer
/// client's kind, to an older server) Unimplemented ("unsupported watch
/// kind" in impl_leader.go; no Go test case of its own).
///
/// Identities: this node over the local socket, and the owner over TLS.
async fn test_watch_kind_unset_is_unimplemented(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), rt);
    for channel in [d.unix().await, d.owner().await] {
        let e = watch_refused(channel, curator::WatchRequest { kind: None }).await;
        assert_eq!(e.code(), Code::Unimplemented, "{e:?}");
    }
}

/// A channel to the curator port presenting `creds`.
async fn tls_with(d: &Daemon, creds: &Credentials) -> Channel {
    let config = client_config(Some(creds), &creds.ca_pem).unwrap();
    connect::tls(&TokioRuntime::shared(), &d.addr, config)
        .await
        .unwrap()
}

async fn list_machines(channel: Channel) -> Result<(), tonic::Status> {
    MachineManagementClient::with_origin(channel, Channel::origin())
        .list_machines(ListMachinesRequest {})
        .await
        .map(|_| ())
}

/// TestExternalServerSecurity: an owner-only call (ListMachines, as the
/// reference's GetRegisterTicket) is served to the owner, refused
/// PermissionDenied to a node (which may still call what it holds the
/// permission for: Watch), and refused Unauthenticated to a self-signed
/// (ephemeral) certificate.
///
/// Identities: the owner over TLS; a node over TLS; this node over the
/// local socket; a self-signed Ed25519 certificate over TLS.
async fn test_external_server_security_owner_allowed_node_denied_self_signed_unauthenticated(
    rt: RuntimeKind,
) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), rt);
    list_machines(d.owner().await).await.unwrap();

    let node_dir = dir.path().join("n");
    d.add_node(&node_dir).await;
    for (channel, who) in [
        (d.tls(&node_dir, "node").await, "a node over TLS"),
        (d.unix().await, "this node over the socket"),
    ] {
        let e = list_machines(channel.clone()).await.unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{who}: {e:?}");
        let mut w = watch(channel, nodes_in_cluster()).await;
        backlog(&mut w).await;
    }

    let ephemeral = AgentKey::new(&d).creds;
    let e = list_machines(tls_with(&d, &ephemeral).await)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    let e = watch_refused(tls_with(&d, &ephemeral).await, nodes_in_cluster()).await;
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
}

/// TestExternalServerSecurity's `getPeerCertificate`
/// (`metropolis/node/core/rpc/server_authentication.go` at `80861fd7`,
/// lines 206-212): exactly one client certificate must be sent. The
/// owner's and a node's certificates, each followed by the cluster CA's
/// certificate (a chain that verifies), are Unauthenticated with a message
/// saying so, on a unary call and on Watch, while the health check, which
/// needs no identity, answers; alone they are served. (The reference's
/// `getPeerInfoUnauthenticated`, lines 173-189, likewise takes a peer with
/// a chain for one without a certificate.)
///
/// Identities: the owner and a node over TLS, each presenting its
/// certificate and the cluster CA's.
async fn test_external_server_security_certificate_chain_unauthenticated(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), rt);
    let node_dir = dir.path().join("n");
    d.add_node(&node_dir).await;
    for (creds_dir, prefix) in [(d.data_dir.join("owner"), "owner"), (node_dir, "node")] {
        let mut chained = Credentials::read_from_dir(&creds_dir, prefix).unwrap();
        chained.cert_pem = format!("{}{}", chained.cert_pem, chained.ca_pem);
        let says_why = |e: &tonic::Status, call: &str| {
            assert_eq!(e.code(), Code::Unauthenticated, "{prefix} {call}: {e:?}");
            assert!(
                e.message()
                    .contains("exactly one client certificate must be sent (got 2)"),
                "{prefix} {call}: {}",
                e.message()
            );
        };
        let e = list_machines(tls_with(&d, &chained).await)
            .await
            .unwrap_err();
        says_why(&e, "ListMachines");
        let e = watch_refused(tls_with(&d, &chained).await, nodes_in_cluster()).await;
        says_why(&e, "Watch");
        // What needs no identity is still served, as by the reference
        // (which then takes the peer for one without a certificate).
        let health = HealthClient::with_origin(tls_with(&d, &chained).await, Channel::origin())
            .check(HealthCheckRequest::default())
            .await;
        assert!(health.is_ok(), "{prefix} health check: {health:?}");
        let mut w = watch(d.tls(&creds_dir, prefix).await, nodes_in_cluster()).await;
        backlog(&mut w).await;
    }
}

/// A certificate for `key` with common name `id`, signed by the cluster
/// CA of `d` (its key from the data directory), with `sans` (DNS names)
/// and `usages`.
fn mint(
    d: &Daemon,
    key: &rcgen::KeyPair,
    id: &NodeId,
    sans: &[&str],
    usages: &[rcgen::ExtendedKeyUsagePurpose],
) -> Credentials {
    let pki = d.data_dir.join("pki");
    let ca_pem = std::fs::read_to_string(pki.join("ca.pem")).unwrap();
    let ca_key = std::fs::read_to_string(pki.join("ca-key.pem")).unwrap();
    let mut ca = rcgen::CertificateParams::default();
    ca.distinguished_name = rcgen::DistinguishedName::new();
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, metropolis_pki::CA_COMMON_NAME);
    let issuer = rcgen::Issuer::new(ca, rcgen::KeyPair::from_pem(&ca_key).unwrap());
    let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
    let mut params = rcgen::CertificateParams::new(sans).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, id.as_str());
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = usages.to_vec();
    let cert = params.signed_by(key, &issuer).unwrap();
    Credentials::from_parts(cert.pem(), key.serialize_pem(), ca_pem)
}

/// TestExternalServerSecurity, for what makes a node certificate (as the
/// reference's identity checks require): a certificate the cluster CA
/// signed for a registered node's key and ID counts as that node only with
/// the server-auth usage and a DNS SAN equal to its common name; without
/// either it is refused Unauthenticated. A certificate with both is served
/// (so the refusals are not the minting's fault).
///
/// Identities: the owner over TLS registers the node; the node over TLS
/// with each minted certificate.
async fn test_external_server_security_node_certificate_needs_server_auth_and_dns_san(
    rt: RuntimeKind,
) {
    use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), rt);
    let (key, id) = ed25519_key();
    d.add_node_with_key(&key, &dir.path().join("n")).await;
    let (_, other) = ed25519_key();

    let good = mint(&d, &key, &id, &[id.as_str()], &[ServerAuth, ClientAuth]);
    let mut w = watch(tls_with(&d, &good).await, nodes_in_cluster()).await;
    assert!(backlog(&mut w).await.contains_key(id.as_str()));
    let as_good = tls_with(&d, &good).await;
    set_status(as_good, id.as_str(), address("192.0.2.30"))
        .await
        .unwrap();

    let client_only = mint(&d, &key, &id, &[id.as_str()], &[ClientAuth]);
    let no_san = mint(&d, &key, &id, &[], &[ServerAuth, ClientAuth]);
    let other_san = mint(&d, &key, &id, &[other.as_str()], &[ServerAuth, ClientAuth]);
    for (creds, what) in [
        (client_only, "without server-auth usage"),
        (no_san, "without DNS SAN"),
        (other_san, "with another node's DNS SAN"),
    ] {
        let e = watch_refused(tls_with(&d, &creds).await, nodes_in_cluster()).await;
        assert_eq!(e.code(), Code::Unauthenticated, "watch {what}: {e:?}");
        let as_node = tls_with(&d, &creds).await;
        let e = set_status(as_node, id.as_str(), address("192.0.2.31"));
        let e = e.await.unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "update {what}: {e:?}");
    }
}

/// TestExternalServerSecurity, with this project's stricter decision: a
/// removed node's certificate, still signed by the cluster CA, is refused
/// Unauthenticated (the reference keeps accepting it).
///
/// Identities: the node over TLS before and after its removal; the owner
/// over TLS adds and removes it.
async fn test_external_server_security_removed_node_unauthenticated(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), rt);
    let node_dir = dir.path().join("n");
    let id = d.add_node(&node_dir).await;
    let mut w = watch(d.tls(&node_dir, "node").await, nodes_in_cluster()).await;
    backlog(&mut w).await;

    remove_node(&d, &id).await;
    let e = watch_refused(d.tls(&node_dir, "node").await, nodes_in_cluster()).await;
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    let as_node = d.tls(&node_dir, "node").await;
    let e = set_status(as_node, id.as_str(), address("192.0.2.40"));
    let e = e.await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
}

against_both_runtimes!(
    test_watch_node_in_cluster_absent_then_created_then_status_then_tombstone,
    test_watch_nodes_in_cluster_backlog_then_updates_then_fresh_backlog_then_tombstone,
    test_cluster_update_node_status_own_allowed_other_permission_denied,
    test_cluster_update_node_status_timestamp_set_by_curator,
    test_watch_kind_unset_is_unimplemented,
    test_external_server_security_owner_allowed_node_denied_self_signed_unauthenticated,
    test_external_server_security_node_certificate_needs_server_auth_and_dns_san,
    test_external_server_security_removed_node_unauthenticated,
    test_external_server_security_certificate_chain_unauthenticated,
);
