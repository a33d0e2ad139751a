//! The daemon's own logs in the log tree: a `tracing` layer that writes
//! every event into a [`LogHub`] under the DN of the component that logged
//! it (`root.curator`, `root.agentcallback`, `root.debug`, ...), so
//! `NodeDebugService.GetLogs` serves them.

use std::fmt::Write as _;

use metropolis_core::logtree::{Dn, Entry, EntryKind, Severity};
use metropolis_service::debug::LogHub;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::Context;

/// Which DN a `tracing` target (a module path) logs under. The first
/// matching prefix wins; targets matching none log under `root.other`.
pub const DN_BY_TARGET: &[(&str, &str)] = &[
    ("metropolis_service::agent_callback", "root.agentcallback"),
    (
        "metropolis_service::debug::trace_stream",
        "root.debug.trace",
    ),
    ("metropolis_service::debug", "root.debug"),
    ("metropolis_service::images", "root.debug.images"),
    ("metropolis_core::trace", "root.debug.trace"),
    ("metropolis_node::tracefs", "root.debug.trace"),
    ("metropolis_node::images", "root.debug.images"),
    ("metropolis_service", "root.curator"),
    ("metropolis_core::store", "root.store"),
    ("metropolis_store", "root.store"),
    ("metropolis_pki", "root.pki"),
    ("metropolis_transport::grpc", "root.network"),
    ("metropolis_transport::listen", "root.network"),
    ("metropolis_node::daemon", "root.daemon"),
    ("metropolisd", "root.daemon"),
    ("metropolis", "root.daemon"),
];

/// The DN of `target` per [`DN_BY_TARGET`].
pub fn dn_for_target(target: &str) -> &'static str {
    DN_BY_TARGET
        .iter()
        .find(|(prefix, _)| {
            target.starts_with(prefix)
                && matches!(
                    target.as_bytes().get(prefix.len()),
                    None | Some(b':' | b'_')
                )
        })
        .map(|(_, dn)| *dn)
        .unwrap_or("root.other")
}

/// A `tracing` layer writing every event it sees into a [`LogHub`] as a
/// leveled entry: the message followed by the event's other fields as
/// `key=value`, the level mapped to a severity (DEBUG and TRACE as INFO),
/// the source location, and the wall-clock time.
#[derive(Clone, Debug)]
pub struct LogTreeLayer {
    hub: LogHub,
}

impl LogTreeLayer {
    /// A layer writing into `hub`.
    pub fn new(hub: LogHub) -> LogTreeLayer {
        LogTreeLayer { hub }
    }
}

/// Formats the message first, then `key=value` for the other fields.
#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.rest, " {}={value}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.rest, " {}={value:?}", field.name());
        }
    }
}

fn severity(level: &Level) -> Severity {
    match *level {
        Level::ERROR => Severity::Error,
        Level::WARN => Severity::Warning,
        _ => Severity::Info,
    }
}

fn now_unix_nanos() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_nanos()).unwrap_or(i64::MAX)
}

impl<S: Subscriber> tracing_subscriber::Layer<S> for LogTreeLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        let mut text = fields.message;
        text.push_str(&fields.rest);
        let location = match (meta.file(), meta.line()) {
            (Some(file), Some(line)) => {
                let base = file.rsplit('/').next().unwrap_or(file);
                format!("{base}:{line}")
            }
            _ => String::new(),
        };
        let dn = Dn::parse(dn_for_target(meta.target()))
            .expect("the DN table holds valid DNs (checked by a unit test)");
        self.hub.append(Entry {
            dn,
            kind: EntryKind::Leveled {
                lines: text.lines().map(str::to_owned).collect(),
                timestamp_unix_nanos: now_unix_nanos(),
                severity: severity(meta.level()),
                location,
            },
        });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use metropolis_core::logtree::{LogTreeConfig, Query};
    use metropolis_proto::prelude::debug;
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn every_dn_of_the_table_parses() {
        for (_, dn) in DN_BY_TARGET {
            Dn::parse(dn).unwrap();
        }
        Dn::parse("root.other").unwrap();
    }

    #[test]
    fn targets_map_to_component_dns() {
        assert_eq!(dn_for_target("metropolis_service::curator"), "root.curator");
        assert_eq!(
            dn_for_target("metropolis_service::agent_callback"),
            "root.agentcallback"
        );
        assert_eq!(
            dn_for_target("metropolis_service::debug::kubeconfig"),
            "root.debug"
        );
        assert_eq!(dn_for_target("metropolis_store::writer"), "root.store");
        assert_eq!(dn_for_target("h2::proto"), "root.other");
        // A prefix matches whole path segments only; other metropolis
        // crates fall back to the daemon's DN.
        assert_eq!(dn_for_target("metropolis_core::storefront"), "root.daemon");
        assert_eq!(dn_for_target("metropolisx"), "root.other");
        assert_eq!(dn_for_target("metropolisd"), "root.daemon");
        assert_eq!(
            dn_for_target("metropolis_transport::listen"),
            "root.network"
        );
    }

    #[test]
    fn events_land_under_their_dn_with_fields_and_severity() {
        let hub = LogHub::new(LogTreeConfig::default());
        let subscriber = tracing_subscriber::registry().with(LogTreeLayer::new(hub.clone()));
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(target: "metropolis_store::wal", offset = 42, "torn tail cut");
            tracing::info!(target: "metropolis_service::curator", "two\nlines");
        });
        let request = debug::GetLogsRequest {
            dn: "root".into(),
            filters: vec![metropolis_proto::prelude::common::LogFilter {
                filter: Some(
                    metropolis_proto::prelude::common::log_filter::Filter::WithChildren(
                        Default::default(),
                    ),
                ),
            }],
            backlog_mode: debug::get_logs_request::BacklogMode::BacklogAll as i32,
            stream_mode: debug::get_logs_request::StreamMode::StreamDisable as i32,
            ..Default::default()
        };
        Query::from_request(&request).unwrap();
        let responses: Vec<_> = futures::executor::block_on_stream(hub.get_logs(&request).unwrap())
            .map(|r| r.unwrap())
            .collect();
        let entries: Vec<_> = responses
            .into_iter()
            .flat_map(|r| r.backlog_entries)
            .collect();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].dn, "root.store");
        assert_eq!(entries[1].dn, "root.curator");
        use metropolis_proto::prelude::common::log_entry::Kind;
        let Some(Kind::Leveled(l)) = &entries[0].kind else {
            panic!("leveled entry expected")
        };
        assert_eq!(l.lines, vec!["torn tail cut offset=42".to_string()]);
        assert_eq!(
            l.severity,
            metropolis_proto::prelude::common::LeveledLogSeverity::Warning as i32
        );
        assert!(l.location.starts_with("logs.rs:"), "{}", l.location);
        let Some(Kind::Leveled(l)) = &entries[1].kind else {
            panic!("leveled entry expected")
        };
        assert_eq!(l.lines, vec!["two".to_string(), "lines".to_string()]);
    }
}
