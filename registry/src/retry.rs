//! Trying a registry request again: which failures are worth another try,
//! and how long to wait before it (docs/spec/metropolis-install.md
//! section 1, "Registry I/O").
//!
//! Retried: connections that could not be made or broke, and the statuses
//! a registry or a proxy in front of it gives for a passing condition:
//! 408, 425, 429, 499 and every 5xx but 501 (not implemented), 505
//! (version not supported) and 511 (network authentication required),
//! which no retry fixes. Waits double from [`RetryPolicy::first_delay`]
//! up to [`RetryPolicy::max_delay`]; a `Retry-After` (seconds or an HTTP
//! date, up to [`MAX_RETRY_AFTER`]) lengthens the wait to what it asks.

use std::time::{Duration, SystemTime};

use crate::error::RegistryError;
use crate::http::Response;

/// The longest `Retry-After` honoured: a registry asking for more gets
/// this much.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(120);

/// How often and how patiently requests are tried again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Tries after the first; 0 never tries again.
    pub retries: u32,
    /// The wait before the first retry.
    pub first_delay: Duration,
    /// The longest wait between two tries (a `Retry-After` aside).
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    /// Four retries, waiting 0.5 s, 1 s, 2 s and 4 s: a registry that is
    /// down fails a request within about 8 s. For callers without a
    /// deadline of their own; the agent's installer uses
    /// [`RetryPolicy::until_deadline`] within its installation limit.
    fn default() -> Self {
        RetryPolicy {
            retries: 4,
            first_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// Tries again for as long as the caller's deadline allows (a
    /// [`Session`](crate::Session) `within` one), waiting 0.5 s, 1 s,
    /// 2 s, ... up to 30 s: the reference's installer keeps trying until
    /// its installation limit.
    pub const fn until_deadline() -> Self {
        RetryPolicy {
            retries: u32::MAX,
            first_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
        }
    }

    /// The wait before retry `attempt` (from 0) without a `Retry-After`.
    pub fn delay(&self, attempt: u32) -> Duration {
        self.first_delay
            .saturating_mul(1u32 << attempt.min(20))
            .min(self.max_delay)
    }
}

/// Whether a registry answering `status` may answer otherwise later.
pub fn retryable_status(status: u16) -> bool {
    matches!(status, 408 | 425 | 429 | 499)
        || ((500..600).contains(&status) && !matches!(status, 501 | 505 | 511))
}

/// The wait a `Retry-After` value asks for, seen at `now`: delay-seconds
/// or an HTTP date; `None` when it is neither.
pub fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    let wait = if let Ok(seconds) = value.parse::<u64>() {
        Duration::from_secs(seconds)
    } else {
        let at = httpdate::parse_http_date(value).ok()?;
        at.duration_since(now).unwrap_or(Duration::ZERO)
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

/// The wait before trying again after try `attempt` (from 0) ended in
/// `outcome`, under `policy`; `None` when it is not tried again (it
/// succeeded, failed for good, or the tries are used up). A
/// `Retry-After` lengthens the wait, as the reference's client does
/// (the longer of the two).
pub(crate) fn wait_before_retry(
    policy: &RetryPolicy,
    attempt: u32,
    outcome: &Result<Response, RegistryError>,
) -> Option<Duration> {
    if attempt >= policy.retries {
        return None;
    }
    match outcome {
        Ok(response) if retryable_status(response.status) => {
            let backoff = policy.delay(attempt);
            let asked = response
                .header("retry-after")
                .and_then(|v| retry_after(v, SystemTime::now()));
            Some(asked.map_or(backoff, |asked| asked.max(backoff)))
        }
        Err(e) if e.is_transient() => Some(policy.delay(attempt)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_worth_another_try() {
        for status in [408, 425, 429, 499, 500, 502, 503, 504, 507, 599] {
            assert!(retryable_status(status), "{status}");
        }
        for status in [200, 206, 301, 400, 401, 403, 404, 416, 501, 505, 511] {
            assert!(!retryable_status(status), "{status}");
        }
    }

    #[test]
    fn waits_double_up_to_the_cap() {
        let policy = RetryPolicy::default();
        let waits: Vec<u64> = (0..8).map(|a| policy.delay(a).as_millis() as u64).collect();
        assert_eq!(waits, [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000]);
    }

    #[test]
    fn retry_after_in_seconds_or_as_a_date() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        assert_eq!(retry_after(" 3 ", now), Some(Duration::from_secs(3)));
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after("999999", now), Some(MAX_RETRY_AFTER));
        assert_eq!(retry_after("soon", now), None);
        assert_eq!(retry_after("-1", now), None);
    }
}
