//! `metroctl images`: what the node's image store holds, through the
//! project's `NodeImages` extension served beside NodeDebugService on the
//! debug listener (plain HTTP/2, no credentials; see docs/debug.md).

use clap::Args;
use metropolis_proto::metropolis::node::core::curator::proto::private::{
    ListImagesRequest, ListImagesResponse, node_images_client::NodeImagesClient,
};
use metropolis_transport::grpc::Channel;

use crate::exit::{Exit, failed};
use crate::output::{Format, emit, print_table};
use crate::{CliError, status_error};

/// `metroctl images`.
#[derive(Args, Debug)]
#[command(
    after_help = "Lists the embedded OCI image layout (<data-dir>/images) or, on a node \
    started with --containerd-socket, containerd's namespace: what `metroctl load-image` \
    imported, and whatever else the store holds."
)]
pub struct ImagesArgs {
    /// One JSON object: the store and its images.
    #[arg(long)]
    json: bool,
}

/// The listing as one JSON object.
fn json(listing: &ListImagesResponse) -> serde_json::Value {
    let images: Vec<_> = listing
        .image
        .iter()
        .map(|i| {
            serde_json::json!({
                "name": (!i.name.is_empty()).then_some(&i.name),
                "digest": i.digest,
                "media_type": i.media_type,
                "size": i.size,
            })
        })
        .collect();
    serde_json::json!({ "store": listing.store, "images": images })
}

/// `metroctl images`.
pub async fn images(endpoint: &str, args: ImagesArgs, format: Format) -> Result<(), CliError> {
    let channel = super::channel(endpoint).await?;
    let listing = NodeImagesClient::with_origin(channel, Channel::origin())
        .max_decoding_message_size(64 * 1024 * 1024)
        .list_images(ListImagesRequest {})
        .await
        .map_err(|status| {
            if status.code() == tonic::Code::Unimplemented {
                return failed(
                    Exit::Failure,
                    format!(
                        "the node at {endpoint} does not list its images (its debug service \
                         has no NodeImages: another implementation, or an older metropolisd)"
                    ),
                );
            }
            status_error(status)
        })?
        .into_inner();
    let format = format.or_json(args.json);
    if format.structured() {
        emit(&json(&listing), format);
        return Ok(());
    }
    let wide = format == Format::Wide;
    let mut header = vec!["NAME", "DIGEST", "SIZE"];
    if wide {
        header.push("MEDIA TYPE");
    }
    let rows: Vec<Vec<String>> = listing
        .image
        .iter()
        .map(|i| {
            let name = if i.name.is_empty() {
                "<none>".to_owned()
            } else {
                i.name.clone()
            };
            let mut row = vec![name, i.digest.clone(), i.size.to_string()];
            if wide {
                row.push(i.media_type.clone());
            }
            row
        })
        .collect();
    if !rows.is_empty() {
        print_table(&header, &rows);
    }
    outln!("{} image(s) in {}", listing.image.len(), listing.store);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use metropolis_proto::metropolis::node::core::curator::proto::private::StoredImage;

    #[test]
    fn unnamed_images_have_a_null_name_in_json() {
        let listing = ListImagesResponse {
            image: vec![
                StoredImage {
                    name: "docker.io/library/busybox:latest".into(),
                    digest: "sha256:ab".into(),
                    media_type: "application/vnd.oci.image.manifest.v1+json".into(),
                    size: 7,
                },
                StoredImage {
                    digest: "sha256:cd".into(),
                    ..Default::default()
                },
            ],
            store: "OCI image layout /d/images".into(),
        };
        let value = json(&listing);
        assert_eq!(value["store"], "OCI image layout /d/images");
        assert_eq!(
            value["images"][0]["name"],
            "docker.io/library/busybox:latest"
        );
        assert_eq!(value["images"][0]["size"], 7);
        assert!(value["images"][1]["name"].is_null());
    }
}
