//! `metroctl node list|show|add`: the cluster's nodes, one node, and a
//! new node's credentials (or a new curator instance's join bundle).

use std::path::Path;

use futures::StreamExt;
use metropolis_core::identity::NodeId;
use metropolis_pki::{CA_CERT_FILE, CA_KEY_FILE, Credentials};
use metropolis_proto::metropolis::node::core::curator::proto::private::{
    AddNodeRequest, node_management_client::NodeManagementClient,
};
use metropolis_proto::prelude::curator::{self, curator_client::CuratorClient};
use metropolis_transport::grpc::Channel;

use super::exit::{Exit, failed, usage};
use super::files::check_new_files_in;
use super::output::{self, Format};
use super::{CliError, status_error};

/// The files `node add --out DIR` writes into DIR.
const NODE_FILES: [&str; 3] = ["node-key.pem", "node.pem", CA_CERT_FILE];

/// The files `node add --curator --out DIR` writes into DIR.
const BUNDLE_FILES: [&str; 2] = [CA_KEY_FILE, CA_CERT_FILE];

/// Checks `node add --out DIR` before anything is generated or sent: DIR
/// must hold none of the files it would write.
pub fn check_add(out: &Path, curator: bool) -> Result<(), CliError> {
    if curator {
        check_new_files_in("--out", out, &BUNDLE_FILES, "a join bundle or a cluster CA")
    } else {
        check_new_files_in("--out", out, &NODE_FILES, "a node's credentials")
    }
}

/// Every node of the cluster: the backlog of a `Watch(NodesInCluster)`.
async fn all_nodes(channel: Channel) -> Result<Vec<curator::Node>, CliError> {
    let mut client = CuratorClient::with_origin(channel, Channel::origin());
    let kind = curator::watch_request::Kind::NodesInCluster(Default::default());
    let mut stream = client
        .watch(curator::WatchRequest { kind: Some(kind) })
        .await
        .map_err(status_error)?
        .into_inner();
    let mut nodes = Vec::new();
    while let Some(event) = stream.next().await {
        let event = event.map_err(status_error)?;
        let done = event.progress == curator::watch_event::Progress::LastBacklogged as i32;
        nodes.extend(event.nodes);
        if done {
            break;
        }
    }
    Ok(nodes)
}

/// `node list`.
pub async fn list(channel: Channel, format: Format) -> Result<(), CliError> {
    let nodes = all_nodes(channel).await?;
    output::print_nodes(&nodes, format);
    Ok(())
}

/// `node show ID`: one node, or exit 5 when there is none of that ID.
pub async fn show(channel: Channel, id: &str, format: Format) -> Result<(), CliError> {
    let id = NodeId::parse(id).map_err(|e| usage(format!("ID: {e}")))?;
    let wanted = id.to_string();
    let node = all_nodes(channel)
        .await?
        .into_iter()
        .find(|n| n.id == wanted)
        .ok_or_else(|| {
            failed(
                Exit::NotFound,
                format!("node {id} not found (`metroctl node list` lists the nodes)"),
            )
        })?;
    output::print_node(&node, format);
    Ok(())
}

/// `node add --out DIR`: a key made here, the node registered and its
/// certificate issued by the curator, then the bundle written, never over
/// an existing file ([`check_add`] ran before the call).
pub async fn add(channel: Channel, out: &Path, format: Format) -> Result<(), CliError> {
    // PKCS#8 v1: OpenSSL and BoringSSL read it too.
    let (key_pem, public) = metropolis_pki::generate_ed25519_key()?;
    let mut mgmt = NodeManagementClient::with_origin(channel, Channel::origin());
    let resp = mgmt
        .add_node(AddNodeRequest {
            public_key: public.to_vec().into(),
        })
        .await
        .map_err(status_error)?
        .into_inner();
    let creds = Credentials::from_parts(
        String::from_utf8(resp.certificate.to_vec())?,
        key_pem,
        String::from_utf8(resp.ca_certificate.to_vec())?,
    );
    creds.write_new_to_dir(out, "node").map_err(|e| {
        format!(
            "node {id} was added, but its credentials were not written (--out {}): {e}; nothing \
             there was replaced. Remove the node (`metroctl node rm {id}`) and add it again \
             with a new or empty --out directory",
            out.display(),
            id = resp.node_id
        )
    })?;
    if format.structured() {
        let value = serde_json::json!({
            "node_id": resp.node_id,
            "credentials": out.display().to_string(),
        });
        output::emit(&value, format);
        return Ok(());
    }
    outln!(
        "node {} added; credentials in {}",
        resp.node_id,
        out.display()
    );
    Ok(())
}

/// `node add --curator --out DIR`: the join bundle of the instance of
/// `data_dir` (no connection).
pub fn add_curator(data_dir: &Path, out: &Path, format: Format) -> Result<(), CliError> {
    check_add(out, true)?;
    let ca = metropolis_node::join::write_bundle(&data_dir.join("pki"), out)?;
    let fingerprint = metropolis_node::join::fingerprint(&ca);
    if format.structured() {
        let value = serde_json::json!({
            "join_bundle": out.display().to_string(),
            "ca_sha256": fingerprint,
        });
        output::emit(&value, format);
        return Ok(());
    }
    outln!(
        "join bundle of the cluster CA (SHA-256 {}) in {}; on the new instance's host: \
         metropolisd --join {} --etcd ... with an empty --data-dir, then delete the bundle",
        fingerprint,
        out.display(),
        out.display()
    );
    Ok(())
}
