//! `get-logs`: GetLogs of a large backlog over a real socket. The debug
//! service runs in this process (the daemon's own log tree cannot be
//! filled with a million entries from outside), served by the listener of
//! `--daemon-runtime`; the client is a tonic client over plain HTTP/2 on
//! loopback. Prints entries/s and wire MB/s.

use std::time::Instant;

use futures::StreamExt;
use metropolis_core::logtree::{Dn, Entry, EntryKind, LogTreeConfig, Severity};
use metropolis_proto::prelude::debug::{
    self, get_logs_request::BacklogMode, get_logs_request::StreamMode,
    node_debug_service_client::NodeDebugServiceClient,
};
use metropolis_service::Router;
use metropolis_service::debug::{DebugService, LogHub};
use metropolis_tests::RuntimeKind;
use metropolis_tests::plain_server::PlainServer;
use metropolis_transport::grpc::Channel;
use prost::Message;

use super::util::{Context, Result, print_table, row};

/// Arguments of `get-logs`.
#[derive(clap::Args, Debug, Clone)]
pub struct GetLogsArgs {
    /// Entries in the backlog.
    #[arg(long, default_value_t = 1_000_000)]
    pub entries: usize,
    /// Bytes of message text per entry.
    #[arg(long, default_value_t = 80)]
    pub line_bytes: usize,
    /// Fetches of the whole backlog (the best is reported).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
}

/// Runs the scenario.
pub async fn run(args: GetLogsArgs, runtime: RuntimeKind) -> Result<()> {
    let hub = LogHub::new(LogTreeConfig {
        max_bytes: usize::MAX,
        max_entries_per_dn: args.entries,
        ..LogTreeConfig::default()
    });
    let dn = Dn::parse("root.bench").context(|| "DN".into())?;
    let fill = Instant::now();
    let text = "x".repeat(args.line_bytes);
    hub.append_all((0..args.entries).map(|i| Entry {
        dn: dn.clone(),
        kind: EntryKind::Leveled {
            lines: vec![format!("{i:>10} {text}")],
            timestamp_unix_nanos: 1_700_000_000_000_000_000 + i as i64,
            severity: Severity::Info,
            location: "bench.rs:1".into(),
        },
    }));
    let fill = fill.elapsed();
    let router = Router::new().with_service(DebugService::new(hub, None).server());
    let server = PlainServer::start(router, runtime).await;
    let channel = metropolis_transport::connect::plain(
        &metropolis_runtime_tokio::rt::TokioRuntime::shared(),
        &server.addr.to_string(),
    )
    .await
    .context(|| "connecting".into())?;
    let mut client = NodeDebugServiceClient::with_origin(channel, Channel::origin())
        .max_decoding_message_size(16 * 1024 * 1024);
    let mut best: Option<(f64, usize, usize, usize)> = None;
    for _ in 0..args.rounds.max(1) {
        let start = Instant::now();
        let mut stream = client
            .get_logs(debug::GetLogsRequest {
                dn: "root.bench".into(),
                backlog_mode: BacklogMode::BacklogAll as i32,
                stream_mode: StreamMode::StreamDisable as i32,
                ..Default::default()
            })
            .await
            .context(|| "GetLogs".into())?
            .into_inner();
        let (mut entries, mut bytes, mut responses) = (0, 0, 0);
        while let Some(resp) = stream.next().await {
            let resp = resp.context(|| "GetLogs stream".into())?;
            responses += 1;
            bytes += resp.encoded_len();
            entries += resp.backlog_entries.len();
        }
        let secs = start.elapsed().as_secs_f64();
        if entries != args.entries {
            return Err(format!("got {entries} entries, expected {}", args.entries).into());
        }
        if best.is_none_or(|(b, ..)| secs < b) {
            best = Some((secs, entries, bytes, responses));
        }
    }
    drop(client);
    drop(server);
    let (secs, entries, bytes, responses) = best.expect("at least one round ran");
    let eps = entries as f64 / secs;
    let mbps = bytes as f64 / secs / 1e6;
    print_table(
        &format!("GetLogs backlog ({runtime} listener, in-process, loopback)"),
        &[
            row("entries", entries),
            row("fill time", format!("{:.2} s", fill.as_secs_f64())),
            row("fetch time (best)", format!("{secs:.3} s")),
            row("entries/s", format!("{eps:.0}")),
            row("wire MB/s", format!("{mbps:.1}")),
            row("responses", responses),
        ],
    );
    println!(
        "RESULT get-logs runtime={runtime} entries={entries} seconds={secs:.3} entries_per_s={eps:.0} mb_per_s={mbps:.1} responses={responses}"
    );
    Ok(())
}
