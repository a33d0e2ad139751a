//! Interoperability: clients of other gRPC stacks (Python `grpcio`, Node
//! `@grpc/grpc-js`, from `tests/interop/`) with their default settings
//! against a real daemon on each runtime: the UNIX socket, the owner over
//! mutual TLS, AgentCallback with self-signed Ed25519 agent certificates,
//! the debug service, health on every listener, and reflection.
//!
//! One daemon per runtime serves every scenario of both clients (the
//! scenarios are independent of each other); each (runtime, stack,
//! scenario) is its own test case, e.g. `smol_server::python::health_unix`.
//! The suites of the two runtimes run one after the other: the Trace
//! scenarios share the kernel's global trace buffer.

#![allow(clippy::unwrap_used)]

use metropolis_testkit::archives;

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use metropolis_pki::{generate_agent_key, self_signed_agent_certificate};
use metropolis_tests::interop::{self, ClientRun, Listener, SCENARIOS, Stack};
use metropolis_tests::{Daemon, RuntimeKind, daemon_bin};

/// The machine registered for the agent scenarios.
const MACHINE: &str = "5b4b3a6e-2d1f-4c8e-9a7b-1f0e2d3c4b5a";
const TRACEFS: &str = "/sys/kernel/tracing";

/// What the clients reported against one runtime's daemon, or why the
/// suite could not run.
type Suite = Result<HashMap<Stack, Result<ClientRun, String>>, String>;

/// The suite against `runtime`'s daemon, run once by the first test case
/// that needs it.
fn suite(runtime: RuntimeKind) -> &'static Suite {
    static TOKIO: OnceLock<Suite> = OnceLock::new();
    static SMOL: OnceLock<Suite> = OnceLock::new();
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let cell = match runtime {
        RuntimeKind::Tokio => &TOKIO,
        RuntimeKind::Smol => &SMOL,
    };
    cell.get_or_init(|| {
        let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        std::panic::catch_unwind(|| run_suite(runtime)).map_err(|panic| {
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic without a message".into())
        })
    })
}

/// `metroctl` as the owner over TLS; panics with its output on failure.
fn metroctl_as_owner(d: &Daemon, args: &[&str]) {
    let out = Command::new(daemon_bin().with_file_name("metroctl-under-test"))
        .arg("--data-dir")
        .arg(&d.data_dir)
        .arg("--endpoint")
        .arg(&d.addr)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "metroctl {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
}

/// The image archive each stack loads, and the name it is stored under.
fn image(stack: Stack) -> (Vec<u8>, &'static str) {
    match stack {
        Stack::Python => {
            let name = "registry.example/interop/python:v1";
            (archives::docker_archive(name, "python layer"), name)
        }
        Stack::Node => {
            let name = "registry.example/interop/node:v1";
            (archives::oci_archive(Some(name), "node layer").bytes, name)
        }
    }
}

fn run_suite(runtime: RuntimeKind) -> HashMap<Stack, Result<ClientRun, String>> {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_debug(&dir.path().join("data"), runtime, &[]);
    let debug_addr = d.debug_addr.clone().unwrap();

    // The registered agent: its key as `metroctl machine add
    // --generate-key` writes it, and the certificate the project's PKI
    // self-signs over it (for clients that cannot build one). A stranger:
    // a key and certificate of the same kind, registered nowhere.
    let agent_key = dir.path().join("agent-key.pem");
    metroctl_as_owner(
        &d,
        &[
            "machine",
            "add",
            MACHINE,
            "--generate-key",
            agent_key.to_str().unwrap(),
        ],
    );
    let key_pem = std::fs::read_to_string(&agent_key).unwrap();
    let (agent_cert, _) = self_signed_agent_certificate(&key_pem).unwrap();
    std::fs::write(dir.path().join("agent.pem"), agent_cert).unwrap();
    let stranger_key = generate_agent_key().unwrap();
    let (stranger_cert, _) = self_signed_agent_certificate(&stranger_key).unwrap();
    std::fs::write(dir.path().join("stranger-key.pem"), stranger_key).unwrap();
    std::fs::write(dir.path().join("stranger.pem"), stranger_cert).unwrap();
    let tracefs = interop::tracefs_writable(Path::new(TRACEFS)).then_some(TRACEFS);

    let socket = d.socket.display().to_string();
    let endpoint = |listener: Listener| match listener {
        Listener::Unix => format!("unix:{socket}"),
        Listener::CuratorTls => format!("{} (curator, TLS)", d.addr),
        Listener::AgentTls => format!("{} (AgentCallback, TLS)", d.agent_addr),
        Listener::Debug => format!("{debug_addr} (debug, plain HTTP/2)"),
    };
    let scenarios: Vec<_> = SCENARIOS
        .iter()
        .map(|&(name, listener)| (name, endpoint(listener)))
        .collect();
    let path = |name: &str| dir.path().join(name).display().to_string();
    let mut runs = HashMap::new();
    for (i, stack) in Stack::ALL.into_iter().enumerate() {
        if let Err(missing) = stack.prerequisites() {
            runs.insert(stack, Err(missing));
            continue;
        }
        let (archive, image_name) = image(stack);
        let archive_file = dir.path().join(format!("image-{i}.tar"));
        std::fs::write(&archive_file, archive).unwrap();
        let config = serde_json::json!({
            "proto_dir": interop::repo_root().join("proto"),
            "data_dir": d.data_dir,
            "socket": socket,
            "curator": d.addr,
            "agent": d.agent_addr,
            "debug": debug_addr,
            "ca": d.data_dir.join("pki").join("ca.pem"),
            "node_id": d.node_id().to_string(),
            // Each stack reports its own address, to see its own update.
            "status_address": format!("192.0.2.{}", 11 + i),
            "machine_id": MACHINE,
            "agent_key": agent_key,
            "agent_cert": path("agent.pem"),
            "stranger_key": path("stranger-key.pem"),
            "stranger_cert": path("stranger.pem"),
            "image_archive": archive_file,
            "image_name": image_name,
            "tracefs": tracefs,
            "scenarios": scenarios,
        });
        let config_file = dir.path().join(format!("config-{i}.json"));
        std::fs::write(&config_file, config.to_string()).unwrap();
        runs.insert(stack, Ok(interop::run_client(stack, &config_file)));
    }
    runs
}

/// One test case: `stack`'s report of `scenario` against `runtime`.
fn case(runtime: RuntimeKind, stack: Stack, scenario: &str) {
    let who = format!("{} against metropolisd --runtime {runtime}", stack.name());
    let runs = match suite(runtime) {
        Ok(runs) => runs,
        Err(setup) => panic!("{who}, {scenario}: the suite's setup failed: {setup}"),
    };
    let run = match &runs[&stack] {
        Ok(run) => run,
        Err(missing) => panic!("{who}, {scenario}: {missing}"),
    };
    let who = format!("{} against metropolisd --runtime {runtime}", run.stack);
    let Some(report) = run.reports.get(scenario) else {
        panic!(
            "{who}, {scenario}: the client reported nothing ({}); its stderr:\n{}",
            run.ended, run.stderr
        );
    };
    if report.skipped {
        eprintln!("{who}, {scenario}: SKIPPED: {}", report.detail);
        return;
    }
    let logged = run
        .stderr_of
        .get(scenario)
        .filter(|s| !s.is_empty())
        .map(|s| format!("\n--- what the client logged meanwhile:\n{s}"))
        .unwrap_or_default();
    assert!(
        report.ok,
        "{who}, {scenario} at {}: {}{logged}",
        report.endpoint, report.detail
    );
}

macro_rules! cases {
    ($runtime:expr, $stack:expr; $($name:ident),*) => {
        $(
            #[test]
            fn $name() {
                crate::case($runtime, $stack, stringify!($name))
            }
        )*
    };
}

/// The test cases: every scenario for each stack on each runtime.
macro_rules! interop_suite {
    ($($name:ident),* $(,)?) => {
        const CASES: &[&str] = &[$(stringify!($name)),*];
        mod tokio_server {
            mod python {
                cases!(metropolis_tests::RuntimeKind::Tokio, metropolis_tests::interop::Stack::Python; $($name),*);
            }
            mod node {
                cases!(metropolis_tests::RuntimeKind::Tokio, metropolis_tests::interop::Stack::Node; $($name),*);
            }
        }
        mod smol_server {
            mod python {
                cases!(metropolis_tests::RuntimeKind::Smol, metropolis_tests::interop::Stack::Python; $($name),*);
            }
            mod node {
                cases!(metropolis_tests::RuntimeKind::Smol, metropolis_tests::interop::Stack::Node; $($name),*);
            }
        }
    };
}

interop_suite!(
    unix_watch_and_status,
    owner_watch_over_tls,
    agent_registered_heartbeat,
    agent_unregistered_key,
    agent_bad_machine_id,
    debug_kubeconfig,
    debug_logs,
    debug_load_image,
    debug_trace,
    health_unix,
    health_curator_tls,
    health_agent_tls,
    health_debug,
    reflection_v1_debug,
    reflection_v1alpha_debug,
    reflection_v1_curator_tls,
    reflection_v1alpha_curator_tls,
);

/// Every scenario the clients run has a test case, and no case names a
/// scenario they do not run.
#[test]
fn every_scenario_has_a_test_case() {
    let scenarios: Vec<&str> = SCENARIOS.iter().map(|(name, _)| *name).collect();
    assert_eq!(CASES, scenarios.as_slice());
}
