//! What is retried and when: which failures are worth another attempt
//! (the spec's "request can be retried": Unavailable; a connection that
//! could not be made or broke), and the wait before it (exponential
//! backoff with jitter, capped; the next endpoint at once while some are
//! untried).

use std::time::Duration;

use crate::error::AttemptError;

/// How long to wait between attempts: `base`, doubling per consecutive
/// failure up to `cap`, each wait drawn uniformly from its upper half
/// (so a fleet that failed together does not retry in lockstep), from a
/// generator seeded with `seed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first wait (before jitter).
    pub base: Duration,
    /// The longest wait.
    pub cap: Duration,
    /// The jitter generator's seed: each call and view of a client draws
    /// from its own stream derived from it, so runs with one seed wait
    /// alike.
    pub seed: u64,
}

impl Default for Backoff {
    /// 100 ms doubling to 5 s, seeded from the clock and the process ID.
    fn default() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(5),
            seed: nanos ^ u64::from(std::process::id()).rotate_left(32),
        }
    }
}

/// SplitMix64: a small, well-mixed generator for jitter (not for secrets).
#[derive(Debug, Clone)]
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// The waits of one call or one view: how many endpoints were tried since
/// the last wait, how many waits in a row.
#[derive(Debug, Clone)]
pub(crate) struct Schedule {
    backoff: Backoff,
    rng: SplitMix,
    endpoints: usize,
    untried: usize,
    waits: u32,
}

impl Schedule {
    /// A schedule over `endpoints` endpoints; `stream` selects its jitter
    /// stream among those of `backoff.seed`.
    pub(crate) fn new(backoff: Backoff, endpoints: usize, stream: u64) -> Schedule {
        let mut rng = SplitMix(backoff.seed ^ stream.wrapping_mul(0xa076_1d64_78bd_642f));
        rng.next();
        Schedule {
            backoff,
            rng,
            endpoints: endpoints.max(1),
            untried: endpoints.max(1),
            waits: 0,
        }
    }

    /// The wait before the next attempt after `failure`. A failure to
    /// reach an endpoint moves on to the next one at once, until each was
    /// tried once; any other failure, or a whole round of them, waits.
    pub(crate) fn after(&mut self, failure: &AttemptError) -> Duration {
        self.untried = self.untried.saturating_sub(1);
        if unreachable(failure) && self.untried > 0 {
            return Duration::ZERO;
        }
        self.untried = self.endpoints;
        let ceiling = self
            .backoff
            .base
            .saturating_mul(1u32 << self.waits.min(20))
            .min(self.backoff.cap);
        self.waits = self.waits.saturating_add(1);
        let half = ceiling / 2;
        let nanos = half.as_nanos() as u64;
        let extra = if nanos == 0 {
            0
        } else {
            self.rng.next() % (nanos + 1)
        };
        half + Duration::from_nanos(extra)
    }

    /// Forgets the failures: the next one waits `base` again.
    pub(crate) fn reset(&mut self) {
        self.untried = self.endpoints;
        self.waits = 0;
    }
}

/// Whether `failure` means the endpoint could not be reached at all (so
/// another endpoint is worth trying without waiting).
fn unreachable(failure: &AttemptError) -> bool {
    matches!(
        failure,
        AttemptError::Connect { .. }
            | AttemptError::Broken { sent: false, .. }
            | AttemptError::Misconfigured { .. }
    )
}

/// Whether a unary call that failed with `failure` may be tried again.
///
/// Yes for: a connection that could not be made or broke before the
/// request was sent; Unavailable (the curator's "curator backend switched,
/// request can be retried", "no curator leader", "lost leadership",
/// "curator shutting down", a failed store); Aborted (a compare-and-swap
/// lost too often in a row, "request can be retried"); an attempt that
/// timed out or came back DeadlineExceeded while the caller's deadline
/// still allows another. And, for idempotent calls only, a connection that
/// broke after the request was sent (it may have been applied).
///
/// A misconfigured endpoint is worth trying no more within the call, but
/// the others are: [`Misconfigured::all`] says when none is left.
pub(crate) fn retryable_call(failure: &AttemptError, resend: Resend) -> bool {
    use tonic::Code;
    let may_resend = resend == Resend::Always;
    match failure {
        AttemptError::Connect { .. } | AttemptError::Misconfigured { .. } => true,
        // The request may be sitting in a curator that stopped: it may
        // still be applied after this call returns.
        AttemptError::TimedOut { .. } => may_resend,
        AttemptError::Broken { sent, .. } => !sent || may_resend,
        // What a curator answers without having applied the call (no
        // leader, the role switched, too many conflicts), or, for
        // DeadlineExceeded, maybe after.
        AttemptError::Status { code, .. } => match code {
            Code::Unavailable | Code::Aborted => true,
            Code::DeadlineExceeded => may_resend,
            _ => false,
        },
    }
}

/// The endpoints one call found misconfigured: once every endpoint is,
/// the call ends at once rather than retrying what no retry fixes.
#[derive(Debug, Clone)]
pub(crate) struct Misconfigured {
    endpoints: Vec<bool>,
}

impl Misconfigured {
    /// None of `endpoints` endpoints yet.
    pub(crate) fn new(endpoints: usize) -> Misconfigured {
        Misconfigured {
            endpoints: vec![false; endpoints.max(1)],
        }
    }

    /// Records the failure of an attempt on endpoint `index`.
    pub(crate) fn record(&mut self, index: usize, failure: &AttemptError) {
        let len = self.endpoints.len();
        self.endpoints[index % len] = matches!(failure, AttemptError::Misconfigured { .. });
    }

    /// Whether the last failure of every endpoint was a misconfiguration.
    pub(crate) fn all(&self) -> bool {
        self.endpoints.iter().all(|&m| m)
    }
}

/// Whether a call may be sent again once an attempt's request may have
/// reached a curator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resend {
    /// Yes: a late copy does no harm (a heartbeat).
    Always,
    /// Only what provably never reached one: a copy held by a paused
    /// curator could be applied after a later call of the same caller,
    /// undoing it (a status update).
    Unsent,
}

/// Whether a watch that failed with `failure` ends for good: only
/// refusals that no reconnect can change (the credential, the request).
pub(crate) fn ends_view(failure: &AttemptError) -> bool {
    use tonic::Code;
    matches!(
        failure,
        AttemptError::Status {
            code: Code::InvalidArgument
                | Code::PermissionDenied
                | Code::Unauthenticated
                | Code::Unimplemented
                | Code::NotFound
                | Code::FailedPrecondition
                | Code::OutOfRange,
            ..
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: tonic::Code) -> AttemptError {
        AttemptError::Status {
            endpoint: "e".into(),
            code,
            message: "m".into(),
        }
    }

    fn refused() -> AttemptError {
        AttemptError::Connect {
            endpoint: "e".into(),
            reason: "refused".into(),
        }
    }

    #[test]
    fn unreachable_endpoints_are_skipped_at_once_until_a_round_is_done() {
        let backoff = Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_millis(400),
            seed: 7,
        };
        let mut s = Schedule::new(backoff, 3, 0);
        assert_eq!(s.after(&refused()), Duration::ZERO);
        assert_eq!(s.after(&refused()), Duration::ZERO);
        // The third endpoint failed too: a whole round, so a wait.
        let first = s.after(&refused());
        assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
        // Doubling, capped, each in its upper half.
        let mut ceilings = Vec::new();
        for _ in 0..4 {
            let d = s.after(&status(tonic::Code::Unavailable));
            ceilings.push(d);
        }
        assert!(
            ceilings[0] >= Duration::from_millis(100) && ceilings[0] <= Duration::from_millis(200)
        );
        for d in &ceilings[1..] {
            assert!(
                *d >= Duration::from_millis(200) && *d <= Duration::from_millis(400),
                "{d:?}"
            );
        }
        s.reset();
        assert_eq!(s.after(&refused()), Duration::ZERO);
    }

    #[test]
    fn jitter_streams_differ_and_repeat_with_their_seed() {
        let backoff = Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(1),
            seed: 42,
        };
        let waits = |stream| {
            let mut s = Schedule::new(backoff, 1, stream);
            (0..8)
                .map(|_| s.after(&status(tonic::Code::Unavailable)))
                .collect::<Vec<_>>()
        };
        assert_eq!(waits(1), waits(1));
        assert_ne!(waits(1), waits(2));
    }

    #[test]
    fn what_is_retried() {
        use Resend::{Always, Unsent};
        use tonic::Code;
        assert!(retryable_call(&status(Code::Unavailable), Unsent));
        assert!(retryable_call(&status(Code::Aborted), Unsent));
        assert!(retryable_call(&refused(), Unsent));
        assert!(!retryable_call(&status(Code::PermissionDenied), Always));
        assert!(!retryable_call(&status(Code::InvalidArgument), Always));
        assert!(!retryable_call(&status(Code::Internal), Always));
        assert!(retryable_call(&status(Code::DeadlineExceeded), Always));
        assert!(!retryable_call(&status(Code::DeadlineExceeded), Unsent));
        let timed_out = AttemptError::TimedOut {
            endpoint: "e".into(),
            after: std::time::Duration::from_secs(1),
        };
        assert!(retryable_call(&timed_out, Always));
        assert!(!retryable_call(&timed_out, Unsent));
        let broken = |sent| AttemptError::Broken {
            endpoint: "e".into(),
            reason: "r".into(),
            sent,
        };
        assert!(retryable_call(&broken(false), Unsent));
        assert!(!retryable_call(&broken(true), Unsent));
        assert!(retryable_call(&broken(true), Always));

        assert!(ends_view(&status(Code::Unauthenticated)));
        assert!(ends_view(&status(Code::PermissionDenied)));
        assert!(!ends_view(&status(Code::Unavailable)));
        assert!(!ends_view(&status(Code::Unknown)));
        assert!(!ends_view(&broken(true)));
    }

    #[test]
    fn a_call_ends_once_every_endpoint_is_misconfigured() {
        let bad = AttemptError::Misconfigured {
            endpoint: "e".into(),
            problem: crate::Misconfiguration::UntrustedServer,
            reason: "invalid peer certificate: BadSignature".into(),
        };
        let mut seen = Misconfigured::new(2);
        seen.record(0, &bad);
        assert!(!seen.all(), "endpoint 1 is untried");
        seen.record(1, &refused());
        assert!(!seen.all(), "endpoint 1 may come back");
        seen.record(1, &bad);
        assert!(seen.all());
        // The next endpoint at once, as for an unreachable one.
        let mut s = Schedule::new(Backoff::default(), 2, 0);
        assert_eq!(s.after(&bad), Duration::ZERO);
        let mut one = Misconfigured::new(1);
        one.record(0, &bad);
        assert!(one.all());
    }
}
