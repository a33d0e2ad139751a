//! `metroctl osimage push`: an image layout's blobs and manifest uploaded
//! through the OCI distribution API with the agent's registry client
//! (`metropolis-registry`: logins, retries, deadlines). Blobs the
//! registry has (`HEAD`) are skipped; the others go up monolithically
//! (`POST` an upload, `PUT` the bytes with `?digest=`), streamed from
//! disk, and an upload that fails for a passing reason starts over; then
//! the manifest is `PUT` by tag, or by digest without one.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;

use metropolis_registry::{
    Access, Client, Method, RegistryError, Request, Response, RetryPolicy, Session, Upload, Url,
};

use super::format::{Descriptor, MANIFEST_MEDIA_TYPE, quoted};
use super::layout::Layout;
use super::reference::Reference;
use super::resolve::{registry_client, registry_credentials};
use crate::CliError;
use crate::exit::{Exit, failed, usage};

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

/// How a push tries again: three more times, waiting 0.5 s, 1 s and 2 s
/// (a `Retry-After` replaces the wait): a registry that is down fails the
/// push within about 4 s.
const RETRY: RetryPolicy = RetryPolicy {
    retries: 3,
    first_delay: Duration::from_millis(500),
    max_delay: Duration::from_secs(4),
};

/// How long one socket read or write may take: a registry that stops
/// taking an upload fails it after this.
const IO_TIMEOUT: Duration = Duration::from_secs(60);

/// How long one request may take in all. Uploads of several GiB over a
/// slow link must fit; a stalled one fails by [`IO_TIMEOUT`] first.
const REQUEST_DEADLINE: Duration = Duration::from_secs(6 * 3600);

/// What the push needs: the layout, where to and with what.
pub struct PushPlan<'a> {
    /// The layout to push.
    pub layout: &'a Layout,
    /// Where to.
    pub reference: &'a Reference,
    /// `--registry-auth`: a Docker `config.json` with logins.
    pub auth_file: Option<&'a Path>,
    /// `--registry-ca`: CA certificates to trust besides the system's.
    pub ca_file: Option<&'a Path>,
    /// `--timeout`: how long connecting may take.
    pub connect_limit: Duration,
}

/// What to do when the registry wants another login.
const LOGIN_HINT: &str = "; give --registry-auth FILE with a login that may push there";

/// The failure a registry error is, its exit status by its kind, with
/// what to do about it.
fn registry_failure(what: &str, e: RegistryError, to: &Reference) -> CliError {
    if let RegistryError::PlainHttp { registry } = &e {
        let tag = to.tag.as_ref().map(|t| format!(":{t}")).unwrap_or_default();
        let path = format!("{}{tag}", to.repository);
        return failed(
            Exit::Failure,
            format!(
                "{what}: {} (https is assumed without a scheme)",
                super::resolve::plain_http(registry, &path)
            ),
        );
    }
    let (exit, hint) = match &e {
        RegistryError::Unauthorized { .. } => (Exit::Denied, LOGIN_HINT),
        RegistryError::Status { status, .. } => match status {
            401 | 403 => (Exit::Denied, LOGIN_HINT),
            404 => (Exit::NotFound, ""),
            s if *s >= 500 => (Exit::Unavailable, ""),
            _ => (Exit::Failure, ""),
        },
        RegistryError::Unreachable { .. } => (Exit::Unavailable, ""),
        RegistryError::Tls { .. } => (
            Exit::Failure,
            " (a registry with a private CA needs --registry-ca FILE)",
        ),
        _ => (Exit::Failure, ""),
    };
    failed(exit, format!("{what}: {e}{hint}"))
}

/// An unexpected answer as an error, naming what was being done.
fn unexpected(what: &str, response: Response, to: &Reference) -> CliError {
    registry_failure(what, RegistryError::status(response), to)
}

/// A blob file opened for one try, counted on `bar`.
struct Counted {
    file: File,
    bar: indicatif::ProgressBar,
}

impl Read for Counted {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read(buf)?;
        self.bar.inc(n as u64);
        Ok(n)
    }
}

/// Why one try at an upload failed: what it was doing, and the error.
type TryFailure = (&'static str, RegistryError);

/// One try at uploading `blob`: `POST` an upload, `PUT` the bytes that
/// `open` gives to where the registry said.
fn upload_once(
    session: &mut Session<'_>,
    base: &Url,
    repository: &str,
    blob: &Descriptor,
    open: &(dyn Fn() -> io::Result<Box<dyn Read>> + Sync),
) -> Result<(), TryFailure> {
    const STARTING: &str = "starting the upload";
    let start = url(base, repository, "blobs/uploads/").map_err(|e| (STARTING, e))?;
    let request = Request {
        method: Method::Post,
        ..Request::default()
    };
    let response = session.send(&start, request).map_err(|e| (STARTING, e))?;
    if response.status != 202 {
        return Err((STARTING, RegistryError::status(response)));
    }
    let bad_location = |problem: String| {
        let url = start.to_string();
        (STARTING, RegistryError::Protocol { url, problem })
    };
    let location = match response.header("location") {
        Some(location) if !location.is_empty() => location.to_string(),
        _ => return Err(bad_location("the registry gave no upload location".into())),
    };
    let put = start
        .join(&location)
        .map_err(|problem| bad_location(format!("upload location: {problem}")))?
        .with_query("digest", &blob.digest);
    let request = Request {
        method: Method::Put,
        upload: Some(Upload {
            len: blob.size,
            content_type: "application/octet-stream",
            open,
        }),
        ..Request::default()
    };
    // Once: an upload cut short is started over, not sent again.
    let response = session
        .send_once(&put, request)
        .map_err(|e| ("uploading", e))?;
    if response.status != 201 {
        return Err(("uploading", RegistryError::status(response)));
    }
    Ok(())
}

/// Uploads `blob` unless the registry has it; whether it was uploaded.
fn blob(
    session: &mut Session<'_>,
    base: &Url,
    plan: &PushPlan<'_>,
    blob: &Descriptor,
    bar: &indicatif::ProgressBar,
) -> Result<bool, CliError> {
    let what = format!("blob {}", blob.digest);
    let to = plan.reference;
    let repository = &to.repository;
    let head = url(base, repository, &format!("blobs/{}", blob.digest))
        .map_err(|e| registry_failure(&what, e, to))?;
    let request = Request {
        method: Method::Head,
        ..Request::default()
    };
    let response = session
        .send(&head, request)
        .map_err(|e| registry_failure(&what, e, to))?;
    match response.status {
        200 => {
            bar.inc(blob.size);
            return Ok(false);
        }
        404 => {}
        _ => return Err(unexpected(&what, response, to)),
    }
    let path: PathBuf = plan.layout.blob_path(&blob.digest);
    let start = bar.position();
    let open = || -> io::Result<Box<dyn Read>> {
        // A try after a failed one counts from the blob's start again.
        bar.set_position(start);
        Ok(Box::new(Counted {
            file: File::open(&path)?,
            bar: bar.clone(),
        }))
    };
    let mut attempt = 0;
    loop {
        match upload_once(session, base, repository, blob, &open) {
            Ok(()) => return Ok(true),
            Err((doing, e)) if attempt < RETRY.retries && e.is_retryable() => {
                let wait = RETRY.delay(attempt);
                eprintln!(
                    "metroctl: {what}: {doing}: {e}; starting the upload over in {:.1} s",
                    wait.as_secs_f64()
                );
                std::thread::sleep(wait);
                attempt += 1;
            }
            Err((doing, e)) => {
                return Err(registry_failure(&format!("{what}: {doing}"), e, to));
            }
        }
    }
}

/// `base/v2/<repository>/<path>`.
fn url(base: &Url, repository: &str, path: &str) -> Result<Url, RegistryError> {
    base.with_target(&format!("/v2/{repository}/{path}"))
        .map_err(|problem| RegistryError::Protocol {
            url: base.to_string(),
            problem,
        })
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

/// The client a push uses: for `https`, the system's roots and
/// `--registry-ca`'s.
fn client(plan: &PushPlan<'_>) -> Result<Client, CliError> {
    let ca: Vec<&Path> = plan.ca_file.into_iter().collect();
    registry_client(
        plan.reference.scheme,
        &ca,
        plan.connect_limit,
        IO_TIMEOUT,
        REQUEST_DEADLINE,
    )
}

/// Pushes `plan.layout` to `plan.reference`, logging in with the login
/// for its host in `plan.auth_file` (if any). Blocking: a few dozen
/// requests, one after the other.
pub fn push(plan: &PushPlan<'_>) -> Result<Pushed, CliError> {
    let credentials = registry_credentials(plan.auth_file)?;
    let client = client(plan)?;
    let reference = plan.reference;
    let to = reference;
    let base = Url::parse(&format!("{}://{}/", reference.scheme, reference.host))
        .map_err(|e| usage(format!("REFERENCE {}: {e}", quoted(&reference.host))))?;
    let notice = |said: &str| eprintln!("metroctl: {said}");
    let mut session = Session::new(
        &client,
        &credentials,
        &base,
        &reference.repository,
        Access::Push,
    )
    .telling(&notice);
    let bar = progress_bar(plan.layout.blobs.iter().map(|b| b.size).sum());
    let (mut uploaded, mut skipped) = (0, 0);
    for descriptor in &plan.layout.blobs {
        match blob(&mut session, &base, plan, descriptor, &bar) {
            Ok(true) => uploaded += 1,
            Ok(false) => skipped += 1,
            Err(e) => {
                bar.finish_and_clear();
                return Err(e);
            }
        }
    }
    bar.finish_and_clear();
    let digest = plan.layout.manifest.digest.clone();
    let target = reference.tag.as_deref().unwrap_or(&digest);
    let what = format!("manifest {}", quoted(target));
    let manifest = url(&base, &reference.repository, &format!("manifests/{target}"))
        .map_err(|e| registry_failure(&what, e, to))?;
    let bytes = &plan.layout.manifest_bytes;
    let open = || -> io::Result<Box<dyn Read>> { Ok(Box::new(io::Cursor::new(bytes.clone()))) };
    let request = Request {
        method: Method::Put,
        upload: Some(Upload {
            len: bytes.len() as u64,
            content_type: MANIFEST_MEDIA_TYPE,
            open: &open,
        }),
        ..Request::default()
    };
    let response = session
        .send(&manifest, request)
        .map_err(|e| registry_failure(&what, e, to))?;
    if response.status != 201 {
        return Err(unexpected(&what, response, to));
    }
    if let Some(said) = response.header("docker-content-digest")
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
        image: format!(
            "{}://{}/{}@{digest}",
            reference.scheme, reference.host, reference.repository
        ),
        digest,
        uploaded,
        skipped,
    })
}
