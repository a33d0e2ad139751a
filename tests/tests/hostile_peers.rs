//! Hostile peers at every listener, each against a real daemon measured
//! from outside: memory held for bodies of unauthenticated or unregistered
//! callers (RSS), error messages that would echo megabytes of input
//! (status size), connections that never speak (closed), and the
//! file-descriptor limit (CPU time, log volume, existing connections still
//! served).

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::StreamBody;
use metropolis_pki::client_config;
use metropolis_proto::prelude::agent::agent_callback_client::AgentCallbackClient;
use metropolis_proto::prelude::{agent, common, curator};
use metropolis_runtime_tokio::rt::TokioRuntime;
use metropolis_tests::{AgentKey, Daemon, RuntimeKind, against_both_runtimes, curator};
use metropolis_transport::connect;
use metropolis_transport::grpc::Channel;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;
use tonic::codegen::Service;

const HEARTBEAT: &str = "/cloud.bmaas.server.api.AgentCallback/Heartbeat";

/// Resident memory of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// CPU time (user + system) of process `pid`, in clock ticks (1/100 s).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name, which is in parentheses.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

type Sender = futures::channel::mpsc::Sender<Result<http_body::Frame<Bytes>, std::io::Error>>;

/// A call left open: the sender of its body (keep it to keep the stream
/// open) and the task awaiting its response's `grpc-status` (the response
/// future must not be dropped: that would cancel the stream).
struct OpenCall {
    _body: Sender,
    status: tokio::task::JoinHandle<String>,
}

/// Starts a Heartbeat call whose body declares a `declared`-byte message,
/// sends `sent` bytes of it and never ends.
async fn hold_open_call(channel: &mut Channel, declared: u32, sent: usize) -> OpenCall {
    let (mut tx, rx) = futures::channel::mpsc::channel(4);
    let mut data = vec![0u8];
    data.extend_from_slice(&declared.to_be_bytes());
    data.resize(5 + sent, b'a');
    tx.try_send(Ok(http_body::Frame::data(Bytes::from(data))))
        .unwrap();
    let body = tonic::body::Body::new(StreamBody::new(rx));
    let request = http::Request::post(format!("http://metropolis{HEARTBEAT}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(body)
        .unwrap();
    futures::future::poll_fn(|cx| channel.poll_ready(cx))
        .await
        .unwrap();
    let response = channel.call(request);
    let status = tokio::spawn(async move {
        match response.await {
            Ok(response) => response
                .headers()
                .get("grpc-status")
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or("(no grpc-status in headers)".into()),
            Err(e) => format!("(request failed: {e})"),
        }
    });
    OpenCall { _body: tx, status }
}

/// The statuses of the calls that were answered so far.
async fn answered(calls: &mut [OpenCall]) -> Vec<String> {
    let mut statuses = Vec::new();
    for call in calls.iter_mut().filter(|c| c.status.is_finished()) {
        statuses.push((&mut call.status).await.unwrap());
    }
    statuses
}

/// Issue 17, item 5: a caller with no certificate opens 200 streams
/// declaring 4 MiB messages, sends 1 MiB of each and never ends them.
async fn bodies_of_callers_without_a_certificate_are_never_read(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), rt);
    let ca = std::fs::read_to_string(d.data_dir.join("pki/ca.pem")).unwrap();
    let before = rss(d.pid());
    let mut calls = Vec::new();
    for _ in 0..2 {
        let mut channel = d.agent_channel(None, &ca).await;
        for _ in 0..100 {
            calls.push(hold_open_call(&mut channel, 4 << 20, 1 << 20).await);
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let grown = rss(d.pid()).saturating_sub(before);
    let statuses = answered(&mut calls).await;
    assert_eq!(
        statuses.iter().filter(|s| *s == "16").count(),
        200,
        "unauthenticated Heartbeats must be refused at once: {statuses:?}"
    );
    assert!(
        grown < 48 << 20,
        "the daemon grew by {} MiB holding bodies of unauthenticated callers",
        grown >> 20
    );
}

/// Issue 17, item 5: a caller with a self-signed agent certificate of an
/// unregistered key sends 200 nearly complete 900 KiB Heartbeats and never
/// ends them: the listener's in-flight budget (16 MiB here) bounds what it
/// holds, and the calls beyond it get ResourceExhausted.
async fn unregistered_agents_are_held_to_the_budget(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(
        &dir.path().join("d"),
        rt,
        &["--max-request-bytes-in-flight", "16M"],
    );
    let key = AgentKey::new(&d);
    let before = rss(d.pid());
    let mut calls = Vec::new();
    for _ in 0..2 {
        let mut channel = d.agent_channel(Some(&key.creds), &key.creds.ca_pem).await;
        for _ in 0..100 {
            calls.push(hold_open_call(&mut channel, 900 << 10, 900 << 10).await);
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let grown = rss(d.pid()).saturating_sub(before);
    let statuses = answered(&mut calls).await;
    let exhausted = statuses.iter().filter(|s| *s == "8").count();
    assert!(
        grown < 64 << 20,
        "the daemon grew by {} MiB for 200 unfinished 900 KiB calls (budget 16 MiB)",
        grown >> 20
    );
    assert!(
        exhausted > 150,
        "only {exhausted} of 200 calls were told ResourceExhausted: {statuses:?}"
    );
}

/// A Heartbeat from an (unregistered) agent whose `machine_id` is 900 KiB
/// of `é%`, which percent-encoding would triple; its error status.
async fn heartbeat_with_a_huge_machine_id(d: &Daemon) -> tonic::Status {
    let key = AgentKey::new(d);
    let mut agent = AgentCallbackClient::with_origin(
        d.agent_channel(Some(&key.creds), &key.creds.ca_pem).await,
        Channel::origin(),
    );
    agent
        .heartbeat(agent::HeartbeatRequest {
            machine_id: "é%".repeat(300 << 10),
            ..Default::default()
        })
        .await
        .unwrap_err()
}

/// Issue 17, item 6: errors quoting input quote a bounded prefix.
async fn error_messages_quote_a_bounded_prefix(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), rt);
    let e = heartbeat_with_a_huge_machine_id(&d).await;
    assert_eq!(
        e.code(),
        Code::InvalidArgument,
        "{}",
        &e.message()[..200.min(e.message().len())]
    );
    assert!(
        e.message().len() < 400,
        "a {}-byte message",
        e.message().len()
    );
    assert!(e.message().contains("machine_id"), "{}", e.message());

    let mut c = curator(d.unix().await);
    let e = c
        .update_node_status(curator::UpdateNodeStatusRequest {
            node_id: d.node_id().to_string(),
            status: Some(common::NodeStatus {
                external_address: "%".repeat(15 << 10),
                ..Default::default()
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().len() < 400,
        "a {}-byte message",
        e.message().len()
    );

    let e = c
        .update_node_status(curator::UpdateNodeStatusRequest {
            node_id: "x".repeat(60 << 10),
            status: None,
        })
        .await
        .unwrap_err();
    assert!(
        e.message().len() < 400,
        "a {}-byte message",
        e.message().len()
    );
}

/// Reads from `stream` until the peer closes it; the time that took, or
/// None when it stayed open for `limit`.
async fn time_until_closed(
    mut stream: impl tokio::io::AsyncRead + Unpin,
    limit: Duration,
) -> Option<Duration> {
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await
    .ok()
    .map(|()| start.elapsed())
}

/// The HTTP/2 connection preface and an empty SETTINGS frame.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// Issue 17, item 7: connections that never speak (or speak only the
/// preface) are closed; one with an open Watch stream is not. The
/// metrics port closes a connection whose request head does not arrive
/// within the handshake timeout.
async fn silent_connections_are_closed(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let metrics_addr = format!("127.0.0.1:{}", metropolis_tests::free_port());
    let d = Daemon::start_debug(
        &dir.path().join("d"),
        rt,
        &[
            "--idle-timeout",
            "2",
            "--handshake-timeout",
            "2",
            "--metrics-listen",
            &metrics_addr,
        ],
    );
    let debug_addr = d.debug_addr.clone().unwrap();
    let limit = Duration::from_secs(9);
    let ca = std::fs::read_to_string(d.data_dir.join("pki/ca.pem")).unwrap();
    let config = client_config(None, &ca).unwrap();

    // A watch that stays open across several idle timeouts.
    let mut watch = metropolis_tests::watch_nodes(d.unix().await).await;
    while let Some(Ok(e)) = watch.next().await {
        if e.progress == curator::watch_event::Progress::LastBacklogged as i32 {
            break;
        }
    }

    let tcp_silent = tokio::net::TcpStream::connect(&d.addr).await.unwrap();
    // The TLS streams as tokio IO (hyper's IO traits, adapted back).
    let rt = TokioRuntime::shared();
    let tls = |addr: &str, config| {
        let rt = rt.clone();
        let addr = addr.to_string();
        async move {
            let stream = connect::tls_stream(&rt, &addr, config).await.unwrap();
            hyper_util::rt::TokioIo::new(stream.io)
        }
    };
    let tls_silent = tls(&d.addr, config.clone()).await;
    let mut tls_preface = tls(&d.agent_addr, config).await;
    tls_preface.write_all(PREFACE).await.unwrap();
    let debug_silent = tokio::net::TcpStream::connect(&debug_addr).await.unwrap();
    let mut debug_preface = tokio::net::TcpStream::connect(&debug_addr).await.unwrap();
    debug_preface.write_all(PREFACE).await.unwrap();
    let metrics_silent = tokio::net::TcpStream::connect(&metrics_addr).await.unwrap();
    let mut metrics_half = tokio::net::TcpStream::connect(&metrics_addr).await.unwrap();
    metrics_half
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let (a, b, c, e, f, g, h) = tokio::join!(
        time_until_closed(tcp_silent, limit),
        time_until_closed(tls_silent, limit),
        time_until_closed(tls_preface, limit),
        time_until_closed(debug_silent, limit),
        time_until_closed(debug_preface, limit),
        time_until_closed(metrics_silent, limit),
        time_until_closed(metrics_half, limit),
    );
    for (what, closed) in [
        ("TCP without a TLS handshake", a),
        ("TLS with nothing after the handshake", b),
        ("TLS with only the HTTP/2 preface (agent port)", c),
        ("debug port, nothing sent", e),
        ("debug port, only the HTTP/2 preface", f),
        ("metrics port, nothing sent", g),
        ("metrics port, half a request head", h),
    ] {
        assert!(closed.is_some(), "{what}: still open after {limit:?}");
    }

    // The watch's connection was not idle: it still delivers.
    let mut c = curator(d.unix().await);
    c.update_node_status(curator::UpdateNodeStatusRequest {
        node_id: d.node_id().to_string(),
        status: Some(common::NodeStatus {
            external_address: "192.0.2.7".into(),
            ..Default::default()
        }),
    })
    .await
    .unwrap();
    let event = tokio::time::timeout(Duration::from_secs(5), watch.next())
        .await
        .expect("the watch delivers after the idle timeouts")
        .expect("the watch stream is open");
    assert!(event.is_ok(), "{event:?}");
}

/// Issue 17, item 8: at the file-descriptor limit the accept loops back
/// off, warn at a bounded rate, and existing connections are served.
async fn the_descriptor_limit_does_not_spin(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), rt);
    let existing = d.unix().await;
    let mut c = curator(existing);
    let pid = d.pid();
    let open = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    let limit = open + 4;
    let set = |n: usize| {
        let out = std::process::Command::new("prlimit")
            .arg(format!("--pid={pid}"))
            .arg(format!("--nofile={n}:"))
            .output()
            .expect("prlimit (util-linux) runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    set(limit);
    let mut flood = Vec::new();
    for _ in 0..40 {
        flood.push(tokio::net::TcpStream::connect(&d.addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let log_before = d.log().matches("accept on").count();
    let cpu_before = cpu_ticks(pid);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cpu = cpu_ticks(pid) - cpu_before;
    let warnings = d.log().matches("accept on").count() - log_before;
    assert!(
        d.log().contains("accept on"),
        "no accept failure was logged:\n{}",
        d.log()
    );
    assert!(
        cpu < 60,
        "the daemon used {cpu} ticks (1/100 s) of CPU in 3 s at the fd limit"
    );
    assert!(warnings < 5, "{warnings} accept warnings in 3 s");
    let start = Instant::now();
    c.update_node_status(curator::UpdateNodeStatusRequest {
        node_id: d.node_id().to_string(),
        status: Some(common::NodeStatus {
            external_address: "192.0.2.8".into(),
            ..Default::default()
        }),
    })
    .await
    .unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "a call on an existing connection took {:?} at the fd limit",
        start.elapsed()
    );
    drop(flood);
    set(4096);
    // New connections are accepted again once descriptors are free.
    let mut fresh = curator(
        tokio::time::timeout(Duration::from_secs(5), d.unix())
            .await
            .expect("a new connection after the flood"),
    );
    fresh
        .watch(curator::WatchRequest { kind: None })
        .await
        .unwrap_err();
}

against_both_runtimes!(
    bodies_of_callers_without_a_certificate_are_never_read,
    unregistered_agents_are_held_to_the_budget,
    error_messages_quote_a_bounded_prefix,
    silent_connections_are_closed,
    the_descriptor_limit_does_not_spin,
);

/// The cases that need etcd (the `system` feature).
#[cfg(feature = "system")]
mod over_etcd {
    use super::*;

    /// Through a follower (two instances elected over etcd, tokio and smol):
    /// a Heartbeat without an agent certificate is refused at once, before it
    /// is forwarded; an error quoting input is as bounded as the leader's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_follower_refuses_and_bounds_as_the_leader_does() {
        let etcd = metropolis_tests::etcd::Etcd::start();
        let dir = tempfile::tempdir().unwrap();
        let c = metropolis_tests::cluster::Curators::pair(dir.path(), &etcd.urls());
        let leader = c.leader(&etcd, Duration::from_secs(10)).await;
        for f in c.followers(leader) {
            let d = &c.daemons[f];
            let ca = std::fs::read_to_string(d.data_dir.join("pki/ca.pem")).unwrap();
            let mut channel = d.agent_channel(None, &ca).await;
            let mut calls = Vec::new();
            for _ in 0..20 {
                calls.push(hold_open_call(&mut channel, 4 << 20, 1 << 20).await);
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            let statuses = answered(&mut calls).await;
            assert_eq!(
                statuses.iter().filter(|s| *s == "16").count(),
                20,
                "follower {f}: {statuses:?}"
            );

            let e = heartbeat_with_a_huge_machine_id(d).await;
            assert_eq!(e.code(), Code::InvalidArgument, "follower {f}");
            assert!(
                e.message().len() < 400,
                "follower {f}: a {}-byte message",
                e.message().len()
            );
        }
    }
}
