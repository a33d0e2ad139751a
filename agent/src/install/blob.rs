//! A layer blob as it is received: counted, cut off as soon as it is
//! longer than the manifest says, and resumed with `Range: bytes=<n>-`
//! when its transfer breaks (docs/spec/metropolis-install.md section 1,
//! "an interrupted blob read resumes").
//!
//! What the reader hands out is not trusted: the payload's chunk hashes
//! verify it ([`verify`](super::verify)). A registry that ignores the
//! range and sends the whole blob again (`200`) is read past the bytes
//! already received; any other answer fails the read.

use std::io::{self, Read};

use super::InstallError;
use metropolis_registry::deadline::DeadlinePassed;
use metropolis_registry::{RegistryError, Response, Session, Url};

/// How many times a broken transfer is resumed without a byte of
/// progress in between before the read fails.
pub(super) const MAX_RESUMES_WITHOUT_PROGRESS: u32 = 5;

/// One layer blob, read from the registry.
pub(super) struct BlobReader<'s, 'a> {
    session: &'s mut Session<'a>,
    url: Url,
    response: Option<Response>,
    received: u64,
    size: u64,
    resumes: u32,
    /// Why the read failed, kept for the installation's error (the
    /// decompressor and the verifier see only an `io::Error`).
    failure: Option<InstallError>,
}

impl<'s, 'a> BlobReader<'s, 'a> {
    /// The blob of `size` bytes at `url`, whose first response is
    /// `response` (a `200` the caller checked).
    pub(super) fn new(
        session: &'s mut Session<'a>,
        url: Url,
        response: Response,
        size: u64,
    ) -> Self {
        BlobReader {
            session,
            url,
            response: Some(response),
            received: 0,
            size,
            resumes: 0,
            failure: None,
        }
    }

    /// Why the read failed, if it was the transfer's fault.
    pub(super) fn take_failure(&mut self) -> Option<InstallError> {
        self.failure.take()
    }

    fn fail(&mut self, failure: InstallError) -> io::Error {
        let e = io::Error::other(failure.to_string());
        self.failure = Some(failure);
        e
    }

    /// Asks for the rest of the blob from byte `received`.
    fn resume(&mut self) -> Result<Response, InstallError> {
        let mut response = self.session.get(&self.url, None, Some(self.received))?;
        match response.status {
            206 => {
                let start = response
                    .header("content-range")
                    .and_then(range_start)
                    .ok_or_else(|| {
                        InstallError::from(RegistryError::Protocol {
                            url: response.url.to_string(),
                            problem: "206 without a Content-Range of bytes".to_string(),
                        })
                    })?;
                if start != self.received {
                    return Err(InstallError::from(RegistryError::Protocol {
                        url: response.url.to_string(),
                        problem: format!(
                            "asked for bytes from {}, the registry sent them from {start}",
                            self.received
                        ),
                    }));
                }
            }
            200 => {
                // The whole blob again: skip what was already received.
                let skipped = io::copy(
                    &mut (&mut response.body).take(self.received),
                    &mut io::sink(),
                )
                .map_err(|source| {
                    InstallError::from(RegistryError::Transfer {
                        url: response.url.to_string(),
                        source,
                    })
                })?;
                if skipped != self.received {
                    return Err(InstallError::from(RegistryError::Protocol {
                        url: response.url.to_string(),
                        problem: format!(
                            "resent the blob from its start, {skipped} bytes long, shorter \
                             than the {} already received",
                            self.received
                        ),
                    }));
                }
            }
            _ => return Err(RegistryError::status(response).into()),
        }
        Ok(response)
    }
}

/// The first byte of a `Content-Range: bytes <first>-<last>/<size>`.
fn range_start(value: &str) -> Option<u64> {
    let range = value.trim().strip_prefix("bytes ")?;
    range.split_once('-')?.0.trim().parse().ok()
}

impl Read for BlobReader<'_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(failure) = &self.failure {
            return Err(io::Error::other(failure.to_string()));
        }
        if buf.is_empty() || self.received >= self.size {
            // Nothing more is wanted: bytes past the payload's size are
            // never read.
            return Ok(0);
        }
        loop {
            let response = match &mut self.response {
                Some(response) => response,
                None => match self.resume() {
                    Ok(response) => self.response.insert(response),
                    Err(failure) => return Err(self.fail(failure)),
                },
            };
            let want = buf.len().min((self.size - self.received) as usize);
            match response.body.read(&mut buf[..want]) {
                Ok(0) => {}
                Ok(read) => {
                    self.received += read as u64;
                    self.resumes = 0;
                    return Ok(read);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // A deadline that passed is not a broken transfer: the
                // registry is too slow, and a resume would get it a new
                // deadline.
                Err(e)
                    if self.resumes >= MAX_RESUMES_WITHOUT_PROGRESS
                        || e.get_ref()
                            .is_some_and(|inner| inner.is::<DeadlinePassed>()) =>
                {
                    let url = response.url.to_string();
                    return Err(self.fail(InstallError::from(RegistryError::Transfer {
                        url,
                        source: e,
                    })));
                }
                Err(e) => {
                    tracing::info!(
                        url = %self.url,
                        received = self.received,
                        "layer transfer broke ({e}); resuming from where it stopped"
                    );
                }
            }
            // The body ended early or broke: ask for the rest.
            self.response = None;
            if self.resumes >= MAX_RESUMES_WITHOUT_PROGRESS {
                return Ok(0);
            }
            self.resumes += 1;
            std::thread::sleep(self.session.retry_delay(self.resumes - 1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::range_start;

    #[test]
    fn content_ranges() {
        assert_eq!(range_start("bytes 100-199/200"), Some(100));
        assert_eq!(range_start(" bytes 0-0/*"), Some(0));
        assert_eq!(range_start("bytes */200"), None);
        assert_eq!(range_start("items 1-2/3"), None);
    }
}
