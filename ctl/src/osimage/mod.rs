//! `metroctl osimage build|push`: OS images in the format the agent
//! installs (an OCI artifact: a config with the chunk hashes of every
//! payload, one layer per payload), built into an OCI image layout
//! directory and pushed to a registry; and the operator's
//! `--node-parameters` file of `metroctl install request`.

mod build;
mod encode;
pub mod format;
pub mod image_ref;
mod layout;
mod push;
pub mod reference;
pub mod resolve;

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Subcommand};
use metropolis_proto::prelude::debug::NodeParameters;
use serde_json::json;

use crate::CliError;
use crate::exit::{Exit, failed, usage};
use crate::output::{Format, emit};
use format::{Compression, DEFAULT_CHUNK_SIZE, Kind};

/// `metroctl osimage …`
#[derive(Subcommand, Debug)]
pub enum OsimageCommand {
    /// Build an OS image into an OCI image layout directory: one layer per
    /// payload (zstd or raw), a config with the SHA-256 of every chunk of
    /// every payload. Prints the manifest digest.
    Build(BuildArgs),
    /// Push an image layout directory (from `osimage build`) to a
    /// registry. Prints the image reference `metroctl install request
    /// --image` takes.
    ///
    /// Blobs the registry has are skipped. A request that fails for a
    /// passing reason (no connection, 429, 5xx) is tried three more times
    /// (after 0.5, 1 and 2 s, or as Retry-After asks), an upload cut
    /// short starts over, and each retry is said on stderr.
    Push(PushArgs),
}

/// `metroctl osimage build`
#[derive(Args, Debug)]
pub struct BuildArgs {
    /// The layout directory to write: created, or empty.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// A payload and the file holding it, once per payload: a metropolis
    /// image needs kernel.efi=FILE and system=FILE, a disk image disk=FILE.
    #[arg(long = "payload", value_name = "NAME=FILE")]
    payloads: Vec<String>,
    /// metropolis: a Metropolis node (kernel.efi and system); disk: a
    /// whole-disk image of another OS (disk), written raw over the root
    /// device.
    #[arg(long, value_enum, default_value_t)]
    kind: Kind,
    /// How payloads are stored: zstd (one frame each) or none (raw).
    #[arg(long, value_enum, default_value_t)]
    compression: Compression,
    /// The length of the hashed chunks, 1 byte to 16 MiB.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_CHUNK_SIZE)]
    chunk_size: u64,
}

/// `metroctl osimage push`
#[derive(Args, Debug)]
pub struct PushArgs {
    /// The image layout directory.
    dir: PathBuf,
    /// Where to: [http://|https://]HOST[:PORT]/REPOSITORY[:TAG] (https
    /// unless http:// is given; without a tag the manifest is pushed by
    /// digest).
    reference: String,
    /// A Docker config.json with the login for the registry's host
    /// ({"auths": {"HOST:PORT": {"auth": "<base64 of user:password>"}}}),
    /// as bmaas-agent --registry-auth reads. Logins go over https only.
    #[arg(long, value_name = "FILE")]
    registry_auth: Option<PathBuf>,
    /// PEM CA certificates to trust besides the system's, for a registry
    /// with a private CA.
    #[arg(long, value_name = "FILE")]
    registry_ca: Option<PathBuf>,
}

/// Runs an `osimage` command; `connect_limit` bounds each connection.
pub async fn run(
    command: OsimageCommand,
    format: Format,
    connect_limit: Duration,
) -> Result<(), CliError> {
    match command {
        OsimageCommand::Build(args) => {
            let plan = build::plan(
                args.out,
                &args.payloads,
                args.kind,
                args.compression,
                args.chunk_size,
            )?;
            let built = build::build(&plan)?;
            if format.structured() {
                let payloads: Vec<_> = built
                    .payloads
                    .iter()
                    .map(|(p, layer)| {
                        json!({
                            "name": p.name,
                            "size": p.size,
                            "chunks": p.chunk_hashes.len(),
                            "media_type": layer.media_type,
                            "blob_digest": layer.digest,
                            "blob_size": layer.size,
                        })
                    })
                    .collect();
                let value = json!({
                    "out": plan.out.display().to_string(),
                    "digest": built.manifest.digest,
                    "artifact_type": plan.kind.artifact_type(),
                    "payloads": payloads,
                });
                emit(&value, format);
                return Ok(());
            }
            for (p, layer) in &built.payloads {
                outln!(
                    "{:<12} {} bytes in {} chunk(s), stored as {} bytes ({})",
                    p.name,
                    p.size,
                    p.chunk_hashes.len(),
                    layer.size,
                    layer.media_type
                );
            }
            outln!(
                "{} image {} in {}",
                plan.kind.name(),
                built.manifest.digest,
                plan.out.display()
            );
            Ok(())
        }
        OsimageCommand::Push(args) => {
            let reference = reference::parse(&args.reference).map_err(usage)?;
            let layout = layout::read(&args.dir)?;
            // The registry client blocks: a few dozen requests in turn.
            let (pushed, layout, reference) = tokio::task::spawn_blocking(move || {
                let plan = push::PushPlan {
                    layout: &layout,
                    reference: &reference,
                    auth_file: args.registry_auth.as_deref(),
                    ca_file: args.registry_ca.as_deref(),
                    connect_limit,
                };
                let pushed = push::push(&plan);
                pushed.map(|pushed| (pushed, layout, reference))
            })
            .await
            .map_err(|e| failed(Exit::Failure, format!("the push thread failed: {e}")))??;
            if format.structured() {
                let value = json!({
                    "image": pushed.image,
                    "tag": reference.tag,
                    "digest": pushed.digest,
                    "artifact_type": layout.artifact_type,
                    "blobs_uploaded": pushed.uploaded,
                    "blobs_present": pushed.skipped,
                });
                emit(&value, format);
                return Ok(());
            }
            outln!(
                "pushed {} ({} blob(s) uploaded, {} already there)",
                pushed.image,
                pushed.uploaded,
                pushed.skipped
            );
            if let Some(tag) = &reference.tag {
                outln!("tag {tag}");
            }
            Ok(())
        }
    }
}

/// The largest `--node-parameters` file read.
const MAX_NODE_PARAMETERS_BYTES: u64 = 1 << 20;

/// Reads `--node-parameters FILE`: the protobuf JSON mapping of
/// `metropolis.proto.api.NodeParameters` when its first non-blank byte is
/// `{`, else the encoded message.
pub fn read_node_parameters(path: &Path) -> Result<NodeParameters, CliError> {
    use prost::Message as _;
    use std::io::Read as _;
    let flag = format!("--node-parameters {}", path.display());
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| {
            f.take(MAX_NODE_PARAMETERS_BYTES + 1)
                .read_to_end(&mut bytes)
        })
        .map_err(|e| usage(format!("{flag}: {e}")))?;
    if bytes.len() as u64 > MAX_NODE_PARAMETERS_BYTES {
        return Err(usage(format!(
            "{flag}: larger than {MAX_NODE_PARAMETERS_BYTES} bytes"
        )));
    }
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{') {
        return metropolis_proto::json::message_from_json(
            "metropolis.proto.api.NodeParameters",
            &bytes,
        )
        .map_err(|e| usage(format!("{flag}: not a NodeParameters in JSON: {e}")));
    }
    NodeParameters::decode(bytes.as_slice()).map_err(|e| {
        usage(format!(
            "{flag}: neither JSON (starting with {{) nor an encoded NodeParameters: {e}"
        ))
    })
}

#[cfg(test)]
mod tests;
