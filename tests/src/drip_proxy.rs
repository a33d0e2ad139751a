//! A TCP proxy in front of a server that, while told to, drips what the
//! server sends: on each connection the first bytes pass at once, the
//! rest a few bytes at a time. Before a registry (TLS passes through
//! untouched) it plays a registry whose layer downloads crawl, fast
//! enough to beat any socket timeout, too slow to ever finish.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::proxy::{Proxy, copy_in_background};

/// A running proxy.
pub struct DripProxy {
    /// `127.0.0.1:port`.
    pub addr: String,
    dripping: Arc<AtomicBool>,
    _proxy: Proxy,
}

impl DripProxy {
    /// Proxies to `upstream`; while dripping, each connection passes the
    /// server's first `fast` bytes, then `chunk` bytes every `pause`.
    pub fn start(upstream: &str, fast: usize, chunk: usize, pause: Duration) -> DripProxy {
        let dripping = Arc::new(AtomicBool::new(true));
        let told = dripping.clone();
        let proxy = Proxy::start(upstream, move |client, server| {
            let drip = told.load(Ordering::SeqCst);
            copy_in_background(client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || pass(server, client, drip.then_some((fast, chunk, pause))));
        });
        DripProxy {
            addr: proxy.addr.clone(),
            dripping,
            _proxy: proxy,
        }
    }

    /// Whether new connections drip (they do from the start).
    pub fn set_dripping(&self, dripping: bool) {
        self.dripping.store(dripping, Ordering::SeqCst);
    }
}

/// Copies `from` to `to`, dripping after `fast` bytes when asked to.
fn pass(mut from: TcpStream, mut to: TcpStream, drip: Option<(usize, usize, Duration)>) {
    let mut passed = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let want = match drip {
            Some((fast, chunk, _)) if passed >= fast => chunk.max(1).min(buf.len()),
            Some((fast, _, _)) => (fast - passed).min(buf.len()),
            None => buf.len(),
        };
        let read = match from.read(&mut buf[..want]) {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        if let Some((fast, _, pause)) = drip
            && passed >= fast
        {
            std::thread::sleep(pause);
        }
        if to.write_all(&buf[..read]).is_err() {
            break;
        }
        passed += read;
    }
    let _ = to.shutdown(Shutdown::Write);
}
