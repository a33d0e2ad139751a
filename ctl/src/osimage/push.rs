//! `metroctl osimage push`: an image layout's blobs and manifest uploaded
//! through the OCI distribution API. Blobs the registry has (HEAD) are
//! skipped; the others go up monolithically (POST an upload, PUT the
//! bytes with `?digest=`), streamed from disk; then the manifest is PUT by
//! tag, or by digest without one.

use std::path::Path;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use http_body_util::{BodyExt as _, StreamBody};
use hyper::body::{Frame, Incoming};
use tokio::io::AsyncReadExt as _;

use super::auth::{self, Login, parse_challenge};
use super::format::{Descriptor, MANIFEST_MEDIA_TYPE, quoted};
use super::http::{Body, Client, error_text, full};
use super::layout::Layout;
use super::reference::Reference;
use crate::CliError;
use crate::exit::{Exit, failed};

/// What a push did.
#[derive(Debug)]
pub struct Pushed {
    /// `scheme://host/repository@sha256:<hex>`: what `metroctl install
    /// request --image` takes.
    pub image: String,
    /// The manifest's digest.
    pub digest: String,
    /// Blobs uploaded.
    pub uploaded: usize,
    /// Blobs the registry already had.
    pub skipped: usize,
}

/// A registry session: its base URL, the repository and the current
/// `Authorization` value.
struct Session {
    client: Client,
    base: String,
    repository: String,
    login: Option<Login>,
    authorization: Option<HeaderValue>,
}

impl Session {
    fn url(&self, path: &str) -> String {
        format!("{}/v2/{}/{path}", self.base, self.repository)
    }

    /// Sends a request; the login goes only to the registry itself.
    async fn send_once(
        &self,
        method: &Method,
        url: &str,
        mut headers: HeaderMap,
        body: Body,
    ) -> Result<http::Response<Incoming>, CliError> {
        if let Some(value) = &self.authorization
            && url.starts_with(&format!("{}/", self.base))
        {
            headers.insert(header::AUTHORIZATION, value.clone());
        }
        self.client.send(method.clone(), url, headers, body).await
    }

    /// Sends a request with a body that can be sent again: a `401` is
    /// answered (a login, a token) and the request sent once more.
    async fn send(
        &mut self,
        method: Method,
        url: &str,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<http::Response<Incoming>, CliError> {
        let response = self
            .send_once(&method, url, headers.clone(), full(body.clone()))
            .await?;
        if response.status() != StatusCode::UNAUTHORIZED {
            return Ok(response);
        }
        let challenge = response
            .headers()
            .get(header::WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_challenge)
            .ok_or_else(|| {
                failed(
                    Exit::Denied,
                    format!(
                        "{} answered 401 without a Basic or Bearer challenge",
                        self.base
                    ),
                )
            })?;
        let answer = auth::answer(
            &self.client,
            &self.base,
            &self.repository,
            &challenge,
            self.login.as_ref(),
        )
        .await?;
        let value = HeaderValue::from_str(&answer)
            .map_err(|_| failed(Exit::Failure, "the token is not a header value"))?;
        self.authorization = Some(value);
        self.send_once(&method, url, headers, full(body)).await
    }
}

/// The failure an unexpected answer is, its exit status by its code.
async fn unexpected(what: &str, response: http::Response<Incoming>) -> CliError {
    let status = response.status();
    let exit = match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Exit::Denied,
        StatusCode::NOT_FOUND => Exit::NotFound,
        s if s.is_server_error() => Exit::Unavailable,
        _ => Exit::Failure,
    };
    let hint = if exit == Exit::Denied {
        "; give --registry-auth FILE with a login that may push there"
    } else {
        ""
    };
    let said = error_text(response).await;
    failed(
        exit,
        format!("{what}: the registry answered {status}{said}{hint}"),
    )
}

/// The blob at `path` as a streamed body, counted on `bar`.
async fn file_body(path: &Path, bar: indicatif::ProgressBar) -> Result<Body, CliError> {
    let file = tokio::fs::File::open(path)
        .await
        .map_err(|e| failed(Exit::Failure, format!("{}: {e}", path.display())))?;
    let chunks = futures::stream::unfold(Some(file), move |file| {
        let bar = bar.clone();
        async move {
            let mut file = file?;
            let mut buf = BytesMut::with_capacity(256 << 10);
            match file.read_buf(&mut buf).await {
                Ok(0) => None,
                Ok(n) => {
                    bar.inc(n as u64);
                    Some((Ok(Frame::data(buf.freeze())), Some(file)))
                }
                Err(e) => Some((Err(e), None)),
            }
        }
    });
    Ok(StreamBody::new(chunks).boxed())
}

/// Uploads `blob` unless the registry has it; whether it was uploaded.
async fn blob(
    session: &mut Session,
    layout: &Layout,
    blob: &Descriptor,
    bar: &indicatif::ProgressBar,
) -> Result<bool, CliError> {
    let what = format!("blob {}", blob.digest);
    let head = session.url(&format!("blobs/{}", blob.digest));
    let response = session
        .send(Method::HEAD, &head, HeaderMap::new(), Bytes::new())
        .await?;
    match response.status() {
        StatusCode::OK => {
            bar.inc(blob.size);
            return Ok(false);
        }
        StatusCode::NOT_FOUND => {}
        _ => return Err(unexpected(&what, response).await),
    }
    let start = session.url("blobs/uploads/");
    let response = session
        .send(Method::POST, &start, HeaderMap::new(), Bytes::new())
        .await?;
    if response.status() != StatusCode::ACCEPTED {
        return Err(unexpected(&format!("{what}: starting the upload"), response).await);
    }
    let location = response
        .headers()
        .get(header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let location = if location.starts_with('/') {
        format!("{}{location}", session.base)
    } else if location.starts_with("http://") || location.starts_with("https://") {
        location.to_string()
    } else {
        return Err(failed(
            Exit::Failure,
            format!("{what}: the registry gave no upload location"),
        ));
    };
    let separator = if location.contains('?') { '&' } else { '?' };
    let put = format!("{location}{separator}digest={}", blob.digest);
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(blob.size));
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    let body = file_body(&layout.blob_path(&blob.digest), bar.clone()).await?;
    let response = session.send_once(&Method::PUT, &put, headers, body).await?;
    if response.status() != StatusCode::CREATED {
        return Err(unexpected(&format!("{what}: uploading"), response).await);
    }
    Ok(true)
}

fn progress_bar(total: u64) -> indicatif::ProgressBar {
    use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
    if total < 64 << 20 {
        return ProgressBar::hidden();
    }
    // Drawn only when stderr is a terminal.
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    let template = "{bar:30} {binary_bytes}/{binary_total_bytes} ({percent}%), \
                    {binary_bytes_per_sec}, ETA {eta}";
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar
}

/// Pushes `layout` to `reference`, logging in with the login for its host
/// in `auth_file` (if any), trusting the CA certificates of `ca_file` too;
/// connecting is bounded by `connect_limit`.
pub async fn push(
    layout: &Layout,
    reference: &Reference,
    auth_file: Option<&Path>,
    ca_file: Option<&Path>,
    connect_limit: Duration,
) -> Result<Pushed, CliError> {
    let login = match auth_file {
        Some(path) => auth::read_login(path, &reference.host)?,
        None => None,
    };
    let mut session = Session {
        client: Client::new(ca_file, connect_limit)?,
        base: format!("{}://{}", reference.scheme, reference.host),
        repository: reference.repository.clone(),
        login,
        authorization: None,
    };
    let bar = progress_bar(layout.blobs.iter().map(|b| b.size).sum());
    let (mut uploaded, mut skipped) = (0, 0);
    for descriptor in &layout.blobs {
        let result = blob(&mut session, layout, descriptor, &bar).await;
        match result {
            Ok(true) => uploaded += 1,
            Ok(false) => skipped += 1,
            Err(e) => {
                bar.finish_and_clear();
                return Err(e);
            }
        }
    }
    bar.finish_and_clear();
    let digest = layout.manifest.digest.clone();
    let target = reference.tag.as_deref().unwrap_or(&digest);
    let url = session.url(&format!("manifests/{target}"));
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(MANIFEST_MEDIA_TYPE),
    );
    let body = Bytes::from(layout.manifest_bytes.clone());
    let response = session.send(Method::PUT, &url, headers, body).await?;
    if response.status() != StatusCode::CREATED {
        return Err(unexpected(&format!("manifest {}", quoted(target)), response).await);
    }
    if let Some(said) = response
        .headers()
        .get("docker-content-digest")
        .and_then(|v| v.to_str().ok())
        && said != digest
    {
        return Err(failed(
            Exit::Failure,
            format!(
                "the registry stored the manifest as {}, not {digest}",
                quoted(said)
            ),
        ));
    }
    Ok(Pushed {
        image: format!("{}/{}@{digest}", session.base, reference.repository),
        digest,
        uploaded,
        skipped,
    })
}
