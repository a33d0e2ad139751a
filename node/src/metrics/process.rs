//! The `process_*` families every Prometheus client exports (the names,
//! types and help of Go's `client_golang`): CPU time, memory, threads,
//! file descriptors and start time, read from `/proc/self` at each scrape.
//! Where `/proc` cannot be read (not Linux, a sandbox) the families are
//! left out rather than exported as zeros.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// What `/proc/self/stat` says of the process.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Stat {
    /// User plus system CPU time, in clock ticks.
    cpu_ticks: u64,
    threads: u64,
    /// Start, in clock ticks after boot.
    start_ticks: u64,
    virtual_bytes: u64,
    resident_pages: u64,
}

/// Parses `/proc/self/stat` (proc(5)): the fields after the command name,
/// which is in parentheses and may hold spaces and parentheses itself.
fn parse_stat(text: &str) -> Option<Stat> {
    let (_, rest) = text.rsplit_once(')')?;
    // rest[0] is field 3 (state): field n is rest[n - 3].
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
    Some(Stat {
        cpu_ticks: field(14)?.checked_add(field(15)?)?,
        threads: field(20)?,
        start_ticks: field(22)?,
        virtual_bytes: field(23)?,
        resident_pages: field(24)?,
    })
}

/// The boot time, in seconds since the epoch, from `/proc/stat`.
fn parse_boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

/// The process's figures at one scrape.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Sample {
    cpu_seconds: f64,
    threads: u64,
    start_time_seconds: f64,
    virtual_bytes: u64,
    resident_bytes: u64,
    open_fds: u64,
    max_fds: Option<u64>,
}

impl Sample {
    fn read() -> Option<Sample> {
        let stat = parse_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
        let boot = parse_boot_time(&std::fs::read_to_string("/proc/stat").ok()?)?;
        let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
        let ticks = rustix::param::clock_ticks_per_second().max(1) as f64;
        let page = rustix::param::page_size() as u64;
        Some(Sample {
            cpu_seconds: stat.cpu_ticks as f64 / ticks,
            threads: stat.threads,
            start_time_seconds: boot as f64 + stat.start_ticks as f64 / ticks,
            virtual_bytes: stat.virtual_bytes,
            resident_bytes: stat.resident_pages.saturating_mul(page),
            open_fds,
            max_fds: rustix::process::getrlimit(rustix::process::Resource::Nofile).current,
        })
    }
}

/// Registered once per registry
/// ([`Registry::register_collector`](prometheus_client::registry::Registry::register_collector)).
#[derive(Debug, Default)]
pub struct ProcessCollector;

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: f64) -> fmt::Result {
    let metric = ConstGauge::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let Some(s) = Sample::read() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(s.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            cpu.metric_type(),
        )?)?;
        let e = &mut encoder;
        gauge(
            e,
            "process_open_fds",
            "Number of open file descriptors.",
            s.open_fds as f64,
        )?;
        if let Some(max) = s.max_fds {
            let help = "Maximum number of open file descriptors.";
            gauge(e, "process_max_fds", help, max as f64)?;
        }
        let help = "Virtual memory size in bytes.";
        gauge(
            e,
            "process_virtual_memory_bytes",
            help,
            s.virtual_bytes as f64,
        )?;
        let help = "Resident memory size in bytes.";
        gauge(
            e,
            "process_resident_memory_bytes",
            help,
            s.resident_bytes as f64,
        )?;
        let help = "Start time of the process since unix epoch in seconds.";
        gauge(e, "process_start_time_seconds", help, s.start_time_seconds)?;
        let help = "Number of OS threads in the process.";
        gauge(e, "process_threads", help, s.threads as f64)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_read_after_the_command_name() {
        // A command name with a space and a parenthesis.
        let text = "4242 (metro) d) S 1 4242 4242 0 -1 4194560 1234 0 0 0 \
                    250 50 0 0 20 0 7 0 98765 123456789 2048 18446744073709551615 \
                    1 1 0 0 0 0 0 4096 17922 0 0 0 17 1 0 0 0 0 0\n";
        assert_eq!(
            parse_stat(text),
            Some(Stat {
                cpu_ticks: 300,
                threads: 7,
                start_ticks: 98765,
                virtual_bytes: 123456789,
                resident_pages: 2048,
            })
        );
        assert_eq!(parse_stat("4242 (cut"), None);
        assert_eq!(parse_stat("4242 (x) S 1 2"), None);
    }

    #[test]
    fn boot_time_is_the_btime_line() {
        let text = "cpu  1 2 3\nintr 5\nbtime 1764770000\nprocesses 9\n";
        assert_eq!(parse_boot_time(text), Some(1_764_770_000));
        assert_eq!(parse_boot_time("cpu 1\n"), None);
    }

    #[test]
    fn this_process_is_read() {
        let s = Sample::read().unwrap();
        assert!(s.threads >= 1 && s.open_fds >= 3, "{s:?}");
        assert!(s.resident_bytes > 0 && s.virtual_bytes >= s.resident_bytes);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        // Started within the last day, not in the future (one tick of
        // slack, and the boot time is whole seconds).
        assert!(s.start_time_seconds <= now + 1.0, "{s:?}");
        assert!(s.start_time_seconds > now - 86_400.0, "{s:?}");
    }
}
