//! What the daemon's private parts decide: which Kubernetes CA signs debug
//! kubeconfigs (never the cluster CA, in any form), and which node
//! certificates the cluster CA issues to the services (never a curator
//! instance's).

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::path::Path;

use metropolis_core::identity::{NodeId, is_curator_certificate};
use metropolis_core::ports::CertIssuer;
use metropolis_pki::{
    ClusterCa, Credentials, GENERATED_KUBERNETES_CA_CERT, GENERATED_KUBERNETES_CA_KEY,
    KubernetesCa, generate_ed25519_key,
};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use super::debug_ports::kubeconfig_issuer;
use super::pki::Issuer;
use super::{Config, DaemonError, Layout};
use crate::exit::{Exit, status_of};

/// A data directory with its PKI directory, and the configuration of a
/// daemon with the debug service on it.
fn setup(data: &Path) -> (Config, Layout, ClusterCa) {
    let mut config = Config::new(data, SocketAddr::from(([127, 0, 0, 1], 0)));
    config.debug_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    let layout = Layout::new(data);
    std::fs::create_dir_all(&layout.pki).unwrap();
    let ca = ClusterCa::generate().unwrap();
    ca.write_to_dir(&layout.pki).unwrap();
    (config, layout, ca)
}

fn refused(config: &Config, layout: &Layout, ca: &ClusterCa) -> DaemonError {
    match kubeconfig_issuer(config, layout, ca) {
        Ok(_) => panic!("accepted"),
        Err(e) => e,
    }
}

/// Writes `cert_pem` and `key_pem` into `dir` as `name.pem` and
/// `name-key.pem`; their paths.
fn write_pair(
    dir: &Path,
    name: &str,
    cert_pem: &str,
    key_pem: &str,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let cert = dir.join(format!("{name}.pem"));
    let key = dir.join(format!("{name}-key.pem"));
    std::fs::write(&cert, cert_pem).unwrap();
    std::fs::write(&key, key_pem).unwrap();
    (cert, key)
}

#[test]
fn half_a_kubernetes_ca_is_a_usage_error_naming_both_flags() {
    // clap refuses it on the command line; an embedder's Config too.
    let dir = tempfile::tempdir().unwrap();
    let (mut config, layout, ca) = setup(dir.path());
    for (cert, key) in [(Some("ca.pem"), None), (None, Some("ca-key.pem"))] {
        config.kubernetes_ca_cert = cert.map(Into::into);
        config.kubernetes_ca_key = key.map(Into::into);
        let e = refused(&config, &layout, &ca);
        assert_eq!(status_of(e.as_ref()), Exit::Usage, "{e}");
        assert_eq!(
            e.to_string(),
            "--kubernetes-ca-cert and --kubernetes-ca-key go together: give both, or neither"
        );
    }
}

#[test]
fn the_cluster_ca_is_refused_as_the_kubernetes_ca() {
    let dir = tempfile::tempdir().unwrap();
    let (mut config, layout, ca) = setup(dir.path());
    // The cluster CA's own files, and its key under another certificate.
    let own = (layout.pki.join("ca.pem"), layout.pki.join("ca-key.pem"));
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let key = rcgen::KeyPair::from_pem(&ca.key_pem()).unwrap();
    let same_key = params.self_signed(&key).unwrap();
    let rekeyed = write_pair(dir.path(), "same-key", &same_key.pem(), &ca.key_pem());
    for ((cert, key), why) in [
        (own, "it is the cluster CA certificate"),
        (rekeyed, "its key is the cluster CA's key"),
    ] {
        config.kubernetes_ca_cert = Some(cert.clone());
        config.kubernetes_ca_key = Some(key.clone());
        let e = refused(&config, &layout, &ca).to_string();
        let named = format!(
            "--kubernetes-ca-cert {} / --kubernetes-ca-key {}: {why}, ",
            cert.display(),
            key.display()
        );
        assert!(e.starts_with(&named), "{e}");
        assert!(e.contains("leave both flags out"), "{e}");
    }
}

#[test]
fn a_kubernetes_ca_of_its_own_signs_the_debug_kubeconfigs() {
    let dir = tempfile::tempdir().unwrap();
    let (mut config, layout, ca) = setup(&dir.path().join("data"));
    let elsewhere = dir.path().join("k8s");
    std::fs::create_dir(&elsewhere).unwrap();
    KubernetesCa::load_or_generate(&elsewhere).unwrap();
    config.kubernetes_ca_cert = Some(elsewhere.join(GENERATED_KUBERNETES_CA_CERT));
    config.kubernetes_ca_key = Some(elsewhere.join(GENERATED_KUBERNETES_CA_KEY));
    assert!(kubeconfig_issuer(&config, &layout, &ca).unwrap().is_some());
    // No CA is generated when one is given.
    assert!(!layout.pki.join(GENERATED_KUBERNETES_CA_CERT).exists());
}

#[test]
fn without_a_kubernetes_ca_one_is_generated_unless_told_not_to() {
    let dir = tempfile::tempdir().unwrap();
    let (mut config, layout, ca) = setup(dir.path());
    let generated = layout.pki.join(GENERATED_KUBERNETES_CA_CERT);
    config.kubernetes_ca_generate = false;
    assert!(kubeconfig_issuer(&config, &layout, &ca).unwrap().is_none());
    assert!(!generated.exists());
    config.kubernetes_ca_generate = true;
    assert!(kubeconfig_issuer(&config, &layout, &ca).unwrap().is_some());
    let first = std::fs::read(&generated).unwrap();
    // Generated once, then reused.
    assert!(kubeconfig_issuer(&config, &layout, &ca).unwrap().is_some());
    assert_eq!(std::fs::read(&generated).unwrap(), first);
}

#[test]
fn a_generated_kubernetes_ca_that_is_the_cluster_ca_is_refused_naming_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let (config, layout, ca) = setup(dir.path());
    write_pair(
        &layout.pki,
        "kubernetes-ca-GENERATED",
        &ca.cert_pem(),
        &ca.key_pem(),
    );
    let e = refused(&config, &layout, &ca).to_string();
    assert!(
        e.starts_with(&format!(
            "{}: the generated Kubernetes CA: it is the cluster CA certificate; remove \
             {GENERATED_KUBERNETES_CA_CERT} and {GENERATED_KUBERNETES_CA_KEY}",
            layout.pki.display()
        )),
        "{e}"
    );
}

#[test]
fn the_services_issuer_signs_node_certificates_that_are_no_curators() {
    let ca = ClusterCa::generate().unwrap();
    let issuer = Issuer(ca.clone());
    let (key_pem, public) = generate_ed25519_key().unwrap();
    let issued = issuer.issue_node_certificate(&public).unwrap();
    assert_eq!(issued.ca_pem, ca.cert_pem());
    // The node's own key fits it, and it chains to the cluster CA.
    let creds = Credentials::from_parts(issued.certificate_pem.clone(), key_pem, issued.ca_pem);
    creds.validate().unwrap();
    assert_eq!(creds.ed25519_public_key().unwrap(), public);
    let der = CertificateDer::from_pem_slice(issued.certificate_pem.as_bytes()).unwrap();
    // A node added through the curator does not forward for others.
    assert!(!is_curator_certificate(&der));
    let id = NodeId::from_public_key(&public);
    let named = der
        .as_ref()
        .windows(id.as_str().len())
        .any(|w| w == id.as_str().as_bytes());
    assert!(named, "the certificate names the node ID {id}");
}
