//! `--metrics-listen`: after real traffic (a Watch stream, status updates,
//! a heartbeat refused, a machine enrolled) a scrape over plain HTTP/1.1
//! shows the counters moving with the labels Prometheus users expect, in
//! both exposition formats. The scrape is read by this file's parser of
//! the text format and, with the system suites, by the Python
//! `prometheus_client` parsers (OpenMetrics strict, and text 0.0.4).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::Duration;

use metropolis_proto::metropolis::node::core::curator::proto::private::AddMachineRequest;
use metropolis_proto::metropolis::node::core::curator::proto::private::machine_management_client::MachineManagementClient;
use metropolis_proto::prelude::agent;
use metropolis_proto::prelude::agent::agent_callback_client::AgentCallbackClient;
use metropolis_proto::prelude::curator;
use metropolis_tests::{
    AgentKey, Daemon, RuntimeKind, against_both_runtimes_and_etcd, free_port, status_with,
    watch_nodes,
};
use metropolis_transport::grpc::Channel;

/// One sample: name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

/// `GET /metrics` over a plain TCP connection, as any HTTP/1.1 client
/// sends it; the response's head and body.
fn scrape(addr: &str, accept: &str) -> (String, String) {
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        conn,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    conn.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (head.to_string(), body.to_string())
}

/// The samples of a text-format exposition (0.0.4 or OpenMetrics), each
/// line checked: every sample's family declared by a `# TYPE` line before
/// it, labels quoted, the value a number.
fn parse(text: &str) -> Vec<Sample> {
    let mut families: Vec<String> = Vec::new();
    let mut samples = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            families.push(rest.split(' ').next().unwrap().to_string());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap();
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("value of {line:?}")),
        };
        let (name, labels) = match series.split_once('{') {
            None => (series.to_string(), BTreeMap::new()),
            Some((name, rest)) => {
                let rest = rest.strip_suffix('}').unwrap();
                let mut labels = BTreeMap::new();
                for pair in rest.split("\",").filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once("=\"").unwrap();
                    labels.insert(k.to_string(), v.trim_end_matches('"').to_string());
                }
                (name.to_string(), labels)
            }
        };
        assert!(
            families.iter().any(|f| name.starts_with(f.as_str())),
            "{name} has no # TYPE line before it"
        );
        samples.push((name, labels, value));
    }
    samples
}

/// The value of `name` with exactly these labels (0 when absent).
fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    let want: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    samples
        .iter()
        .find(|(n, l, _)| n == name && *l == want)
        .map(|(_, _, v)| *v)
        .unwrap_or(0.0)
}

const CURATOR: &str = "metropolis.node.core.curator.proto.api.Curator";
const AGENT_CALLBACK: &str = "cloud.bmaas.server.api.AgentCallback";

/// The CPU time of process `pid` so far, in seconds, read on its own from
/// `/proc/<pid>/stat`: user plus system time (fields 14 and 15), in
/// USER_HZ ticks, which Linux fixes at 100 per second.
fn proc_cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces): the third on.
    let rest = &stat[stat.rfind(')').unwrap() + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 =
        fields[14 - 3].parse::<u64>().unwrap() + fields[15 - 3].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

fn method<'a>(service: &'a str, method: &'a str, kind: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("grpc_service", service),
        ("grpc_method", method),
        ("grpc_type", kind),
    ]
}

fn with_code<'a>(mut labels: Vec<(&'a str, &'a str)>, code: &'a str) -> Vec<(&'a str, &'a str)> {
    labels.push(("grpc_code", code));
    labels
}

/// The scrapes of a daemon `d` serving metrics at `metrics`: before and
/// after the traffic, and after the Watch stream is dropped.
async fn scrapes_after_traffic(d: &Daemon, metrics: &str, read: impl Fn() -> Vec<Sample>) {
    let before = read();
    let update = method(CURATOR, "UpdateNodeStatus", "unary");
    let watch = method(CURATOR, "Watch", "server_stream");
    let started = |s: &[Sample]| value(s, "grpc_server_started_total", &update);

    // A Watch stream, open; three status updates from this node.
    let mut stream = watch_nodes(d.owner().await).await;
    stream.message().await.unwrap().unwrap();
    let mut node = metropolis_tests::curator(d.unix().await);
    let id = d.node_id().to_string();
    for seq in 1..=3 {
        let request = curator::UpdateNodeStatusRequest {
            node_id: id.clone(),
            status: status_with(seq),
        };
        node.update_node_status(request).await.unwrap();
    }
    // The stream sees the updates (it sends them as events).
    stream.message().await.unwrap().unwrap();
    // A heartbeat from an agent the cluster does not know; a machine
    // enrolled that never sent one (so it is lost).
    let key = AgentKey::new(d);
    let mut agent = AgentCallbackClient::with_origin(
        d.agent_channel(Some(&key.creds), &key.creds.ca_pem).await,
        Channel::origin(),
    );
    let beat = agent::HeartbeatRequest {
        machine_id: "8d4a4a5e-0f0a-4c55-9b9a-1a2b3c4d5e6f".into(),
        ..Default::default()
    };
    let refused = agent.heartbeat(beat).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    let mut operator = MachineManagementClient::with_origin(d.owner().await, Channel::origin());
    operator
        .add_machine(AddMachineRequest {
            machine_id: "0f6b1c52-3a8e-4a55-8f0e-2b1c3d4e5f60".into(),
            agent_public_key: key.public.to_vec().into(),
        })
        .await
        .unwrap();

    let (head, text) = scrape(metrics, "*/*");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    parse(&text);
    let after = read();
    assert_eq!(started(&after) - started(&before), 3.0, "{after:?}");
    let ok = with_code(update.clone(), "OK");
    assert_eq!(
        value(&after, "grpc_server_handled_total", &ok)
            - value(&before, "grpc_server_handled_total", &ok),
        3.0
    );
    assert!(value(&after, "grpc_server_handling_seconds_count", &update) >= 3.0);
    assert_eq!(
        value(&after, "grpc_server_in_flight", &watch),
        1.0,
        "{after:?}"
    );
    assert_eq!(value(&after, "metropolis_curator_watch_streams", &[]), 1.0);
    assert!(value(&after, "metropolis_curator_watch_events_sent_total", &[]) >= 2.0);
    assert!(value(&after, "metropolis_curator_watch_sent_bytes_total", &[]) > 0.0);
    let heartbeat = method(AGENT_CALLBACK, "Heartbeat", "unary");
    assert_eq!(
        value(
            &after,
            "grpc_server_handled_total",
            &with_code(heartbeat, "Unauthenticated")
        ),
        1.0,
        "{after:?}"
    );
    assert_eq!(
        value(
            &after,
            "metropolis_agent_heartbeats_total",
            &[("result", "unknown_agent")]
        ),
        1.0
    );
    // The machines are counted at a scrape at most once a second.
    let mut census = after.clone();
    for _ in 0..40 {
        if value(&census, "metropolis_machines", &[("state", "lost")]) == 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        census = read();
    }
    assert_eq!(
        value(&census, "metropolis_machines", &[("state", "lost")]),
        1.0
    );
    assert_eq!(
        value(&census, "metropolis_machines", &[("state", "alive")]),
        0.0
    );
    assert_eq!(value(&after, "metropolis_curator_is_leader", &[]), 1.0);
    let backend = if d.elected { "etcd" } else { "embedded" };
    let writes = [("backend", backend), ("op", "write")];
    let count = "metropolis_kv_request_duration_seconds_count";
    assert!(value(&after, count, &writes) >= value(&before, count, &writes) + 4.0);
    if d.elected {
        assert_eq!(
            value(&after, "metropolis_curator_role", &[("state", "leader")]),
            1.0
        );
        // The election's lease: granted once, renewed every third of its
        // TTL (2 s here) without failing.
        let leases = "metropolis_lease_request_duration_seconds_count";
        assert_eq!(value(&after, leases, &[("op", "grant")]), 1.0);
        let mut renewed = after.clone();
        for _ in 0..40 {
            if value(&renewed, leases, &[("op", "keep_alive")]) >= 2.0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            renewed = read();
        }
        assert!(value(&renewed, leases, &[("op", "keep_alive")]) >= 2.0);
        assert!(
            !renewed
                .iter()
                .any(|(name, _, _)| name == "metropolis_lease_request_errors_total"),
            "a lease request failed"
        );
    } else {
        assert!(
            value(&after, "metropolis_store_commits_total", &[])
                > value(&before, "metropolis_store_commits_total", &[])
        );
        assert!(value(&after, "metropolis_store_wal_bytes", &[]) > 0.0);
        assert!(
            value(
                &after,
                "metropolis_store_wal_sync_duration_seconds_count",
                &[]
            ) >= 1.0
        );
    }

    // The daemon's process, as every Prometheus client exports it. Its
    // CPU time lies between what /proc says just before and just after a
    // scrape; scraped again until the daemon has used a few ticks (one
    // this young may not have used one yet, and 0 would prove nothing).
    let pid = d.pid();
    let mut cpu = (0.0, 0.0, 0.0);
    for _ in 0..1000 {
        let before = proc_cpu_seconds(pid);
        let exported = value(&read(), "process_cpu_seconds_total", &[]);
        cpu = (before, exported, proc_cpu_seconds(pid));
        if before >= 0.03 {
            break;
        }
    }
    let (lower, exported, upper) = cpu;
    assert!(
        lower >= 0.03,
        "the daemon used {lower} s of CPU in 1,000 scrapes"
    );
    assert!(
        lower <= exported && exported <= upper,
        "exported {exported} s, /proc said {lower} s before and {upper} s after"
    );
    assert!(value(&after, "process_open_fds", &[]) >= 3.0);
    assert!(value(&after, "process_max_fds", &[]) >= value(&after, "process_open_fds", &[]));
    assert!(value(&after, "process_resident_memory_bytes", &[]) > 1e6);
    assert!(value(&after, "process_threads", &[]) >= 1.0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let started = value(&after, "process_start_time_seconds", &[]);
    assert!(
        started <= now + 1.0 && started > now - 600.0,
        "started {started}, now {now}"
    );

    // The stream dropped: no longer in flight, handled as Canceled.
    drop(stream);
    let gone = with_code(watch.clone(), "Canceled");
    let mut last = Vec::new();
    for _ in 0..100 {
        last = read();
        if value(&last, "grpc_server_handled_total", &gone) == 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(value(&last, "grpc_server_handled_total", &gone), 1.0);
    assert_eq!(value(&last, "grpc_server_in_flight", &watch), 0.0);
    assert_eq!(value(&last, "metropolis_curator_watch_streams", &[]), 0.0);
}

fn start(dir: &std::path::Path, runtime: RuntimeKind) -> (Daemon, String) {
    let metrics = format!("127.0.0.1:{}", free_port());
    let d = Daemon::start_with(dir, runtime, &["--metrics-listen", &metrics]);
    (d, metrics)
}

async fn scrape_shows_the_traffic(runtime: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let (d, metrics) = start(dir.path(), runtime);
    scrapes_after_traffic(&d, &metrics, || parse(&scrape(&metrics, "*/*").1)).await;

    // OpenMetrics when asked, as Prometheus asks; 404 and 405 elsewhere.
    let (head, text) = scrape(
        &metrics,
        "application/openmetrics-text;version=1.0.0,*/*;q=0.1",
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{head}"
    );
    assert!(text.ends_with("# EOF\n"), "{text}");
    parse(&text);
    let mut conn = std::net::TcpStream::connect(&metrics).unwrap();
    write!(
        conn,
        "GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    conn.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 404"), "{response}");
    let mut conn = std::net::TcpStream::connect(&metrics).unwrap();
    write!(
        conn,
        "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    conn.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 405"), "{response}");
}

against_both_runtimes_and_etcd!(scrape_shows_the_traffic);

/// The same traffic, each scrape read by Python's `prometheus_client`
/// (`tests/interop/scrape.py`): the OpenMetrics parser, which refuses
/// anything outside the standard, and the text-format one.
#[cfg(feature = "system")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_prometheus_client_parses_both_formats() {
    let dir = tempfile::tempdir().unwrap();
    let (d, metrics) = start(dir.path(), RuntimeKind::Tokio);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/interop/scrape.py");
    let read = |format: &str| -> Vec<Sample> {
        let out = std::process::Command::new("python3")
            .args([script, &format!("http://{metrics}/metrics"), format])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    // The checks read the OpenMetrics parse; the text format must parse
    // to the same series (the formats differ only in how they say it).
    let python = || -> Vec<Sample> {
        let open = read("openmetrics");
        let text = read("text");
        let series =
            |rows: &[Sample], name: &str| rows.iter().filter(|(n, _, _)| n == name).count();
        for name in [
            "grpc_server_started_total",
            "grpc_server_handling_seconds_bucket",
        ] {
            assert_eq!(series(&open, name), series(&text, name), "{name}");
        }
        open
    };
    scrapes_after_traffic(&d, &metrics, python).await;
}
