//! The daemon's Prometheus metrics: one registry holding the service
//! layer's families (calls, Watch streams, heartbeats, leadership, store
//! requests), the embedded store's (commits, syncs, file sizes) and
//! `metropolis_build_info` and the process's (`process_*`, [`process`]),
//! served by `--metrics-listen`
//! ([`listen::serve_scrapes`](metropolis_transport::listen::serve_scrapes)).
//! Each scrape first refreshes what is read rather than recorded (the
//! machines alive and lost), at most once a second.

pub mod process;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use metropolis_core::ports::MonotonicClock;
use metropolis_core::time::Instant;
use metropolis_service::ProvisioningService;
use metropolis_service::metrics::Metrics;
use metropolis_store::StoreMetrics;
use metropolis_transport::exposition::{Format, Render};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

/// How long a census of the machines is reused by later scrapes.
const CENSUS_EVERY: Duration = Duration::from_secs(1);

/// The registry a metrics listener serves, and what refreshes it.
pub struct NodeMetrics {
    registry: Registry,
    core: Metrics,
    clock: Arc<dyn MonotonicClock>,
    machines: ProvisioningService,
    /// When the last census was taken.
    census_at: Mutex<Option<Instant>>,
}

impl NodeMetrics {
    /// A registry of `core`'s families, `store`'s (the embedded store's,
    /// when there is one), the build's version and the process's;
    /// `machines` is counted at each scrape.
    pub fn new(
        core: Metrics,
        store: Option<&StoreMetrics>,
        clock: Arc<dyn MonotonicClock>,
        machines: ProvisioningService,
    ) -> NodeMetrics {
        let mut registry = Registry::default();
        registry.register(
            "metropolis_build",
            "The metropolisd build: its version",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        registry.register_collector(Box::new(process::ProcessCollector));
        core.register(&mut registry);
        if let Some(store) = store {
            store.register(&mut registry);
        }
        NodeMetrics {
            registry,
            core,
            clock,
            machines,
            census_at: Mutex::new(None),
        }
    }

    /// Counts the machines, unless that was done within [`CENSUS_EVERY`].
    /// A failed census (the store unavailable, a follower without a
    /// leader) leaves the last figures.
    async fn refresh(&self) {
        let now = self.clock.now();
        {
            let mut at = self.census_at.lock().unwrap_or_else(|e| e.into_inner());
            if at.is_some_and(|t| now.saturating_duration_since(t) < CENSUS_EVERY) {
                return;
            }
            *at = Some(now);
        }
        match self.machines.census().await {
            Ok((registered, lost)) => self.core.record_machines(registered, lost),
            Err(e) => {
                tracing::debug!(error = %e.message(), "cannot count the machines for metrics")
            }
        }
    }

    /// The exposition in `format`.
    pub fn encode(&self, format: Format) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = match format {
            Format::OpenMetrics => {
                prometheus_client::encoding::text::encode(&mut text, &self.registry)
            }
            _ => prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry),
        };
        text
    }

    /// What the metrics listener serves: a refresh, then the exposition.
    pub fn render(self: &Arc<Self>) -> Render {
        let this = self.clone();
        Arc::new(move |format| {
            let this = this.clone();
            async move {
                this.refresh().await;
                this.encode(format)
            }
            .boxed()
        })
    }
}
