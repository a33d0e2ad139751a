//! The debug service's host ports the flags ask for: the image store
//! LoadImage writes to (containerd, or an OCI image layout in the data
//! directory) and the Kubernetes CA that signs debug kubeconfigs, one that
//! is not the cluster CA.

use std::sync::Arc;

use metropolis_core::ports::KubeconfigIssuer;
use metropolis_pki::{ClusterCa, DebugKubeconfigs, KubernetesCa};
use metropolis_service::images::ImageStore;
use metropolis_transport::runtime::SharedRuntime;

use super::{Config, DaemonError, Layout};
use crate::images::{ContainerdConfig, ContainerdStore, OciLayoutOptions, OciLayoutStore};

/// The image store the flags ask for: containerd, or the OCI image layout
/// under the data directory.
pub(super) fn image_store(
    config: &Config,
    runtime: &SharedRuntime,
) -> Result<Arc<dyn ImageStore>, DaemonError> {
    match &config.containerd_socket {
        Some(socket) => {
            let mut c = ContainerdConfig::new(socket, config.data_dir.join("containerd-staging"));
            c.namespace = config.containerd_namespace.clone();
            c.replace_tags = config.image_replace_tags;
            let store = ContainerdStore::open(c, runtime.clone())
                .map_err(|e| format!("{}: containerd image store: {e}", socket.display()))?;
            Ok(Arc::new(store))
        }
        None => {
            let dir = config.data_dir.join("images");
            let store = OciLayoutStore::open(
                &dir,
                OciLayoutOptions::replace_tags(config.image_replace_tags),
            )
            .map_err(|e| format!("{}: image store: {e}", dir.display()))?;
            Ok(Arc::new(store))
        }
    }
}

/// The kubeconfig issuer the flags ask for: the configured Kubernetes CA,
/// else a generated one (unless `--kubernetes-ca-generate=false`), else
/// none. A Kubernetes CA that is the cluster CA `cluster` in any form is
/// refused: the kubeconfigs it signed would be cluster credentials, the
/// owner's among them, for anyone reaching the debug service.
pub(super) fn kubeconfig_issuer(
    config: &Config,
    layout: &Layout,
    cluster: &ClusterCa,
) -> Result<Option<Arc<dyn KubeconfigIssuer>>, DaemonError> {
    let ca = match (&config.kubernetes_ca_cert, &config.kubernetes_ca_key) {
        (Some(cert), Some(key)) => {
            let ca = KubernetesCa::from_files(cert, key)?;
            ca.check_separate_from(cluster).map_err(|overlap| {
                format!(
                    "--kubernetes-ca-cert {} / --kubernetes-ca-key {}: {overlap}, so the debug \
                     kubeconfigs it signs would be Metropolis cluster credentials (the owner's \
                     among them) for anyone reaching the debug service; give the CA of your \
                     Kubernetes cluster, one that is not the cluster CA (pki/ca.pem) and was \
                     not signed by it, or leave both flags out to sign with a generated debug \
                     CA",
                    cert.display(),
                    key.display()
                )
            })?;
            ca
        }
        (None, None) if config.kubernetes_ca_generate => {
            let ca = KubernetesCa::load_or_generate(&layout.pki)?;
            ca.check_separate_from(cluster).map_err(|overlap| {
                format!(
                    "{}: the generated Kubernetes CA: {overlap}; remove {} and {} (a new one \
                     is generated)",
                    layout.pki.display(),
                    metropolis_pki::GENERATED_KUBERNETES_CA_CERT,
                    metropolis_pki::GENERATED_KUBERNETES_CA_KEY
                )
            })?;
            tracing::warn!(
                dir = %layout.pki.display(),
                "debug kubeconfigs are signed by a GENERATED Kubernetes CA, not a cluster's \
                 (configure --kubernetes-ca-cert and --kubernetes-ca-key)"
            );
            ca
        }
        (None, None) => return Ok(None),
        _ => {
            return Err(crate::exit::usage(
                "--kubernetes-ca-cert and --kubernetes-ca-key go together: give both, or neither",
            ));
        }
    };
    Ok(Some(Arc::new(DebugKubeconfigs::new(
        ca,
        config.kubernetes_api_server.clone(),
        std::time::Duration::from_secs(config.kubeconfig_validity),
    ))))
}
