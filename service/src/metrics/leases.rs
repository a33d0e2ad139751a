//! The election's lease requests, timed at the [`Leases`] port:
//! `metropolis_lease_request_duration_seconds{op}` (grant, keep_alive,
//! revoke) and `metropolis_lease_request_errors_total{op,error}`. A
//! keep-alive is timed from the renewal's request to its answer, so the
//! histogram shows how much of the lease's TTL each renewal costs; a
//! keep-alive error is the lease lost or not renewed in time, the step
//! before this instance stops leading.

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::{Metrics, latency_buckets};
use metropolis_core::ports::{GrantedLease, LeaseRenewal, Leases, MonotonicClock};
use metropolis_core::store::{LeaseId, StoreError};
use metropolis_core::time::Instant;

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    op: &'static str,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    op: &'static str,
    error: &'static str,
}

/// The lease request families.
#[derive(Clone, Debug)]
pub(crate) struct LeaseMetrics {
    duration: Family<OpLabel, Histogram>,
    errors: Family<ErrorLabels, Counter>,
}

impl Default for LeaseMetrics {
    fn default() -> Self {
        LeaseMetrics {
            duration: Family::new_with_constructor(|| Histogram::new(latency_buckets())),
            errors: Family::default(),
        }
    }
}

impl LeaseMetrics {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "metropolis_lease_request_duration_seconds",
            "The election's lease requests by op: grant, keep_alive (one renewal, request to answer), revoke",
            self.duration.clone(),
        );
        registry.register(
            "metropolis_lease_request_errors",
            "Lease requests that failed, by op and error (keep_alive: the lease lost or not renewed in time)",
            self.errors.clone(),
        );
    }

    fn observe(&self, op: &'static str, sent_at: Instant, now: Instant) {
        let took = now.saturating_duration_since(sent_at);
        self.duration
            .get_or_create(&OpLabel { op })
            .observe(took.as_secs_f64());
    }

    fn failed(&self, op: &'static str, e: &StoreError) {
        let error = super::kv::error_name(e);
        self.errors.get_or_create(&ErrorLabels { op, error }).inc();
    }
}

/// [`Leases`] that time every request they pass to the ones inside.
pub struct MeteredLeases {
    inner: Arc<dyn Leases>,
    clock: Arc<dyn MonotonicClock>,
    metrics: LeaseMetrics,
}

impl MeteredLeases {
    /// Passes every request to `inner`, recording into `metrics`. `clock`
    /// is the one `inner` stamps `sent_at` with (the election's), which
    /// need not be the one `metrics` times calls with.
    pub fn new(
        inner: Arc<dyn Leases>,
        clock: Arc<dyn MonotonicClock>,
        metrics: &Metrics,
    ) -> MeteredLeases {
        MeteredLeases {
            inner,
            clock,
            metrics: metrics.leases.clone(),
        }
    }
}

impl Leases for MeteredLeases {
    fn grant(
        &self,
        ttl: std::time::Duration,
    ) -> BoxFuture<'static, Result<GrantedLease, StoreError>> {
        let (metrics, clock) = (self.metrics.clone(), self.clock.clone());
        let started = clock.now();
        self.inner
            .grant(ttl)
            .map(move |result| {
                match &result {
                    Ok(lease) => metrics.observe("grant", lease.sent_at, clock.now()),
                    Err(e) => {
                        metrics.observe("grant", started, clock.now());
                        metrics.failed("grant", e);
                    }
                }
                result
            })
            .boxed()
    }

    fn keep_alive(
        &self,
        lease: &GrantedLease,
    ) -> BoxStream<'static, Result<LeaseRenewal, StoreError>> {
        let (metrics, clock) = (self.metrics.clone(), self.clock.clone());
        self.inner
            .keep_alive(lease)
            .inspect(move |item| match item {
                Ok(renewal) => metrics.observe("keep_alive", renewal.sent_at, clock.now()),
                Err(e) => metrics.failed("keep_alive", e),
            })
            .boxed()
    }

    fn revoke(&self, lease: LeaseId) -> BoxFuture<'static, Result<(), StoreError>> {
        let (metrics, clock) = (self.metrics.clone(), self.clock.clone());
        let started = clock.now();
        self.inner
            .revoke(lease)
            .map(move |result| {
                metrics.observe("revoke", started, clock.now());
                if let Err(e) = &result {
                    metrics.failed("revoke", e);
                }
                result
            })
            .boxed()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Mutex;
    use std::time::Duration;

    use futures::executor::block_on;
    use futures::stream;

    use super::super::tests::exposition;
    use super::*;

    /// A clock the test sets.
    #[derive(Default)]
    struct Set(Mutex<Instant>);
    impl MonotonicClock for Set {
        fn now(&self) -> Instant {
            *self.0.lock().unwrap_or_else(|e| e.into_inner())
        }
    }

    fn at(ms: u64) -> Instant {
        Instant::from_offset(Duration::from_millis(ms))
    }

    /// Leases whose requests were sent at 1 s and answer at once; the
    /// keep-alive renews twice, then loses the lease. Revoking fails.
    struct Canned;
    impl Leases for Canned {
        fn grant(&self, ttl: Duration) -> BoxFuture<'static, Result<GrantedLease, StoreError>> {
            let lease = GrantedLease {
                id: 7,
                ttl,
                sent_at: at(1000),
            };
            futures::future::ready(Ok(lease)).boxed()
        }
        fn keep_alive(
            &self,
            lease: &GrantedLease,
        ) -> BoxStream<'static, Result<LeaseRenewal, StoreError>> {
            let renewal = |sent| {
                Ok(LeaseRenewal {
                    ttl: Duration::from_secs(2),
                    sent_at: at(sent),
                })
            };
            let items = vec![
                renewal(1000),
                renewal(1500),
                Err(StoreError::LeaseNotFound(lease.id)),
            ];
            stream::iter(items).boxed()
        }
        fn revoke(&self, _: LeaseId) -> BoxFuture<'static, Result<(), StoreError>> {
            futures::future::ready(Err(StoreError::Unavailable("gone".into()))).boxed()
        }
    }

    fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
    }

    #[test]
    fn requests_are_timed_from_when_they_were_sent_on_the_leases_clock() {
        let clock = Arc::new(Set::default());
        // The metrics' own clock stands still: only the leases' counts.
        let metrics = Metrics::new(Arc::new(Set::default()));
        let leases = MeteredLeases::new(Arc::new(Canned), clock.clone(), &metrics);
        *clock.0.lock().unwrap() = at(1250);
        let lease = block_on(leases.grant(Duration::from_secs(2))).unwrap();
        *clock.0.lock().unwrap() = at(1750);
        let renewals: Vec<_> = block_on(leases.keep_alive(&lease).collect());
        assert_eq!(renewals.len(), 3);
        assert!(block_on(leases.revoke(lease.id)).is_err());

        let text = exposition(&metrics);
        let duration = "metropolis_lease_request_duration_seconds";
        assert_eq!(
            line(&text, &format!("{duration}_sum{{op=\"grant\"}}")),
            format!("{duration}_sum{{op=\"grant\"}} 0.25")
        );
        // Two renewals, sent at 1 s and 1.5 s, both answered at 1.75 s.
        assert_eq!(
            line(&text, &format!("{duration}_count{{op=\"keep_alive\"}}")),
            format!("{duration}_count{{op=\"keep_alive\"}} 2")
        );
        assert_eq!(
            line(&text, &format!("{duration}_sum{{op=\"keep_alive\"}}")),
            format!("{duration}_sum{{op=\"keep_alive\"}} 1.0")
        );
        let errors = "metropolis_lease_request_errors_total";
        assert!(
            text.contains(&format!(
                "{errors}{{op=\"keep_alive\",error=\"lease_not_found\"}} 1\n"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "{errors}{{op=\"revoke\",error=\"unavailable\"}} 1\n"
            )),
            "{text}"
        );
        assert!(!text.contains("op=\"grant\",error"), "{text}");
    }
}
