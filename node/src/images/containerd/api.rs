//! containerd's gRPC API as the store calls it: one connection per
//! import, the namespace and lease headers on every request, and each
//! call's failure as an [`ImageStoreError`] naming the call.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

use metropolis_proto::containerd::services::content::v1 as content;
use metropolis_proto::containerd::services::images::v1 as images;
use metropolis_proto::containerd::services::leases::v1 as leases;
use metropolis_proto::containerd::types;
use metropolis_service::images::{ImageStoreError, ListedImage};
use metropolis_transport::grpc::Channel;
use metropolis_transport::runtime::SharedRuntime;
use tonic::metadata::AsciiMetadataValue;

use content::content_client::ContentClient;
use images::images_client::ImagesClient;
use leases::leases_client::LeasesClient;

/// The header naming the namespace of a request.
const NAMESPACE_HEADER: &str = "containerd-namespace";
/// The header naming the lease a request's content and ingests join.
const LEASE_HEADER: &str = "containerd-lease";
/// The label after which containerd's garbage collector removes a lease
/// (an RFC 3339 time).
const LABEL_GC_EXPIRE: &str = "containerd.io/gc.expire";
/// The label naming the store that created a lease: the store's state
/// directory, which one store holds locked at a time.
pub(super) const LABEL_OWNER: &str = "io.metropolis.image-store";
/// How long a lease outlives a crash of its store: an import's content is
/// kept that long if the store never comes back to remove it.
const LEASE_EXPIRY: Duration = Duration::from_secs(24 * 3600);
/// Most bytes of a containerd error message quoted.
const MAX_MESSAGE: usize = 512;

/// A connection to containerd in one namespace, optionally under a lease.
#[derive(Clone)]
pub(super) struct Api {
    channel: Channel,
    namespace: AsciiMetadataValue,
    lease: Option<AsciiMetadataValue>,
}

impl Api {
    /// Connects to containerd's socket, within `timeout` (connection and
    /// HTTP/2 handshake).
    pub(super) async fn connect(
        runtime: &SharedRuntime,
        socket: &Path,
        namespace: &AsciiMetadataValue,
        timeout: Duration,
    ) -> Result<Api, ImageStoreError> {
        let connect = metropolis_transport::connect::unix(runtime, socket);
        let sleep = runtime.timer().sleep(timeout);
        futures::pin_mut!(connect);
        let channel = match futures::future::select(connect, sleep).await {
            futures::future::Either::Left((Ok(channel), _)) => channel,
            futures::future::Either::Left((Err(e), _)) => {
                return Err(ImageStoreError::Unavailable(format!(
                    "cannot reach containerd: {e}"
                )));
            }
            futures::future::Either::Right(_) => {
                return Err(ImageStoreError::Unavailable(format!(
                    "cannot reach containerd at {}: no connection within {timeout:?}",
                    socket.display()
                )));
            }
        };
        Ok(Api {
            channel,
            namespace: namespace.clone(),
            lease: None,
        })
    }

    /// The same connection, its requests under the lease `id`.
    pub(super) fn under_lease(&self, id: &str) -> Result<Api, ImageStoreError> {
        let lease = AsciiMetadataValue::try_from(id)
            .map_err(|_| ImageStoreError::Unavailable(format!("lease id {id:?} is not ASCII")))?;
        Ok(Api {
            lease: Some(lease),
            ..self.clone()
        })
    }

    /// `message` with the namespace (and lease) headers.
    pub(super) fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        let headers = request.metadata_mut();
        headers.insert(NAMESPACE_HEADER, self.namespace.clone());
        if let Some(lease) = &self.lease {
            headers.insert(LEASE_HEADER, lease.clone());
        }
        request
    }

    pub(super) fn content(&self) -> ContentClient<Channel> {
        ContentClient::with_origin(self.channel.clone(), Channel::origin())
            .max_decoding_message_size(16 * 1024 * 1024)
    }

    fn images(&self) -> ImagesClient<Channel> {
        ImagesClient::with_origin(self.channel.clone(), Channel::origin())
            .max_decoding_message_size(64 * 1024 * 1024)
    }

    fn leases(&self) -> LeasesClient<Channel> {
        LeasesClient::with_origin(self.channel.clone(), Channel::origin())
    }

    /// The names of every image in the namespace.
    pub(super) async fn image_names(&self) -> Result<Vec<String>, ImageStoreError> {
        Ok(self
            .listed_images()
            .await?
            .into_iter()
            .map(|i| i.name)
            .collect())
    }

    /// Every image in the namespace: its name and target.
    pub(super) async fn listed_images(&self) -> Result<Vec<ListedImage>, ImageStoreError> {
        let listed = self
            .images()
            .list(self.request(images::ListImagesRequest::default()))
            .await
            .map_err(|s| failed("listing images", &s))?;
        Ok(listed
            .into_inner()
            .images
            .into_iter()
            .map(|i| {
                let target = i.target.unwrap_or_default();
                ListedImage {
                    name: i.name,
                    digest: target.digest,
                    media_type: target.media_type,
                    size: u64::try_from(target.size).unwrap_or(0),
                }
            })
            .collect())
    }

    /// Points the image `name` at `target`, creating it if it does not
    /// exist (as `ctr images import` does).
    pub(super) async fn put_image(
        &self,
        name: &str,
        target: types::Descriptor,
    ) -> Result<(), ImageStoreError> {
        let image = images::Image {
            name: name.to_owned(),
            target: Some(target),
            ..Default::default()
        };
        let update = images::UpdateImageRequest {
            image: Some(image.clone()),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["target".to_owned()],
            }),
        };
        match self.images().update(self.request(update)).await {
            Ok(_) => return Ok(()),
            Err(s) if s.code() == tonic::Code::NotFound => {}
            Err(s) => return Err(failed(&format!("updating image {name}"), &s)),
        }
        let create = images::CreateImageRequest { image: Some(image) };
        self.images()
            .create(self.request(create))
            .await
            .map_err(|s| failed(&format!("creating image {name}"), &s))?;
        Ok(())
    }

    /// Sets `labels` on the committed blob `digest`, leaving its other
    /// labels alone.
    pub(super) async fn set_labels(
        &self,
        digest: &str,
        labels: HashMap<String, String>,
    ) -> Result<(), ImageStoreError> {
        let paths = labels.keys().map(|k| format!("labels.{k}")).collect();
        let update = content::UpdateRequest {
            info: Some(content::Info {
                digest: digest.to_owned(),
                labels,
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask { paths }),
        };
        self.content()
            .update(self.request(update))
            .await
            .map_err(|s| failed(&format!("labelling blob {digest}"), &s))?;
        Ok(())
    }

    /// Creates the lease `id`, expiring after [`LEASE_EXPIRY`], owned by
    /// `owner`.
    pub(super) async fn create_lease(&self, id: &str, owner: &str) -> Result<(), ImageStoreError> {
        let expire = prost_types::Timestamp::from(SystemTime::now() + LEASE_EXPIRY);
        let labels = HashMap::from([
            (LABEL_GC_EXPIRE.to_owned(), expire.to_string()),
            (LABEL_OWNER.to_owned(), owner.to_owned()),
        ]);
        let create = leases::CreateRequest {
            id: id.to_owned(),
            labels,
        };
        self.leases()
            .create(self.request(create))
            .await
            .map_err(|s| failed("creating a lease", &s))?;
        Ok(())
    }

    /// Deletes the lease `id`; with `sync`, returns once containerd has
    /// collected what only the lease held.
    pub(super) async fn delete_lease(&self, id: &str, sync: bool) -> Result<(), ImageStoreError> {
        let delete = leases::DeleteRequest {
            id: id.to_owned(),
            sync,
        };
        match self.leases().delete(self.request(delete)).await {
            Ok(_) => Ok(()),
            Err(s) if s.code() == tonic::Code::NotFound => Ok(()),
            Err(s) => Err(failed(&format!("deleting lease {id}"), &s)),
        }
    }

    /// Puts the committed blob `digest` under the lease `id` (a blob that
    /// existed before the import is then kept until the image holds it).
    pub(super) async fn lease_blob(&self, id: &str, digest: &str) -> Result<(), ImageStoreError> {
        let add = leases::AddResourceRequest {
            id: id.to_owned(),
            resource: Some(leases::Resource {
                id: digest.to_owned(),
                r#type: "content".to_owned(),
            }),
        };
        self.leases()
            .add_resource(self.request(add))
            .await
            .map_err(|s| failed(&format!("leasing blob {digest}"), &s))?;
        Ok(())
    }

    /// The ids of the leases `owner` created.
    pub(super) async fn leases_of(&self, owner: &str) -> Result<Vec<String>, ImageStoreError> {
        let listed = self
            .leases()
            .list(self.request(leases::ListRequest::default()))
            .await
            .map_err(|s| failed("listing leases", &s))?;
        Ok(listed
            .into_inner()
            .leases
            .into_iter()
            .filter(|l| l.labels.get(LABEL_OWNER).map(String::as_str) == Some(owner))
            .map(|l| l.id)
            .collect())
    }
}

/// A failed call: Unavailable, naming what was being done, with
/// containerd's code and (a bounded prefix of) its message.
pub(super) fn failed(what: &str, status: &tonic::Status) -> ImageStoreError {
    let message = status.message();
    let cut = (0..=MAX_MESSAGE.min(message.len()))
        .rev()
        .find(|&i| message.is_char_boundary(i))
        .unwrap_or(0);
    ImageStoreError::Unavailable(format!(
        "containerd, {what}: {:?}: {}",
        status.code(),
        &message[..cut]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_name_the_call_and_bound_the_message() {
        let long = "é".repeat(1000);
        let ImageStoreError::Unavailable(m) =
            failed("listing images", &tonic::Status::internal(long))
        else {
            panic!("not Unavailable");
        };
        assert!(
            m.starts_with("containerd, listing images: Internal: é"),
            "{m}"
        );
        assert!(m.len() < MAX_MESSAGE + 64, "{}", m.len());
    }
}
