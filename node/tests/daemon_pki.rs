//! This node's PKI in the data directory, as `NodePki::load_or_create`
//! leaves it: what the first start creates (and with which modes), that
//! later starts load the same identity, what an older data directory gets
//! upgraded to without losing its node ID or CA, and joining a cluster
//! with `--join`. (The PKCS#8 v2 key upgrade is in `pki_keys.rs`.)

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use metropolis_core::identity::{NodeId, is_curator_certificate};
use metropolis_node::daemon::{Config, NodePki};
use metropolis_node::logs::dn_for_target;
use metropolis_pki::{ClusterCa, Credentials, P256_PREFIX, p256_mismatch};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};

fn config(data: &Path, sans: &[&str]) -> Config {
    let mut config = Config::new(data, SocketAddr::from(([127, 0, 0, 1], 0)));
    config.extra_sans = sans.iter().map(|s| s.to_string()).collect();
    config
}

/// What a start logged: (DN in the log tree, message).
type Logged = Vec<(&'static str, String)>;

/// Runs `NodePki::load_or_create` on `config`, with what it logged.
fn start(config: &Config) -> (NodePki, Logged) {
    let logged = Arc::new(Mutex::new(Vec::new()));
    let subscriber = tracing_subscriber::registry().with(Capture(logged.clone()));
    let pki = tracing::subscriber::with_default(subscriber, || NodePki::load_or_create(config));
    let logged = logged.lock().unwrap().clone();
    (pki.unwrap(), logged)
}

/// Records every event's target as a DN, and its message.
struct Capture(Arc<Mutex<Logged>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        struct Message(String);
        impl Visit for Message {
            fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        let dn = dn_for_target(event.metadata().target());
        self.0.lock().unwrap().push((dn, message.0));
    }
}

/// Whether the daemon's log said `what`, under the daemon's DN.
fn said(logged: &Logged, what: &str) -> bool {
    logged
        .iter()
        .any(|(dn, message)| *dn == "root.daemon" && message.contains(what))
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Every file the PKI of the data directory `data` consists of, with the
/// mode it must have.
fn pki_files(data: &Path) -> Vec<(PathBuf, u32)> {
    let pki = data.join("pki");
    let owner = data.join("owner");
    vec![
        (pki.join("ca.pem"), 0o644),
        (pki.join("ca-key.pem"), 0o600),
        (Credentials::cert_path(&pki, "node"), 0o644),
        (Credentials::key_path(&pki, "node"), 0o600),
        (Credentials::cert_path(&pki, P256_PREFIX), 0o644),
        (Credentials::key_path(&pki, P256_PREFIX), 0o600),
        (owner.join("ca.pem"), 0o644),
        (Credentials::cert_path(&owner, "owner"), 0o644),
        (Credentials::key_path(&owner, "owner"), 0o600),
    ]
}

fn contents(files: &[(PathBuf, u32)]) -> Vec<Vec<u8>> {
    files
        .iter()
        .map(|(f, _)| std::fs::read(f).unwrap())
        .collect()
}

fn read(data: &Path, prefix: &str) -> Credentials {
    let dir = data.join(if prefix == "owner" { "owner" } else { "pki" });
    Credentials::read_from_dir(&dir, prefix).unwrap()
}

/// Whether the DER of `creds`' certificate holds `bytes` (a SAN's value).
fn cert_holds(creds: &Credentials, bytes: &[u8]) -> bool {
    creds
        .cert_der()
        .unwrap()
        .as_ref()
        .windows(bytes.len())
        .any(|w| w == bytes)
}

#[test]
fn the_first_start_creates_ca_identity_and_owner_credential_owner_only() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (pki, logged) = start(&config(&data, &[]));

    for d in [&data, &data.join("pki"), &data.join("owner")] {
        assert_eq!(mode(d), 0o700, "{}", d.display());
    }
    for (file, expected) in pki_files(&data) {
        assert_eq!(mode(&file), expected, "{}", file.display());
    }
    let ca = ClusterCa::read_from_dir(&data.join("pki")).unwrap();
    // Each credential reads back and chains to the cluster CA.
    let node = read(&data, "node");
    let owner = read(&data, "owner");
    let p256 = read(&data, P256_PREFIX);
    for creds in [&node, &owner, &p256] {
        assert_eq!(creds.ca_pem, ca.cert_pem());
    }
    // The node is a curator instance, its ID its Ed25519 key's.
    assert!(is_curator_certificate(&node.cert_der().unwrap()));
    let id = NodeId::from_public_key(&node.ed25519_public_key().unwrap());
    assert!(pki.node_id() == &id, "the node ID is its key's");
    // The P-256 server certificate is the node certificate's twin.
    assert_eq!(p256_mismatch(&ca, &node, &p256, now()).unwrap(), None);
    pki.client_config().unwrap();

    for what in [
        "first start: creating the cluster CA",
        "created this node's identity",
        "created the owner credential",
        "created this node's P-256 server certificate",
    ] {
        assert!(said(&logged, what), "{what:?} not in {logged:?}");
    }
}

#[test]
fn a_later_start_loads_the_same_identity_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let (first, _) = start(&config(data, &["node1.example"]));
    let files = pki_files(data);
    let before = contents(&files);
    // --san only names the certificates of the first start.
    let (second, logged) = start(&config(data, &["node2.example"]));
    assert!(first.node_id() == second.node_id());
    assert_eq!(contents(&files), before, "a file changed");
    assert!(!said(&logged, "created"), "{logged:?}");
    assert!(!said(&logged, "reissued"), "{logged:?}");
    let node = read(data, "node");
    assert!(cert_holds(&node, b"node1.example"));
    assert!(!cert_holds(&node, b"node2.example"));
}

#[test]
fn extra_sans_name_the_node_and_its_p256_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    start(&config(data, &["node1.example", "192.0.2.77"]));
    for prefix in ["node", P256_PREFIX] {
        let creds = read(data, prefix);
        assert!(cert_holds(&creds, b"node1.example"), "{prefix}");
        assert!(cert_holds(&creds, &[192, 0, 2, 77]), "{prefix}");
    }
}

#[test]
fn a_node_certificate_without_the_curator_mark_is_reissued_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let (first, _) = start(&config(data, &[]));
    let pki_dir = data.join("pki");
    let ca = ClusterCa::read_from_dir(&pki_dir).unwrap();

    // What a version before the curator mark left: the same key and CA,
    // a node certificate without the mark, and a P-256 twin of that one.
    let node = read(data, "node");
    let key = node.ed25519_public_key().unwrap();
    let unmarked = Credentials::from_parts(
        ca.issue_node_cert(&key, &[], false).unwrap(),
        node.key_pem.clone(),
        node.ca_pem.clone(),
    );
    assert!(!is_curator_certificate(&unmarked.cert_der().unwrap()));
    unmarked.write_to_dir(&pki_dir, "node").unwrap();
    let old_p256 = ca.issue_p256_server_cert(&unmarked).unwrap();
    old_p256.write_to_dir(&pki_dir, P256_PREFIX).unwrap();
    assert_eq!(
        p256_mismatch(&ca, &unmarked, &old_p256, now()).unwrap(),
        None
    );
    let kept = [
        pki_dir.join("ca.pem"),
        pki_dir.join("ca-key.pem"),
        Credentials::key_path(&pki_dir, "node"),
        Credentials::cert_path(&data.join("owner"), "owner"),
        Credentials::key_path(&data.join("owner"), "owner"),
    ];
    let kept_before: Vec<Vec<u8>> = kept.iter().map(|f| std::fs::read(f).unwrap()).collect();

    let (second, logged) = start(&config(data, &[]));
    // The same node, CA and owner: only the certificates are new.
    assert!(second.node_id() == first.node_id());
    let kept_after: Vec<Vec<u8>> = kept.iter().map(|f| std::fs::read(f).unwrap()).collect();
    assert_eq!(kept_after, kept_before);
    let node = read(data, "node");
    assert!(is_curator_certificate(&node.cert_der().unwrap()));
    assert_eq!(node.ed25519_public_key().unwrap(), key);
    assert!(said(&logged, "reissued this node's certificate to mark it"));
    // The P-256 twin follows: the mark is one of the names it copies.
    let p256 = read(data, P256_PREFIX);
    assert_ne!(p256.cert_pem, old_p256.cert_pem);
    assert!(
        p256_mismatch(&ca, &unmarked, &p256, now())
            .unwrap()
            .is_some()
    );
    assert_eq!(p256_mismatch(&ca, &node, &p256, now()).unwrap(), None);
    assert!(said(
        &logged,
        "reissued this node's P-256 server certificate"
    ));
    for (file, expected) in pki_files(data) {
        assert_eq!(mode(&file), expected, "{}", file.display());
    }

    // Upgraded once: the next start keeps it all.
    let files = pki_files(data);
    let before = contents(&files);
    let (_, logged) = start(&config(data, &[]));
    assert_eq!(contents(&files), before);
    assert!(!said(&logged, "reissued"), "{logged:?}");
}

#[test]
fn a_missing_or_damaged_p256_certificate_is_issued_again() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let (first, _) = start(&config(data, &[]));
    let pki_dir = data.join("pki");
    let ca = ClusterCa::read_from_dir(&pki_dir).unwrap();
    let node_pem = std::fs::read(Credentials::cert_path(&pki_dir, "node")).unwrap();
    let cert = Credentials::cert_path(&pki_dir, P256_PREFIX);
    let key = Credentials::key_path(&pki_dir, P256_PREFIX);
    // Another node's twin, under the same CA.
    let (other, _) = ca.issue_curator_node(&[]).unwrap();
    let others = ca.issue_p256_server_cert(&other).unwrap();

    let garble = || std::fs::write(&cert, "not a certificate").unwrap();
    let replace = || others.write_to_dir(&pki_dir, P256_PREFIX).unwrap();
    let remove = || {
        std::fs::remove_file(&cert).unwrap();
        std::fs::remove_file(&key).unwrap();
    };
    let cases: [(&str, &dyn Fn(), &str); 3] = [
        ("garbled", &garble, "reissued"),
        ("another node's", &replace, "reissued"),
        ("missing", &remove, "created"),
    ];
    for (what, damage, logged_as) in cases {
        damage();
        let (pki, logged) = start(&config(data, &[]));
        assert!(pki.node_id() == first.node_id(), "{what}");
        let node = read(data, "node");
        let p256 = read(data, P256_PREFIX);
        assert_eq!(
            p256_mismatch(&ca, &node, &p256, now()).unwrap(),
            None,
            "{what}"
        );
        assert_eq!(mode(&key), 0o600, "{what}");
        assert!(
            said(&logged, &format!("{logged_as} this node's P-256")),
            "{what}: {logged:?}"
        );
        // The node's own certificate is not touched for its twin.
        assert_eq!(
            std::fs::read(Credentials::cert_path(&pki_dir, "node")).unwrap(),
            node_pem,
            "{what}"
        );
    }
}

#[test]
fn joining_takes_the_bundles_ca_and_a_new_identity() {
    let dir = tempfile::tempdir().unwrap();
    let first_data = dir.path().join("first");
    let (first, _) = start(&config(&first_data, &[]));
    let bundle = dir.path().join("bundle");
    metropolis_node::join::write_bundle(&first_data.join("pki"), &bundle).unwrap();

    let joining_data = dir.path().join("joining");
    let mut joining = config(&joining_data, &[]);
    joining.cluster.join = Some(bundle.clone());
    let (joined, _) = start(&joining);
    assert!(joined.node_id() != first.node_id(), "a node of its own");
    let ca_of = |data: &Path| std::fs::read(data.join("pki").join("ca.pem")).unwrap();
    assert_eq!(ca_of(&joining_data), ca_of(&first_data), "the cluster's CA");
    assert_eq!(
        std::fs::read(joining_data.join("pki").join("ca-key.pem")).unwrap(),
        std::fs::read(first_data.join("pki").join("ca-key.pem")).unwrap()
    );
    assert_eq!(mode(&joining_data.join("pki")), 0o700);
    for (file, expected) in pki_files(&joining_data) {
        assert_eq!(mode(&file), expected, "{}", file.display());
    }
    // A restart with the same flags is the same node.
    let (again, _) = start(&joining);
    assert!(again.node_id() == joined.node_id());

    // A data directory of another cluster is not joined over.
    let other_data = dir.path().join("other");
    start(&config(&other_data, &[]));
    let other_ca = ca_of(&other_data);
    let mut rejoining = config(&other_data, &[]);
    rejoining.cluster.join = Some(bundle.clone());
    let e = match NodePki::load_or_create(&rejoining) {
        Ok(_) => panic!("joined over another cluster's CA"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.starts_with(&format!("--join {}: ", bundle.display())),
        "{e}"
    );
    assert!(e.contains("another cluster CA"), "{e}");
    assert_eq!(ca_of(&other_data), other_ca);
}

#[test]
fn a_join_bundle_that_is_not_one_is_refused_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("empty-bundle");
    std::fs::create_dir(&bundle).unwrap();
    let data = dir.path().join("data");
    let mut joining = config(&data, &[]);
    joining.cluster.join = Some(bundle.clone());
    let e = match NodePki::load_or_create(&joining) {
        Ok(_) => panic!("joined with no bundle"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.starts_with(&format!("--join {}: not a join bundle", bundle.display())),
        "{e}"
    );
    assert!(
        !data.join("pki").join("ca.pem").exists(),
        "a CA was created"
    );
}

/// Seconds since the Unix epoch.
fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}
