//! The systemd service notification protocol (`sd_notify(3)`): one
//! datagram per state change to the socket named by `NOTIFY_SOCKET`, for
//! a unit of `Type=notify` (see `deploy/systemd/metropolisd.service`).
//!
//! The daemon sends `READY=1` once every listener is bound (connections
//! are then queued by the kernel and served), `STOPPING=1` when it starts
//! to shut down, and, when the unit sets `WatchdogSec=`, `WATCHDOG=1` at
//! half the interval from a task of its runtime, so a wedged runtime gets
//! the process restarted. Without `NOTIFY_SOCKET` nothing is sent.

use std::io;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::Arc;
use std::time::Duration;

use metropolis_core::ports::{MonotonicClock, Timer};
use metropolis_transport::runtime::{RuntimeTime, SharedRuntime};

/// Where notifications go: the socket systemd (or a test) gave in the
/// environment.
#[derive(Debug)]
pub struct Notifier {
    socket: UnixDatagram,
    addr: SocketAddr,
    watchdog: Option<Duration>,
}

impl Notifier {
    /// The notifier of this process, from `NOTIFY_SOCKET` (a path, or
    /// `@name` for the abstract namespace) and `WATCHDOG_USEC` (honoured
    /// when `WATCHDOG_PID` is unset or names this process); None without
    /// `NOTIFY_SOCKET`. The variables are read once, at start.
    pub fn from_env() -> io::Result<Option<Notifier>> {
        let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
            return Ok(None);
        };
        let watchdog = std::env::var("WATCHDOG_USEC")
            .ok()
            .and_then(|usec| usec.parse::<u64>().ok())
            .filter(|&usec| usec > 0)
            .filter(|_| {
                std::env::var("WATCHDOG_PID")
                    .map_or(true, |pid| pid.parse() == Ok(std::process::id()))
            })
            .map(Duration::from_micros);
        Notifier::new(&path.to_string_lossy(), watchdog).map(Some)
    }

    /// A notifier sending to `path` (`@name`: abstract), with a watchdog
    /// of `watchdog`.
    pub fn new(path: &str, watchdog: Option<Duration>) -> io::Result<Notifier> {
        let addr = match path.strip_prefix('@') {
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                SocketAddr::from_abstract_name(name.as_bytes())?
            }
            None => SocketAddr::from_pathname(path)?,
        };
        Ok(Notifier {
            socket: UnixDatagram::unbound()?,
            addr,
            watchdog,
        })
    }

    /// Sends `state` (newline-separated `KEY=value` assignments).
    pub fn notify(&self, state: &str) -> io::Result<()> {
        self.socket.send_to_addr(state.as_bytes(), &self.addr)?;
        Ok(())
    }

    /// How often to send `WATCHDOG=1` (half the unit's `WatchdogSec=`),
    /// if the unit asked for a watchdog.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog.map(|w| w / 2)
    }
}

/// Tells the service manager the process is ready (`READY=1` and
/// `STATUS=status`) when it started the process with `NOTIFY_SOCKET`, and
/// starts the watchdog pings its unit asked for on a task of `runtime`;
/// the notifier, for `STOPPING=1`. A failure to notify is logged, not
/// fatal. The daemon calls it once its listeners are bound, `bmaas-agent`
/// once its key, CA and state are read.
pub fn notify_ready(runtime: &SharedRuntime, status: &str) -> Option<Arc<Notifier>> {
    let notifier = match Notifier::from_env() {
        Ok(n) => Arc::new(n?),
        Err(e) => {
            tracing::warn!(error = %e, "NOTIFY_SOCKET is set but unusable; not notifying");
            return None;
        }
    };
    if let Err(e) = notifier.notify(&format!("READY=1\nSTATUS={status}")) {
        tracing::warn!(error = %e, "cannot notify the service manager (NOTIFY_SOCKET)");
    }
    if let Some(every) = notifier.watchdog_interval() {
        tracing::info!(every = ?every, "sending watchdog keep-alives to the service manager");
        let pinger = notifier.clone();
        let time = RuntimeTime::new(runtime.as_ref());
        runtime.spawn(Box::pin(async move {
            loop {
                time.sleep_until(time.now() + every).await;
                if let Err(e) = pinger.notify("WATCHDOG=1") {
                    tracing::warn!(error = %e, "cannot send a watchdog keep-alive");
                }
            }
        }));
    }
    Some(notifier)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn sends_to_a_path_and_an_abstract_socket() {
        let dir = std::env::temp_dir().join(format!("notify-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let server = UnixDatagram::bind(&path).unwrap();
        let n = Notifier::new(path.to_str().unwrap(), Some(Duration::from_secs(10))).unwrap();
        n.notify("READY=1\nSTATUS=serving").unwrap();
        let mut buf = [0u8; 64];
        let len = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=serving");
        assert_eq!(n.watchdog_interval(), Some(Duration::from_secs(5)));
        std::fs::remove_dir_all(&dir).unwrap();

        use std::os::linux::net::SocketAddrExt;
        let name = format!("metropolis-notify-test-{}", std::process::id());
        let server =
            UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap())
                .unwrap();
        let n = Notifier::new(&format!("@{name}"), None).unwrap();
        n.notify("STOPPING=1").unwrap();
        let len = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"STOPPING=1");
        assert_eq!(n.watchdog_interval(), None);
    }
}
