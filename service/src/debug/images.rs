//! `NodeImages.ListImages`: the project's own extension of the debug
//! service, listing what the node's image store holds (what `LoadImage`
//! imported). Served beside `NodeDebugService` on the debug listener, and
//! like it without authorization.

use std::sync::Arc;

use metropolis_proto::metropolis::node::core::curator::proto::private::node_images_server::{
    NodeImages, NodeImagesServer,
};
use metropolis_proto::metropolis::node::core::curator::proto::private::{
    ListImagesRequest, ListImagesResponse, StoredImage,
};
use tonic::{Request, Response, Status};

use crate::images::{ImageStore, ListedImage};

/// The `NodeImages` implementation over a node's image store. Cheap to
/// clone.
#[derive(Clone)]
pub struct ImagesService {
    store: Option<Arc<dyn ImageStore>>,
}

impl std::fmt::Debug for ImagesService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImagesService")
            .field("store", &self.store.as_ref().map(|s| s.describe()))
            .finish()
    }
}

impl ImagesService {
    /// A service listing `store`; None: ListImages fails with
    /// FailedPrecondition, as LoadImage does.
    pub fn new(store: Option<Arc<dyn ImageStore>>) -> ImagesService {
        ImagesService { store }
    }

    /// The tonic server, for [`Router::with_service`](crate::Router::with_service).
    pub fn server(&self) -> NodeImagesServer<ImagesService> {
        NodeImagesServer::new(self.clone())
    }
}

/// The images sorted by name, then digest, as the response carries them.
pub fn listed(mut images: Vec<ListedImage>) -> Vec<StoredImage> {
    images.sort_by(|a, b| (&a.name, &a.digest).cmp(&(&b.name, &b.digest)));
    images
        .into_iter()
        .map(|i| StoredImage {
            name: i.name,
            digest: i.digest,
            media_type: i.media_type,
            size: i.size,
        })
        .collect()
}

#[tonic::async_trait]
impl NodeImages for ImagesService {
    async fn list_images(
        &self,
        _request: Request<ListImagesRequest>,
    ) -> Result<Response<ListImagesResponse>, Status> {
        let Some(store) = &self.store else {
            return Err(Status::failed_precondition(
                "no image store is configured on this node",
            ));
        };
        let images = store
            .list()
            .await
            .map_err(|e| crate::status::debug::image_store(&e))?;
        Ok(Response::new(ListImagesResponse {
            image: listed(images),
            store: store.describe(),
        }))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::images::ImageStoreError;

    fn image(name: &str, digest: &str) -> ListedImage {
        ListedImage {
            name: name.to_owned(),
            digest: digest.to_owned(),
            media_type: "application/vnd.oci.image.manifest.v1+json".to_owned(),
            size: 7,
        }
    }

    /// A store that neither imports nor lists.
    struct Mute;

    impl ImageStore for Mute {
        fn begin(&self) -> Result<Box<dyn crate::images::ImageImport>, ImageStoreError> {
            Err(ImageStoreError::Unavailable("mute".to_owned()))
        }
    }

    fn call(service: ImagesService) -> Result<ListImagesResponse, Status> {
        futures::executor::block_on(service.list_images(Request::new(ListImagesRequest {})))
            .map(Response::into_inner)
    }

    #[test]
    fn without_a_store_or_a_listing_the_call_says_why() {
        let e = call(ImagesService::new(None)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(e.message().contains("no image store"), "{e:?}");
        let e = call(ImagesService::new(Some(Arc::new(Mute)))).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unavailable);
        assert!(e.message().contains("cannot list"), "{e:?}");
    }

    #[test]
    fn images_are_sorted_by_name_then_digest() {
        let out = listed(vec![
            image("b:1", "sha256:2"),
            image("a:1", "sha256:9"),
            image("b:1", "sha256:1"),
            image("", "sha256:0"),
        ]);
        let order: Vec<(&str, &str)> = out
            .iter()
            .map(|i| (i.name.as_str(), i.digest.as_str()))
            .collect();
        assert_eq!(
            order,
            [
                ("", "sha256:0"),
                ("a:1", "sha256:9"),
                ("b:1", "sha256:1"),
                ("b:1", "sha256:2")
            ]
        );
    }
}
