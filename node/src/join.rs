//! How a curator instance joins a cluster of several over etcd.
//!
//! Every instance of one cluster holds the same cluster CA (certificate
//! and key in `<data-dir>/pki`): each issues its own node and server
//! certificates with it, the leader issues node certificates for
//! `AddNode`, and instances trust each other (forwarding to the leader)
//! because their certificates chain to it. The CA key never crosses the
//! network: an operator with access to an existing instance's data
//! directory writes a **join bundle** (`metroctl node add --curator --out
//! DIR`: `ca.pem`, `ca-key.pem`), carries it to the new host, and starts
//! the new instance with `--join DIR` ([`install_bundle`]).
//!
//! The first elected instance records the CA certificate in the shared
//! store ([`CLUSTER_CA_KEY`]); every later one compares its own with it at
//! start ([`check_cluster_ca`]) and refuses to serve with another, saying
//! how to join, instead of campaigning with a CA the others cannot verify.

use std::path::Path;

use metropolis_core::curator::CLUSTER_CA_KEY;
use metropolis_core::hex;
use metropolis_core::ports::KvStore;
use metropolis_core::store::{KeyRange, Op, OpResult, Txn};
use sha2::Digest;

use crate::daemon::DaemonError;
use metropolis_pki::{CA_CERT_FILE, CA_KEY_FILE, ClusterCa, write_new_file};

/// What to do when an instance's CA is not the cluster's.
const HOW_TO_JOIN: &str = "to add an instance to an existing cluster, run \
    `metroctl --data-dir <its data directory> node add --curator --out BUNDLE` on a host of \
    an existing instance, copy BUNDLE here, and start this instance with an empty \
    --data-dir and `--join BUNDLE` (docs/operations.md, Adding a curator instance)";

/// The SHA-256 of `ca`'s certificate (DER), as hex: how messages name a CA.
pub fn fingerprint(ca: &ClusterCa) -> String {
    hex::encode(&sha2::Sha256::digest(ca.cert_der().as_ref()))
}

/// Writes the join bundle of the instance whose PKI directory is `pki`
/// into `out` (created with mode 0700; `ca-key.pem` mode 0600). Refuses an
/// `out` that already holds either file of a bundle, and never replaces
/// one: each file is written whole and linked into place only if nothing
/// is there ([`metropolis_pki::write_new_file`]); a failure removes what
/// this call wrote.
pub fn write_bundle(pki: &Path, out: &Path) -> Result<ClusterCa, DaemonError> {
    let ca = ClusterCa::read_from_dir(pki).map_err(|e| {
        format!(
            "reading the cluster CA of this instance: {e} (run this where the instance's \
             data directory is readable, e.g. as root on its host, with --data-dir naming it)"
        )
    })?;
    for name in [CA_KEY_FILE, CA_CERT_FILE] {
        if out.join(name).symlink_metadata().is_ok() {
            return Err(format!(
                "--out {}: already holds {name} (a join bundle or a CA); nothing was written: \
                 give a new or empty directory",
                out.display()
            )
            .into());
        }
    }
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(out)
            .map_err(|e| format!("{}: cannot create the bundle directory: {e}", out.display()))?;
    }
    let key = out.join(CA_KEY_FILE);
    write_new_file(&key, ca.key_pem().as_bytes(), 0o600)?;
    if let Err(e) = write_new_file(&out.join(CA_CERT_FILE), ca.cert_pem().as_bytes(), 0o644) {
        let _ = std::fs::remove_file(&key);
        return Err(e.into());
    }
    Ok(ca)
}

/// Installs the cluster CA of the join bundle `bundle` into the PKI
/// directory `pki` of a new instance (before anything else of the PKI is
/// created). A `pki` that already holds the same CA is left as it is (a
/// restart with the same flags); one holding another CA is refused: that
/// data directory belongs to another cluster.
pub fn install_bundle(bundle: &Path, pki: &Path) -> Result<(), DaemonError> {
    let joined = ClusterCa::read_from_dir(bundle)
        .map_err(|e| format!("--join {}: not a join bundle: {e}", bundle.display()))?;
    if pki.join(CA_CERT_FILE).exists() {
        let own = ClusterCa::read_from_dir(pki)?;
        if own.cert_der() == joined.cert_der() {
            return Ok(());
        }
        return Err(format!(
            "--join {}: the data directory already holds another cluster CA ({}, SHA-256 {}; \
             the bundle's is {}): it belongs to another cluster. Start the joining instance \
             with an empty --data-dir",
            bundle.display(),
            pki.join(CA_CERT_FILE).display(),
            fingerprint(&own),
            fingerprint(&joined),
        )
        .into());
    }
    joined.write_to_dir(pki)?;
    tracing::info!(
        bundle = %bundle.display(),
        ca = %fingerprint(&joined),
        "joined: installed the cluster CA of the bundle"
    );
    Ok(())
}

/// Compares `ca` with the cluster CA recorded in `store`, recording it
/// when none is (the first instance of the cluster). An instance with
/// another CA could neither forward to the leader nor be forwarded to: the
/// error says how to join instead.
pub async fn check_cluster_ca(store: &dyn KvStore, ca: &ClusterCa) -> Result<(), DaemonError> {
    let key = bytes::Bytes::from_static(CLUSTER_CA_KEY);
    let ours = bytes::Bytes::from(ca.cert_pem().into_bytes());
    let txn = Txn::create(
        key.clone(),
        ours.clone(),
        vec![Op::Range(KeyRange::Key(key))],
    );
    let response = store
        .txn(txn)
        .await
        .map_err(|e| format!("reading the cluster CA from the store: {e}"))?;
    if response.succeeded {
        tracing::info!(ca = %fingerprint(ca), "recorded this instance's CA as the cluster CA");
        return Ok(());
    }
    let recorded = match response.results.first() {
        Some(OpResult::Range(kvs)) => kvs.first().map(|kv| kv.value.clone()),
        _ => None,
    };
    let Some(recorded) = recorded else {
        return Err("the store returned no cluster CA record; try again".into());
    };
    if recorded == ours {
        return Ok(());
    }
    let theirs = fingerprint_of_pem(&recorded).unwrap_or_else(|| "unreadable".to_owned());
    Err(format!(
        "this instance's cluster CA (SHA-256 {}) is not the cluster's (SHA-256 {theirs}, \
         recorded in etcd by the instance that started the cluster): its calls to the leader \
         would fail certificate verification. {HOW_TO_JOIN}",
        fingerprint(ca),
    )
    .into())
}

/// The SHA-256 (hex) of the first certificate in `pem`, if it holds one.
fn fingerprint_of_pem(pem: &[u8]) -> Option<String> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let der = CertificateDer::pem_slice_iter(pem).next()?.ok()?;
    Some(hex::encode(&sha2::Sha256::digest(der.as_ref())))
}
