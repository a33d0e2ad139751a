//! GetLogs over the gRPC API: every backlog mode, stream mode and filter,
//! on a log tree with known entries served in-process by each runtime's
//! listener, and the daemon's own logs under their component DNs.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use futures::StreamExt;
use metropolis_core::logtree::{Dn, Entry, EntryKind, LogTreeConfig, Severity};
use metropolis_proto::prelude::common::{self, log_entry, log_filter};
use metropolis_proto::prelude::debug::{
    self, get_logs_request::BacklogMode, get_logs_request::StreamMode,
    node_debug_service_client::NodeDebugServiceClient,
};
use metropolis_service::Router;
use metropolis_service::debug::{DebugService, LogHub};
use metropolis_tests::plain_server::PlainServer;
use metropolis_tests::{Daemon, RuntimeKind, against_both_runtimes};
use metropolis_transport::grpc::Channel;

fn leveled(dn: &str, text: &str, severity: Severity) -> Entry {
    Entry {
        dn: Dn::parse(dn).unwrap(),
        kind: EntryKind::Leveled {
            lines: vec![text.to_string()],
            timestamp_unix_nanos: 1_700_000_000_000_000_000,
            severity,
            location: "test.rs:1".into(),
        },
    }
}

fn raw(dn: &str, text: &str) -> Entry {
    Entry {
        dn: Dn::parse(dn).unwrap(),
        kind: EntryKind::Raw {
            data: text.to_string(),
            original_length: text.len() as i64,
        },
    }
}

/// The known tree: root.a (a1 I, a2 W, a3 E), root.a.b (b1 raw, b2 F),
/// root.c (c1 I), interleaved.
fn known_hub() -> LogHub {
    let hub = LogHub::new(LogTreeConfig {
        max_entries_per_dn: 100_000,
        ..LogTreeConfig::default()
    });
    hub.append_all([
        leveled("root.a", "a1", Severity::Info),
        raw("root.a.b", "b1"),
        leveled("root.c", "c1", Severity::Info),
        leveled("root.a", "a2", Severity::Warning),
        leveled("root.a.b", "b2", Severity::Fatal),
        leveled("root.a", "a3", Severity::Error),
    ]);
    hub
}

fn text(entry: &common::LogEntry) -> String {
    match &entry.kind {
        Some(log_entry::Kind::Leveled(l)) => l.lines.join("\n"),
        Some(log_entry::Kind::Raw(r)) => r.data.clone(),
        None => String::new(),
    }
}

fn request(
    dn: &str,
    filters: Vec<log_filter::Filter>,
    backlog: BacklogMode,
) -> debug::GetLogsRequest {
    debug::GetLogsRequest {
        dn: dn.into(),
        filters: filters
            .into_iter()
            .map(|f| common::LogFilter { filter: Some(f) })
            .collect(),
        backlog_mode: backlog as i32,
        backlog_count: 0,
        stream_mode: StreamMode::StreamDisable as i32,
    }
}

fn children() -> log_filter::Filter {
    log_filter::Filter::WithChildren(Default::default())
}

async fn serve(
    hub: LogHub,
    runtime: RuntimeKind,
) -> (PlainServer, NodeDebugServiceClient<Channel>) {
    let router = Router::new().with_service(DebugService::new(hub, None).server());
    let server = PlainServer::start(router, runtime).await;
    let client = NodeDebugServiceClient::with_origin(server.channel().await, Channel::origin());
    (server, client)
}

/// Runs a non-streaming request; returns the backlog texts.
async fn backlog(
    client: &mut NodeDebugServiceClient<Channel>,
    req: debug::GetLogsRequest,
) -> Result<Vec<String>, tonic::Status> {
    let mut stream = client.get_logs(req).await?.into_inner();
    let mut out = Vec::new();
    while let Some(resp) = stream.next().await {
        let resp = resp?;
        assert!(
            resp.stream_entries.is_empty(),
            "no stream entries without streaming"
        );
        out.extend(resp.backlog_entries.iter().map(text));
    }
    Ok(out)
}

async fn backlog_modes_and_filters(runtime: RuntimeKind) {
    let (_server, mut client) = serve(known_hub(), runtime).await;
    let all = BacklogMode::BacklogAll;
    assert_eq!(
        backlog(&mut client, request("root.a", vec![], all))
            .await
            .unwrap(),
        ["a1", "a2", "a3"]
    );
    assert_eq!(
        backlog(&mut client, request("root.a", vec![children()], all))
            .await
            .unwrap(),
        ["a1", "b1", "a2", "b2", "a3"]
    );
    assert_eq!(
        backlog(&mut client, request("root", vec![children()], all))
            .await
            .unwrap(),
        ["a1", "b1", "c1", "a2", "b2", "a3"]
    );
    // COUNT: the newest n.
    let mut req = request("root.a", vec![children()], BacklogMode::BacklogCount);
    req.backlog_count = 2;
    assert_eq!(
        backlog(&mut client, req.clone()).await.unwrap(),
        ["b2", "a3"]
    );
    req.backlog_count = 100;
    assert_eq!(backlog(&mut client, req.clone()).await.unwrap().len(), 5);
    req.backlog_count = 0;
    let e = backlog(&mut client, req).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("backlog_count"), "{}", e.message());
    // DISABLE with no streaming: the call ends with nothing.
    assert!(
        backlog(
            &mut client,
            request("root", vec![children()], BacklogMode::BacklogDisable)
        )
        .await
        .unwrap()
        .is_empty()
    );
    // Kind and severity filters.
    let only_raw = log_filter::Filter::OnlyRaw(Default::default());
    let only_leveled = log_filter::Filter::OnlyLeveled(Default::default());
    assert_eq!(
        backlog(
            &mut client,
            request("root", vec![children(), only_raw], all)
        )
        .await
        .unwrap(),
        ["b1"]
    );
    assert_eq!(
        backlog(
            &mut client,
            request("root.a", vec![children(), only_leveled], all)
        )
        .await
        .unwrap(),
        ["a1", "a2", "b2", "a3"]
    );
    let min = |s: common::LeveledLogSeverity| {
        log_filter::Filter::LeveledWithMinimumSeverity(log_filter::LeveledWithMinimumSeverity {
            minimum: s as i32,
        })
    };
    assert_eq!(
        backlog(
            &mut client,
            request(
                "root",
                vec![children(), min(common::LeveledLogSeverity::Error)],
                all
            )
        )
        .await
        .unwrap(),
        ["b2", "a3"]
    );
    assert_eq!(
        backlog(
            &mut client,
            request(
                "root.a",
                vec![min(common::LeveledLogSeverity::Warning)],
                all
            )
        )
        .await
        .unwrap(),
        ["a2", "a3"]
    );
    // As the reference: the empty DN is the root (with WithChildren,
    // every entry), and a DN never logged to is empty, not an error.
    assert_eq!(
        backlog(&mut client, request("", vec![children()], all))
            .await
            .unwrap(),
        ["a1", "b1", "c1", "a2", "b2", "a3"]
    );
    assert!(
        backlog(&mut client, request("root.nope", vec![], all))
            .await
            .unwrap()
            .is_empty()
    );
    // Errors: an invalid DN, no backlog mode.
    let e = backlog(&mut client, request("root..a", vec![], all))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    let e = backlog(
        &mut client,
        request("root", vec![], BacklogMode::BacklogInvalid),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
}

async fn streaming_follows_new_entries(runtime: RuntimeKind) {
    let hub = known_hub();
    let (_server, mut client) = serve(hub.clone(), runtime).await;
    let mut req = request(
        "root.a",
        vec![
            children(),
            log_filter::Filter::OnlyLeveled(Default::default()),
        ],
        BacklogMode::BacklogCount,
    );
    req.backlog_count = 1;
    req.stream_mode = StreamMode::StreamUnbuffered as i32;
    let mut stream = client.get_logs(req).await.unwrap().into_inner();
    let first = stream.next().await.unwrap().unwrap();
    assert_eq!(
        first.backlog_entries.iter().map(text).collect::<Vec<_>>(),
        ["a3"]
    );
    assert!(first.stream_entries.is_empty());
    // New entries: matching ones arrive as stream entries, in order; a raw
    // one and one outside the subtree do not.
    hub.append(raw("root.a", "ignored raw"));
    hub.append(leveled("root.c", "ignored dn", Severity::Info));
    hub.append(leveled("root.a.b", "n1", Severity::Info));
    hub.append(leveled("root.a", "n2", Severity::Error));
    let mut got = Vec::new();
    while got.len() < 2 {
        let resp = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("streamed entries arrive")
            .unwrap()
            .unwrap();
        assert!(resp.backlog_entries.is_empty(), "backlog only comes first");
        got.extend(resp.stream_entries.iter().map(text));
    }
    assert_eq!(got, ["n1", "n2"]);
    assert_eq!(hub.followers(), 1);
    drop(stream);
    // The server ends the subscription once the client goes away.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while hub.followers() != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "subscription not closed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn stream_without_backlog_and_large_backlogs(runtime: RuntimeKind) {
    let hub = known_hub();
    // 20,000 more entries: the backlog spans several responses, in order.
    hub.append_all((0..20_000).map(|i| leveled("root.big", &format!("e{i}"), Severity::Info)));
    let (_server, mut client) = serve(hub.clone(), runtime).await;
    let mut stream = client
        .get_logs(request("root.big", vec![], BacklogMode::BacklogAll))
        .await
        .unwrap()
        .into_inner();
    let mut responses = 0;
    let mut texts = Vec::new();
    while let Some(resp) = stream.next().await {
        responses += 1;
        texts.extend(resp.unwrap().backlog_entries.iter().map(text));
    }
    assert!(responses > 1, "a large backlog is chunked");
    assert_eq!(texts.len(), 20_000);
    assert!(texts.iter().enumerate().all(|(i, t)| *t == format!("e{i}")));

    // DISABLE + UNBUFFERED: only new entries.
    let mut req = request("root.c", vec![], BacklogMode::BacklogDisable);
    req.stream_mode = StreamMode::StreamUnbuffered as i32;
    let mut stream = client.get_logs(req).await.unwrap().into_inner();
    // The subscription exists once the call is answered; wait for it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while hub.followers() == 0 {
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    hub.append(leveled("root.c", "c2", Severity::Info));
    let resp = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(resp.backlog_entries.is_empty());
    assert_eq!(
        resp.stream_entries.iter().map(text).collect::<Vec<_>>(),
        ["c2"]
    );
}

async fn daemon_logs_its_components(runtime: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_debug(&dir.path().join("data"), runtime, &[]);
    let mut client = d.debug_client().await;
    // Something the debug service itself logs, as a warning.
    client
        .get_debug_kubeconfig(debug::GetDebugKubeconfigRequest {
            id: "admin".into(),
            groups: vec!["system:masters".into()],
        })
        .await
        .unwrap();
    let mut all = request("root", vec![children()], BacklogMode::BacklogAll);
    all.filters.push(common::LogFilter {
        filter: Some(log_filter::Filter::OnlyLeveled(Default::default())),
    });
    let mut stream = client.get_logs(all).await.unwrap().into_inner();
    let mut entries = Vec::new();
    while let Some(resp) = stream.next().await {
        entries.extend(resp.unwrap().backlog_entries);
    }
    let find = |dn: &str, needle: &str| {
        entries
            .iter()
            .find(|e| e.dn == dn && text(e).contains(needle))
            .unwrap_or_else(|| {
                panic!(
                    "no {dn} entry with {needle:?} in {:#?}",
                    entries
                        .iter()
                        .map(|e| (e.dn.clone(), text(e)))
                        .collect::<Vec<_>>()
                )
            })
            .clone()
    };
    find("root.daemon", "curator serving");
    find("root.daemon", "UNAUTHENTICATED");
    find("root.daemon", "registered this node");
    let issued = find("root.debug", "system:masters");
    let Some(log_entry::Kind::Leveled(l)) = &issued.kind else {
        panic!("leveled")
    };
    assert_eq!(l.severity, common::LeveledLogSeverity::Warning as i32);
    assert!(text(&issued).contains("id=admin"), "{}", text(&issued));
}

against_both_runtimes!(
    backlog_modes_and_filters,
    streaming_follows_new_entries,
    stream_without_backlog_and_large_backlogs,
    daemon_logs_its_components,
);

/// The debug service is off unless asked for.
#[tokio::test]
async fn debug_service_is_off_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("data"), RuntimeKind::Tokio);
    assert!(d.debug_addr.is_none());
    assert!(std::net::TcpStream::connect("127.0.0.1:7837").is_err());
    assert!(!d.log().contains("NodeDebugService"), "{}", d.log());
}
