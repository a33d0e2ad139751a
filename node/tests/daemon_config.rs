//! What the daemon's configuration decides before anything is created:
//! the flag combinations it refuses (each refusal naming the flag), the
//! ones it accepts, the listen addresses `parse_listen` takes, and the
//! defaults an embedder starts from. A refused start touches neither the
//! data directory nor the runtime.

#![allow(clippy::unwrap_used)]

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use clap::Parser;
use clap::error::ErrorKind;
use futures::future::BoxFuture;
use metropolis_core::ports::Spawner;
use metropolis_node::daemon::{
    Config, DEFAULT_DEBUG_LISTEN, DEFAULT_METRICS_LISTEN, DaemonError, NodeServices, parse_listen,
};
use metropolis_node::exit::{Exit, status_of};
use metropolis_transport::connect::Dialer;
use metropolis_transport::edge::SharedTimer;
use metropolis_transport::grpc::Channel;
use metropolis_transport::runtime::{Listener, Runtime, SharedRuntime, Socket};

/// The daemon's flags `args` (without the program name), as clap parses
/// them; no environment variable of the daemon is read here but the four
/// `Config` declares itself (none of which these tests set).
fn parse(args: &[&str]) -> Result<Config, clap::Error> {
    Config::try_parse_from(std::iter::once("metropolisd").chain(args.iter().copied()))
}

/// The error clap refuses `args` with, rendered as the daemon prints it.
fn refused(args: &[&str]) -> (ErrorKind, String) {
    let e = parse(args).unwrap_err();
    (e.kind(), e.render().to_string())
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

#[test]
fn flags_that_need_another_are_refused_naming_it() {
    // --debug-listen-non-loopback only widens --debug-listen.
    let (kind, e) = refused(&["--debug-listen-non-loopback"]);
    assert_eq!(kind, ErrorKind::MissingRequiredArgument, "{e}");
    assert!(e.contains("--debug-listen [<ADDR>]"), "{e}");
    // The Kubernetes CA is a certificate and its key, never one alone.
    let (kind, e) = refused(&["--kubernetes-ca-cert", "ca.pem"]);
    assert_eq!(kind, ErrorKind::MissingRequiredArgument, "{e}");
    assert!(e.contains("--kubernetes-ca-key <FILE>"), "{e}");
    let (kind, e) = refused(&["--kubernetes-ca-key", "ca-key.pem"]);
    assert_eq!(kind, ErrorKind::MissingRequiredArgument, "{e}");
    assert!(e.contains("--kubernetes-ca-cert <FILE>"), "{e}");
}

#[test]
fn a_bad_listen_address_is_refused_naming_the_flag() {
    for flag in [
        "--listen",
        "--agent-listen",
        "--debug-listen",
        "--metrics-listen",
    ] {
        for bad in ["7835", "127.0.0.1", "localhost:http", "127.0.0.1:65536"] {
            let (kind, e) = refused(&[flag, bad]);
            assert_eq!(kind, ErrorKind::ValueValidation, "{flag} {bad}: {e}");
            // `'--listen <ADDR>'`, `'--debug-listen [<ADDR>]'`.
            assert!(e.contains(&format!("for '{flag} ")), "{flag} {bad}: {e}");
            assert!(e.contains("expected IP:PORT"), "{flag} {bad}: {e}");
        }
    }
}

#[test]
fn parse_listen_takes_ip_and_port_or_a_host_name() {
    assert_eq!(
        parse_listen("127.0.0.1:7835").unwrap(),
        addr("127.0.0.1:7835")
    );
    assert_eq!(parse_listen("0.0.0.0:0").unwrap(), addr("0.0.0.0:0"));
    assert_eq!(parse_listen("[::1]:7835").unwrap(), addr("[::1]:7835"));
    assert_eq!(parse_listen("[::]:65535").unwrap(), addr("[::]:65535"));
    // A host name is resolved now, to its first address (localhost is
    // answered from the hosts file: no network needed).
    let local = parse_listen("localhost:7835").unwrap();
    assert!(local.ip().is_loopback(), "{local}");
    assert_eq!(local.port(), 7835);
}

#[test]
fn parse_listen_refuses_an_address_without_a_usable_port() {
    let cases = [
        ("", "no port"),
        ("7835", "no port"),
        ("localhost", "no port"),
        ("127.0.0.1", "no port"),
        ("localhost:http", "\"http\" is not a port"),
        ("localhost:", "\"\" is not a port"),
        ("localhost:65536", "\"65536\" is not a port"),
        ("localhost:-1", "\"-1\" is not a port"),
        ("[::1]", "is not a port"),
        // An unbracketed IPv6 address is not split at a guess.
        (
            "::1:7835",
            "needs brackets before its port, as in [::1]:7835",
        ),
    ];
    for (value, expected) in cases {
        let e = parse_listen(value).unwrap_err();
        assert!(e.contains(expected), "{value:?}: {e}");
        assert!(e.contains("expected IP:PORT"), "{value:?}: {e}");
    }
}

#[test]
fn a_port_without_a_host_says_which_hosts_to_write() {
    // Go's `:7835` means every address; the daemon asks which.
    let e = parse_listen(":7835").unwrap_err();
    assert_eq!(
        e,
        "no host before the port: write 0.0.0.0:7835 (every IPv4 address), [::]:7835 \
         (every address) or 127.0.0.1:7835 (this machine only)"
    );
}

#[test]
fn the_defaults_listen_everywhere_with_debug_and_metrics_off() {
    let c = parse(&["--data-dir", "/var/lib/metropolis-test"]).unwrap();
    assert_eq!(c.listen, addr("0.0.0.0:7835"));
    assert_eq!(c.agent_listen, addr("0.0.0.0:7836"));
    assert_eq!(c.debug_listen, None);
    assert!(!c.debug_listen_non_loopback);
    assert_eq!(c.metrics_listen, None);
    assert!(c.kubernetes_ca_generate);
    assert_eq!(c.socket, None);
    assert_eq!(
        c.socket_path(),
        Path::new("/var/lib/metropolis-test/curator.sock")
    );
    c.check_debug_listen().unwrap();
    let tree = c.log_tree_config();
    assert_eq!(tree.max_bytes, c.log_buffer_bytes);
    assert_eq!(tree.max_entries_per_dn, c.log_entries_per_dn);
}

#[test]
fn debug_and_metrics_flags_alone_listen_on_loopback() {
    let c = parse(&["--debug-listen", "--metrics-listen"]).unwrap();
    assert_eq!(c.debug_listen, Some(addr(DEFAULT_DEBUG_LISTEN)));
    assert_eq!(c.metrics_listen, Some(addr(DEFAULT_METRICS_LISTEN)));
    assert_eq!(DEFAULT_DEBUG_LISTEN, "127.0.0.1:7837");
    assert_eq!(DEFAULT_METRICS_LISTEN, "127.0.0.1:7838");
    c.check_debug_listen().unwrap();
    let c = parse(&[
        "--debug-listen",
        "127.0.0.1:9000",
        "--kubernetes-ca-generate",
        "false",
    ])
    .unwrap();
    assert_eq!(c.debug_listen, Some(addr("127.0.0.1:9000")));
    assert!(!c.kubernetes_ca_generate);
    let c = parse(&[
        "--kubernetes-ca-cert",
        "ca.pem",
        "--kubernetes-ca-key",
        "key.pem",
    ])
    .unwrap();
    assert_eq!(c.kubernetes_ca_cert.as_deref(), Some(Path::new("ca.pem")));
    assert_eq!(c.kubernetes_ca_key.as_deref(), Some(Path::new("key.pem")));
}

#[test]
fn a_debug_listener_off_loopback_needs_its_own_flag() {
    for exposed in [
        "0.0.0.0:7837",
        "10.1.2.3:7837",
        "[::]:7837",
        "[2001:db8::1]:7837",
    ] {
        let c = parse(&["--debug-listen", exposed]).unwrap();
        let e = c.check_debug_listen().unwrap_err();
        assert_eq!(status_of(e.as_ref()), Exit::Usage, "{exposed}: {e}");
        let e = e.to_string();
        assert!(e.starts_with(&format!("--debug-listen {exposed}: ")), "{e}");
        assert!(e.contains("add --debug-listen-non-loopback"), "{e}");
        let c = parse(&["--debug-listen", exposed, "--debug-listen-non-loopback"]).unwrap();
        c.check_debug_listen().unwrap();
    }
    // Every loopback address is loopback, an IPv4-mapped one too.
    for local in [
        "127.0.0.1:7837",
        "127.8.9.10:1",
        "[::1]:7837",
        "[::ffff:127.0.0.1]:7837",
    ] {
        let c = parse(&["--debug-listen", local]).unwrap();
        c.check_debug_listen()
            .unwrap_or_else(|e| panic!("{local}: {e}"));
    }
    // The exposing flag is harmless with a loopback address.
    let c = parse(&["--debug-listen", "--debug-listen-non-loopback"]).unwrap();
    c.check_debug_listen().unwrap();
}

#[test]
fn config_new_is_the_defaults_on_the_given_addresses() {
    let c = Config::new("/srv/node", addr("127.0.0.1:0"));
    assert_eq!(c.data_dir, PathBuf::from("/srv/node"));
    assert_eq!(c.listen, addr("127.0.0.1:0"));
    // The agent listener follows the TLS one's address, on a free port.
    assert_eq!(c.agent_listen, addr("127.0.0.1:0"));
    let c = Config::new("/srv/node", addr("[::1]:7835"));
    assert_eq!(c.agent_listen, addr("[::1]:0"));
    assert_eq!(c.socket_path(), Path::new("/srv/node/curator.sock"));
    let mut c = c;
    c.socket = Some("/run/metropolis.sock".into());
    assert_eq!(c.socket_path(), Path::new("/run/metropolis.sock"));
    assert_eq!(c.debug_listen, None);
    assert!(c.cluster.etcd.is_empty());
    assert!(c.logs.is_none());
}

/// A runtime the refusals below must never reach.
struct Untouched;

impl Spawner for Untouched {
    fn spawn(&self, _: Pin<Box<dyn Future<Output = ()> + Send + 'static>>) {
        unreachable!("a refused start spawned a task")
    }
}

impl Runtime for Untouched {
    fn timer(&self) -> SharedTimer {
        unreachable!("a refused start asked for the timer")
    }
    fn tcp_listener(&self, _: std::net::TcpListener) -> io::Result<Box<dyn Listener>> {
        unreachable!("a refused start listened")
    }
    fn unix_listener(&self, _: std::os::unix::net::UnixListener) -> io::Result<Box<dyn Listener>> {
        unreachable!("a refused start listened")
    }
    fn connect_tcp(&self, _: String) -> BoxFuture<'static, io::Result<Box<dyn Socket>>> {
        unreachable!("a refused start connected")
    }
    fn connect_unix(&self, _: PathBuf) -> BoxFuture<'static, io::Result<Box<dyn Socket>>> {
        unreachable!("a refused start connected")
    }
    fn termination(&self) -> io::Result<BoxFuture<'static, ()>> {
        unreachable!("a refused start waited for a signal")
    }
}

impl Dialer for Untouched {
    fn dial(
        &self,
        _: String,
        _: String,
        _: Arc<rustls::ClientConfig>,
    ) -> BoxFuture<'static, Result<Channel, metropolis_transport::connect::ConnectError>> {
        unreachable!("a refused start dialled")
    }
}

fn untouched() -> SharedRuntime {
    Arc::new(Untouched)
}

/// `config` with its data directory a missing subdirectory of `dir`.
fn config_in(dir: &Path) -> Config {
    Config::new(dir.join("data"), addr("127.0.0.1:0"))
}

fn prepare(config: &Config) -> DaemonError {
    let prepared = futures::executor::block_on(NodeServices::prepare(config, untouched()));
    match prepared {
        Ok(_) => panic!("prepared"),
        Err(e) => e,
    }
}

fn prepare_node(config: &Config) -> DaemonError {
    let dialer: Arc<dyn Dialer> = Arc::new(Untouched);
    let prepared = futures::executor::block_on(NodeServices::prepare_node(
        config,
        untouched(),
        dialer,
        None,
    ));
    match prepared {
        Ok(_) => panic!("prepared"),
        Err(e) => e,
    }
}

#[test]
fn an_exposed_debug_listener_is_refused_before_the_data_directory_is_made() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config_in(dir.path());
    config.debug_listen = Some(addr("0.0.0.0:7837"));
    for e in [prepare(&config), prepare_node(&config)] {
        assert_eq!(status_of(e.as_ref()), Exit::Usage, "{e}");
        assert!(
            e.to_string().starts_with("--debug-listen 0.0.0.0:7837: "),
            "{e}"
        );
    }
    assert!(!config.data_dir.exists(), "the data directory was created");
}

#[test]
fn etcd_is_refused_where_it_cannot_be_served() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config_in(dir.path());
    config.cluster.etcd = vec!["http://127.0.0.1:2379".into()];
    // The embedded store's entry point serves no elected instance.
    let e = prepare(&config).to_string();
    assert!(e.starts_with("--etcd: "), "{e}");
    assert!(e.contains("prepare_elected"), "{e}");
    // A build without an election refuses it as a usage error.
    let e = prepare_node(&config);
    assert_eq!(status_of(e.as_ref()), Exit::Usage, "{e}");
    let e = e.to_string();
    assert!(e.starts_with("--etcd: "), "{e}");
    assert!(e.contains("--features etcd"), "{e}");
    // The exposed debug listener is refused first, whichever the store.
    config.debug_listen = Some(addr("10.0.0.1:7837"));
    let e = prepare_node(&config).to_string();
    assert!(e.starts_with("--debug-listen 10.0.0.1:7837: "), "{e}");
    assert!(!config.data_dir.exists(), "the data directory was created");
}
