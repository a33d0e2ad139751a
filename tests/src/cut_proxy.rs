//! A TCP proxy in front of a server that breaks uploads: the first
//! `uploads` connections on which the client sends more than `cut` bytes
//! are shut down in both directions once `cut` bytes have passed, as a
//! link that drops in the middle of a large `PUT` does. Everything else
//! passes untouched.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::proxy::{Proxy, copy_in_background};

/// A running proxy.
pub struct CutProxy {
    /// `127.0.0.1:port`.
    pub addr: String,
    /// Connections cut so far.
    pub cut: Arc<AtomicUsize>,
    _proxy: Proxy,
}

impl CutProxy {
    /// Proxies to `upstream`, cutting the first `uploads` connections
    /// that carry more than `cut` bytes from the client.
    pub fn start(upstream: &str, cut: usize, uploads: usize) -> CutProxy {
        let done = Arc::new(AtomicUsize::new(0));
        let counted = done.clone();
        let proxy = Proxy::start(upstream, move |client, server| {
            copy_in_background(server.try_clone().unwrap(), client.try_clone().unwrap());
            let done = counted.clone();
            std::thread::spawn(move || upload(client, server, cut, uploads, &done));
        });
        CutProxy {
            addr: proxy.addr.clone(),
            cut: done,
            _proxy: proxy,
        }
    }
}

/// Copies the client's bytes to the server, cutting both off after
/// `cut` bytes while fewer than `uploads` connections were cut.
fn upload(
    mut client: TcpStream,
    mut server: TcpStream,
    cut: usize,
    uploads: usize,
    done: &AtomicUsize,
) {
    let mut passed = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let read = match client.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        if passed + read > cut && done.load(Ordering::SeqCst) < uploads {
            let _ = server.write_all(&buf[..cut - passed]);
            done.fetch_add(1, Ordering::SeqCst);
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
            return;
        }
        if server.write_all(&buf[..read]).is_err() {
            break;
        }
        passed += read;
    }
    let _ = server.shutdown(Shutdown::Write);
}
