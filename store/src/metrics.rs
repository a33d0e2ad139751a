//! The store's Prometheus families: commits (batches), records per batch,
//! the time of each batch's durable write, the WAL's and the snapshot's
//! sizes. The writer records them; whoever serves metrics registers them
//! ([`StoreMetrics::register`]).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The families one store records in. Cloning shares them.
#[derive(Clone, Debug)]
pub struct StoreMetrics {
    commits: Counter,
    batch_records: Histogram,
    written_bytes: Counter,
    sync: Histogram,
    wal_bytes: Gauge,
    snapshot_bytes: Gauge,
    snapshots: Counter,
}

impl Default for StoreMetrics {
    fn default() -> Self {
        StoreMetrics {
            commits: Counter::default(),
            // 1 to 4,096 records.
            batch_records: Histogram::new(exponential_buckets(1.0, 2.0, 13)),
            written_bytes: Counter::default(),
            sync: Histogram::new(metropolis_core::time::latency_buckets()),
            wal_bytes: Gauge::default(),
            snapshot_bytes: Gauge::default(),
            snapshots: Counter::default(),
        }
    }
}

impl StoreMetrics {
    /// Registers the families in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "metropolis_store_commits",
            "WAL batches written durably (one synchronous write each, shared by every change in it)",
            self.commits.clone(),
        );
        registry.register(
            "metropolis_store_commit_batch_records",
            "Records per WAL batch (group commit)",
            self.batch_records.clone(),
        );
        registry.register(
            "metropolis_store_wal_written_bytes",
            "Bytes of records appended to the WAL",
            self.written_bytes.clone(),
        );
        registry.register(
            "metropolis_store_wal_sync_duration_seconds",
            "Time of one WAL batch write until durable (O_DSYNC write, or write and fdatasync)",
            self.sync.clone(),
        );
        registry.register(
            "metropolis_store_wal_bytes",
            "Size of the current WAL file",
            self.wal_bytes.clone(),
        );
        registry.register(
            "metropolis_store_snapshot_bytes",
            "Size of the last snapshot file written (0 until one is written by this process)",
            self.snapshot_bytes.clone(),
        );
        registry.register(
            "metropolis_store_snapshots",
            "Snapshots written (each followed by a fresh WAL)",
            self.snapshots.clone(),
        );
    }

    /// A batch of `records` records, `bytes` long, was written durably in
    /// `seconds`; the WAL is now `wal_size` bytes.
    pub(crate) fn committed(&self, records: usize, bytes: usize, seconds: f64, wal_size: u64) {
        self.commits.inc();
        self.batch_records.observe(records as f64);
        self.written_bytes.inc_by(bytes as u64);
        self.sync.observe(seconds);
        self.set_wal_size(wal_size);
    }

    /// The WAL is `size` bytes.
    pub(crate) fn set_wal_size(&self, size: u64) {
        self.wal_bytes.set(i64::try_from(size).unwrap_or(i64::MAX));
    }

    /// A snapshot of `size` bytes was written.
    pub(crate) fn snapshot_written(&self, size: u64) {
        self.snapshots.inc();
        self.snapshot_bytes
            .set(i64::try_from(size).unwrap_or(i64::MAX));
    }
}
