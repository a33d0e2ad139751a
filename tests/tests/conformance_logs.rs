//! Conformance of NodeDebugService.GetLogs with the reference: re-expresses
//! the test cases of Monogon's `metropolis/node/core/mgmt/svc_logs_test.go`
//! (as of `HEAD`: `TestLogService_Logs_Backlog`, `TestLogService_Logs_Stream`,
//! `TestLogService_Logs_Filters`), plus the refusals the reference makes
//! that its tests do not spell out, on both runtimes.
//!
//! Black-box where the daemon can be made to log known entries: a real
//! `metropolisd` with its debug listener, whose log tree holds only the
//! daemon's own logs. The owner's `AddMachine` logs `machine added
//! machine=<id>` (INFO) under `root.agentcallback`, which nothing else
//! logs to; `GetDebugKubeconfig` logs `issued a debug kubeconfig ...
//! id=<id>` under `root.debug`, INFO, or WARNING for `system:masters`.
//!
//! In-process where it cannot: the daemon writes only leveled entries (its
//! `tracing` layer has no raw entries) and none at ERROR on demand, so the
//! cases about raw entries (OnlyRaw, OnlyLeveled leaving raw out, a minimum
//! severity dropping raw entries) read a `LogHub` holding the reference's
//! own entries, served by each runtime's listener (`PlainServer`), as
//! `tests/debug_logs.rs` does. The reference's invalid UTF-8 case is not
//! re-expressed: entries here are Rust strings, valid UTF-8 by
//! construction, so no log line can carry invalid bytes to replace.
//!
//! Identities: every GetLogs and GetDebugKubeconfig call goes over the
//! unauthenticated debug listener (plain HTTP/2, no credentials), or the
//! in-process listener likewise; `AddMachine` is called as the owner
//! (owner certificate over mutual TLS).

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use futures::StreamExt;
use metropolis_core::logtree::{Dn, Entry, EntryKind, LogTreeConfig, Severity};
use metropolis_proto::metropolis::node::core::curator::proto::private::{
    AddMachineRequest, machine_management_client::MachineManagementClient,
};
use metropolis_proto::prelude::common::{
    self, LeveledLogSeverity as Sev, log_entry, log_filter, log_filter::Filter as F,
};
use metropolis_proto::prelude::debug::{
    self, get_logs_request::BacklogMode as B, get_logs_request::StreamMode,
    node_debug_service_client::NodeDebugServiceClient,
};
use metropolis_service::Router;
use metropolis_service::debug::{DebugService, LogHub};
use metropolis_tests::plain_server::PlainServer;
use metropolis_tests::{AgentKey, Daemon, RuntimeKind, against_both_runtimes};
use metropolis_transport::grpc::Channel;
use tempfile::TempDir;
use tonic::Code;

type Client = NodeDebugServiceClient<Channel>;
/// An entry as the reference's tests compare them: DN, severity (None for
/// a raw entry), text.
type Summary = (String, Option<i32>, String);

/// Bound of every call and every wait for an entry.
const WAIT: Duration = Duration::from_secs(10);

const MACHINE_A: &str = "0f8fad5b-d9cb-469f-a165-70867728950e";
const MACHINE_B: &str = "7c9e6679-7425-40de-944b-e07fc1f90ae7";
/// What the daemon logs under `root.agentcallback` for AddMachine, then the ID.
const ADDED: &str = "machine added machine=";
const CALLBACK: &str = "root.agentcallback";

const CHILDREN: F = F::WithChildren(log_filter::WithChildren {});
const ONLY_RAW: F = F::OnlyRaw(log_filter::OnlyRaw {});
const ONLY_LEVELED: F = F::OnlyLeveled(log_filter::OnlyLeveled {});

fn minimum(s: Sev) -> F {
    F::LeveledWithMinimumSeverity(log_filter::LeveledWithMinimumSeverity { minimum: s as i32 })
}

/// A request with STREAM_DISABLE (`n`: the backlog count).
fn req(dn: &str, filters: &[F], backlog: B, n: i64) -> debug::GetLogsRequest {
    debug::GetLogsRequest {
        dn: dn.into(),
        filters: filters
            .iter()
            .map(|f| common::LogFilter { filter: Some(*f) })
            .collect(),
        backlog_mode: backlog as i32,
        backlog_count: n,
        stream_mode: StreamMode::StreamDisable as i32,
    }
}

fn all(dn: &str, filters: &[F]) -> debug::GetLogsRequest {
    req(dn, filters, B::BacklogAll, 0)
}

fn text(e: &common::LogEntry) -> String {
    match &e.kind {
        Some(log_entry::Kind::Leveled(l)) => l.lines.join("\n"),
        Some(log_entry::Kind::Raw(r)) => r.data.clone(),
        None => String::new(),
    }
}

fn summary(e: &common::LogEntry) -> Summary {
    let severity = match &e.kind {
        Some(log_entry::Kind::Leveled(l)) => Some(l.severity),
        _ => None,
    };
    (e.dn.clone(), severity, text(e))
}

fn summaries(entries: &[common::LogEntry]) -> Vec<Summary> {
    entries.iter().map(summary).collect()
}

fn want(dn: &str, entries: &[(Option<Sev>, &str)]) -> Vec<Summary> {
    let one = |&(s, t): &(Option<Sev>, &str)| (dn.into(), s.map(|s| s as i32), t.into());
    entries.iter().map(one).collect()
}

/// Runs a call that must end after its backlog (within [`WAIT`]); the
/// backlog entries.
async fn backlog(
    client: &mut Client,
    req: debug::GetLogsRequest,
) -> Result<Vec<common::LogEntry>, tonic::Status> {
    tokio::time::timeout(WAIT, async {
        let mut stream = client.get_logs(req).await?.into_inner();
        let mut out = Vec::new();
        while let Some(resp) = stream.next().await {
            let resp = resp?;
            assert!(resp.stream_entries.is_empty(), "stream entries: {resp:?}");
            out.extend(resp.backlog_entries);
        }
        Ok(out)
    })
    .await
    .expect("the call ends after its backlog")
}

/// A daemon with its debug listener, after registering `machines` as the
/// owner (each logs [`ADDED`] and its ID under [`CALLBACK`], which nothing
/// else logs to); its NodeDebugService client.
async fn daemon(rt: RuntimeKind, machines: &[&str]) -> (TempDir, Daemon, Client) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_debug(&dir.path().join("d"), rt, &[]);
    for m in machines {
        add_machine(&d, m).await;
    }
    let client = d.debug_client().await;
    (dir, d, client)
}

async fn add_machine(d: &Daemon, machine_id: &str) {
    let mut op = MachineManagementClient::with_origin(d.owner().await, Channel::origin());
    let req = AddMachineRequest {
        machine_id: machine_id.into(),
        agent_public_key: AgentKey::new(d).public.to_vec().into(),
    };
    let call = tokio::time::timeout(WAIT, op.add_machine(req)).await;
    call.expect("AddMachine answers").unwrap();
}

/// Issues a debug kubeconfig for `id` in `groups`: the daemon logs it under
/// `root.debug`, as a warning for `system:masters`, else as INFO.
async fn kubeconfig(client: &mut Client, id: &str, groups: &[&str]) {
    let req = debug::GetDebugKubeconfigRequest {
        id: id.into(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
    };
    let call = tokio::time::timeout(WAIT, client.get_debug_kubeconfig(req)).await;
    call.expect("GetDebugKubeconfig answers").unwrap();
}

/// Each of `requests` is InvalidArgument, with a message naming `field`.
async fn refused(client: &mut Client, requests: Vec<debug::GetLogsRequest>, field: &str) {
    for req in requests {
        let e = match backlog(client, req.clone()).await {
            Ok(entries) => panic!("{req:?}: accepted, {} entries", entries.len()),
            Err(e) => e,
        };
        assert_eq!(e.code(), Code::InvalidArgument, "{req:?}: {e:?}");
        assert!(e.message().contains(field), "{req:?}: {}", e.message());
    }
}

/// A followed call's responses.
struct Follow {
    stream: tonic::Streaming<debug::GetLogsResponse>,
    streaming: bool,
}

impl Follow {
    async fn open(client: &mut Client, mut req: debug::GetLogsRequest) -> Follow {
        req.stream_mode = StreamMode::StreamUnbuffered as i32;
        let call = tokio::time::timeout(WAIT, client.get_logs(req)).await;
        let stream = call.expect("GetLogs answers").unwrap().into_inner();
        Follow {
            stream,
            streaming: false,
        }
    }

    /// Reads until an entry whose text contains `needle` (within
    /// [`WAIT`]); it, and whether it came in `stream_entries`. Asserts
    /// no backlog entry comes after a stream entry.
    async fn until(&mut self, needle: &str) -> (common::LogEntry, bool) {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let resp = tokio::time::timeout(left, self.stream.next())
                .await
                .unwrap_or_else(|_| panic!("no entry with {needle:?} within {WAIT:?}"))
                .expect("the stream goes on")
                .unwrap();
            assert!(
                resp.backlog_entries.is_empty() || !self.streaming,
                "backlog entries after stream entries: {resp:?}"
            );
            self.streaming |= !resp.stream_entries.is_empty();
            let backlog = resp.backlog_entries.into_iter().map(|e| (e, false));
            let stream = resp.stream_entries.into_iter().map(|e| (e, true));
            let mut entries = backlog.chain(stream);
            if let Some(found) = entries.find(|(e, _)| text(e).contains(needle)) {
                return found;
            }
        }
    }

    /// Asserts no entry arrives for `period` and the stream stays open.
    async fn quiet(&mut self, period: Duration) {
        let read = async {
            while let Some(resp) = self.stream.next().await {
                let resp = resp.unwrap();
                let entries = resp.backlog_entries.len() + resp.stream_entries.len();
                assert_eq!(entries, 0, "{resp:?}");
            }
            panic!("the stream ended");
        };
        assert!(tokio::time::timeout(period, read).await.is_err());
    }
}

/// TestLogService_Logs_Backlog, all backlog: BACKLOG_ALL of one DN returns
/// its entries, oldest first, and the call ends. Daemon; GetLogs over the
/// unauthenticated debug listener, AddMachine as the owner.
async fn test_log_service_logs_backlog_all(rt: RuntimeKind) {
    let (_dir, _d, mut client) = daemon(rt, &[MACHINE_A, MACHINE_B]).await;
    let got = backlog(&mut client, all(CALLBACK, &[])).await.unwrap();
    let (a, b) = (format!("{ADDED}{MACHINE_A}"), format!("{ADDED}{MACHINE_B}"));
    let info = Some(Sev::Info);
    assert_eq!(summaries(&got), want(CALLBACK, &[(info, &a), (info, &b)]));
}

/// TestLogService_Logs_Backlog, exact backlog: BACKLOG_COUNT 1 returns the
/// newest entry only. Daemon; GetLogs over the unauthenticated debug
/// listener, AddMachine as the owner.
async fn test_log_service_logs_backlog_count(rt: RuntimeKind) {
    let (_dir, _d, mut client) = daemon(rt, &[MACHINE_A, MACHINE_B]).await;
    let got = backlog(&mut client, req(CALLBACK, &[], B::BacklogCount, 1)).await;
    let b = format!("{ADDED}{MACHINE_B}");
    assert_eq!(
        summaries(&got.unwrap()),
        want(CALLBACK, &[(Some(Sev::Info), &b)])
    );
}

/// TestLogService_Logs_Backlog, no backlog: BACKLOG_DISABLE with
/// STREAM_DISABLE returns nothing and ends. Daemon; GetLogs over the
/// unauthenticated debug listener, AddMachine as the owner.
async fn test_log_service_logs_backlog_disable(rt: RuntimeKind) {
    let (_dir, _d, mut client) = daemon(rt, &[MACHINE_A]).await;
    let got = backlog(&mut client, req(CALLBACK, &[], B::BacklogDisable, 0)).await;
    assert_eq!(got.unwrap(), []);
}

/// TestLogService_Logs_Backlog, recursion with backlog: WithChildren and
/// BACKLOG_COUNT 2 return the newest two entries of the subtree, across
/// children; without WithChildren the DN's own entries only (none).
/// Daemon; GetLogs and GetDebugKubeconfig over the unauthenticated debug
/// listener, AddMachine as the owner.
async fn test_log_service_logs_backlog_with_children(rt: RuntimeKind) {
    let (_dir, _d, mut client) = daemon(rt, &[MACHINE_A]).await;
    kubeconfig(&mut client, "alice", &[]).await;
    let got = backlog(&mut client, req("root", &[CHILDREN], B::BacklogCount, 2)).await;
    let got = summaries(&got.unwrap());
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0].2, format!("{ADDED}{MACHINE_A}"), "{got:?}");
    assert_eq!(
        (got[0].0.as_str(), got[1].0.as_str()),
        (CALLBACK, "root.debug")
    );
    assert!(got[1].2.contains("id=alice"), "{got:?}");
    let own = backlog(&mut client, req("root", &[], B::BacklogCount, 2)).await;
    assert_eq!(own.unwrap(), []);
}

/// Beyond TestLogService_Logs_Backlog (which always sets the stream mode):
/// an unset `stream_mode` behaves like STREAM_DISABLE, the call ends after
/// the backlog. Daemon; GetLogs over the unauthenticated debug listener,
/// AddMachine as the owner.
async fn test_log_service_logs_backlog_unset_stream_mode_ends(rt: RuntimeKind) {
    let (_dir, _d, mut client) = daemon(rt, &[MACHINE_A]).await;
    let mut unset = all(CALLBACK, &[]);
    unset.stream_mode = StreamMode::StreamInvalid as i32;
    let got = backlog(&mut client, unset).await.unwrap();
    let a = format!("{ADDED}{MACHINE_A}");
    assert_eq!(summaries(&got), want(CALLBACK, &[(Some(Sev::Info), &a)]));
}

/// TestLogService_Logs_Stream: `dn: ""` with WithChildren, BACKLOG_ALL and
/// STREAM_UNBUFFERED follows every entry of the tree: a new entry arrives
/// (through the backlog or the stream), and the next one through the
/// stream. Daemon; GetLogs over the unauthenticated debug listener,
/// AddMachine as the owner.
async fn test_log_service_logs_stream_root_with_children(rt: RuntimeKind) {
    let (_dir, d, mut client) = daemon(rt, &[]).await;
    let mut follow = Follow::open(&mut client, all("", &[CHILDREN])).await;
    // The backlog spans the whole tree: the daemon's start under root.daemon.
    let (serving, streamed) = follow.until("curator serving").await;
    assert_eq!((serving.dn.as_str(), streamed), ("root.daemon", false));
    add_machine(&d, MACHINE_A).await;
    let (first, _) = follow.until(&format!("{ADDED}{MACHINE_A}")).await;
    assert_eq!(first.dn, CALLBACK);
    add_machine(&d, MACHINE_B).await;
    let b = format!("{ADDED}{MACHINE_B}");
    let (again, streamed) = follow.until(&b).await;
    assert!(streamed, "an entry logged after the backlog is streamed");
    assert_eq!([summary(&again)], *want(CALLBACK, &[(Some(Sev::Info), &b)]));
}

/// Beyond TestLogService_Logs_Stream: a DN never logged to is no error;
/// its backlog is empty, and a followed call waits, then streams its first
/// entries as they come. Daemon; GetLogs over the unauthenticated debug
/// listener, AddMachine as the owner.
async fn test_log_service_logs_stream_dn_never_logged_to(rt: RuntimeKind) {
    let (_dir, d, mut client) = daemon(rt, &[]).await;
    let never = backlog(&mut client, all("root.nothing.here", &[CHILDREN])).await;
    assert_eq!(never.unwrap(), []);
    // Nothing has logged under root.agentcallback yet.
    let mut follow = Follow::open(&mut client, all(CALLBACK, &[])).await;
    follow.quiet(Duration::from_millis(500)).await;
    add_machine(&d, MACHINE_A).await;
    let (first, streamed) = follow.until(&format!("{ADDED}{MACHINE_A}")).await;
    assert!(streamed && first.dn == CALLBACK, "{first:?}");
}

/// TestLogService_Logs_Filters, case 0 (request given level): a minimum
/// severity of WARNING keeps the warnings and drops the INFO entries.
/// Daemon; GetLogs and GetDebugKubeconfig over the unauthenticated debug
/// listener.
async fn test_log_service_logs_filters_given_level(rt: RuntimeKind) {
    let (_dir, _d, mut client) = daemon(rt, &[]).await;
    kubeconfig(&mut client, "alice", &[]).await;
    kubeconfig(&mut client, "bob", &["system:masters"]).await;
    kubeconfig(&mut client, "carol", &["dev"]).await;
    let every = backlog(&mut client, all("root.debug", &[])).await.unwrap();
    assert_eq!(every.len(), 3, "{every:?}");
    let got = backlog(&mut client, all("root.debug", &[minimum(Sev::Warning)])).await;
    let got = summaries(&got.unwrap());
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].1, Some(Sev::Warning as i32));
    assert!(got[0].2.contains("id=bob"), "{got:?}");
    let errors = backlog(&mut client, all("root.debug", &[minimum(Sev::Error)])).await;
    assert_eq!(errors.unwrap(), []);
}

fn leveled(severity: Severity, line: &str) -> EntryKind {
    EntryKind::Leveled {
        lines: vec![line.into()],
        timestamp_unix_nanos: 1_700_000_000_000_000_000,
        severity,
        location: "svc_logs_test.go:1".into(),
    }
}

/// TestLogService_Logs_Filters' entries under `main` (two INFO, a WARNING,
/// a raw line, an ERROR), served in-process by `rt`'s listener; the
/// backlog of `main` through `filter`.
async fn reference_filtered(rt: RuntimeKind, filter: F) -> Vec<common::LogEntry> {
    let hub = LogHub::new(LogTreeConfig::default());
    let raw = EntryKind::Raw {
        data: "medium rare".into(),
        original_length: 11,
    };
    hub.append_all(
        [
            leveled(Severity::Info, "Hello"),
            leveled(Severity::Info, "Starting..."),
            leveled(Severity::Warning, "Something failed!"),
            raw,
            leveled(Severity::Error, "Something failed very hard!"),
        ]
        .map(|kind| Entry {
            dn: Dn::parse("main").unwrap(),
            kind,
        }),
    );
    let router = Router::new().with_service(DebugService::new(hub, None).server());
    let server = PlainServer::start(router, rt).await;
    let mut client = Client::with_origin(server.channel().await, Channel::origin());
    backlog(&mut client, all("main", &[filter])).await.unwrap()
}

/// TestLogService_Logs_Filters, case 0 (request given level), with its raw
/// entry: a minimum severity of WARNING also drops the raw entry.
/// In-process listener (unauthenticated), the reference's entries.
async fn test_log_service_logs_filters_given_level_drops_raw(rt: RuntimeKind) {
    let got = reference_filtered(rt, minimum(Sev::Warning)).await;
    let expected = [
        (Some(Sev::Warning), "Something failed!"),
        (Some(Sev::Error), "Something failed very hard!"),
    ];
    assert_eq!(summaries(&got), want("main", &expected));
}

/// TestLogService_Logs_Filters, case 1 (request raw only): OnlyRaw returns
/// the raw entry alone. In-process listener (unauthenticated), the
/// reference's entries.
async fn test_log_service_logs_filters_raw_only(rt: RuntimeKind) {
    let got = reference_filtered(rt, ONLY_RAW).await;
    assert_eq!(summaries(&got), want("main", &[(None, "medium rare")]));
    let Some(log_entry::Kind::Raw(r)) = &got[0].kind else {
        panic!("raw: {got:?}")
    };
    assert_eq!(r.original_length, 11);
}

/// TestLogService_Logs_Filters, case 2 (request leveled only): OnlyLeveled
/// returns every leveled entry and no raw one. In-process listener
/// (unauthenticated), the reference's entries.
async fn test_log_service_logs_filters_leveled_only(rt: RuntimeKind) {
    let got = reference_filtered(rt, ONLY_LEVELED).await;
    let expected = [
        (Some(Sev::Info), "Hello"),
        (Some(Sev::Info), "Starting..."),
        (Some(Sev::Warning), "Something failed!"),
        (Some(Sev::Error), "Something failed very hard!"),
    ];
    assert_eq!(summaries(&got), want("main", &expected));
}

/// Refusal the reference makes (`invalid DN`): a DN that is not one is
/// InvalidArgument naming `dn`. Daemon; unauthenticated debug listener.
async fn test_log_service_logs_invalid_dn_refused(rt: RuntimeKind) {
    let (_dir, _d, mut client) = daemon(rt, &[]).await;
    let bad = ["Root..x", "root..x", "root.", ".root", "root x"];
    refused(&mut client, bad.map(|dn| all(dn, &[CHILDREN])).into(), "dn").await;
}

/// Refusal the reference makes: BACKLOG_COUNT with `backlog_count` <= 0 is
/// InvalidArgument naming `backlog_count`. Daemon; unauthenticated debug
/// listener.
async fn test_log_service_logs_backlog_count_not_positive_refused(rt: RuntimeKind) {
    let (_dir, _d, mut client) = daemon(rt, &[]).await;
    let counts = [0, -1, i64::MIN].map(|n| req("root", &[CHILDREN], B::BacklogCount, n));
    refused(&mut client, counts.into(), "backlog_count").await;
}

/// Refusal the reference makes (`unknown backlog_mode 0`): an unset
/// `backlog_mode` is InvalidArgument naming it. Daemon; unauthenticated
/// debug listener.
async fn test_log_service_logs_backlog_mode_unset_refused(rt: RuntimeKind) {
    let (_dir, _d, mut client) = daemon(rt, &[]).await;
    let unset = req("root", &[CHILDREN], B::BacklogInvalid, 0);
    refused(&mut client, vec![unset], "backlog_mode").await;
}

/// Refusal the reference makes (at most 10 filters): 11 filters are
/// InvalidArgument naming `filters`; 10 are accepted. Daemon;
/// unauthenticated debug listener.
async fn test_log_service_logs_too_many_filters_refused(rt: RuntimeKind) {
    let (_dir, _d, mut client) = daemon(rt, &[]).await;
    let ten = backlog(&mut client, all("root", &[CHILDREN; 10])).await;
    assert!(!ten.unwrap().is_empty(), "10 filters are allowed");
    refused(&mut client, vec![all("root", &[CHILDREN; 11])], "filters").await;
}

/// Refusal the reference makes (`requested only raw and only leveled logs
/// simultaneously`): OnlyRaw with OnlyLeveled is InvalidArgument naming
/// `filters`. Daemon; unauthenticated debug listener.
async fn test_log_service_logs_only_raw_and_only_leveled_refused(rt: RuntimeKind) {
    let (_dir, _d, mut client) = daemon(rt, &[]).await;
    let both = all("root", &[CHILDREN, ONLY_RAW, ONLY_LEVELED]);
    refused(&mut client, vec![both], "filters").await;
}

against_both_runtimes!(
    test_log_service_logs_backlog_all,
    test_log_service_logs_backlog_count,
    test_log_service_logs_backlog_disable,
    test_log_service_logs_backlog_with_children,
    test_log_service_logs_backlog_unset_stream_mode_ends,
    test_log_service_logs_stream_root_with_children,
    test_log_service_logs_stream_dn_never_logged_to,
    test_log_service_logs_filters_given_level,
    test_log_service_logs_filters_given_level_drops_raw,
    test_log_service_logs_filters_raw_only,
    test_log_service_logs_filters_leveled_only,
    test_log_service_logs_invalid_dn_refused,
    test_log_service_logs_backlog_count_not_positive_refused,
    test_log_service_logs_backlog_mode_unset_refused,
    test_log_service_logs_too_many_filters_refused,
    test_log_service_logs_only_raw_and_only_leveled_refused,
);
