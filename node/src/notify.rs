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
use std::time::Duration;

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
