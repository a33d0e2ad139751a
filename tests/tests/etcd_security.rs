//! etcd over TLS and with etcd's authentication, against a real etcd
//! (Debian `etcd-server`; users and roles made with `etcdctl`, Debian
//! `etcd-client`) with certificates made here: the etcd port over TLS with
//! client certificates, users, permissions and expiring tokens; two
//! elected `metropolisd` instances (one per runtime) over TLS and
//! authentication; and daemons etcd refuses exiting at once, saying what
//! failed.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use metropolis_core::store::{KeyRange, Op, StoreError, Txn};
use metropolis_etcd::{EtcdAccess, EtcdClientCert, EtcdStore, EtcdTls, EtcdUser};
use metropolis_node::cluster::DEFAULT_ELECTION_PREFIX;
use metropolis_proto::prelude::storage::LeaderElectionValue;
use metropolis_proto::prelude::{common, curator};
use metropolis_tests::cluster::{share_ca, start_elected};
use metropolis_tests::etcd::{Etcd, EtcdOptions};
use metropolis_tests::etcd_pki::EtcdPki;
use metropolis_tests::{Daemon, RuntimeKind, curator, free_port, watch_nodes};
use prost::Message;

/// The password of etcd's `metropolis` user.
const PASSWORD: &str = "m3tr0-p4ss";

fn put(key: &str, value: &str) -> Txn {
    Txn {
        success: vec![Op::Put {
            key: Bytes::copy_from_slice(key.as_bytes()),
            value: Bytes::copy_from_slice(value.as_bytes()),
            lease: 0,
        }],
        ..Txn::default()
    }
}

fn message(e: &StoreError) -> String {
    match e {
        StoreError::Unavailable(m) => m.clone(),
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

fn tls(ca: &Path, client: Option<(&Path, &Path)>) -> EtcdTls {
    EtcdTls {
        ca_pem: std::fs::read(ca).unwrap(),
        client: client.map(|(cert, key)| EtcdClientCert {
            cert_pem: std::fs::read(cert).unwrap(),
            key_pem: std::fs::read(key).unwrap(),
        }),
    }
}

fn user(name: &str, password: &str) -> Option<EtcdUser> {
    Some(EtcdUser {
        name: name.into(),
        password: password.into(),
    })
}

/// Connects with `access`, retrying while etcd elects itself; a failure
/// that is not a refused connection ("connection refused") is returned.
async fn connect(etcd: &Etcd, access: EtcdAccess) -> Result<EtcdStore, StoreError> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match EtcdStore::connect(etcd.config().with_access(access.clone())).await {
            Err(e) if message(&e).contains("tcp connect error") && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => return other,
        }
    }
}

/// Users and roles as docs/operations.md says: `root`, and `metropolis`
/// with readwrite on exactly the daemon's prefixes; also `reader`, with
/// read only. Then `auth enable`.
fn enable_auth(etcd: &Etcd) {
    etcd.etcdctl_ok(&["user", "add", "root:r00t-pw"]);
    etcd.etcdctl_ok(&["user", "grant-role", "root", "root"]);
    for (role, permission) in [("metropolis", "readwrite"), ("reader", "read")] {
        etcd.etcdctl_ok(&["role", "add", role]);
        for prefix in [
            "/nodes/",
            "/machines/",
            "/cluster/",
            DEFAULT_ELECTION_PREFIX,
        ] {
            etcd.etcdctl_ok(&[
                "role",
                "grant-permission",
                role,
                "--prefix=true",
                permission,
                prefix,
            ]);
        }
    }
    etcd.etcdctl_ok(&["user", "add", &format!("metropolis:{PASSWORD}")]);
    etcd.etcdctl_ok(&["user", "grant-role", "metropolis", "metropolis"]);
    etcd.etcdctl_ok(&["user", "add", "reader:r34d-pw"]);
    etcd.etcdctl_ok(&["user", "grant-role", "reader", "reader"]);
    etcd.etcdctl_ok(&["auth", "enable"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_over_tls_with_client_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let pki = EtcdPki::new(dir.path(), "ca-etcd");
    let etcd = Etcd::start_with(
        1,
        EtcdOptions {
            tls: Some(pki.server_tls(true)),
            ..EtcdOptions::default()
        },
    );
    let url = etcd.url();
    assert!(url.starts_with("https://"), "{url}");
    let ca = pki.ca();
    let (cert, key) = pki.client("client", "metropolis");

    // With etcd's CA and a client certificate of it: everything works,
    // the watch and the lease included.
    let access = EtcdAccess {
        tls: Some(tls(&ca, Some((&cert, &key)))),
        user: None,
    };
    let store = connect(&etcd, access).await.unwrap();
    let r = store.run_txn(put("/t/a", "1")).await.unwrap();
    // From the put's revision: a watch opened "from now" races the put
    // (its stream is set up in the background).
    let mut watch = store.watch_range(KeyRange::Prefix(Bytes::from_static(b"/t/")), r.revision);
    let batch = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(batch.events[0].kv.mod_revision, r.revision);
    let lease = store.lease_grant(Duration::from_secs(5)).await.unwrap();
    let mut keep_alive = store.lease_keep_alive(&lease);
    assert!(keep_alive.next().await.unwrap().is_ok());

    // Refused, at connect and within the request timeout: no client
    // certificate, one of another CA (etcd's alert may lose the race with
    // the client's first write: "broken pipe"), a CA that did not sign
    // etcd's certificate (the client's own check, which always says so),
    // and plain HTTP to the TLS port.
    let stranger = EtcdPki::new(&dir.path().join("stranger"), "ca-stranger");
    let (other_cert, other_key) = stranger.client("client", "metropolis");
    let cases = [
        ("no client certificate", tls(&ca, None), ""),
        (
            "a client certificate of another CA",
            tls(&ca, Some((&other_cert, &other_key))),
            "",
        ),
        (
            "a CA that did not sign etcd's certificate",
            tls(&stranger.ca(), Some((&cert, &key))),
            "invalid peer certificate: UnknownIssuer",
        ),
    ];
    for (case, tls, says) in cases {
        let started = Instant::now();
        let access = EtcdAccess {
            tls: Some(tls),
            user: None,
        };
        let e = connect(&etcd, access).await.unwrap_err();
        let m = message(&e);
        assert!(m.contains(&url) && m.contains(says), "{case}: {m}");
        assert!(started.elapsed() < Duration::from_secs(5), "{case}: {m}");
    }
    let mut plain = etcd.config();
    plain.endpoints = vec![url.replace("https://", "http://")];
    let e = EtcdStore::connect(plain).await.unwrap_err();
    assert!(message(&e).contains("connect"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_permissions_and_expiring_tokens() {
    // Tokens unused for a second expire.
    let mut etcd = Etcd::start_with(
        1,
        EtcdOptions {
            args: vec!["--auth-token-ttl=1".into()],
            ..EtcdOptions::default()
        },
    );
    enable_auth(&etcd);
    let as_user = |name: &str, password: &str| EtcdAccess {
        tls: None,
        user: user(name, password),
    };

    // A wrong password is refused while connecting.
    let e = connect(&etcd, as_user("metropolis", "wrong"))
        .await
        .unwrap_err();
    assert!(message(&e).contains("authentication failed"), "{e}");
    // No user: connected (a status needs none), but every key is refused.
    let anonymous = connect(&etcd, EtcdAccess::default()).await.unwrap();
    let e = anonymous.run_txn(put("/nodes/x", "1")).await.unwrap_err();
    assert!(message(&e).contains("user name is empty"), "{e}");
    // The user may write its prefixes, and nothing else.
    let store = connect(&etcd, as_user("metropolis", PASSWORD))
        .await
        .unwrap();
    store.run_txn(put("/nodes/x", "1")).await.unwrap();
    let e = store.run_txn(put("/elsewhere", "1")).await.unwrap_err();
    assert!(message(&e).contains("permission denied"), "{e}");

    // Across expired tokens: a watch and a keep-alive opened before go on;
    // a write, a new watch (opened first, so that the watch is what meets
    // the expired token) and a new lease authenticate again.
    let nodes = KeyRange::Prefix(Bytes::from_static(b"/nodes/"));
    let mut open = store.watch_range(nodes.clone(), 0);
    let lease = store.lease_grant(Duration::from_secs(2)).await.unwrap();
    let mut keep_alive = store.lease_keep_alive(&lease);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut fresh = store.watch_range(nodes.clone(), 0);
    // The watch is created (or refused) when its first answer comes:
    // give it that time before the write it must see.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = store.run_txn(put("/nodes/y", "2")).await.unwrap();
    for watch in [&mut fresh, &mut open] {
        let batch = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(batch.events[0].kv.mod_revision, r.revision);
    }
    store.lease_grant(Duration::from_secs(5)).await.unwrap();
    assert!(keep_alive.next().await.unwrap().is_ok());
    assert!(store.lease_time_to_live(lease.id).await.is_ok());

    // And after etcd restarted, which forgets every token.
    etcd.restart();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match store.run_txn(put("/nodes/z", "3")).await {
            Ok(_) => break,
            Err(e) => {
                let m = message(&e);
                assert!(
                    !m.contains("token") && !m.contains("permission"),
                    "not re-authenticated: {m}"
                );
                assert!(Instant::now() < deadline, "{m}");
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut after = store.watch_range(nodes, r.revision + 1);
    let batch = tokio::time::timeout(Duration::from_secs(10), after.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(batch.events[0].kv.key, Bytes::from_static(b"/nodes/z"));
}

/// The index of the daemon the election names as leader (within 15 s).
async fn leader(etcd: &Etcd, daemons: &[&Daemon]) -> usize {
    let store = EtcdStore::connect(etcd.config()).await.unwrap();
    let election = store.election(DEFAULT_ELECTION_PREFIX);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok((Some(leader), _)) = election.leader().await
            && let Ok(value) = LeaderElectionValue::decode(leader.value.clone())
            && let Some(i) = daemons.iter().position(|d| d.addr == value.curator_address)
        {
            return i;
        }
        assert!(Instant::now() < deadline, "no curator leader within 15 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// The flags of a daemon reaching `etcd` with the CA, a client
/// certificate and key, and more `flags`.
fn tls_flags(ca: &Path, client: Option<(&Path, &Path)>, flags: &[&str]) -> Vec<String> {
    let mut args = vec!["--etcd-cacert".to_string(), ca.display().to_string()];
    if let Some((cert, key)) = client {
        args.extend([
            "--etcd-cert".into(),
            cert.display().to_string(),
            "--etcd-key".into(),
            key.display().to_string(),
        ]);
    }
    args.extend(strings(flags));
    args
}

/// An etcd serving TLS that requires client certificates, with
/// authentication on (see [`enable_auth`]).
fn secure_etcd(pki: &EtcdPki) -> Etcd {
    let mut etcd = Etcd::start_with(
        1,
        EtcdOptions {
            tls: Some(pki.server_tls(true)),
            ..EtcdOptions::default()
        },
    );
    enable_auth(&etcd);
    let (cert, key) = pki.client("observer", "metropolis");
    etcd.set_access(EtcdAccess {
        tls: Some(tls(&pki.ca(), Some((&cert, &key)))),
        user: user("metropolis", PASSWORD),
    });
    etcd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_over_tls_and_authentication() {
    let dir = tempfile::tempdir().unwrap();
    let pki = EtcdPki::new(&dir.path().join("etcd-pki"), "ca-etcd");
    let etcd = secure_etcd(&pki);
    let password_file = dir.path().join("etcd-password");
    std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
    std::fs::set_permissions(
        &password_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let (cert0, key0) = pki.client("curator-0", "curator-0");
    let (cert1, key1) = pki.client("curator-1", "metropolis");

    // The first instance (tokio) authenticates as the user `metropolis`
    // with its password in a file; the second (smol) by its client
    // certificate alone, whose common name is that user.
    let data0 = dir.path().join("curator-0");
    let flags0 = tls_flags(
        &pki.ca(),
        Some((&cert0, &key0)),
        &[
            "--etcd-user",
            "metropolis",
            "--etcd-password-file",
            password_file.to_str().unwrap(),
        ],
    );
    let d0 = start_elected(&data0, RuntimeKind::Tokio, &etcd.url(), &flags0);
    let data1 = dir.path().join("curator-1");
    share_ca(&data0, &data1);
    let flags1 = tls_flags(&pki.ca(), Some((&cert1, &key1)), &[]);
    let d1 = start_elected(&data1, RuntimeKind::Smol, &etcd.url(), &flags1);
    let daemons = [&d0, &d1];
    let l = leader(&etcd, &daemons).await;
    let (leader_d, follower) = (daemons[l], daemons[1 - l]);

    // A watch on the leader sees an update made through the follower.
    let mut watch = watch_nodes(leader_d.unix().await).await;
    curator(follower.unix().await)
        .update_node_status(curator::UpdateNodeStatusRequest {
            node_id: follower.node_id().to_string(),
            status: Some(common::NodeStatus {
                external_address: "192.0.2.44".into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    let id = follower.node_id().to_string();
    let seen = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            let event = watch.next().await.unwrap().unwrap();
            if event.nodes.iter().any(|n| {
                n.id == id
                    && n.status
                        .as_ref()
                        .is_some_and(|s| s.external_address == "192.0.2.44")
            }) {
                return;
            }
        }
    })
    .await;
    assert!(seen.is_ok(), "the update through the follower was not seen");
    // Neither instance put its password on the command line, so neither
    // warned about it.
    for d in daemons {
        assert!(!d.log().contains("on the command line"), "{}", d.log());
    }
}

/// Starts a daemon over `etcd` with `flags` and waits for it to exit
/// (within 20 s: etcd refusing it is never retried); its log.
fn refused(dir: &Path, name: &str, urls: &str, flags: &[String]) -> String {
    let mut args = vec!["--etcd".to_string(), urls.to_string()];
    args.extend(flags.iter().cloned());
    // The daemon binds its listeners before it reads anything else: a
    // port taken between free_port and the bind (another test's) is
    // tried again with another.
    for _ in 0..3 {
        let addr = format!("127.0.0.1:{}", free_port());
        let mut d = Daemon::spawn_with(&dir.join(name), addr, RuntimeKind::Tokio, &args);
        let started = Instant::now();
        let status = d.wait_exit(Duration::from_secs(20));
        assert!(!status.success(), "{name}: {status}");
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{name}: took {:?}, retried a refusal",
            started.elapsed()
        );
        let log = d.log();
        if !log.contains("cannot listen: address already in use") {
            return log;
        }
    }
    panic!("{name}: no free port in three tries")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemons_etcd_refuses_exit_saying_what_failed() {
    let dir = tempfile::tempdir().unwrap();
    let pki = EtcdPki::new(&dir.path().join("etcd-pki"), "ca-etcd");
    let etcd = secure_etcd(&pki);
    let url = etcd.url();
    let ca = pki.ca();
    let (cert, key) = pki.client("client", "curator");
    let client = Some((cert.as_path(), key.as_path()));
    let (nobody_cert, nobody_key) = pki.client("nobody", "nobody");
    let stranger = EtcdPki::new(&dir.path().join("stranger"), "ca-stranger");
    let good_user = format!("metropolis:{PASSWORD}");
    let cases: Vec<(&str, Vec<String>, Vec<&str>)> = vec![
        (
            "no-client-cert",
            tls_flags(&ca, None, &["--etcd-user", &good_user]),
            vec!["TLS handshake with etcd failed", "--etcd-cert"],
        ),
        (
            "untrusted-server",
            tls_flags(&stranger.ca(), client, &["--etcd-user", &good_user]),
            vec!["TLS handshake with etcd failed", "--etcd-cacert"],
        ),
        (
            "wrong-password",
            tls_flags(&ca, client, &["--etcd-user", "metropolis:wrong"]),
            vec![
                "etcd refused --etcd-user",
                "authentication failed",
                // A password on the command line is warned about.
                "on the command line",
            ],
        ),
        (
            "read-only-user",
            tls_flags(&ca, client, &["--etcd-user", "reader:r34d-pw"]),
            vec!["lacks a permission", "/nodes/", "permission denied"],
        ),
        (
            "certificate-of-no-user",
            tls_flags(&ca, Some((&nobody_cert, &nobody_key)), &[]),
            vec!["common name of --etcd-cert", "permission denied"],
        ),
        (
            "plain-http-with-tls",
            tls_flags(&ca, client, &[]),
            vec!["plain http:// with --etcd-cacert"],
        ),
        (
            "https-without-ca",
            strings(&["--etcd-user", &good_user]),
            vec!["https:// needs --etcd-cacert"],
        ),
        (
            "missing-key-file",
            tls_flags(&ca, Some((&cert, &dir.path().join("no-such-key.pem"))), &[]),
            vec!["--etcd-key", "no-such-key.pem", "cannot read"],
        ),
        (
            "not-pem",
            tls_flags(
                &ca,
                Some((&cert, &dir.path().join("etcd-pki/ca-etcd.pem"))),
                &[],
            ),
            vec!["--etcd-key", "no PEM private key"],
        ),
    ];
    // Started together: each must exit on its own.
    let handles: Vec<_> = cases
        .into_iter()
        .map(|(name, flags, expected)| {
            let dir = dir.path().to_path_buf();
            let urls = if name == "plain-http-with-tls" {
                url.replace("https://", "http://")
            } else {
                url.clone()
            };
            std::thread::spawn(move || (name, refused(&dir, name, &urls, &flags), expected))
        })
        .collect();
    for handle in handles {
        let (name, log, expected) = handle.join().unwrap();
        let error = log
            .lines()
            .find(|l| l.starts_with("metropolisd: "))
            .unwrap_or_else(|| panic!("{name}: no error line in its log:\n{log}"));
        eprintln!("{name}: {error}");
        for want in expected {
            assert!(
                log.contains(want),
                "{name}: {want:?} not in:\n{error}\n{log}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_without_a_user_is_refused_where_authentication_is_on() {
    let etcd = Etcd::start();
    enable_auth(&etcd);
    let dir = tempfile::tempdir().unwrap();
    let log = refused(dir.path(), "anonymous", &etcd.url(), &[]);
    assert!(log.contains("named no user"), "{log}");
    assert!(log.contains("user name is empty"), "{log}");
}
