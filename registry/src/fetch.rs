//! Fetching a small document whole (a manifest, a config): the request
//! and the reading of its body are one try, so a connection that breaks
//! in the body is tried again too, as the reference's client does.

use crate::auth::Session;
use crate::error::RegistryError;
use crate::http::{Response, Url};

/// What [`Session::get_whole`] got.
pub enum Whole {
    /// `200`, and the body, at most the limit.
    Body {
        /// The response (its body read).
        response: Response,
        /// The body.
        bytes: Vec<u8>,
    },
    /// `200`, and a body longer than the limit (not read).
    TooLarge(Response),
    /// Another status: the response, its body unread.
    Status(Response),
}

impl Session<'_> {
    /// `GET url` and its whole body, at most `limit` bytes; a transfer
    /// that breaks in the body is tried again as the client's retry
    /// policy says, within the session's deadline.
    pub fn get_whole(
        &mut self,
        url: &Url,
        accept: Option<&str>,
        limit: u64,
    ) -> Result<Whole, RegistryError> {
        let policy = self.client.retry;
        let mut attempt = 0u32;
        loop {
            let mut response = self.get(url, accept, None)?;
            if response.status != 200 {
                return Ok(Whole::Status(response));
            }
            let source = match response.read_body(limit) {
                Ok(Some(bytes)) => return Ok(Whole::Body { response, bytes }),
                Ok(None) => return Ok(Whole::TooLarge(response)),
                Err(source) => source,
            };
            let failed = RegistryError::Transfer {
                url: response.url.to_string(),
                source,
            };
            if attempt >= policy.retries
                || !self.pause_before_retry(url, policy.delay(attempt), || failed.to_string())
            {
                return Err(failed);
            }
            attempt = attempt.saturating_add(1);
        }
    }
}
