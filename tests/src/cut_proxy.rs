//! A TCP proxy in front of a server that breaks transfers: the first
//! `times` connections on which more than `cut` bytes go one way (the
//! client's uploads, or the server's downloads) are shut down in both
//! directions once `cut` bytes have passed that way, as a link that drops
//! in the middle of a large `PUT` or `GET` does. Everything else passes
//! untouched.

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

/// Which way transfers are cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    /// What the client sends.
    Upload,
    /// What the server sends.
    Download,
}

impl CutProxy {
    /// Proxies to `upstream`, cutting the first `times` connections that
    /// carry more than `cut` bytes the `way` given.
    pub fn start(upstream: &str, way: Way, cut: usize, times: usize) -> CutProxy {
        let done = Arc::new(AtomicUsize::new(0));
        let counted = done.clone();
        let proxy = Proxy::start(upstream, move |client, server| {
            let (from, to) = match way {
                Way::Upload => (client, server),
                Way::Download => (server, client),
            };
            copy_in_background(to.try_clone().unwrap(), from.try_clone().unwrap());
            let done = counted.clone();
            std::thread::spawn(move || copy_cut(from, to, cut, times, &done));
        });
        CutProxy {
            addr: proxy.addr.clone(),
            cut: done,
            _proxy: proxy,
        }
    }
}

/// Copies `from` to `to`, cutting both off after `cut` bytes while fewer
/// than `times` connections were cut.
fn copy_cut(mut from: TcpStream, mut to: TcpStream, cut: usize, times: usize, done: &AtomicUsize) {
    let mut passed = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let read = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        if passed + read > cut && done.load(Ordering::SeqCst) < times {
            let _ = to.write_all(&buf[..cut - passed]);
            done.fetch_add(1, Ordering::SeqCst);
            let _ = from.shutdown(Shutdown::Both);
            let _ = to.shutdown(Shutdown::Both);
            return;
        }
        if to.write_all(&buf[..read]).is_err() {
            break;
        }
        passed += read;
    }
    let _ = to.shutdown(Shutdown::Write);
}
