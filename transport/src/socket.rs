//! Sockets: the local UNIX socket's file (stale-socket replacement, mode
//! 0600 from the moment it appears at its path), and TCP keepalive on
//! accepted connections.

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;

/// Makes `path` ready for a UNIX listener to bind: creates its directory
/// and removes a stale socket left by a previous run. Anything else at
/// that path is left alone and reported.
pub fn prepare_socket_path(path: &Path) -> io::Result<()> {
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path),
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{}: exists and is not a socket; refusing to replace it",
                path.display()
            ),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Restricts the bound socket to its owner (mode 0600): callers of the
/// local socket act as this node.
pub fn restrict_socket(path: &Path) -> io::Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}

/// Binds a UNIX listener at `path` (replacing a stale socket) whose file
/// has mode 0600 from the moment it exists at `path`: the socket is bound
/// inside a fresh directory of mode 0700 beside `path`, restricted there,
/// then renamed into place (a bound socket keeps working when renamed).
/// So no other user can connect in the window between `bind` and `chmod`,
/// whatever the process umask. Nonblocking, ready for a runtime to adopt.
pub fn bind_private(path: &Path) -> io::Result<std::os::unix::net::UnixListener> {
    use std::os::unix::fs::DirBuilderExt;
    prepare_socket_path(path)?;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, "the socket path names no file")
    })?;
    let private = dir.join(format!(
        ".{}.{}.bind",
        name.to_string_lossy(),
        std::process::id()
    ));
    // A directory left by a crashed start of this same PID is stale.
    let _ = std::fs::remove_dir_all(&private);
    std::fs::DirBuilder::new().mode(0o700).create(&private)?;
    let staged = private.join("s");
    let bound = (|| {
        let listener = std::os::unix::net::UnixListener::bind(&staged)?;
        restrict_socket(&staged)?;
        std::fs::rename(&staged, path)?;
        listener.set_nonblocking(true)?;
        Ok(listener)
    })();
    let _ = std::fs::remove_file(&staged);
    let _ = std::fs::remove_dir(&private);
    bound
}

/// Interval of TCP keepalive probes once a connection's idle time passed.
pub const TCP_KEEPALIVE_PROBE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);
/// Unanswered probes after which the kernel drops the connection.
pub const TCP_KEEPALIVE_PROBES: u32 = 3;

/// Turns on TCP keepalive on `socket` (an accepted connection): after
/// `idle` without traffic the kernel probes the peer every
/// [`TCP_KEEPALIVE_PROBE_INTERVAL`] and drops the connection after
/// [`TCP_KEEPALIVE_PROBES`] unanswered probes, so a peer that vanished
/// (host down, network cut) stops holding its streams. Costs nothing per
/// call, unlike HTTP/2 PINGs. `None` leaves the socket as it is.
pub fn set_tcp_keepalive(
    socket: &impl std::os::fd::AsFd,
    idle: Option<std::time::Duration>,
) -> io::Result<()> {
    let Some(idle) = idle else {
        return Ok(());
    };
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval(TCP_KEEPALIVE_PROBE_INTERVAL)
        .with_retries(TCP_KEEPALIVE_PROBES);
    socket2::SockRef::from(socket).set_tcp_keepalive(&keepalive)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_socket_appears_with_mode_0600_and_accepts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("curator.sock");
        let listener = bind_private(&path).unwrap();
        let mode = std::fs::symlink_metadata(&path)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        std::os::unix::net::UnixStream::connect(&path).unwrap();
        listener.set_nonblocking(false).unwrap();
        assert!(listener.accept().is_ok());
        // Nothing is left beside it; a second bind replaces the stale socket.
        drop(listener);
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1);
        bind_private(&path).unwrap();
    }

    #[test]
    fn tcp_keepalive_is_set_as_asked() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let sock = socket2::SockRef::from(&client);
        assert!(!sock.keepalive().unwrap());
        super::set_tcp_keepalive(&client, None).unwrap();
        assert!(!sock.keepalive().unwrap());
        super::set_tcp_keepalive(&client, Some(std::time::Duration::from_secs(42))).unwrap();
        assert!(sock.keepalive().unwrap());
        assert_eq!(sock.tcp_keepalive_time().unwrap().as_secs(), 42);
        assert_eq!(sock.tcp_keepalive_interval().unwrap().as_secs(), 10);
        assert_eq!(sock.tcp_keepalive_retries().unwrap(), 3);
    }
}
