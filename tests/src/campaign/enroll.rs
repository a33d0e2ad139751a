//! Enrolling the clients of a [`Cluster`] as
//! its owner: nodes (a key, `AddNode`, the returned certificate) and
//! machines (an agent key and self-signed certificate, `AddMachine`),
//! each call retried while the cluster elects its first leader.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metropolis_pki::{Credentials, client_config};
use metropolis_proto::metropolis::node::core::curator::proto::private::{
    AddMachineRequest, AddNodeRequest, machine_management_client::MachineManagementClient,
    node_management_client::NodeManagementClient,
};
use metropolis_transport::grpc::Channel;

use super::cluster::Cluster;

/// The owner, connected to curator-0 for enrolling.
pub struct Owner {
    /// The owner's credential.
    pub credentials: Credentials,
    nodes: NodeManagementClient<Channel>,
    machines: MachineManagementClient<Channel>,
}

/// An enrolled node: its ID and TLS configuration.
pub struct EnrolledNode {
    /// The node's ID.
    pub id: String,
    /// Its client configuration for the curators' TLS port.
    pub tls: Arc<rustls::ClientConfig>,
}

/// An enrolled machine: its ID and its agent's TLS configuration.
pub struct EnrolledAgent {
    /// The machine's ID.
    pub machine_id: String,
    /// Its agent's client configuration for the AgentCallback port.
    pub tls: Arc<rustls::ClientConfig>,
}

impl Owner {
    /// Reads the owner credential in `owner_dir` and connects to
    /// curator-0 (tried for 5 s while it starts).
    pub async fn connect(owner_dir: &Path) -> Result<Owner, String> {
        let credentials = Credentials::read_from_dir(owner_dir, "owner")
            .map_err(|e| format!("reading the owner credential: {e}"))?;
        let config = client_config(Some(&credentials), &credentials.ca_pem)
            .map_err(|e| format!("the owner's TLS configuration: {e}"))?;
        let runtime = metropolis_runtime_tokio::rt::TokioRuntime::shared();
        let mut last = String::new();
        for _ in 0..50 {
            match metropolis_transport::connect::tls(
                &runtime,
                &Cluster::curator_addr(0),
                config.clone(),
            )
            .await
            {
                Ok(channel) => {
                    return Ok(Owner {
                        credentials,
                        nodes: NodeManagementClient::with_origin(
                            channel.clone(),
                            Channel::origin(),
                        ),
                        machines: MachineManagementClient::with_origin(channel, Channel::origin()),
                    });
                }
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!("connecting to curator-0 as the owner: {last}"))
    }

    /// The owner's own TLS configuration for the curators.
    pub fn tls(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        client_config(Some(&self.credentials), &self.credentials.ca_pem)
            .map_err(|e| format!("the owner's TLS configuration: {e}"))
    }

    /// Adds a node with a new Ed25519 key.
    pub async fn add_node(&self) -> Result<EnrolledNode, String> {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519)
            .map_err(|e| format!("generating a node key: {e}"))?;
        let request = AddNodeRequest {
            public_key: key.public_key_raw().to_vec().into(),
        };
        let resp = settle("adding a node", || {
            let (mut nodes, request) = (self.nodes.clone(), request.clone());
            async move { nodes.add_node(request).await }
        })
        .await?
        .into_inner();
        let creds = Credentials::from_parts(
            String::from_utf8_lossy(&resp.certificate).into_owned(),
            key.serialize_pem(),
            String::from_utf8_lossy(&resp.ca_certificate).into_owned(),
        );
        let tls = client_config(Some(&creds), &creds.ca_pem)
            .map_err(|e| format!("node {}'s TLS configuration: {e}", resp.node_id))?;
        Ok(EnrolledNode {
            id: resp.node_id,
            tls,
        })
    }

    /// Registers machine `machine_id` with a new agent key.
    pub async fn add_agent(&self, machine_id: &str) -> Result<EnrolledAgent, String> {
        let key = metropolis_pki::generate_agent_key()
            .map_err(|e| format!("generating an agent key: {e}"))?;
        let (cert, public) = metropolis_pki::self_signed_agent_certificate(&key)
            .map_err(|e| format!("the agent's certificate: {e}"))?;
        let request = AddMachineRequest {
            machine_id: machine_id.to_string(),
            agent_public_key: public.to_vec().into(),
        };
        settle("registering a machine", || {
            let (mut machines, request) = (self.machines.clone(), request.clone());
            async move { machines.add_machine(request).await }
        })
        .await?;
        let ca = &self.credentials.ca_pem;
        let creds = Credentials::from_parts(cert, key, ca.clone());
        let tls = metropolis_pki::curator_client_config(Some(&creds), ca)
            .map_err(|e| format!("the agent's TLS configuration: {e}"))?;
        Ok(EnrolledAgent {
            machine_id: machine_id.to_string(),
            tls,
        })
    }
}

/// Retries a set-up call while the cluster elects its first leader (30 s).
async fn settle<T, F, Fut>(what: &str, mut f: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(s) if Instant::now() < deadline && s.code() == tonic::Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(s) => return Err(format!("{what}: {}", s.message())),
        }
    }
}
