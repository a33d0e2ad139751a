//! The daemon's logs: their format on stderr ([`LogFormat`]) and
//! [`init_logging`], which sends them to stderr and into the log tree the
//! debug service serves.

use clap::ValueEnum;
use metropolis_core::logtree::LogTreeConfig;
use metropolis_service::debug::LogHub;

/// How logs are written to stderr ([`init_logging`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines; colours only when stderr is a terminal (so
    /// journald and files get plain text).
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`,
    /// `fields` (the message and the event's fields), `span` and `spans`.
    Json,
}

/// Sets up logging with `filter` (falling back to "info") to stderr in
/// `format` and into a log tree with `tree` limits, which it returns for
/// the debug service's GetLogs (put it in
/// [`Config::logs`](super::Config::logs)); the tree is the same whatever
/// the format.
pub fn init_logging(filter: &str, format: LogFormat, tree: LogTreeConfig) -> LogHub {
    use std::io::IsTerminal;
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let env_filter = tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|e| {
        eprintln!("--log {filter:?}: {e}; using \"info\"");
        tracing_subscriber::EnvFilter::new("info")
    });
    let hub = LogHub::new(tree);
    let stderr = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let stderr = match format {
        LogFormat::Text => stderr.with_ansi(std::io::stderr().is_terminal()).boxed(),
        LogFormat::Json => stderr.json().with_current_span(true).boxed(),
    };
    let _ = tracing_subscriber::registry()
        .with(env_filter)
        .with(stderr)
        .with(crate::logs::LogTreeLayer::new(hub.clone()))
        .try_init();
    hub
}
